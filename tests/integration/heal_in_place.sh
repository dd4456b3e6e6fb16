#!/bin/sh
# Healing in place (docs/training.md): 2 agents x 2 muster-train ranks train
# the small model under musterd. Against an uninterrupted run's final loss,
# bit for bit:
#   1. one rank SIGKILLed: the three survivors keep their processes (same
#      PIDs to the end), only the dead rank is started again, its shard comes
#      from its holder's memory (event state_restored), no rank dies of a
#      signal nobody sent;
#   2. a whole agent SIGKILLed with its ranks and started again (as systemd
#      would): both of its ranks' shards come back from the other node;
#   3. a rank and the rank holding its replica SIGKILLed together: the job
#      falls back to the last committed checkpoint, and the event says so;
#   4. a rank SIGKILLed as the job ends (the others have finished): the job
#      still completes;
#   5. a rank frozen (SIGSTOP): found hung (the report names that rank, not
#      one of those waiting for it in a collective), replaced, the others
#      keep theirs;
#   6. musterd SIGKILLed during a heal, before rank 0 sent the new
#      generation's id, and started again: the agent sends the id again, the
#      generation forms, the survivors keep their processes.
# In 1 and 2 the event names the step rank 0 restored, and no other restore
# is reported (agents beat every 50 ms: a rejoining rank's beat of the
# generation before, relayed as the new one's, would be taken for news).
set -eu
. tests/itest-lib.sh

need_data
make_token "$ITEST_DIR/token"
STEPS=40

job() { # NAME [MORE KEYS]
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 3, "model": "small", "data": "$DATA", ${2:-}
 "steps": $STEPS, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 50, "heartbeat_timeout_ms": 3000, "restart_backoff_ms": 0,
 "checkpoint_dir": "$ITEST_DIR/ck-$1", "checkpoint_every": 5}
JSON
}

RANK_ARGS="--threads 1 ${HEAL_RANK_ARGS:-}"
agent() { # NAME METRICS
    start_agent "$1" 2 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/muster-train $RANK_ARGS --metrics $2"
}

run() { # NAME [MORE KEYS]: musterd + agents a, b; sets A, B
    rm -rf "$ITEST_DIR/state"
    job "$1" "${2:-}"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token"
    agent a "$ITEST_DIR/$1.metrics"
    A=$AGENT_PID
    agent b "$ITEST_DIR/$1.metrics"
    B=$AGENT_PID
}

final_loss() { # METRICS: the loss of the last step, full precision
    grep "\"step\": $STEPS, \"loss\"" "$1" | tail -n 1 |
        python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read())["loss"]))'
}

finish() { # NAME: waits for the job's end (the daemon stays up for its events), then stops everything
    wait_for 240 'd["state"] == "completed"' || { show_status; fail "$1: did not complete in 240 s"; }
    curl -sf "http://127.0.0.1:$HTTP/v1/events" > "$ITEST_DIR/$1.events" || fail "$1: no events"
    kill "$DAEMON_PID" "$A" "$B" 2> /dev/null || true
    wait_exit "$DAEMON_PID" 10 || fail "$1: musterd did not stop"
    wait_exit "$A" 10 || true
    wait_exit "$B" 10 || true
}

no_stray_signal() { # only the SIGKILLs the test sent (and SIGTERMs of stopped ranks)
    ! grep -h "killed by signal" "$ITEST_DIR"/agent-*.log | grep -v "signal 9 \|signal 15 " \
        || fail "a rank died of a signal nobody sent"
}

restore_reported() { # NAME: the state_restored event names the step rank 0 restored; nothing else restored
    said=$(grep -o 'generation [0-9]* resumed at step [0-9]* from memory' "$ITEST_DIR/$1.events" | tail -n 1 | cut -d' ' -f6)
    logged=$(grep -ho "state of step [0-9]* from peers' memory" "$ITEST_DIR"/agent-*.log | tail -n 1 | cut -d' ' -f4)
    [ -n "$said" ] && [ "$logged" = "$said" ] \
        || fail "$1: rank 0 restored step $logged from memory; the event says step '$said'"
    ! grep -q '"state_from_seed"\|"state_from_checkpoint"' "$ITEST_DIR/$1.events" \
        || fail "$1: a restore from the seed or a checkpoint was reported; rank 0 restored step $logged from memory"
}

# job_step NAME: the last step rank 0 logged (its metrics, written after each
# step): the step now, not a status document's (up to 5 s old).
job_step() { sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' "$ITEST_DIR/$1.metrics" 2>/dev/null | tail -n 1; }
# at_step NAME STEP: the job runs and rank 0 has logged STEP, within 120 s.
at_step() {
    i=0
    while [ $i -lt 2400 ]; do
        [ "$(job_step "$1")" -ge "$2" ] 2>/dev/null && return 0
        sleep 0.05; i=$((i + 1))
    done
    fail "$1 run: not at step $2 in 120 s"
}

# ---- the reference
run straight
finish straight
ref=$(final_loss "$ITEST_DIR/straight.metrics")
[ -n "$ref" ] || fail "no step-$STEPS loss in the uninterrupted run"
echo "uninterrupted: final loss $ref"

# ---- 1. one rank
run rank
at_step rank 10
before_a=$(ranks_of "$A"); before_b=$(ranks_of "$B")
victim=$(echo "$before_b" | cut -d' ' -f2)
[ -n "$victim" ] || fail "no second rank under agent b (ranks: $before_b)"
at=$(job_step rank)
kill -9 "$victim"
echo "SIGKILLed a rank of node b (pid $victim) at step $at"
survivor_b=$(echo "$before_b" | cut -d' ' -f1)
finish rank
# The survivors are the processes that end the job: each exits 0 in generation 2.
for p in $before_a $survivor_b; do
    grep -q "(pid $p, generation 2) exited with status 0" "$ITEST_DIR"/agent-*.log \
        || fail "surviving rank (pid $p) did not finish generation 2: it was restarted"
done
grep -q '"state_restored"' "$ITEST_DIR/rank.events" || fail "no state_restored event after the kill"
restore_reported rank
got=$(final_loss "$ITEST_DIR/rank.metrics")
echo "rank killed at step $at, healed in place: final loss $got; survivors $before_a$survivor_b kept"
[ "$got" = "$ref" ] || fail "final loss $got differs from the uninterrupted run's $ref"
grep -q '"generation_opened".*generation 3' "$ITEST_DIR/rank.events" && fail "a second generation was opened"
grep -q 'state of step [0-9]* from peers. memory: 3 rank(s) kept theirs' "$ITEST_DIR"/agent-*.log \
    || fail "rank 0 did not log a memory restore with 3 survivors"
no_stray_signal

# ---- 2. a whole node, back at once
run node
at_step node 10
before_a=$(ranks_of "$A")
pkill -9 -P "$B" -f muster-train 2>/dev/null || true # its ranks first: orphans would outlive it
kill -9 "$B"
echo "SIGKILLed agent b and its ranks at step $(job_step node); starting it again"
agent b "$ITEST_DIR/node.metrics"
B=$AGENT_PID
finish node
for p in $before_a; do
    grep -q "(pid $p, generation [0-9]*) exited with status 0" "$ITEST_DIR/agent-a.log" \
        || fail "node a's rank (pid $p) did not finish the job: it was restarted"
done
grep -q '"state_restored"' "$ITEST_DIR/node.events" ||
    fail "no state_restored event after the node came back: $(cat "$ITEST_DIR/node.events")"
restore_reported node
got=$(final_loss "$ITEST_DIR/node.metrics")
echo "node killed and back: final loss $got"
[ "$got" = "$ref" ] || fail "final loss $got differs from the uninterrupted run's $ref"

# ---- 3. a rank and its holder: rank 0 is held by rank 2 (its successor on the replica ring)
run pair
i=0
until [ "$(cat "$ITEST_DIR/ck-pair/latest" 2>/dev/null | sed 's/^step-0*//')" -ge 10 ] 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 2400 ] || fail "pair run: no checkpoint at step 10 in 120 s"; sleep 0.05
done
r0=$(ranks_of "$A" | cut -d' ' -f1); r2=$(ranks_of "$B" | cut -d' ' -f1)
kill -9 "$r0" "$r2"
echo "SIGKILLed rank 0 (pid $r0) and rank 2 (pid $r2) together at step $(job_step pair)"
finish pair
grep -q '"state_from_checkpoint"' "$ITEST_DIR/pair.events" || fail "no state_from_checkpoint event"
grep -q 'no step was held in memory for every rank' "$ITEST_DIR/pair.events" || fail "the fallback event does not say why"
got=$(final_loss "$ITEST_DIR/pair.metrics")
echo "rank and holder killed, resumed from disk: final loss $got"
[ "$got" = "$ref" ] || fail "final loss $got differs from the uninterrupted run's $ref"
no_stray_signal

# ---- 4. a rank killed as the job ends: the others have finished and exit
run end
at_step end 2
r3=$(ranks_of "$B" | cut -d' ' -f2)
i=0
while [ "$(cat "$ITEST_DIR/ck-end/latest" 2>/dev/null)" != "$(printf 'step-%08d' $STEPS)" ] && [ $i -lt 24000 ]; do
    sleep 0.005; i=$((i + 1))
done
kill -9 "$r3" 2>/dev/null || true
echo "SIGKILLed a rank of node b (pid $r3) once the checkpoint of step $STEPS was committed"
finish end
[ "$(final_loss "$ITEST_DIR/end.metrics")" = "$ref" ] || fail "end: final loss differs from the uninterrupted run's"
no_stray_signal

# ---- 5. a frozen rank
run hang '"progress_timeout_ms": 3000, "stop_grace_ms": 1000,'
at_step hang 8
before_a=$(ranks_of "$A")
frozen=$(ranks_of "$B" | cut -d' ' -f1)
kill -STOP "$frozen"
echo "SIGSTOPped a rank of node b (pid $frozen) at step $(job_step hang)"
finish hang
grep -q '"rank_hung"' "$ITEST_DIR/hang.events" || fail "hang: the frozen rank was not found hung"
frozen_rank=$(grep -o "rank [0-9]* (pid $frozen, generation" "$ITEST_DIR/agent-b.log" | head -n 1 | cut -d' ' -f2)
# A stopped process is named as such (the agent sees its state in /proc).
hung=$(grep -o 'rank [0-9]* on node [a-z]* is hung: its process is stopped' "$ITEST_DIR/hang.events" | head -n 1)
[ "$hung" = "rank $frozen_rank on node b is hung: its process is stopped" ] \
    || fail "hang: the report names '$hung', not the frozen rank $frozen_rank on node b: $(grep -o '"rank [0-9]* on node [a-z]* is hung[^"]*' "$ITEST_DIR/hang.events" | head -n 1)"
echo "the hang report names the frozen rank: $hung"
grep -q '"state_restored"' "$ITEST_DIR/hang.events" || fail "hang: no state_restored event after the hang"
for p in $before_a; do
    grep -q "(pid $p, generation [0-9]*) exited with status 0" "$ITEST_DIR/agent-a.log" \
        || fail "hang: node a's rank (pid $p) did not finish the job: it was restarted"
done
got=$(final_loss "$ITEST_DIR/hang.metrics")
echo "rank frozen, replaced: final loss $got"
[ "$got" = "$ref" ] || fail "hang: final loss $got differs from the uninterrupted run's $ref"

# ---- 6. musterd killed during a heal
run dmn
at_step dmn 16 # mid-run, as the status-timed kill of 80 steps used to land
r0=$(ranks_of "$A" | cut -d' ' -f1)
victim=$(ranks_of "$B" | cut -d' ' -f2)
rejoins=$(grep -c "rejoins in place" "$ITEST_DIR/agent-a.log" || true)
kill -STOP "$r0" # rank 0 makes the next generation's id once it runs again: after musterd is gone
kill -9 "$victim"
i=0
while [ "$(grep -c "rejoins in place" "$ITEST_DIR/agent-a.log")" -le "$rejoins" ] && [ $i -lt 600 ]; do
    sleep 0.05; i=$((i + 1))
done
kill -9 "$DAEMON_PID"
kill -CONT "$r0"
echo "SIGKILLed a rank of node b (pid $victim), then musterd once node a's ranks rejoined"
sleep 1
"$BUILD/musterd" --job "$ITEST_DIR/dmn.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" \
    --state-dir "$ITEST_DIR/state" --token-file "$ITEST_DIR/token" >> "$ITEST_DIR/musterd.log" 2>&1 &
DAEMON_PID=$!
ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
finish dmn
got=$(final_loss "$ITEST_DIR/dmn.metrics")
echo "musterd restarted during a heal: final loss $got"
[ "$got" = "$ref" ] || fail "dmn: final loss $got differs from the uninterrupted run's $ref"
grep -q "rank 0 (pid $r0, generation [0-9]*) exited with status 0" "$ITEST_DIR/agent-a.log" \
    || fail "dmn: rank 0 (pid $r0) did not finish the job: it was restarted"
no_stray_signal
echo "heal in place: ok"
