"""One rank of the pair that test_strict_nccl.py forms with the strict
NCCL-like backend (tests/torch/strict_nccl.py, on PYTHONPATH), driven by
the test: `strict_nccl_peer.py RANK PORT`. It reads one word a line on
stdin when the test says what comes next, and writes one JSON object a
line on stdout for what it saw ({"event": ..., ...}). Rank 1 only takes
part in the first collectives; the test then SIGKILLs it. Every wait on
a work of the strict group is in a thread of its own, joined with a
timeout, so that what does not return is reported, not waited for."""

import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import strict_nccl
from muster_rank import pg


def say(event: str, **kw) -> None:
    print(json.dumps(dict(kw, event=event)), flush=True)


def told(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        say("error", why="told %r, expected %r" % (line, word))
        os._exit(1)


def failure(e: BaseException) -> str:
    return "%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[0])


class Bounded(threading.Thread):
    """fn() in a daemon thread: ended (monotonic time) and error (None, or
    "Type: first line") once it returned or raised."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self.fn, self.ended, self.error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except Exception as e:
            self.error = failure(e)
        self.ended = time.monotonic()

    def outcome(self, timeout: float) -> str:
        """"returned", "raised Type: ..." or "blocked" (still running timeout s on)."""
        self.join(timeout)
        if self.is_alive():
            return "blocked"
        return "raised " + self.error if self.error is not None else "returned"


def main() -> int:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    before = pg.sockets()
    dist.init_process_group(strict_nccl.register(), init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    conns = pg.opened_since(before)  # as Elastic keeps them for the park watch's pg.shut
    strict = dist.distributed_c10d._get_default_group()
    side = dist.new_group(backend="gloo")  # a plain gloo group beside it, for comparison
    say("formed", backend=strict.getBackendName(), sockets=len(conns))

    # (a) An all-reduce returns its work at once; rank 0's does not complete, nor
    # touch its tensor, before rank 1 issued its own; wait() gives the sum.
    if rank == 1:
        told("go")
    t = torch.full((4,), float(rank + 1))
    started = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    issued_s = time.monotonic() - started
    if rank == 0:
        time.sleep(0.3)  # gloo underneath would have finished by now were rank 1 in it
        say("issued", issued_s=issued_s, completed=work.is_completed(), tensor=t.tolist())
    waited = Bounded(work.wait)
    say("waited", outcome=waited.outcome(10.0), completed=work.is_completed(), tensor=t.tolist(),
        future=[x.tolist() for x in work.get_future().wait()] if waited.error is None and not waited.is_alive() else None)

    # A healthy strict group's destroy returns (and logs nothing).
    other = dist.new_group(backend=strict_nccl.NAME)
    u = torch.ones(2)
    dist.all_reduce(u, group=other)
    say("healthy_destroy", outcome=Bounded(lambda: dist.destroy_process_group(other)).outcome(5.0),
        tensor=u.tolist())
    if rank == 1:
        say("idle")
        sys.stdin.readline()  # until SIGKILLed
        return 0

    # (b) Rank 1 is SIGKILLed while rank 0 waits in a collective on it, on the
    # strict group and on the plain gloo one: gloo's fails, the strict one's
    # does not end, not even once the group's sockets are shut as the park
    # watch shuts them.
    side_work = dist.all_reduce(torch.ones(1), group=side, async_op=True)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    side_waiter, waiter = Bounded(side_work.wait), Bounded(work.wait)
    say("pending")
    told("killed")
    side_outcome = side_waiter.outcome(10.0)
    say("peer_killed", side=side_outcome, strict=waiter.outcome(2.0))
    pg.shut(conns)
    say("sockets_shut", sockets=len(conns), strict=waiter.outcome(2.0))

    # (c) abort() from another thread ends the pending wait at once, with an error.
    told("abort")
    at = time.monotonic()
    aborter = Bounded(strict.abort)
    aborted = aborter.outcome(5.0)
    outcome = waiter.outcome(5.0)
    say("aborted", abort=aborted, strict=outcome,
        after_s=(waiter.ended - at) if waiter.ended is not None else None,
        future=Bounded(work.get_future().wait).outcome(1.0), completed=work.is_completed(),
        success=work.is_success())

    # (d) Any use of the group after its abort is an error (bounded: a lenient
    # backend might block instead).
    uses = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(1)),
        "all_reduce async": lambda: dist.all_reduce(torch.ones(1), async_op=True).wait(),
        "broadcast": lambda: dist.broadcast(torch.ones(1), 0),
        "all_gather": lambda: dist.all_gather([torch.ones(1), torch.ones(1)], torch.ones(1)),
        "barrier": dist.barrier,
    }
    say("used_after_abort", uses={name: Bounded(use).outcome(2.0) for name, use in uses.items()})

    # (e) destroy_process_group of the aborted group blocks, after it logged so.
    destroy = Bounded(dist.destroy_process_group).outcome(1.5)
    with open(os.environ["STRICT_NCCL_LOG"]) as f:
        logged = f.read()
    say("destroyed", outcome=destroy, log=logged, pid=os.getpid())
    os._exit(0)  # the destroy's thread blocks for ever: the interpreter does not wait for it


if __name__ == "__main__":
    sys.exit(main())
