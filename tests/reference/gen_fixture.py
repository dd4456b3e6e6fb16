#!/usr/bin/python3
"""Writes the PyTorch reference fixture that tests/check_model.c compares with.

usage: /usr/bin/python3 tests/reference/gen_fixture.py --model tiny --seed 1337 \
           --out tests/reference/tiny.fixture
       (or --L --NH --C --T --V for other dimensions)

Needs Debian's python3-torch. The committed fixture is for the "tiny" preset;
`make check` only reads it. Weights are random (norm gains around 1, biases
non-zero, so every gradient path is exercised), drawn from torch's generator
seeded with --seed.

Layout (little-endian): int32[16] header, float32[16] hyper-parameters, then
float32 params[P], int32 inputs[B*T], int32 targets[B*T], float32
logits[B*T*V], float32 loss, float32 grads[P], float32 losses[steps] (the loss
before each of the AdamW steps, all on the same batch).
"""
import argparse
import struct
import sys

import torch

from gpt_ref import GPT, lr_at

MAGIC = 0x4D465854  # "TXFM"
PRESETS = {"tiny": (2, 2, 16, 32, 256), "small": (4, 4, 128, 128, 256)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(PRESETS), default="tiny")
    for k in ("L", "NH", "C", "T", "V"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16, help="tokens per sequence (<= T)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-2, help="peak lr of the AdamW steps (floor lr/10)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    L, NH, C, T, V = PRESETS[a.model]
    L, NH, C, T, V = [getattr(a, k) if getattr(a, k) else d
                      for k, d in zip(("L", "NH", "C", "T", "V"), (L, NH, C, T, V))]
    B, S = a.batch, a.seq
    if S > T or C % NH:
        sys.exit("gen_fixture: need seq <= T and C a multiple of NH")
    hp = dict(lr=a.lr, lr_min=a.lr / 10, warmup=3, beta1=0.9, beta2=0.95, eps=1e-8,
              wd=0.1, clip=1.0)

    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    model = GPT(L, NH, C, T, V)
    with torch.no_grad():
        for n in model.names:
            t = model.p(n)
            if n.endswith("ln1w") or n.endswith("ln2w") or n == "lnfw":
                t.copy_(1.0 + 0.1 * torch.randn(t.shape))
            elif t.dim() == 1:
                t.copy_(0.02 * torch.randn(t.shape))
            else:
                t.copy_(0.02 * torch.randn(t.shape))
    params0 = model.flat().clone()
    data = torch.randint(0, V, (B, S + 1))
    inp, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    logits = model(inp)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))
    loss.backward()
    grads = model.flat_grad().clone()
    logits0 = logits.detach().clone()

    opt = model.optimizer(hp["lr"], hp["wd"], hp["beta1"], hp["beta2"], hp["eps"])
    opt.zero_grad()
    losses = []
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, hp["lr"], hp["lr_min"], hp["warmup"])
        opt.zero_grad()
        l = torch.nn.functional.cross_entropy(model(inp).view(-1, V), tgt.view(-1))
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
        opt.step()
        losses.append(l.item())

    with open(a.out, "wb") as f:
        f.write(struct.pack("<16i", MAGIC, 1, L, NH, C, T, V, B, S, a.steps,
                            params0.numel(), a.seed & 0x7FFFFFFF, 0, 0, 0, 0))
        f.write(struct.pack("<16f", hp["lr"], hp["lr_min"], hp["warmup"], hp["beta1"],
                            hp["beta2"], hp["eps"], hp["wd"], hp["clip"],
                            0, 0, 0, 0, 0, 0, 0, 0))
        f.write(params0.numpy().astype("<f4").tobytes())
        f.write(inp.numpy().astype("<i4").tobytes())
        f.write(tgt.numpy().astype("<i4").tobytes())
        f.write(logits0.numpy().astype("<f4").tobytes())
        f.write(struct.pack("<f", loss.item()))
        f.write(grads.numpy().astype("<f4").tobytes())
        f.write(struct.pack("<%df" % a.steps, *losses))
    print("gen_fixture: L=%d NH=%d C=%d T=%d V=%d B=%d seq=%d params=%d loss=%.6f -> %s"
          % (L, NH, C, T, V, B, S, params0.numel(), loss.item(), a.out))


if __name__ == "__main__":
    main()
