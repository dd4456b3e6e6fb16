#!/bin/sh
# Mutual authentication and the sealed channel (issue 34), attacked on
# loopback by peers that do not know the token:
# (a) a listener at an agent's --daemon address sends CHALLENGE (a made-up
#     proof, or none), WELCOME with the highest term and an ASSIGN whose
#     rank_cmd creates a file: nothing runs, the agent says why and counts,
#     and with the real musterd next in its list it joins that one and its
#     ranks run (the stranger's term was not taken);
# (b) a relay changes one frame from musterd after the handshake: the agent
#     refuses it and resumes on a new connection; a relay replays one frame
#     of an agent: musterd refuses it (bad_mac), resets the link, and the
#     agent comes back;
# (c) a relay renames an agent's HELLO to a member's name: the agent refuses
#     musterd's proof, the member is undisturbed; a recorded handshake played
#     again to musterd is refused.
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
MARKER="$ITEST_DIR/stranger-ran"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"

# ---- (a) a stranger at the agent's only --daemon address
FAKE=$(free_port)
python3 tests/fake-daemon.py "$FAKE" "$MARKER" > "$ITEST_DIR/fake.log" 2>&1 &
ITEST_PIDS="$ITEST_PIDS $!"
i=0
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $FAKE), timeout=1).close()" 2>/dev/null ||
    [ $i -ge 50 ]; do sleep 0.1; i=$((i + 1)); done
"$BUILD/muster-worker" --daemon "127.0.0.1:$FAKE" --node x --devices cpu:1 --token-file "$ITEST_DIR/token" \
    --state-dir "$ITEST_DIR/agent-state" > "$ITEST_DIR/agent-x.log" 2>&1 &
X=$!
ITEST_PIDS="$ITEST_PIDS $X"
wait_log 15 "$ITEST_DIR/fake.log" "connection 4:" || fail "the agent did not come back to the stranger 4 times"
sleep 0.3
kill "$X"; wait "$X" 2>/dev/null || true
[ ! -e "$MARKER" ] || fail "the stranger's rank_cmd ran"
grep -q "refused the peer at 127.0.0.1:$FAKE: its CHALLENGE does not prove the cluster token" "$ITEST_DIR/agent-x.log" ||
    fail "the agent does not say the stranger's proof failed"
grep -q "refused the peer at 127.0.0.1:$FAKE: it sent WELCOME before proving the cluster token" "$ITEST_DIR/agent-x.log" ||
    fail "the agent does not say the stranger sent WELCOME unproven"
grep -q "(3 peers refused so far)" "$ITEST_DIR/agent-x.log" || fail "the agent does not count the refusals"
! grep -q "joined daemon\|term\|rank 0 (pid" "$ITEST_DIR/agent-x.log" || fail "the agent acted on the stranger's frames"
echo "(a) a stranger's CHALLENGE, WELCOME, ASSIGN, COMMAND, LOG_REQUEST: nothing acted on; $(grep -c 'refused the peer' "$ITEST_DIR/agent-x.log") refusals logged"

# The real musterd after the stranger in the list: joined, and its frames
# (term 0: no store) obeyed, so the stranger's term was not taken.
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "auth", "nodes": 3, "batch": 12, "max_restarts": 10, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 4000, "stop_grace_ms": 1000}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
mkdir -p "$ITEST_DIR/pids-a"
FAKE_RANK_PIDDIR="$ITEST_DIR/pids-a" "$BUILD/muster-worker" --daemon "127.0.0.1:$FAKE,127.0.0.1:$CTL" --node a \
    --devices cpu:2 --token-file "$ITEST_DIR/token" --state-dir "$ITEST_DIR/agent-state" --rank-cmd "$RANK_CMD" \
    > "$ITEST_DIR/agent-a.log" 2>&1 &
ITEST_PIDS="$ITEST_PIDS $!"

# ---- (b) b through a relay that changes a frame of musterd's, c through one
# that replays a frame of the agent's
REAL=$CTL
# relay MODE: a relay to the real musterd (its port in RELAY, its log relay-MODE.log).
relay() {
    start_relay tests/auth-relay.py "$1"
    mv "$ITEST_DIR/relay.log" "$ITEST_DIR/relay-$1.log"
}
# via PORT NAME NDEV: an agent whose --daemon is 127.0.0.1:PORT.
via() {
    CTL=$1; shift
    start_agent "$@" --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
    CTL=$REAL
}
relay tamper
via "$RELAY" b 2
relay replay
via "$RELAY" c 2
wait_for 30 'd["state"] == "running" and running == 6' || fail "the job of a, b and c did not run"
grep -q "refused the peer at 127.0.0.1:$FAKE" "$ITEST_DIR/agent-a.log" || fail "agent a did not refuse the stranger first"
grep -q "joined daemon at 127.0.0.1:$CTL as node a" "$ITEST_DIR/agent-a.log" || fail "agent a did not join the real musterd"
[ ! -e "$MARKER" ] || fail "the stranger's rank_cmd ran"
echo "(a) agent a refused the stranger, joined the real musterd next in its list; its ranks run"

wait_log 10 "$ITEST_DIR/agent-b.log" "failed authentication" || fail "agent b did not refuse the changed frame"
grep -q "tampered" "$ITEST_DIR/relay-tamper.log" || fail "the relay did not change a frame"
wait_log 10 "$ITEST_DIR/agent-b.log" "session with the daemon at .* resumed on a new connection" ||
    fail "agent b did not resume its session after the changed frame"
wait_event 10 'bad_mac' || fail "musterd did not refuse the replayed frame (no bad_mac event)"
wait_log 10 "$ITEST_DIR/agent-c.log" "lost the daemon" || fail "agent c's link was not reset"
wait_for 30 'd["state"] == "running" and running == 6 and all(n["state"] == "joined" for n in d["nodes"])' ||
    fail "the job did not run again with a, b and c"
[ "$(grep -c 'joined daemon' "$ITEST_DIR/agent-c.log")" -ge 2 ] || fail "agent c did not join again"
echo "(b) a changed frame: refused by agent b, link reset, session resumed; a replayed frame: refused by musterd, agent c back"

# ---- (c) a relayed handshake under another node's name, and a replayed one
relay rename:a
via "$RELAY" d 1
D=$AGENT_PID
wait_log 10 "$ITEST_DIR/agent-d.log" "its CHALLENGE does not prove the cluster token" ||
    fail "agent d did not refuse musterd's proof for a renamed HELLO"
grep -q "renamed d -> a" "$ITEST_DIR/relay-rename:a.log" || fail "the relay did not rename the HELLO"
wait_event 5 "node a from .* refused musterd's proof" || fail "musterd did not record the refused proof"
kill "$D"
check 'd["state"] == "running" and running == 6 and all(n["state"] == "joined" for n in d["nodes"])' ||
    fail "the renamed handshake disturbed the job"
echo "(c) a HELLO renamed on the way: musterd's proof refused by the agent; node a undisturbed"

relay record
via "$RELAY" e 1
E=$AGENT_PID
wait_log 10 "$ITEST_DIR/relay-record.log" "replayed handshake:" || fail "the relay did not replay the handshake"
grep -q "replayed handshake: musterd answered REJECT, then closed\|replayed handshake: musterd closed" "$ITEST_DIR/relay-record.log" ||
    fail "the replayed handshake was not refused: $(cat "$ITEST_DIR/relay-record.log")"
wait_event 5 "node e from .* failed authentication: wrong cluster token" || fail "musterd did not refuse the replayed proof"
kill "$E"
check 'd["state"] == "running" and running == 6' || fail "the replayed handshake disturbed the job"
[ ! -e "$MARKER" ] || fail "the stranger's rank_cmd ran"
echo "(c) a recorded handshake played again: refused"

# ---- (d) a churn of wrong proofs: counted, one auth_failed event for them
first=$(curl -sf "http://127.0.0.1:$HTTP/v1/events" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["events"][0], sort_keys=True))')
python3 - "$CTL" <<'PY'
import os, socket, sys
sys.path.insert(0, os.path.abspath("tests"))
import muster_wire as w
for _ in range(300):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    s.sendall(w.frame("HELLO", w.hello_fields("z", nonce=os.urandom(32).hex())))
    w.read_whole(s)
    s.sendall(w.frame("RESPONSE", {"hmac": os.urandom(32).hex()}))
    try:
        w.read_whole(s)
    except (OSError, EOFError):
        pass
    s.close()
PY
wait_event 5 "node z from" || fail "no auth_failed event for the wrong proofs"
sleep 1 # the REST snapshot follows the loop
curl -sf "http://127.0.0.1:$HTTP/v1/events" > "$ITEST_DIR/events.json"
python3 - "$ITEST_DIR/events.json" "$first" <<'PY' || fail "auth_failed events not coalesced: $(tail -c 600 "$ITEST_DIR/events.json")"
import json, sys
events = json.load(open(sys.argv[1]))["events"]
z = [e for e in events if e["kind"] == "auth_failed" and "node z from" in json.dumps(e)]
assert len(z) == 1, len(z)
assert json.dumps(events[0], sort_keys=True) == sys.argv[2], "the oldest event was pushed out"
print("(d) 300 wrong proofs: 1 auth_failed event; the oldest event kept")
PY

# ---- (e) a stranger naming a member does not evict the member's pending claim
echo '{"name": "claims", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 5000}' > "$ITEST_DIR/claims.json"
rm -rf "$ITEST_DIR/state"
start_daemon "$ITEST_DIR/claims.json" --token-file "$ITEST_DIR/token"
python3 - "$CTL" "$ITEST_DIR/token" <<'PY' || fail "a stranger's HELLO evicted the member's resuming connection"
import hmac, json, os, socket, sys, time
sys.path.insert(0, os.path.abspath("tests"))
import muster_wire as w
port, token = int(sys.argv[1]), open(sys.argv[2], "rb").read().rstrip(b"\n")
old, welcome = w.join(port, token, "m")
session = welcome["session"]
# The member resumes its session on a new connection: HELLO, CHALLENGE ...
s = socket.create_connection(("127.0.0.1", port), timeout=5)
nonce = os.urandom(32)
hello = w.frame("HELLO", w.hello_fields("m", nonce=nonce.hex(), session=session))
s.sendall(hello)
bind = w.Bind(hello, nonce, "m", session)
m = json.loads(w.read_whole(s)[8:])
bind.daemon_nonce = bytes.fromhex(m["nonce"])
assert hmac.compare_digest(w.proof(token, bind, "daemon"), bytes.fromhex(m["hmac"]))
# ... while strangers name it, without its session or with a wrong one.
strangers = []
for extra in ({}, {"session": session + 1}, {}):
    x = socket.create_connection(("127.0.0.1", port), timeout=5)
    x.sendall(w.frame("HELLO", w.hello_fields("m", nonce=os.urandom(32).hex(), **extra)))
    w.read_whole(x)
    strangers.append(x)
time.sleep(0.3)
s.sendall(w.frame("RESPONSE", {"hmac": w.proof(token, bind, "agent").hex()}))
link = w.Link(s, w.Channel(token, bind, "agent"))
t, m = link.recv()
assert t == "WELCOME", (t, m)
print("(e) the member resumed its session past 3 strangers naming it")
PY
wait_event 5 "node_resumed" || fail "no node_resumed event"
echo "auth mutual: ok"
