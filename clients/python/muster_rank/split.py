"""The time split: how a rank's main thread spends its wall time, sampled
from outside it, with no change to the program.

A sampler thread looks at the main thread's stack SAMPLE_HZ times a second
(MUSTER_SAMPLE_HZ, 0 to 1000; 0 turns it off) and puts each look in one of
four kinds, by where the main thread is:

  collective  in torch.distributed (a c10d collective, a work handle's
              wait()), DeepSpeed's comm, or a backward pass: DDP reduces
              gradients inside loss.backward(), where the host's wait for
              its peers cannot be told from its own work, so a backward
              pass counts as waiting;
  gpu         waiting on the device: torch.cuda's synchronize (a Stream's,
              an Event's), or the program's frame in .item(), .cpu(),
              .tolist(), .numpy() (read from its bytecode, where.calling);
  data        in a DataLoader (torch/utils/data/: its __next__, its
              workers' queue);
  compute     anything else: the forward pass, the optimizer, the
              program's own code (its own sleeps too).

So in synchronous data parallelism every rank's compute is what it does
between its waits, and the slow rank is the one that computes longest
while its peers wait for it in the collective (musterd's rule:
daemon/failslow.h). The looks are counted over a window of at least
WINDOW_S seconds (MUSTER_SPLIT_WINDOW_S), closed at a step boundary when
the rank's steps are known (the start-up hook's optimizer steps, or the
program's own beat()), so that the window's steps give compute seconds per
step; a rank without steps (or in a step longer than LONG_WINDOWS windows)
closes it on time alone, with no steps. Each window's shares go to the
agent in the rank's heartbeats (split_s, split_steps and the four *_frac
fields, proto/PROTOCOL.md)."""

import os
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from .where import GPU_CALLS, GPU_FUNCTIONS, GPU_MODULES, PROGRAM, Kinds, calling, library_roots

COMPUTE, COLLECTIVE, GPU, DATA = 0, 1, 2, 3
NAMES = ("compute", "collective", "gpu", "data")
SAMPLE_HZ = 200       # looks per second, by default
SAMPLE_HZ_MAX = 1000  # the most MUSTER_SAMPLE_HZ may ask for
WINDOW_S = 1.0        # a window's least length, by default
LONG_WINDOWS = 10     # a step this many windows long closes the window without it
SPLIT_S_MAX = 3600.0  # the longest window the wire takes (proto.h's PROTO_SPLIT_S_MAX)

# Frames in which the main thread waits on its peers, as paths under the package directories.
COLLECTIVE_PATHS = ("/torch/distributed/", "/deepspeed/comm/", "/deepspeed/runtime/zero/")
# A backward pass: these functions of torch/autograd/ and torch/_tensor.py.
BACKWARD_PATHS = ("/torch/autograd/", "/torch/_tensor.py")
BACKWARD_FUNCTIONS = frozenset(["backward", "_engine_run_backward", "grad"])
DATA_PATHS = ("/torch/utils/data/",)
# The calls from the program's frame that wait on peers (a work handle's), the others on the device.
WAIT_CALLS = frozenset(["wait"])


def classify(frame, kinds: Kinds) -> int:
    """The kind of a look at a thread whose innermost frame is frame (a frame
    object, or anything with f_code.co_filename, f_code.co_name, f_back and,
    for the program's innermost frame, f_lasti): the first frame from the
    innermost outwards that says; COMPUTE when none does."""
    innermost, depth = frame, 0
    while frame is not None and depth < 256:
        code = frame.f_code
        name = code.co_filename
        kind = kinds.kind(name)[0]
        if kind == PROGRAM:
            call = calling(frame) if frame is innermost else None
            last = call.rsplit(".", 1)[-1] if call else None
            if last in WAIT_CALLS:
                return COLLECTIVE
            if last in GPU_CALLS:
                return GPU
            return COMPUTE
        if any(p in name for p in COLLECTIVE_PATHS):
            return COLLECTIVE
        if code.co_name in BACKWARD_FUNCTIONS and any(p in name for p in BACKWARD_PATHS):
            return COLLECTIVE
        if code.co_name in GPU_FUNCTIONS and any(m in name for m in GPU_MODULES):
            return GPU
        if any(p in name for p in DATA_PATHS):
            return DATA
        frame = frame.f_back
        depth += 1
    return COMPUTE


class Window:
    """Looks counted by kind since the window began, at a time and a step;
    closed into a split once long enough. Pure: the caller gives the times."""

    def __init__(self, window_s: float, now: float, step: Optional[int]) -> None:
        self.window_s = window_s
        self._begin(now, step)

    def _begin(self, now: float, step: Optional[int]) -> None:
        self.start, self.start_step = now, step
        self.counts = [0, 0, 0, 0]

    def add(self, kind: int) -> None:
        self.counts[kind] += 1

    def close(self, now: float, step: Optional[int]) -> Optional[dict]:
        """The window's split when it is due at now with the rank at step,
        and a new window begun; else None. Due: WINDOW_S long and at a step
        boundary (the step moved since it began) when steps are known, or
        on time alone (no steps) without them or after LONG_WINDOWS."""
        length = now - self.start
        if length < self.window_s:
            return None
        if length > SPLIT_S_MAX:  # the process was stopped (or starved) that long: start over
            self._begin(now, step)
            return None
        if step is not None and (self.start_step is None or step < self.start_step):
            # the rank's start-up (its step not known yet) or a generation that
            # went back to an earlier step: not a window of its steps, and
            # start-up work beside peers that wait would look like a slow rank
            self._begin(now, step)
            return None
        stepped = step is not None and self.start_step is not None and step > self.start_step
        if not stepped and step is not None and self.start_step == step and length < LONG_WINDOWS * self.window_s:
            return None  # inside a step: wait for its end
        total = sum(self.counts)
        split = None
        if total:
            split = {"split_s": length, "split_steps": step - self.start_step if stepped else 0}
            for k, n in zip(NAMES, self.counts):
                split[k + "_frac"] = n / total
        self._begin(now, step)
        return split


def _env_number(name: str, default: float, low: float, high: float) -> float:
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not (low <= x <= high):
        from .log import log
        log("%s: expected a number in [%g, %g], got %r; using %g" % (name, low, high, text, default))
        return default
    return x


class Sampler:
    """The sampler thread of a rank: looks at thread_id's stack hz times a
    second and hands each closed window's split to publish(split). step()
    says the rank's step (None: not known). frames and clock are
    sys._current_frames and time.monotonic, unless a test gives its own."""

    def __init__(self, thread_id: int, step: Callable[[], Optional[int]], publish: Callable[[dict], None],
                 hz: float, window_s: float, kinds: Optional[Kinds] = None,
                 frames: Callable[[], Dict[int, object]] = sys._current_frames,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.thread_id, self.step, self.publish = thread_id, step, publish
        self.period = 1.0 / hz
        self.kinds = kinds if kinds is not None else Kinds(*library_roots())
        self.frames, self.clock = frames, clock
        self.window = Window(window_s, clock(), step())
        self.looks = 0

    def look(self) -> None:
        """One look, and the window closed when it is due."""
        frame = self.frames().get(self.thread_id)
        self.window.add(classify(frame, self.kinds) if frame is not None else COMPUTE)
        self.looks += 1
        split = self.window.close(self.clock(), self.step())
        if split is not None:
            self.publish(split)

    def run(self) -> None:
        due = self.clock()
        while True:
            due += self.period
            left = due - self.clock()
            if left > 0:
                time.sleep(left)
            else:
                due = self.clock()  # late (the interpreter was busy): do not catch up in a burst
            try:
                self.look()
            except Exception:  # a frame that changed under it: skip this look
                continue


_started: List[Sampler] = []


def start(rank) -> Optional[Sampler]:
    """Starts the sampler thread for a rank's link (muster_rank.link.Rank),
    once per process; None when it is inactive or MUSTER_SAMPLE_HZ is 0."""
    if _started or not rank.active:
        return _started[0] if _started else None
    hz = _env_number("MUSTER_SAMPLE_HZ", SAMPLE_HZ, 0, SAMPLE_HZ_MAX)
    if hz <= 0:
        return None
    window_s = _env_number("MUSTER_SPLIT_WINDOW_S", WINDOW_S, 0.1, 60)
    s = Sampler(threading.main_thread().ident, rank.current_step, rank.set_split, hz, window_s)
    _started.append(s)
    threading.Thread(target=s.run, name="muster_rank-sampler", daemon=True).start()
    return s
