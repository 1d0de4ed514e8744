#!/usr/bin/env python3
"""Mixed-load soak of a running forkd (driven by bin/soak).

Usage: soak.py --port P --supervisor PID --user-id ID --email E --password-file F
               --work DIR --download NAME [--minutes 30] [options, see --help]

Load, all on 127.0.0.1, for --minutes minutes after a set-up phase:
  * wrk bursts, one route at a time, -t1 -c4 -dBURST s: /health at second 10
    of every minute, /api/config at 25, GET /api/v1/users/{id} with the
    newest bearer token at 40 (a per-minute duty cycle: wrk saturates the
    machine while it runs, so it runs 3 x BURST seconds a minute and never
    two at once);
  * SSE streams on /api/events (--sse), opened once and kept open; a stream
    that ends is counted as a death and reopened;
  * WebSocket clients on /ws?token=... (--ws), each in one of --rooms rooms,
    chatting at --chat-rate messages/s in total (a random client each time);
    every chat delivery (sender included) is counted against the members the
    room had when it was sent; a client that ends is counted and reopened;
  * logins (POST /api/v1/auth/login, real argon2) at --login-rate per second;
    each fresh access token replaces the one wrk and reopened WebSockets use
    (access tokens expire after auth.access_ttl_secs);
  * downloads of /download/NAME every --download-every seconds, read in full;
  * a prober process: GET /health --probe-rate times a second on its own
    keep-alive connection, timed from send to the last byte; its p50/p99 of
    each minute is the latency column (samples taken while a wrk burst runs
    are also reported apart, as "burst", from the "quiet" rest).
Every minute, when no wrk burst runs, it samples the supervisor and its
children (the workers): VmRSS, open fds, pids; reads /metrics; and prints
one table line. At the end: a detail table and the verdict.

A benchmark, not a test: exit status 0 whatever the numbers; non-zero only
when the load could not be set up. Python 3 standard library only. It
starts wrk (subprocess handles) and two helper processes (multiprocessing
handles) and stops exactly those on exit.
"""

import argparse
import errno
import http.client
import json
import math
import multiprocessing as mp
import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from ws_client import frame, parse_frames, upgrade_request, upgrade_response

HOST = "127.0.0.1"


# --- small helpers ------------------------------------------------------------

def pct(sorted_vals, p):
    """Nearest-rank percentile of an ascending list (nan when empty)."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def median(vals):
    vals = sorted(v for v in vals if not math.isnan(v))
    if not vals:
        return float("nan")
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


def read_token(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def write_token(path, token):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(token)
    os.replace(tmp, path)  # readers never see half a token


def login(port, email, password, timeout=30):
    """One login on a fresh connection; returns the access token."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        body = json.dumps({"email": email, "password": password})
        c.request("POST", "/api/v1/auth/login", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise OSError(f"login: HTTP {r.status} {data[:200]!r}")
        return json.loads(data)["data"]["accessToken"]
    finally:
        c.close()


# --- /proc --------------------------------------------------------------------

def proc_stat(pid):
    """(state, ppid) of pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rfind(")") + 2:].split()  # the command name may hold spaces or ')'
    return rest[0], int(rest[1])


def children_of(parent):
    """Pids whose parent is `parent` (scanning /proc, never by name), sorted."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(d)
            if st and st[1] == parent and st[0] != "Z":
                out.append(int(d))
    return sorted(out)


def mem_kib(pid):
    """VmRSS and its parts (RssAnon, RssFile, RssShmem) of pid in KiB, or None when it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(":", 1)[0]
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(line.split()[1])
    except OSError:
        return None
    return out if "VmRSS" in out else None


def memory_readings(pids, counters, reads, gap):
    """VmRSS of each pid, read `reads` times `gap` s apart while no login or
    download of ours is in flight: (lowest, highest, the lowest reading's
    parts) per pid, KiB (None: gone).
    The lowest is the verdict's figure: a login leaves its worker holding a
    ~19 MiB argon2 buffer until the server's low-priority hashing thread finds
    its queue empty, which on a busy machine can take seconds; the highest
    shows when that happened."""
    lo, hi = {p: None for p in pids}, {p: None for p in pids}
    parts = {p: None for p in pids}  # the lowest reading's RssAnon/RssFile/RssShmem
    with counters.quiet:
        for i in range(reads):
            if i:
                time.sleep(gap)
            for p in pids:
                m = mem_kib(p)
                if m is None:
                    continue
                r = m["VmRSS"]
                if lo[p] is None or r < lo[p]:
                    lo[p], parts[p] = r, m
                hi[p] = r if hi[p] is None else max(hi[p], r)
    return lo, hi, parts


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def metrics(port):
    """Gauges and counters of interest from /metrics (summed over label sets)."""
    want = ("forkd_open_connections", "forkd_sse_streams", "forkd_websocket_clients",
            "forkd_workers", "forkd_worker_restarts_total")
    out = {}
    try:
        c = http.client.HTTPConnection(HOST, port, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode("utf-8", "replace")
        c.close()
    except (OSError, http.client.HTTPException):
        return out
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in want:
            try:
                out[name] = out.get(name, 0) + float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                pass
    return out


# --- the /health prober (its own process) ----------------------------------------

def prober(port, rate, pipe, burst_flag):
    """GET /health `rate` times a second on one keep-alive connection. On "snap"
    from the pipe: reply with this period's latencies (ms) and errors, reset."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops us
    quiet, burst, errors = [], [], 0
    conn = None
    period = 1.0 / rate
    parent = os.getppid()
    nxt = time.monotonic()
    while True:
        while pipe.poll(0):
            msg = pipe.recv()
            if msg == "stop":
                return
            q, b = sorted(quiet), sorted(burst)
            allv = sorted(q + b)
            pipe.send({"n": len(allv), "errors": errors,
                       "p50": pct(allv, 50), "p99": pct(allv, 99), "max": allv[-1] if allv else float("nan"),
                       "quiet_p99": pct(q, 99), "burst_p99": pct(b, 99), "burst_n": len(b)})
            quiet, burst, errors = [], [], 0
        if os.getppid() != parent:  # the driver is gone: so are we
            return
        now = time.monotonic()
        if now < nxt:
            time.sleep(min(nxt - now, 0.05))
            continue
        nxt += period
        if nxt < now - 1:  # far behind (machine stalled): do not burst to catch up
            nxt = now + period
        in_burst = burst_flag.value != 0
        try:
            if conn is None:
                conn = http.client.HTTPConnection(HOST, port, timeout=10)
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t0 = time.perf_counter()
            conn.request("GET", "/health")
            r = conn.getresponse()
            r.read()
            ms = (time.perf_counter() - t0) * 1000
            if r.status != 200:
                errors += 1  # counted as an error, not as a latency
            else:
                (burst if in_burst or burst_flag.value != 0 else quiet).append(ms)
        except (OSError, http.client.HTTPException):
            errors += 1
            if conn is not None:
                conn.close()
            conn = None


# --- SSE and WebSocket clients (their own process, one selector) -------------------

class Stream:
    """One SSE or WebSocket client connection."""
    __slots__ = ("kind", "sock", "state", "buf", "room", "last_rx")

    def __init__(self, kind, sock, room=None):
        self.kind, self.sock, self.state, self.buf, self.room = kind, sock, "connecting", b"", room
        self.last_rx = time.monotonic()


HEARTBEAT = b"event: heartbeat"


class Clients:
    """Keeps `n_sse` SSE streams and `n_ws` WebSocket clients open, chats, counts."""

    def __init__(self, port, n_sse, n_ws, rooms, chat_rate, token_file, heartbeat_s, inflight):
        self.port, self.n_sse, self.n_ws, self.rooms = port, n_sse, n_ws, rooms
        self.chat_rate, self.token_file, self.heartbeat_s, self.inflight = chat_rate, token_file, heartbeat_s, inflight
        self.sel = selectors.DefaultSelector()
        self.sse_alive = 0
        self.ws_ready = []  # ready WebSocket clients (for picking senders)
        self.members = [0] * rooms
        self.connecting = 0
        self.todo = []  # (not before, kind, room) to (re)open
        self.c = self.zero()
        self.sse_req = (f"GET /api/events HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                        "Accept: text/event-stream\r\n\r\n").encode()
        self.seq = 0

    @staticmethod
    def zero():
        return {"sse_deaths": 0, "sse_open_failed": 0, "sse_opened": 0, "heartbeats": 0,
                "ws_deaths": 0, "ws_open_failed": 0, "ws_opened": 0, "ws_error_frames": 0,
                "chat_sent": 0, "chat_expected": 0, "chat_received": 0, "send_failed": 0}

    # -- opening
    def start(self, kind, room):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = s.connect_ex((HOST, self.port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            self.failed_open(kind, room)
            return
        st = Stream(kind, s, room)
        self.connecting += 1
        self.sel.register(s, selectors.EVENT_WRITE, st)

    def failed_open(self, kind, room):
        self.c["sse_open_failed" if kind == "sse" else "ws_open_failed"] += 1
        self.todo.append((time.monotonic() + 0.5, kind, room))  # retry, not in a tight loop

    def opened(self, st):
        self.connecting -= 1
        st.state = "open"
        if st.kind == "sse":
            self.sse_alive += 1
            self.c["sse_opened"] += 1
        else:
            self.ws_ready.append(st)
            self.members[st.room] += 1
            self.c["ws_opened"] += 1
            try:
                st.sock.sendall(frame(0x1, json.dumps({"type": "join", "roomId": f"soak-{st.room}"}).encode()))
            except OSError:
                self.lost(st)

    def lost(self, st):
        """A connection ended or failed: count it and queue its replacement."""
        try:
            self.sel.unregister(st.sock)
        except (KeyError, ValueError):
            pass
        st.sock.close()
        if st.state == "open":
            if st.kind == "sse":
                self.sse_alive -= 1
                self.c["sse_deaths"] += 1
            else:
                self.ws_ready.remove(st)
                self.members[st.room] -= 1
                self.c["ws_deaths"] += 1
            self.todo.append((time.monotonic(), st.kind, st.room))
        else:
            self.connecting -= 1
            self.failed_open(st.kind, st.room)
        st.state = "dead"

    def pump_opens(self):
        now = time.monotonic()
        if not self.todo or self.connecting >= self.inflight:
            return
        keep = []
        for item in self.todo:
            if self.connecting < self.inflight and item[0] <= now:
                self.start(item[1], item[2])
            else:
                keep.append(item)
        self.todo = keep

    # -- events
    def on_event(self, st, mask):
        if st.state == "connecting":
            err = st.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.lost(st)
                return
            if st.kind == "sse":
                st.sock.sendall(self.sse_req)
            else:
                st.sock.sendall(upgrade_request(HOST, self.port, read_token(self.token_file)))
            st.state = "head"
            self.sel.modify(st.sock, selectors.EVENT_READ, st)
            return
        try:
            data = st.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self.lost(st)
            return
        if not data:
            self.lost(st)
            return
        st.last_rx = time.monotonic()
        if st.kind == "sse":
            self.on_sse(st, data)
        else:
            self.on_ws(st, data)

    def on_sse(self, st, data):
        if st.state == "head":
            st.buf += data
            if b"event: connected" not in st.buf:
                if len(st.buf) > 65536:
                    self.lost(st)
                return
            if not st.buf.startswith(b"HTTP/1.1 200"):
                self.lost(st)
                return
            self.opened(st)
            data, st.buf = st.buf, b""
        # Count heartbeats; keep a tail shorter than the marker so that one split
        # over two reads is still counted, and none twice.
        buf = st.buf + data
        self.c["heartbeats"] += buf.count(HEARTBEAT)
        st.buf = buf[-(len(HEARTBEAT) - 1):]

    def on_ws(self, st, data):
        st.buf += data
        if st.state == "head":
            try:
                rest = upgrade_response(st.buf)
            except OSError:  # not a 101
                self.lost(st)
                return
            if rest is None:
                return
            st.buf, st.state = rest, "upgraded"
        frames, st.buf = parse_frames(st.buf)
        for op, payload in frames:
            if op == 0x9:  # ping: pong with the same payload
                try:
                    st.sock.sendall(frame(0xA, payload))
                except OSError:
                    self.lost(st)
                    return
            elif op == 0x8:  # close
                self.lost(st)
                return
            elif op == 0x1:
                if b'"type":"chat"' in payload:
                    self.c["chat_received"] += 1
                elif st.state == "upgraded" and b'"type":"connected"' in payload:
                    self.opened(st)
                elif b'"type":"error"' in payload:
                    self.c["ws_error_frames"] += 1

    def chat(self):
        if not self.ws_ready:
            return
        st = random.choice(self.ws_ready)
        self.seq += 1
        msg = frame(0x1, json.dumps({"type": "chat", "roomId": f"soak-{st.room}",
                                        "content": f"soak message {self.seq}"}).encode())
        try:
            st.sock.sendall(msg)  # small; fits the socket's send buffer
        except BlockingIOError:
            self.c["send_failed"] += 1
            return
        except OSError:
            self.c["send_failed"] += 1
            self.lost(st)
            return
        self.c["chat_sent"] += 1
        self.c["chat_expected"] += self.members[st.room]

    def stale(self):
        """Open SSE streams silent for 2.5 heartbeats; open WebSockets silent for 75 s."""
        now = time.monotonic()
        sse = ws = 0
        for key in list(self.sel.get_map().values()):
            st = key.data
            if st.state != "open":
                continue
            if st.kind == "sse" and now - st.last_rx > 2.5 * self.heartbeat_s:
                sse += 1
            elif st.kind == "ws" and now - st.last_rx > 75:
                ws += 1
        return sse, ws

    def snapshot(self):
        c, self.c = self.c, self.zero()
        stale_sse, stale_ws = self.stale()
        c.update(sse_alive=self.sse_alive, ws_alive=len(self.ws_ready), stale_sse=stale_sse, stale_ws=stale_ws,
                 connecting=self.connecting, waiting=len(self.todo))
        return c

    def run(self, pipe, setup_timeout):
        now = time.monotonic()
        # Interleave the kinds so that both are set up from the start.
        for i in range(max(self.n_sse, self.n_ws)):
            if i < self.n_ws:
                self.todo.append((now, "ws", i % self.rooms))
            if i < self.n_sse:
                self.todo.append((now, "sse", None))
        t_setup = time.monotonic()
        ready_sent = False
        chatting = False
        next_chat = 0.0
        period = 1.0 / self.chat_rate if self.chat_rate > 0 else None
        parent = os.getppid()
        while True:
            if os.getppid() != parent:  # the driver is gone: so are we
                return
            self.pump_opens()
            for key, mask in self.sel.select(timeout=0.01):
                self.on_event(key.data, mask)
            now = time.monotonic()
            if not ready_sent:
                done = self.sse_alive >= self.n_sse and len(self.ws_ready) >= self.n_ws
                if done or now - t_setup > setup_timeout:
                    c = self.snapshot()
                    c["setup_s"] = now - t_setup
                    pipe.send(("ready", c))
                    ready_sent = True
            while pipe.poll(0):
                msg = pipe.recv()
                if msg == "stop":
                    return
                if msg == "chat":
                    chatting, next_chat = True, time.monotonic()
                elif msg == "snap":
                    pipe.send(("snap", self.snapshot()))
            if chatting and period:
                n = 0
                while now >= next_chat and n < 10:
                    self.chat()
                    next_chat += period
                    n += 1
                if now - next_chat > 1:  # stalled: do not catch up in one go
                    next_chat = now


def clients_main(port, n_sse, n_ws, rooms, chat_rate, token_file, heartbeat_s, inflight, setup_timeout, pipe):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Clients(port, n_sse, n_ws, rooms, chat_rate, token_file, heartbeat_s, inflight).run(pipe, setup_timeout)


# --- wrk -----------------------------------------------------------------------

WRK = {"proc": None}  # the running wrk, if any (stopped on exit)


def wrk_ms(v):
    m = re.match(r"^([0-9.]+)(us|ms|s|m)$", v)
    if not m:
        return float("nan")
    n = float(m.group(1))
    return {"us": n / 1000, "ms": n, "s": n * 1000, "m": n * 60000}[m.group(2)]


def run_wrk(url, secs, headers, burst_flag):
    """One bounded wrk -t1 -c4 burst; returns {requests, errors, p50, p99}."""
    cmd = ["wrk", "-t1", "-c4", f"-d{secs}s", "--latency", "--timeout", "5s"]
    for h in headers:
        cmd += ["-H", h]
    cmd.append(url)
    burst_flag.value = 1
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        WRK["proc"] = p
        try:
            out, _ = p.communicate(timeout=secs + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
    finally:
        WRK["proc"] = None
        burst_flag.value = 0
    res = {"requests": 0, "errors": 0, "p50": float("nan"), "p99": float("nan"), "ok": p.returncode == 0}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[1] == "requests" and f[2] == "in":
            res["requests"] = int(f[0])
        elif line.strip().startswith("Non-2xx or 3xx responses:"):
            res["errors"] += int(f[-1])
        elif line.strip().startswith("Socket errors:"):
            res["errors"] += sum(int(x) for x in re.findall(r"\d+", line))
        elif len(f) == 2 and f[0] == "50%":
            res["p50"] = wrk_ms(f[1])
        elif len(f) == 2 and f[0] == "99%":
            res["p99"] = wrk_ms(f[1])
    if not res["ok"]:
        res["errors"] += 1
        res["raw"] = out[-500:]
    return res


# --- the driver ----------------------------------------------------------------

class Counters:
    """Counters shared by the driver's threads, taken and reset once a minute."""

    def __init__(self):
        self.lock = threading.Lock()
        self.d = self.zero()
        # Held by a login or a download while it is in flight, and by the
        # sampler while it reads memory: the readings see neither.
        self.quiet = threading.Lock()

    @staticmethod
    def zero():
        return {"logins": 0, "login_errors": 0, "downloads": 0, "download_errors": 0, "download_bytes": 0}

    def add(self, k, n=1):
        with self.lock:
            self.d[k] += n

    def take(self):
        with self.lock:
            d, self.d = self.d, self.zero()
        return d


def login_loop(a, password, counters, stop):
    period = 1.0 / a.login_rate
    nxt = time.monotonic()
    while not stop.is_set():
        nxt += period
        try:
            with counters.quiet:
                token = login(a.port, a.email, password)
            write_token(a.token_file, token)
            counters.add("logins")
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            counters.add("login_errors")
        delay = nxt - time.monotonic()
        if delay < -5:
            nxt = time.monotonic()
        stop.wait(max(0.0, delay))


def download_loop(a, counters, stop):
    nxt = time.monotonic()
    while not stop.is_set():
        nxt += a.download_every
        try:
            with counters.quiet:
                c = http.client.HTTPConnection(HOST, a.port, timeout=60)
                c.request("GET", f"/download/{a.download}")
                r = c.getresponse()
                n = 0
                while True:
                    chunk = r.read(262144)
                    if not chunk:
                        break
                    n += len(chunk)
                c.close()
            if r.status == 200 and n == a.download_size:
                counters.add("downloads")
                counters.add("download_bytes", n)
            else:
                counters.add("download_errors")
        except (OSError, http.client.HTTPException):
            counters.add("download_errors")
        stop.wait(max(0.0, nxt - time.monotonic()))


def ask(pipe, msg, timeout=20):
    while pipe.poll(0):  # a late answer to an earlier question (it timed out): drop it
        pipe.recv()
    pipe.send(msg)
    if not pipe.poll(timeout):
        return None
    return pipe.recv()


def fmt(v, spec=".1f", width=0):
    s = "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)
    return s.rjust(width)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--supervisor", type=int, required=True, help="the supervisor's pid")
    ap.add_argument("--user-id", type=int, required=True)
    ap.add_argument("--email", required=True)
    ap.add_argument("--password-file", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (token file)")
    ap.add_argument("--download", required=True, help="file name under download.dir")
    ap.add_argument("--download-size", type=int, required=True, help="its size in bytes")
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2, help="workers forkd runs")
    ap.add_argument("--sse", type=int, default=2000, help="SSE streams kept open")
    ap.add_argument("--ws", type=int, default=500, help="WebSocket clients kept open")
    ap.add_argument("--rooms", type=int, default=25, help="chat rooms the WebSocket clients are spread over")
    ap.add_argument("--chat-rate", type=float, default=50, help="chat messages per second, in total")
    ap.add_argument("--login-rate", type=float, default=1, help="logins per second")
    ap.add_argument("--download-every", type=float, default=5, help="seconds between downloads")
    ap.add_argument("--probe-rate", type=float, default=20, help="/health probes per second")
    ap.add_argument("--burst", type=int, default=5, help="seconds of each wrk burst (3 a minute)")
    ap.add_argument("--heartbeat", type=float, default=15, help="sse.heartbeat_ms of the server, in s")
    ap.add_argument("--rss-reads", type=int, default=20,
                    help="VmRSS readings (0.1 s apart) per sample; the lowest counts")
    ap.add_argument("--growth-target", type=float, default=5.0, help="RSS growth target, percent")
    a = ap.parse_args()
    if a.burst > 14:
        ap.error("--burst must be at most 14 s (three bursts fit in a minute with the sample)")
    a.token_file = os.path.join(a.work, "token")
    with open(a.password_file) as f:
        password = f.read().strip()

    # SIGTERM/SIGINT from the wrapper: unwind through the finally below.
    def on_signal(signum, _):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    base = f"http://{HOST}:{a.port}"
    helpers = []
    counters = Counters()
    stop = threading.Event()
    threads = []
    try:
        write_token(a.token_file, login(a.port, a.email, password))

        burst_flag = mp.Value("i", 0, lock=False)
        probe_pipe, probe_end = mp.Pipe()
        pr = mp.Process(target=prober, args=(a.port, a.probe_rate, probe_end, burst_flag), daemon=True)
        cl_pipe, cl_end = mp.Pipe()
        cl = mp.Process(target=clients_main, daemon=True,
                        args=(a.port, a.sse, a.ws, a.rooms, a.chat_rate, a.token_file, a.heartbeat, 128, 180, cl_end))
        for p in (cl, pr):
            p.start()
            helpers.append(p)

        sup = a.supervisor
        workers0 = children_of(sup)
        t_setup = time.monotonic()
        if not cl_pipe.poll(240):
            print("soak: the SSE/WebSocket clients did not report within 240 s", file=sys.stderr)
            return 1
        _, ready = cl_pipe.recv()
        print(f"set-up: {ready['sse_alive']} / {a.sse} SSE streams and {ready['ws_alive']} / {a.ws} WebSocket"
              f" clients open in {ready['setup_s']:.1f} s ({ready['sse_open_failed']} + {ready['ws_open_failed']}"
              " failed attempts)", flush=True)
        if ready["sse_alive"] == 0 and ready["ws_alive"] == 0:
            print("soak: no stream could be opened", file=sys.stderr)
            return 1
        time.sleep(2)  # let the joins land on every worker before the first chat
        cl_pipe.send("chat")
        for fn, args in ((login_loop, (a, password, counters, stop)), (download_loop, (a, counters, stop))):
            t = threading.Thread(target=fn, args=args, daemon=True)
            t.start()
            threads.append(t)
        m0, _, _ = memory_readings([sup] + workers0, counters, a.rss_reads, 0.1)
        # Minute 1 starts now: drop what the set-up period counted.
        ask(probe_pipe, "snap")
        ask(cl_pipe, "snap")
        counters.take()

        n_w = max(a.workers, len(workers0))
        slots = list(workers0) + [None] * (n_w - len(workers0))
        head = (f"{'min':>3} | {'RSS MiB sup':>11}" + "".join(f" {'w' + str(i + 1):>5}" for i in range(n_w))
                + f" | {'fds sup':>7}" + "".join(f" {'w' + str(i + 1):>5}" for i in range(n_w))
                + f" | {'wpids':>7} | {'/health p50':>11} {'p99 ms':>6} | {'SSE alive':>9} | {'WS recv/expected':>17}"
                f" | {'requests':>8} | {'errors':>6}")
        print()
        print(f"load: wrk -t1 -c4 bursts of {a.burst} s at seconds 10 (/health), 25 (/api/config) and 40"
              f" (/api/v1/users/{a.user_id}, bearer) of each minute, one at a time; {a.sse} SSE streams;"
              f" {a.ws} WebSocket clients in {a.rooms} rooms, {a.chat_rate:g} chat messages/s;"
              f" {a.login_rate:g} login/s; one {a.download_size >> 20} MiB download every {a.download_every:g} s;"
              f" /health prober {a.probe_rate:g}/s on one keep-alive connection (latency columns)")
        print(f"sample at the end of each minute, no wrk running: RSS = the lowest of {a.rss_reads} VmRSS readings"
              f" 0.1 s apart ({0.1 * (a.rss_reads - 1):.1f} s) with our logins and downloads paused (RSS hi below);"
              " fds = entries of /proc/PID/fd; requests = HTTP requests completed in the minute;"
              " errors = failed requests + stream deaths + WebSocket error frames")
        print(f"baseline after set-up: supervisor {sup} {fmt(m0[sup] / 1024 if m0[sup] else None)} MiB, workers "
              + ", ".join(f"{p} {fmt(m0[p] / 1024 if m0[p] else None)} MiB" for p in workers0))
        print()
        print(head)
        print("-" * len(head), flush=True)

        routes = [(10, "/health", []), (25, "/api/config", []), (40, f"/api/v1/users/{a.user_id}", None)]
        rows = []
        t0 = time.monotonic()  # minute 1 starts here
        for minute in range(1, a.minutes + 1):
            start = t0 + 60 * (minute - 1)
            wrk = {}
            for offset, path, headers in routes:
                delay = start + offset - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if headers is None:
                    headers = [f"Authorization: Bearer {read_token(a.token_file)}"]
                wrk[path] = run_wrk(base + path, a.burst, headers, burst_flag)
            delay = start + 60 - time.monotonic()
            if delay > 0:
                time.sleep(delay)

            # --- the sample (no wrk runs now)
            kids = children_of(sup)
            changed = [p for p in slots if p is not None and p not in kids]
            new = [p for p in kids if p not in slots]
            for i, p in enumerate(slots):  # a replaced worker takes its predecessor's column
                if p is not None and p not in kids:
                    slots[i] = None
            for p in new:
                if None in slots:
                    slots[slots.index(None)] = p
                else:
                    slots.append(p)
            procs = [sup] + slots
            # The minute's counts first (so each minute covers 60 s), then memory.
            probe = ask(probe_pipe, "snap") or {}
            cs = ask(cl_pipe, "snap")
            cs = cs[1] if cs else {}
            cnt = counters.take()
            fds = [fd_count(p) if p else None for p in procs]
            met = metrics(a.port)
            lo, hi, parts = memory_readings([p for p in procs if p], counters, a.rss_reads, 0.1)
            rss = [lo.get(p) if p else None for p in procs]
            rss_hi = [hi.get(p) if p else None for p in procs]
            rss_parts = [parts.get(p) if p else None for p in procs]
            wrk_req = sum(w["requests"] for w in wrk.values())
            wrk_err = sum(w["errors"] for w in wrk.values())
            requests = wrk_req + probe.get("n", 0) + probe.get("errors", 0) + cnt["logins"] + cnt["login_errors"] \
                + cnt["downloads"] + cnt["download_errors"]
            errors = wrk_err + probe.get("errors", 0) + cnt["login_errors"] + cnt["download_errors"] \
                + cs.get("sse_deaths", 0) + cs.get("ws_deaths", 0) + cs.get("ws_error_frames", 0) \
                + cs.get("send_failed", 0)
            row = {"minute": minute, "procs": procs, "rss": rss, "rss_hi": rss_hi, "rss_parts": rss_parts, "fds": fds, "died": changed, "new": new,
                   "probe": probe, "clients": cs, "counters": cnt, "wrk": wrk, "metrics": met,
                   "requests": requests, "errors": errors, "load": os.getloadavg()[0]}
            rows.append(row)
            mib = [fmt(r / 1024 if r else None, ".1f") for r in rss]
            pids = "same" if not changed and not new else f"{len(changed)} gone"
            recv = f"{cs.get('chat_received', 0)}/{cs.get('chat_expected', 0)}"
            print(f"{minute:>3} | {mib[0]:>11}" + "".join(f" {m:>5}" for m in mib[1:])
                  + f" | {fmt(fds[0], 'd'):>7}" + "".join(f" {fmt(f, 'd'):>5}" for f in fds[1:])
                  + f" | {pids:>7} | {fmt(probe.get('p50'), '.2f'):>11} {fmt(probe.get('p99'), '.2f'):>6}"
                  f" | {cs.get('sse_alive', 0):>9} | {recv:>17} | {requests:>8} | {errors:>6}", flush=True)

        report(a, rows, sup, m0)
        return 0
    finally:
        stop.set()
        p = WRK["proc"]
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        for h in helpers:
            if h.is_alive():
                h.terminate()
            h.join(5)
            if h.is_alive():
                h.kill()
                h.join(2)


def report(a, rows, sup, m0):
    """The detail table, then the verdict."""
    print()
    print("details per minute (wrk: requests in its burst and wrk's own p99 ms; prober p99 outside/during the"
          " bursts; logins, downloads; SSE/WS as the clients saw them; server: /metrics gauges at the sample;"
          " RSS hi: the highest of the readings whose lowest is in the table, supervisor first; anon: RssAnon of"
          " that lowest reading; load average):")
    head = (f"{'min':>3} | {'wrk /health':>15} {'/api/config':>15} {'/users/{id}':>15} | {'probe n':>7}"
            f" {'quiet p99':>9} {'burst p99':>9} {'max':>7} | {'logins':>6} {'dl':>4} | {'SSE deaths':>10}"
            f" {'stale':>5} {'beats':>6} | {'WS alive':>8} {'deaths':>6} {'err':>4} | {'srv sse':>7} {'ws':>4}"
            f" {'conns':>5} | {'RSS hi MiB':>16} | {'anon MiB':>16} | {'load':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        w, p, c, n, m = r["wrk"], r["probe"], r["clients"], r["counters"], r["metrics"]

        def wcol(path):
            x = next((v for k, v in w.items() if k.startswith(path)), None)
            if not x:
                return "-"
            return f"{x['requests']} {fmt(x['p99'], '.1f')}" + (f" E{x['errors']}" if x["errors"] else "")
        print(f"{r['minute']:>3} | {wcol('/health'):>15} {wcol('/api/config'):>15} {wcol('/api/v1/users'):>15}"
              f" | {p.get('n', 0):>7} {fmt(p.get('quiet_p99'), '.2f'):>9} {fmt(p.get('burst_p99'), '.2f'):>9}"
              f" {fmt(p.get('max'), '.1f'):>7} | {n['logins']:>6} {n['downloads']:>4}"
              f" | {c.get('sse_deaths', 0):>10} {c.get('stale_sse', 0):>5} {c.get('heartbeats', 0):>6}"
              f" | {c.get('ws_alive', 0):>8} {c.get('ws_deaths', 0):>6} {c.get('ws_error_frames', 0):>4}"
              f" | {fmt(m.get('forkd_sse_streams'), '.0f'):>7} {fmt(m.get('forkd_websocket_clients'), '.0f'):>4}"
              f" {fmt(m.get('forkd_open_connections'), '.0f'):>5}"
              f" | {' '.join(fmt(x / 1024 if x else None, '.1f') for x in r['rss_hi']):>16}"
              f" | {' '.join(fmt(x['RssAnon'] / 1024 if x and 'RssAnon' in x else None, '.2f') for x in r['rss_parts']):>16}"
              f" | {r['load']:>5.2f}")

    if not rows:
        print("\nno minute completed: no verdict")
        return
    first, last = rows[0], rows[-1]
    print()
    print(f"verdict ({len(rows)} minute(s); minute 1 vs minute {last['minute']}):")
    # RSS
    growth_ok = True
    names = ["supervisor"] + [f"worker {i}" for i in range(1, len(last["procs"]))]
    for i, name in enumerate(names):
        a_pid = first["procs"][i] if i < len(first["procs"]) else None
        b_pid = last["procs"][i]
        ra = first["rss"][i] if i < len(first["rss"]) else None
        rb = last["rss"][i]
        if ra is None or rb is None:
            print(f"  RSS {name:<11} -")
            growth_ok = False
            continue
        g = (rb - ra) / ra * 100
        series = [r["rss"][i] for r in rows if i < len(r["rss"]) and r["rss"][i]]
        if a_pid == b_pid:
            ok = g <= a.growth_target
            growth_ok &= ok
            judged = f"target <= {a.growth_target:g} %: {'met' if ok else 'MISSED'}"
        else:
            growth_ok = False
            judged = f"not judged: pid {a_pid} was replaced by {b_pid}"
        print(f"  RSS {name:<11} {ra / 1024:6.1f} -> {rb / 1024:6.1f} MiB  {g:+6.1f} %"
              f"  (min {min(series) / 1024:.1f}, max {max(series) / 1024:.1f})  {judged}")
        pa = first["rss_parts"][i] if i < len(first["rss_parts"]) else None
        pb = last["rss_parts"][i]
        if pa and pb and all(k in pa and k in pb for k in ("RssAnon", "RssFile", "RssShmem")):
            print("      " + ", ".join(f"{k[3:].lower()} {pa[k] / 1024:.2f} -> {pb[k] / 1024:.2f} MiB"
                                      f" ({pb[k] - pa[k]:+d} KiB)" for k in ("RssAnon", "RssFile", "RssShmem")))
    # fds
    fds_ok = True
    for i, name in enumerate(names):
        series = [r["fds"][i] for r in rows if i < len(r["fds"]) and r["fds"][i] is not None]
        if not series:
            continue
        spread = max(series) - min(series)
        flat = spread <= max(4, 0.01 * max(series))
        fds_ok &= flat
        print(f"  fds {name:<11} {series[0]:>5} -> {series[-1]:>5}  (range {min(series)}-{max(series)}):"
              f" {'flat' if flat else 'NOT flat'}")
    # deaths
    deaths = sum(len(r["died"]) for r in rows)
    restarts = last["metrics"].get("forkd_worker_restarts_total")
    print(f"  worker deaths: {deaths} seen as pid changes; forkd_worker_restarts_total {fmt(restarts, '.0f')}"
          f" -> {'none' if deaths == 0 and not restarts else 'WORKERS DIED'}")
    # p99
    p99 = [r["probe"].get("p99", float("nan")) for r in rows]
    quiet = [r["probe"].get("quiet_p99", float("nan")) for r in rows]
    third = max(1, len(rows) // 3)
    early, late = median(p99[:third]), median(p99[-third:])
    ratio = late / early if early and not math.isnan(early) and not math.isnan(late) else float("nan")
    steady = not math.isnan(ratio) and ratio <= 1.5
    good = [v for v in p99 if not math.isnan(v)]
    gq = [v for v in quiet if not math.isnan(v)]
    print(f"  /health p99 (prober): range {fmt(min(good) if good else None, '.2f')}-"
          f"{fmt(max(good) if good else None, '.2f')} ms, median of the first {third} minute(s) {fmt(early, '.2f')},"
          f" of the last {third} {fmt(late, '.2f')} (x{fmt(ratio, '.2f')}):"
          f" {'steady' if steady else 'NOT steady'} (steady: x <= 1.5);"
          f" outside wrk bursts {fmt(min(gq) if gq else None, '.2f')}-{fmt(max(gq) if gq else None, '.2f')} ms")
    # totals
    tot = lambda f: sum(f(r) for r in rows)  # noqa: E731
    wrk_req = tot(lambda r: sum(w["requests"] for w in r["wrk"].values()))
    wrk_err = tot(lambda r: sum(w["errors"] for w in r["wrk"].values()))
    probes = tot(lambda r: r["probe"].get("n", 0))
    probe_err = tot(lambda r: r["probe"].get("errors", 0))
    logins = tot(lambda r: r["counters"]["logins"])
    login_err = tot(lambda r: r["counters"]["login_errors"])
    dls = tot(lambda r: r["counters"]["downloads"])
    dl_err = tot(lambda r: r["counters"]["download_errors"])
    dl_bytes = tot(lambda r: r["counters"]["download_bytes"])
    sent = tot(lambda r: r["clients"].get("chat_sent", 0))
    recv = tot(lambda r: r["clients"].get("chat_received", 0))
    exp = tot(lambda r: r["clients"].get("chat_expected", 0))
    sse_d = tot(lambda r: r["clients"].get("sse_deaths", 0))
    ws_d = tot(lambda r: r["clients"].get("ws_deaths", 0))
    ws_e = tot(lambda r: r["clients"].get("ws_error_frames", 0))
    beats = tot(lambda r: r["clients"].get("heartbeats", 0))
    alive = [r["clients"].get("sse_alive", 0) for r in rows]
    wsalive = [r["clients"].get("ws_alive", 0) for r in rows]
    print(f"  totals: {tot(lambda r: r['requests'])} HTTP requests ({wrk_req} by wrk, {wrk_err} wrk errors;"
          f" {probes} probes, {probe_err} failed; {logins} logins, {login_err} failed;"
          f" {dls} downloads ({dl_bytes / 2**20:.0f} MiB), {dl_err} failed)")
    print(f"          SSE: alive {min(alive)}-{max(alive)} of {a.sse}, {sse_d} deaths, {beats} heartbeats;"
          f" WebSocket: alive {min(wsalive)}-{max(wsalive)} of {a.ws}, {ws_d} deaths, {ws_e} error frames;"
          f" chat: {sent} sent, {recv} / {exp} deliveries ({recv / exp * 100 if exp else 0:.3f} %)")
    print(f"          errors (HTTP + stream deaths + WS error frames): {tot(lambda r: r['errors'])}")
    print(f"  overall: RSS {'met' if growth_ok else 'MISSED'}, fds {'flat' if fds_ok else 'NOT flat'},"
          f" worker deaths {deaths}, p99 {'steady' if steady else 'NOT steady'}")


if __name__ == "__main__":
    sys.exit(main())
