#!/bin/sh
# REST under hostile clients, on loopback: 200 slowloris connections to
# musterd's REST port (half trickle a header byte a second, half send nothing;
# every one closed is opened again), in two phases:
#   A (8 s)  from 127.0.0.2-5, 50 each (under the per-address limit): the
#            whole-request deadline (5 s) must cut each off with a 408 and
#            none may live past 7 s;
#   B (3 s)  from 127.0.0.1, the address the checks below use too: over the
#            per-address limit, the slowest are evicted (408) for new ones.
# Throughout, /v1/status is asked every 0.2 s and an admin request every
# second from 127.0.0.1: each must be answered within 1 s.
# itest: solo
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "slowloris", "nodes": 1}
JSON
make_token "$ITEST_DIR/cluster"
make_token "$ITEST_DIR/admin"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/cluster" --admin-token-file "$ITEST_DIR/admin"

run_phase() { # PHASE SECONDS SOURCE-ADDRESSES...
python3 - "$HTTP" "$(cat "$ITEST_DIR/admin")" "$@" <<'PY' || fail "phase $1: REST did not stay answering under slowloris"
import socket, sys, time, select

port, token, phase, run_s, sources = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5:]
N, DEADLINE_S = 200, 5.0
head = b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port

def slow_open(i):
    s = socket.socket()
    s.bind((sources[i % len(sources)], 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    return {"sock": s, "opened": time.monotonic(), "next": time.monotonic(), "sent": 0, "trickle": i % 2 == 0}

def timed(method, path, auth=None):
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    req = "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n" % (method, path, port)
    if auth:
        req += "Authorization: Bearer %s\r\n" % auth
    if method == "POST":
        req += "Content-Type: application/json\r\nContent-Length: 0\r\n"
    s.sendall((req + "\r\n").encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return time.monotonic() - t0, int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0

conns = [slow_open(i) for i in range(N)]
start = time.monotonic()
lat, admin_lat, lives, answers = [], [], [], {}
next_status, next_admin, reopened = start, start + 0.5, 0
while time.monotonic() - start < run_s:
    now = time.monotonic()
    for c in conns:
        if c["trickle"] and now >= c["next"]:
            try:  # the request line and one header, then a header line that never ends
                c["sock"].send(head if c["sent"] == 0 else b"X")
                c["sent"] += 1
            except OSError:
                pass
            c["next"] = now + 1.0
    readable, _, _ = select.select([c["sock"] for c in conns], [], [], 0.02)
    for s in readable:
        i = next(k for k, c in enumerate(conns) if c["sock"] is s)
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if data.startswith(b"HTTP/1.1 "):
            code = data.split(b" ", 2)[1].decode()
            answers[code] = answers.get(code, 0) + 1
        if not data:
            lives.append(time.monotonic() - conns[i]["opened"])
            s.close()
            conns[i] = slow_open(i)
            reopened += 1
    if now >= next_status:
        dt, code = timed("GET", "/v1/status")
        assert code == 200, "GET /v1/status answered %d" % code
        lat.append(dt)
        next_status = now + 0.2
    if now >= next_admin:
        dt, code = timed("POST", "/v1/job/checkpoint", token)
        assert code == 409, "POST /v1/job/checkpoint answered %d (a waiting job: 409)" % code
        admin_lat.append(dt)
        next_admin = now + 1.0
oldest = max(time.monotonic() - c["opened"] for c in conns)
for c in conns:
    c["sock"].close()

print("phase %s: status %d requests, max %.3f s, median %.4f s; admin %d, max %.3f s" %
      (phase, len(lat), max(lat), sorted(lat)[len(lat) // 2], len(admin_lat), max(admin_lat)))
print("phase %s: slow connections closed and reopened %d (answers %s), lives %.1f..%.1f s, oldest open %.1f s" %
      (phase, reopened, answers, min(lives) if lives else 0, max(lives) if lives else 0, oldest))
assert len(lat) >= 4 * run_s - 2 and max(lat) < 1.0, "a status request took %.3f s" % max(lat)
assert len(admin_lat) >= run_s - 2 and max(admin_lat) < 1.0, "an admin request took %.3f s" % max(admin_lat)
assert answers.get("408", 0) >= N // 2, "too few 408 answers: %s" % answers
assert max(lives) < DEADLINE_S + 2 and oldest < DEADLINE_S + 2, "a slow connection lived %.1f s" % max(lives + [oldest])
if phase == "A":  # the deadline did it: nobody was evicted early
    assert min(lives) > DEADLINE_S - 0.5, "a slow connection was closed after %.1f s" % min(lives)
PY
}

run_phase A 8 127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5
grep -q "no whole request within 5000 ms" "$ITEST_DIR/musterd.log" || fail "musterd did not log the deadline"
run_phase B 3 127.0.0.1
grep -q "connections per address: closed the slowest request" "$ITEST_DIR/musterd.log" \
    || fail "musterd did not log evicting slow connections"
kill -TERM "$DAEMON_PID"
echo "rest_slowloris: ok"
