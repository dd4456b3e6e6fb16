"""The rank's side of muster's flight recorder reading (issue 32, item 5).

The agent turns torch's flight recorder on (TORCH_FR_BUFFER_SIZE) for a
Python rank. torch 2.11 records gloo's collectives as NCCL's: each entry has
the process group's `collective_seq_id`, the op (`profiling_name`,
"gloo:all_reduce") and the group ([name, desc]); `pg_status` keeps each
group's last enqueued and last completed numbers. A dump is
torch._C._distributed_c10d._dump_fr_trace_json(), which may be called from
any thread while the main thread waits inside a collective.

`arm()` makes a FIFO MUSTER_RANK_DIR/fr-PID.fifo and a daemon thread that
blocks reading it. On a suspected hang the agent writes a byte there; the
thread reads the recorder and writes `summary()` of it to fr-PID.txt
(through a rename, so the agent never reads half of it): one line per
process group, `PG DESC ENTERED COMPLETED [SEQ:OP ...]`, the grammar of
common/flight.h, where musterd compares the ranks' lines. The thread costs
nothing while it waits; the recorder's cost per collective is measured by
tests/bench/bench_flight.py.
"""

import json
import os
import re
import sys
import threading
from typing import Optional

MAX_OPS = 4        # the last collectives per group (common/flight.h: FLIGHT_MAX_OPS)
MAX_PGS = 8        # process groups (FLIGHT_MAX_PGS)
MAX_TEXT = 2048    # bytes (FLIGHT_TEXT_MAX)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,31}\Z")
_OP = re.compile(r"[A-Za-z0-9_]{1,23}\Z")

_armed = {"fd": None}


def _name(text) -> str:
    """A group's name or description as the summary's grammar allows: other bytes become '_'."""
    text = re.sub(r"[^A-Za-z0-9_.-]", "_", str(text))[:31]
    return text if _NAME.match(text) else "_"


def _op(profiling_name) -> str:
    """'gloo:all_reduce' -> 'all_reduce' (the backend said once is enough)."""
    op = re.sub(r"[^A-Za-z0-9_]", "_", str(profiling_name).rsplit(":", 1)[-1])[:23]
    return op if _OP.match(op) else "unknown"


def _seq(value) -> int:
    """A recorder number ('37', 37, '-1' = none) as >= 0."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return 0
    return n if 0 < n < 2**63 else 0


def summary(dump: dict) -> str:
    """The summary lines of one flight recorder dump (the dict of
    _dump_fr_trace_json), for every process group in its pg_status."""
    entries = [e for e in dump.get("entries", []) if isinstance(e, dict) and not e.get("is_p2p")]
    groups = {}  # pg_id (as pg_status names it) -> (name, desc, {seq: op})
    for e in entries:
        pg = e.get("process_group") or ["", ""]
        key = str(e.get("pg_id", ""))
        name, desc, ops = groups.setdefault(key, (_name(pg[0]), _name(pg[1] if len(pg) > 1 else ""), {}))
        seq = _seq(e.get("collective_seq_id"))
        if seq:
            ops[seq] = _op(e.get("profiling_name", ""))
    lines = []
    for key, status in sorted(dump.get("pg_status", {}).items(), key=lambda kv: _seq(kv[0])):
        if len(lines) == MAX_PGS or not isinstance(status, dict):
            break
        name, desc, ops = groups.get(str(key), (_name(key), "_", {}))
        entered = _seq(status.get("last_enqueued_collective"))
        completed = min(_seq(status.get("last_completed_collective")), entered)
        last = sorted(s for s in ops if s <= entered)[-MAX_OPS:]
        line = " ".join([name, desc, str(entered), str(completed)] + ["%d:%s" % (s, ops[s]) for s in last])
        if sum(len(x) + 1 for x in lines) + len(line) > MAX_TEXT:
            break
        lines.append(line)
    return "\n".join(lines)


def _dump() -> str:
    """This process's summary; '' before torch.distributed made a group."""
    if "torch" not in sys.modules:
        return ""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
        return summary(json.loads(_dump_fr_trace_json(True, False)))
    except Exception:  # no recorder in this torch, or nothing recorded yet
        return ""


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _serve(fd: int, out: str) -> None:
    while True:
        try:
            if not os.read(fd, 64):
                return
            _write(out, _dump())
        except OSError:
            return


def arm() -> Optional[str]:
    """Starts the reading thread when the recorder is on (TORCH_FR_BUFFER_SIZE
    > 0) and the rank has a directory; returns the FIFO's path, or None."""
    size, where = os.environ.get("TORCH_FR_BUFFER_SIZE", ""), os.environ.get("MUSTER_RANK_DIR", "")
    if _armed["fd"] is not None or not (size.isascii() and size.isdigit() and int(size) > 0 and where):
        return None
    fifo = os.path.join(where, "fr-%d.fifo" % os.getpid())
    out = os.path.join(where, "fr-%d.txt" % os.getpid())
    try:
        if os.path.lexists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo, 0o600)
        # read and write: the agent's non-blocking open finds a reader, and no EOF comes between requests
        fd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    _armed["fd"] = fd
    threading.Thread(target=_serve, args=(fd, out), name="muster-flight", daemon=True).start()
    import atexit

    def _unarm():
        for p in (fifo, out):
            try:
                os.unlink(p)
            except OSError:
                pass
    atexit.register(_unarm)
    return fifo
