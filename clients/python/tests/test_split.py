"""muster_rank.split on synthetic frames and clocks: which kind a look at the main thread is, and the
windows of looks that become a rank's time split."""

import _thread
import sys
import threading
import time
import unittest
from types import SimpleNamespace

from muster_rank import split as s
from muster_rank import where as w

LIB, PKGS = "/usr/lib/python3.11", "/venv/lib/python3.11/site-packages"


def stack(*frames):
    """The innermost frame of a chain given outermost first: (file, line, function) each."""
    frame = None
    for filename, line, name in frames:
        frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=filename, co_name=name), f_lineno=line,
                                f_back=frame)
    return frame


PROGRAM = ("/home/u/train.py", 88, "step")


class ClassifyTest(unittest.TestCase):
    def setUp(self):
        self.kinds = w.Kinds([LIB], [PKGS])

    def kind(self, *frames):
        return s.NAMES[s.classify(stack(*frames), self.kinds)]

    def test_program_code_and_forward_are_compute(self):
        self.assertEqual(self.kind(PROGRAM), "compute")
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/nn/modules/module.py", 1500, "_call_impl"),
                                   (PKGS + "/torch/nn/modules/linear.py", 116, "forward")), "compute")
        # DDP's forward is the model's forward: compute, not a collective
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/nn/parallel/distributed.py", 1600, "forward"),
                                   (PKGS + "/torch/nn/parallel/distributed.py", 1500, "_run_ddp_forward"),
                                   (PKGS + "/torch/nn/modules/linear.py", 116, "forward")), "compute")
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/optim/adam.py", 200, "step")), "compute")
        self.assertEqual(self.kind((LIB + "/runpy.py", 1, "_run_module_as_main")), "compute")
        self.assertEqual(s.classify(None, self.kinds), s.COMPUTE)

    def test_collectives_and_backward_wait(self):
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/distributed/c10d_logger.py", 81, "wrapper"),
                                   (PKGS + "/torch/distributed/distributed_c10d.py", 2500, "all_reduce")),
                         "collective")
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/_tensor.py", 600, "backward"),
                                   (PKGS + "/torch/autograd/__init__.py", 300, "_engine_run_backward")),
                         "collective")
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/deepspeed/comm/comm.py", 10, "all_reduce")), "collective")
        # torch/autograd/ outside a backward pass (a custom Function's forward) is compute
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/autograd/function.py", 553, "apply")), "compute")

    def test_gpu_syncs(self):
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/cuda/__init__.py", 1040, "synchronize")), "gpu")
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/cuda/streams.py", 224, "synchronize")), "gpu")
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/cuda/memory.py", 224, "empty_cache")), "compute")

    def test_data_loading(self):
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/utils/data/dataloader.py", 630, "__next__"),
                                   (PKGS + "/torch/utils/data/dataloader.py", 1300, "_next_data"),
                                   (LIB + "/multiprocessing/queues.py", 113, "get"),
                                   (LIB + "/threading.py", 320, "wait")), "data")
        # a program's own dataset, called by the loader, is the program's compute
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/utils/data/dataloader.py", 630, "__next__"),
                                   ("/home/u/data.py", 10, "__getitem__")), "compute")

    def test_innermost_that_says_wins_and_depth_is_bounded(self):
        # a collective inside the data loader's fetch is a collective
        self.assertEqual(self.kind(PROGRAM, (PKGS + "/torch/utils/data/dataloader.py", 630, "__next__"),
                                   (PKGS + "/torch/distributed/distributed_c10d.py", 1, "broadcast")), "collective")
        deep = [(LIB + "/x.py", i, "r") for i in range(300)]
        self.assertEqual(self.kind((PKGS + "/torch/distributed/distributed_c10d.py", 1, "all_reduce"), *deep),
                         "compute")  # past 256 frames nothing is read

    def test_native_calls_from_the_program(self):
        """loss.item() blocks in native code with the program's frame innermost: gpu; a work handle's
        wait() there: collective; what the call is comes from the frame's bytecode."""
        class Tensor:
            pass
        lock = _thread.allocate_lock()
        lock.acquire()
        loss, work = Tensor(), Tensor()
        loss.item = work.wait = loss.read = lock.acquire
        here = w.Kinds([LIB], [PKGS])

        def blocked(body):
            t = threading.Thread(target=body, daemon=True)
            t.start()
            for _ in range(100):  # until it is inside the call (at most 1 s)
                f = sys._current_frames().get(t.ident)
                if f is not None and w.calling(f):
                    break
                time.sleep(0.01)
            got = s.NAMES[s.classify(sys._current_frames().get(t.ident), here)]
            lock.release()
            t.join(5)
            return got

        def item():
            return loss.item()

        def wait():
            work.wait()

        def read():
            loss.read()

        self.assertEqual(blocked(item), "gpu")
        self.assertEqual(blocked(wait), "collective")
        self.assertEqual(blocked(read), "compute")


class WindowTest(unittest.TestCase):
    def test_closed_at_a_step_boundary_with_its_steps(self):
        win = s.Window(1.0, 0.0, 10)
        for _ in range(6):
            win.add(s.COMPUTE)
        for _ in range(3):
            win.add(s.COLLECTIVE)
        win.add(s.DATA)
        self.assertIsNone(win.close(0.5, 14))   # not long enough
        self.assertIsNone(win.close(1.2, 10))   # long enough, but inside a step
        got = win.close(1.5, 22)
        self.assertEqual(got["split_steps"], 12)
        self.assertAlmostEqual(got["split_s"], 1.5)
        self.assertEqual((got["compute_frac"], got["collective_frac"], got["gpu_frac"], got["data_frac"]),
                         (0.6, 0.3, 0.0, 0.1))
        self.assertEqual((win.start, win.start_step, win.counts), (1.5, 22, [0, 0, 0, 0]))

    def test_without_steps_on_time_alone(self):
        win = s.Window(1.0, 0.0, None)
        win.add(s.GPU)
        got = win.close(1.0, None)
        self.assertEqual((got["split_steps"], got["gpu_frac"]), (0, 1.0))
        self.assertIsNone(win.close(2.5, None))  # no looks: nothing to say

    def test_a_long_step_closes_without_it(self):
        win = s.Window(1.0, 0.0, 5)
        win.add(s.COLLECTIVE)
        self.assertIsNone(win.close(9.0, 5))
        self.assertEqual(win.close(s.LONG_WINDOWS, 5)["split_steps"], 0)

    def test_start_up_and_a_step_back_are_no_window(self):
        # a fresh rank (a spare's, a restarted one) computes its start-up while
        # its peers wait: that window, begun before its step was known, is not
        # one of its steps; nor one across a generation that went back
        win = s.Window(1.0, 0.0, None)
        for _ in range(9):
            win.add(s.COMPUTE)
        self.assertIsNone(win.close(3.0, 40))
        self.assertEqual((win.start, win.start_step, win.counts), (3.0, 40, [0, 0, 0, 0]))
        win.add(s.COMPUTE)
        self.assertIsNone(win.close(4.5, 30))
        self.assertEqual((win.start_step, win.counts), (30, [0, 0, 0, 0]))
        win.add(s.COLLECTIVE)
        self.assertEqual(win.close(5.6, 33)["split_steps"], 3)

    def test_a_stopped_process_starts_over(self):
        win = s.Window(1.0, 0.0, 5)
        win.add(s.COMPUTE)
        self.assertIsNone(win.close(s.SPLIT_S_MAX + 1, 9))
        self.assertEqual(win.counts, [0, 0, 0, 0])


class SamplerTest(unittest.TestCase):
    def test_looks_become_published_splits(self):
        t = [0.0]
        steps = [3]
        frames = {7: stack(PROGRAM, (PKGS + "/torch/distributed/distributed_c10d.py", 1, "all_reduce"))}
        got = []
        sm = s.Sampler(7, lambda: steps[0], got.append, 100, 1.0, kinds=w.Kinds([LIB], [PKGS]),
                       frames=lambda: frames, clock=lambda: t[0])
        for i in range(150):
            t[0] = i * 0.01
            if i == 50:
                frames[7] = stack(PROGRAM)  # now computing
            if i % 10 == 0:
                steps[0] += 1
            sm.look()
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0]["split_steps"], 11)  # 3 to 14: steps at 0.0, 0.1, ... 1.0 s
        self.assertAlmostEqual(got[0]["collective_frac"], 50 / 101)
        self.assertAlmostEqual(got[0]["compute_frac"], 51 / 101)

    def test_rate_from_the_environment_is_bounded(self):
        import os
        os.environ["MUSTER_SAMPLE_HZ"] = "5000"
        try:
            self.assertEqual(s._env_number("MUSTER_SAMPLE_HZ", s.SAMPLE_HZ, 0, s.SAMPLE_HZ_MAX), s.SAMPLE_HZ)
        finally:
            del os.environ["MUSTER_SAMPLE_HZ"]


if __name__ == "__main__":
    unittest.main()
