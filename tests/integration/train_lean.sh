#!/bin/sh
# muster-train's lean start (docs/gpu.md, "The GPU module"): on a CPU device it
# maps no CUDA runtime, cuBLAS or NCCL, and no GPU module, neither for
# --version nor while training; --device gpu loads the module and, where it
# cannot, says what was not found and how to fix it.
set -eu
. tests/itest-lib.sh
T=$BUILD/muster-train
GPU_LIBS='libcudart|libcublas|libnccl|libcuda\.|muster-train-gpu'

# --version loads nothing of CUDA (LD_DEBUG lists every library ld.so opens).
loaded=$(LD_DEBUG=libs "$T" --version 2>&1 >/dev/null | grep -E 'calling init: ' || true)
[ -n "$loaded" ] || fail "LD_DEBUG=libs printed no library initialisation: cannot check"
bad=$(printf '%s\n' "$loaded" | grep -E "$GPU_LIBS" || true)
[ -z "$bad" ] || fail "muster-train --version loads GPU libraries: $bad"
echo "--version: $(printf '%s\n' "$loaded" | wc -l) libraries, none of CUDA or NCCL"

# A CPU training run: its mappings while it trains, then it completes.
for i in 1 2 3 4; do cat README.md docs/*.md; done > "$ITEST_DIR/text.txt"
"$T" --standalone --device cpu --model tiny --data "$ITEST_DIR/text.txt" --steps 1500 --batch 8 \
    --threads 2 --eval-every 0 --metrics "$ITEST_DIR/m.jsonl" > "$ITEST_DIR/train.log" 2>&1 &
pid=$!
ITEST_PIDS="$ITEST_PIDS $pid"
i=0
until [ -s "$ITEST_DIR/m.jsonl" ]; do
    i=$((i + 1)); [ "$i" -lt 300 ] || fail "no training step within 30 s"
    kill -0 "$pid" 2>/dev/null || fail "the CPU training run ended before its first step"
    sleep 0.1
done
maps=$(cat "/proc/$pid/maps" 2>/dev/null || true)
[ -n "$maps" ] || fail "cannot read /proc/$pid/maps"
bad=$(printf '%s\n' "$maps" | grep -E "$GPU_LIBS" | awk '{print $6}' | sort -u || true)
[ -z "$bad" ] || fail "a CPU training run maps: $bad"
wait "$pid" || fail "the CPU training run failed"
grep -q '"step": 1500, "loss"' "$ITEST_DIR/m.jsonl" || fail "the CPU training run did not reach step 1500"
echo "CPU training: 1500 steps (long enough to read its mappings while it runs), no GPU library mapped"

gpu() { # DIR/muster-train with --device gpu; its stderr in gpu.log
    "$1/muster-train" --standalone --device gpu --model tiny --data "$ITEST_DIR/text.txt" --steps 2 \
        --batch 2 > "$ITEST_DIR/gpu.log" 2>&1
}
if [ ! -e "$BUILD/muster-train-gpu.so" ]; then
    ! gpu "$BUILD" || fail "--device gpu succeeded in a build without CUDA"
    grep -q 'built without CUDA (nvcc not found at ' "$ITEST_DIR/gpu.log" || fail "--device gpu without CUDA: wrong message"
    echo "--device gpu in a build without CUDA: says so"
    exit 0
fi

# The module where it is built: it loads (every symbol it takes from
# muster-train resolves); without a GPU, the GPU path says there is none.
if gpu "$BUILD"; then
    echo "--device gpu: trained on a GPU"
else
    grep -q 'muster-train error: --device gpu: ' "$ITEST_DIR/gpu.log" || fail "--device gpu failed without saying why"
    ! grep -Eq 'undefined symbol|cannot load|not installed' "$ITEST_DIR/gpu.log" || fail "the GPU module did not load"
    echo "--device gpu without a GPU: $(sed 's/^muster-train error: //' "$ITEST_DIR/gpu.log")"
fi

# No module next to muster-train nor in ../lib/muster/.
mkdir -p "$ITEST_DIR/alone"
cp "$T" "$ITEST_DIR/alone/"
! gpu "$ITEST_DIR/alone" || fail "--device gpu succeeded without the module"
grep -q "muster-train-gpu.so is not installed: looked for $ITEST_DIR/alone/muster-train-gpu.so and" \
    "$ITEST_DIR/gpu.log" || fail "--device gpu without the module: wrong message"
grep -q 'make install' "$ITEST_DIR/gpu.log" || fail "--device gpu without the module: no fix given"
echo "--device gpu without the module: names it, where it looked, how to install it"

# A module whose CUDA library is missing: a stand-in that needs a library
# that was there when it was linked and is gone now.
mkdir -p "$ITEST_DIR/nolib" "$ITEST_DIR/gone"
cp "$T" "$ITEST_DIR/nolib/"
printf 'int muster_cudart_stand_in(void) { return 0; }\n' > "$ITEST_DIR/gone/cudart.c"
${CC:-cc} -shared -fPIC -o "$ITEST_DIR/gone/libcudart-stand-in.so" "$ITEST_DIR/gone/cudart.c"
printf 'int muster_cudart_stand_in(void);\nint f(void) { return muster_cudart_stand_in(); }\n' > "$ITEST_DIR/gone/mod.c"
${CC:-cc} -shared -fPIC -o "$ITEST_DIR/nolib/muster-train-gpu.so" "$ITEST_DIR/gone/mod.c" \
    -L"$ITEST_DIR/gone" -lcudart-stand-in
rm "$ITEST_DIR/gone/libcudart-stand-in.so"
! gpu "$ITEST_DIR/nolib" || fail "--device gpu succeeded with a library missing"
grep -q 'cannot load the GPU module: .*libcudart-stand-in.so: cannot open shared object file' "$ITEST_DIR/gpu.log" \
    || fail "--device gpu with a library missing: does not name it"
grep -q 'LD_LIBRARY_PATH' "$ITEST_DIR/gpu.log" || fail "--device gpu with a library missing: no fix given"
echo "--device gpu with a CUDA library missing: names it and the fix"

# A module of another build is refused, not called.
cat > "$ITEST_DIR/gone/old.c" <<'CODE'
#include <stddef.h>
static const struct { int abi; const char *version; size_t trainer_size; } old = {0, "0.0.1", 8};
const void *gpu_module_entry(void) { return &old; }
CODE
${CC:-cc} -shared -fPIC -o "$ITEST_DIR/nolib/muster-train-gpu.so" "$ITEST_DIR/gone/old.c"
! gpu "$ITEST_DIR/nolib" || fail "--device gpu succeeded with another build's module"
grep -q 'is from another build of muster (version 0.0.1' "$ITEST_DIR/gpu.log" \
    || fail "--device gpu with another build's module: wrong message"
echo "--device gpu with another build's module: refused"
