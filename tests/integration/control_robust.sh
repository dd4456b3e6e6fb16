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
import hashlib, hmac, json, socket, struct, sys, time

port, token_path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
token = open(token_path, "rb").read().rstrip(b"\n")
TYPES = {"HELLO": 1, "CHALLENGE": 2, "RESPONSE": 3, "WELCOME": 4, "REJECT": 5, "HEARTBEAT": 8, "ERROR": 11}

def frame(t, obj=None, raw=None):
    body = raw if raw is not None else json.dumps(obj).encode()
    return struct.pack(">IHH", len(body), 1, TYPES[t]) + body

def read_frame(s):
    head = b""
    while len(head) < 8:
        chunk = s.recv(8 - len(head))
        if not chunk:
            raise EOFError("closed")
        head += chunk
    n, _, t = struct.unpack(">IHH", head)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return t, json.loads(body)

def hello(s, node):
    s.sendall(frame("HELLO", {"node": node, "addr": "127.0.0.1", "kind": "cpu", "devices": [0],
                               "device_mem_mb": 0, "generation": 0, "free_port": 0, "agent_version": "test"}))

def join(node):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    hello(s, node)
    t, m = read_frame(s)
    assert t == TYPES["CHALLENGE"], (t, m)
    mac = hmac.new(token, bytes.fromhex(m["nonce"]), hashlib.sha256).hexdigest()
    s.sendall(frame("RESPONSE", {"hmac": mac}))
    t, m = read_frame(s)
    assert t == TYPES["WELCOME"], (t, m)
    return s

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
    s.sendall(frame("HEARTBEAT", {"generation": 0, "seq": 1, "ranks": [], "extra": 1}))
    while True:
        t, m = read_frame(s)
        if t == TYPES["ERROR"]:
            assert m["code"] == "bad_request", m
            break
    # Still joined: a good heartbeat is answered.
    s.sendall(frame("HEARTBEAT", {"generation": 0, "seq": 2, "ranks": []}))
    while True:
        t, m = read_frame(s)
        if t == TYPES["HEARTBEAT"] and m["seq"] == 2:
            break
    print("skipped and still joined")
elif mode == "noread":
    s = join("q")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    end = time.monotonic() + 8
    try:
        while time.monotonic() < end:
            s.sendall(frame("HEARTBEAT", {"generation": 0, "seq": 1, "ranks": []}))
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
