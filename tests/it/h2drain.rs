//! No HTTP/2 request fails while workers are replaced (SIGHUP) or handed over to a new
//! supervisor (SIGUSR2), counted the way a correct client counts (CONTRACT §9, §11;
//! RFC 9113 §6.8, §8.7): the small, bounded version of `bin/drain-test --proto h2c`.
//!
//! The load is a raw HTTP/2 client written here (frames on a blocking socket, one thread
//! per connection slot, each keeping [`STREAMS`] streams in flight on `GET /health` or on a 20 ms pool job), so it
//! sees every frame and every close itself. A request is *retried* iff the server marked
//! it unprocessed: its stream id is above the `last_stream_id` of a GOAWAY on its
//! connection, or it was reset with `REFUSED_STREAM`. A connection that got a GOAWAY opens
//! no new stream; the slot moves to a new connection once the old one's remaining streams
//! are answered. Everything else is a *failure*: a reset with another code, a stream in
//! flight (at or below the GOAWAY's `last_stream_id`, or with no GOAWAY at all) when the
//! connection closes, a status other than 200, no answer in time, a refused connect (the
//! listening sockets never close in these scenarios), and a connection the server closes
//! without any GOAWAY even with nothing in flight (a client that had just sent a request
//! would have lost it). The tests also require GOAWAYs to have been seen, so they cannot
//! pass without connections being drained at all.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use crate::drainload::{hup_replaces_every_worker, Load, Report, Slot};
use crate::upgrade::upgrade_completes;
use crate::util::*;

/// Connection slots (one thread each).
const CONNS: usize = 8;
/// What the streams ask for, in turn on every connection: answers at once, and answers
/// after a pool job of 20 ms (so a draining worker always holds streams it has accepted and
/// not answered, whichever connections the supervisor gave it).
const PATHS: [&str; 2] = ["/health", "/_debug/sleep?ms=20"];
/// Streams kept in flight per connection.
const STREAMS: usize = 8;
/// The load never starts more requests than this, nor runs longer than [`MAX_RUN`].
const MAX_REQUESTS: u64 = 400_000;
const MAX_RUN: Duration = Duration::from_secs(12);
/// Answers that prove the traffic flows (before or after an event).
const FLOWING: u64 = 200;
/// Bound for workers to be replaced / to exit.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// One read's wait.
const TICK: Duration = Duration::from_millis(10);

use crate::h2util::wire::*;

/// One load thread: a connection at a time.
struct Client {
    addr: SocketAddr,
    s: Slot,
}

/// The HTTP/2 load: [`CONNS`] threads, each a [`Client`].
fn start_load(addr: SocketAddr) -> Load {
    Load::start("HTTP/2", CONNS, MAX_RUN, move |s| Client { addr, s }.run())
}

/// How a connection ended.
enum End {
    /// The load stops.
    Stop,
    /// Its GOAWAY's streams are all answered: the slot opens a new one.
    Drained,
    /// It broke (the failures are counted): the slot opens a new one.
    Broken,
}

impl Client {
    fn run(mut self) {
        while !self.s.stopping() {
            match self.connection() {
                End::Stop => return,
                End::Drained | End::Broken => {}
            }
        }
    }

    fn fail(&self, what: String) {
        self.s.fail(false, what);
    }

    /// One connection, until it ends.
    fn connection(&mut self) -> End {
        let mut sock = match TcpStream::connect_timeout(&self.addr, IO_TIMEOUT) {
            Ok(s) => s,
            Err(e) => {
                self.fail(format!("connect: {e}"));
                thread::sleep(Duration::from_millis(50));
                return End::Broken;
            }
        };
        self.s.c.conns.fetch_add(1, Ordering::Relaxed);
        let _ = sock.set_nodelay(true);
        let _ = sock.set_read_timeout(Some(TICK));
        let mut out = PREFACE.to_vec();
        frame(&mut out, SETTINGS, 0, 0, &[]);
        // The whole connection window at once: no WINDOW_UPDATE per answer.
        frame(&mut out, WINDOW_UPDATE, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes());
        let authority = self.addr.to_string();
        let mut next_id: u32 = 1;
        // Stream id -> (started, status once its head came).
        let mut inflight: BTreeMap<u32, (Instant, Option<u16>)> = BTreeMap::new();
        let mut goaway: Option<u32> = None;
        let mut input: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let stopping = self.s.stopping();
            if stopping && inflight.is_empty() {
                return End::Stop;
            }
            if goaway.is_some() && inflight.is_empty() {
                return End::Drained;
            }
            while goaway.is_none()
                && !stopping
                && inflight.len() < STREAMS
                && self.s.c.started.fetch_add(1, Ordering::Relaxed) < MAX_REQUESTS
            {
                headers_frame(&mut out, next_id, &authority, PATHS[(self.s.slot + next_id as usize / 2) % PATHS.len()]);
                inflight.insert(next_id, (Instant::now(), None));
                next_id += 2;
            }
            if !out.is_empty() {
                if let Err(e) = sock.write_all(&out) {
                    return self.broken(&inflight, goaway, &format!("write: {e}"));
                }
                out.clear();
            }
            if let Some(id) = inflight.iter().find(|(_, (t, _))| t.elapsed() > IO_TIMEOUT).map(|(id, _)| *id) {
                self.fail(format!("stream {id}: no answer within {IO_TIMEOUT:?}"));
                inflight.remove(&id);
                return self.broken(&inflight, goaway, "a stream timed out");
            }
            match sock.read(&mut buf) {
                Ok(0) => return self.broken(&inflight, goaway, "EOF"),
                Ok(n) => input.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.broken(&inflight, goaway, &format!("read: {e}")),
            }
            let mut at = 0;
            while input.len() - at >= 9 {
                let h = &input[at..at + 9];
                let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                if input.len() - at - 9 < len {
                    break;
                }
                let (kind, flags) = (h[3], h[4]);
                let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                let payload = input[at + 9..at + 9 + len].to_vec();
                at += 9 + len;
                match kind {
                    SETTINGS if flags & ACK == 0 => frame(&mut out, SETTINGS, ACK, 0, &[]),
                    PING if flags & ACK == 0 => frame(&mut out, PING, ACK, 0, &payload),
                    // The status is in the first bytes of the HEADERS block (any
                    // CONTINUATION only carries more fields).
                    HEADERS => {
                        if let Some(e) = inflight.get_mut(&id) {
                            e.1 = Some(e.1.unwrap_or_else(|| status_of(header_block(flags, &payload))));
                        }
                        if flags & END_STREAM != 0 {
                            self.ended(&mut inflight, id);
                        }
                    }
                    DATA if flags & END_STREAM != 0 => self.ended(&mut inflight, id),
                    RST_STREAM if payload.len() == 4 => {
                        let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        if inflight.remove(&id).is_some() {
                            if code == REFUSED_STREAM {
                                self.s.c.retried.fetch_add(1, Ordering::Relaxed);
                            } else {
                                self.fail(format!("stream {id}: RST_STREAM code {code}"));
                            }
                        }
                    }
                    GOAWAY if payload.len() >= 8 => {
                        self.s.c.goaways.fetch_add(1, Ordering::Relaxed);
                        let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                        let last = goaway.map_or(last, |g| g.min(last));
                        goaway = Some(last);
                        let above: Vec<u32> = inflight.range(last + 1..).map(|(id, _)| *id).collect();
                        for id in above {
                            inflight.remove(&id);
                            self.s.c.retried.fetch_add(1, Ordering::Relaxed);
                        }
                        if code != 0 && !inflight.is_empty() {
                            return self.broken(&inflight, goaway, &format!("GOAWAY with error code {code}"));
                        }
                    }
                    _ => {}
                }
            }
            input.drain(..at);
        }
    }

    /// Stream `id` ended: 200 is an answer, anything else a failure.
    fn ended(&self, inflight: &mut BTreeMap<u32, (Instant, Option<u16>)>, id: u32) {
        match inflight.remove(&id) {
            Some((_, Some(200))) => {
                self.s.c.ok.fetch_add(1, Ordering::Relaxed);
            }
            Some((_, status)) => self.fail(format!("stream {id}: status {status:?}")),
            None => {}
        }
    }

    /// The connection broke: what was in flight at or below the GOAWAY (all of it without
    /// one) was cut; a close without any GOAWAY is a failure even with nothing in flight.
    fn broken(&self, inflight: &BTreeMap<u32, (Instant, Option<u16>)>, goaway: Option<u32>, why: &str) -> End {
        let mut cut = Vec::new();
        for id in inflight.keys() {
            if goaway.is_some_and(|last| *id > last) {
                self.s.c.retried.fetch_add(1, Ordering::Relaxed);
            } else {
                cut.push(*id);
            }
        }
        if !cut.is_empty() {
            self.fail(format!("{why} with stream(s) {cut:?} in flight (GOAWAY last_stream_id {goaway:?})"));
        } else if goaway.is_none() && !self.s.stopping() {
            self.fail(format!("{why} without a GOAWAY (nothing in flight)"));
        }
        End::Broken
    }
}

/// Appends a frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// `GET path` on `stream`: HPACK without the dynamic table or Huffman.
fn headers_frame(out: &mut Vec<u8>, stream: u32, authority: &str, path: &str) {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http (static table)
    for (index, value) in [(4u8, path), (1u8, authority)] {
        // Literal without indexing, indexed name (:path, :authority); values are short.
        block.push(index);
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    frame(out, HEADERS, END_STREAM | END_HEADERS, stream, &block);
}

/// The field block of a HEADERS payload (without padding and priority).
fn header_block(flags: u8, payload: &[u8]) -> &[u8] {
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 && !p.is_empty() {
        pad = usize::from(p[0]);
        p = &p[1..];
    }
    if flags & PRIORITY != 0 && p.len() >= 5 {
        p = &p[5..];
    }
    &p[..p.len().saturating_sub(pad)]
}

/// The status of a response head: its first field, `:status` (RFC 9113 §8.3). Only the
/// static table's indexed statuses are decoded; any other first field reads as 0 (a
/// failure: `/health` answers 200, which the server sends as the indexed 0x88).
fn status_of(block: &[u8]) -> u16 {
    match block.first() {
        Some(0x88) => 200,
        Some(0x89) => 204,
        Some(0x8a) => 206,
        Some(0x8b) => 304,
        Some(0x8c) => 400,
        Some(0x8d) => 404,
        Some(0x8e) => 500,
        _ => 0,
    }
}

fn server() -> Server {
    let s = Server::builder()
        .workers(2)
        .set("rate_limit", "enabled = false")
        .env("RUST_LOG", "info,access=off")
        .top("shutdown_timeout_ms = 10000")
        .start();
    s.wait_log_line(START_TIMEOUT, |l| l.contains("ready: "));
    s
}

fn assert_flowing(load: &Load, s: &Server, when: &str) {
    load.assert_flowing(s, FLOWING, Duration::from_secs(5), when);
}

fn assert_clean(rep: &Report, min_goaways: u64, events: &[String], log: &str, what: &str) {
    rep.assert_clean("HTTP/2", min_goaways, events, log, what);
}

#[test]
fn hup_under_http2_load_fails_no_request() {
    let s = server();
    let old: BTreeSet<i32> = s.wait_workers(2, START_TIMEOUT).into_iter().collect();
    let load = start_load(s.addr());
    let mut ev = Vec::new();
    assert_flowing(&load, &s, "before SIGHUP");
    load.mark(&mut ev, &format!("SIGHUP (workers {old:?})"));
    let now = hup_replaces_every_worker(&s, &old, 2, CHANGE_TIMEOUT, "SIGHUP");
    load.mark(&mut ev, &format!("old workers gone; new {now:?}"));
    assert_flowing(&load, &s, "after SIGHUP");
    load.mark(&mut ev, "stop the load");
    let rep = load.finish();
    // Every connection open at the reload was on an old worker: each got a GOAWAY.
    assert_clean(&rep, CONNS as u64, &ev, &s.log_tail(), "SIGHUP under HTTP/2 load");
}

#[test]
fn usr2_under_http2_load_fails_no_request() {
    let mut s = server();
    let old_workers = s.wait_workers(2, START_TIMEOUT);
    let load = start_load(s.addr());
    let mut ev = Vec::new();
    assert_flowing(&load, &s, "before SIGUSR2");
    load.mark(&mut ev, &format!("SIGUSR2 (workers {old_workers:?})"));
    // `_stop` stops the new supervisor (not our child) and its workers by pid when the test ends.
    let (_stop, new_pid, log) = upgrade_completes(&mut s, &old_workers, 2, CHANGE_TIMEOUT);
    load.mark(&mut ev, &format!("old supervisor and workers gone; new supervisor {new_pid}"));
    assert_flowing(&load, &s, "after SIGUSR2");
    load.mark(&mut ev, "stop the load");
    // The load stops before the new supervisor does (`_stop` drops last).
    let rep = load.finish();
    assert_clean(&rep, CONNS as u64, &ev, &log, "SIGUSR2 under HTTP/2 load");
}
