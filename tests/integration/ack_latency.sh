#!/bin/sh
# A daemon that answers late keeps its agents' leases. Node a's agent reaches
# musterd through tests/lag-relay.py, which delivers what the daemon sends
# 550 ms and 950 ms late in turn (a busy daemon or a long path: under one
# heartbeat interval, under a quarter of the timeout, so no stall either),
# with lease_ms at its least, twice the interval (1 s / 2 s; timeout 5 s).
# The daemon hears every heartbeat at once; the agent hears an answer at
# most an interval and a half apart when it asks on every heartbeat, and
# must never go lease_ms without one: no lease lost, no self-fencing, no
# restart, generation 1 throughout 12 s.
# itest: solo
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "ack-latency", "nodes": 1, "max_restarts": 5, "heartbeat_interval_ms": 1000,
 "heartbeat_timeout_ms": 5000, "lease_ms": 2000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_relay tests/lag-relay.py --delays-ms 550,950 --life-s 60

real_ctl=$CTL
CTL=$RELAY start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
CTL=$real_ctl
wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 2' || fail "generation 1 not running"
echo "generation 1 running: the daemon's frames reach node a 550 and 950 ms late in turn"

i=0
while [ $i -lt 24 ]; do
    sleep 0.5
    i=$((i + 1))
    if grep -q 'no frame from the daemon\|SELF-FENCING' "$ITEST_DIR/agent-a.log"; then
        grep 'no frame from the daemon\|SELF-FENCING\|no answer' "$ITEST_DIR/agent-a.log" | head -5 >&2
        fail "node a lost its lease to a daemon that answers every heartbeat that asks, under an interval late"
    fi
    check 'd["state"] == "running" and d["generation"] == 1 and d["restarts"] == 0' ||
        { show_status; fail "generation 1 did not run on undisturbed"; }
done
echo "12 s with answers 550/950 ms late, lease 2 s: no lease lost, generation 1 throughout"
echo "ack latency: ok"
