"""The warm spare's look for the CUDA driver (muster_spare): which mapped
libraries are the driver, and a process that loads one (a copy of a small
shared library named libcuda.so.1, loaded with ctypes in a child) is found to have
touched it while one that loads cudart-like names is not. No torch, no GPU."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import muster_spare

MAPS = """\
7f1a2b000000-7f1a2b100000 r-xp 00000000 08:01 1234   /venv/torch/lib/libtorch_cuda.so
7f1a2c000000-7f1a2c100000 r-xp 00000000 08:01 1235   /venv/nvidia/cu13/lib/libcudart.so.13
7f1a2d000000-7f1a2d100000 r-xp 00000000 08:01 1236   /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
7f1a2e000000-7f1a2e100000 rw-p 00000000 00:00 0
7ffd1000000-7ffd1021000 rw-p 00000000 00:00 0        [stack]
"""
DRIVER = "7f1a2f000000-7f1a2f100000 r-xp 00000000 08:01 1237   /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n"


class CudaDriverTest(unittest.TestCase):
    def test_not_the_driver(self):
        self.assertIsNone(muster_spare._cuda_driver(MAPS))
        self.assertIsNone(muster_spare._cuda_driver(""))

    def test_the_driver(self):
        self.assertEqual(muster_spare._cuda_driver(MAPS + DRIVER), "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06")
        self.assertEqual(muster_spare._cuda_driver("0-1 r-xp 0 0:0 1 /x/libcuda.so\n"), "/x/libcuda.so")

    def test_a_process_that_loads_it(self):
        import _ctypes
        src = getattr(_ctypes, "__file__", None)  # a small shared library at hand, loaded here anyway
        if not src or not os.path.exists(src):
            self.skipTest("no small library to stand in for the driver")
        with tempfile.TemporaryDirectory() as d:
            for name in ("libcuda.so.1", "libcudart.so.13"):
                shutil.copy(src, os.path.join(d, name))
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            look = ("import ctypes, os, sys; sys.path.insert(0, %r); import muster_spare; "
                    "before = muster_spare._cuda_touched(); ctypes.CDLL(os.path.join(%r, sys.argv[1])); "
                    "print(before, muster_spare._cuda_touched())" % (here, d))
            out = {name: subprocess.run([sys.executable, "-c", look, name], capture_output=True, text=True,
                                        timeout=30).stdout.strip() for name in ("libcuda.so.1", "libcudart.so.13")}
        self.assertEqual(out["libcuda.so.1"], "None libcuda.so.1 mapped")
        self.assertEqual(out["libcudart.so.13"], "None None")


class ReportTest(unittest.TestCase):
    def test_a_reporting_spare_exits_though_an_import_left_a_thread(self):
        """The spare that reports a CUDA import exits at once with EXIT_CUDA, though the import left a
        non-daemon thread running (sys.exit would wait for it: the agent, reading the report at the
        exit, would meanwhile hand the lingering spare a rank)."""
        import json
        import socket
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        child = ("import os, sys, threading, time; sys.path.insert(0, %r); import muster_spare; "
                 "threading.Thread(target=time.sleep, args=(60,)).start(); "
                 "muster_spare._warm_up = lambda names: ('fakecuda', 'libcuda.so.1 mapped'); "
                 "sys.exit(muster_spare.main())" % here)
        ours, theirs = socket.socketpair()
        with ours:
            env = dict(os.environ, MUSTER_SPARE_FD=str(theirs.fileno()), MUSTER_WARM_IMPORTS="fakecuda")
            p = subprocess.Popen([sys.executable, "-c", child], env=env, pass_fds=(theirs.fileno(),),
                                 stderr=subprocess.DEVNULL)
            theirs.close()
            try:
                rc = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.fail("the reporting spare was still alive 15 s after its report")
            ours.settimeout(5)
            report = ours.recv(4096)
        self.assertEqual(rc, muster_spare.EXIT_CUDA)
        self.assertEqual(json.loads(report), {"cuda_import": "fakecuda", "how": "libcuda.so.1 mapped"})


if __name__ == "__main__":
    unittest.main()
