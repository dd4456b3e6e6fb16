"""The control socket's frames, as "The rank contract" in proto/PROTOCOL.md
describes them: a header (payload length, protocol version, message type,
big-endian) and a JSON payload. Pure: bytes in, frames out; no socket."""

import json
import struct
from typing import List, Tuple

HEADER = struct.Struct(">IHH")
VERSION = 2
MAX_PAYLOAD = 256 * 1024
ASSIGN, UNIQUE_ID, HEARTBEAT, COMMAND = 6, 7, 8, 10
U64_MAX = 2**53 - 1  # the largest integer on the wire
UID_LEN = 128


class FrameError(ValueError):
    """The bytes hold a frame this client does not speak (another version, or too long)."""


def encode(mtype: int, payload: dict) -> bytes:
    """One frame of message type mtype with payload as compact JSON (NaN refused)."""
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return HEADER.pack(len(body), VERSION, mtype) + body


def decode(payload: bytes):
    """A frame's JSON payload as an object; raises ValueError when it is not JSON."""
    return json.loads(payload.decode("utf-8"))


class Decoder:
    """Frames out of a byte stream that arrives in pieces of any size."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[Tuple[int, bytes]]:
        """[(message type, payload)] of every frame data completes, in order;
        what is left of a frame waits for the next call. Raises FrameError at
        a header this client does not speak (the stream cannot be read on)."""
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            length, version, mtype = HEADER.unpack_from(self._buf)
            if length > MAX_PAYLOAD or version != VERSION:
                raise FrameError("version %d, %d bytes" % (version, length))
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append((mtype, bytes(self._buf[HEADER.size:end])))
            del self._buf[:end]
        return frames
