"""What the client says: a line on stderr, and the phases of a heal for benchmarks."""

import os
import sys
import time


def log(msg: str) -> None:
    """"muster_rank: msg" on stderr; never raises."""
    try:
        sys.stderr.write("muster_rank: %s\n" % msg)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def trace(phase: str) -> None:
    """Appends "WALLTIME PID PHASE" to the file MUSTER_RANK_TRACE names, when
    it names one: the phases of a heal, for benchmarks (tests/bench)."""
    path = os.environ.get("MUSTER_RANK_TRACE")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, ("%.6f %d %s\n" % (time.time(), os.getpid(), phase)).encode())
        finally:
            os.close(fd)
    except OSError:
        pass
