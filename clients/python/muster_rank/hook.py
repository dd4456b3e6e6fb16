"""muster's start-up hook, which startup/sitecustomize.py runs in every Python
process of a rank (and muster_spare when a warm spare becomes one). It arms
faulthandler so that the agent can ask for every thread's stack, a thread
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
