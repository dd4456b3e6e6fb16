#!/bin/sh
# Healing an NCCL-like program in place, measured against gloo's: a PyTorch
# DDP program through muster_rank.Elastic (tests/torch/ddp_train.py
# --elastic), 2 agents x 2 ranks on loopback, one job per backend, each
# killing rank 3 RUNS times (default 5) once every rank made 5 steps since
# the last heal:
#   gloo         torch's gloo: the survivors' collective fails when the
#                peer's socket closes (or the park watch closes theirs);
#   strict_nccl  tests/torch/strict_nccl.py: the survivors' collective never
#                fails, only the park watch's abort ends it, and the groups
#                are forgotten, never destroyed.
# Each backend also with a warm spare ("warm_spares": 1: the replacement
# rank is a process that already started Python and imported torch), as
# gloo+spare and strict_nccl+spare; each kill then waits until node b's spare
# has done its imports.
# "kill -> next step on every rank": from the SIGKILL to the first step of
# the next generation (its restart count, in the ranks' --timing-file
# lines) that the last of the 4 ranks (the replacement among them)
# completes, by the ranks' own wall clocks. Medians with ranges.
# Then the fences' own cost per step (muster_rank.fence: begin, updated,
# completed on the host path, as Elastic calls them), beside a step of the
# same program in one process, and a snapshot's cost (the host path; the
# pinned side-stream copy of CUDA state where there is a GPU), timed by
# tests/bench/bench_fence.py.
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-5}
. tests/itest-lib.sh
need_torch bench_strict_heal torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
make_token "$ITEST_DIR/token"
STRICT_NCCL_LOG="$ITEST_DIR/strict.log"
export STRICT_NCCL_LOG

wall() { python3 -c 'import time; print("%.6f" % time.time())'; }
# since T [R]: the fewest steps any rank completed after wall time T (0 until all 4 did one), by
# $TIMING; with R, only steps of a generation whose restart count is above R.
# restarts T: the highest restart count of a step done by T. healed T R: the
# seconds from T to the first step of a generation above R on the last of the ranks.
timing() {
    python3 - "$TIMING" "$@" <<'PY'
import sys
path, what, t = sys.argv[1], sys.argv[2], float(sys.argv[3])
above = int(sys.argv[4]) if len(sys.argv) > 4 else -1
steps = [(f[1], int(f[2]), float(f[5])) for f in (line.split() for line in open(path)) if f and f[0] == "step"]
if what == "restarts":
    print(max([r for _, r, w in steps if w <= t] or [0]))
    sys.exit()
seen, first = {}, {}
for rank, r, w in steps:
    if w > t and r > above:
        seen[rank] = seen.get(rank, 0) + 1
        first.setdefault(rank, w)
if what == "since":
    print(min(seen.values()) if len(seen) == 4 else 0)
else:
    print("%.6f" % (max(first.values()) - t))
PY
}

# spare_ready: node b's warm spare has done its imports (it waits on its hand-off socket, in a unix socket read).
spare_ready() {
    for p in $(pgrep -f "muster_spare .*$ITEST_DIR/" || true); do
        if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "MUSTER_NODE=b" &&
            [ "$(cat "/proc/$p/wchan" 2> /dev/null)" = unix_stream_read_generic ]; then
            return 0
        fi
    done
    return 1
}

: > "$ITEST_DIR/kills"
for kind in gloo strict_nccl gloo+spare strict_nccl+spare; do # (itest-lib sets $job)
    backend=${kind%+spare}
    spare=0
    [ "$kind" = "$backend" ] || spare=1
    TIMING=$ITEST_DIR/$backend-$spare.timing  # itest-lib's functions set $name
    cat > "$ITEST_DIR/$backend-$spare.json" <<JSON
{"name": "$backend-$spare", "nodes": 2, "max_restarts": 1000, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "stop_grace_ms": 1000, "restart_backoff_ms": 0, "warm_spares": $spare,
 "rank_cmd": ["$PY", "$SCRIPT", "--elastic", "--backend", "$backend", "--steps", "100000", "--step-sleep", "0.05",
              "--timing-file", "$TIMING"]}
JSON
    : > "$TIMING"
    start_pair_job "$ITEST_DIR/$backend-$spare.json"
    last=0
    i=0
    while [ $i -lt "$RUNS" ]; do
        n=0
        until [ "$(timing since "$last")" -ge 5 ]; do
            n=$((n + 1)); [ $n -lt 600 ] || fail "$kind: the ranks did not make 5 steps within 120 s (kill $i)"; sleep 0.2
        done
        if [ "$spare" = 1 ]; then
            n=0
            until spare_ready; do
                n=$((n + 1)); [ $n -lt 1200 ] || fail "$kind: node b's warm spare not ready within 120 s (kill $i)"; sleep 0.1
            done
        fi
        # the last process that said it started as rank 3 (a warm spare's command line does not name the script)
        victim=$(awk '$1 == "start" && $2 == 3 { p = $4 } END { print p }' "$TIMING")
        [ -n "$victim" ] || fail "$kind: no rank 3 process"
        last=$(wall)
        kill -9 "$victim"
        restarts=$(timing restarts "$last")
        n=0
        until [ "$(timing since "$last" "$restarts")" -ge 1 ]; do
            n=$((n + 1)); [ $n -lt 600 ] || fail "$kind: no step on every rank within 120 s of kill $((i + 1))"; sleep 0.1
        done
        echo "$kind $(timing healed "$last" "$restarts")" >> "$ITEST_DIR/kills"
        i=$((i + 1))
    done
    end_pair_job
    pkill -9 -f "$TIMING" 2> /dev/null || true
done
[ ! -s "$STRICT_NCCL_LOG" ] || fail "a strict_nccl group was destroyed after an abort: $(cat "$STRICT_NCCL_LOG")"

PYTHONPATH="$(pwd)/clients/python" "$PY" tests/bench/bench_fence.py > "$ITEST_DIR/fence"
python3 - "$ITEST_DIR/kills" "$ITEST_DIR/fence" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    backend, s = line.split()
    rows.setdefault(backend, []).append(float(s))
print("== strict heal: rank 3 SIGKILLed -> next step on every rank, ddp_train.py --elastic, 2 agents x 2 ranks "
      "(CPU, loopback)")
med = {}
for backend, what in (("gloo", "gloo"), ("strict_nccl", "strict_nccl (NCCL-like: aborted, never destroyed)"),
                      ("gloo+spare", "gloo, warm spare"), ("strict_nccl+spare", "strict_nccl, warm spare")):
    v = rows[backend]
    med[backend] = statistics.median(v)
    print(f"  {what:<52} median {med[backend]:6.2f} s ({min(v):.2f}-{max(v):.2f}, {len(v)} kills)")
print(f"  strict_nccl / gloo: {med['strict_nccl'] / med['gloo']:.2f}x without a spare, "
      f"{med['strict_nccl+spare'] / med['gloo+spare']:.2f}x with one; the spare: "
      f"{med['gloo'] / med['gloo+spare']:.2f}x faster on gloo, {med['strict_nccl'] / med['strict_nccl+spare']:.2f}x on strict_nccl")
print(open(sys.argv[2]).read().rstrip())
PY
