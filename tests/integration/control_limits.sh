#!/bin/sh
# musterd's connection limit follows the job (nodes + nodes/4 + 64: 65 for a
# one-node job). Held idle connections fill it; every connection over it is
# answered REJECT "full" with a reason naming the limit (raw client), and a
# real agent over it logs that reason and joins once the idle connections are
# cut by the handshake deadline. The refusals' log lines are rate-limited.
set -eu
. tests/itest-lib.sh

echo '{"name": "limits", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000}' > "$ITEST_DIR/job.json"
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"

cat > "$ITEST_DIR/fill.py" <<'PY'
import json, os, socket, struct, sys, time

port, limit, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s

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

def refused(s):
    t, msg = read_frame(s)
    assert t == 5, "expected REJECT (5), got type %d: %s" % (t, msg)
    assert msg["code"] == "full", msg
    assert ("limit of %d connections" % limit) in msg["reason"], msg["reason"]
    s.close()
    return msg["reason"]

held = [connect() for _ in range(limit)]
time.sleep(0.3)  # every held one accepted before the first over the limit
reason = None
for _ in range(200):
    reason = refused(connect())
print("over the limit: REJECT full: %s" % reason)
time.sleep(1.2)  # a new rate-limit window: the next line reports what was held back
refused(connect())
open(flag, "w").close()
time.sleep(1.5)  # a real agent tries while the limit is still full
for s in held:
    s.close()
PY

python3 "$ITEST_DIR/fill.py" "$CTL" 65 "$ITEST_DIR/filled" > "$ITEST_DIR/fill.log" 2>&1 &
FILL=$!
ITEST_PIDS="$ITEST_PIDS $FILL"
i=0
while [ ! -e "$ITEST_DIR/filled" ] && [ $i -lt 200 ]; do
    pid_alive "$FILL" || { cat "$ITEST_DIR/fill.log"; fail "the raw client failed"; }
    sleep 0.05; i=$((i + 1))
done
[ -e "$ITEST_DIR/filled" ] || fail "the raw client did not fill the connection limit within 10 s"
cat "$ITEST_DIR/fill.log"

start_agent extra 1 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
i=0
until grep -q "refused node extra: full: musterd is at its limit of 65 connections" "$ITEST_DIR/agent-extra.log"; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the agent over the limit did not log the REJECT reason within 5 s"
    sleep 0.05
done
echo "agent over the limit: $(grep -m1 'refused node extra' "$ITEST_DIR/agent-extra.log")"
wait "$FILL" || fail "the raw client failed: $(cat "$ITEST_DIR/fill.log")"

# Once the held connections are gone the same agent joins and the job forms.
wait_for 30 'd["state"] == "running" and running == 1' || fail "the agent did not join after the limit freed up"

refusals=$(grep -c "refused: musterd is at its limit" "$ITEST_DIR/musterd.log" || true)
[ "$refusals" -le 15 ] || fail "$refusals refusal lines for 202 refusals: not rate-limited"
grep -q "similar lines suppressed" "$ITEST_DIR/musterd.log" || fail "no 'similar lines suppressed' line"
echo "musterd logged $refusals refusal lines and: $(grep -m1 'similar lines suppressed' "$ITEST_DIR/musterd.log")"
echo "control_limits: ok"
