#!/bin/sh
# Hot spare nodes (job key spare_nodes) under a PyTorch DDP program that heals
# in place through muster_rank.Elastic (tests/torch/ddp_train.py --elastic):
# musterd and three agents of 2 ranks for a 2-node job with spare_nodes 1.
# The third agent (s) joins as a spare, shown spare and fit, and starts its
# warm spare process (warm_spares 1) before it holds ranks; agent b is
# SIGKILLed with its ranks mid-run: the spare takes b's ranks 2-3 in
# the next generation at world size 4, with no rejoin_timeout_ms wait (60 s) and no
# shrink; ranks 0 and 1 rejoin in place with their processes; the spare's
# ranks take their state from a peer, one of them in the spare node's warm
# spare process; rank 0 logs steps 1..STEPS once each
# (no completed step lost, none redone). Agent b started again is a spare.
set -eu
. tests/itest-lib.sh

need_torch torch_spare_nodes torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
STEPS=40
make_token "$ITEST_DIR/token"

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "tspares", "nodes": 2, "spare_nodes": 1, "max_restarts": 4, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 1000, "rejoin_timeout_ms": 60000, "min_nodes": 1, "warm_spares": 1,
 "rank_cmd": ["$PY", "$SCRIPT", "--elastic", "--steps", "$STEPS", "--step-sleep", "0.1",
              "--final-file", "$ITEST_DIR/run.final", "--ckpt-dir", "$ITEST_DIR/run"]}
JSON

start_pair_job "$ITEST_DIR/job.json"
A=$AGENT_A
B=$AGENT_B
wait_for 60 'd["state"] in ("forming", "running")' || { show_status; fail "the job did not form with a and b"; }
start_agent s 2 --token-file "$ITEST_DIR/token"
S=$AGENT_PID
wait_for 30 'd["spares"]["ready"] == 1' || { show_status; fail "node s is not a ready spare"; }
curl -sf "http://127.0.0.1:$HTTP/v1/nodes" | python3 -c '
import json, sys
n = [n for n in json.load(sys.stdin)["nodes"] if n["name"] == "s"][0]
assert n["role"] == "spare" and n["ranks"] == [] and n["fit"] == "fit", n' || fail "node s is not shown as a spare"

wait_for 120 'd["state"] == "running" and all((r["step"] or 0) >= 15 for r in d["ranks"])' \
    || fail "the job does not reach step 15"
rank_pids run > "$ITEST_DIR/pids-before"
[ "$(wc -l < "$ITEST_DIR/pids-before")" -eq 4 ] || fail "expected 4 rank processes: $(cat "$ITEST_DIR/pids-before")"
kill -9 "$B" "$(sed -n 's/^2 //p' "$ITEST_DIR/pids-before")" "$(sed -n 's/^3 //p' "$ITEST_DIR/pids-before")"
echo "SIGKILLed agent b and its ranks 2-3"
wait_for 30 'd["generation"] >= 2 and d["state"] == "running" and d["world_size"] == 4' \
    || { show_status; fail "no generation after the kill is running at world size 4"; }
G=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])') # 2, or 3 (see spare_nodes.sh)
event_matching 'e["kind"] == "node_replaced" and "node b lost: spare node s took its place (node rank 1, ranks 2-3)" in e["message"]' \
    > /dev/null || fail "no node_replaced event naming b, s and node rank 1"
for r in 0 1; do
    before=$(sed -n "s/^$r //p" "$ITEST_DIR/pids-before")
    grep -q "rank $r (pid $before) rejoins in place for generation $G" "$ITEST_DIR/agent-a.log" \
        || fail "rank $r (pid $before) did not keep its process"
done
start_agent b 2 --token-file "$ITEST_DIR/token"
B=$AGENT_PID
wait_for 120 'd["state"] == "completed"' || { show_status; fail "the healed job did not complete"; }
grep -q "generation $G: rank [23] of 4, training from step [0-9]* (state from rank [01])" "$ITEST_DIR/agent-s.log" \
    || fail "the spare's ranks did not get their state from a peer"
grep -q "started rank [23] (.*) for generation $G: the warm spare took it up" "$ITEST_DIR/agent-s.log" \
    || fail "no rank of the spare node started in its warm spare process: $(grep 'started rank' "$ITEST_DIR/agent-s.log")"
curl -sf "http://127.0.0.1:$HTTP/v1/nodes" | python3 -c '
import json, sys
n = [n for n in json.load(sys.stdin)["nodes"] if n["name"] == "b"][0]
assert n["role"] == "spare" and n["ranks"] == [], n' || fail "node b, back, is not the new spare"
! event_matching 'e["kind"] == "job_shrunk"' > /dev/null || fail "the job shrank"
rank_steps "$ITEST_DIR/agent-a.log" 0 > "$ITEST_DIR/run.steps"
why=$(same_steps $STEPS "$ITEST_DIR/run.steps" "$ITEST_DIR/run.steps" 2>&1) \
    || fail "rank 0 did not log steps 1..$STEPS once each: $why"
kill "$DAEMON_PID" "$A" "$B" "$S" 2>/dev/null || true
echo "torch spare nodes: ok"
