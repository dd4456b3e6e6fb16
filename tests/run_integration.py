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

A solo that keeps less than LIGHT_SOLO CPUs busy (by the table: most of
them wait on timers, links and leases, and the hang scripts' one training
keeps about one busy) leaves the other CPU idle, a third of the whole run
once. So where this machine lets the runner make
CPU control groups (cgroup v1's cpu controller or v2's; root), the solos
run in two steps: the heavy ones alone, then the light ones one at a
time with a shared script beside each in a *background* group whose CPU
weight is a third of the solo's, so that the solo's processes win most of
the CPU whenever they want it (the kernel's own fair scheduler, by
weight) and the background script uses what is left. Not less than a
third: at an eighth, a solo's burst (four ranks importing torch at once)
left a background script's musterd and agents a few hundredths of a CPU
for seconds, past its jobs' heartbeat timeouts of 1-2 s (a session resume
that could not finish, a node lost, a generation restarted). Once the last solo is done
the background group's weight is raised to the foreground's, so that the
scripts still in it run as any other. Without control groups every solo
runs alone. ITEST_LANES=off turns the background off. Only the unit suites
and a script that says `# itest: background` (one seen to pass there,
time after time) go in the background; the others run as shared scripts
in the foreground: in the background, with jobs whose heartbeat timeouts
are 1-3 s, memckpt_deepspeed, heal_in_place and gpu_shrink lost sessions
or named a starved rank hung, and the job spent a generation.

--unit CMD adds one more item, named unit_suites, run as a shared script
first in the background (the Check suites, by tests/run.sh).

make check makes the Python environment (.venv, mk/deps.sh venv: minutes of
pip on a fresh machine) while the tree builds, and starts this runner once
the build is done, with ITEST_VENV_STATUS naming the file the environment's
exit status will be written to: until it is there, the scripts that use the
environment (need_torch, .venv, TORCH_PY in their text) are held and the
others run; then the held ones join the order (solos still alone), the
environment's log (ITEST_VENV_LOG) is printed, and if it failed every held
script fails, naming why.

With ITEST_JOBS above 2, a third (or later) script starts beside others
only where it fits the machine: the CPU the running ones used per second
of their last run (the table's CPU column), with its own, must stay within
ITEST_CPUS (default: the CPUs this machine has); a script with no CPU
figure counts as a whole CPU. The first pending script that fits starts,
so a light one can go beside two heavy ones. Up to 2, none of this applies.

A script that fails is run once more at the end, alone on the machine
(at most RETRY_MOST of them: more failures than that are not a flake but
a break, and are not retried). One that then passes is counted as passed
but named FLAKY, in the tally and in $BUILD/itest-flaky, with the first
run's whole output above and its FAIL lines repeated at the end; one that
fails again fails. So a broken feature still fails the run (it fails
alone too), and a failure that only a loaded machine makes (a lease
timed out while pip or a neighbour took the CPU) is reported, not lost in
a red run. ITEST_RETRY=0 turns the second run off.

Usage: python3 tests/run_integration.py [--unit CMD] [NAME ...]   (default: every script)
       python3 tests/run_integration.py --save-durations
           (merges $BUILD/itest-durations into tests/integration/durations)
Environment: BUILD, ITEST_JOBS, ITEST_CPUS, ITEST_TIMEOUT_S (600 per script), ITEST_LANES,
ITEST_VENV_STATUS, ITEST_VENV_LOG, ITEST_RETRY.
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
KINDS = ("solo", "background")  # background: shared, and may run in the background lane beside a light solo
DEFAULT_S = 60  # an unknown script starts among the long ones
LIGHT_SOLO = 1.2  # CPUs a solo may keep busy (by the table) and still have a script beside it
BG_SHARE = 3  # the foreground lane weighs this many times the background one
UNIT = "unit_suites"
VENV_WAIT_S = 3600  # the longest the held scripts wait for the environment
RETRY_MOST = 3  # failed scripts run once more, alone, if there are no more than this


def kind_of(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"#\s*itest:\s*(\w+)\s*$", line)
            if m:
                if m.group(1) not in KINDS:
                    raise SystemExit(f"{path}: '# itest: {m.group(1)}': expected one of {', '.join(KINDS)}")
                return m.group(1)
    return "shared"


def needs_venv(path) -> bool:
    """Whether a script uses the build's Python environment (.venv)."""
    if isinstance(path, list):  # the unit suites' command
        return False
    with open(path, encoding="utf-8") as f:
        return re.search(r"need_torch|\.venv\b|TORCH_PY", f.read()) is not None


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
    it the foreground and the background lanes, BG_SHARE to 1. None where they
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
        self.weigh("bg", max(1, self.full // BG_SHARE))

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
    def __init__(self, scripts: list, jobs: int, timeout_s: int, durations: dict, cpus: float, lanes=None,
                 venv_status=None, venv_log=None):
        self.pending = list(scripts)  # (name, path, kind), in start order
        self.held = []  # the scripts waiting for the Python environment
        self.venv_status, self.venv_log = venv_status, venv_log
        if venv_status and not os.path.exists(venv_status):
            self.held = [s for s in self.pending if needs_venv(s[1])]
            self.pending = [s for s in self.pending if s not in self.held]
        self.lane_of = {}  # name -> "fg" or "bg", of the running scripts
        self.lanes = lanes
        self.jobs = max(1, jobs)
        self.durations = durations
        self.cpus = cpus
        self.timeout_s = timeout_s
        self.running = {}  # name -> kind, "solo" or "light" (a solo with a script beside it) or "shared"
        self.background = False  # the background group still weighs less than the foreground
        self.results = []  # (name, ok, seconds, cpu seconds)
        self.digests = {}  # name -> what a failed script said (digest())
        self.unmade = set()  # the scripts failed for want of the Python environment
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
                if kind == "background" or name == UNIT:
                    return self.pending.pop(i), "bg"
            return None
        if head[2] == "solo":  # alone, or (light, with lanes) beside background scripts only
            if lanes and light(self.durations, head[0]):
                if len(self.running) < 2 and "fg" not in self.lane_of.values():
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
            where = ", in the background" if lane == "bg" and self.lanes is not None else ""
            sys.stdout.write(f"-- {name}: {'ok' if ok else 'FAILED'} ({secs:.0f} s, {cpu:.0f} s CPU{where})\n")
            sys.stdout.flush()
            self.results.append((name, ok, secs, cpu))
            if not ok:
                self.digests[name] = digest(out)
            del self.running[name]
            del self.lane_of[name]
            self.cond.notify_all()

    def _wait_venv(self) -> None:
        """Waits for the environment's exit status (bounded), then lets the
        held scripts join the order, or fails them."""
        start = time.monotonic()
        status = None
        while time.monotonic() - start < VENV_WAIT_S:
            try:
                with open(self.venv_status, encoding="utf-8") as f:
                    status = f.read().strip()
                if status:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.5)
        log = ""
        if self.venv_log:
            try:
                with open(self.venv_log, encoding="utf-8", errors="replace") as f:
                    log = f.read()
            except OSError:
                pass
        with self.cond:
            held, self.held = self.held, []
            sys.stdout.write(f"== the Python environment (mk/deps.sh venv): exit status {status or 'none'}, "
                             f"{time.monotonic() - start:.0f} s after the runner started; "
                             f"{len(held)} scripts held for it\n{log}")
            if status == "0":
                self.pending = plan(self.pending + held, self.durations, self.lanes is not None)
            else:
                why = (f"mk/deps.sh venv exited {status}" if status else
                       f"no exit status in {self.venv_status} within {VENV_WAIT_S} s")
                for name, _, _ in held:
                    sys.stdout.write(f"== integration: {name}\nthe Python environment was not made ({why}; "
                                     f"its log is above)\n-- {name}: FAILED (0 s, 0 s CPU)\n")
                    self.results.append((name, False, 0.0, 0.0))
                    self.unmade.add(name)
            sys.stdout.flush()
            self.cond.notify_all()

    def run(self) -> None:
        threads = []
        if self.held:
            t = threading.Thread(target=self._wait_venv)
            t.start()
            threads.append(t)
        with self.cond:
            while self.pending or self.running or self.held:
                nxt = self._startable()
                if nxt is None:
                    self.cond.wait()
                    continue
                (name, path, kind), lane = nxt
                if kind == "solo" and self.lanes is not None and light(self.durations, name):
                    kind = "light"
                if lane == "bg":
                    if not self.background:  # (raised when the solos seemed over; solos held for the environment came)
                        self.lanes.weigh("bg", max(1, self.lanes.full // 8))
                    self.background = True
                self.running[name] = kind
                self.lane_of[name] = lane
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


def digest(out: str, most: int = 40) -> str:
    """The lines of a failed script's output that say why (its FAIL lines,
    Check's failed cases, the line before each FAIL, and musterd's state
    that fail() prints last), at most `most`: repeated at the end of the
    run, where a CI log's tail shows them."""
    lines = out.splitlines()
    keep = []
    for i, line in enumerate(lines):
        if line.startswith("FAIL") or re.search(r":[FE]:[^:]+:", line):
            if i and lines[i - 1] not in keep and not lines[i - 1].startswith("----"):
                keep.append(lines[i - 1])
            keep.append(line)
    keep = keep[:20]  # room for musterd's account below
    tails = [i for i, ln in enumerate(lines) if ln.startswith("---- tail of ") and ln.endswith("/musterd.log")]
    if tails:  # musterd's own account of the job's last moves
        section = []
        for ln in lines[tails[-1] + 1:]:
            if ln.startswith("---- "):
                break
            section.append(ln)
        keep.extend(["---- the last of musterd.log"] + section[-8:])
    if "---- musterd now" in out:
        keep.extend(out[out.rindex("---- musterd now"):].splitlines()[:20])
    keep = [ln[:400] for ln in keep[:most]]
    return "\n".join(keep) if keep else "\n".join(ln[:400] for ln in lines[-8:])


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
                    durations, cpus, lanes, os.environ.get("ITEST_VENV_STATUS"), os.environ.get("ITEST_VENV_LOG"))
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
        last.update({n: (max(1, round(s)), round(c)) for n, ok, s, c in runner.results if ok or s > 0})
        write_durations(record, last, "# tests/run_integration.py: seconds per script, last run\n")
    print(f"== slowest ten of {len(runner.results)} scripts ({jobs} at a time, {wall:.0f} s wall, "
          f"{sum(r[2] for r in runner.results):.0f} s in all, {sum(r[3] for r in runner.results):.0f} s CPU)")
    for name, ok, secs, cpu in sorted(runner.results, key=lambda r: -r[2])[:10]:
        print(f"  {secs:6.0f} s  {cpu:5.0f} s CPU  {name}{'' if ok else '  (FAILED)'}")
    failed = sorted(r[0] for r in runner.results if not r[1])
    flaky = []
    retry = [s for s in scripts if s[0] in failed and s[0] not in runner.unmade]
    if os.environ.get("ITEST_RETRY", "1") != "0" and 0 < len(retry) <= RETRY_MOST:
        print(f"== running again, one at a time and alone: {' '.join(s[0] for s in retry)}")
        sys.stdout.flush()
        again = Runner(retry, 1, int(os.environ.get("ITEST_TIMEOUT_S", "600")), durations, cpus)
        again.run()
        flaky = sorted(n for n, ok, _, _ in again.results if ok)
        failed = [n for n in failed if n not in flaky]
        runner.digests.update({n: "(the second run)\n" + d for n, d in again.digests.items()})
    if os.path.isdir(build):
        with open(os.path.join(build, "itest-flaky"), "w", encoding="utf-8") as f:
            f.write("".join(n + "\n" for n in flaky))
    passed = len(runner.results) - len(failed)
    for name in flaky:
        print(f"== FLAKY: {name} failed beside other work and passed alone; why it failed the first time:")
        print(runner.digests.get(name, "(no output kept)"))
    for name in failed:
        print(f"== why {name} failed (its whole output is above)")
        print(runner.digests.get(name, "(no output kept)"))
    if flaky:
        print("flaky (failed, then passed alone): " + " ".join(flaky))
    if failed:
        print("failed: " + " ".join(failed))
    print(f"integration: {passed} passed ({len(flaky)} of them on a second run alone), {len(failed)} failed"
          if flaky else f"integration: {passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
