#!/bin/sh
# The service side of musterd and muster-worker, as systemd runs them:
# - musterd with no arguments reads $CONFIGURATION_DIRECTORY/musterd.json;
#   --config FILE plus a flag: the flag wins;
# - muster-worker with no arguments reads $CONFIGURATION_DIRECTORY/worker.json,
#   joins, and tells systemd READY=1 and STATUS= (joined ...) on a socket of
#   the test's own, then STOPPING=1 on SIGTERM; a flag overrides the file;
# - bad files (unknown key, bad value) stop start-up naming file and key;
# - token files readable by others are refused by both programs.
set -eu
. tests/itest-lib.sh

C="$ITEST_DIR/etc"
mkdir -p "$C"
make_token "$C/token"
CTL=$(free_port); HTTP=$(free_port)
echo '{"name": "svc", "nodes": 3}' > "$C/job.json"
cat > "$C/musterd.json" <<JSON
{"listen": "127.0.0.1:$CTL", "http": "127.0.0.1:1", "job": "job.json", "state_dir": "$ITEST_DIR/state",
 "log_level": "info"}
JSON
cat > "$C/worker.json" <<JSON
{"daemon": "127.0.0.1:$CTL", "node": "filenode", "devices": "cpu:1", "token_file": "token",
 "rank_cmd": "$PWD/$BUILD/tests/fake-rank --steps 100000"}
JSON

# musterd: default file from $CONFIGURATION_DIRECTORY (token from there too); --http overrides the file's.
CONFIGURATION_DIRECTORY="$C" "$BUILD/musterd" --http "127.0.0.1:$HTTP" > "$ITEST_DIR/musterd.log" 2>&1 &
DAEMON_PID=$!
ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
wait_for 10 'd["state"] == "waiting"' || fail "musterd with no arguments did not serve on the --http port"
echo "musterd: no arguments + \$CONFIGURATION_DIRECTORY/musterd.json, --http override: ok"

# muster-worker: no arguments, default file, notify READY after the join.
SOCK="$ITEST_DIR/notify.sock"
python3 - "$SOCK" > "$ITEST_DIR/notify.txt" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(0.2)
end = time.monotonic() + 15
while time.monotonic() < end:
    try:
        msg = s.recv(4096).decode()
    except socket.timeout:
        continue
    print(msg.replace("\n", "|"), flush=True)
    if "STOPPING=1" in msg:
        break
PY
LISTENER=$!
ITEST_PIDS="$ITEST_PIDS $LISTENER"
i=0; while [ ! -S "$SOCK" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
CONFIGURATION_DIRECTORY="$C" NOTIFY_SOCKET="$SOCK" "$BUILD/muster-worker" > "$ITEST_DIR/agent-file.log" 2>&1 &
A1=$!
ITEST_PIDS="$ITEST_PIDS $A1"
wait_for 10 '"filenode" in node' || fail "the agent started with no arguments did not join as filenode"
# A flag overrides the file: same file, another node name.
"$BUILD/muster-worker" --config "$C/worker.json" --node flagnode > "$ITEST_DIR/agent-flag.log" 2>&1 &
ITEST_PIDS="$ITEST_PIDS $!"
wait_for 10 '"flagnode" in node and d["state"] == "waiting"' || fail "--node did not override the file"
sleep 0.2
kill -TERM "$A1"
i=0; while pid_alive "$LISTENER" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
cat "$ITEST_DIR/notify.txt"
python3 - "$ITEST_DIR/notify.txt" "$CTL" <<'PY' || fail "agent notifications missing or out of order"
import sys
msgs = [l.strip() for l in open(sys.argv[1]) if l.strip()]
want = "READY=1|STATUS=joined daemon 127.0.0.1:%s as filenode, no ranks yet" % sys.argv[2]
assert msgs and msgs[0] == want, msgs
assert msgs[-1] == "STOPPING=1", msgs
assert sum(m.count("READY=1") for m in msgs) == 1, msgs
PY
echo "muster-worker: no arguments + worker.json, READY/STATUS after the join, STOPPING on SIGTERM, flag override: ok"

# expect_refusal CODE PATTERN CMD...: exits CODE and says PATTERN on stderr.
expect_refusal() {
    want=$1; pattern=$2; shift 2
    rc=0; "$@" > "$ITEST_DIR/out" 2>&1 || rc=$?
    [ "$rc" -eq "$want" ] || fail "$* exited $rc, expected $want: $(cat "$ITEST_DIR/out")"
    grep -qF -- "$pattern" "$ITEST_DIR/out" || fail "$* did not say '$pattern': $(cat "$ITEST_DIR/out")"
}
echo '{"daemon": "127.0.0.1:1", "devices": "cpu:1", "colour": "red"}' > "$ITEST_DIR/unknown.json"
expect_refusal 1 "$ITEST_DIR/unknown.json: colour: unknown key" "$BUILD/muster-worker" --config "$ITEST_DIR/unknown.json"
echo '{"daemon": "127.0.0.1:1", "devices": "cpu:99"}' > "$ITEST_DIR/bad.json"
expect_refusal 1 "$ITEST_DIR/bad.json: devices: expected cpu:N (N in 1..64), gpu:all or gpu:I,J,..., got \"cpu:99\"" \
    "$BUILD/muster-worker" --config "$ITEST_DIR/bad.json"
echo '{"listen": "everywhere"}' > "$ITEST_DIR/badd.json"
expect_refusal 1 "$ITEST_DIR/badd.json: listen: expected ADDR:PORT, got \"everywhere\"" \
    "$BUILD/musterd" --config "$ITEST_DIR/badd.json"
echo "bad config files: refused with file, key and expectation"

# Token files others can read: refused by the agent, the daemon, and for the admin token.
cp "$C/token" "$ITEST_DIR/loose"
chmod 644 "$ITEST_DIR/loose"
expect_refusal 1 "$ITEST_DIR/loose: token file has mode 0644, readable or writable by others; run \`chmod 600 $ITEST_DIR/loose\`" \
    "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --devices cpu:1 --token-file "$ITEST_DIR/loose"
expect_refusal 1 "token file has mode 0644" "$BUILD/musterd" --job "$C/job.json" --token-file "$ITEST_DIR/loose" \
    --listen 127.0.0.1:0 --http 127.0.0.1:0 --state-dir "$ITEST_DIR/state2"
chmod 640 "$ITEST_DIR/loose"
expect_refusal 1 "admin token: $ITEST_DIR/loose: token file has mode 0640" "$BUILD/musterd" --job "$C/job.json" \
    --token-file "$C/token" --admin-token-file "$ITEST_DIR/loose" --listen 127.0.0.1:0 --http 127.0.0.1:0 \
    --state-dir "$ITEST_DIR/state2"
echo "service config: ok"
