"""muster's start-up hook, which startup/sitecustomize.py runs in every Python
process of a rank (and muster_spare when a warm spare becomes one). It arms
a thread and faulthandler so that the agent can ask for every thread's stack, a thread
that reads torch's flight recorder when the agent asks (flight.py), and once the
program imports torch (2.0 or later), it counts optimizer steps through
torch's global optimizer step hook and reports them to the agent, as beat()
would (a program that calls beat() itself keeps its own figures), and starts
the sampler of the rank's time split (split.py: how much of its wall time
the main thread computes, and how much it waits). It imports only the link
to the agent, not the healing classes."""

import os
import sys
from typing import Optional

from .link import claim, connect

_hook = {"stacks": None, "counts": {}, "step": 0}


def startup() -> None:
    """Run by muster's sitecustomize in every Python process of a rank."""
    if not claim():
        return  # not a rank's own process (or not under muster)
    _arm_stacks()
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):  # the agent turned the recorder on
        from .flight import arm
        arm()
    if "torch" in sys.modules:  # a warm spare (muster_spare) imported it before it became this rank
        _torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatch())


def _arm_stacks() -> None:
    """Two ways to MUSTER_RANK_DIR/stacks-PID.txt, where the agent reads every
    thread's stack:

    - a daemon thread blocked reading stacks-PID.fifo: on the agent's byte it
      takes sys._current_frames() with the GIL and writes the dump in one
      write. Every other thread is then at a point where it let the GIL go,
      so no frame changes under the walk. This is the way the agent asks
      first.
    - faulthandler on MUSTER_STACKS_SIGNAL, which dumps from the signal
      handler without the GIL: it works while a thread holds the GIL inside
      native code (where the thread above never runs), but walking threads
      that run Python meanwhile can crash the process (CPython issue
      116008: a rank killed by signal 11 as its stacks were asked). The
      agent sends the signal only when the thread has not even read the
      byte within its fallback time (still in the FIFO: the thread never
      ran), most likely because a thread holds the GIL in native code and
      nothing runs Python; a process starved of CPU for that long is the
      case left (the walk may then meet a running frame).

    Only the process that armed them removes the files at exit: a child it
    forks (which has no such thread) leaves them alone. At exit the files go
    first and the signal is ignored after, so that a request on its way
    never meets the default action of a real-time signal (to terminate)."""
    sig, where = os.environ.get("MUSTER_STACKS_SIGNAL", ""), os.environ.get("MUSTER_RANK_DIR", "")
    if not (sig.isdigit() and where):
        return
    import faulthandler
    owner = os.getpid()
    path = os.path.join(where, "stacks-%d.txt" % owner)
    fifo = os.path.join(where, "stacks-%d.fifo" % owner)
    try:
        f = open(path, "a")
        faulthandler.register(int(sig), file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return
    _hook["stacks"] = f  # faulthandler keeps the descriptor, not the file object
    rfd = -1
    try:
        if os.path.lexists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo, 0o600)
        # read and write: the agent's non-blocking open finds a reader, and no EOF comes between requests
        rfd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)
        import threading
        threading.Thread(target=_serve_stacks, args=(rfd, f.fileno(), fifo), name="muster-stacks",
                         daemon=True).start()
    except (OSError, RuntimeError):  # the signal alone, as before
        _drop_fifo(rfd, fifo)
        fifo = ""
    import atexit

    def _unarm():
        if os.getpid() != owner:
            return  # a forked child's exit: the files are its parent's
        for p in (path, fifo):
            try:
                if p:
                    os.unlink(p)
            except OSError:
                pass
        try:
            faulthandler.unregister(int(sig))
            import signal
            signal.signal(int(sig), signal.SIG_IGN)
        except (ValueError, RuntimeError, OSError):
            pass
    atexit.register(_unarm)


def _drop_fifo(rfd: int, fifo: str) -> None:
    """The FIFO no thread serves is removed, so that the agent signals at once instead."""
    if rfd >= 0:
        try:
            os.close(rfd)
        except OSError:
            pass
    if fifo:
        try:
            os.unlink(fifo)
        except OSError:
            pass


def stacks_text(skip: Optional[int] = None) -> str:
    """Every thread's stack, innermost call first, in faulthandler's layout
    ("Thread 0x... (most recent call first):", then '  File "F", line N in
    FUNC'), the main thread last as faulthandler puts the current one; the
    thread skip (an ident) is left out."""
    import threading
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    for ident in sorted(frames, key=lambda i: (i == main, i)):
        if ident == skip:
            continue
        lines = ['Thread 0x%016x "%s" (most recent call first):' % (ident, names.get(ident, "?"))]
        frame, depth = frames[ident], 0
        while frame is not None and depth < 100:
            code = frame.f_code
            lines.append('  File "%s", line %d in %s' % (code.co_filename, frame.f_lineno or 0, code.co_name))
            frame, depth = frame.f_back, depth + 1
        if frame is not None:
            lines.append("  ...")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _serve_stacks(rfd: int, out: int, fifo: str) -> None:
    """The stacks thread: one dump per byte read (the agent truncated the file before it asked)."""
    import threading
    me = threading.get_ident()
    while True:
        try:
            if not os.read(rfd, 64):
                break
            data = stacks_text(skip=me).encode("utf-8", "replace")
            while data:
                data = data[os.write(out, data):]
        except OSError:
            break
    _drop_fifo(rfd, fifo)


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


def _torch_imported(torch) -> None:
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        return  # torch before 2.0 has no global optimizer step hook
    try:
        register_optimizer_step_post_hook(on_optimizer_step)
    except Exception:  # a torch that changed the hook: say nothing, change nothing
        return
    from .split import start
    start(connect())


def _optimizer_step(opt) -> Optional[int]:
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


def on_optimizer_step(opt, args, kwargs) -> None:
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
            connect().auto_step(step)
    except Exception:
        return
