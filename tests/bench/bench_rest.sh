#!/bin/sh
# REST at scale, on loopback: musterd with AGENTS simulated agents x RANKS
# ranks (tests/sim-agents.c: the real protocol, 1 Hz heartbeats) in steady
# state, and tests/rest-load.c asking at a fixed rate (open loop: latency
# counts from when a request was due; sent_p99_ms from when it went out,
# which leaves out the generator's own lateness) over 8 kept-alive connections:
#   /v1/status                  RATE req/s for SECONDS s (target p99 < 5 ms
#                               at 1000 req/s, 4096 x 8)
#   /v1/ranks?offset=&limit=100 pages spread over the ranks, 200 req/s
#   /v1/ranks?state=exited      a filter that scans every rank, 100 req/s
#   /v1/nodes?order=health&limit=100  the dashboard's tiles, 100 req/s
#   /v1/ranks, /metrics         whole documents (rendered once per version), 10 req/s
# and musterd's CPU (% of one core) while /v1/status is under load.
# MUSTERD=path measures another build; TIMEOUT_S (default 120) bounds the formation.
set -eu
AGENTS=${AGENTS:-4096}
RANKS=${RANKS:-8}
RATE=${RATE:-1000}
SECONDS_=${SECONDS_:-10}
TIMEOUT_S=${TIMEOUT_S:-120}
. tests/itest-lib.sh
MUSTERD=${MUSTERD:-$BUILD/musterd}
# The simulated agents share one address: lift the per-address limit of
# unauthenticated connections where the build has one (an older build, for a
# side-by-side run, has none).
PER_ADDR=
! "$MUSTERD" --help | grep -q preauth-per-address || PER_ADDR="--preauth-per-address 1000000"
SIM=$BUILD/tests/sim-agents
LOAD=$BUILD/tests/rest-load
[ -x "$SIM" ] && [ -x "$LOAD" ] || fail "$SIM or $LOAD not built (make tests)"
make_token "$ITEST_DIR/token"
world=$((AGENTS * RANKS))
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "restbench", "nodes": $AGENTS, "heartbeat_interval_ms": 1000, "batch": $world}
JSON
CTL=$(free_port); HTTP=$(free_port)
"$MUSTERD" --job "$ITEST_DIR/job.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" $PER_ADDR \
    --state-dir "$ITEST_DIR/state" --token-file "$ITEST_DIR/token" > "$ITEST_DIR/musterd.log" 2>&1 &
DAEMON_PID=$!
ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
wait_for 10 'True' || fail "musterd did not serve /v1/status"
"$SIM" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" --agents "$AGENTS" \
    --ranks "$RANKS" --steady-s 600 --timeout-s "$TIMEOUT_S" > "$ITEST_DIR/sim.out" 2> "$ITEST_DIR/sim.log" &
SIM_PID=$!
ITEST_PIDS="$ITEST_PIDS $SIM_PID"
i=0; while ! grep -q "^form_ms=" "$ITEST_DIR/sim.out" && [ $i -lt $((TIMEOUT_S * 10 + 100)) ]; do sleep 0.1; i=$((i + 1)); done
grep -q '^form_ms=[0-9]' "$ITEST_DIR/sim.out" || fail "the job did not form: $(cat "$ITEST_DIR/sim.out")"
sleep 3 # the formation's bursts settle; heartbeats at 1 Hz from here on

cpu_s() { awk '{ print ($14 + $15) / 100 }' "/proc/$DAEMON_PID/stat"; }

echo "== REST at scale: $AGENTS agents x $RANKS ranks in steady state, loopback, $(nproc) cores ($MUSTERD)"
echo "   formed in $(sed -n 's/^form_ms=//p' "$ITEST_DIR/sim.out") ms"
printf '%-34s %-6s %-9s %-9s %-9s %-12s %-9s %s\n' endpoint req/s p50_ms p99_ms max_ms sent_p99_ms bytes errors
# load LABEL RATE SECONDS PATH...: one line of figures
load() {
    label=$1; r=$2; s=$3; shift 3
    args=""
    for p in "$@"; do args="$args --path $p"; done
    # shellcheck disable=SC2086
    out=$("$LOAD" --port "$HTTP" --rate "$r" --seconds "$s" $args) || true
    get() { echo "$out" | sed -n "s/^$1=//p"; }
    printf '%-34s %-6s %-9s %-9s %-9s %-12s %-9s %s\n' "$label" "$(get rate)" "$(get p50_ms)" "$(get p99_ms)" \
        "$(get max_ms)" "$(get sent_p99_ms)" "$(get bytes)" "$(get errors)"
}
c0=$(cpu_s); t0=$(date +%s.%N)
load "/v1/status" "$RATE" "$SECONDS_" /v1/status
c1=$(cpu_s); t1=$(date +%s.%N)
pages=""
k=0; while [ $k -lt 16 ]; do pages="$pages /v1/ranks?offset=$((k * world / 16))&limit=100"; k=$((k + 1)); done
# shellcheck disable=SC2086
load "/v1/ranks?offset=..&limit=100" 200 5 $pages
load "/v1/ranks?state=exited" 100 5 "/v1/ranks?state=exited"
load "/v1/nodes?order=health&limit=100" 100 5 "/v1/nodes?order=health&limit=100"
load "/v1/ranks (whole)" 10 5 /v1/ranks
load "/metrics" 10 5 /metrics
echo "   musterd CPU under $RATE req/s of /v1/status: $(awk -v a="$c0" -v b="$c1" -v s="$t0" -v e="$t1" \
    'BEGIN { printf "%.1f", 100 * (b - a) / (e - s) }') % of one core (heartbeats included)"
# Other work on the machine stretches the tails: say how much there was.
[ -r /proc/pressure/cpu ] && echo "   CPU pressure during the run (some, avg60): $(sed -n 's/^some avg10=[^ ]* avg60=\([^ ]*\).*/\1/p' /proc/pressure/cpu) %"
kill -TERM "$SIM_PID" "$DAEMON_PID" 2>/dev/null || true
