"""A plain PyTorch DDP training script, written as for torchrun: gloo,
init_method="env://", its own checkpoints, torch.distributed.elastic's
@record for error files. muster's tests and benchmarks run it unmodified
as a rank program; --muster-client adds the three lines of muster's Python
rank client (clients/python/muster_rank/) to report step and loss.

It trains a small MLP on synthetic regression data that is a pure function
of (seed, step, rank), so a resumed run sees the batches it would have seen.
"""
import argparse
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--global-batch", type=int, default=0,
                   help="with --elastic: each step's batch of this many samples, split over the ranks of the "
                        "world of the moment (instead of --batch per rank), with a target the model learns "
                        "(the sine of the first 8 features' scaled sum), so that the loss falls")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-dir", default="", help="checkpoint here every --ckpt-every steps")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to make room for faults)")
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="this rank sleeps --slow-frac times --step-sleep more per step, in its own code (a "
                        "fail-slow rank: its step is mostly that sleep) ...")
    p.add_argument("--slow-frac", type=float, default=0.4, help="... this share more ...")
    p.add_argument("--slow-from", type=int, default=0, help="... from this step ...")
    p.add_argument("--slow-to", type=int, default=-1, help="... to this one (-1: to the end)")
    p.add_argument("--slow-node", default="", help="... and only while it runs on this node (MUSTER_NODE): the "
                   "node is slow, not the program")
    p.add_argument("--raise-at-step", type=int, default=-1, help="raise ValueError at this step ...")
    p.add_argument("--raise-rank", type=int, default=0, help="... on this rank")
    p.add_argument("--raise-restart", type=int, default=0, help="... in this restart only")
    p.add_argument("--spin-at-step", type=int, default=-1, help="spin in a Python loop for ever at this step ...")
    p.add_argument("--spin-rank", type=int, default=0, help="... on this rank")
    p.add_argument("--spin-restart", type=int, default=0, help="... in this restart only")
    p.add_argument("--skip-at-step", type=int, default=-1,
                   help="at this step every rank but --skip-rank all-reduces its loss and rank 0 writes the mean "
                        "to --skip-file; that rank skips the all-reduce and waits for the file: a rank-conditional "
                        "deadlock (gloo hangs or aborts when a skipping rank enters another collective instead) ...")
    p.add_argument("--skip-rank", type=int, default=0, help="... on this rank ...")
    p.add_argument("--skip-file", default="", help="... and this file")
    p.add_argument("--muster-client", action="store_true", help="report step and loss to muster")
    p.add_argument("--elastic", action="store_true",
                   help="heal in place through muster_rank.Elastic (survivors keep process and state)")
    p.add_argument("--backend", default="gloo",
                   help="with --elastic: the process group's backend; strict_nccl (or STRICT_NCCL=1 in the "
                        "environment): tests/torch/strict_nccl.py's NCCL-like one, over gloo on the host")
    p.add_argument("--race-at-step", type=int, default=-1,
                   help="with --elastic --backend strict_nccl, in the first process of each rank: an abort racing "
                        "this step (0-based). Rank --race-die-rank SIGKILLs itself once its update is done (the "
                        "step's reduce completed everywhere), appending 'kill RANK TIME' to --timing-file; rank "
                        "--race-rank's update of the step is still on its emulated device then "
                        "(strict_nccl.LateUpdate: done only after the abort, and half applied) ...")
    p.add_argument("--race-rank", type=int, default=0, help="... this rank ...")
    p.add_argument("--race-die-rank", type=int, default=3, help="... and this one")
    p.add_argument("--final-file", default="", help="rank 0 writes the final parameters' checksum and loss here")
    p.add_argument("--reference-world", type=int, default=0,
                   help="no ranks, no muster: one process computes what --elastic (per-rank batches) computes "
                        "on this many ranks without a failure (DDP's gradient is the mean of the ranks'), "
                        "printing rank 0's steps and writing --final-file: a test's reference")
    p.add_argument("--timing", action="store_true", help="print launch and first-step wall times")
    p.add_argument("--timing-file", default="",
                   help="append to this file 'start RANK RESTART PID -1 TIME MAIN CREATED' once init_process_group "
                        "returns and 'step RANK RESTART PID STEP TIME' after each step (wall times, for benchmarks)")
    return p.parse_args()


def timing_line(path, *fields):
    """One line per write(2) with O_APPEND: the ranks of every node share the file."""
    line = (" ".join(str(f) for f in fields) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def process_created():
    """Wall time this process was created (10 ms resolution), or -1 where /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return -1.0


def batch(seed, step, rank, n, width):
    g = torch.Generator().manual_seed(seed * 1000003 + step * 1009 + rank)
    x = torch.randn(n, width, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


def slow(args, rank, step):
    """Whether this rank's step is a fail-slow one (--slow-rank, --slow-from/--slow-to, --slow-node)."""
    return (rank == args.slow_rank and step >= args.slow_from and (args.slow_to < 0 or step < args.slow_to) and
            (not args.slow_node or os.environ.get("MUSTER_NODE") == args.slow_node))


def spin_for_ever():
    """A rank wedged in its own code (a livelock): it runs, but never reaches the next collective."""
    n = 0
    while True:
        n += 1


def race_update(elastic, net, args):
    """See --race-at-step: rank --race-rank's update of that step is a
    strict_nccl.LateUpdate. It stands in for the CUDA event Elastic records
    behind an update on a GPU (Elastic._update_event, replaced here: the
    test's emulated device)."""
    import strict_nccl
    recorded = elastic._update_event

    def event():
        if elastic.step == args.race_at_step and elastic.rank == args.race_rank:
            print(f"the update of step {elastic.step + 1} is on the emulated device until "
                  f"the abort", flush=True)
            return strict_nccl.LateUpdate(net.parameters())
        return recorded()
    elastic._update_event = event


def main_elastic(args):
    """The same training through muster_rank.Elastic: under muster a peer's death
    costs the survivors neither their process nor their state."""
    import muster_rank
    if args.timing_file:  # the process runs the script (a warm spare: since it took the rank up)
        now = time.time()
        timing_line(args.timing_file, "start", os.environ.get("RANK"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                    os.getpid(), -1, f"{now:.6f}", f"{now:.6f}", f"{process_created():.6f}")
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 1))
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    backend = args.backend
    if backend == "strict_nccl" or os.environ.get("STRICT_NCCL") == "1":
        import strict_nccl  # beside this script
        backend = strict_nccl.backend(backend)
    elastic = muster_rank.Elastic(net, opt, wrap=DDP, backend=backend)
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if args.race_at_step >= 0 and first:
        race_update(elastic, net, args)
    print(f"rank {os.environ.get('RANK')} pid {os.getpid()} generation {os.environ.get('MUSTER_GENERATION')} "
          f"started", flush=True)

    def train_step(step):
        rank, world = elastic.rank, elastic.world_size
        if step == args.raise_at_step and rank == args.raise_rank:
            raise ValueError(f"injected failure at step {step} on rank {rank}")
        if (step == args.spin_at_step and rank == args.spin_rank and
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == str(args.spin_restart)):
            spin_for_ever()
        if args.global_batch:
            # The step's global batch is the same whatever the world: this rank takes
            # its share, and the loss is scaled so that DDP's mean over the ranks is
            # the mean over the global batch, however unequal the shares.
            x, _ = batch(args.seed, step, 0, args.global_batch, args.width)
            y = torch.sin(x[:, :8].sum(dim=1, keepdim=True) / 8 ** 0.5)
            lo, hi = rank * args.global_batch // world, (rank + 1) * args.global_batch // world
            err = nn.functional.mse_loss(elastic.model(x[lo:hi]), y[lo:hi], reduction="sum")
            loss = err * world / args.global_batch
        else:
            x, y = batch(args.seed, step, rank, args.batch, args.width)
            loss = nn.functional.mse_loss(elastic.model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.timing_file:
            timing_line(args.timing_file, "step", rank, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                        os.getpid(), step + 1, f"{time.time():.6f}")
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        if step == args.race_at_step and rank == args.race_die_rank and first:
            time.sleep(0.3)  # the other ranks' lines of the step first (the figures)
            if args.timing_file:
                timing_line(args.timing_file, "kill", rank, f"{time.time():.6f}")
            os.kill(os.getpid(), signal.SIGKILL)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if slow(args, rank, step):
            time.sleep(args.slow_frac * args.step_sleep)
        return loss

    loss = elastic.run(train_step, args.steps)
    # run()'s park watch must be over once it returns: a thread of its own
    # dropping the last reference to the model as the interpreter exits
    # ends the process with SIGABRT (torch frees tensors there).
    watching = [t.name for t in threading.enumerate() if t.name == "muster_rank-park"]
    if watching:
        raise RuntimeError("muster_rank.Elastic.run() returned with its park watch still running")
    if args.final_file and dist.get_rank() == 0:
        with open(args.final_file, "w") as f:
            f.write(final_line(net, loss))
    dist.destroy_process_group()
    print(f"rank {dist.get_rank() if dist.is_initialized() else os.environ.get('RANK')} done", flush=True)


def final_line(net, loss):
    """The final file's line: the parameters' checksum and the last loss."""
    digest = sum(float(p.detach().double().sum()) for p in net.parameters())
    return f"{digest!r} {float(loss.detach())!r}\n"


def main_reference(args):
    """--elastic's training on --reference-world ranks, in one process: each
    step's gradient is the mean of the ranks' (as DDP reduces it)."""
    world = args.reference_world
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 1))
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    for step in range(args.steps):
        losses = [nn.functional.mse_loss(net(x), y)
                  for x, y in (batch(args.seed, step, r, args.batch, args.width) for r in range(world))]
        opt.zero_grad()
        (sum(losses) / world).backward()
        opt.step()
        print(f"step {step + 1} loss {losses[0].item():.6f}", flush=True)
    if args.final_file:
        with open(args.final_file, "w") as f:
            f.write(final_line(net, losses[0]))


@record
def main():
    args = parse_args()
    if args.reference_world:
        return main_reference(args)
    if args.elastic:
        return main_elastic(args)
    t_start = time.time()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank}/{world} restart {restart} master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
          flush=True)
    if args.timing_file:
        timing_line(args.timing_file, "start", rank, restart, os.getpid(), -1, f"{time.time():.6f}",
                    f"{t_start:.6f}", f"{process_created():.6f}")

    torch.manual_seed(args.seed)
    model = DDP(nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = 0
    path = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_dir else ""
    if path:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    if path and os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"rank {rank} resumed at step {start}", flush=True)

    client = None
    if args.muster_client:
        import muster_rank
        client = muster_rank.connect()

    for step in range(start, args.steps):
        if step == args.raise_at_step and rank == args.raise_rank and restart == args.raise_restart:
            raise ValueError(f"injected failure at step {step} on rank {rank}")
        if step == args.spin_at_step and rank == args.spin_rank and restart == args.spin_restart:
            spin_for_ever()
        x, y = batch(args.seed, step, rank, args.batch, args.width)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.skip_at_step and rank != args.skip_rank:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if rank == 0:
                with open(args.skip_file, "w") as f:
                    f.write(f"{mean.item() / world:.6f}\n")
        elif step == args.skip_at_step:
            while not os.path.exists(args.skip_file):
                time.sleep(0.05)
        if args.timing and step == start:
            print(f"rank {rank} first step done at {time.time():.6f} (launched {t_start:.6f})", flush=True)
        if args.timing_file:
            timing_line(args.timing_file, "step", rank, restart, os.getpid(), step + 1, f"{time.time():.6f}")
        if client:
            client.beat(step + 1, loss=loss.item())
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        if path and (step + 1) % args.ckpt_every == 0:
            if rank == 0:
                tmp = path + ".tmp"
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
                os.replace(tmp, path)
            dist.barrier()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if slow(args, rank, step):
            time.sleep(args.slow_frac * args.step_sleep)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
