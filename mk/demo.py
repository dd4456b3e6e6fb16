#!/usr/bin/env python3
"""make demo: a muster job on this machine, with a rank killed and healed.

musterd and two agents (node-a, node-b) of two CPU ranks each train the
`small` GPT on a text with ZeRO-3 over the TCP ring. Partway through, one
muster-train rank is SIGKILLed: musterd opens the next generation, the three
survivors keep their processes and state, and the replacement takes its
shard from a peer's memory. The demo shows the agents as musterd reports
them joined, one status line while the job runs (redrawn in place on a
terminal; otherwise a plain line at each change of state or generation and
four times over the run), the heal as the ranks and musterd saw it,
then a summary: the loss, the heal, the plan beside what the ranks measured,
and a sample of text from the trained model.

Everything it knows comes from musterd's REST API and the agents' logs; the
standard library is all it needs.

Environment:
  BUILD=dir      the binaries (default build)
  DATA=file      the text to train on (default ../shared/data/tinyshakespeare.txt)
  STEPS=n        optimizer steps (default 200; short mode 60)
  DEMO_SHORT=1   the short mode CI runs (tests/integration/demo.sh): fewer,
                 smaller steps and no sample
  DEMO_DIR=dir   the run's files: state, logs, checkpoints, events.json
                 (default demo-run; removed at the end unless KEEP=1). One
                 demo at a time uses it (a second is refused), and a
                 directory holding anything but a demo's files is left alone
  KEEP=1         keep DEMO_DIR afterwards (it is always kept on a failure)

Exit status: 0 the job completed, 1 it did not (or the demo could not run
it), 2 a bad setting above or no binaries in BUILD.
"""

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

BUILD = os.environ.get("BUILD", "build")
SHORT = os.environ.get("DEMO_SHORT", "0") == "1"
DIR = os.path.abspath(os.environ.get("DEMO_DIR", "demo-run"))
KEEP = os.environ.get("KEEP", "0") == "1"
TTY = sys.stdout.isatty()
NODES = ("node-a", "node-b")
RANKS_PER_NODE = 2
VICTIM_RANK = 3  # node-b's second rank: its shard's replica lives on node-a
DEADLINE_S = 240 if SHORT else 600  # the whole run, whatever happens
# What a demo writes in DEMO_DIR: a directory with anything else is not wiped.
DEMO_FILES = {"agents", "checkpoints", "job.json", "musterd.log", "state", "token", "events.json"} | \
    {f"{node}.log" for node in NODES}


class DemoError(Exception):
    """A reason to stop the demo, said in one line."""


def env_int(name, default, low, high):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise DemoError(f"{name}={raw!r}: expected a whole number") from None
    if not low <= value <= high:
        raise DemoError(f"{name}={value}: expected {low} to {high}")
    return value


def pick_port(preferred):
    """The preferred port when it is free on loopback, else 0 (musterd picks one)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            return 0
        return preferred


def human(n):
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}T"


def shown(path):
    """A path as short as it reads: relative when it is under the current directory."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def size(n):
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


class Screen:
    """One status line redrawn in place on a terminal; plain lines otherwise."""

    def __init__(self):
        self.shown = ""   # the status line on screen (terminal only)

    def say(self, text):
        if TTY and self.shown:
            sys.stdout.write("\r\033[K")
        print(text, flush=True)
        if TTY and self.shown:
            sys.stdout.write(self.shown)
            sys.stdout.flush()

    def status(self, text, plain_now):
        if TTY:
            width = shutil.get_terminal_size((100, 24)).columns - 1
            self.shown = text[:width]
            sys.stdout.write("\r\033[K" + self.shown)
            sys.stdout.flush()
        elif plain_now:
            print(text, flush=True)

    def done(self):
        if TTY and self.shown:
            sys.stdout.write("\n")
            sys.stdout.flush()
        self.shown = ""


class Demo:
    def __init__(self):
        self.screen = Screen()
        self.procs = []
        self.t0 = time.monotonic()
        self.steps = env_int("STEPS", 60 if SHORT else 200, 20, 100000)
        for prog in ("musterd", "muster-worker", "muster-train", "musterctl"):
            if not os.access(f"{BUILD}/{prog}", os.X_OK):
                raise DemoError(f"no {BUILD}/{prog}: build first (make), or set BUILD=dir")
        data = os.environ.get("DATA", "../shared/data/tinyshakespeare.txt")
        if not os.path.isfile(data) or not os.access(data, os.R_OK):
            raise DemoError(f"cannot read the training text '{data}' (not a readable file); "
                            "give one with DATA=path/to/text.txt")
        self.data = os.path.abspath(data)
        self.claim_dir()
        self.server = ""
        self.plan_seen = None    # (plan, measured, step_s) of the last running status
        self.kill = None         # what the kill and the heal came to

    # ---- REST
    def get(self, path):
        try:
            with urllib.request.urlopen(self.server + path, timeout=2) as r:
                return json.load(r)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def elapsed(self):
        return time.monotonic() - self.t0

    def check_deadline(self, what):
        if self.elapsed() > DEADLINE_S:
            raise DemoError(f"{what}: not done after {DEADLINE_S} s")

    # ---- set-up
    def claim_dir(self):
        """DIR for this run alone, emptied: a second demo on it would wipe the
        first one's files (and read its logs), and a DEMO_DIR that holds
        anything but a demo's files is not this demo's to remove."""
        try:
            os.makedirs(DIR, exist_ok=True)
            self.lock = os.open(DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise DemoError(f"DEMO_DIR {shown(DIR)}: {e.strerror}") from None
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise DemoError(f"another demo is running in {shown(DIR)}/: wait for it to end, or give "
                            "this one its own DEMO_DIR=dir") from None
        foreign = sorted(set(os.listdir(DIR)) - DEMO_FILES)
        if foreign:
            raise DemoError(f"DEMO_DIR {shown(DIR)} holds files a demo did not write ({', '.join(foreign[:3])}"
                            f"{', ...' if len(foreign) > 3 else ''}): not removing them; give a new or "
                            "empty directory")
        for entry in os.listdir(DIR):
            path = os.path.join(DIR, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)

    def write_job(self):
        # Sequences of 64 tokens: the loss falls from 5.5 (a uniform guess
        # over 256 bytes) to about 2.4 in 200 steps of 16; the short mode's
        # steps of 8 cost half as much, and 60 of them reach about 2.7.
        batch, seq = (8, 64) if SHORT else (16, 64)
        job = {
            "name": "demo", "nodes": len(NODES), "max_restarts": 3,
            "model": "small", "data": self.data, "steps": self.steps,
            "batch": batch, "seq_len": seq, "lr": 0.003, "lr_min": 0.0003,
            "warmup_steps": 20, "eval_every": self.steps, "eval_batches": 4,
            "checkpoint_dir": os.path.join(DIR, "checkpoints"),
            "checkpoint_every": 50, "restart_backoff_ms": 0,
        }
        self.job_path = os.path.join(DIR, "job.json")
        with open(self.job_path, "w") as f:
            json.dump(job, f, indent=1)
        self.batch, self.seq = batch, seq

    def spawn(self, args, log):
        out = open(os.path.join(DIR, log), "w")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        out.close()
        self.procs.append(p)
        return p

    def start(self):
        self.write_job()
        token = os.path.join(DIR, "token")
        made = subprocess.run([f"{BUILD}/musterctl", "token", "new", token],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if made.returncode != 0:
            raise DemoError(f"musterctl token new: {made.stderr.strip()}")
        ctl, http = pick_port(29470), pick_port(29471)
        self.daemon = self.spawn(
            [f"{BUILD}/musterd", "--job", self.job_path, "--listen", f"127.0.0.1:{ctl}",
             "--http", f"127.0.0.1:{http}", "--state-dir", os.path.join(DIR, "state"),
             "--token-file", token], "musterd.log")
        ctl = self.wait_listening()
        while self.get("/v1/status") is None:
            if self.daemon.poll() is not None:
                raise DemoError(f"musterd exited with status {self.daemon.returncode}")
            self.check_deadline("musterd's REST API")
            time.sleep(0.05)
        shape = f"{self.batch} sequences x {self.seq} tokens"
        print(f"muster demo: musterd and {len(NODES)} agents x {RANKS_PER_NODE} CPU ranks on this "
              f"machine (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        print(wrap("  ", f"training: the 'small' GPT (0.84M parameters), ZeRO-3 over the TCP "
                         f"ring, {self.steps} steps of {shape} from {os.path.basename(self.data)}"))
        print(wrap("  ", f"dashboard: {self.server}/ (reads need no token on loopback; the "
                         f"admin token is {shown(token)})"))
        self.agents = {}
        for node in NODES:
            self.agents[node] = self.spawn(
                [f"{BUILD}/muster-worker", "--daemon", f"127.0.0.1:{ctl}", "--node", node,
                 "--devices", f"cpu:{RANKS_PER_NODE}", "--token-file", token,
                 "--state-dir", os.path.join(DIR, "agents")], f"{node}.log")

    def wait_listening(self):
        """musterd's control port, and its REST URL in self.server, as its own
        log says: a port another program took after pick_port found it free
        stops musterd (said here) rather than point the demo at that program."""
        log = os.path.join(DIR, "musterd.log")
        while True:
            with open(log, errors="replace") as f:
                text = f.read()
            m = re.search(r"control 127\.0\.0\.1:(\d+), REST (http://127\.0\.0\.1:\d+)", text)
            if m:
                self.server = m.group(2)
                return int(m.group(1))
            if self.daemon.poll() is not None:
                last = text.strip().splitlines()[-1:] or ["(no output)"]
                raise DemoError(f"musterd exited with status {self.daemon.returncode}: {last[0]}")
            self.check_deadline("musterd's start")
            time.sleep(0.05)

    def wait_formed(self):
        """Names each node when musterd lists it joined, then the first generation."""
        joined = set()
        while True:
            self.check_deadline("forming the job")
            for node, agent in self.agents.items():
                if agent.poll() is not None:
                    raise DemoError(f"the agent of {node} exited with status {agent.returncode}")
            # The status first: every node of a generation it shows formed is in
            # the list read after it.
            st = self.get("/v1/status")
            nodes = self.get("/v1/nodes") or {"nodes": []}
            for n in nodes["nodes"]:
                if n.get("fit") == "unfit":  # the job cannot form: say why now, not at the deadline
                    raise DemoError(f"{n['name']} is unfit for the job: {n.get('unfit_reason')}")
                if n["state"] == "joined" and n["name"] not in joined:
                    joined.add(n["name"])
                    print(f"  {n['name']} joined at {self.elapsed():.1f} s: {n['devices']} "
                          f"{n['kind']} devices, address {n['addr']}")
            if st and st["state"] == "running" and st["generation"] >= 1:
                ranks = self.get("/v1/ranks") or {"ranks": []}
                where = {}
                for r in ranks["ranks"]:
                    where.setdefault(r["node"], []).append(r["rank"])
                blocks = ", ".join(f"ranks {min(v)}-{max(v)} on {k}" for k, v in sorted(where.items()))
                print(f"  generation {st['generation']} formed at {self.elapsed():.1f} s: "
                      f"{st['world_size']} ranks ({blocks})")
                return
            time.sleep(0.1)

    # ---- the ranks' own account, from their agents' logs
    def rank0_steps(self):
        """(generation, step, loss) of every step rank 0 logged, in order."""
        out, gen = [], 1
        try:
            with open(os.path.join(DIR, "node-a.log"), errors="replace") as f:
                for line in f:
                    m = re.match(r"rank 0: muster-train\[0\] info: generation (\d+)", line)
                    if m:
                        gen = int(m.group(1))
                    m = re.match(r"rank 0: step (\d+)/\d+ loss ([0-9.]+)", line)
                    if m:
                        out.append((gen, int(m.group(1)), float(m.group(2))))
        except OSError:
            pass
        return out

    def rank_pids(self):
        """{rank: pid} of the live muster-train processes the agents started, from /proc."""
        agents = {a.pid for a in self.agents.values()}
        pids = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid not in agents:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except (OSError, IndexError, ValueError):
                continue
            if b"RANK" in env:
                pids[int(env[b"RANK"])] = int(entry)
        return pids

    # ---- the run
    def status_line(self, st):
        step = st["step"] or 0
        steps = st["steps"] or self.steps
        loss = f"{st['loss']:.3f}" if st["loss"] is not None else "-"
        tps = human(st["tokens_per_s"]) if st["tokens_per_s"] else "-"
        running = st["ranks_by_state"]["running"]
        return (f"  {self.elapsed():5.1f} s  {st['state']:<10} generation {st['generation']}  "
                f"step {step:>{len(str(steps))}}/{steps}  loss {loss}  {tps} tok/s  "
                f"{running}/{st['world_size']} ranks running")

    def follow(self):
        kill_at = max(5, self.steps * 2 // 5)
        next_plain, shown = 1, None
        while True:
            self.check_deadline("the job")
            if self.daemon.poll() is not None:
                raise DemoError(f"musterd exited with status {self.daemon.returncode}")
            st = self.get("/v1/status")
            if st is None:
                time.sleep(0.2)
                continue
            if st["state"] == "running" and st["plan"] and st["measured"]["comm_frac"] is not None:
                self.plan_seen = (st["plan"], st["measured"], st["step_s"])
            step = st["step"] or 0
            # Plain lines: at every change of state or generation, and
            # four times over the run.
            plain = step >= next_plain or (st["state"], st["generation"]) != shown
            self.screen.status(self.status_line(st), plain)
            if plain:
                shown = (st["state"], st["generation"])
                if step >= next_plain:
                    next_plain = step + max(1, self.steps // 4)
            if st["state"] in ("completed", "failed", "stopped"):
                self.screen.done()
                return st
            if self.kill is None and st["state"] == "running" and step >= kill_at:
                self.kill_one(st)
                self.watch_heal()
                next_plain = 1
            time.sleep(0.25 if TTY else 0.5)

    def next_rank0_step(self):
        """Waits for rank 0 to log a step beyond those logged now; the time it saw it."""
        seen = len(self.rank0_steps())
        while len(self.rank0_steps()) <= seen:
            self.check_deadline("the next step")
            time.sleep(0.01)
        return time.monotonic()

    def kill_one(self, st):
        pids = self.rank_pids()
        if VICTIM_RANK not in pids or len(pids) != len(NODES) * RANKS_PER_NODE:
            raise DemoError(f"cannot find the rank processes under the agents (found {pids})")
        victim = pids[VICTIM_RANK]
        # Mid-step: a rank's state of step s reaches its holder early in step
        # s + 1, while it computes, and the step's update waits for it
        # (worker/train/replica.h). Killed between the two, the rank costs no
        # finished step; killed just after a step ends, before its state went
        # out, the heal goes back one step, and the summary would say so.
        t1 = self.next_rank0_step()
        time.sleep((self.next_rank0_step() - t1) / 2)
        logged = self.rank0_steps()
        os.kill(victim, signal.SIGKILL)
        self.kill = {"time": time.monotonic(), "pid": victim, "pids": pids,
                     "generation": st["generation"], "logged": logged[-1][1] if logged else 0}
        self.screen.say(f"  SIGKILL to rank {VICTIM_RANK} (node-b, pid {victim}) at step "
                        f"{self.kill['logged']}, {self.elapsed():.1f} s in")

    def watch_heal(self):
        """Waits for rank 0's first step of the next generation; says what the heal cost."""
        k = self.kill
        while True:
            self.check_deadline("the heal")
            after = [s for s in self.rank0_steps() if s[0] > k["generation"]]
            if after:
                k["next_step_s"] = time.monotonic() - k["time"]
                # Every rank is alive now; a short job may end while musterd's
                # account is awaited below, and its ranks with it.
                now = self.rank_pids()
                break
            st = self.get("/v1/status")
            if st and st["state"] in ("completed", "failed", "stopped"):
                raise DemoError(f"the job ended ({st['state']}: {st['reason']}) before it healed")
            time.sleep(0.05)
        # musterd's account of the heal: where the new generation's state came from.
        while True:
            st = self.get("/v1/status") or {}
            if (st.get("generation", 0) > k["generation"] and st.get("restored")) or \
                    time.monotonic() - k["time"] > 20:
                break
            time.sleep(0.1)
        # The steps rank 0 finished in the generation that broke: the heal
        # loses those beyond the step it resumed at.
        before = [s[1] for s in self.rank0_steps() if s[0] <= k["generation"]]
        k["last_done"] = max(before) if before else 0
        restored = st.get("restored") or {}
        k["from"], k["resumed"] = restored.get("from"), restored.get("step")
        k["new_generation"] = st.get("generation")
        k["kept"] = [r for r, p in k["pids"].items() if r != VICTIM_RANK and now.get(r) == p]
        k["replaced"] = now.get(VICTIM_RANK) not in (None, k["pid"])
        k["lost"] = None if k["resumed"] is None else max(0, k["last_done"] - k["resumed"])
        self.screen.say(wrap("  ", self.heal_line()))

    def heal_line(self):
        k = self.kill
        if k["lost"] is None:
            lost = "unknown"
        elif k["lost"] == 0:
            lost = "none"
        else:
            lost = f"{k['lost']} (steps {k['resumed'] + 1}-{k['last_done']} are done again)"
        where = {"memory": "from peers' memory", "disk": "from the checkpoint on disk",
                 "seed": "from the seed"}.get(k["from"], "from an unknown source")
        in_place = (k["lost"] == 0 and k["from"] == "memory" and
                    len(k["kept"]) == len(k["pids"]) - 1 and k["replaced"])
        survivors = ", ".join(str(r) for r in sorted(k["kept"]))
        return (f"{'healed in place' if in_place else 'recovered, not in place'}: generation "
                f"{k['new_generation']}, ranks {survivors} kept their processes, rank {VICTIM_RANK} "
                f"restarted; resumed at step {k['resumed']} {where}; steps lost: {lost}; "
                f"next step {k['next_step_s']:.1f} s after the kill")

    # ---- the summary
    def plan_line(self):
        if not self.plan_seen:
            return "plan vs measured: no measurement was seen while the job ran"
        plan, measured, step_s = self.plan_seen
        comm, frac = plan["comm"], measured["comm_frac"]
        waited = f": {1000 * frac * step_s:.0f} ms of a {1000 * step_s:.0f} ms step" if step_s else ""
        sent = size(comm["sent_per_step"])
        return (f"plan vs measured: communication {100 * comm['comm_frac']:.1f} % planned, "
                f"{100 * frac:.1f} % measured (the rank that waited most{waited}). "
                f"The plan counts the time to move the bytes ({sent} per step at "
                f"{comm['network_gbit']:g} Gbit/s: {1000 * comm['comm_s']:.0f} ms) against "
                f"{comm['tflops']:g} TFLOPS of compute per rank ({1000 * comm['compute_s']:.0f} ms); "
                f"a rank measures all the time it waits in collectives, and here {self.world} "
                f"ranks share {os.cpu_count()} cores, so most of that is waiting for peers that "
                f"are still computing or not scheduled, not moving bytes. Bytes per step agree: "
                f"{sent} planned, {size(measured['sent_per_step'] or 0)} sent.")

    def val_loss(self):
        with open(os.path.join(DIR, "node-a.log"), errors="replace") as f:
            vals = re.findall(r"rank 0: val step \d+ loss ([0-9.]+)", f.read())
        return float(vals[-1]) if vals else None

    def summary(self, st):
        with urllib.request.urlopen(self.server + "/v1/events", timeout=5) as r:
            events = r.read()
        with open(os.path.join(DIR, "events.json"), "wb") as f:
            f.write(events)
        steps = self.rank0_steps()
        print()
        print(f"summary ({self.elapsed():.0f} s):")
        print(f"  job {st['state']}: {st['step']} steps, generation {st['generation']}, "
              f"{st['restarts']} restart{'' if st['restarts'] == 1 else 's'}")
        if steps:
            val = self.val_loss()
            print(f"  loss {steps[0][2]:.3f} at step {steps[0][1]} -> {steps[-1][2]:.3f} at step "
                  f"{steps[-1][1]}" + (f"; validation loss {val:.3f}" if val is not None else ""))
        if self.kill:
            print(wrap("  ", self.heal_line()))
        print(wrap("  ", self.plan_line()))

    def sample(self):
        """A few lines of text from the last checkpoint (one thread: the machine is busy)."""
        try:
            out = subprocess.run(
                [f"{BUILD}/muster-train", "--standalone", "--job", self.job_path, "--threads", "1",
                 "--resume", os.path.join(DIR, "checkpoints"), "--sample", "240", "--eval-every", "0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace",
                timeout=60)
        except subprocess.TimeoutExpired:
            print("  (no sample: sampling took over 60 s)")
            return
        at = out.stdout.find("sample")
        if out.returncode == 0 and at >= 0:
            print("  " + out.stdout[at:].rstrip().replace("\n", "\n  "))
        else:
            print(f"  (no sample: muster-train exited with status {out.returncode})")

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def run(self):
        self.world = len(NODES) * RANKS_PER_NODE
        self.start()
        self.wait_formed()
        st = self.follow()
        if st["state"] != "completed":
            raise DemoError(f"the job is {st['state']}: {st['reason']}")
        self.summary(st)
        if not SHORT:
            self.sample()


def wrap(indent, text):
    return textwrap.fill(text, 92, initial_indent=indent, subsequent_indent=indent + "  ")


def interrupted(signum, frame):
    raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does: its processes with it


def main():
    signal.signal(signal.SIGTERM, interrupted)
    try:
        demo = Demo()
    except DemoError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    try:
        demo.run()
        ok = True
    except DemoError as e:
        demo.screen.done()
        print(f"demo: {e}; the logs are in {shown(DIR)}/", file=sys.stderr)
        ok = False
    except KeyboardInterrupt:
        demo.screen.done()
        print("demo: interrupted", file=sys.stderr)
        ok = False
    finally:
        demo.stop()
    if ok and not KEEP:
        shutil.rmtree(DIR, ignore_errors=True)
    print(f"demo: {'done' if ok else 'failed'} ({'kept' if KEEP or not ok else 'removed'} {shown(DIR)}/)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
