#!/bin/sh
# The GPU path's own source (worker/train/gpu/) run under cuemu, CUDA emulated on
# the CPU (tests/cuemu/README.md), so that CI checks it without a GPU:
#   - gpu-check (the check-gpu program): tiny forward/backward against the
#     CPU reference, NCCL world 1, abort, training that tracks the CPU,
#     checkpoints between the paths; with every stream lazy (the other order
#     cuemu can force, the communication stream eager, is
#     gpu_emulated_eager.sh's);
#   - zero-world: ZeRO-3 over 2 and 3 ranks (threads) against world 1;
#   - gpu-faults: the communicator under cuemu's strict NCCL (a peer gone
#     inside a collective, a wait deadline, a free with a peer gone, a
#     cancelled formation, 1000 aborts racing collectives), the race again
#     under ASan+UBSan and under TSan (leaks off: cuemu keeps aborted
#     handles on purpose, to report a later use).
# muster-train --device gpu, its jobs and healing: gpu_emulated_train.sh.
set -eu
. tests/itest-lib.sh
. tests/cuemu-lib.sh
cuemu_setup gpu_emulated gpu-check zero-world gpu-faults gpu-faults-asan gpu-faults-tsan

cuemu_check_order ""

# A wait cuemu sees can never end is reported after 20 s: far more than any
# of these needs (each bounds its own waits at 10 s).
for v in "" -asan -tsan; do
    args=1000; [ -n "$v" ] && args="1000 race"
    CUEMU_NCCL_TIMEOUT_S=20 ASAN_OPTIONS=detect_leaks=0 TSAN_OPTIONS=halt_on_error=1 timeout 300 \
        "$E/gpu-faults$v" $args > "$ITEST_DIR/faults$v.log" 2>&1 \
        || fail "gpu-faults$v: $(grep -E 'FAIL|cuemu:|Sanitizer|WARNING' "$ITEST_DIR/faults$v.log" | head -5)"
    grep -q '^gpu-faults: passed' "$ITEST_DIR/faults$v.log" || fail "gpu-faults$v did not pass"
done
grep -E 'racing' "$ITEST_DIR/faults-tsan.log" | sed 's/^ *ok */  tsan: /'

echo "gpu_emulated: passed"
