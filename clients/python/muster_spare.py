"""muster's warm spare: a Python process that becomes a rank without paying
interpreter start and `import torch` when the rank is needed.

muster-worker starts `PYTHON -c SPARE_START ARGS...`, which runs this module
as `-m` would but without the agent's working directory on sys.path
(worker/agent/spare.h; ARGS: the rank command's, so that ps and pgrep -f see
the rank's command line) for a job
with warm_spares on (worker/agent/spare.h), with the ranks' environment less what names one rank,
no visible device, MUSTER_SPARE_FD (its hand-off socket, fd 4) and
MUSTER_WARM_IMPORTS. It imports torch, torch.distributed and those modules,
takes one step of a tiny model with SGD and with AdamW (torch imports a
second's worth of modules, torch._dynamo among them, on an optimizer's first
use), and waits. It holds no device and no process group. When the agent needs a
rank, it writes {"argv", "env", "cwd"} as JSON to the hand-off socket and
closes it: the spare takes that environment, directory and argv, starts
muster's rank hook as a fresh rank's interpreter would have, and runs the
script (or `-m` module) as __main__, as `python script.py ...` would. Its
process, output and control socket (fd 3) were the rank's from its spawn.
EOF without a hand-off (the agent is gone, or stops the spare) ends it.

A spare must never touch the CUDA driver: with no device visible, a driver
initialised then has "no GPU" for the life of the process, and the rank it
became could never use its own. After torch's warm-up and after each warm
import the spare looks (_cuda_touched: libcuda mapped into the process, or
torch.cuda initialised); when one did, it writes {"cuda_import": NAME,
"how": ...} to the hand-off socket and exits at once (os._exit: no
import's thread or atexit handler keeps it alive) with status 3 without being
handed a rank: its agent starts the next spare without that import
(worker/agent/spare.h). On a node with job GPUs the agent sets
DS_ACCELERATOR=cuda in the spare's environment, so that DeepSpeed, which
picks its accelerator once at import, picks CUDA there (by probing it would
find no device and pick the CPU for the life of the process).
"""
import importlib
import json
import os
import runpy
import socket
import sys

# A warm import touched the CUDA driver: the spare reported it and exits with this status.
EXIT_CUDA = 3


def _cuda_driver(maps):
    """The path of the CUDA driver library (libcuda.so, libcuda.so.1, ...)
    mapped in a process, given its /proc/PID/maps text; None when it is not.
    cudart, cuBLAS, NCCL and NVML (libnvidia-ml) are not the driver: torch
    maps those at import and they touch no device until called."""
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        base = os.path.basename(fields[5].strip())
        if base == "libcuda.so" or base.startswith("libcuda.so."):
            return fields[5].strip()
    return None


def _cuda_touched():
    """How this process touched the CUDA driver, or None: libcuda mapped
    (any library that loads it is about to initialise it) or torch.cuda
    initialised. Without /proc only torch's own state is known."""
    try:
        with open("/proc/self/maps") as f:
            path = _cuda_driver(f.read())
    except OSError:
        path = None
    if path is not None:
        return "%s mapped" % os.path.basename(path)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch.cuda initialised"
    return None


def _warm_up(names):
    """Imports the heavy modules now, so that the rank finds them loaded.
    Returns None, or (name, how) for the first import (torch itself
    included) after which the CUDA driver was touched (_cuda_touched); the
    imports after it are not made."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401  (DistributedDataParallel)
    # torch imports much on first use (an optimizer's first construction brings
    # in torch._dynamo: about a second): one tiny step of each usual kind does it here.
    w = torch.nn.Linear(2, 1)
    for make in (torch.optim.SGD, torch.optim.AdamW):
        opt = make(w.parameters(), lr=1e-3)
        w(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
    how = _cuda_touched()
    if how is not None:
        return "torch", how
    for name in names:
        importlib.import_module(name)
        how = _cuda_touched()
        if how is not None:
            return name, how
    return None


def _report_cuda(fd, name, how):
    """Tells the agent, on the hand-off socket, which import touched the CUDA driver."""
    sys.stderr.write("muster_spare: importing %s touched the CUDA driver (%s): a warm spare must hold no device; "
                     "exiting untaken\n" % (name, how))
    sock = socket.socket(fileno=fd)
    try:
        sock.sendall(json.dumps({"cuda_import": name, "how": how}).encode())
    except OSError:
        pass  # the agent is gone or stopped the spare: nothing to tell
    finally:
        sock.close()


def _read_handoff(fd):
    """The hand-off's bytes up to EOF ("" when the agent closed it without one)."""
    sock = socket.socket(fileno=fd)
    parts = []
    try:
        while True:
            b = sock.recv(1 << 16)
            if not b:
                break
            parts.append(b)
    finally:
        sock.close()
    return b"".join(parts)


def _become(rank):
    """Takes the rank's environment, directory and argv; returns how to run it."""
    argv, env, cwd = rank["argv"], rank["env"], rank["cwd"]
    os.environ.clear()
    for kv in env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    os.chdir(cwd)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch
        torch.set_num_threads(int(threads))  # OpenMP read the spare's at import
    from muster_rank import hook
    hook.startup()
    if argv[1] == "-m":
        sys.argv = [argv[2]] + argv[3:]  # run_module puts the module's file in argv[0]
        sys.path.insert(0, cwd)  # `python -m` runs with the working directory first on the path
        return lambda: runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    script = os.path.abspath(argv[1])
    sys.argv = argv[1:]
    sys.path.insert(0, os.path.dirname(script))  # `python script.py` runs with the script's directory first
    return lambda: runpy.run_path(script, run_name="__main__")


def main():
    fd = int(os.environ.pop("MUSTER_SPARE_FD"))
    names = [n for n in os.environ.pop("MUSTER_WARM_IMPORTS", "").split(",") if n]
    touched = _warm_up(names)
    if touched is not None:
        _report_cuda(fd, *touched)
        # Out now: a thread or atexit handler of a warm import must not keep an untaken spare alive (its
        # agent reads the report when it exits, and would hand a lingering one a rank it cannot run).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_CUDA)
    data = _read_handoff(fd)
    if not data:
        return 0
    from muster_rank import log
    log.trace("handoff")
    _become(json.loads(data))()
    return 0


if __name__ == "__main__":
    sys.exit(main())
