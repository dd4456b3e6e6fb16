#!/bin/sh
# muster-train vs PyTorch on the CPU: the "small" preset (L=4, NH=4, C=128,
# T=128, V=256), batch 16 x 128 tokens, AdamW, same thread count (default:
# all cores), same text. Each side runs WARMUP untimed steps, then STEPS
# timed ones; the figure is the median ms/step and the tokens/s it implies.
# PyTorch is Debian's python3-torch (`sh mk/deps.sh bench` installs it).
# OpenBLAS 0.3.21 mistakes recent Xeons for a generic SSE3 CPU; muster-train
# corrects that by itself, and this script sets the same OPENBLAS_CORETYPE
# for PyTorch's BLAS so that both sides get the same kernels.
set -eu
BUILD=${BUILD:-build}
THREADS=${BENCH_THREADS:-$(nproc)}
STEPS=${BENCH_STEPS:-30}
WARMUP=${BENCH_WARMUP:-5}
NAME=train
. tests/bench/train-env.sh

echo "== train: muster-train vs PyTorch, model small, batch 16 x 128, $THREADS threads, $STEPS steps (+$WARMUP warm-up), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto}"
"$BUILD/muster-train" --standalone --model small --data "$DATA" --steps $((STEPS + WARMUP)) \
    --batch 16 --lr 1e-3 --warmup 10 --eval-every 0 --threads "$THREADS" --log-level warn \
    --metrics "$T/c.jsonl" > /dev/null
c_ms=$(sed -n 's/.*"ms": \([0-9.]*\)}.*/\1/p' "$T/c.jsonl" | tail -n "$STEPS" | sort -n |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
c_tps=$(awk -v ms="$c_ms" 'BEGIN { printf "%.0f", 16 * 128 / (ms / 1000) }')
echo "muster-train ms_per_step $c_ms tokens_per_s $c_tps"

if ! /usr/bin/python3 -c 'import torch' 2> /dev/null; then
    echo "PyTorch not installed (sh mk/deps.sh bench): no comparison"
    exit 0
fi
OMP_NUM_THREADS=$THREADS /usr/bin/python3 tests/bench/bench_train_torch.py --data "$DATA" \
    --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" | tee "$T/torch.txt"
t_ms=$(sed -n 's/.*ms_per_step \([0-9.]*\) .*/\1/p' "$T/torch.txt")
awk -v c="$c_ms" -v t="$t_ms" 'BEGIN { printf "ratio: muster-train is %.2fx PyTorch'"'"'s speed (tokens/s C / tokens/s PyTorch)\n", t / c }'
