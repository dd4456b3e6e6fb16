#!/bin/sh
# torchrun's device contract on GPU nodes, checked on this machine's CPUs:
# agents a (--devices gpu:0,1,3) and b (gpu:2,3) run one 5-rank job whose
# ranks select their device as a torchrun DDP script, DeepSpeed's engine and
# accelerate's PartialState do (tests/torch/device_select.py, with a strict
# stand-in for CUDA's device selection: an index past CUDA_VISIBLE_DEVICES is
# "invalid device ordinal", as on hardware).
#  (a) every rank, by each of the three code paths, selects cuda:LOCAL_RANK,
#      and entry LOCAL_RANK of its CUDA_VISIBLE_DEVICES is the GPU its agent
#      started it on; TORCH_NCCL_ASYNC_ERROR_HANDLING is unset (torch's default);
#  (b) "visible_devices": "own" (a 3-rank job: a gpu:0,1, b gpu:3): one GPU visible, so DDP's and DeepSpeed's choice
#      fails on every local rank but 0 (what the docs say breaks), accelerate's
#      (index modulo the device count) does not; an agent environment's
#      TORCH_NCCL_ASYNC_ERROR_HANDLING reaches the ranks as it was;
#  (c) muster-train keeps its one visible device under the default.
set -eu
. tests/itest-lib.sh

need_torch device_contract torch.distributed deepspeed accelerate
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/device_select.py"
make_token "$ITEST_DIR/token"

# start_gpu_agent NAME DEVICES [extra args]: an agent told it has those GPUs (nothing touches them),
# with the variables of AGENT_ENV (NAME=VALUE ...) in its environment.
AGENT_ENV=""
start_gpu_agent() {
    _name=$1; _devs=$2; shift 2
    # shellcheck disable=SC2086 # AGENT_ENV is a list of words
    env $AGENT_ENV "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$_name" --devices "$_devs" \
        --state-dir "$ITEST_DIR/agent-state" --token-file "$ITEST_DIR/token" "$@" \
        >> "$ITEST_DIR/agent-$_name.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
}

# run_job NAME A_GPUS B_GPUS EXTRA_JOB_KEYS [NAME=VALUE ...: the agents' environment]: the job
# of agents a and b with those GPUs to its end (completed or failed).
run_job() {
    _job=$1; _a=$2; _b=$3; _keys=$4; shift 4
    cat > "$ITEST_DIR/$_job.json" <<JSON
{"name": "$_job", "nodes": 2, "max_restarts": 0, "batch": 30, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 5000,
 "lease_ms": 10000, "rank_cmd": ["$PY", "$SCRIPT", "ddp", "deepspeed", "accelerate"]$_keys}
JSON
    rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state" "$ITEST_DIR"/agent-*.log
    start_daemon "$ITEST_DIR/$_job.json" --token-file "$ITEST_DIR/token"
    AGENT_ENV="$*"
    start_gpu_agent a "gpu:$_a" && AGENT_A=$AGENT_PID
    start_gpu_agent b "gpu:$_b" && AGENT_B=$AGENT_PID
    wait_for 120 'd["state"] in ("completed", "failed")' || fail "$_job: the job did not end within 120 s"
    JOB_STATE=$(status | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])')
    kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    cat "$ITEST_DIR"/agent-a.log "$ITEST_DIR"/agent-b.log > "$ITEST_DIR/$_job.out"
}

# ---- (a) the default: torchrun's view ---------------------------------------
run_job torchrun-view 0,1,3 2,3 ""
python3 - "$ITEST_DIR/torchrun-view.out" <<'PY' || fail "(a) a rank did not select its own GPU"
import re, sys
text = open(sys.argv[1]).read()
started = {int(r): (int(l), int(g)) for r, l, g in
           re.findall(r"started rank (\d+) \(local rank (\d+), gpu (\d+), pid", text)}
assert sorted(started) == list(range(5)), f"ranks started: {sorted(started)}"
assert sorted(g for _, g in started.values()) == [0, 1, 2, 3, 3], started
seen = {}
for r, l, kind, idx, gpu in re.findall(r"rank (\d+) local (\d+) kind (\w+) selects cuda:(\d+) gpu (\d+)", text):
    seen[(int(r), kind)] = (int(l), int(idx), int(gpu))
fails = re.findall(r"rank \d+ local \d+ kind \w+ fails: .*", text)
assert not fails, fails
for r, (local, gpu) in started.items():
    for kind in ("ddp", "deepspeed", "accelerate"):
        got = seen.get((r, kind))
        assert got == (local, local, gpu), f"rank {r} ({kind}): local {local}, gpu {gpu} wanted, got {got}"
nccl = re.findall(r"rank (\d+) TORCH_NCCL_ASYNC_ERROR_HANDLING=(\S+)", text)
assert len(nccl) == 5 and all(v == "unset" for _, v in nccl), nccl
print("(a) 5 ranks x ddp, deepspeed, accelerate: each selects cuda:LOCAL_RANK = its agent's GPU; "
      "TORCH_NCCL_ASYNC_ERROR_HANDLING unset: ok")
PY
[ "$JOB_STATE" = completed ] || fail "(a) the job ended $JOB_STATE, not completed"

# ---- (b) one visible device per rank, and the user's NCCL setting ----------
run_job own-view 0,1 3 ', "visible_devices": "own"' TORCH_NCCL_ASYNC_ERROR_HANDLING=0
python3 - "$ITEST_DIR/own-view.out" <<'PY' || fail "(b) the one-device view is not what the docs say"
import re, sys
text = open(sys.argv[1]).read()
started = {int(r): (int(l), int(g)) for r, l, g in
           re.findall(r"started rank (\d+) \(local rank (\d+), gpu (\d+), pid", text)}
assert sorted(started) == list(range(3)), f"ranks started: {sorted(started)}"
assert sorted(started.values()) == [(0, 0), (0, 3), (1, 1)], started
for r, (local, gpu) in started.items():
    for kind in ("ddp", "deepspeed"):
        if local == 0:
            assert f"rank {r} local 0 kind {kind} selects cuda:0 gpu {gpu}" in text, (r, kind)
        else:
            assert f"rank {r} local {local} kind {kind} fails: CUDA error: invalid device ordinal" in text, (r, kind)
    assert f"rank {r} local {local} kind accelerate selects cuda:0 gpu {gpu}" in text, (r, "accelerate")
nccl = re.findall(r"rank (\d+) TORCH_NCCL_ASYNC_ERROR_HANDLING=(\S+)", text)
assert len(nccl) == 3 and all(v == "0" for _, v in nccl), nccl
print("(b) visible_devices own: cuda:0 only; DDP and DeepSpeed fail on local rank 1 with invalid device "
      "ordinal, accelerate does not; the agent's TORCH_NCCL_ASYNC_ERROR_HANDLING=0 kept: ok")
PY

# ---- (c) muster-train sees its one device ----------------------------------
# A program named muster-train (what the agent goes by) that prints its view.
mkdir -p "$ITEST_DIR/bin"
cat > "$ITEST_DIR/bin/muster-train" <<'SH'
#!/bin/sh
echo "view rank $RANK local $LOCAL_RANK visible '$CUDA_VISIBLE_DEVICES'"
SH
chmod +x "$ITEST_DIR/bin/muster-train"
cat > "$ITEST_DIR/trainer.json" <<JSON
{"name": "trainer-view", "nodes": 1, "max_restarts": 0, "rank_cmd": ["$ITEST_DIR/bin/muster-train"]}
JSON
rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state" "$ITEST_DIR"/agent-*.log
AGENT_ENV=""
start_daemon "$ITEST_DIR/trainer.json" --token-file "$ITEST_DIR/token"
start_gpu_agent a gpu:4,6
wait_for 30 'd["state"] == "completed"' || fail "(c) the trainer-view job did not complete"
for l in 0 1; do
    grep -q "view rank $l local $l visible '$((2 * l + 4))'$" "$ITEST_DIR/agent-a.log" \
        || fail "(c) muster-train local rank $l does not see GPU $((2 * l + 4)) alone"
done
echo "(c) muster-train: one visible device per rank: ok"
