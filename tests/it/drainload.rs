//! The load the drain suites run (`h2drain.rs`, `h3drain.rs`): threads that each keep one
//! connection of their protocol busy until told to stop, counters they share, the failures
//! with the time they happened, and the assertions on what was counted. What a connection
//! does and what counts as a failure is the suite's own (its `Conn::run`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::{eventually, wall_clock, Server};

/// What the load counted.
#[derive(Default)]
pub struct Counters {
    pub ok: AtomicU64,
    pub retried: AtomicU64,
    pub goaways: AtomicU64,
    pub conns: AtomicU64,
    pub started: AtomicU64,
    /// The slowest handshake, in ms (HTTP/3).
    pub handshake_max_ms: AtomicU64,
}

/// One failure: when (the load's clock), whether it was a connection that never completed
/// its handshake (after SIGTERM that is a refused new connection, not a request cut), what.
pub struct Failure {
    pub at: f64,
    pub handshake: bool,
    pub text: String,
}

/// What one load thread holds: its number, the shared counters, the way to report.
pub struct Slot {
    pub slot: usize,
    pub c: Arc<Counters>,
    failures: Arc<Mutex<Vec<Failure>>>,
    stop: Arc<AtomicBool>,
    pub t0: Instant,
    max_run: Duration,
}

impl Slot {
    /// The load stops (told to, or past its longest run).
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.t0.elapsed() >= self.max_run
    }

    /// Records a failure of this thread's connection.
    pub fn fail(&self, handshake: bool, what: String) {
        let at = self.t0.elapsed().as_secs_f64();
        let text = format!("+{at:.3}s slot {}: {what}", self.slot);
        if let Ok(mut f) = self.failures.lock() {
            f.push(Failure { at, handshake, text });
        }
    }
}

/// The load: its threads and what they share.
pub struct Load {
    proto: &'static str,
    c: Arc<Counters>,
    failures: Arc<Mutex<Vec<Failure>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
    t0: Instant,
}

/// What a finished load counted.
pub struct Report {
    pub ok: u64,
    pub retried: u64,
    pub goaways: u64,
    pub conns: u64,
    pub handshake_max_ms: u64,
    pub failures: Vec<Failure>,
}

impl Load {
    /// `threads` threads of `proto` load, each running `run` with its [`Slot`] (which must
    /// return once [`Slot::stopping`]); none runs longer than `max_run`.
    pub fn start(
        proto: &'static str,
        threads: usize,
        max_run: Duration,
        run: impl Fn(Slot) + Send + Clone + 'static,
    ) -> Load {
        let c = Arc::new(Counters::default());
        let failures = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let threads = (0..threads)
            .map(|slot| {
                let s = Slot {
                    slot,
                    c: Arc::clone(&c),
                    failures: Arc::clone(&failures),
                    stop: Arc::clone(&stop),
                    t0,
                    max_run,
                };
                let run = run.clone();
                thread::spawn(move || run(s))
            })
            .collect();
        Load { proto, c, failures, stop, threads, t0 }
    }

    pub fn ok(&self) -> u64 {
        self.c.ok.load(Ordering::Relaxed)
    }

    /// Seconds since the load started (its failures' clock).
    pub fn elapsed(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub fn failed(&self) -> usize {
        self.failures.lock().map(|f| f.len()).unwrap_or(0)
    }

    /// Waits until `n` more answers came (or `timeout`).
    pub fn wait_more_ok(&self, n: u64, timeout: Duration) -> bool {
        let target = self.ok() + n;
        eventually(timeout, || self.ok() >= target)
    }

    /// Notes `what` happened now (printed, and kept for a failure's message).
    pub fn mark(&self, events: &mut Vec<String>, what: &str) {
        let line = format!("+{:.3}s {what} (ok so far {})", self.t0.elapsed().as_secs_f64(), self.ok());
        eprintln!("{} {line}", wall_clock());
        events.push(line);
    }

    /// Stops the threads and reports.
    pub fn finish(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        let mut panicked = 0;
        for t in self.threads {
            if t.join().is_err() {
                panicked += 1;
            }
        }
        let mut failures = std::mem::take(&mut *self.failures.lock().unwrap_or_else(|e| e.into_inner()));
        for _ in 0..panicked {
            failures.push(Failure { at: 0.0, handshake: false, text: "a load thread panicked".into() });
        }
        Report {
            ok: self.c.ok.load(Ordering::Relaxed),
            retried: self.c.retried.load(Ordering::Relaxed),
            goaways: self.c.goaways.load(Ordering::Relaxed),
            conns: self.c.conns.load(Ordering::Relaxed),
            handshake_max_ms: self.c.handshake_max_ms.load(Ordering::Relaxed),
            failures,
        }
    }

    /// Asserts `n` more answers within `within` (`when`: for the message).
    pub fn assert_flowing(&self, s: &Server, n: u64, within: Duration, when: &str) {
        assert!(
            self.wait_more_ok(n, within),
            "{when}: the {} load got fewer than {n} more answers within {within:?} (ok {}, failures {})\nlog:\n{}",
            self.proto,
            self.ok(),
            self.failed(),
            s.log_tail()
        );
    }
}

impl Report {
    /// Prints the report; asserts no failure and at least `min_goaways` GOAWAYs (`proto`,
    /// `what`: for the messages).
    pub fn assert_clean(&self, proto: &str, min_goaways: u64, events: &[String], log: &str, what: &str) {
        eprintln!(
            "{what}: {} ok, {} retried, {} GOAWAYs, {} connections (slowest handshake {} ms), {} failures",
            self.ok,
            self.retried,
            self.goaways,
            self.conns,
            self.handshake_max_ms,
            self.failures.len()
        );
        let shown: Vec<&str> = self.failures.iter().take(40).map(|f| f.text.as_str()).collect();
        assert!(
            self.failures.is_empty(),
            "{what}: {} {proto} request(s) or connection(s) failed ({} ok, {} retried, {} GOAWAYs); a draining \
             worker must send GOAWAY and let the requests it accepted finish:\n  {}\nevents:\n  {}\nlog:\n{log}",
            self.failures.len(),
            self.ok,
            self.retried,
            self.goaways,
            shown.join("\n  "),
            events.join("\n  ")
        );
        assert!(
            self.goaways >= min_goaways,
            "{what}: only {} GOAWAY(s) seen, {min_goaways} expected: were the connections drained at all?\nevents:\n  {}",
            self.goaways,
            events.join("\n  ")
        );
    }
}

/// `SIGHUP` to `s`, then, within `within`, `workers` workers none of which is in `old`, and
/// every old one gone; returns the new ones (`what`: for the messages).
pub fn hup_replaces_every_worker(
    s: &Server,
    old: &std::collections::BTreeSet<i32>,
    workers: usize,
    within: Duration,
    what: &str,
) -> std::collections::BTreeSet<i32> {
    s.signal(nix::sys::signal::Signal::SIGHUP);
    let mut now = std::collections::BTreeSet::new();
    let replaced = eventually(within, || {
        now = s.workers().into_iter().collect();
        now.len() == workers && now.is_disjoint(old)
    });
    assert!(replaced, "{what}: every worker must be new: {now:?} (old {old:?})\nlog:\n{}", s.log_tail());
    for w in old {
        assert!(eventually(within, || !crate::util::pid_alive(*w)), "old worker {w} did not exit\n{}", s.log_tail());
    }
    now
}
