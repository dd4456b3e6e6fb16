"""One rank of the GPU device-contract check (tests/gpu-contract.sh), on real GPUs.

Run by muster-worker --local, one rank per GPU of the node, as a torchrun
script would be: it selects its device with torch.cuda.set_device(LOCAL_RANK),
joins an NCCL group through env://, all-reduces, then (rank 0) asks NCCL's RAS
service what it sees and every rank dumps torch's flight recorder. It prints one
line, "gpu-contract {json}", that the script checks against nvidia-smi:

  rank, local_rank, visible   CUDA_VISIBLE_DEVICES as the agent gave it
  uuid                        the UUID of cuda:LOCAL_RANK after set_device
  sum, want                   the all-reduce of rank+1 over the world, and W(W+1)/2
  nccl_error_handling         TORCH_NCCL_ASYNC_ERROR_HANDLING as the rank sees it
  fr                          what the flight recorder dump held (entries, all_reduce ones)
  ras                         rank 0: the RAS answer's first lines, or why there was none
"""
import json
import os
import pickle
import socket
import sys
import time

import torch
import torch.distributed as dist


def ras_status(timeout_s=20.0):
    """NCCL's RAS client protocol (NCCL 2.24+): CLIENT PROTOCOL, then VERBOSE STATUS; text until EOF."""
    addr = os.environ.get("NCCL_RAS_ADDR", "localhost:28028")
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + timeout_s
    try:
        s = socket.create_connection((host or "localhost", int(port)), timeout=5)
    except OSError as e:
        return {"error": f"connect {addr}: {e}"}
    with s:
        s.settimeout(5)
        s.sendall(b"CLIENT PROTOCOL 2\n")
        hello = s.recv(1024).decode(errors="replace").strip()
        if not hello.upper().startswith("SERVER PROTOCOL"):
            return {"error": f"unexpected handshake answer {hello!r}"}
        s.sendall(b"VERBOSE STATUS\n")
        chunks = []
        while time.monotonic() < deadline:
            try:
                b = s.recv(65536)
            except socket.timeout:
                continue
            if not b:
                break
            chunks.append(b)
        text = b"".join(chunks).decode(errors="replace")
    return {"server": hello, "bytes": len(text), "head": text.splitlines()[:40]}


def flight_recorder():
    """The recorder's dump through whichever entry point this torch has."""
    c10d = torch._C._distributed_c10d
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            dump = pickle.loads(fn())
        except Exception as e:  # the dump is what is being checked: say what failed
            return {"entry": name, "error": f"{type(e).__name__}: {e}"}
        entries = dump.get("entries", [])
        return {"entry": name, "entries": len(entries),
                "all_reduce": sum(1 for e in entries if "all_reduce" in str(e.get("profiling_name", ""))),
                "last_seq": max((e.get("collective_seq_id", -1) for e in entries), default=-1)}
    return {"error": "no flight-recorder dump entry point in torch._C._distributed_c10d"}


def main():
    local = int(os.environ["LOCAL_RANK"])
    out = {"rank": int(os.environ["RANK"]), "local_rank": local,
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
           "nccl_error_handling": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "unset")}
    try:
        torch.cuda.set_device(local)  # torchrun's pattern: fails with "invalid device ordinal" when not visible
        out["uuid"] = str(torch.cuda.get_device_properties(local).uuid)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        world = dist.get_world_size()
        t = torch.full((1024,), float(dist.get_rank() + 1), device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
            t.div_(world)  # back to the mean, so three rounds keep the same value
        dist.all_reduce(t)
        out["sum"] = float(t[0].item())
        out["want"] = world * (world + 1) / 2  # three means of rank+1, then one sum
        if dist.get_rank() == 0:
            out["ras"] = ras_status()
        dist.barrier(device_ids=[local])
        out["fr"] = flight_recorder()
        dist.destroy_process_group()
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print("gpu-contract " + json.dumps(out), flush=True)
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
