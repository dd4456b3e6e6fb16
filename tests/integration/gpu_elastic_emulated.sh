#!/bin/sh
# Shrink and grow from memory on the GPU path (docs/gpu.md, "Healing in
# place"), under cuemu (CUDA emulated on the CPU, tests/cuemu/README.md):
# musterd and 2 agents x 2 GPU ranks (tiny), no checkpoint directory.
#   1. Agent b is SIGKILLed with its ranks and stays away: after
#      rejoin_timeout_ms the job shrinks to node a's 2 ranks, which keep
#      their processes and re-slice the state of 4 ranks (their own, copied
#      down from their GPUs, and the replicas they hold of b's) for a world
#      of 2, uploaded to their GPUs;
#   2. agent b comes back: a's ranks leave their generation at a step
#      boundary, and the grown world of 4 gets its shards re-sliced from
#      a's memory.
# Each time the new generation trains on from the step the old one reached
# (from peers' memory: nothing from a checkpoint or the seed), its first
# loss is close to the last one before (a state from the seed, or a shard
# put in the wrong place, starts over near ln(vocab)), and a's ranks are
# never restarted. The re-slice itself is checked bit for bit by the ckpt
# and zero suites (ckpt_reslice, GPU slicing included).
# Every emulated GPU has 48 MiB (CUEMU_DEVICE_MB): one tiny trainer takes
# about 33 MiB (32 of them cuBLAS's workspace; 32 MiB is too little), two
# do not fit. A rank that re-slices copies its state to the host and frees
# its old trainer before it builds the new one; built the other way round
# (the old order), both of a's ranks failed at the shrink building the new
# trainer ("cudaMalloc(cuBLAS workspace, 0.031 GiB): ... out of memory:
# 0.015 GiB free of 0.047 GiB on the device"), exited with status 1, and
# the job restarted them from the seed ("did not shrink to 2 GPU ranks from
# memory"). Each re-slice must also say that the old trainer left first.
set -eu
if [ "${CUEMU:-on}" = off ]; then
    echo "gpu_elastic_emulated: skipped (sanitizer build: cuemu is not built there, see the Makefile)"
    exit 0
fi
. tests/itest-lib.sh
E=$BUILD/cuemu
[ -x "$E/muster-train" ] || fail "$E/muster-train not built"
for i in 1 2 3 4; do cat README.md docs/*.md; done > "$ITEST_DIR/text.txt"
make_token "$ITEST_DIR/token"
STEPS=70
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "gpu-elastic", "nodes": 2, "min_nodes": 1, "rejoin_timeout_ms": 1500, "max_restarts": 3, "model": "tiny",
 "data": "$ITEST_DIR/text.txt", "steps": $STEPS, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0,
 "seed": 5, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 1000, "restart_backoff_ms": 0}
JSON
M=$ITEST_DIR/gpu.metrics
agent() { # NAME: an agent with two (emulated) GPUs
    CUEMU_DEVICE_MB=48 "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$1" --devices gpu:0,1 --state-dir "$ITEST_DIR/agent-state" \
        --token-file "$ITEST_DIR/token" --rank-cmd "$E/muster-train --metrics $M" >> "$ITEST_DIR/agent-$1.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
}
step_now() { status | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"] or 0)'; }
loss_at() { grep "\"step\": $1, \"loss\"" "$M" | tail -n 1 | sed 's/.*"loss": \([^,]*\),.*/\1/'; }

# resumed WORLD: the last restore into WORLD came from memory, re-sliced, at
# the step the world before reached, and its first loss follows on.
resumed() {
    line=$(grep -h "state of step [0-9]* from peers' memory, re-sliced" "$ITEST_DIR/agent-a.log" | tail -n 1)
    [ -n "$line" ] || fail "world $1: no re-slice from peers' memory ($(grep -h 'state\|seed\|checkpoint' "$ITEST_DIR/agent-a.log" | tail -n 3))"
    step=$(echo "$line" | sed "s/.*state of step \([0-9]*\) from peers' memory.*/\1/")
    grep -q "training from step $step (state from peers' memory)" "$ITEST_DIR/agent-a.log" \
        || fail "world $1: the generation did not train from step $step"
    before=$(loss_at "$step"); after=$(loss_at $((step + 1)))
    [ -n "$before" ] && [ -n "$after" ] || fail "world $1: no losses around step $step"
    awk -v a="$before" -v b="$after" 'BEGIN { d = b - a; if (d < 0) d = -d; exit !(d < 0.15 * a) }' \
        || fail "world $1: loss $before at step $step, then $after: the state did not carry over"
    echo "world $1 from step $step, re-sliced from memory: loss $before -> $after"
}

start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
agent a
A=$AGENT_PID
agent b
B=$AGENT_PID
wait_for 240 'd["state"] == "running" and (d["step"] or 0) >= 8' || fail "not running at step 8 in 240 s"
before_a=$(ranks_of "$A")

# ---- 1. shrink
pkill -9 -P "$B" -f muster-train 2> /dev/null || true
kill -9 "$B"
echo "SIGKILLed agent b and its GPU ranks at step $(step_now)"
wait_for 120 'd["world_size"] == 2 and d["state"] == "running" and (d["step"] or 0) > 0 and d["restored"] and d["restored"]["from"] == "memory"' \
    || { show_status; fail "did not shrink to 2 GPU ranks from memory"; }
at=$(step_now)
wait_for 120 "(d['step'] or 0) >= $at + 3" || fail "the shrunk job did not go on"
resumed 2

# ---- 2. grow
agent b
B=$AGENT_PID
wait_for 180 'd["world_size"] == 4 and d["state"] in ("running", "completed") and d["restored"] and d["restored"]["from"] == "memory"' \
    || { show_status; fail "did not grow back to 4 GPU ranks from memory"; }
curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -q '"job_growing"' || fail "the GPU ranks were not asked to yield"
at=$(step_now)
wait_for 120 "(d['step'] or 0) >= $at + 2 or d['state'] == 'completed'" || fail "the grown job did not go on"
resumed 4

wait_for 300 'd["state"] == "completed"' || { show_status; fail "did not complete"; }
gen=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
for p in $before_a; do
    grep -q "(pid $p, generation $gen) exited with status 0" "$ITEST_DIR/agent-a.log" \
        || fail "node a's GPU rank (pid $p) did not finish generation $gen: it was restarted"
done
[ "$(grep -c 'its trainer left the device before the one of rank' "$ITEST_DIR/agent-a.log")" -ge 4 ] \
    || fail "a's ranks did not free their old trainers before building new ones (2 re-slices x 2 ranks)"
if grep -q 'out of memory\|stays on the device' "$ITEST_DIR/agent-a.log"; then
    fail "a re-slice did not free the old trainer first: $(grep -m 1 'out of memory\|stays on the device' "$ITEST_DIR/agent-a.log")"
fi
[ "$(grep -c '(state from the seed)' "$ITEST_DIR/agent-a.log")" = 1 ] \
    || fail "a generation after the first started from the seed: $(grep 'state from' "$ITEST_DIR/agent-a.log")"
echo "gpu elastic: shrank 4 -> 2 and grew 2 -> 4 from memory on GPUs of 48 MiB (one trainer at a time); node a's GPU ranks kept throughout"
