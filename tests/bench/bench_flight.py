"""The flight recorder's cost (issue 32, item 5): tests/torch/ddp_train.py on
2 gloo ranks on loopback, with TORCH_FR_BUFFER_SIZE=2000 (what the agent sets
by default) and without, in alternating runs; and a loop of small
all_reduces, which is all collective overhead, the same way. Prints medians
over the runs with their range, and the cost per collective.

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
t = time.perf_counter()
for _ in range(int(os.environ["OPS"])):
    dist.all_reduce(x)
dt = time.perf_counter() - t
if dist.get_rank() == 0:
    print(dt / int(os.environ["OPS"]))
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


def loop_op(fr: bool, ops: int) -> float:
    return float(launch(["-c", LOOP], fr, extra={"OPS": str(ops)}).split()[-1])


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
    print("flight recorder cost, %d runs each, alternating, 2 gloo ranks on loopback:" % a.runs)
    # ddp_train.py's step has one collective (the gradient bucket's all_reduce)
    show("ddp_train.py step (1 collective)", on, off, 1e6, "per step")
    show("all_reduce of 8 floats", lon, loff, 1e6, "per collective")


if __name__ == "__main__":
    main()
