#!/bin/sh
# Cost of buddy replicas (muster_rank.ShardedElastic) per training step: the
# FSDP2 program tests/torch/fsdp_train.py, 4 CPU ranks (gloo) under torchrun
# on one machine, replicas off (K=0), every step (K=1) and every 10 steps
# (K=10), the order rotated from run to run (0 1 10, 1 10 0, 10 0 1, ...)
# so that no K always runs first or last. Per run, the mean step time of
# rank 0 over a window of whole replica periods: from the end of step A (the
# first multiple of 10 from WARMUP on, a round's step) to the end of step
# A + 10n, the last such step (wall clock, from the script's --timing-file:
# a mean, not a median, so that the one step in K that replicates counts;
# the window holds each K's rounds in its steps exactly: the round after
# step A is in it, the one after its last step is not, and ShardedElastic
# ships none after the job's last step). With one node, each rank's buddy
# is the next rank (docs/pytorch.md): the same traffic, one snapshot out
# and one in per rank and round, as across nodes.
# Knobs: STEPS (default 40), WARMUP (5), WIDTH (512), DEPTH (4), RUNS (3:
# the figures are the median and the mean over runs of each run's mean,
# with their range).
set -eu
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-5}
WIDTH=${WIDTH:-512}
DEPTH=${DEPTH:-4}
RUNS=${RUNS:-3}
PY=${BENCH_PYTHON:-${MUSTER_TORCH_PY:-$PWD/.venv/bin/python}}

if ! "$PY" -c 'import torch.distributed.fsdp' 2> /dev/null; then
    echo "== fsdp_buddy: $PY cannot import torch.distributed.fsdp (run: sh mk/deps.sh venv): skipped"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/muster-bench-fsdp.XXXXXX")
trap 'rm -rf "$T"' EXIT

echo "== fsdp_buddy: FSDP2 MLP width $WIDTH depth $DEPTH, 4 CPU ranks, $STEPS steps, mean step over whole periods from $WARMUP on, $RUNS run(s)"
run=1
while [ "$run" -le "$RUNS" ]; do
    case $((run % 3)) in 1) order="0 1 10" ;; 2) order="1 10 0" ;; *) order="10 0 1" ;; esac
    for k in $order; do
        port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        PYTHONPATH="$PWD/clients/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
            "$PY" -m torch.distributed.run --nproc-per-node 4 --master-addr 127.0.0.1 --master-port "$port" \
            tests/torch/fsdp_train.py --steps "$STEPS" --width "$WIDTH" --depth "$DEPTH" \
            --replica-every "$k" --timing-file "$T/k$k-$run" > "$T/log-k$k-$run" 2>&1 \
            || { echo "fsdp_buddy: the run with K=$k failed:"; tail -20 "$T/log-k$k-$run"; exit 1; }
    done
    run=$((run + 1))
done
"$PY" - "$T" "$RUNS" "$WARMUP" <<'PY'
import statistics, sys
d, runs, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def mean_step(path):
    t = [float(x) for x in open(path).read().split()]  # t[i]: the end of step i + 1
    a = -(-warmup // 10) * 10
    b = a + (len(t) - a) // 10 * 10
    if b <= a:
        sys.exit("fsdp_buddy: %d steps leave no whole window of 10 steps after step %d: raise STEPS" % (len(t), a))
    return (t[b - 1] - t[a - 1]) / (b - a), a, b
base = None
for k in (0, 1, 10):
    per = [mean_step("%s/k%d-%d" % (d, k, r)) for r in range(1, runs + 1)]
    v = [m for m, _, _ in per]
    med, mean = statistics.median(v), statistics.mean(v)
    base = base or (med, mean)
    print("K=%-3s step (steps %d-%d) median %.2f ms, mean %.2f ms (range %.2f-%.2f) over %d runs%s"
          % (k if k else "off", per[0][1] + 1, per[0][2], med * 1000, mean * 1000, min(v) * 1000, max(v) * 1000, runs,
             "" if k == 0 else "  overhead %+.1f %% (median), %+.1f %% (mean)"
             % ((med / base[0] - 1) * 100, (mean / base[1] - 1) * 100)))
PY
