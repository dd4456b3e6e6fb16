#!/bin/sh
# musterd against hostile or broken peers (raw frames from a Python client):
# a peer that resets its connection mid-handshake must not kill the daemon
# (SIGPIPE); a joined agent's frame with a bad payload is answered with
# ERROR bad_request and skipped without losing the node; a joined peer that
# never reads is cut off and SIGTERM still ends the daemon promptly.
set -eu
. tests/itest-lib.sh

echo '{"name": "robust", "nodes": 2, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000}' > "$ITEST_DIR/job.json"
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"

cat > "$ITEST_DIR/peer.py" <<'PY'
import os, socket, struct, sys, time
sys.path.insert(0, os.path.abspath("tests"))
import muster_wire as w

port, token_path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
token = open(token_path, "rb").read().rstrip(b"\n")
frame = w.frame

def hello(s, node):
    s.sendall(frame("HELLO", w.hello_fields(node, nonce=os.urandom(32).hex())))

def join(node):
    return w.join(port, token, node)[0]

if mode == "reset":
    # HELLO, then a frame out of order, then an abortive close (RST).
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        hello(s, "x")
        s.sendall(frame("HEARTBEAT", {"generation": 0, "seq": 1, "ranks": []}))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
elif mode == "badpayload":
    s = join("p")
    s.send("HEARTBEAT", {"generation": 0, "seq": 1, "ranks": [], "extra": 1})
    while True:
        t, m = s.recv()
        if t == "ERROR":
            assert m["code"] == "bad_request", m
            break
    # Still joined: a good heartbeat is answered.
    s.send("HEARTBEAT", {"generation": 0, "seq": 2, "ranks": []})
    while True:
        t, m = s.recv()
        if t == "HEARTBEAT" and m["seq"] == 2:
            break
    print("skipped and still joined")
elif mode == "noread":
    link = join("q")
    s = link.sock
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    end = time.monotonic() + 8
    try:
        while time.monotonic() < end:
            link.send("HEARTBEAT", {"generation": 0, "seq": 1, "ranks": []})
    except OSError:
        pass
    print("sent until", "closed" if time.monotonic() < end else "time limit")
PY

timeout 30 python3 "$ITEST_DIR/peer.py" "$CTL" "$ITEST_DIR/token" reset || fail "reset client failed"
sleep 0.3
pid_alive "$DAEMON_PID" || fail "musterd died when peers reset their connections (SIGPIPE?)"
check 'd["state"] == "waiting"' || fail "musterd not serving after resets"

timeout 30 python3 "$ITEST_DIR/peer.py" "$CTL" "$ITEST_DIR/token" badpayload || fail "bad payload was not skipped"
wait_event 5 'node p joined' || fail "no join event for p"

timeout 30 python3 "$ITEST_DIR/peer.py" "$CTL" "$ITEST_DIR/token" noread > "$ITEST_DIR/noread.out" 2>&1 &
NR=$!
ITEST_PIDS="$ITEST_PIDS $NR"
sleep 3
rss=$(awk '/VmRSS/ {print $2}' "/proc/$DAEMON_PID/status")
[ "$rss" -lt 200000 ] || fail "musterd RSS ${rss} kB with a peer that does not read"
kill -TERM "$DAEMON_PID"
i=0; while pid_alive "$DAEMON_PID" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
pid_alive "$DAEMON_PID" && fail "musterd did not exit within 5 s of SIGTERM with a peer that does not read"
wait "$DAEMON_PID" || fail "musterd exited non-zero"
echo "control robustness: ok (musterd RSS ${rss} kB under a non-reading peer)"
