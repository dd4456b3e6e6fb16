"""Re-slicing: the state of a step, held in memory for every rank of another
world size (a shrink or a grow), sliced anew for this one, one old shard in
memory at a time."""

from typing import Optional, Tuple

from .. import state
from ..log import log
from ..snapshot import Snapshot, from_local, local
from ..transport import Transport
from .plans import placement, reslicable, row_range, rows_of
from .shards import set_rng, take_shard


def reslice(dist, group, old, me: int, world: int, plan, module, optimizer, objects, gen: int) -> Optional[Tuple[int, Snapshot]]:
    """The state of a step held in memory for every rank of another world
    size (a shrink or a grow; plan: plans.reslice_plan's; old: the Buddy of
    the generation that ended), sliced anew for this one: (step, this
    rank's snapshot of it for this world), or None when the state is not
    sliced as it can be re-sliced (every
    DTensor sharded on dim 0 or replicated, on a one-dimensional mesh, as
    FSDP2's fully_shard makes it); then the caller falls back to the
    program's checkpoint.

    Each old rank's snapshot is broadcast in turn from a rank that holds
    it (one old shard in memory at a time); every rank copies from it the
    rows of each tensor that fall in its own new shard (torch.chunk's
    split: rows [r * c, (r + 1) * c) of n, c = ceil(n / world), for rank r).
    What is not sharded (the optimizer's step counts, the objects in
    `state`) comes from old rank 0's; torch's RNG from old rank
    min(rank, old world - 1)'s."""
    import torch
    step, was_world, holders = plan
    transport = Transport(dist, group)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    mine = module.state_dict()
    fill = []      # (target local tensor, name): rows to copy from each old rank's snapshot
    layout0 = None
    opt_state = None
    rng = None
    for r in range(was_world):
        snap = old.find(r, was_world, step) if holders[r] == me else None
        snap = transport.broadcast(snap, holders[r], me)
        layout = snap.unpack()
        trees = layout["trees"]
        if r == 0:
            layout0 = layout
            if not all(reslicable(sl.spec) for sl in state.slots(trees["model"]) + state.slots(trees["optimizer"])):
                log("generation %d: the replicas of step %d (world %d) are not sliced on dim 0 of a "
                    "one-dimensional mesh: they cannot be re-sliced for world %d" % (gen, step, was_world, world))
                return None
            for name, sl in trees["model"].items():
                if name not in mine:
                    raise ValueError("the replica of step %d has %s, which this model has not" % (step, name))
                fill.append((local(mine[name])[0], name))
            opt_state = {}
            for i, st in trees["optimizer"]["state"].items():
                like = params[i] if i < len(params) else None
                entry = {}
                for k, v in st.items():
                    if isinstance(v, state.TensorSlot):
                        shape = v.shape
                        if v.spec is not None and placement(v.spec) == "shard0":
                            shape = rows_of(v.spec, me, world) + tuple(v.spec[1][1:])
                        part = torch.empty(shape, dtype=v.dtype)
                        fill.append((part, "optimizer state %s of parameter %d" % (k, i)))
                        entry[k] = (part, v, like)
                    else:
                        entry[k] = v
                opt_state[i] = entry
        if r == min(me, was_world - 1):
            rng = layout["extra"]
        offsets = layout["offsets"]
        slots = state.slots(trees["model"]) + state.slots(trees["optimizer"])
        if len(slots) != len(fill):
            raise ValueError("old rank %d's replica of step %d holds %d tensors, rank 0's %d"
                             % (r, step, len(slots), len(fill)))
        for (dst, name), sl in zip(fill, slots):
            src = snap.view(offsets[sl.index], sl.dtype, sl.shape)
            copy_rows(dst, src, sl.spec, r, was_world, me, world, name)
        snap = None
    with torch.no_grad():
        opt = dict(layout0["trees"]["optimizer"])
        opt["state"] = {i: {k: (from_local(v[0], v[1].spec, v[2]) if isinstance(v, tuple) else v)
                            for k, v in st.items()} for i, st in opt_state.items()}
        optimizer.load_state_dict(opt)
    for name, o in objects.items():
        o.load_state_dict(layout0["extra"]["objects"][name])
    set_rng(rng)
    snap = Snapshot()
    take_shard(snap, step, me, world, module, optimizer, objects)
    return step, snap


def copy_rows(dst, src, spec, old_rank: int, old_world: int, rank: int, world: int, name: str) -> None:
    """Copies into dst (rank's local part, world) what src (old_rank's, old_world) holds of it."""
    if spec is None or placement(spec) == "replicate":
        if old_rank == 0:
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError("%s: the replica is %s, this model's %s" % (name, tuple(src.shape), tuple(dst.shape)))
            dst.copy_(src)
        return
    n = spec[1][0]
    a0, a1 = row_range(n, old_rank, old_world)
    b0, b1 = row_range(n, rank, world)
    if dst.shape[0] != b1 - b0 or src.shape[0] != a1 - a0:
        raise ValueError("%s: a shard of %d rows is not split as torch.chunk splits it (%s here, %s in the replica)"
                         % (name, n, tuple(dst.shape), tuple(src.shape)))
    lo, hi = max(a0, b0), min(a1, b1)
    if lo < hi:
        dst[lo - b0:hi - b0].copy_(src[lo - a0:hi - a0])
