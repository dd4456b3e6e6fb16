#!/bin/sh
# The dashboard rendered by a real browser (headless Chromium), against
# musterd with 40 simulated agents x 8 ranks (320 ranks: the large-job
# layout): one tile per node, the failing and slowest ranks from the
# summary, the loss chart from /v1/history, the events. Skipped, with a
# message, where no Chromium is installed (optional: apt-get install chromium).
# DASHBOARD_SCREENSHOT=file.png also saves what the page looks like.
set -eu
. tests/itest-lib.sh

BROWSER=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" > /dev/null 2>&1; then BROWSER=$b; break; fi
done
if [ -z "$BROWSER" ]; then
    echo "dashboard_browser: skipped (no chromium installed)"
    exit 0
fi
SIM=$BUILD/tests/sim-agents
[ -x "$SIM" ] || fail "$SIM not built (make tests)"

AGENTS=40
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "dashtest", "nodes": $AGENTS, "heartbeat_interval_ms": 1000, "batch": $((AGENTS * 8))}
JSON
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
"$SIM" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" --agents "$AGENTS" \
    --ranks 8 --steady-s 60 --timeout-s 20 > "$ITEST_DIR/sim.out" 2> "$ITEST_DIR/sim.log" &
ITEST_PIDS="$ITEST_PIDS $!"
wait_for 20 'd["state"] == "running" and running == 320' || fail "the job did not run"
# two history samples (a second apart) for a loss line
i=0; while [ $i -lt 60 ]; do
    curl -sf "http://127.0.0.1:$HTTP/v1/history" | python3 -c '
import json, sys; sys.exit(0 if len(json.load(sys.stdin)["step"]) >= 2 else 1)' && break
    sleep 0.1; i=$((i + 1))
done

timeout 60 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$ITEST_DIR/browser" \
    --virtual-time-budget=4000 --dump-dom "http://127.0.0.1:$HTTP/" > "$ITEST_DIR/dom.html" 2> "$ITEST_DIR/browser.log" \
    || fail "$BROWSER failed: $(tail -n 5 "$ITEST_DIR/browser.log")"
python3 - "$ITEST_DIR/dom.html" <<'PY' || fail "the dashboard did not render as expected"
import re, sys
dom = open(sys.argv[1]).read()
def text(id):
    m = re.search(r'id="%s"[^>]*>(.*?)</' % id, dom, re.S)
    return re.sub(r"<[^>]+>", "", m.group(1)) if m else None
tiles = re.findall(r'class="t s-(\w+)', dom)
checks = [
    ('the job state badge says running', 'class="badge s-running"' in dom and text("state") == "running"),
    ('one tile per node (40), all ok', len(tiles) == 40 and set(tiles) == {"ok"}),
    ('the large-job ranks title', (text("rankstitle") or "").startswith("ranks needing attention (0 of 320")),
    ('the slowest ranks table has rows', dom.count("<tr>", dom.find('id="slowest"')) >= 2),
    ('ranks running card', (text("ranks_running") or "").startswith("320")),
    ('the loss chart drew from the history', "points" in (text("lossrange") or "")),
    ('events listed', "generation_running" in dom),
    ('no connection error', (text("conn") or "").startswith("updated")),
]
bad = [name for name, ok in checks if not ok]
for name in bad:
    print("dashboard: not rendered: %s" % name)
sys.exit(1 if bad else 0)
PY
[ -n "${DASHBOARD_SCREENSHOT:-}" ] && timeout 60 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$ITEST_DIR/browser" --virtual-time-budget=4000 --window-size=1280,1600 \
    --screenshot="$DASHBOARD_SCREENSHOT" "http://127.0.0.1:$HTTP/" 2>> "$ITEST_DIR/browser.log"
echo "dashboard_browser: ok ($BROWSER)"
