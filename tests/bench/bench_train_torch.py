#!/usr/bin/python3
"""The PyTorch side of bench_train_cpu.sh: the same GPT (tests/reference/gpt_ref.py),
same dimensions, batch, optimizer and thread count as muster-train, trained on
the same text; prints the median ms/step and tokens/s over the timed steps.

usage: bench_train_torch.py --data FILE --threads N --steps N [--warmup N]
       [--L 4 --NH 4 --C 128 --T 128 --V 256 --batch 16]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from gpt_ref import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    for k, d in (("L", 4), ("NH", 4), ("C", 128), ("T", 128), ("V", 256), ("batch", 16)):
        ap.add_argument("--" + k, type=int, default=d)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    model = GPT(a.L, a.NH, a.C, a.T, a.V)
    with torch.no_grad():
        for n in model.names:
            t = model.p(n)
            if n.endswith("ln1w") or n.endswith("ln2w") or n == "lnfw":
                t.fill_(1.0)
            elif t.dim() == 1:
                t.zero_()
            else:
                t.normal_(0.0, 0.02)
    opt = model.optimizer(1e-3, 0.1, 0.9, 0.95, 1e-8)
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        ix = torch.randint(0, len(data) - a.T - 1, (a.batch,))
        x = torch.stack([data[i:i + a.T] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.T] for i in ix])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, a.V), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        losses.append(loss.item())
    ms = statistics.median(times) * 1e3
    print("torch ms_per_step %.2f tokens_per_s %.0f loss %.4f->%.4f threads %d"
          % (ms, a.batch * a.T / (ms / 1e3), losses[0], losses[-1], torch.get_num_threads()))


if __name__ == "__main__":
    main()
