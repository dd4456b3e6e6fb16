#!/bin/sh
# The stack muster's users run, as ranks, unmodified: a DeepSpeed ZeRO stage 3
# script (tests/torch/ds_zero3_train.py: deepspeed.initialize with a JSON
# config, bf16, DeepSpeed's own checkpoints; CPU accelerator, gloo) and an
# accelerate script (tests/torch/accel_train.py: Accelerator, prepare,
# backward, save_state/load_state), on musterd + 2 agents x 2 ranks on
# loopback, with the build's PyTorch 2.x environment (mk/deps.sh):
#  (a) DeepSpeed: the 4 ranks form from muster's torchrun environment and
#      train (the loss falls);
#  (d) muster's start-up hook sees the DeepSpeed script's steps (no client in
#      it), and a SIGSTOPped rank is named hung, as stopped, within the
#      progress timeout, with the others' stacks collected;
#  (b) the hung rank's restart: the next generation resumes, every rank from
#      the newest checkpoint DeepSpeed had written (engine.load_checkpoint),
#      and the job completes with every step done (a SIGKILLed DeepSpeed rank:
#      memckpt_deepspeed.sh);
#  (c) accelerate: with ACCELERATE_USE_CPU=true (what `accelerate launch
#      --cpu` sets) put in the job's rank_cmd, the 4 ranks run multi-CPU
#      data parallel, train and complete.
set -eu
. tests/itest-lib.sh

need_torch torch_deepspeed torch.distributed deepspeed accelerate
PY=$TORCH_PY
DS_SCRIPT="$(pwd)/tests/torch/ds_zero3_train.py"
DS_CONFIG="$(pwd)/tests/torch/ds_zero3_config.json"
ACC_SCRIPT="$(pwd)/tests/torch/accel_train.py"
STEPS=20
DS_STEPS=30 # room for the hang at step 5 or later before the end
make_token "$ITEST_DIR/token"

# losses FILE: rank 0's losses in order, one per line, from an agent's log.
losses() { sed -n 's/.*rank 0: step [0-9]* loss \([0-9.]*\).*/\1/p' "$1"; }

# falls FILE: the mean of the last 5 losses is below half the mean of the first 5.
falls() {
    losses "$1" | awk '{ l[NR] = $1 } END {
        if (NR < 10) exit 1
        for (i = 1; i <= 5; i++) { a += l[i]; b += l[NR - 5 + i] }
        printf "loss: first 5 steps %.4f, last 5 %.4f\n", a / 5, b / 5
        exit !(b < a / 2) }'
}

run_job() { # JOBFILE NODE1 NODE2: musterd and two agents of 2 ranks each (logs agent-NODE.log)
    start_daemon "$1" --token-file "$ITEST_DIR/token"
    start_agent "$2" 2 --token-file "$ITEST_DIR/token"
    AGENT_A=$AGENT_PID
    start_agent "$3" 2 --token-file "$ITEST_DIR/token"
    AGENT_B=$AGENT_PID
}

stop_job() {
    kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    rm -rf "$ITEST_DIR/state" # a new job needs a fresh daemon state
}

# ---- job 1: DeepSpeed ZeRO-3, a hung rank named, the restart resumed --------
cat > "$ITEST_DIR/ds.json" <<JSON
{"name": "deepspeed-zero3", "nodes": 2, "max_restarts": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 500, "progress_timeout_ms": 5000,
 "rank_cmd": ["$PY", "$DS_SCRIPT", "--deepspeed_config", "$DS_CONFIG", "--steps", "$DS_STEPS",
              "--step-sleep", "0.1", "--ckpt-dir", "$ITEST_DIR/ds-ckpt", "--ckpt-every", "5",
              "--stop-at", "2:7:$ITEST_DIR/rank2-stopped"]}
JSON
run_job "$ITEST_DIR/ds.json" a b
wait_for 90 'd["state"] == "running" and running == 4' || fail "(a) the DeepSpeed job is not running with 4 ranks"
# (a start under load may pass progress_timeout_ms before the first step: a restart, then restart 1)
wait_log 90 "$ITEST_DIR/agent-a.log" "rank 0: rank 0/4 restart [0-9]* master 127.0.0.1:[0-9]* backend gloo" \
    || fail "(a) rank 0 did not form a gloo group of 4 from muster's environment"
echo "(a) DeepSpeed ZeRO-3: 4 ranks on gloo: ok"

# (d) the hook shows the script's steps; rank 2 (node b) stops itself
# (SIGSTOP) after step 7, between the saves of steps 5 and 10, and must be
# named hung, as stopped. (Not stopped from here at a moment of the test's
# choosing: one that fell inside the save of step 10, under load, left rank
# 2's shard half-written where DeepSpeed's rank 0 had already pointed
# `latest`, and every restart failed to load it: DeepSpeed's own checkpoint
# is not atomic across ranks.)
wait_for 120 'd["state"] == "running" and running == 4 and all(not r["silent"] and (r["step"] or 0) >= 5 and r.get("where") for r in d["ranks"])' \
    || fail "(d) the DeepSpeed script's steps do not reach status through the hook"
gen=$(status | python3 -c 'import json, sys; print(json.load(sys.stdin)["generation"])')
mark=$(wc -l < "$ITEST_DIR/agent-b.log")
i=0
until [ -e "$ITEST_DIR/rank2-stopped" ] || [ $i -ge 1200 ]; do sleep 0.05; i=$((i + 1)); done
pid=$(rank_pid "$DS_SCRIPT.*$ITEST_DIR/ds-ckpt" 2)
[ -n "$pid" ] || fail "(d) no process for rank 2"
i=0
until [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" = T ] || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
[ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" = T ] || fail "(d) rank 2 (pid $pid) did not stop itself after step 7"
t0=$(now_ms)
saved=$(sed -n 's/^step\([0-9]*\)$/\1/p' "$ITEST_DIR/ds-ckpt/latest")
wait_event 30 'rank 2 on node b is hung: its process is stopped' \
    || { kill -CONT "$pid" 2>/dev/null || true; fail "(d) the SIGSTOPped DeepSpeed rank was not named hung as stopped"; }
t1=$(now_ms)
kill -CONT "$pid" 2>/dev/null || true
# within the progress timeout (5 s) plus the stack window (1 s) and 6 s of
# heartbeats and polling (a loaded machine: seen 9.1 s beside a solo script,
# in the background lane); not before the timeout less the step in flight
[ $((t1 - t0)) -ge 4000 ] && [ $((t1 - t0)) -le 12000 ] \
    || fail "(d) rank 2 named hung $((t1 - t0)) ms after its SIGSTOP, not within 4-12 s (progress_timeout_ms 5000)"
echo "(d) rank 2 named hung $((t1 - t0)) ms after its SIGSTOP (progress_timeout_ms 5000)"
curl -sf "http://127.0.0.1:$HTTP/v1/stacks" > "$ITEST_DIR/ds-stacks.json" || fail "(d) GET /v1/stacks failed"
python3 - "$ITEST_DIR/ds-stacks.json" <<'PY' || fail "(d) the stacks after the hang: $(head -c 2000 "$ITEST_DIR/ds-stacks.json")"
import json, sys
by = {r["rank"]: r for r in json.load(open(sys.argv[1]))["ranks"]}
assert by[2]["stopped"], by[2]
for r in (0, 1, 3):
    assert "ds_zero3_train.py" in (by[r].get("text") or ""), (r, by[r])
PY
echo "(d) DeepSpeed through the hook: steps in status; SIGSTOPped rank 2 named, stacks collected: ok"

# (b) the hung rank's restart: the next generation resumes, every rank from the
# newest checkpoint DeepSpeed had written (engine.load_checkpoint), and the
# job completes with every step done.
# (or a later one: under load a restarted DeepSpeed rank may pass the progress timeout before its first step)
wait_for 90 "d['generation'] >= $gen + 1 and d['state'] == 'running' and running == 4" \
    || fail "(b) generation $((gen + 1)) is not running after the hang of rank 2"
i=0
until tail -n +"$mark" "$ITEST_DIR/agent-b.log" | grep -q "rank 3: rank 3 resumed at step" || [ $i -ge 1800 ]; do sleep 0.05; i=$((i + 1)); done
at=$(tail -n +"$mark" "$ITEST_DIR/agent-b.log" | sed -n 's/.*rank 3: rank 3 resumed at step \([0-9]*\).*/\1/p' | tail -n 1)
[ -n "$at" ] || fail "(b) rank 3 did not resume from DeepSpeed's checkpoint"
for r in 0 1 2; do
    log=$ITEST_DIR/agent-a.log; [ $r -ge 2 ] && log=$ITEST_DIR/agent-b.log
    wait_log 30 "$log" "rank $r: rank $r resumed at step $at\$" || fail "(b) rank $r did not resume at step $at as rank 3 did"
done
[ -n "$saved" ] && [ "$at" -ge "$saved" ] || fail "(b) resumed at step $at, before the checkpoint of step $saved that was on disk"
wait_for 120 'd["state"] == "completed"' || fail "the DeepSpeed job did not complete"
wait_log 10 "$ITEST_DIR/agent-a.log" "rank 0: step $DS_STEPS loss" || fail "the DeepSpeed job completed without step $DS_STEPS"
echo "(b) the hung rank's restart: generation $((gen + 1)) resumed at step $at (step $saved on disk at the hang) from engine.load_checkpoint; completed: ok"
falls "$ITEST_DIR/agent-a.log" || fail "(a) the DeepSpeed job's loss did not fall: $(losses "$ITEST_DIR/agent-a.log" | tr '\n' ' ')"
stop_job

# ---- job 2: accelerate ---------------------------------------------------------
cat > "$ITEST_DIR/acc.json" <<JSON
{"name": "accelerate", "nodes": 2, "max_restarts": 0, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 2000,
 "rank_cmd": ["env", "ACCELERATE_USE_CPU=true", "$PY", "$ACC_SCRIPT", "--steps", "$STEPS",
              "--ckpt-dir", "$ITEST_DIR/acc-ckpt", "--ckpt-every", "10"]}
JSON
run_job "$ITEST_DIR/acc.json" c d
wait_for 90 'd["state"] == "completed"' || fail "(c) the accelerate job did not complete"
grep -q "rank 0: rank 0/4 restart 0 DistributedType.MULTI_CPU" "$ITEST_DIR/agent-c.log" \
    || fail "(c) accelerate did not run multi-CPU data parallel over 4 ranks"
wait_log 10 "$ITEST_DIR/agent-c.log" "rank 0: step $STEPS loss" || fail "(c) the accelerate job completed without step $STEPS"
[ "$(cat "$ITEST_DIR/acc-ckpt/latest")" = "step_$STEPS" ] || fail "(c) accelerate's save_state of step $STEPS is missing"
falls "$ITEST_DIR/agent-c.log" || fail "(c) the accelerate job's loss did not fall: $(losses "$ITEST_DIR/agent-c.log" | tr '\n' ' ')"
echo "(c) accelerate: 4 ranks multi-CPU, trained, completed: ok"
stop_job
echo "torch_deepspeed: ok"
