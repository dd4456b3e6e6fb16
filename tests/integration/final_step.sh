#!/bin/sh
# A completed job shows its last step: 2 agents x 1 muster-train rank train
# 37 steps with a heartbeat interval (1 s) far longer than a step, so the
# periodic relay alone would leave the daemon at an earlier step. Each rank
# sends its final beat before it exits, and the agent relays a rank's last
# entry before its exit: /v1/status says step 37 and the events say
# "finished at step 37" for both ranks.
set -eu
. tests/itest-lib.sh

need_data
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "final", "nodes": 2, "model": "small", "data": "$DATA",
 "steps": 37, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 1000, "heartbeat_timeout_ms": 5000}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
RANK_CMD="$BUILD/muster-train --threads 1"
start_agent a 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
start_agent b 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 240 'd["state"] == "completed"' || { show_status; fail "the job did not complete within 240 s"; }
check 'd["step"] == 37' || { show_status; fail "completed job shows step $(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])'), not 37"; }
n=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -o 'finished at step [0-9]*' | sort | uniq -c | tr -s ' ')
echo "events:$n"
[ "$(echo "$n" | grep -c 'finished at step 37')" -eq 1 ] && echo "$n" | grep -q '^ *2 finished at step 37' ||
    fail "expected both ranks to finish at step 37, events say:$n"
echo "final_step: ok (step 37 shown, both ranks finished at step 37)"
