#!/bin/sh
# A PyTorch DDP program whose world changes size under muster, through the
# Python client's Elastic API (tests/torch/ddp_train.py --elastic, each
# step's global batch of 32 split over the ranks of the moment), musterd +
# 2 agents x 2 ranks on loopback:
#  (a) shrink and grow: agent b is SIGKILLed with its ranks and stays away;
#      after rejoin_timeout_ms the job shrinks to node a's 2 ranks, which
#      keep their processes; agent b comes back: node a's ranks leave their
#      generation together at a step boundary (COMMAND yield, no generation
#      breaks), the job grows to 4, b's new ranks get the state from one of
#      a's; the job completes with node a's first processes, loss falling;
#  (b) then agent b is SIGKILLed with its ranks and started again: its ranks
#      are replaced and get the state from a peer, node a's keep their PIDs,
#      the job completes;
#  (c) a hung peer (2 agents x 1 rank): rank 1 spins in its own code;
#      muster's hang detection names it and parks the generation; Elastic
#      interrupts rank 1's step, so its peer's collective ends: both ranks
#      keep their processes to the end of the job.
# itest: background
set -eu
. tests/itest-lib.sh

need_torch torch_elastic_world torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
make_token "$ITEST_DIR/token"

# run_job NAME STEPS JOBKEYS [ARGS [RANKS]]: musterd and agents a and b of RANKS ranks each (2)
# (AGENT_A, AGENT_B) on the job.
run_job() {
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 4, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "stop_grace_ms": 1000, "restart_backoff_ms": 0, $3
 "rank_cmd": ["$PY", "$SCRIPT", "--elastic", "--steps", "$2", "--step-sleep", "0.05", "--global-batch", "32",
              "--final-file", "$ITEST_DIR/$1.final", "--timing-file", "$ITEST_DIR/$1.timing" ${4:-}]}
JSON
    rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state" "$ITEST_DIR"/agent-?.log
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token"
    start_agent a "${5:-2}" --token-file "$ITEST_DIR/token"
    AGENT_A=$AGENT_PID
    start_agent b "${5:-2}" --token-file "$ITEST_DIR/token"
    AGENT_B=$AGENT_PID
}
end_job() {
    kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    for f in "$ITEST_DIR"/agent-?.log "$ITEST_DIR/musterd.log"; do mv "$f" "$f.$1" 2>/dev/null || true; done
}
ranks_of_agent() { pgrep -P "$1" -f "$SCRIPT" | sort -n | tr '\n' ' '; }
kill_agent_b() { # agent b and its ranks, SIGKILL (the ranks first: orphans would outlive it)
    pkill -9 -P "$AGENT_B" -f "$SCRIPT" 2>/dev/null || true
    kill -9 "$AGENT_B"
    wait "$AGENT_B" 2>/dev/null || true
}
# logs_of NODE: every output log of NODE's ranks.
logs_of() { find "$ITEST_DIR/agent-state" -path "*$1*" -name output.log; }
# wait_logs SECONDS NODE PATTERN: a line matching PATTERN in an output log of NODE's ranks (polls every 100 ms).
wait_logs() {
    i=0
    while [ $i -lt $(( $1 * 10 )) ]; do
        grep -q "$3" $(logs_of "$2") 2>/dev/null && return 0
        sleep 0.1; i=$((i + 1))
    done
    return 1
}
step_of() { status | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"] or 0)'; }

# ---- (a) shrink 4 -> 2, grow 2 -> 4, then (b)
STEPS=300
run_job world $STEPS '"min_nodes": 1, "rejoin_timeout_ms": 1500,'
wait_for 90 'd["state"] == "running" and (d["step"] or 0) >= 10' || fail "(a) not running at step 10"
pids_a=$(ranks_of_agent "$AGENT_A")
need_pids "(a) node a" 2 "$pids_a"
kill_agent_b
echo "(a) SIGKILLed agent b and its ranks at step $(step_of)"
wait_for 30 'd["world_size"] == 2 and d["state"] == "running"' || { show_status; fail "(a) did not shrink to 2 ranks"; }
at=$(step_of)
wait_for 30 "d['world_size'] == 2 and (d['step'] or 0) >= $at + 5" || { show_status; fail "(a) the world of 2 does not train"; }
[ "$(ranks_of_agent "$AGENT_A")" = "$pids_a" ] || fail "(a) node a's ranks were restarted by the shrink"
wait_logs 10 /a/ "rank [01] of 2, training from step" || fail "(a) node a's ranks did not re-form as a world of 2"
echo "(a) shrank to 2 ranks in the same processes ($pids_a), trains on at step $(step_of)"

start_agent b 2 --token-file "$ITEST_DIR/token"
AGENT_B=$AGENT_PID
wait_for 60 'd["world_size"] == 4 and d["state"] in ("running", "completed")' || { show_status; fail "(a) did not grow to 4"; }
curl -sf "http://127.0.0.1:$HTTP/v1/events" > "$ITEST_DIR/world.events" || fail "(a) no events"
grep -q '"job_growing"' "$ITEST_DIR/world.events" || fail "(a) no job_growing event: the ranks were not asked to yield"
grep -q '"job_grew"' "$ITEST_DIR/world.events" || fail "(a) no job_grew event"
! grep -q '"grow_unyielded"' "$ITEST_DIR/world.events" || fail "(a) the ranks did not leave at a step boundary in time"
left=$(cat $(logs_of /a/) | grep -o "left at the boundary of step [0-9]*" | tail -n 1 | awk '{print $NF}')
[ -n "$left" ] || fail "(a) node a's ranks did not leave their generation at a step boundary"
wait_logs 60 /b/ "rank [23] of 4, training from step $left (state from rank [01])" \
    || fail "(a) b's new ranks did not get the state of step $left from node a's"
grew=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
echo "(a) grew to 4 at the boundary of step $left (generation $grew), b's ranks from a's state"

# (b) a whole agent killed and started again: its ranks are replaced, node a's stay
at=$(step_of)
old_b=$(ranks_of_agent "$AGENT_B")
need_pids "(b) node b before its agent is killed" 2 "$old_b"
kill_agent_b
start_agent b 2 --token-file "$ITEST_DIR/token"
AGENT_B=$AGENT_PID
echo "(b) SIGKILLed agent b and its ranks at step $at, started it again"
wait_for 60 "d['generation'] > $grew and d['world_size'] == 4 and d['state'] in ('running', 'completed')" \
    || { show_status; fail "(b) no generation of 4 ranks after agent b came back"; }
i=0
until sed -n 's/.*generation \([0-9]*\): rank [23] of 4, training from step [0-9]* (state from rank [01]).*/\1/p' \
        $(logs_of /b/) 2>/dev/null | awk -v g=$grew '$1 > g' | grep -q .; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "(b) b's new ranks did not get the state from node a's"; sleep 0.1
done
# the new agent b's ranks: new processes, and the ones that finish the job
new_b=$(ranks_of_agent "$AGENT_B")
need_pids "(b) node b after its agent came back" 2 "$new_b"
for p in $new_b; do case " $old_b " in *" $p "*) fail "(b) b's rank $p survived its agent's SIGKILL";; esac; done
wait_for 120 'd["state"] == "completed"' || { show_status; fail "(a, b) did not complete"; }
gen=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
kept_pids "$ITEST_DIR/agent-a.log" "$pids_a" "$gen"
kept_pids "$ITEST_DIR/agent-b.log" "$new_b" "$gen"
# rank 0's loss (of its share of the global batch) over the first and the last
# 10 steps, from agent a's log (the agent keeps the rank directories, output
# logs included, of the last 5 generations only, and this job may have had 6)
first=$(sed -n 's/^rank 0: //p' "$ITEST_DIR/agent-a.log" | grep "^step [0-9]* loss" |
    awk '$2 <= 10 { s += $4; n++ } END { if (n) print s / n }')
last=$(sed -n 's/^rank 0: //p' "$ITEST_DIR/agent-a.log" | grep "^step [0-9]* loss" |
    awk -v t=$STEPS '$2 > t - 10 { s += $4; n++ } END { if (n) print s / n }')
[ -n "$first" ] && [ -n "$last" ] || fail "(a) no first or last losses in rank 0's log"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 2) }' || fail "(a) the loss did not fall: $first -> $last"
echo "(b) agent b's ranks replaced with a peer's state; node a's processes ($pids_a) finished generation $gen; loss $first -> $last"
end_job world

# ---- (c) a hung peer
STEPS=60
run_job hang $STEPS '"rejoin_timeout_ms": 30000, "progress_timeout_ms": 10000,' ', "--spin-at-step", "20", "--spin-rank", "1"' 1
wait_for 90 'd["state"] == "running" and (d["step"] or 0) >= 5' || fail "(c) not running at step 5"
pids_a=$(ranks_of_agent "$AGENT_A")
pids_b=$(ranks_of_agent "$AGENT_B")
need_pids "(c) node a" 1 "$pids_a"
need_pids "(c) node b" 1 "$pids_b"
wait_event_matching 60 'e["kind"] == "rank_hung"' || { show_status; fail "(c) the spinning rank 1 was not found hung"; }
hung=$(event_matching 'e["kind"] == "rank_hung"')
event_matching 'e["kind"] == "rank_hung" and e["rank"] == 1 and e["node"] == "b"' > /dev/null \
    && ! event_matching 'e["kind"] == "rank_hung" and e["rank"] != 1' > /dev/null \
    || fail "(c) the hung rank named is not rank 1 of node b alone: $hung"
# (60 steps: the job may be over by the time a status is read; rank 0's own log says it went on)
wait_for 30 'd["generation"] >= 2 and d["state"] in ("running", "completed")' \
    || { show_status; fail "(c) no generation 2 after the hang"; }
wait_logs 30 /a/ "^step 22 loss" || { show_status; fail "(c) the job did not go on after the hang"; }
# (the job may be over by now: the agents' logs say it, not the live processes)
grep -q "rank 0 (pid $(echo $pids_a)) rejoins in place for generation 2" "$ITEST_DIR/agent-a.log" &&
    grep -q "rank 1 (pid $(echo $pids_b)) rejoins in place for generation 2" "$ITEST_DIR/agent-b.log" \
    || fail "(c) a rank was restarted: $(grep -h 'started rank\|rejoins in place' "$ITEST_DIR"/agent-?.log)"
grep -q "rank 1 has not left it (.*spin_for_ever.*): closing its connections, interrupting its step" $(logs_of /b/) \
    || fail "(c) rank 1 was not interrupted in its step"
# Step 21 hangs for the progress timeout (10 s), then is done in place:
# not sooner (nothing was named early), and within 10 s of it.
python3 - "$ITEST_DIR/hang.timing" <<'PY' || fail "(c) the hang's time to resume is out of bounds"
import sys
steps = [l.split() for l in open(sys.argv[1]) if l.startswith("step ")]
t20 = max(float(s[5]) for s in steps if int(s[4]) == 20)
t21 = max(float(s[5]) for s in steps if int(s[4]) == 21)
print("(c) hung at step 21 -> step 21 done on every rank: %.2f s (progress_timeout_ms 10000, bounds 9.5-20 s)"
      % (t21 - t20))
sys.exit(0 if 9.5 <= t21 - t20 <= 20 else 1)
PY
echo "(c) the hung rank 1 was interrupted in place: both ranks kept their processes"

wait_for 60 'd["state"] == "completed"' || { show_status; fail "(c) did not complete"; }
gen=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
kept_pids "$ITEST_DIR/agent-a.log" "$pids_a" "$gen"
kept_pids "$ITEST_DIR/agent-b.log" "$pids_b" "$gen"
echo "(c) the job completed with the same 2 processes"
end_job hang
echo "torch_elastic_world: ok"
