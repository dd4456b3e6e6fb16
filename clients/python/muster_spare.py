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
"""
import importlib
import json
import os
import runpy
import socket
import sys


def _warm_up(names):
    """Imports the heavy modules now, so that the rank finds them loaded."""
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
    for name in names:
        importlib.import_module(name)
    if torch.cuda.is_initialized():
        raise RuntimeError("a warm import initialised CUDA; a spare must hold no device (warm_imports: %s)"
                           % ",".join(names))


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
    _warm_up(names)
    data = _read_handoff(fd)
    if not data:
        return 0
    from muster_rank import log
    log.trace("handoff")
    _become(json.loads(data))()
    return 0


if __name__ == "__main__":
    sys.exit(main())
