"""The bench's model and data (tests/torch/ddp_train.py's MLP, batches a pure
function of seed, step and rank) trained under TorchFT (pip install torchft):
each process is a replica group of one rank, started by its own torchrun
(which restarts it when it dies) and coordinated by torchft's lighthouse.
On a replica's death the others go on in a smaller quorum; its new process
joins the next quorum and receives the model and optimizer state from a live
peer (torchft's checkpoint transport). Timing lines as ddp_train.py's
--timing-file: 'start RANK RESTART PID -1 TIME TIME CREATED' when the process
starts, 'step RANK RESTART PID STEP TIME' after each committed step, RANK
being the replica group (REPLICA_GROUP_ID). Options: ddp_train.py's
(checkpoints aside: torchft heals from a peer).
"""
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
from ddp_train import batch, parse_args, process_created, timing_line  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo  # noqa: E402


def main():
    args = parse_args()  # ddp_train.py's options: the bench passes --steps, --step-sleep, --timing-file
    group = int(os.environ["REPLICA_GROUP_ID"])
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if args.timing_file:
        now = time.time()
        timing_line(args.timing_file, "start", group, restart, os.getpid(), -1, f"{now:.6f}", f"{now:.6f}",
                    f"{process_created():.6f}")
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 1))
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)

    def load_state(sd):
        net.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])

    timeout = timedelta(seconds=10)  # torchft's collective and quorum timeout
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state,
                      state_dict=lambda: {"model": net.state_dict(), "opt": opt.state_dict()},
                      replica_id=f"bench_{group}", timeout=timeout, quorum_timeout=timeout)
    model = DistributedDataParallel(manager, net)
    optimizer = Optimizer(manager, opt)
    while manager.current_step() < args.steps:
        step = manager.current_step()
        x, y = batch(args.seed, step, group, args.batch, args.width)
        optimizer.zero_grad()  # starts the step's quorum
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()  # commits only when every participant's step went through
        if manager.current_step() > step and args.timing_file:
            timing_line(args.timing_file, "step", group, restart, os.getpid(), manager.current_step(),
                        f"{time.time():.6f}")
        if args.step_sleep:
            time.sleep(args.step_sleep)
    manager.shutdown()


if __name__ == "__main__":
    sys.exit(main())
