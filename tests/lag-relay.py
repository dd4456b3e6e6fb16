#!/usr/bin/env python3
"""lag-relay: a TCP relay on loopback that delays what the daemon sends, for
tests of an agent whose daemon answers late (tests/integration/ack_latency.sh).

    lag-relay.py LISTEN_PORT TARGET_PORT --delays-ms D1,D2,... [--life-s S]

Every connection accepted on 127.0.0.1:LISTEN_PORT is relayed to
127.0.0.1:TARGET_PORT. What the agent sends goes on at once. Each read from
the daemon is delivered after the next delay of the list, in turn (a slow
daemon, a long path: the answers come late, and not all equally late), and
never before the read before it, so every stream stays whole and in order.
The relay exits after --life-s seconds (default 120) whatever happens.
"""
import argparse
import queue
import socket
import threading
import time


def shut_both(src, dst):
    """One side ended: end the other too, so both peers see it."""
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(src, dst):
    """Agent to daemon: at once."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    shut_both(src, dst)


def lagged(src, dst, delays):
    """Daemon to agent: each read after the next delay, in order."""
    q = queue.Queue()

    def deliver():
        while True:
            due, data = q.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        shut_both(src, dst)

    threading.Thread(target=deliver, daemon=True).start()
    last, n = 0.0, 0
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            last = max(last, time.monotonic() + delays[n % len(delays)] / 1000.0)
            n += 1
            q.put((last, data))
    except OSError:
        pass
    q.put((last, None))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen", type=int)
    ap.add_argument("target", type=int)
    ap.add_argument("--delays-ms", required=True)
    ap.add_argument("--life-s", type=float, default=120.0)
    args = ap.parse_args()
    delays = [float(x) for x in args.delays_ms.split(",")]

    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", args.listen))
    lsock.listen(16)
    lsock.settimeout(0.5)
    end = time.monotonic() + args.life_s
    while time.monotonic() < end:
        try:
            agent, _ = lsock.accept()
        except socket.timeout:
            continue
        try:
            daemon = socket.create_connection(("127.0.0.1", args.target), timeout=2)
        except OSError:
            agent.close()
            continue
        daemon.settimeout(None)
        for s in (agent, daemon):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(agent, daemon), daemon=True).start()
        threading.Thread(target=lagged, args=(daemon, agent, delays), daemon=True).start()


if __name__ == "__main__":
    main()
