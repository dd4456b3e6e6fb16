#!/bin/sh
# slow_policy swap (issue 36 item 3): a node found slow is swapped for a hot
# spare at a step boundary, with no code change in the program. A PyTorch DDP
# program healing in place through muster_rank.Elastic (tests/torch/ddp_train.py
# --elastic), 2 agents x 2 ranks and a spare agent s, the job's
# slow_policy "swap" with slow_swap_after_s 1 and max_restarts 0 (a swap must
# spend none). Rank 3 is slow from step 10 while it runs on node b
# (--slow-node b: the node is slow, not the program):
#  - the hook's time splits name rank 3 on node b slow (rank_slow);
#  - a second later the ranks leave their generation at a step boundary
#    (node_swapping), the spare takes node b's rank block in the next
#    generation (node_replaced "node b slow: spare node s took its place"),
#    world size 4, no restart spent; ranks 0-1 keep their processes; node b's
#    ranks stop and node b is the spare;
#  - rank 3, on node s now, is not slow: nothing is named again, and rank 0
#    logs steps 1..STEPS once each (no step lost, none redone).
set -eu
. tests/itest-lib.sh

need_torch torch_slow_swap torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
STEPS=90
make_token "$ITEST_DIR/token"

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "slowswap", "nodes": 2, "spare_nodes": 1, "slow_policy": "swap", "slow_swap_after_s": 1,
 "max_restarts": 0, "batch": 4, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 4000, "lease_ms": 8000,
 "stop_grace_ms": 1000,
 "rank_cmd": ["$PY", "$SCRIPT", "--elastic", "--steps", "$STEPS", "--width", "16", "--batch", "8",
              "--step-sleep", "0.05", "--slow-rank", "3", "--slow-node", "b", "--slow-frac", "0.6",
              "--slow-from", "10", "--final-file", "$ITEST_DIR/run.final", "--ckpt-dir", "$ITEST_DIR/run"]}
JSON

start_pair_job "$ITEST_DIR/job.json"
A=$AGENT_A
B=$AGENT_B
wait_for 60 'd["state"] in ("forming", "running")' || { show_status; fail "the job did not form with a and b"; }
start_agent s 2 --token-file "$ITEST_DIR/token"
S=$AGENT_PID
wait_for 30 'd["spares"]["ready"] == 1' || { show_status; fail "node s is not a ready spare"; }
wait_for 60 'd["state"] == "running" and running == 4' || { show_status; fail "the job is not running"; }
rank_pids run > "$ITEST_DIR/pids-before"

wait_for 120 'd["state"] in ("running", "completed") and d["spares"]["replacements"] == 1' \
    || { show_status; fail "node b was not swapped for the spare within 120 s"; }
slow=$(event_matching 'e["kind"] == "rank_slow"') || fail "no rank_slow event"
echo "$slow" | grep -q "rank 3 on node b is slow: computes " || fail "the slow rank named is not rank 3 on node b: $slow"
event_matching 'e["kind"] == "node_swapping" and "rank 3 on node b was slow for" in e["message"]' > /dev/null \
    || fail "no node_swapping event for rank 3 on node b"
swap=$(event_matching 'e["kind"] == "node_replaced"')
echo "$swap" | grep -q "node b slow: spare node s took its place (node rank 1, ranks 2-3)" \
    || fail "the replacement does not say node b was slow and s took its place: $swap"
echo "swapped: $(echo "$slow" | head -n 1 | cut -c1-120) ..."
wait_for 120 'd["state"] == "completed"' || { show_status; fail "the job did not complete after the swap"; }
check 'd["restarts"] == 0 and d["world_size"] == 4' || { show_status; fail "the swap spent a restart or changed the world"; }
G=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
for r in 0 1; do
    before=$(sed -n "s/^$r //p" "$ITEST_DIR/pids-before")
    grep -q "rank $r (pid $before) rejoins in place for generation $G" "$ITEST_DIR/agent-a.log" \
        || fail "rank $r (pid $before) did not keep its process"
done
grep -q "generation $G: rank [23] of 4, training from step [0-9]* (state from rank [01])" "$ITEST_DIR/agent-s.log" \
    || fail "the spare's ranks did not get their state from a peer"
curl -sf "http://127.0.0.1:$HTTP/v1/nodes" | python3 -c '
import json, sys
n = [n for n in json.load(sys.stdin)["nodes"] if n["name"] == "b"][0]
assert n["role"] == "spare" and n["ranks"] == [], n' || fail "node b is not the spare after the swap"
[ "$(event_matching 'e["kind"] == "rank_slow"' | wc -l)" -eq 1 ] || fail "a rank was named slow again after the swap"
rank_steps "$ITEST_DIR/agent-a.log" 0 > "$ITEST_DIR/run.steps"
why=$(same_steps $STEPS "$ITEST_DIR/run.steps" "$ITEST_DIR/run.steps" 2>&1) \
    || fail "rank 0 did not log steps 1..$STEPS once each: $why"
kill "$DAEMON_PID" "$A" "$B" "$S" 2>/dev/null || true
echo "torch slow swap: ok"
