#!/bin/sh
# gpu_emulated.sh's gpu-check and zero-world under cuemu in the other order
# it can force: the communication stream eager, blocks and threads
# descending (tests/cuemu/README.md). A script of its own so that it runs
# beside the lazy order.
set -eu
. tests/itest-lib.sh
. tests/cuemu-lib.sh
cuemu_setup gpu_emulated_eager gpu-check zero-world

cuemu_check_order 2
echo "gpu_emulated_eager: passed"
