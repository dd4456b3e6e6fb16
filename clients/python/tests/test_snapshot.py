"""Snapshots with CPU torch: state_dicts into one flat buffer and back, shard
state and RNG, the transport's framing over a fake torch.distributed, and
re-slicing rows. Skipped without torch."""

import unittest
from types import SimpleNamespace
from unittest import mock

try:
    import torch
except ImportError:
    torch = None

from muster_rank import state

if torch is not None:
    from muster_rank.sharded import buddies, reslice, shards
    from muster_rank.snapshot import Snapshot
    from muster_rank.transport import Transport


class FakeDist:
    """torch.distributed's point-to-point calls and broadcast as one queue of tensors:
    what one side sends, the other receives, in order. me: the broadcasting rank's view."""

    def __init__(self):
        self.wire, self.me = [], 0

    def isend(self, t, dst, group=None):
        self.wire.append(t.clone())
        return SimpleNamespace(wait=lambda: None)

    def recv(self, t, src, group=None):
        t.copy_(self.wire.pop(0))

    def broadcast(self, t, src, group=None):
        if self.me == src:
            self.wire.append(t.clone())
        else:
            t.copy_(self.wire.pop(0))


def trained(seed=0, steps=2):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for i in range(steps):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


class Counter:
    def __init__(self, n=0):
        self.n = n

    def state_dict(self):
        return {"n": self.n, "t": torch.tensor([float(self.n)])}

    def load_state_dict(self, sd):
        self.n = sd["n"]
        assert float(sd["t"][0]) == self.n


@unittest.skipIf(torch is None, "torch is not importable")
class StateWalkTest(unittest.TestCase):
    def test_strip_fill_slots(self):
        tree = {"a": torch.ones(2), "b": [torch.zeros(3), 7, (torch.arange(4), "x")], "c": {"d": None}}
        tensors = []
        stripped = state.strip(tree, tensors, lambda t: (t.detach(), None))
        self.assertEqual(len(tensors), 3)
        self.assertEqual([sl.index for sl in state.slots(stripped)], [0, 1, 2])
        self.assertEqual([sl.shape for sl in state.slots(stripped)], [(2,), (3,), (4,)])
        self.assertEqual(stripped["b"][1], 7)
        self.assertIsInstance(stripped["b"][2], tuple)
        back = state.fill(stripped, lambda sl: tensors[sl.index].clone())
        self.assertTrue(torch.equal(back["b"][2][0], torch.arange(4)))
        self.assertEqual(back["c"], {"d": None})


@unittest.skipIf(torch is None, "torch is not importable")
class SnapshotTest(unittest.TestCase):
    def test_take_and_load(self):
        model, opt = trained()
        snap = Snapshot()
        snap.take(2, 0, 1, {"model": model.state_dict(), "optimizer": opt.state_dict(), "c": Counter(5).state_dict()})
        self.assertEqual(snap.flat.numel() % 64, 0)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # the snapshot holds a copy
        fresh, fresh_opt = trained(seed=1, steps=0)
        counter = Counter()
        snap.load({"model": fresh, "optimizer": fresh_opt, "c": counter})
        for k, v in fresh.state_dict().items():
            self.assertTrue(torch.equal(v, want[k]), k)
        self.assertEqual(counter.n, 5)
        got, ref = fresh_opt.state_dict()["state"], opt.state_dict()["state"]
        self.assertEqual(sorted(got), sorted(ref))
        self.assertTrue(torch.equal(got[0]["exp_avg"], ref[0]["exp_avg"]))

    def test_shard_state_and_rng(self):
        model, opt = trained()
        snap = Snapshot()
        torch.manual_seed(42)
        shards.take_shard(snap, 2, 0, 1, model, opt, {"c": Counter(3)})
        drawn = torch.rand(3)
        fresh, fresh_opt = trained(seed=1, steps=0)
        counter = Counter()
        shards.apply_shard(snap, fresh, fresh_opt, {"c": counter})
        self.assertTrue(torch.equal(torch.rand(3), drawn))  # the RNG as it was taken
        self.assertEqual(counter.n, 3)
        for a, b in zip(model.parameters(), fresh.parameters()):
            self.assertTrue(torch.equal(a, b))
        self.assertTrue(torch.equal(fresh_opt.state_dict()["state"][1]["exp_avg_sq"],
                                    opt.state_dict()["state"][1]["exp_avg_sq"]))

    def test_apply_to_another_model_fails(self):
        model, opt = trained()
        snap = Snapshot()
        shards.take_shard(snap, 2, 0, 1, model, opt, {})
        other = torch.nn.Linear(4, 2)
        with self.assertRaises(ValueError):
            shards.apply_shard(snap, other, torch.optim.AdamW(other.parameters()), {})

    def test_slots_reuse_buffers(self):
        snaps = []
        a = buddies.slot(snaps)
        a.step, a.complete = 10, True
        b = buddies.slot(snaps)
        b.step, b.complete = 20, True
        self.assertEqual(snaps, [a, b])
        c = buddies.slot(snaps)  # two complete: the older is taken
        self.assertIs(c, a)
        self.assertEqual((c.step, c.complete), (-1, False))
        self.assertEqual(snaps, [b, a])
        self.assertIs(buddies.slot(snaps), a)  # a free one first


@unittest.skipIf(torch is None, "torch is not importable")
class TransportTest(unittest.TestCase):
    def snapshot(self):
        model, opt = trained()
        snap = Snapshot()
        shards.take_shard(snap, 7, 1, 2, model, opt, {})
        return snap

    def assert_same(self, a, b):
        self.assertEqual((a.step, a.rank, a.world, a.complete), (b.step, b.rank, b.world, True))
        self.assertEqual(a.layout, b.layout)
        self.assertTrue(torch.equal(a.flat, b.flat))

    def test_send_recv(self):
        dist, snap = FakeDist(), self.snapshot()
        works = Transport(dist).send(snap, 1)
        self.assertEqual(len(works), 3)
        got = Snapshot()
        Transport(dist).recv(got, 0)
        self.assert_same(got, snap)
        self.assertEqual(dist.wire, [])

    def test_recv_reuses_a_buffer_that_fits(self):
        dist, snap = FakeDist(), self.snapshot()
        got = Snapshot()
        got.flat = torch.empty(snap.flat.numel(), dtype=torch.uint8)
        buf = got.flat
        Transport(dist).send(snap, 1)
        Transport(dist).recv(got, 0)
        self.assertIs(got.flat, buf)
        self.assert_same(got, snap)

    def test_broadcast(self):
        dist, snap = FakeDist(), self.snapshot()
        self.assertIs(Transport(dist).broadcast(snap, 0, 0), snap)
        dist.me = 1
        got = Transport(dist).broadcast(None, 0, 1)
        self.assert_same(got, snap)


class Shard0:
    dim = 0

    def is_replicate(self):
        return False

    def is_shard(self):
        return True


@unittest.skipIf(torch is None, "torch is not importable")
class CopyRowsTest(unittest.TestCase):
    def test_reslice_rows_from_three_to_two(self):
        full = torch.arange(7 * 2, dtype=torch.float32).view(7, 2)
        spec = ((Shard0(),), (7, 2), (2, 1))
        old = list(full.chunk(3))
        for me in range(2):
            dst = torch.zeros_like(full.chunk(2)[me])
            for r in range(3):
                reslice.copy_rows(dst, old[r], spec, r, 3, me, 2, "w")
            self.assertTrue(torch.equal(dst, full.chunk(2)[me]), me)

    def test_replicated_comes_from_old_rank_0(self):
        dst = torch.zeros(3)
        reslice.copy_rows(dst, torch.ones(3), None, 1, 2, 0, 3, "b")
        self.assertTrue(torch.equal(dst, torch.zeros(3)))
        reslice.copy_rows(dst, torch.ones(3), None, 0, 2, 0, 3, "b")
        self.assertTrue(torch.equal(dst, torch.ones(3)))

    def test_a_split_other_than_chunk_fails(self):
        spec = ((Shard0(),), (6, 1), (1, 1))
        with self.assertRaises(ValueError):
            reslice.copy_rows(torch.zeros(3, 1), torch.zeros(3, 1), spec, 0, 2, 0, 3, "w")



@unittest.skipIf(torch is None, "torch is not importable")
class SlotDeviceTest(unittest.TestCase):
    def test_slot_keeps_its_device_type(self):
        tensors = []
        tree = state.strip({"w": torch.ones(2, 3)}, tensors, lambda t: (t, None))
        self.assertEqual(tree["w"].device, "cpu")
        self.assertEqual((tree["w"].shape, tree["w"].dtype), ((2, 3), torch.float32))

    def test_place_on_this_ranks_device(self):
        cuda = state.TensorSlot(0, (1,), torch.float32, device="cuda")
        host = state.TensorSlot(0, (1,), torch.float32)
        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(torch.cuda, "current_device", return_value=2):
            self.assertEqual(state.place(cuda), torch.device("cuda", 2))  # the sender's index is not kept
            self.assertEqual(state.place(host), torch.device("cpu"))
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            self.assertEqual(state.place(cuda), torch.device("cpu"))  # no GPU here: the host

    def test_host_state_round_trip(self):
        snap = Snapshot()
        snap.take(3, 0, 1, {"m": {"w": torch.arange(6.0).view(2, 3)}})
        layout = snap.unpack()
        got = snap.tensor(layout, layout["trees"]["m"]["w"])
        self.assertEqual(got.device, torch.device("cpu"))
        self.assertTrue(torch.equal(got, torch.arange(6.0).view(2, 3)))


    def test_snapshot_taken_across_an_abort_is_not_complete(self):
        from muster_rank.fence import Fence
        fence = Fence()

        class Aborting(dict):
            """A state_dict whose tensors are read while the park watch aborts."""
            def items(self):
                fence.abort()
                return super().items()
        snap = Snapshot()
        snap.take(3, 0, 1, {"m": {"w": torch.ones(2)}}, fence=fence)
        self.assertTrue(snap.complete)
        snap.take(4, 0, 1, {"m": Aborting(w=torch.ones(2))}, fence=fence)
        self.assertFalse(snap.complete)


if __name__ == "__main__":
    unittest.main()
