#!/usr/bin/python3
"""The PyTorch side of `make bench-gpu`: the same GPT-2 (same units, tied head,
GELU tanh, LayerNorm eps 1e-5, AdamW 0.9/0.95/1e-8, wd 0.1 on matrices) on
one GPU with fp32 weights under bf16 autocast, attention through
F.scaled_dot_product_attention (causal), torch.compile when it works.
Prints one human line and one JSON line: tokens/s, MFU (6N, same peak table
as gpu-bench.c), peak memory (torch.cuda.max_memory_allocated).

usage: bench_torch_gpu.py [--L 12 --NH 12 --C 768 --T 1024 --V 50257]
                          [--batch 8] [--steps 10] [--warmup 3] [--no-compile]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAKS = [("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0),
         ("L40S", 362.05), ("A10", 125.0)]


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.attproj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def run(model, step_fn, args, x, y):
    torch.cuda.synchronize()
    for s in range(args.warmup + args.steps):
        if s == args.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = step_fn(x, y)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, loss.item()


def main():
    ap = argparse.ArgumentParser()
    for k, d in (("L", 12), ("NH", 12), ("C", 768), ("T", 1024), ("V", 50257), ("batch", 8),
                 ("steps", 10), ("warmup", 3)):
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_torch_gpu: no GPU: skipped")
        return
    dev = "cuda"
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(args.L, args.NH, args.C, args.T, args.V).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    x = torch.randint(0, args.V, (args.batch, args.T), device=dev)
    y = torch.randint(0, args.V, (args.batch, args.T), device=dev)
    compiled = "no"
    fwd = model
    if not args.no_compile:
        try:
            fwd = torch.compile(model)
            compiled = "yes"
        except Exception as e:  # torch.compile is optional: report and go on eager
            print("bench_torch_gpu: torch.compile unavailable (%s): eager" % e)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.reset_peak_memory_stats()
    try:
        dt, loss = run(model, step, args, x, y)
    except Exception as e:  # a compile failure shows at the first call
        if compiled != "yes":
            raise
        print("bench_torch_gpu: torch.compile failed at run time (%s): eager" % str(e)[:200])
        compiled, fwd = "failed", model
        torch.cuda.reset_peak_memory_stats()
        dt, loss = run(model, step, args, x, y)
    name = torch.cuda.get_device_name(0)
    peak = next((p for m, p in PEAKS if m in name), 0.0)
    tps = args.batch * args.T * args.steps / dt
    mfu = 6.0 * nparams * tps / (peak * 1e12) if peak else 0.0
    mem = torch.cuda.max_memory_allocated()
    print("torch %s on %s: batch %d seq_len %d: %.0f tokens/s, %.1f ms/step, MFU %.1f%%, "
          "compile %s, loss %.4f, peak memory %.2f GiB"
          % (torch.__version__, name, args.batch, args.T, tps, 1e3 * dt / args.steps, 100 * mfu,
             compiled, loss, mem / 2**30))
    print(json.dumps({"impl": "torch", "device": name, "torch": torch.__version__,
                      "compile": compiled, "micro_batch": args.batch, "seq_len": args.T,
                      "tokens_per_s": round(tps, 1), "mfu": round(mfu, 4), "params": nparams,
                      "peak_mem_bytes": mem}))


if __name__ == "__main__":
    main()
