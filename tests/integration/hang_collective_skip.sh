#!/bin/sh
# A rank that skips one collective (rank-conditional code), named by torch's
# flight recorder (issue 32, item 5): an unmodified gloo DDP program
# (tests/torch/ddp_train.py --skip-at-step 30 --skip-rank 2) on musterd + 2
# agents x 2 ranks, the recorder on by default. At its step 30 (0-based)
# every rank but 2 all-reduces its loss, and rank 0 would then write the
# mean to a file rank 2 waits for: ranks 0-1, 3 wait in the all_reduce for
# ever (gloo's timeout is 30 min). (Had rank 2 gone on to another collective
# instead, gloo pairs the two by number: it hangs, or aborts on the sizes;
# tests/check_flight.c has that case.) The rules name rank 2, outside any
# collective, with where it is; the recorders' summaries add the op and its
# number (where every rank waits and the rules cannot tell, the verdict is
# the reason: tests/check_rdv.c hang_is_named_by_the_flight_recorders):
#   3 collectives when DDP wraps the model (all_gather of the parameter
#     shapes, 2 broadcasts of its state), 1 all_reduce of the gradient
#     bucket per step, 2 broadcasts before step 1 (DDP rebuilds its buckets
#     after the first step): step S's bucket is #S+6 (S >= 1), and the
#     all_reduce rank 2 skips after step 30 is #37, its last #36.
# Then, with "flight_recorder": 0, the same program's hang says nothing of
# the recorder, and the rank environment has no TORCH_FR_BUFFER_SIZE.
set -eu
. tests/itest-lib.sh

need_torch hang_collective_skip torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
make_token "$ITEST_DIR/token"
SKIP=30
EXPECT=$((SKIP + 7))

# wait_hung GEN SECONDS: sets MSG once GEN's rank_hung event is there ("" = none within SECONDS).
wait_hung() { MSG=$(event_message rank_hung "$1" "$2"); }
job() { # job SKIP_AT_STEP [FLIGHT_RECORDER_KEY]
    cat > "$ITEST_DIR/job.json" <<JSON
{"name": "hang-skip", "nodes": 2, "max_restarts": 0, "batch": 4, "stop_grace_ms": 500, "progress_timeout_ms": 4000,
 "heartbeat_interval_ms": 200 ${2:-},
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "100000", "--skip-at-step", "$1", "--skip-rank", "2",
              "--skip-file", "$ITEST_DIR/mean-loss"]}
JSON
}

# ---- the recorder on (the default)
job "$SKIP"
start_pair_job "$ITEST_DIR/job.json"
# rank 0 prints step 30's line after the all_reduce it never leaves: step 29's is its last
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step $SKIP loss" || fail "rank 0 did not reach step $SKIP"
pid=$(rank_pid "$SCRIPT.*$ITEST_DIR" 0)
tr '\0' '\n' < "/proc/$pid/environ" | grep -qx 'TORCH_FR_BUFFER_SIZE=2000' ||
    fail "rank 0's environment has no TORCH_FR_BUFFER_SIZE=2000"
wait_hung 1 30
[ -n "$MSG" ] || fail "the deadlock was not named within 30 s of step $SKIP"
# the rules name rank 2 too (outside any collective, where it waits for the file); the recorder adds the collective
want="torch's flight recorder: rank 2 never entered all_reduce #$EXPECT (its last is all_reduce #$((EXPECT - 1))); ranks 0-1, 3 wait in it"
case "$MSG" in
"rank 2 on node b is hung: it is not in a collective (at ddp_train.py:"*"; $want") ;;
*) fail "the hang's message:
  got:  $MSG
  want: rank 2 on node b is hung: it is not in a collective (at ddp_train.py:...; $want" ;;
esac
echo "named: $MSG"
stacks=$(event_message rank_stacks 1)
case "$stacks" in
"flight recorder: rank 2 never entered all_reduce #$EXPECT"*) ;;
*) fail "the rank_stacks event does not start with the verdict: $stacks" ;;
esac
# /v1/stacks: the verdict, and each rank's summary with the number it entered
curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/stacks" > "$ITEST_DIR/stacks.json" || fail "GET /v1/stacks"
python3 - "$ITEST_DIR/stacks.json" "$EXPECT" <<'PYEOF' || fail "GET /v1/stacks: $(cat "$ITEST_DIR/stacks.json")"
import json, sys
d, n = json.load(open(sys.argv[1])), int(sys.argv[2])
assert d["flight_recorder"]["rank"] == 2, d["flight_recorder"]
assert d["flight_recorder"]["verdict"].startswith("rank 2 never entered all_reduce #%d" % n)
for r in d["ranks"]:
    line = r["fr"].split("\n")[0].split()
    entered = n - 1 if r["rank"] == 2 else n  # rank 2 stopped short of #n; the others are inside it
    assert line[:4] == ["0", "default_pg", str(entered), str(n - 1)], (r["rank"], r["fr"])
    assert line[-1] == "%d:all_reduce" % entered, (r["rank"], r["fr"])
PYEOF
end_pair_job
rm -f "$ITEST_DIR"/agent-*.log # the agents append: the next job's lines alone

# ---- the recorder off: no summary, no verdict, no TORCH_FR_BUFFER_SIZE (the skip at step 3, to be quick)
job 3 ', "flight_recorder": 0'
start_pair_job "$ITEST_DIR/job.json"
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step 3 loss" || fail "(off) rank 0 did not reach step 3"
pid=$(rank_pid "$SCRIPT.*$ITEST_DIR" 1)
[ -n "$pid" ] || fail "(off) no process for rank 1"
if tr '\0' '\n' < "/proc/$pid/environ" | grep -q '^TORCH_FR_BUFFER_SIZE='; then
    fail "(off) the rank's environment has TORCH_FR_BUFFER_SIZE"
fi
wait_hung 1 30
[ -n "$MSG" ] || fail "(off) the deadlock was not named within 30 s"
case "$MSG" in
*"flight recorder"*) fail "(off) the recorder was used: $MSG" ;;
esac
echo "(off) named without it: $MSG"
end_pair_job
