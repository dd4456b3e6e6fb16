#!/bin/sh
# Save time of a DeepSpeed ZeRO-3 program to a memory checkpoint directory
# (tmpfs, what MUSTER_CHECKPOINT_DIR is: docs/pytorch.md) against a disk
# directory, the same engine.save_checkpoint call, side by side in one run
# (tests/bench/bench_memckpt_save.py: 2 CPU ranks on gloo, started with
# torchrun's variables by hand, saves alternated). Knobs: SAVES (5), WIDTH
# (1024: about 8.4M parameters), MEM_DIR (a directory under /dev/shm),
# DISK_DIR (one under build/, the tree's own disk).
set -eu
BUILD=${BUILD:-build}
SAVES=${SAVES:-5}
WIDTH=${WIDTH:-1024}
PY=${BENCH_PYTHON:-${MUSTER_TORCH_PY:-$PWD/.venv/bin/python}}
if ! "$PY" -c 'import deepspeed' 2> /dev/null; then
    echo "== memckpt_save: $PY cannot import deepspeed (run: sh mk/deps.sh venv): skipped"
    exit 0
fi
MEM_DIR=${MEM_DIR:-$(mktemp -d /dev/shm/muster-bench-memckpt.XXXXXX)}
DISK_DIR=${DISK_DIR:-$(mktemp -d "$PWD/$BUILD/muster-bench-memckpt.XXXXXX")}
trap 'rm -rf "$MEM_DIR" "$DISK_DIR"' EXIT
echo "== memckpt_save: DeepSpeed ZeRO-3 bf16 MLP width $WIDTH, 2 CPU ranks, $SAVES saves to each of"
echo "   $MEM_DIR ($(df -T "$MEM_DIR" | awk 'NR == 2 { print $2 }')) and $DISK_DIR ($(df -T "$DISK_DIR" | awk 'NR == 2 { print $2 }'))"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=""
for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
        "$PY" tests/bench/bench_memckpt_save.py --deepspeed_config tests/torch/ds_zero3_config.json \
        --dirs "$MEM_DIR,$DISK_DIR" --saves "$SAVES" --width "$WIDTH" > "$DISK_DIR.rank$r.log" 2>&1 &
    pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
grep -h "save_checkpoint median" "$DISK_DIR.rank0.log" | sed 's/^/   /'
[ $rc -eq 0 ] || { tail -n 20 "$DISK_DIR.rank0.log" "$DISK_DIR.rank1.log"; rm -f "$DISK_DIR".rank*.log; exit 1; }
rm -f "$DISK_DIR".rank*.log
