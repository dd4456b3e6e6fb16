#!/bin/sh
# Cloud-platform mode: two "nodes" on this machine started only with
# WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT (plus MUSTER_TOKEN_FILE,
# MUSTER_DEVICES and, on node rank 0, MUSTER_JOB) form a job and train.
# Node rank 0 runs the daemon and exits with the job's status; node rank 1
# exits 0 when the daemon ends the job. Also: a batch that does not divide
# over the world is refused at formation, and a bad variable is a usage error.
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
echo '{"name": "cloud", "max_restarts": 1, "batch": 8}' > "$ITEST_DIR/job.json"
PORT=$(free_port)
RANKCMD="$BUILD/tests/fake-rank --steps 30 --step-ms 20"

# node NODE_RANK LOG: the same command on every node, as a platform starts it.
node() {
    env -i PATH="$PATH" WORLD_SIZE=2 RANK="$1" MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
        MUSTER_TOKEN_FILE="$ITEST_DIR/token" MUSTER_JOB="$ITEST_DIR/job.json" MUSTER_DEVICES=cpu:2 \
        FAKE_RANK_PIDDIR="$ITEST_DIR/pids-$1" \
        timeout 60 "$BUILD/muster-worker" --from-env --rank-cmd "$RANKCMD" > "$2" 2>&1
}
mkdir -p "$ITEST_DIR/pids-0" "$ITEST_DIR/pids-1"
# Node 1 first: it waits for the daemon node 0 brings up.
node 1 "$ITEST_DIR/node1.log" &
N1=$!
ITEST_PIDS="$ITEST_PIDS $N1"
sleep 0.2
node 0 "$ITEST_DIR/node0.log" &
N0=$!
ITEST_PIDS="$ITEST_PIDS $N0"
rc0=0; wait "$N0" || rc0=$?
rc1=0; wait "$N1" || rc1=$?
[ "$rc0" -eq 0 ] || fail "node rank 0 exited $rc0, expected 0 (job completed)"
[ "$rc1" -eq 0 ] || fail "node rank 1 exited $rc1, expected 0"
grep -q 'job cloud: completed, generation 1, 4 ranks' "$ITEST_DIR/node0.log" || fail "no completion in node 0's log"
grep -q "joined daemon at 127.0.0.1:$PORT as node node0" "$ITEST_DIR/node0.log" || fail "node0 did not join"
grep -q "joined daemon at 127.0.0.1:$PORT as node node1" "$ITEST_DIR/node1.log" || fail "node1 did not join"
# Both nodes held ranks: 2 each, ranks 0..1 on node0 and 2..3 on node1.
grep -q 'generation 1: 2 rank(s) of world size 4 on this node (ranks 0..1)' "$ITEST_DIR/node0.log" \
    || fail "node0 did not hold ranks 0..1"
grep -q 'generation 1: 2 rank(s) of world size 4 on this node (ranks 2..3)' "$ITEST_DIR/node1.log" \
    || fail "node1 did not hold ranks 2..3"
[ "$(ls "$ITEST_DIR/pids-0" | wc -l)" -ge 2 ] && [ "$(ls "$ITEST_DIR/pids-1" | wc -l)" -ge 2 ] \
    || fail "ranks did not run on both nodes"
echo "cloud mode: 2 nodes x 2 ranks formed from the environment and completed"

# A batch that does not divide over the 4 ranks fails the job at formation: exit 1, numbers named.
echo '{"name": "cloud", "batch": 6}' > "$ITEST_DIR/job.json"
PORT=$(free_port)
node 1 "$ITEST_DIR/node1-bad.log" &
N1=$!
ITEST_PIDS="$ITEST_PIDS $N1"
rc0=0; node 0 "$ITEST_DIR/node0-bad.log" || rc0=$?
rc1=0; wait "$N1" || rc1=$?
[ "$rc0" -eq 1 ] || fail "node rank 0 exited $rc0 for a batch that does not divide, expected 1"
grep -q 'batch 6 does not divide over 4 ranks: use a multiple of 4, e.g. 4 or 8' "$ITEST_DIR/node0-bad.log" \
    || fail "the refusal does not name the numbers"
if grep -q 'rank(s) of world size' "$ITEST_DIR/node0-bad.log" "$ITEST_DIR/node1-bad.log"; then
    fail "ranks were assigned for a refused batch"
fi
# The launcher keeps the failed job's daemon state for the operator; the test removes it.
kept=$(sed -n 's/.*daemon state kept in \(.*\)$/\1/p' "$ITEST_DIR/node0-bad.log")
case "$kept" in /tmp/muster-launch.*) rm -rf "$kept" ;; esac
echo "cloud mode: batch 6 over 4 ranks refused at formation"

# Usage errors: exit 2, naming the variable.
rc=0; env -i PATH="$PATH" WORLD_SIZE=2 RANK=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
    "$BUILD/muster-worker" --from-env --devices cpu:1 --token-file "$ITEST_DIR/token" 2> "$ITEST_DIR/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q 'RANK: expected 0..1 (WORLD_SIZE is 2), got 2' "$ITEST_DIR/err" \
    || fail "RANK out of range: exit $rc, $(cat "$ITEST_DIR/err")"
rc=0; env -i PATH="$PATH" WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
    "$BUILD/muster-worker" --from-env --devices cpu:1 --token-file "$ITEST_DIR/token" 2> "$ITEST_DIR/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q 'needs the job' "$ITEST_DIR/err" || fail "rank 0 without a job: exit $rc"
echo "cloud mode: ok"
