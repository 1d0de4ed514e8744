//! The shared-memory region: one fixed-size anonymous `MAP_SHARED` mapping
//! created by the supervisor before the first fork and inherited by every worker.
//!
//! It holds only fixed-size records of atomics (no pointers, no locks), laid
//! out once. Today: one [`ProcRecord`] per live worker process (heartbeat,
//! state, counters), a parallel [`metrics::ProcMetrics`] block per process
//! plus the retired block (`GET /metrics`), the rate-limit table, the user change
//! counters ([`epochs`]) and the recent revocations of access tokens ([`revoked`]); later
//! zones are added here as more fixed arrays. The shared cache, sized from the configuration, lives in
//! its own mapping instead ([`cache`]), and so do HTTP/3's TLS sessions ([`sessions`]). It must not grow, allocate or hold
//! Rust pointers.

pub mod cache;
pub mod epochs;
pub mod metrics;
pub mod ratelimit;
pub mod revoked;
pub mod sessions;

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// A slot of a set-associative table in its own mapping ([`cache`], [`sessions`]).
///
/// # Safety
/// The all-zero bit pattern must be a valid (empty) slot, its alignment at most a page, and
/// every field an atomic: the slots are shared by processes and only ever read and written
/// through atomics.
pub(crate) unsafe trait ZeroSlot: Sized {}

/// Map a zero-filled table of whole sets of `ways` slots holding at least `entries` (at least
/// one set); the slots and the number of sets. Supervisor, before fork; never unmapped.
/// `what` names the table in the error for a size that overflows.
pub(crate) fn map_sets<T: ZeroSlot>(entries: usize, ways: usize, what: &str) -> io::Result<(&'static [T], usize)> {
    let sets = entries.div_ceil(ways).max(1);
    let count = sets.checked_mul(ways);
    let len = count
        .and_then(|n| n.checked_mul(std::mem::size_of::<T>()))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} too large")))?;
    let ptr = crate::sys::map_shared_anonymous(len)?;
    // SAFETY: the mapping is page-aligned (at least `T`'s alignment, `ZeroSlot`), exactly
    // `count` slots of `T` long, zero-filled (a valid empty `T`, `ZeroSlot`) and never
    // unmapped, so a shared `'static` slice over it is sound; all access goes through atomics.
    let slots = unsafe { std::slice::from_raw_parts(ptr as *const T, count.unwrap_or(0)) };
    Ok((slots, sets))
}

/// How many worker processes can be alive at once (serving plus draining).
pub const MAX_PROCS: usize = 2048;

/// A worker's state as the worker itself publishes it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Record free or process still setting up.
    Starting = 0,
    /// Event loop running and accepting.
    Serving = 1,
    /// Stopped accepting; finishing what it has.
    Draining = 2,
}

/// One worker process's record. Aligned to a cache line so that workers
/// stamping their heartbeats never share a line.
#[repr(C, align(64))]
pub struct ProcRecord {
    /// Owner pid; 0 when the record is free. Written by the supervisor.
    pub pid: AtomicI32,
    /// The worker's state ([`WorkerState`] as u32). Written by the worker.
    pub state: AtomicU32,
    /// Monotonic ms of the worker's last event-loop turn. Written by the worker.
    pub heartbeat_ms: AtomicU64,
    /// Open client connections. Written by the worker.
    pub connections: AtomicU64,
    /// Requests answered since start. Written by the worker.
    pub requests: AtomicU64,
}

/// The whole region.
#[repr(C)]
pub struct Region {
    /// Per-process records, indexed by the slot the supervisor assigned.
    pub procs: [ProcRecord; MAX_PROCS],
    /// Per-process metrics blocks, same index as `procs`.
    pub metrics: [metrics::ProcMetrics; MAX_PROCS],
    /// What released records counted, and the worker restart count.
    pub retired: metrics::Retired,
    /// The shared rate-limit table (seeded by the supervisor before forking).
    pub rate: ratelimit::RateTable,
    /// Change counters of user records (what a worker's memo of users checks).
    pub users: epochs::Epochs,
    /// Accounts whose access tokens were revoked lately (what the event loop checks).
    pub revoked: revoked::Revocations,
    /// One past the highest record index ever claimed: readers that walk the
    /// records stop here. A walk over all [`MAX_PROCS`] records maps in 128 KiB
    /// of pages no process ever wrote (a read of untouched shared memory still
    /// allocates the page), which showed as a worker's RSS jumping by 164 KiB
    /// the first time it served `/metrics`.
    pub claimed: AtomicUsize,
}

impl Region {
    /// Map a zeroed region. Call once, in the supervisor, before forking.
    pub fn create() -> io::Result<&'static Region> {
        let ptr = crate::sys::map_shared_anonymous(std::mem::size_of::<Region>())?;
        // SAFETY: the mapping is page-aligned (≥ 64), large enough, zero-filled
        // (a valid value for every atomic in `Region`) and never unmapped, so a
        // shared `'static` reference to it is sound; all access goes through atomics.
        let region = unsafe { &*(ptr as *const Region) };
        region.revoked.start(crate::auth::jwt::now_ms());
        Ok(region)
    }

    /// Claim a free record for a new process (supervisor only).
    pub fn claim(&self) -> Option<usize> {
        let i = self.procs.iter().position(|p| p.pid.load(Ordering::Relaxed) == 0)?;
        // Before the pid is published (Release below): a reader that sees the pid sees this.
        self.claimed.fetch_max(i + 1, Ordering::Relaxed);
        let rec = &self.procs[i];
        rec.state.store(WorkerState::Starting as u32, Ordering::Relaxed);
        rec.heartbeat_ms.store(crate::sys::monotonic_ms(), Ordering::Relaxed);
        rec.connections.store(0, Ordering::Relaxed);
        rec.requests.store(0, Ordering::Relaxed);
        self.reset_metrics(i);
        rec.pid.store(-1, Ordering::Release);
        Some(i)
    }

    /// The records that may be in use (see [`Region::claimed`]) with their metrics blocks.
    pub fn claimed_records(&self) -> impl Iterator<Item = (&ProcRecord, &metrics::ProcMetrics)> {
        let n = self.claimed.load(Ordering::Acquire).min(MAX_PROCS);
        self.procs[..n].iter().zip(self.metrics[..n].iter())
    }

    /// Give a record back (supervisor only, after reaping its process). Its
    /// metrics counters are added to the retired block first.
    pub fn release(&self, i: usize) {
        if let Some(rec) = self.procs.get(i) {
            self.retire_metrics(i, || rec.pid.store(0, Ordering::Release));
        }
    }
}

impl ProcRecord {
    /// The state the worker last published.
    pub fn state(&self) -> WorkerState {
        match self.state.load(Ordering::Relaxed) {
            1 => WorkerState::Serving,
            2 => WorkerState::Draining,
            _ => WorkerState::Starting,
        }
    }

    /// Publish a state (worker only).
    pub fn set_state(&self, s: WorkerState) {
        self.state.store(s as u32, Ordering::Release);
    }

    /// Stamp the heartbeat (worker only, every loop turn).
    pub fn beat(&self, now_ms: u64) {
        self.heartbeat_ms.store(now_ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_cache_line_sized_and_claimed_once() {
        assert_eq!(std::mem::size_of::<ProcRecord>(), 64);
        let r = Region::create().expect("map");
        let a = r.claim().expect("a");
        let b = r.claim().expect("b");
        assert_ne!(a, b);
        r.release(a);
        assert_eq!(r.claim(), Some(a));
    }
}
