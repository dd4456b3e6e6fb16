"""A strict NCCL-like torch.distributed backend for tests on hosts without a
GPU: backend="strict_nccl" once this module is imported (register()), or
any torch program run with STRICT_NCCL=1 through tests/torch/ddp_train.py
and fsdp_train.py's --backend.

Its collectives (all-reduce, broadcast, all-gather, reduce-scatter, their
tensor and coalesced forms, reduce, gather, scatter, all-to-all, barrier,
send/recv: every one that DDP, FSDP2, DTensor and torch.distributed.checkpoint
call; a Python group must answer each itself, as torch finds no backend of
the device type to hand one to) run over gloo on the host, but behave as
NCCL does where healing in place depends on it:
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

LateUpdate stands for the device's side of an optimizer step (a CUDA event
recorded behind the update): its synchronize() returns only once a group
of the process was aborted, and then leaves the update half applied, as an
update still queued behind a reduce that the abort cut short would.
"""

import os
import queue
import threading
from datetime import timedelta
from typing import List

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

NAME = "strict_nccl"

# The aborts of this process's groups so far, and their condition (LateUpdate waits on it).
_aborts = 0
_aborts_cond = threading.Condition()


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


class _Works:
    """Several gloo works waited on as one."""

    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> None:
        for w in self.works:
            w.wait()


def _reduce_scatter_opts(opts) -> "dist.ReduceScatterOptions":
    out = dist.ReduceScatterOptions()
    if opts is not None:
        out.reduceOp = opts.reduceOp
    return out


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

    def _gathered(self, output_lists, inputs, start) -> StrictWork:
        """A collective into lists of tensors (allgather's, gather's): start(staged lists, staged inputs)."""
        staged = [[t.clone() for t in outs] for outs in output_lists]
        return self._issue([t for outs in output_lists for t in outs], [t for outs in staged for t in outs],
                           lambda: start(staged, [t.clone() for t in inputs]))

    def allgather(self, output_lists, inputs, opts=None):
        return self._gathered(output_lists, inputs, lambda o, i: self._inner.allgather(
            o, i, opts if opts is not None else _c10d.AllgatherOptions()))

    def _allgather_base(self, output, input, opts=None):
        staged = output.clone()
        return self._issue([output], [staged],
                           lambda: self._inner._allgather_base(staged, input.clone(),
                                                               opts if opts is not None else _c10d.AllgatherOptions()))

    def _reduce_scatter_base(self, output, input, opts=None):
        staged = output.clone()
        return self._issue([output], [staged],
                           lambda: self._inner._reduce_scatter_base(
                               staged, input.clone(), opts if opts is not None else dist.ReduceScatterOptions()))

    def reduce(self, tensors, opts=None):
        staged = [t.clone() for t in tensors]
        return self._issue(tensors, staged,
                           lambda: self._inner.reduce(staged, opts if opts is not None else dist.ReduceOptions()))

    def gather(self, output_lists, inputs, opts=None):
        return self._gathered(output_lists, inputs, lambda o, i: self._inner.gather(
            o, i, opts if opts is not None else dist.GatherOptions()))

    def scatter(self, outputs, input_lists, opts=None):
        staged = [t.clone() for t in outputs]
        return self._issue(outputs, staged,
                           lambda: self._inner.scatter(staged, [[t.clone() for t in ins] for ins in input_lists],
                                                       opts if opts is not None else dist.ScatterOptions()))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        staged = [t.clone() for t in outputs]
        return self._issue(outputs, staged,
                           lambda: self._inner.reduce_scatter(staged, [[t.clone() for t in ins] for ins in input_lists],
                                                              opts if opts is not None else dist.ReduceScatterOptions()))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        staged = output.clone()
        return self._issue([output], [staged],
                           lambda: self._inner.alltoall_base(staged, input.clone(), output_split_sizes,
                                                             input_split_sizes,
                                                             opts if opts is not None else dist.AllToAllOptions()))

    # The functional collectives (DTensor's redistribute: full_tensor(), FSDP2's
    # state dicts) come through the coalesced forms, which gloo's Python
    # binding lacks: one gloo collective per tensor, one work for them all.
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        staged = [t.clone() for t in outputs]
        return self._issue(outputs, staged, lambda: _Works(
            [self._inner._allgather_base(o, i.clone(), _c10d.AllgatherOptions()) for o, i in zip(staged, inputs)]))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        staged = [t.clone() for t in outputs]
        return self._issue(outputs, staged, lambda: _Works(
            [self._inner._reduce_scatter_base(o, i.clone(), _reduce_scatter_opts(opts))
             for o, i in zip(staged, inputs)]))

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
        global _aborts
        with _aborts_cond:
            _aborts += 1
            _aborts_cond.notify_all()
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


class LateUpdate:
    """An optimizer step's update on an emulated device, racing an abort:
    synchronize() (a CUDA event's, GIL released) returns once a group of
    the process was aborted after the event was made (at most wait_s
    later), the parameters then half updated (each shifted by `by` over its
    first half), as an update whose reduce the abort cut short. A step
    fenced on it must not count."""

    def __init__(self, params, by: float = 1.0, wait_s: float = 60.0) -> None:
        self.params, self.by, self.wait_s = list(params), by, wait_s
        with _aborts_cond:
            self._before = _aborts

    def synchronize(self) -> None:
        with _aborts_cond:
            if not _aborts_cond.wait_for(lambda: _aborts > self._before, self.wait_s):
                raise RuntimeError("strict_nccl.LateUpdate: no abort came within %.0f s" % self.wait_s)
        with torch.no_grad():
            for p in self.params:
                flat = p.view(-1)
                flat[: (flat.numel() + 1) // 2] += self.by


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
