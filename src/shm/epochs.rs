//! Change counters for user records, one shared array for every worker: a
//! write to user `id` bumps `id`'s counter after it commits; a worker's memo
//! of rendered users (`app::usermemo`) trusts an entry only while the counter
//! it was read under is unchanged.
//!
//! Fixed-size atomics in the shared region, no pointers, no locks. Ids share
//! counters modulo [`EPOCHS`]: a bump of one invalidates its neighbours' entries
//! too (a miss, never a stale answer). It must not know what a user is.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters in the array (a power of two).
pub const EPOCHS: usize = 4096;

/// `key`'s place in a table indexed by its low bits: a key below 2^48 (a user's id) is
/// itself; the bits above (a record's resource, see `app::usermemo::record_key`) are mixed
/// into the low ones, so records of different resources with the same id do not share.
pub fn spread(key: i64) -> usize {
    let k = key as u64;
    (k ^ (k >> 48).wrapping_mul(0x9e37_79b9_7f4a_7c15)) as usize
}

/// The counters.
#[repr(C)]
pub struct Epochs {
    counters: [AtomicU64; EPOCHS],
}

impl Epochs {
    /// Zeroed counters on the heap (tests; the workers' live in the shared region).
    #[cfg(test)]
    pub fn boxed() -> Box<Epochs> {
        Box::new(Epochs { counters: std::array::from_fn(|_| AtomicU64::new(0)) })
    }

    fn counter(&self, id: i64) -> &AtomicU64 {
        &self.counters[spread(id) & (EPOCHS - 1)]
    }

    /// `id`'s counter. Read before the record is (so that a write committed
    /// after the read leaves the entry stale, not trusted).
    pub fn get(&self, id: i64) -> u64 {
        self.counter(id).load(Ordering::Acquire)
    }

    /// Record that `id` changed. Call after the change committed and before
    /// the writer's answer goes out.
    pub fn bump(&self, id: i64) {
        self.counter(id).fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_changes_its_counter_and_its_neighbours_modulo_the_size_only() {
        let e = Epochs::boxed();
        let (a, b) = (e.get(7), e.get(8));
        e.bump(7);
        assert_ne!(e.get(7), a);
        assert_eq!(e.get(8), b);
        assert_eq!(e.get(7 + EPOCHS as i64), e.get(7), "ids share counters modulo EPOCHS");
    }
}
