#!/bin/sh
# The worst moment for a link cut: right after the daemon answered a
# heartbeat, so that the agent's stall clock starts only at the next one
# that asks. Node a reaches musterd through tests/flap-relay.py, which cuts
# the link right after the next answer it relays (SIGHUP) for 0.2 s, the
# outage PROTOCOL.md says costs nothing (heartbeat_timeout_ms −
# heartbeat_interval_ms − about 0.1 s) at a small timeout, where the stall
# time stays 200 ms (100 ms / 440 ms): the connection that lived through
# the cut stays silent 3 s more, so only a new one is in time. 16 cuts: the
# session is resumed each time, and no cut costs a restart. The agent must
# ask on the next heartbeat here: asking every other one, it sees the stall
# 400-500 ms after the answer, the daemon loses the node 440-540 ms after
# it, and some cuts (which, depends on the timers' phases) cost a restart.
# itest: solo
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "cut-after-answer", "nodes": 2, "max_restarts": 20, "heartbeat_interval_ms": 100,
 "heartbeat_timeout_ms": 440, "lease_ms": 10000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_relay tests/flap-relay.py --stall-s 3 --cut-s 0.2 --life-s 120

real_ctl=$CTL
CTL=$RELAY start_agent a 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
CTL=$real_ctl
start_agent b 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 2' || fail "generation 1 not running"
echo "generation 1 running: node a through the relay"

n=0
while [ $n -lt 16 ]; do
    n=$((n + 1))
    kill -HUP "$RELAY_PID"
    sleep 0.8
    wait_for 5 'node["a"]["state"] == "joined" and running == 2' || { show_status; fail "cut $n: node a not back"; }
    check 'd["generation"] == 1 and d["restarts"] == 0' ||
        { show_status; fail "cut $n (0.2 s right after an answer) cost a restart"; }
    sleep 0.5
done
resumed=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -o 'node a resumed its session' | wc -l)
[ "$resumed" -eq 16 ] || fail "expected 16 resumed sessions, saw $resumed"
curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -o 'node a resumed[^"]*' | sort | uniq -c
echo "16 cuts of 0.2 s right after an answer: each session resumed, generation 1 throughout"
echo "link cut after an answer: ok"
