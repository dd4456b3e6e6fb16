"""make check-gpu's NCCL part (tests/gpu-check.sh), on one GPU: what healing
an NCCL program in place needs of the device, through muster_rank.pg's
abort and forget, as Elastic's park watch and training thread use them:
  1. a one-rank NCCL group, formed eagerly (device_id) with non-blocking
     communicators (pg.nccl_options), all-reduces;
  2. a long kernel and an all-reduce queued behind it, the group aborted
     from another thread meanwhile: the device then synchronises without
     a lingering error, waited for as Elastic's watch waits (pg.device_wait,
     with its deadline); a keepalive ticker thread ticks on while the abort
     runs (the abort releases the GIL: else the link's keepalives stop and
     the agent takes the rank for dead);
  3. the groups forgotten (never finalized), a new one formed in the same
     process on a new port: an all-reduce works there;
  4. a CUDA FSDP2 model's shard state taken into a snapshot (host memory)
     and applied back after the parameters changed: equal to what was taken;
  5. a snapshot's pinned side-stream copy (check_pinned_snapshot).
  6. one pass through Elastic itself, its agent played by test_elastic's
     FakeLink (no agent needed): a one-rank NCCL group parked in step 2
     with a long kernel and an all-reduce queued; the park watch aborts the
     group (the ticker ticking on meanwhile), the step's update does not run
     (the fence), the next generation's group forms in the same process on
     a new port, the state syncs on the device, and training ends equal to
     an uninterrupted run's.
Without a GPU or NCCL it says "skipped" and exits 0."""

import os
import socket
import sys
import threading
import time
from unittest import mock

import torch
import torch.distributed as dist

from muster_rank import pg
from muster_rank.sharded.shards import apply_shard, take_shard
from muster_rank.snapshot import Snapshot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def form(device) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    os.environ.update(pg.nccl_env(os.environ, 30.0))
    # As Elastic forms it: eagerly, with non-blocking communicators where torch has the option.
    dist.init_process_group("nccl", init_method="env://", device_id=device,
                            pg_options=pg.nccl_options(dist, "nccl"))


# The longest a keepalive ticker may stall while an abort runs (the link's
# keepalives go every second or so; the agent gives up on a rank after a few).
TICKER_GAP_S = 1.0


class Ticker:
    """A thread that ticks every 10 ms, as the link's keepalive thread wakes
    (it needs the GIL to): the longest gap between ticks over a span says
    whether something held the GIL meanwhile."""

    EVERY_S = 0.01

    def __init__(self) -> None:
        self.ticks = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keepalive-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.EVERY_S):
            self.ticks.append(time.monotonic())

    def longest_gap(self, start: float, end: float) -> float:
        times = [start] + [t for t in list(self.ticks) if start < t < end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)


def timed(fn, spans: list):
    """fn, recording (start, end) in spans for each call."""
    def run(*args, **kw):
        start = time.monotonic()
        try:
            return fn(*args, **kw)
        finally:
            spans.append((start, time.monotonic()))
    return run


def check(what: str, ok: bool) -> None:
    print("%s: %s" % (what, "ok" if ok else "FAILED"), flush=True)
    if not ok:
        sys.exit(1)


def check_pinned_snapshot(device) -> None:
    """5. A CUDA tensor's snapshot copied into pinned memory on a side stream
    (muster_rank.pinned): behind a long kernel the take returns with its copy
    still under way, the buffer is page-locked and kept from take to take,
    and the snapshot holds the tensor as it was at the take, not what the
    current stream writes into it right after."""
    n = 1 << 20
    w = torch.arange(n, dtype=torch.float32, device=device)
    snap = Snapshot()
    snap.take(1, 0, 1, {"m": {"w": w}})
    first = snap.wait()
    buf = snap.flat
    torch.cuda._sleep(1_000_000_000)  # a long kernel (about half a second) ahead of the next take
    started = time.monotonic()
    snap.take(2, 0, 1, {"m": {"w": w}})
    returned = time.monotonic() - started
    copying = snap.copying
    w.add_(1.0)
    landed = snap.wait()
    held = snap.view(snap.unpack()["offsets"][0], torch.float32, (n,))
    check("5. a CUDA snapshot copied to pinned memory on a side stream (the take returned in %.3f s, "
          "its copy under way: %s)" % (returned, copying),
          first and copying and landed and buf.is_pinned() and snap.flat is buf
          and torch.equal(held, torch.arange(n, dtype=torch.float32)))


def main() -> int:
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("nccl_gpu_check: no GPU (or no NCCL): skipped")
        return 0
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    form(device)
    t = torch.ones(4, device=device)
    dist.all_reduce(t)
    check("1. one-rank NCCL group formed eagerly, all-reduce", bool((t == 1).all()))

    torch.cuda._sleep(2_000_000_000)  # a long kernel (about a second) ahead of the collective
    work = dist.all_reduce(torch.ones(1 << 20, device=device), async_op=True)
    spans = []
    abort = timed(pg.abort, spans)
    aborter = threading.Thread(target=lambda: (time.sleep(0.2), abort(dist, pg.groups(dist))))
    ticker = Ticker()
    started = time.monotonic()
    aborter.start()
    try:
        work.wait()
    except RuntimeError as e:
        print("   the queued all-reduce ended with: %s" % str(e).splitlines()[0])
    aborter.join()
    why = pg.device_wait(pg.cuda_sync(), 30.0)
    if why is not None:
        print("   %s" % why)
    clean = why is None
    check("2. abort with a kernel and an all-reduce queued, then the device synchronises (%.2f s)"
          % (time.monotonic() - started), clean)
    ticker.stop()
    check("2. the abort ran", len(spans) == 1)
    gap = ticker.longest_gap(*spans[0])
    check("2. a keepalive thread ticked on while the abort ran (longest gap %.3f s over its %.3f s)"
          % (gap, spans[0][1] - spans[0][0]), gap <= TICKER_GAP_S)

    pg.forget(dist)
    form(device)
    t = torch.full((4,), 2.0, device=device)
    dist.all_reduce(t)
    check("3. the groups forgotten, a new one on a new port in the same process, all-reduce",
          bool((t == 2).all()))

    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, 16, device=device)).sum().backward()
    opt.step()
    before = [p.detach().full_tensor().clone() for p in model.parameters()]
    snap = Snapshot()
    take_shard(snap, 1, 0, 1, model, opt, {})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    apply_shard(snap, model, opt, {})
    after = [p.detach().full_tensor() for p in model.parameters()]
    check("4. a CUDA FSDP2 snapshot taken and applied",
          snap.complete and all(torch.equal(a, b) for a, b in zip(before, after)))
    check_pinned_snapshot(device)
    dist.destroy_process_group()

    elastic_pass(device)
    print("nccl_gpu_check: passed")
    return 0


def elastic_pass(device) -> None:
    """5. (see the top): Elastic over a one-rank NCCL world, parked in step 2."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python",
                                    "tests"))
    from test_elastic import FakeLink, batch
    from muster_rank.elastic import Elastic

    steps = 5
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")

    def model():
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1).to(device)
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def on_device(step):
        return [t.to(device) for t in batch(step)]

    ref, ref_opt = model()
    for step in range(steps):
        x, y = on_device(step)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()

    link = FakeLink()
    net, opt = model()
    e = Elastic(net, opt, backend="nccl", link=link)
    calls = []

    def train_step(step):
        calls.append((link.generation, step))
        x, y = on_device(step)
        loss = torch.nn.functional.mse_loss(e.model(x), y)
        if step == 2 and link.generation == 1:
            torch.cuda._sleep(2_000_000_000)  # a long kernel, an all-reduce queued behind it
            dist.all_reduce(torch.ones(1 << 20, device=device))
            link.park()  # a peer lost, as the agent says it: the watch aborts the group
            link.next_generation()
            loss.item()  # the host waits on the device meanwhile
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    spans = []
    ticker = Ticker()
    started = time.monotonic()
    with mock.patch.object(pg, "abort", timed(pg.abort, spans)):
        e.run(train_step, steps)
    ticker.stop()
    gaps = [ticker.longest_gap(*span) for span in spans]
    print("   calls (generation, step): %s; aborts: %d, longest ticker gap in them %.3f s"
          % (calls, len(spans), max(gaps, default=0.0)))
    same = all(torch.allclose(a, b) for a, b in zip(net.parameters(), ref.parameters()))
    check("5. Elastic: parked in step 2, its NCCL group aborted by the watch and formed again, step 2 redone, "
          "trained as without the park (%.2f s)" % (time.monotonic() - started),
          e.step == steps and calls == [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)]
          and link.restored[-1] == (2, "memory", 2) and same)
    check("5. a keepalive thread ticked on while the watch's abort ran", len(spans) >= 1 and
          max(gaps) <= TICKER_GAP_S)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
