"""muster_rank: tell muster how a training program is doing (standard library only).

Under muster-worker every rank inherits a control socket, named by the
environment variable MUSTER_CTL_FD. This module speaks the rank's side of it
as "The rank contract" in proto/PROTOCOL.md describes: HEARTBEAT frames with
the step, loss and throughput, so that muster shows progress and can tell a
hung rank from a slow one. Without it a rank is still supervised (its exit
drives recovery); with it the step is known and hang detection works.

    import muster_rank
    rank = muster_rank.connect()
    for step in range(start, steps):
        loss = train_step()
        rank.beat(step + 1, loss=loss.item(), tokens_per_s=tps)
        if rank.stop_requested:
            break

Outside muster (MUSTER_CTL_FD unset) connect() returns an object whose calls
do nothing, so the same script runs anywhere. No call raises because the
agent went away: the first failure is logged once on stderr and the object
then does nothing (stop_requested turns True, as the agent is gone).

Two daemon threads do the I/O, so beat() never waits on the socket: a reader
takes in what the agent sends (ASSIGN, UNIQUE_ID, COMMAND) so that the
agent's writes never back up, and a writer sends at most one HEARTBEAT per
BEAT_INTERVAL seconds, always the latest, within BEAT_INTERVAL of the call
that made it. Every method may be called from any thread. Python 3.9+.
"""

import json
import math
import os
import socket
import struct
import sys
import threading
import time

__all__ = ["connect", "Rank", "BEAT_INTERVAL"]

# Frame header: payload length, protocol version, message type (big-endian).
_HEADER = struct.Struct(">IHH")
_VERSION = 1
_MAX_PAYLOAD = 256 * 1024
_ASSIGN, _UNIQUE_ID, _HEARTBEAT, _COMMAND = 6, 7, 8, 10
_U64_MAX = 2**53 - 1  # the largest integer on the wire
_UID_LEN = 128

# At most one HEARTBEAT frame per BEAT_INTERVAL seconds. The agent relays
# its ranks' latest entries every heartbeat_interval_ms (>= 50) and hang
# detection counts in seconds, so ten frames a second lose nothing.
BEAT_INTERVAL = 0.1

_connect_lock = threading.Lock()
_connected = None


def _log(msg):
    try:
        sys.stderr.write("muster_rank: %s\n" % msg)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _env_int(name, limit):
    text = os.environ.get(name, "")
    if not (text.isascii() and text.isdigit()) or int(text) > limit:
        raise ValueError("%s: expected an integer in [0, %d], got %r" % (name, limit, text))
    return int(text)


def connect():
    """The rank's link to its agent; the same object on every call.

    Takes over the socket MUSTER_CTL_FD names and removes MUSTER_CTL_FD from
    os.environ, so that child processes (data loader workers) do not take
    the socket for theirs. When MUSTER_CTL_FD is unset, or it or RANK or
    MUSTER_GENERATION is unusable (said once on stderr), the object is
    inactive and every call does nothing.
    """
    global _connected
    with _connect_lock:
        if _connected is None:
            _connected = _open()
        return _connected


def _open():
    if not os.environ.get("MUSTER_CTL_FD"):
        return Rank(None, 0, 0)
    try:
        fd = _env_int("MUSTER_CTL_FD", 2**31 - 1)
        generation = _env_int("MUSTER_GENERATION", _U64_MAX)
        rank = _env_int("RANK", 2**32 - 1)
        sock = socket.socket(fileno=fd)
    except (ValueError, OSError) as e:
        _log("not reporting to muster: %s" % e)
        return Rank(None, 0, 0)
    sock.set_inheritable(False)
    del os.environ["MUSTER_CTL_FD"]
    return Rank(sock, generation, rank)


def _finite(x, low, high):
    """x as a float clamped to [low, high]; 0.0 when it is not finite."""
    x = float(x)
    return min(max(x, low), high) if math.isfinite(x) else 0.0


def _step(step):
    step = int(step)
    if step < 0:
        raise ValueError("step must be >= 0, got %d" % step)
    return min(step, _U64_MAX)


class Rank:
    """One rank's link to its agent. Make it with connect()."""

    def __init__(self, sock, generation, rank):
        self.generation = generation  # MUSTER_GENERATION: sent in every frame
        self.rank = rank              # RANK: the global rank this entry is for
        self._sock = sock
        self._cond = threading.Condition()
        self._dead = sock is None     # inactive: never speaks again
        self._closing = False
        self._stop = False
        self._checkpoint_asked = False
        self._assign = None
        self._uid = None
        self._out = []                # frames other than heartbeats, in order
        self._entry = None            # latest rank entry given by the program
        self._checkpoint_step = 0
        self._dirty = False           # _entry changed since the last frame
        self._seq = 0
        self._sent_at = -math.inf
        if sock is None:
            return
        os.register_at_fork(after_in_child=self._forked)
        self._reader = threading.Thread(target=self._read_loop, name="muster_rank-reader", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name="muster_rank-writer", daemon=True)
        self._reader.start()
        self._writer.start()

    # ---- what the program calls -------------------------------------------

    @property
    def active(self):
        """True while this rank reports to an agent."""
        return not self._dead

    @property
    def stop_requested(self):
        """True once the agent said COMMAND stop, or went away."""
        return self._stop

    @property
    def assignment(self):
        """The ASSIGN the agent sent (a dict: generation, world_size, ranks, job, ...), or None."""
        return self._assign

    def beat(self, step, loss=None, tokens_per_s=0.0, comm_frac=0.0):
        """Progress after a step: step is the last completed optimizer step.

        loss None, NaN or infinite is sent as null; tokens_per_s (this rank's
        throughput) is clamped to >= 0 and comm_frac (share of step time spent
        waiting on communication) to 0..1. Raises only for a negative step
        or an argument that is not a number; never for I/O.
        """
        if self._dead:
            return
        loss = None if loss is None else float(loss)
        entry = {"rank": self.rank, "state": "running", "step": _step(step),
                 "loss": loss if loss is not None and math.isfinite(loss) else None,
                 "tokens_per_s": _finite(tokens_per_s, 0.0, math.inf),
                 "comm_frac": _finite(comm_frac, 0.0, 1.0)}
        with self._cond:
            self._entry = entry
            self._changed()

    def checkpoint_committed(self, step):
        """The step of the last checkpoint that is complete on disk (all ranks).

        Sent with the following heartbeats (as checkpoint_step); musterd
        records the one rank 0 reports as the job's last checkpoint.
        """
        if self._dead:
            return
        step = _step(step)
        with self._cond:
            self._checkpoint_step = step
            if self._entry is not None:
                self._changed()

    def checkpoint_requested(self):
        """True when the agent asked for a checkpoint (COMMAND checkpoint) since the last call."""
        with self._cond:
            asked, self._checkpoint_asked = self._checkpoint_asked, False
            return asked

    def unique_id(self, mine=None, timeout=None):
        """The communicator's unique id of this generation (128 bytes), or None.

        Global rank 0 passes the id it created (mine, 128 bytes); it goes up
        to musterd, which hands it to every rank. Every rank (rank 0 too)
        then waits for it at most timeout seconds (None: until it comes).
        None when inactive, when the agent went away, or on timeout.
        """
        if mine is not None:
            mine = bytes(mine)
            if len(mine) != _UID_LEN:
                raise ValueError("a unique id is %d bytes, got %d" % (_UID_LEN, len(mine)))
            self._send_later(_UNIQUE_ID, {"generation": self.generation, "id": mine.hex()})
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._uid is None and not self._dead:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._uid

    def close(self, timeout=1.0):
        """Sends the latest beat if it is still held back, then closes the socket."""
        with self._cond:
            if self._dead or self._closing:
                return
            self._closing = True
            self._sent_at = -math.inf
            self._cond.notify_all()
        self._writer.join(timeout)
        self._gone(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the I/O threads ----------------------------------------------------

    def _changed(self):
        # Called with the lock held. The writer already waits for a dirty
        # entry's turn; wake it only when the entry was clean.
        if not self._dirty:
            self._dirty = True
            self._cond.notify_all()

    def _send_later(self, mtype, payload):
        with self._cond:
            if self._dead:
                return
            self._out.append(_frame(mtype, payload))
            self._cond.notify_all()

    def _next_frames(self):
        """Frames to write now; blocks until there are some. None: stop."""
        with self._cond:
            while not self._dead:
                frames, self._out = self._out, []
                if self._dirty:
                    wait = self._sent_at + BEAT_INTERVAL - time.monotonic()
                    if wait <= 0:
                        self._seq += 1
                        self._sent_at = time.monotonic()
                        self._dirty = False
                        entry = dict(self._entry)
                        if self._checkpoint_step > 0:
                            entry["checkpoint_step"] = self._checkpoint_step
                        frames.append(_frame(_HEARTBEAT, {"generation": self.generation,
                                                          "seq": self._seq, "ranks": [entry]}))
                else:
                    wait = None
                if frames:
                    return frames
                if self._closing:
                    return None
                self._cond.wait(wait)
            return None

    def _write_loop(self):
        flags = getattr(socket, "MSG_NOSIGNAL", 0)
        try:
            while True:
                frames = self._next_frames()
                if frames is None:
                    return
                self._sock.sendall(b"".join(frames), flags)
        except OSError as e:
            self._gone("cannot write to the control socket: %s" % (e.strerror or e))

    def _read_loop(self):
        buf = bytearray()
        try:
            while True:
                data = self._sock.recv(65536)
                if not data:
                    self._gone("the agent closed the control socket")
                    return
                buf += data
                while len(buf) >= _HEADER.size:
                    length, version, mtype = _HEADER.unpack_from(buf)
                    if length > _MAX_PAYLOAD or version != _VERSION:
                        self._gone("the agent sent a frame this client does not speak "
                                   "(version %d, %d bytes)" % (version, length), agent_gone=False)
                        return
                    end = _HEADER.size + length
                    if len(buf) < end:
                        break
                    payload = bytes(buf[_HEADER.size:end])
                    del buf[:end]
                    self._on_frame(mtype, payload)
        except OSError as e:
            self._gone("cannot read the control socket: %s" % (e.strerror or e))

    def _on_frame(self, mtype, payload):
        if mtype not in (_ASSIGN, _UNIQUE_ID, _COMMAND):
            return
        try:
            msg = json.loads(payload.decode("utf-8"))
            if not isinstance(msg, dict):
                return
            with self._cond:
                if mtype == _ASSIGN:
                    self._assign = msg
                elif mtype == _COMMAND and msg.get("action") == "stop":
                    self._stop = True
                elif mtype == _COMMAND and msg.get("action") == "checkpoint":
                    self._checkpoint_asked = True
                elif mtype == _UNIQUE_ID and msg.get("generation") == self.generation:
                    uid = bytes.fromhex(msg["id"])
                    if len(uid) == _UID_LEN:
                        self._uid = uid
                        self._cond.notify_all()
        except (ValueError, KeyError, TypeError):
            return  # not a frame the agent would send: skip it

    def _gone(self, why, agent_gone=True):
        """Stops speaking for good: logs why once (None: closed on purpose)."""
        with self._cond:
            if self._dead:
                return
            self._dead = True
            if agent_gone and why is not None:
                self._stop = True
            self._cond.notify_all()
        if why is not None:
            _log("%s; progress is no longer reported" % why)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _forked(self):
        # A forked child (a data loader worker) is not the rank and has no I/O
        # threads; the lock may have been held by one of them at the fork.
        self._cond = threading.Condition()
        self._dead = True


def _frame(mtype, payload):
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return _HEADER.pack(len(body), _VERSION, mtype) + body
