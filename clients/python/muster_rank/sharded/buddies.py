"""Buddy replicas: each rank's shard state, every replica_every steps, in
host memory at its buddy, a rank on another node (plans.buddy_choice),
shipped by a thread while training goes on."""

import os
import socket
import threading
import time
from typing import List, Optional, Tuple

from ..snapshot import Snapshot
from ..transport import Transport
from .plans import buddy_choice
from .shards import take_shard


class Buddy:
    """Buddy replicas of one generation: a thread that ships this rank's
    snapshot to its buddy (a rank on another node) and receives its wards'
    (the ranks whose buddy it is), over a gloo group of its own.

    Memory: two own snapshots (the last one every buddy is known to hold,
    and the one in flight) and two per ward (the same two steps). A round
    is committed when every rank has done its part of it, which the main
    thread learns at the next round with one all-reduce of a flag.
    """

    def __init__(self, dist, group, rank, world, buddy, wards, own=None, held=None, carried=None):
        self.dist, self.group = dist, group
        self.rank, self.world, self.buddy, self.wards = rank, world, buddy, wards
        self.own = own or []          # [Snapshot], oldest first, at most 2
        self.held = held or {}        # ward -> [Snapshot], at most 2
        # Re-sliced from another world: that world's snapshots this rank held,
        # kept until this world's first round is held everywhere (a rank lost
        # before then is re-sliced from them again).
        self.carried = carried or []
        self._cond = threading.Condition()
        self._job = None              # the snapshot of the round to ship
        self._busy = False
        self._error = None
        self._quit = False
        self._round = -1              # the step of the round shipped last
        self._thread = threading.Thread(target=self._loop, name="muster_rank-buddy", daemon=True)
        self._thread.start()
        if self.own:  # restored: its buddy gets the step restored at once
            self._post(self.own[-1])

    def holdings(self) -> List[Tuple[int, int, int]]:
        """[(rank, world, step)] of every whole snapshot this rank holds (a copy
        under way waited for)."""
        snaps = self.own + [s for ss in self.held.values() for s in ss] + self.carried
        return sorted({(s.rank, s.world, s.step) for s in snaps if s.wait() and s.step >= 0})

    def find(self, rank: int, world: int, step: int) -> Optional[Snapshot]:
        for s in self.own + [s for ss in self.held.values() for s in ss] + self.carried:
            if s.wait() and (s.rank, s.world, s.step) == (rank, world, step):
                return s
        return None

    def replicate(self, step: int, model, optimizer, objects, fence=None) -> None:
        """At a step boundary, on every rank: commits the last round, snapshots
        this step and ships it in the background. Raises RuntimeError when the
        last round failed (a peer died: the program's healing follows), or
        when an abort (fence) passed while the snapshot was taken: it is not
        complete, and is not shipped. A copy of CUDA tensors still under way
        is the shipping thread's to wait for (muster_rank.pinned); an abort
        before it lands fails the round."""
        import torch
        with self._cond:
            while self._busy:
                self._cond.wait()
            error = self._error
        if self._round >= 0:
            # Once every rank got its wards' snapshots of the last round, that
            # round is held everywhere and what is older can go.
            ok = torch.tensor([0 if error else 1], dtype=torch.int64)
            self.dist.all_reduce(ok, op=self.dist.ReduceOp.MIN, group=self.group)
            if ok.item() != 1:
                raise RuntimeError("buddy replicas of step %d: %s" % (self._round, error or "a peer's failed"))
            self._keep_after(self._round)
            self.carried = []
        snap = slot(self.own)
        take_shard(snap, step, self.rank, self.world, model, optimizer, objects, fence)
        if not snap.complete and not snap.copying:
            raise RuntimeError("buddy replica of step %d: the process groups were aborted while it was taken" % step)
        self._post(snap)

    def _post(self, snap: Snapshot) -> None:
        with self._cond:
            self._job, self._busy, self._round = snap, True, snap.step
            self._cond.notify_all()

    def _keep_after(self, step: int) -> None:
        """Frees the own and held snapshots older than step (their buffers stay for reuse)."""
        for ss in [self.own] + list(self.held.values()):
            if any(s.complete and s.step >= step for s in ss):
                for s in ss:
                    if s.step < step:
                        s.complete, s.step = False, -1

    def idle(self, timeout: float) -> bool:
        """Waits for the round in flight; True once none is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self, timeout: float) -> bool:
        """Lets the round in flight end (or fail) within timeout, then ends the thread."""
        done = self.idle(timeout)
        with self._cond:
            self._quit = True
            self._cond.notify_all()
        if done:
            self._thread.join(timeout)
        return done

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._quit:
                    self._cond.wait()
                if self._quit:
                    return
                snap, self._job = self._job, None
            error = None
            try:
                self._ship(snap)
            except Exception as e:  # a peer's death: the main thread's next round raises it
                error = str(e) or type(e).__name__
            with self._cond:
                self._error, self._busy = error, False
                self._cond.notify_all()

    def _ship(self, snap: Snapshot) -> None:
        transport = Transport(self.dist, self.group)
        works = transport.send(snap, self.buddy) if self.buddy is not None else []
        for w in self.wards:
            transport.recv(slot(self.held.setdefault(w, [])), w)
        for w in works:
            w.wait()


def slot(snaps: List[Snapshot]) -> Snapshot:
    """The snapshot of snaps (at most 2) to fill next, moved to its end:
    a free one (neither complete nor copying), else the older of two, else a new one."""
    snap = next((s for s in snaps if not s.complete and not s.copying), None)
    if snap is None and len(snaps) >= 2:
        snap = snaps[0]
    if snap is None:
        snap = Snapshot()
    else:
        snaps.remove(snap)
    snap.complete, snap.step = False, -1
    snaps.append(snap)
    return snap


def buddies(dist, rank: int, world: int) -> Tuple[Optional[int], List[int]]:
    """(buddy, wards) of this rank (plans.buddy_choice), from every rank's node
    (MUSTER_NODE, else GROUP_RANK, else the host name), gathered over dist."""
    node = os.environ.get("MUSTER_NODE") or os.environ.get("GROUP_RANK") or socket.gethostname()
    names = [None] * world
    dist.all_gather_object(names, node)
    return buddy_choice(names, rank)
