"""Where a thread of the program is: its innermost frame of the program's own
code ("train.py:88 in step"), and the call it waits in on its peers when its
innermost frames are a collective or a backward pass ("all_reduce
(distributed_c10d.py)"). Sent in every heartbeat: when every rank stands
still, musterd names the one that is not waiting on the others."""

import os
import sys
from typing import Dict, Optional, Sequence, Tuple

# Packages whose frames are not the program's own: the frameworks a training
# program calls into. Frames of the standard library and of this client are
# not the program's either; everything else is (a program installed as a
# package included).
FRAMEWORKS = frozenset(["torch", "deepspeed", "accelerate", "transformers", "lightning", "pytorch_lightning",
                        "numpy", "triton", "apex", "torchft", "functorch", "_pytest"])
# Inside these a program's main thread waits on its peers (a collective, or a
# backward pass whose gradients are reduced as they come).
COMM = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/", "torch/_tensor.py",
        "deepspeed/comm/", "deepspeed/runtime/zero/")
LIB, COMMS, PROGRAM = 0, 1, 2
WHERE_MAX, WAITING_MAX = 255, 127


def _roots(paths: Sequence[Optional[str]]) -> Tuple[str, ...]:
    """Directories as prefixes ("/a/b/"), the longest first."""
    return tuple(sorted((os.path.join(os.path.abspath(p), "") for p in paths if p), key=len, reverse=True))


def library_roots() -> Tuple[set, set]:
    """(the standard library's and this client's directories, the package directories)."""
    import site
    import sysconfig
    paths = sysconfig.get_paths()
    client = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # beside muster_spare and startup/
    lib = {paths.get("stdlib"), paths.get("platstdlib"), client}
    pkgs = {paths.get("purelib"), paths.get("platlib")}
    try:
        pkgs.update(site.getsitepackages())
        pkgs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site.py
        pass
    return lib, pkgs


class Kinds:
    """Whose code a source file is (LIB, COMMS or PROGRAM) and its short name,
    from the library and package roots; cached per file name."""

    def __init__(self, lib: Sequence[str], pkgs: Sequence[str]) -> None:
        self.lib, self.pkgs = _roots(lib), _roots(pkgs)
        self._cache: Dict[str, Tuple[int, str]] = {}

    def kind(self, filename: str) -> Tuple[int, str]:
        k = self._cache.get(filename)
        if k is not None:
            return k
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        k = (PROGRAM, os.path.basename(path))
        if path.startswith("<frozen"):
            k = (LIB, path)
        for root in self.pkgs:  # site-packages may lie inside the standard library's tree
            if path.startswith(root):
                rel = path[len(root):]
                if rel.split("/", 1)[0].split(".", 1)[0] in FRAMEWORKS:
                    short = rel if os.path.basename(rel) == "__init__.py" else os.path.basename(rel)
                    k = (COMMS if rel.startswith(COMM) else LIB, short)
                break
        else:
            if any(path.startswith(root) for root in self.lib):
                k = (LIB, os.path.basename(path))
        if len(self._cache) < 4096:
            self._cache[filename] = k
        return k


def locate(frame, kinds: Kinds) -> Tuple[Optional[str], Optional[str]]:
    """(where, waiting) from a thread's innermost frame outwards (frame: a
    frame object, or anything with f_code.co_filename, f_code.co_name,
    f_lineno and f_back); None for what is not known."""
    where = waiting = None
    comm = None
    depth = 0
    while frame is not None and depth < 256:
        code = frame.f_code
        kind, short = kinds.kind(code.co_filename)
        if kind == PROGRAM:
            where = "%s:%d in %s" % (short, frame.f_lineno, code.co_name)
            break
        if kind == COMMS and (comm is None or comm[1].startswith("_")):
            comm = (short, code.co_name)  # the public call the program made, not a private helper
        frame = frame.f_back
        depth += 1
    if comm is not None:
        waiting = "%s (%s)" % (comm[1], comm[0])
    return (where[:WHERE_MAX] if where else None), (waiting[:WAITING_MAX] if waiting else None)


_kinds: Optional[Kinds] = None  # this interpreter's, made at the first call


def where(thread_id: int) -> Tuple[Optional[str], Optional[str]]:
    """(where, waiting) of a thread of this process (see locate)."""
    global _kinds
    if _kinds is None:
        _kinds = Kinds(*library_roots())
    return locate(sys._current_frames().get(thread_id), _kinds)
