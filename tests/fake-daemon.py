#!/usr/bin/env python3
"""fake-daemon: a listener that does not know the cluster token, at an
agent's --daemon address (a spoofed master, a retired one's address), for
tests/integration/auth_mutual.sh.

    fake-daemon.py PORT MARKER

To every connection, once its HELLO has come, it sends in one burst what
would take the agent over if it were believed: a CHALLENGE whose proof is
made up (on odd connections; on even ones no CHALLENGE at all), a WELCOME
with the highest term (which would make the agent refuse the real leader),
an ASSIGN of one rank whose job's rank_cmd creates MARKER, COMMAND start
and a LOG_REQUEST; then it answers nothing. Each connection is logged as
"connection N: HELLO from NODE (mode)".
"""
import json
import os
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import muster_wire as w  # noqa: E402

TERM_MAX = (1 << 53) - 1


def burst(node, marker, with_challenge):
    job = {"name": "taken", "nodes": 1, "rank_cmd": ["/bin/sh", "-c", "touch %s; sleep 30" % marker]}
    frames = []
    if with_challenge:
        frames.append(w.frame("CHALLENGE", {"nonce": os.urandom(32).hex(), "hmac": os.urandom(32).hex()}))
    frames += [
        w.frame("WELCOME", {"heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 60000, "lease_ms": 60000,
                            "session": 7, "job": job, "term": TERM_MAX}),
        w.frame("ASSIGN", {"generation": 1, "world_size": 1, "ranks": [{"rank": 0, "local_rank": 0, "device": 0}],
                           "node_rank": 0, "nnodes": 1, "restart_count": 0, "master_addr": "127.0.0.1",
                           "master_port": 29999, "job": job, "term": TERM_MAX}),
        w.frame("COMMAND", {"generation": 1, "action": "start", "term": TERM_MAX}),
        w.frame("LOG_REQUEST", {"id": 1, "rank": 0, "generation": 0, "offset": 0, "tail": 0, "max": 100}),
    ]
    return b"".join(frames)


def serve(conn, n, marker):
    try:
        conn.settimeout(10)
        whole = w.read_whole(conn)
        node = json.loads(whole[8:]).get("node", "?")
        mode = "made-up proof" if n % 2 else "no challenge"
        print("connection %d: HELLO from %s (%s)" % (n, node, mode), flush=True)
        conn.sendall(burst(node, marker, n % 2 == 1))
        while conn.recv(65536):
            pass
    except (OSError, EOFError, ValueError):
        pass
    finally:
        conn.close()


def main():
    port, marker = int(sys.argv[1]), sys.argv[2]
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    n = 0
    while True:
        conn, _ = ls.accept()
        n += 1
        threading.Thread(target=serve, args=(conn, n, marker), daemon=True).start()


main()
