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
say solo. Each has its own temporary directory and free ports
(tests/itest-lib.sh), so that two running at once share nothing. A
script's output is printed whole when it ends, so that two scripts' lines
never interleave.

Order: the solo scripts first, then the others longest first
(longest-processing-time-first), by the seconds each took last time:
tests/integration/durations (checked in; `make itest-durations` refreshes
it from the last run), overridden by $BUILD/itest-durations, which every
run writes. Solos first because a solo can start only once the machine is
empty: grouped at the start, nothing waits for a drain; and the short
scripts come last, so the slots run out together. A script in neither
table counts as DEFAULT_S.

A solo that keeps less than LIGHT_SOLO of a CPU busy (by the table: most
of them wait on timers, links and leases) leaves the other CPU idle, a
third of the whole run once. So where this machine lets the runner make
CPU control groups (cgroup v1's cpu controller or v2's; root), the solos
run in two steps: the heavy ones alone, then the light ones one at a
time with a shared script beside each in a *background* group whose CPU
weight is an eighth of the solo's, so that the solo's processes win the
CPU whenever they want it (the kernel's own fair scheduler, by weight)
and the background script uses what is left. Once the last solo is done
the background group's weight is raised to the foreground's, so that the
scripts still in it run as any other. Without control groups every solo
runs alone. ITEST_LANES=off turns the background off.

--unit CMD adds one more item, named unit_suites, run as a shared script
first in the background (the Check suites, by tests/run.sh).

With ITEST_JOBS above 2, a third (or later) script starts beside others
only where it fits the machine: the CPU the running ones used per second
of their last run (the table's CPU column), with its own, must stay within
ITEST_CPUS (default: the CPUs this machine has); a script with no CPU
figure counts as a whole CPU. The first pending script that fits starts,
so a light one can go beside two heavy ones. Up to 2, none of this applies.

Usage: python3 tests/run_integration.py [--unit CMD] [NAME ...]   (default: every script)
       python3 tests/run_integration.py --save-durations
           (merges $BUILD/itest-durations into tests/integration/durations)
Environment: BUILD, ITEST_JOBS, ITEST_CPUS, ITEST_TIMEOUT_S (600 per script), ITEST_LANES.
"""
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IDIR = os.path.join(HERE, "integration")
TABLE = os.path.join(IDIR, "durations")
KINDS = ("solo",)
DEFAULT_S = 60  # an unknown script starts among the long ones
LIGHT_SOLO = 0.75  # CPUs a solo may keep busy (by the table) and still have a script beside it
UNIT = "unit_suites"


def kind_of(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"#\s*itest:\s*(\w+)\s*$", line)
            if m:
                if m.group(1) not in KINDS:
                    raise SystemExit(f"{path}: '# itest: {m.group(1)}': expected one of {', '.join(KINDS)}")
                return m.group(1)
    return "shared"


def read_durations(path: str) -> dict:
    """{name: (seconds, CPU seconds or None)} from lines 'SECONDS [CPU] NAME';
    '#' starts a comment. {} if absent."""
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.split("#", 1)[0].split()
                if not line:
                    continue
                if len(line) not in (2, 3) or not all(re.fullmatch(r"\d+", w) for w in line[:-1]):
                    raise SystemExit(f"{path}:{n}: expected 'SECONDS [CPU_SECONDS] NAME'")
                out[line[-1]] = (int(line[0]), int(line[1]) if len(line) == 3 else None)
    except FileNotFoundError:
        pass
    return out


def write_durations(path: str, durations: dict, header: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(header)
        for name in sorted(durations):
            secs, cpu = durations[name]
            f.write(f"{secs} {cpu} {name}\n" if cpu is not None else f"{secs} {name}\n")
    os.replace(tmp, path)


def cpu_load(durations: dict, name: str) -> float:
    """The CPUs a script kept busy on average in its last run; 1.0 when unknown."""
    secs, cpu = durations.get(name, (0, None))
    return 1.0 if cpu is None or secs <= 0 else cpu / secs


def light(durations: dict, name: str) -> bool:
    return cpu_load(durations, name) < LIGHT_SOLO


def plan(scripts: list, durations: dict, lanes: bool) -> list:
    """The start order: solos (with lanes, the heavy ones first), then the
    rest, unit_suites first; each part longest first, then by name."""
    def key(s):
        name, _, kind = s
        part = 0 if kind == "solo" and not (lanes and light(durations, name)) else 1 if kind == "solo" else 2
        return (part, name != UNIT, -durations.get(name, (DEFAULT_S, None))[0], name)
    return sorted(scripts, key=key)


class Lanes:
    """CPU control groups made for this run under the cpu controller's root
    (v1: /sys/fs/cgroup/cpu, cpu.shares; v2: /sys/fs/cgroup, cpu.weight):
    muster-itest-PID, weighing as much as 8 processes outside it (so that a
    busy machine's other work does not starve the run as a whole), and in
    it the foreground and the background lanes, 8 to 1. None where they
    cannot be made."""

    @staticmethod
    def make():
        if os.environ.get("ITEST_LANES", "on") == "off":
            return None
        for root, knob, full in (("/sys/fs/cgroup/cpu", "cpu.shares", 1024), ("/sys/fs/cgroup", "cpu.weight", 100)):
            if not os.path.isfile(os.path.join(root, "cgroup.procs")):
                continue
            if knob == "cpu.weight":
                try:
                    with open(os.path.join(root, "cgroup.controllers")) as f:
                        if "cpu" not in f.read().split():
                            continue
                except OSError:
                    continue
            lanes = Lanes(root, knob, full)
            try:
                lanes.setup()
                return lanes
            except OSError:
                lanes.close()
        return None

    def __init__(self, root: str, knob: str, full: int):
        self.root, self.knob, self.full = root, knob, full
        self.top = os.path.join(root, f"muster-itest-{os.getpid()}")
        self.dirs = {lane: os.path.join(self.top, lane) for lane in ("fg", "bg")}

    def setup(self) -> None:
        if self.knob == "cpu.weight":
            with open(os.path.join(self.root, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
        os.mkdir(self.top)
        with open(os.path.join(self.top, self.knob), "w") as f:
            f.write(str(8 * self.full))
        if self.knob == "cpu.weight":
            with open(os.path.join(self.top, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
        for d in self.dirs.values():
            os.mkdir(d)
        self.weigh("fg", self.full)
        self.weigh("bg", max(1, self.full // 8))

    def weigh(self, lane: str, w: int) -> None:
        with open(os.path.join(self.dirs[lane], self.knob), "w") as f:
            f.write(str(w))

    def procs(self, lane: str) -> str:
        return os.path.join(self.dirs[lane], "cgroup.procs")

    def close(self) -> None:
        """Moves what is left (a script's stray process) to the root group
        and removes the groups (a process still exiting holds one: 2 s)."""
        for d in list(self.dirs.values()) + [self.top]:
            for _ in range(40):
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        for pid in f.read().split():
                            try:
                                with open(os.path.join(self.root, "cgroup.procs"), "w") as r:
                                    r.write(pid)
                            except OSError:
                                pass
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


class Runner:
    def __init__(self, scripts: list, jobs: int, timeout_s: int, durations: dict, cpus: float, lanes=None):
        self.pending = list(scripts)  # (name, path, kind), in start order
        self.lanes = lanes
        self.jobs = max(1, jobs)
        self.durations = durations
        self.cpus = cpus
        self.timeout_s = timeout_s
        self.running = {}  # name -> kind, "solo" or "light" (a solo with a script beside it) or "shared"
        self.background = False  # the background group still weighs less than the foreground
        self.results = []  # (name, ok, seconds, cpu seconds)
        self.cond = threading.Condition()

    def _startable(self):
        """The next pending script and its lane ("fg" or "bg") if the rules
        let it start now, or None. In order: a solo waits for the machine
        to empty, and what comes after it waits for it, but for a light solo
        (with lanes) which waits only for other solos and takes one shared
        script beside it in the background; beyond two at a time, the first
        that fits the CPUs."""
        if not self.pending or len(self.running) >= self.jobs:
            return None
        kinds = list(self.running.values())
        head = self.pending[0]
        lanes = self.lanes is not None and self.jobs >= 2
        if "solo" in kinds:
            return None
        if "light" in kinds:
            if len(self.running) >= 2:
                return None
            for i, (name, _, kind) in enumerate(self.pending):  # the one script beside it
                if kind != "solo":
                    return self.pending.pop(i), "bg"
            return None
        if head[2] == "solo":
            if lanes and light(self.durations, head[0]):
                if len(self.running) < 2:
                    return self.pending.pop(0), "fg"
                return None
            return (self.pending.pop(0), "fg") if not kinds else None
        if self.background:  # the solos are over: the background weighs as much as the foreground
            self.lanes.weigh("bg", self.lanes.full)
            self.background = False
        if len(self.running) < 2:
            return self.pending.pop(0), "fg"
        busy = sum(cpu_load(self.durations, n) for n in self.running)
        for i, (name, _, kind) in enumerate(self.pending):
            if kind == "solo":
                break
            if busy + cpu_load(self.durations, name) <= self.cpus:
                return self.pending.pop(i), "fg"
        return None

    def _run_one(self, name: str, path: str, lane: str) -> None:
        start = time.monotonic()
        cpu = 0.0
        cmd = ["timeout", str(self.timeout_s)] + (path if isinstance(path, list) else ["sh", path])
        if self.lanes is not None:  # the shell joins its group, then becomes the script
            cmd = ["sh", "-c", 'echo $$ > "$0" 2>/dev/null; exec "$@"', self.lanes.procs(lane)] + cmd
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, cwd=os.path.dirname(HERE))
            out = p.stdout.read().decode(errors="replace")
            p.stdout.close()
            # wait4: the CPU time of the script and of every process it reaped.
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            ok, cpu = p.returncode == 0, ru.ru_utime + ru.ru_stime
        except OSError as e:
            out, ok = f"cannot run {name}: {e}\n", False
        secs = time.monotonic() - start
        with self.cond:
            sys.stdout.write(f"== integration: {name}\n{out}")
            sys.stdout.write(f"-- {name}: {'ok' if ok else 'FAILED'} ({secs:.0f} s, {cpu:.0f} s CPU)\n")
            sys.stdout.flush()
            self.results.append((name, ok, secs, cpu))
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
                (name, path, kind), lane = nxt
                if kind == "solo" and self.lanes is not None and light(self.durations, name):
                    kind = "light"
                if lane == "bg":
                    self.background = True
                self.running[name] = kind
                t = threading.Thread(target=self._run_one, args=(name, path, lane))
                t.start()
                threads.append(t)
        for t in threads:
            t.join()


TABLE_HEADER = """\
# Seconds each integration script took in its last full run (2 at a time)
# and the CPU seconds it used (where known): tests/run_integration.py starts
# the longest first, and above 2 at a time fits scripts to the CPUs. Refresh with
# `make itest-durations` after a `make check`. Two at a time (make check's
# default), a wrong figure only costs wall time, never a result.
"""


def save_durations(build: str) -> int:
    measured = read_durations(os.path.join(build, "itest-durations"))
    if not measured:
        raise SystemExit(f"no {build}/itest-durations: run the integration scripts first")
    table = read_durations(TABLE)
    table.update(measured)
    exists = {f[:-3] for f in os.listdir(IDIR) if f.endswith(".sh")} | {UNIT}
    write_durations(TABLE, {n: s for n, s in table.items() if n in exists}, TABLE_HEADER)
    print(f"{TABLE}: {len(measured)} figures from {build}/itest-durations")
    return 0


def main(argv: list) -> int:
    build = os.environ.get("BUILD", "build")
    if argv == ["--save-durations"]:
        return save_durations(build)
    unit = None
    if argv[:1] == ["--unit"] and len(argv) >= 2:
        unit, argv = argv[1].split(), argv[2:]
    names = argv or sorted(f[:-3] for f in os.listdir(IDIR) if f.endswith(".sh"))
    scripts = [(UNIT, unit, "shared")] if unit else []
    for n in names:
        path = os.path.join(IDIR, n + ".sh")
        if not os.path.isfile(path):
            raise SystemExit(f"no integration script {path}")
        scripts.append((n, path, kind_of(path)))
    record = os.path.join(build, "itest-durations")
    durations = read_durations(TABLE)
    durations.update(read_durations(record))
    jobs = int(os.environ.get("ITEST_JOBS", "2"))
    cpus = float(os.environ.get("ITEST_CPUS", os.cpu_count() or 1))
    lanes = Lanes.make() if jobs >= 2 else None
    runner = Runner(plan(scripts, durations, lanes is not None), jobs, int(os.environ.get("ITEST_TIMEOUT_S", "600")),
                    durations, cpus, lanes)
    start = time.monotonic()
    try:
        runner.run()
    finally:
        if lanes is not None:
            lanes.close()
    wall = time.monotonic() - start
    if lanes is not None:
        print(f"== light solos ran beside a background script (CPU groups under {lanes.top})")
    if os.path.isdir(build):
        last = read_durations(record)
        last.update({n: (max(1, round(s)), round(c)) for n, _, s, c in runner.results})
        write_durations(record, last, "# tests/run_integration.py: seconds per script, last run\n")
    print(f"== slowest ten of {len(runner.results)} scripts ({jobs} at a time, {wall:.0f} s wall, "
          f"{sum(r[2] for r in runner.results):.0f} s in all, {sum(r[3] for r in runner.results):.0f} s CPU)")
    for name, ok, secs, cpu in sorted(runner.results, key=lambda r: -r[2])[:10]:
        print(f"  {secs:6.0f} s  {cpu:5.0f} s CPU  {name}{'' if ok else '  (FAILED)'}")
    failed = sorted(r[0] for r in runner.results if not r[1])
    passed = len(runner.results) - len(failed)
    if failed:
        print("failed: " + " ".join(failed))
    print(f"integration: {passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
