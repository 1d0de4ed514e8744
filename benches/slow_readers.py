#!/usr/bin/env python3
"""Slow readers of one download (driven by bin/bench-download).

Usage: slow_readers.py --port P [--n 200] [--path /download/f100] [--hold 3]
                       [--rcvbuf 4096] [--timeout 30]

  1. opens N connections to 127.0.0.1:P, each with SO_RCVBUF set small
     BEFORE connect (so the window it advertises stays small), and sends
     `GET PATH HTTP/1.1` on each; then never reads while holding them;
  2. waits (bounded by --timeout) until every connection has an answer
     waiting in its receive buffer, seen with poll() only: nothing is read,
     so the server really faces N stalled clients;
  3. prints `ready OPENED ANSWERED` on stdout and waits for one line on
     stdin (the driver's "go", bounded by --timeout);
  4. holds the connections for --hold seconds (the driver samples the
     server meanwhile), then reads the first 100 bytes of each to prove it
     is still alive (not closed by the server, and it starts with
     `HTTP/1.1 200`), prints
     `alive ALIVE N` and closes them all.

A measurement tool, not a test: it exits 0 whatever it saw, non-zero only
when it could not set the load up (connections that failed to open, or no
"go"). Python 3 standard library only.
"""

import argparse
import select
import socket
import sys
import time

PEEK = 100  # bytes read from each connection at the end


def open_all(port, n, path, rcvbuf, deadline):
    """Open n connections and send the request on each; returns (sockets, failures)."""
    request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               "User-Agent: forkd-slow-readers\r\n\r\n").encode()
    socks, failed = [], 0
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # Before connect: the window scale is agreed in the handshake.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
            s.connect(("127.0.0.1", port))
            s.sendall(request)  # tiny; fits the fresh socket's send buffer
            socks.append(s)
        except OSError as e:
            if failed < 5:
                print(f"  connection failed: {e}", file=sys.stderr)
            failed += 1
            s.close()
        if time.monotonic() > deadline:
            failed += n - len(socks) - failed
            break
    return socks, failed


def wait_answered(socks, deadline):
    """Poll (never read) until every socket has input waiting; returns how many do."""
    p = select.poll()
    fd_of = {s.fileno(): s for s in socks}
    for fd in fd_of:
        p.register(fd, select.POLLIN)
    answered = 0
    while fd_of and time.monotonic() < deadline:
        for fd, _ in p.poll(200):
            p.unregister(fd)
            del fd_of[fd]
            answered += 1
    return answered


def read_head(s, timeout):
    """Read up to PEEK bytes from s (bounded); returns what came."""
    s.settimeout(timeout)
    got = b""
    try:
        while len(got) < PEEK:
            chunk = s.recv(PEEK - len(got))
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--path", default="/download/f100")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds to hold after the go")
    ap.add_argument("--rcvbuf", type=int, default=4096, help="SO_RCVBUF, set before connect")
    ap.add_argument("--timeout", type=float, default=30.0, help="bound on each wait")
    a = ap.parse_args()

    t0 = time.monotonic()
    socks, failed = open_all(a.port, a.n, a.path, a.rcvbuf, t0 + a.timeout)
    answered = wait_answered(socks, time.monotonic() + a.timeout)
    eff = socks[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) if socks else 0
    print(f"  client: {len(socks)} / {a.n} connections in {time.monotonic() - t0:.2f} s"
          f" ({failed} failed), {answered} answered; SO_RCVBUF asked {a.rcvbuf},"
          f" kernel says {eff}", file=sys.stderr)
    print(f"ready {len(socks)} {answered}", flush=True)
    if failed:
        return 1

    ready, _, _ = select.select([sys.stdin], [], [], a.timeout)
    if not ready or not sys.stdin.readline():
        print("  client: no go from the driver; giving up", file=sys.stderr)
        return 1
    time.sleep(a.hold)

    # Closed by the server (FIN or reset) while held, even with the head
    # still buffered: not alive.
    p = select.poll()
    for s in socks:
        p.register(s.fileno(), select.POLLRDHUP)
    gone = {fd for fd, ev in p.poll(0) if ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)}
    alive = 0
    for s in socks:
        if s.fileno() not in gone and read_head(s, 5.0).startswith(b"HTTP/1.1 200"):
            alive += 1
    for s in socks:
        s.close()
    print(f"alive {alive} {len(socks)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
