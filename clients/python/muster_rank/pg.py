"""What torch's process groups need from a client that heals in place, in one
place: torch works around none of it, as a process that keeps living across
generations meets it and a fresh one does not.

- await_store: the store's client backs off for up to a second when it finds
  no listener; this polls it every 5 ms instead.
- forget_failed_init: an init_process_group that raised leaves its group
  counted, and the next group's gloo keys never meet.
- sockets, opened_since, shut: gloo has no abort and keeps its sockets open
  past destroy_process_group; shutting them lets the peers go.
- release_meshes: device meshes and DTensor's sharding caches hold the old
  generation's groups.
- aborts, groups, abort, forget: an NCCL collective whose peer is lost never
  fails and finalizing a broken communicator can wait for ever: its groups
  are aborted (from any thread) and then only forgotten.
- device: NCCL moves only device tensors.
- nccl_env, nccl_options: torch's NCCL watchdog must leave the errors an
  abort makes to the healing, NVLink SHARP must be off, and the
  communicators are non-blocking, so that an abort also ends their set-up.
- cuda_sync, device_wait: after an abort the device must drain within a
  deadline, or the process (its CUDA context) is no use to the next generation.
"""

import os
import socket
import threading
import time
from typing import Callable, Dict, Optional

from .log import trace


def await_store(timeout: float, parked) -> None:
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
            trace("store")
            return
        except OSError:
            if parked():
                raise RuntimeError("muster_rank: the generation was parked before its process group formed "
                                   "(rank 0 never listened at %s:%d)" % where)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)


def forget_failed_init(dist) -> None:
    """Before a default process group is formed again: an init_process_group
    that raised (its generation was parked while it waited for its peers)
    has already counted its group, and destroy_process_group, which resets
    the count, does nothing without a group. The next group would then be
    named "1" where a new process's is "0", and gloo's rendezvous keys, which
    carry the name, would never meet: every rank waits for ever."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def sockets() -> Dict[int, str]:
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


def opened_since(before: Dict[int, str]) -> Dict[int, str]:
    return {fd: s for fd, s in sockets().items() if before.get(fd) != s}


def shut(conns: Dict[int, str]) -> None:
    """Shuts down each connected socket of conns ({fd: "socket:[inode]"}) still open as
    the same socket: its peers see it closed at once, and calls waiting on it here fail.
    Listening sockets stay (gloo's listener thread aborts the process when its own fails)."""
    now = sockets()
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


def release_meshes() -> None:
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


def aborts(backend: str) -> bool:
    """Whether the groups of backend are aborted when their generation ends
    (and never finalized after that): those of NCCL, named in the backend
    string ("nccl", "cpu:gloo,cuda:nccl", the tests' "strict_nccl"). An
    NCCL collective whose peer is lost never fails, its kernel spins until
    the communicator is aborted, and finalizing a broken one can wait for ever."""
    return "nccl" in backend.lower()


def groups(dist) -> list:
    """Every process group torch knows of, the default one last (as torch
    aborts and shuts them down: ncclCommAbort was collective in some NCCL versions)."""
    names = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    named = list((getattr(names, "pg_names", None) or {}).items())
    return [g for g, _ in sorted(named, key=lambda kv: kv[1], reverse=True)]


def abort(dist, found: list) -> None:
    """Aborts each group of found (groups()), from any thread: the collectives
    pending on them fail, and their later use raises. Where the default group
    has an NCCL backend the aborts are grouped (ncclGroupStart/End), so that
    one communicator's abort does not wait on another's."""
    import torch
    nccl = None
    c10d = dist.distributed_c10d
    if found and c10d.is_nccl_available():
        try:
            backend = found[-1]._get_backend(torch.device("cuda"))
        except RuntimeError:
            backend = None
        if isinstance(backend, c10d.ProcessGroupNCCL):
            nccl = backend
    if nccl is not None:
        nccl._group_start()
    try:
        for group in found:
            try:
                group.abort()
            except Exception as e:  # a backend without an abort (gloo's, a side group) has nothing to end
                trace("abort: %s" % e)
    finally:
        if nccl is not None:
            nccl._group_end()


def forget(dist) -> None:
    """torch's bookkeeping of every process group dropped, none of them
    shut down (destroy_process_group's part that finalizes nothing): after
    an abort, what is left of the groups goes with their last reference."""
    c10d = dist.distributed_c10d
    world = c10d._world
    c10d._update_default_pg(None)
    for table in (world.pg_map, world.pg_names, world.pg_group_ranks, world.pg_backend_config,
                  world.pg_to_tag, world.tags_to_pg, world.pg_coalesce_state):
        table.clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0


def device(backend: str) -> Optional[object]:
    """The device a group's own collectives (state sync, votes) use, as torch
    picks it for object collectives: the rank's current CUDA device where
    the backend is NCCL's alone, else the host (None; "cpu:gloo,cuda:nccl"
    moves host tensors over gloo)."""
    import torch
    if aborts(backend) and "cpu:" not in backend.lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


# torch's TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC when it is not set (ProcessGroupNCCL's heartbeat monitor).
TORCH_HEARTBEAT_S = 8 * 60


def nccl_env(environ: Dict[str, str], heal_s: float) -> Dict[str, str]:
    """What a process that heals its NCCL groups in place sets in its own
    environment before each group (torch and NCCL read it as they make one):
    TORCH_NCCL_ASYNC_ERROR_HANDLING=0 and TORCH_NCCL_RETHROW_CUDA_ERRORS=0,
    for the watchdog would otherwise end the process on the NCCL or CUDA
    error an abort leaves (the healing aborts instead);
    TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC above twice the heal window where it,
    or torch's default when it is not set (8 minutes: a heal window above
    4), is below that (the heartbeat monitor ends a process whose watchdog
    looks stuck that long); and NCCL_NVLS_ENABLE=0 unless the environment sets it
    (NVIDIA's in-process restart guide: NVLink SHARP on NVSwitch systems
    must be off for communicators that are aborted and made again in the
    same process; a program that sets it keeps its own value)."""
    out = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0"}
    if "NCCL_NVLS_ENABLE" not in environ:
        out["NCCL_NVLS_ENABLE"] = "0"
    floor = int(2 * heal_s) + 1
    try:
        beat = int(environ.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", ""))
    except ValueError:
        beat = TORCH_HEARTBEAT_S  # unset (or not a number, which torch reads as unset): torch's default
    if beat < floor:
        out["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] = str(floor)
    return out


def torch_nccl(backend: str) -> bool:
    """Whether backend names torch's own NCCL ("nccl", or "cuda:nccl" in a
    device list), not a stand-in registered under another name."""
    return any(part.strip().rpartition(":")[2] == "nccl" for part in backend.lower().split(","))


def nccl_options(dist, backend: str, timeout=None) -> Optional[object]:
    """init_process_group's pg_options for a group of torch's NCCL that an
    abort can cancel: ProcessGroupNCCL.Options with config.blocking = 0, so
    that NCCL makes its communicators non-blocking (their set-up and
    collectives return at once and torch polls them; an abort from the
    watch thread then also ends a set-up that waits on a lost peer, as
    TorchFT's groups do). timeout: the group's (None: torch's default for
    the backend), set in the options too, as init_process_group sets it.
    None where backend is not torch's NCCL (gloo, the tests' stand-in) or
    this torch has no such options: the group is formed with torch's own."""
    if not torch_nccl(backend):
        return None
    c10d = getattr(dist, "distributed_c10d", None)
    try:
        if not c10d.is_nccl_available():
            return None
        options = c10d.ProcessGroupNCCL.Options()
        options.config.blocking = 0
        options.is_high_priority_stream = False  # torch's default for the groups it makes
        options._timeout = timeout if timeout is not None else c10d._get_default_timeout(backend)
    except (AttributeError, RuntimeError, TypeError, ValueError) as e:
        trace("nccl options: %s" % e)
        return None
    return options


def cuda_sync() -> Optional[Callable[[], None]]:
    """torch.cuda.synchronize where this process initialised CUDA, else None:
    nothing of it is on a device, and CUDA is not initialised from here."""
    try:
        import torch
        if torch.cuda.is_initialized():
            return torch.cuda.synchronize
    except (ImportError, AttributeError):
        pass
    return None


def device_wait(sync: Optional[Callable[[], None]], deadline_s: float) -> Optional[str]:
    """After an abort: sync() (cuda_sync's: every kernel queued on the device
    finished) in a thread of its own, waited for up to deadline_s. None when
    it returned (or there is nothing to wait for: sync None); else why the
    process cannot go on: the device did not drain in time (a kernel that
    never ends, a lost GPU) or the sync raised (the CUDA context is lost:
    its errors are sticky, every later call fails the same way). The thread
    left behind past the deadline is a daemon: the caller then exits."""
    if sync is None:
        return None
    done = []

    def run() -> None:
        try:
            sync()
            done.append(None)
        except Exception as e:  # a CUDA error: the context is lost for this process
            done.append(e)

    waiter = threading.Thread(target=run, name="muster_rank-device", daemon=True)
    waiter.start()
    waiter.join(deadline_s)
    if not done:
        return "the device did not finish its queued work within %.1f s of the abort" % deadline_s
    if done[0] is not None:
        first = (str(done[0]).strip().splitlines() or [type(done[0]).__name__])[0]
        return "the device failed after the abort, its CUDA context is lost (%s)" % first
    return None
