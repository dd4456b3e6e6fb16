#!/bin/sh
# musterd restarts while a rank's exit waits in its agent's exit queue
# (proto/PROTOCOL.md, "Rank exits survive a stalled link"). 2 agents x 2
# fake ranks; musterd is frozen (SIGSTOP), a rank of node a crashes
# (SIGUSR1 makes fake-rank exit 3 with its own message), then musterd is
# SIGKILLed and started again on the same ports and state dir:
#  - the crash 0.1 s into the freeze: the agent still takes the link for up,
#    so the RANK_EXIT goes into a connection nobody will read;
#  - the crash once the agent has set the stalled link aside: the exit waits
#    unsent.
# Each time the restarted musterd resumes the job, the agent's HELLO reports
# the generation of the unconfirmed exit and the exit follows WELCOME: the
# next generation names that rank and its own reason, not "came back (or
# rejoined) without its ranks" nor a node lost, and the job runs again.
# itest: solo
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "restart-exit", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 3000, "lease_ms": 10000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
AGENT_A=$AGENT_PID
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 4' || fail "generation 1 not running"
# The last rank of node a's block is the one that crashes.
VICTIM=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/ranks" |
    python3 -c 'import json,sys; print(max(r["rank"] for r in json.load(sys.stdin)["ranks"] if r["node"] == "a"))')
echo "generation 1 running; rank $VICTIM of node a will crash"

restart_daemon() {
    kill -9 "$DAEMON_PID"
    wait "$DAEMON_PID" 2>/dev/null || true
    "$BUILD/musterd" --job "$ITEST_DIR/job.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" \
        --state-dir "$ITEST_DIR/state" --token-file "$ITEST_DIR/token" >> "$ITEST_DIR/musterd.log" 2>&1 &
    DAEMON_PID=$!
    ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
    wait_for 10 'True' || fail "the restarted musterd did not serve /v1/status within 10 s"
}

# failure: the job's reason and last_failure, as /v1/status gives them.
failure() {
    status | python3 -c 'import json,sys; d=json.load(sys.stdin); print("  reason:", d["reason"]); print("  last_failure:", d["last_failure"])'
}

# mark_log FILE PATTERN, then wait_log FILE SECONDS PATTERN: true once FILE
# has more lines matching PATTERN than it had at mark_log.
mark_log() { marked=$(grep -c "$2" "$1" || true); }
wait_log() {
    i=0
    while [ "$(grep -c "$3" "$1" || true)" -le "$marked" ] && [ $i -lt $(( $2 * 20 )) ]; do
        sleep 0.05; i=$((i + 1))
    done
    [ "$(grep -c "$3" "$1" || true)" -gt "$marked" ]
}

# crash_while_frozen GENERATION WHEN: WHEN is "joined" (the link still up) or "set-aside".
crash_while_frozen() {
    gen=$1; next=$(($1 + 1))
    pid=$(cat "$ITEST_DIR/pids-a/rank-$VICTIM.pid")
    pid_alive "$pid" || fail "rank $VICTIM of node a (pid $pid) is not running"
    queued="rank $VICTIM's exit is sent once the daemon is reachable again"
    queued_before=$(grep -c "$queued" "$ITEST_DIR/agent-a.log" || true)
    mark_log "$ITEST_DIR/agent-a.log" 'no answer from the daemon'
    kill -STOP "$DAEMON_PID"
    if [ "$2" = joined ]; then
        sleep 0.1
    else
        wait_log "$ITEST_DIR/agent-a.log" 5 'no answer from the daemon' ||
            fail "node a's agent did not notice the frozen musterd within 5 s"
    fi
    kill -USR1 "$pid"
    wait_exit "$pid" 2 || fail "rank $VICTIM (pid $pid) did not crash on SIGUSR1 within 2 s"
    sleep 0.2 # the agent has handled the exit: written into the frozen connection, or queued
    queued_now=$(grep -c "$queued" "$ITEST_DIR/agent-a.log" || true)
    if [ "$2" = joined ] && [ "$queued_now" -ne "$queued_before" ]; then
        fail "rank $VICTIM's exit was queued unsent: the link was already set aside"
    elif [ "$2" = set-aside ] && [ "$queued_now" -eq "$queued_before" ]; then
        fail "rank $VICTIM's exit went out although the link was set aside"
    fi
    restart_daemon
    wait_for 15 "d['generation'] == $next" ||
        { show_status; fail "rank $VICTIM's crash in generation $gen did not open generation $next after the restart"; }
    check "((d['last_failure'] or {}).get('rank') == $VICTIM and d['last_failure']['node'] == 'a' and
           d['last_failure']['generation'] == $gen and d['last_failure']['how'] == 'exited with status 3' and
           'as asked (SIGUSR1)' in (d['last_failure']['reason'] or ''))" ||
        { failure; fail "generation $next: the failure is not rank $VICTIM's own exit (lost with musterd?)"; }
    if curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -q 'without its ranks\|did not rejoin\|lost:'; then
        failure
        fail "generation $gen failed for another reason than rank $VICTIM's exit"
    fi
    wait_for 15 "d['state'] == 'running' and d['generation'] == $next and running == 4" ||
        { show_status; fail "generation $next not running after the restart"; }
    echo "crash with the link $2, musterd SIGKILLed and started again: generation $next running for rank $VICTIM's" \
        "own exit ($(status | python3 -c 'import json,sys; f=json.load(sys.stdin)["last_failure"]; print(f["how"] + ": " + f["reason"])'))"
}
crash_while_frozen 1 joined
sleep 1
crash_while_frozen 2 set-aside
pid_alive "$AGENT_A" || fail "node a's agent died"
echo "musterd restart with a pending rank exit: ok"
