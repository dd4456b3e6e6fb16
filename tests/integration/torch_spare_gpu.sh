#!/bin/sh
# The warm spare of a GPU node (docs/spares.md, worker/agent/spare.h),
# checked on this machine's CPUs: musterd and one agent told it has a GPU
# (--devices gpu:0; nothing touches it), warm_spares 1, and warm_imports
# "muster_fakecuda,json", where muster_fakecuda loads a stand-in CUDA
# driver (a one-function libcuda.so.1 built here) with ctypes, as a library
# that initialises CUDA at import would load the real one:
#  - the first spare finds the driver mapped after that import, reports it
#    on its hand-off socket and exits untaken; the agent names the import
#    (its log, and musterd's event warm_spare_unfit from the heartbeat's
#    spare_note) and starts the next spare without it;
#  - that spare has DS_ACCELERATOR=cuda in its environment (the node has
#    job GPUs: DeepSpeed's accelerator is CUDA once it is taken), still no
#    device visible, imports json alone, and waits on its hand-off socket
#    with no libcuda mapped;
#  - no spare outlives the job.
# A CPU node's spare has no DS_ACCELERATOR (tests/integration/torch_spares.sh).
set -eu
. tests/itest-lib.sh

need_torch torch_spare_gpu torch
PY=$TORCH_PY
command -v cc > /dev/null || fail "no C compiler for the stand-in libcuda.so.1"
mkdir -p "$ITEST_DIR/mods"
echo 'int cuInit(unsigned int flags) { return flags ? 1 : 0; }' > "$ITEST_DIR/fakecuda.c"
cc -shared -fPIC -o "$ITEST_DIR/mods/libcuda.so.1" "$ITEST_DIR/fakecuda.c" || fail "cannot build the stand-in libcuda.so.1"
cat > "$ITEST_DIR/mods/muster_fakecuda.py" <<'PY'
import ctypes, os
ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libcuda.so.1")).cuInit(0)
PY
cat > "$ITEST_DIR/idle.py" <<'PY'
import os, sys, time
# A rank that waits (at most 120 s) until the test lets it end.
for _ in range(1200):
    if os.path.exists(sys.argv[1]):
        break
    time.sleep(0.1)
PY
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "sparegpu", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 5000,
 "warm_spares": 1, "warm_imports": "muster_fakecuda,json",
 "rank_cmd": ["$PY", "$ITEST_DIR/idle.py", "$ITEST_DIR/done"]}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
PYTHONPATH="$ITEST_DIR/mods" "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node g --devices gpu:0 \
    --state-dir "$ITEST_DIR/agent-state" --token-file "$ITEST_DIR/token" >> "$ITEST_DIR/agent-g.log" 2>&1 &
AGENT=$!
ITEST_PIDS="$ITEST_PIDS $AGENT"
LOG=$ITEST_DIR/agent-g.log

wait_for 60 'd["state"] == "running"' || fail "the job does not run"
wait_log 60 "$LOG" "importing muster_fakecuda (warm_imports) touched the CUDA driver (libcuda.so.1 mapped): a spare must hold no device; starting another without it (warm imports now: json)" \
    || fail "the spare that loaded the stand-in driver is not reported: $(grep 'spare' "$LOG")"
first=$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$LOG" | head -n 1)
grep -q "warm spare (pid $first): importing muster_fakecuda" "$LOG" || fail "the report is not the first spare's (pid $first)"
! grep -q "warm spare (pid $first) exited with status" "$LOG" || fail "the spare that touched the driver counts as a death"
wait_event_matching 10 'e["kind"] == "warm_spare_unfit" and e["message"] == "node g: warm spare: importing muster_fakecuda (warm_imports) touched the CUDA driver (libcuda.so.1 mapped): the node'"'"'s spares leave it out"' \
    || fail "no warm_spare_unfit event naming the import: $(curl -sf "http://127.0.0.1:$HTTP/v1/events")"
i=0
until [ "$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$LOG" | wc -l)" -ge 2 ]; do
    sleep 0.1; i=$((i + 1)); [ $i -lt 300 ] || fail "no second spare within 30 s of the report"
done
spare=$(sed -n 's/.*started a warm spare (pid \([0-9]*\)).*/\1/p' "$LOG" | sed -n 2p)
env_of() { tr '\0' '\n' < "/proc/$spare/environ"; }
env_of | grep -qx 'DS_ACCELERATOR=cuda' || fail "the GPU node's spare has no DS_ACCELERATOR=cuda"
env_of | grep -qx 'CUDA_VISIBLE_DEVICES=' || fail "the spare sees a device"
env_of | grep -qx 'MUSTER_WARM_IMPORTS=json' || fail "the next spare still imports muster_fakecuda: $(env_of | grep WARM)"
i=0
until [ "$(cat "/proc/$spare/wchan" 2>/dev/null)" = unix_stream_read_generic ]; do
    sleep 0.1; i=$((i + 1)); [ $i -lt 600 ] || fail "the second spare did not finish its imports within 60 s"
done
! grep -q '/libcuda\.so' "/proc/$spare/maps" || fail "the waiting spare has libcuda mapped"
echo "a warm import that loaded libcuda: reported, the next spare left it out; DS_ACCELERATOR=cuda on the GPU node: ok"

touch "$ITEST_DIR/done"
wait_for 60 'd["state"] == "completed"' || fail "the job did not complete"
wait_exit "$spare" 10 || fail "spare $spare outlived the job"
echo "torch_spare_gpu: ok"
