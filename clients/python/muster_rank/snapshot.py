"""A state in host memory: every tensor of some state_dicts (a DTensor's local
shard, not the whole) in one flat byte buffer, and the rest (their layout,
other objects' state) as one pickled layout. What muster_rank.transport moves
between ranks: Elastic's state from the rank with the most steps, and
ShardedElastic's buddy replicas."""

import math
import pickle
import threading
from typing import Any, Dict, Optional

from . import pinned, state


def _align(n: int) -> int:
    return (n + 63) & ~63


def local(t) -> tuple:
    """(a tensor's local part as a plain tensor, its DTensor spec or None)."""
    if hasattr(t, "to_local") and hasattr(t, "placements"):
        return t.to_local().detach(), (tuple(t.placements), tuple(t.shape), tuple(t.stride()))
    return t.detach(), None


def from_local(t, spec, like):
    """A tensor restored from its local part: a DTensor again where it was
    one, on the mesh of the parameter it belongs to (like) in this generation."""
    if spec is None:
        return t  # load_state_dict moves it where the optimizer keeps it
    from torch.distributed.tensor import DTensor
    placements, shape, stride = spec
    t = t.to(local(like)[0].device)
    return DTensor.from_local(t, like.device_mesh, placements, run_check=False, shape=shape, stride=stride)


class Snapshot:
    """One rank's state at one step. layout, once unpickled (unpack()):
    {"trees": {name: stripped state_dict}, "extra": what was passed as is,
    "offsets": each tensor's offset in flat}.

    It is complete when it holds that state whole: every byte received, or
    taken with no abort meanwhile and, for CUDA tensors, their copy to the
    host landed (muster_rank.pinned). What reads it waits for that first:
    wait(), or require() (which view(), unpack() and the transport call),
    which raises if it never is. ops: the torch.cuda pieces the copy uses
    (None: muster_rank.pinned's CudaOps, at the first CUDA tensor)."""

    def __init__(self, ops=None) -> None:
        self.step = -1       # the step it holds (-1: nothing yet)
        self.rank = -1       # whose: that rank's number and world size when taken
        self.world = 0
        self.layout: Optional[bytes] = None
        self._flat = None     # uint8 tensor
        self._pinned = False  # _flat is take()'s page-locked buffer (a state with CUDA tensors)
        self._complete = False
        self._copy: Optional[pinned.Copy] = None  # the copy of CUDA tensors under way, until settled
        self._lock = threading.Lock()  # settling: the training thread and the buddy thread may both
        self._ops = ops

    @property
    def flat(self):
        """The uint8 tensor of every tensor's bytes (a copy under way may still
        write into it: read it after wait())."""
        return self._flat

    @flat.setter
    def flat(self, t) -> None:
        if t is not self._flat:
            self._flat, self._pinned = t, False

    @property
    def complete(self) -> bool:
        """Whether it holds its state whole (asks the device about a copy under way; never blocks)."""
        copy = self._copy
        if copy is not None and (copy.landed() or not copy.clean()):
            self._settle(copy, copy.clean())
        return self._complete

    @complete.setter
    def complete(self, value: bool) -> None:
        """Set by what fills or frees it, once a copy under way landed (the
        buffer is written again only then) or an abort refused it."""
        self.wait()
        self._complete = value

    @property
    def copying(self) -> bool:
        """Whether the copy of its CUDA tensors is still under way (complete or not once it lands)."""
        return not self.complete and self._copy is not None

    def wait(self) -> bool:
        """Whether it is complete, once the copy under way landed (blocks, the
        GIL free) or an abort passed (never complete then)."""
        copy = self._copy
        if copy is not None:
            self._settle(copy, copy.wait() and copy.clean())
        return self._complete

    def _settle(self, copy: "pinned.Copy", ok: bool) -> None:
        with self._lock:
            if self._copy is not copy:
                return  # settled by the other thread
            self._copy, self._complete = None, ok
            if not ok and not copy.landed():
                self._flat = None  # the device may still write into it: never read nor reused

    def take(self, step: int, rank: int, world: int, trees: Dict[str, Any], extra: Any = None, fence=None) -> None:
        """Holds trees (name -> state_dict), their tensors copied into flat, and
        extra as it is. A host tensor is copied at once; a CUDA one into
        pinned host memory on a side stream (muster_rank.pinned: the host
        does not wait), and the snapshot is complete once that copy landed.
        Never complete when an abort (fence: a muster_rank.fence.Fence)
        passed between the take's start and then (what it copied may be
        half updated). flat is kept from take to take while its size and
        kind (pinned or not) stay."""
        import torch
        epoch = fence.epoch if fence is not None else 0
        self.complete = False  # after an earlier take's copy under way landed
        tensors: list = []
        copy = None
        with torch.no_grad():
            layout = {"trees": {name: state.strip(tree, tensors, local) for name, tree in trees.items()},
                      "extra": extra}
            offsets, size = [], 0
            for t in tensors:
                offsets.append(size)
                size = _align(size + t.numel() * t.element_size())
            layout["offsets"] = offsets
            device = [(off, t) for off, t in zip(offsets, tensors) if t.is_cuda]
            self._buffer(size, bool(device))
            for off, t in zip(offsets, tensors):
                if not t.is_cuda:
                    self._view(off, t.dtype, t.shape).copy_(t)
            if device:
                copy = pinned.Copy.start(self._cuda(), [(self._view(off, t.dtype, t.shape), t) for off, t in device],
                                         fence, epoch)
        self.layout = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
        self.step, self.rank, self.world = step, rank, world
        if copy is None:
            self._complete = fence is None or fence.taken(epoch)
        else:
            self._copy = copy
            if not copy.clean():
                self._settle(copy, False)

    def _buffer(self, size: int, pin: bool) -> None:
        """flat of size bytes, page-locked when pin; the one it has when it fits."""
        import torch
        if self._flat is None or self._flat.numel() != size or self._pinned != pin:
            self._flat = None  # the old buffer goes before the new one comes
            self._flat = self._cuda().pinned(size) if pin else torch.empty(size, dtype=torch.uint8)
            self._pinned = pin

    def _cuda(self):
        if self._ops is None:
            self._ops = pinned.cuda_ops()
        return self._ops

    def require(self) -> None:
        """Returns once it is complete (wait()); RuntimeError if it never is."""
        if not self.wait():
            raise RuntimeError("rank %d's snapshot of step %d is not complete (taken across an abort, or "
                               "never filled): it is not read" % (self.rank, self.step))

    def unpack(self) -> dict:
        """The layout as take() made it, once the snapshot is complete (RuntimeError if it never is)."""
        self.require()
        return pickle.loads(self.layout)

    def view(self, off: int, dtype, shape):
        """The tensor of dtype and shape at byte offset off of flat (no copy),
        once the snapshot is complete (RuntimeError if it never is)."""
        self.require()
        return self._view(off, dtype, shape)

    def _view(self, off: int, dtype, shape):
        import torch
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        return self._flat[off:off + n].view(dtype).view(shape)

    def tensor(self, layout: dict, slot: state.TensorSlot):
        """A copy of the tensor slot of layout holds, on this rank's device of
        the slot's device type (state.place)."""
        view = self.view(layout["offsets"][slot.index], slot.dtype, slot.shape)
        where = state.place(slot)
        return view.clone() if where.type == "cpu" else view.to(where)

    def load(self, objects: Dict[str, Any]) -> None:
        """Every object's state from the tree of its name (load_state_dict)."""
        layout = self.unpack()
        for name, o in objects.items():
            o.load_state_dict(state.fill(layout["trees"][name], lambda sl: self.tensor(layout, sl)))
