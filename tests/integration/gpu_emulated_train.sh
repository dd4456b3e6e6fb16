#!/bin/sh
# The GPU path's own source run under cuemu (tests/cuemu/README.md), as
# muster-train --device gpu (gpu_emulated.sh runs the check programs):
#   - checkpoints on the GPU path, resumed on the GPU path, on the CPU and
#     back, --sample; a rank of a job under the local launcher on an
#     emulated gpu:0 device;
#   - two GPU ranks healing in place: one SIGKILLed with no checkpoint, the
#     other keeps its process, the replacement's shard comes from its memory,
#     final loss as the uninterrupted run's;
#   - the out-of-memory diagnosis on a small emulated device.
set -eu
. tests/itest-lib.sh
. tests/cuemu-lib.sh
cuemu_setup gpu_emulated_train muster-train

train() {
    timeout 120 "$E/muster-train" --standalone --model tiny --data "$ITEST_DIR/text.txt" \
        --steps 12 --batch 8 --micro-batch 4 --lr 1e-2 --threads 2 --log-level warn "$@"
}
latest_is() {
    [ "$(cat "$1/latest" 2>/dev/null)" = "$2" ] || fail "$1/latest: expected $2"
}
loss_at() { # METRICS STEP: the loss at that step, full precision
    grep "\"step\": $2, \"loss\"" "$1" | tail -n 1 |
        python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read())["loss"]))'
}
CK=$ITEST_DIR/ck
train --device gpu --stop-after 8 --eval-every 4 --eval-batches 2 --metrics "$ITEST_DIR/straight.jsonl" \
    > "$ITEST_DIR/t0.log" 2>&1 || fail "GPU training: $(tail -3 "$ITEST_DIR/t0.log")"
grep -q 'val' "$ITEST_DIR/t0.log" || fail "no validation line from the GPU path"
train --device gpu --stop-after 4 --checkpoint-dir "$CK/gpu" --checkpoint-every 4 \
    --eval-every 4 --eval-batches 2 > "$ITEST_DIR/t1.log" 2>&1 || fail "GPU training: $(tail -3 "$ITEST_DIR/t1.log")"
latest_is "$CK/gpu" step-00000004
train --device gpu --stop-after 4 --checkpoint-dir "$CK/gpu" --resume "$CK/gpu" \
    --eval-every 4 --eval-batches 2 --metrics "$ITEST_DIR/resumed.jsonl" \
    > "$ITEST_DIR/t2.log" 2>&1 || fail "GPU resume: $(tail -3 "$ITEST_DIR/t2.log")"
latest_is "$CK/gpu" step-00000008
# cuemu runs atomics in one order, so here (unlike on a GPU) a resumed run
# must repeat the uninterrupted one bit for bit: data position, schedule and
# AdamW step count all come back from the checkpoint.
ref=$(loss_at "$ITEST_DIR/straight.jsonl" 8); got=$(loss_at "$ITEST_DIR/resumed.jsonl" 8)
[ -n "$ref" ] && [ "$ref" = "$got" ] || fail "step 8 loss: straight $ref, resumed from step 4 $got"
echo "GPU path resumed from step 4: step-8 loss $got, as the uninterrupted run"
python3 - "$ITEST_DIR/straight.jsonl" <<'PY' || fail "comm_frac missing or outside [0, 1] in the GPU path's metrics"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(steps) == 8 and all(0.0 <= d["comm_frac"] <= 1.0 for d in steps)
PY
train --device cpu --stop-after 2 --checkpoint-dir "$CK/cpu" --resume "$CK/gpu" \
    > "$ITEST_DIR/t3.log" 2>&1 || fail "CPU resume of a GPU checkpoint: $(tail -3 "$ITEST_DIR/t3.log")"
latest_is "$CK/cpu" step-00000010
train --device gpu --resume "$CK/cpu" --sample 32 > "$ITEST_DIR/t4.log" 2>&1 \
    || fail "GPU resume of a CPU checkpoint: $(tail -3 "$ITEST_DIR/t4.log")"
grep -q '^sample at step 12:' "$ITEST_DIR/t4.log" || fail "no sample at step 12"

# A GPU rank under musterd: the agent hands it an emulated gpu:0 device.
cat > "$ITEST_DIR/job.json" <<EOF
{"name": "gpu-local", "model": "tiny", "data": "$ITEST_DIR/text.txt", "steps": 4,
 "batch": 4, "micro_batch": 4, "max_restarts": 0}
EOF
timeout 120 "$BUILD/muster-worker" --local --job "$ITEST_DIR/job.json" --devices gpu:0 \
    --rank-cmd "$E/muster-train" > "$ITEST_DIR/local.log" 2>&1 \
    || fail "a job with a GPU rank under the local launcher failed"
grep -q 'completed, generation 1, 1 ranks' "$ITEST_DIR/local.log" || fail "no completion in the launcher's log"
grep -q 'on cuemu (CUDA emulated on the CPU)' "$ITEST_DIR/local.log" || fail "the rank did not take the GPU path"

# Two GPU ranks (processes): rank 0's NCCL id travels through the agent and
# musterd to rank 1. A rank SIGKILLed after a checkpoint: the other is
# parked out of its collective (ncclCommAbort), generation 2 gets a new id
# and completes.
cat > "$ITEST_DIR/job2.json" <<EOF
{"name": "gpu-two", "model": "tiny", "data": "$ITEST_DIR/text.txt", "steps": 16,
 "batch": 8, "micro_batch": 4, "max_restarts": 1, "checkpoint_dir": "$CK/two", "checkpoint_every": 4,
 "heartbeat_interval_ms": 200}
EOF
timeout 180 "$BUILD/muster-worker" --local --job "$ITEST_DIR/job2.json" --devices gpu:0,1 \
    --rank-cmd "$E/muster-train" > "$ITEST_DIR/two.log" 2>&1 &
L=$!
ITEST_PIDS="$ITEST_PIDS $L"
i=0; while [ ! -f "$CK/two/latest" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
[ -f "$CK/two/latest" ] || fail "no checkpoint from the two GPU ranks within 60 s"
# Its own ranks (others may run the same binary): children of the launcher,
# which is the child of timeout ($L), not of this shell.
launcher=$(pgrep -P "$L" -f muster-worker | head -n 1)
victim=""
[ -z "$launcher" ] || victim=$(pgrep -P "$launcher" -f "^$E/muster-train" | head -n 1)
[ -n "$victim" ] || fail "no GPU rank process to kill"
kill -9 "$victim"
echo "two GPU ranks: SIGKILLed pid $victim after $(cat "$CK/two/latest")"
wait "$L" || fail "the two-rank GPU job did not complete: $(tail -5 "$ITEST_DIR/two.log")"
grep -q 'completed, generation 2, 2 ranks' "$ITEST_DIR/two.log" || fail "expected completion in generation 2"

# Healing in place on the GPU path (docs/training.md): two GPU ranks, no
# checkpoint ever written, rank 1 SIGKILLed mid-run. Rank 0 keeps its
# process (and its emulated device state), rejoins generation 2 with a new
# NCCL communicator, rank 1's replacement gets its shard from rank 0's
# memory (the replica shipped from pinned host copies), and the run ends
# with the uninterrupted run's final loss, bit for bit: cuemu's collectives
# and kernels run in one order, so equal states give equal steps.
HSTEPS=12
cat > "$ITEST_DIR/heal.json" <<EOF
{"name": "gpu-heal", "model": "tiny", "data": "$ITEST_DIR/text.txt", "steps": $HSTEPS,
 "batch": 8, "micro_batch": 4, "max_restarts": 1, "heartbeat_interval_ms": 200, "seed": 3}
EOF
heal_run() { # METRICS LOG
    exec timeout 180 "$BUILD/muster-worker" --local --job "$ITEST_DIR/heal.json" --devices gpu:0,1 \
        --rank-cmd "$E/muster-train --metrics $1" > "$2" 2>&1
}
(heal_run "$ITEST_DIR/heal-straight.jsonl" "$ITEST_DIR/heal-straight.log") \
    || fail "the uninterrupted two-rank GPU job failed: $(tail -5 "$ITEST_DIR/heal-straight.log")"
ref=$(loss_at "$ITEST_DIR/heal-straight.jsonl" $HSTEPS)
[ -n "$ref" ] || fail "no step-$HSTEPS loss from the uninterrupted two-rank GPU job"
(heal_run "$ITEST_DIR/heal.jsonl" "$ITEST_DIR/heal.log") &
L=$! # timeout, which runs the launcher
ITEST_PIDS="$ITEST_PIDS $L"
steps_in() { cat "$1" 2> /dev/null | grep -c '"loss"' || true; } # METRICS: steps reported so far
i=0; while [ "$(steps_in "$ITEST_DIR/heal.jsonl")" -lt 6 ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
launcher=$(pgrep -P "$L" -f muster-worker | head -n 1)
ranks=""
[ -z "$launcher" ] || ranks=$(pgrep -P "$launcher" -f "^$E/muster-train" | sort -n)
survivor=$(echo "$ranks" | head -n 1); victim=$(echo "$ranks" | sed -n 2p)
[ -n "$victim" ] || fail "healing: no second GPU rank to kill (ranks: $ranks)"
at=$(steps_in "$ITEST_DIR/heal.jsonl")
kill -9 "$victim"
wait "$L" || fail "the healing two-rank GPU job did not complete: $(tail -5 "$ITEST_DIR/heal.log")"
grep -q 'completed, generation 2, 2 ranks' "$ITEST_DIR/heal.log" || fail "healing: expected completion in generation 2"
grep -q "rank 0 (pid $survivor, generation 2) exited with status 0" "$ITEST_DIR/heal.log" \
    || fail "healing: the surviving GPU rank (pid $survivor) did not finish generation 2: it was restarted"
grep -q "state of step [0-9]* from peers' memory: 1 rank(s) kept theirs (0 went back to their snapshot), 1 restored" \
    "$ITEST_DIR/heal.log" || fail "healing: no restore from the peer's memory: $(grep -i 'state\|broke' "$ITEST_DIR/heal.log")"
restored=$(grep -o "state of step [0-9]* from peers' memory" "$ITEST_DIR/heal.log" | cut -d' ' -f4)
[ "$restored" -ge $((at - 1)) ] || fail "healing: restored step $restored, but $at steps were done when the rank was killed"
got=$(loss_at "$ITEST_DIR/heal.jsonl" $HSTEPS)
echo "two GPU ranks: SIGKILLed rank 1 (pid $victim) after step $at, no checkpoint; rank 0 (pid $survivor) kept," \
    "state of step $restored from its memory; final loss $got (uninterrupted $ref)"
[ "$got" = "$ref" ] || fail "healing: final loss $got differs from the uninterrupted run's $ref"

# Out of memory: what was asked, what was free, what would fit.
set +e
CUEMU_DEVICE_MB=256 timeout 60 "$E/muster-train" --standalone --device gpu --model gpt2-124m \
    --data "$ITEST_DIR/text.txt" --steps 1 --batch 8 --micro-batch 8 --seq-len 1024 \
    > "$ITEST_DIR/oom.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "out of device memory exited $rc, expected 1"
grep -q 'out of memory: .* GiB free of 0.250 GiB' "$ITEST_DIR/oom.log" || fail "OOM message: $(cat "$ITEST_DIR/oom.log")"
grep -q 'would fit: .*micro_batch' "$ITEST_DIR/oom.log" || fail "OOM message names nothing that fits"
echo "gpu_emulated_train: passed"
