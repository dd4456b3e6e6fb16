#!/bin/sh
# An unmodified PyTorch DDP program (tests/torch/ddp_train.py, gloo, 2 nodes
# x 2 ranks on loopback) under muster's start-up hook:
#   (a) the hook's cost per optimizer step: AdamW.step() on a tiny model timed
#       in one process with and without torch's global step hook registered
#       by muster_rank (its fake agent a socketpair), rounds alternating,
#       median of ROUNDS rounds of STEPS steps;
#   (b) SIGSTOP -> the stopped rank named hung in /v1/events: RUNS trials
#       (default 10), each stopping a rank chosen in turn (3, 2, 1, 0, ...),
#       progress_timeout_ms PROGRESS_MS (default 3000): median and range of
#       the time from the stop to the event, and how many named the right rank;
#   (c) the same SIGSTOP under torchrun (--max_restarts 0): whether anything
#       happens within TORCHRUN_WAIT_S (default 60 s). torchrun has no hang
#       detection: the survivors wait in the collective until its timeout
#       (gloo's default, 30 min).
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-10}
PROGRESS_MS=${PROGRESS_MS:-3000}
TORCHRUN_WAIT_S=${TORCHRUN_WAIT_S:-60}
PY=${MUSTER_TORCH_PY:-.venv/bin/python}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
    echo "== hang: PyTorch 2.x not found at $PY (sh mk/deps.sh bench): skipped"
    exit 0
fi
. tests/itest-lib.sh
SCRIPT="$(pwd)/tests/torch/ddp_train.py"

echo "== hang: (a) the start-up hook's cost per optimizer step"
PYTHONPATH="$(pwd)/clients/python" ROUNDS=${ROUNDS:-9} STEPS=${STEPS:-20000} "$PY" - <<'PY'
import os, socket, statistics, time
import torch
import muster_rank.hook
a, b = socket.socketpair()
os.environ.update(MUSTER_CTL_FD=str(b.fileno()), MUSTER_GENERATION="1", RANK="0")
def drain():
    while True:
        if not a.recv(1 << 16):
            return
import threading; threading.Thread(target=drain, daemon=True).start()
m = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(m.parameters())
m(torch.randn(4, 16)).sum().backward()
from torch.optim.optimizer import register_optimizer_step_post_hook
steps, rounds = int(os.environ["STEPS"]), int(os.environ["ROUNDS"])
def timed():
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t) / steps * 1e6
plain, hooked, handle = [], [], None
for i in range(2 * rounds):
    if (i % 2 == 1) != (handle is not None):
        if handle is None:
            handle = register_optimizer_step_post_hook(muster_rank.hook.on_optimizer_step)
        else:
            handle.remove(); handle = None
    (hooked if handle is not None else plain).append(timed())
d = [h - p for h, p in zip(hooked, plain)]
print("   AdamW.step() %.1f us plain, %.1f us hooked (medians of %d x %d steps); the hook adds %.1f us "
      "(range %.1f..%.1f)" % (statistics.median(plain), statistics.median(hooked), rounds, steps,
                              statistics.median(d), min(d), max(d)))
PY

echo "== hang: (b) SIGSTOP -> named hung under muster (progress_timeout_ms $PROGRESS_MS), $RUNS trials"
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "bench-hang", "nodes": 2, "max_restarts": 1000, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 300, "progress_timeout_ms": $PROGRESS_MS,
 "restart_backoff_ms": 0,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "1000000", "--step-sleep", "0.05", "--ckpt-dir", "$ITEST_DIR/ckpt",
              "--ckpt-every", "100000000"]}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token"
start_agent b 2 --token-file "$ITEST_DIR/token"
hung_event() {
    curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | python3 -c '
import json, sys
ev = [e for e in json.load(sys.stdin)["events"] if e.get("kind") == "rank_hung" and e.get("generation") == int(sys.argv[1])]
print(ev[-1]["message"] if ev else "")' "$1"
}
: > "$ITEST_DIR/lat"
right=0
for t in $(seq 1 "$RUNS"); do # (wait_for uses i)
    gen=$t
    victim=$(( (3 + 3 * (t - 1)) % 4 ))
    wait_for 120 "d['generation'] == $gen and d['state'] == 'running' and running == 4 and all((r['step'] or 0) > 3 for r in d['ranks'])" \
        || fail "trial $t: generation $gen not running with steps"
    pid=$(rank_pid "$SCRIPT.*$ITEST_DIR/ckpt" "$victim")
    t0=$(now_ms); kill -STOP "$pid"
    j=0; msg=""
    while [ $j -lt 600 ] && [ -z "$msg" ]; do msg=$(hung_event "$gen"); [ -n "$msg" ] || sleep 0.02; j=$((j + 1)); done
    t1=$(now_ms); kill -CONT "$pid" 2>/dev/null || true
    [ -n "$msg" ] || fail "trial $t: rank $victim not found hung"
    case "$msg" in "rank $victim on node "*) right=$((right + 1)) ;; esac
    echo "$((t1 - t0))" >> "$ITEST_DIR/lat"
    echo "   trial $t: rank $victim stopped -> $((t1 - t0)) ms: $(echo "$msg" | cut -c1-110)"
done
python3 - "$ITEST_DIR/lat" "$right" "$RUNS" <<'PY'
import statistics, sys
v = [int(x) for x in open(sys.argv[1])]
print("   SIGSTOP -> named: median %.2f s (range %.2f..%.2f) over %d, right rank named %s/%s" % (
    statistics.median(v) / 1e3, min(v) / 1e3, max(v) / 1e3, len(v), sys.argv[2], sys.argv[3]))
PY
for p in $ITEST_PIDS; do kill "$p" 2>/dev/null || true; done
pkill -9 -f "$SCRIPT.*$ITEST_DIR" 2>/dev/null || true

echo "== hang: (c) the same SIGSTOP under torchrun"
port=$(free_port)
for n in 0 1; do
    "$PY" -m torch.distributed.run --nnodes 2 --node-rank $n --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port "$port" --max-restarts 0 "$SCRIPT" --steps 1000000 --step-sleep 0.05 \
        --ckpt-dir "$ITEST_DIR/ckpt-tr" --ckpt-every 100000000 > "$ITEST_DIR/torchrun-$n.log" 2>&1 &
    TORCHRUNS="${TORCHRUNS:-} $!"
    ITEST_PIDS="$ITEST_PIDS $!"
done
j=0
until grep -q "^step 5 " "$ITEST_DIR/torchrun-0.log" 2>/dev/null || [ $j -ge 1200 ]; do sleep 0.1; j=$((j + 1)); done
grep -q "^step 5 " "$ITEST_DIR/torchrun-0.log" || fail "(c) torchrun did not reach step 5 within 120 s: $(tail -n 5 "$ITEST_DIR/torchrun-0.log")"
victim=$(pgrep -f "$SCRIPT.*ckpt-tr" | while read -r p; do tr '\0' '\n' < "/proc/$p/environ" | grep -qx RANK=3 && echo "$p"; done | head -1)
[ -n "$victim" ] || fail "(c) no rank 3 under torchrun"
before=$(wc -l < "$ITEST_DIR/torchrun-0.log")
kill -STOP "$victim"
sleep "$TORCHRUN_WAIT_S"
after=$(wc -l < "$ITEST_DIR/torchrun-0.log")
alive=0
for p in $TORCHRUNS; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
kill -CONT "$victim" 2>/dev/null || true
# what torchrun said about it, counted, not assumed; the timeout as torch states it
named=$(cat "$ITEST_DIR"/torchrun-*.log | grep -ciE "hung|stopped|timed? ?out|watchdog|rank 3" || true)
pg_timeout=$("$PY" -c 'from torch.distributed.constants import default_pg_timeout as t; print("%d s" % t.total_seconds())' \
    2>/dev/null || echo "unknown")
echo "   torchrun: rank 3 stopped for ${TORCHRUN_WAIT_S} s: $((after - before)) new log lines on node 0, $alive of 2 torchrun" \
     "agents still waiting, $named log lines naming a hang, a timeout or rank 3 (its figure is the collective timeout:" \
     "torch's default_pg_timeout here is $pg_timeout)"
pkill -9 -f "$SCRIPT.*$ITEST_DIR" 2>/dev/null || true
