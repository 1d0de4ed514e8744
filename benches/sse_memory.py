#!/usr/bin/env python3
"""Memory cost of idle SSE streams in one forkd worker (driven by bin/bench-sse-memory).

Usage: sse_memory.py --port P --pid WORKER_PID [--n 10000] [--settle 5] [--keepalive]

With --keepalive it holds N idle HTTP/1.1 keep-alive connections instead:
each sends one `GET /health`, reads the whole response and stays open.

Opens N idle `GET /api/events` streams from this one process (non-blocking
sockets and a selector, at most --inflight connections being set up at a
time so the listen backlog never overflows), reads each stream's preamble
up to `event: connected` so the stream is really established, checks through
`/_debug/streams` that the worker counts N streams, and reports the worker's
VmRSS before, right after, and --settle seconds after; then closes everything
and reports how the count and the RSS come back.

A measurement, not a test: it prints numbers and exits 0 whatever they are
(non-zero only when it could not measure). Python 3 standard library only.
"""

import argparse
import errno
import http.client
import json
import selectors
import socket
import sys
import time
from forkd_debug import debug_streams

TARGET_BYTES_PER_10K = 40_000_000  # the budget: 40 MB of extra RSS for 10 000 streams


def rss_bytes(pid):
    """The process's VmRSS, in bytes, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")




def wait_for_sse(port, want, timeout, key="sse"):
    """Poll /_debug/streams until `key` == want or the timeout; returns (answer, seconds)."""
    t0 = time.monotonic()
    while True:
        s = debug_streams(port)
        if s[key] == want or time.monotonic() - t0 > timeout:
            return s, time.monotonic() - t0
        time.sleep(0.05)


def answered(buf):
    """A whole `/health` response is in `buf`."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return True


def open_streams(port, n, inflight, timeout, keepalive=False):
    """Open n SSE streams (or answered keep-alive connections); returns (sockets, failures, seconds)."""
    if keepalive:
        request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    else:
        request = (f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   "Accept: text/event-stream\r\n\r\n").encode()
    sel = selectors.DefaultSelector()
    done, failed, started = [], 0, 0
    bufs = {}
    t0 = time.monotonic()
    deadline = t0 + timeout

    def start_one():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            return False
        bufs[s] = None  # None: request not sent yet
        sel.register(s, selectors.EVENT_WRITE)
        return True

    while len(done) + failed < n and time.monotonic() < deadline:
        # Keep up to `inflight` streams in set-up.
        while started < n and len(bufs) < inflight:
            started += 1
            if not start_one():
                failed += 1
        for key, ev in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                if bufs[s] is None:  # connected (or failed): send the request
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, "connect")
                    s.sendall(request)  # tiny; fits the fresh socket's buffer
                    bufs[s] = b""
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                chunk = s.recv(4096)
                if not chunk:
                    raise OSError("closed before the preamble")
                bufs[s] += chunk
                if (answered(bufs[s]) if keepalive else b"event: connected" in bufs[s]):
                    if not bufs[s].startswith(b"HTTP/1.1 200"):
                        raise OSError("not a 200: %r" % bufs[s][:40])
                    sel.unregister(s)
                    del bufs[s]
                    done.append(s)  # established; left idle from now on
            except OSError as e:
                if failed < 5:
                    print(f"  stream failed: {e}", file=sys.stderr)
                failed += 1
                sel.unregister(s)
                del bufs[s]
                s.close()
    for s in list(bufs):  # still in set-up at the deadline
        failed += 1
        sel.unregister(s)
        s.close()
    sel.close()
    return done, failed, time.monotonic() - t0


def mb(b):
    return f"{b / 1e6:7.1f} MB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True, help="the (only) worker's pid")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds before the second RSS reading")
    ap.add_argument("--inflight", type=int, default=256, help="streams in set-up at once")
    ap.add_argument("--open-timeout", type=float, default=120.0)
    ap.add_argument("--keepalive", action="store_true", help="idle keep-alive connections, not streams")
    a = ap.parse_args()
    # Keep-alive connections are counted by `connections` (this check's own included).
    key, want, what = ("connections", a.n + 1, "connections") if a.keepalive else ("sse", a.n, "streams")

    first = debug_streams(a.port)
    if first["pid"] != a.pid:
        print(f"/_debug/streams answered from pid {first['pid']}, expected worker {a.pid}")
        return 1
    rss0 = rss_bytes(a.pid)
    print(f"worker pid {a.pid}; before: sse = {first['sse']}, VmRSS {mb(rss0)}")

    socks, failed, secs = open_streams(a.port, a.n, a.inflight, a.open_timeout, a.keepalive)
    print(f"opened {len(socks)} / {a.n} {what} in {secs:.1f} s ({failed} failed)")
    st, _ = wait_for_sse(a.port, len(socks) + (want - a.n), 10, key)
    rss1 = rss_bytes(a.pid)
    ok = "OK" if st[key] == want else f"MISMATCH (expected {key} = {want})"
    print(f"/_debug/streams: sse = {st['sse']} {ok}, connections = {st['connections']}")
    time.sleep(a.settle)
    rss2 = rss_bytes(a.pid)
    st2 = debug_streams(a.port)

    extra = max(rss1, rss2) - rss0
    per = extra / max(len(socks), 1)
    budget = TARGET_BYTES_PER_10K / 10000  # bytes per stream
    print()
    print(f"  {what + ' (N)':22} {len(socks)}")
    print(f"  VmRSS before           {mb(rss0)}  ({rss0} B)")
    print(f"  VmRSS after            {mb(rss1)}  ({rss1} B)")
    print(f"  VmRSS after {a.settle:g} s        {mb(rss2)}  ({rss2} B)   sse still {st2['sse']}")
    print(f"  extra RSS total        {mb(extra)}  ({extra} B, larger of the two readings)")
    print(f"  extra RSS per stream   {per:7.0f} B")
    verdict = "met" if per <= budget else "MISSED"
    print(f"  target                 <= 40 MB per 10 000 streams = {budget:.0f} B/stream: {verdict}"
          f" (scaled to 10 000: {per * 10000 / 1e6:.1f} MB)")

    print()
    t0 = time.monotonic()
    for s in socks:
        s.close()
    st3, secs = wait_for_sse(a.port, want - a.n, 15, key)
    time.sleep(1)
    rss3 = rss_bytes(a.pid)
    print(f"closed all {len(socks)}: sse = {st3['sse']} after {secs:.2f} s,"
          f" connections = {st3['connections']}; VmRSS 1 s later {mb(rss3)}"
          f" ({rss3 - rss0:+d} B vs before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
