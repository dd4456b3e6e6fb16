"""When a step counts as completed: `Fence`.

Under NCCL an optimizer step is only enqueued when optimizer.step() returns;
its update applies on the device later, possibly after an aborted reduce.
A step counts once its update finished on the device and no abort of the
rank's process groups (an abort epoch, counted by the park watch) passed
between the step's start and then. An update on the host is finished when
optimizer.step() returns, and what it read came from collectives that
completed (an aborted one raises): it counts, abort or not. A rank whose optimizer stepped in a step
that does not count has a state that may be half updated: it is not a state
source while another rank is."""

from typing import Optional


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
