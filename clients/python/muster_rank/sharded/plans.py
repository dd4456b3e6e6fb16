"""ShardedElastic's decisions, as functions of lists: no torch, no sockets.

An offer is what one rank holds in memory: [(rank, world, step)] of every
whole snapshot (its own and its wards'), one list per rank of this world.
A DTensor spec is (placements, global shape, stride), as snapshot.local
makes it; a placement answers is_replicate() and is_shard() (and has dim).
"""

from typing import List, Optional, Sequence, Tuple

Offer = List[Tuple[int, int, int]]


def restore_plan(offers: Sequence[Offer], world: int) -> Optional[Tuple[int, List[int]]]:
    """(step, source rank per rank) of the latest step whose state every rank
    of this world can have (its own snapshot, else a holder's), or None."""
    steps = sorted({s for held in offers for (r, w, s) in held if w == world}, reverse=True)
    for step in steps:
        sources = []
        for r in range(world):
            if (r, world, step) in offers[r]:
                sources.append(r)
            else:
                sources.append(next((q for q in range(world) if (r, world, step) in offers[q]), None))
        if None not in sources:
            return step, sources
    return None


def reslice_plan(offers: Sequence[Offer], world: int) -> Optional[Tuple[int, int, List[int]]]:
    """(step, old world, holder per old rank) of the latest step whose state
    the ranks of this world hold for every rank of another world, or None."""
    held = sorted({(s, w) for o in offers for (r, w, s) in o if w != world}, reverse=True)
    for step, was in held:
        holders = []
        for r in range(was):
            holders.append(next((q for q in range(world) if (r, was, step) in offers[q]), None))
        if None not in holders:
            return step, was, holders
    return None


def row_range(n: int, rank: int, world: int) -> Tuple[int, int]:
    """Rows [start, end) of n that rank holds, sharded on dim 0 over world (torch.chunk's split)."""
    c = -(-n // world)
    start = min(rank * c, n)
    return start, min(start + c, n)


def rows_of(spec, rank: int, world: int) -> Tuple[int]:
    """The local row count (as a shape's head) of a tensor of spec sharded on dim 0, on rank of world."""
    start, end = row_range(spec[1][0], rank, world)
    return (end - start,)


def placement(spec) -> Optional[str]:
    """"shard0", "replicate", or None for any other DTensor placement."""
    placements = spec[0]
    if len(placements) != 1:
        return None
    p = placements[0]
    if p.is_replicate():
        return "replicate"
    if p.is_shard() and getattr(p, "dim", None) == 0:
        return "shard0"
    return None


def reslicable(spec) -> bool:
    """A tensor of spec (None: a plain one) can be re-sliced for another world size."""
    return spec is None or placement(spec) is not None


def buddy_choice(nodes_of_ranks: Sequence[str], rank: int) -> Tuple[Optional[int], List[int]]:
    """(buddy, wards) of rank, given each rank's node name: its buddy is the
    rank of the same index on the next node (nodes in the order of their
    first rank, wrapping), so that a node's loss leaves its ranks' replicas
    on another; with one node, the next rank on it. wards: the ranks whose
    buddy it is. A world of one rank has no buddy. muster-train picks its
    holders by another rule (one ring): docs/training.md, "Two buddy rules",
    says how and why."""
    world = len(nodes_of_ranks)
    nodes: List[Tuple[object, List[int]]] = []
    for r, n in enumerate(nodes_of_ranks):
        if not nodes or nodes[-1][0] != n:
            nodes.append((n, []))
        nodes[-1][1].append(r)
    if len(nodes) == 1:
        nodes = [(r, [r]) for r in range(world)]

    def buddy_of(r):
        i = next(i for i, (_, ranks) in enumerate(nodes) if r in ranks)
        if len(nodes) < 2:
            return None
        here, there = nodes[i][1], nodes[(i + 1) % len(nodes)][1]
        return there[here.index(r) % len(there)]
    return buddy_of(rank), [r for r in range(world) if r != rank and buddy_of(r) == rank]
