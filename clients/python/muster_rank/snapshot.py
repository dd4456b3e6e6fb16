"""A state in host memory: every tensor of some state_dicts (a DTensor's local
shard, not the whole) in one flat byte buffer, and the rest (their layout,
other objects' state) as one pickled layout. What muster_rank.transport moves
between ranks: Elastic's state from the rank with the most steps, and
ShardedElastic's buddy replicas."""

import math
import pickle
from typing import Any, Dict, Optional

from . import state


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
    "offsets": each tensor's offset in flat}."""

    def __init__(self) -> None:
        self.step = -1       # the step it holds (-1: nothing yet)
        self.rank = -1       # whose: that rank's number and world size when taken
        self.world = 0
        self.layout: Optional[bytes] = None
        self.flat = None     # uint8 tensor
        self.complete = False  # a received one: every byte came

    def take(self, step: int, rank: int, world: int, trees: Dict[str, Any], extra: Any = None, fence=None) -> None:
        """Holds trees (name -> state_dict), their tensors copied into flat, and
        extra as it is; not complete when an abort (fence: a muster_rank.fence.Fence)
        passed while it was taken (what it copied may be half updated)."""
        import torch
        epoch = fence.epoch if fence is not None else 0
        tensors: list = []
        with torch.no_grad():
            layout = {"trees": {name: state.strip(tree, tensors, local) for name, tree in trees.items()},
                      "extra": extra}
            offsets, size = [], 0
            for t in tensors:
                offsets.append(size)
                size = _align(size + t.numel() * t.element_size())
            layout["offsets"] = offsets
            if self.flat is None or self.flat.numel() != size:
                self.flat = None  # the old buffer goes before the new one comes
                self.flat = torch.empty(size, dtype=torch.uint8)
            for off, t in zip(offsets, tensors):
                self.view(off, t.dtype, t.shape).copy_(t)
        self.layout = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
        self.step, self.rank, self.world = step, rank, world
        self.complete = fence is None or fence.taken(epoch)

    def unpack(self) -> dict:
        """The layout as take() made it."""
        return pickle.loads(self.layout)

    def view(self, off: int, dtype, shape):
        """The tensor of dtype and shape at byte offset off of flat (no copy)."""
        import torch
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        return self.flat[off:off + n].view(dtype).view(shape)

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
