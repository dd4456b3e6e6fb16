#!/bin/sh
# Strangers without the token against a running 2-node job (loopback): a
# flood that holds 3000 connections to the control port, re-opened as they
# are closed, then connect/close churn, each for FLOOD_S seconds. During
# each, node b's agent is killed and started again: it must rejoin within
# its usual time (measured first without a flood) plus REJOIN_SLACK_MS, and
# never be told "full". musterd's peak RSS (VmHWM) is printed and must stay
# under RSS_MAX_MB (musterd.service's MemoryMax is set above it).
# itest: solo
set -eu
. tests/itest-lib.sh

FLOOD_S=${FLOOD_S:-8}
RSS_MAX_MB=${RSS_MAX_MB:-64}
REJOIN_SLACK_MS=${REJOIN_SLACK_MS:-3000}

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "flood", "nodes": 2, "max_restarts": 10, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "rejoin_timeout_ms": 30000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 20 'd["state"] == "running" and running == 4' || fail "the job did not run"
echo "job running: 2 nodes x 2 ranks"

rss_peak_mb() { awk '/^VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$DAEMON_PID/status"; }

# rejoin: kills node b's agent, starts it again, sets TOOK to the ms until
# b is joined with a fresh heartbeat and all 4 ranks run.
rejoin() {
    kill -9 "$B_PID"
    wait "$B_PID" 2>/dev/null || true
    wait_for 10 'node["b"]["state"] != "joined"' || fail "musterd did not see agent b go"
    t0=$(now_ms)
    start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
    B_PID=$AGENT_PID
    wait_for 30 'node["b"]["state"] == "joined" and node["b"]["heartbeat_age_ms"] < 1000 and running == 4' ||
        { show_status; tail -n 5 "$ITEST_DIR/agent-b.log"; fail "agent b did not rejoin within 30 s"; }
    TOOK=$(( $(now_ms) - t0 ))
}
B_PID=$AGENT_PID

rejoin
usual=$TOOK
echo "rejoin without a flood: $usual ms (musterd RSS peak so far $(rss_peak_mb) MB)"

flood() { # MODE ARGS...: the flood runs while b is killed and rejoins
    python3 tests/control-flood.py "$@" > "$ITEST_DIR/flood.log" 2>&1 &
    FLOOD=$!
    ITEST_PIDS="$ITEST_PIDS $FLOOD"
    sleep 2 # the flood at full strength before the kill
    rejoin
    took=$TOOK
    wait "$FLOOD" || fail "the flood client failed: $(cat "$ITEST_DIR/flood.log")"
    rss=$(rss_peak_mb)
    echo "$1 flood: $(cat "$ITEST_DIR/flood.log"); agent b rejoined in $took ms; musterd RSS peak $rss MB"
    if [ "$1" = hold ]; then # the flood's size is claimed: it must have held them all at once
        peak=$(sed -n 's/.*, \([0-9]*\) held at most$/\1/p' "$ITEST_DIR/flood.log")
        [ "${peak:-0}" -ge "$4" ] || fail "hold flood: ${peak:-no} connections held at once, not $4"
    fi
    [ "$took" -le $((usual + REJOIN_SLACK_MS)) ] ||
        fail "$1 flood: rejoin took $took ms, over the usual $usual ms + $REJOIN_SLACK_MS ms"
    awk -v r="$rss" -v m="$RSS_MAX_MB" 'BEGIN { exit !(r < m) }' ||
        fail "$1 flood: musterd's RSS peak $rss MB is over $RSS_MAX_MB MB"
}
: > "$ITEST_DIR/agent-b.log"
flood hold 127.0.0.1 "$CTL" 3000 "$FLOOD_S"
flood churn 127.0.0.1 "$CTL" "$FLOOD_S"
! grep -q "full" "$ITEST_DIR/agent-b.log" || fail "agent b was told full: $(grep -m1 full "$ITEST_DIR/agent-b.log")"
check 'd["state"] == "running"' || { show_status; fail "the job is not running after the floods"; }
evicted=$(grep -c "evicted" "$ITEST_DIR/musterd.log" || true)
echo "musterd logged $evicted eviction lines (rate-limited); job running"
echo "control_flood: ok"
