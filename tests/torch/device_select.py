"""Which GPU a torchrun-style program selects, through its own library's code
path, on a machine without a GPU.

torch.cuda is replaced by a strict stand-in for CUDA's device selection: it
counts the devices CUDA_VISIBLE_DEVICES lists, as the CUDA runtime does, and
set_device of an index past them raises "CUDA error: invalid device ordinal",
as the runtime does. Nothing else of CUDA is used. The program then selects
its device the way its kind of program does:

  ddp        torchrun's guides: torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
  deepspeed  DeepSpeed's engine: its own _configure_with_arguments (LOCAL_RANK)
             and _set_distributed_vars (get_accelerator().set_device), with
             DeepSpeed's CUDA accelerator
  accelerate accelerate's PartialState(): cuda:(local process index % device count)

Every rank joins one gloo group (from muster's MASTER_ADDR/MASTER_PORT), which
DeepSpeed and accelerate take up as the distributed state they expect, then
selects its device as each KIND named does, and prints for each
  "rank R local L kind K selects cuda:I gpu G"
where G is entry I of its CUDA_VISIBLE_DEVICES (the node's GPU ordinal), or
  "rank R local L kind K fails: ..."
"""
import argparse
import os
import sys
import types

import torch


class StrictCudaDevices:
    """torch.cuda's device selection, as strict as CUDA's: only listed devices exist."""

    def __init__(self, visible: str):
        self.devices = [d for d in visible.split(",") if d.strip() != ""] if visible else []
        self.current = 0

    def is_available(self) -> bool:
        return bool(self.devices)

    def device_count(self) -> int:
        return len(self.devices)

    def set_device(self, device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        if index is None:
            index = 0
        if not 0 <= index < len(self.devices):
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.current = index

    def current_device(self) -> int:
        return self.current

    def get_device_properties(self, device=None):
        if self.device_count() == 0:
            raise RuntimeError("Found no NVIDIA driver on your system")
        # a Hopper GPU's, as DeepSpeed's op builders and accelerator ask at import
        return types.SimpleNamespace(major=9, minor=0, name="stand-in", total_memory=80 << 30)

    def get_device_capability(self, device=None) -> tuple:
        prop = self.get_device_properties(device)
        return (prop.major, prop.minor)

    def install(self) -> None:
        for name in ("is_available", "device_count", "set_device", "current_device", "get_device_properties",
                     "get_device_capability"):
            setattr(torch.cuda, name, getattr(self, name))


def select_ddp() -> int:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return torch.cuda.current_device()


def select_deepspeed() -> int:
    os.environ["DS_ACCELERATOR"] = "cuda"  # the node's kind, as DeepSpeed would detect it on a GPU node
    import deepspeed
    from deepspeed.runtime.engine import DeepSpeedEngine

    deepspeed.init_distributed(dist_backend="gloo")  # takes up the group main() formed
    engine = object.__new__(DeepSpeedEngine)  # only its device choice, not a model
    DeepSpeedEngine._configure_with_arguments(engine, None, None)
    DeepSpeedEngine._set_distributed_vars(engine, None)
    if engine.device.type != "cuda":
        raise RuntimeError(f"DeepSpeed chose {engine.device}, not a CUDA device")
    return engine.device.index


def select_accelerate() -> int:
    from accelerate import PartialState

    state = PartialState()
    if state.device.type != "cuda":
        raise RuntimeError(f"accelerate chose {state.device}, not a CUDA device")
    return state.device.index


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kinds", nargs="+", choices=["ddp", "deepspeed", "accelerate"])
    args = p.parse_args()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    StrictCudaDevices(visible).install()
    rank, local = os.environ["RANK"], os.environ["LOCAL_RANK"]
    import torch.distributed as dist

    print(f"rank {rank} TORCH_NCCL_ASYNC_ERROR_HANDLING={os.environ.get('TORCH_NCCL_ASYNC_ERROR_HANDLING', 'unset')}",
          flush=True)
    # One gloo group for all three: DeepSpeed's init_distributed and accelerate's PartialState take it up.
    dist.init_process_group("gloo", init_method="env://")
    status = 0
    for kind in args.kinds:
        try:
            index = {"ddp": select_ddp, "deepspeed": select_deepspeed, "accelerate": select_accelerate}[kind]()
            gpu = visible.split(",")[index]
            print(f"rank {rank} local {local} kind {kind} selects cuda:{index} gpu {gpu}", flush=True)
        except (RuntimeError, ValueError) as e:  # CUDA's error, or torch's check of a device_id
            print(f"rank {rank} local {local} kind {kind} fails: {e}", flush=True)
            status = 1
    dist.barrier()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
