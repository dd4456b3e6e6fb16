#!/usr/bin/env python3
"""A stand-in for NCCL's RAS client service (NCCL 2.24+, JSON from 2.28.7) for tests.

    fake-ras.py PORT DOC_FILE [--text-only]

Listens on 127.0.0.1:PORT and speaks RAS's client protocol as NCCL does:
CLIENT PROTOCOL n -> SERVER PROTOCOL 2; TIMEOUT s -> OK; SET FORMAT json ->
OK (with --text-only: an error line, as NCCL before 2.28.7 answers);
[VERBOSE] STATUS -> the contents of DOC_FILE, read at that moment (a test
writes it once it knows its ranks' PIDs), then EOF. Each query is logged to
stderr as one line, "fake-ras: query N: ...".
"""
import socket
import sys
import threading


def serve(conn, n, doc_file, text_only):
    f = conn.makefile("rwb", buffering=0)
    said = []
    try:
        for raw in f:
            line = raw.decode(errors="replace").strip()
            said.append(line)
            word = line.upper()
            if word.startswith("CLIENT PROTOCOL"):
                f.write(b"SERVER PROTOCOL 2\n")
            elif word.startswith("TIMEOUT"):
                f.write(b"OK\n")
            elif word.startswith("SET FORMAT"):
                f.write(b"ERROR: unknown command\n" if text_only else b"OK\n")
            elif word.endswith("STATUS"):
                with open(doc_file, "rb") as d:
                    f.write(d.read())
                break
            else:
                f.write(b"ERROR: unknown command\n")
    finally:
        print(f"fake-ras: query {n}: {' | '.join(said)}", file=sys.stderr, flush=True)
        conn.close()


def main():
    port, doc_file = int(sys.argv[1]), sys.argv[2]
    text_only = "--text-only" in sys.argv[3:]
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    print(f"fake-ras: listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    n = 0
    while True:
        conn, _ = ls.accept()
        n += 1
        conn.settimeout(10)
        threading.Thread(target=serve, args=(conn, n, doc_file, text_only), daemon=True).start()


if __name__ == "__main__":
    main()
