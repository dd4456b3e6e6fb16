"""A snapshot's CUDA tensors copied to pinned host memory on a side stream
(muster_rank.pinned, Snapshot.take), on CPU torch: the torch.cuda pieces are
fakes (FakeOps), a "CUDA" tensor is a host tensor that says it is one, and
the fake device runs a stream's copies only when an event behind them
finishes, as a DMA lands after the host moved on. Skipped without torch."""

import pickle
import threading
import unittest

try:
    import torch
except ImportError:
    torch = None

from muster_rank.fence import Fence

if torch is not None:
    from muster_rank.pinned import Copy
    from muster_rank.sharded import buddies
    from muster_rank.snapshot import Snapshot
    from muster_rank.transport import Transport

    class OnDevice(torch.Tensor):
        """A host tensor that says it is on a GPU."""

        @property
        def is_cuda(self):
            return True


def on_device(t):
    return t.as_subclass(OnDevice)


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log, self.queue = name, log, []

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, event.stream))


class FakeEvent:
    """Done once finish() ran the copies enqueued on its stream before it was recorded."""

    def __init__(self, log):
        self.log, self.stream, self.copies, self.done, self.queries = log, None, [], False, 0
        self.finish_after = None  # finish at that many queries (a device that gets there)

    def record(self, stream):
        self.log.append(("record", stream.name))
        self.stream, self.copies, stream.queue = stream.name, stream.queue, []

    def query(self):
        self.queries += 1
        if self.finish_after is not None and self.queries >= self.finish_after:
            self.finish()
        return self.done

    def synchronize(self):
        self.finish()

    def finish(self):
        for dst, src in self.copies:
            dst.copy_(src)
        self.copies, self.done = [], True


class FakeOps:
    """muster_rank.pinned.CudaOps's pieces, logged."""

    def __init__(self):
        self.log, self.events, self.pinned_sizes = [], [], []
        self.side, self.current = FakeStream("side", self.log), FakeStream("current", self.log)

    def side_stream(self, device):
        return self.side

    def current_stream(self, device):
        return self.current

    def copy(self, stream, pairs):
        self.log.append(("copy", stream.name, len(pairs)))
        stream.queue.extend(pairs)

    def event(self):
        self.events.append(FakeEvent(self.log))
        return self.events[-1]

    def pinned(self, nbytes):
        self.pinned_sizes.append(nbytes)
        return torch.zeros(nbytes, dtype=torch.uint8)


def state(w, b=None):
    """A state_dict tree: w on the "device", b (if given) on the host."""
    tree = {"w": on_device(w)}
    if b is not None:
        tree["b"] = b
    return {"m": tree}


def held(snap):
    """{name: tensor} of the "m" tree snap holds (waits for it)."""
    got = {}
    snap.load({"m": type("M", (), {"load_state_dict": lambda self, sd: got.update(sd)})()})
    return got


@unittest.skipIf(torch is None, "torch is not importable")
class PinnedPathTest(unittest.TestCase):
    def test_a_cuda_tensor_goes_to_pinned_memory_on_the_side_stream(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(3, 0, 1, state(torch.arange(6.0), b=torch.ones(2)))
        self.assertEqual(len(ops.pinned_sizes), 1)
        self.assertEqual(ops.pinned_sizes[0], snap.flat.numel())
        # The side stream waits for the update, copies, records; the current stream waits for the copy.
        self.assertEqual(ops.log, [("wait_stream", "side", "current"), ("copy", "side", 1), ("record", "side"),
                                   ("wait_event", "current", "side")])
        self.assertTrue(snap.copying)
        self.assertFalse(snap.complete)
        ops.events[0].finish()
        self.assertTrue(snap.complete)
        self.assertFalse(snap.copying)
        got = held(snap)
        self.assertTrue(torch.equal(got["w"], torch.arange(6.0)))
        self.assertTrue(torch.equal(got["b"], torch.ones(2)))

    def test_the_host_tensor_beside_it_is_copied_at_once(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(3, 0, 1, state(torch.arange(6.0), b=torch.full((2,), 7.0)))
        offsets = pickle.loads(snap.layout)["offsets"]  # read without waiting, as no reader does
        self.assertTrue(torch.equal(snap.flat[offsets[1]:offsets[1] + 8].view(torch.float32), torch.full((2,), 7.0)))
        self.assertEqual(snap.flat[offsets[0]:offsets[0] + 24].count_nonzero().item(), 0)  # not landed yet

    def test_the_pinned_buffer_is_reused_across_takes(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(1, 0, 1, state(torch.ones(4)))
        buf = snap.flat
        self.assertTrue(snap.wait())
        snap.take(2, 0, 1, state(torch.full((4,), 2.0)))
        self.assertIs(snap.flat, buf)
        self.assertTrue(snap.wait())
        self.assertTrue(torch.equal(held(snap)["w"], torch.full((4,), 2.0)))
        self.assertEqual(len(ops.pinned_sizes), 1)
        snap.take(3, 0, 1, state(torch.ones(40)))  # another shape: another buffer
        self.assertIsNot(snap.flat, buf)
        self.assertEqual(len(ops.pinned_sizes), 2)

    def test_a_take_over_a_copy_under_way_waits_for_it_and_keeps_the_buffer(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(1, 0, 1, state(torch.ones(4)))
        buf = snap.flat
        snap.take(2, 0, 1, state(torch.full((4,), 2.0)))
        self.assertTrue(ops.events[0].done)  # landed before its buffer was written again
        self.assertIs(snap.flat, buf)
        self.assertEqual(len(ops.pinned_sizes), 1)
        self.assertTrue(torch.equal(held(snap)["w"], torch.full((4,), 2.0)))

    def test_a_copy_not_landed_is_not_complete_and_readers_wait_for_it(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(5, 0, 1, state(torch.arange(3.0)))
        for _ in range(3):
            self.assertFalse(snap.complete)
        self.assertFalse(ops.events[0].done)
        self.assertTrue(torch.equal(held(snap)["w"], torch.arange(3.0)))  # load waited (synchronize)
        self.assertTrue(ops.events[0].done)
        self.assertTrue(snap.complete)

    def test_with_a_fence_the_wait_polls_until_the_copy_lands(self):
        ops, fence = FakeOps(), Fence()
        snap = Snapshot(ops)
        snap.take(5, 0, 1, state(torch.arange(3.0)), fence=fence)
        ops.events[0].finish_after = 3
        self.assertTrue(snap.wait())
        self.assertGreaterEqual(ops.events[0].queries, 3)

    def test_a_transport_sends_only_what_landed(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(7, 1, 2, state(torch.arange(4.0)))
        sent = []
        dist = type("D", (), {"isend": lambda self, t, dst, group=None: sent.append(t.clone())})()
        Transport(dist).send(snap, 0)
        self.assertTrue(ops.events[0].done)
        self.assertTrue(torch.equal(sent[2], snap.flat))

    def test_the_host_path_is_unchanged(self):
        ops = FakeOps()
        snap = Snapshot(ops)
        snap.take(3, 0, 1, {"m": {"w": torch.arange(6.0), "b": torch.ones(2)}})
        self.assertEqual((ops.log, ops.pinned_sizes), ([], []))
        self.assertTrue(snap.complete)
        self.assertFalse(snap.copying)
        self.assertTrue(torch.equal(held(snap)["w"], torch.arange(6.0)))

    def test_a_slot_copying_is_not_taken_for_the_next_round(self):
        old, free = Snapshot(FakeOps()), Snapshot()
        old.take(20, 0, 1, state(torch.ones(2)))
        self.assertIs(buddies.slot([old, free]), free)
        self.assertTrue(old.copying)


@unittest.skipIf(torch is None, "torch is not importable")
class AbortTest(unittest.TestCase):
    def test_an_abort_during_the_take_is_never_complete(self):
        ops, fence = FakeOps(), Fence()

        class Aborting(dict):
            """A state_dict whose tensors are read while the park watch aborts."""
            def items(self):
                fence.abort()
                return super().items()
        snap = Snapshot(ops)
        snap.take(4, 0, 1, {"m": Aborting(w=on_device(torch.ones(2)))}, fence=fence)
        self.assertFalse(snap.copying)
        ops.events[0].finish()
        self.assertFalse(snap.complete)
        self.assertFalse(snap.wait())

    def test_an_abort_before_the_copy_lands_is_never_complete(self):
        ops, fence = FakeOps(), Fence()
        snap = Snapshot(ops)
        snap.take(4, 0, 1, state(torch.ones(2)), fence=fence)
        fence.abort()
        self.assertFalse(snap.complete)
        ops.events[0].finish()
        self.assertFalse(snap.complete)
        self.assertFalse(snap.wait())
        self.assertIsNone(snap.flat)  # the device could still have written into it
        with self.assertRaises(RuntimeError):
            snap.unpack()

    def test_an_abort_while_a_reader_waits_ends_the_wait(self):
        ops, fence = FakeOps(), Fence()
        snap = Snapshot(ops)
        snap.take(4, 0, 1, state(torch.ones(2)), fence=fence)  # its copy never lands
        aborter = threading.Timer(0.05, fence.abort)
        aborter.start()
        self.assertFalse(snap.wait())
        aborter.join()
        with self.assertRaises(RuntimeError):
            Transport(None).send(snap, 0)

    def test_a_copy_before_an_abort_stays_complete(self):
        ops, fence = FakeOps(), Fence()
        snap = Snapshot(ops)
        snap.take(4, 0, 1, state(torch.ones(2)), fence=fence)
        ops.events[0].finish()
        self.assertTrue(snap.complete)
        fence.abort()
        self.assertTrue(snap.complete)
        self.assertTrue(snap.wait())


@unittest.skipIf(torch is None, "torch is not importable")
class CopyTest(unittest.TestCase):
    def test_one_event_per_device_and_each_waited_for(self):
        ops = FakeOps()
        dst = [torch.zeros(2), torch.zeros(2)]
        copy = Copy.start(ops, [(dst[0], on_device(torch.ones(2))), (dst[1], on_device(torch.full((2,), 2.0)))])
        self.assertEqual(len(ops.events), 1)  # one device: one stream, one event
        self.assertFalse(copy.landed())
        self.assertTrue(copy.wait())
        self.assertTrue(copy.landed())
        self.assertTrue(torch.equal(dst[1], torch.full((2,), 2.0)))


if __name__ == "__main__":
    unittest.main()
