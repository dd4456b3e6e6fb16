#!/bin/sh
# Warm spares (job key warm_spares): a PyTorch DDP program healing in place
# through muster_rank.Elastic (tests/torch/ddp_train.py --elastic), musterd +
# 2 agents x 2 ranks on loopback. Each agent keeps a warm spare (a Python
# process that imported torch); rank 3 is SIGKILLed mid-run:
#  - the replacement of rank 3 is node b's spare: the agent logs the
#    spare's PID as rank 3's, and rank 3's stacks (POST /v1/stacks) come from
#    that PID, in the training script: the hook is armed for the rank;
#  - the survivors keep their processes, the replacement's state comes from
#    a peer (state_restored), and the job completes with every step done:
#    rank 0 logs steps 1..STEPS once each, with the losses and the final
#    parameters of a reference computed without a failure
#    (ddp_train.py --reference-world 4, one process);
#  - node b starts a new spare once the old one is taken (10 s later);
#  - a spare SIGKILLed before it is needed (node a's first) is replaced;
#  - no spare outlives the job: once a rank of a node finished its training
#    the agent stops its spare (nothing will need it), so each node's last
#    spare has exited by the time the job completed (within 10 s).
set -eu
. tests/itest-lib.sh

need_torch torch_spares torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
STEPS=200
make_token "$ITEST_DIR/token"

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "spares", "nodes": 2, "max_restarts": 4, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 1000, "warm_spares": 1,
 "warm_imports": "torch.nn.parallel",
 "rank_cmd": ["$PY", "$SCRIPT", "--elastic", "--steps", "$STEPS", "--step-sleep", "0.1",
              "--final-file", "$ITEST_DIR/final", "--ckpt-dir", "$ITEST_DIR/ckpt"]}
JSON
"$PY" "$SCRIPT" --reference-world 4 --steps $STEPS --final-file "$ITEST_DIR/ref.final" |
    sed -n 's/^step \([0-9]*\) loss \([-0-9.e]*\)$/\1 \2/p' > "$ITEST_DIR/ref.steps" || fail "the reference run failed"
make_token "$ITEST_DIR/admin"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token" --admin-token-file "$ITEST_DIR/admin"
start_agent a 2 --token-file "$ITEST_DIR/token"
AGENT_A=$AGENT_PID
start_agent b 2 --token-file "$ITEST_DIR/token"
AGENT_B=$AGENT_PID

wait_for 120 'd["state"] == "running" and all((r["step"] or 0) >= 10 for r in d["ranks"])' \
    || fail "the job does not reach step 10"
wait_log 60 "$ITEST_DIR/agent-a.log" "started a warm spare (pid [0-9]*)" || fail "node a started no warm spare"
spare_a=$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-a.log" | head -n 1)
kill -9 "$spare_a"
wait_log 60 "$ITEST_DIR/agent-b.log" "started a warm spare (pid [0-9]*)" || fail "node b started no warm spare"
spare=$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-b.log" | head -n 1)
pid_alive "$spare" || fail "node b's spare (pid $spare) is not running"
tr '\0' '\n' < "/proc/$spare/environ" | grep -qx 'CUDA_VISIBLE_DEVICES=' || fail "the spare sees a device"
! tr '\0' '\n' < "/proc/$spare/environ" | grep -q '^DS_ACCELERATOR=' || fail "a CPU node's spare has DS_ACCELERATOR set"
! tr '\0' '\n' < "/proc/$spare/environ" | grep -q '^MUSTER_CTL_FD=' || fail "the spare has a rank's control fd"
# Its imports done, it waits on its hand-off socket (its main thread in a unix socket read).
i=0
until [ "$(cat "/proc/$spare/wchan" 2>/dev/null)" = unix_stream_read_generic ]; do
    sleep 0.1; i=$((i + 1)); [ $i -lt 600 ] || fail "the spare did not finish its imports within 60 s"
done
before=$(for r in 0 1 2; do rank_pid "$SCRIPT.*$ITEST_DIR" $r; done)
need_pids "the survivors (ranks 0-2)" 3 "$before"
victim=$(rank_pid "$SCRIPT.*$ITEST_DIR" 3)
[ -n "$victim" ] || fail "no rank 3 process"
kill -9 "$victim"
wait_log 60 "$ITEST_DIR/agent-b.log" "started rank 3 .*pid $spare) for generation 2: the warm spare took it up" \
    || fail "rank 3's replacement is not the spare (pid $spare): $(grep 'started rank 3' "$ITEST_DIR/agent-b.log")"
wait_for 60 'd["generation"] == 2 and d["state"] == "running" and all((r["step"] or 0) > 25 for r in d["ranks"])' \
    || fail "generation 2 does not run"
curl -sf -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $(cat "$ITEST_DIR/admin")" "http://127.0.0.1:$HTTP/v1/stacks" > /dev/null \
    || fail "POST /v1/stacks"
i=0
until curl -sf "http://127.0.0.1:$HTTP/v1/stacks" > "$ITEST_DIR/stacks" && python3 - "$ITEST_DIR/stacks" "$spare" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r3 = [r for r in d["ranks"] if r["rank"] == 3]
sys.exit(0 if d["generation"] == 2 and r3 and r3[0]["answered"] and r3[0]["pid"] == int(sys.argv[2])
         and "ddp_train.py" in (r3[0]["text"] or "") else 1)
PY
do
    sleep 0.2; i=$((i + 1)); [ $i -lt 100 ] || fail "rank 3's stacks are not the spare's (pid $spare): $(cat "$ITEST_DIR/stacks")"
done
wait_for 120 'd["state"] == "completed"' || fail "the healed job did not complete"
for p in $before; do
    grep -q "(pid $p) rejoins in place for generation 2" "$ITEST_DIR"/agent-[ab].log \
        || fail "survivor pid $p did not keep its process"
done
curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -q '"kind": *"state_restored"' \
    || fail "no state_restored event: the replacement's state did not come from a peer"
[ -s "$ITEST_DIR/final" ] || fail "no final parameters written"
rank_steps "$ITEST_DIR/agent-a.log" 0 > "$ITEST_DIR/run.steps"
why=$(same_steps $STEPS "$ITEST_DIR/run.steps" "$ITEST_DIR/ref.steps" 2>&1) || fail "not every step done once: $why"
python3 - "$ITEST_DIR/final" "$ITEST_DIR/ref.final" <<'PY' \
    || fail "final parameters differ from the reference's: $(cat "$ITEST_DIR/final") vs $(cat "$ITEST_DIR/ref.final")"
import sys
run, ref = ([float(x) for x in open(p).read().split()] for p in sys.argv[1:3])
assert len(run) == len(ref) == 2, (run, ref)
for h, r in zip(run, ref):
    assert abs(h - r) <= 1e-6 * abs(r), (h, r)
PY
[ "$(grep -c 'started a warm spare' "$ITEST_DIR/agent-b.log")" -ge 2 ] || fail "node b started no new spare after the take-up"
grep -q "warm spare (pid $spare_a) was killed by signal 9 before it was needed.*starting another" "$ITEST_DIR/agent-a.log" \
    || fail "node a's SIGKILLed spare (pid $spare_a) is not reported as such"
[ "$(grep -c 'started a warm spare' "$ITEST_DIR/agent-a.log")" -ge 2 ] || fail "node a did not replace its dead spare"
echo "rank 3 SIGKILLed: node b's warm spare (pid $spare) took its slot, state from a peer, job completed: ok"

# No spare outlives the job: each node's last one is gone, its agent still running.
last_a=$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-a.log" | tail -n 1)
last_b=$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-b.log" | tail -n 1)
need_pids "the nodes' last spares" 2 "$last_a $last_b"
[ "$last_b" != "$spare" ] || fail "node b's last spare is the one rank 3 took"
for p in $last_a $last_b; do wait_exit "$p" 10 || fail "spare $p outlived the job"; done
pid_alive "$AGENT_A" && pid_alive "$AGENT_B" || fail "an agent exited with the job (its spare's end says nothing)"
echo "torch_spares: ok"
