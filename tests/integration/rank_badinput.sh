#!/bin/sh
# Bad input around rank programs, each answered by a clear error that names
# what was wrong while musterd and the agent stay up: a rank command that
# does not exist or is not executable (command line and job spec), a
# rank_cmd of the wrong type, error files that are not JSON or are huge, a
# master_port_range with no free port (the job waits, then forms when a
# port frees). Also: in --from-env mode a rank gets the job's MASTER_ADDR /
# MASTER_PORT, not the platform's (which name musterd's control port).
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
echo '{"name": "bad", "max_restarts": 0}' > "$ITEST_DIR/job.json"

# expect_usage RC PATTERN CMD...: the command exits RC and says PATTERN.
expect_exit() {
    want=$1; pattern=$2; shift 2
    rc=0; "$@" > "$ITEST_DIR/out" 2>&1 || rc=$?
    [ "$rc" -eq "$want" ] || fail "$* exited $rc, expected $want: $(cat "$ITEST_DIR/out")"
    grep -q "$pattern" "$ITEST_DIR/out" || fail "$* did not say '$pattern': $(cat "$ITEST_DIR/out")"
}

W="$BUILD/muster-worker --local --job $ITEST_DIR/job.json --devices cpu:1"
expect_exit 2 "cannot run '/nonexistent/train': No such file or directory" $W -- /nonexistent/train
expect_exit 2 "cannot run 'no-such-trainer-xyz': not found in PATH" $W -- no-such-trainer-xyz --lr 1
printf '#!/bin/sh\nexit 0\n' > "$ITEST_DIR/notexec"
chmod 644 "$ITEST_DIR/notexec"
expect_exit 2 "cannot run '$ITEST_DIR/notexec': Permission denied" $W --rank-cmd "$ITEST_DIR/notexec"
expect_exit 2 "give the rank command once" $W --rank-cmd "$BUILD/tests/fake-rank" -- "$BUILD/tests/fake-rank"
echo '{"name": "bad", "rank_cmd": 5}' > "$ITEST_DIR/badtype.json"
expect_exit 1 "rank_cmd: expected a command string or an array of strings, got an integer" \
    "$BUILD/muster-worker" --local --job "$ITEST_DIR/badtype.json" --devices cpu:1
echo '{"name": "bad", "rank_cmd": ["python3", ""]}' > "$ITEST_DIR/badarg.json"
expect_exit 1 "rank_cmd: expected a non-empty string without NUL at index 1" \
    "$BUILD/muster-worker" --local --job "$ITEST_DIR/badarg.json" --devices cpu:1
echo "rank commands that cannot run, or are of the wrong type: refused at start: ok"

# Under musterd + an agent: the job's rank_cmd cannot run; error files that cannot be used.
cat > "$ITEST_DIR/job1.json" <<JSON
{"name": "bad", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "rank_cmd": ["$ITEST_DIR/missing-trainer", "--lr", "3e-4"]}
JSON
start_daemon "$ITEST_DIR/job1.json" --token-file "$ITEST_DIR/token"
start_agent a 1 --token-file "$ITEST_DIR/token"
AGENT=$AGENT_PID
wait_for 20 'd["state"] == "failed"' || fail "a job whose rank_cmd cannot run did not fail"
check '"cannot run '"'$ITEST_DIR/missing-trainer'"': no such file or directory (the job'"'"'s rank_cmd)" in d["reason"]' \
    || fail "the reason does not name the rank command: $(status)"
pid_alive "$DAEMON_PID" && pid_alive "$AGENT" || fail "musterd or the agent died"
echo "a job's rank_cmd that cannot run: the job fails with the reason, daemon and agent up: ok"
kill "$DAEMON_PID" "$AGENT"; wait "$DAEMON_PID" "$AGENT" 2>/dev/null || true
rm -rf "$ITEST_DIR/state"

# run_failing NAME SCRIPT: a one-rank job whose rank runs SCRIPT (sh -c) and fails; sets REASON.
run_failing() {
    python3 - "$ITEST_DIR/$1.json" "$2" <<'PY'
import json, sys
json.dump({"name": "bad", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 200,
           "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "rank_cmd": ["sh", "-c", sys.argv[2]]},
          open(sys.argv[1], "w"))
PY
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token"
    start_agent "$1" 1 --token-file "$ITEST_DIR/token"
    AGENT=$AGENT_PID
    wait_for 20 'd["state"] == "failed"' || fail "$1: the failing rank did not fail the job"
    REASON=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_failure"]["reason"])')
    pid_alive "$DAEMON_PID" && pid_alive "$AGENT" || fail "$1: musterd or the agent died"
    kill "$DAEMON_PID" "$AGENT"; wait "$DAEMON_PID" "$AGENT" 2>/dev/null || true
    rm -rf "$ITEST_DIR/state"
}
run_failing notjson 'printf "{not json" > "$TORCHELASTIC_ERROR_FILE"; echo "boom from stderr" >&2; exit 1'
[ "$REASON" = "boom from stderr" ] || fail "not-JSON error file: reason '$REASON', expected stderr's line"
grep -q "error file .*/notjson/gen-1/rank-0/error.json is not JSON" "$ITEST_DIR/agent-notjson.log" \
    || fail "the agent does not say the error file is not JSON"
run_failing huge 'head -c 2000000 /dev/zero | tr "\0" " " > "$TORCHELASTIC_ERROR_FILE"; echo "huge: stderr speaks" >&2; exit 3'
[ "$REASON" = "huge: stderr speaks" ] || fail "huge error file: reason '$REASON'"
grep -q "holds 2000000 bytes, more than the 1048576 read" "$ITEST_DIR/agent-huge.log" \
    || fail "the agent does not say the error file is too large"
run_failing good 'printf "{\"message\": {\"message\": \"KeyError: '"'"'lr'"'"'\", \"extraInfo\": {\"py_callstack\": \"File \\\\\"/x/cfg.py\\\\\", line 7\"}}}" > "$TORCHELASTIC_ERROR_FILE"; exit 1'
[ "$REASON" = "KeyError: 'lr' (cfg.py:7)" ] || fail "good error file: reason '$REASON'"
echo "error files: not JSON and huge ones fall back to stderr with a warning; a good one is used: ok"

# A full disk does not go away by itself: the next generation waits restart_backoff_max_ms
# instead of spending max_restarts in a tight loop; the class is in status.
cat > "$ITEST_DIR/job-enospc.json" <<JSON
{"name": "bad", "nodes": 1, "max_restarts": 5, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "restart_backoff_max_ms": 2000,
 "rank_cmd": ["sh", "-c", "echo 'checkpoint: write /ckpt/step-00000010/rank-0.bin: No space left on device' >&2; exit 1"]}
JSON
start_daemon "$ITEST_DIR/job-enospc.json" --token-file "$ITEST_DIR/token"
start_agent enospc 1 --token-file "$ITEST_DIR/token"
AGENT=$AGENT_PID
wait_for 10 '(d["last_failure"] or {}).get("class") == "disk_full" and "starts in 2.0 s (the cause will not go away by itself" in (d["reason"] or "")' \
    || fail "a full disk is not classified or not backed off: $(status)"
wait_event 5 'restart_backoff' || fail "no restart_backoff event"
sleep 2.5
check 'd["restarts"] <= 2 and d["state"] != "failed"' || fail "the job spent its restarts in a tight loop: $(status)"
"$BUILD/musterctl" --server "http://127.0.0.1:$HTTP" status | grep -q "No space left on device \[disk_full\]" \
    || fail "musterctl status does not show the class"
kill "$DAEMON_PID" "$AGENT"; wait "$DAEMON_PID" "$AGENT" 2>/dev/null || true
rm -rf "$ITEST_DIR/state"
echo "disk full: classified, the next generation waits restart_backoff_max_ms: ok"

# No free port for MASTER_PORT: a listener holds the whole (one-port) range.
HOLD=$(free_port)
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); time.sleep(60)' "$HOLD" &
HOLDER=$!
ITEST_PIDS="$ITEST_PIDS $HOLDER"
sleep 0.3
cat > "$ITEST_DIR/job2.json" <<JSON
{"name": "ports", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000,
 "lease_ms": 4000, "rank_cmd": "$BUILD/tests/fake-rank --steps 20 --step-ms 20"}
JSON
start_daemon "$ITEST_DIR/job2.json" --token-file "$ITEST_DIR/token"
start_agent p 1 --token-file "$ITEST_DIR/token" --master-port-range "$HOLD-$HOLD"
AGENT=$AGENT_PID
wait_for 10 'd["state"] == "forming" and "find a free port for MASTER_PORT" in (d["reason"] or "")' \
    || fail "no free port: the job should wait with the reason: $(status)"
wait_event 5 'no_master_port' || fail "no free port: no event"
grep -q "no free port in master_port_range $HOLD-$HOLD" "$ITEST_DIR/agent-p.log" || fail "the agent does not warn"
kill "$HOLDER"; wait "$HOLDER" 2>/dev/null || true
wait_for 20 'd["state"] in ("running", "completed")' || fail "the job did not form once the port was free"
wait_for 20 'd["state"] == "completed"' || fail "the job did not complete"
echo "master_port_range with no free port: the job waits with the reason, forms when one frees: ok"
kill "$DAEMON_PID" "$AGENT"; wait "$DAEMON_PID" "$AGENT" 2>/dev/null || true

# --from-env: the platform's MASTER_ADDR/MASTER_PORT point at musterd; ranks get the job's.
PORT=$(free_port)
cat > "$ITEST_DIR/job3.json" <<JSON
{"name": "envjob", "max_restarts": 0,
 "rank_cmd": ["sh", "-c", "echo \"seen MASTER=\$MASTER_ADDR:\$MASTER_PORT RANK=\$RANK WORLD=\$WORLD_SIZE GROUP=\$GROUP_RANK/\$GROUP_WORLD_SIZE\""]}
JSON
env -i PATH="$PATH" WORLD_SIZE=1 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
    MUSTER_TOKEN_FILE="$ITEST_DIR/token" MUSTER_JOB="$ITEST_DIR/job3.json" MUSTER_DEVICES=cpu:2 \
    timeout 30 "$BUILD/muster-worker" --from-env --state-dir "$ITEST_DIR/env-state" > "$ITEST_DIR/env.log" 2>&1 \
    || fail "--from-env job failed: $(tail -5 "$ITEST_DIR/env.log")"
grep -q "rank 1: seen MASTER=127.0.0.1:29[5-9][0-9][0-9] RANK=1 WORLD=2 GROUP=0/1" "$ITEST_DIR/env.log" \
    || fail "--from-env: rank 1 did not get the job's values: $(grep seen "$ITEST_DIR/env.log")"
grep -q "seen MASTER=127.0.0.1:$PORT " "$ITEST_DIR/env.log" && fail "--from-env: a rank got the platform's MASTER_PORT"
echo "--from-env: ranks get the job's MASTER_ADDR/MASTER_PORT, RANK and WORLD_SIZE: ok"
echo "rank bad input: ok"
