"""A strict NCCL-like torch.distributed backend for tests on hosts without a
GPU: backend="strict_nccl" once this module is imported (register()), or
any torch program run with STRICT_NCCL=1 through tests/torch/ddp_train.py
and fsdp_train.py's --backend.

Its collectives run over gloo on the host, but behave as NCCL does where
healing in place depends on it:
- asynchronous: a collective returns a Work at once and its result lands in
  the caller's tensors only once the work completed, seen through wait() or
  its future (the gloo operation runs on staged copies, as a kernel on its
  stream);
- in order: the works of a group complete one after the other (one stream);
- a lost peer never fails a collective: an error from gloo underneath
  (a peer's socket closed, gloo's timeout) leaves the work, and every later
  one of the group, pending for ever, as NCCL kernels spin; wait() blocks in
  a lock with the GIL released, where no exception raised asynchronously in
  its thread reaches it;
- abort() (ProcessGroup.abort(), torch's _abort_process_group) ends it: every
  pending work fails with a RuntimeError, its future too, and any later use
  of the group raises;
- shutdown() (destroy_process_group) of a group that broke or was aborted
  blocks for ever, as finalizing a broken communicator does; it first
  appends "shutdown-after-abort PID" to $STRICT_NCCL_LOG so that a test can
  assert it never happens.
"""

import os
import queue
import threading
from datetime import timedelta
from typing import List

import torch
import torch.distributed as dist

NAME = "strict_nccl"


class _Op:
    """One collective in a group's stream: the gloo work, the staged tensors
    it writes, the caller's tensors the result is copied into, and its end."""

    def __init__(self, outputs: List[torch.Tensor], staged: List[torch.Tensor]) -> None:
        self.outputs, self.staged = outputs, staged
        self.inner = None
        self.done = threading.Event()       # completed or aborted
        self.error = None                   # set when aborted
        # Its future: completed (from the stream, or abort()) by completing `ended`,
        # through a callback, so that an abort fails it with an error of torch's own
        # (a C++ one, which DDP's reducer takes), not with an exception as its value.
        self.ended = torch.futures.Future()
        self.future = self.ended.then(lambda _: self.result())

    def result(self) -> List[torch.Tensor]:
        if self.error is not None:
            raise self.error
        return self.outputs


class StrictWork(dist.Work):
    """A collective's handle: completes only through wait() or its future."""

    def __init__(self, op: _Op) -> None:
        super().__init__()
        self._op = op

    def wait(self, timeout: timedelta = None) -> bool:
        self._op.done.wait()  # no timeout: a lock acquired in C, the GIL released, as NCCL's host sync
        self._op.result()
        return True

    def is_completed(self) -> bool:
        return self._op.done.is_set()

    def is_success(self) -> bool:
        return self._op.done.is_set() and self._op.error is None

    def exception(self):
        return self._op.error

    def get_future(self) -> torch.futures.Future:
        return self._op.future

    def synchronize(self) -> None:
        self.wait()


class StrictNccl(dist.ProcessGroup):
    """The group: gloo underneath (its own keys in the store), one stream
    thread that completes the works in order."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._name = ""
        self._inner = dist.ProcessGroupGloo(dist.PrefixStore("strict_nccl", store), rank, size, timeout)
        self._lock = threading.Lock()
        self._aborted = False
        self._broken = False                # a work failed underneath: the stream spins
        self._pending: List[_Op] = []
        self._stream: "queue.Queue[_Op]" = queue.Queue()
        threading.Thread(target=self._run_stream, name="strict_nccl-stream", daemon=True).start()

    def getBackendName(self) -> str:
        return NAME

    # Its name, which torch keeps in a group's backends (this one has none of torch's).
    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    # -- the stream --

    def _run_stream(self) -> None:
        while True:
            op = self._stream.get()
            with self._lock:
                if self._broken:
                    return  # the stream spins in the collective that lost its peer
            try:
                op.inner.wait()
            except Exception:
                # NCCL does not fail a collective whose peer is gone: it spins.
                with self._lock:
                    self._broken = True
                return
            with self._lock:
                if self._aborted:
                    return
                for out, staged in zip(op.outputs, op.staged):
                    if out is not staged:
                        out.copy_(staged)
                self._pending.remove(op)
                op.done.set()
            op.ended.set_result(None)

    def _issue(self, outputs: List[torch.Tensor], staged: List[torch.Tensor], start) -> StrictWork:
        op = _Op(outputs, staged)
        with self._lock:
            if self._aborted:
                raise RuntimeError("strict_nccl: the communicator was aborted; a collective on it is an error")
            op.inner = start()
            self._pending.append(op)
        self._stream.put(op)
        return StrictWork(op)

    # -- collectives (gloo on staged copies) --

    def allreduce(self, tensors, opts=None):
        staged = [t.clone() for t in tensors]
        opts = opts if opts is not None else dist.AllreduceOptions()
        if isinstance(opts, dist.ReduceOp):
            op, opts = opts, dist.AllreduceOptions()
            opts.reduceOp = op
        return self._issue(tensors, staged, lambda: self._inner.allreduce(staged, opts))

    def broadcast(self, tensors, opts=None):
        staged = [t.clone() for t in tensors]
        return self._issue(tensors, staged,
                           lambda: self._inner.broadcast(staged, opts if opts is not None else dist.BroadcastOptions()))

    def allgather(self, output_lists, inputs, opts=None):
        staged = [[t.clone() for t in outs] for outs in output_lists]
        flat_out = [t for outs in output_lists for t in outs]
        flat_staged = [t for outs in staged for t in outs]
        return self._issue(flat_out, flat_staged,
                           lambda: self._inner.allgather(staged, [t.clone() for t in inputs],
                                                         opts if opts is not None else dist.AllgatherOptions()))

    def _allgather_base(self, output, input, opts=None):
        staged = output.clone()
        return self._issue([output], [staged],
                           lambda: self._inner._allgather_base(staged, input.clone(),
                                                               opts if opts is not None else dist.AllgatherOptions()))

    def _reduce_scatter_base(self, output, input, opts=None):
        staged = output.clone()
        return self._issue([output], [staged],
                           lambda: self._inner._reduce_scatter_base(
                               staged, input.clone(), opts if opts is not None else dist.ReduceScatterOptions()))

    def barrier(self, opts=None):
        return self._issue([], [], lambda: self._inner.barrier(opts if opts is not None else dist.BarrierOptions()))

    def send(self, tensors, dst, tag=0):
        staged = [t.clone() for t in tensors]
        return self._issue([], [], lambda: self._inner.send(staged, dst, tag))

    def recv(self, tensors, src, tag=0):
        staged = [t.clone() for t in tensors]
        return self._issue(tensors, staged, lambda: self._inner.recv(staged, src, tag))

    def lose(self) -> None:
        """A peer is lost (for tests of one process): the works pending and
        every later one never complete, as when gloo underneath fails."""
        with self._lock:
            self._broken = True
        self._stream.put(_Op([], []))  # wakes the stream, which stops there

    # -- ending --

    def abort(self) -> None:
        """Fails every pending work and makes any later use an error (NCCL's ncclCommAbort)."""
        with self._lock:
            self._aborted = True
            pending, self._pending = self._pending, []
        for op in pending:
            op.error = RuntimeError("strict_nccl: the communicator was aborted while this collective was pending")
            op.done.set()
            op.ended.set_result(None)

    def shutdown(self) -> None:
        """A healthy group ends; a broken or aborted one blocks for ever, as
        finalizing a broken communicator does."""
        with self._lock:
            broken = self._broken or self._aborted or bool(self._pending)
        if not broken:
            return
        path = os.environ.get("STRICT_NCCL_LOG")
        if path:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, ("shutdown-after-abort %d\n" % os.getpid()).encode())
            finally:
                os.close(fd)
        threading.Event().wait()


def _create(opts, backend_options) -> StrictNccl:
    """torch's extended creator: the group is named as torch named it (device
    meshes, FSDP's among them, look groups up by name)."""
    group = StrictNccl(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    group._set_group_name(opts.group_id)
    return group


def register() -> str:
    """Registers the backend with torch (once); returns its name."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    return NAME


def backend(name: str) -> str:
    """The backend a test program asks for: name, or this one (registered) when
    name is "strict_nccl" or STRICT_NCCL=1 is set."""
    if name == NAME or os.environ.get("STRICT_NCCL") == "1":
        return register()
    return name
