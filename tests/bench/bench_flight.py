"""The flight recorder's cost (issue 32, item 5): tests/torch/ddp_train.py on
2 gloo ranks on loopback, with TORCH_FR_BUFFER_SIZE=2000 (what the agent sets
by default) and without, in alternating runs; and a loop of small
all_reduces on one gloo rank, which is all collective overhead and no peer
to wait for, the same way: its wall time and its main thread's CPU time (the
recorder records on the calling thread; CPU time is what a loaded machine
disturbs least). Prints medians over the runs with their range.

  .venv/bin/python tests/bench/bench_flight.py [--runs 5] [--steps 300] [--ops 3000]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DDP = os.path.join(HERE, "..", "torch", "ddp_train.py")
LOOP = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(8)
for _ in range(50):
    dist.all_reduce(x)
dist.barrier()
n = int(os.environ["OPS"])
t, c = time.perf_counter(), time.thread_time()
for _ in range(n):
    dist.all_reduce(x)
dt, dc = time.perf_counter() - t, time.thread_time() - c
if dist.get_rank() == 0:
    print(dt / n, dc / n)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv, fr: bool, world: int = 2, extra=None):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                   RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", **(extra or {}))
        env.pop("TORCH_FR_BUFFER_SIZE", None)
        if fr:
            env["TORCH_FR_BUFFER_SIZE"] = "2000"
        procs.append(subprocess.Popen([sys.executable] + argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a rank failed: %s" % argv)
    return outs[0]


def ddp_step(fr: bool, steps: int) -> float:
    """Median seconds per step of rank 0 after the first 20 steps."""
    with tempfile.TemporaryDirectory() as d:
        timing = os.path.join(d, "timing")
        launch([DDP, "--steps", str(steps), "--timing-file", timing], fr)
        t = [float(f[5]) for f in (line.split() for line in open(timing)) if f[0] == "step" and f[1] == "0"]
    gaps = [b - a for a, b in zip(t[20:], t[21:])]
    return statistics.median(gaps)


def loop_op(fr: bool, ops: int):
    """(wall, main thread CPU) seconds per all_reduce on one rank."""
    wall, cpu = launch(["-c", LOOP], fr, world=1, extra={"OPS": str(ops)}).split()[-2:]
    return float(wall), float(cpu)


def show(name: str, on, off, unit: float, per: str):
    mon, moff = statistics.median(on), statistics.median(off)
    print("%s: on %.1f us (%.1f-%.1f), off %.1f us (%.1f-%.1f): %+.1f us %s (%+.1f%%)" % (
        name, mon * unit, min(on) * unit, max(on) * unit, moff * unit, min(off) * unit, max(off) * unit,
        (mon - moff) * unit, per, 100 * (mon - moff) / moff))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ops", type=int, default=3000)
    a = p.parse_args()
    on, off, lon, loff = [], [], [], []
    for i in range(a.runs):
        for fr in ((True, False) if i % 2 == 0 else (False, True)):  # alternate which goes first
            (on if fr else off).append(ddp_step(fr, a.steps))
            (lon if fr else loff).append(loop_op(fr, a.ops))
    print("flight recorder cost (TORCH_FR_BUFFER_SIZE=2000 vs unset), %d runs each, alternating:" % a.runs)
    # ddp_train.py's step has one collective (the gradient bucket's all_reduce)
    show("ddp_train.py step, 2 gloo ranks (1 collective a step), wall", on, off, 1e6, "per step")
    show("all_reduce of 8 floats, 1 gloo rank, wall", [x[0] for x in lon], [x[0] for x in loff], 1e6,
         "per collective")
    show("all_reduce of 8 floats, 1 gloo rank, main thread CPU", [x[1] for x in lon], [x[1] for x in loff], 1e6,
         "per collective")


if __name__ == "__main__":
    main()
