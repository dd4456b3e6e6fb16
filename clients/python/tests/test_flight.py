"""muster_rank.flight: the summary of a flight recorder dump (the shape torch 2.11 writes for gloo), and the
FIFO thread that writes it when the agent asks."""

import os
import tempfile
import time
import unittest
from unittest import mock

from muster_rank import flight


def entry(seq, op, pg_id=0, pg=("0", "default_pg"), p2p=False):
    return {"collective_seq_id": seq, "profiling_name": "gloo:" + op, "pg_id": pg_id, "process_group": list(pg),
            "state": "scheduled", "retired": True, "is_p2p": p2p, "p2p_seq_id": 0}


def dump(entries, status):
    return {"version": "2.10", "entries": entries, "pg_config": {"": {"desc": "", "name": "", "ranks": "[]"}},
            "pg_status": {k: {"last_enqueued_collective": str(e), "last_completed_collective": str(c),
                              "last_started_collective": "-1"} for k, (e, c) in status.items()}}


class SummaryTest(unittest.TestCase):
    def test_last_ops_per_group(self):
        d = dump([entry(i, "all_reduce") for i in range(1, 37)] + [entry(37, "barrier"),
                  entry(1, "all_gather", 1, ("1", "undefined"))], {"0": (37, 36), "1": (1, 1)})
        self.assertEqual(flight.summary(d), "0 default_pg 37 36 34:all_reduce 35:all_reduce 36:all_reduce 37:barrier\n"
                                            "1 undefined 1 1 1:all_gather")

    def test_nothing_yet(self):
        self.assertEqual(flight.summary({}), "")
        self.assertEqual(flight.summary(dump([], {"0": (-1, -1)})), "0 _ 0 0")

    def test_hostile_names_and_numbers_stay_in_the_grammar(self):
        d = dump([entry(3, "all reduce\n", pg=("a b", "x" * 80)), entry("x", "broadcast"),
                  entry(2, "send", p2p=True)], {"0": ("3", "9")})
        line = flight.summary(d)
        self.assertEqual(line, "a_b " + "x" * 31 + " 3 3 3:all_reduce_")

    def test_bounded(self):
        d = dump([entry(1, "x" * 100, pg_id=i, pg=(str(i), "d" * 40)) for i in range(20)],
                 {str(i): (1, 0) for i in range(20)})
        text = flight.summary(d)
        self.assertEqual(len(text.split("\n")), flight.MAX_PGS)
        self.assertLessEqual(len(text), flight.MAX_TEXT)


class ArmTest(unittest.TestCase):
    def test_a_byte_in_the_fifo_writes_the_summary(self):
        with tempfile.TemporaryDirectory() as where:
            env = {"TORCH_FR_BUFFER_SIZE": "2000", "MUSTER_RANK_DIR": where}
            with mock.patch.dict(os.environ, env), mock.patch.object(flight, "_armed", {"fd": None}), \
                    mock.patch.object(flight, "_dump", lambda: "0 default_pg 5 4 5:all_reduce"):
                fifo = flight.arm()
                self.assertEqual(fifo, os.path.join(where, "fr-%d.fifo" % os.getpid()))
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # as the agent does: a reader is there
                os.write(fd, b"d")
                os.close(fd)
                out = os.path.join(where, "fr-%d.txt" % os.getpid())
                deadline = time.monotonic() + 5
                while not os.path.exists(out) and time.monotonic() < deadline:
                    time.sleep(0.01)
                with open(out) as f:
                    self.assertEqual(f.read(), "0 default_pg 5 4 5:all_reduce")
                os.close(flight._armed["fd"])

    def test_off_without_a_buffer_or_a_directory(self):
        with mock.patch.object(flight, "_armed", {"fd": None}):
            for env in ({"TORCH_FR_BUFFER_SIZE": "0", "MUSTER_RANK_DIR": "/tmp"},
                        {"TORCH_FR_BUFFER_SIZE": "2000", "MUSTER_RANK_DIR": ""},
                        {"TORCH_FR_BUFFER_SIZE": "lots", "MUSTER_RANK_DIR": "/tmp"}):
                with mock.patch.dict(os.environ, env):
                    self.assertIsNone(flight.arm())


if __name__ == "__main__":
    unittest.main()
