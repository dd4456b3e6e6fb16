"""A training script written as Hugging Face accelerate's guides write them:
Accelerator(), accelerator.prepare of the model, optimizer and DataLoader,
accelerator.backward, and accelerate's own checkpoints
(accelerator.save_state every --ckpt-every steps into <ckpt-dir>/step_<N>,
accelerator.load_state of the newest at start, skip_first_batches to go on
where it stopped). The Accelerator reads torchrun's environment, so
`accelerate launch`, torchrun or muster can start it; on CPUs it runs
multi-CPU data parallel on gloo.

With --ckpt-in-memory the directory is muster's memory checkpoint
directory, $MUSTER_CHECKPOINT_DIR, which is node-local: there save_state
must write the model and optimizer on every node
(ProjectConfiguration(save_on_each_node=True)), not only from the main
process, or the other nodes hold nothing to load.

The model is a small MLP learning a fixed random teacher. Rank 0 prints
"step N loss L"; a resumed rank prints "rank R resumed at step S".
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-dir", default="", help="accelerate checkpoints here every --ckpt-every steps")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-in-memory", action="store_true",
                   help="checkpoints in the agent's memory directory, $MUSTER_CHECKPOINT_DIR (job key "
                        "memory_checkpoint_mb), node-local: every node saves the model and optimizer")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to make room for faults)")
    return p.parse_args()


def dataset(seed, n, width):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(width, 1, generator=g) / width ** 0.5
    x = torch.randn(n, width, generator=g)
    return TensorDataset(x, torch.tanh(x @ teacher))


def newest_checkpoint(ckpt_dir):
    """The step_<N> directory named by <ckpt-dir>/latest (written once every rank has saved), or None."""
    try:
        with open(os.path.join(ckpt_dir, "latest")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None, 0
    return os.path.join(ckpt_dir, name), int(name.removeprefix("step_"))


@record
def main():
    args = parse_args()
    if args.ckpt_in_memory:
        args.ckpt_dir = os.environ["MUSTER_CHECKPOINT_DIR"]
    # A node-local directory: each node's local main process writes the model and optimizer there too.
    accelerator = Accelerator(project_config=ProjectConfiguration(save_on_each_node=args.ckpt_in_memory))
    rank, world = accelerator.process_index, accelerator.num_processes
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank}/{world} restart {restart} {accelerator.distributed_type} on {accelerator.device}", flush=True)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # One epoch holds every step: the batches of a step are the same whether or not the run was resumed.
    data = DataLoader(dataset(args.seed, args.steps * args.batch * world, args.width), batch_size=args.batch)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    start = 0
    if args.ckpt_dir:
        path, start = newest_checkpoint(args.ckpt_dir)
        if path:
            accelerator.load_state(path)
            print(f"rank {rank} resumed at step {start}", flush=True)

    step = start
    for x, y in accelerator.skip_first_batches(data, start):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        step += 1
        if accelerator.is_main_process:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if args.ckpt_dir and step % args.ckpt_every == 0:
            accelerator.save_state(os.path.join(args.ckpt_dir, f"step_{step}"))
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                tmp = os.path.join(args.ckpt_dir, "latest.tmp")
                with open(tmp, "w") as f:
                    f.write(f"step_{step}\n")
                os.replace(tmp, os.path.join(args.ckpt_dir, "latest"))
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if step >= args.steps:
            break
    accelerator.end_training()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
