#!/bin/sh
# Unauthenticated connections to the control port have a pool of their own
# (as large as the joined-connection limit: 65 for a one-node job) and a
# per-address limit (64); both are kept by closing the oldest stranger, so
# held idle connections never keep an agent out. A connection that sends no
# HELLO within 2 s is closed, and a frame larger than 16 KiB before
# authentication is answered REJECT bad_request naming the limit. An agent
# joins while strangers hold connections. The closing lines are rate-limited.
# itest: solo
set -eu
. tests/itest-lib.sh

echo '{"name": "limits", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000}' > "$ITEST_DIR/job.json"
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"

cat > "$ITEST_DIR/fill.py" <<'PY'
import json, socket, struct, sys, time

port, flag = int(sys.argv[1]), sys.argv[2]

def closed(s, within):
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True

def read_frame(s):
    data = b""
    while len(data) < 8:
        chunk = s.recv(8 - len(data))
        if not chunk:
            raise EOFError("closed without a frame")
        data += chunk
    n, _, t = struct.unpack(">IHH", data)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            raise EOFError("closed inside a frame")
        body += chunk
    return t, json.loads(body)

# 100 idle connections from one address: the 36 oldest are closed (the address
# holds 64 at most), the newest 64 stay until their HELLO deadline.
held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
time.sleep(0.5)
gone = [i for i, s in enumerate(held) if closed(s, 0.01)]
assert gone == list(range(36)), "expected the 36 oldest closed, got %s" % gone
print("100 idle connections: the 36 oldest closed, 64 held")
open(flag, "w").close()

# A frame over 16 KiB before authentication: REJECT bad_request.
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(struct.pack(">IHH", 20000, 2, 1) + b"{" * 17000)
t, msg = read_frame(s)
assert t == 5 and msg["code"] == "bad_request" and "16384 bytes" in msg["reason"], (t, msg)
print("oversized pre-authentication frame: REJECT bad_request: %s" % msg["reason"])

# No HELLO within 2 s: closed.
t0 = time.monotonic()
alive = [s for s in held[36:] if not closed(s, 4.0)]
assert not alive, "%d idle connections still open after 4 s" % len(alive)
print("idle connections closed by the HELLO deadline after %.1f s" % (time.monotonic() - t0))
PY

python3 "$ITEST_DIR/fill.py" "$CTL" "$ITEST_DIR/filled" > "$ITEST_DIR/fill.log" 2>&1 &
FILL=$!
ITEST_PIDS="$ITEST_PIDS $FILL"
i=0
while [ ! -e "$ITEST_DIR/filled" ] && [ $i -lt 200 ]; do
    pid_alive "$FILL" || { cat "$ITEST_DIR/fill.log"; fail "the raw client failed"; }
    sleep 0.05; i=$((i + 1))
done
[ -e "$ITEST_DIR/filled" ] || fail "the raw client did not fill the pool within 10 s"

wait "$FILL" || fail "the raw client failed: $(cat "$ITEST_DIR/fill.log")"
cat "$ITEST_DIR/fill.log"

# The agent joins while strangers hold 200 connections, re-opened as they are closed.
python3 tests/control-flood.py hold 127.0.0.1 "$CTL" 200 8 > "$ITEST_DIR/flood.log" 2>&1 &
FLOOD=$!
ITEST_PIDS="$ITEST_PIDS $FLOOD"
sleep 1
start_agent extra 1 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
wait_for 7 'd["state"] == "running" and running == 1' || fail "the agent did not join beside the held connections"
pid_alive "$FLOOD" || fail "the flood was over before the agent joined: the test proves nothing"
echo "agent joined while strangers held 200 connections"
wait "$FLOOD" || fail "the flood client failed: $(cat "$ITEST_DIR/flood.log")"

lines=$(grep -c "closed: evicted\|closed: no HELLO" "$ITEST_DIR/musterd.log" || true)
[ "$lines" -le 100 ] || fail "$lines closing lines for $(cat "$ITEST_DIR/flood.log"): not rate-limited"
grep -q "similar lines suppressed" "$ITEST_DIR/musterd.log" || fail "no 'similar lines suppressed' line"
echo "musterd logged $lines closing lines and: $(grep -m1 'similar lines suppressed' "$ITEST_DIR/musterd.log")"
echo "control_limits: ok"
