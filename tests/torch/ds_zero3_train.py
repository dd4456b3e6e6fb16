"""A DeepSpeed ZeRO stage 3 training script written as DeepSpeed's guides write
them: deepspeed.initialize with a JSON config (--deepspeed_config; bf16,
AdamW, stage 3 with every parameter partitioned), engine.backward and
engine.step, and DeepSpeed's own checkpoints (engine.save_checkpoint every
--ckpt-every steps, engine.load_checkpoint at start). It reads torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so
torchrun, the deepspeed launcher or muster can start it. Without a GPU,
DeepSpeed picks its CPU accelerator and the process group runs on gloo.

The model is a small MLP learning a fixed random teacher on inputs that
are a pure function of (seed, step, rank), so a resumed run sees the batches it would
have seen. Rank 0 prints "step N loss L"; a resumed rank prints
"rank R resumed at step S".
"""
import argparse
import os
import signal
import sys
import time

import deepspeed
import torch
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-dir", default="", help="DeepSpeed checkpoints here every --ckpt-every steps")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-in-memory", action="store_true",
                   help="checkpoints in the agent's memory directory, $MUSTER_CHECKPOINT_DIR (job key memory_checkpoint_mb)")
    p.add_argument("--stall-save", default="", metavar="RANK:STEP:RESTART",
                   help="for tests: that rank, in that restart, stalls inside the save of that step, after the "
                        "tag directory is made and before its own optimizer state is written")
    p.add_argument("--stop-at", default="", metavar="RANK:STEP:MARK",
                   help="rank RANK stops itself (SIGSTOP) once step STEP and its save are done, the first time "
                        "(it creates the file MARK just before): a hang at a step boundary, never inside a save")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (to make room for faults)")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")),
                   help="set by the deepspeed launcher; torchrun and muster set LOCAL_RANK")
    p = deepspeed.add_config_arguments(p)
    return p.parse_args()


def batch(seed, step, rank, n, width):
    """Inputs for (seed, step, rank); targets from a fixed random teacher, so the loss can fall."""
    teacher = torch.randn(width, 1, generator=torch.Generator().manual_seed(seed)) / width ** 0.5
    g = torch.Generator().manual_seed(seed * 1000003 + step * 1009 + rank)
    x = torch.randn(n, width, generator=g)
    return x, torch.tanh(x @ teacher)


@record
def main():
    args = parse_args()
    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank}/{world} restart {restart} master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
          f"backend {torch.distributed.get_backend()}", flush=True)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, args.width),
                          nn.GELU(), nn.Linear(args.width, 1))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32

    if args.ckpt_in_memory:
        args.ckpt_dir = os.environ["MUSTER_CHECKPOINT_DIR"]
    if args.stall_save:
        stall_rank, stall_step, stall_restart = (int(v) for v in args.stall_save.split(":"))
        if rank == stall_rank and restart == stall_restart:
            save = engine.checkpoint_engine.save

            def stalling_save(*pos, **kw):
                path = str(kw.get("path", pos[1] if len(pos) > 1 else ""))
                if f"step{stall_step}" in path and "optim_states" in path:
                    print(f"rank {rank} stalls in the save of step {stall_step}", flush=True)
                    time.sleep(3600)
                return save(*pos, **kw)

            engine.checkpoint_engine.save = stalling_save

    start = 0
    if args.ckpt_dir and os.path.exists(os.path.join(args.ckpt_dir, "latest")):
        _, client_state = engine.load_checkpoint(args.ckpt_dir)
        start = client_state["step"]
        print(f"rank {rank} resumed at step {start}", flush=True)

    micro = engine.train_micro_batch_size_per_gpu()
    for step in range(start, args.steps):
        x, y = batch(args.seed, step, rank, micro, args.width)
        loss = nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
        if args.ckpt_dir and (step + 1) % args.ckpt_every == 0:
            engine.save_checkpoint(args.ckpt_dir, tag=f"step{step + 1}", client_state={"step": step + 1})
        if args.stop_at:
            stop_rank, stop_step, mark = args.stop_at.split(":", 2)
            if rank == int(stop_rank) and step + 1 == int(stop_step) and not os.path.exists(mark):
                open(mark, "w").close()
                os.kill(os.getpid(), signal.SIGSTOP)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    torch.distributed.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
