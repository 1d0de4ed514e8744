//! The metrics zone: the counters behind `GET /metrics`, one fixed block per
//! worker process plus one block for processes that are gone.
//!
//! Each worker process owns one [`ProcMetrics`] (parallel to its
//! [`ProcRecord`](super::ProcRecord), same index) and is its only writer: the
//! event loop adds one finished request at a time with plain relaxed loads
//! and stores (no read-modify-write instruction, no lock, no allocation). The
//! supervisor zeroes the block when it claims the record and, when it
//! releases the record after reaping the process, adds the block's counters
//! into [`Retired`], so a dead worker's counts stay in the sums. A reader
//! (the `/metrics` handler, in any worker) sums `retired` and the live
//! blocks under a sequence counter the supervisor bumps around each fold, so
//! a release racing the read is retried instead of counting a block twice or
//! not at all.
//!
//! Labels are small fixed indices: route slot 0 is `other` (unmatched), the
//! app numbers its route patterns from 1 (at most [`ROUTES`]` - 1`); statuses
//! are the exact codes in [`CODES`] plus one `Nxx` slot per class for any
//! other code. What it must not do: allocate, hold pointers, or grow.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

use super::{Region, WorkerState};

/// Route label slots, `other` included.
pub const ROUTES: usize = 64;
/// The route slot of requests that matched no route pattern.
pub const ROUTE_OTHER: u16 = 0;
/// The status codes counted exactly; any other code counts in its class's `Nxx` slot.
pub const CODES: [u16; 27] = [
    101, 200, 201, 204, 206, 302, 304, 400, 401, 403, 404, 405, 408, 409, 412, 413, 415, 416, 417, 422, 426, 429, 431,
    500, 502, 503, 504,
];
/// Status label slots: [`CODES`], then `1xx`..`5xx`.
pub const STATUSES: usize = CODES.len() + 5;
/// Upper bounds of the latency buckets, in microseconds (0.5 ms … 5 s); one
/// more bucket (`+Inf`) follows.
pub const BOUNDS_US: [u64; 13] =
    [500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000];
/// Latency buckets, `+Inf` included.
pub const BUCKETS: usize = BOUNDS_US.len() + 1;

/// Status code → slot, for every code from 100 to 599.
const SLOT_OF: [u8; 500] = {
    let mut t = [0u8; 500];
    let mut c = 0;
    while c < 500 {
        t[c] = (CODES.len() + c / 100) as u8;
        c += 1;
    }
    let mut i = 0;
    while i < CODES.len() {
        t[CODES[i] as usize - 100] = i as u8;
        i += 1;
    }
    t
};

/// The slot counting `status`.
pub fn status_slot(status: u16) -> usize {
    SLOT_OF[(status.clamp(100, 599) - 100) as usize] as usize
}

/// The label of status slot `i`: the code, or its class (`4xx`).
pub fn status_label(i: usize) -> std::borrow::Cow<'static, str> {
    match CODES.get(i) {
        Some(c) => c.to_string().into(),
        None => format!("{}xx", i - CODES.len() + 1).into(),
    }
}

/// One worker process's counters. Written only by that process's event loop
/// (and zeroed/folded by the supervisor while no process owns it).
#[repr(C, align(64))]
pub struct ProcMetrics {
    /// Finished requests by route slot and status slot.
    requests: [[AtomicU64; STATUSES]; ROUTES],
    /// Finished requests by route slot and latency bucket (not cumulative here).
    latency: [[AtomicU64; BUCKETS]; ROUTES],
    /// Sum of the latencies by route slot, in microseconds.
    latency_sum_us: [AtomicU64; ROUTES],
    /// Open SSE streams (a gauge).
    sse_streams: AtomicU64,
    /// Open WebSocket clients (a gauge).
    websocket_clients: AtomicU64,
    /// Connections closed unserved on a `proxy_protocol` listener: a peer outside
    /// `proxy.trusted`, or no valid PROXY header in time.
    proxy_refused: AtomicU64,
}

/// Add one to a counter only this process writes: a load and a store, no
/// locked instruction (the hot path pays no more than for a plain integer).
fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
}

impl ProcMetrics {
    /// Count one finished request (worker only, on its event loop).
    /// `route` beyond [`ROUTES`] counts as `other`.
    pub fn record(&self, route: u16, status: u16, elapsed: Duration) {
        let route = if (route as usize) < ROUTES { route as usize } else { ROUTE_OTHER as usize };
        bump(&self.requests[route][status_slot(status)], 1);
        let us = elapsed.as_micros().min(u64::MAX as u128) as u64;
        let bucket = BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(BOUNDS_US.len());
        bump(&self.latency[route][bucket], 1);
        bump(&self.latency_sum_us[route], us);
    }

    /// Count one connection a `proxy_protocol` listener closed unserved (worker only).
    pub fn count_proxy_refused(&self) {
        bump(&self.proxy_refused, 1);
    }

    /// Publish the open SSE stream count (worker only).
    pub fn set_sse_streams(&self, n: usize) {
        self.sse_streams.store(n as u64, Ordering::Relaxed);
    }

    /// Publish the open WebSocket client count (worker only).
    pub fn set_websocket_clients(&self, n: usize) {
        self.websocket_clients.store(n as u64, Ordering::Relaxed);
    }

    /// Zero everything (supervisor, before the block gets an owner).
    fn reset(&self) {
        for c in self.counters() {
            c.store(0, Ordering::Relaxed);
        }
        self.sse_streams.store(0, Ordering::Relaxed);
        self.websocket_clients.store(0, Ordering::Relaxed);
    }

    /// Every counter (gauges excluded), in a fixed order.
    fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        let rows = self.requests.iter().flatten().chain(self.latency.iter().flatten());
        rows.chain(&self.latency_sum_us).chain(std::iter::once(&self.proxy_refused))
    }

    /// Add this block's counters and gauges to `t`.
    fn add_to(&self, t: &mut Totals, gauges: bool) {
        for (r, row) in self.requests.iter().enumerate() {
            for (s, c) in row.iter().enumerate() {
                t.requests[r][s] += c.load(Ordering::Relaxed);
            }
        }
        for (r, row) in self.latency.iter().enumerate() {
            for (b, c) in row.iter().enumerate() {
                t.latency[r][b] += c.load(Ordering::Relaxed);
            }
            t.latency_sum_us[r] += self.latency_sum_us[r].load(Ordering::Relaxed);
        }
        t.proxy_refused += self.proxy_refused.load(Ordering::Relaxed);
        if gauges {
            t.sse_streams += self.sse_streams.load(Ordering::Relaxed);
            t.websocket_clients += self.websocket_clients.load(Ordering::Relaxed);
        }
    }
}

/// What is left of processes that are gone. Written by the supervisor only.
#[repr(C, align(64))]
pub struct Retired {
    /// Odd while a fold is under way; readers retry when it moved.
    seq: AtomicU64,
    /// Worker processes that exited without being asked to (crash, kill,
    /// watchdog); the supervisor replaces each.
    restarts: AtomicU64,
    /// Redis (`cluster.redis_url`), as the supervisor's bridge sees it: 0 not
    /// configured, 1 down, 2 up.
    redis_state: AtomicU64,
    /// Times Redis was lost and the rate limits fell back to this host's own count.
    redis_fallbacks: AtomicU64,
    /// The counters of every released block, summed (gauges unused).
    counters: ProcMetrics,
}

/// A consistent sum of the zone, plus the gauges of the process records.
pub struct Totals {
    /// Requests by route slot and status slot.
    pub requests: Box<[[u64; STATUSES]; ROUTES]>,
    /// Requests by route slot and latency bucket (not cumulative).
    pub latency: Box<[[u64; BUCKETS]; ROUTES]>,
    /// Sum of the latencies by route slot, in microseconds.
    pub latency_sum_us: [u64; ROUTES],
    /// Connections closed unserved on a `proxy_protocol` listener.
    pub proxy_refused: u64,
    /// Open client connections.
    pub connections: u64,
    /// Open SSE streams.
    pub sse_streams: u64,
    /// Open WebSocket clients.
    pub websocket_clients: u64,
    /// Worker processes serving (not starting, not draining).
    pub workers: u64,
    /// Worker processes that exited without being asked to.
    pub restarts: u64,
    /// With `cluster.redis_url`: whether Redis is up, and how many times it was lost.
    pub redis: Option<(bool, u64)>,
}

impl Totals {
    fn zero() -> Totals {
        Totals {
            requests: Box::new([[0; STATUSES]; ROUTES]),
            latency: Box::new([[0; BUCKETS]; ROUTES]),
            latency_sum_us: [0; ROUTES],
            proxy_refused: 0,
            connections: 0,
            sse_streams: 0,
            websocket_clients: 0,
            workers: 0,
            restarts: 0,
            redis: None,
        }
    }

    /// Requests counted (the histograms' `_count`s, summed).
    pub fn count(&self) -> u64 {
        self.latency.iter().flatten().sum()
    }
}

/// How often a read retries when releases keep racing it, before it answers
/// with what it has (only a supervisor releasing records non-stop could get there).
const MAX_TRIES: usize = 64;

impl Region {
    /// Zero record `i`'s metrics block (supervisor, in [`Region::claim`]).
    pub(super) fn reset_metrics(&self, i: usize) {
        self.metrics[i].reset();
    }

    /// Move record `i`'s counters to the retired block, then run `release`
    /// (supervisor, in [`Region::release`]). Readers that overlap see the
    /// sequence move and read again. The block is left zeroed, so releasing
    /// a record twice cannot count it twice.
    pub(super) fn retire_metrics(&self, i: usize, release: impl FnOnce()) {
        let seq = self.retired.seq.load(Ordering::Relaxed);
        self.retired.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (to, from) in self.retired.counters.counters().zip(self.metrics[i].counters()) {
            bump(to, from.load(Ordering::Relaxed));
        }
        self.metrics[i].reset();
        release();
        self.retired.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Count a worker process that exited without being asked to (supervisor only).
    pub fn count_restart(&self) {
        bump(&self.retired.restarts, 1);
    }

    /// Publish whether Redis is up (supervisor only, with `cluster.redis_url`).
    pub fn set_redis_up(&self, up: bool) {
        self.retired.redis_state.store(if up { 2 } else { 1 }, Ordering::Relaxed);
    }

    /// Count one fallback to per-host rate limits (supervisor only).
    pub fn count_redis_fallback(&self) {
        bump(&self.retired.redis_fallbacks, 1);
    }

    /// Sum the zone: retired counters plus every live block, the gauges of
    /// live processes, and the number of serving workers.
    pub fn metrics_totals(&self) -> Totals {
        let mut t = Totals::zero();
        for _ in 0..MAX_TRIES {
            t = Totals::zero();
            let seq = self.retired.seq.load(Ordering::Acquire);
            if seq % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            self.retired.counters.add_to(&mut t, false);
            t.restarts = self.retired.restarts.load(Ordering::Relaxed);
            t.redis = match self.retired.redis_state.load(Ordering::Relaxed) {
                0 => None,
                state => Some((state == 2, self.retired.redis_fallbacks.load(Ordering::Relaxed))),
            };
            for (rec, m) in self.claimed_records() {
                let pid = rec.pid.load(Ordering::Acquire);
                if pid == 0 {
                    continue;
                }
                m.add_to(&mut t, true);
                t.connections += rec.connections.load(Ordering::Relaxed);
                if pid > 0 && rec.state() == WorkerState::Serving {
                    t.workers += 1;
                }
            }
            fence(Ordering::Acquire);
            if self.retired.seq.load(Ordering::Relaxed) == seq {
                break;
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_slots_are_exact_codes_or_classes() {
        assert_eq!(status_label(status_slot(200)), "200");
        assert_eq!(status_label(status_slot(404)), "404");
        assert_eq!(status_label(status_slot(418)), "4xx");
        assert_eq!(status_label(status_slot(299)), "2xx");
        assert_eq!(status_label(status_slot(100)), "1xx");
        assert_eq!(status_label(status_slot(599)), "5xx");
        assert_eq!(status_label(status_slot(700)), "5xx");
        let labels: std::collections::HashSet<_> = (0..STATUSES).map(status_label).collect();
        assert_eq!(labels.len(), STATUSES, "every slot has its own label");
    }

    #[test]
    fn totals_read_only_the_records_ever_claimed() {
        let r = Region::create().expect("map");
        let i = r.claim().expect("record");
        r.metrics[i].record(1, 200, Duration::from_micros(10));
        // A pid beyond every claimed record (as no supervisor writes) is not read.
        r.procs[100].pid.store(7, std::sync::atomic::Ordering::Release);
        r.metrics[100].record(1, 200, Duration::from_micros(10));
        // The retired block is always read (and was written once a worker retired).
        r.retired.counters.add_to(&mut Totals::zero(), false);
        let before = crate::sys::mapping_rss_kib(r as *const Region as usize);
        let t = r.metrics_totals();
        assert_eq!((t.count(), t.workers), (1, 0), "only record {i} is read");
        // Only pages already touched: the first records, the retired and two metrics blocks.
        let after = crate::sys::mapping_rss_kib(r as *const Region as usize);
        assert_eq!(after, before, "KiB of shared memory resident after a /metrics sum");
    }

    #[test]
    fn latency_goes_to_the_first_bucket_that_holds_it() {
        let r = Region::create().expect("map");
        let i = r.claim().expect("record");
        let m = &r.metrics[i];
        m.record(1, 200, Duration::from_micros(500)); // le 0.0005
        m.record(1, 200, Duration::from_micros(501)); // le 0.001
        m.record(1, 200, Duration::from_secs(6)); // +Inf
        m.record(2, 200, Duration::from_micros(100)); // another route's histogram
        let t = r.metrics_totals();
        assert_eq!(t.latency[1][0], 1);
        assert_eq!(t.latency[1][1], 1);
        assert_eq!(t.latency[1][BUCKETS - 1], 1);
        assert_eq!((t.latency[2][0], t.latency[0][0]), (1, 0));
        assert_eq!(t.count(), 4);
        assert_eq!(t.latency_sum_us[1], 500 + 501 + 6_000_000);
        assert_eq!(t.latency_sum_us[2], 100);
        assert_eq!(t.requests[1][status_slot(200)], 3);
    }

    #[test]
    fn released_records_keep_their_counts_and_claims_start_from_zero() {
        let r = Region::create().expect("map");
        let a = r.claim().expect("a");
        let b = r.claim().expect("b");
        r.procs[a].pid.store(100, Ordering::Relaxed);
        r.procs[b].pid.store(101, Ordering::Relaxed);
        r.metrics[a].record(3, 200, Duration::from_millis(2));
        r.metrics[a].record(ROUTE_OTHER, 404, Duration::from_millis(1));
        r.metrics[b].record(3, 200, Duration::from_millis(2));
        r.metrics[a].set_sse_streams(2);
        r.metrics[b].set_websocket_clients(1);
        let before = r.metrics_totals();
        assert_eq!(before.requests[3][status_slot(200)], 2);
        assert_eq!((before.sse_streams, before.websocket_clients), (2, 1));

        r.release(a);
        r.release(a); // a second release adds nothing
        r.count_restart();
        let after = r.metrics_totals();
        assert_eq!(after.requests[3][status_slot(200)], 2, "a's requests stay counted");
        assert_eq!(after.requests[ROUTE_OTHER as usize][status_slot(404)], 1);
        assert_eq!(after.count(), before.count());
        assert_eq!(after.latency_sum_us, before.latency_sum_us);
        assert_eq!(after.sse_streams, 0, "a dead process's gauges go with it");
        assert_eq!(after.restarts, 1);

        // The record is reused from zero: the sums do not count a's requests twice.
        assert_eq!(r.claim(), Some(a));
        assert_eq!(r.metrics_totals().count(), 3);
        r.metrics[a].record(3, 500, Duration::from_millis(1));
        let t = r.metrics_totals();
        assert_eq!(t.count(), 4);
        assert_eq!(t.requests[3][status_slot(500)], 1);
    }

    #[test]
    fn only_serving_processes_count_as_workers() {
        let r = Region::create().expect("map");
        let a = r.claim().expect("a");
        let b = r.claim().expect("b");
        let _starting = r.claim().expect("c");
        r.procs[a].pid.store(100, Ordering::Relaxed);
        r.procs[b].pid.store(101, Ordering::Relaxed);
        r.procs[a].set_state(WorkerState::Serving);
        r.procs[b].set_state(WorkerState::Draining);
        r.procs[a].connections.store(3, Ordering::Relaxed);
        r.procs[b].connections.store(1, Ordering::Relaxed);
        let t = r.metrics_totals();
        assert_eq!(t.workers, 1);
        assert_eq!(t.connections, 4);
    }
}
