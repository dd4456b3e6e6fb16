"""A sharded PyTorch program (FSDP2: torch.distributed.fsdp.fully_shard) that
heals in place through muster_rank.ShardedElastic: gloo (or --backend, e.g.
tests/torch/strict_nccl.py's NCCL-like one), init_method="env://",
AdamW, checkpoints with torch.distributed.checkpoint (each rank writes its
shards). Every --replica-every steps each rank's shard state goes to its
buddy on another node; a replacement rank is restored from there, and when a
rank and its buddy are both lost every rank loads the last checkpoint.

The data is a pure function of (seed, step, rank), so a run that went back
to an earlier step sees the batches it would have seen.

With --ckpt-in-memory the checkpoints go to muster's memory checkpoint
directory, $MUSTER_CHECKPOINT_DIR, which is node-local. A default dcp.save
there cannot be loaded on two nodes: the coordinator (rank 0) alone writes
the checkpoint's .metadata, and an item every rank holds (a replicated
tensor, the optimizer's step counts) is written by one rank only, into its
file on its node, while dcp.load may have any rank read any rank's file.
So it saves with use_collectives=False: each rank writes everything it
holds to __RANK_0.distcp with its own __RANK.metadata, and dcp.load, finding
no global .metadata, reads its rank's own (same world size). `latest` may
then name "step-N" (muster writes the name of the directory it restores).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard

import muster_rank


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=3, help="hidden layers, each sharded on its own")
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--backend", default="gloo",
                   help="the process group's backend; strict_nccl (or STRICT_NCCL=1 in the environment): "
                        "tests/torch/strict_nccl.py's NCCL-like one, over gloo on the host")
    p.add_argument("--replica-every", type=int, default=5, help="buddy replicas every K steps (0: none)")
    p.add_argument("--ckpt-dir", default="", help="checkpoint here every --ckpt-every steps")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-in-memory", action="store_true",
                   help="checkpoints in the agent's memory directory, $MUSTER_CHECKPOINT_DIR (job key "
                        "memory_checkpoint_mb), node-local: each rank saves all it loads "
                        "(dcp.save use_collectives=False)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="bound on every collective and on the rendezvous (ShardedElastic timeout_s)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to make room for faults)")
    p.add_argument("--final-file", default="", help="rank 0 writes the final parameters' sum and loss here")
    p.add_argument("--timing-file", default="", help="rank 0 writes the steps' wall times here at the end")
    p.add_argument("--die-after-reslice", default="",
                   help="NODE:MARKER: a rank on node NODE (MUSTER_NODE) SIGKILLs itself right after its first "
                        "re-slice of the state, before its new replica has shipped, unless the file MARKER exists "
                        "(which it then makes): a fault injected for the tests")
    p.add_argument("--hang-at-step", type=int, default=-1,
                   help="in its first process, rank --hang-rank hangs at this step (0-based), in its own code before "
                        "the forward pass (a Python loop of short sleeps), until muster's hang detection parks the "
                        "generation and ShardedElastic interrupts it: a fault injected for the tests ...")
    p.add_argument("--hang-rank", type=int, default=1, help="... on this rank")
    p.add_argument("--reference-schedule", default="",
                   help="STEP:WORLD,...: no ranks, no muster: one process computes what the sharded program "
                        "computes with WORLD ranks from STEP on (each step's gradient the mean of the ranks', as "
                        "FSDP reduces it), printing rank 0's steps and writing --final-file: a test's reference")
    p.add_argument("--digests", action="store_true",
                   help="rank 0 prints a digest of the whole state (parameters and optimizer moments, gathered) "
                        "after each step and when a generation starts, to compare a re-sliced state with the one "
                        "it came from")
    return p.parse_args()


def batch(seed, step, rank, n, width):
    g = torch.Generator().manual_seed(seed * 1000003 + step * 1009 + rank)
    x = torch.randn(n, width, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def layers(args):
    """The model, unsharded: the same initial weights on every rank (seeded)."""
    torch.manual_seed(args.seed)
    mods = []
    for _ in range(args.depth):
        mods += [nn.Linear(args.width, args.width), nn.Tanh()]
    return nn.Sequential(*mods, nn.Linear(args.width, 1))


def final_line(digest, loss):
    """The final file's line: the parameters' sum and the last loss."""
    return f"{digest!r} {float(loss.detach())!r}\n"


def main_reference(args):
    """See --reference-schedule."""
    schedule = sorted((int(s), int(w)) for s, w in (p.split(":") for p in args.reference_schedule.split(",")))
    model = layers(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        world = [w for s, w in schedule if s <= step][-1]
        losses = [nn.functional.mse_loss(model(x), y)
                  for x, y in (batch(args.seed, step, r, args.batch, args.width) for r in range(world))]
        opt.zero_grad()
        (sum(losses) / world).backward()
        opt.step()
        print(f"step {step + 1} loss {losses[0].item():.6f}", flush=True)
    if args.final_file:
        with open(args.final_file, "w") as f:
            f.write(final_line(sum(float(p.detach().double().sum()) for p in model.parameters()), losses[0]))


def build(args):
    """The model sharded over this generation's process group, and its optimizer."""
    model = layers(args)  # every rank the same initial weights, before sharding
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=args.lr)


def save_checkpoint(args, model, opt, step):
    msd, osd = get_state_dict(model, opt)
    # Node-local (--ckpt-in-memory): each rank writes all it loads, __RANK_0.distcp and __RANK.metadata, which
    # dcp.load reads where there is no global .metadata (use_collectives=False: no rank's item left to another).
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(args.ckpt_dir, f"step-{step}"),
             use_collectives=not args.ckpt_in_memory)
    dist.barrier()
    if dist.get_rank() == 0:  # the checkpoint counts once every rank wrote its part
        tmp = os.path.join(args.ckpt_dir, "latest.tmp")
        with open(tmp, "w") as f:
            f.write(f"{step}\n")
        os.replace(tmp, os.path.join(args.ckpt_dir, "latest"))


def load_checkpoint(args, model, opt):
    """The step of the last checkpoint, loaded into model and opt; None without one."""
    try:
        with open(os.path.join(args.ckpt_dir, "latest")) as f:
            step = int(f.read().strip().removeprefix("step-"))  # muster writes the directory's name
    except (OSError, ValueError):
        return None
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=os.path.join(args.ckpt_dir, f"step-{step}"))
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    print(f"rank {dist.get_rank()} resumed at step {step}", flush=True)
    return step


def state_digest(model, opt):
    """A SHA-256 of the whole state, bit for bit (a collective: every rank
    calls it): every parameter, then every optimizer moment by its name,
    each gathered whole, in order, with its name, dtype, shape and bytes, so
    a value changed, a shard at another offset or two moments swapped change
    it. The moments' step counts, one per parameter, are in it too."""
    import hashlib
    h = hashlib.sha256()

    def add(name, t):
        t = t.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        t = t.cpu()
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

    params = list(model.parameters())
    for i, p in enumerate(params):
        add(f"param {i}", p)
    for i, p in enumerate(params):
        st = opt.state.get(p, {})
        for k in sorted(st):
            if torch.is_tensor(st[k]):
                add(f"param {i} {k}", st[k])
    return h.hexdigest()


def die_after_reslice(node, marker):
    """Wraps the re-slice ShardedElastic calls (muster_rank.sharded.elastic.reslice): see --die-after-reslice."""
    import signal
    import muster_rank.sharded.elastic as sharded
    reslice = sharded.reslice

    def then_die(*a):
        out = reslice(*a)
        if out is not None and os.environ.get("MUSTER_NODE") == node and not os.path.exists(marker):
            open(marker, "w").close()
            print(f"rank {dist.get_rank()} re-sliced: SIGKILLing itself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    sharded.reslice = then_die


@record
def main():
    args = parse_args()
    if args.ckpt_in_memory:
        args.ckpt_dir = os.environ["MUSTER_CHECKPOINT_DIR"]
    if args.reference_schedule:
        return main_reference(args)
    if args.die_after_reslice:
        die_after_reslice(*args.die_after_reslice.split(":", 1))
    if args.ckpt_dir:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    backend = args.backend
    if backend == "strict_nccl" or os.environ.get("STRICT_NCCL") == "1":
        import strict_nccl  # beside this script
        backend = strict_nccl.backend(backend)
    elastic = muster_rank.ShardedElastic(
        lambda: build(args), replica_every=args.replica_every, timeout_s=args.timeout_s, backend=backend,
        checkpoint=(lambda m, o: load_checkpoint(args, m, o)) if args.ckpt_dir else None)
    print(f"rank {os.environ.get('RANK')} pid {os.getpid()} generation {os.environ.get('MUSTER_GENERATION')} "
          f"started", flush=True)
    times = []

    seen = [None]
    hang = [args.hang_at_step >= 0 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"]

    def train_step(step):
        rank = dist.get_rank()
        if hang[0] and step == args.hang_at_step and rank == args.hang_rank:
            hang[0] = False
            print(f"rank {rank} hangs at step {step + 1}", flush=True)
            while True:
                time.sleep(0.01)
        if args.digests and elastic.restored is not seen[0]:
            seen[0] = elastic.restored
            d = state_digest(elastic.model, elastic.optimizer)
            if rank == 0:
                print(f"generation {os.environ.get('MUSTER_GENERATION')} world {dist.get_world_size()} "
                      f"from {elastic.restored[0]} at step {step} digest {d}", flush=True)
        x, y = batch(args.seed, step, rank, args.batch, args.width)
        loss = nn.functional.mse_loss(elastic.model(x), y)
        elastic.optimizer.zero_grad()
        loss.backward()
        elastic.optimizer.step()
        times.append(time.perf_counter())
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        if args.digests:
            d = state_digest(elastic.model, elastic.optimizer)
            if rank == 0:
                print(f"world {dist.get_world_size()} after step {step + 1} digest {d}", flush=True)
        if args.ckpt_dir and (step + 1) % args.ckpt_every == 0:
            save_checkpoint(args, elastic.model, elastic.optimizer, step + 1)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        return loss

    loss = elastic.run(train_step, args.steps)
    digest = sum(float(p.detach().full_tensor().double().sum()) for p in elastic.model.parameters())
    if dist.get_rank() == 0:
        if args.final_file:
            with open(args.final_file, "w") as f:
                f.write(final_line(digest, loss))
        if args.timing_file:
            with open(args.timing_file, "w") as f:
                f.write(" ".join(f"{t:.6f}" for t in times) + "\n")
    dist.destroy_process_group()
    print(f"rank {os.environ.get('RANK')} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
