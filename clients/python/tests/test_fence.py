"""The fence that decides whether a step counts (muster_rank.fence), and the
choice of device and abort for a backend (muster_rank.pg). No torch needed."""

import unittest
from unittest import mock

from muster_rank import pg
from muster_rank.fence import Fence, clean_steps, no_clean_state, source_key


class Event:
    """A device event whose synchronize() may see an abort come meanwhile."""

    def __init__(self, during=None):
        self.during, self.waited = during, 0

    def synchronize(self):
        self.waited += 1
        if self.during is not None:
            self.during()


class Polled:
    """A device event done at its n-th query; during(i) runs at the i-th."""

    def __init__(self, n, during=None):
        self.n, self.during, self.queries = n, during, 0

    def query(self):
        self.queries += 1
        if self.during is not None:
            self.during(self.queries)
        return self.queries >= self.n


class FenceTest(unittest.TestCase):
    def test_host_update_without_abort_counts(self):
        f = Fence()
        f.begin()
        f.updated()
        f.abort()  # after the update: it is in the state
        self.assertTrue(f.stepped)
        self.assertTrue(f.completed())

    def test_no_update_does_not_count(self):
        f = Fence()
        f.begin()
        self.assertFalse(f.stepped)
        self.assertFalse(f.completed())

    def test_host_update_after_an_abort_counts(self):
        # done when optimizer.step() returned, from collectives that completed
        f = Fence()
        f.begin()
        f.abort()
        f.updated()
        self.assertTrue(f.stepped)
        self.assertTrue(f.completed())

    def test_device_update_waits_for_its_event(self):
        f = Fence()
        f.begin()
        ev = Event()
        f.updated(ev)
        self.assertTrue(f.completed())
        self.assertTrue(f.completed())
        self.assertEqual(ev.waited, 1)

    def test_device_update_with_an_abort_before_the_wait_is_not_waited_on(self):
        f = Fence()
        f.begin()
        ev = Event()
        f.updated(ev)
        f.abort()
        self.assertFalse(f.completed())
        self.assertEqual(ev.waited, 0)

    def test_device_update_that_an_abort_overtakes_does_not_count(self):
        f = Fence()
        f.begin()
        f.updated(Event(during=f.abort))
        self.assertFalse(f.completed())

    def test_each_step_starts_afresh(self):
        f = Fence()
        f.begin()
        f.updated(Event())
        f.abort()
        self.assertFalse(f.completed())
        f.begin()
        f.updated(Event())
        self.assertTrue(f.completed())

    def test_wait_polls_until_the_event_is_done(self):
        f = Fence()
        ev = Polled(4)
        self.assertTrue(f.wait(ev, f.epoch, poll_s=0))
        self.assertEqual(ev.queries, 4)

    def test_wait_ends_at_an_abort(self):
        f = Fence()
        at = f.epoch
        ev = Polled(1000, during=lambda i: f.abort() if i == 2 else None)
        self.assertFalse(f.wait(ev, at, poll_s=0))
        self.assertEqual(ev.queries, 2)  # not waited on after the abort

    def test_wait_for_an_event_done_after_an_abort_is_false(self):
        f = Fence()
        at = f.epoch
        f.abort()
        self.assertFalse(f.wait(Polled(1), at))

    def test_snapshot_taken_across_an_abort(self):
        f = Fence()
        at = f.epoch
        self.assertTrue(f.taken(at))
        f.abort()
        self.assertFalse(f.taken(at))


def source(ranks):
    """What _sync_state's all-reduces name: ranks = [(steps, fenced)] by rank;
    (source rank, its steps), or None where no rank holds a clean state."""
    most, world = max(s for s, _ in ranks), len(ranks)
    best = max(clean_steps(s, f) for s, f in ranks)
    if no_clean_state(most, best):
        return None
    return min(source_key(s, best, r, world, f) for r, (s, f) in enumerate(ranks)), best


class SourceTest(unittest.TestCase):
    def test_the_first_rank_with_the_most_steps(self):
        self.assertEqual(source([(20, True), (21, True), (21, True), (-1, True)]), (1, 21))
        self.assertEqual(source([(21, True), (21, True)]), (0, 21))

    def test_a_rank_whose_fence_failed_is_not_the_source_while_a_fenced_one_is(self):
        # rank 0's update of step 21 raced an abort: it counts 20 and is unfenced
        self.assertEqual(source([(20, False), (21, True), (21, True), (-1, True)]), (1, 21))
        # the same count, unfenced (interrupted in its own code): the next fenced one
        self.assertEqual(source([(21, False), (21, True), (21, True)]), (1, 21))
        self.assertEqual(source([(21, True), (21, False), (21, True)]), (0, 21))

    def test_a_fenced_rank_a_step_behind_over_unfenced_ones(self):
        # ranks 0 and 1 hold step 21 and a half-applied 22; rank 2 a clean 20: from it, step 21 redone
        self.assertEqual(source([(21, False), (21, False), (20, True)]), (2, 20))

    def test_no_clean_state_when_every_rank_that_trained_failed_its_fence(self):
        self.assertIsNone(source([(21, False), (21, False)]))
        self.assertIsNone(source([(21, False)]))
        # a fresh replacement (the seed's state) is no source for a job that trained
        self.assertIsNone(source([(-1, True), (-1, True), (5, False)]))
        # nor a clean state two steps behind
        self.assertIsNone(source([(19, True), (21, False), (21, False)]))

    def test_all_from_the_seed(self):
        self.assertEqual(source([(-1, True), (-1, True)]), (0, -1))


class BackendTest(unittest.TestCase):
    def test_aborts(self):
        for name in ("nccl", "NCCL", "cpu:gloo,cuda:nccl", "strict_nccl"):
            self.assertTrue(pg.aborts(name), name)
        for name in ("gloo", "mpi", "cpu:gloo"):
            self.assertFalse(pg.aborts(name), name)

    def test_nccl_env(self):
        off = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"}
        self.assertEqual(pg.nccl_env({}, 30.0), off)
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "1"},
                                     30.0), off)  # the healing needs them off
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "20"}, 30.0),
                         dict(off, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="61"))
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}, 30.0), off)
        # unset, or not a number: torch's default of 8 minutes, raised only for a heal window above 4
        self.assertEqual(pg.nccl_env({}, 300.0), dict(off, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="601"))
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "soon"}, 300.0),
                         dict(off, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="601"))
        self.assertEqual(pg.nccl_env({}, 239.0), off)
        kept = dict(off)
        del kept["NCCL_NVLS_ENABLE"]
        self.assertEqual(pg.nccl_env({"NCCL_NVLS_ENABLE": "1"}, 30.0), kept)  # the program's own choice stays

    def test_device(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not importable")
        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(torch.cuda, "current_device", return_value=3):
            self.assertEqual(pg.device("nccl"), torch.device("cuda", 3))
            self.assertIsNone(pg.device("gloo"))
            self.assertIsNone(pg.device("cpu:gloo,cuda:nccl"))  # host tensors go over gloo
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            self.assertIsNone(pg.device("strict_nccl"))  # no GPU: the host


if __name__ == "__main__":
    unittest.main()
