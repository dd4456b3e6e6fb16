#!/bin/sh
# An unmodified PyTorch 2.x DDP program (tests/torch/ddp_train.py without
# muster's client) as muster's ranks, seen through muster's start-up hook
# (clients/python/startup/), on musterd + 2 agents x 2 ranks on loopback:
#  (a) its optimizer steps reach /v1/ranks (no rank silent), with where each
#      rank is; the user's own sitecustomize still runs;
#  (b) a SIGSTOPped rank 3 is the one named hung, as stopped, within the
#      progress timeout, and the stacks collected on the hang are in
#      /v1/stacks;
#  (c) a rank spinning in its own Python loop is the one named hung ("not in
#      a collective"), where it spins is in its stack and in the event;
#  (d) with python_hook 0 the same program runs silent, as before: after
#      rank 0 logged its 5th step, a status built since shows every rank
#      running, silent, step unknown, and no rank armed the stack dump.
# itest: solo
set -eu
. tests/itest-lib.sh

need_torch torch_hook torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
make_token "$ITEST_DIR/token"

events() { curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events"; }
# The user's own sitecustomize, on the agents' PYTHONPATH: muster's hook must run it too.
mkdir -p "$ITEST_DIR/usersite"
printf 'import os\nopen(os.path.join(%s, "user-site-%%d" %% os.getpid()), "w").close()\n' \
    "'$ITEST_DIR/usersite'" > "$ITEST_DIR/usersite/sitecustomize.py"

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "torch-hook", "nodes": 2, "max_restarts": 6, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 500, "progress_timeout_ms": 4000,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "100000", "--step-sleep", "0.05", "--ckpt-dir", "$ITEST_DIR/ckpt",
              "--ckpt-every", "1000000", "--spin-at-step", "15", "--spin-rank", "1", "--spin-restart", "1"]}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
PYTHONPATH="$ITEST_DIR/usersite" start_agent a 2 --token-file "$ITEST_DIR/token"
PYTHONPATH="$ITEST_DIR/usersite" start_agent b 2 --token-file "$ITEST_DIR/token"

# (a) steps without the client, and where every rank is.
wait_for 90 'd["state"] == "running" and running == 4 and all(not r["silent"] and (r["step"] or 0) > 3 and r.get("where") for r in d["ranks"])' \
    || fail "(a) the unmodified DDP program's steps do not reach /v1/ranks through the hook"
check 'all("ddp_train.py:" in r["where"] for r in d["ranks"])' \
    || fail "(a) where is not the program's own frame: $(curl -sf "http://127.0.0.1:$HTTP/v1/ranks")"
n=$(ls "$ITEST_DIR/usersite" | grep -c '^user-site-' || true)
[ "$n" -ge 4 ] || fail "(a) the user's sitecustomize ran in $n processes, expected every rank's (4)"
echo "(a) unmodified DDP program: steps and where in status, user's sitecustomize chained: ok"

# (b) SIGSTOP rank 3: named, as stopped, within the progress timeout (4 s)
# plus the relay and stack window (1 s) and 3 s of heartbeats and polling
# (a loaded machine), and not before the timeout (less the step in flight).
pid=$(rank_pid "$SCRIPT.*$ITEST_DIR/ckpt" 3)
[ -n "$pid" ] || fail "(b) no process for rank 3"
t0=$(now_ms)
kill -STOP "$pid"
msg=$(event_message rank_hung 1 15)
t1=$(now_ms)
kill -CONT "$pid" 2>/dev/null || true
[ -n "$msg" ] || fail "(b) the SIGSTOPped rank was not found hung within 15 s"
[ $((t1 - t0)) -ge 3500 ] && [ $((t1 - t0)) -le 8000 ] || fail "(b) named after $((t1 - t0)) ms, not within 3.5-8 s: $msg"
case "$msg" in
"rank 3 on node b is hung: its process is stopped"*) ;;
*) fail "(b) the wrong rank, or not as stopped: $msg" ;;
esac
case "$msg" in *ddp_train.py*) ;; *) fail "(b) the event does not say where rank 3 stopped: $msg" ;; esac
echo "(b) SIGSTOP of rank 3 -> named after $((t1 - t0)) ms (3.5-8 s): $msg"
curl -sf "http://127.0.0.1:$HTTP/v1/stacks" > "$ITEST_DIR/stacks1.json" || fail "(b) GET /v1/stacks failed"
python3 - "$ITEST_DIR/stacks1.json" <<'PY' || fail "(b) /v1/stacks after the hang: $(head -c 2000 "$ITEST_DIR/stacks1.json")"
import json, sys
d = json.load(open(sys.argv[1]))
by = {r["rank"]: r for r in d["ranks"]}
assert by[3]["stopped"], by[3]
for r in (0, 1, 2):  # the others dumped their stacks: the program's frames are in them
    text = by[r].get("text") or ""
    assert "ddp_train.py" in text, (r, by[r])
    # by the hook's thread (with the GIL, thread names), not faulthandler's signal ("Current thread")
    assert '"MainThread" (most recent call first)' in text and "Current thread" not in text, (r, text)
PY
echo "(b) stacks collected on the hang: ok"

# (c) generation 2: rank 1 spins in its own loop at step 15 while the others wait for it.
wait_for 60 'd["generation"] == 2 and d["state"] == "running"' || fail "(c) no generation 2 after the hang"
msg=$(event_message rank_hung 2 45)
[ -n "$msg" ] || fail "(c) the spinning rank was not found hung"
case "$msg" in
"rank 1 on node a is hung: it is not in a collective"*spin_for_ever*) ;;
*) fail "(c) the wrong rank, or not where it spins: $msg" ;;
esac
curl -sf "http://127.0.0.1:$HTTP/v1/stacks" > "$ITEST_DIR/stacks2.json" || fail "(c) GET /v1/stacks failed"
python3 - "$ITEST_DIR/stacks2.json" <<'PY' || fail "(c) rank 1's stack lacks spin_for_ever: $(head -c 3000 "$ITEST_DIR/stacks2.json")"
import json, sys
by = {r["rank"]: r for r in json.load(open(sys.argv[1]))["ranks"]}
assert "in spin_for_ever" in by[1]["text"], by[1]
# a rank running Python is dumped by the hook's thread, never by faulthandler's walk (CPython issue 116008)
assert '"MainThread" (most recent call first)' in by[1]["text"] and "Current thread" not in by[1]["text"], by[1]
PY
echo "(c) rank spinning in a Python loop -> $msg: ok"
kill "$DAEMON_PID" 2>/dev/null || true
wait "$DAEMON_PID" 2>/dev/null || true
pkill -9 -f "$SCRIPT.*$ITEST_DIR" 2>/dev/null || true
for p in $ITEST_PIDS; do kill "$p" 2>/dev/null || true; done
rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"

# (d) python_hook 0: the program runs silent, as without muster's hook.
cat > "$ITEST_DIR/job2.json" <<JSON
{"name": "torch-nohook", "nodes": 1, "max_restarts": 0, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "python_hook": 0,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "100", "--step-sleep", "0.05", "--ckpt-dir", "$ITEST_DIR/ckpt2"]}
JSON
start_daemon "$ITEST_DIR/job2.json" --token-file "$ITEST_DIR/token"
start_agent c 2 --token-file "$ITEST_DIR/token"
# Every rank is silent before its first step, hook or not: wait for steps.
wait_log 60 "$ITEST_DIR/agent-c.log" "^rank 0: step 5 loss" || fail "(d) the job without the hook does not reach step 5"
wait_fresh 3 'd["state"] == "running" and running == 2 and all(r["silent"] and r["step"] is None for r in d["ranks"])' \
    || fail "(d) with python_hook 0 the ranks are not silent at step 5 or later: $(curl -sf "http://127.0.0.1:$HTTP/v1/ranks")"
# The hook arms the dump as the process starts (stacks-PID.txt in its rank directory) and removes it at exit.
armed=$(ls "$ITEST_DIR"/agent-state/c/gen-1/rank-*/stacks-* 2>/dev/null || true)
[ -z "$armed" ] || fail "(d) python_hook 0 still armed the stack hook: $armed"
[ -n "$(ls -d "$ITEST_DIR"/agent-state/c/gen-1/rank-0 2>/dev/null)" ] || fail "(d) no rank directory to look in"
grep -q "^rank 0: step 100 loss" "$ITEST_DIR/agent-c.log" && fail "(d) the job ended before it was checked"
wait_for 60 'd["state"] == "completed"' || fail "(d) the job without the hook did not complete"
echo "(d) python_hook 0: silent ranks, no hook: ok"
echo "torch_hook: ok"
