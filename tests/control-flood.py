#!/usr/bin/env python3
"""Unauthenticated connections against musterd's control port, bounded in
count and time, on an address the caller gives (loopback or a namespace it
made). Never speaks the protocol: a stranger without the token.

  control-flood.py hold HOST PORT N SECONDS   keep N connections open, each
                                              re-opened as soon as it is closed
  control-flood.py churn HOST PORT SECONDS    connect and close, one after another

Prints one line: mode, connections opened, closed by the far end, seconds.
"""
import errno, resource, selectors, socket, sys, time


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, n + 64))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want - 64


def hold(host, port, n, seconds):
    n = min(n, raise_nofile(n))
    sel = selectors.DefaultSelector()
    opened = closed = 0
    end = time.monotonic() + seconds

    def open_one():
        nonlocal opened
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex((host, port))
        if rc not in (0, errno.EINPROGRESS):
            s.close()
            return False
        sel.register(s, selectors.EVENT_READ)
        opened += 1
        return True

    live = 0
    while time.monotonic() < end:
        while live < n and time.monotonic() < end:
            if not open_one():
                time.sleep(0.01)
                break
            live += 1
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data:
                continue  # a REJECT, say: read and wait for the close
            sel.unregister(s)
            s.close()
            live -= 1
            closed += 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return opened, closed


def churn(host, port, seconds):
    opened = closed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect((host, port))
            opened += 1
        except OSError:
            time.sleep(0.01)
        s.close()
        closed += 1
    return opened, closed


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "hold":
        t0 = time.monotonic()
        o, c = hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    elif len(sys.argv) == 5 and sys.argv[1] == "churn":
        t0 = time.monotonic()
        o, c = churn(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(__doc__)
    print("%s: %d connections opened, %d closed, %.1f s" % (sys.argv[1], o, c, time.monotonic() - t0))


main()
