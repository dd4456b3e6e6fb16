#!/bin/sh
# Control-plane latencies on loopback, medians over RUNS (default 10) runs of
# musterd + 2 agents x 2 fake ranks with the default timing keys
# (heartbeat_interval_ms 1000):
#   formation: agents started -> /v1/status says generation 1 running, 4 ranks
#   recovery:  SIGKILL of one rank -> generation 2 running, 4 ranks
# The end of each interval is the time stamp of musterd's own
# "generation_running" event (ms resolution), not the moment a poll saw it.
set -eu
RUNS=${RUNS:-10}
INTERVAL_MS=${INTERVAL_MS:-1000}
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "bench", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": $INTERVAL_MS}
JSON
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
make_token "$ITEST_DIR/token"

poll_until() { # SECONDS PYEXPR: like wait_for, 20 ms period
    limit=$(( $1 * 50 )); i=0
    while [ $i -lt $limit ]; do
        check "$2" && return 0
        sleep 0.02; i=$((i + 1))
    done
    return 1
}

wall_ms() { date +%s%3N; }
# event_ms GEN: wall-clock ms of the event saying generation GEN runs.
event_ms() {
    curl -sf "http://127.0.0.1:$HTTP/v1/events" | python3 -c '
import json, sys, datetime
g = int(sys.argv[1])
for e in json.load(sys.stdin)["events"]:
    if e["kind"] == "generation_running" and e["generation"] == g:
        t = datetime.datetime.strptime(e["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
        print(int(t.timestamp() * 1000))
        break' "$1"
}

form=""; recov=""
run=1
while [ $run -le "$RUNS" ]; do
    rm -rf "$ITEST_DIR/state" "$ITEST_DIR"/pids-*
    start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
    t0=$(wall_ms)
    start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"; A=$AGENT_PID
    start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"; B=$AGENT_PID
    poll_until 30 'd["state"] == "running" and d["generation"] == 1 and running == 4' || fail "run $run: no generation 1"
    t1=$(event_ms 1)
    sleep 0.3
    t2=$(wall_ms)
    kill -9 "$(cat "$ITEST_DIR/pids-b/rank-3.pid")"
    poll_until 30 'd["state"] == "running" and d["generation"] == 2 and running == 4' || fail "run $run: no generation 2"
    t3=$(event_ms 2)
    form="$form $((t1 - t0))"; recov="$recov $((t3 - t2))"
    echo "run $run: formation $((t1 - t0)) ms, recovery $((t3 - t2)) ms"
    kill -9 "$A" "$B" "$DAEMON_PID" 2>/dev/null || true
    pkill -9 -f "$BUILD/tests/fake-rank" 2>/dev/null || true
    sleep 0.2
    run=$((run + 1))
done
median() { echo "$@" | tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo "control plane (heartbeat_interval_ms=$INTERVAL_MS, $RUNS runs): median formation $(median $form) ms, median recovery $(median $recov) ms"
