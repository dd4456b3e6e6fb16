#!/usr/bin/env python3
"""Unauthenticated connections against musterd's control port, bounded in
count and time, on an address the caller gives (loopback or a namespace it
made). Never speaks the protocol: a stranger without the token.

  control-flood.py hold HOST PORT N SECONDS   keep N connections open, each
                                              re-opened as soon as it is closed
  control-flood.py churn HOST PORT SECONDS    connect and close, one after another

Prints one line: mode, connections opened, closed by the far end, seconds;
hold adds the most connections held at once (connected: a connect still in
progress is not held). hold fails when the open-file limit cannot take N.
"""
import errno, resource, selectors, socket, sys, time


def raise_nofile(n):
    """The open-file limit raised to take n sockets and 64 more, or exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n + 64:
        sys.exit("hold: the open-file limit (hard %d) cannot take %d connections: raise it (ulimit -Hn)" % (hard, n))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, n + 64), hard))


def hold(host, port, n, seconds):
    raise_nofile(n)
    sel = selectors.DefaultSelector()
    opened = closed = held = peak = 0
    end = time.monotonic() + seconds

    def open_one():
        nonlocal opened
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex((host, port))
        if rc not in (0, errno.EINPROGRESS):
            s.close()
            return False
        # data None: connecting (held once writable with no error); True: held
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, None)
        opened += 1
        return True

    live = 0
    while time.monotonic() < end:
        while live < n and time.monotonic() < end:
            if not open_one():
                time.sleep(0.01)
                break
            live += 1
        for key, events in sel.select(timeout=0.05):
            s = key.fileobj
            if key.data is None and events & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    sel.modify(s, selectors.EVENT_READ, True)
                    held += 1
                    peak = max(peak, held)
                    continue
                data = b""  # refused: gone
            else:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
            if data:
                continue  # a REJECT, say: read and wait for the close
            if key.data:
                held -= 1
            sel.unregister(s)
            s.close()
            live -= 1
            closed += 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return opened, closed, peak


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
        o, c, peak = hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        print("hold: %d connections opened, %d closed, %.1f s, %d held at most"
              % (o, c, time.monotonic() - t0, peak))
    elif len(sys.argv) == 5 and sys.argv[1] == "churn":
        t0 = time.monotonic()
        o, c = churn(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        print("churn: %d connections opened, %d closed, %.1f s" % (o, c, time.monotonic() - t0))
    else:
        sys.exit(__doc__)


main()
