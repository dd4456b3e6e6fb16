#!/bin/sh
# Healing in place, measured: 2 agents x 2 muster-train ranks (small model,
# no checkpoint directory) under musterd on loopback. RUNS times (default
# 10) in one job, once it has made 5 steps since the last heal, rank 3 is
# SIGKILLed; rank 0 logs the phases of the heal (docs/training.md) with the
# wall clock, read against the moment of the kill:
#   detect       kill -> rank 0 saw its generation break
#   generation   -> the next generation's ASSIGN reached it
#   ring         -> the training ring formed (the replacement started, the
#                   unique id went round)
#   restore      -> replica ring formed, plan agreed, shard shipped
#   first step   -> the first step after the heal completed
# plus the steps redone (completed before the kill, done again after) and
# the replicas' cost: median step time with replicate_every 1 against 0, in
# jobs run back to back. With PyTorch installed, torchrun's recovery of a
# SIGKILLed rank (tests/bench/bench_torch_launch.sh, TORCH_RUNS runs,
# default 5) is measured in the same run and set against it.
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-10}
TORCH_RUNS=${TORCH_RUNS:-5}
DATA=${MUSTER_DATA:-../shared/data/tinyshakespeare.txt}
[ -r "$DATA" ] || { echo "== heal: no training text at $DATA (set MUSTER_DATA): skipped"; exit 0; }
DATA=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")
. tests/itest-lib.sh
make_token "$ITEST_DIR/token"

job() { # NAME REPLICATE_EVERY STEPS
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 1000, "model": "small", "data": "$DATA",
 "steps": $3, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000, "restart_backoff_ms": 0,
 "replicate_every": $2}
JSON
}

start() { # NAME: musterd + agents a, b
    rm -rf "$ITEST_DIR/state"
    rm -f "$ITEST_DIR"/agent-*.log
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token" --exit-on-end
    for n in a b; do
        start_agent "$n" 2 --token-file "$ITEST_DIR/token" \
            --rank-cmd "$BUILD/muster-train --threads 1 --metrics $ITEST_DIR/$1.metrics"
        eval "AGENT_$n=\$AGENT_PID"
    done
}

stop_all() {
    kill "$DAEMON_PID" "$AGENT_a" "$AGENT_b" 2> /dev/null || true
    sleep 0.5
    pkill -9 -f "$ITEST_DIR" 2> /dev/null || true
}

rank_pid() { # RANK: the muster-train process of that global rank
    for p in $(pgrep -f "muster-train.*$ITEST_DIR" || true); do
        tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "RANK=$1" && { echo "$p"; return 0; }
    done
    return 1
}

last_step() { grep '"loss"' "$1" 2> /dev/null | tail -n 1 | sed 's/.*"step": \([0-9]*\),.*/\1/'; }
wall() { python3 -c 'import time; print("%.6f" % time.time())'; }

# ---- kills
job heal 1 100000
start heal
wait_for 120 'd["state"] == "running" and (d["step"] or 0) >= 5' || fail "heal job not running in 120 s"
: > "$ITEST_DIR/heals"
i=0
while [ $i -lt "$RUNS" ]; do
    base=$(last_step "$ITEST_DIR/heal.metrics"); base=${base:-0}
    n=0
    while [ "$(last_step "$ITEST_DIR/heal.metrics")" -lt $((base + 5)) ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n + 1)); done
    victim=$(rank_pid 3) || fail "no rank 3 process"
    healed=$(grep -c 'healed: ' "$ITEST_DIR/agent-a.log" || true)
    before=$(last_step "$ITEST_DIR/heal.metrics")
    t_kill=$(wall)
    kill -9 "$victim"
    n=0
    while [ "$(grep -c 'healed: ' "$ITEST_DIR/agent-a.log" || true)" -le "$healed" ] && [ $n -lt 1200 ]; do
        sleep 0.02; n=$((n + 1))
    done
    line=$(grep 'healed: ' "$ITEST_DIR/agent-a.log" | tail -n 1)
    [ -n "$line" ] && [ $n -lt 1200 ] || fail "kill $((i + 1)): no heal within 24 s"
    from=$(grep 'training from step' "$ITEST_DIR/agent-a.log" | tail -n 1 | sed 's/.*training from step \([0-9]*\).*/\1/')
    echo "$t_kill $before $from $line" >> "$ITEST_DIR/heals"
    i=$((i + 1))
done
stop_all

# ---- replica cost: step times with and without replicas, back to back
for every in 1 0; do
    job "cost$every" "$every" 60
    start "cost$every"
    n=0
    while pid_alive "$DAEMON_PID" && [ $n -lt 3600 ]; do sleep 0.05; n=$((n + 1)); done
    stop_all
done

python3 - "$ITEST_DIR" "$RUNS" <<'PY'
import json, re, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
rows = []
for line in open(f"{d}/heals"):
    t_kill, before, restored, rest = line.split(" ", 3)
    m = re.search(r"next generation (\d+) ms, training ring (\d+) ms, state restored (\d+) ms, first step (\d+) ms\); "
                  r"broke at ([0-9.]+), step at ([0-9.]+)", rest)
    gen, ring, restore, first, broke, done = m.groups()
    t_kill = float(t_kill)
    rows.append({"detect": (float(broke) - t_kill) * 1e3, "generation": float(gen), "ring": float(ring),
                 "restore": float(restore), "first step": float(first), "total": (float(done) - t_kill) * 1e3,
                 "redone": max(0, int(before) - int(restored))})
def fig(k):
    v = [r[k] for r in rows]
    return statistics.median(v), min(v), max(v)
print(f"== heal: SIGKILL of rank 3 -> next completed step, 2 nodes x 2 ranks (small, CPU, loopback), {len(rows)} kills in one job")
for k in ["detect", "generation", "ring", "restore", "first step", "total"]:
    med, lo, hi = fig(k)
    print(f"  {k:<12} median {med:7.1f} ms  ({lo:.1f}-{hi:.1f})")
med, lo, hi = fig("redone")
print(f"  steps redone median {med:.0f} ({lo}-{hi}); completed steps lost: 0 (every heal resumed in memory)")
ms = {}
for every in ("1", "0"):
    v = [json.loads(l)["ms"] for l in open(f"{d}/cost{every}.metrics") if '"loss"' in l][10:]
    ms[every] = (statistics.median(v), len(v))
print(f"  step time, replicate_every 1: median {ms['1'][0]:.1f} ms; replicate_every 0: {ms['0'][0]:.1f} ms "
      f"(steps 11-60 of rank 0): replica overhead {100 * (ms['1'][0] / ms['0'][0] - 1):+.1f} %")
open(f"{d}/total_ms", "w").write("%.1f" % fig("total")[0])
PY
TOTAL=$(cat "$ITEST_DIR/total_ms")

PY=${BENCH_PYTHON:-${MUSTER_TORCH_PY:-$PWD/.venv/bin/python}}
if "$PY" -c 'import torch' 2> /dev/null; then
    RUNS=$TORCH_RUNS sh tests/bench/bench_torch_launch.sh > "$ITEST_DIR/torch.out" 2>&1 || true
    tr_line=$(grep '^(b) kill -> first step after recovery' "$ITEST_DIR/torch.out" | head -n 1 || true)
    [ -n "$tr_line" ] || { echo "  torchrun: bench_torch_launch.sh gave no recovery figure:"; tail -n 5 "$ITEST_DIR/torch.out"; }
    echo "  torchrun in the same run ($TORCH_RUNS runs of tests/bench/bench_torch_launch.sh, its DDP script):"
    echo "    $tr_line"
    echo "$tr_line" | sed 's/^.\{46\} *//' | awk -v m="$TOTAL" 'NF { t = $1 + 0; m2 = $3 + 0;
        printf "  kill -> next step: torchrun %.2f s, muster with a PyTorch rank (whole restart) %.2f s, muster-train healing in place %.3f s: %.0fx faster than torchrun\n", t, m2, m / 1000, t * 1000 / m }'
else
    echo "  torchrun: $PY cannot import torch (sh mk/deps.sh venv): not measured"
fi
