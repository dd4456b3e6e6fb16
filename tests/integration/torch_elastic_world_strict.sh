#!/bin/sh
# torch_elastic_world's scenarios (a node lost: shrink; back: grow at a step
# boundary; lost and started again; a rank hung in its own code) under the
# strict NCCL-like backend of tests/torch/strict_nccl.py (STRICT_NCCL=1,
# which tests/torch/ddp_train.py takes): the survivors' collectives never
# fail there, so every heal in place rests on the park watch aborting the
# groups; no group may be destroyed after its abort (the backend logs such
# a call to STRICT_NCCL_LOG, and blocks).
set -eu
. tests/itest-lib.sh

need_torch torch_elastic_world_strict torch.distributed
STRICT_NCCL=1 STRICT_NCCL_LOG="$ITEST_DIR/strict.log" sh tests/integration/torch_elastic_world.sh \
    || fail "torch_elastic_world failed under the strict NCCL-like backend"
[ ! -s "$ITEST_DIR/strict.log" ] || fail "a process group was destroyed after an abort: $(cat "$ITEST_DIR/strict.log")"
echo "torch_elastic_world_strict: ok"
