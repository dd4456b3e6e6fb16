#!/bin/sh
# ZeRO-3 vs plain all-reduce data parallel on the CPU: the "small" preset,
# global batch 16 x 128 tokens, N = 2 and 4 ranks as threads of one process
# over the TCP ring on loopback, nproc/N OpenMP threads per rank. Median
# ms/step of STEPS timed steps (after WARMUP), the ratio zero3/dp, each
# rank's model-state bytes (weights, moments, gradients) and the share of
# the ZeRO-3 step the training thread spent waiting for collectives.
# Plain DP keeps everything on every rank and all-reduces the whole gradient
# once after the backward; ZeRO-3 gathers each unit twice per micro-step and
# reduce-scatters its gradient, overlapped with compute on a comm thread.
set -eu
BUILD=${BUILD:-build}
STEPS=${BENCH_STEPS:-10}
WARMUP=${BENCH_WARMUP:-2}
NAME=zero
. tests/bench/train-env.sh
echo "== zero: ZeRO-3 vs all-reduce data parallel, model small, batch 16 x 128, $(nproc) cores, $STEPS steps (+$WARMUP warm-up)"
"$BUILD/tests/zero-bench" --model small --data "$DATA" --ranks "${ZERO_RANKS:-2,4}" \
    --batch 16 --steps "$STEPS" --warmup "$WARMUP"
