#!/bin/sh
# torch_elastic's scenario under the strict NCCL-like backend
# (tests/torch/strict_nccl.py: collectives that never fail when a peer is
# lost, only abort() ends them, and destroying a broken group blocks for
# ever), musterd + 2 agents x 2 ranks on loopback:
#  (a) uninterrupted, it trains to the end: the reference final parameters;
#  (b) an abort racing a step (ddp_train.py --race-at-step 20): rank 3
#      SIGKILLs itself once its update of step 21 is done, so ranks 1 and 2
#      are blocked in step 22's reduce (a host sync, the GIL free) when the
#      park comes, and rank 0's update of step 21 is still on its emulated
#      device (strict_nccl.LateUpdate: done only after the abort, and half
#      applied then). Ranks 0-2 keep their processes (same PIDs) because
#      the park watch aborts their groups (gloo's socket shutting cannot end
#      an NCCL-like wait); rank 0's step 21 does not count (its fence saw
#      the abort), so the state comes from rank 1, the first rank whose
#      last step is fenced, never from rank 0 (whose half-applied update
#      would move the final parameters by far more than 1e-6); every rank
#      trains on from step 21: no completed step is lost; the final
#      parameters and loss equal (a)'s within 1e-6; and no rank ever
#      destroys a group after an abort (the backend logs such a call to
#      STRICT_NCCL_LOG and blocks).
# It prints kill -> next step on every survivor and the steps redone.
set -eu
. tests/itest-lib.sh

need_torch torch_elastic_strict torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
STEPS=60
make_token "$ITEST_DIR/token"
STRICT_NCCL_LOG="$ITEST_DIR/strict.log"
export STRICT_NCCL_LOG

# run_job NAME [ARGS]: starts musterd and two agents on a job of STEPS steps under the strict
# backend (ARGS: more of the rank command's, as JSON list items, each after a comma).
run_job() {
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 4, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 1000,
 "rank_cmd": ["$PY", "$SCRIPT", "--elastic", "--backend", "strict_nccl", "--steps", "$STEPS",
              "--step-sleep", "0.1", "--final-file", "$ITEST_DIR/$1.final",
              "--timing-file", "$ITEST_DIR/$1.timing", "--ckpt-dir", "$ITEST_DIR/$1"${2:-}]}
JSON
    start_pair_job "$ITEST_DIR/$1.json"
}

# (a) the reference.
run_job ref
wait_for 150 'd["state"] == "completed"' || fail "(a) the uninterrupted strict_nccl job did not complete"
[ -s "$ITEST_DIR/ref.final" ] || fail "(a) no final parameters written"
end_pair_job
echo "(a) uninterrupted: $(cat "$ITEST_DIR/ref.final")"

# (b) rank 3 SIGKILLs itself after its update of step 21, rank 0's update of it racing the abort.
run_job heal ', "--race-at-step", "20", "--race-rank", "0", "--race-die-rank", "3"'
wait_for 150 'd["state"] == "running" and all((r["step"] or 0) >= 5 for r in d["ranks"])' \
    || fail "(b) the strict_nccl job does not reach step 5"
rank_pids heal > "$ITEST_DIR/pids-before"
[ "$(wc -l < "$ITEST_DIR/pids-before")" -eq 4 ] || fail "(b) expected 4 rank processes: $(cat "$ITEST_DIR/pids-before")"
victim=$(sed -n 's/^3 //p' "$ITEST_DIR/pids-before")
wait_for 90 'd["generation"] >= 2 and d["state"] == "running"' || fail "(b) generation 2 is not running"
wait_for 150 'd["state"] == "completed"' || fail "(b) the healed job did not complete"
killed_at=$(sed -n 's/^kill 3 //p' "$ITEST_DIR/heal.timing")
[ -n "$killed_at" ] || fail "(b) rank 3 did not kill itself at step 21"
# The figures first (they say how a failing run failed), then the checks.
python3 - "$ITEST_DIR/heal.timing" "$killed_at" "$ITEST_DIR/pids-before" "$victim" > "$ITEST_DIR/figures" <<'PY'
import sys
path, killed, before, victim = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
survivors = [l.split()[1] for l in open(before) if l.split()[1] != victim]
by_pid, by_rank = {}, {}
for line in open(path):
    f = line.split()
    if f[0] == "step":
        by_pid.setdefault(f[3], []).append((float(f[5]), int(f[4])))
        if float(f[5]) >= killed:
            by_rank.setdefault(f[1], []).append(float(f[5]))
kept, redone = [], 0
for pid in survivors:
    seen = by_pid.get(pid, [])
    before_kill = [s for t, s in seen if t < killed]
    after = sorted((t, s) for t, s in seen if t >= killed)
    if before_kill and after:
        kept.append(pid)
        redone = max(redone, max(before_kill) - (after[0][1] - 1))
every = max(min(ts) for ts in by_rank.values()) - killed if len(by_rank) == 4 else float("nan")
# Completed steps lost, on any process: the last step done before the kill less the first one done again.
last = max(s for seen in by_pid.values() for t, s in seen if t < killed)
again = min(min(s for t, s in seen if t >= killed) for seen in by_pid.values() if any(t >= killed for t, _ in seen))
print("kill -> next step on every rank %.2f s, survivors that stepped again in their own process %d/3, "
      "completed steps redone %d" % (every, len(kept), max(redone, last - (again - 1))))
print("kept %d redone %d" % (len(kept), redone))
PY
echo "(b) $(head -n 1 "$ITEST_DIR/figures")"
check 'd["generation"] == 2' || fail "(b) the job restarted again after generation 2: it did not heal in place"
grep -qx "kept 3 redone 0" "$ITEST_DIR/figures" || fail "(b) the survivors did not all step again in their processes with no step redone"
grep -q "rank 0: the update of step 21 is on the emulated device until the abort" "$ITEST_DIR/agent-a.log" \
    || fail "(b) rank 0's update of step 21 did not race the abort"
# Elastic's line for generation 2 on every rank: "training from step S (state from rank R)".
from=$(grep -ho "generation 2: rank [0-9] of 4, training from step [0-9]* (state from [a-z0-9 ]*)" "$ITEST_DIR"/agent-[ab].log |
    sed 's/.*training from step \([0-9]*\) (state from \(.*\))/\1 \2/' | sort -u)
[ "$from" = "21 rank 1" ] || fail "(b) generation 2 did not train on from step 21 with the state of rank 1 (the first fenced rank): '$from'"
[ ! -s "$STRICT_NCCL_LOG" ] || fail "(b) a process group was destroyed after an abort: $(cat "$STRICT_NCCL_LOG")"
curl -sf "http://127.0.0.1:$HTTP/v1/events" | grep -q '"kind": *"state_restored"' \
    || fail "(b) no state_restored event: the replacement's state did not come from memory"
[ -s "$ITEST_DIR/heal.final" ] || fail "(b) no final parameters written"
python3 - "$ITEST_DIR/heal.final" "$ITEST_DIR/ref.final" <<'PY' \
    || fail "(b) final parameters differ from the uninterrupted run: $(cat "$ITEST_DIR/heal.final") vs $(cat "$ITEST_DIR/ref.final")"
import sys
healed, ref = ([float(x) for x in open(p).read().split()] for p in sys.argv[1:3])
for h, r in zip(healed, ref):
    assert abs(h - r) <= 1e-6 * abs(r), (h, r)
PY
end_pair_job
echo "(b) SIGKILL of rank 3 under strict_nccl racing rank 0's update: ranks 0-2 kept their processes, rank 0's step not counted, state from rank 1, no destroy after an abort, final $(cat "$ITEST_DIR/heal.final") vs $(cat "$ITEST_DIR/ref.final"): ok"
echo "torch_elastic_strict: ok"
