"""Moving a Snapshot between the ranks of a process group, the one transport
for state (as TorchFT's CheckpointTransport): Elastic broadcasts the state of
the rank with the most steps, ShardedElastic sends replicas to buddies and
broadcasts old shards to re-slice them. A snapshot travels as three tensors:
a header (step, rank, world, layout bytes, flat bytes), the pickled layout,
and the flat buffer."""

from typing import List, Optional

from .snapshot import Snapshot


class Transport:
    """Snapshots over dist (torch.distributed) in group (None: the default
    group). device: where the tensors travel (a backend such as NCCL moves
    only device tensors); None: the host, where the snapshot lives."""

    def __init__(self, dist, group=None, device=None) -> None:
        self.dist, self.group, self.device = dist, group, device

    def _parts(self, snap: Snapshot) -> list:
        """snap's three tensors, once it is complete (a copy of its CUDA tensors landed)."""
        import torch
        snap.require()
        parts = [torch.tensor([snap.step, snap.rank, snap.world, len(snap.layout), snap.flat.numel()],
                              dtype=torch.int64),
                 torch.frombuffer(bytearray(snap.layout), dtype=torch.uint8), snap.flat]
        return parts if self.device is None else [t.to(self.device) for t in parts]

    def _empty(self, n: int, dtype):
        import torch
        return torch.empty(n, dtype=dtype, device=self.device)

    def _take(self, snap: Snapshot, head, layout, flat) -> None:
        step, rank, world, _, _ = (int(v) for v in head.tolist())
        snap.flat = flat if self.device is None else flat.cpu()
        snap.layout = layout.cpu().numpy().tobytes()
        snap.step, snap.rank, snap.world, snap.complete = step, rank, world, True

    def send(self, snap: Snapshot, dst: int) -> List:
        """Works (not waited on) that send snap to rank dst."""
        return [self.dist.isend(t, dst, group=self.group) for t in self._parts(snap)]

    def recv(self, snap: Snapshot, src: int) -> None:
        """Receives rank src's snapshot into snap, reusing its buffer when the size fits (blocks)."""
        import torch
        snap.complete = False
        head = self._empty(5, torch.int64)
        self.dist.recv(head, src, group=self.group)
        nlayout, nflat = int(head[3]), int(head[4])
        layout = self._empty(nlayout, torch.uint8)
        if self.device is None and snap.flat is not None and snap.flat.numel() == nflat:
            flat = snap.flat
        else:
            snap.flat = None
            flat = self._empty(nflat, torch.uint8)
        self.dist.recv(layout, src, group=self.group)
        self.dist.recv(flat, src, group=self.group)
        self._take(snap, head, layout, flat)

    def broadcast(self, snap: Optional[Snapshot], src: int, me: int) -> Snapshot:
        """Rank src's snapshot on every rank: src sends snap, the others receive
        it into snap (a new one when None) and return it (blocks)."""
        import torch
        if me == src:
            for t in self._parts(snap):
                self.dist.broadcast(t, src, group=self.group)
            return snap
        snap = snap if snap is not None else Snapshot()
        snap.complete = False
        head = self._empty(5, torch.int64)
        self.dist.broadcast(head, src, group=self.group)
        nlayout, nflat = int(head[3]), int(head[4])
        layout = self._empty(nlayout, torch.uint8)
        flat = self._empty(nflat, torch.uint8)
        self.dist.broadcast(layout, src, group=self.group)
        self.dist.broadcast(flat, src, group=self.group)
        self._take(snap, head, layout, flat)
        return snap
