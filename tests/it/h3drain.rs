//! No HTTP/3 request fails while workers are replaced (SIGHUP, the memory ceiling), handed
//! over to a new supervisor (SIGUSR2) or stopped (SIGTERM), counted the way a correct client
//! counts (RFC 9114 §5.2, §4.1.1): the small, bounded version of `bin/drain-test --proto h3`,
//! as `h2drain.rs` is for HTTP/2.
//!
//! The load is [`CONNS`] threads, each with its own QUIC connection (the blocking client of
//! `h3client.rs`), keeping [`STREAMS`] requests in flight (`GET /health`, or a 20 ms pool
//! job on every other thread) and re-filling as answers come. A request is *retried* iff the server marked it unprocessed: its stream ID
//! is at or above the ID of a GOAWAY on its connection, or the stream was reset with
//! `H3_REQUEST_REJECTED`. A connection that got a GOAWAY opens no new stream; once what it
//! has in flight is answered, the thread closes it and opens a new one. A connection the
//! server closes with `H3_NO_ERROR` after a GOAWAY, with nothing in flight, is fine.
//! Everything else is a *failure*: a stream reset with another code, a connection lost with
//! requests in flight below its GOAWAY's ID (or with no GOAWAY at all), a connection closed
//! without a GOAWAY or with an error code, a status other than 200, no answer (or no
//! handshake) within [`REQUEST_TIMEOUT`]. The tests also require GOAWAYs to have been seen,
//! so they cannot pass without connections being drained at all.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use quinn_proto::{ClientConfig, ConnectionError, StreamId, VarInt};

use crate::drainload::{hup_replaces_every_worker, Load, Report, Slot};
use crate::h3client::{client_config, parse, H3Client};
use crate::tls::Pki;
use crate::upgrade::upgrade_completes;
use crate::util::*;

/// Connections (one thread each).
const CONNS: usize = 8;
/// Requests kept in flight per connection.
const STREAMS: usize = 4;
/// What the threads ask for, by thread number: answers at once, and answers after a pool
/// job of 20 ms (so a draining worker always holds requests it has accepted and not answered).
const PATHS: [&str; 2] = ["/health", "/_debug/sleep?ms=20"];
/// The load never starts more requests than this, nor runs longer than [`MAX_RUN`].
const MAX_REQUESTS: u64 = 400_000;
const MAX_RUN: Duration = Duration::from_secs(60);
/// Answers that prove the traffic flows (before or after an event), and the time they get.
const FLOWING: u64 = 100;
const FLOWING_WITHIN: Duration = Duration::from_secs(10);
/// Bound for workers to be replaced / to exit.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// A request (or a handshake) not answered within this is a failure.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// One step's wait for datagrams at most.
const TICK: Duration = Duration::from_millis(50);
/// GOAWAYs one event must bring at least: each connection open then gets one, but one may
/// still be in its handshake (its first packets dropped by the draining worker), so half.
const MIN_GOAWAYS: u64 = CONNS as u64 / 2;
/// HTTP/3 error codes (RFC 9114 §8.1).
const H3_NO_ERROR: u64 = 0x100;
const H3_REQUEST_REJECTED: u64 = 0x10b;

/// One load thread: a connection at a time.
struct Client {
    addr: SocketAddr,
    config: ClientConfig,
    s: Slot,
}

/// The HTTP/3 load: [`CONNS`] threads, each a [`Client`].
fn start_load(addr: SocketAddr, config: ClientConfig) -> Load {
    Load::start("HTTP/3", CONNS, MAX_RUN, move |s| Client { addr, config: config.clone(), s }.run())
}

/// A request stream's raw ID (the number a GOAWAY carries).
fn raw(id: StreamId) -> u64 {
    VarInt::from(id).into_inner()
}

impl Client {
    fn run(self) {
        while !self.s.stopping() {
            self.connection();
        }
    }

    /// One connection, until it is drained, broken or the load stops.
    fn connection(&self) {
        let opened = Instant::now();
        let mut c = H3Client::start(self.addr, &self.config);
        self.s.c.conns.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        while c.conn.is_handshaking() && c.lost.is_none() && Instant::now() < deadline {
            if self.s.stopping() {
                return;
            }
            c.step(deadline.min(Instant::now() + TICK));
        }
        if let Some(e) = &c.lost {
            self.s.fail(true, format!("handshake: {e}"));
            return;
        }
        if c.conn.is_handshaking() {
            self.s.fail(true, format!("no handshake within {REQUEST_TIMEOUT:?}"));
            return;
        }
        self.s.c.handshake_max_ms.fetch_max(opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        // Raw stream ID -> the stream, when its request was sent.
        let mut inflight: BTreeMap<u64, (StreamId, Instant)> = BTreeMap::new();
        let mut goaway = None;
        loop {
            // A GOAWAY: the streams from its ID on were not processed.
            if goaway.is_none() {
                if let Some(limit) = c.goaway_id {
                    self.s.c.goaways.fetch_add(1, Ordering::Relaxed);
                    goaway = Some(limit);
                    let above: Vec<u64> = inflight.range(limit..).map(|(raw, _)| *raw).collect();
                    for r in above {
                        inflight.remove(&r);
                        self.s.c.retried.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            self.answers(&mut c, &mut inflight);
            if let Some(lost) = c.lost.clone() {
                self.lost(&inflight, goaway, &lost);
                return;
            }
            let stopping = self.s.stopping();
            if inflight.is_empty() && (stopping || goaway.is_some()) {
                c.close(H3_NO_ERROR);
                return;
            }
            if let Some((r, _)) = inflight.iter().find(|(_, (_, t))| t.elapsed() > REQUEST_TIMEOUT) {
                self.s.fail(false, format!("stream {r}: no answer within {REQUEST_TIMEOUT:?} (GOAWAY {goaway:?})"));
                c.close(H3_NO_ERROR);
                return;
            }
            while goaway.is_none()
                && !stopping
                && inflight.len() < STREAMS
                && self.s.c.started.fetch_add(1, Ordering::Relaxed) < MAX_REQUESTS
            {
                let Some(id) = c.try_get(PATHS[self.s.slot % PATHS.len()]) else { break };
                inflight.insert(raw(id), (id, Instant::now()));
            }
            c.step(Instant::now() + TICK);
        }
    }

    /// Counts the streams that ended: a 200 is an answer; a reset with
    /// `H3_REQUEST_REJECTED` is retried; anything else is a failure.
    fn answers(&self, c: &mut H3Client, inflight: &mut BTreeMap<u64, (StreamId, Instant)>) {
        let ended: Vec<u64> = inflight
            .iter()
            .filter(|(_, (id, _))| c.streams.get(id).is_some_and(|s| s.fin || s.reset.is_some()))
            .map(|(r, _)| *r)
            .collect();
        for r in ended {
            let Some((id, _)) = inflight.remove(&r) else { continue };
            let Some(got) = c.streams.remove(&id) else { continue };
            match got.reset {
                Some(H3_REQUEST_REJECTED) => {
                    self.s.c.retried.fetch_add(1, Ordering::Relaxed);
                }
                Some(code) => self.s.fail(false, format!("stream {r}: reset with code {code:#x}")),
                None => match parse(&got.bytes).status() {
                    200 => {
                        self.s.c.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    status => self.s.fail(false, format!("stream {r}: status {status}")),
                },
            }
        }
    }

    /// The connection was lost: what was in flight from the GOAWAY's ID on is retried, the
    /// rest (all of it without a GOAWAY) was cut. With nothing cut, only a close with
    /// `H3_NO_ERROR` after a GOAWAY is clean.
    fn lost(&self, inflight: &BTreeMap<u64, (StreamId, Instant)>, goaway: Option<u64>, why: &ConnectionError) {
        let mut cut = Vec::new();
        for r in inflight.keys() {
            if goaway.is_some_and(|limit| *r >= limit) {
                self.s.c.retried.fetch_add(1, Ordering::Relaxed);
            } else {
                cut.push(*r);
            }
        }
        let no_error =
            matches!(why, ConnectionError::ApplicationClosed(close) if close.error_code.into_inner() == H3_NO_ERROR);
        if !cut.is_empty() {
            self.s.fail(false, format!("connection lost ({why}) with stream(s) {cut:?} in flight (GOAWAY {goaway:?})"));
        } else if goaway.is_none() || !no_error {
            self.s.fail(false, format!("connection lost ({why}), nothing in flight, GOAWAY {goaway:?}"));
        }
    }
}

/// A server with HTTP/3 on its TLS port, `workers` workers, no rate limit and no access log;
/// its UDP address, the client configuration (and the certificates' directory, kept).
fn server(
    workers: usize,
    extra: impl FnOnce(ServerBuilder) -> ServerBuilder,
) -> (Server, SocketAddr, ClientConfig, tempfile::TempDir) {
    let pki = Pki::new();
    let dir = tempfile::Builder::new().prefix("forkd-h3drain-").tempdir().expect("tempdir");
    let (cert, key) = pki.write(dir.path());
    let port = free_port();
    let b = Server::builder()
        .workers(workers)
        .top(&format!("public_origin = \"https://localhost:{port}\""))
        .top("shutdown_timeout_ms = 10000")
        .set("tls", &tls_section(port, &cert, &key))
        .set("http3", "enabled = true")
        .set("rate_limit", "enabled = false")
        .env("RUST_LOG", "info,access=off");
    let s = extra(b).start();
    s.wait_log_line(START_TIMEOUT, |l| l.contains("ready: "));
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    (s, addr, client_config(&pki), dir)
}

fn assert_flowing(load: &Load, s: &Server, when: &str) {
    load.assert_flowing(s, FLOWING, FLOWING_WITHIN, when);
}

fn assert_clean(rep: &Report, min_goaways: u64, events: &[String], log: &str, what: &str) {
    rep.assert_clean("HTTP/3", min_goaways, events, log, what);
}

#[test]
fn hup_under_http3_load_fails_no_request() {
    let (s, addr, config, _d) = server(2, |b| b);
    let mut old: BTreeSet<i32> = s.wait_workers(2, START_TIMEOUT).into_iter().collect();
    let load = start_load(addr, config);
    let mut ev = Vec::new();
    assert_flowing(&load, &s, "before SIGHUP");
    for round in 1..=2 {
        load.mark(&mut ev, &format!("SIGHUP #{round} (workers {old:?})"));
        let now = hup_replaces_every_worker(&s, &old, 2, CHANGE_TIMEOUT, &format!("SIGHUP #{round}"));
        load.mark(&mut ev, &format!("old workers gone; new {now:?}"));
        assert_flowing(&load, &s, &format!("after SIGHUP #{round}"));
        old = now;
    }
    load.mark(&mut ev, "stop the load");
    let rep = load.finish();
    // Every connection open at a reload was on an old worker: each got a GOAWAY.
    assert_clean(&rep, 2 * MIN_GOAWAYS, &ev, &s.log_tail(), "two SIGHUPs under HTTP/3 load");
}

#[test]
fn usr2_under_http3_load_fails_no_request() {
    let (mut s, addr, config, _d) = server(2, |b| b);
    let old_workers = s.wait_workers(2, START_TIMEOUT);
    let load = start_load(addr, config);
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
    assert_clean(&rep, MIN_GOAWAYS, &ev, &log, "SIGUSR2 under HTTP/3 load");
}

#[test]
fn memory_replacements_under_http3_load_fail_no_request() {
    // Every worker is over 1 MiB: each check (every 200 ms) replaces every worker.
    let (s, addr, config, _d) = server(2, |b| b.set("supervisor", "worker_max_rss_mb = 1\nmemory_check_ms = 200"));
    let mut seen: BTreeSet<i32> = s.workers().into_iter().collect();
    let load = start_load(addr, config);
    let mut ev = Vec::new();
    load.mark(&mut ev, &format!("load started (workers {seen:?})"));
    assert_flowing(&load, &s, "with the memory ceiling");
    wait_replacements(&s, &mut seen, 3, CHANGE_TIMEOUT);
    load.mark(&mut ev, &format!("{} workers seen: {seen:?}", seen.len()));
    assert_flowing(&load, &s, "after the replacements");
    load.mark(&mut ev, "stop the load");
    let rep = load.finish();
    assert_clean(&rep, MIN_GOAWAYS, &ev, &s.log_tail(), "memory replacements under HTTP/3 load");
}

#[test]
fn graceful_stop_under_http3_load_fails_no_request_in_flight() {
    let (mut s, addr, config, _d) = server(2, |b| b);
    let workers = s.wait_workers(2, START_TIMEOUT);
    let load = start_load(addr, config);
    let mut ev = Vec::new();
    assert_flowing(&load, &s, "before SIGTERM");
    load.mark(&mut ev, "SIGTERM");
    let term_at = load.elapsed();
    s.signal(Signal::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(15));
    let log = s.log_tail();
    load.mark(&mut ev, &format!("supervisor exited: {status:?}"));
    assert!(
        status.is_some_and(|st| st.code() == Some(0)),
        "the supervisor must exit 0 within 15 s of SIGTERM under load: {status:?}\nlog:\n{log}"
    );
    for w in &workers {
        assert!(eventually(IO_TIMEOUT, || !pid_alive(*w)), "worker {w} outlived its supervisor");
    }
    load.mark(&mut ev, "stop the load");
    let mut rep = load.finish();
    assert!(rep.ok >= FLOWING, "the load got only {} answers before SIGTERM", rep.ok);
    // Once the stop began, a new connection that gets no handshake is refused, not cut (the
    // port closes with the last worker).
    rep.failures.retain(|f| !(f.handshake && f.at >= term_at));
    assert_clean(&rep, MIN_GOAWAYS, &ev, &log, "SIGTERM under HTTP/3 load");
}
