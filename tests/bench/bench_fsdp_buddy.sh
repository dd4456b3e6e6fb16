#!/bin/sh
# Cost of buddy replicas (muster_rank.ShardedElastic) per training step: the
# FSDP2 program tests/torch/fsdp_train.py, 4 CPU ranks (gloo) under torchrun
# on one machine, replicas off (K=0), every step (K=1) and every 10 steps
# (K=10), one run after the other. Per run, the mean step time of rank 0
# over the steps after the first WARMUP (wall clock from the end of step
# WARMUP to the end of the last, from the script's --timing-file: a mean,
# not a median, so that the one step in K that replicates counts). With one node, each
# rank's buddy is the next rank (docs/pytorch.md): the same traffic, one
# snapshot out and one in per rank and round, as across nodes.
# Knobs: STEPS (default 40), WARMUP (5), WIDTH (512), DEPTH (4), RUNS (3:
# the figure is the median over runs of each run's mean).
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

echo "== fsdp_buddy: FSDP2 MLP width $WIDTH depth $DEPTH, 4 CPU ranks, $STEPS steps, mean step after $WARMUP, $RUNS run(s)"
run=1
while [ "$run" -le "$RUNS" ]; do
    for k in 0 1 10; do
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
    t = [float(x) for x in open(path).read().split()]
    return (t[-1] - t[warmup]) / (len(t) - 1 - warmup)
base = None
for k in (0, 1, 10):
    m = statistics.median(mean_step("%s/k%d-%d" % (d, k, r)) for r in range(1, runs + 1))
    base = base or m
    print("K=%-3s step %.2f ms%s" % (k if k else "off", m * 1000,
          "" if k == 0 else "  overhead %+.1f %%" % ((m / base - 1) * 100)))
PY
