#!/bin/sh
# Recovery from a rank's SIGKILL with memory checkpoints (worker/agent/memckpt.h)
# every 5 steps against disk checkpoints every 50, side by side in one run:
# musterd + 2 agents x 1 rank, each agent in a mount namespace of its own, the
# ranks (tests/memrep/save_rank.py, no torch) saving MIB MiB each per save and
# stepping every SLEEP s. Rank 1 is SIGKILLed once rank 0 printed step KILL;
# the job restarts both ranks (max_restarts 1). Per mode it prints the step
# the ranks resumed at, the steps redone (KILL - resumed), the time from the
# kill to rank 0's first step after the restart, and to rank 0's step KILL+1
# (the work lost made up). The disk mode gives the ranks a directory on
# $D (the test's disk, MUSTER_CHECKPOINT_DIR through `env`, no memory
# directory: the program's own save and load, as without muster's); the
# memory mode the agent's tmpfs (MIB x 8: keep 2 and saves that come faster than the scans prune). Knobs: MIB (4), KILL (73), SLEEP (0.05).
# Needs root and mount namespaces (skipped else).
set -eu
BUILD=${BUILD:-build}
MIB=${MIB:-4}
KILL=${KILL:-73}
SLEEP=${SLEEP:-0.05}
PY=${PYTHON:-python3}
if ! unshare -m --propagation private true 2> /dev/null; then
    echo "== memckpt recovery: mount namespaces are not permitted here (needs root): skipped"
    exit 0
fi
D=$(mktemp -d /var/tmp/muster-bench-recovery.XXXXXX)
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null || true; done; [ "${KEEP:-0}" = 1 ] || rm -rf "$D"' EXIT
. tests/bench/mem-lib.sh
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$D/token"
chmod 600 "$D/token"
cp tests/memrep/save_rank.py "$D/"
export PYTHONPATH="$PWD/clients/python"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# wait_after FILE LINE: until FILE has LINE after its first "rank 0: resumed" line past line $FROM, 60 s at most;
# prints the ms
wait_after() {
    i=0
    until awk -v l="$2" -v from="$FROM" 'f && $0 == l { found = 1 } NR > from && /^rank 0: resumed/ { f = 1 }
                                          END { exit !found }' "$1"; do
        i=$((i + 1)); [ $i -le 6000 ] || { echo "   no '$2' after the restart in $1" >&2; return 1; }
        sleep 0.01
    done
    now_ms
}
# wait_line FILE PATTERN: until a line of FILE matches (grep -E), 60 s at most; prints the ms it was seen
wait_line() {
    i=0
    until grep -Eq "$2" "$1" 2>/dev/null; do
        i=$((i + 1)); [ $i -le 6000 ] || { echo "   no '$2' in $1" >&2; tail -n 20 "$1" >&2; return 1; }
        sleep 0.01
    done
    now_ms
}

echo "== memckpt recovery: 2 nodes x 1 rank, $MIB MiB a rank a save, a step every $SLEEP s, rank 1 SIGKILLed at step $KILL"
for mode in memory disk; do
    M=$D/$mode
    mkdir -p "$M/shm" "$M/disk" "$M/barrier"
    if [ $mode = memory ]; then
        every=5
        keys="\"memory_checkpoint_mb\": $((MIB * 8)), \"memory_checkpoint_root\": \"$M/shm\","
        cmd="\"$PY\""
    else
        every=50
        keys=""
        cmd="\"env\", \"MUSTER_CHECKPOINT_DIR=$M/disk\", \"$PY\""
    fi
    cat > "$M/job.json" <<JSON
{"name": "bench", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 8000,
 "lease_ms": 16000, "stop_grace_ms": 500, "restart_backoff_ms": 0, $keys
 "rank_cmd": [$cmd, "$D/save_rank.py", "--steps", "$((KILL + 40))", "--sleep", "$SLEEP", "--every", "$every",
              "--mib", "$MIB", "--barrier", "$M/barrier"]}
JSON
    mem_job "$M"
    wait_line "$M/agent-a.log" "^rank 0: step $KILL\$" > /dev/null
    victim=""
    for p in $(pgrep -f "$D/save_rank.py" || true); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=1" || continue
        tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | grep -q "$M/barrier" && victim=$p
    done
    [ -n "$victim" ] || { echo "   $mode: no process for rank 1"; exit 1; }
    t0=$(now_ms)
    kill -9 "$victim"
    FROM=$(wc -l < "$M/agent-a.log")
    i=0 resumed=""
    while [ -z "$resumed" ] && [ $i -le 6000 ]; do
        resumed=$(awk -v from="$FROM" 'NR > from && /^rank 0: resumed at step/ { print $6; exit }' "$M/agent-a.log")
        i=$((i + 1)); sleep 0.01
    done
    [ -n "$resumed" ] || { echo "   $mode: rank 0 did not resume"; exit 1; }
    t1=$(wait_after "$M/agent-a.log" "rank 0: step $((resumed + 1))") || exit 1
    t2=$(wait_after "$M/agent-a.log" "rank 0: step $((KILL + 1))") || exit 1
    kill $daemon $agents 2>/dev/null || true
    wait $daemon $agents 2>/dev/null || true
    printf '   %-6s checkpoint every %2d steps: resumed at step %d, %2d steps redone; kill -> first step %5d ms, ' \
        $mode $every "$resumed" $((KILL - resumed)) $((t1 - t0))
    printf 'kill -> step %d %5d ms\n' $((KILL + 1)) $((t2 - t0))
    echo "$mode $((KILL - resumed)) $((t1 - t0)) $((t2 - t0))" >> "$D/figures"
done
awk '{ r[$1] = $2; f[$1] = $3; b[$1] = $4 }
     END { if (b["memory"] > 0) printf "   disk/memory: %.1fx the steps redone, %.2fx the time back to the step of the kill\n",
                                  (r["memory"] ? r["disk"] / r["memory"] : 0), b["disk"] / b["memory"] }' "$D/figures"
