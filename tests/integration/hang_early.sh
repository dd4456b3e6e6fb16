#!/bin/sh
# Hangs early in a job, under the automatic progress timeout (no
# progress_timeout_ms) and the default 1 s heartbeat, which brings ~15 of this
# program's 0.05 s steps at once: an unmodified DDP program
# (tests/torch/ddp_train.py, muster's start-up hook) on musterd + 2 agents x 2
# ranks on loopback.
#  (a) rank 3 SIGSTOPped at step 10: named hung, as stopped, by the stopped
#      rule (daemon/hang.h: HANG_STOPPED_MS, 5 s, after its peers' last step),
#      within 20 s, not after the 300 s start allowance;
#  (b) in generation 2, rank 2 spins in its own loop at step 40: named "not in
#      a collective" within 45 s of the step before: the timeout follows the steps after the
#      first 5 (the 30 s floor), not after 5 heartbeats' worth of steps
#      (~75 steps), which left the start allowance (300 s) in force.
# itest: solo
set -eu
. tests/itest-lib.sh

need_torch hang_early torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
make_token "$ITEST_DIR/token"

# wait_hung GEN SECONDS: sets MSG and WAITED_MS (from now) once GEN's rank_hung event is there.
wait_hung() {
    _t0=$(now_ms)
    MSG=$(event_message rank_hung "$1" "$2")
    WAITED_MS=$(($(now_ms) - _t0))
}

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "hang-early", "nodes": 2, "max_restarts": 3, "batch": 4, "stop_grace_ms": 500,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "100000", "--step-sleep", "0.05", "--ckpt-dir", "$ITEST_DIR/ckpt",
              "--ckpt-every", "1000000", "--spin-at-step", "40", "--spin-rank", "2", "--spin-restart", "1"]}
JSON
start_pair_job "$ITEST_DIR/job.json"

# (a) SIGSTOP rank 3 once rank 0 reached step 10.
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step 10 loss" || fail "(a) rank 0 did not reach step 10"
pid=$(rank_pid "$SCRIPT.*$ITEST_DIR/ckpt" 3)
[ -n "$pid" ] || fail "(a) no process for rank 3"
kill -STOP "$pid"
wait_hung 1 20
kill -CONT "$pid" 2>/dev/null || true
[ -n "$MSG" ] || fail "(a) the SIGSTOPped rank was not named hung within 20 s"
case "$MSG" in
"rank 3 on node b is hung: its process is stopped"*) ;;
*) fail "(a) the wrong rank, or not as stopped: $MSG" ;;
esac
echo "(a) rank 3 SIGSTOPped at step 10 -> named after $WAITED_MS ms: $MSG"

# (b) generation 2: rank 2 spins at its step 40; the others wait in backward's all_reduce.
wait_for 90 'd["generation"] == 2 and d["state"] == "running"' || fail "(b) no generation 2 after the hang"
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: rank 0/4 restart 1 master" || fail "(b) rank 0 did not restart"
# generation 1 never reached step 39 (rank 3 stopped at 10): this line is generation 2's
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step 39 loss" || fail "(b) rank 0 did not reach step 39"
# rank 2 reaches step 40 (2.4 s of steps) and spins; its peers block in that step's all_reduce
wait_hung 2 45
[ -n "$MSG" ] || fail "(b) the spinning rank was not named hung within 45 s of step 39 (progress_timeout: $(status | python3 -c "import json, sys; print(json.load(sys.stdin).get(\"progress_timeout\"))"))"
case "$MSG" in
"rank 2 on node b is hung: it is not in a collective"*spin_for_ever*) ;;
*) fail "(b) the wrong rank, or not where it spins: $MSG" ;;
esac
echo "(b) rank 2 spinning at step 40 of generation 2 -> named $WAITED_MS ms after step 39: $MSG"
end_pair_job
