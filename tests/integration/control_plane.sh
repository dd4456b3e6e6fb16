#!/bin/sh
# The control plane end to end on loopback: musterd + 2 agents x 2 fake
# ranks form generation 1; a SIGKILLed rank brings generation 2; a wrong
# token is refused without disturbing the job; a SIGKILLed agent loses its
# ranks within the lease, its node is marked lost, and the job comes back
# when the agent returns.
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "itest", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 1500, "lease_ms": 3000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
make_token "$ITEST_DIR/wrong-token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"

start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
check 'd["state"] == "waiting" and d["generation"] == 0' || fail "fresh daemon is not waiting"

start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
AGENT_A=$AGENT_PID
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
AGENT_B=$AGENT_PID

wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 4 and d["world_size"] == 4' \
    || fail "generation 1 not running with 4 ranks"
check '[r["node"] for r in d["ranks"]] == ["a", "a", "b", "b"] and [r["local_rank"] for r in d["ranks"]] == [0, 1, 0, 1]' \
    || fail "ranks not contiguous per node"
wait_for 5 'all(r["step"] > 0 and r["heartbeat_age_ms"] is not None for r in d["ranks"])' \
    || fail "ranks do not report steps"
echo "generation 1 running"; show_status

# A rank dies: the job goes on in generation 2 with every rank back.
victim=$(cat "$ITEST_DIR/pids-b/rank-3.pid")
kill -9 "$victim"
wait_for 20 'd["state"] == "running" and d["generation"] == 2 and running == 4 and d["restarts"] == 1' \
    || fail "no generation 2 after SIGKILL of rank 3"
wait_event 5 'rank 3 on node b was killed by signal 9' \
    || fail "events do not name the killed rank"
echo "generation 2 running after SIGKILL of rank 3"

# An agent with the wrong token cannot verify musterd's proof: it acts on
# nothing, says why and keeps trying (it cannot tell a musterd of another
# token from a stranger); musterd records auth_failed; the job is unaffected.
"$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node c --devices cpu:1 \
    --token-file "$ITEST_DIR/wrong-token" --rank-cmd "$RANK_CMD" > "$ITEST_DIR/agent-c.log" 2>&1 &
AGENT_C=$!
wait_event 5 'auth_failed' || fail "no auth_failed event"
kill -0 "$AGENT_C" 2>/dev/null || fail "agent with a wrong token exited: $(tail -3 "$ITEST_DIR/agent-c.log")"
kill "$AGENT_C"
wait "$AGENT_C" 2>/dev/null || true
grep -q 'does not prove the cluster token' "$ITEST_DIR/agent-c.log" || fail "agent log does not say the proof failed"
check 'd["state"] == "running" and d["generation"] == 2 and running == 4' || fail "wrong token disturbed the job"
echo "wrong token refused; job unaffected"

# SIGKILL agent b: its ranks go within the lease, the node is lost, the job
# waits; agent b returns and the job runs again in a new generation.
b_ranks="$(cat "$ITEST_DIR/pids-b/rank-2.pid") $(cat "$ITEST_DIR/pids-b/rank-3.pid")"
rm -f "$ITEST_DIR"/pids-b/*.pid
kill -9 "$AGENT_B"
wait_for 5 'node["b"]["state"] == "lost" and d["state"] == "recovering"' || fail "node b not marked lost"
i=0
for p in $b_ranks; do
    while pid_alive "$p" && [ $i -lt 80 ]; do sleep 0.05; i=$((i + 1)); done
    pid_alive "$p" && fail "rank process $p of the killed agent still alive after the lease"
done
echo "agent b killed: node lost, its ranks gone"
check 'd["generation"] == 3' || fail "expected generation 3 while node b is away"
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 20 'd["state"] == "running" and d["generation"] == 3 and running == 4 and node["b"]["state"] == "joined"' \
    || fail "job did not come back after agent b returned"
check '[r["node"] for r in d["ranks"]] == ["a", "a", "b", "b"]' || fail "node b did not get its rank block back"
echo "agent b back: generation 3 running"; show_status

# Clean shutdown: SIGTERM, every handle closed, exit 0.
kill -TERM "$DAEMON_PID"
i=0
while pid_alive "$DAEMON_PID" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
pid_alive "$DAEMON_PID" && fail "musterd did not exit within 5 s of SIGTERM"
wait "$DAEMON_PID" || fail "musterd exited non-zero after SIGTERM"
grep -q 'stopped cleanly' "$ITEST_DIR/musterd.log" || fail "musterd did not report a clean loop close"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["generation"] == 3 and d["restarts"] == 2, d' \
    "$ITEST_DIR/state/musterd.state.json" || fail "state file does not hold generation 3, 2 restarts"
echo "control plane: ok"
