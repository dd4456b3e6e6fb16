"""muster_rank.link: a Rank against a fake agent, the other end of a socketpair."""

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
import unittest
from unittest import mock

from muster_rank import link, wire


class FakeAgent:
    """The agent's end of a rank's control socket: sends frames, reads heartbeats."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(5.0)
        self.decoder = wire.Decoder()
        self.frames = []

    def send(self, mtype, payload):
        self.sock.sendall(wire.encode(mtype, payload))

    def next_heartbeat(self, pred=lambda entry: True, timeout=5.0):
        """The rank entry of the first HEARTBEAT (from now on) that pred accepts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.frames:
                mtype, payload = self.frames.pop(0)
                if mtype == wire.HEARTBEAT:
                    msg = wire.decode(payload)
                    entry = dict(msg["ranks"][0], generation=msg["generation"], seq=msg["seq"])
                    if pred(entry):
                        return entry
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError("the rank closed its socket")
            self.frames += self.decoder.feed(data)
        raise AssertionError("no such heartbeat within %.1f s" % timeout)

    def next_frame(self, mtype, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, (t, payload) in enumerate(self.frames):
                if t == mtype:
                    del self.frames[i]
                    return wire.decode(payload)
            self.frames += self.decoder.feed(self.sock.recv(65536))
        raise AssertionError("no frame of type %d" % mtype)


def until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def assign(generation, slots, **more):
    return dict({"generation": generation, "world_size": len(slots), "master_addr": "127.0.0.1",
                 "master_port": 29500, "ranks": [{"rank": r, "local_rank": lr} for r, lr in slots]}, **more)


class LinkTest(unittest.TestCase):
    def setUp(self):
        a, b = socket.socketpair()
        self.agent = FakeAgent(a)
        with mock.patch.dict(os.environ, {"LOCAL_RANK": "1"}):
            self.rank = link.Rank(b, 3, 5)
        self.stderr = io.StringIO()
        redirect = contextlib.redirect_stderr(self.stderr)
        redirect.__enter__()
        self.addCleanup(redirect.__exit__, None, None, None)

    def tearDown(self):
        self.rank.close()
        self.agent.sock.close()

    def test_beat_reaches_the_agent(self):
        self.rank.total_steps = 100
        self.rank.beat(7, loss=1.5, tokens_per_s=-3, comm_frac=2.0)
        e = self.agent.next_heartbeat()
        self.assertEqual((e["generation"], e["rank"], e["step"], e["loss"], e["state"]), (3, 5, 7, 1.5, "running"))
        self.assertEqual((e["tokens_per_s"], e["comm_frac"], e["total_steps"]), (0.0, 1.0, 100))
        self.assertNotIn("rejoin", e)

    def test_latest_beat_wins_the_rate_limit(self):
        for step in range(1, 200):
            self.rank.beat(step, loss=float("nan"))
        e = self.agent.next_heartbeat(lambda e: e["step"] == 199)
        self.assertIsNone(e["loss"])

    def test_keepalive_while_quiet(self):
        self.rank.beat(1)
        first = self.agent.next_heartbeat()
        again = self.agent.next_heartbeat(timeout=3 * link.KEEPALIVE_INTERVAL)
        self.assertEqual(again["step"], 1)
        self.assertGreater(again["seq"], first["seq"])

    def test_bad_steps_raise(self):
        with self.assertRaises(ValueError):
            self.rank.beat(-1)
        with self.assertRaises(ValueError):
            self.rank.tokens_per_step = float("inf")

    def test_auto_step_yields_to_the_program(self):
        self.rank.auto_step(4)
        self.assertEqual(self.agent.next_heartbeat()["step"], 4)
        self.rank.beat(10)
        self.rank.auto_step(11)
        self.assertEqual(self.agent.next_heartbeat(lambda e: e["step"] != 4)["step"], 10)
        self.assertEqual(self.agent.next_heartbeat()["step"], 10)  # the keepalive: 11 was not taken

    def test_commands(self):
        self.agent.send(wire.COMMAND, {"action": "checkpoint"})
        self.assertTrue(until(lambda: self.rank.checkpoint_requested()))
        self.assertFalse(self.rank.checkpoint_requested())
        self.agent.send(wire.COMMAND, {"action": "yield", "generation": 2})
        self.agent.send(wire.COMMAND, {"action": "yield", "generation": 3})
        self.assertTrue(until(lambda: self.rank.yield_asked(3)))
        self.assertFalse(self.rank.stop_requested)
        self.agent.send(wire.COMMAND, {"action": "stop"})
        self.assertTrue(until(lambda: self.rank.stop_requested))

    def test_park_ends_the_generation(self):
        self.assertFalse(self.rank.over(3))
        self.assertFalse(self.rank.wait_over(3, 0.05))
        self.agent.send(wire.COMMAND, {"action": "park", "generation": 3})  # names the generation being formed
        self.assertFalse(self.rank.wait_over(3, 0.2))
        self.agent.send(wire.COMMAND, {"action": "park", "generation": 4})
        self.assertTrue(self.rank.wait_over(3, 5.0))
        self.assertTrue(self.rank.over(3))
        self.assertFalse(self.rank.over(4))
        self.assertEqual(self.rank.generation, 3)  # a park alone takes up nothing

    def test_newer_assign_taken_up_in_place(self):
        self.agent.send(wire.ASSIGN, assign(3, [(5, 1)]))
        self.assertTrue(until(lambda: self.rank.assignment is not None))
        self.assertIsNone(self.rank.wait_generation(3, 0.05))
        self.rank.rejoin_in_place()
        self.rank.set_restored("memory", 40)
        self.agent.send(wire.ASSIGN, assign(4, [(0, 0), (2, 1)]))  # its local rank 1 is rank 2 there
        got = self.rank.wait_generation(3, 5.0)
        self.assertIsNotNone(got)
        msg, generation, rank = got
        self.assertEqual((msg["world_size"], generation, rank), (2, 4, 2))
        self.assertTrue(self.rank.over(3))
        self.rank.beat(1)
        e = self.agent.next_heartbeat()
        self.assertEqual((e["generation"], e["rank"], e["rejoin"]), (4, 2, True))
        self.assertNotIn("restore_from", e)  # a new generation's state is not known yet

    def test_assign_without_its_slot_is_not_taken_up(self):
        self.rank.rejoin_in_place()
        self.agent.send(wire.ASSIGN, assign(4, [(0, 0)]))
        self.assertIsNone(self.rank.wait_generation(3, 0.2))
        self.assertEqual(self.rank.generation, 3)

    def test_heartbeat_says_restored_and_yielded(self):
        self.rank.set_restored("disk", 30)
        self.rank.beat(30)
        self.agent.next_heartbeat()
        self.rank.left_for_grow()
        e = self.agent.next_heartbeat(lambda e: e.get("yielded"))
        self.assertEqual((e["restore_from"], e["restore_step"]), ("disk", 30))

    def test_heartbeat_carries_the_time_split(self):
        self.assertIsNone(self.rank.current_step())
        self.rank.beat(12)
        self.assertEqual(self.rank.current_step(), 12)
        self.assertNotIn("split_s", self.agent.next_heartbeat())
        split = {"split_s": 1.25, "split_steps": 10, "compute_frac": 0.5, "collective_frac": 0.25,
                 "gpu_frac": 0.125, "data_frac": 0.125}
        self.rank.set_split(split)
        e = self.agent.next_heartbeat(lambda e: "split_s" in e)
        self.assertEqual({k: e[k] for k in split}, split)
        again = self.agent.next_heartbeat(timeout=3 * link.KEEPALIVE_INTERVAL)  # every keepalive repeats it
        self.assertEqual(again["split_s"], 1.25)

    def test_unique_id(self):
        uid = bytes(range(128))
        self.agent.send(wire.UNIQUE_ID, {"generation": 2, "id": (b"\x01" * 128).hex()})  # an older one
        self.assertIsNone(self.rank.unique_id(timeout=0.05))
        self.agent.send(wire.UNIQUE_ID, {"generation": 3, "id": uid.hex()})
        self.assertEqual(self.rank.unique_id(timeout=5.0), uid)
        self.assertEqual(self.rank.unique_id(mine=uid, timeout=1.0), uid)
        self.assertEqual(self.agent.next_frame(wire.UNIQUE_ID), {"generation": 3, "id": uid.hex()})
        with self.assertRaises(ValueError):
            self.rank.unique_id(mine=b"short")

    def test_agent_gone(self):
        self.agent.sock.close()
        self.assertTrue(until(lambda: not self.rank.active))
        self.assertTrue(self.rank.stop_requested)
        self.assertFalse(self.rank.wait_over(3, 1.0))
        self.assertIsNone(self.rank.wait_generation(3, 1.0))
        self.rank.beat(1)  # does nothing, raises nothing
        self.assertIn("the agent closed the control socket", self.stderr.getvalue())

    def test_frame_it_does_not_speak(self):
        self.agent.sock.sendall(wire.HEADER.pack(2, wire.VERSION + 1, wire.COMMAND) + b"{}")
        self.assertTrue(until(lambda: not self.rank.active))
        self.assertFalse(self.rank.stop_requested)  # the agent is not gone: the rank just stops speaking
        self.assertIn("does not speak", self.stderr.getvalue())

    def test_junk_payloads_are_skipped(self):
        self.agent.sock.sendall(wire.HEADER.pack(3, wire.VERSION, wire.COMMAND) + b"\xff\xfe!")
        self.agent.send(wire.COMMAND, ["not", "a", "dict"])
        self.agent.send(wire.COMMAND, {"action": "park", "generation": "x"})
        self.agent.send(wire.COMMAND, {"action": "stop"})
        self.assertTrue(until(lambda: self.rank.stop_requested))
        self.assertTrue(self.rank.active)


class ConnectTest(unittest.TestCase):
    def test_outside_muster_is_inactive(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            r = link._open()
        self.assertFalse(r.active)
        r.beat(1)
        self.assertIsNone(r.unique_id(timeout=0))
        self.assertFalse(r.wait_over(1, 0))

    def test_bad_environment_is_inactive(self):
        with mock.patch.dict(os.environ, {"MUSTER_CTL_FD": "x", "RANK": "0", "MUSTER_GENERATION": "1"}, clear=True), \
                contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertFalse(link._open().active)
        self.assertIn("MUSTER_CTL_FD", err.getvalue())

    def test_not_a_socket_is_inactive(self):
        r, w = os.pipe()
        try:
            with mock.patch.dict(os.environ, {"MUSTER_CTL_FD": str(r), "RANK": "0", "MUSTER_GENERATION": "1"}), \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                self.assertFalse(link.claim())
                self.assertNotIn("MUSTER_CTL_FD", os.environ)
                self.assertFalse(link._open().active)
            self.assertIn("not a socket", err.getvalue())
        finally:
            os.close(r)
            os.close(w)

    def test_claim_hides_the_fd_from_children(self):
        a, b = socket.socketpair()
        fd = os.dup(b.fileno())
        b.close()
        try:
            with mock.patch.dict(os.environ, {"MUSTER_CTL_FD": str(fd), "RANK": "0", "MUSTER_GENERATION": "1"}):
                self.assertTrue(link.claim())
                self.assertNotIn("MUSTER_CTL_FD", os.environ)
                self.assertFalse(os.get_inheritable(fd))
                out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('MUSTER_CTL_FD'))"],
                                     capture_output=True, text=True, check=True).stdout
                self.assertEqual(out.strip(), "None")
                pid = os.fork()
                if pid == 0:  # a forked worker holds the memory, not the right to the socket
                    os._exit(0 if not link.claim() and not link._open().active else 1)
                self.assertEqual(os.waitpid(pid, 0)[1], 0)
                r = link._open()
                self.assertTrue(r.active)
                r.close()
        finally:
            a.close()

    def test_takes_over_the_socket(self):
        a, b = socket.socketpair()
        fd = os.dup(b.fileno())
        b.close()
        with mock.patch.dict(os.environ, {"MUSTER_CTL_FD": str(fd), "RANK": "2", "MUSTER_GENERATION": "9"}):
            r = link._open()
            self.assertNotIn("MUSTER_CTL_FD", os.environ)
        try:
            self.assertEqual((r.active, r.rank, r.generation), (True, 2, 9))
            r.beat(1)
            self.assertEqual(FakeAgent(a).next_heartbeat()["generation"], 9)
        finally:
            r.close()
            a.close()


if __name__ == "__main__":
    unittest.main()
