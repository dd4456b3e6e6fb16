#!/usr/bin/env python3
"""flap-relay: a TCP relay on loopback that can cut its link, for link-flap
tests without network namespaces (tests/integration/link_flap_relay.sh).

    flap-relay.py LISTEN_PORT TARGET_PORT [--stall-s S] [--cut-s S] [--life-s S]

Every connection accepted on 127.0.0.1:LISTEN_PORT is relayed to
127.0.0.1:TARGET_PORT. SIGUSR1 cuts the link: nothing is relayed either way
and no connection is accepted (connections arriving meanwhile wait in the
listen backlog). SIGUSR2 restores it: new connections flow at once, but the
connections that were open during the cut stay silent --stall-s seconds more
(default 3), as TCP's retransmission backoff keeps a real connection silent
after a real cut (0.2, 0.6, 1.4, 3 s after its first lost segment), then
deliver what they hold. Nothing is dropped, so every stream stays whole.
SIGHUP cuts the link right after the next HEARTBEAT the daemon sends (an
answer: the worst moment for an agent's stall detection, which counts from
the next heartbeat that asks) and restores it --cut-s seconds later
(default 0.2), as SIGUSR1 and SIGUSR2 would.
The relay exits after --life-s seconds (default 120) whatever happens.
"""
import argparse
import selectors
import signal
import socket
import time

CHUNK = 65536
HEARTBEAT = 8  # frame type (proto/proto.h)


def frames(pending):
    """The types of the whole frames at the start of pending (bytes of a
    stream: an 8-byte header, payload length then version and type, and the
    payload), and what follows them."""
    types = []
    while len(pending) >= 8 and len(pending) >= 8 + int.from_bytes(pending[:4], "big"):
        types.append(int.from_bytes(pending[6:8], "big"))
        pending = pending[8 + int.from_bytes(pending[:4], "big"):]
    return types, pending


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen", type=int)
    ap.add_argument("target", type=int)
    ap.add_argument("--stall-s", type=float, default=3.0)
    ap.add_argument("--cut-s", type=float, default=0.2)
    ap.add_argument("--life-s", type=float, default=120.0)
    args = ap.parse_args()

    state = {"cut": False, "restored_at": None}
    signal.signal(signal.SIGUSR1, lambda *_: state.update(cut=True))
    signal.signal(signal.SIGUSR2, lambda *_: state.update(cut=False, restored_at=time.monotonic()))
    state["armed"] = False  # SIGHUP: cut after the next answer
    state["restore_at"] = None
    signal.signal(signal.SIGHUP, lambda *_: state.update(armed=True))

    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", args.listen))
    lsock.listen(128)
    lsock.setblocking(False)

    sel = selectors.DefaultSelector()
    peer = {}         # socket -> the other end of its pair
    frozen = {}       # socket -> monotonic time it flows again (inf while cut)
    pending = {}      # a daemon-side socket -> what it relayed past its last whole frame
    end = time.monotonic() + args.life_s

    def close_pair(s):
        for x in (s, peer.get(s)):
            if x is None:
                continue
            if x in frozen:
                del frozen[x]
            try:
                sel.unregister(x)
            except (KeyError, ValueError):
                pass
            peer.pop(x, None)
            pending.pop(x, None)
            x.close()

    while time.monotonic() < end:
        now = time.monotonic()
        if state["restore_at"] is not None and now >= state["restore_at"]:
            state.update(cut=False, restored_at=now, restore_at=None)
        cut = state["cut"]
        # What may move now: the listener when the link is up; each relayed
        # socket unless it is frozen.
        want = {}
        if not cut:
            want[lsock] = True
        for s in peer:
            if cut:
                frozen[s] = float("inf")
            elif frozen.get(s) == float("inf"):
                frozen[s] = state["restored_at"] + args.stall_s
            if frozen.get(s, 0) <= now:
                frozen.pop(s, None)
                want[s] = True
        for s in list(sel.get_map().values()):
            if s.fileobj not in want:
                sel.unregister(s.fileobj)
        for s in want:
            if s not in sel.get_map():
                sel.register(s, selectors.EVENT_READ)
        for key, _ in sel.select(timeout=0.02):
            s = key.fileobj
            if s is lsock:
                try:
                    c, _ = lsock.accept()
                except BlockingIOError:
                    continue
                try:
                    t = socket.create_connection(("127.0.0.1", args.target), timeout=2)
                except OSError:
                    c.close()
                    continue
                c.setblocking(True)
                t.setblocking(True)
                peer[c], peer[t] = t, c
                pending[t] = b""
                continue
            if s not in peer:
                continue
            try:
                data = s.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                close_pair(s)
                continue
            try:
                peer[s].sendall(data)
            except OSError:
                close_pair(s)
                continue
            if s in pending:
                types, pending[s] = frames(pending[s] + data)
                if state["armed"] and HEARTBEAT in types and not state["cut"]:
                    state.update(armed=False, cut=True, restore_at=time.monotonic() + args.cut_s)


if __name__ == "__main__":
    main()
