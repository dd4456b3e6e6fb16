#!/bin/sh
# Control plane at scale, on loopback: musterd and SIZES simulated agents x
# RANKS ranks (tests/sim-agents.c speaks the real protocol: mutual join, sealed frames,
# heartbeats at heartbeat_interval_ms 1000, ranks reported running at once,
# no rank processes). For each size, one line:
#   form      agents started together -> generation 1 running (musterd's event)
#   cpu, rss  musterd's CPU (% of one core: the median of 5 s windows of CPU
#             seconds over wall seconds) and RSS over STEADY_S s of 1 Hz beats
#   wakeups   musterd's voluntary context switches per second in steady
#             state (its loop going to sleep; daemon/coalesce.h)
#   recovery  one rank's RANK_EXIT -> generation 2 running
#   log       lines musterd logged over the whole run
# MUSTERD=path measures another build (e.g. an older commit's) with the
# same generator; a size that binary refuses is reported as such.
# SIM_ARGS adds options to the generator, e.g. SIM_ARGS=--ack-all: every
# heartbeat asks for an answer, as agents did before HEARTBEAT's ack.
set -eu
SIZES=${SIZES:-64 512 2048 4096}
RANKS=${RANKS:-8}
STEADY_S=${STEADY_S:-10}
TIMEOUT_S=${TIMEOUT_S:-60}
. tests/itest-lib.sh
MUSTERD=${MUSTERD:-$BUILD/musterd}
# The simulated agents share one address: lift the per-address limit of
# unauthenticated connections where the build has one (an older build, for a
# side-by-side run, has none).
PER_ADDR=
! "$MUSTERD" --help | grep -q preauth-per-address || PER_ADDR="--preauth-per-address 1000000"
SIM=$BUILD/tests/sim-agents
[ -x "$SIM" ] || fail "$SIM not built (make tests)"
make_token "$ITEST_DIR/token"

echo "== control plane at scale: agents x $RANKS ranks, loopback, $(nproc) cores ($MUSTERD)"
printf '%-8s %-8s %-10s %-8s %-10s %-10s %-12s %s\n' agents ranks form_ms cpu_% rss_MB wakeups/s recovery_ms log_lines
for n in $SIZES; do
    world=$((n * RANKS))
    cat > "$ITEST_DIR/job.json" <<JSON
{"name": "scale", "nodes": $n, "max_restarts": 5, "heartbeat_interval_ms": 1000, "batch": $world}
JSON
    rm -rf "$ITEST_DIR/state"
    CTL=$(free_port); HTTP=$(free_port)
    "$MUSTERD" --job "$ITEST_DIR/job.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" $PER_ADDR \
        --state-dir "$ITEST_DIR/state" --token-file "$ITEST_DIR/token" > "$ITEST_DIR/musterd.log" 2>&1 &
    DAEMON_PID=$!
    ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
    if ! wait_for 10 'True'; then
        printf '%-8s %-8s %s\n' "$n" "$world" "refused: $(tail -n 1 "$ITEST_DIR/musterd.log")"
        kill -9 "$DAEMON_PID" 2>/dev/null || true
        continue
    fi
    out=$("$SIM" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" --agents "$n" \
        --ranks "$RANKS" --pid "$DAEMON_PID" --steady-s "$STEADY_S" --rank-exit --timeout-s "$TIMEOUT_S" ${SIM_ARGS:-} \
        2> "$ITEST_DIR/sim.log") || true
    get() { echo "$out" | sed -n "s/^$1=//p" | head -n 1; }
    form=$(get form_ms); cpu=$(get steady_cpu_pct); rss=$(get steady_rss_kb); rec=$(get recovery_ms)
    wk=$(get steady_wakeups_per_s)
    [ -n "$rss" ] && rss=$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    i=0; while pid_alive "$DAEMON_PID" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$DAEMON_PID" 2>/dev/null || true
    lines=$(wc -l < "$ITEST_DIR/musterd.log")
    printf '%-8s %-8s %-10s %-8s %-10s %-10s %-12s %s\n' "$n" "$world" "${form:--}" "${cpu:--}" "${rss:--}" "${wk:--}" "${rec:--}" "$lines"
    echo "$out" | grep '^steady_cpu_windows=' | sed 's/^steady_cpu_windows=/         cpu % of each 5 s window: /' || true
    echo "$out" | grep '^reject:' | sed 's/^/         /' || true
done
