#!/bin/sh
# make check-gpu: the GPU path against the CPU reference (tests/gpu-check.c),
# then muster-train --device gpu end to end. Without a GPU: "no GPU: skipped"
# (exit 0, or 1 with REQUIRE_GPU=1).
set -u
BUILD=${BUILD:-build}
data=$(mktemp)
log=$(mktemp)
ck=$(mktemp -d)
trap 'rm -rf "$data" "$log" "$ck"' EXIT
# Text to train `small` on: the project's own documentation, a few times over.
for i in 1 2 3 4; do cat README.md docs/*.md; done > "$data"
"$BUILD/tests/gpu-check" "$data" > "$log"
rc=$?
cat "$log"
[ $rc -eq 0 ] || exit $rc
grep -q "skipped" "$log" && exit 0
echo "muster-train --device gpu, small, 20 steps with validation:"
"$BUILD/muster-train" --standalone --device gpu --model small --data "$data" --steps 20 \
    --batch 16 --micro-batch 8 --seq-len 128 --eval-every 10 --log-level warn || exit 1
echo "muster-train: checkpoints on the GPU, resumed on the GPU, then on the CPU and back, --sample:"
train() {
    "$BUILD/muster-train" --standalone --model small --data "$data" --steps 30 --batch 16 \
        --micro-batch 8 --seq-len 128 --log-level warn "$@"
}
latest_is() {
    [ "$(cat "$1/latest" 2>/dev/null)" = "$2" ] || { echo "$1/latest: expected $2"; exit 1; }
}
train --device gpu --stop-after 10 --checkpoint-dir "$ck/gpu" --checkpoint-every 5 || exit 1
latest_is "$ck/gpu" step-00000010
train --device gpu --stop-after 10 --checkpoint-dir "$ck/gpu" --resume "$ck/gpu" || exit 1
latest_is "$ck/gpu" step-00000020
train --device cpu --threads 2 --stop-after 5 --checkpoint-dir "$ck/cpu" --resume "$ck/gpu" || exit 1
latest_is "$ck/cpu" step-00000025
train --device gpu --resume "$ck/cpu" --sample 64 > "$log" || exit 1
grep -q "^sample at step 30:" "$log" || { cat "$log"; echo "no sample at step 30"; exit 1; }
# What healing an NCCL program in place needs of the device (abort with work
# queued, a new group in the same process, a CUDA FSDP2 snapshot), with the
# build's PyTorch environment where there is one.
PY=${MUSTER_TORCH_PY:-.venv/bin/python}
if [ -x "$PY" ]; then
    echo "NCCL groups healed in place (tests/torch/nccl_gpu_check.py):"
    PYTHONPATH=clients/python "$PY" tests/torch/nccl_gpu_check.py || exit 1
else
    echo "NCCL groups healed in place: skipped (no $PY; run: sh mk/deps.sh venv)"
fi
# torchrun's device contract under the agent with real set_device(LOCAL_RANK),
# NCCL, RAS and the flight recorder (tests/gpu-contract.sh).
if [ -x "$PY" ]; then
    BUILD=$BUILD PY=$PY sh tests/gpu-contract.sh || exit 1
else
    echo "gpu contract: skipped (no $PY)"
fi
echo "check-gpu: passed"
