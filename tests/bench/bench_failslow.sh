#!/bin/sh
# Fail-slow without code changes (issue 36; clients/python/muster_rank/split.py,
# daemon/failslow.h):
#   (a) the time split sampler's cost per training step: a small MLP's
#       forward, backward and AdamW step in one process, timed in rounds of
#       STEPS steps with the sampler thread off and on (at 200 looks a second,
#       the default, and at 1000, the most), rounds alternating: the median
#       step time (wall and CPU) of ROUNDS rounds each, with its range, side
#       by side, and one look's own cost, timed in place by the sampler;
#   (b) detection time against the slowdown: an unmodified DDP program
#       (tests/torch/ddp_train.py, gloo, 2 agents x 2 ranks on loopback) whose
#       rank 3 sleeps 1.2x, 1.5x and 2x as long in its own code from step 30
#       on: the steps from step 30 to the rank_slow event (and the seconds
#       they take at the job's step time), and whether any other rank was
#       named (RUNS runs per slowdown, default 1).
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-1}
PY=${MUSTER_TORCH_PY:-.venv/bin/python}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
    echo "== failslow: PyTorch 2.x not found at $PY (sh mk/deps.sh bench): skipped"
    exit 0
fi
. tests/itest-lib.sh
SCRIPT="$(pwd)/tests/torch/ddp_train.py"

echo "== failslow: (a) the sampler's cost per training step"
PYTHONPATH="$(pwd)/clients/python" ROUNDS=${ROUNDS:-7} STEPS=${STEPS:-400} "$PY" - <<'PY'
import os, statistics, sys, threading, time
import torch
from muster_rank import split
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.AdamW(model.parameters())
x, y = torch.randn(64, 256), torch.randn(64, 1)
steps, rounds = int(os.environ["STEPS"]), int(os.environ["ROUNDS"])
main = threading.get_ident()
done = [0]

def step():
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    done[0] += 1

looks = {}  # hz -> [seconds inside look(), looks]: one look's cost in place

def timed(hz):
    stop = threading.Event()
    if hz:
        s = split.Sampler(main, lambda: done[0], lambda w: None, hz, 1.0)
        spent = looks.setdefault(hz, [0.0, 0])
        def run():
            while not stop.wait(s.period):
                t = time.perf_counter()
                s.look()
                spent[0] += time.perf_counter() - t
                spent[1] += 1
        t = threading.Thread(target=run, daemon=True)
        t.start()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    ms, cpu = (time.perf_counter() - t0) / steps * 1e3, (time.process_time() - c0) / steps * 1e3
    stop.set()
    return ms, cpu

for _ in range(50):
    step()
got = {0: [], 200: [], 1000: []}
for _ in range(rounds):
    for hz in got:
        got[hz].append(timed(hz))
base = statistics.median(w for w, _ in got[0])
cbase = statistics.median(c for _, c in got[0])
print("  (%d rounds of %d steps; load average %s)" % (rounds, steps, " ".join(open("/proc/loadavg").read().split()[:3])))
for hz, v in got.items():
    w, c = [x for x, _ in v], [x for _, x in v]
    print("  sampler %-8s wall %.3f ms per step (range %.3f-%.3f, %.3fx of off), "
          "CPU %.3f ms per step (range %.3f-%.3f, %.3fx)" % (
              "off" if not hz else "%d/s" % hz, statistics.median(w), min(w), max(w), statistics.median(w) / base,
              statistics.median(c), min(c), max(c), statistics.median(c) / cbase))
for hz, (spent, n) in sorted(looks.items()):
    print("  one look in place at %d/s (sys._current_frames and classifying the main thread's stack): "
          "%.1f us on average over %d looks" % (hz, spent / max(n, 1) * 1e6, n))
PY

echo "== failslow: (b) detection time against the slowdown (rank 3 slow from step 30; $RUNS run(s) each)"
make_token "$ITEST_DIR/token"
for factor in 1.2 1.5 2.0; do
    frac=$(echo "$factor" | awk '{ printf "%.2f", $1 - 1 }')
    run=1
    while [ "$run" -le "$RUNS" ]; do
        cat > "$ITEST_DIR/job.json" <<JSON
{"name": "bench-failslow", "nodes": 2, "max_restarts": 0, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 4000, "lease_ms": 8000, "stop_grace_ms": 500,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "1000", "--width", "16", "--batch", "8", "--step-sleep", "0.05",
              "--slow-rank", "3", "--slow-frac", "$frac", "--slow-from", "30",
              "--ckpt-dir", "$ITEST_DIR/ckpt", "--ckpt-every", "1000000"]}
JSON
        rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
        start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
        start_agent a 2 --token-file "$ITEST_DIR/token"
        start_agent b 2 --token-file "$ITEST_DIR/token"
        python3 - "$HTTP" "$factor" <<'PY' || true
import json, sys, time, urllib.request
base, factor = "http://127.0.0.1:%s" % sys.argv[1], sys.argv[2]
get = lambda p: json.load(urllib.request.urlopen(base + p, timeout=2))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        ranks = get("/v1/ranks")["ranks"]
        slow = [e for e in get("/v1/events")["events"] if e["kind"] == "rank_slow"]
    except Exception:
        time.sleep(0.1)
        continue
    steps = [r["step"] for r in ranks if r["step"] is not None]
    step = min(steps) if len(steps) == 4 else 0
    if slow and step < 30:
        print("  %sx: named at step %d, before rank 3 was slow (a false positive): %s" % (factor, step,
                                                                                    slow[0]["message"]))
        sys.exit(0)
    if slow:
        wrong = [e for e in slow if e["rank"] != 3]
        fast = sorted(r["step_s"] for r in ranks if r["rank"] != 3 and r["step_s"])
        step_s = fast[len(fast) // 2] if fast else 0
        print("  %sx: named after %d steps (about %.1f s at %.3f s per step)%s: %s" % (
            factor, step - 30, (step - 30) * step_s, step_s,
            ", and %d other rank(s) named" % len(wrong) if wrong else ", no other rank named", slow[0]["message"]))
        sys.exit(0)
    time.sleep(0.1)
print("  %sx: not named within 120 s" % factor)
PY
        stop_all
        run=$((run + 1))
    done
done
