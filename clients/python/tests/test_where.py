"""muster_rank.where on synthetic frames: the program's innermost frame, and the collective it waits in."""

import sys
import time
import unittest
from types import SimpleNamespace

from muster_rank import where as w

LIB, PKGS = "/usr/lib/python3.11", "/venv/lib/python3.11/site-packages"


def stack(*frames):
    """The innermost frame of a chain given outermost first: (file, line, function) each."""
    frame = None
    for filename, line, name in frames:
        frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=filename, co_name=name), f_lineno=line,
                                f_back=frame)
    return frame


class WhereTest(unittest.TestCase):
    def setUp(self):
        self.kinds = w.Kinds([LIB], [PKGS])

    def test_kinds(self):
        k = self.kinds.kind
        self.assertEqual(k("/home/u/train.py"), (w.PROGRAM, "train.py"))
        self.assertEqual(k(LIB + "/threading.py"), (w.LIB, "threading.py"))
        self.assertEqual(k("<frozen runpy>"), (w.LIB, "<frozen runpy>"))
        self.assertEqual(k(PKGS + "/torch/distributed/distributed_c10d.py"), (w.COMMS, "distributed_c10d.py"))
        self.assertEqual(k(PKGS + "/torch/nn/modules/module.py"), (w.LIB, "module.py"))
        self.assertEqual(k(PKGS + "/deepspeed/comm/__init__.py"), (w.COMMS, "deepspeed/comm/__init__.py"))
        self.assertEqual(k(PKGS + "/mylib/model.py"), (w.PROGRAM, "model.py"))  # an installed program is the program's

    def test_site_packages_inside_the_standard_library(self):
        k = w.Kinds([LIB], [LIB + "/site-packages"]).kind
        self.assertEqual(k(LIB + "/site-packages/mypkg/x.py"), (w.PROGRAM, "x.py"))
        self.assertEqual(k(LIB + "/site-packages/numpy/core.py"), (w.LIB, "core.py"))

    def test_program_frame(self):
        f = stack(("/home/u/train.py", 120, "main"), ("/home/u/train.py", 88, "step"),
                  (PKGS + "/torch/nn/modules/module.py", 1500, "_call_impl"), (LIB + "/threading.py", 320, "wait"))
        self.assertEqual(w.locate(f, self.kinds), ("train.py:88 in step", None))

    def test_waiting_in_a_collective(self):
        f = stack(("/home/u/train.py", 88, "step"),
                  (PKGS + "/torch/distributed/c10d_logger.py", 81, "wrapper"),
                  (PKGS + "/torch/distributed/distributed_c10d.py", 2500, "all_reduce"),
                  (PKGS + "/torch/distributed/distributed_c10d.py", 900, "_wait"))
        self.assertEqual(w.locate(f, self.kinds), ("train.py:88 in step", "all_reduce (distributed_c10d.py)"))

    def test_backward_pass(self):
        f = stack(("/home/u/train.py", 90, "step"), (PKGS + "/torch/_tensor.py", 600, "backward"),
                  (PKGS + "/torch/autograd/__init__.py", 300, "_engine_run_backward"))
        self.assertEqual(w.locate(f, self.kinds)[1], "backward (_tensor.py)")

    def test_only_library_frames(self):
        f = stack((LIB + "/runpy.py", 1, "_run_module_as_main"), (LIB + "/threading.py", 2, "wait"))
        self.assertEqual(w.locate(f, self.kinds), (None, None))
        self.assertEqual(w.locate(None, self.kinds), (None, None))

    def test_long_names_are_cut(self):
        f = stack(("/home/u/train.py", 1, "f" * 400))
        self.assertEqual(len(w.locate(f, self.kinds)[0]), w.WHERE_MAX)
        f = stack(("/home/u/train.py", 1, "step"), (PKGS + "/torch/distributed/distributed_c10d.py", 1, "g" * 400))
        self.assertEqual(len(w.locate(f, self.kinds)[1]), w.WAITING_MAX)

    def test_deep_stack_is_bounded(self):
        f = stack(("/home/u/train.py", 1, "main"), *[(LIB + "/x.py", i, "r") for i in range(300)])
        self.assertEqual(w.locate(f, self.kinds), (None, None))

    def test_gpu_sync_in_torch_cuda(self):
        """torch.cuda.synchronize (the device's, a Stream's, an Event's) has a Python frame of its own."""
        f = stack(("/home/u/train.py", 91, "step"), (PKGS + "/torch/cuda/__init__.py", 1040, "synchronize"))
        self.assertEqual(w.locate(f, self.kinds), ("train.py:91 in step", "gpu (synchronize at train.py:91)"))
        f = stack(("/home/u/train.py", 95, "step"), (PKGS + "/torch/cuda/streams.py", 224, "synchronize"))
        self.assertEqual(w.locate(f, self.kinds)[1], "gpu (synchronize at train.py:95)")
        f = stack(("/home/u/train.py", 95, "step"), (PKGS + "/torch/cuda/memory.py", 224, "empty_cache"))
        self.assertEqual(w.locate(f, self.kinds)[1], None)  # not a sync

    def test_gpu_sync_in_native_code(self):
        """loss.item() and the like block in native code: the program's frame is the innermost one,
        and what it calls is read from its bytecode."""
        import _thread
        import threading

        class Tensor:
            pass
        lock = _thread.allocate_lock()
        lock.acquire()
        loss, work = Tensor(), Tensor()
        loss.item = loss.read = lock.acquire  # native, blocking, named as torch's are
        work.wait = lock.acquire
        here = w.Kinds([LIB], [PKGS])  # this file is the program's

        def blocked(body):
            t = threading.Thread(target=body, daemon=True)
            t.start()
            for _ in range(100):  # until it is inside the call (a call with arguments: 1 s)
                f = sys._current_frames().get(t.ident)
                if f is not None and w.calling(f):
                    break
                time.sleep(0.01)
            got = w.locate(sys._current_frames().get(t.ident), here)
            lock.release()  # the thread's acquire takes it: locked again for the next call
            t.join(5)
            return got

        def item():
            return loss.item()

        def wait():
            work.wait()

        def read():
            loss.read()

        def with_argument():
            loss.item(True)

        where, waiting = blocked(item)
        self.assertRegex(where, r"^test_where\.py:\d+ in item$")
        self.assertEqual(waiting, "gpu (loss.item at %s)" % where[:where.index(" in ")])
        self.assertRegex(blocked(wait)[1], r"^gpu \(work\.wait at test_where\.py:\d+\)$")
        self.assertEqual(blocked(read)[1], None)  # blocked, but not on the device
        self.assertEqual(blocked(with_argument)[1], None)  # a call with arguments is not read

    def test_this_process(self):
        import threading
        self.assertEqual(len(w.where(threading.get_ident())), 2)
        self.assertEqual(w.where(-1), (None, None))


if __name__ == "__main__":
    unittest.main()
