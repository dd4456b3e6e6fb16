"""muster_wire: the daemon <-> agent protocol (proto/PROTOCOL.md, version 2)
for the integration tests that speak raw frames: plain frames, the join
handshake with its proofs, and the sealed channel after it.

    sys.path.insert(0, "tests"); import muster_wire as w
    link = w.join(port, token, "node-a")      # HELLO .. WELCOME, proofs checked
    link.send("HEARTBEAT", {...}); t, m = link.recv()

The cryptography is the standard library's (hmac, hashlib); HKDF is RFC 5869
written out over its HMAC, as proto/auth.c asks OpenSSL for it.
"""
import hashlib
import hmac
import json
import os
import socket
import struct

VERSION = 2
MAC_LEN = 32
TYPES = {"HELLO": 1, "CHALLENGE": 2, "RESPONSE": 3, "WELCOME": 4, "REJECT": 5, "ASSIGN": 6,
         "UNIQUE_ID": 7, "HEARTBEAT": 8, "RANK_EXIT": 9, "COMMAND": 10, "ERROR": 11,
         "LOG_REQUEST": 12, "LOG_DATA": 13, "PREFLIGHT": 14, "STACKS": 15}
NAMES = {v: k for k, v in TYPES.items()}
HEADER = struct.Struct(">IHH")


def frame(t, obj=None, raw=None):
    """A plain frame of type t (a name) with obj as JSON, or raw bytes."""
    body = raw if raw is not None else json.dumps(obj, separators=(",", ":")).encode()
    return HEADER.pack(len(body), VERSION, TYPES[t]) + body


def hkdf(ikm, salt, info, n):
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < n:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:n]


class Bind:
    """What a proof and the channel's keys are bound to (struct proto_bind)."""

    def __init__(self, hello_frame, agent_nonce, node, session=0):
        self.agent_nonce = agent_nonce
        self.daemon_nonce = b"\0" * 32
        self.digest = hashlib.sha256(hello_frame).digest()
        self.node = node.encode()
        self.session = session

    def data(self, label):
        return (label.encode() + b"\0" + self.agent_nonce + self.daemon_nonce + self.digest +
                struct.pack(">Q", self.session) + bytes([len(self.node)]) + self.node)


def proof(token, bind, side):
    """side "agent" or "daemon": the HMAC that side sends."""
    return hmac.new(token, bind.data("muster/2 %s proof" % side), hashlib.sha256).digest()


class Channel:
    """One side's sealed channel: frames out under its key, in under the peer's."""

    def __init__(self, token, bind, side):
        keys = hkdf(token, bind.agent_nonce + bind.daemon_nonce, bind.data("muster/2 channel keys"), 64)
        agent_key, daemon_key = keys[:32], keys[32:]
        self.tx_key, self.rx_key = (agent_key, daemon_key) if side == "agent" else (daemon_key, agent_key)
        self.tx_seq = self.rx_seq = 0

    def seal(self, plain):
        n = len(plain) - 8 + MAC_LEN
        head = struct.pack(">I", n) + plain[4:8]
        mac = hmac.new(self.tx_key, struct.pack(">Q", self.tx_seq) + head + plain[8:], hashlib.sha256).digest()
        self.tx_seq += 1
        return head + plain[8:] + mac

    def open(self, whole):
        """A whole sealed frame (header, payload, MAC): (type, payload); ValueError on a bad MAC."""
        body, mac = whole[:-MAC_LEN], whole[-MAC_LEN:]
        want = hmac.new(self.rx_key, struct.pack(">Q", self.rx_seq) + body, hashlib.sha256).digest()
        if not hmac.compare_digest(want, mac):
            raise ValueError("bad MAC")
        self.rx_seq += 1
        return HEADER.unpack_from(whole)[2], body[8:]


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    return buf


def read_whole(s):
    """The next frame's bytes, header included (sealed or not)."""
    head = read_exact(s, 8)
    return head + read_exact(s, HEADER.unpack(head)[0])


def hello_fields(node, **extra):
    h = {"node": node, "addr": "127.0.0.1", "kind": "cpu", "devices": [0], "device_mem_mb": 0,
         "generation": 0, "free_port": 0, "agent_version": "test"}
    h.update(extra)
    return h


class Link:
    """An agent's joined connection to musterd: sealed frames both ways."""

    def __init__(self, sock, channel):
        self.sock, self.ch = sock, channel
        self.buf = b""

    def send(self, t, obj=None, raw=None):
        self.sock.sendall(self.ch.seal(frame(t, obj, raw)))

    def recv(self):
        t, body = self.ch.open(read_whole(self.sock))
        return NAMES.get(t, t), json.loads(body)

    def poll(self):
        """One recv() of what has come (for a select loop): the whole frames
        in it, as (type, message); EOFError when musterd closed."""
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("musterd closed the connection")
        self.buf += chunk
        out = []
        while len(self.buf) >= 8 and len(self.buf) >= 8 + HEADER.unpack_from(self.buf)[0]:
            n = 8 + HEADER.unpack_from(self.buf)[0]
            t, body = self.ch.open(self.buf[:n])
            self.buf = self.buf[n:]
            out.append((NAMES.get(t, t), json.loads(body)))
        return out


def handshake(sock, token, node, **extra):
    """HELLO, CHALLENGE (musterd's proof checked), RESPONSE: the Link and
    musterd's first sealed frame (WELCOME or REJECT) as its type and message."""
    nonce = os.urandom(32)
    hello = frame("HELLO", hello_fields(node, nonce=nonce.hex(), **extra))
    sock.sendall(hello)
    bind = Bind(hello, nonce, node, extra.get("session", 0))
    whole = read_whole(sock)
    t, m = NAMES.get(HEADER.unpack_from(whole)[2]), json.loads(whole[8:])
    if t != "CHALLENGE":
        raise AssertionError("expected CHALLENGE, got %s %s" % (t, m))
    bind.daemon_nonce = bytes.fromhex(m["nonce"])
    if not hmac.compare_digest(proof(token, bind, "daemon"), bytes.fromhex(m["hmac"])):
        raise AssertionError("musterd's proof does not verify")
    sock.sendall(frame("RESPONSE", {"hmac": proof(token, bind, "agent").hex()}))
    link = Link(sock, Channel(token, bind, "agent"))
    t, m = link.recv()
    return link, t, m


def join(port, token, node, expect="WELCOME", **extra):
    """Connects to musterd on 127.0.0.1:port and joins as node: the Link
    and musterd's answer to the RESPONSE (expect: its type)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    link, t, m = handshake(s, token, node, **extra)
    assert t == expect, (t, m)
    return link, m
