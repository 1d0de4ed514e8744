//! When a worker gives the allocator's free memory back to the kernel.
//!
//! glibc returns freed memory only from the top of each arena: pages freed
//! in the middle stay resident until `malloc_trim` ([`super::trim_heap`]).
//! This module decides, from a worker's connection counts and the time, which
//! give-back is due this turn; the worker's loop carries it out. It is a pure
//! policy: it holds no state and must not allocate, trim or touch a
//! connection itself.

use std::time::{Duration, Instant};

/// Connections a worker must have held at once before it gives memory back when they go.
pub const TRIM_PEAK: usize = 1024;
/// How often a worker hands the allocator's free pages back to the kernel
/// whatever happens (glibc `malloc_trim`): without it a worker's RSS creeps
/// up for its first minutes of mixed load (the pool threads' arenas fill
/// with holes) although its live heap is flat. One trim costs tens of
/// microseconds on a worker's few MiB of heap; Ruby does the same after a GC.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);
/// The least time between two trims made because the worker's last
/// connection closed: a worker serving short-lived connections one at a
/// time trims at most this often.
pub const QUIET_TRIM_GAP: Duration = Duration::from_secs(1);

/// The give-back due this turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// Nothing.
    No,
    /// [`TRIM_EVERY`] has passed: trim the heap.
    Periodic,
    /// The last connection closed: trim the heap now, so what the
    /// connections held (an HTTP/2 connection's stream table and frame
    /// buffers: ~150 KiB when busy) goes back when they go.
    Quiet,
    /// A crowd of at least [`TRIM_PEAK`] connections fell to a quarter:
    /// shrink the connection table too, then trim.
    Crowd,
}

/// The counts and deadlines the decision reads.
#[derive(Clone, Copy, Debug)]
pub struct State {
    /// TCP connections open now.
    pub live: usize,
    /// Most connections open at once since memory was last given back
    /// after they went (0: none since).
    pub peak: usize,
    /// When a [`Trim::Periodic`] is due.
    pub next_trim: Instant,
    /// The earliest a [`Trim::Quiet`] may run.
    pub next_quiet_trim: Instant,
}

/// What to give back at `now`. A crowd's departure wins over the rest (it
/// also shrinks the connection table); a quiet worker trims once per quiet
/// spell (the caller sets `peak` to 0 after a [`Trim::Quiet`]), and not
/// twice within [`QUIET_TRIM_GAP`] (it trims on a later turn instead).
pub fn due(s: State, now: Instant) -> Trim {
    if s.peak >= TRIM_PEAK && s.live <= s.peak / 4 {
        Trim::Crowd
    } else if s.live == 0 && s.peak > 0 && now >= s.next_quiet_trim {
        Trim::Quiet
    } else if now >= s.next_trim {
        Trim::Periodic
    } else {
        Trim::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(live: usize, peak: usize, now: Instant) -> State {
        State { live, peak, next_trim: now + TRIM_EVERY, next_quiet_trim: now }
    }

    #[test]
    fn the_last_connection_closing_trims_at_once() {
        let now = Instant::now();
        assert_eq!(due(at(0, 100, now), now), Trim::Quiet);
        assert_eq!(due(at(0, 1, now), now), Trim::Quiet);
    }

    #[test]
    fn a_worker_with_connections_or_already_trimmed_waits_for_the_period() {
        let now = Instant::now();
        assert_eq!(due(at(1, 100, now), now), Trim::No);
        // peak 0: nothing was open since the last give-back.
        assert_eq!(due(at(0, 0, now), now), Trim::No);
        assert_eq!(due(at(1, 100, now), now + TRIM_EVERY), Trim::Periodic);
    }

    #[test]
    fn quiet_trims_are_at_least_a_gap_apart() {
        let now = Instant::now();
        let mut s = at(0, 3, now);
        s.next_quiet_trim = now + QUIET_TRIM_GAP;
        assert_eq!(due(s, now), Trim::No);
        assert_eq!(due(s, now + QUIET_TRIM_GAP), Trim::Quiet);
    }

    #[test]
    fn a_crowd_leaving_shrinks_the_table_whether_or_not_it_is_gone() {
        let now = Instant::now();
        assert_eq!(due(at(TRIM_PEAK / 4, TRIM_PEAK, now), now), Trim::Crowd);
        assert_eq!(due(at(0, TRIM_PEAK, now), now), Trim::Crowd);
        assert_eq!(due(at(TRIM_PEAK / 4 + 1, TRIM_PEAK, now), now), Trim::No);
    }
}
