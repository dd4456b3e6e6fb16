#!/bin/sh
# musterd's state disk slow to make writes durable (every fsync 1.2 s
# longer, as on a loaded disk): frames that follow a state change wait
# until it is durable (server_hold), and for that time the agents heard
# nothing from musterd, not even the answers to their heartbeats, took the
# link for stalled and resumed their sessions, whose WELCOME waited too:
# both agents lost at once. Liveness must not wait for the disk: a rank
# killed twice, each recovery persisted slowly, and no agent resumes,
# rejoins or is lost. (b) A disk stuck: once a write has waited lease_ms,
# liveness stops too and the agents fence themselves. (c) The job's end on
# the slow disk, under --exit-on-end (as `muster run` and cloud mode start
# musterd): the agents' shutdown command waits for the completed state to be
# durable, and musterd must not close their links before it has left, or
# they retry a daemon gone until something kills them. 2 agents x 2 fake
# ranks, ~30 s.
# itest: solo
set -eu
. tests/itest-lib.sh

if [ ! -f "$BUILD/tests/slow_fsync.so" ]; then # a sanitizer build: its musterd takes no LD_PRELOAD before ASan
    echo "slow_state_disk: skipped: no $BUILD/tests/slow_fsync.so (sanitizer builds make none)"
    exit 0
fi
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/slowdisk.json" <<JSON
{"name": "slowdisk", "nodes": 2, "max_restarts": 4, "heartbeat_interval_ms": 100,
 "heartbeat_timeout_ms": 2000, "lease_ms": 15000, "stop_grace_ms": 1000, "restart_backoff_ms": 0}
JSON
# slow_job JSON MS: musterd, its every fsync MS ms longer ($ITEST_DIR/fsync_ms,
# read by slow_fsync.so at each call: changed later, the disk changes), and
# agents a, b with 2 fake ranks each; returns once generation 1 runs.
slow_job() {
    echo "$2" > "$ITEST_DIR/fsync_ms"
    # musterd's environment, and only its (an absolute path: the python helpers of start_daemon take it too)
    LD_PRELOAD="$(cd "$BUILD" && pwd)/tests/slow_fsync.so" MUSTER_TEST_FSYNC_FILE="$ITEST_DIR/fsync_ms"
    export LD_PRELOAD MUSTER_TEST_FSYNC_FILE
    start_daemon "$1" --token-file "$ITEST_DIR/token"
    unset LD_PRELOAD MUSTER_TEST_FSYNC_FILE
    for n in a b; do
        start_agent "$n" 2 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
    done
    wait_for 40 'd["state"] == "running" and d["generation"] == 1' || fail "$1: the job did not run within 40 s"
}
slow_job "$ITEST_DIR/slowdisk.json" 1200
for g in 2 3; do
    victim=$(pgrep -P "$AGENT_PID" -f fake-rank | head -n 1)
    [ -n "$victim" ] || fail "no rank under agent b"
    kill -9 "$victim"
    wait_for 40 "d['state'] == 'running' and d['generation'] == $g" || fail "generation $g did not run within 40 s"
done
echo "two ranks killed, each recovery written to a disk 1.2 s slow per fsync: generation 3 running"
for n in a b; do
    ! grep -q "resuming the session\|rejoining\|lost the daemon" "$ITEST_DIR/agent-$n.log" \
        || fail "agent $n lost its link to a musterd whose disk was slow: $(grep -m1 'resuming the session\|rejoining\|lost the daemon' "$ITEST_DIR/agent-$n.log")"
done
! grep -q "no heartbeat for\|session resumed" "$ITEST_DIR/musterd.log" \
    || fail "musterd: $(grep -m1 'no heartbeat for\|session resumed' "$ITEST_DIR/musterd.log")"
stop_all

# (b) A disk stuck (every fsync 60 s longer): the liveness echo stops once a
# state write has waited lease_ms (4 s) without progress, and the agents
# fence themselves as they would for a musterd gone: nothing more is decided.
rm -rf "$ITEST_DIR/state"
sed 's/"lease_ms": 15000/"lease_ms": 4000/' "$ITEST_DIR/slowdisk.json" > "$ITEST_DIR/stuck.json"
slow_job "$ITEST_DIR/stuck.json" 0
echo 60000 > "$ITEST_DIR/fsync_ms" # read by slow_fsync.so at each call: from now on the disk is stuck
victim=$(pgrep -P "$AGENT_PID" -f fake-rank | head -n 1)
kill -9 "$victim"
wait_log 20 "$ITEST_DIR/agent-a.log" "SELF-FENCING" || fail "(b) agent a did not fence itself while musterd's state could not be written"
echo "(b) disk stuck: agent a fenced itself $(grep -c SELF-FENCING "$ITEST_DIR/agent-a.log") time(s) once lease_ms passed"
stop_all

# (c) The end, 1.2 s per fsync: musterd exits with the job, and the agents
# with it, told (exit 0), not left retrying its address.
rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
sed 's/"max_restarts": 4/"max_restarts": 0/' "$ITEST_DIR/slowdisk.json" > "$ITEST_DIR/end.json"
echo 1200 > "$ITEST_DIR/fsync_ms"
LD_PRELOAD="$(cd "$BUILD" && pwd)/tests/slow_fsync.so" MUSTER_TEST_FSYNC_FILE="$ITEST_DIR/fsync_ms"
export LD_PRELOAD MUSTER_TEST_FSYNC_FILE
start_daemon "$ITEST_DIR/end.json" --token-file "$ITEST_DIR/token" --exit-on-end
unset LD_PRELOAD MUSTER_TEST_FSYNC_FILE
for n in a b; do
    start_agent "$n" 2 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --steps 20 --step-ms 20"
    eval "END_$n=\$AGENT_PID"
done
wait_exit "$DAEMON_PID" 40 || fail "(c) musterd --exit-on-end still runs 40 s after the start of a 20-step job"
rc=0; wait "$DAEMON_PID" || rc=$?
[ "$rc" -eq 0 ] || fail "(c) musterd exited $rc at the job's end, expected 0: $(tail -n 3 "$ITEST_DIR/musterd.log")"
for n in a b; do
    eval "p=\$END_$n"
    wait_exit "$p" 10 || fail "(c) agent $n still runs 10 s after musterd ended the job: $(tail -n 2 "$ITEST_DIR/agent-$n.log")"
    rc=0; wait "$p" || rc=$?
    [ "$rc" -eq 0 ] || fail "(c) agent $n exited $rc after the job's end, expected 0: $(tail -n 2 "$ITEST_DIR/agent-$n.log")"
    ! grep -q "cannot reach daemon" "$ITEST_DIR/agent-$n.log" \
        || fail "(c) agent $n was not told the job ended: $(grep -m1 'cannot reach daemon' "$ITEST_DIR/agent-$n.log")"
done
echo "(c) job's end on the slow disk: musterd exited 0 and both agents were told (exit 0)"
echo "slow_state_disk: ok"
