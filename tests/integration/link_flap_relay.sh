#!/bin/sh
# Link flaps without network namespaces: node a's agent reaches musterd
# through tests/flap-relay.py, a loopback relay that cuts the link on
# SIGUSR1 and restores it on SIGUSR2, after which the connections that lived
# through the cut stay silent 3 s more, as TCP's retransmission backoff keeps
# them after a real cut. A connection's own recovery therefore comes too
# late for heartbeat_timeout_ms (2 s); only a new one can be in time.
#  - 3 cuts of 1.2 s: no restart, generation 1 throughout, the node's session
#    resumed each time;
#  - a cut of 3 s, longer than the timeout: node a is lost, generation 2
#    opens and runs once the link is back.
# Runs anywhere (python3 on loopback); link_flap.sh does the same through
# a real router namespace where namespaces are permitted.
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "flap-relay", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 10000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
RELAY=$(free_port)
python3 tests/flap-relay.py "$RELAY" "$CTL" --stall-s 3 --life-s 120 > "$ITEST_DIR/relay.log" 2>&1 &
RELAY_PID=$!
ITEST_PIDS="$ITEST_PIDS $RELAY_PID"
i=0
until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $RELAY), timeout=1).close()" 2>/dev/null ||
    [ $i -ge 50 ]; do sleep 0.1; i=$((i + 1)); done

real_ctl=$CTL
CTL=$RELAY start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
CTL=$real_ctl
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 4' || fail "generation 1 not running"
echo "generation 1 running: node a through the relay"

cut() { # SECONDS
    kill -USR1 "$RELAY_PID"
    sleep "$1"
    kill -USR2 "$RELAY_PID"
}

n=0
while [ $n -lt 3 ]; do
    n=$((n + 1))
    cut 1.2
    wait_for 5 'node["a"]["state"] == "joined" and node["a"]["heartbeat_age_ms"] < 1000 and running == 4' ||
        { show_status; fail "flap $n: node a not back and running within 5 s"; }
    check 'd["generation"] == 1 and d["restarts"] == 0 and d["state"] == "running"' ||
        { show_status; fail "flap $n (1.2 s, the old connection silent 3 s more) cost a restart"; }
    echo "flap $n: link cut 1.2 s, generation 1 kept, no restart"
    sleep 1
done
resumed=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -o 'node a resumed its session[^"]*' || true)
echo "$resumed" | sed 's/^/  /'
[ "$(echo "$resumed" | grep -c resumed)" -eq 3 ] || fail "expected 3 resumed sessions"

cut 3
wait_for 10 'd["generation"] == 2 and d["restarts"] == 1' || { show_status; fail "a 3 s outage did not open generation 2"; }
wait_for 15 'd["state"] == "running" and d["generation"] == 2 and running == 4 and node["a"]["state"] == "joined"' ||
    { show_status; fail "the job did not run again after the 3 s outage"; }
echo "outage 3 s (over the timeout): node a lost, generation 2 running after the link came back"
echo "link flaps through the relay: ok"
