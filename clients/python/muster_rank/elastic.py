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
from .fence import Fence, clean_steps, no_clean_state, source_key
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


class NoCleanState(RuntimeError):
    """No rank holds a state it can go on from in place (every rank that
    trained failed its last fence): raised out of Elastic.run, so that the
    ranks exit and the generation restarts cold, from the program's own
    checkpoint (muster_rank.fence)."""


class _NotUpdated(BaseException):
    """Raised from the optimizer's pre-step hook when an abort passed while
    the step's gradients were still on their way: the update does not run."""


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
        self._abort_found = []         # the groups that abort found (those formed after it: see _rejoin)
        self._draining = False         # the watch waits for the device after its abort (see _rejoin)
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
        pre = self.optimizer.register_step_pre_hook(self._before_update) if self.optimizer is not None else None
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
                except NoCleanState:
                    raise
                except RuntimeError as e:
                    err = e
                except _NotUpdated:
                    action = Action.PARK  # its state is the last step's, whole
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
            if pre is not None:
                pre.remove()
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

    def _before_update(self, *_) -> None:
        """The optimizer's pre-step hook: the update runs only on gradients
        that arrived whole (muster_rank.fence: the first fence)."""
        event = self._grads_event()
        if event is not None and not self._fence.ready(event):
            raise _NotUpdated()

    def _grads_event(self) -> Optional[object]:
        """Before an optimizer step: a CUDA event recorded behind the step's
        gradients (the current stream waits for their reduce) where the
        optimizer's parameters are on a GPU, None on the host (the gradients
        are there by now)."""
        return self._stream_event()

    def _update_event(self) -> Optional[object]:
        """After an optimizer step: a CUDA event recorded behind its update
        where the optimizer's parameters are on a GPU, None on the host
        (the update is done by now)."""
        return self._stream_event()

    def _stream_event(self) -> Optional[object]:
        """A CUDA event recorded on the current stream now where the
        optimizer's parameters are on a GPU; None on the host."""
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
                options = pg.nccl_options(dist, self._backend, kw.get("timeout"))
                if options is not None:
                    kw["pg_options"] = options  # non-blocking communicators: an abort ends their set-up too
            dist.init_process_group(self._backend, init_method="env://", **kw)
            with cond:
                self._conns = pg.opened_since(before)
                parked = self._aborted == gen
            trace("group")
            if parked:
                # The watch aborted the generation while its group formed, before torch
                # knew of it: the group is aborted on the way out (_rejoin), never used.
                raise RuntimeError("muster_rank: generation %d was parked while its process group formed" % gen)

    def _sync_state(self, dist) -> None:
        """Every rank to the state of the first rank with the most steps."""
        import torch
        me, world = dist.get_rank(), dist.get_world_size()
        have = self.step if self.step > 0 else -1  # -1: nothing trained, the seed's state
        device = pg.device(self._backend)
        best = torch.tensor([have], dtype=torch.int64, device=device)
        dist.all_reduce(best, op=dist.ReduceOp.MAX)
        # The state comes from the first rank with the most steps, one that was not
        # interrupted in its own code nor failed a fence (its update may be half done) if there is one.
        # The state comes from the first rank with the most steps of those that were not
        # interrupted in their own code nor failed a fence (their update may be half done).
        fenced = not self._suspect
        clean = torch.tensor([clean_steps(have, fenced)], dtype=torch.int64, device=device)
        dist.all_reduce(clean, op=dist.ReduceOp.MAX)
        most = int(best.item())
        best = clean
        if no_clean_state(most, int(best.item())):
            # Every rank that trained may hold a half-applied update: none goes on from it.
            raise NoCleanState("muster_rank: generation %d: no rank holds a clean state: every rank with %d steps "
                               "failed its last fence (an update an abort cut short may be in it), and none is "
                               "fenced a step before; the generation restarts from the program's checkpoint"
                               % (self._gen, most))
        src = torch.tensor([source_key(have, int(best.item()), me, world, fenced)], dtype=torch.int64,
                           device=device)
        dist.all_reduce(src, op=dist.ReduceOp.MIN)
        src = int(src.item())
        if best.item() >= 0 and best.item() < most and self._link.active:
            log("generation %d: the state comes from rank %d at step %d: every rank with %d steps failed its "
                "last fence" % (self._gen, src, int(best.item()), most))
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
            found = self._abort_found if aborted else []
            self._abort_found = []  # no reference kept: an aborted group goes once forgotten
        if not yielded and pg.aborts(self._backend):
            # Broken while no park watch aborted it (outside muster's watch, or left by itself), or
            # formed after the watch's abort (the generation's group while it formed, a wrapper's
            # subgroups): an NCCL group that broke is never finalized, only aborted.
            missed = [g for g in pg.groups(dist) if all(g is not f for f in found)]
            if missed:
                pg.abort(dist, missed)
                self._drain_device(gen)
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
        with link.cond:
            # The next generation's work is not queued while the watch waits for the device to drain
            # the last one's: a sync would wait on it too, and the watch could not abort that one in turn.
            link.cond.wait_for(lambda: not self._draining, self._heal_wait + PARK_EXIT_S)
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
        and the link's keepalives go on), closes their gloo sockets, and waits
        for the device (_drain_device; _rejoin forms the next generation only
        after that)."""
        import torch.distributed as dist
        gen = self._gen
        self._aborted = gen
        self._fence.abort()
        found = pg.groups(dist)
        self._abort_found = found
        conns = self._connections()
        log("generation %d is over: aborting its %d process group(s)" % (gen, len(found)))
        self._draining = True
        self._link.cond.release()
        try:
            pg.abort(dist, found)
            pg.shut(conns)
            self._drain_device(gen)
        finally:
            self._link.cond.acquire()
            self._draining = False
            self._link.cond.notify_all()
        trace("aborted")

    def _drain_device(self, gen: int) -> None:
        """After an abort of generation gen's groups: the device must finish
        what was queued on it within the heal window (pg.device_wait; nothing
        to wait for without CUDA). A device that does not, or whose CUDA
        context is lost, is no use to the next generation: the process exits,
        and its slot is started again in a fresh one."""
        why = pg.device_wait(pg.cuda_sync(), self._heal_wait)
        if why is not None:
            log("generation %d: rank %d aborted its process groups, but %s: exiting, so that its slot "
                "is started again" % (gen, self._link.rank, why))
            os._exit(1)

    def _held(self, busy: int, seconds: float) -> bool:
        """True when the rank is still in the generation it entered as busy after seconds (lock held)."""
        deadline = time.monotonic() + seconds
        while self._running and self._busy == busy:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self._link.cond.wait(left)
        return False
