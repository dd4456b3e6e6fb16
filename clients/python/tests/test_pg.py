"""What Elastic asks of torch for groups it aborts (muster_rank.pg):
the non-blocking NCCL options (with torch's own classes; no GPU needed to
make them), which backends get them, and the post-abort device wait with
its deadline, against fake syncs (no CUDA needed); and that Elastic forms
its groups with them (a fake torch.distributed that records the call)."""

import datetime
import os
import threading
import time
import types
import unittest
from unittest import mock

from muster_rank import pg
from muster_rank.elastic import Elastic

try:
    import torch.distributed as dist
except ImportError:
    dist = None


class NcclOptionsTest(unittest.TestCase):
    def test_torch_nccl(self):
        for name in ("nccl", "NCCL", "cpu:gloo,cuda:nccl", "cuda:nccl"):
            self.assertTrue(pg.torch_nccl(name), name)
        for name in ("gloo", "strict_nccl", "cpu:gloo", "cpu:gloo,cuda:strict_nccl"):
            self.assertFalse(pg.torch_nccl(name), name)

    def test_non_blocking_options(self):
        if dist is None or not dist.is_nccl_available():
            self.skipTest("torch without NCCL")
        opts = pg.nccl_options(dist, "nccl")
        self.assertIsInstance(opts, dist.ProcessGroupNCCL.Options)
        self.assertEqual(opts.config.blocking, 0)
        self.assertFalse(opts.is_high_priority_stream)
        self.assertEqual(opts._timeout, dist.distributed_c10d._get_default_timeout("nccl"))
        five = datetime.timedelta(seconds=5)
        self.assertEqual(pg.nccl_options(dist, "cpu:gloo,cuda:nccl", five)._timeout, five)

    def test_no_options_off_torch_nccl(self):
        # The strict stand-in and gloo form their groups as before; a torch
        # without the options (or without NCCL) forms NCCL groups with its defaults.
        self.assertIsNone(pg.nccl_options(dist, "gloo"))
        self.assertIsNone(pg.nccl_options(dist, "strict_nccl"))

        class NoOptions:
            class distributed_c10d:
                @staticmethod
                def is_nccl_available():
                    return True

                class ProcessGroupNCCL:
                    pass

        self.assertIsNone(pg.nccl_options(NoOptions, "nccl"))


class FormDist:
    """torch.distributed as Elastic._join uses it: NCCL's classes are torch's, the group is only recorded."""

    def __init__(self):
        c10d = dist.distributed_c10d
        self.distributed_c10d = types.SimpleNamespace(is_nccl_available=c10d.is_nccl_available,
                                                      ProcessGroupNCCL=c10d.ProcessGroupNCCL,
                                                      _get_default_timeout=c10d._get_default_timeout)
        self.formed = []

    def is_initialized(self) -> bool:
        return False

    def init_process_group(self, backend, **kw) -> None:
        self.formed.append((backend, kw))


class ElasticFormsTest(unittest.TestCase):
    def form(self, backend: str) -> dict:
        if dist is None or not dist.is_nccl_available():
            self.skipTest("torch without NCCL")
        link = types.SimpleNamespace(active=False, cond=threading.Condition(), generation=1)
        fake = FormDist()
        with mock.patch.dict(os.environ, {"RANK": "0"}):
            Elastic(None, None, backend=backend, link=link)._join(fake, None)
            env = dict(os.environ)
        self.assertEqual([b for b, _ in fake.formed], [backend])
        return fake.formed[0][1], env

    def test_torch_nccl_group_is_non_blocking(self):
        kw, env = self.form("nccl")
        self.assertEqual(kw["pg_options"].config.blocking, 0)
        self.assertEqual(env["TORCH_NCCL_RETHROW_CUDA_ERRORS"], "0")

    def test_others_get_no_options(self):
        for backend in ("gloo", "strict_nccl"):
            kw, _ = self.form(backend)
            self.assertNotIn("pg_options", kw, backend)


class DeviceWaitTest(unittest.TestCase):
    def test_nothing_on_a_device(self):
        self.assertIsNone(pg.device_wait(None, 0.01))

    def test_drained(self):
        calls = []
        self.assertIsNone(pg.device_wait(lambda: calls.append(1), 5.0))
        self.assertEqual(calls, [1])

    def test_past_the_deadline(self):
        release = threading.Event()
        started = time.monotonic()
        why = pg.device_wait(lambda: release.wait(10.0), 0.2)
        took = time.monotonic() - started
        release.set()  # the fake's thread ends
        self.assertIn("did not finish its queued work within 0.2 s", why or "")
        self.assertLess(took, 5.0)
        self.assertGreaterEqual(took, 0.2)

    def test_context_lost(self):
        def sync():
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        why = pg.device_wait(sync, 5.0)
        self.assertEqual(why, "the device failed after the abort, its CUDA context is lost "
                              "(CUDA error: an illegal memory access was encountered)")

    def test_no_cuda_initialised_no_wait(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not importable")
        if torch.cuda.is_initialized():
            self.skipTest("CUDA is initialised in this process")
        self.assertIsNone(pg.cuda_sync())
        self.assertFalse(torch.cuda.is_initialized())  # asking did not initialise it


if __name__ == "__main__":
    unittest.main()
