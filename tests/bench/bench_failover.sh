#!/bin/sh
# Failover, measured: three etcd members and two musterd on loopback (the
# job's state in etcd, lease TTL 3 s), 2 agents x 2 fake ranks given both
# daemons. RUNS times (default 10) the leader is SIGKILLed; the figure is
# the time from the kill to the moment both agents are joined to the new
# leader (the next heal is possible from then on), as the agents log it;
# the killed musterd is started again and stands by. Then musterd's cost
# per state write: the state file (two fsyncs) against etcd (a conditional
# transaction), tests/store-bench. Skipped without etcd.
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-10}
. tests/itest-lib.sh
. tests/etcd-cluster.sh
command -v etcd > /dev/null || { echo "== failover: no etcd (apt-get install etcd-server): skipped"; exit 0; }
make_token "$ITEST_DIR/token"
etcd_start
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "bench", "nodes": 2, "max_restarts": 100, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 3000, "lease_ms": 15000, "stop_grace_ms": 1000}
JSON
CTL1=$(free_port); CTL2=$(free_port)
start_ha() { # N
    eval "ctl=\$CTL$1"
    "$BUILD/musterd" --job "$ITEST_DIR/job.json" --listen "127.0.0.1:$ctl" --http "127.0.0.1:0" \
        --state-dir "$ITEST_DIR/state$1" --token-file "$ITEST_DIR/token" --store "etcd://$ETCD_ENDPOINTS" \
        >> "$ITEST_DIR/musterd$1.log" 2>&1 &
    eval "D$1=$!"
    ITEST_PIDS="$ITEST_PIDS $!"
}
count() { n=$(grep -c "$1" "$2" 2>/dev/null || true); echo "${n:-0}"; }
start_ha 1
i=0; until [ "$(count 'leading job' "$ITEST_DIR/musterd1.log")" -ge 1 ]; do
    i=$((i + 1)); [ $i -lt 400 ] || fail "musterd 1 did not lead"; sleep 0.05; done
start_ha 2
CTL=$CTL1 # start_agent's default --daemon, replaced by the list below
for n in a b; do
    start_agent "$n" 2 --daemon "127.0.0.1:$CTL1,127.0.0.1:$CTL2" --token-file "$ITEST_DIR/token" \
        --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
done
i=0; until [ "$(count "joined daemon at 127.0.0.1:$CTL1 " "$ITEST_DIR/agent-a.log")" -ge 1 ] &&
           [ "$(count "joined daemon at 127.0.0.1:$CTL1 " "$ITEST_DIR/agent-b.log")" -ge 1 ]; do
    i=$((i + 1)); [ $i -lt 400 ] || fail "the agents did not join"; sleep 0.05; done
sleep 2
leader=1; times=""
for r in $(seq 1 "$RUNS"); do
    other=$((3 - leader))
    eval "pid=\$D$leader; octl=\$CTL$other"
    before_a=$(count "joined daemon at 127.0.0.1:$octl " "$ITEST_DIR/agent-a.log")
    before_b=$(count "joined daemon at 127.0.0.1:$octl " "$ITEST_DIR/agent-b.log")
    kill -9 "$pid"; t0=$(now_ms)
    i=0; until [ "$(count "joined daemon at 127.0.0.1:$octl " "$ITEST_DIR/agent-a.log")" -gt "$before_a" ] &&
               [ "$(count "joined daemon at 127.0.0.1:$octl " "$ITEST_DIR/agent-b.log")" -gt "$before_b" ]; do
        i=$((i + 1)); [ $i -lt 600 ] || fail "run $r: the agents did not re-join within 30 s"; sleep 0.02; done
    ms=$(( $(now_ms) - t0 ))
    times="$times $ms"
    stood=$(count 'standing by' "$ITEST_DIR/musterd$leader.log")
    start_ha "$leader"
    i=0; until [ "$(count 'standing by' "$ITEST_DIR/musterd$leader.log")" -gt "$stood" ]; do
        i=$((i + 1)); [ $i -lt 400 ] || fail "run $r: the restarted musterd did not stand by"; sleep 0.05; done
    leader=$other
    sleep 2
done
gens=$(grep -h "started rank 0 .*for generation" "$ITEST_DIR"/agent-*.log | sed 's/.*generation //' | sort -u | tr '\n' ' ')
echo "== failover: leader SIGKILL -> both agents joined to the new leader (lease TTL 3 s), $RUNS runs:"
echo "$times" | python3 -c 'import sys, statistics as s; t=[int(x) for x in sys.stdin.read().split()]; print("   median %d ms, min %d ms, max %d ms" % (s.median(t), min(t), max(t)))'
echo "   generations the ranks ran: $gens"
echo "== state write cost (16 members, 200 writes each, one after another):"
mkdir -p "$ITEST_DIR/bench-state"
"$BUILD/tests/store-bench" "$ITEST_DIR/bench-state" "etcd://$ETCD_ENDPOINTS" 200 | sed 's/^/   /'
