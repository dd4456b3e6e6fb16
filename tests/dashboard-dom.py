#!/usr/bin/env python3
"""dashboard-dom: checks the dashboard as a browser rendered it (the DOM of
`chromium --headless --dump-dom`) for one of the jobs of
tests/integration/dashboard_browser.sh.

usage: dashboard-dom.py large|hang|crash DOM.html [HISTORY.json]

  large  320 running ranks of 40 nodes, the job says 90000 steps
  hang   4 ranks of nodes a and b, rank 3 found hung, the job failed
         (HISTORY.json: /v1/history as the page drew it)
  crash  2 ranks of node a, rank 1 exited with status 3, the job failed

Prints each expectation that does not hold, and what the page showed.
Exit 0 when all hold, 1 otherwise, 2 on a usage error.
"""
import json
import re
import sys
from html.parser import HTMLParser

NO_END_TAG = ("meta", "br", "input", "link", "img", "hr")


class Dom(HTMLParser):
    """What the checks read: the rows of each table (class, cell texts, the
    classes of their marks and badges), the chart's tick labels and axis
    titles by axis, its loss line and point circles, the node tiles, and the
    text under each element with an id."""

    def __init__(self, text):
        super().__init__()
        self.tables, self.ticks, self.ids = {}, {}, {}
        self.polylines, self.circles, self.tiles = [], 0, []
        self.stack = []  # open elements: (tag, attrs)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        self.stack.append((tag, a))
        if tag == "table":
            self.tables[a.get("id")] = []
        elif tag == "tr" and self.table() is not None:
            self.table().append({"class": cls, "cells": [], "marks": [], "badges": []})
        elif tag in ("td", "th") and self.row():
            self.row()["cells"].append("")
        elif tag == "span" and self.row() and cls.startswith(("mark ", "badge ")):
            self.row()["marks" if cls.startswith("mark") else "badges"].append(cls.split()[1])
        elif tag == "polyline" and cls == "loss":
            self.polylines.append(a.get("points", ""))
        elif tag == "circle" and cls == "pt":
            self.circles += 1
        elif tag == "div" and cls.startswith("t s-"):
            self.tiles.append(cls.split()[1][2:])
        if tag in NO_END_TAG:
            self.stack.pop()

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in NO_END_TAG:
            self.stack.pop()

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def table(self):
        tid = next((a.get("id") for t, a in reversed(self.stack) if t == "table"), None)
        return self.tables.get(tid)

    def row(self):
        t = self.table()
        return t[-1] if t and any(tag == "tr" for tag, _ in self.stack) else None

    def handle_data(self, data):
        for tag, a in self.stack:
            if "id" in a:
                self.ids[a["id"]] = self.ids.get(a["id"], "") + data
        if self.stack and self.stack[-1][0] == "text":
            cls = self.stack[-1][1].get("class")
            axis = next((a.get("class") for t, a in reversed(self.stack) if t == "g"), None)
            key = axis if cls == "tick" else "%s %s" % (axis, cls)
            self.ticks.setdefault(key, []).append(data)
        if any(t in ("td", "th") for t, _ in self.stack) and self.row():
            self.row()["cells"][-1] += data

    def rows(self, table_id):
        """The data rows of a table by their first cell (the header row left out)."""
        return {r["cells"][0]: r for r in self.tables.get(table_id, [])[1:] if r["cells"]}


def num(t):
    try:
        return float(t)
    except ValueError:
        return None


def unmarked(row):
    return row is not None and row["class"] == "" and not row["marks"]


def marked(row, kind, pattern):
    """The row tinted for kind, with one mark of that kind whose text matches pattern."""
    return (row is not None and row["class"] == "r-" + kind and row["marks"] == ["m-" + kind]
            and re.search(pattern, " ".join(row["cells"])) is not None)


def large(dom, _):
    slowest = dom.rows("slowest")
    return [
        ("the job state badge says running", dom.ids.get("state") == "running"),
        ("one tile per node (40), all ok", len(dom.tiles) == 40 and set(dom.tiles) == {"ok"}),
        ("the large-job ranks title", dom.ids.get("rankstitle", "").startswith("ranks needing attention (0 of 320")),
        ("the slowest ranks table has rows", len(slowest) >= 1),
        ("ranks running card", dom.ids.get("ranks_running", "").startswith("320")),
        ("the step with its total (the job says 90000)", " / 90000" in dom.ids.get("step", "")),
        ("no rank or node marked", all(unmarked(r) for t in ("ranks", "slowest", "nodes")
                                       for r in dom.rows(t).values())),
        ("events listed", "generation_running" in dom.ids.get("events", "")),
        ("no connection error", dom.ids.get("conn", "").startswith("updated")),
    ]


def hang(dom, hist):
    losses = [v for v in hist["loss"] if isinstance(v, (int, float))]
    steps = [s for s, v in zip(hist["step"], hist["loss"]) if isinstance(v, (int, float))]
    ranks, nodes = dom.rows("ranks"), dom.rows("nodes")
    xt = [num(t) for t in dom.ticks.get("x-axis", [])]
    yt = [num(t) for t in dom.ticks.get("y-axis", [])]
    pts = dom.polylines[0].split() if dom.polylines else []
    return [
        ("the job state badge says failed", dom.ids.get("state") == "failed"),
        ("x axis: at least 2 numeric step ticks, ascending, within the steps run",
         len(xt) >= 2 and None not in xt and xt == sorted(xt) and steps[0] <= xt[0] and xt[-1] <= steps[-1]),
        ("y axis: at least 2 numeric loss ticks, ascending upwards, around the losses",
         len(yt) >= 2 and None not in yt and yt == sorted(yt) and yt[0] <= max(losses) and yt[-1] >= min(losses)),
        ("axis titles step and loss",
         dom.ticks.get("x-axis title") == ["step"] and dom.ticks.get("y-axis title") == ["loss"]),
        ("the loss line has one point per loss value (%d)" % len(losses),
         len(pts) == len(losses) and dom.circles == len(losses)),
        ("the loss range names the points", ("%d points" % len(losses)) in dom.ids.get("lossrange", "")),
        ("4 rank rows", sorted(ranks) == ["0", "1", "2", "3"]),
        ("rank 3 marked hung with how long it made no step", marked(ranks.get("3"), "hung", r"hung: no step for \d")),
        ("ranks 0-2 not marked, their state a grey exited",
         all(unmarked(ranks.get(i)) and ranks[i]["badges"] == ["s-exited"] for i in "012")),
        ("node b marked with its hung rank", marked(nodes.get("b"), "hung", r"rank 3 hung: no step for \d")),
        ("node a not marked", unmarked(nodes.get("a"))),
        ("no total steps (the ranks do not say one)", "/" not in dom.ids.get("step", "/")),
        ("the failure shown", "rank 3 on node b" in dom.ids.get("failure", "")),
    ]


def crash(dom, _):
    ranks, nodes = dom.rows("ranks"), dom.rows("nodes")
    return [
        ("the job state badge says failed", dom.ids.get("state") == "failed"),
        ("rank 1 marked failed with how it ended", marked(ranks.get("1"), "failed", r"failed: exited with status 3")),
        ("rank 0 not marked", unmarked(ranks.get("0"))),
        ("node a marked with its failed rank", marked(nodes.get("a"), "failed", r"rank 1 failed: exited with status 3")),
    ]


def main():
    jobs = {"large": large, "hang": hang, "crash": crash}
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in jobs or (sys.argv[1] == "hang") != (len(sys.argv) == 4):
        print("usage: dashboard-dom.py large|hang|crash DOM.html [HISTORY.json (hang)]", file=sys.stderr)
        return 2
    with open(sys.argv[2]) as f:
        dom = Dom(f.read())
    hist = None
    if len(sys.argv) == 4:
        with open(sys.argv[3]) as f:
            hist = json.load(f)
    bad = [name for name, ok in jobs[sys.argv[1]](dom, hist) if not ok]
    for name in bad:
        print("dashboard (%s): not rendered: %s" % (sys.argv[1], name))
    if bad:
        for t in ("ranks", "nodes"):
            for key, row in dom.rows(t).items():
                print("  %s %s: %s" % (t, key, row))
        print("  ticks: %s" % dom.ticks)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
