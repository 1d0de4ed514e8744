//! The shared rate-limit table: fixed-window request counters, one table for
//! every worker, living inside the shared [`Region`](super::Region).
//!
//! It owns a fixed array of [`BUCKETS`] 16-byte buckets grouped in sets of
//! [`WAYS`] (a set-associative cache, like a CPU cache: a key can live only in
//! the set its hash selects), the keyed hash that places keys, and the
//! counting rules. It plays the role of nginx's `limit_req` zone, but instead
//! of a red-black tree and an LRU queue under a shared mutex it uses one
//! compare-and-swap per hit on a single 64-bit word.
//!
//! What it must not do:
//! - allocate, or grow: the table is part of a fixed mapping; a flood of new
//!   keys evicts old ones instead (least recently hit in the key's set);
//! - take any lock: a worker can be `SIGKILL`ed at *any* instruction, and a
//!   lock it held would be held forever. Every change is one CAS on a bucket's
//!   `word`; a worker killed anywhere leaves the table consistent, at worst
//!   with its own hit not counted or one bucket's recency hint a little off;
//! - hold pointers: the table is plain integers, valid at any address.
//!
//! Windows are fixed and aligned to multiples of `window_ms` since the epoch
//! of the monotonic clock ([`crate::sys::monotonic_ms`], the same clock in
//! every process), which is what express-rate-limit's default memory store
//! does: a client can get up to `2 × max` requests through around a window
//! boundary, never more.
//!
//! The answer errs towards *allowing*: an evicted key starts again from zero,
//! and two processes inserting the same *new* key at the same instant, while
//! seeing its set differently, may claim two buckets and split its count until
//! the orphan is evicted.
//! It can wrongly *refuse* only when two keys share a set and a 24-bit tag
//! (for one key against a full set of others, about 1 in 2^21); the hash is
//! keyed with a secret seed chosen before fork, so such pairs cannot be picked
//! offline.

use std::sync::atomic::{AtomicU64, Ordering};

/// Buckets in the table (16 bytes each: 1 MiB; pages never touched cost no RSS).
pub const BUCKETS: usize = 65536;
/// Buckets per set: how many places a key may occupy, and how many candidates
/// eviction chooses from. Eight 16-byte buckets are two adjacent cache lines.
pub const WAYS: usize = 8;
/// Number of sets.
pub const SETS: usize = BUCKETS / WAYS;

const COUNT_BITS: u32 = 20;
const WINDOW_BITS: u32 = 20;
const TAG_BITS: u32 = 24;
/// The largest count a bucket holds; counting saturates there.
pub const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const WINDOW_MASK: u64 = (1 << WINDOW_BITS) - 1;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// How many times one call retries after losing a CAS race before it answers
/// from what it last saw. Every lost race means another hit was stored, so
/// this bound is never reached in practice; it only makes the call wait-free.
const MAX_TRIES: usize = 256;

/// The answer for one request: what to do and what to put in the
/// `RateLimit-*` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The configured maximum per window (`RateLimit-Limit`).
    pub limit: u64,
    /// Requests still allowed in this window (`RateLimit-Remaining`).
    pub remaining: u64,
    /// Whole seconds until the current window ends, at least 1
    /// (`RateLimit-Reset`, `Retry-After`).
    pub reset_secs: u64,
}

/// A slot granted by [`RateTable::take`]: the window it counts in, so that
/// [`RateTable::give_back`] returns it to that window only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    window: u64,
}

/// One bucket. `word` is the whole entry; `last_ms` is a recency hint.
#[repr(C)]
struct Bucket {
    /// `tag (24) | window (20) | count (20)`, 0 when empty (a tag is never 0).
    word: AtomicU64,
    /// Monotonic ms of the latest hit, raised (never lowered) *before* the
    /// CAS that stores a hit, so that whoever sees a word also sees a
    /// `last_ms` at least as new as that word's window.
    last_ms: AtomicU64,
}

impl Bucket {
    /// Raise `last_ms` to `now_ms`. A bucket already stamped at or after
    /// `now_ms` is left alone (most hits on a busy key), which keeps the
    /// guarantee: a reader that acquires a word stored after this call reads a
    /// `last_ms` at least as large as the one read here (read-read coherence),
    /// and `last_ms` only ever grows.
    fn touch(&self, now_ms: u64) {
        if self.last_ms.load(Ordering::Relaxed) < now_ms {
            self.last_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }
}

/// A set of [`WAYS`] buckets, aligned so it spans exactly two cache lines.
#[repr(C, align(64))]
struct Set {
    ways: [Bucket; WAYS],
}

/// The table. All-zero memory is a valid, empty, unseeded table.
#[repr(C)]
pub struct RateTable {
    /// The 128-bit SipHash key, written once by [`RateTable::init`].
    seed: [AtomicU64; 2],
    sets: [Set; SETS],
}

/// What a bucket holding the caller's tag means for the caller.
enum Entry {
    /// Counting in this window (or in the next one, already opened by a
    /// process whose clock read a little later): the count so far.
    Current(u64),
    /// An older window: the next hit starts a new one.
    Stale,
}

impl RateTable {
    /// Set the secret hash key. Call once, in the supervisor, before forking
    /// (for example with `rand::random()`). An unseeded table works but its
    /// bucket placement is predictable.
    pub fn init(&self, seed: u128) {
        self.seed[0].store(seed as u64, Ordering::Relaxed);
        self.seed[1].store((seed >> 64) as u64, Ordering::Relaxed);
    }

    /// Count one request for `key` and decide on it: allowed while the count
    /// in the current window, this request included, is at most `max`.
    ///
    /// Refused requests are counted too (the window still ends on time).
    /// `now_ms` must come from [`crate::sys::monotonic_ms`]; `window_ms` takes
    /// part in the hash, so the same key bytes used with two window lengths are two
    /// independent counters. Limiters that share a window length but not a
    /// maximum must prefix their keys (`b"login\0..."`).
    pub fn hit(&self, key: &[u8], now_ms: u64, window_ms: u64, max: u64) -> Decision {
        let window_ms = window_ms.max(1);
        let (set, tag) = self.locate(key, window_ms);
        let cur = (now_ms / window_ms) & WINDOW_MASK;
        let fresh = pack(tag, cur, 1);
        let mut seen = 1;
        for _ in 0..MAX_TRIES {
            let (bucket, old, new) = match find(set, tag) {
                Some((bucket, old)) => match classify(bucket, old, now_ms, cur, window_ms) {
                    Entry::Current(count) if count >= COUNT_MAX => {
                        bucket.touch(now_ms);
                        return decide(COUNT_MAX, now_ms, window_ms, max);
                    }
                    Entry::Current(_) => (bucket, old, old + 1),
                    Entry::Stale => (bucket, old, fresh),
                },
                None => {
                    let (bucket, old) = victim(set);
                    (bucket, old, fresh)
                }
            };
            seen = count_of(new);
            bucket.touch(now_ms);
            if bucket.word.compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return decide(seen, now_ms, window_ms, max);
            }
        }
        decide(seen, now_ms, window_ms, max)
    }

    /// Look at `key` without counting: `allowed` says whether a [`hit`] now
    /// would be allowed (count so far `< max`), `remaining` how many hits
    /// still would be. Not a way to bound work: attempts that all peek before
    /// any of them counts all pass; [`take`] is.
    ///
    /// [`hit`]: RateTable::hit
    /// [`take`]: RateTable::take
    pub fn peek(&self, key: &[u8], now_ms: u64, window_ms: u64, max: u64) -> Decision {
        let window_ms = window_ms.max(1);
        let (set, tag) = self.locate(key, window_ms);
        let cur = (now_ms / window_ms) & WINDOW_MASK;
        let count = match find(set, tag) {
            Some((bucket, word)) => match classify(bucket, word, now_ms, cur, window_ms) {
                Entry::Current(count) => count,
                Entry::Stale => 0,
            },
            None => 0,
        };
        let d = decide(count, now_ms, window_ms, max);
        Decision { allowed: count < max, ..d }
    }

    /// Take one of `max` slots for `key` in the current window: granted (and
    /// counted) while fewer than `max` are taken, refused *without* counting
    /// otherwise, so the count never passes `max`. One CAS decides, so
    /// concurrent takers across threads and processes can never be granted
    /// more than `max` slots in one window between them.
    ///
    /// For limiters that bound work rather than count requests (login
    /// attempts): take before the work, [`give_back`] when it turns out not to
    /// count. Unlike [`hit`], a take that keeps losing CAS races is refused:
    /// a slot is granted only once it is stored. An evicted key still starts
    /// again from zero.
    ///
    /// [`give_back`]: RateTable::give_back
    /// [`hit`]: RateTable::hit
    pub fn take(&self, key: &[u8], now_ms: u64, window_ms: u64, max: u64) -> (Decision, Option<Slot>) {
        let window_ms = window_ms.max(1);
        let (set, tag) = self.locate(key, window_ms);
        let cur = (now_ms / window_ms) & WINDOW_MASK;
        let cap = max.min(COUNT_MAX);
        let refused = |count| (Decision { allowed: false, ..decide(count, now_ms, window_ms, max) }, None);
        if cap == 0 {
            return refused(0);
        }
        let mut seen = cap;
        for _ in 0..MAX_TRIES {
            let (bucket, old, new) = match find(set, tag) {
                Some((bucket, old)) => match classify(bucket, old, now_ms, cur, window_ms) {
                    Entry::Current(count) if count >= cap => {
                        bucket.touch(now_ms);
                        return refused(count);
                    }
                    Entry::Current(_) => (bucket, old, old + 1),
                    Entry::Stale => (bucket, old, pack(tag, cur, 1)),
                },
                None => {
                    let (bucket, old) = victim(set);
                    (bucket, old, pack(tag, cur, 1))
                }
            };
            bucket.touch(now_ms);
            if bucket.word.compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let slot = Slot { window: window_of(new) };
                return (decide(count_of(new), now_ms, window_ms, max), Some(slot));
            }
            seen = count_of(new);
        }
        refused(seen)
    }

    /// Give back a slot [`take`] granted for `key`: the count of its window
    /// goes down by one. Nothing happens once that window is over (its slots
    /// ended with it) or when the key was evicted meanwhile.
    ///
    /// [`take`]: RateTable::take
    pub fn give_back(&self, key: &[u8], slot: Slot, window_ms: u64) {
        let (set, tag) = self.locate(key, window_ms.max(1));
        for _ in 0..MAX_TRIES {
            let Some((bucket, word)) = find(set, tag) else { return };
            if window_of(word) != slot.window || count_of(word) == 0 {
                return;
            }
            if bucket.word.compare_exchange(word, word - 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// Forget `key`. Best effort: a hit racing with the reset may survive it.
    pub fn reset(&self, key: &[u8], window_ms: u64) {
        let (set, tag) = self.locate(key, window_ms.max(1));
        for _ in 0..MAX_TRIES {
            let Some((bucket, word)) = find(set, tag) else { return };
            if bucket.word.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// The key's set and its tag (24 bits, never 0).
    fn locate(&self, key: &[u8], window_ms: u64) -> (&Set, u64) {
        let h =
            siphash::<1, 3>(self.seed[0].load(Ordering::Relaxed), self.seed[1].load(Ordering::Relaxed), window_ms, key);
        let set = &self.sets[(h as usize) % SETS];
        let tag = (h >> 40) & TAG_MASK;
        (set, if tag == 0 { 1 } else { tag })
    }
}

/// The bucket of `set` holding `tag`, with the word as read.
fn find(set: &Set, tag: u64) -> Option<(&Bucket, u64)> {
    set.ways.iter().find_map(|b| {
        let w = b.word.load(Ordering::Acquire);
        (w != 0 && tag_of(w) == tag).then_some((b, w))
    })
}

/// The bucket a new key takes over, with its word as read: the first empty
/// one, else the least recently hit. Whether another key's entry is stale
/// cannot be judged here (its window length is not stored: keys of every
/// limiter share the table), so recency alone decides.
fn victim(set: &Set) -> (&Bucket, u64) {
    let mut best = (&set.ways[0], u64::MAX, u64::MAX);
    for b in &set.ways {
        let w = b.word.load(Ordering::Acquire);
        if w == 0 {
            return (b, 0);
        }
        let last = b.last_ms.load(Ordering::Relaxed);
        if last < best.2 {
            best = (b, w, last);
        }
    }
    (best.0, best.1)
}

/// Decide whether `word` (which holds the caller's tag, read from `bucket`
/// with acquire) still counts in the caller's window `cur`.
///
/// The 20-bit window number repeats every 2^20 windows, so a match alone
/// could be an entry idle for exactly that long; `last_ms` tells them apart.
/// It is raised before every CAS that stores a word, so for a word written in
/// the current window `now_ms - last_ms < window_ms` always holds. A window
/// number slightly *ahead* of ours with a recent `last_ms` is the next window,
/// opened by a process that read the clock a moment later: count into it
/// rather than reset it.
fn classify(bucket: &Bucket, word: u64, now_ms: u64, cur: u64, window_ms: u64) -> Entry {
    let recent = now_ms.saturating_sub(bucket.last_ms.load(Ordering::Relaxed)) < window_ms;
    let ahead = window_of(word).wrapping_sub(cur) & WINDOW_MASK;
    if recent && ahead < (1 << (WINDOW_BITS - 1)) {
        Entry::Current(count_of(word))
    } else {
        Entry::Stale
    }
}

/// The decision for a window in which `count` hits (this one included) were seen.
fn decide(count: u64, now_ms: u64, window_ms: u64, max: u64) -> Decision {
    let end = (now_ms / window_ms + 1).saturating_mul(window_ms);
    let reset_secs = end.saturating_sub(now_ms).div_ceil(1000).max(1);
    Decision { allowed: count <= max, limit: max, remaining: max.saturating_sub(count), reset_secs }
}

fn pack(tag: u64, window: u64, count: u64) -> u64 {
    (tag << (WINDOW_BITS + COUNT_BITS)) | (window << COUNT_BITS) | count
}

fn tag_of(word: u64) -> u64 {
    word >> (WINDOW_BITS + COUNT_BITS)
}

fn window_of(word: u64) -> u64 {
    (word >> COUNT_BITS) & WINDOW_MASK
}

fn count_of(word: u64) -> u64 {
    word & COUNT_MAX
}

/// SipHash-C-D with key `(k0, k1)` over the message `prefix (8 bytes, LE) ‖ data`.
///
/// A keyed pseudo-random function, the one Rust's `HashMap` uses against hash
/// flooding; written out here because std exposes no stable keyed SipHash-1-3.
pub(crate) fn siphash<const C: usize, const D: usize>(k0: u64, k1: u64, prefix: u64, data: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    sip_compress::<C>(&mut v, prefix);
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        sip_compress::<C>(&mut v, u64::from_le_bytes(b));
    }
    let mut last = [0u8; 8];
    let tail = chunks.remainder();
    last[..tail.len()].copy_from_slice(tail);
    last[7] = (data.len() as u64).wrapping_add(8) as u8;
    sip_compress::<C>(&mut v, u64::from_le_bytes(last));
    v[2] ^= 0xff;
    for _ in 0..D {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

fn sip_compress<const C: usize>(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    for _ in 0..C {
        sip_round(v);
    }
    v[0] ^= m;
}

fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Region;

    const MIN: u64 = 60_000;

    /// A fresh, seeded table in its own shared mapping (zeroed = empty).
    fn table() -> &'static RateTable {
        let region = Region::create().expect("map region");
        region.rate.init(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        &region.rate
    }

    /// How many hits `key` has in the window containing `now`.
    fn count(t: &RateTable, key: &[u8], now: u64, window_ms: u64) -> u64 {
        let max = 1 << 30;
        max - t.peek(key, now, window_ms, max).remaining
    }

    fn occupied(t: &RateTable) -> usize {
        t.sets.iter().flat_map(|s| &s.ways).filter(|b| b.word.load(Ordering::Relaxed) != 0).count()
    }

    #[test]
    fn layout_is_fixed_and_bucket_sized() {
        assert_eq!(std::mem::size_of::<Bucket>(), 16);
        assert_eq!(std::mem::size_of::<Set>(), 128);
        assert_eq!(std::mem::size_of::<RateTable>(), 64 + BUCKETS * 16);
        assert_eq!(std::mem::align_of::<RateTable>(), 64);
    }

    #[test]
    fn hundred_allowed_then_the_101st_refused() {
        let t = table();
        // Window 16 of one minute: [960 000, 1 020 000); 15 s left at 1 005 000.
        let now = 1_005_000;
        for i in 1..=100 {
            let d = t.hit(b"10.0.0.1", now, MIN, 100);
            assert_eq!(d, Decision { allowed: true, limit: 100, remaining: 100 - i, reset_secs: 15 }, "hit {i}");
        }
        let d = t.hit(b"10.0.0.1", now + 14_001, MIN, 100);
        assert_eq!(d, Decision { allowed: false, limit: 100, remaining: 0, reset_secs: 1 });
        assert_eq!(count(t, b"10.0.0.1", now, MIN), 101, "refused hits are counted");
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let t = table();
        for _ in 0..101 {
            t.hit(b"k", 1_005_000, MIN, 100);
        }
        let d = t.hit(b"k", 1_020_000, MIN, 100);
        assert_eq!(d, Decision { allowed: true, limit: 100, remaining: 99, reset_secs: 60 });
        // Much later: still a fresh window.
        assert_eq!(t.hit(b"k", 9_999_999_000, MIN, 100).remaining, 99);
    }

    #[test]
    fn keys_are_independent() {
        let t = table();
        for _ in 0..5 {
            t.hit(b"a", 1000, MIN, 5);
        }
        assert!(!t.hit(b"a", 1000, MIN, 5).allowed);
        assert_eq!(t.hit(b"b", 1000, MIN, 5).remaining, 4);
        // The same bytes under another window length are another counter.
        assert_eq!(t.hit(b"a", 1000, 2 * MIN, 5).remaining, 4);
    }

    #[test]
    fn peek_does_not_count() {
        let t = table();
        let k = b"login\x0010.0.0.1\x00a@example.com";
        for _ in 0..3 {
            assert_eq!(t.peek(k, 1000, MIN, 5), Decision { allowed: true, limit: 5, remaining: 5, reset_secs: 59 });
        }
        for _ in 0..4 {
            t.hit(k, 1000, MIN, 5);
        }
        assert_eq!(t.peek(k, 1000, MIN, 5), Decision { allowed: true, limit: 5, remaining: 1, reset_secs: 59 });
        assert!(t.hit(k, 1000, MIN, 5).allowed, "the 5th failure is still within the limit");
        assert_eq!(t.peek(k, 1000, MIN, 5), Decision { allowed: false, limit: 5, remaining: 0, reset_secs: 59 });
        assert_eq!(count(t, k, 1000, MIN), 5);
    }

    #[test]
    fn take_grants_max_slots_and_refuses_without_counting() {
        let t = table();
        let k = b"login\x0010.0.0.1\x00a@example.com";
        for i in 1..=3 {
            let (d, slot) = t.take(k, 1000, MIN, 3);
            assert_eq!(d, Decision { allowed: true, limit: 3, remaining: 3 - i, reset_secs: 59 }, "take {i}");
            assert!(slot.is_some());
        }
        for _ in 0..5 {
            let (d, slot) = t.take(k, 1000, MIN, 3);
            assert_eq!((d.allowed, d.remaining, slot), (false, 0, None));
        }
        assert_eq!(count(t, k, 1000, MIN), 3, "refused takes are not counted");
        // The next window starts from zero.
        assert!(t.take(k, 60_000, MIN, 3).0.allowed);
        assert!(!t.take(b"never", 1000, MIN, 0).0.allowed, "max 0 grants nothing");
    }

    #[test]
    fn a_slot_given_back_can_be_taken_again_in_its_window_only() {
        let t = table();
        let (_, first) = t.take(b"g", 1000, MIN, 2);
        let (_, second) = t.take(b"g", 1000, MIN, 2);
        assert!(!t.take(b"g", 1000, MIN, 2).0.allowed);
        t.give_back(b"g", second.expect("granted"), MIN);
        assert_eq!(count(t, b"g", 1000, MIN), 1);
        assert!(t.take(b"g", 1000, MIN, 2).0.allowed, "the slot given back is free again");
        // A slot of an earlier window does not lower the count of the current one.
        let (_, late) = t.take(b"g", 60_000, MIN, 2);
        assert!(late.is_some());
        t.give_back(b"g", first.expect("granted"), MIN);
        assert_eq!(count(t, b"g", 60_000, MIN), 1);
        t.give_back(b"never-taken", late.expect("granted"), MIN);
    }

    #[test]
    fn concurrent_takes_never_grant_more_than_max() {
        let t = table();
        let granted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..500).filter(|_| t.take(b"race", 1000, MIN, 37).1.is_some()).count()))
                .collect();
            workers.into_iter().map(|w| w.join().expect("thread")).sum()
        });
        assert_eq!(granted, 37);
        assert_eq!(count(t, b"race", 1000, MIN), 37);
    }

    #[test]
    fn reset_forgets_the_key_only() {
        let t = table();
        for _ in 0..10 {
            t.hit(b"x", 1000, MIN, 5);
            t.hit(b"y", 1000, MIN, 5);
        }
        t.reset(b"x", MIN);
        assert_eq!(count(t, b"x", 1000, MIN), 0);
        assert_eq!(count(t, b"y", 1000, MIN), 10);
        assert_eq!(t.hit(b"x", 1000, MIN, 5).remaining, 4);
        t.reset(b"never-seen", MIN);
    }

    #[test]
    fn threads_hitting_one_key_count_exactly() {
        let t = table();
        let mut seen: Vec<u64> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..1000).map(|_| 10_000 - t.hit(b"hot", 1000, MIN, 10_000).remaining).collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().expect("thread")).collect()
        });
        seen.sort_unstable();
        assert_eq!(seen, (1..=4000).collect::<Vec<u64>>(), "every hit saw a distinct count");
        assert_eq!(count(t, b"hot", 1000, MIN), 4000);
    }

    #[test]
    fn forked_processes_share_the_count() {
        use nix::sys::wait::{waitpid, WaitStatus};
        let region = Region::create().expect("map region");
        region.rate.init(42);
        let t = &region.rate;
        let hits = |n| {
            for _ in 0..n {
                t.hit(b"shared", 1000, MIN, 10_000);
            }
        };
        match crate::sys::fork().expect("fork") {
            crate::sys::Forked::Child => {
                // Never return into the test harness from the child.
                let ok = std::panic::catch_unwind(|| hits(500)).is_ok();
                std::process::exit(if ok { 0 } else { 1 });
            }
            crate::sys::Forked::Parent(pid) => {
                hits(500);
                let status = waitpid(nix::unistd::Pid::from_raw(pid), None).expect("waitpid");
                assert!(matches!(status, WaitStatus::Exited(_, 0)), "child: {status:?}");
            }
        }
        assert_eq!(count(t, b"shared", 1000, MIN), 1000);
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_bounded_and_keeps_hot_keys() {
        let t = table();
        let window = 1 << 40; // one window for the whole test
        let mut now = 1_000;
        for _ in 0..10 {
            t.hit(b"cold", now, window, 100);
        }
        let (mut hot, mut repeats) = (0, 0);
        for i in 0u64..1_000_000 {
            now += i & 1; // the clock advances 1 ms every other request
            if t.hit(&i.to_le_bytes(), now, window, 100).remaining != 99 {
                repeats += 1; // a (set, tag) collision with an earlier key: ~1e-6 per key
            }
            if i % 1000 == 0 {
                hot += 1;
                assert_eq!(t.hit(b"hot", now, window, 100_000).remaining, 100_000 - hot, "hot hit {hot}");
            }
        }
        assert!(repeats < 10, "{repeats} flood keys were confused with others");
        assert_eq!(occupied(t), BUCKETS, "the flood fills the table, and no more");
        // The hot key, hit every 1000 requests, is never the least recently hit
        // of its set, so it keeps its exact count. The cold key, idle since
        // before the flood, was evicted: it starts again from zero.
        assert_eq!(count(t, b"hot", now, window), 1000);
        assert_eq!(count(t, b"cold", now, window), 0);
        assert_eq!(t.hit(b"hot", now, window, 100_000).remaining, 100_000 - 1001);
    }

    #[test]
    fn hostile_keys_are_just_keys() {
        let t = table();
        let big = vec![0xAB; 64 * 1024];
        let mut big2 = big.clone();
        big2[65535] = 0xAC;
        for _ in 0..3 {
            t.hit(b"", 1000, MIN, 10);
            t.hit(&big, 1000, MIN, 10);
        }
        t.hit(&big2, 1000, MIN, 10);
        assert_eq!(count(t, b"", 1000, MIN), 3);
        assert_eq!(count(t, &big, 1000, MIN), 3);
        assert_eq!(count(t, &big2, 1000, MIN), 1);
        assert!(!t.hit(b"z", 1000, MIN, 0).allowed, "max 0 refuses everything");
        assert_eq!(t.hit(b"z", 1000, 0, 1).reset_secs, 1, "window 0 is treated as 1 ms");
        assert_eq!(t.hit(b"z", u64::MAX, u64::MAX, 1).reset_secs, 1);
    }

    #[test]
    fn counts_saturate() {
        let t = table();
        let max = 2 * COUNT_MAX;
        for _ in 0..COUNT_MAX + 5 {
            t.hit(b"s", 1000, MIN, max);
        }
        assert_eq!(count(t, b"s", 1000, MIN), COUNT_MAX);
        assert_eq!(t.hit(b"s", 1000, MIN, 10).remaining, 0);
    }

    #[test]
    fn a_window_number_that_wrapped_around_is_not_the_current_window() {
        let t = table();
        for _ in 0..7 {
            t.hit(b"w", 5_000, 1000, 10);
        }
        // 2^20 windows later the 20-bit window number is the same again.
        let later = 5_000 + (1 << WINDOW_BITS) * 1000;
        assert_eq!(count(t, b"w", later, 1000), 0);
        assert_eq!(t.hit(b"w", later, 1000, 10).remaining, 9);
    }

    #[test]
    fn a_process_reading_the_clock_late_counts_into_the_next_window() {
        let t = table();
        t.hit(b"c", 1_999, 1000, 10);
        t.hit(b"c", 2_000, 1000, 10); // opens window 2
                                      // A process that read the clock 1 ms earlier counts into window 2
                                      // instead of restarting window 1 over it.
        assert_eq!(t.hit(b"c", 1_999, 1000, 10).remaining, 8);
        assert_eq!(t.hit(b"c", 2_001, 1000, 10).remaining, 7);
    }

    #[test]
    #[allow(deprecated)] // std's SipHasher (2-4) is the reference implementation
    fn siphash_matches_the_reference() {
        use std::hash::{Hasher, SipHasher};
        // The paper's vector: key 00..0f, message 00..0e.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let msg: Vec<u8> = (0..15).collect();
        let prefix = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(siphash::<2, 4>(k0, k1, prefix, &msg[8..]), 0xa129_ca61_49be_45e5);
        let data: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37)).collect();
        for len in 0..data.len() {
            let mut h = SipHasher::new_with_keys(k0, k1);
            h.write(&77u64.to_le_bytes());
            h.write(&data[..len]);
            assert_eq!(siphash::<2, 4>(k0, k1, 77, &data[..len]), h.finish(), "length {len}");
        }
        assert_ne!(siphash::<1, 3>(1, 2, 3, b"x"), siphash::<1, 3>(1, 3, 3, b"x"), "the key matters");
    }

    #[test]
    #[ignore = "benchmark: cargo test --release --lib shm::ratelimit -- --ignored --nocapture"]
    fn bench_hit() {
        let t = table();
        let n = 2_000_000u64;
        let keys: Vec<[u8; 16]> =
            (0..n).map(|i| (i % 50_000).to_le_bytes().repeat(2).try_into().expect("16")).collect();
        let start = std::time::Instant::now();
        for (i, k) in keys.iter().enumerate() {
            std::hint::black_box(t.hit(k, 1_000 + i as u64 / 1000, MIN, 100));
        }
        let one_key = start.elapsed();
        let start = std::time::Instant::now();
        for i in 0..n {
            std::hint::black_box(t.hit(b"203.0.113.7", 1_000 + i / 1000, MIN, 100));
        }
        let hot = start.elapsed();
        println!(
            "hit: {:.1} ns (50 000 keys, 16 B), {:.1} ns (one hot key, 11 B)",
            one_key.as_nanos() as f64 / n as f64,
            hot.as_nanos() as f64 / n as f64
        );
    }
}
