"""Elastic's state machine against a fake link, in a one-rank gloo world of
this process: a park after a failed step (the step is redone, none lost), a
newer ASSIGN between steps, a yield vote, and an error muster knows nothing
of; the same under the strict NCCL-like backend of tests/torch/strict_nccl.py,
with a lost peer whose collective only the park watch's abort ends (and,
the control, no heal when that abort does nothing: the watch gives up), and
second losses: while the next group forms, in its state sync's votes and
in its state broadcast; the next group formed only once the device
drained. Skipped without torch."""

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

    def run_elastic(self, during_step=None, made=None, **kw):
        """Elastic over a fresh model, made(elastic) once it exists; during_step(step, calls) in each step."""
        net, opt = self.model()
        kw.setdefault("backend", self.BACKEND)
        e = elastic.Elastic(net, opt, link=self.link, **kw)
        if made is not None:
            made(e)

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

    @staticmethod
    def peer_lost_at_step_2(link):
        """A during_step that loses a peer in step 2 of generation 1: the
        generation is parked and the next one opened, and the collective on
        the lost peer spins until the watch aborts it."""
        def lose_once(step, n):
            if step == 2 and n == 3:
                link.park()
                link.next_generation()
                dist.distributed_c10d._get_default_group().lose()
                dist.all_reduce(torch.zeros(1))
        return lose_once

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

    def test_update_racing_an_abort_does_not_count(self):
        # Step 2's update is on the (emulated) device when the generation is
        # parked, while the rank waits for it: the watch aborts the group, the
        # update lands only then, half applied (strict_nccl.LateUpdate), and
        # the step must not count.
        import strict_nccl
        link = self.link
        made = []

        class ParkedWhileWaited(strict_nccl.LateUpdate):
            def synchronize(self):
                link.park()
                link.next_generation()
                super().synchronize()

        def late_at_2(step, n):
            e = made[0]
            if step == 2 and n == 3:
                e._update_event = lambda: ParkedWhileWaited(e.module.parameters(), wait_s=10.0)
            elif n == 4:
                e._update_event = lambda: None

        # The only rank failed its fence: its half-applied update is in its state (no
        # copy to go back to), so it does not go on in place: the generation restarts cold.
        with self.assertRaises(elastic.NoCleanState) as cm:
            self.run_elastic(late_at_2, made=made.append)
        self.assertIn("generation 2: no rank holds a clean state: every rank with 2 steps failed its last fence",
                      str(cm.exception))
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2)])
        self.assertEqual(self.link.beats, [(1, 1), (1, 2)])  # step 3 never counted

    def test_gradients_cut_short_by_an_abort_are_never_applied(self):
        # Step 2's gradients are still on their way (the device's reduce) when the
        # generation is parked: the first fence sees the abort and the optimizer does
        # not run, so the rank's state is step 2's whole and it heals from itself.
        link = self.link
        made = []

        class GradientsInFlight:
            def __init__(self, fence):
                self.fence, self.epoch = fence, fence.epoch
                link.park()
                link.next_generation()

            def query(self):
                return self.fence.epoch != self.epoch  # "arrive" only once the watch aborted

        def in_flight_at_2(step, n):
            e = made[0]
            if step == 2 and n == 3:
                e._grads_event = lambda: GradientsInFlight(e._fence)
            elif n == 4:
                e._grads_event = lambda: None

        e, net = self.run_elastic(in_flight_at_2, made=made.append)
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (2, "memory", 2)])
        self.assertEqual(e.step, self.STEPS)
        self.assertNotIn("failed its last fence", self.stderr.getvalue())
        self.assert_trained_as_without_a_failure(net)

    def test_lost_peer_aborted_by_the_watch(self):
        lose_once = self.peer_lost_at_step_2(self.link)
        e, net = self.run_elastic(lose_once)
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (2, "memory", 2)])
        self.assertIn("generation 1 is over: aborting its 1 process group(s)", self.stderr.getvalue())
        self.assertEqual(e.step, self.STEPS)
        self.assert_trained_as_without_a_failure(net)

    def test_lost_peer_not_healed_without_the_abort(self):
        # The control of the test above: the groups' abort made a no-op, all else
        # as there (the park watch still shuts the group's sockets, gloo's way).
        # The collective on the lost peer never ends: the rank does not heal, the
        # watch closes its connections to no avail and gives up on it, where it
        # would exit (a cold restart). Bounded here: the watch's waits shortened,
        # its exit recorded with the steps run by then, and the group aborted then.
        exits = []

        lose_once = self.peer_lost_at_step_2(self.link)

        def gone(code):
            exits.append((code, list(self.calls)))
            dist.distributed_c10d._get_default_group().abort()

        with mock.patch.object(elastic.pg, "abort", lambda dist, found: None), \
                mock.patch.object(elastic, "PARK_INTERRUPT_S", 0.2), mock.patch.object(elastic, "PARK_EXIT_S", 0.5), \
                mock.patch.object(elastic.os, "_exit", side_effect=gone):
            try:
                self.run_elastic(lose_once)
            except elastic.NoCleanState:
                pass  # after the exit that did not come: the watch had interrupted the step, no clean state
        self.assertEqual(exits, [(1, [(1, 0), (1, 1), (1, 2)])], self.stderr.getvalue())
        self.assertIn("generation 1 was parked and rank 0 has not left it", self.stderr.getvalue())
        self.assertIn("closing its connections", self.stderr.getvalue())

    def test_device_that_does_not_drain_after_the_abort(self):
        # After the watch's abort the device must finish its queued work within
        # the heal window (a fake sync here that never does): else the rank exits.
        release = threading.Event()
        self.addCleanup(release.set)
        exits = []

        lose_once = self.peer_lost_at_step_2(self.link)
        with mock.patch.object(elastic.pg, "cuda_sync", return_value=lambda: release.wait(10.0)), \
                mock.patch.object(elastic.os, "_exit", side_effect=exits.append):
            self.run_elastic(lose_once, heal_wait_s=0.3)
        self.assertEqual(exits, [1])
        self.assertIn("generation 1: rank 0 aborted its process groups, but the device did not finish its queued "
                      "work within 0.3 s of the abort: exiting, so that its slot is started again",
                      self.stderr.getvalue())

    def test_park_while_the_next_group_forms(self):
        # Step 2 fails and generation 2 comes; while its group forms (after the
        # store, before torch knows the group) generation 2 is parked too and its
        # peer is lost. The watch's abort finds no group then: the rank must abort
        # the group it formed itself, not hang in its state sync until it exits.
        link, real_init, made = self.link, dist.init_process_group, []
        exits = []

        def init(*args, **kw):
            if link.generation == 2 and not made:
                made.append(True)
                link.park()
                link.next_generation()
                with link.cond:  # the watch's abort, of no group, is done
                    link.cond.wait_for(lambda: self.e._aborted == 2, 5.0)
                real_init(*args, **kw)
                dist.distributed_c10d._get_default_group().lose()
            else:
                real_init(*args, **kw)

        def fail_once(step, n):
            if step == 2 and n == 3:
                link.park()
                link.next_generation()
                raise RuntimeError("Connection closed by peer")

        def gone(code):  # without the rank's own abort: the watch gives up on it (11 s on: bounded here)
            exits.append(code)
            dist.distributed_c10d._get_default_group().abort()

        with mock.patch.object(dist, "init_process_group", init), \
                mock.patch.object(elastic.os, "_exit", side_effect=gone):
            e, net = self.run_elastic(fail_once, made=lambda e: setattr(self, "e", e))
        self.assertEqual(exits, [], self.stderr.getvalue())
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (3, 2), (3, 3), (3, 4)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (3, "memory", 2)])
        self.assertEqual(e.step, self.STEPS)
        self.assert_trained_as_without_a_failure(net)

    def second_loss_in(self, collective):
        """Step 2 fails (generation 1 parked for 3), and generation 2 loses its
        peer too, inside its first call of dist.COLLECTIVE: the watch must abort
        it there. Returns (lost, exits, stderr, net)."""
        link, real, lost, exits = self.link, getattr(dist, collective), [], []

        def losing(*args, **kw):
            if link.generation == 2 and not lost:
                lost.append(True)
                link.park()
                link.next_generation()
                dist.distributed_c10d._get_default_group().lose()
            return real(*args, **kw)

        def fail_once(step, n):
            if step == 2 and n == 3:
                link.park()
                link.next_generation()
                raise RuntimeError("Connection closed by peer")

        def gone(code):  # without the watch's abort: it gives up on the rank (11 s on: bounded here)
            exits.append(code)
            dist.distributed_c10d._get_default_group().abort()

        with mock.patch.object(dist, collective, losing), \
                mock.patch.object(elastic.os, "_exit", side_effect=gone):
            _, net = self.run_elastic(fail_once)
        return lost, exits, self.stderr.getvalue(), net

    def test_second_loss_during_the_state_sync(self):
        # Generation 2 (after step 2's failure) loses a peer too, while its first
        # state-sync all-reduce waits on it: the watch aborts it there, and
        # generation 3 trains on from step 2, no step lost or counted twice.
        _, exits, err, net = self.second_loss_in("all_reduce")
        self.assertEqual(exits, [])
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (3, 2), (3, 3), (3, 4)])
        self.assertEqual(self.link.beats, [(1, 1), (1, 2), (3, 3), (3, 4), (3, 5)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (3, "memory", 2)])
        self.assertIn("generation 2 is over: aborting its 1 process group(s)", err)
        self.assert_trained_as_without_a_failure(net)

    def test_park_during_the_state_broadcast(self):
        # Generation 2 is parked, and its peer lost, while its state broadcast
        # runs (after the votes): the watch aborts it there; generation 3 takes
        # the state whole, from step 2, none lost or counted twice.
        lost, exits, err, net = self.second_loss_in("broadcast")
        self.assertEqual(lost, [True])
        self.assertEqual(exits, [])
        self.assertIn("generation 2 is over: aborting its 1 process group(s)", err)
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (3, 2), (3, 3), (3, 4)])
        self.assertEqual(self.link.beats, [(1, 1), (1, 2), (3, 3), (3, 4), (3, 5)])
        self.assertEqual(self.link.restored, [(1, "seed", 0), (3, "memory", 2)])
        self.assert_trained_as_without_a_failure(net)

    def test_next_group_waits_for_the_drain(self):
        # The watch's abort of generation 1 waits for the device (a fake sync of
        # 1.5 s here): generation 2's group is formed only after that, so that no
        # work of it is queued behind the drain (a sync would wait on that too).
        import time
        link, real_init, drained, formed = self.link, dist.init_process_group, [], []

        def slow_sync():
            time.sleep(1.5)
            drained.append(time.monotonic())

        def init(*args, **kw):
            formed.append((link.generation, time.monotonic()))
            real_init(*args, **kw)

        lose_once = self.peer_lost_at_step_2(link)
        with mock.patch.object(dist, "init_process_group", init), \
                mock.patch.object(elastic.pg, "cuda_sync", return_value=slow_sync):
            e, net = self.run_elastic(lose_once)
        self.assertEqual(len(drained), 1)
        self.assertEqual([g for g, _ in formed], [1, 2])
        self.assertGreaterEqual(formed[1][1], drained[0])
        self.assertEqual(self.calls, [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)])
        self.assert_trained_as_without_a_failure(net)


if __name__ == "__main__":
    unittest.main()
