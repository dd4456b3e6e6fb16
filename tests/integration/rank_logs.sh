#!/bin/sh
# Rank logs: every rank's stdout and stderr land in its agent's state
# directory (NODE/gen-G/rank-R/output.log, turned over past log_max_mb), and
# `musterctl logs` shows them through musterd: the right rank only, --tail,
# --follow into the next generation after a restart, clear errors.
set -eu
. tests/itest-lib.sh

echo '{"name": "logs", "nodes": 2, "max_restarts": 3}' > "$ITEST_DIR/job.json"
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
# Two lines a step on stdout; rank 1 crashes at step 60 of generation 1, so generation 2 follows.
RANK="$BUILD/tests/fake-rank --step-ms 20 --lines 2 --crash-at-step 60 --crash-rank 1"
start_agent a 2 --token-file "$ITEST_DIR/token" --state-dir "$ITEST_DIR/state-a" --rank-cmd "$RANK"
# Node b (ranks 2, 3) turns its logs over past 0.004 MiB (4194 bytes): about a second of output.
CAP=4194
start_agent b 2 --token-file "$ITEST_DIR/token" --state-dir "$ITEST_DIR/state-b" --log-max-mb 0.004 \
    --rank-cmd "$RANK"
CTL="$BUILD/musterctl --server http://127.0.0.1:$HTTP"
wait_for 15 'running == 4' || fail "the 4 ranks of generation 1 did not run within 15 s"

# A follower from generation 1 on; it must go on into generation 2.
$CTL logs 1 -f > "$ITEST_DIR/follow.out" 2> "$ITEST_DIR/follow.err" &
FOLLOW=$!
ITEST_PIDS="$ITEST_PIDS $FOLLOW"

wait_for 15 'd["generation"] == 2 and running == 4' || fail "generation 2 did not run within 15 s of rank 1's crash"
sleep 0.5

# The newest generation of rank 1, and nothing of rank 0.
$CTL logs 1 > "$ITEST_DIR/logs1.out" || fail "musterctl logs 1 exited $?"
grep -q '^fake-rank 1 generation 2 step [0-9]* line 1$' "$ITEST_DIR/logs1.out" \
    || fail "musterctl logs 1 does not show rank 1's generation 2 lines: $(head -c 300 "$ITEST_DIR/logs1.out")"
grep -q 'fake-rank 0' "$ITEST_DIR/logs1.out" && fail "musterctl logs 1 shows rank 0's lines"
# Generation 1, both streams in one log: stdout lines and the crash note from stderr, in order.
$CTL logs 1 --generation 1 > "$ITEST_DIR/gen1.out" || fail "musterctl logs 1 --generation 1 exited $?"
grep -q '^fake-rank 1 generation 1 step 59 line 1$' "$ITEST_DIR/gen1.out" || fail "generation 1's last stdout line is missing"
tail -n 1 "$ITEST_DIR/gen1.out" | grep -q 'crashing at step 60' || fail "generation 1 does not end with the crash (stderr)"
# --tail bounds the bytes.
$CTL logs 0 --tail 100 > "$ITEST_DIR/tail.out" || fail "musterctl logs 0 --tail 100 exited $?"
n=$(wc -c < "$ITEST_DIR/tail.out")
[ "$n" -gt 0 ] && [ "$n" -le 100 ] || fail "--tail 100 printed $n bytes"
grep -q '^fake-rank 0 generation 2 step' "$ITEST_DIR/tail.out" || fail "--tail 100: $(cat "$ITEST_DIR/tail.out")"

# Errors: exit 1 with the daemon's words; usage errors exit 2.
set +e
$CTL logs 9 > /dev/null 2> "$ITEST_DIR/err9"; rc=$?
set -e
[ "$rc" -eq 1 ] || fail "musterctl logs 9 exited $rc, expected 1"
grep -q 'no such rank: rank 9 is not in generation 2' "$ITEST_DIR/err9" || fail "unknown rank: $(cat "$ITEST_DIR/err9")"
set +e
$CTL logs 1 --generation 7 > /dev/null 2> "$ITEST_DIR/err7"; rc=$?
set -e
[ "$rc" -eq 1 ] || fail "musterctl logs 1 --generation 7 exited $rc, expected 1"
grep -q 'no log: no log of rank 1 in generation 7 on node a (HTTP 404)' "$ITEST_DIR/err7" \
    || fail "missing generation: $(cat "$ITEST_DIR/err7")"
for bad in "logs x" "logs" "logs 1 --tail 0" "logs 1 2" "status --tail 5"; do
    set +e
    $CTL $bad > /dev/null 2>&1; rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "musterctl $bad exited $rc, expected 2"
done

# The files under the state directories.
log1=$ITEST_DIR/state-a/a/gen-1/rank-1/output.log
[ -f "$log1" ] || fail "no $log1"
[ "$(stat -c %a "$log1")" = 600 ] || fail "$log1 has mode $(stat -c %a "$log1")"
grep -q '^fake-rank 1 generation 1 step 1 line 0$' "$log1" || fail "$log1 lacks rank 1's first line"
grep -q 'fake-rank 0' "$log1" && fail "$log1 holds rank 0's lines"
[ -f "$ITEST_DIR/state-a/a/gen-2/rank-0/output.log" ] || fail "no log of rank 0 in generation 2"

# Node b turns its logs over: two files, each within the cap.
old=$ITEST_DIR/state-b/b/gen-2/rank-2/output.log.1
i=0; while [ ! -f "$old" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -f "$old" ] || fail "rank 2's log of generation 2 was not turned over within 10 s"
for f in "$old" "$ITEST_DIR/state-b/b/gen-2/rank-2/output.log"; do
    n=$(wc -c < "$f")
    [ "$n" -le "$CAP" ] || fail "$f holds $n bytes, over the cap of $CAP"
done
# Through musterd: both files, without a gap (offsets run on across the turnover; one
# more turnover while musterctl reads may add a file's worth).
$CTL logs 2 --tail 1000000 > "$ITEST_DIR/logs2.out" || fail "musterctl logs 2 --tail 1000000 exited $?"
n=$(wc -c < "$ITEST_DIR/logs2.out")
[ "$n" -gt "$CAP" ] && [ "$n" -le $((3 * CAP)) ] || fail "rank 2's kept log is $n bytes (cap $CAP)"
sed -n 's/^fake-rank 2 generation 2 step \([0-9]*\) line \([01]\)$/\1 \2/p' "$ITEST_DIR/logs2.out" | awk '
    { k = $1 * 2 + $2; if (NR > 1 && k != last + 1) { print "gap after step " last / 2; bad = 1 } last = k }
    END { exit bad }' || fail "rank 2's log through musterd is not contiguous"

# The follower saw generation 1 end and went on into generation 2; SIGINT ends it with status 0.
sleep 0.5
kill -INT "$FOLLOW"
i=0; while pid_alive "$FOLLOW" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
pid_alive "$FOLLOW" && fail "musterctl logs -f did not exit within 10 s of SIGINT"
set +e
wait "$FOLLOW"; rc=$?
set -e
[ "$rc" -eq 0 ] || fail "musterctl logs -f exited $rc on SIGINT: $(cat "$ITEST_DIR/follow.err")"
first_line() { grep -n -m 1 -e "$1" "$ITEST_DIR/follow.out" | cut -d: -f1; }
crash=$(first_line 'crashing at step 60')
sep=$(first_line '^--- rank 1, generation 2 ---$')
gen2=$(first_line '^fake-rank 1 generation 2 step')
[ -n "$crash" ] && [ -n "$sep" ] && [ -n "$gen2" ] && [ "$crash" -lt "$sep" ] && [ "$sep" -lt "$gen2" ] \
    || fail "the follower did not print the crash (line ${crash:-none}), the separator (${sep:-none}), then generation 2 (${gen2:-none})"
grep -q '^fake-rank 1 generation 1 step 59 line 1$' "$ITEST_DIR/follow.out" \
    || fail "the follower missed generation 1's last lines"

# Shutdown with a log request waiting on a node that does not answer (stopped):
# musterd answers it and still closes its loop cleanly.
kill -STOP "$AGENT_PID"
CURLS=""
for k in $(seq 1 30); do
    curl -s --max-time 10 -o "$ITEST_DIR/pending$k.out" -w '%{http_code}' \
        "http://127.0.0.1:$HTTP/v1/ranks/2/log" > "$ITEST_DIR/pending$k.code" 2>/dev/null &
    CURLS="$CURLS $!"
done
sleep 0.5
kill -TERM "$DAEMON_PID"
i=0; while pid_alive "$DAEMON_PID" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
pid_alive "$DAEMON_PID" && fail "musterd did not exit within 5 s of SIGTERM with log requests pending"
wait "$DAEMON_PID" || fail "musterd exited non-zero after SIGTERM"
grep -q 'stopped cleanly' "$ITEST_DIR/musterd.log" || fail "musterd did not report a clean loop close"
kill -CONT "$AGENT_PID"
set +e
for c in $CURLS; do wait "$c"; done
set -e
# Every one is answered before the REST server stops (it used to close them unanswered).
for k in $(seq 1 30); do
    code=$(cat "$ITEST_DIR/pending$k.code")
    [ "$code" = 503 ] && grep -q '"shutting down"' "$ITEST_DIR/pending$k.out" \
        || fail "log request $k pending at shutdown got HTTP $code: $(cat "$ITEST_DIR/pending$k.out")"
done

echo "rank logs: ok"
