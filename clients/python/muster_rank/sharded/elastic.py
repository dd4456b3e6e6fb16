"""ShardedElastic: healing in place for a sharded program, with buddy replicas."""

from typing import List

from .. import pg
from ..elastic import Elastic
from ..log import log
from ..snapshot import Snapshot
from ..transport import Transport
from .buddies import Buddy, buddies, slot
from .plans import reslice_plan, restore_plan
from .reslice import reslice
from .shards import apply_shard, take_shard


class ShardedElastic(Elastic):
    """Healing in place for a sharded program (FSDP2's fully_shard, or any
    model whose state_dict holds DTensors), with buddy replicas.

        def build():                       # called once per generation
            model = Net()
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

        elastic = muster_rank.ShardedElastic(build, replica_every=10, checkpoint=load_ckpt)
        def train_step(step):
            loss = loss_fn(elastic.model(x), y)
            elastic.optimizer.zero_grad(); loss.backward(); elastic.optimizer.step()
            return loss
        elastic.run(train_step, steps)

    A survivor holds only its shard, so the model is built anew in every
    generation's process group (build(): the model sharded, its optimizer),
    and every rank's state is put back from host memory: every replica_every
    steps each rank snapshots its shard state (its local parameter and
    optimizer shards, the objects in `state`, the step, torch's RNG) and a
    thread ships it to its buddy, a rank on another node, while training
    goes on. When a generation forms, all ranks go back to the latest step
    whose state exists for every rank: a survivor's own snapshot, the
    replacement's at its buddy. So a failure redoes the steps since the last
    replica (fewer than replica_every, or up to twice that when the round
    in flight was lost too). When the world changed size (a shrink or a
    grow), that state is re-sliced for the new world (see reslice); a grow
    goes back to no earlier step (every rank keeps its state of the boundary
    the ranks left at). When a rank and its buddy were both lost (or the
    state cannot be re-sliced), every rank, the survivors in place, calls
    checkpoint(model, optimizer), the program's own loader, which returns the
    step it loaded (None: no checkpoint, start from the seed). It is also what
    a job started anew resumes from.
    """

    def __init__(self, build, replica_every=10, state=None, checkpoint=None, backend="gloo",
                 heal_wait_s=30.0, replica_timeout_s=300.0, timeout_s=300.0, link=None):
        if int(replica_every) < 0:
            raise ValueError("replica_every must be >= 0 (0: no replicas), got %r" % (replica_every,))
        # timeout_s bounds every collective: the last resort of a survivor whose
        # peers left a collective of the old group that it still waits in
        super().__init__(None, None, state=state, backend=backend, heal_wait_s=heal_wait_s,
                         timeout_s=float(timeout_s), link=link)
        self._build = build
        self._every = int(replica_every)
        self._checkpoint = checkpoint
        self._replica_timeout = float(replica_timeout_s)
        self._buddy = None
        self.restored = None   # (from, step, steps redone) of the last generation formed

    def run(self, train_step, steps):
        def step_then_replicate(step):
            result = train_step(step)
            if self._every and (step + 1) % self._every == 0 and step + 1 < steps:
                self._buddy.replicate(step + 1, self.module, self.optimizer, self._state, self._fence)
            # the result outlives the step: without its autograd graph (see _let_go)
            return result.detach() if hasattr(result, "detach") else result
        try:
            return super().run(step_then_replicate, steps)
        finally:
            if self._buddy is not None:
                self._buddy.stop(min(self._replica_timeout, 30.0))

    def _watch_steps(self, fn):
        from torch.optim.optimizer import register_optimizer_step_post_hook
        return register_optimizer_step_post_hook(lambda opt, *_: fn() if opt is self.optimizer else None)

    def _rejoin(self, dist, yielded: bool) -> None:
        if yielded and self._buddy is not None and self.step > 0:
            # Every rank leaves at this step boundary, none lost: each keeps its
            # state of this step, so that the next world (re-sliced) redoes no step.
            self._buddy.stop(5.0)
            take_shard(slot(self._buddy.own), self.step, dist.get_rank(), dist.get_world_size(), self.module,
                       self.optimizer, self._state)
        super()._rejoin(dist, yielded)

    def _let_go(self) -> None:
        if self._buddy is not None:
            self._buddy.stop(5.0)  # a round whose peers live ends; one with a dead peer fails
            self._buddy.group = None
        # A gloo group closes its connections only once nothing refers to it,
        # and the peers that still wait in one of its collectives fail only
        # then. The sharded model and its optimizer refer to it (run() has
        # dropped the failed step's error, whose frames hold the loss's
        # autograd graph and so FSDP's hooks), and so does the device mesh,
        # which DTensor's sharding caches keep: all let go of it before the
        # group is destroyed.
        self.model = self.module = self.optimizer = None
        pg.release_meshes()

    def _sync_state(self, dist) -> None:
        """Every rank's model built anew in this group, its shard state from
        the buddy replicas, else the program's checkpoint, else the seed."""
        import datetime
        import gc
        me, world = dist.get_rank(), dist.get_world_size()
        was = self.step
        old = self._buddy
        self.model = self.module = self.optimizer = None
        gc.collect()
        self.model, self.optimizer = self._build()
        self.module = self.model
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self._replica_timeout))
        buddy, wards = buddies(dist, me, world)
        offers = [None] * world
        dist.all_gather_object(offers, old.holdings() if old is not None else [])
        plan = restore_plan(offers, world)
        resliced_plan = reslice_plan(offers, world) if plan is None else None
        resliced = None
        if resliced_plan is not None:
            resliced = reslice(dist, group, old, me, world, resliced_plan, self.module, self.optimizer, self._state,
                               self._gen)
        carried = []
        if resliced is not None:
            self.step, snap = resliced
            own, held = [snap], {}
            how = ("memory", self.step)
            if old is not None:  # a new process holds none
                was_world = resliced_plan[1]
                carried = [c for c in (old.find(r, was_world, self.step) for r in range(was_world)) if c is not None]
        elif plan is not None:
            step, sources = plan
            snap = self._fetch(dist, group, old, me, world, step, sources)
            apply_shard(snap, self.module, self.optimizer, self._state)
            self.step = step
            own, held = [snap], {}
            if old is not None:  # the replicas of this step it holds stay (its wards may be survivors)
                for w in wards:
                    s = old.find(w, world, step)
                    if s is not None:
                        held[w] = [s]
            how = ("memory", step)
        else:
            own, held = [], {}
            loaded = self._checkpoint(self.module, self.optimizer) if self._checkpoint else None
            self.step = int(loaded) if loaded is not None else 0
            how = ("disk" if loaded is not None else "seed", self.step)
        old = None
        self._buddy = Buddy(dist, group, me, world, buddy, wards, own, held, carried)
        self._link.set_restored(*how)
        self._suspect = self._interrupted = False  # a step interrupted in its own code: redone from a replica
        self.restored = (how[0], how[1], max(was - how[1], 0))
        if me == 0 and was > 0:
            log("generation %d: every rank at step %d from %s (%d steps redone)"
                % (self._gen, how[1], "buddy replicas" if how[0] == "memory" and resliced is None else
                    "buddy replicas re-sliced from world %d to %d" % (resliced_plan[1], world)
                    if how[0] == "memory" else
                    "the program's checkpoint" if how[0] == "disk" else "the seed", max(was - how[1], 0)))

    def _fetch(self, dist, group, old: Buddy, me: int, world: int, step: int, sources: List[int]) -> Snapshot:
        """This rank's snapshot of step: its own, or sent by the rank that holds it;
        sends what it holds of step for ranks that have it nowhere else."""
        transport = Transport(dist, group)
        works = []
        for r, src in enumerate(sources):
            if src == me and r != me:
                works += transport.send(old.find(r, world, step), r)
        if sources[me] == me:
            snap = old.find(me, world, step)
        else:
            snap = Snapshot()
            transport.recv(snap, sources[me])
        for w in works:
            w.wait()
        return snap
