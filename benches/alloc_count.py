"""Allocations per request of a forkd built with the cargo feature `count-alloc`.

Driven by bin/alloc-count (which builds and starts forkd with one worker and
`[debug] routes`). On one keep-alive connection, for each route: a warm-up,
then two reads of `GET /_debug/allocations` in a row (what one read costs),
then N requests (one at a time, or `--pipeline P` per write), then a read.
Allocations per request = (after - before - one read's cost) / N. The
counts are the worker process's, its pool threads included.
"""

import argparse
import json
import socket
import sys
import time


class Conn:
    """One keep-alive HTTP/1.1 connection that reads Content-Length responses."""

    def __init__(self, port, timeout=30):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _response(self):
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(rest) < length:
            self.buf = head + b"\r\n\r\n" + rest
            self._more()
            head, _, rest = self.buf.partition(b"\r\n\r\n")
        self.buf = rest[length:]
        return status, rest[:length]

    def _more(self):
        chunk = self.s.recv(65536)
        if not chunk:
            raise OSError("the server closed the connection")
        self.buf += chunk

    def requests(self, raw, count, want=200):
        """Send `raw` (`count` requests) in one write; read `count` responses."""
        self.s.sendall(raw)
        body = b""
        for _ in range(count):
            status, body = self._response()
            if status != want:
                raise OSError(f"HTTP {status}: {body[:200]!r}")
        return body


def request(path, token=None):
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode()


def counts(c):
    return json.loads(c.requests(request("/_debug/allocations"), 1))


def diff(a, b):
    return {k: b[k] - a[k] for k in ("allocs", "reallocs", "frees", "bytes")}


def measure(c, raw, n, pipeline, warmup):
    for _ in range(warmup):
        c.requests(raw, 1)
    a = counts(c)
    b = counts(c)
    read_cost = diff(a, b)
    sent = 0
    while sent < n:
        k = min(pipeline, n - sent)
        c.requests(raw * k, k)
        sent += k
    d = diff(b, counts(c))
    return {k: (d[k] - read_cost[k]) / n for k in d}, read_cost, a["pid"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--user-path", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--pipeline", type=int, default=1)
    a = ap.parse_args()
    c = Conn(a.port)
    routes = [
        ("/health", request("/health")),
        (f"GET {a.user_path} (bearer)", request(a.user_path, a.token)),
    ]
    mode = "one at a time" if a.pipeline == 1 else f"{a.pipeline} per write"
    print(f"{a.requests} requests per route on one keep-alive connection ({mode}), after {a.warmup} warm-up requests")
    print(f"{'route':<34} {'allocs/req':>10} {'reallocs/req':>12} {'frees/req':>10} {'bytes/req':>10}")
    for name, raw in routes:
        t0 = time.monotonic()
        per, read_cost, pid = measure(c, raw, a.requests, a.pipeline, a.warmup)
        print(f"{name:<34} {per['allocs']:>10.2f} {per['reallocs']:>12.2f} {per['frees']:>10.2f} {per['bytes']:>10.0f}"
              f"   ({time.monotonic() - t0:.1f} s)")
    print(f"(worker pid {pid}; one read of /_debug/allocations costs {read_cost['allocs']} allocs,"
          f" {read_cost['reallocs']} reallocs: subtracted)")


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:
        print(f"alloc_count: {e}", file=sys.stderr)
        sys.exit(1)
