#!/usr/bin/env python3
"""dashboard-hover: moves a real pointer over the dashboard's loss chart and
checks the value it shows. Drives headless Chromium over the DevTools
protocol on a pipe (--remote-debugging-pipe: the browser reads commands on
fd 3 and answers on fd 4, each message JSON ended by a NUL byte), so no
port is opened and nothing but the standard library is needed.

usage: dashboard-hover.py BROWSER URL HISTORY.json PROFILE_DIR [SCREENSHOT.png]

For the 2nd, the middle and the last point of the history's loss values:
the pointer over the point's circle must show "step S  loss L" with that
point's step and loss (4 decimals), and the highlighted circle must sit on
it. Then the pointer leaves and the value must hide. Every wait is bounded
(20 s for the chart, 5 s per check). Exit 0 when all hold, 1 otherwise.
"""
import base64
import json
import os
import select
import subprocess
import sys
import time


class Browser:
    def __init__(self, exe, profile):
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()

        def fds():  # the browser's fd 3 reads our commands, its fd 4 writes its answers
            a, b = os.dup(cmd_r), os.dup(out_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe",
             "--user-data-dir=" + profile, "--window-size=1280,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, pass_fds=(3, 4))
        os.close(cmd_r)
        os.close(out_w)
        self.buf, self.next_id, self.session = b"", 0, None

    def call(self, method, params=None, timeout=10.0):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                ans = json.loads(raw)
                if ans.get("id") == self.next_id:
                    if "error" in ans:
                        raise RuntimeError("%s: %s" % (method, ans["error"].get("message")))
                    return ans.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.out_r], [], [], left)[0]:
                raise RuntimeError("%s: no answer within %.0f s" % (method, timeout))
            chunk = os.read(self.out_r, 1 << 16)
            if not chunk:
                raise RuntimeError("%s: the browser closed its pipe" % method)
            self.buf += chunk

    def js(self, expr):
        res = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        if "exceptionDetails" in res:
            raise RuntimeError("%s: %s" % (expr, res["exceptionDetails"].get("text")))
        return res["result"].get("value")

    def until(self, expr, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.js(expr)
            if value:
                return value
            time.sleep(0.1)
        return None

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=10)


def main():
    if len(sys.argv) not in (5, 6):
        print("usage: dashboard-hover.py BROWSER URL HISTORY.json PROFILE_DIR [SCREENSHOT.png]", file=sys.stderr)
        return 2
    exe, url, hist_path, profile = sys.argv[1:5]
    hist = json.load(open(hist_path))
    pts = [(s, v) for s, v in zip(hist["step"], hist["loss"]) if isinstance(v, (int, float))]
    if len(pts) < 3:
        print("dashboard-hover: the history holds %d loss values, 3 needed" % len(pts))
        return 1
    b = Browser(exe, profile)
    bad = []
    try:
        target = b.call("Target.createTarget", {"url": url})["targetId"]
        b.session = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        n = b.until("document.querySelectorAll('#chart circle.pt').length", 20)
        if n != len(pts):
            print("dashboard-hover: the chart shows %s points, the history %d" % (n, len(pts)))
            return 1
        for i in (1, len(pts) // 2, len(pts) - 1):
            c = b.js("(function () { var r = document.querySelectorAll('#chart circle.pt')[%d]"
                     ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()" % i)
            b.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": c[0], "y": c[1]})
            want = "step %d  loss %.4f" % pts[i]
            shown = b.until("(function () { var h = document.getElementById('hover');"
                            " return !h.hidden && h.textContent.indexOf(%s) === 0 && h.textContent; })()"
                            % json.dumps(want), 5)
            on = b.js("(function () { var h = document.querySelector('#chart circle.hot'),"
                      " p = document.querySelectorAll('#chart circle.pt')[%d];"
                      " return !!h && Math.abs(h.cx.baseVal.value - p.cx.baseVal.value) < 0.5"
                      " && Math.abs(h.cy.baseVal.value - p.cy.baseVal.value) < 0.5; })()" % i)
            if not shown or not on:
                bad.append("point %d: want %r highlighted, shown %r (%s)" % (
                    i, want, b.js("document.getElementById('hover').textContent"),
                    "on the point" if on else "highlight elsewhere"))
        if len(sys.argv) == 6:
            shot = b.call("Page.captureScreenshot", {"format": "png"})
            with open(sys.argv[5], "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        b.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 5, "y": 5})
        if not b.until("document.getElementById('hover').hidden", 5):
            bad.append("the value stays shown after the pointer left the chart")
    finally:
        b.close()
    for line in bad:
        print("dashboard-hover: %s" % line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
