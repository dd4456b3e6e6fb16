#!/bin/sh
# The dashboard rendered by a real browser (headless Chromium), asserted on
# the DOM after the page's scripts ran (--dump-dom with a virtual time
# budget), in two jobs:
# 1. 40 simulated agents x 8 ranks (320 ranks: the large-job layout): one
#    tile per node, the failing and slowest ranks from the summary, events,
#    the step out of the job's steps.
# 2. 2 agents x 2 fake ranks, rank 3 hangs at step 40 (progress timeout 3 s,
#    no restarts): the loss chart has its points and both axes with tick
#    labels; rank 3 and its node are marked hung ("hung: no step for ..."),
#    the other ranks and node a are not; the step shows no total (the ranks
#    do not say one). A real pointer over three points of the chart shows
#    each one's step and loss (tests/dashboard-hover.py). Screenshots are
#    left at $BUILD/dashboard_browser.png and dashboard_browser-hover.png
#    (or DASHBOARD_SCREENSHOT=file.png and file-hover.png).
# Without Chromium: a failure under CI (mk/deps.sh build installs it), else
# a skip that says how to install it.
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

# ---- 1. the large-job layout ------------------------------------------------
AGENTS=40
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "dashtest", "nodes": $AGENTS, "heartbeat_interval_ms": 1000, "batch": $((AGENTS * 8)), "steps": 90000}
JSON
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
"$SIM" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" --agents "$AGENTS" \
    --ranks 8 --steady-s 60 --timeout-s 20 > "$ITEST_DIR/sim.out" 2> "$ITEST_DIR/sim.log" &
SIM_PID=$!
ITEST_PIDS="$ITEST_PIDS $SIM_PID"
wait_for 20 'd["state"] == "running" and running == 320' || fail "the job did not run"
browse "$ITEST_DIR/dom-large.html" --dump-dom
python3 - "$ITEST_DIR/dom-large.html" <<'PY' || fail "the dashboard of 320 ranks did not render as expected"
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
    ('the step with its total (the job says 90000)', " / 90000" in (text("step") or "")),
    ('no rank or node marked', 'class="mark' not in dom),
    ('events listed', "generation_running" in dom),
    ('no connection error', (text("conn") or "").startswith("updated")),
]
bad = [name for name, ok in checks if not ok]
for name in bad:
    print("dashboard: not rendered: %s" % name)
sys.exit(1 if bad else 0)
PY
kill "$SIM_PID" "$DAEMON_PID" 2> /dev/null || true
wait_exit "$DAEMON_PID" 10 || fail "musterd did not stop"
rm -rf "$ITEST_DIR/state"

# ---- 2. a hung rank -----------------------------------------------------------
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "dashhang", "nodes": 2, "max_restarts": 0, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 4000, "progress_timeout_ms": 3000, "stop_grace_ms": 500}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
RANK_CMD="$FAKE --step-ms 100 --hang-at-step 40 --hang-rank 3"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 30 'd["state"] == "failed" and [r["rank"] for r in d["ranks"] if r["hung"]] == [3]' ||
    fail "rank 3 was not found hung"
losses 3 || fail "fewer than 3 loss values in the history"
curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/history" > "$ITEST_DIR/history.json"
browse "$ITEST_DIR/dom-hang.html" --dump-dom
browse /dev/null --screenshot="$SHOT"
[ -s "$SHOT" ] || fail "no screenshot at $SHOT"
python3 - "$ITEST_DIR/dom-hang.html" "$ITEST_DIR/history.json" <<'PY' || fail "the dashboard of the hung rank did not render as expected"
import json, re, sys
from html.parser import HTMLParser

class Dom(HTMLParser):
    """Rows of each table (class, cell texts, mark classes), the chart's
    tick labels by axis, its polyline and circles, text by id."""
    def __init__(self):
        super().__init__()
        self.tables, self.ticks, self.ids, self.polylines, self.circles = {}, {}, {}, [], 0
        self.stack = []  # (tag, attrs) open elements
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.stack.append((tag, a))
        cls = a.get("class", "")
        if tag == "table":
            self.table = self.tables.setdefault(a.get("id"), [])
        elif tag == "tr":
            self.table.append({"class": cls, "cells": [], "marks": []})
        elif tag in ("td", "th"):
            self.table[-1]["cells"].append("")
        elif tag == "span" and cls.startswith("mark "):
            self.table[-1]["marks"].append(cls.split()[1])
        elif tag == "polyline" and cls == "loss":
            self.polylines.append(a.get("points", ""))
        elif tag == "circle" and cls == "pt":
            self.circles += 1
        if tag in ("meta", "br", "input", "link", "img", "hr"):  # no end tag
            self.stack.pop()
    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if self.stack and self.stack[-1][0] == tag:
            self.stack.pop()
    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break
    def handle_data(self, data):
        for tag, a in self.stack:
            if "id" in a:
                self.ids[a["id"]] = self.ids.get(a["id"], "") + data
        if self.stack and self.stack[-1][0] == "text":
            cls = self.stack[-1][1].get("class")
            axis = next((a.get("class") for t, a in reversed(self.stack) if t == "g"), None)
            if cls == "tick":
                self.ticks.setdefault(axis, []).append(data)
            elif cls == "title":
                self.ticks.setdefault(axis + " title", []).append(data)
        if any(t in ("td", "th") for t, _ in self.stack) and self.tables:
            for t, a in self.stack:
                if t == "table":
                    self.tables[a.get("id")][-1]["cells"][-1] += data
                    break

dom = Dom()
dom.feed(open(sys.argv[1]).read())
hist = json.load(open(sys.argv[2]))
losses = [v for v in hist["loss"] if isinstance(v, (int, float))]
steps = [s for s, v in zip(hist["step"], hist["loss"]) if isinstance(v, (int, float))]

def num(t):
    try:
        return float(t)
    except ValueError:
        return None

ranks = {int(r["cells"][0]): r for r in dom.tables.get("ranks", [])[1:] if r["cells"] and r["cells"][0].isdigit()}
nodes = {r["cells"][0]: r for r in dom.tables.get("nodes", [])[1:] if r["cells"]}
xt = [num(t) for t in dom.ticks.get("x-axis", [])]
yt = [num(t) for t in dom.ticks.get("y-axis", [])]
pts = dom.polylines[0].split() if dom.polylines else []
checks = [
    ('the job state badge says failed', dom.ids.get("state") == "failed"),
    ('x axis: at least 2 numeric step ticks, ascending, within the steps run',
     len(xt) >= 2 and None not in xt and xt == sorted(xt) and steps[0] <= xt[0] and xt[-1] <= steps[-1]),
    ('y axis: at least 2 numeric loss ticks, ascending upwards, around the losses',
     len(yt) >= 2 and None not in yt and yt == sorted(yt) and yt[0] <= max(losses) and yt[-1] >= min(losses)),
    ('axis titles step and loss', dom.ticks.get("x-axis title") == ["step"] and dom.ticks.get("y-axis title") == ["loss"]),
    ('the loss line has one point per loss value (%d)' % len(losses), len(pts) == len(losses) and dom.circles == len(losses)),
    ('the loss range names the points', ("%d points" % len(losses)) in dom.ids.get("lossrange", "")),
    ('4 rank rows', sorted(ranks) == [0, 1, 2, 3]),
    ('rank 3 marked hung with how long it made no step',
     ranks.get(3, {}).get("class") == "r-hung" and ranks[3]["marks"] == ["m-hung"]
     and re.search(r"hung: no step for \d", " ".join(ranks[3]["cells"])) is not None),
    ('ranks 0-2 not marked', all(ranks.get(i, {"class": "x"})["class"] == "" and not ranks[i]["marks"] for i in (0, 1, 2))),
    ('node b marked with its hung rank', nodes.get("b", {}).get("marks") == ["m-hung"]
     and "rank 3 hung: no step for" in " ".join(nodes["b"]["cells"])),
    ('node a not marked', nodes.get("a", {}).get("class") == "" and not nodes["a"]["marks"]),
    ('no total steps (the ranks do not say one)', "/" not in dom.ids.get("step", "/")),
    ('the failure shown', "rank 3 on node b" in dom.ids.get("failure", "")),
]
bad = [name for name, ok in checks if not ok]
for name in bad:
    print("dashboard: not rendered: %s" % name)
if bad:
    print("ranks:", ranks, "\nnodes:", nodes, "\nticks:", dom.ticks, "\npoints:", pts, "\nlosses:", losses)
sys.exit(1 if bad else 0)
PY
# the value under a real pointer (DevTools protocol over a pipe)
timeout 60 python3 tests/dashboard-hover.py "$BROWSER" "http://127.0.0.1:$HTTP/" "$ITEST_DIR/history.json" \
    "$ITEST_DIR/browser-hover" "${SHOT%.png}-hover.png" || fail "the chart did not show the value under the pointer"
echo "dashboard_browser: ok ($BROWSER; screenshots $SHOT, ${SHOT%.png}-hover.png)"
