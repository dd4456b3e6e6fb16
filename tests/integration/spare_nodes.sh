#!/bin/sh
# Hot spare nodes (job key spare_nodes, docs/spares.md): musterd and three
# agents of 2 muster-train ranks each for a 2-node job with spare_nodes 1.
#   - the third agent (s, of b's domain) joins as a spare: /v1/nodes shows it
#     spare, fit, without ranks; /v1/status counts it ready;
#   - agent b SIGKILLed with its ranks: the spare takes b's rank block and
#     node rank in the next generation at once (generation 2, or 3 should a
#     generation opened by its ranks' deaths be assigned before b's loss
#     breaks it; rejoin_timeout_ms is 60 s:
#     the job runs on, at world size 4, long before it), node a's ranks keep
#     their processes, the state comes from peers' memory at a step no older
#     than the one made before the kill (no completed step lost), and the
#     event says "node b lost: spare node s took its place (node rank 1 ...";
#   - musterd SIGKILLed and started again on its state directory: the
#     committed state keeps s as the member holding ranks 2-3 and the last
#     replacement, and the job goes on in that generation;
#   - agent b started again: it is the new spare, and the job completes.
set -eu
. tests/itest-lib.sh

need_data
make_token "$ITEST_DIR/token"
STEPS=80 # the job must still run when musterd is killed and b comes back (seen done at 40 on a loaded machine)

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "spares", "nodes": 2, "spare_nodes": 1, "max_restarts": 3, "model": "small", "data": "$DATA",
 "steps": $STEPS, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 50, "heartbeat_timeout_ms": 3000, "restart_backoff_ms": 0,
 "rejoin_timeout_ms": 60000, "min_nodes": 1}
JSON

agent() { # NAME DOMAIN
    start_agent "$1" 2 --token-file "$ITEST_DIR/token" --domain "$2" \
        --rank-cmd "$BUILD/muster-train --threads 1 --metrics $ITEST_DIR/train.metrics"
}

node_says() { # NAME PYEXPR on /v1/nodes' entry n of node NAME
    curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/nodes" | python3 -c '
import json, sys
n = [n for n in json.load(sys.stdin)["nodes"] if n["name"] == sys.argv[1]]
sys.exit(0 if n and eval(sys.argv[2], {}, {"n": n[0]}) else 1)' "$1" "$2"
}

wait_node() { # SECONDS NAME PYEXPR
    _i=0
    while [ $_i -lt $(( $1 * 10 )) ]; do
        node_says "$2" "$3" && return 0
        sleep 0.1; _i=$((_i + 1))
    done
    return 1
}

job_step() { status | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"] or 0)'; }

start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
agent a r1
A=$AGENT_PID
agent b r2
B=$AGENT_PID
wait_for 60 'd["state"] in ("forming", "running")' || { show_status; fail "the job did not form with a and b"; }
agent s r2
S=$AGENT_PID
wait_node 30 s 'n["role"] == "spare" and n["fit"] == "fit" and n["ranks"] == [] and n["domain"] == "r2"' \
    || fail "node s is not shown as a ready spare: $(curl -sf "http://127.0.0.1:$HTTP/v1/nodes")"
check 'd["spares"]["ready"] == 1 and d["spares"]["wanted"] == 1' || fail "/v1/status does not count the ready spare"
echo "node s joined as a ready spare"

wait_for 120 'd["state"] == "running" and (d["step"] or 0) >= 12' || fail "not at step 12 in 120 s"
before_a=$(ranks_of "$A")
[ -n "$before_a" ] || fail "no ranks under agent a"
at=$(job_step)
t0=$(now_ms)
ranks_b=$(ranks_of "$B")
kill -9 "$B" $ranks_b # the agent with its ranks, so that it tells nothing of their deaths
echo "SIGKILLed agent b and its ranks at step $at"
wait_for 30 'd["state"] == "running" and d["generation"] >= 2 and d["world_size"] == 4' \
    || { show_status; fail "the job did not run again at world size 4 within 30 s"; }
t1=$(now_ms)
G=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
echo "running again at world size 4, $((t1 - t0)) ms after the kill"
node_says s 'n["role"] == "member" and n["ranks"] == [2, 3]' || fail "node s does not hold b's ranks 2-3"
event_matching 'e["kind"] == "node_replaced" and "node b lost: spare node s took its place (node rank 1, ranks 2-3, domain r2)" in e["message"]' \
    > /dev/null || fail "no node_replaced event naming b, s and node rank 1: $(curl -sf "http://127.0.0.1:$HTTP/v1/events")"
check 'd["spares"]["last_replacement"]["lost"] == "b" and d["spares"]["last_replacement"]["spare"] == "s"' \
    || fail "/v1/status does not show the last replacement"
curl -sf "http://127.0.0.1:$HTTP/metrics" | grep -qx 'muster_spare_replacements_total 1' \
    || fail "/metrics does not count the replacement: $(curl -sf "http://127.0.0.1:$HTTP/metrics" | grep spare)"

kill -9 "$DAEMON_PID"
"$BUILD/musterd" --job "$ITEST_DIR/job.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" \
    --state-dir "$ITEST_DIR/state" --token-file "$ITEST_DIR/token" >> "$ITEST_DIR/musterd.log" 2>&1 &
DAEMON_PID=$!
ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
wait_for 30 'd["state"] in ("running", "completed") and d["generation"] == '"$G"' and d["spares"]["last_replacement"] is not None and d["spares"]["last_replacement"]["spare"] == "s"' \
    || { show_status; fail "the restarted musterd lost the replacement"; }
node_says s 'n["role"] == "member" and n["ranks"] == [2, 3]' || fail "after the restart node s does not hold ranks 2-3"
echo "musterd restarted: s still holds ranks 2-3, the last replacement kept"

agent b r2
B=$AGENT_PID
wait_node 30 b 'n["role"] == "spare" and n["ranks"] == []' || fail "node b, back, is not the new spare"
echo "node b came back as the spare"

wait_for 240 'd["state"] == "completed"' || { show_status; fail "did not complete in 240 s"; }
curl -sf "http://127.0.0.1:$HTTP/v1/events" > "$ITEST_DIR/events"
! event_matching 'e["kind"] == "job_shrunk"' "$ITEST_DIR/events" > /dev/null || fail "the job shrank"
for p in $before_a; do
    grep -q "(pid $p, generation $G) exited with status 0" "$ITEST_DIR/agent-a.log" \
        || fail "node a's rank (pid $p) did not finish generation $G: it was restarted"
done
said=$(grep -o "generation $G resumed at step [0-9]* from memory" "$ITEST_DIR/events" | head -n 1 | cut -d' ' -f6)
[ -n "$said" ] || fail "no restore from memory in generation $G: $(cat "$ITEST_DIR/events")"
[ "$said" -ge "$at" ] || fail "generation $G resumed at step $said, older than step $at made before the kill"
echo "generation $G resumed at step $said from peers' memory (step $at before the kill); node a's ranks $before_a kept"
kill "$DAEMON_PID" "$A" "$B" "$S" 2>/dev/null || true
echo "spare nodes: ok"
