"""Runs the integration scripts of tests/integration/, ITEST_JOBS at a time
(default 2), and prints the tally and the ten slowest.

A script whose checks hold only on a machine of its own (latencies, link
flaps and leases it times, a browser's virtual time, network namespaces,
a flood that takes the file limit) says so on a line of its own:

  # itest: solo

and runs with no other script beside it; every other script runs beside
any but a solo one. Their waits are bounded generously enough for a
machine that runs two trainings at once (seen: every torch script green at
a load average of 20 on 2 cores), so a new script that asserts timing must
say solo. Scripts start in name order within what the rules allow;
each has its own temporary directory and free ports (tests/itest-lib.sh),
so that two running at once share nothing. A script's output is printed
whole when it ends, so that two scripts' lines never interleave.

Usage: python3 tests/run_integration.py [NAME ...]   (default: every script)
Environment: BUILD, ITEST_JOBS, ITEST_TIMEOUT_S (600 per script).
"""
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("solo",)


def kind_of(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"#\s*itest:\s*(\w+)\s*$", line)
            if m:
                if m.group(1) not in KINDS:
                    raise SystemExit(f"{path}: '# itest: {m.group(1)}': expected one of {', '.join(KINDS)}")
                return m.group(1)
    return "shared"


class Runner:
    def __init__(self, scripts: list, jobs: int, timeout_s: int):
        self.pending = list(scripts)  # (name, path, kind), in name order
        self.jobs = max(1, jobs)
        self.timeout_s = timeout_s
        self.running = {}  # name -> kind
        self.results = []  # (name, ok, seconds)
        self.cond = threading.Condition()

    def _startable(self):
        """The first pending script the rules let start now, or None."""
        if len(self.running) >= self.jobs:
            return None
        kinds = list(self.running.values())
        if "solo" in kinds:
            return None
        for i, (name, path, kind) in enumerate(self.pending):
            if kind == "solo" and kinds:
                continue
            return self.pending.pop(i)
        return None

    def _run_one(self, name: str, path: str) -> None:
        start = time.monotonic()
        try:
            p = subprocess.run(["timeout", str(self.timeout_s), "sh", path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, cwd=os.path.dirname(HERE))
            out, ok = p.stdout.decode(errors="replace"), p.returncode == 0
        except OSError as e:
            out, ok = f"cannot run {path}: {e}\n", False
        secs = time.monotonic() - start
        with self.cond:
            sys.stdout.write(f"== integration: {name}\n{out}")
            sys.stdout.write(f"-- {name}: {'ok' if ok else 'FAILED'} ({secs:.0f} s)\n")
            sys.stdout.flush()
            self.results.append((name, ok, secs))
            del self.running[name]
            self.cond.notify_all()

    def run(self) -> None:
        threads = []
        with self.cond:
            while self.pending or self.running:
                nxt = self._startable()
                if nxt is None:
                    self.cond.wait()
                    continue
                name, path, kind = nxt
                self.running[name] = kind
                t = threading.Thread(target=self._run_one, args=(name, path))
                t.start()
                threads.append(t)
        for t in threads:
            t.join()


def main(argv: list) -> int:
    idir = os.path.join(HERE, "integration")
    names = argv or sorted(f[:-3] for f in os.listdir(idir) if f.endswith(".sh"))
    scripts = []
    for n in names:
        path = os.path.join(idir, n + ".sh")
        if not os.path.isfile(path):
            raise SystemExit(f"no integration script {path}")
        scripts.append((n, path, kind_of(path)))
    jobs = int(os.environ.get("ITEST_JOBS", "2"))
    runner = Runner(scripts, jobs, int(os.environ.get("ITEST_TIMEOUT_S", "600")))
    start = time.monotonic()
    runner.run()
    wall = time.monotonic() - start
    print(f"== slowest ten of {len(runner.results)} scripts ({jobs} at a time, {wall:.0f} s wall, "
          f"{sum(s for _, _, s in runner.results):.0f} s in all)")
    for name, ok, secs in sorted(runner.results, key=lambda r: -r[2])[:10]:
        print(f"  {secs:6.0f} s  {name}{'' if ok else '  (FAILED)'}")
    failed = sorted(n for n, ok, _ in runner.results if not ok)
    passed = len(runner.results) - len(failed)
    if failed:
        print("failed: " + " ".join(failed))
    print(f"integration: {passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
