#!/bin/sh
# A sharded PyTorch program (FSDP2's fully_shard, tests/torch/fsdp_train.py)
# that heals in place through the Python client's ShardedElastic, with buddy
# replicas every 5 steps and a checkpoint every 10: musterd + 2 agents x 2
# ranks on loopback (rank r's buddy is the rank of the same index on the
# other node: 0<->2, 1<->3).
#  (a) uninterrupted, it trains to the end: the reference;
#  (b) under the strict NCCL-like backend (tests/torch/strict_nccl.py: a
#      collective whose peer is lost never fails, only the park watch's
#      abort ends it, and destroying a broken group blocks for ever), rank 3
#      SIGKILLed mid-run: ranks 0-2 keep their processes, every rank goes
#      back to the last replica step (the survivors from their own
#      snapshot, rank 3's new process from rank 1's replica: the event
#      state_restored), fewer than 2 x 5 steps are redone, no group is
#      destroyed after its abort (the backend logs such a call to
#      STRICT_NCCL_LOG), and the final parameters and loss are bit-identical
#      to (a)'s under gloo: the same shards, the same batches (a function of
#      the step) and the same collectives in the same world give the same
#      floats (the strict backend runs gloo's on staged copies);
#  (c) ranks 1 and 3 (buddies) SIGKILLed together: rank 3's state is nowhere
#      in memory, so every rank loads the program's last checkpoint, ranks 0
#      and 2 in place (state_from_checkpoint), and the result is again (a)'s;
#  (d) under strict_nccl, rank 1 hangs in its own code at step 13 for the
#      progress timeout (8 s)
#      (fsdp_train.py --hang-at-step), its peers blocked in FSDP's all-gather,
#      which never fails there: muster's hang detection parks the
#      generation, every rank's park watch aborts its groups (the survivors'
#      all-gather fails) and interrupts rank 1 in its loop; all 4 ranks keep
#      their processes, go back to the last replica step, destroy no group
#      after its abort, and end bit-identical to (a).
# itest: background
set -eu
. tests/itest-lib.sh

need_torch torch_fsdp_buddy torch.distributed.fsdp
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/fsdp_train.py"
STEPS=40
make_token "$ITEST_DIR/token"
STRICT_NCCL_LOG="$ITEST_DIR/strict.log"
export STRICT_NCCL_LOG

# run_job NAME [BACKEND [KEYS [ARGS]]]: musterd and two agents on a job of STEPS steps (default backend gloo;
# KEYS: more of the job's keys, each followed by a comma; ARGS: more of the rank command's, each after a comma)
run_job() {
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 4, "batch": 4, "heartbeat_interval_ms": 200, ${3:-}
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 1000,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "$STEPS", "--step-sleep", "0.1", "--replica-every", "5",
              "--ckpt-every", "10", "--final-file", "$ITEST_DIR/$1.final", "--ckpt-dir", "$ITEST_DIR/$1",
              "--backend", "${2:-gloo}"${4:-}]}
JSON
    for n in a b; do # each job's agents log afresh (kill_at reads rank 0's steps there)
        [ ! -e "$ITEST_DIR/agent-$n.log" ] || mv "$ITEST_DIR/agent-$n.log" "$ITEST_DIR/agent-$n.before-$1.log"
    done
    start_pair_job "$ITEST_DIR/$1.json"
}

# kill_at NAME STEP RANK...: SIGKILLs the ranks once rank 0 completed STEP
# (AT: a step every rank had finished); then the job must heal in
# place and complete, the other ranks keeping their processes. Ranks on two
# nodes die as their two agents report them: in one next generation or in
# two (the second forms before the later report and breaks), either is a heal.
kill_at() {
    name=$1 at=$2
    shift 2
    # rank 0's own output, not /v1/status: polling status is slow on a loaded machine
    wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step $at loss" || fail "($name) the job does not reach step $at"
    # Rank 0 finished step at: every rank finished step at - 1 (its collectives
    # needed theirs). Not /v1/ranks: musterd republishes the figures once a
    # second when read, every 5 s when not, so a first read is seconds old.
    AT=$((at - 1))
    rank_pids "$name" > "$ITEST_DIR/pids-$name"
    [ "$(wc -l < "$ITEST_DIR/pids-$name")" -eq 4 ] || fail "($name) expected 4 rank processes: $(cat "$ITEST_DIR/pids-$name")"
    for r in "$@"; do
        kill -9 "$(sed -n "s/^$r //p" "$ITEST_DIR/pids-$name")"
    done
    wait_for 60 'd["generation"] >= 2 and d["state"] == "running"' || fail "($name) no next generation is running"
    wait_for 120 'd["state"] == "completed"' || fail "($name) the healed job did not complete"
    for r in 0 1 2 3; do
        case " $* " in *" $r "*) continue ;; esac
        pid=$(sed -n "s/^$r //p" "$ITEST_DIR/pids-$name")
        grep -q "rank $r (pid $pid) rejoins in place for generation" "$ITEST_DIR"/agent-[ab].log \
            || fail "($name) rank $r (pid $pid) did not keep its process"
    done
}

same_as_ref() { # the final parameters' sum and loss are (a)'s, bit for bit
    [ -s "$ITEST_DIR/$1.final" ] || fail "($1) no final parameters written"
    [ "$(cat "$ITEST_DIR/$1.final")" = "$(cat "$ITEST_DIR/ref.final")" ] \
        || fail "($1) final parameters differ from the uninterrupted run: $(cat "$ITEST_DIR/$1.final") vs $(cat "$ITEST_DIR/ref.final")"
}

# (a) the reference.
run_job ref
wait_for 120 'd["state"] == "completed"' || fail "(a) the uninterrupted job did not complete"
[ -s "$ITEST_DIR/ref.final" ] || fail "(a) no final parameters written"
end_pair_job
echo "(a) uninterrupted: $(cat "$ITEST_DIR/ref.final")"

# (b) rank 3 SIGKILLed after step 12: every rank back to the last replica
# step (a multiple of 5: the last one, or the one before when the round was
# still in flight), rank 3 from its buddy's replica.
run_job heal strict_nccl
kill_at heal 12 3
check "d[\"restored\"][\"from\"] == \"memory\" and d[\"restored\"][\"step\"] % 5 == 0 and d[\"restored\"][\"step\"] >= $((AT / 5 * 5 - 5))" \
    || fail "(b) not restored from buddy replicas at a step of 5 since $AT - 5: $(status)"
redone=$(sed -n 's/.*every rank at step [0-9]* from buddy replicas (\([0-9]*\) steps redone).*/\1/p' "$ITEST_DIR/agent-a.log")
[ -n "$redone" ] && [ "$redone" -lt 10 ] || fail "(b) steps redone: '$redone', expected fewer than 2 x 5"
curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -q '"kind": *"state_restored"' \
    || fail "(b) no state_restored event"
same_as_ref heal
[ ! -s "$STRICT_NCCL_LOG" ] || fail "(b) a process group was destroyed after an abort: $(cat "$STRICT_NCCL_LOG")"
grep -q "aborting its [0-9]* process group" "$ITEST_DIR"/agent-[ab].log || fail "(b) no survivor aborted its groups"
end_pair_job
echo "(b) strict_nccl, SIGKILL of rank 3 after step $AT: ranks 0-2 kept their processes (groups aborted, none destroyed), rank 3 from its buddy's replica, $redone step(s) redone, final bit-identical to gloo's: ok"

# (c) ranks 1 and 3 together after step 13: rank 3's replica died with rank 1.
run_job both
kill_at both 13 1 3
check "d[\"restored\"][\"from\"] == \"disk\" and d[\"restored\"][\"step\"] % 10 == 0 and d[\"restored\"][\"step\"] >= $((AT / 10 * 10 - 10))" \
    || fail "(c) not restored from a checkpoint (every 10 steps) since $AT - 10: $(status)"
curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -q '"kind": *"state_from_checkpoint"' \
    || fail "(c) no state_from_checkpoint event"
same_as_ref both
end_pair_job
echo "(c) SIGKILL of ranks 1 and 3 (buddies) after step $AT: ranks 0 and 2 kept their processes, all from the checkpoint, final bit-identical: ok"
# (d) rank 1 hangs at step 13 under strict_nccl.
run_job hang strict_nccl '"progress_timeout_ms": 8000, "rejoin_timeout_ms": 30000,' ', "--hang-at-step", "12", "--hang-rank", "1"'
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 1: rank 1 hangs at step 13" || fail "(d) rank 1 does not hang at step 13"
rank_pids hang > "$ITEST_DIR/pids-hang"
[ "$(wc -l < "$ITEST_DIR/pids-hang")" -eq 4 ] || fail "(d) expected 4 rank processes: $(cat "$ITEST_DIR/pids-hang")"
wait_for 60 'd["generation"] >= 2 and d["state"] == "running"' || fail "(d) no next generation is running after the hang"
wait_for 120 'd["state"] == "completed"' || fail "(d) the healed job did not complete"
for r in 0 1 2 3; do
    pid=$(sed -n "s/^$r //p" "$ITEST_DIR/pids-hang")
    grep -q "rank $r (pid $pid) rejoins in place for generation" "$ITEST_DIR"/agent-[ab].log \
        || fail "(d) rank $r (pid $pid) did not keep its process"
done
check 'd["restored"]["from"] == "memory" and d["restored"]["step"] % 5 == 0 and d["restored"]["step"] >= 5' \
    || fail "(d) not restored from buddy replicas at a step of 5 since step 5: $(status)"
same_as_ref hang
[ ! -s "$STRICT_NCCL_LOG" ] || fail "(d) a process group was destroyed after an abort: $(cat "$STRICT_NCCL_LOG")"
end_pair_job
echo "(d) strict_nccl, rank 1 hung at step 13: all 4 ranks kept their processes (groups aborted, rank 1 interrupted), from buddy replicas, final bit-identical: ok"
echo "torch_fsdp_buddy: ok"
