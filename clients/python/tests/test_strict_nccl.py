"""The strict NCCL-like backend's own contract (tests/torch/strict_nccl.py),
which the strict Elastic tests and integration scripts rely on, checked
directly so that a lenient change to it is caught: two processes on
loopback (strict_nccl_peer.py) form a group with it, and
  (a) an all-reduce returns its work at once, incomplete and its tensor
      untouched while the peer has not joined; wait() gives the sum;
      a healthy group's destroy returns;
  (b) the peer SIGKILLed while the survivor waits in a collective on it:
      a plain gloo group's wait beside it fails, the strict one's does not
      return (2 s), not even once the group's sockets are shut as
      Elastic's park watch shuts them (pg.shut): socket shutting is not
      what ends it;
  (c) abort() from another thread ends that wait at once with a
      RuntimeError, the work's future too;
  (d) every use of the group after the abort raises;
  (e) destroy_process_group after the abort blocks, and says so in
      STRICT_NCCL_LOG.
The pair runs once for the class (every wait bounded, both processes
killed at the end); each test reads its part. Skipped without torch."""

import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
STRICT = os.path.join(HERE, "..", "..", "..", "tests", "torch")
PEER = os.path.join(HERE, "strict_nccl_peer.py")

# How long the pair may take to form (two interpreters importing torch on a loaded machine).
FORM_S = 60.0
# How long any later event may take to come.
EVENT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """One rank's process: words to its stdin, its JSON events read from its
    stdout by a thread, each awaited with a timeout; stderr kept in a file."""

    def __init__(self, rank: int, port: int, env: dict) -> None:
        self.rank = rank
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, PEER, str(rank), str(port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env, text=True)
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass  # not one of its events (a library's print)
        self.events.put({"event": "exited"})

    def tell(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def expect(self, event: str, timeout: float = EVENT_S) -> dict:
        try:
            got = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("rank %d: no %r within %.0f s%s" % (self.rank, event, timeout, self.stderr()))
        if got.get("event") != event:
            raise AssertionError("rank %d: expected %r, got %r%s" % (self.rank, event, got, self.stderr()))
        return got

    def stderr(self) -> str:
        self.err.seek(0)
        tail = self.err.read()[-3000:]
        return "; its stderr:\n" + tail if tail else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        try:
            self.proc.stdin.close()
        except OSError:
            pass  # a word it never read
        self.reader.join(5.0)  # at its stdout's end, now that it is gone
        self.proc.stdout.close()
        self.err.close()


@unittest.skipIf(torch is None or not dist.is_available() or not os.path.exists(os.path.join(STRICT, "strict_nccl.py")),
                 "torch (with torch.distributed) or tests/torch/strict_nccl.py is not there")
class StrictNcclContractTest(unittest.TestCase):
    seen: dict = {}
    broke = None  # why the pair stopped before its last event, if it did

    @classmethod
    def setUpClass(cls) -> None:
        log = tempfile.NamedTemporaryFile(prefix="strict_nccl", delete=False)
        log.close()
        cls.addClassCleanup(os.unlink, log.name)
        env = dict(os.environ, STRICT_NCCL_LOG=log.name,
                   PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), STRICT]))
        env.pop("STRICT_NCCL", None)
        port = free_port()
        cls.seen, cls.broke = {}, None
        peers = [Peer(rank, port, env) for rank in (0, 1)]
        for p in peers:
            cls.addClassCleanup(p.kill)
        survivor, victim = peers
        try:
            cls.run_pair(survivor, victim)
        except AssertionError as e:
            cls.broke = str(e)

    @classmethod
    def run_pair(cls, survivor: Peer, victim: Peer) -> None:
        def saw(peer: Peer, event: str, timeout: float = EVENT_S) -> None:
            cls.seen[(peer.rank, event)] = peer.expect(event, timeout)

        for p in (survivor, victim):
            saw(p, "formed", FORM_S)
        saw(survivor, "issued")
        victim.tell("go")
        for p in (survivor, victim):
            saw(p, "waited")
            saw(p, "healthy_destroy")
        saw(victim, "idle")
        saw(survivor, "pending")
        victim.proc.kill()
        victim.proc.wait(10)
        survivor.tell("killed")
        saw(survivor, "peer_killed")
        saw(survivor, "sockets_shut")
        survivor.tell("abort")
        saw(survivor, "aborted")
        saw(survivor, "used_after_abort")
        saw(survivor, "destroyed")

    def event(self, rank: int, name: str) -> dict:
        got = self.seen.get((rank, name))
        if got is None:
            self.fail("rank %d never got to %r: %s" % (rank, name, self.broke))
        return got

    def test_formed_with_the_strict_backend(self):
        for rank in (0, 1):
            self.assertEqual(self.event(rank, "formed")["backend"], "strict_nccl")
        self.assertGreater(self.event(0, "formed")["sockets"], 0, "init_process_group opened no socket")

    def test_work_completes_only_once_the_peer_joined_and_is_waited(self):
        issued = self.event(0, "issued")
        self.assertLess(issued["issued_s"], 1.0, "all_reduce(async_op=True) did not return at once")
        self.assertFalse(issued["completed"], "the work completed before the peer joined")
        self.assertEqual(issued["tensor"], [1.0] * 4, "the tensor changed before the work completed")
        for rank in (0, 1):
            waited = self.event(rank, "waited")
            self.assertEqual(waited["outcome"], "returned")
            self.assertTrue(waited["completed"])
            self.assertEqual(waited["tensor"], [3.0] * 4)
            self.assertEqual(waited["future"], [[3.0] * 4])

    def test_healthy_group_destroy_returns(self):
        for rank in (0, 1):
            got = self.event(rank, "healthy_destroy")
            self.assertEqual(got["outcome"], "returned")
            self.assertEqual(got["tensor"], [2.0, 2.0])

    def test_dead_peer_collective_never_completes_even_with_sockets_shut(self):
        killed = self.event(0, "peer_killed")
        self.assertTrue(killed["side"].startswith("raised"),
                        "gloo's own all-reduce beside it did not fail when the peer died: %s" % killed["side"])
        self.assertEqual(killed["strict"], "blocked", "the strict group's wait ended on a dead peer")
        shut = self.event(0, "sockets_shut")
        self.assertGreater(shut["sockets"], 0)
        self.assertEqual(shut["strict"], "blocked", "the strict group's wait ended once its sockets were shut")

    def test_abort_from_another_thread_ends_the_wait(self):
        got = self.event(0, "aborted")
        self.assertEqual(got["abort"], "returned")
        self.assertTrue(got["strict"].startswith("raised RuntimeError"), got["strict"])
        self.assertLess(got["after_s"], 2.0)
        self.assertTrue(got["future"].startswith("raised"), "the aborted work's future: %s" % got["future"])
        self.assertTrue(got["completed"])
        self.assertFalse(got["success"])

    def test_any_use_after_abort_raises(self):
        uses = self.event(0, "used_after_abort")["uses"]
        self.assertEqual(len(uses), 5)
        for name, outcome in uses.items():
            self.assertTrue(outcome.startswith("raised RuntimeError"), "%s after the abort: %s" % (name, outcome))

    def test_destroy_after_abort_blocks_and_is_logged(self):
        got = self.event(0, "destroyed")
        self.assertEqual(got["outcome"], "blocked")
        self.assertEqual(got["log"], "shutdown-after-abort %d\n" % got["pid"])


if __name__ == "__main__":
    unittest.main()
