"""When a step counts as completed: `Fence`.

Under NCCL an optimizer step is only enqueued when optimizer.step() returns;
its update applies on the device later, possibly after an aborted reduce.
A step counts once its update finished on the device and no abort of the
rank's process groups (an abort epoch, counted by the park watch) passed
between the step's start and then. An update on the host is finished when
optimizer.step() returns, and what it read came from collectives that
completed (an aborted one raises): it counts, abort or not.

Two fences. Before the update (Fence.ready): the optimizer waits until the
step's gradients are on the device (DDP's reduce makes the compute stream
wait for NCCL's, the host does not wait) and does not run if an abort passed
meanwhile, so an aborted reduce never feeds an update (on a GPU: the host
waits for the backward pass before it enqueues the update, a short bubble
per step). After it (Fence.completed): the update finished with no abort.
A rank whose optimizer stepped in a step that does not count has a state
that may be half updated: never a state source (source_key); when no rank
holds a clean state at the most steps or one before (no_clean_state), the
generation cannot go on in place and restarts from a checkpoint."""

import time
from typing import Optional


def clean_steps(steps: int, fenced: bool) -> int:
    """This rank's bid for the clean state with the most steps, for a MAX
    all-reduce: its completed steps (-1: none, the seed's state) if no step
    of it failed its fence, else -2 (its state may hold a half-applied
    update: never a source)."""
    return steps if fenced else -2


def source_key(steps: int, best: int, rank: int, world: int, fenced: bool) -> int:
    """This rank's bid to be the state source, for a MIN all-reduce over the
    ranks: its rank if it is fenced and holds best steps (the MAX of
    clean_steps), else world (not a source). The source is the first such
    rank."""
    return rank if fenced and steps == best else world


def no_clean_state(most: int, best: int) -> bool:
    """Whether the ranks' state cannot be trusted: some rank trained (most,
    the MAX of every rank's steps, >= 0) but no fenced rank holds that
    state or the one a step before it (best, the MAX of clean_steps; in
    one generation the ranks are at most a step apart). Then no rank may
    go on in place: the generation restarts from a checkpoint."""
    return most >= 0 and best < most - 1


class Fence:
    """One rank's abort epochs and its current step's fence.

        fence.begin()                       # a step starts
        ... optimizer.step(); fence.updated(event)   # event: device work done (None: the host's, done now)
        fence.completed()                   # the update finished, no abort meanwhile

    abort() comes from the park watch (its lock held), the rest from the
    training thread."""

    def __init__(self) -> None:
        self.epoch = 0          # aborts so far
        self._start = 0         # the epoch the current step started in
        self._updated = False   # the optimizer stepped in the current step
        self._fenced: Optional[bool] = None  # its update finished before any abort (None: not known yet)
        self._event = None      # the device's event after the update, until waited on

    def abort(self) -> int:
        """An abort of the rank's groups: steps under way no longer complete. Returns the new epoch."""
        self.epoch += 1
        return self.epoch

    def begin(self) -> None:
        self._start, self._updated, self._fenced, self._event = self.epoch, False, None, None

    def updated(self, event=None) -> None:
        """The optimizer stepped; event (with synchronize()) is done once the
        update is on the device, None when it is done already (on the host)."""
        self._updated = True
        if event is None:
            self._fenced = True
        else:
            self._event, self._fenced = event, None

    @property
    def stepped(self) -> bool:
        """The optimizer stepped in this step (whether or not it counts)."""
        return self._updated

    def ready(self, event, poll_s: float = 0.0002) -> bool:
        """Before the optimizer steps: waits until event (with query()), recorded
        behind the step's gradients, is done on the device; False as soon as
        an abort passed since the step began (the gradients may be cut short:
        the update must not run). A gradient that never arrives is a hang,
        which muster names and parks, which aborts."""
        return self.wait(event, self._start, poll_s)

    def wait(self, event, epoch: int, poll_s: float = 0.0002) -> bool:
        """Waits until event (with query()) is done on the device; False as
        soon as an abort passed since epoch, done or not. It polls with the
        GIL free (sleep), so the park watch runs and can abort."""
        while not event.query():
            if self.epoch != epoch:
                return False
            time.sleep(poll_s)
            poll_s = min(poll_s * 2, 0.005)
        return self.epoch == epoch

    def completed(self) -> bool:
        """Whether this step's update finished with no abort since the step
        began: waits for the device's event (synchronize() releases the GIL)
        unless an abort already passed."""
        if not self._updated:
            return False
        if self._fenced is None:
            if self.epoch != self._start:
                self._fenced = False
            else:
                self._event.synchronize()
                self._fenced = self.epoch == self._start
            self._event = None
        return self._fenced

    def taken(self, epoch: int) -> bool:
        """Whether something that began at epoch (a snapshot) saw no abort since."""
        return self.epoch == epoch
