//! A counting global allocator, compiled only with the cargo feature
//! `count-alloc` (a measurement build; `bin/alloc-count` makes and drives one).
//!
//! It wraps the system allocator and counts, per process, the calls that
//! obtain memory (`alloc`, `alloc_zeroed`, `realloc`), the frees and the bytes
//! asked for. Counters are relaxed atomics in the process's own data, so after
//! a fork every worker counts only its own allocations (its pool threads
//! included). Without the feature this module does not exist and the binary
//! uses the system allocator directly: the default build pays nothing.
//!
//! It must not allocate, lock or log: it runs inside every allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counted.
pub struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counters are atomics and
// touch no allocator state.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        FREES.fetch_add(1, Relaxed);
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new_size.saturating_sub(layout.size()) as u64, Relaxed);
        // SAFETY: forwarded unchanged; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// This process's allocator calls so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `alloc` and `alloc_zeroed` calls.
    pub allocs: u64,
    /// `realloc` calls (a growing `Vec` or `String`).
    pub reallocs: u64,
    /// `dealloc` calls.
    pub frees: u64,
    /// Bytes asked for (by `realloc`: only the growth).
    pub bytes: u64,
}

/// The counts so far.
pub fn counts() -> Counts {
    Counts {
        allocs: ALLOCS.load(Relaxed),
        reallocs: REALLOCS.load(Relaxed),
        frees: FREES.load(Relaxed),
        bytes: BYTES.load(Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_and_a_growing_vec_are_counted() {
        // Other test threads allocate too: only lower bounds are exact.
        let before = counts();
        let b = std::hint::black_box(Box::new([7u8; 100]));
        let mut v: Vec<u8> = Vec::with_capacity(1);
        v.extend_from_slice(std::hint::black_box(&[1u8; 64]));
        drop(b);
        drop(v);
        let after = counts();
        assert!(after.allocs >= before.allocs + 2, "{before:?} → {after:?}");
        assert!(after.reallocs > before.reallocs, "{before:?} → {after:?}");
        assert!(after.frees >= before.frees + 2, "{before:?} → {after:?}");
        assert!(after.bytes >= before.bytes + 100 + 64, "{before:?} → {after:?}");
    }
}
