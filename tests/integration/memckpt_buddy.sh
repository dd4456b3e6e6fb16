#!/bin/sh
# Memory checkpoints replicated to the buddy node and given back
# (worker/agent/memrep.h, daemon/rdv_memrep.c): musterd + 2 agents x 1 rank,
# each agent in a mount namespace of its own (its tmpfs is that node's alone,
# as on separate machines); the ranks (tests/memrep/save_rank.py, plain
# Python, no torch) save 1 MiB each to $MUSTER_CHECKPOINT_DIR every 5 steps.
#   (d) rank 1 (node b) writes half of its step-15 file and stalls there:
#       node b's copy at its buddy a never goes past step10 (a half-written
#       checkpoint is never shipped);
#   (b) agent b is SIGKILLed with its rank, its tmpfs going with its mount
#       namespace, and a fresh agent for node b is started: node b's step10
#       comes back from node a before its rank starts, the event says so,
#       both ranks resume at step 10 with intact bytes, and the job completes;
#   (g) a job with a hot spare (spare_nodes 1): agent b SIGKILLed, the spare
#       s takes its rank block and gets b's files from b's buddy a before
#       its rank starts, which resumes intact;
#   (c) a job draining to checkpoint_dir every 10 steps: both agents
#       SIGKILLed with their ranks and tmpfs (no buddy copy is left: replicas
#       off, as they would be lost with both nodes; musterd's choice is the
#       same), a drain cut
#       short planted in node b's durable directory and a step90 drained on
#       node a alone; fresh agents copy the newest checkpoint drained on both
#       back from checkpoint_dir, the event says so, both ranks resume there
#       intact, the planted stage is removed and never used;
#   (f) a one-node job saving 5 MiB a step into 8 MiB: the second save fails
#       in the program with ENOSPC, and an event names node f and the size.
# Needs root and mount namespaces; skipped with a message where they are not permitted.
set -eu
. tests/itest-lib.sh

need_mount_ns memckpt_buddy
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/clients/python"
ROOT=$ITEST_DIR/shm
mkdir -p "$ROOT" "$ITEST_DIR/barrier"
make_token "$ITEST_DIR/token"
cp tests/memrep/save_rank.py "$ITEST_DIR/save_rank.py" # the ranks' command line names the test's directory

cat > "$ITEST_DIR/rep.json" <<JSON
{"name": "rep", "nodes": 2, "max_restarts": 3, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "stop_grace_ms": 500, "restart_backoff_ms": 0,
 "memory_checkpoint_mb": 64, "memory_checkpoint_root": "$ROOT", "memory_checkpoint_replica_mbps": 100,
 "rank_cmd": ["$PY", "$ITEST_DIR/save_rank.py", "--steps", "40", "--sleep", "0.1", "--half", "1:15",
              "--barrier", "$ITEST_DIR/barrier"]}
JSON

# mem_agent NAME: an agent of 1 rank in a mount namespace of its own (AGENT_PID: the agent itself)
mem_agent() {
    unshare -m --propagation private "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$1" \
        --devices cpu:1 --state-dir "$ITEST_DIR/agent-state" --token-file "$ITEST_DIR/token" \
        >> "$ITEST_DIR/agent-$1.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
}
# agents_ab: agents for nodes a and b (AGENT_A, AGENT_B)
agents_ab() {
    mem_agent a
    AGENT_A=$AGENT_PID
    mem_agent b
    AGENT_B=$AGENT_PID
}

start_daemon "$ITEST_DIR/rep.json" --token-file "$ITEST_DIR/token"
agents_ab

# ---- (d) a half-written save is never shipped -------------------------------------
wait_log 60 "$ITEST_DIR/agent-b.log" "rank 1: half of step 15 written; stalled" \
    || { show_status; fail "(d) rank 1 did not reach its half-written save of step 15"; }
wait_for 20 '((d["memory_checkpoint"] or {}).get("replicas") or {}).get("b", {}).get("newest") == "step10"' \
    || fail "(d) node a does not hold node b's step10: $(status)"
sleep 1 # b's heartbeats go on: its half step15 would be sent now if it ever were
grep -q "memory checkpoint step15 of node b sent" "$ITEST_DIR/agent-b.log" \
    && fail "(d) node b sent its half-written step15 to its buddy"
check '(d["memory_checkpoint"]["replicas"]["b"]["newest"] == "step10" and
        d["memory_checkpoint"]["nodes"]["b"] == "step10")' \
    || fail "(d) after b's stall its buddy's copy or its own newest is not step10: $(status)"
lag=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_checkpoint"]["replicas"]["a"]["lag_steps"])')
echo "(d) b's half step15 never shipped: a holds b's step10; a's copy at b lags $lag step(s)"

# ---- (b) node b replaced: its files come from its buddy -----------------------------
pid=$(rank_pid "$ITEST_DIR/save_rank.py" 1)
[ -n "$pid" ] || fail "(b) no process for rank 1"
kill -9 "$AGENT_B" "$pid"
wait "$AGENT_B" 2>/dev/null || true
mem_agent b
AGENT_B=$AGENT_PID
wait_log 30 "$ITEST_DIR/agent-b.log" "memory checkpoint step10 came back from the buddy" \
    || { show_status; fail "(b) node b's step10 did not come back from node a"; }
wait_log 30 "$ITEST_DIR/agent-b.log" "rank 1: resumed at step 10 (intact)" \
    || fail "(b) rank 1 did not resume at step 10 with intact files: $(grep 'rank 1: resumed' "$ITEST_DIR/agent-b.log")"
# the fresh agent's first rank is the one that resumed (not a later generation's, after a start from scratch)
first=$(awk '/muster-worker [0-9.]*: node b/ { n++ } n == 2 && /^rank 1: / { print; exit }' "$ITEST_DIR/agent-b.log")
[ "$first" = "rank 1: resumed at step 10 (intact)" ] \
    || fail "(b) the fresh agent's rank 1 did not start from its buddy's copy: its first line is '$first'"
wait_log 30 "$ITEST_DIR/agent-a.log" "rank 0: resumed at step 10 (intact)" \
    || fail "(b) rank 0 did not resume at step 10: $(grep 'rank 0: resumed' "$ITEST_DIR/agent-a.log")"
event_matching 'e["kind"] == "memory_resumed" and "step 10" in e["message"] and "node b'"'"'s files from node a" in e["message"]' \
    > /dev/null || fail "(b) no memory_resumed event naming node b's files from node a: $(curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -o '"memory_resumed[^}]*')"
wait_for 60 'd["state"] == "completed"' || { show_status; fail "(b) the job did not complete after the resume"; }
echo "(b) $(event_matching 'e["kind"] == "memory_resumed"' | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["message"])')"
kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true

# ---- (g) node b replaced by a hot spare: the spare gets b's files from b's buddy ---------------
cat > "$ITEST_DIR/sp.json" <<JSON
{"name": "repspare", "nodes": 2, "spare_nodes": 1, "max_restarts": 3, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 500, "restart_backoff_ms": 0,
 "memory_checkpoint_mb": 64, "memory_checkpoint_root": "$ROOT", "memory_checkpoint_replica_mbps": 100,
 "rank_cmd": ["$PY", "$ITEST_DIR/save_rank.py", "--steps", "40", "--sleep", "0.1", "--barrier", "$ITEST_DIR/barrier-sp"]}
JSON
mkdir -p "$ITEST_DIR/barrier-sp"
rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
for n in a b; do mv "$ITEST_DIR/agent-$n.log" "$ITEST_DIR/rep-agent-$n.log"; done
start_daemon "$ITEST_DIR/sp.json" --token-file "$ITEST_DIR/token"
agents_ab
wait_for 30 'd["state"] == "running"' || { show_status; fail "(g) the job did not run on a and b"; }
mem_agent s
AGENT_S=$AGENT_PID
wait_for 30 'd["spares"]["ready"] == 1' || { show_status; fail "(g) node s is not a ready spare"; }
wait_for 30 '(((d["memory_checkpoint"] or {}).get("replicas") or {}).get("b") or {}).get("newest") not in (None, "")' \
    || fail "(g) node a holds no copy of node b's: $(status)"
pid=$(rank_pid "$ITEST_DIR/save_rank.py" 1)
[ -n "$pid" ] || fail "(g) no process for rank 1"
kill -9 "$AGENT_B" "$pid"
wait "$AGENT_B" 2>/dev/null || true
wait_log 30 "$ITEST_DIR/agent-s.log" "came back from the buddy" \
    || { show_status; fail "(g) node b's files did not come to the spare from node a"; }
wait_log 30 "$ITEST_DIR/agent-s.log" "rank 1: resumed at step " \
    || fail "(g) the spare's rank 1 did not resume"
grep -q "rank 1: resumed at step [1-9][0-9]* (intact)" "$ITEST_DIR/agent-s.log" \
    || fail "(g) the spare's rank 1 did not resume from b's files intact: $(grep 'rank 1: resumed' "$ITEST_DIR/agent-s.log")"
event_matching 'e["kind"] == "node_replaced" and "node b lost: spare node s took its place" in e["message"]' > /dev/null \
    || fail "(g) no node_replaced event for b and s"
event_matching 'e["kind"] == "memory_resumed" and "node s'"'"'s files from node a" in e["message"]' \
    > /dev/null || fail "(g) no memory_resumed event naming node s's files from node a: $(curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -o '"memory_resumed[^}]*')"
wait_for 60 'd["state"] == "completed"' || { show_status; fail "(g) the job did not complete after the spare took b's place"; }
echo "(g) spare s took node b's place with b's files from a: $(grep -o 'rank 1: resumed at step [0-9]* (intact)' "$ITEST_DIR/agent-s.log")"
kill "$DAEMON_PID" "$AGENT_A" "$AGENT_S" 2>/dev/null || true
wait "$DAEMON_PID" "$AGENT_A" "$AGENT_S" 2>/dev/null || true

# ---- (c) both buddies lost: resumed from the drained durable checkpoint -----------------------
cat > "$ITEST_DIR/dr.json" <<JSON
{"name": "drain", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 5000,
 "lease_ms": 10000, "stop_grace_ms": 500, "restart_backoff_ms": 0,
 "memory_checkpoint_mb": 64, "memory_checkpoint_root": "$ROOT",
 "memory_checkpoint_drain_steps": 10, "checkpoint_dir": "$ITEST_DIR/durable",
 "rank_cmd": ["$PY", "$ITEST_DIR/save_rank.py", "--steps", "400", "--sleep", "0.1", "--barrier", "$ITEST_DIR/barrier-dr"]}
JSON
mkdir -p "$ITEST_DIR/barrier-dr"
rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
for n in a b s; do mv "$ITEST_DIR/agent-$n.log" "$ITEST_DIR/sp-agent-$n.log"; done
start_daemon "$ITEST_DIR/dr.json" --token-file "$ITEST_DIR/token"
agents_ab
DUR=$ITEST_DIR/durable/muster-memory/drain
i=0 # the directories, not status: the loss must come while the ranks are a few steps past step20
until [ -d "$DUR/a/step20" ] && [ -d "$DUR/b/step20" ]; do
    i=$((i + 1)); [ $i -le 600 ] || { show_status; fail "(c) nodes a and b did not both drain step20 to checkpoint_dir"; }
    sleep 0.05
done
p0=$(rank_pid "$ITEST_DIR/save_rank.py" 0)
p1=$(rank_pid "$ITEST_DIR/save_rank.py" 1)
kill -9 "$AGENT_A" "$AGENT_B" $p0 $p1
wait "$AGENT_A" "$AGENT_B" 2>/dev/null || true
event_matching 'e["kind"] == "memory_drained" and "node b drained memory checkpoint step 10 (step10) to checkpoint_dir" in e["message"]' \
    > /dev/null || fail "(c) no memory_drained event for node b's step10: $(curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -o '"memory_drained[^}]*')"
want=$(ls "$DUR/a" "$DUR/b" | grep '^step' | sort | uniq -d | sort -V | tail -n 1) # the newest drained on both
[ -n "$want" ] || fail "(c) nodes a and b hold no drained checkpoint in common: $(ls "$DUR/a" "$DUR/b" | tr '\n' ' ')"
mkdir -p "$DUR/b/.muster-drain-step80/meta" "$DUR/a/step90" # a copy cut short; one drained on a alone
head -c 1000 /dev/zero > "$DUR/b/.muster-drain-step80/rank1.bin"
agents_ab
wait_log 30 "$ITEST_DIR/agent-b.log" "copied back from its drained copy" \
    || { show_status; fail "(c) node b's checkpoint was not copied back from checkpoint_dir"; }
wait_log 30 "$ITEST_DIR/agent-b.log" "rank 1: resumed at step " || fail "(c) rank 1 did not resume"
step=$(awk '/muster-worker [0-9.]*: node b/ { n++ } n == 2 && /^rank 1: resumed at step/ { print $6; exit }' "$ITEST_DIR/agent-b.log")
[ "step$step" = "$want" ] \
    || fail "(c) rank 1's first start after the loss did not resume from $want, the newest drained on both: '$step'"
wait_log 30 "$ITEST_DIR/agent-a.log" "rank 0: resumed at step $step (intact)" \
    || fail "(c) rank 0 did not resume at step $step intact: $(grep 'rank 0: resumed' "$ITEST_DIR/agent-a.log")"
grep -q "rank 1: resumed at step $step (intact)" "$ITEST_DIR/agent-b.log" || fail "(c) rank 1's files were not intact"
event_matching 'e["kind"] == "memory_resumed" and "resumed from the drained durable checkpoint step '"$step"'" in e["message"]' \
    > /dev/null || fail "(c) no memory_resumed event naming the drained durable checkpoint: $(curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -o '"memory_resumed[^}]*')"
check '(d["memory_checkpoint"]["drained"]["a"] or "").startswith("step")' \
    || fail "(c) status names no checkpoint drained on node a: $(status)"
grep -q "1 drain(s) cut short before" "$ITEST_DIR/agent-b.log" || fail "(c) node b's agent did not remove the cut-short drain"
[ ! -e "$DUR/b/.muster-drain-step80" ] || fail "(c) the cut-short drain is still in node b's durable directory"
echo "(c) $(event_matching 'e["kind"] == "memory_resumed"' | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["message"])')"
kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
for n in a b; do mv "$ITEST_DIR/agent-$n.log" "$ITEST_DIR/dr-agent-$n.log"; done

# ---- (f) the tmpfs full: the save fails with ENOSPC, an event names the node and the size -------------
cat > "$ITEST_DIR/full.json" <<JSON
{"name": "full", "nodes": 1, "max_restarts": 2, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "stop_grace_ms": 500, "restart_backoff_ms": 0,
 "memory_checkpoint_mb": 8, "memory_checkpoint_root": "$ROOT",
 "rank_cmd": ["$PY", "$ITEST_DIR/save_rank.py", "--steps", "20", "--sleep", "0.05", "--mib", "5"]}
JSON
rm -rf "$ITEST_DIR/state"
start_daemon "$ITEST_DIR/full.json" --token-file "$ITEST_DIR/token"
mem_agent f
wait_log 30 "$ITEST_DIR/agent-f.log" "No space left on device" \
    || fail "(f) the rank's save of 10 MiB into 8 MiB did not fail with ENOSPC"
wait_event_matching 10 'e["kind"] == "node_error" and "memory_checkpoint_full" in e["message"] and "on node f is full: " in e["message"] and " of 8 MiB used" in e["message"]' \
    || fail "(f) no event names node f's full memory checkpoint directory and its size: $(curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -o '"node_error[^}]*')"
echo "(f) $(event_matching 'e["kind"] == "node_error"' | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["message"])' | cut -c1-160)"
echo "memckpt_buddy: ok"
