"""A rank's shard state in a Snapshot: its model's and optimizer's
state_dicts (a DTensor's local shard), the objects in `state` and torch's
RNG, taken between steps and put back into a model and optimizer built for
the same world size."""

from typing import Any, Dict

from .. import state
from ..snapshot import Snapshot, from_local, local


def take_shard(snap: Snapshot, step: int, rank: int, world: int, model, optimizer, objects: Dict[str, Any],
               fence=None) -> None:
    """snap holds rank's state of step: layout trees "model" and "optimizer",
    extra {"objects", "rng", "cuda_rng"}; not complete when an abort passed
    meanwhile (fence: see Snapshot.take)."""
    import torch
    with torch.no_grad():
        snap.take(step, rank, world, {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                  {"objects": {name: o.state_dict() for name, o in objects.items()},
                   "rng": torch.get_rng_state(),
                   "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None},
                  fence)


def copy_into(dst, src, name: str) -> None:
    """src's values into dst's local part, which must have its shape."""
    part, _ = local(dst)
    if tuple(part.shape) != tuple(src.shape):
        raise ValueError("%s: the saved shard is %s, this model's %s (another world size?)"
                         % (name, tuple(src.shape), tuple(part.shape)))
    part.copy_(src)


def set_rng(extra: dict) -> None:
    """torch's RNG (and CUDA's, when it was taken with CUDA in use) as take_shard took it."""
    import torch
    torch.set_rng_state(extra["rng"])
    if extra["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(extra["cuda_rng"])


def apply_shard(snap: Snapshot, model, optimizer, objects: Dict[str, Any]) -> None:
    """Puts the state back into a model and optimizer built for the same
    world size (a fresh optimizer included: its state is made here)."""
    import torch
    layout = snap.unpack()
    trees, extra, offsets = layout["trees"], layout["extra"], layout["offsets"]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    with torch.no_grad():
        mine = model.state_dict()
        for name, slot in trees["model"].items():
            if name not in mine:
                raise ValueError("rank %d's state of step %d has %s, which this model has not"
                                 % (snap.rank, snap.step, name))
            copy_into(mine[name], snap.view(offsets[slot.index], slot.dtype, slot.shape), name)
    opt = trees["optimizer"]

    def restored(st, like):
        return state.fill(st, lambda sl: from_local(snap.tensor(layout, sl), sl.spec, like))
    opt["state"] = {i: restored(st, params[i] if i < len(params) else None) for i, st in opt["state"].items()}
    optimizer.load_state_dict(opt)
    for name, o in objects.items():
        o.load_state_dict(extra["objects"][name])
    set_rng(extra)
