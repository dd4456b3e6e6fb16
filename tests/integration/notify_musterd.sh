#!/bin/sh
# musterd speaks the systemd notify protocol to a socket of the test's own:
# READY=1 once serving, STATUS= lines, WATCHDOG=1 at half of WATCHDOG_USEC,
# STOPPING=1 on SIGTERM, in that order.
# itest: solo
set -eu
. tests/itest-lib.sh

echo '{"name": "notify", "nodes": 1}' > "$ITEST_DIR/job.json"
make_token "$ITEST_DIR/token"
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

CTL=$(free_port); HTTP=$(free_port)
NOTIFY_SOCKET="$SOCK" WATCHDOG_USEC=200000 "$BUILD/musterd" --job "$ITEST_DIR/job.json" \
    --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" --state-dir "$ITEST_DIR/state" \
    --token-file "$ITEST_DIR/token" > "$ITEST_DIR/musterd.log" 2>&1 &
DAEMON_PID=$!
ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
wait_for 10 'd["state"] == "waiting"' || fail "musterd not serving"
sleep 0.5 # several watchdog periods (100 ms each)
kill -TERM "$DAEMON_PID"
i=0; while pid_alive "$LISTENER" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
cat "$ITEST_DIR/notify.txt"
python3 - "$ITEST_DIR/notify.txt" <<'PY' || fail "notifications missing or out of order"
import sys
lines = [l.strip() for l in open(sys.argv[1]) if l.strip()]
kinds = []
for l in lines:
    for part in l.split("|"):
        kinds.append(part.split("=")[0] + ("=" + part.split("=")[1] if part.startswith(("READY", "WATCHDOG", "STOPPING")) else ""))
ready = kinds.index("READY=1")
status = [i for i, k in enumerate(kinds) if k == "STATUS"]
wd = [i for i, k in enumerate(kinds) if k == "WATCHDOG=1"]
stop = kinds.index("STOPPING=1")
assert status and wd, kinds
assert ready < stop and wd[0] < stop and stop == len(kinds) - 1, kinds
assert len(wd) >= 3, "expected several WATCHDOG=1 in 0.5 s at a 100 ms period, got %d" % len(wd)
assert any("waiting: 0 of 1 nodes joined" in l for l in lines), lines
PY
echo "notify: ok"
