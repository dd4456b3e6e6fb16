"""The fences' cost per step (muster_rank.fence), beside a step: what
Elastic adds to each step on the host path (begin under no lock here,
updated(None) from the optimizer's post hook, completed()), timed over many
steps, against one step of tests/torch/ddp_train.py's model (width 64,
batch 32, SGD) in this process, with the post hook registered (as Elastic
does) and without. Then a snapshot's cost (muster_rank.snapshot, as
ShardedElastic's replicas take one every replica_every steps): that model's
state taken (its state_dicts built, the tensors copied into the snapshot's
reused buffer, the layout pickled) on the host path; with a GPU, a larger
model's state taken every step through the pinned side-stream copy
(muster_rank.pinned), the step's time with it against without. Medians of
5 rounds; prints the lines for bench_strict_heal.sh."""

import statistics
import time

import torch
import torch.nn as nn

from muster_rank.fence import Fence
from muster_rank.snapshot import Snapshot

ROUNDS, FENCES, STEPS, TAKES = 5, 100000, 2000, 2000
GPU_WIDTH, GPU_LAYERS, GPU_STEPS = 2048, 4, 50


def fence_round() -> float:
    f = Fence()
    t = time.perf_counter()
    for _ in range(FENCES):
        f.begin()
        f.updated(None)
        f.completed()
    return (time.perf_counter() - t) / FENCES


def ddp_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    return net, torch.optim.SGD(net.parameters(), lr=1e-2)


def take_round() -> float:
    net, opt = ddp_model()
    snap = Snapshot()
    t = time.perf_counter()
    for i in range(TAKES):
        snap.take(i, 0, 1, {"model": net.state_dict(), "optimizer": opt.state_dict()})
    return (time.perf_counter() - t) / TAKES


def gpu_round(taken: bool) -> float:
    """A step of a GPU_LAYERS x GPU_WIDTH MLP (AdamW) on cuda:0, with its
    state taken after each step (the pinned side-stream copy) or not; the
    round ends when the device has done everything."""
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(GPU_WIDTH, GPU_WIDTH) for _ in range(GPU_LAYERS)]).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    x = torch.randn(64, GPU_WIDTH, device=device)
    snap = Snapshot()

    def step() -> None:
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if taken:
            snap.take(1, 0, 1, {"model": net.state_dict(), "optimizer": opt.state_dict()})
    step()  # the optimizer's state made, the pinned buffer allocated
    snap.wait()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(GPU_STEPS):
        step()
    if taken and not snap.wait():
        raise RuntimeError("the last snapshot is not complete")
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / GPU_STEPS


def step_round(hooked: bool) -> float:
    net, opt = ddp_model()
    f = Fence()
    handle = opt.register_step_post_hook(lambda *_: f.updated(None)) if hooked else None
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    t = time.perf_counter()
    for _ in range(STEPS):
        if hooked:
            f.begin()
        loss = nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hooked:
            f.completed()
    spent = (time.perf_counter() - t) / STEPS
    if handle is not None:
        handle.remove()
    return spent


def main() -> None:
    torch.set_num_threads(1)
    fence = statistics.median(fence_round() for _ in range(ROUNDS))
    plain, fenced = [], []
    for _ in range(ROUNDS):  # interleaved, so that a slower moment of the machine falls on both
        plain.append(step_round(False))
        fenced.append(step_round(True))
    p, q = statistics.median(plain), statistics.median(fenced)
    print(f"  fence per step (begin, updated, completed; host path): {fence * 1e6:.2f} us, "
          f"{100 * fence / p:.3f} % of a step of ddp_train.py's model ({p * 1e6:.0f} us, 1 thread)")
    print(f"  that step with the fence and its post hook: {q * 1e6:.0f} us ({min(fenced) * 1e6:.0f}-"
          f"{max(fenced) * 1e6:.0f}) against {p * 1e6:.0f} us ({min(plain) * 1e6:.0f}-{max(plain) * 1e6:.0f}) "
          f"without: {q / p:.3f}x")
    takes = [take_round() for _ in range(ROUNDS)]
    k = statistics.median(takes)
    nbytes = sum(t.numel() * t.element_size() for t in ddp_model()[0].state_dict().values())
    print(f"  snapshot of that model's state (host path, {nbytes / 1024:.1f} KiB): {k * 1e6:.0f} us a take "
          f"({min(takes) * 1e6:.0f}-{max(takes) * 1e6:.0f}), {100 * k / p:.1f} % of a step when taken every "
          f"step (replica_every 1; / K for K)")
    if not torch.cuda.is_available():
        print("  snapshot of CUDA state (pinned memory, side stream): not measured, no GPU here; "
              "the figure waits for a GPU")
        return
    plain, taken = [], []
    for _ in range(ROUNDS):
        plain.append(gpu_round(False))
        taken.append(gpu_round(True))
    p, q = statistics.median(plain), statistics.median(taken)
    net = nn.Sequential(*[nn.Linear(GPU_WIDTH, GPU_WIDTH) for _ in range(GPU_LAYERS)])
    mib = 3 * sum(t.numel() * t.element_size() for t in net.state_dict().values()) / 2**20  # weights, 2 moments
    print(f"  snapshot of CUDA state (pinned memory, side stream; {GPU_LAYERS} x {GPU_WIDTH} MLP, AdamW, "
          f"{mib:.0f} MiB) every step: {q * 1e3:.2f} ms a step ({min(taken) * 1e3:.2f}-{max(taken) * 1e3:.2f}) "
          f"against {p * 1e3:.2f} ms ({min(plain) * 1e3:.2f}-{max(plain) * 1e3:.2f}) without: {q / p:.2f}x "
          f"({torch.cuda.get_device_name(0)})")


if __name__ == "__main__":
    main()
