#!/bin/sh
# make check-gpu: the GPU path against the CPU reference (tests/gpu-check.c),
# then muster-train --device gpu end to end. Without a GPU: "no GPU: skipped"
# (exit 0, or 1 with REQUIRE_GPU=1).
set -u
BUILD=${BUILD:-build}
data=$(mktemp)
log=$(mktemp)
trap 'rm -f "$data" "$log"' EXIT
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
echo "check-gpu: passed"
