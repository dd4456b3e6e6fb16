#!/bin/sh
# Memory checkpoints for a program's own saves (job key memory_checkpoint_mb,
# worker/agent/memckpt.h): the DeepSpeed ZeRO-3 script
# (tests/torch/ds_zero3_train.py) saves with engine.save_checkpoint to
# $MUSTER_CHECKPOINT_DIR every 5 steps and loads with engine.load_checkpoint,
# on musterd + 2 agents x 2 ranks. Each agent runs in a mount namespace of
# its own (unshare -m), so the tmpfs it mounts at the one path every rank is
# told is that node's alone, as on separate machines:
#   (u) pre-flight: a size over the node's memory makes the node unfit, with
#       the figures;
#   (r) a reference run without faults: its per-step losses;
#   (a) rank 3 SIGKILLed after step 12: generation 2 resumes on every rank
#       at step 10, the newest checkpoint complete on both nodes, from memory;
#   (c) the nodes disagree: node b's step15 is removed (as if b never
#       finished it) while a has it complete: status shows a at step15, b at
#       step10, step10 common;
#   (b) then rank 3 stalls inside the save of step 20 (the tag directories
#       are made, rank 0 has written `latest` = step20 on a, rank 3's
#       optimizer state is not written) and is SIGKILLed there: step20 never
#       counts on either node, generation 3 resumes at step 10 on every rank
#       (not a's step15: a's step15 and step20 are gone, its `latest` names
#       step10) and completes;
# every loss of every generation equals the reference run's for that step
# (to the printed 6 decimals: the CPU run is deterministic), and each node's
# directory is gone when the job has completed;
#   (d) node b replaced, in a run of 10 steps with replicas on
#       (memory_checkpoint_replica_mbps): once step5 is complete on both
#       nodes and node a holds b's copy, every process in b's mount namespace
#       (agent b, ranks 2 and 3) is SIGKILLed, its tmpfs going with the
#       namespace; a fresh agent b waits for step5 from node a, which gives
#       it back, every rank resumes at step 5, the memory_resumed event says
#       "node b's files from node a", and every loss is the reference run's;
#   (p), (q) an accelerate and an FSDP2/DCP program on 2 agents x 1 rank:
#       rank 1 SIGKILLed after step 6, both ranks resume at step 5 from
#       memory, each node's directory holding all its rank loads.
# Needs root and mount namespaces; skipped with a message where they are not permitted.
set -eu
. tests/itest-lib.sh

need_mount_ns memckpt_deepspeed
need_torch memckpt_deepspeed torch.distributed deepspeed
PY=$TORCH_PY
DS_SCRIPT="$(pwd)/tests/torch/ds_zero3_train.py"
# the ranks' command lines name the test's directory, so that cleanup's pkill -f finds them
DS_CONFIG=$ITEST_DIR/ds_zero3_config.json
cp tests/torch/ds_zero3_config.json "$DS_CONFIG"
STEPS=20
ROOT=$ITEST_DIR/shm
mkdir -p "$ROOT"
make_token "$ITEST_DIR/token"

job() { # NAME STEPS STEP-SLEEP [MORE ARGS, as JSON strings [MORE KEYS, as JSON members]]: a job file
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 3, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "stop_grace_ms": 1000, "restart_backoff_ms": 0,
 "memory_checkpoint_mb": 256, "memory_checkpoint_root": "$ROOT",${5:+ $5,}
 "rank_cmd": ["$PY", "$DS_SCRIPT", "--deepspeed_config", "$DS_CONFIG", "--steps", "$2",
              "--step-sleep", "$3", "--ckpt-in-memory", "--ckpt-every", "5"${4:+, $4}]}
JSON
}

# mem_agent NAME [DEVICES]: an agent of 2 ranks (or DEVICES') in a mount namespace of its own
# (AGENT_PID: the agent itself)
mem_agent() {
    unshare -m --propagation private "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$1" \
        --devices "${2:-cpu:2}" --state-dir "$ITEST_DIR/agent-state" --token-file "$ITEST_DIR/token" \
        >> "$ITEST_DIR/agent-$1.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
}

run_job() { # NAME
    rm -rf "$ITEST_DIR/state"
    : > "$ITEST_DIR/agent-a.log"
    : > "$ITEST_DIR/agent-b.log"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token"
    mem_agent a
    AGENT_A=$AGENT_PID
    mem_agent b
    AGENT_B=$AGENT_PID
}

stop_job() {
    kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
}

on_node() { # AGENT-PID CMD...: CMD in that agent's mount namespace
    pid=$1; shift
    nsenter -t "$pid" -m "$@"
}

# ns_pids NS: the processes in mount namespace NS (as readlink /proc/PID/ns/mnt names it), one a line
ns_pids() {
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
    done
    return 0
}

# losses LOG: rank 0's "STEP LOSS" lines, every generation's, in order
losses() { sed -n 's/.*rank 0: step \([0-9]*\) loss \([0-9.]*\).*/\1 \2/p' "$1"; }

# same_losses LOSSES STEPS WHAT: LOSSES (losses' lines) ran steps 1..STEPS, some more than once, and
# each loss is the reference run's for its step as printed (the CPU run is deterministic)
same_losses() {
    python3 - "$ITEST_DIR/ref.losses" "$1" "$2" "$3" <<'PY'
import sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = [l.split() for l in open(sys.argv[2])]
steps = {s for s, _ in got}
assert steps == {str(s) for s in range(1, int(sys.argv[3]) + 1)}, f"steps run: {sorted(steps, key=int)}"
bad = [(s, v, ref[s]) for s, v in got if v != ref[s]]
assert not bad, f"(step, loss, reference): {bad}"
print(f"losses: {len(got)} steps printed {sys.argv[4]}, each equal to the reference run's")
PY
}

# resumed_all N STEP: every rank printed "rank R resumed at step STEP" N times (once per generation
# that resumed there so far)
resumed_all() {
    for r in 0 1 2 3; do
        log=$ITEST_DIR/agent-a.log; [ $r -ge 2 ] && log=$ITEST_DIR/agent-b.log
        i=0
        until [ "$(grep -c "rank $r: rank $r resumed at step $2\$" "$log")" -ge "$1" ] || [ $i -ge 1200 ]; do
            sleep 0.05; i=$((i + 1))
        done
        [ $i -lt 1200 ] || return 1
    done
}

# ---- (u) pre-flight: more memory than the node has ------------------------------
cat > "$ITEST_DIR/unfit.json" <<JSON
{"name": "unfit", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000, "lease_ms": 4000,
 "memory_checkpoint_mb": 1073741824, "memory_checkpoint_root": "$ROOT", "rank_cmd": ["/bin/true"]}
JSON
rm -rf "$ITEST_DIR/state"
start_daemon "$ITEST_DIR/unfit.json" --token-file "$ITEST_DIR/token"
start_agent u 1 --token-file "$ITEST_DIR/token"
AGENT_U=$AGENT_PID
wait_log 20 "$ITEST_DIR/agent-u.log" "unfit for the job: memory_checkpoint_mb: 1073741824 MiB asked for $ROOT/muster-unfit, but this node has [0-9]* MiB of memory available" \
    || fail "(u) a memory_checkpoint_mb over the node's memory did not make it unfit with the figures"
i=0
until curl -sf "http://127.0.0.1:$HTTP/v1/nodes" | grep -q '"unfit_reason": *"memory_checkpoint_mb: 1073741824 MiB asked' ||
    [ $i -ge 100 ]; do sleep 0.05; i=$((i + 1)); done
[ $i -lt 100 ] || fail "(u) /v1/nodes does not show node u unfit for its memory checkpoints: $(curl -sf "http://127.0.0.1:$HTTP/v1/nodes")"
[ "$(curl -sf "http://127.0.0.1:$HTTP/v1/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" != running ] \
    || fail "(u) the job runs on an unfit node"
kill "$DAEMON_PID" "$AGENT_U" 2>/dev/null || true
wait "$DAEMON_PID" "$AGENT_U" 2>/dev/null || true
echo "(u) pre-flight: $(sed -n 's/.*unfit for the job: \(memory_checkpoint_mb: [^:]*\):.*/\1/p' "$ITEST_DIR/agent-u.log" | head -n 1): ok"

# ---- (r) the reference run -------------------------------------------------------
job ref $STEPS 0
run_job ref
wait_for 120 'd["state"] == "completed"' || fail "(r) the reference run did not complete"
losses "$ITEST_DIR/agent-a.log" > "$ITEST_DIR/ref.losses"
[ "$(wc -l < "$ITEST_DIR/ref.losses")" -eq $STEPS ] || fail "(r) the reference run printed $(wc -l < "$ITEST_DIR/ref.losses") losses, not $STEPS"
grep -q "rank 0: rank 0 resumed" "$ITEST_DIR/agent-a.log" && fail "(r) the reference run resumed from something"
wait_log 10 "$ITEST_DIR/agent-a.log" "removing the memory checkpoint directory $ROOT/muster-ref" \
    || fail "(r) node a did not remove its memory checkpoint directory when the job completed"
stop_job
echo "(r) reference run: $STEPS steps, losses $(head -n 1 "$ITEST_DIR/ref.losses" | cut -d' ' -f2) .. $(tail -n 1 "$ITEST_DIR/ref.losses" | cut -d' ' -f2)"

# ---- the faulted run -------------------------------------------------------------
job mem $STEPS 0.25 '"--stall-save", "3:20:1"'
run_job mem
DIR=$ROOT/muster-mem
wait_for 120 'd["state"] == "running" and running == 4' || fail "the job is not running with 4 ranks"
on_node "$AGENT_A" sh -c "grep -q ' $DIR tmpfs .*size=262144k' /proc/self/mounts" \
    || fail "node a's $DIR is not a tmpfs of 256 MiB: $(on_node "$AGENT_A" grep "$DIR" /proc/self/mounts)"
pid=$(rank_pid "$DS_CONFIG.*--stall-save" 2) # the faulted job's ranks alone have --stall-save
[ -n "$pid" ] || fail "no process for rank 2"
tr '\0' '\n' < "/proc/$pid/environ" | grep -qx "MUSTER_CHECKPOINT_DIR=$DIR" \
    || fail "rank 2 (pid $pid) was not given MUSTER_CHECKPOINT_DIR=$DIR: $(tr '\0' '\n' < "/proc/$pid/environ" | grep MUSTER_)"

# (a) SIGKILL rank 3 after step 12, once step10 is complete on both nodes
wait_for 90 '(d["memory_checkpoint"] or {}).get("common") == "step10"' \
    || fail "(a) status never showed step10 complete on both nodes: $(curl -sf "http://127.0.0.1:$HTTP/v1/status")"
wait_log 60 "$ITEST_DIR/agent-a.log" "rank 0: step 12 loss" || fail "(a) rank 0 did not reach step 12"
pid=$(rank_pid "$DS_CONFIG.*--stall-save" 3)
[ -n "$pid" ] || fail "(a) no process for rank 3"
kill -9 "$pid"
wait_for 90 'd["generation"] == 2 and d["state"] == "running"' || fail "(a) generation 2 is not running after rank 3's SIGKILL"
resumed_all 1 10 || fail "(a) not every rank resumed at step 10 in generation 2"
wait_event 10 "generation 2 resumed from memory checkpoint step 10" || fail "(a) no event says generation 2 resumed from memory checkpoint step 10"
echo "(a) SIGKILL of rank 3 after step 12: generation 2 resumed at step 10 from memory on every rank: ok"

# (c) the nodes disagree: b lacks step15, a has it complete
wait_for 90 '(d["memory_checkpoint"] or {}).get("common") == "step15"' || fail "(c) step15 never complete on both nodes"
on_node "$AGENT_B" rm -rf "$DIR/step15"
wait_for 10 'd["memory_checkpoint"]["nodes"] == {"a": "step15", "b": "step10"} and d["memory_checkpoint"]["common"] == "step10"' \
    || fail "(c) status does not show a at step15, b at step10, step10 common: $(curl -sf "http://127.0.0.1:$HTTP/v1/status")"
echo "(c) b without step15, a with it: status shows a step15, b step10, common step10: ok"

# (b) rank 3 stalls inside the save of step 20 and is killed there
wait_log 90 "$ITEST_DIR/agent-b.log" "rank 3: rank 3 stalls in the save of step 20" || fail "(b) rank 3 did not stall in its save"
i=0
until [ "$(on_node "$AGENT_A" cat "$DIR/latest" 2>/dev/null)" = step20 ] || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
[ $i -lt 200 ] || fail "(b) rank 0 never wrote latest = step20 (the half-done save is not what the test needs)"
sleep 1 # heartbeats: a half-done save must not be reported
wait_for 1 'd["memory_checkpoint"]["nodes"] == {"a": "step15", "b": "step10"} and d["memory_checkpoint"]["common"] == "step10"' \
    || fail "(b) the half-done step20 counts as complete: $(curl -sf "http://127.0.0.1:$HTTP/v1/status")"
pid=$(rank_pid "$DS_CONFIG.*--stall-save" 3)
[ -n "$pid" ] || fail "(b) no process for rank 3"
kill -9 "$pid"
wait_for 90 'd["generation"] == 3 and d["state"] == "running"' || fail "(b) generation 3 is not running after rank 3's SIGKILL"
# before generation 3 saves its own step15 (5 steps on)
[ "$(on_node "$AGENT_A" cat "$DIR/latest")" = step10 ] || fail "(c) node a's latest is not step10"
on_node "$AGENT_A" sh -c "[ ! -e '$DIR/step15' ] && [ ! -e '$DIR/step20' ]" \
    || fail "(c) node a's step15 or step20, newer than the common step10, is still there: $(on_node "$AGENT_A" ls "$DIR")"
resumed_all 2 10 || fail "(b, c) not every rank resumed at step 10 in generation 3"
wait_event 10 "generation 3 resumed from memory checkpoint step 10" || fail "(b, c) no event for generation 3's resume"
echo "(b) save of step 20 killed half-way: never complete; (c) generation 3 resumed at step 10 on every rank, a's step15 dropped: ok"

wait_for 120 'd["state"] == "completed"' || fail "the job did not complete"
losses "$ITEST_DIR/agent-a.log" > "$ITEST_DIR/mem.losses"
same_losses "$ITEST_DIR/mem.losses" $STEPS "over 3 generations" || fail "losses differ from the reference run's"
wait_log 10 "$ITEST_DIR/agent-b.log" "removing the memory checkpoint directory $DIR" \
    || fail "node b did not remove its memory checkpoint directory when the job completed"
on_node "$AGENT_B" sh -c "! grep -q ' $DIR ' /proc/self/mounts && [ ! -e '$DIR' ]" || fail "node b's $DIR is still there"
stop_job

# ---- (d) node b replaced: its files come from its buddy a ------------------------
# Replicas on, 10 steps: step10, the last save, never completes (no step follows
# it), so step5 is the checkpoint to resume from however late the kill comes.
job node 10 0.3 '' '"memory_checkpoint_replica_mbps": 100'
run_job node
wait_for 120 '((d["memory_checkpoint"] or {}).get("common") == "step5" and
               ((d["memory_checkpoint"].get("replicas") or {}).get("b") or {}).get("newest") == "step5")' \
    || fail "(d) step5 never complete on both nodes with node b's copy held by its buddy a: $(status)"
# every process in b's mount namespace: the agent and its ranks; its tmpfs goes with the namespace
ns=$(readlink "/proc/$AGENT_B/ns/mnt")
pids=$(ns_pids "$ns" | tr '\n' ' ')
for r in 2 3; do
    pid=$(rank_pid "$DS_CONFIG --steps 10 " $r)
    case " $pids" in *" $pid "*) ;; *) fail "(d) rank $r (pid '$pid') is not in node b's mount namespace ($pids)" ;; esac
done
kill -9 $pids 2>/dev/null || true # one may be gone already; the namespace must empty all the same
wait "$AGENT_B" 2>/dev/null || true
i=0
until [ -z "$(ns_pids "$ns")" ] || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
[ $i -lt 200 ] || fail "(d) node b's mount namespace, and with it its tmpfs, outlived the SIGKILL: $(ns_pids "$ns" | tr '\n' ' ')"
mem_agent b
AGENT_B=$AGENT_PID
wait_log 30 "$ITEST_DIR/agent-b.log" "generation 2: memory checkpoint step5 is not here; the ranks wait for it from node a" \
    || { show_status; fail "(d) the fresh agent b did not wait for step5 from node a"; }
wait_log 30 "$ITEST_DIR/agent-b.log" "memory checkpoint step5 came back from the buddy" \
    || { show_status; fail "(d) node b's step5 did not come back from node a"; }
resumed_all 1 5 || fail "(d) not every rank resumed at step 5: $(grep -h 'resumed at step' "$ITEST_DIR"/agent-?.log)"
event_matching '(e["kind"] == "memory_resumed" and e["message"].startswith("generation 2 resumed from memory checkpoint step 5 ")
                 and "node b'"'"'s files from node a" in e["message"])' > /dev/null \
    || fail "(d) no memory_resumed event for generation 2 naming node b's files from node a: $(curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -o '"memory_resumed[^}]*')"
wait_for 90 'd["state"] == "completed"' || { show_status; fail "(d) the job did not complete after node b's resume"; }
check 'd["generation"] == 2' || fail "(d) the job took more than one restart: $(status)"
losses "$ITEST_DIR/agent-a.log" > "$ITEST_DIR/node.losses"
same_losses "$ITEST_DIR/node.losses" 10 "over 2 generations" || fail "(d) losses differ from the reference run's"
echo "(d) agent b and ranks 2, 3 SIGKILLed with b's tmpfs, a fresh agent b: $(event_matching 'e["kind"] == "memory_resumed"' | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["message"])')"
stop_job

# ---- (p), (q): accelerate and FSDP2/DCP programs, 2 agents x 1 rank ------------
# Each saves into $MUSTER_CHECKPOINT_DIR every 5 steps and loads `latest` at
# start; rank 1 (node b) is SIGKILLed after step 6. The directory is
# node-local, which the programs' default saves do not allow for:
#   (p) tests/torch/accel_train.py --ckpt-in-memory: accelerate's save_state
#       writes the model and optimizer from the main process alone unless
#       save_on_each_node: b's step_5 would hold only its RNG state
#       (FileNotFoundError: step_5/pytorch_model.bin);
#   (q) tests/torch/fsdp_train.py --ckpt-in-memory (ShardedElastic, no buddy
#       replicas: rank 0 rejoins in place and loads the program's checkpoint
#       too): a default dcp.save writes .metadata on rank 0 alone ("metadata
#       is None" on b) and each replicated item into one rank's file
#       (FileNotFoundError: __1_0.distcp on a): it saves with
#       use_collectives=False, each rank all it loads.
# prog_job TAG NAME CKPT SCRIPT ARGS: the job NAME (rank_cmd ARGS, as JSON
# strings) runs, rank 1 is SIGKILLed after step 6 once checkpoint CKPT
# (step 5) is complete on both nodes, both ranks resume at step 5 from
# memory, step 6's loss is redone alike, and the job completes after one restart.
prog_job() {
    tag=$1 name=$2 ckpt=$3 script=$4
    cat > "$ITEST_DIR/$name.json" <<JSON
{"name": "$name", "nodes": 2, "max_restarts": 2, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 5000,
 "lease_ms": 10000, "stop_grace_ms": 1000, "restart_backoff_ms": 0,
 "memory_checkpoint_mb": 64, "memory_checkpoint_root": "$ROOT", "rank_cmd": [$5]}
JSON
    rm -rf "$ITEST_DIR/state"
    : > "$ITEST_DIR/agent-a.log"
    : > "$ITEST_DIR/agent-b.log"
    start_daemon "$ITEST_DIR/$name.json" --token-file "$ITEST_DIR/token"
    mem_agent a cpu:1
    AGENT_A=$AGENT_PID
    mem_agent b cpu:1
    AGENT_B=$AGENT_PID
    wait_for 120 "(d['memory_checkpoint'] or {}).get('common') == '$ckpt'" \
        || fail "$tag: status never showed $ckpt complete on both nodes: $(curl -sf "http://127.0.0.1:$HTTP/v1/status")"
    wait_log 30 "$ITEST_DIR/agent-a.log" "rank 0: step 6 loss" || fail "$tag: rank 0 did not reach step 6"
    pid=$(rank_pid "$script.*--ckpt-in-memory" 1)
    [ -n "$pid" ] || fail "$tag: no process for rank 1"
    kill -9 "$pid"
    wait_event 60 "generation 2 resumed from memory checkpoint step 5" \
        || fail "$tag: no event says generation 2 resumed from memory checkpoint step 5"
    for r in 0 1; do
        log=$ITEST_DIR/agent-a.log; [ $r = 1 ] && log=$ITEST_DIR/agent-b.log
        wait_log 60 "$log" "rank $r: rank $r resumed at step 5\$" \
            || fail "$tag: rank $r did not resume at step 5: $(grep -h 'exited with status' "$ITEST_DIR"/agent-?.log | tail -n 2)"
    done
    wait_for 90 'd["state"] == "completed"' || fail "$tag: the job did not complete: $(curl -sf "http://127.0.0.1:$HTTP/v1/status")"
    [ "$(curl -sf "http://127.0.0.1:$HTTP/v1/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')" = 2 ] \
        || fail "$tag: the job took more than one restart"
    loss6=$(sed -n 's/^rank 0: step 6 loss \([0-9.]*\)$/\1/p' "$ITEST_DIR/agent-a.log" | head -n 1)
    [ "$(grep -c "^rank 0: step 6 loss $loss6\$" "$ITEST_DIR/agent-a.log")" -eq 2 ] \
        || fail "$tag: step 6's loss after the resume differs from generation 1's: $(grep 'rank 0: step 6 loss' "$ITEST_DIR/agent-a.log")"
    stop_job
    echo "$tag $name, 2 nodes x 1 rank: rank 1 SIGKILLed after step 6, both ranks resumed from memory at step 5, step 6 redone alike, completed: ok"
}
ACC_SCRIPT="$(pwd)/tests/torch/accel_train.py"
prog_job "(p)" accel step_5 "$ACC_SCRIPT" "\"env\", \"ACCELERATE_USE_CPU=true\", \"$PY\", \"$ACC_SCRIPT\", \"--steps\", \"8\",
    \"--width\", \"16\", \"--ckpt-in-memory\", \"--ckpt-every\", \"5\", \"--step-sleep\", \"0.3\""
FSDP_SCRIPT="$(pwd)/tests/torch/fsdp_train.py"
prog_job "(q)" dcp step-5 "$FSDP_SCRIPT" "\"$PY\", \"$FSDP_SCRIPT\", \"--steps\", \"8\", \"--width\", \"16\", \"--depth\", \"1\",
    \"--replica-every\", \"0\", \"--ckpt-in-memory\", \"--ckpt-every\", \"5\", \"--step-sleep\", \"0.3\""
echo "memckpt_deepspeed: ok"
