"""The rank's link to its agent: `Rank`, made by `connect()`.

Two daemon threads do the I/O, so beat() never waits on the socket: a reader
takes in what the agent sends (ASSIGN, UNIQUE_ID, COMMAND) so that the
agent's writes never back up, and a writer sends at most one HEARTBEAT per
BEAT_INTERVAL seconds, always the latest, within BEAT_INTERVAL of the call
that made it, and a keepalive every KEEPALIVE_INTERVAL seconds once the rank
reported. Every method may be called from any thread.

Besides what a program calls, a Rank has the package's API for healing in
place (muster_rank.elastic): `cond`, the condition it notifies whenever what
it knows changes; `rejoin_in_place()`; `over(generation)`, `wait_over()`,
`wait_generation()` and `yield_asked()` for a generation's end; and
`set_restored()` and `left_for_grow()` for what its heartbeats say.
"""

import math
import os
import socket
import stat
import threading
import time
from typing import Optional, Tuple

from . import wire
from .log import log
from .where import where

# At most one HEARTBEAT frame per BEAT_INTERVAL seconds. The agent relays
# its ranks' latest entries every heartbeat_interval_ms (>= 50) and hang
# detection counts in seconds, so ten frames a second lose nothing.
BEAT_INTERVAL = 0.1
# A rank that reported once sends its latest entry at least this often, so
# that the agent (which leaves out a rank quiet for 1.5 s) and musterd can
# tell a rank that waits from one that cannot run.
KEEPALIVE_INTERVAL = 0.5

_connect_lock = threading.Lock()
_connected = None
# The control socket claimed from MUSTER_CTL_FD: (pid, fd, why). Kept with
# the pid that claimed it: a forked child (a data loader worker) inherits
# this module's memory, not the right to speak for the rank.
_claimed = None


def _env_int(name: str, limit: int) -> int:
    text = os.environ.get(name, "")
    if not (text.isascii() and text.isdigit()) or int(text) > limit:
        raise ValueError("%s: expected an integer in [0, %d], got %r" % (name, limit, text))
    return int(text)


def claim() -> bool:
    """Takes MUSTER_CTL_FD out of os.environ at once, so that no process this
    one starts (data loader and compile workers, subprocesses) sees it and
    takes its own descriptor of that number for the agent's socket. Keeps
    the number here, for connect(), once it checked that the descriptor is a
    socket and made it not inherited across exec. muster's start-up hook
    calls it first thing; connect() calls it too. True when this process
    holds the rank's control socket."""
    global _claimed
    text = os.environ.pop("MUSTER_CTL_FD", None)
    if text is not None:
        why = None
        fd = -1
        try:
            if not (text.isascii() and text.isdigit()) or int(text) > 2**31 - 1:
                raise ValueError("MUSTER_CTL_FD: expected an integer in [0, %d], got %r" % (2**31 - 1, text))
            fd = int(text)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise ValueError("MUSTER_CTL_FD: descriptor %d is not a socket" % fd)
            os.set_inheritable(fd, False)
        except (ValueError, OSError) as e:
            why = str(e)
        _claimed = (os.getpid(), fd, why)
    return _claimed is not None and _claimed[0] == os.getpid() and _claimed[2] is None


def connect() -> "Rank":
    """The rank's link to its agent; the same object on every call.

    Takes over the socket MUSTER_CTL_FD named (claim() removed it from
    os.environ, so that child processes such as data loader workers do not
    take the socket for theirs). When MUSTER_CTL_FD is unset, or it or RANK or
    MUSTER_GENERATION is unusable (said once on stderr), the object is
    inactive and every call does nothing.
    """
    global _connected
    with _connect_lock:
        if _connected is None:
            _connected = _open()
        return _connected


def _open() -> "Rank":
    global _claimed
    claim()
    held, _claimed = _claimed, None  # the socket is the Rank's now (or nobody's)
    if held is None or held[0] != os.getpid():
        return Rank(None, 0, 0)
    try:
        if held[2] is not None:
            raise ValueError(held[2])
        generation = _env_int("MUSTER_GENERATION", wire.U64_MAX)
        rank = _env_int("RANK", 2**32 - 1)
        sock = socket.socket(fileno=held[1])
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            sock.detach()
            raise ValueError("MUSTER_CTL_FD: descriptor %d is not the agent's socket (a Unix stream socket)"
                             % held[1])
    except (ValueError, OSError) as e:
        log("not reporting to muster: %s" % e)
        return Rank(None, 0, 0)
    sock.set_inheritable(False)
    return Rank(sock, generation, rank)


def _finite(x, low: float, high: float) -> float:
    """x as a float clamped to [low, high]; 0.0 when it is not finite."""
    x = float(x)
    return min(max(x, low), high) if math.isfinite(x) else 0.0


def _step(step) -> int:
    step = int(step)
    if step < 0:
        raise ValueError("step must be >= 0, got %d" % step)
    return min(step, wire.U64_MAX)


class Rank:
    """One rank's link to its agent. Make it with connect()."""

    def __init__(self, sock: Optional[socket.socket], generation: int, rank: int) -> None:
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
        self._own = False             # the program calls beat() itself
        self._step_at = None          # monotonic time the step last changed
        self._step_s = 0.0            # the last step's duration
        self._total_steps = 0
        self._tokens_per_step = 0.0
        self._main = threading.main_thread().ident
        self._rejoin = False          # it rejoins the next generation in place (Elastic)
        self._parked = 0              # the generation a COMMAND park announced (0: none)
        self._yield = 0               # the generation a COMMAND yield asked to leave (0: none)
        self._yielded = False         # it left its generation at a step boundary for a grow
        self._restore = None          # (from, step) of this generation's state, once known
        self._split = None            # the latest time split (split.py), sent with every heartbeat
        try:
            self._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            self._local_rank = 0
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
    def active(self) -> bool:
        """True while this rank reports to an agent."""
        return not self._dead

    @property
    def stop_requested(self) -> bool:
        """True once the agent said COMMAND stop, or went away."""
        return self._stop

    @property
    def assignment(self) -> Optional[dict]:
        """The ASSIGN the agent sent (a dict: generation, world_size, ranks, job, ...), or None."""
        return self._assign

    def beat(self, step, loss=None, tokens_per_s=None, comm_frac=0.0) -> None:
        """Progress after a step: step is the last completed optimizer step.

        loss None, NaN or infinite is sent as null; tokens_per_s (this rank's
        throughput) is clamped to >= 0 and comm_frac (share of step time spent
        waiting on communication) to 0..1. Without tokens_per_s, it is
        tokens_per_step / the step's duration when the program set
        tokens_per_step, else 0. Raises only for a negative step or an
        argument that is not a number; never for I/O. Once the program
        calls it, muster's start-up hook no longer reports steps for it.
        """
        self._own = True
        self._report(step, loss, tokens_per_s, comm_frac)

    @property
    def total_steps(self) -> int:
        """The steps the program will run, as it said (0: unknown)."""
        return self._total_steps

    @total_steps.setter
    def total_steps(self, n) -> None:
        n = _step(n)
        with self._cond:
            self._total_steps = n

    @property
    def tokens_per_step(self) -> float:
        """Tokens one optimizer step of this rank consumes (0: unknown); gives tokens/s."""
        return self._tokens_per_step

    @tokens_per_step.setter
    def tokens_per_step(self, n) -> None:
        n = float(n)
        if not math.isfinite(n) or n < 0:
            raise ValueError("tokens_per_step must be a finite number >= 0, got %r" % n)
        self._tokens_per_step = n

    def auto_step(self, step: int) -> None:
        """A step counted by the start-up hook; ignored once the program reports itself."""
        if not self._own:
            self._report(step, None, None, 0.0)

    def _report(self, step, loss, tokens_per_s, comm_frac) -> None:
        if self._dead:
            return
        step = _step(step)
        loss = None if loss is None else float(loss)
        now = time.monotonic()
        with self._cond:
            if self._entry is None or step != self._entry["step"]:
                if self._entry is not None and self._step_at is not None:
                    self._step_s = now - self._step_at
                self._step_at = now
            if tokens_per_s is None:
                tokens_per_s = self._tokens_per_step / self._step_s if self._tokens_per_step and self._step_s else 0.0
            self._entry = {"rank": self.rank, "state": "running", "step": step,
                           "loss": loss if loss is not None and math.isfinite(loss) else None,
                           "tokens_per_s": _finite(tokens_per_s, 0.0, math.inf),
                           "comm_frac": _finite(comm_frac, 0.0, 1.0)}
            self._changed()

    def current_step(self) -> Optional[int]:
        """The step last reported (by the program or the start-up hook), or None."""
        entry = self._entry
        return entry["step"] if entry is not None else None

    def set_split(self, split: dict) -> None:
        """The latest window of the time split (split.py: split_s, split_steps
        and the four shares), sent with the following heartbeats."""
        with self._cond:
            self._split = dict(split)
            if self._entry is not None:
                self._changed()

    def checkpoint_committed(self, step) -> None:
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

    def checkpoint_requested(self) -> bool:
        """True when the agent asked for a checkpoint (COMMAND checkpoint) since the last call."""
        with self._cond:
            asked, self._checkpoint_asked = self._checkpoint_asked, False
            return asked

    def unique_id(self, mine=None, timeout: Optional[float] = None) -> Optional[bytes]:
        """The communicator's unique id of this generation (128 bytes), or None.

        Global rank 0 passes the id it created (mine, 128 bytes); it goes up
        to musterd, which hands it to every rank. Every rank (rank 0 too)
        then waits for it at most timeout seconds (None: until it comes).
        None when inactive, when the agent went away, or on timeout.
        """
        if mine is not None:
            mine = bytes(mine)
            if len(mine) != wire.UID_LEN:
                raise ValueError("a unique id is %d bytes, got %d" % (wire.UID_LEN, len(mine)))
            self._send_later(wire.UNIQUE_ID, {"generation": self.generation, "id": mine.hex()})
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._uid is None and not self._dead:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._uid

    def close(self, timeout: float = 1.0) -> None:
        """Sends the latest beat if it is still held back, then closes the socket."""
        with self._cond:
            if self._dead or self._closing:
                return
            self._closing = True
            self._sent_at = -math.inf
            self._cond.notify_all()
        self._writer.join(timeout)
        self._gone(None)

    def __enter__(self) -> "Rank":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the I/O threads ----------------------------------------------------

    def _changed(self) -> None:
        # Called with the lock held. The writer already waits for a dirty
        # entry's turn; wake it only when the entry was clean.
        if not self._dirty:
            self._dirty = True
            self._cond.notify_all()

    def _send_later(self, mtype: int, payload: dict) -> None:
        with self._cond:
            if self._dead:
                return
            self._out.append(wire.encode(mtype, payload))
            self._cond.notify_all()

    def _next_frames(self) -> Optional[list]:
        """Frames to write now; blocks until there are some. None: stop."""
        with self._cond:
            while not self._dead:
                frames, self._out = self._out, []
                wait = None
                if self._entry is not None:
                    now = time.monotonic()
                    due = self._sent_at + (BEAT_INTERVAL if self._dirty else KEEPALIVE_INTERVAL)
                    if now >= due or (self._closing and self._dirty):
                        frames.append(self._heartbeat(now))
                    else:
                        wait = due - now
                if frames:
                    return frames
                if self._closing:
                    return None
                self._cond.wait(wait)
            return None

    def _heartbeat(self, now: float) -> bytes:
        """The HEARTBEAT frame of the latest entry; called with the lock held."""
        self._seq += 1
        self._sent_at = now
        self._dirty = False
        entry = dict(self._entry)
        entry["rank"] = self.rank  # a rank that rejoined may have another one now
        if self._rejoin:
            entry["rejoin"] = True
        if self._restore is not None:
            entry["restore_from"], entry["restore_step"] = self._restore
        if self._yielded:
            entry["yielded"] = True
        entry["step_age_ms"] = int((now - self._step_at) * 1000)
        if self._step_s > 0:
            entry["step_s"] = self._step_s
        if self._total_steps:
            entry["total_steps"] = self._total_steps
        if self._checkpoint_step > 0:
            entry["checkpoint_step"] = self._checkpoint_step
        if self._split is not None:
            entry.update(self._split)
        at, waiting = where(self._main)
        if at:
            entry["where"] = at
        if waiting:
            entry["waiting"] = waiting
        return wire.encode(wire.HEARTBEAT, {"generation": self.generation, "seq": self._seq, "ranks": [entry]})

    def _write_loop(self) -> None:
        flags = getattr(socket, "MSG_NOSIGNAL", 0)
        try:
            while True:
                frames = self._next_frames()
                if frames is None:
                    return
                self._sock.sendall(b"".join(frames), flags)
        except OSError as e:
            self._gone("cannot write to the control socket: %s" % (e.strerror or e))

    def _read_loop(self) -> None:
        decoder = wire.Decoder()
        try:
            while True:
                data = self._sock.recv(65536)
                if not data:
                    self._gone("the agent closed the control socket")
                    return
                try:
                    frames = decoder.feed(data)
                except wire.FrameError as e:
                    self._gone("the agent sent a frame this client does not speak (%s)" % e, agent_gone=False)
                    return
                for mtype, payload in frames:
                    self._on_frame(mtype, payload)
        except OSError as e:
            self._gone("cannot read the control socket: %s" % (e.strerror or e))

    def _on_frame(self, mtype: int, payload: bytes) -> None:
        if mtype not in (wire.ASSIGN, wire.UNIQUE_ID, wire.COMMAND):
            return
        try:
            msg = wire.decode(payload)
            if not isinstance(msg, dict):
                return
            with self._cond:
                if mtype == wire.ASSIGN:
                    gen = msg.get("generation")
                    if self._rejoin and isinstance(gen, int) and gen > self.generation:
                        self._take_up(msg)
                    elif self._assign is None or gen == self.generation:
                        self._assign = msg
                elif mtype == wire.COMMAND and msg.get("action") == "park":
                    self._parked = max(self._parked, int(msg.get("generation", 0)))
                    self._cond.notify_all()
                elif mtype == wire.COMMAND and msg.get("action") == "yield":
                    if msg.get("generation") == self.generation:
                        self._yield = self.generation
                elif mtype == wire.COMMAND and msg.get("action") == "stop":
                    self._stop = True
                elif mtype == wire.COMMAND and msg.get("action") == "checkpoint":
                    self._checkpoint_asked = True
                elif mtype == wire.UNIQUE_ID and msg.get("generation") == self.generation:
                    uid = bytes.fromhex(msg["id"])
                    if len(uid) == wire.UID_LEN:
                        self._uid = uid
                        self._cond.notify_all()
        except (ValueError, KeyError, TypeError):
            return  # not a frame the agent would send: skip it

    def _take_up(self, msg: dict) -> None:
        """A newer generation's ASSIGN for a rank that rejoins: it becomes the
        rank of its slot (its local rank) there. Called with the lock held."""
        for slot in msg.get("ranks", []):
            if slot.get("local_rank") == self._local_rank and isinstance(slot.get("rank"), int):
                self._assign = msg
                self.generation = msg["generation"]
                self.rank = slot["rank"]
                self._restore = None
                self._uid = None
                self._yielded = False
                self._cond.notify_all()
                return

    # ---- the package's API for healing in place (muster_rank.elastic) -------

    @property
    def cond(self) -> threading.Condition:
        """The condition this link notifies whenever what it knows changes (a
        generation, a park, a stop, the agent gone). A healing class keeps its
        own state of the generation under it too, and notifies it when that
        changes, so that one wait sees both."""
        return self._cond

    def rejoin_in_place(self) -> None:
        """This process heals in place: it takes up the next generation's ASSIGN
        (its slot's rank there) instead of exiting, and says so in its heartbeats.
        The steps are then the healing class's (beat()), not the start-up hook's."""
        with self._cond:
            self._rejoin = True
            self._own = True

    def own_steps(self) -> None:
        """The program reports its steps itself: the start-up hook's count stays out."""
        self._own = True

    def over(self, generation: int) -> bool:
        """True once generation is over: a COMMAND park named it, or a newer ASSIGN came."""
        with self._cond:
            return self._parked > generation or self.generation > generation

    def yield_asked(self, generation: int) -> bool:
        """True once a COMMAND yield asked generation to leave at a step boundary (a grow)."""
        with self._cond:
            return self._yield == generation

    def set_restored(self, source: str, step: int) -> None:
        """Where this generation's state came from ("memory", "disk", "seed") and
        its step, sent with the following heartbeats (restore_from, restore_step)."""
        with self._cond:
            self._restore = (source, step)

    def left_for_grow(self) -> None:
        """The rank left its generation at a step boundary with the others, for a
        grow: its heartbeats say so (yielded) until it takes up the next one."""
        with self._cond:
            self._yielded = True
            if self._entry is not None:
                self._changed()

    def wait_generation(self, after: int, timeout: float) -> Optional[Tuple[dict, int, int]]:
        """(ASSIGN, generation, rank) of a generation newer than after, once it
        came, read together (a newer ASSIGN may follow at any time); None on
        timeout, on stop, or when the agent went away."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.generation <= after and not self._dead and not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return (self._assign, self.generation, self.rank) if self.generation > after else None

    def wait_over(self, after: int, timeout: float) -> bool:
        """True once a COMMAND park (or a newer ASSIGN) says generation after is
        over; False at timeout, on stop, or when the agent went away."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._parked <= after and self.generation <= after and not self._dead and not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._parked > after or self.generation > after

    def _gone(self, why: Optional[str], agent_gone: bool = True) -> None:
        """Stops speaking for good: logs why once (None: closed on purpose)."""
        with self._cond:
            if self._dead:
                return
            self._dead = True
            if agent_gone and why is not None:
                self._stop = True
            self._cond.notify_all()
        if why is not None:
            log("%s; progress is no longer reported" % why)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _forked(self) -> None:
        # A forked child (a data loader worker) is not the rank and has no I/O
        # threads; the lock may have been held by one of them at the fork.
        self._cond = threading.Condition()
        self._dead = True
