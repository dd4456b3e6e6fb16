#!/bin/sh
# Rank 0's unique id made while the agent's link to musterd is stalled: the
# agent holds it and sends it once its session is back on a new connection
# (WELCOME), or the generation's ranks wait for it until they give up.
# musterd is SIGSTOPped for 1.8 s right after the ASSIGN; rank 0 (fake-rank
# --uid-delay-ms 1600) makes its id while the agent is resuming its session
# (a stall is seen within three quarters of heartbeat_timeout_ms, 1.5 s).
# itest: solo
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/uid.json" <<JSON
{"name": "uid-resume", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 15000, "stop_grace_ms": 500}
JSON
start_daemon "$ITEST_DIR/uid.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50 --uid-delay-ms 1600"
wait_log 30 "$ITEST_DIR/agent-a.log" "fake-rank 0: assigned, generation 1" || fail "rank 0 was not assigned generation 1"
kill -STOP "$DAEMON_PID"
sleep 1.8
kill -CONT "$DAEMON_PID"
grep -q "rank 0 created the unique id of generation 1 but the daemon is not reachable" "$ITEST_DIR/agent-a.log" \
    || fail "the unique id was not made while the link was down (the scenario did not happen): $(grep -E 'resum|unique' "$ITEST_DIR/agent-a.log")"
wait_event 15 "generation 1: unique id from rank 0 sent to" || fail "the unique id made while the link was down never reached musterd"
wait_for 15 'd["state"] == "running" and all((r["step"] or 0) >= 5 for r in d["ranks"])' \
    || fail "the ranks did not train after the unique id came"
grep -q "sending rank 0's unique id of generation 1, made while the daemon was unreachable" "$ITEST_DIR/agent-a.log" \
    || fail "the agent did not say it sent the held unique id"
echo "uid_across_resume: the unique id made during the stall reached musterd after the session came back: ok"
