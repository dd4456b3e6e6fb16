#!/bin/sh
# A sharded PyTorch program (FSDP2, tests/torch/fsdp_train.py through
# ShardedElastic, buddy replicas every 5 steps, no checkpoint at all) whose
# world changes size: musterd + 2 agents x 2 ranks on loopback, under the
# strict NCCL-like backend of tests/torch/strict_nccl.py (FSDP_BACKEND=gloo:
# gloo's): a collective whose peer is lost never fails there, only the park
# watch's abort ends it, and no group may be destroyed after its abort (the
# backend logs such a call to STRICT_NCCL_LOG, and blocks); gloo's heals of
# ShardedElastic are torch_fsdp_buddy's (c).
#  (a) shrink: agent b is SIGKILLed with its ranks and stays away; after
#      rejoin_timeout_ms the job shrinks to node a's 2 ranks, which keep
#      their processes; ranks 2 and 3's shards exist only in the replicas
#      node a's ranks hold (their buddies): the state of the last replica
#      step of world 4 is re-sliced for world 2, and its digest (a SHA-256
#      of every parameter and optimizer moment, gathered, with its name,
#      shape and bytes) is the one world 4 had after that step, bit for bit;
#  (b) grow: agent b comes back; the ranks leave their generation together
#      at a step boundary, each keeping its state of that step, which is
#      re-sliced for world 4: 0 steps redone, the digest world 2 had after
#      that step; b's new rank 2 SIGKILLs itself right after that re-slice
#      (before its new replica shipped): the ranks keep world 2's snapshots
#      until world 4's first round, so the next generation re-slices them
#      again (0 steps redone, the same step), and its digest (the first
#      re-slice's generation trains no step) is world 2's; the job
#      completes with node a's first processes, its final parameters and
#      loss (and the loss of each step, as last done) those of a reference
#      computed in one process on the same worlds from the same steps
#      (fsdp_train.py --reference-schedule, from rank 0's generation lines),
#      within 1e-5 (FSDP's reduce-scatter sums in another order than one
#      process: 3e-7 seen; a step more or less, or a world changed one step
#      early or late, moves the final sum by 7e-4 to 2e-2).
set -eu
. tests/itest-lib.sh

need_torch torch_fsdp_world torch.distributed.fsdp
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/fsdp_train.py"
STEPS=60
BACKEND=${FSDP_BACKEND:-strict_nccl}
make_token "$ITEST_DIR/token"
STRICT_NCCL_LOG="$ITEST_DIR/strict.log"
export STRICT_NCCL_LOG

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "fsdp-world", "nodes": 2, "min_nodes": 1, "rejoin_timeout_ms": 1500, "max_restarts": 4,
 "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 1000,
 "restart_backoff_ms": 0,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "$STEPS", "--step-sleep", "0.05", "--replica-every", "5", "--digests", "--backend", "$BACKEND",
              "--final-file", "$ITEST_DIR/final",
              "--die-after-reslice", "b:$ITEST_DIR/died"]}
JSON
start_pair_job "$ITEST_DIR/job.json"
LOG=$ITEST_DIR/agent-a.log  # rank 0's output, as "rank 0: ..."

ranks_of_agent() { pgrep -P "$1" -f "$SCRIPT" | sort -n | tr '\n' ' '; }
# same_digest FROM TO: rank 0's digest when the world of TO ranks started from
# memory equals the one the world of FROM had after that step (STEP: that step).
same_digest() {
    wait_log 30 "$LOG" "rank 0: generation [0-9]* world $2 from memory at step" || true
    line=$(grep -o "rank 0: generation [0-9]* world $2 from memory at step [0-9]* digest .*" "$LOG" | tail -n 1)
    [ -n "$line" ] || fail "no generation of world $2 started from memory: $(grep 'every rank at step' "$LOG" | tail -n 2)"
    STEP=$(echo "$line" | awk '{print $11}')
    got=$(echo "$line" | awk '{print $13}')
    want=$(grep -o "rank 0: world $1 after step $STEP digest .*" "$LOG" | tail -n 1 | awk '{print $9}')
    [ -n "$want" ] || fail "no digest of world $1 after step $STEP"
    [ "$got" = "$want" ] || fail "world $2's state of step $STEP (digest $got) is not world $1's (digest $want)"
}

wait_log 120 "$LOG" "rank 0: step 12 loss" || fail "the job does not reach step 12"
pids_a=$(ranks_of_agent "$AGENT_A")
need_pids "node a" 2 "$pids_a"
pkill -9 -P "$AGENT_B" -f "$SCRIPT" 2>/dev/null || true
kill -9 "$AGENT_B"
wait "$AGENT_B" 2>/dev/null || true
echo "(a) SIGKILLed agent b and its ranks"
wait_log 60 "$LOG" "buddy replicas re-sliced from world 4 to 2" \
    || fail "(a) the state was not re-sliced for world 2: $(grep 'every rank at step\|cannot be re-sliced' "$LOG" | tail -n 2)"
same_digest 4 2
step=$STEP
redone=$(grep -o "re-sliced from world 4 to 2 ([0-9]* steps redone)" "$LOG" | tail -n 1 | tr -d '(' | awk '{print $7}')
[ "$redone" -lt 10 ] || fail "(a) $redone steps redone, replicas are every 5"
[ "$(ranks_of_agent "$AGENT_A")" = "$pids_a" ] || fail "(a) node a's ranks were restarted by the shrink"
echo "(a) shrank to 2 ranks in the same processes ($pids_a): world 4's state of step $step re-sliced," \
    "digest equal, $redone steps redone"

wait_log 60 "$LOG" "rank 0: world 2 after step $((step + 5)) digest" || fail "(a) the world of 2 does not train"
start_agent b 2 --token-file "$ITEST_DIR/token"
AGENT_B=$AGENT_PID
wait_log 90 "$LOG" "buddy replicas re-sliced from world 2 to 4" \
    || fail "(b) the state was not re-sliced for world 4: $(grep 'every rank at step\|cannot be re-sliced' "$LOG" | tail -n 2)"
# That generation trains no step: b's new rank dies right after its re-slice,
# before the first step's digest (a collective) is done; the next one re-slices
# world 2's snapshots again, and its digest is compared.
wait_log 30 "$ITEST_DIR/agent-b.log" "re-sliced: SIGKILLing itself" || fail "(b) b's rank did not die after its re-slice"
# the generation it died in: the last one a rank of b started for before that line (rank 0 may or
# may not have logged that generation's re-slice before the death broke it: a race, not a check)
died=$(awk '/ generation [0-9]+ started/ { for (i = 1; i < NF; i++) if ($i == "generation") g = $(i + 1) }
            /re-sliced: SIGKILLing itself/ { print g; exit }' "$ITEST_DIR/agent-b.log")
[ -n "$died" ] || fail "(b) no generation for b's rank that died"
i=0
until sed -n 's/.*generation \([0-9]*\): every rank at step [0-9]* from buddy replicas re-sliced from world 2 to 4 (0 steps redone).*/\1/p' \
        "$LOG" | awk -v d="$died" '$1 > d { found = 1 } END { exit !found }'; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "(b) after b's rank died in generation $died, world 2's state was not re-sliced" \
        "again: $(grep 'every rank at step\|re-sliced from world 2 to 4' "$LOG" | tail -n 2)"; sleep 0.1
done
grows=$(sed -n 's/.*every rank at step \([0-9]*\) from buddy replicas re-sliced from world 2 to 4 (0 steps redone).*/\1/p' "$LOG" |
    uniq | tr '\n' ' ')
[ "$(echo $grows | wc -w)" -eq 1 ] || fail "(b) the two re-slices for world 4 are of different steps: $grows"
! grep "re-sliced from world 2 to 4" "$LOG" | grep -qv "(0 steps redone)" \
    || fail "(b) a re-slice for world 4 redid steps: $(grep -o 're-sliced from world 2 to 4.*' "$LOG")"
same_digest 2 4
step=$STEP
[ "$step" = "$(echo $grows)" ] || fail "(b) world 4 trained from step $step, not from the re-sliced step $grows"
echo "(b) grew to 4 at the boundary of step $step; b's rank SIGKILLed right after the re-slice: world 2's state" \
    "of that step re-sliced again, digest equal, 0 steps redone each time"

# The worlds the job trained on and from which step: the reference's schedule.
schedule=$(sed -n 's/^rank 0: generation [0-9]* world \([0-9]*\) from [a-z]* at step \([0-9]*\) digest .*/\2:\1/p' "$LOG" |
    tr '\n' ',' | sed 's/,$//')
PYTHONPATH="$(pwd)/clients/python" "$PY" "$SCRIPT" --steps $STEPS --reference-schedule "$schedule" \
    --final-file "$ITEST_DIR/ref.final" > "$ITEST_DIR/ref.log" 2>&1 &
REF=$!
wait_for 180 'd["state"] == "completed"' || { show_status; fail "the job did not complete"; }
gen=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
kept_pids "$ITEST_DIR/agent-a.log" "$pids_a" "$gen"
wait "$REF" || fail "the reference run failed: $(tail -n 5 "$ITEST_DIR/ref.log")"
python3 - "$ITEST_DIR/final" "$ITEST_DIR/ref.final" "$LOG" "$ITEST_DIR/ref.log" "$STEPS" <<'PY' \
    || fail "the result is not the reference's (schedule $schedule): $(cat "$ITEST_DIR/final") vs $(cat "$ITEST_DIR/ref.final")"
import re, sys
run, ref = ([float(x) for x in open(p).read().split()] for p in sys.argv[1:3])
assert len(run) == len(ref) == 2, (run, ref)
for h, r in zip(run, ref):
    assert abs(h - r) <= 1e-5 * abs(r), ("final", h, r)
def losses(path, prefix):  # each step's loss as last done
    out = {}
    for line in open(path):
        m = re.match(prefix + r"step (\d+) loss (\S+)$", line.strip())
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out
a, b = losses(sys.argv[3], "rank 0: "), losses(sys.argv[4], "")
steps = int(sys.argv[5])
assert sorted(a) == sorted(b) == list(range(1, steps + 1)), (sorted(a)[:5], len(a), len(b))
bad = [(s, a[s], b[s]) for s in a if abs(a[s] - b[s]) > 1e-5]
assert not bad, bad[:3]
PY
echo "final $(cat "$ITEST_DIR/final") = reference's on worlds $schedule (step:world) within 1e-5"
[ ! -s "$STRICT_NCCL_LOG" ] || fail "a process group was destroyed after an abort: $(cat "$STRICT_NCCL_LOG")"
[ "$BACKEND" != strict_nccl ] || grep -q "aborting its [0-9]* process group" "$LOG" || fail "rank 0 never aborted its groups"
echo "torch_fsdp_world: passed under $BACKEND (node a's processes $pids_a finished generation $gen)"
