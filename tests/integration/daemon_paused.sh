#!/bin/sh
# musterd paused (SIGSTOP, as a VM paused or a leader stopped short of its
# etcd lease's TTL) for a little longer than the job's heartbeat_timeout_ms
# (not much longer: the agents give up resuming their sessions then), then
# resumed: the agents' heartbeats of that time wait unread in its sockets,
# and the silence was musterd's own. It must not declare the nodes lost nor
# open a generation (which would spend a restart): the job runs on in
# generation 1, and musterd says it did not run. 2 agents x 2 fake ranks.
# itest: solo
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/paused.json" <<JSON
{"name": "paused", "nodes": 2, "max_restarts": 2, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 15000, "stop_grace_ms": 1000}
JSON
start_daemon "$ITEST_DIR/paused.json" --token-file "$ITEST_DIR/token"
for n in a b; do
    start_agent "$n" 2 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
done
wait_for 30 'd["state"] == "running" and d["generation"] == 1' || fail "the job did not run within 30 s"
sleep 1
kill -STOP "$DAEMON_PID"
sleep 2.2
kill -CONT "$DAEMON_PID"
echo "musterd stopped for 2.2 s (heartbeat_timeout_ms 2000)"
sleep 3
check 'd["state"] == "running" and d["generation"] == 1' \
    || { show_status >&2 || true; fail "the job left generation 1 after musterd's own pause"; }
! grep -q "no heartbeat for" "$ITEST_DIR/musterd.log" \
    || fail "musterd declared a node lost for its own pause: $(grep 'no heartbeat for' "$ITEST_DIR/musterd.log")"
grep -q "musterd did not run for" "$ITEST_DIR/musterd.log" || fail "musterd did not say it had not run"
echo "daemon_paused: ok"
