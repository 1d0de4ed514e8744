"""h2load-retry: an HTTP/2 load client that retries what the server marked
unprocessed, and counts everything else that went wrong as a failure.

Run it through bin/h2load-retry (which provides the pinned `h2` package).

N connections (h2c, or TLS with ALPN h2 when --tls), each keeping M streams
in flight on one path (GET), until --duration seconds have passed or --count
answers have come back. One process, one selector, non-blocking sockets;
--procs P forks P such processes (the connections split between them) and
adds their counts.

The retry rule (RFC 9113 §6.8 and §8.7): a request is *retried*, not failed,
iff the server marked it unprocessed:
  * its stream id is above the last_stream_id of a GOAWAY on its connection,
  * or the stream was reset with REFUSED_STREAM.
A connection that received a GOAWAY opens no new stream; its slot opens a
new connection at once, and the old one stays until its remaining streams
(those at or below last_stream_id) are answered. Everything else is a
*failure*:
  * a stream reset with any other code,
  * a connection closed (EOF, error) with a stream in flight at or below the
    last_stream_id of its GOAWAY (or with no GOAWAY at all),
  * a non-2xx status,
  * no answer within --timeout seconds, or still none --grace seconds after
    the load stopped.
Also reported, not failures by themselves: `abrupt` (connections the server
closed with nothing in flight and without any GOAWAY: a client that had just
sent a request would have lost it), `refused` (connects refused, e.g. after
SIGTERM closed the port; retried every 50 ms), `goaways` (GOAWAY frames
received) and `conns` (connections opened).

The last line of the output is one JSON object with every counter.
"""

import argparse
import errno
import json
import logging
import os
import selectors
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from h2.errors import ErrorCodes

MAX_STREAM_ID = 2**31 - 1


class Client(h2.connection.H2Connection):
    """python-h2's connection, except that a GOAWAY does not end it.

    python-h2 moves to its CLOSED state on a GOAWAY and then refuses the
    frames of the streams the GOAWAY lets finish; RFC 9113 §6.8 says those
    streams go on. This keeps the state as it was and only reports the
    GOAWAY; the caller opens no new stream after it.
    """

    def _receive_goaway_frame(self, frame):
        ev = h2.events.ConnectionTerminated()
        ev.error_code = h2.errors._error_code_from_int(frame.error_code)
        ev.last_stream_id = frame.last_stream_id
        ev.additional_data = frame.additional_data or None
        return [], [ev]


class Counts:
    FIELDS = ("ok", "failed", "retried", "abrupt", "refused", "goaways", "conns",
              "reset", "cut", "non2xx", "timeout")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, 0)
        self.first_failures = []

    def fail(self, kind, detail):
        self.failed += 1
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.first_failures) < 10:
            self.first_failures.append(f"{kind}: {detail}")

    def as_dict(self):
        d = {f: getattr(self, f) for f in self.FIELDS}
        d["first_failures"] = self.first_failures
        return d


class Conn:
    """One HTTP/2 connection of a slot."""

    def __init__(self, load, slot):
        self.load = load
        self.slot = slot
        self.h2 = Client(config=h2.config.H2Configuration(
            client_side=True, header_encoding=None,
            # The load is on the server: skip python-h2's own header checks.
            validate_outbound_headers=False, normalize_outbound_headers=False,
            validate_inbound_headers=False, normalize_inbound_headers=False))
        self.inflight = {}  # stream id -> start time
        self.status = {}  # stream id -> status
        self.goaway = None  # the lowest last_stream_id of the GOAWAYs received
        self.closed = False
        self.tls_ready = not load.args.tls
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        err = self.sock.connect_ex((load.args.host, load.args.port))
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
        self.connected = err == 0
        if load.args.tls:
            self.sock = load.tls.wrap_socket(self.sock, server_hostname=load.args.host,
                                             do_handshake_on_connect=False)
        self.out = b""
        load.counts.conns += 1
        load.sel.register(self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, self)
        self.h2.initiate_connection()
        self.fill()

    def usable(self):
        return self.goaway is None and not self.closed

    def fill(self):
        """Open streams up to M while the run goes on."""
        load = self.load
        while self.usable() and len(self.inflight) < load.args.streams and load.may_start():
            sid = self.h2.get_next_available_stream_id()
            self.h2.send_headers(sid, load.headers, end_stream=True)
            self.inflight[sid] = time.monotonic()
            load.started += 1
        self.queue()

    def queue(self):
        data = self.h2.data_to_send()
        if data:
            self.out += data
        self.want_write(bool(self.out) or not self.connected or not self.tls_ready)

    def want_write(self, on):
        if self.closed:
            return
        ev = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
        if self.load.sel.get_key(self.sock).events != ev:
            self.load.sel.modify(self.sock, ev, self)

    def handshake(self):
        try:
            self.sock.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        if self.sock.selected_alpn_protocol() != "h2":
            raise OSError("ALPN did not choose h2")
        self.tls_ready = True
        return True

    def on_writable(self):
        if not self.connected:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise ConnectionRefusedError(err, os.strerror(err))
            self.connected = True
        if not self.tls_ready and not self.handshake():
            return
        while self.out:
            try:
                n = self.sock.send(self.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            self.out = self.out[n:]
        self.want_write(bool(self.out))

    def on_readable(self):
        if not self.connected:
            self.on_writable()
            if not self.connected:
                return
        if not self.tls_ready:
            if not self.handshake():
                return
            self.queue()
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not data:
                self.end("EOF")
                return
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as e:
                self.end(f"protocol error: {e}")
                return
            for ev in events:
                self.on_event(ev)
            if len(data) < 65536:
                break
        if not self.closed:
            self.fill()
            if self.goaway is not None and not self.inflight:
                # Every stream the GOAWAY let finish is answered: done with it.
                self.end(None)

    def on_event(self, ev):
        c = self.load.counts
        if isinstance(ev, h2.events.ResponseReceived):
            for k, v in ev.headers:
                if k == b":status":
                    self.status[ev.stream_id] = int(v)
        elif isinstance(ev, h2.events.DataReceived):
            if ev.flow_controlled_length:
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            if self.inflight.pop(ev.stream_id, None) is None:
                return
            status = self.status.pop(ev.stream_id, 0)
            if 200 <= status < 300:
                c.ok += 1
            else:
                c.fail("non2xx", f"stream {ev.stream_id}: status {status}")
        elif isinstance(ev, h2.events.StreamReset):
            if self.inflight.pop(ev.stream_id, None) is None:
                return
            self.status.pop(ev.stream_id, None)
            if ev.error_code == ErrorCodes.REFUSED_STREAM:
                c.retried += 1
            else:
                c.fail("reset", f"stream {ev.stream_id}: RST_STREAM {ev.error_code!r}")
        elif isinstance(ev, h2.events.ConnectionTerminated):
            c.goaways += 1
            last = ev.last_stream_id if ev.last_stream_id is not None else 0
            if ev.error_code != ErrorCodes.NO_ERROR:
                # An error GOAWAY ends the connection: what it did not cover is
                # unprocessed, the rest is cut (counted at the close).
                self.note_goaway(last)
                self.end(f"GOAWAY {ev.error_code!r}")
                return
            self.note_goaway(last)

    def note_goaway(self, last):
        first = self.goaway is None
        self.goaway = last if first else min(self.goaway, last)
        for sid in [s for s in self.inflight if s > self.goaway]:
            del self.inflight[sid]
            self.status.pop(sid, None)
            self.load.counts.retried += 1
        if first:
            self.load.replace(self)

    def end(self, why):
        """Close; what is still in flight was cut (or, above a GOAWAY, unprocessed)."""
        if self.closed:
            return
        self.closed = True
        c = self.load.counts
        if why is not None and self.goaway is None and not self.inflight:
            c.abrupt += 1
        for sid in sorted(self.inflight):
            if self.goaway is not None and sid > self.goaway:
                c.retried += 1
            else:
                c.fail("cut", f"stream {sid} in flight at {why} (GOAWAY last_stream_id {self.goaway})")
        self.inflight.clear()
        try:
            self.load.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        self.load.conns.discard(self)
        if self.goaway is None:
            self.load.replace(self)

    def check_timeouts(self, now, timeout):
        for sid, t in list(self.inflight.items()):
            if now - t > timeout:
                del self.inflight[sid]
                self.load.counts.fail("timeout", f"stream {sid}: no answer in {timeout}s")
                # h2 would still deliver it; make it unknown to us.
                try:
                    self.h2.reset_stream(sid, ErrorCodes.CANCEL)
                except h2.exceptions.ProtocolError:
                    pass
        if not self.inflight and self.goaway is not None:
            self.end(None)


class Load:
    def __init__(self, args, conns):
        self.args = args
        self.counts = Counts()
        self.sel = selectors.DefaultSelector()
        self.conns = set()
        self.pending = []  # (time, slot): connects to try again
        self.started = 0
        self.stopping = False
        self.start = time.monotonic()
        self.headers = [
            (b":method", b"GET"),
            (b":scheme", b"https" if args.tls else b"http"),
            (b":authority", f"{args.host}:{args.port}".encode()),
            (b":path", args.path.encode()),
            (b"user-agent", b"h2load-retry"),
        ]
        self.tls = None
        if args.tls:
            self.tls = ssl.create_default_context()
            self.tls.check_hostname = False
            self.tls.verify_mode = ssl.CERT_NONE
            self.tls.set_alpn_protocols(["h2"])
        self.slots = conns

    def may_start(self):
        if self.stopping:
            return False
        return self.args.count <= 0 or self.started < self.args.count

    def open(self, slot):
        try:
            self.conns.add(Conn(self, slot))
        except OSError:
            self.counts.refused += 1
            self.pending.append((time.monotonic() + 0.05, slot))

    def replace(self, conn):
        if not self.stopping:
            self.open(conn.slot)

    def run(self):
        for s in range(self.slots):
            self.open(s)
        deadline = self.start + self.args.duration
        last_check = self.start
        while True:
            now = time.monotonic()
            if not self.stopping and (now >= deadline or (self.args.count > 0 and self.started >= self.args.count)):
                self.stopping = True
                self.stop_at = now + self.args.grace
                self.pending.clear()
            if self.stopping:
                busy = [c for c in self.conns if c.inflight]
                if not busy or now >= self.stop_at:
                    for c in busy:
                        for sid in c.inflight:
                            self.counts.fail("timeout", f"stream {sid}: unanswered when the run ended")
                        c.inflight.clear()
                    break
            for t, slot in list(self.pending):
                if t <= now:
                    self.pending.remove((t, slot))
                    self.open(slot)
            for key, mask in self.sel.select(timeout=0.05):
                conn = key.data
                if conn.closed:
                    continue
                try:
                    if mask & selectors.EVENT_READ:
                        conn.on_readable()
                    if mask & selectors.EVENT_WRITE and not conn.closed:
                        conn.on_writable()
                except ConnectionRefusedError:
                    self.counts.refused += 1
                    self.counts.conns -= 1
                    conn.closed = True
                    self.sel.unregister(conn.sock)
                    conn.sock.close()
                    self.conns.discard(conn)
                    if not self.stopping:
                        self.pending.append((time.monotonic() + 0.05, conn.slot))
                except (OSError, ssl.SSLError) as e:
                    conn.end(f"socket error: {e}")
            if now - last_check >= 0.5:
                last_check = now
                for c in list(self.conns):
                    c.check_timeouts(now, self.args.timeout)
        for c in list(self.conns):
            c.closed = True
            try:
                self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()
        elapsed = time.monotonic() - self.start
        d = self.counts.as_dict()
        d["elapsed"] = round(elapsed, 3)
        return d


def main():
    logging.disable(logging.DEBUG)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="http://HOST:PORT/PATH (h2c) or https://… (TLS, ALPN h2)")
    p.add_argument("-c", "--conns", type=int, default=16, help="connections (default 16)")
    p.add_argument("-m", "--streams", type=int, default=8, help="streams in flight per connection (default 8)")
    p.add_argument("-d", "--duration", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("-n", "--count", type=int, default=0, help="requests to start at most (0: no limit)")
    p.add_argument("-p", "--procs", type=int, default=1, help="processes (default 1)")
    p.add_argument("--timeout", type=float, default=15.0, help="a request unanswered this long fails")
    p.add_argument("--grace", type=float, default=15.0, help="after the run, wait this long for answers")
    args = p.parse_args()
    from urllib.parse import urlsplit
    u = urlsplit(args.url)
    if u.scheme not in ("http", "https") or not u.hostname:
        p.error("url: http:// or https:// with a host")
    args.tls = u.scheme == "https"
    args.host = u.hostname
    args.port = u.port or (443 if args.tls else 80)
    args.path = (u.path or "/") + (f"?{u.query}" if u.query else "")

    procs = max(1, min(args.procs, args.conns))
    if procs == 1:
        total = Load(args, args.conns).run()
    else:
        pipes = []
        count = args.count
        for i in range(procs):
            r, w = os.pipe()
            conns = args.conns // procs + (1 if i < args.conns % procs else 0)
            pid = os.fork()
            if pid == 0:
                os.close(r)
                if count > 0:
                    args.count = count // procs + (1 if i < count % procs else 0)
                d = Load(args, conns).run()
                os.write(w, json.dumps(d).encode())
                os._exit(0)
            os.close(w)
            pipes.append((pid, r))
        total = None
        for pid, r in pipes:
            chunks = []
            while True:
                b = os.read(r, 65536)
                if not b:
                    break
                chunks.append(b)
            os.close(r)
            os.waitpid(pid, 0)
            d = json.loads(b"".join(chunks) or b"{}")
            if total is None:
                total = d
            else:
                for k, v in d.items():
                    if k == "first_failures":
                        total[k] = (total[k] + v)[:10]
                    elif k == "elapsed":
                        total[k] = max(total[k], v)
                    else:
                        total[k] += v
    total["rps"] = round(total["ok"] / total["elapsed"]) if total["elapsed"] else 0
    for f in total["first_failures"]:
        print(f"failure: {f}", file=sys.stderr)
    print(json.dumps(total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
