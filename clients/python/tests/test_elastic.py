"""Elastic's state machine against a fake link, in a one-rank gloo world of
this process: a park after a failed step (the step is redone, none lost), a
newer ASSIGN between steps, a yield vote, and an error muster knows nothing
of; the same under the strict NCCL-like backend of tests/torch/strict_nccl.py,
with a lost peer whose collective only the park watch's abort ends. Skipped
without torch."""

import contextlib
import io
import os
import socket
import sys
import tempfile
import threading
import unittest
from unittest import mock

try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None

from muster_rank import elastic


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeLink:
    """The link Elastic talks to, driven by the test as the agent would drive a Rank."""

    active = True

    def __init__(self):
        self.cond = threading.Condition()
        self.generation, self.rank = 1, 0
        self.parked = 0
        self.yield_gen = 0
        self.assign = None
        self.rejoins = self.yields = 0
        self.beats, self.restored = [], []
        self.grow_on_yield = False

    # what Elastic calls
    def rejoin_in_place(self):
        self.rejoins += 1

    def own_steps(self):
        pass

    def over(self, generation):
        with self.cond:
            return self.parked > generation or self.generation > generation

    def yield_asked(self, generation):
        return self.yield_gen == generation

    def set_restored(self, source, step):
        self.restored.append((self.generation, source, step))

    def left_for_grow(self):
        self.yields += 1
        if self.grow_on_yield:
            self.next_generation()

    def beat(self, step, loss=None):
        self.beats.append((self.generation, step))

    def wait_over(self, after, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: self.over(after), timeout)

    def wait_generation(self, after, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: self.generation > after, timeout):
                return None
            return self.assign, self.generation, self.rank

    # what the test does, as the agent
    def park(self):
        with self.cond:
            self.parked = self.generation + 1
            self.cond.notify_all()

    def next_generation(self):
        with self.cond:
            self.generation += 1
            self.assign = {"generation": self.generation, "world_size": 1, "master_addr": "127.0.0.1",
                           "master_port": free_port(), "ranks": [{"rank": 0, "local_rank": 0}]}
            self.cond.notify_all()


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


@unittest.skipIf(torch is None or not dist.is_available(), "torch (with torch.distributed) is not importable")
class ElasticTest(unittest.TestCase):
    STEPS = 5
    BACKEND = "gloo"

    def setUp(self):
        env = mock.patch.dict(os.environ, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                                           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        env.start()
        self.addCleanup(env.stop)
        self.stderr = io.StringIO()
        err = contextlib.redirect_stderr(self.stderr)
        err.__enter__()
        self.addCleanup(err.__exit__, None, None, None)
        self.link = FakeLink()
        self.calls = []

    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()

    def model(self):
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def run_elastic(self, during_step=None, **kw):
        net, opt = self.model()
        kw.setdefault("backend", self.BACKEND)
        e = elastic.Elastic(net, opt, link=self.link, **kw)

        def train_step(step):
            self.calls.append((self.link.generation, step))
            x, y = batch(step)
            loss = torch.nn.functional.mse_loss(e.model(x), y)
            if during_step is not None:
                during_step(step, len(self.calls))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        e.run(train_step, self.STEPS)
        return e, net

    def reference(self):
        net, opt = self.model()
        for step in range(self.STEPS):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        return net

    def assert_trained_as_without_a_failure(self, net):
        for a, b in zip(net.parameters(), self.reference().parameters()):
            self.assertTrue(torch.allclose(a, b), (a, b))

    def test_uninterrupted(self):
        e, net = self.run_elastic()
        self.assertEqual(self.calls, [(1, s) for s in range(self.STEPS)])
        self.assertEqual(self.link.beats, [(1, s + 1) for s in range(self.STEPS)])
        self.assertEqual(self.link.rejoins, 1)
        self.assertEqual(self.link.restored, [(1, "seed", 0)])
        self.assert_trained_as_without_a_failure(net)

    def test_park_redoes_the_failed_step(self):
        def fail_once(step, n):
            if step == 2 and n == 3:  # a peer died: the collective raises, muster parks, the next ASSIGN comes
                self.link.park()
                self.link.next_generation()
                raise RuntimeError("Connection closed by peer")
        e, net = self.run_elastic(fail_once)
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (2, "memory", 2)])
        self.assertEqual(os.environ["MASTER_PORT"], str(self.link.assign["master_port"]))
        self.assertEqual(os.environ["MUSTER_GENERATION"], "2")
        self.assertEqual(e.step, self.STEPS)
        self.assert_trained_as_without_a_failure(net)

    def test_newer_assign_between_steps(self):
        def assign_at(step, n):
            if step == 1:
                self.link.next_generation()
        e, net = self.run_elastic(assign_at)
        self.assertEqual(self.calls, [(1, 0), (1, 1), (2, 2), (2, 3), (2, 4)])  # step 1 completed: none redone
        self.assertEqual(self.link.restored[-1], (2, "memory", 2))
        self.assertEqual(self.link.yields, 0)
        self.assert_trained_as_without_a_failure(net)

    def test_yield_vote(self):
        self.link.grow_on_yield = True  # musterd opens the grown generation once the ranks yielded

        def ask(step, n):
            if step == 0:
                self.link.yield_gen = 1
        e, net = self.run_elastic(ask)
        self.assertEqual(self.link.yields, 1)
        self.assertEqual(self.calls, [(1, 0), (2, 1), (2, 2), (2, 3), (2, 4)])
        self.assertEqual(self.link.restored[-1], (2, "memory", 1))
        self.assert_trained_as_without_a_failure(net)

    def test_error_muster_knows_nothing_of(self):
        def fail(step, n):
            if step == 1:
                raise RuntimeError("the program's own")
        with self.assertRaisesRegex(RuntimeError, "the program's own"):
            self.run_elastic(fail, heal_wait_s=0.05)
        self.assertEqual(self.calls, [(1, 0), (1, 1)])


STRICT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "torch")


@unittest.skipIf(torch is None or not dist.is_available() or not os.path.exists(os.path.join(STRICT, "strict_nccl.py")),
                 "torch (with torch.distributed) or tests/torch/strict_nccl.py is not there")
class ElasticStrictTest(ElasticTest):
    """Every test above under the strict NCCL-like backend, and a lost peer."""

    def setUp(self):
        super().setUp()
        if STRICT not in sys.path:
            sys.path.insert(0, STRICT)
        import strict_nccl
        self.BACKEND = strict_nccl.register()
        log = tempfile.NamedTemporaryFile(prefix="strict_nccl", delete=False)
        log.close()
        self.addCleanup(os.unlink, log.name)
        self.strict_log = log.name
        env = mock.patch.dict(os.environ, {"STRICT_NCCL_LOG": log.name})
        env.start()
        self.addCleanup(env.stop)

    def tearDown(self):
        with open(self.strict_log) as f:
            self.assertEqual(f.read(), "", "a process group was destroyed after its abort")
        super().tearDown()

    def test_newer_assign_between_steps(self):
        # The watch aborts the group as soon as the ASSIGN comes, in step 1: when
        # that is before its update, the step does not count and is redone.
        def assign_at(step, n):
            if step == 1 and n == 2:
                self.link.next_generation()
        e, net = self.run_elastic(assign_at)
        self.assertIn(self.calls, ([(1, 0), (1, 1), (2, 2), (2, 3), (2, 4)],
                                   [(1, 0), (1, 1), (2, 1), (2, 2), (2, 3), (2, 4)]))
        self.assertEqual(self.link.restored[-1], (2, "memory", self.calls[2][1]))
        self.assert_trained_as_without_a_failure(net)

    def test_lost_peer_aborted_by_the_watch(self):
        def lose_once(step, n):
            if step == 2 and n == 3:  # a peer died; its collective spins until the watch aborts it
                self.link.park()
                self.link.next_generation()
                dist.distributed_c10d._get_default_group().lose()
                dist.all_reduce(torch.zeros(1))
        e, net = self.run_elastic(lose_once)
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (2, "memory", 2)])
        self.assertIn("generation 1 is over: aborting its 1 process group(s)", self.stderr.getvalue())
        self.assertEqual(e.step, self.STEPS)
        self.assert_trained_as_without_a_failure(net)


if __name__ == "__main__":
    unittest.main()
