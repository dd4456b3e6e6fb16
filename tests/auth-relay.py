#!/usr/bin/env python3
"""auth-relay: a TCP relay on loopback between agents and musterd that
attacks the link as someone on the path would, for
tests/integration/auth_mutual.sh. It knows no token.

    auth-relay.py LISTEN_PORT TARGET_PORT MODE

Every connection accepted on 127.0.0.1:LISTEN_PORT is relayed to
127.0.0.1:TARGET_PORT frame by frame (headers give the lengths; a sealed
frame's length counts its MAC). MODE, applied to the first connection that
sends a frame only (later ones are relayed untouched):

  tamper   the 4th frame from musterd (after CHALLENGE, WELCOME and one
           more) gets one payload byte changed on its way to the agent
  replay   the 4th frame from the agent (after HELLO, RESPONSE and one
           more) is sent to musterd twice
  rename:NAME  the agent's HELLO names node NAME instead (a relayed
           handshake to another node)
  record   relayed untouched, but the agent's HELLO and RESPONSE are kept
           and played again to musterd on a connection of the relay's own

Each thing it does is logged on stdout: "tampered", "replayed",
"renamed A -> B", "replayed handshake: ...".
"""
import json
import os
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import muster_wire as w  # noqa: E402


def say(*args):
    print(*args, flush=True)


def pump(src, dst, change):
    """Frames from src to dst, each through change(index, bytes) -> bytes."""
    i = 0
    try:
        while True:
            whole = w.read_whole(src)
            dst.sendall(change(i, whole))
            i += 1
    except (OSError, EOFError):
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def rename(whole, name):
    hello = json.loads(whole[8:])
    was = hello["node"]
    hello["node"] = name
    say("renamed %s -> %s" % (was, name))
    return w.frame("HELLO", hello)


def replay_handshake(target, hello, response):
    s = socket.create_connection(("127.0.0.1", target), timeout=5)
    s.sendall(hello)
    t = w.HEADER.unpack_from(w.read_whole(s))[2]
    if t != w.TYPES["CHALLENGE"]:
        say("replayed handshake: no CHALLENGE (type %d)" % t)
        return
    s.sendall(response)
    try:
        t = w.HEADER.unpack_from(w.read_whole(s))[2]
        say("replayed handshake: musterd answered %s, then %s" %
            (w.NAMES.get(t, t), "closed" if not s.recv(1) else "went on"))
    except (OSError, EOFError):
        say("replayed handshake: musterd closed the connection")
    s.close()


CLAIM = threading.Lock()
CLAIMED = []


def relay(agent, target, mode):
    daemon = socket.create_connection(("127.0.0.1", target))
    kept = {}
    me = {"attacked": False}

    def to_daemon(i, whole):
        if i == 0:
            with CLAIM:
                me["attacked"] = not CLAIMED
                CLAIMED.append(agent)
        if not me["attacked"]:
            return whole
        if mode.startswith("rename:") and i == 0:
            return rename(whole, mode.split(":", 1)[1])
        if mode == "replay" and i == 3:
            say("replayed")
            return whole + whole
        if mode == "record" and i in (0, 1):
            kept[i] = whole
            if i == 1:
                threading.Thread(target=replay_handshake, args=(target, kept[0], kept[1]), daemon=True).start()
        return whole

    def to_agent(i, whole):
        if me["attacked"] and mode == "tamper" and i == 3:
            b = bytearray(whole)
            b[8] ^= 0x01  # the payload's first byte: "{" becomes "z"
            say("tampered")
            return bytes(b)
        return whole

    threading.Thread(target=pump, args=(daemon, agent, to_agent), daemon=True).start()
    pump(agent, daemon, to_daemon)


def main():
    listen, target, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", listen))
    ls.listen(16)
    while True:
        agent, _ = ls.accept()
        threading.Thread(target=relay, args=(agent, target, mode), daemon=True).start()


main()
