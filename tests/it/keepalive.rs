//! A keep-alive load generator, like wrk: `conns` threads, each on its own connection,
//! each sending the next `GET` right after the previous response, for the tests of
//! worker replacement under load (`drain.rs`).
//!
//! What counts as what:
//! * a 200 → `ok`; one with `Connection: close` is ok too, then the thread reconnects;
//! * a connect refused (`ECONNREFUSED`) → `refused`, retried after ~5 ms (the port is
//!   closed, e.g. after SIGTERM: no request was lost);
//! * anything else is a failure, described with the time since start, the connection and
//!   the worker it was on: a reset, an EOF before a complete response, a write error, a
//!   status other than 200, no response within [`RESPONSE_TIMEOUT`] (also counted in
//!   `timeouts`), a connect that fails otherwise. The thread then reconnects.
//!
//! When `path` answers JSON with a `pid` (`/_debug/pid`), the load also knows which worker
//! each connection is on ([`KeepAliveLoad::holders`]) and which workers answered.
//!
//! Bounded: a stop flag is checked between requests, and every connect, write and read
//! is bounded by [`RESPONSE_TIMEOUT`], so `finish` (and drop) returns within ~2 s.
//!
//! The load threads run at a lower priority ([`LOAD_NICE`]): a dozen threads sending back
//! to back would otherwise take most of a 2-core machine, and a worker starting under the
//! load (a reload, a replacement) would need seconds to come up. wrk gets the same effect
//! from driving all its connections from 2 threads. It does not hide the race these tests
//! look for: a slower client leaves a connection idle longer between a response and its
//! next request. The hot path takes no lock.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::util::{eventually, is_timeout, request, Conn, Response};

/// No response within this is a failure (wrk's default timeout).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before connecting again after a refused connect.
const REFUSED_RETRY: Duration = Duration::from_millis(5);
/// Nice value of the load threads (Linux: per thread).
pub const LOAD_NICE: i32 = 10;

#[derive(Debug, Default, Clone)]
pub struct KeepAliveReport {
    /// 200 responses (with or without `Connection: close`).
    pub ok: usize,
    /// Every failure, timeouts included: `"+1.234s conn 3 (worker 4321, request 57 on it): …"`.
    pub failures: Vec<String>,
    /// How many of `failures` were a response (or connect) that did not come in time.
    pub timeouts: usize,
    /// Connects refused (the port was closed); not failures.
    pub refused: usize,
    /// Connections opened after each thread's first one.
    pub reconnects: usize,
    /// Responses that carried `Connection: close`.
    pub closes: usize,
    /// Every worker pid that answered (when the path answers `{"pid": …}`).
    pub pids: BTreeSet<i32>,
}

/// What the threads share: counters on the hot path, a lock for the rare events.
#[derive(Default)]
struct Shared {
    ok: AtomicUsize,
    /// Requests completed, ok or failed.
    done: AtomicUsize,
    closes: AtomicUsize,
    refused: AtomicUsize,
    reconnects: AtomicUsize,
    /// Failures (their descriptions are in `rare`).
    failed: AtomicUsize,
    /// Per thread: the worker its current connection last got an answer from (0: none).
    on: Vec<AtomicI32>,
    /// Failures, timeouts and the pids seen.
    rare: Mutex<Rare>,
}

#[derive(Default)]
struct Rare {
    failures: Vec<String>,
    timeouts: usize,
    pids: BTreeSet<i32>,
}

/// Keep-alive load on `conns` connections until [`KeepAliveLoad::finish`] or drop.
pub struct KeepAliveLoad {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    start: Instant,
    handles: Vec<JoinHandle<()>>,
}

impl KeepAliveLoad {
    /// Starts `conns` threads sending `GET path` back to back on keep-alive connections.
    pub fn start(addr: SocketAddr, path: &str, conns: usize) -> KeepAliveLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared { on: (0..conns).map(|_| AtomicI32::new(0)).collect(), ..Default::default() });
        let start = Instant::now();
        let handles = (0..conns)
            .map(|i| {
                let w = Worker {
                    id: i,
                    addr,
                    req: request("GET", path, &[], b""),
                    stop: stop.clone(),
                    shared: shared.clone(),
                    start,
                };
                thread::Builder::new().name(format!("keepalive-{i}")).spawn(move || w.run()).expect("spawn load thread")
            })
            .collect();
        KeepAliveLoad { stop, shared, start, handles }
    }

    /// Requests completed so far (ok or failed).
    pub fn count(&self) -> usize {
        self.shared.done.load(Ordering::Relaxed)
    }

    /// 200 responses so far.
    pub fn ok(&self) -> usize {
        self.shared.ok.load(Ordering::Relaxed)
    }

    /// Failures so far (timeouts included).
    pub fn failures(&self) -> usize {
        self.shared.failed.load(Ordering::Relaxed)
    }

    /// Time since the load started (the failures' time base): print it with each event.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits until at least `n` more requests complete (ok or not), bounded by `timeout`.
    pub fn wait_more(&self, n: usize, timeout: Duration) -> bool {
        let from = self.count();
        eventually(timeout, || self.count() >= from + n)
    }

    /// Waits until at least `n` more 200 responses came, bounded by `timeout`.
    pub fn wait_more_ok(&self, n: usize, timeout: Duration) -> bool {
        let from = self.ok();
        eventually(timeout, || self.ok() >= from + n)
    }

    /// Worker pid → connections whose last answer came from it (path `/_debug/pid`).
    pub fn holders(&self) -> BTreeMap<i32, usize> {
        let mut m = BTreeMap::new();
        for p in self.shared.on.iter().map(|p| p.load(Ordering::Relaxed)).filter(|p| *p != 0) {
            *m.entry(p).or_insert(0) += 1;
        }
        m
    }

    /// Every worker pid that answered so far (path `/_debug/pid`).
    pub fn pids(&self) -> BTreeSet<i32> {
        self.shared.rare.lock().unwrap().pids.clone()
    }

    /// Stops the threads (each ends after its request in progress, ≤ ~2 s) and reports.
    pub fn finish(mut self) -> KeepAliveReport {
        self.stop_and_join();
        let sh = &self.shared;
        let rare = sh.rare.lock().unwrap();
        KeepAliveReport {
            ok: sh.ok.load(Ordering::Relaxed),
            failures: rare.failures.clone(),
            timeouts: rare.timeouts,
            refused: sh.refused.load(Ordering::Relaxed),
            reconnects: sh.reconnects.load(Ordering::Relaxed),
            closes: sh.closes.load(Ordering::Relaxed),
            pids: rare.pids.clone(),
        }
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for KeepAliveLoad {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// One load thread.
struct Worker {
    id: usize,
    addr: SocketAddr,
    req: Vec<u8>,
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    start: Instant,
}

/// How one request on a connection ended.
enum Outcome {
    /// 200; `true` when the response closes the connection.
    Ok(bool),
    /// A failure: description, whether it was a timeout.
    Failed(String, bool),
}

impl Worker {
    fn run(self) {
        lower_priority();
        // The pids this thread has reported (the shared set is locked only for a new one).
        let mut seen = BTreeSet::new();
        let mut first = true;
        while !self.stopped() {
            // Connect (refused: the port is closed; retry shortly).
            let conn = match TcpStream::connect_timeout(&self.addr, RESPONSE_TIMEOUT) {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    self.shared.refused.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(REFUSED_RETRY);
                    continue;
                }
                Err(e) => {
                    let timeout = is_timeout(&e);
                    self.fail(format!("connect: {e}"), timeout, None, 0);
                    thread::sleep(REFUSED_RETRY);
                    continue;
                }
            };
            if !first {
                self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            first = false;
            self.set_on(None);
            let mut c = Conn::from_stream(conn, None);
            c.set_timeout(RESPONSE_TIMEOUT);
            c.stream.set_write_timeout(Some(RESPONSE_TIMEOUT)).unwrap();
            // Requests back to back until the server closes, a failure, or stop.
            let mut on: Option<i32> = None;
            let mut n = 0usize;
            while !self.stopped() {
                n += 1;
                let outcome = self.one(&mut c, &mut on, &mut seen);
                self.shared.done.fetch_add(1, Ordering::Relaxed);
                match outcome {
                    Outcome::Ok(false) => continue,
                    Outcome::Ok(true) => break,
                    Outcome::Failed(what, timeout) => {
                        self.fail(what, timeout, on, n);
                        break;
                    }
                }
            }
        }
        self.set_on(None);
    }

    /// One request and its response on `c`.
    fn one(&self, c: &mut Conn, on: &mut Option<i32>, seen: &mut BTreeSet<i32>) -> Outcome {
        if let Err(e) = c.try_write(&self.req) {
            return Outcome::Failed(format!("write error: {e}"), is_timeout(&e));
        }
        let sent = Instant::now();
        match c.try_read_response(false) {
            Ok(r) if r.status == 200 => {
                let close = r.closes();
                self.shared.ok.fetch_add(1, Ordering::Relaxed);
                if close {
                    self.shared.closes.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(p) = pid_of(&r) {
                    *on = Some(p);
                    if seen.insert(p) {
                        self.shared.rare.lock().unwrap().pids.insert(p);
                    }
                }
                self.set_on(if close { None } else { *on });
                Outcome::Ok(close)
            }
            Ok(r) => Outcome::Failed(
                format!("status {} (Connection: {:?})", r.status, r.header("connection").unwrap_or("")),
                false,
            ),
            Err(e) if is_timeout(&e) => Outcome::Failed(
                format!("no response within {RESPONSE_TIMEOUT:?} ({:?} after the request)", sent.elapsed()),
                true,
            ),
            Err(e) => {
                let msg = short(&e.to_string());
                Outcome::Failed(
                    match e.kind() {
                        io::ErrorKind::ConnectionReset => format!("reset before a complete response: {msg}"),
                        io::ErrorKind::UnexpectedEof => msg,
                        _ => format!("read error: {msg}"),
                    },
                    false,
                )
            }
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn set_on(&self, pid: Option<i32>) {
        self.shared.on[self.id].store(pid.unwrap_or(0), Ordering::Relaxed);
    }

    fn fail(&self, what: String, timeout: bool, on: Option<i32>, n: usize) {
        let at = self.start.elapsed().as_secs_f64();
        let worker = on.map(|p| format!("worker {p}")).unwrap_or_else(|| "no answer yet".into());
        let line = format!("+{at:.3}s conn {} ({worker}, request {n} on it): {what}", self.id);
        let mut rare = self.shared.rare.lock().unwrap();
        rare.failures.push(line);
        if timeout {
            rare.timeouts += 1;
        }
        self.shared.failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lowers the calling thread's priority to [`LOAD_NICE`] (best effort).
fn lower_priority() {
    // SAFETY: gettid and setpriority take and return plain integers.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, LOAD_NICE);
    }
}

/// `pid` from a `{"pid": …}` body, if any.
fn pid_of(r: &Response) -> Option<i32> {
    serde_json::from_slice::<serde_json::Value>(&r.body).ok()?.get("pid")?.as_i64().map(|p| p as i32)
}

/// The first line of an error without the harness's "(after <read timeout>)" note, at
/// most 160 characters.
fn short(s: &str) -> String {
    let l = s.lines().next().unwrap_or("");
    let l = match l.split_once(" (after ") {
        Some((head, rest)) => format!("{head}{}", rest.split_once(')').map(|(_, r)| r).unwrap_or("")),
        None => l.to_string(),
    };
    l.chars().take(160).collect()
}
