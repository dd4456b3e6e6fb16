#!/bin/sh
# The dashboard rendered by a real browser (headless Chromium), asserted on
# the DOM after the page's scripts ran (--dump-dom with a virtual time
# budget), in three jobs:
# 1. 40 simulated agents x 8 ranks (320 ranks: the large-job layout): one
#    tile per node, the failing and slowest ranks from the summary, events,
#    the step out of the job's steps.
# 2. 2 agents x 2 fake ranks, rank 3 hangs at step 60 (progress timeout 3 s,
#    no restarts): the loss chart has its points and both axes with tick
#    labels; rank 3 and its node are marked hung ("hung: no step for ..."),
#    the other ranks and node a are not; the step shows no total (the ranks
#    do not say one). A real pointer over three points of the chart shows
#    each one's step and loss (tests/dashboard-hover.py). Screenshots are
#    left at $BUILD/dashboard_browser.png and dashboard_browser-hover.png
#    (or DASHBOARD_SCREENSHOT=file.png and file-hover.png).
# 3. 1 agent x 2 fake ranks, rank 1 exits with status 3 (no restarts): rank 1
#    and node a are marked "failed: exited with status 3", rank 0 is not.
# The DOM checks are tests/dashboard-dom.py's.
# Without Chromium: a failure under CI (mk/deps.sh build installs it), else
# a skip that says how to install it.
# itest: solo
set -eu
. tests/itest-lib.sh

BROWSER=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" > /dev/null 2>&1; then BROWSER=$b; break; fi
done
if [ -z "$BROWSER" ]; then
    [ -n "${CI:-}" ] && fail "dashboard_browser: no chromium installed; mk/deps.sh build installs it for make check"
    echo "dashboard_browser: skipped (no chromium installed); run: apt-get install chromium"
    exit 0
fi
SIM=$BUILD/tests/sim-agents
FAKE=$BUILD/tests/fake-rank
[ -x "$SIM" ] && [ -x "$FAKE" ] || fail "$SIM or $FAKE not built (make tests)"
SHOT=${DASHBOARD_SCREENSHOT:-$BUILD/dashboard_browser.png}

# browse OUT ARGS...: headless Chromium on the dashboard, 60 s at most; the
# page runs 4 s of virtual time (its first polls) before the DOM is taken.
browse() {
    _out=$1; shift
    timeout 60 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$ITEST_DIR/browser" \
        --virtual-time-budget=4000 --window-size=1280,1400 "$@" "http://127.0.0.1:$HTTP/" > "$_out" \
        2>> "$ITEST_DIR/browser.log" || fail "$BROWSER failed: $(tail -n 5 "$ITEST_DIR/browser.log")"
}

# losses N: true once /v1/history holds N loss values
losses() {
    curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/history" | python3 -c '
import json, sys; h = json.load(sys.stdin)
sys.exit(0 if sum(isinstance(v, (int, float)) for v in h["loss"]) >= int(sys.argv[1]) else 1)' "$1"
}

# stop_daemon: musterd and its agents stopped, its state gone, for the next job
stop_daemon() {
    kill $ITEST_PIDS 2> /dev/null || true
    wait_exit "$DAEMON_PID" 10 || fail "musterd did not stop"
    rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
}

# ---- 1. the large-job layout ------------------------------------------------
AGENTS=40
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "dashtest", "nodes": $AGENTS, "heartbeat_interval_ms": 1000, "batch": $((AGENTS * 8)), "steps": 90000}
JSON
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
"$SIM" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" --agents "$AGENTS" \
    --ranks 8 --steady-s 60 --timeout-s 20 > "$ITEST_DIR/sim.out" 2> "$ITEST_DIR/sim.log" &
ITEST_PIDS="$ITEST_PIDS $!"
wait_for 20 'd["state"] == "running" and running == 320' || fail "the job did not run"
browse "$ITEST_DIR/dom-large.html" --dump-dom
python3 tests/dashboard-dom.py large "$ITEST_DIR/dom-large.html" ||
    fail "the dashboard of 320 ranks did not render as expected"
stop_daemon

# ---- 2. a hung rank -----------------------------------------------------------
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "dashhang", "nodes": 2, "max_restarts": 0, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 4000, "progress_timeout_ms": 3000, "stop_grace_ms": 500}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
RANK_CMD="$FAKE --step-ms 100 --hang-at-step 60 --hang-rank 3"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 30 'd["state"] == "failed" and [r["rank"] for r in d["ranks"] if r["hung"]] == [3]' ||
    fail "rank 3 was not found hung"
losses 3 || fail "fewer than 3 loss values in the history"
curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/history" > "$ITEST_DIR/history.json"
browse "$ITEST_DIR/dom-hang.html" --dump-dom --screenshot="$SHOT"
[ -s "$SHOT" ] || fail "no screenshot at $SHOT"
python3 tests/dashboard-dom.py hang "$ITEST_DIR/dom-hang.html" "$ITEST_DIR/history.json" ||
    fail "the dashboard of the hung rank did not render as expected"
# the value under a real pointer (DevTools protocol over a pipe)
timeout 60 python3 tests/dashboard-hover.py "$BROWSER" "http://127.0.0.1:$HTTP/" "$ITEST_DIR/history.json" \
    "$ITEST_DIR/browser-hover" "${SHOT%.png}-hover.png" || fail "the chart did not show the value under the pointer"
stop_daemon

# ---- 3. a failed rank -----------------------------------------------------------
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "dashcrash", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 200, "stop_grace_ms": 500}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$FAKE --step-ms 100 --crash-at-step 20 --crash-rank 1"
wait_for 30 'd["state"] == "failed" and d["last_failure"]["rank"] == 1' || fail "rank 1 did not fail"
browse "$ITEST_DIR/dom-crash.html" --dump-dom
python3 tests/dashboard-dom.py crash "$ITEST_DIR/dom-crash.html" ||
    fail "the dashboard of the failed rank did not render as expected"
echo "dashboard_browser: ok ($BROWSER; screenshots $SHOT, ${SHOT%.png}-hover.png)"
