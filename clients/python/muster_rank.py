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

Once a rank has reported, the writer also sends a keepalive every
KEEPALIVE_INTERVAL seconds while the program is busy (in a long collective,
say), so that a quiet rank means one that cannot run (stopped, frozen, or
its interpreter held by native code), not one that waits. Each heartbeat
says where the program's main thread is (`where`, its innermost frame of
the program's own code) and, when it is inside a collective or a backward
pass, what it waits in (`waiting`): when every rank stands still, musterd
names the one that is not waiting on the others.

Programs that do not use this module are seen too: under muster-worker a
Python rank starts with muster's start-up hook (startup/sitecustomize.py
beside this file), which calls _startup() below. It arms faulthandler so
that the agent can ask for every thread's stack, and once the program
imports torch (2.0 or later), it counts optimizer steps through torch's
global optimizer step hook and reports them here, as beat() would (a
program that calls beat() itself keeps its own figures).
"""

import json
import math
import os
import socket
import struct
import sys
import threading
import time

__all__ = ["connect", "Rank", "Elastic", "ShardedElastic", "BEAT_INTERVAL", "KEEPALIVE_INTERVAL"]

# Frame header: payload length, protocol version, message type (big-endian).
_HEADER = struct.Struct(">IHH")
_VERSION = 2
_MAX_PAYLOAD = 256 * 1024
_ASSIGN, _UNIQUE_ID, _HEARTBEAT, _COMMAND = 6, 7, 8, 10
_U64_MAX = 2**53 - 1  # the largest integer on the wire
_UID_LEN = 128

# At most one HEARTBEAT frame per BEAT_INTERVAL seconds. The agent relays
# its ranks' latest entries every heartbeat_interval_ms (>= 50) and hang
# detection counts in seconds, so ten frames a second lose nothing.
BEAT_INTERVAL = 0.1
# A rank that reported once sends its latest entry at least this often, so
# that the agent (which leaves out a rank quiet for 1.5 s) and musterd can
# tell a rank that waits from one that cannot run.
KEEPALIVE_INTERVAL = 0.5
_WHERE_MAX, _WAITING_MAX = 255, 127

_connect_lock = threading.Lock()
_connected = None


def _log(msg):
    try:
        sys.stderr.write("muster_rank: %s\n" % msg)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _trace(phase):
    """Appends "WALLTIME PID PHASE" to the file MUSTER_RANK_TRACE names, when
    it names one: the phases of a heal, for benchmarks (tests/bench)."""
    path = os.environ.get("MUSTER_RANK_TRACE")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, ("%.6f %d %s\n" % (time.time(), os.getpid(), phase)).encode())
        finally:
            os.close(fd)
    except OSError:
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

    def beat(self, step, loss=None, tokens_per_s=None, comm_frac=0.0):
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
    def total_steps(self):
        """The steps the program will run, as it said (0: unknown)."""
        return self._total_steps

    @total_steps.setter
    def total_steps(self, n):
        n = _step(n)
        with self._cond:
            self._total_steps = n

    @property
    def tokens_per_step(self):
        """Tokens one optimizer step of this rank consumes (0: unknown); gives tokens/s."""
        return self._tokens_per_step

    @tokens_per_step.setter
    def tokens_per_step(self, n):
        n = float(n)
        if not math.isfinite(n) or n < 0:
            raise ValueError("tokens_per_step must be a finite number >= 0, got %r" % n)
        self._tokens_per_step = n

    def _auto_step(self, step):
        """A step counted by the start-up hook; ignored once the program reports itself."""
        if not self._own:
            self._report(step, None, None, 0.0)

    def _report(self, step, loss, tokens_per_s, comm_frac):
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

    def _heartbeat(self, now):
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
        where, waiting = _where(self._main)
        if where:
            entry["where"] = where
        if waiting:
            entry["waiting"] = waiting
        return _frame(_HEARTBEAT, {"generation": self.generation, "seq": self._seq, "ranks": [entry]})

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
                    gen = msg.get("generation")
                    if self._rejoin and isinstance(gen, int) and gen > self.generation:
                        self._take_up(msg)
                    elif self._assign is None or gen == self.generation:
                        self._assign = msg
                elif mtype == _COMMAND and msg.get("action") == "park":
                    self._parked = max(self._parked, int(msg.get("generation", 0)))
                    self._cond.notify_all()
                elif mtype == _COMMAND and msg.get("action") == "yield":
                    if msg.get("generation") == self.generation:
                        self._yield = self.generation
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

    def _take_up(self, msg):
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

    def _wait_generation(self, after, timeout):
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

    def _wait_park(self, after, timeout):
        """True once a COMMAND park (or a newer ASSIGN) says generation after is over."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._parked <= after and self.generation <= after and not self._dead and not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._parked > after or self.generation > after

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


# ---- where the program is ---------------------------------------------------

# Packages whose frames are not the program's own: the frameworks a training
# program calls into. Frames of the standard library and of this module are
# not the program's either; everything else is (a program installed as a
# package included).
_FRAMEWORKS = frozenset(["torch", "deepspeed", "accelerate", "transformers", "lightning", "pytorch_lightning",
                         "numpy", "triton", "apex", "torchft", "functorch", "_pytest"])
# Inside these a program's main thread waits on its peers (a collective, or a
# backward pass whose gradients are reduced as they come).
_COMM = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/", "torch/_tensor.py",
         "deepspeed/comm/", "deepspeed/runtime/zero/")
_LIB, _COMMS, _PROGRAM = 0, 1, 2
_kinds = {}      # filename -> (kind, short name)
_roots = None    # (library roots, package roots)


def _library_roots():
    import site
    import sysconfig
    paths = sysconfig.get_paths()
    lib = {paths.get("stdlib"), paths.get("platstdlib"), os.path.dirname(os.path.abspath(__file__))}
    pkgs = {paths.get("purelib"), paths.get("platlib")}
    try:
        pkgs.update(site.getsitepackages())
        pkgs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site.py
        pass
    norm = lambda ps: tuple(sorted((os.path.join(os.path.abspath(p), "") for p in ps if p), key=len, reverse=True))
    return norm(lib), norm(pkgs)


def _kind(filename):
    """(kind, short name) of a source file, cached."""
    k = _kinds.get(filename)
    if k is not None:
        return k
    global _roots
    if _roots is None:
        _roots = _library_roots()
    lib, pkgs = _roots
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    k = (_PROGRAM, os.path.basename(path))
    if path.startswith("<frozen"):
        k = (_LIB, path)
    for root in pkgs:  # site-packages may lie inside the standard library's tree
        if path.startswith(root):
            rel = path[len(root):]
            if rel.split("/", 1)[0].split(".", 1)[0] in _FRAMEWORKS:
                short = rel if os.path.basename(rel) == "__init__.py" else os.path.basename(rel)
                k = (_COMMS if rel.startswith(_COMM) else _LIB, short)
            break
    else:
        if any(path.startswith(root) for root in lib):
            k = (_LIB, os.path.basename(path))
    if len(_kinds) < 4096:
        _kinds[filename] = k
    return k


def _where(thread_id):
    """(where, waiting) of a thread: its innermost frame of the program's own
    code ("train.py:88 in step"), and the call it waits in on its peers when
    its innermost frames are a collective or a backward pass
    ("all_reduce (distributed_c10d.py)"), else None."""
    frame = sys._current_frames().get(thread_id)
    where = waiting = None
    comm = None
    depth = 0
    while frame is not None and depth < 256:
        code = frame.f_code
        kind, short = _kind(code.co_filename)
        if kind == _PROGRAM:
            where = "%s:%d in %s" % (short, frame.f_lineno, code.co_name)
            break
        if kind == _COMMS and (comm is None or comm[1].startswith("_")):
            comm = (short, code.co_name)  # the public call the program made, not a private helper
        frame = frame.f_back
        depth += 1
    if comm is not None:
        waiting = "%s (%s)" % (comm[1], comm[0])
    return (where[:_WHERE_MAX] if where else None), (waiting[:_WAITING_MAX] if waiting else None)


# ---- the start-up hook ------------------------------------------------------

_hook = {"stacks": None, "counts": {}, "step": 0}


def _startup():
    """Run by muster's sitecustomize in every Python process of a rank."""
    if "MUSTER_CTL_FD" not in os.environ:
        return  # not a rank's own process (or not under muster)
    _arm_stacks()
    if "torch" in sys.modules:  # a warm spare (muster_spare) imported it before it became this rank
        _torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatch())


def _arm_stacks():
    """faulthandler dumps every thread's stack on MUSTER_STACKS_SIGNAL into
    MUSTER_RANK_DIR/stacks-PID.txt, where the agent reads it. It works while
    the main thread is blocked in native code, where no Python handler runs."""
    sig, where = os.environ.get("MUSTER_STACKS_SIGNAL", ""), os.environ.get("MUSTER_RANK_DIR", "")
    if not (sig.isdigit() and where):
        return
    import faulthandler
    path = os.path.join(where, "stacks-%d.txt" % os.getpid())
    try:
        f = open(path, "a")
        faulthandler.register(int(sig), file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return
    _hook["stacks"] = f  # faulthandler keeps the descriptor, not the file object
    import atexit

    def _unarm():
        try:
            faulthandler.unregister(int(sig))
            os.unlink(path)
        except (OSError, ValueError):
            pass
    atexit.register(_unarm)


class _TorchWatch:
    """A meta path finder that finds nothing: when torch is first imported, it
    lets the real finders find it and hooks the optimizer step once torch's
    own import is complete. It is removed from sys.meta_path at once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            try:
                del loader.exec_module
            except AttributeError:
                pass
            _torch_imported(module)
        loader.exec_module = exec_then_hook
        return spec


def _torch_imported(torch):
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        return  # torch before 2.0 has no global optimizer step hook
    try:
        register_optimizer_step_post_hook(_on_optimizer_step)
    except Exception:  # a torch that changed the hook: say nothing, change nothing
        return


def _optimizer_step(opt):
    """The optimizer's own step count when it keeps one on the CPU (Adam,
    AdamW...: it survives the program's checkpoint), else None."""
    try:
        for group in opt.param_groups:
            for p in group["params"]:
                st = opt.state.get(p)
                if not st:
                    continue
                s = st.get("step")
                if isinstance(s, (int, float)):
                    return int(s)
                if s is not None and getattr(s, "device", None) is not None and s.device.type == "cpu":
                    return int(s.item())
                return None
            return None
    except Exception:
        return None
    return None


def _on_optimizer_step(opt, args, kwargs):
    """torch's global optimizer step post-hook: the rank's step is the
    optimizer's own count, or the steps this process ran; with several
    optimizers, the one that stepped most."""
    try:
        counts = _hook["counts"]
        n = counts.get(id(opt), 0) + 1
        counts[id(opt)] = n
        own = _optimizer_step(opt)
        step = own if own is not None and own >= n else n
        if step > _hook["step"] or own is not None:
            _hook["step"] = step
            connect()._auto_step(step)
    except Exception:
        return


# ---- healing in place -------------------------------------------------------

# Once muster parked the generation, how long a rank may stay in its step
# before it is interrupted there (a survivor in its forward pass reaches its
# next collective, which raises, well within it; the hung rank does not), and
# how long after that before it exits, when its main thread is held outside
# any collective by native code: its peers' collectives then fail and they go on.
PARK_INTERRUPT_S = 1.0
PARK_EXIT_S = 5.0

# How often the ranks of a generation vote at a step boundary on leaving it
# for a grow (muster's COMMAND yield): one all-reduce, which costs a step of
# a small model on CPUs 10-30 %, every this many seconds of steps (and at
# most every VOTE_MAX_STEPS steps) instead of every step.
VOTE_EVERY_S = 0.5
VOTE_MAX_STEPS = 1000


class _Parked(BaseException):
    """Raised in the rank's training thread, in its own code, when muster parked
    the generation and the step does not end by itself (the rank is the hung
    one). A BaseException: a program's `except Exception` lets it through."""


def _interrupt(thread_id, exc):
    """Raises exc in the thread at its next bytecode (None: takes back one not raised yet)."""
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc and ctypes.py_object(exc))


class Elastic:
    """Healing in place for a data-parallel PyTorch program.

        elastic = muster_rank.Elastic(model, optimizer, wrap=DDP, step=start)
        def train_step(step):
            x, y = batch(step, elastic.rank, elastic.world_size)  # this rank's share of the step's batch
            loss = loss_fn(elastic.model(x), y)   # elastic.model: wrap(model) of this generation
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            return loss
        elastic.run(train_step, steps)

    run() forms the process group (torchrun's environment: backend gloo by
    default), brings every rank to the state of the rank that completed the
    most steps (a rank started fresh, such as a replacement, receives model,
    optimizer and every object passed in `state` from it by broadcast), and
    calls train_step(step) for each step left. Under muster, when a step
    fails because a peer died (a collective raises) and muster parks the
    generation, the rank keeps its process and its state: it destroys the
    process group, waits for the next generation's ASSIGN from its agent,
    takes its RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, forms the new
    process group, brings every rank to the same state again and redoes
    the step that failed: no completed step is lost. Outside muster (plain
    python, torchrun) the same script runs, and a failure raises as usual.

    The world may change size between generations (a node lost for good:
    the job shrinks; a node that comes back: it grows, the ranks leaving
    their generation together at a step boundary on muster's COMMAND yield,
    by one vote per step): `rank` and `world_size` are this generation's.
    A rank that hangs (muster's hang detection parks the generation) is
    interrupted in its own code, or exits when it cannot be, so that its
    peers' collectives end (see PARK_INTERRUPT_S, PARK_EXIT_S).

    state: objects with state_dict()/load_state_dict() (a data loader's
    position, an LR scheduler, ...), kept alike on every rank. The step
    count travels too; the program's RNG does not (draw batches as a
    function of the step, as the test programs do, or pass an object).
    timeout_s: the process group's collective timeout (None: torch's).
    """

    def __init__(self, model, optimizer, wrap=None, state=None, step=0, backend="gloo", heal_wait_s=30.0,
                 timeout_s=None):
        self.module = model
        self.optimizer = optimizer
        self.model = model
        self.step = int(step)          # completed optimizer steps
        self._wrap = wrap
        self._state = dict(state or {})
        self._backend = backend
        self._heal_wait = heal_wait_s
        self._timeout = timeout_s
        self._rank = connect()
        self._gen = 0                  # the generation of the process group it trains in
        self._thread = None            # the thread that runs the steps
        self._running = False          # run() is under way (the park watch lives as long)
        self._busy = 0                 # a number for each generation it entered, while in it (else 0)
        self._entered = 0              # generations entered so far
        self._in_step = False          # in train_step
        self._conns = None             # the process group's sockets ({fd: inode}) once formed
        self._conns_before = None      # the sockets open before the process group was formed
        self._interrupted = False      # _Parked was sent to this step
        self._suspect = False          # interrupted in its own code: its state may be half updated
        self._vote_at = 0              # the step at whose boundary the ranks vote next (see _boundary)
        self._voted = None             # (step, monotonic time) of the last vote
        if self._rank.active:
            self._rank._rejoin = True
            self._rank._own = True  # the steps are this object's, not the start-up hook's count

    @property
    def rank(self):
        """This rank's number in the current generation (RANK before run() forms the group)."""
        import torch.distributed as dist
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))

    @property
    def world_size(self):
        """The ranks of the current generation (WORLD_SIZE before run() forms the group)."""
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    def run(self, train_step, steps):
        """train_step(step) for step in [self.step, steps); returns the last step's result.

        A step counts as completed once the optimizer stepped in it, even if
        something after that raised (its update is in the state)."""
        import torch.distributed as dist
        stepped = [False]
        hook = self._watch_steps(lambda *_: stepped.__setitem__(0, True))
        self._thread = threading.get_ident()
        self._rank._own = True  # run() reports the steps: the start-up hook's own count stays out
        watcher = None
        if self._rank.active:
            # What exists by now (torch's modules, the model, ...) lives as long as the
            # process: the garbage collector skips it from now on, so that the full
            # collection a heal makes (see _rejoin) takes milliseconds, not a tenth of a second.
            import gc
            gc.freeze()
            self._running = True
            watcher = threading.Thread(target=self._watch_park, name="muster_rank-park", daemon=True)
            watcher.start()
        result = None
        pending = "form"  # before the next step: "form" (the first), "park" or "yield" (leave, form the next)
        try:
            while True:
                stepped[0] = False
                err = None
                try:
                    if pending == "form":
                        pending = None
                        self._form(dist)
                    elif pending:
                        yielded, pending = pending == "yield", None
                        self._rejoin(dist, yielded)
                    if self.step >= steps:
                        break
                    pending = self._boundary(dist)
                    if pending:
                        continue
                    result = self._one_step(train_step)
                except RuntimeError as e:
                    err = e
                except _Parked:
                    self._suspect = True
                    pending = "park"
                if err is None and pending is None:
                    self.step += 1
                    loss = result.item() if hasattr(result, "item") else result
                    self._rank._report(self.step, loss if isinstance(loss, (int, float)) else None, None, 0.0)
                    continue
                if stepped[0]:
                    self.step += 1
                if err is not None:
                    _trace("error")
                    if not (self._rank.active and self._rank._wait_park(self._gen, self._heal_wait)):
                        raise err  # no failure muster knows of: the program's own error
                    # Dropped here, out of the except clause, so that the failed step's
                    # frames (and the generation's DDP in them) go before its process group.
                    err = None
                    _trace("parked")
                    pending = "park"
        finally:
            hook.remove()
            with self._rank._cond:
                self._running = False
                self._rank._cond.notify_all()
            if watcher is not None:
                # Its end drops a reference to this object (the thread's target): were
                # it the last one, a thread of its own would free the model, DDP's
                # reducer with it, and if the interpreter were exiting by then, torch
                # freeing tensors there ends the process (std::terminate, SIGABRT).
                watcher.join(PARK_EXIT_S)
        return result

    def _watch_steps(self, fn):
        """fn() after each step of the program's optimizer; returns the hook's handle."""
        return self.optimizer.register_step_post_hook(fn)

    # -- one generation's process group and state --

    def _form(self, dist, generation=None):
        """Enters the generation (None: the one the rank started in): joins its
        process group, then brings the state to every rank."""
        self._join(dist, generation)
        self._sync_state(dist)
        self._vote_at, self._voted = self.step, None  # every rank votes at its first boundary

    def _join(self, dist, generation):
        """The generation's process group (formed unless it is), with the
        bookkeeping the park watch relies on: the generation entered and the
        group's sockets."""
        cond = self._rank._cond
        with cond:
            self._gen = self._rank.generation if generation is None else generation
            self._entered += 1
            self._busy = self._entered
            cond.notify_all()
        if not dist.is_initialized():
            _forget_failed_init(dist)
            before = _sockets()
            with cond:
                self._conns = None
                self._conns_before = before
            _trace("join")
            r = self._rank
            gen = self._gen
            _await_store(self._heal_wait if self._timeout is None else max(self._timeout, self._heal_wait),
                         lambda: r.active and (r._parked > gen or r.generation > gen))
            if self._timeout is None:
                dist.init_process_group(self._backend, init_method="env://")
            else:
                import datetime
                dist.init_process_group(self._backend, init_method="env://",
                                        timeout=datetime.timedelta(seconds=self._timeout))
            with cond:
                self._conns = _opened_since(before)
            _trace("group")

    def _sync_state(self, dist):
        """Every rank to the state of the first rank with the most steps."""
        import torch
        me, world = dist.get_rank(), dist.get_world_size()
        have = self.step if self.step > 0 else -1  # -1: nothing trained, the seed's state
        best = torch.tensor([have], dtype=torch.int64)
        dist.all_reduce(best, op=dist.ReduceOp.MAX)
        # The state comes from the first rank with the most steps, one that was not
        # interrupted in its own code (its update may be half done) if there is one.
        key = 2 * world if have != best.item() else me + world if self._suspect else me
        src = torch.tensor([key], dtype=torch.int64)
        dist.all_reduce(src, op=dist.ReduceOp.MIN)
        src = int(src.item()) % world
        if best.item() >= 0:
            self._broadcast_state(dist, src)
            self.step = int(best.item())
            self._rank._restore = ("memory", self.step)
        else:
            self._rank._restore = ("seed", 0)
        self._suspect = self._interrupted = False
        _trace("synced")
        self.model = self._wrap(self.module) if self._wrap else self.module
        _trace("wrapped")
        if self._rank.active:
            _log("generation %d: rank %d of %d, training from step %d (state from %s)"
                 % (self._gen, me, world, self.step, "rank %d" % src if best.item() >= 0 else "the seed"))

    def _objects(self):
        objs = {"model": self.module, "optimizer": self.optimizer}
        objs.update(self._state)
        return objs

    def _broadcast_state(self, dist, src):
        """Every object's state_dict from rank src: its layout as one pickled
        object, its tensors one broadcast each, in place where they exist."""
        import torch
        me = dist.get_rank()
        objs = self._objects()
        tensors = []

        def strip(x):
            if isinstance(x, torch.Tensor):
                tensors.append(x)
                return _TensorSlot(len(tensors) - 1, tuple(x.shape), x.dtype)
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(strip(v) for v in x)
            return x
        layout = [{name: strip(o.state_dict()) for name, o in objs.items()} if me == src else None]
        dist.broadcast_object_list(layout, src=src)
        if me == src:
            for t in tensors:
                dist.broadcast(t.detach().contiguous(), src=src)
            return
        got = []

        def fill(x):
            if isinstance(x, _TensorSlot):
                t = torch.empty(x.shape, dtype=x.dtype)
                got.append((x.index, t))
                return t
            if isinstance(x, dict):
                return {k: fill(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(fill(v) for v in x)
            return x
        states = {name: fill(sd) for name, sd in layout[0].items()}
        for _, t in sorted(got, key=lambda it: it[0]):
            dist.broadcast(t, src=src)
        for name, o in objs.items():
            o.load_state_dict(states[name])

    # -- leaving a generation --

    def _boundary(self, dist):
        """Between two steps: "park" when muster parked the generation, "yield"
        when the ranks agree to leave it for a grow (a vote, one all-reduce
        at the first boundary of a generation and then about every
        VOTE_EVERY_S: any rank that got COMMAND yield asks), else None."""
        r = self._rank
        if not r.active:
            return None
        if r._parked > self._gen or r.generation > self._gen:
            return "park"
        if self.step < self._vote_at:
            return None
        # The vote: whether to yield, and when to vote next, as steps of about
        # VOTE_EVERY_S by the slowest rank's clock (one all-reduce, MAX of
        # [ask, -steps]), so that every rank counts the same steps to it.
        import torch
        now = time.monotonic()
        steps = 1
        if self._voted is not None and self.step > self._voted[0]:
            per_step = (now - self._voted[1]) / (self.step - self._voted[0])
            steps = max(1, min(VOTE_MAX_STEPS, int(VOTE_EVERY_S / per_step) if per_step > 0 else VOTE_MAX_STEPS))
        device = torch.device("cuda", torch.cuda.current_device()) if self._backend == "nccl" else None
        ask = torch.tensor([1 if r._yield == self._gen else 0, -steps], dtype=torch.int64, device=device)
        dist.all_reduce(ask, op=dist.ReduceOp.MAX)
        ask = ask.tolist()
        self._voted = (self.step, now)
        self._vote_at = self.step + max(1, -ask[1])
        return "yield" if ask[0] else None

    def _one_step(self, train_step):
        cond = self._rank._cond
        with cond:
            self._in_step = True
        try:
            return train_step(self.step)
        finally:
            with cond:
                self._in_step = False
                if self._interrupted:
                    _interrupt(self._thread, None)  # one not raised by now is not raised

    def _rejoin(self, dist, yielded):
        """Leaves the generation it trained in, keeping its state, and forms the next one."""
        _trace("leave")
        r = self._rank
        gen = self._gen
        with r._cond:
            self._busy = 0
            r._cond.notify_all()
            conns = self._connections()
        if yielded:
            with r._cond:
                r._yielded = True
                if r._entry is not None:
                    r._changed()
            _log("generation %d: left at the boundary of step %d with the other ranks (the job grows)"
                 % (gen, self.step))
        else:
            _log("generation %d broke at step %d; waiting for the next generation" % (gen, self.step))
            # gloo has no abort and keeps its sockets open past destroy_process_group:
            # peers still blocked on this rank in the ended generation are let go now.
            _shut(conns)
        _trace("shut")
        self._let_go()
        import gc
        gc.collect()
        _trace("collected")
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        _trace("destroyed")
        got = r._wait_generation(gen, 3600.0)
        if got is None:
            raise RuntimeError("muster_rank: generation %d is over and no next one came (stopped, or the agent "
                               "went away)" % gen)
        assign, generation, rank = got
        _trace("assigned")
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(assign["world_size"]),
                          MASTER_ADDR=str(assign["master_addr"]), MASTER_PORT=str(assign["master_port"]),
                          MUSTER_GENERATION=str(generation),
                          TORCHELASTIC_RESTART_COUNT=str(assign.get("restart_count", 0)),
                          GROUP_RANK=str(assign.get("node_rank", 0)), GROUP_WORLD_SIZE=str(assign.get("nnodes", 1)),
                          LOCAL_WORLD_SIZE=str(len(assign.get("ranks", []))))
        self._form(dist, generation)

    def _let_go(self):
        """Before the process group of the generation that ended is destroyed:
        drops what refers to it. The wrapper (DDP's reducer hooks its parameters
        and holds the old group) goes before the new one is made."""
        self.model = self.module

    def _connections(self):
        """The sockets of the current generation's process group (lock held):
        those init_process_group opened, or all opened since it began while it runs."""
        if self._conns is not None:
            return self._conns
        return _opened_since(self._conns_before) if self._conns_before is not None else {}

    def _watch_park(self):
        """Muster parked the generation and the rank has not left it
        PARK_INTERRUPT_S later. Held by its own code in a step (it is the
        hung one): its connections of the generation are closed, which ends
        its peers' waits on it, and _Parked is raised in that code. Waiting
        on its peers (a collective, a rendezvous) PARK_EXIT_S later still:
        its own connections are closed, which ends its wait. Still in the
        generation PARK_EXIT_S after either (native code outside any
        collective), the process exits, so that its peers go on; its slot
        is started again."""
        r = self._rank
        with r._cond:
            while self._running:
                busy = self._busy
                if not busy or (r._parked <= self._gen and r.generation <= self._gen):
                    r._cond.wait()
                    continue
                if not self._held(busy, PARK_INTERRUPT_S):
                    continue
                where, waiting = _where(self._thread)
                stuck = self._in_step and waiting is None and not self._interrupted
                if not stuck and not self._held(busy, PARK_EXIT_S):
                    continue
                _log("generation %d was parked and rank %d has not left it (%s): closing its connections%s"
                     % (self._gen, r.rank, waiting or where or "where is not known",
                        ", interrupting its step" if stuck else ""))
                _shut(self._connections())
                if stuck:
                    self._interrupted = True
                    _interrupt(self._thread, _Parked)
                if self._held(busy, PARK_EXIT_S):
                    _log("rank %d did not leave generation %d %.0f s after that: exiting, so that its peers go on"
                         % (r.rank, self._gen, PARK_EXIT_S))
                    os._exit(1)

    def _held(self, busy, seconds):
        """True when the rank is still in the generation it entered as busy after seconds (lock held)."""
        deadline = time.monotonic() + seconds
        while self._running and self._busy == busy:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self._rank._cond.wait(left)
        return False


def _await_store(timeout, parked):
    """Until the process group's store (rank 0's, at MASTER_ADDR:MASTER_PORT)
    accepts connections, on every rank but 0, polled every 5 ms: torch's
    store client backs off for up to a second between attempts when it
    finds no listener, as it does when rank 0 is the last of a generation
    to get there. At the timeout, init_process_group tries as it would.
    Raises RuntimeError once parked() says the generation is over (its rank
    0 died before it listened): the rank then heals as from a failed step."""
    if os.environ.get("RANK", "0") == "0":
        return
    try:
        where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    except (KeyError, ValueError):
        return  # init_process_group names what is missing
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(where, timeout=1.0).close()
            _trace("store")
            return
        except OSError:
            if parked():
                raise RuntimeError("muster_rank: the generation was parked before its process group formed "
                                   "(rank 0 never listened at %s:%d)" % where)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)


def _forget_failed_init(dist):
    """Before a default process group is formed again: an init_process_group
    that raised (its generation was parked while it waited for its peers)
    has already counted its group, and destroy_process_group, which resets
    the count, does nothing without a group. The next group would then be
    named "1" where a new process's is "0", and gloo's rendezvous keys, which
    carry the name, would never meet: every rank waits for ever."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def _sockets():
    """{fd: "socket:[inode]"} of the process's open sockets ({} without /proc)."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue
        if link.startswith("socket:"):
            found[int(name)] = link
    return found


def _opened_since(before):
    return {fd: s for fd, s in _sockets().items() if before.get(fd) != s}


def _shut(conns):
    """Shuts down each connected socket of conns ({fd: "socket:[inode]"}) still open as
    the same socket: its peers see it closed at once, and calls waiting on it here fail.
    Listening sockets stay (gloo's listener thread aborts the process when its own fails)."""
    now = _sockets()
    for fd, s in conns.items():
        if now.get(fd) != s:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()


class _TensorSlot:
    """A tensor's place in a broadcast state_dict layout (spec: a DTensor's, see _local)."""

    def __init__(self, index, shape, dtype, spec=None):
        self.index, self.shape, self.dtype, self.spec = index, shape, dtype, spec


# ---- sharded state: buddy replicas -----------------------------------------

def _align(n):
    return (n + 63) & ~63


class _Snapshot:
    """One rank's shard state at one step, in host memory: every tensor of
    its model's and optimizer's state_dicts (a DTensor's local shard, not the
    whole) in one flat byte buffer, and the rest (the layout, the objects'
    state, RNG) as one pickled layout. Taken by the main thread between
    steps; sent to the buddy whole, as three tensors (header, layout, flat).
    """

    def __init__(self):
        self.step = -1       # the step it holds (-1: nothing yet)
        self.rank = -1       # whose: that rank's number and world size when taken
        self.world = 0
        self.layout = None   # pickled: see take()
        self.flat = None     # uint8 tensor
        self.complete = False  # a received one: every byte came

    def take(self, step, rank, world, model, optimizer, objects):
        import pickle
        import torch
        tensors = []

        def strip(x):
            if isinstance(x, torch.Tensor):
                local, spec = _local(x)
                tensors.append(local)
                return _TensorSlot(len(tensors) - 1, tuple(local.shape), local.dtype, spec)
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(strip(v) for v in x)
            return x
        with torch.no_grad():
            layout = {"model": strip(model.state_dict()), "optimizer": strip(optimizer.state_dict()),
                      "objects": {name: o.state_dict() for name, o in objects.items()},
                      "rng": torch.get_rng_state(),
                      "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None}
            offsets, size = [], 0
            for t in tensors:
                offsets.append(size)
                size = _align(size + t.numel() * t.element_size())
            layout["offsets"] = offsets
            if self.flat is None or self.flat.numel() != size:
                self.flat = None  # the old buffer goes before the new one comes
                self.flat = torch.empty(size, dtype=torch.uint8)
            for off, t in zip(offsets, tensors):
                self._view(off, t.dtype, t.shape).copy_(t)
        self.layout = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
        self.step, self.rank, self.world, self.complete = step, rank, world, True

    def _view(self, off, dtype, shape):
        import torch
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        return self.flat[off:off + n].view(dtype).view(shape)

    def apply(self, model, optimizer, objects):
        """Puts the state back into a model and optimizer built for the same
        world size (a fresh optimizer included: its state is made here)."""
        import pickle
        import torch
        layout = pickle.loads(self.layout)
        offsets = layout["offsets"]
        params = [p for g in optimizer.param_groups for p in g["params"]]

        def fill(x, like=None):
            if isinstance(x, _TensorSlot):
                t = self._view(offsets[x.index], x.dtype, x.shape).clone()
                return _from_local(t, x.spec, like)
            if isinstance(x, dict):
                return {k: fill(v, like) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(fill(v, like) for v in x)
            return x
        with torch.no_grad():
            mine = model.state_dict()
            for name, slot in layout["model"].items():
                if name not in mine:
                    raise ValueError("rank %d's state of step %d has %s, which this model has not"
                                     % (self.rank, self.step, name))
                _copy_into(mine[name], self._view(offsets[slot.index], slot.dtype, slot.shape), name)
        opt = layout["optimizer"]
        opt["state"] = {i: fill(st, params[i] if i < len(params) else None) for i, st in opt["state"].items()}
        optimizer.load_state_dict(opt)
        for name, o in objects.items():
            o.load_state_dict(layout["objects"][name])
        torch.set_rng_state(layout["rng"])
        if layout["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(layout["cuda_rng"])

    def header(self):
        import torch
        return torch.tensor([self.step, self.rank, self.world, len(self.layout), self.flat.numel()],
                            dtype=torch.int64)

    def send(self, dist, dst, group):
        """Works (not waited on) that send this snapshot to rank dst."""
        import torch
        layout = torch.frombuffer(bytearray(self.layout), dtype=torch.uint8)
        return [dist.isend(t, dst, group=group) for t in (self.header(), layout, self.flat)]

    def broadcast(self, dist, src, me, group):
        """This snapshot from rank src to every rank of group: src's is sent,
        the others' receive it (blocks)."""
        import torch
        if me == src:
            for t in (self.header(), torch.frombuffer(bytearray(self.layout), dtype=torch.uint8), self.flat):
                dist.broadcast(t, src, group=group)
            return
        self.complete = False
        head = torch.empty(5, dtype=torch.int64)
        dist.broadcast(head, src, group=group)
        step, rank, world, nlayout, nflat = (int(v) for v in head.tolist())
        layout = torch.empty(nlayout, dtype=torch.uint8)
        self.flat = torch.empty(nflat, dtype=torch.uint8)
        dist.broadcast(layout, src, group=group)
        dist.broadcast(self.flat, src, group=group)
        self.layout = layout.numpy().tobytes()
        self.step, self.rank, self.world, self.complete = step, rank, world, True

    def recv(self, dist, src, group):
        """Receives a snapshot from rank src into this one (blocks)."""
        import torch
        self.complete = False
        head = torch.empty(5, dtype=torch.int64)
        dist.recv(head, src, group=group)
        step, rank, world, nlayout, nflat = (int(v) for v in head.tolist())
        layout = torch.empty(nlayout, dtype=torch.uint8)
        if self.flat is None or self.flat.numel() != nflat:
            self.flat = None
            self.flat = torch.empty(nflat, dtype=torch.uint8)
        dist.recv(layout, src, group=group)
        dist.recv(self.flat, src, group=group)
        self.layout = layout.numpy().tobytes()
        self.step, self.rank, self.world, self.complete = step, rank, world, True


def _local(t):
    """(a tensor's local part as a plain tensor, its DTensor spec or None)."""
    if hasattr(t, "to_local") and hasattr(t, "placements"):
        return t.to_local().detach(), (tuple(t.placements), tuple(t.shape), tuple(t.stride()))
    return t.detach(), None


def _from_local(t, spec, like):
    """A tensor restored from its local part: a DTensor again where it was
    one, on the mesh of the parameter it belongs to (like) in this generation."""
    if spec is None:
        return t  # load_state_dict moves it where the optimizer keeps it
    from torch.distributed.tensor import DTensor
    placements, shape, stride = spec
    t = t.to(_local(like)[0].device)
    return DTensor.from_local(t, like.device_mesh, placements, run_check=False, shape=shape, stride=stride)


def _copy_into(dst, src, name):
    local, _ = _local(dst)
    if tuple(local.shape) != tuple(src.shape):
        raise ValueError("%s: the saved shard is %s, this model's %s (another world size?)"
                         % (name, tuple(src.shape), tuple(local.shape)))
    local.copy_(src)


class _Buddy:
    """Buddy replicas of one generation: a thread that ships this rank's
    snapshot to its buddy (a rank on another node) and receives its wards'
    (the ranks whose buddy it is), over a gloo group of its own.

    Memory: two own snapshots (the last one every buddy is known to hold,
    and the one in flight) and two per ward (the same two steps). A round
    is committed when every rank has done its part of it, which the main
    thread learns at the next round with one all-reduce of a flag.
    """

    def __init__(self, dist, group, rank, world, buddy, wards, own=None, held=None, carried=None):
        self.dist, self.group = dist, group
        self.rank, self.world, self.buddy, self.wards = rank, world, buddy, wards
        self.own = own or []          # [_Snapshot], oldest first, at most 2
        self.held = held or {}        # ward -> [_Snapshot], at most 2
        # Re-sliced from another world: that world's snapshots this rank held,
        # kept until this world's first round is held everywhere (a rank lost
        # before then is re-sliced from them again).
        self.carried = carried or []
        self._cond = threading.Condition()
        self._job = None              # the snapshot of the round to ship
        self._busy = False
        self._error = None
        self._quit = False
        self._round = -1              # the step of the round shipped last
        self._thread = threading.Thread(target=self._loop, name="muster_rank-buddy", daemon=True)
        self._thread.start()
        if self.own:  # restored: its buddy gets the step restored at once
            self._post(self.own[-1])

    def holdings(self):
        """[(rank, world, step)] of every whole snapshot this rank holds."""
        snaps = self.own + [s for ss in self.held.values() for s in ss] + self.carried
        return sorted({(s.rank, s.world, s.step) for s in snaps if s.complete and s.step >= 0})

    def find(self, rank, world, step):
        for s in self.own + [s for ss in self.held.values() for s in ss] + self.carried:
            if s.complete and (s.rank, s.world, s.step) == (rank, world, step):
                return s
        return None

    def replicate(self, step, model, optimizer, objects):
        """At a step boundary, on every rank: commits the last round, snapshots
        this step and ships it in the background. Raises RuntimeError when the
        last round failed (a peer died: the program's healing follows)."""
        import torch
        with self._cond:
            while self._busy:
                self._cond.wait()
            error = self._error
        if self._round >= 0:
            # Once every rank got its wards' snapshots of the last round, that
            # round is held everywhere and what is older can go.
            ok = torch.tensor([0 if error else 1], dtype=torch.int64)
            self.dist.all_reduce(ok, op=self.dist.ReduceOp.MIN, group=self.group)
            if ok.item() != 1:
                raise RuntimeError("buddy replicas of step %d: %s" % (self._round, error or "a peer's failed"))
            self._keep_after(self._round)
            self.carried = []
        snap = _slot(self.own)
        snap.take(step, self.rank, self.world, model, optimizer, objects)
        self._post(snap)

    def _post(self, snap):
        with self._cond:
            self._job, self._busy, self._round = snap, True, snap.step
            self._cond.notify_all()

    def _keep_after(self, step):
        """Frees the own and held snapshots older than step (their buffers stay for reuse)."""
        for ss in [self.own] + list(self.held.values()):
            if any(s.complete and s.step >= step for s in ss):
                for s in ss:
                    if s.step < step:
                        s.complete, s.step = False, -1

    def idle(self, timeout):
        """Waits for the round in flight; True once none is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self, timeout):
        """Lets the round in flight end (or fail) within timeout, then ends the thread."""
        done = self.idle(timeout)
        with self._cond:
            self._quit = True
            self._cond.notify_all()
        if done:
            self._thread.join(timeout)
        return done

    def _loop(self):
        while True:
            with self._cond:
                while self._job is None and not self._quit:
                    self._cond.wait()
                if self._quit:
                    return
                snap, self._job = self._job, None
            error = None
            try:
                self._ship(snap)
            except Exception as e:  # a peer's death: the main thread's next round raises it
                error = str(e) or type(e).__name__
            with self._cond:
                self._error, self._busy = error, False
                self._cond.notify_all()

    def _ship(self, snap):
        works = snap.send(self.dist, self.buddy, self.group) if self.buddy is not None else []
        for w in self.wards:
            _slot(self.held.setdefault(w, [])).recv(self.dist, w, self.group)
        for w in works:
            w.wait()


def _slot(snaps):
    """The snapshot of snaps (at most 2) to fill next, moved to its end:
    a free one, else the older of two, else a new one."""
    snap = next((s for s in snaps if not s.complete), None)
    if snap is None and len(snaps) >= 2:
        snap = snaps[0]
    if snap is None:
        snap = _Snapshot()
    else:
        snaps.remove(snap)
    snap.complete, snap.step = False, -1
    snaps.append(snap)
    return snap


def _buddies(dist, rank, world):
    """(buddy, wards) of this rank: its buddy is the rank of the same index
    on the next node (nodes in the order of their first rank), so that a
    node's loss leaves its ranks' replicas on another; with one node, the
    next rank on it."""
    node = os.environ.get("MUSTER_NODE") or os.environ.get("GROUP_RANK") or socket.gethostname()
    names = [None] * world
    dist.all_gather_object(names, node)
    nodes = []
    for r, n in enumerate(names):
        if not nodes or nodes[-1][0] != n:
            nodes.append((n, []))
        nodes[-1][1].append(r)
    if len(nodes) == 1:
        nodes = [(r, [r]) for r in range(world)]

    def buddy_of(r):
        i = next(i for i, (_, ranks) in enumerate(nodes) if r in ranks)
        if len(nodes) < 2:
            return None
        here, there = nodes[i][1], nodes[(i + 1) % len(nodes)][1]
        return there[here.index(r) % len(there)]
    return buddy_of(rank), [r for r in range(world) if r != rank and buddy_of(r) == rank]


class ShardedElastic(Elastic):
    """Healing in place for a sharded program (FSDP2's fully_shard, or any
    model whose state_dict holds DTensors), with buddy replicas.

        def build():                       # called once per generation
            model = Net()
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

        elastic = muster_rank.ShardedElastic(build, replica_every=10, checkpoint=load_ckpt)
        def train_step(step):
            loss = loss_fn(elastic.model(x), y)
            elastic.optimizer.zero_grad(); loss.backward(); elastic.optimizer.step()
            return loss
        elastic.run(train_step, steps)

    A survivor holds only its shard, so the model is built anew in every
    generation's process group (build(): the model sharded, its optimizer),
    and every rank's state is put back from host memory: every replica_every
    steps each rank snapshots its shard state (its local parameter and
    optimizer shards, the objects in `state`, the step, torch's RNG) and a
    thread ships it to its buddy, a rank on another node, while training
    goes on. When a generation forms, all ranks go back to the latest step
    whose state exists for every rank: a survivor's own snapshot, the
    replacement's at its buddy. So a failure redoes the steps since the last
    replica (fewer than replica_every, or up to twice that when the round
    in flight was lost too). When the world changed size (a shrink or a
    grow), that state is re-sliced for the new world (see _reslice); a grow
    goes back to no earlier step (every rank keeps its state of the boundary
    the ranks left at). When a rank and its buddy were both lost (or the
    state cannot be re-sliced), every rank, the survivors in place, calls
    checkpoint(model, optimizer), the program's own loader, which returns the
    step it loaded (None: no checkpoint, start from the seed). It is also what
    a job started anew resumes from.
    """

    def __init__(self, build, replica_every=10, state=None, checkpoint=None, backend="gloo",
                 heal_wait_s=30.0, replica_timeout_s=300.0, timeout_s=300.0):
        if int(replica_every) < 0:
            raise ValueError("replica_every must be >= 0 (0: no replicas), got %r" % (replica_every,))
        # timeout_s bounds every collective: the last resort of a survivor whose
        # peers left a collective of the old group that it still waits in
        super().__init__(None, None, state=state, backend=backend, heal_wait_s=heal_wait_s,
                         timeout_s=float(timeout_s))
        self._build = build
        self._every = int(replica_every)
        self._checkpoint = checkpoint
        self._replica_timeout = float(replica_timeout_s)
        self._buddy = None
        self.restored = None   # (from, step, steps redone) of the last generation formed

    def run(self, train_step, steps):
        def step_then_replicate(step):
            result = train_step(step)
            if self._every and (step + 1) % self._every == 0 and step + 1 < steps:
                self._buddy.replicate(step + 1, self.module, self.optimizer, self._state)
            # the result outlives the step: without its autograd graph (see _let_go)
            return result.detach() if hasattr(result, "detach") else result
        try:
            return super().run(step_then_replicate, steps)
        finally:
            if self._buddy is not None:
                self._buddy.stop(min(self._replica_timeout, 30.0))

    def _watch_steps(self, fn):
        from torch.optim.optimizer import register_optimizer_step_post_hook
        return register_optimizer_step_post_hook(lambda opt, *_: fn() if opt is self.optimizer else None)

    def _rejoin(self, dist, yielded):
        if yielded and self._buddy is not None and self.step > 0:
            # Every rank leaves at this step boundary, none lost: each keeps its
            # state of this step, so that the next world (re-sliced) redoes no step.
            self._buddy.stop(5.0)
            _slot(self._buddy.own).take(self.step, dist.get_rank(), dist.get_world_size(), self.module,
                                        self.optimizer, self._state)
        super()._rejoin(dist, yielded)

    def _let_go(self):
        if self._buddy is not None:
            self._buddy.stop(5.0)  # a round whose peers live ends; one with a dead peer fails
            self._buddy.group = None
        # A gloo group closes its connections only once nothing refers to it,
        # and the peers that still wait in one of its collectives fail only
        # then. The sharded model and its optimizer refer to it (run() has
        # dropped the failed step's error, whose frames hold the loss's
        # autograd graph and so FSDP's hooks), and so does the device mesh,
        # which DTensor's sharding caches keep: all let go of it before the
        # group is destroyed.
        self.model = self.module = self.optimizer = None
        _release_meshes()

    def _sync_state(self, dist):
        """Every rank's model built anew in this group, its shard state from
        the buddy replicas, else the program's checkpoint, else the seed."""
        import datetime
        import gc
        me, world = dist.get_rank(), dist.get_world_size()
        was = self.step
        old = self._buddy
        self.model = self.module = self.optimizer = None
        gc.collect()
        self.model, self.optimizer = self._build()
        self.module = self.model
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self._replica_timeout))
        buddy, wards = _buddies(dist, me, world)
        offers = [None] * world
        dist.all_gather_object(offers, old.holdings() if old is not None else [])
        plan = _restore_plan(offers, world)
        reslice = _reslice_plan(offers, world) if plan is None else None
        resliced = self._reslice(dist, group, old, me, world, reslice) if reslice is not None else None
        carried = []
        if resliced is not None:
            self.step, snap = resliced
            own, held = [snap], {}
            how = ("memory", self.step)
            if old is not None:  # a new process holds none
                was_world = reslice[1]
                carried = [c for c in (old.find(r, was_world, self.step) for r in range(was_world)) if c is not None]
        elif plan is not None:
            step, sources = plan
            snap = self._fetch(dist, group, old, me, world, step, sources)
            snap.apply(self.module, self.optimizer, self._state)
            self.step = step
            own, held = [snap], {}
            if old is not None:  # the replicas of this step it holds stay (its wards may be survivors)
                for w in wards:
                    s = old.find(w, world, step)
                    if s is not None:
                        held[w] = [s]
            how = ("memory", step)
        else:
            own, held = [], {}
            loaded = self._checkpoint(self.module, self.optimizer) if self._checkpoint else None
            self.step = int(loaded) if loaded is not None else 0
            how = ("disk" if loaded is not None else "seed", self.step)
        old = None
        self._buddy = _Buddy(dist, group, me, world, buddy, wards, own, held, carried)
        self._rank._restore = how
        self._suspect = self._interrupted = False  # a step interrupted in its own code: redone from a replica
        self.restored = (how[0], how[1], max(was - how[1], 0))
        if me == 0 and was > 0:
            _log("generation %d: every rank at step %d from %s (%d steps redone)"
                 % (self._gen, how[1], "buddy replicas" if how[0] == "memory" and resliced is None else
                    "buddy replicas re-sliced from world %d to %d" % (reslice[1], world)
                    if how[0] == "memory" else
                    "the program's checkpoint" if how[0] == "disk" else "the seed", max(was - how[1], 0)))

    def _reslice(self, dist, group, old, me, world, plan):
        """The state of a step held in memory for every rank of another world
        size (a shrink or a grow; plan: _reslice_plan's), sliced anew for
        this one: (step, this rank's snapshot of it for this world), or None
        when the state is not sliced as it can be re-sliced (every
        DTensor sharded on dim 0 or replicated, on a one-dimensional mesh, as
        FSDP2's fully_shard makes it); then the caller falls back to the
        program's checkpoint.

        Each old rank's snapshot is broadcast in turn from a rank that holds
        it (one old shard in memory at a time); every rank copies from it the
        rows of each tensor that fall in its own new shard (torch.chunk's
        split: rows [r * c, (r + 1) * c) of n, c = ceil(n / world), for rank r).
        What is not sharded (the optimizer's step counts, the objects in
        `state`) comes from old rank 0's; torch's RNG from old rank
        min(rank, old world - 1)'s."""
        import pickle
        import torch
        step, was_world, holders = plan
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        mine = self.module.state_dict()
        fill = []      # (target local tensor, name): rows to copy from each old rank's snapshot
        layout0 = None
        opt_state = None
        rng = None
        for r in range(was_world):
            snap = old.find(r, was_world, step) if holders[r] == me else _Snapshot()
            snap.broadcast(dist, holders[r], me, group)
            layout = pickle.loads(snap.layout)
            if r == 0:
                layout0 = layout
                if not all(_reslicable(sl) for sl in _slots(layout["model"]) + _slots(layout["optimizer"])):
                    _log("generation %d: the replicas of step %d (world %d) are not sliced on dim 0 of a "
                         "one-dimensional mesh: they cannot be re-sliced for world %d" % (self._gen, step, was_world,
                                                                                       world))
                    return None
                for name, sl in layout["model"].items():
                    if name not in mine:
                        raise ValueError("the replica of step %d has %s, which this model has not" % (step, name))
                    fill.append((_local(mine[name])[0], name))
                opt_state = {}
                for i, st in layout["optimizer"]["state"].items():
                    like = params[i] if i < len(params) else None
                    entry = {}
                    for k, v in st.items():
                        if isinstance(v, _TensorSlot):
                            shape = v.shape
                            if v.spec is not None and _placement(v.spec) == "shard0":
                                shape = _rows_of(v, me, world) + tuple(v.spec[1][1:])
                            local = torch.empty(shape, dtype=v.dtype)
                            fill.append((local, "optimizer state %s of parameter %d" % (k, i)))
                            entry[k] = (local, v, like)
                        else:
                            entry[k] = v
                    opt_state[i] = entry
            if r == min(me, was_world - 1):
                rng = (layout["rng"], layout["cuda_rng"])
            offsets = layout["offsets"]
            slots = _slots(layout["model"]) + _slots(layout["optimizer"])
            if len(slots) != len(fill):
                raise ValueError("old rank %d's replica of step %d holds %d tensors, rank 0's %d"
                                 % (r, step, len(slots), len(fill)))
            for (dst, name), sl in zip(fill, slots):
                src = snap._view(offsets[sl.index], sl.dtype, sl.shape)
                _copy_rows(dst, src, sl.spec, r, was_world, me, world, name)
            snap = None
        with torch.no_grad():
            opt = dict(layout0["optimizer"])
            opt["state"] = {i: {k: (_from_local(v[0], v[1].spec, v[2]) if isinstance(v, tuple) else v)
                                for k, v in st.items()} for i, st in opt_state.items()}
            self.optimizer.load_state_dict(opt)
        for name, o in self._state.items():
            o.load_state_dict(layout0["objects"][name])
        torch.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state_all(rng[1])
        snap = _Snapshot()
        snap.take(step, me, world, self.module, self.optimizer, self._state)
        return step, snap

    def _fetch(self, dist, group, old, me, world, step, sources):
        """This rank's snapshot of step: its own, or sent by the rank that holds it;
        sends what it holds of step for ranks that have it nowhere else."""
        works = []
        for r, src in enumerate(sources):
            if src == me and r != me:
                works += old.find(r, world, step).send(dist, r, group)
        if sources[me] == me:
            snap = old.find(me, world, step)
        else:
            snap = _Snapshot()
            snap.recv(dist, sources[me], group)
        for w in works:
            w.wait()
        return snap


def _release_meshes():
    """Makes every device mesh (those of a generation that ended: FSDP makes
    one per fully_shard call, and caches keep them) let go of its process
    groups, and empties DTensor's sharding caches, which hold such meshes
    (the next generation's equal meshes must not find them there)."""
    import gc
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor
        prop = DTensor._op_dispatcher.sharding_propagator
    except (ImportError, AttributeError):
        return
    for mesh in gc.get_objects():
        if isinstance(mesh, DeviceMesh):
            registry = getattr(mesh, "_pg_registry", None)
            if isinstance(registry, dict):
                registry.clear()
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        clear = getattr(getattr(prop, name, None), "cache_clear", None)
        if clear is not None:
            clear()


def _reslice_plan(offers, world):
    """(step, old world, holder per old rank) of the latest step whose state
    the ranks of this world hold for every rank of another world, or None."""
    held = sorted({(s, w) for o in offers for (r, w, s) in o if w != world}, reverse=True)
    for step, was in held:
        holders = []
        for r in range(was):
            holders.append(next((q for q in range(world) if (r, was, step) in offers[q]), None))
        if None not in holders:
            return step, was, holders
    return None


def _slots(tree):
    """The _TensorSlots of a stripped state_dict, in the order of their index."""
    found = []

    def walk(x):
        if isinstance(x, _TensorSlot):
            found.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(tree)
    return sorted(found, key=lambda sl: sl.index)


def _placement(spec):
    """"shard0", "replicate", or None for any other DTensor placement."""
    placements = spec[0]
    if len(placements) != 1:
        return None
    p = placements[0]
    if p.is_replicate():
        return "replicate"
    if p.is_shard() and getattr(p, "dim", None) == 0:
        return "shard0"
    return None


def _reslicable(slot):
    return slot.spec is None or _placement(slot.spec) is not None


def _row_range(n, rank, world):
    """Rows [start, end) of n that rank holds, sharded on dim 0 over world (torch.chunk's split)."""
    c = -(-n // world)
    start = min(rank * c, n)
    return start, min(start + c, n)


def _rows_of(slot, rank, world):
    start, end = _row_range(slot.spec[1][0], rank, world)
    return (end - start,)


def _copy_rows(dst, src, spec, old_rank, old_world, rank, world, name):
    """Copies into dst (rank's local part, world) what src (old_rank's, old_world) holds of it."""
    if spec is None or _placement(spec) == "replicate":
        if old_rank == 0:
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError("%s: the replica is %s, this model's %s" % (name, tuple(src.shape), tuple(dst.shape)))
            dst.copy_(src)
        return
    n = spec[1][0]
    a0, a1 = _row_range(n, old_rank, old_world)
    b0, b1 = _row_range(n, rank, world)
    if dst.shape[0] != b1 - b0 or src.shape[0] != a1 - a0:
        raise ValueError("%s: a shard of %d rows is not split as torch.chunk splits it (%s here, %s in the replica)"
                         % (name, n, tuple(dst.shape), tuple(src.shape)))
    lo, hi = max(a0, b0), min(a1, b1)
    if lo < hi:
        dst[lo - b0:hi - b0].copy_(src[lo - a0:hi - a0])


def _restore_plan(offers, world):
    """(step, source rank per rank) of the latest step whose state every rank
    of this world can have (its own snapshot, else a holder's), or None."""
    steps = sorted({s for held in offers for (r, w, s) in held if w == world}, reverse=True)
    for step in steps:
        sources = []
        for r in range(world):
            if (r, world, step) in offers[r]:
                sources.append(r)
            else:
                sources.append(next((q for q in range(world) if (r, world, step) in offers[q]), None))
        if None not in sources:
            return step, sources
    return None
