"""A snapshot's device-to-host copy: CUDA tensors into pinned host memory on
a side stream, the host not waiting for it.

    copy = Copy.start(ops, [(host_view, cuda_tensor), ...], fence, epoch)
    ... the host goes on (the next step is enqueued) ...
    copy.landed()   # every byte is in host memory (asks the device, never blocks)
    copy.wait()     # blocks until then, the GIL free; False as soon as an abort passed
    copy.clean()    # no abort of the rank's groups since epoch (muster_rank.fence)

Per device the copy runs on a side stream of its own (one per process and
device, made at its first copy), which first waits for the current stream,
so that it reads the state as the step's update leaves it. The copies are
enqueued there with non_blocking=True into page-locked memory (a true
asynchronous DMA: into pageable memory the host would wait for each). An
event is recorded behind them, and the current stream waits for that
event: nothing enqueued after the snapshot (the next update, a BatchNorm's
running statistics in the next forward pass, a kernel given the memory of
a tensor freed since) writes what the copy still reads. So the device runs
the copy before the next step's kernels, but the host waits for nothing:
not for the queue to drain, nor for one copy per tensor, as a blocking copy
does; only a reader of the snapshot waits, for its event.

The torch.cuda pieces come through an ops object: CudaOps, or a test's fake."""

from typing import Dict, List


class CudaOps:
    """The pieces of torch.cuda a side-stream copy uses: streams, the copy, events, pinned memory."""

    def __init__(self) -> None:
        self._side: Dict = {}  # device -> its side stream

    def side_stream(self, device):
        import torch
        if device not in self._side:
            self._side[device] = torch.cuda.Stream(device=device)
        return self._side[device]

    def current_stream(self, device):
        import torch
        return torch.cuda.current_stream(device)

    def copy(self, stream, pairs: List[tuple]) -> None:
        """dst.copy_(src) for each (dst, src), enqueued on stream; the host does not wait."""
        import torch
        with torch.cuda.stream(stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)

    def event(self):
        import torch
        return torch.cuda.Event()

    def pinned(self, nbytes: int):
        """A uint8 host buffer of nbytes, page-locked (pin_memory), from torch's
        caching host allocator: a block a DMA may still write into is not
        handed out again before that DMA's event is done."""
        import torch
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


_cuda = None


def cuda_ops() -> CudaOps:
    """The process's CudaOps (its side streams live as long as it)."""
    global _cuda
    if _cuda is None:
        _cuda = CudaOps()
    return _cuda


class Copy:
    """A device-to-host copy under way: an event per device behind it, and
    the abort epoch it began in (fence: a muster_rank.fence.Fence; None:
    no abort is counted)."""

    def __init__(self, events: list, fence=None, epoch: int = 0) -> None:
        self.events, self.fence, self.epoch = events, fence, epoch

    @classmethod
    def start(cls, ops, pairs: List[tuple], fence=None, epoch: int = 0) -> "Copy":
        """Enqueues dst.copy_(src) for each (dst: a view of pinned host memory,
        src: a CUDA tensor), device by device, as the module says."""
        by_device: Dict = {}
        for dst, src in pairs:
            by_device.setdefault(src.device, []).append((dst, src))
        events = []
        for device, these in by_device.items():
            side, current = ops.side_stream(device), ops.current_stream(device)
            side.wait_stream(current)  # the copy reads the state the update left
            ops.copy(side, these)
            event = ops.event()
            event.record(side)
            current.wait_event(event)  # what comes after does not write what the copy reads
            events.append(event)
        return cls(events, fence, epoch)

    def landed(self) -> bool:
        """Whether every byte is in host memory (the device asked, no wait)."""
        return all(e.query() for e in self.events)

    def clean(self) -> bool:
        """Whether no abort passed since the copy's snapshot began."""
        return self.fence is None or self.fence.taken(self.epoch)

    def wait(self) -> bool:
        """Waits until every byte is in host memory (the GIL free: the park
        watch runs); False as soon as an abort passed first (a copy behind
        an aborted collective may never land whole)."""
        for e in self.events:
            if self.fence is None:
                e.synchronize()
            elif not self.fence.wait(e, self.epoch):
                return False
        return True
