"""The fence that decides whether a step counts (muster_rank.fence), and the
choice of device and abort for a backend (muster_rank.pg). No torch needed."""

import unittest
from unittest import mock

from muster_rank import pg
from muster_rank.fence import Fence


class Event:
    """A device event whose synchronize() may see an abort come meanwhile."""

    def __init__(self, during=None):
        self.during, self.waited = during, 0

    def synchronize(self):
        self.waited += 1
        if self.during is not None:
            self.during()


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

    def test_snapshot_taken_across_an_abort(self):
        f = Fence()
        at = f.epoch
        self.assertTrue(f.taken(at))
        f.abort()
        self.assertFalse(f.taken(at))


class BackendTest(unittest.TestCase):
    def test_aborts(self):
        for name in ("nccl", "NCCL", "cpu:gloo,cuda:nccl", "strict_nccl"):
            self.assertTrue(pg.aborts(name), name)
        for name in ("gloo", "mpi", "cpu:gloo"):
            self.assertFalse(pg.aborts(name), name)

    def test_nccl_env(self):
        self.assertEqual(pg.nccl_env({}, 30.0), {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, 30.0),
                         {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})  # the healing needs it off
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "20"}, 30.0),
                         {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "61"})
        self.assertEqual(pg.nccl_env({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600"}, 30.0),
                         {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})

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
