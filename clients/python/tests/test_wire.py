"""muster_rank.wire: frames to bytes and back, whatever pieces the bytes come in."""

import json
import unittest

from muster_rank import wire


class WireTest(unittest.TestCase):
    def test_frame_layout(self):
        frame = wire.encode(wire.HEARTBEAT, {"generation": 3, "seq": 1})
        length, version, mtype = wire.HEADER.unpack_from(frame)
        self.assertEqual((version, mtype), (wire.VERSION, wire.HEARTBEAT))
        self.assertEqual(frame[wire.HEADER.size:], b'{"generation":3,"seq":1}')
        self.assertEqual(length, len(frame) - wire.HEADER.size)

    def test_nan_is_refused(self):
        with self.assertRaises(ValueError):
            wire.encode(wire.HEARTBEAT, {"loss": float("nan")})

    def test_frames_split_at_every_byte(self):
        stream = wire.encode(wire.ASSIGN, {"generation": 2, "ranks": []}) + wire.encode(wire.COMMAND, {"action": "stop"})
        for cut in range(len(stream) + 1):
            d = wire.Decoder()
            got = d.feed(stream[:cut]) + d.feed(stream[cut:])
            self.assertEqual([(t, wire.decode(p)) for t, p in got],
                             [(wire.ASSIGN, {"generation": 2, "ranks": []}), (wire.COMMAND, {"action": "stop"})],
                             "cut at byte %d" % cut)

    def test_byte_by_byte(self):
        stream = b"".join(wire.encode(wire.UNIQUE_ID, {"i": i}) for i in range(5))
        d = wire.Decoder()
        got = [f for i in range(len(stream)) for f in d.feed(stream[i:i + 1])]
        self.assertEqual([wire.decode(p)["i"] for _, p in got], list(range(5)))

    def test_empty_payload(self):
        self.assertEqual(wire.Decoder().feed(wire.HEADER.pack(0, wire.VERSION, 99)), [(99, b"")])

    def test_other_version_is_an_error(self):
        with self.assertRaises(wire.FrameError):
            wire.Decoder().feed(wire.HEADER.pack(2, wire.VERSION + 1, wire.COMMAND) + b"{}")

    def test_oversized_frame_is_an_error_at_its_header(self):
        with self.assertRaises(wire.FrameError):
            wire.Decoder().feed(wire.HEADER.pack(wire.MAX_PAYLOAD + 1, wire.VERSION, wire.COMMAND))

    def test_largest_frame_passes(self):
        body = json.dumps({"pad": "x" * (wire.MAX_PAYLOAD - 11)}).encode()
        self.assertEqual(len(body), wire.MAX_PAYLOAD)
        frames = wire.Decoder().feed(wire.HEADER.pack(len(body), wire.VERSION, wire.COMMAND) + body)
        self.assertEqual(frames, [(wire.COMMAND, body)])

    def test_payload_that_is_not_json(self):
        with self.assertRaises(ValueError):
            wire.decode(b"\xff{")


if __name__ == "__main__":
    unittest.main()
