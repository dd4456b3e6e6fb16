"""GPT-2 in PyTorch, written to mirror worker/train/model.c tensor for tensor.

Parameters are kept in the C program's flat order (unit 0: wte, wpe; units
1..L: the block tensors; unit L+1: lnfw, lnfb) so that a flat float32 vector
moves between the two without any renaming. Used by gen_fixture.py (the
correctness fixture) and tests/bench/bench_train_torch.py (the benchmark).
"""
import math

import torch
import torch.nn.functional as F

BLOCK = ["ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"]


def tensor_shapes(L, C, T, V):
    """(name, shape, decay) in the C flat order."""
    out = [("wte", (V, C), True), ("wpe", (T, C), True)]
    for layer in range(L):
        shapes = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,),
                  "attprojw": (C, C), "attprojb": (C,), "ln2w": (C,), "ln2b": (C,),
                  "fcw": (4 * C, C), "fcb": (4 * C,), "fcprojw": (C, 4 * C),
                  "fcprojb": (C,)}
        for name in BLOCK:
            out.append(("h%d.%s" % (layer, name), shapes[name], len(shapes[name]) == 2))
    out += [("lnfw", (C,), False), ("lnfb", (C,), False)]
    return out


class GPT(torch.nn.Module):
    def __init__(self, L, NH, C, T, V):
        super().__init__()
        self.L, self.NH, self.C, self.T, self.V = L, NH, C, T, V
        self.names = []
        self.decay = {}
        for name, shape, decay in tensor_shapes(L, C, T, V):
            key = name.replace(".", "_")
            self.register_parameter(key, torch.nn.Parameter(torch.zeros(shape)))
            self.names.append(key)
            self.decay[key] = decay

    def p(self, name):
        return getattr(self, name)

    def flat(self):
        return torch.cat([self.p(n).detach().reshape(-1) for n in self.names])

    def flat_grad(self):
        return torch.cat([self.p(n).grad.reshape(-1) for n in self.names])

    def load_flat(self, vec):
        off = 0
        with torch.no_grad():
            for n in self.names:
                t = self.p(n)
                t.copy_(vec[off:off + t.numel()].view_as(t))
                off += t.numel()

    def forward(self, idx):
        B, T = idx.shape
        C, NH = self.C, self.NH
        hs = C // NH
        x = self.wte[idx] + self.wpe[:T]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for layer in range(self.L):
            g = lambda n: self.p("h%d_%s" % (layer, n))
            h = F.layer_norm(x, (C,), g("ln1w"), g("ln1b"), 1e-5)
            qkv = F.linear(h, g("qkvw"), g("qkvb"))
            q, k, v = qkv.split(C, dim=2)
            q = q.view(B, T, NH, hs).transpose(1, 2)
            k = k.view(B, T, NH, hs).transpose(1, 2)
            v = v.view(B, T, NH, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + F.linear(y, g("attprojw"), g("attprojb"))
            h = F.layer_norm(x, (C,), g("ln2w"), g("ln2b"), 1e-5)
            h = F.gelu(F.linear(h, g("fcw"), g("fcb")), approximate="tanh")
            x = x + F.linear(h, g("fcprojw"), g("fcprojb"))
        x = F.layer_norm(x, (C,), self.lnfw, self.lnfb, 1e-5)
        return F.linear(x, self.wte)

    def optimizer(self, lr, wd, beta1, beta2, eps):
        decay = [self.p(n) for n in self.names if self.decay[n]]
        nodecay = [self.p(n) for n in self.names if not self.decay[n]]
        return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                                  {"params": nodecay, "weight_decay": 0.0}],
                                 lr=lr, betas=(beta1, beta2), eps=eps)


def lr_at(step, steps, lr, lr_min, warmup):
    """Same schedule as worker/train/optim.c: linear warm-up, cosine to lr_min."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if steps <= warmup:
        return lr_min
    progress = min(1.0, (step - warmup) / (steps - warmup))
    return lr_min + 0.5 * (lr - lr_min) * (1.0 + math.cos(math.pi * progress))
