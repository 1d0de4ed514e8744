#!/usr/bin/env python3
"""Notification delivery latency on /api/events (driven by bin/bench-sse-latency).

Usage: sse_latency.py --port P --token ADMIN_TOKEN [--streams 200] [--rounds 30]
                      [--gap 0.1] [--label idle]

One process, one selector, every socket, one clock:
  1. opens STREAMS event streams (GET /api/events, HTTP/1.1) on fresh
     connections, which SO_REUSEPORT spreads over the workers, and waits for
     each one's `connected` event;
  2. ROUNDS times: POSTs one notification (admin token) on a keep-alive
     connection of its own, records the send time, the time its 201 arrives
     (the store write: a pool job on one worker), and the time each stream
     receives the `notification` event carrying the id the 201 named.
     Streams on the POSTing worker get it from that worker's loop; the others
     through the bus (worker -> supervisor -> worker).

Per round and stream, three figures:
  * stored: POST sent -> 201 read (parse, pool job, SQLite insert and commit);
  * fanout: 201 read -> event read on a stream (delivery after the commit:
    the pool's result to the loop, the bus hop, the other loop's write);
  * total: POST sent -> event read.
Times are client-side (time.monotonic_ns after the read), so one Python loop
serving every socket adds its share; on a loaded machine that share grows
too, as it would for any client.

A measurement, not a test: prints numbers and exits 0 whatever they are
(non-zero only when it could not measure). Python 3 standard library only.
"""

import argparse
import json
import selectors
import socket
import sys
import time


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def ms(ns):
    return ns / 1e6


class Stream:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Accept: text/event-stream\r\n\r\n")
        self.sock.setblocking(False)
        self.buf = b""
        self.head_done = False
        self.connected = False
        self.seen = {}  # notification id -> monotonic ns

    def on_readable(self, now):
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        self.buf += data
        if not self.head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return True
            self.head_done = True
            self.buf = self.buf[end + 4:]
        # Chunked framing: event text is found inside the chunks; chunk-size
        # lines never look like `id: ` lines, so scanning the raw bytes is enough.
        while True:
            end = self.buf.find(b"\n\n")
            if end < 0:
                break
            block, self.buf = self.buf[:end], self.buf[end + 2:]
            lines = block.split(b"\n")
            ev = next((l[7:].strip() for l in lines if l.startswith(b"event: ")), b"")
            if ev == b"connected":
                self.connected = True
            elif ev == b"notification":
                for l in lines:
                    if l.startswith(b"id: "):
                        try:
                            self.seen.setdefault(int(l[4:].strip()), now)
                        except ValueError:
                            pass
        return True


def post(port, token, n):
    body = json.dumps({"title": f"bench {n}", "body": "latency"}).encode()
    return (b"POST /api/v1/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer " + token.encode() +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def read_response(sock, deadline):
    buf = b""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(buf) >= end + 4 + length:
                status = int(head.split(" ")[1])
                return status, json.loads(buf[end + 4:end + 4 + length] or b"null")
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the POST connection")
        buf += chunk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--gap", type=float, default=0.1)
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    sel = selectors.DefaultSelector()
    streams = []
    for _ in range(a.streams):
        s = Stream(a.port)
        streams.append(s)
        sel.register(s.sock, selectors.EVENT_READ, s)

    def pump(until, done):
        while time.monotonic() < until and not done():
            for key, _ in sel.select(timeout=0.05):
                st = key.data
                if not st.on_readable(time.monotonic_ns()):
                    sel.unregister(st.sock)
        return done()

    if not pump(time.monotonic() + 20, lambda: all(s.connected for s in streams)):
        print(f"only {sum(s.connected for s in streams)}/{a.streams} streams connected", file=sys.stderr)
        return 1

    poster = socket.create_connection(("127.0.0.1", a.port), timeout=5)
    poster.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stored, fanout, total, missing = [], [], [], 0
    for n in range(a.rounds + 1):  # round 0 warms up
        t0 = time.monotonic_ns()
        poster.sendall(post(a.port, a.token, n))
        status, body = read_response(poster, time.monotonic() + 10)
        t1 = time.monotonic_ns()
        if status != 201:
            print(f"POST answered {status}: {body}", file=sys.stderr)
            return 1
        nid = body["data"]["id"]
        pump(time.monotonic() + 10, lambda: all(nid in s.seen for s in streams))
        if n == 0:
            continue
        stored.append(t1 - t0)
        for s in streams:
            t = s.seen.get(nid)
            if t is None:
                missing += 1
                continue
            # A stream may read the event before the POST's 201 is read.
            fanout.append(max(0, t - t1))
            total.append(t - t0)
        time.sleep(a.gap)

    label = f"[{a.label}] " if a.label else ""
    print(f"{label}streams {a.streams}, rounds {a.rounds}, deliveries {len(total)}, missing {missing}")
    for name, v in (("stored (POST -> 201)", stored), ("fanout (201 -> event)", fanout),
                    ("total (POST -> event)", total)):
        print(f"{label}  {name:24} p50 {ms(pct(v, 50)):7.2f} ms  p99 {ms(pct(v, 99)):7.2f} ms"
              f"  max {ms(max(v) if v else float('nan')):7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
