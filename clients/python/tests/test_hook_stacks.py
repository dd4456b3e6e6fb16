"""muster_rank.hook's stacks: the text of every thread's stack, and the thread
that writes it when a byte comes on the FIFO (the way the agent asks first;
faulthandler's signal is its fallback), run in a child process as a rank's
hook would arm it."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from muster_rank import hook

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parked_in_a_known_place(event):
    event.wait(10)


class StacksTextTest(unittest.TestCase):
    def test_every_thread_main_last_and_skip(self):
        ev = threading.Event()
        t = threading.Thread(target=parked_in_a_known_place, args=(ev,), name="parked")
        t.start()
        try:
            text = hook.stacks_text()
            skipped = hook.stacks_text(skip=t.ident)
        finally:
            ev.set()
            t.join()
        self.assertIn('"parked" (most recent call first):', text)
        self.assertIn("in parked_in_a_known_place", text)
        self.assertNotIn("in parked_in_a_known_place", skipped)
        # the main thread, innermost first, is the last part (faulthandler's current thread)
        last = text.strip().split("\n\n")[-1]
        self.assertTrue(last.startswith("Thread 0x") and '"MainThread"' in last, last)
        self.assertIn("in stacks_text", last.split("\n")[1])  # the caller's own thread, its call innermost
        self.assertIn("in test_every_thread_main_last_and_skip", last.split("\n")[2])


CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from muster_rank import hook
hook._arm_stacks()
def busy_in_python(until):
    print("armed", flush=True)  # from inside: a dump from now on shows this frame
    n = 0
    while time.monotonic() < until:
        n += 1
    return n
busy_in_python(time.monotonic() + 20)
"""


class StacksThreadTest(unittest.TestCase):
    def test_a_byte_on_the_fifo_writes_the_dump(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, MUSTER_RANK_DIR=d, MUSTER_STACKS_SIGNAL=str(int(signal.SIGRTMIN) + 5))
            p = subprocess.Popen([sys.executable, "-c", CHILD, HERE], env=env, stdout=subprocess.PIPE, text=True)
            try:
                self.assertEqual(p.stdout.readline().strip(), "armed")
                fifo, out = os.path.join(d, "stacks-%d.fifo" % p.pid), os.path.join(d, "stacks-%d.txt" % p.pid)
                self.assertTrue(os.path.exists(fifo) and os.path.exists(out))
                for _ in range(3):  # as the agent asks: truncate, then a byte
                    open(out, "w").close()
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b"s")
                    os.close(fd)
                    end = time.monotonic() + 5
                    while os.path.getsize(out) == 0 and time.monotonic() < end:
                        time.sleep(0.01)
                    with open(out) as f:
                        text = f.read()
                    self.assertIn("in busy_in_python", text)
                    self.assertNotIn("_serve_stacks", text)
                    self.assertEqual(text.count('"MainThread"'), 1)
            finally:
                p.kill()
                p.wait()
                p.stdout.close()


FORKS = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from muster_rank import hook
hook._arm_stacks()
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit runs the atexit hooks it inherited
os.waitpid(pid, 0)
where = os.environ["MUSTER_RANK_DIR"]
print(sorted(os.listdir(where)), flush=True)
"""


class StacksForkTest(unittest.TestCase):
    def test_a_forked_child_leaves_its_parents_files(self):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, MUSTER_RANK_DIR=d, MUSTER_STACKS_SIGNAL=str(int(signal.SIGRTMIN) + 5))
            out = subprocess.run([sys.executable, "-c", FORKS, HERE], env=env, stdout=subprocess.PIPE, text=True,
                                 timeout=30).stdout
            self.assertIn("stacks-", out)
            self.assertIn(".fifo", out)
            self.assertIn(".txt", out)
            self.assertEqual(os.listdir(d), [], "the parent's own exit removes them")


if __name__ == "__main__":
    unittest.main()
