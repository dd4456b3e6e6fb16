#!/bin/sh
# Replication of memory checkpoints to the buddy node (worker/agent/memrep.h):
# musterd + 2 agents x 1 rank, each in a mount namespace of its own, the
# ranks (tests/memrep/save_rank.py) saving MIB MiB each every 5 steps. For
# each cap (memory_checkpoint_replica_mbps) it prints the median of the
# copies' own figures (an agent's "sent to the buddy: B bytes ... T ms": from
# the first piece read to the end frame sent, through musterd) as MiB/s, and
# the lag (T plus the wait for the next heartbeat that starts it is at most
# one heartbeat_interval_ms more), side by side with cp -r of one such
# checkpoint from tmpfs to tmpfs on the same machine. Knobs: MIB (16), CAPS
# ("100 100000"), STEPS (20). Needs root and mount namespaces (skipped else).
set -eu
BUILD=${BUILD:-build}
MIB=${MIB:-16}
CAPS=${CAPS:-100 100000}
STEPS=${STEPS:-20}
PY=${PYTHON:-python3}
if ! unshare -m --propagation private true 2> /dev/null; then
    echo "== memrep: mount namespaces are not permitted here (needs root): skipped"
    exit 0
fi
D=$(mktemp -d /tmp/muster-bench-memrep.XXXXXX)
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null || true; done; pkill -9 -f "$D" 2>/dev/null || true; rm -rf "$D"' EXIT
. tests/bench/mem-lib.sh
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$D/token"
chmod 600 "$D/token"
cp tests/memrep/save_rank.py "$D/"
export PYTHONPATH="$PWD/clients/python"
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "none") }'; }

echo "== memrep: 2 nodes x 1 rank, $MIB MiB a rank a checkpoint, every 5 steps, $STEPS steps"
mkdir -p /dev/shm/muster-bench-cp
base=$(mktemp -d /dev/shm/muster-bench-cp/src.XXXXXX)
head -c $((MIB << 20)) /dev/urandom > "$base/rank0.bin"
t0=$(date +%s%N); cp -r "$base" "$base.copy"; t1=$(date +%s%N)
cp_ms=$(( (t1 - t0) / 1000000 )); [ "$cp_ms" -gt 0 ] || cp_ms=1
rm -rf /dev/shm/muster-bench-cp
echo "   cp -r tmpfs -> tmpfs: $cp_ms ms ($(( MIB * 1000 / cp_ms )) MiB/s)"
for cap in $CAPS; do
    mkdir -p "$D/$cap/shm"
    cat > "$D/$cap/job.json" <<JSON
{"name": "bench", "nodes": 2, "max_restarts": 0, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 4000,
 "lease_ms": 8000, "memory_checkpoint_mb": $((MIB * 4)), "memory_checkpoint_root": "$D/$cap/shm",
 "memory_checkpoint_replica_mbps": $cap,
 "rank_cmd": ["$PY", "$D/save_rank.py", "--steps", "$STEPS", "--sleep", "0.2", "--mib", "$MIB"]}
JSON
    mem_job "$D/$cap"
    i=0
    until grep -q "every rank finished" "$D/$cap/agent-a.log" "$D/$cap/agent-b.log" 2>/dev/null && [ $i -gt 10 ] ||
        [ $i -ge 1200 ]; do sleep 0.1; i=$((i + 1)); done
    sleep 1
    kill $daemon $agents 2>/dev/null || true
    wait $daemon $agents 2>/dev/null || true
    sed -n 's/.*sent to the buddy: \([0-9]*\) bytes in [0-9]* files, \([0-9]*\) ms/\1 \2/p' "$D/$cap"/agent-*.log > "$D/$cap/sent"
    n=$(wc -l < "$D/$cap/sent")
    [ "$n" -gt 0 ] || { echo "   cap $cap MiB/s: no copy was sent"; tail -n 20 "$D/$cap"/agent-a.log; exit 1; }
    ms=$(awk '{ print $2 }' "$D/$cap/sent" | median)
    rate=$(awk '{ if ($2 > 0) printf "%d\n", $1 / 1048576 * 1000 / $2 }' "$D/$cap/sent" | median)
    echo "   cap $cap MiB/s: $n copies, median $ms ms a copy ($rate MiB/s), lag <= $ms ms + 200 ms; x$(( ms / cp_ms )) cp's time"
done
