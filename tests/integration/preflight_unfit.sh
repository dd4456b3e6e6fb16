#!/bin/sh
# Node pre-flight: two agents (a, b) each run from their own directory, and
# the job names its data file and checkpoint_dir relative to it, so that
# each node sees its own. Three causes make b unfit in turn: the data file
# is missing there, its checkpoint_dir is read-only (a read-only tmpfs where
# mounting is permitted, else a directory of mode 0555 for a non-root
# user), and its free space is below two checkpoints (a 64 KiB tmpfs where
# mounting is permitted, and the statvfs test hook of common/preflight.h).
# Each time node b is shown unfit with the reason in /v1/nodes (and among
# /v1/status's unhealthy nodes) and /v1/events, the job waits and spends no
# restart; fixing the cause makes b fit within a few seconds and the job
# forms and runs.
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
python3 -c '
import random, sys
random.seed(3)
words = ["to ", "be ", "or ", "not ", "that ", "is ", "the ", "question\n"]
sys.stdout.write("".join(random.choice(words) for _ in range(6000)))' > "$ITEST_DIR/data.txt"
RANK_CMD="$(pwd)/$BUILD/muster-train --threads 1"
MOUNTED=""
cleanup_mount() { [ -z "$MOUNTED" ] || umount "$MOUNTED" 2>/dev/null || true; cleanup; }
trap cleanup_mount EXIT INT TERM

job() { # NAME [CHECKPOINT_DIR]
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 3, "model": "tiny", "data": "data.txt", "steps": 100000,
 "batch": 4, "eval_every": 0, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000,
 "checkpoint_dir": "${2:-}"}
JSON
}

# run NAME: musterd and agents a, b, each agent started in its own directory.
run() {
    rm -rf "$ITEST_DIR/state"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token"
    abs=$(pwd)
    for n in a b; do
        (cd "$ITEST_DIR/$n" && exec "$abs/$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$n" \
            --devices cpu:1 --state-dir "$ITEST_DIR/agent-state-$n" --token-file "$ITEST_DIR/token" \
            --rank-cmd "$RANK_CMD" >> "$ITEST_DIR/agent-$n.log" 2>&1) &
        ITEST_PIDS="$ITEST_PIDS $!"
    done
}

# unfit_then_fit CASE PATTERN FIX: b must be shown unfit with PATTERN in its reason
# while the job waits without spending a restart; FIX (a shell command) makes it fit.
unfit_then_fit() {
    wait_for 20 'node.get("b", {}).get("fit") == "unfit" and node["a"]["fit"] == "fit"' \
        || fail "$1: node b was not shown unfit within 20 s"
    reason=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/nodes?node=b" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["unfit_reason"])')
    echo "$1: node b unfit: $reason"
    echo "$reason" | grep -q "$2" || fail "$1: reason does not name the cause ($2)"
    check 'any(n["name"] == "b" and n["health"] == "unfit" for n in d["unhealthy_nodes"])' \
        || fail "$1: /v1/status does not list node b among its unhealthy nodes as unfit"
    wait_event 5 "node b is unfit" || fail "$1: no node_unfit event"
    sleep 1 # the job waits: nothing formed, nothing restarted
    check 'd["state"] == "waiting" and d["restarts"] == 0 and d["generation"] == 0 and "unfit" in (d["reason"] or "")' \
        || fail "$1: expected the job waiting on b with no restart spent"
    sh -c "$3"
    wait_for 20 'node["b"]["fit"] == "fit" and d["state"] in ("forming", "running") and d["restarts"] == 0' \
        || fail "$1: after the fix node b did not become fit and the job did not form within 20 s"
    wait_for 60 'running == 2 and d["restarts"] == 0' || fail "$1: ranks did not run after the fix"
    echo "$1: fixed: node b fit, job running, restarts 0"
}

# 1. the data file is missing on node b
mkdir -p "$ITEST_DIR/a" "$ITEST_DIR/b"
cp "$ITEST_DIR/data.txt" "$ITEST_DIR/a/data.txt"
job missing
run missing
unfit_then_fit "missing data" "data.txt: No such file" "cp '$ITEST_DIR/data.txt' '$ITEST_DIR/b/data.txt'"
stop_all

# 2. checkpoint_dir read-only on node b
cp "$ITEST_DIR/data.txt" "$ITEST_DIR/b/data.txt"
mkdir -p "$ITEST_DIR/b/ck"
if mount -t tmpfs -o ro,size=1m tmpfs "$ITEST_DIR/b/ck" 2>/dev/null; then
    MOUNTED="$ITEST_DIR/b/ck"
    fix="umount '$ITEST_DIR/b/ck'"
elif [ "$(id -u)" != 0 ]; then
    chmod 0555 "$ITEST_DIR/b/ck"
    fix="chmod 0755 '$ITEST_DIR/b/ck'"
else
    fix=""
    echo "read-only checkpoint_dir: skipped (root without mount permission)"
fi
if [ -n "$fix" ]; then
    job readonly ck
    run readonly
    unfit_then_fit "read-only checkpoint_dir" "checkpoint_dir ck: not writable" "$fix"
    MOUNTED=""
    stop_all
fi

# 3. free space below two checkpoints on node b: a 64 KiB tmpfs where mounting is
#    permitted (the fix grows it), and always through the statvfs test hook
# (both nodes' checkpoint_dir emptied: case 2's job left node a's half of a
# checkpoint there, which a job whose other half is gone must refuse to load)
rm -rf "$ITEST_DIR/a/ck" "$ITEST_DIR/b/ck"; mkdir -p "$ITEST_DIR/b/ck"
if mount -t tmpfs -o size=64k tmpfs "$ITEST_DIR/b/ck" 2>/dev/null; then
    MOUNTED="$ITEST_DIR/b/ck"
    job smalldisk ck
    run smalldisk
    unfit_then_fit "small tmpfs" "free, 2 checkpoints of this job need" "mount -o remount,size=16m '$ITEST_DIR/b/ck'"
    stop_all
    umount "$ITEST_DIR/b/ck"
    MOUNTED=""
else
    echo "small tmpfs checkpoint_dir: skipped (no mount permission); the statvfs hook follows"
fi

rm -rf "$ITEST_DIR/a/ck" "$ITEST_DIR/b/ck"; mkdir -p "$ITEST_DIR/b/ck" # as above
echo 1000 > "$ITEST_DIR/free-b"
job lowspace ck
rm -rf "$ITEST_DIR/state"
start_daemon "$ITEST_DIR/lowspace.json" --token-file "$ITEST_DIR/token"
abs=$(pwd)
(cd "$ITEST_DIR/a" && exec "$abs/$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node a --devices cpu:1 \
    --state-dir "$ITEST_DIR/agent-state-a" --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD" \
    >> "$ITEST_DIR/agent-a.log" 2>&1) &
ITEST_PIDS="$ITEST_PIDS $!"
(cd "$ITEST_DIR/b" && MUSTER_TEST_FREE_BYTES_FILE="$ITEST_DIR/free-b" exec "$abs/$BUILD/muster-worker" \
    --daemon "127.0.0.1:$CTL" --node b --devices cpu:1 --state-dir "$ITEST_DIR/agent-state-b" \
    --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD" >> "$ITEST_DIR/agent-b.log" 2>&1) &
ITEST_PIDS="$ITEST_PIDS $!"
unfit_then_fit "low free space" "1000 B free, 2 checkpoints of this job need" "echo 100000000000 > '$ITEST_DIR/free-b'"
stop_all
echo "preflight_unfit: ok"
