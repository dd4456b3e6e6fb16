#!/bin/sh
# muster-train's start-up: `muster-train --version`, RUNS (default 20) times;
# the median wall time from spawn to exit and the largest resident set (as
# GNU time reports it: a child spawned from Python would count Python's own
# pages). It is
# what every rank pays before it trains (issue 12: < 20 ms, < 15 MB with the
# CUDA toolkit installed). The libraries it maps are counted too: a CPU rank
# maps none of CUDA, cuBLAS or NCCL (tests/integration/train_lean.sh).
set -eu
RUNS=${RUNS:-20}
BUILD=${BUILD:-build}
python3 - "$BUILD/muster-train" "$RUNS" <<'PY'
import os, statistics, subprocess, sys, time
exe, runs = sys.argv[1], int(sys.argv[2])
walls, rss = [], []
def run(argv):
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, _ = os.wait4(p.pid, 0)
    ms = (time.perf_counter() - t0) * 1e3
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{exe} --version failed")
    return ms
for _ in range(runs):
    walls.append(run([exe, "--version"]))
    out = subprocess.run(["/usr/bin/time", "-f", "%M", exe, "--version"], capture_output=True, text=True)
    rss.append(int(out.stderr.split()[-1]) / 1024)  # KiB -> MiB
env = dict(os.environ, LD_DEBUG="libs")
log = subprocess.run([exe, "--version"], env=env, capture_output=True, text=True).stderr
libs = sorted({l.split("calling init: ")[1].strip() for l in log.splitlines() if "calling init: " in l})
gpu = [l for l in libs if any(k in l for k in ("libcudart", "libcublas", "libnccl", "muster-train-gpu"))]
print(f"== start: muster-train --version, {runs} runs")
print(f"  wall median {statistics.median(walls):.1f} ms (min {min(walls):.1f}, max {max(walls):.1f}); "
      f"max RSS {max(rss):.1f} MiB; {len(libs)} libraries loaded, {len(gpu)} of CUDA/NCCL")
PY
