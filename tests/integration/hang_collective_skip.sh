#!/bin/sh
# A rank that skips one collective (rank-conditional code, the classic
# deadlock), named by torch's flight recorder (issue 32, item 5): an
# unmodified gloo DDP program (tests/torch/ddp_train.py --skip-at-step 30
# --skip-rank 2) on musterd + 2 agents x 2 ranks, the recorder on by default.
# At its step 30 (0-based) every rank but 2 all-reduces its loss and then all
# meet in a barrier: rank 2's barrier takes the number of the all_reduce it
# skipped, and every rank waits for ever (gloo's timeout is 30 min). The
# existing rules see four ranks waiting in a collective; the recorders'
# summaries name rank 2, the op and its number:
#   3 collectives when DDP wraps the model (all_gather of the parameter
#     shapes, 2 broadcasts of its state), 1 all_reduce of the gradient
#     bucket per step, 2 broadcasts before step 1 (DDP rebuilds its buckets
#     after the first step): step S's bucket is #S+6 (S >= 1), and the
#     skipped all_reduce after step 30 is #37.
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

# hung_event GEN: the message of the rank_hung event of generation GEN ("" = none yet).
hung_event() {
    curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | python3 -c '
import json, sys
ev = [e for e in json.load(sys.stdin)["events"] if e.get("kind") == sys.argv[2] and e.get("generation") == int(sys.argv[1])]
print(ev[-1]["message"] if ev else "")' "$1" "${2:-rank_hung}"
}
wait_hung() {
    _t0=$(now_ms); MSG=""
    while [ -z "$MSG" ] && [ $(($(now_ms) - _t0)) -lt $(($2 * 1000)) ]; do
        MSG=$(hung_event "$1") || MSG=""
        [ -n "$MSG" ] || sleep 0.2
    done
}
job() { # job FLIGHT_RECORDER_KEY
    cat > "$ITEST_DIR/job.json" <<JSON
{"name": "hang-skip", "nodes": 2, "max_restarts": 0, "batch": 4, "stop_grace_ms": 500, "progress_timeout_ms": 4000,
 "heartbeat_interval_ms": 200 $1,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "100000", "--skip-at-step", "$SKIP", "--skip-rank", "2"]}
JSON
}

# ---- the recorder on (the default)
job ""
start_pair_job "$ITEST_DIR/job.json"
# rank 0 prints step 30's line after the all_reduce it never leaves: step 29's is its last
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step $SKIP loss" || fail "rank 0 did not reach step $SKIP"
pid=$(rank_pid "$SCRIPT" 0)
tr '\0' '\n' < "/proc/$pid/environ" | grep -qx 'TORCH_FR_BUFFER_SIZE=2000' ||
    fail "rank 0's environment has no TORCH_FR_BUFFER_SIZE=2000"
wait_hung 1 30
[ -n "$MSG" ] || fail "the deadlock was not named within 30 s of step $SKIP"
want="rank 2 on node b is hung: rank 2 never entered all_reduce #$EXPECT (its #$EXPECT is barrier); ranks 0-1, 3 wait in it (torch's flight recorder)"
[ "$MSG" = "$want" ] || fail "the hang's message:
  got:  $MSG
  want: $want"
echo "named: $MSG"
stacks=$(hung_event 1 rank_stacks)
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
    assert line[:3] == ["0", "default_pg", str(n)], (r["rank"], r["fr"])
    assert line[-1] == "%d:%s" % (n, "barrier" if r["rank"] == 2 else "all_reduce"), (r["rank"], r["fr"])
PYEOF
end_pair_job

# ---- the recorder off: no summary, no verdict, no TORCH_FR_BUFFER_SIZE
job ', "flight_recorder": 0'
start_pair_job "$ITEST_DIR/job.json"
wait_log 120 "$ITEST_DIR/agent-a.log" "rank 0: step 3 loss" || fail "(off) rank 0 did not reach step 3"
pid=$(rank_pid "$SCRIPT" 1)
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
