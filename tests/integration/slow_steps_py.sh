#!/bin/sh
# A rank program whose steps take longer than the agent's quiet window
# (1.5 s) beats once a step, as PROTOCOL.md's rank contract tells it to
# (the Python client sends only when there is something new): here 8 s. The agent
# learns that cadence from the gaps between its frames and keeps relaying
# its latest entry between beats: the rank is not shown stale in
# /v1/ranks, its node not "stale" in /v1/nodes, while it steps.
# itest: solo
set -eu
. tests/itest-lib.sh

PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/clients/python"

cat > "$ITEST_DIR/rank.py" <<'PY'
import time
import muster_rank

rank = muster_rank.connect()
for step in range(1, 200):
    rank.beat(step, loss=1.0 / step, tokens_per_s=100.0)
    time.sleep(8.0)  # one long step
    if rank.stop_requested:
        break
PY

# stale after heartbeat_timeout_ms / 2 = 2 s without an entry for the rank
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "slowsteps", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 100,
 "heartbeat_timeout_ms": 4000, "stop_grace_ms": 500, "progress_timeout_ms": 30000}
JSON
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$PY $ITEST_DIR/rank.py"
wait_for 40 'd["generation"] == 1 and all(r["step"] >= 2 for r in d["ranks"])' \
    || { show_status; fail "python ranks did not report step 2"; }
# Samples over two steps: REST rebuilds its snapshot at least every 5 s,
# so a rank left out of the heartbeats shows its age within a step.
$ITEST_POLL always "$HTTP" '(not any(r["stale"] for r in d["ranks"]) and all(r["heartbeat_age_ms"] < 2000 for r in d["ranks"])
           and node["a"]["health"] == "ok" and node["a"]["heartbeat_age_ms"] < 2000)' 17 0.5 \
    || { show_status; curl -sf "http://127.0.0.1:$HTTP/v1/nodes"
         fail "a rank that beats once an 8 s step, or its node, is shown stale between its beats"; }
check 'all(r["step"] >= 3 for r in d["ranks"]) and d["state"] == "running"' \
    || { show_status; fail "the ranks did not go on stepping"; }
echo "slow_steps_py: ranks beating once an 8 s step, and their node, never stale over 17 s"
echo "slow_steps_py: ok"
