#!/bin/sh
# A shrink that meets a new rank process, on the GPU path under cuemu
# (tests/cuemu/README.md): musterd and 2 agents x 2 GPU ranks (tiny), batch
# 8 with micro_batch left at 0 (batch / world: 2 sequences per micro-step in
# a world of 4, 4 in a world of 2). Agent b is SIGKILLed with its ranks and
# stays away; while the job waits for it, node a's rank 1 is SIGKILLed too.
# The job shrinks to 2 ranks: a's rank 0 keeps its process (started in the
# world of 4), a's rank 1 is a new process (started in the world of 2).
# Both must run a step alike (1 micro-step of 4 sequences): a rank that kept
# the micro-batch of the world it was started in ran 2 micro-steps while
# the new one ran 1, and cuemu stopped them at their first collective that
# did not match ("rank 0 called ncclAllGather ... but rank 1 called
# ncclAllReduce"), generation after generation. No step is in memory for
# every old rank (rank 1 and its holder on b are lost) and there is no
# checkpoint: the shrunk job starts from the seed and must complete.
set -eu
if [ "${CUEMU:-on}" = off ]; then
    echo "gpu_shrink_new_rank_emulated: skipped (sanitizer build: cuemu is not built there, see the Makefile)"
    exit 0
fi
. tests/itest-lib.sh
E=$BUILD/cuemu
[ -x "$E/muster-train" ] || fail "$E/muster-train not built"
for i in 1 2 3 4; do cat README.md docs/*.md; done > "$ITEST_DIR/text.txt"
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "gpu-shrink-new-rank", "nodes": 2, "min_nodes": 1, "rejoin_timeout_ms": 1500, "max_restarts": 3,
 "model": "tiny", "data": "$ITEST_DIR/text.txt", "steps": 24, "batch": 8, "lr": 0.003, "warmup_steps": 5,
 "eval_every": 0, "seed": 5, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 1000, "restart_backoff_ms": 0}
JSON
agent() { # NAME: an agent with two (emulated) GPUs
    "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$1" --devices gpu:0,1 --state-dir "$ITEST_DIR/agent-state" \
        --token-file "$ITEST_DIR/token" --rank-cmd "$E/muster-train" >> "$ITEST_DIR/agent-$1.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
}

start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
agent a
A=$AGENT_PID
agent b
B=$AGENT_PID
wait_for 240 'd["state"] == "running" and (d["step"] or 0) >= 4' || fail "not running at step 4 in 240 s"
a0=$(sed -n 's/.*started rank 0 (local rank 0, gpu 0, pid \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-a.log" | tail -n 1)
a1=$(sed -n 's/.*started rank 1 (local rank 1, gpu 1, pid \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-a.log" | tail -n 1)
[ -n "$a0" ] && [ -n "$a1" ] || fail "no pids of node a's ranks in its log"

pkill -9 -P "$B" -f muster-train 2> /dev/null || true
kill -9 "$B"
wait_for 30 'd["state"] == "recovering"' || { show_status; fail "the job did not notice that b was gone"; }
kill -9 "$a1"
echo "SIGKILLed agent b with its ranks, then node a's rank 1 (pid $a1) while the job waited for b"

wait_for 240 'd["state"] in ("completed", "failed")' || { show_status; fail "did not end"; }
check 'd["state"] == "completed" and d["world_size"] == 2' \
    || { show_status; fail "the job of 2 ranks (a's rank 0 kept, rank 1 new) did not complete"; }
gen=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
grep -q "(pid $a0, generation $gen) exited with status 0" "$ITEST_DIR/agent-a.log" \
    || fail "node a's rank 0 (pid $a0) did not finish generation $gen: it was restarted"
# Each rank says how it runs a step: the same in the generation that completed.
shapes=$(grep -h "generation $gen: .*micro-step(s) of" "$ITEST_DIR/agent-a.log" | sed 's/.*, \([0-9]* micro-step(s) of [0-9]* sequence(s)\).*/\1/' | sort -u)
[ "$shapes" = "1 micro-step(s) of 4 sequence(s)" ] || fail "the ranks of generation $gen ran steps of: $shapes"
if grep -q "NCCL collective #[0-9]*: rank" "$ITEST_DIR/agent-a.log"; then
    fail "collectives did not match: $(grep -m 1 'NCCL collective #' "$ITEST_DIR/agent-a.log")"
fi
echo "gpu shrink with a new rank: the kept and the new rank ran 1 micro-step of 4 sequences alike, and completed"
