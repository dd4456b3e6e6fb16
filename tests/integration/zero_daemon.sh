#!/bin/sh
# The whole job under musterd: 2 agents x 1 muster-train rank each train the
# small model (slow enough to be caught mid-run) with ZeRO-3 over the ring. One run goes straight through; in the
# other, a rank is SIGKILLed after a checkpoint was committed: the job opens
# the next generation, every rank resumes from the last committed checkpoint,
# and the final loss must equal the uninterrupted run's bit for bit. Last, a
# whole node is killed and stays away: after rejoin_timeout_ms the job shrinks
# to the one node left (min_nodes 1), which re-slices the world-2 checkpoint
# for world 1 and finishes.
set -eu
. tests/itest-lib.sh

need_data
make_token "$ITEST_DIR/token"

job() { # NAME CHECKPOINT_DIR
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 2, "min_nodes": 1, "rejoin_timeout_ms": 2000, "model": "small", "data": "$DATA",
 "steps": 60, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000,
 "checkpoint_dir": "$2", "checkpoint_every": 10}
JSON
}

# run NAME: starts musterd + agents a, b; leaves DAEMON_PID, AGENT pids.
run() {
    rm -rf "$ITEST_DIR/state"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token" --exit-on-end
    RANK_CMD="$BUILD/muster-train --threads 1 --metrics $ITEST_DIR/$1.metrics"
    start_agent a 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
    A=$AGENT_PID
    start_agent b 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
    B=$AGENT_PID
}

final_loss() { # METRICS: the loss of the last step, full precision
    grep '"step": 60, "loss"' "$1" | tail -n 1 | python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read())["loss"]))'
}

job straight "$ITEST_DIR/ck-straight"
run straight
wait_exit "$DAEMON_PID" 240 || fail "uninterrupted run did not finish in 240 s"
wait "$DAEMON_PID" || fail "uninterrupted run did not complete"
ref=$(final_loss "$ITEST_DIR/straight.metrics")
[ -n "$ref" ] || fail "no step-60 loss in the uninterrupted run"
echo "uninterrupted: final loss $ref"
wait_exit "$A" 10 || true; wait_exit "$B" 10 || true

job killed "$ITEST_DIR/ck-killed"
run killed
wait_for 120 'd["last_checkpoint_step"] is not None and d["last_checkpoint_step"] >= 20' \
    || fail "no committed checkpoint reported within 120 s"
victim=$(pgrep -P "$B" -f muster-train | head -n 1)
[ -n "$victim" ] || fail "no rank process under agent b"
kill -9 "$victim"
echo "SIGKILLed rank 1 (pid $victim) after checkpoint $(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_checkpoint_step"])')"
wait_exit "$DAEMON_PID" 240 || fail "interrupted run did not finish in 240 s"
wait "$DAEMON_PID" || fail "interrupted run did not complete"
grep -q 'completed, generation 2' "$ITEST_DIR/musterd.log" || fail "expected completion in generation 2"
got=$(final_loss "$ITEST_DIR/killed.metrics")
echo "killed and resumed: final loss $got"
[ "$got" = "$ref" ] || fail "final loss $got differs from the uninterrupted run's $ref"
# The survivors were stopped with SIGTERM: none may die of another signal (a handler
# once wrote into the freed control channel: SIGSEGV).
! grep -h "killed by signal" "$ITEST_DIR"/agent-*.log | grep -v "signal 9 \|signal 15 " \
    || fail "a rank died of a signal nobody sent"
wait_exit "$A" 10 || true; wait_exit "$B" 10 || true

job shrink "$ITEST_DIR/ck-shrink"
run shrink
wait_for 120 'd["last_checkpoint_step"] is not None and d["last_checkpoint_step"] >= 20' \
    || fail "no committed checkpoint reported within 120 s (shrink run)"
kill -9 "$B"
pkill -9 -P "$B" 2>/dev/null || true
wait_exit "$DAEMON_PID" 240 || fail "shrunk run did not finish in 240 s"
wait "$DAEMON_PID" || fail "shrunk run did not complete"
grep -q 'completed, generation 3, 1 ranks' "$ITEST_DIR/musterd.log" || fail "expected completion in generation 3 with 1 rank"
grep -q '"step": 60, "loss"' "$ITEST_DIR/shrink.metrics" || fail "the shrunk job did not reach step 60"
echo "node killed for good: job shrank to 1 rank and completed"
echo "zero under the daemon: ok"
