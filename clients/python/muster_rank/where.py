"""Where a thread of the program is: its innermost frame of the program's own
code ("train.py:88 in step"), and the call it waits in on its peers when its
innermost frames are a collective or a backward pass ("all_reduce
(distributed_c10d.py)"), or when it waits on the GPU ("gpu (loss.item at
train.py:91)"). Sent in every heartbeat: when every rank stands still,
musterd names the one that is not waiting on the others.

Waiting on the GPU is waiting on peers under NCCL: collectives are queued on
the device, and the host blocks at its next sync with the device, in native
code that leaves no Python frame of its own: `loss.item()`, `.cpu()`,
`.tolist()`, `.numpy()`, a work handle's `.wait()`, called from the
program's frame (what that frame is calling is read from its bytecode at
the instruction under way), or torch.cuda's `synchronize` (the device's, a
Stream's or an Event's), whose Python frame names it."""

import dis
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
# Native calls in which the host waits for the device (or for a queued collective).
GPU_CALLS = frozenset(["item", "cpu", "tolist", "numpy", "wait", "synchronize"])
# torch's Python functions that block on the device: torch/cuda/'s synchronize.
GPU_MODULES = ("torch/cuda/",)
GPU_FUNCTIONS = frozenset(["synchronize"])
_LOADS = frozenset(["LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_FAST_CHECK"])
_CALLS = frozenset(["CALL", "PRECALL", "CALL_METHOD", "CALL_FUNCTION"])  # 3.8 to 3.13


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


_instructions: Dict[object, list] = {}  # code object -> its instructions, for calling()


def calling(frame) -> Optional[str]:
    """The method or function a frame is calling at the instruction under way,
    as the source names it ("loss.item", "torch.cuda.synchronize"), or None:
    read from the bytecode (the CALL at f_lasti and the loads that made its
    callee). Only a call without arguments is read (item(), cpu(), wait(),
    synchronize()): the loads right before a call with arguments are its
    arguments', not its callee's. A frame without code or f_lasti (a
    synthetic one) says nothing."""
    code, lasti = getattr(frame, "f_code", None), getattr(frame, "f_lasti", None)
    if not hasattr(code, "co_code") or not isinstance(lasti, int) or lasti < 0:
        return None
    ins = _instructions.get(code)
    if ins is None:
        ins = list(dis.get_instructions(code))
        if len(_instructions) < 1024:
            _instructions[code] = ins
    at = next((i for i, x in enumerate(ins) if x.offset == lasti), None)
    if at is None or ins[at].opname not in _CALLS or ins[at].arg:
        return None
    i = at - 1
    while i >= 0 and ins[i].opname.startswith(("PRECALL", "PUSH_NULL", "KW_NAMES", "CACHE")):
        i -= 1
    names = []  # the callee's loads, from its last attribute back: LOAD_ATTR/LOAD_METHOD ... LOAD_FAST
    while i >= 0 and ins[i].opname in ("LOAD_ATTR", "LOAD_METHOD") and len(names) < 4:
        names.append(str(ins[i].argval))
        i -= 1
    if not names:
        return None
    if i >= 0 and ins[i].opname in _LOADS:
        names.append(str(ins[i].argval))
    return ".".join(reversed(names))


def locate(frame, kinds: Kinds) -> Tuple[Optional[str], Optional[str]]:
    """(where, waiting) from a thread's innermost frame outwards (frame: a
    frame object, or anything with f_code.co_filename, f_code.co_name,
    f_lineno and f_back); None for what is not known."""
    where = waiting = None
    comm = gpu = None
    depth = 0
    innermost = frame
    while frame is not None and depth < 256:
        code = frame.f_code
        kind, short = kinds.kind(code.co_filename)
        if kind == PROGRAM:
            where = "%s:%d in %s" % (short, frame.f_lineno, code.co_name)
            call = calling(frame) if frame is innermost else None
            if call and call.rsplit(".", 1)[-1] in GPU_CALLS:
                gpu = call
            if gpu is not None and comm is None:
                waiting = "gpu (%s at %s:%d)" % (gpu, short, frame.f_lineno)
            break
        if (gpu is None and code.co_name in GPU_FUNCTIONS and
                any(m in code.co_filename for m in GPU_MODULES)):
            gpu = calling(frame.f_back) or code.co_name  # as the caller names it: torch.cuda.synchronize
        if kind == COMMS and (comm is None or comm[1].startswith("_")):
            comm = (short, code.co_name)  # the public call the program made, not a private helper
        frame = frame.f_back
        depth += 1
    if comm is not None:
        waiting = "%s (%s)" % (comm[1], comm[0])
    elif gpu is not None and waiting is None:
        waiting = "gpu (%s)" % gpu
    return (where[:WHERE_MAX] if where else None), (waiting[:WAITING_MAX] if waiting else None)


_kinds: Optional[Kinds] = None  # this interpreter's, made at the first call


def where(thread_id: int) -> Tuple[Optional[str], Optional[str]]:
    """(where, waiting) of a thread of this process (see locate)."""
    global _kinds
    if _kinds is None:
        _kinds = Kinds(*library_roots())
    return locate(sys._current_frames().get(thread_id), _kinds)
