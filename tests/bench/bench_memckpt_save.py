"""One rank of the memory checkpoint save benchmark (bench_memckpt_save.sh):
the ZeRO-3 engine of tests/torch/ds_zero3_train.py (its JSON config, a
wider MLP), trained a step, then engine.save_checkpoint, the same call, to
each directory named by --dirs in turn, --saves times, in rotated order.
Rank 0 prints one line per directory: the median and range of the call's
wall time (barrier to barrier), and the median of an os.sync() after it
(the write-back a disk save still owes; DeepSpeed does not fsync).
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import deepspeed
import torch
import torch.nn as nn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dirs", required=True, help="comma-separated directories to save to")
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(1)
    w = args.width
    model = nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w), nn.GELU(), nn.Linear(w, 1))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    x = torch.randn(engine.train_micro_batch_size_per_gpu(), w, dtype=torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    dirs = args.dirs.split(",")
    took = {d: [] for d in dirs}
    synced = {d: [] for d in dirs}
    size = {}
    for i in range(args.saves):
        for d in dirs[i % len(dirs):] + dirs[:i % len(dirs)]:
            tag = f"step{i}"
            torch.distributed.barrier()
            t0 = time.monotonic()
            engine.save_checkpoint(d, tag=tag)
            torch.distributed.barrier()
            t1 = time.monotonic()
            os.sync()
            torch.distributed.barrier()
            took[d].append(t1 - t0)
            synced[d].append(time.monotonic() - t1)
            if rank == 0:
                size[d] = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(d, tag))
                              for f in fs)
            torch.distributed.barrier()
            if rank == 0:
                shutil.rmtree(os.path.join(d, tag))
    if rank == 0:
        for d in dirs:
            print(f"{d}: save_checkpoint median {statistics.median(took[d]) * 1000:.0f} ms "
                  f"(range {min(took[d]) * 1000:.0f}..{max(took[d]) * 1000:.0f}), then os.sync() median "
                  f"{statistics.median(synced[d]) * 1000:.0f} ms; {size[d] / 2**20:.1f} MiB per checkpoint",
                  flush=True)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
