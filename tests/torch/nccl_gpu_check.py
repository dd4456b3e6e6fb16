"""make check-gpu's NCCL part (tests/gpu-check.sh), on one GPU: what healing
an NCCL program in place needs of the device, through muster_rank.pg's
abort and forget, as Elastic's park watch and training thread use them:
  1. a one-rank NCCL group, formed eagerly (device_id), all-reduces;
  2. a long kernel and an all-reduce queued behind it, the group aborted
     from another thread meanwhile: the device then synchronises without
     a lingering error;
  3. the groups forgotten (never finalized), a new one formed in the same
     process on a new port: an all-reduce works there;
  4. a CUDA FSDP2 model's shard state taken into a snapshot (host memory)
     and applied back after the parameters changed: equal to what was taken.
Without a GPU or NCCL it says "skipped" and exits 0."""

import os
import socket
import sys
import threading
import time

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
    dist.init_process_group("nccl", init_method="env://", device_id=device)


def check(what: str, ok: bool) -> None:
    print("%s: %s" % (what, "ok" if ok else "FAILED"), flush=True)
    if not ok:
        sys.exit(1)


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
    aborter = threading.Thread(target=lambda: (time.sleep(0.2), pg.abort(dist, pg.groups(dist))))
    started = time.monotonic()
    aborter.start()
    try:
        work.wait()
    except RuntimeError as e:
        print("   the queued all-reduce ended with: %s" % str(e).splitlines()[0])
    aborter.join()
    try:
        torch.cuda.synchronize()
        clean = True
    except RuntimeError as e:
        print("   synchronize: %s" % e)
        clean = False
    check("2. abort with a kernel and an all-reduce queued, then the device synchronises (%.2f s)"
          % (time.monotonic() - started), clean)

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
    dist.destroy_process_group()
    print("nccl_gpu_check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
