#!/usr/bin/env python3
"""WebSocket room fan-out latency across forkd workers (driven by bin/bench-ws-fanout).

Usage: ws_fanout.py --port P --token T --workers PID,PID [--members 1000] [--rounds 20]
                    [--port2 P2 --workers2 PID,PID]

One process, one selector, every client socket (the sender included), so
every timestamp comes from the same clock:
  1. opens MEMBERS WebSocket clients to /ws?token=T (a minimal RFC 6455
     client: handshake, masked frames, pongs), waits for each `connected`;
  2. every client joins room "bench"; /_debug/streams is asked (on fresh
     connections, which SO_REUSEPORT spreads over the workers) until every
     worker has answered and the members counts add up to MEMBERS;
  3. one warm-up round, then ROUNDS rounds: client 0 sends one `chat` whose
     content carries the round number and the send time; each round waits
     (bounded) until every member has it. Other traffic (typing, errors,
     older rounds) is ignored.

Two latencies per delivery:
  * kernel: the arrival time the kernel stamped on the packet
    (SO_TIMESTAMPNS, CLOCK_REALTIME) minus the send time (time.time_ns just
    before send). This is the server's delivery latency: it does not include
    the time this Python loop takes to get round to the socket.
  * client: time.monotonic_ns right after this process read the frame, minus
    the monotonic send time. This is what the client saw; it adds the
    client's own overhead (one Python loop serving MEMBERS sockets in turn).
Their difference is the tool's own share.

With --port2 (a second forkd host sharing the first one's Redis), members
alternate between the two hosts, the sender is on the first, and the
latencies are reported per host as well: the second host's members get each
message through the Redis bridge.

A measurement, not a test: it prints numbers and exits 0 whatever they are
(non-zero only when it could not measure). Python 3 standard library only.
"""

import argparse
import errno
import http.client
import json
import math
import os
import selectors
import socket
import struct
import sys
import time
from forkd_debug import debug_streams
from ws_client import frame, parse_frames, upgrade_request, upgrade_response

ROOM = "bench"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; also the cmsg type
CMSG_TS = socket.CMSG_SPACE(16)  # struct timespec on 64-bit Linux


# --- WebSocket clients (frames and handshake: ws_client.py) -----------------------

def text(obj):
    return frame(0x1, json.dumps(obj, separators=(",", ":")).encode())


class Client:
    """One WebSocket client: its socket, its input buffer, its state."""
    __slots__ = ("sock", "buf", "state", "got", "port")

    def __init__(self, sock, port):
        self.sock, self.buf, self.state, self.port = sock, b"", "connecting", port
        self.got = {}  # round -> (kernel ns, monotonic ns) of its delivery


def recv(c):
    """Read what is there; returns (bytes, kernel arrival ns or None)."""
    data, anc, _, _ = c.sock.recvmsg(65536, CMSG_TS)
    ts = None
    for level, kind, d in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(d) >= 16:
            sec, nsec = struct.unpack_from("qq", d)
            ts = sec * 1_000_000_000 + nsec
    return data, ts


# --- the steps -----------------------------------------------------------------

def connect_all(ports, token, members, inflight, timeout):
    """Open `members` clients, the i-th to ports[i % len(ports)]; returns them once each has
    seen `connected`."""
    sel = selectors.DefaultSelector()
    clients, ready, started, failed = [], 0, 0, 0
    deadline = time.monotonic() + timeout
    while ready < members and time.monotonic() < deadline:
        while started < members and started - ready - failed < inflight:
            port = ports[started % len(ports)]
            started += 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            if s.connect_ex(("127.0.0.1", port)) not in (0, errno.EINPROGRESS):
                failed += 1
                s.close()
                continue
            c = Client(s, port)
            clients.append(c)
            sel.register(s, selectors.EVENT_WRITE, c)
        for key, _ in sel.select(timeout=0.5):
            c = key.data
            try:
                if c.state == "connecting":
                    err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, os.strerror(err))
                    c.sock.sendall(upgrade_request("127.0.0.1", c.port, token))
                    c.state = "handshake"
                    sel.modify(c.sock, selectors.EVENT_READ, c)
                    continue
                try:
                    data, _ = recv(c)
                except BlockingIOError:
                    continue
                if not data:
                    raise OSError("closed during the handshake")
                c.buf += data
                if c.state == "handshake":
                    rest = upgrade_response(c.buf)
                    if rest is None:
                        continue
                    c.buf, c.state = rest, "open"
                frames, c.buf = parse_frames(c.buf)
                for op, payload in frames:
                    if op == 0x1 and json.loads(payload).get("type") == "connected":
                        c.state = "ready"
                        ready += 1
                        sel.unregister(c.sock)
            except OSError as e:
                if failed < 5:
                    print(f"  client failed: {e}", file=sys.stderr)
                failed += 1
                sel.unregister(c.sock)
                c.sock.close()
                c.state = "failed"
    sel.close()
    ok = [c for c in clients if c.state == "ready"]
    for c in clients:
        if c.state not in ("ready", "failed"):
            c.sock.close()
    return ok, failed




def per_worker(port, pids, want_members, timeout):
    """Latest /_debug/streams answer of each worker, polled until the members add up."""
    seen, t0 = {}, time.monotonic()
    while time.monotonic() - t0 < timeout:
        s = debug_streams(port)
        seen[s["pid"]] = s
        if set(pids) <= set(seen) and sum(seen[p]["members"] for p in pids) == want_members:
            break
        time.sleep(0.01)
    return seen


def run_round(sel, clients, sender, rnd, timeout, read_after):
    """Send round `rnd`'s chat from `sender`; collect deliveries until all arrive or timeout.
    With read_after > 0 the client sleeps that long before reading (kernel stamps
    still date each arrival; the client then takes no CPU during the fan-out).
    Returns (send realtime ns, send monotonic ns, deliveries)."""
    t_real, t_mono = time.time_ns(), time.monotonic_ns()
    sender.sock.sendall(text({"type": "chat", "roomId": ROOM, "content": f"bench {rnd} {t_mono}"}))
    if read_after:
        time.sleep(read_after)
    want, got = len(clients), 0
    deadline = time.monotonic() + timeout
    while got < want and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            c = key.data
            try:
                data, ts = recv(c)
            except BlockingIOError:
                continue
            now = time.monotonic_ns()
            if not data:
                continue  # closed by the server: it will be missing from the counts
            frames, c.buf = parse_frames(c.buf + data)
            for op, payload in frames:
                if op == 0x9:  # ping: answer, keep going
                    c.sock.sendall(frame(0xA, payload))
                elif op == 0x1:
                    m = json.loads(payload)
                    # Only this round's chat counts; typing, errors and stragglers are ignored.
                    if m.get("type") == "chat" and m.get("content", "").startswith(f"bench {rnd} "):
                        if rnd not in c.got:
                            c.got[rnd] = (ts, now)
                            got += 1
    return t_real, t_mono, got


def pct(sorted_vals, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--workers", required=True, help="worker pids, comma separated")
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.05, help="seconds of quiet between rounds")
    ap.add_argument("--read-after", type=float, default=0.0,
                    help="seconds to wait after each send before reading (0: read at once);"
                         " isolates the server's latency from the client's CPU use")
    ap.add_argument("--inflight", type=int, default=128, help="clients in set-up at once")
    ap.add_argument("--port2", type=int, help="a second host (same Redis): members alternate")
    ap.add_argument("--workers2", help="the second host's worker pids, comma separated")
    a = ap.parse_args()
    if (a.port2 is None) != (a.workers2 is None):
        ap.error("--port2 and --workers2 go together")
    hosts = [(a.port, [int(p) for p in a.workers.split(",")])]
    if a.port2 is not None:
        hosts.append((a.port2, [int(p) for p in a.workers2.split(",")]))
    pids = [p for _, ps in hosts for p in ps]

    t0 = time.monotonic()
    clients, failed = connect_all([port for port, _ in hosts], a.token, a.members, a.inflight, 60)
    print(f"connected {len(clients)} / {a.members} WebSocket clients in {time.monotonic() - t0:.1f} s"
          f" ({failed} failed)")
    if not clients:
        return 1

    join = text({"type": "join", "roomId": ROOM})
    for c in clients:
        c.sock.sendall(join)
    seen = {}
    for port, ps in hosts:
        seen.update(per_worker(port, ps, sum(c.port == port for c in clients), 10))
    total = sum(seen[p]["members"] for p in pids if p in seen)
    print("members per worker: " + ", ".join(
        f"pid {p}: {seen[p]['members']} (ws {seen[p]['ws']})" if p in seen else f"pid {p}: no answer"
        for p in pids))
    spread = all(p in seen and seen[p]["members"] > 0 for p in pids)
    print(f"  sum {total} / {len(clients)} {'OK' if total == len(clients) else 'MISMATCH'};"
          f" every worker has members: {'yes' if spread else 'NO'}")

    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.sock, selectors.EVENT_READ, c)
    sender = clients[0]
    kern, app, spans, expected, received, no_ts = [], [], [], 0, 0, 0
    by_host = {port: [] for port, _ in hosts}  # kernel-stamp latencies per host
    for rnd in range(a.rounds + 1):  # round 0 is the warm-up, not counted
        time.sleep(a.gap)
        t_real, t_mono, got = run_round(sel, clients, sender, rnd, 5, a.read_after)
        if rnd == 0:
            print(f"warm-up round: {got} / {len(clients)} delivered")
            continue
        expected += len(clients)
        received += got
        reads = [c.got[rnd][1] for c in clients if rnd in c.got]
        if reads:  # first to last read by this client: its own pace through the sockets
            spans.append((max(reads) - min(reads)) / 1e6)
        for c in clients:
            if rnd in c.got:
                ts, now = c.got[rnd]
                app.append((now - t_mono) / 1e6)
                if ts is None:
                    no_ts += 1
                else:
                    kern.append((ts - t_real) / 1e6)
                    by_host[c.port].append((ts - t_real) / 1e6)
    sel.close()
    for c in clients:
        c.sock.close()

    kern.sort()
    app.sort()
    print()
    print(f"  members                {len(clients)}  ("
          + ", ".join(f"{seen[p]['members']} on pid {p}" for p in pids if p in seen) + ")")
    print(f"  rounds                 {a.rounds} (+1 warm-up), sender: one member, {a.gap * 1000:.0f} ms apart"
          + (f", reads deferred {a.read_after * 1000:.0f} ms" if a.read_after else ""))
    print(f"  deliveries             {received} / {expected}"
          f" {'(all)' if received == expected else '(MISSING ' + str(expected - received) + ')'}")
    print("  latency (ms)               p50     p99     max")
    print(f"    server (kernel stamp) {pct(kern, 50):7.2f} {pct(kern, 99):7.2f} {kern[-1] if kern else float('nan'):7.2f}"
          + (f"   ({no_ts} without a stamp)" if no_ts else ""))
    print(f"    client (after read)   {pct(app, 50):7.2f} {pct(app, 99):7.2f} {app[-1] if app else float('nan'):7.2f}")
    if len(hosts) > 1:
        for i, (port, _) in enumerate(hosts):
            v = sorted(by_host[port])
            name = "sender's host" if i == 0 else "other host"
            print(f"    {name:<14} :{port:<5} {pct(v, 50):7.2f} {pct(v, 99):7.2f} {v[-1] if v else float('nan'):7.2f}"
                  f"   ({len(v)} deliveries)")
    spans.sort()
    if spans:
        med = pct(spans, 50)
        print(f"  client read span       first to last delivery read, per round: p50 {med:.2f} ms"
              f" = {med * 1000 / len(clients):.1f} us per member")
    p99 = pct(kern, 99) if kern else pct(app, 99)
    verdict = "met" if received == expected and p99 <= 20 else "MISSED"
    print(f"  target                 all delivered, p99 <= 20 ms (server latency): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
