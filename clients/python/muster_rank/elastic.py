"""Healing in place for a data-parallel PyTorch program: `Elastic`.

Its loop branches on an `Action`, decided between two steps (see Action's
table): the rank keeps its process and its state across generations,
forming each generation's process group and bringing every rank to the
same state through muster_rank.transport.
"""

import os
import threading
import time
from enum import Enum
from typing import Dict, Optional

from . import pg
from .fence import Fence
from .link import connect
from .log import log, trace
from .snapshot import Snapshot
from .transport import Transport
from .where import where

# Once muster parked the generation, how long a rank may stay in its step
# before it is interrupted there (a survivor in its forward pass reaches its
# next collective, which raises, well within it; the hung rank does not), and
# how long after that before it exits, when its main thread is held outside
# any collective by native code: its peers' collectives then fail and they go on.
PARK_INTERRUPT_S = 1.0
PARK_EXIT_S = 5.0

# How often the ranks of a generation vote at a step boundary on leaving it
# for a grow (muster's COMMAND yield): one all-reduce, which costs a step of
# a small model on CPUs 10-30 %, every this many seconds of steps (and at
# most every VOTE_MAX_STEPS steps) instead of every step.
VOTE_EVERY_S = 0.5
VOTE_MAX_STEPS = 1000


class Action(Enum):
    """What the rank does before its next step, decided at the end of the last.

    ======  ==============================================================
    FORM    enter the generation it started in (run()'s first action)
    STEP    train the next step in the generation it is in
    PARK    leave the generation, which muster parked (a peer failed or
            hung), keeping its state, and form the next one
    YIELD   leave the generation with every other rank at this step
            boundary, for a grow (muster's COMMAND yield), and form the next
    ======  ==============================================================
    """
    FORM = "form"
    STEP = "step"
    PARK = "park"
    YIELD = "yield"


class _Parked(BaseException):
    """Raised in the rank's training thread, in its own code, when muster parked
    the generation and the step does not end by itself (the rank is the hung
    one). A BaseException: a program's `except Exception` lets it through."""


def _interrupt(thread_id: int, exc) -> None:
    """Raises exc in the thread at its next bytecode (None: takes back one not raised yet)."""
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc and ctypes.py_object(exc))


class Elastic:
    """Healing in place for a data-parallel PyTorch program.

        elastic = muster_rank.Elastic(model, optimizer, wrap=DDP, step=start)
        def train_step(step):
            x, y = batch(step, elastic.rank, elastic.world_size)  # this rank's share of the step's batch
            loss = loss_fn(elastic.model(x), y)   # elastic.model: wrap(model) of this generation
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            return loss
        elastic.run(train_step, steps)

    run() forms the process group (torchrun's environment: backend gloo by
    default), brings every rank to the state of the rank that completed the
    most steps (a rank started fresh, such as a replacement, receives model,
    optimizer and every object passed in `state` from it by broadcast), and
    calls train_step(step) for each step left. Under muster, when a step
    fails because a peer died (a collective raises) and muster parks the
    generation, the rank keeps its process and its state: it destroys the
    process group (an NCCL one is aborted and forgotten instead, see
    pg.aborts), waits for the next generation's ASSIGN from its agent,
    takes its RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, forms the new
    process group, brings every rank to the same state again and redoes
    the step that failed: no completed step is lost. Outside muster (plain
    python, torchrun) the same script runs, and a failure raises as usual.

    The world may change size between generations (a node lost for good:
    the job shrinks; a node that comes back: it grows, the ranks leaving
    their generation together at a step boundary on muster's COMMAND yield,
    by one vote per step): `rank` and `world_size` are this generation's.
    A rank that hangs (muster's hang detection parks the generation) is
    interrupted in its own code, or exits when it cannot be, so that its
    peers' collectives end (see PARK_INTERRUPT_S, PARK_EXIT_S).

    state: objects with state_dict()/load_state_dict() (a data loader's
    position, an LR scheduler, ...), kept alike on every rank. The step
    count travels too; the program's RNG does not (draw batches as a
    function of the step, as the test programs do, or pass an object).
    timeout_s: the process group's collective timeout (None: torch's).
    link: the rank's link to its agent (None: connect()'s); tests pass a fake.
    """

    def __init__(self, model, optimizer, wrap=None, state=None, step=0, backend="gloo", heal_wait_s=30.0,
                 timeout_s=None, link=None):
        self.module = model
        self.optimizer = optimizer
        self.model = model
        self.step = int(step)          # completed optimizer steps
        self._wrap = wrap
        self._state = dict(state or {})
        self._backend = backend
        self._heal_wait = heal_wait_s
        self._timeout = timeout_s
        self._link = link if link is not None else connect()
        self._gen = 0                  # the generation of the process group it trains in
        self._thread = None            # the thread that runs the steps
        self._running = False          # run() is under way (the park watch lives as long)
        self._busy = 0                 # a number for each generation it entered, while in it (else 0)
        self._entered = 0              # generations entered so far
        self._in_step = False          # in train_step
        self._conns = None             # the process group's sockets ({fd: inode}) once formed
        self._conns_before = None      # the sockets open before the process group was formed
        self._interrupted = False      # _Parked was sent to this step
        self._suspect = False          # interrupted in its own code: its state may be half updated
        self._vote_at = 0              # the step at whose boundary the ranks vote next (see _boundary)
        self._voted = None             # (step, monotonic time) of the last vote
        self._fence = Fence()          # abort epochs, and whether the current step's update counts
        self._aborted = 0              # the last generation whose groups were aborted (NCCL's: see pg.aborts)
        if self._link.active:
            self._link.rejoin_in_place()  # the steps are this object's, not the start-up hook's count

    @property
    def rank(self) -> int:
        """This rank's number in the current generation (RANK before run() forms the group)."""
        import torch.distributed as dist
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        """The ranks of the current generation (WORLD_SIZE before run() forms the group)."""
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    def run(self, train_step, steps: int):
        """train_step(step) for step in [self.step, steps); returns the last step's result.

        A step counts as completed once the optimizer stepped in it and its
        update finished on the device with no abort of the generation's groups
        meanwhile (muster_rank.fence), even if something after that raised
        (its update is in the state)."""
        import torch.distributed as dist
        fence = self._fence
        hook = self._watch_steps(lambda *_: fence.updated(self._update_event()))
        self._thread = threading.get_ident()
        self._link.own_steps()  # run() reports the steps: the start-up hook's own count stays out
        watcher = None
        if self._link.active:
            # What exists by now (torch's modules, the model, ...) lives as long as the
            # process: the garbage collector skips it from now on, so that the full
            # collection a heal makes (see _rejoin) takes milliseconds, not a tenth of a second.
            import gc
            gc.freeze()
            self._running = True
            watcher = threading.Thread(target=self._watch_park, name="muster_rank-park", daemon=True)
            watcher.start()
        result = None
        action = Action.FORM
        try:
            while True:
                with self._link.cond:
                    fence.begin()
                err = None
                try:
                    if action is not Action.STEP:
                        leaving, action = action, Action.STEP  # a failure here: see below
                        if leaving is Action.FORM:
                            self._form(dist)
                        else:
                            self._rejoin(dist, leaving is Action.YIELD)
                    if self.step >= steps:
                        break
                    action = self._boundary(dist)
                    if action is not Action.STEP:
                        continue
                    result = self._one_step(train_step)
                except RuntimeError as e:
                    err = e
                except _Parked:
                    self._suspect = True
                    action = Action.PARK
                if err is None and action is Action.STEP and fence.completed():
                    self.step += 1
                    loss = result.item() if hasattr(result, "item") else result
                    self._link.beat(self.step, loss=loss if isinstance(loss, (int, float)) else None)
                    continue
                if err is None and action is Action.STEP:
                    action = Action.PARK  # an abort passed during the step (only a park aborts)
                if fence.stepped:
                    if fence.completed():
                        self.step += 1
                    else:
                        self._suspect = True  # its update may be half applied: not a state source
                if err is not None:
                    trace("error")
                    if not (self._link.active and self._link.wait_over(self._gen, self._heal_wait)):
                        raise err  # no failure muster knows of: the program's own error
                    # Dropped here, out of the except clause, so that the failed step's
                    # frames (and the generation's DDP in them) go before its process group.
                    err = None
                    trace("parked")
                    action = Action.PARK
        finally:
            hook.remove()
            with self._link.cond:
                self._running = False
                self._link.cond.notify_all()
            if watcher is not None:
                # Its end drops a reference to this object (the thread's target): were
                # it the last one, a thread of its own would free the model, DDP's
                # reducer with it, and if the interpreter were exiting by then, torch
                # freeing tensors there ends the process (std::terminate, SIGABRT).
                watcher.join(PARK_EXIT_S)
        return result

    def _watch_steps(self, fn):
        """fn() after each step of the program's optimizer; returns the hook's handle."""
        return self.optimizer.register_step_post_hook(fn)

    def _update_event(self) -> Optional[object]:
        """After an optimizer step: a CUDA event recorded behind its update
        where the optimizer's parameters are on a GPU, None on the host
        (the update is done by now)."""
        for group in self.optimizer.param_groups if self.optimizer is not None else ():
            for p in group["params"]:
                if not p.is_cuda:
                    return None
                import torch
                event = torch.cuda.Event()
                event.record()
                return event
        return None

    # -- one generation's process group and state --

    def _form(self, dist, generation: Optional[int] = None) -> None:
        """Enters the generation (None: the one the rank started in): joins its
        process group, then brings the state to every rank."""
        self._join(dist, generation)
        self._sync_state(dist)
        self._vote_at, self._voted = self.step, None  # every rank votes at its first boundary

    def _join(self, dist, generation: Optional[int]) -> None:
        """The generation's process group (formed unless it is), with the
        bookkeeping the park watch relies on: the generation entered and the
        group's sockets."""
        cond = self._link.cond
        with cond:
            self._gen = self._link.generation if generation is None else generation
            self._entered += 1
            self._busy = self._entered
            cond.notify_all()
        if not dist.is_initialized():
            pg.forget_failed_init(dist)
            before = pg.sockets()
            with cond:
                self._conns = None
                self._conns_before = before
            trace("join")
            link = self._link
            gen = self._gen
            pg.await_store(self._heal_wait if self._timeout is None else max(self._timeout, self._heal_wait),
                           lambda: link.active and link.over(gen))
            kw = {}
            if self._timeout is not None:
                import datetime
                kw["timeout"] = datetime.timedelta(seconds=self._timeout)
            if pg.aborts(self._backend):
                os.environ.update(pg.nccl_env(os.environ, self._heal_wait))
                device = pg.device(self._backend)
                if device is not None:
                    kw["device_id"] = device  # formed eagerly, here, where a park's abort can end it
            dist.init_process_group(self._backend, init_method="env://", **kw)
            with cond:
                self._conns = pg.opened_since(before)
            trace("group")

    def _sync_state(self, dist) -> None:
        """Every rank to the state of the first rank with the most steps."""
        import torch
        me, world = dist.get_rank(), dist.get_world_size()
        have = self.step if self.step > 0 else -1  # -1: nothing trained, the seed's state
        device = pg.device(self._backend)
        best = torch.tensor([have], dtype=torch.int64, device=device)
        dist.all_reduce(best, op=dist.ReduceOp.MAX)
        # The state comes from the first rank with the most steps, one that was not
        # interrupted in its own code (its update may be half done) if there is one.
        key = 2 * world if have != best.item() else me + world if self._suspect else me
        src = torch.tensor([key], dtype=torch.int64, device=device)
        dist.all_reduce(src, op=dist.ReduceOp.MIN)
        src = int(src.item()) % world
        if best.item() >= 0:
            self._broadcast_state(dist, src)
            self.step = int(best.item())
            self._link.set_restored("memory", self.step)
        else:
            self._link.set_restored("seed", 0)
        self._suspect = self._interrupted = False
        trace("synced")
        self.model = self._wrap(self.module) if self._wrap else self.module
        trace("wrapped")
        if self._link.active:
            log("generation %d: rank %d of %d, training from step %d (state from %s)"
                % (self._gen, me, world, self.step, "rank %d" % src if best.item() >= 0 else "the seed"))

    def _objects(self) -> dict:
        objs = {"model": self.module, "optimizer": self.optimizer}
        objs.update(self._state)
        return objs

    def _broadcast_state(self, dist, src: int) -> None:
        """Every object's state_dict from rank src, as one snapshot (muster_rank.transport)."""
        me = dist.get_rank()
        objs = self._objects()
        snap = None
        if me == src:
            snap = Snapshot()
            snap.take(self.step, me, dist.get_world_size(), {name: o.state_dict() for name, o in objs.items()})
        snap = Transport(dist, device=pg.device(self._backend)).broadcast(snap, src, me)
        if me != src:
            snap.load(objs)

    # -- leaving a generation --

    def _boundary(self, dist) -> Action:
        """Between two steps: PARK when muster parked the generation, YIELD
        when the ranks agree to leave it for a grow (a vote, one all-reduce
        at the first boundary of a generation and then about every
        VOTE_EVERY_S: any rank that got COMMAND yield asks), else STEP."""
        link = self._link
        if not link.active:
            return Action.STEP
        if link.over(self._gen):
            return Action.PARK
        if self.step < self._vote_at:
            return Action.STEP
        # The vote: whether to yield, and when to vote next, as steps of about
        # VOTE_EVERY_S by the slowest rank's clock (one all-reduce, MAX of
        # [ask, -steps]), so that every rank counts the same steps to it.
        import torch
        now = time.monotonic()
        steps = 1
        if self._voted is not None and self.step > self._voted[0]:
            per_step = (now - self._voted[1]) / (self.step - self._voted[0])
            steps = max(1, min(VOTE_MAX_STEPS, int(VOTE_EVERY_S / per_step) if per_step > 0 else VOTE_MAX_STEPS))
        ask = torch.tensor([1 if link.yield_asked(self._gen) else 0, -steps], dtype=torch.int64,
                           device=pg.device(self._backend))
        dist.all_reduce(ask, op=dist.ReduceOp.MAX)
        ask = ask.tolist()
        self._voted = (self.step, now)
        self._vote_at = self.step + max(1, -ask[1])
        return Action.YIELD if ask[0] else Action.STEP

    def _one_step(self, train_step):
        cond = self._link.cond
        with cond:
            self._in_step = True
        try:
            return train_step(self.step)
        finally:
            with cond:
                self._in_step = False
                if self._interrupted:
                    _interrupt(self._thread, None)  # one not raised by now is not raised

    def _rejoin(self, dist, yielded: bool) -> None:
        """Leaves the generation it trained in, keeping its state, and forms the next one."""
        trace("leave")
        link = self._link
        gen = self._gen
        with link.cond:
            self._busy = 0
            link.cond.notify_all()
            conns = self._connections()
            aborted = self._aborted == gen
        if not yielded and not aborted and pg.aborts(self._backend):
            # Broken while no park watch aborted it (outside muster's watch, or left by itself):
            # an NCCL group that broke is never finalized, only aborted.
            pg.abort(dist, pg.groups(dist))
            aborted = True
        if yielded:
            link.left_for_grow()
            log("generation %d: left at the boundary of step %d with the other ranks (the job grows)"
                % (gen, self.step))
        else:
            log("generation %d broke at step %d; waiting for the next generation" % (gen, self.step))
            # gloo has no abort and keeps its sockets open past destroy_process_group:
            # peers still blocked on this rank in the ended generation are let go now.
            pg.shut(conns)
        trace("shut")
        self._let_go()
        import gc
        gc.collect()
        trace("collected")
        if aborted:
            pg.forget(dist)  # finalizing an aborted communicator can wait for ever
        else:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        trace("destroyed")
        got = link.wait_generation(gen, 3600.0)
        if got is None:
            raise RuntimeError("muster_rank: generation %d is over and no next one came (stopped, or the agent "
                               "went away)" % gen)
        assign, generation, rank = got
        trace("assigned")
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(assign["world_size"]),
                          MASTER_ADDR=str(assign["master_addr"]), MASTER_PORT=str(assign["master_port"]),
                          MUSTER_GENERATION=str(generation),
                          TORCHELASTIC_RESTART_COUNT=str(assign.get("restart_count", 0)),
                          GROUP_RANK=str(assign.get("node_rank", 0)), GROUP_WORLD_SIZE=str(assign.get("nnodes", 1)),
                          LOCAL_WORLD_SIZE=str(len(assign.get("ranks", []))))
        self._form(dist, generation)

    def _let_go(self) -> None:
        """Before the process group of the generation that ended is destroyed:
        drops what refers to it. The wrapper (DDP's reducer hooks its parameters
        and holds the old group) goes before the new one is made."""
        self.model = self.module

    def _connections(self) -> Dict[int, str]:
        """The sockets of the current generation's process group (lock held):
        those init_process_group opened, or all opened since it began while it runs."""
        if self._conns is not None:
            return self._conns
        return pg.opened_since(self._conns_before) if self._conns_before is not None else {}

    def _watch_park(self) -> None:
        """Muster parked the generation and the rank has not left it
        PARK_INTERRUPT_S later. Held by its own code in a step (it is the
        hung one): its connections of the generation are closed, which ends
        its peers' waits on it, and _Parked is raised in that code. Waiting
        on its peers (a collective, a rendezvous) PARK_EXIT_S later still:
        its own connections are closed, which ends its wait. Still in the
        generation PARK_EXIT_S after either (native code outside any
        collective), the process exits, so that its peers go on; its slot
        is started again.

        Groups that NCCL backs (pg.aborts) are aborted at once instead, as
        soon as the generation is over: their collectives never fail when a
        peer is lost, and the abort ends the training thread's wait (it
        raises there); the abort epoch it records tells the steps under way
        that they do not count (muster_rank.fence)."""
        link = self._link
        with link.cond:
            while self._running:
                busy = self._busy
                if not busy or not link.over(self._gen):
                    link.cond.wait()
                    continue
                if self._aborted != self._gen and pg.aborts(self._backend):
                    self._abort_generation()
                    continue
                if not self._held(busy, PARK_INTERRUPT_S):
                    continue
                at, waiting = where(self._thread)
                stuck = self._in_step and waiting is None and not self._interrupted
                if not stuck and not self._held(busy, PARK_EXIT_S):
                    continue
                log("generation %d was parked and rank %d has not left it (%s): closing its connections%s"
                    % (self._gen, link.rank, waiting or at or "where is not known",
                       ", interrupting its step" if stuck else ""))
                pg.shut(self._connections())
                if stuck:
                    self._interrupted = True
                    _interrupt(self._thread, _Parked)
                if self._held(busy, PARK_EXIT_S):
                    log("rank %d did not leave generation %d %.0f s after that: exiting, so that its peers go on"
                        % (link.rank, self._gen, PARK_EXIT_S))
                    os._exit(1)

    def _abort_generation(self) -> None:
        """Aborts the process groups of the generation the rank is in (lock
        held; released while the groups abort, so that the training thread
        and the link's keepalives go on), and closes their gloo sockets."""
        import torch.distributed as dist
        gen = self._gen
        self._aborted = gen
        self._fence.abort()
        found = pg.groups(dist)
        conns = self._connections()
        log("generation %d is over: aborting its %d process group(s)" % (gen, len(found)))
        self._link.cond.release()
        try:
            pg.abort(dist, found)
            pg.shut(conns)
        finally:
            self._link.cond.acquire()
        trace("aborted")

    def _held(self, busy: int, seconds: float) -> bool:
        """True when the rank is still in the generation it entered as busy after seconds (lock held)."""
        deadline = time.monotonic() + seconds
        while self._running and self._busy == busy:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self._link.cond.wait(left)
        return False
