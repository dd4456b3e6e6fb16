#!/usr/bin/env python3
"""The integration scripts' checks of musterd's REST documents, in one
process per wait (tests/itest-lib.sh: check, wait_for, wait_fresh,
event_matching, wait_event_matching).

A Python start costs ~0.2 s of CPU here (and ~1 s of wall on a loaded
2-core machine): a wait that started one per 50 ms poll spent a core on
polling. This process starts once, and polls in a loop bounded in count
and by the clock.

  itest_poll.py status PORT PYEXPR [SECONDS [PERIOD]]
      true once PYEXPR holds for d = /v1/status, with d["ranks"] and
      d["nodes"] the lists of /v1/ranks and /v1/nodes (read only when
      PYEXPR uses them: "ranks", running, node); ITEST_FRESH set (an
      uptime bound) makes a document built before that moment false.
  itest_poll.py events PORT PYEXPR [SECONDS [PERIOD]]
      the events of /v1/events for which PYEXPR holds with e one event,
      one JSON line each; true when some do.
  itest_poll.py events-file FILE PYEXPR
      the same for a saved copy of /v1/events.
  itest_poll.py always PORT PYEXPR SECONDS [PERIOD]
      true when PYEXPR holds at every look for SECONDS (false at the
      first look where it does not).
  itest_poll.py message PORT PYEXPR [SECONDS [PERIOD]]
      the message of the newest event for which PYEXPR holds, once there
      is one; nothing (and false) when none came.

Without SECONDS: one look. PERIOD: seconds between looks (0.05).
"""
import json
import os
import sys
import time
import urllib.request


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=2) as r:
        return json.load(r)


def status_holds(base, expr):
    try:
        d = get(base, "/v1/status")
        fresh = os.environ.get("ITEST_FRESH")
        if fresh and d.get("uptime_s", -1) < float(fresh):
            return False
        env = {"d": d}
        if "ranks" in expr or "running" in expr:
            d["ranks"] = get(base, "/v1/ranks")["ranks"]
            env["running"] = sum(1 for r in d["ranks"] if r["state"] == "running")
        if "node" in expr:
            d["nodes"] = get(base, "/v1/nodes")["nodes"]
            env["node"] = {n["name"]: n for n in d["nodes"]}
        return bool(eval(expr, {}, env))
    except Exception:
        return False


def matching(doc, expr):
    try:
        return [e for e in doc["events"] if eval(expr, {}, {"e": e})]
    except Exception:
        return []


def events_found(base, expr, message_only=False):
    try:
        found = matching(get(base, "/v1/events"), expr)
    except Exception:
        return False
    if found and message_only:
        print(found[-1].get("message", ""))
    elif found:
        for e in found:
            print(json.dumps(e))
    return bool(found)


def poll(look, seconds, period):
    if seconds is None:
        return look()
    end = time.monotonic() + seconds
    for _ in range(max(1, int(seconds / period) + 1)):
        if look():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(period)
    return False


def main(argv):
    if len(argv) == 3 and argv[0] == "events-file":
        try:
            with open(argv[1]) as f:
                found = matching(json.load(f), argv[2])
        except (OSError, ValueError):
            return 1
        for e in found:
            print(json.dumps(e))
        return 0 if found else 1
    if len(argv) < 3 or argv[0] not in ("status", "always", "events", "message"):
        print(__doc__, file=sys.stderr)
        return 2
    base = "http://127.0.0.1:%s" % argv[1]
    expr = argv[2]
    seconds = float(argv[3]) if len(argv) > 3 else None
    period = float(argv[4]) if len(argv) > 4 else 0.05
    if argv[0] == "always":
        if seconds is None:
            return 2
        return 0 if poll(lambda: not status_holds(base, expr), seconds, period) is False else 1
    if argv[0] == "status":
        look = lambda: status_holds(base, expr)
    else:
        look = lambda: events_found(base, expr, argv[0] == "message")
    return 0 if poll(look, seconds, period) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
