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
    /// Cross-host counting (`cluster.redis_url`); never touched without it.
    sync: SyncZone,
}

/// [`SyncZone::flags`]: hits mark their set dirty for the supervisor's flush.
const SYNC_ON: u64 = 1;
/// [`SyncZone::flags`]: decisions add the other hosts' counts (Redis is up).
const SYNC_REMOTE: u64 = 2;

/// What the supervisor's Redis bridge reads and writes (see
/// `supervisor::redis`): which sets were hit since its last flush, and, per
/// bucket, how many hits the *other* hosts counted for the bucket's key and
/// window. A worker only marks sets dirty and reads `remote`; the supervisor
/// alone clears `dirty` and writes `remote`. Like the buckets, every entry is
/// one atomic word, so a process killed anywhere leaves it consistent.
#[repr(C, align(64))]
struct SyncZone {
    /// [`SYNC_ON`] | [`SYNC_REMOTE`].
    flags: AtomicU64,
    /// Added to every `now_ms` (wrapping): wall-clock time minus monotonic
    /// time, so that every host's windows start at the same instant.
    clock_offset: AtomicU64,
    /// One bit per set: hit since the last flush.
    dirty: [AtomicU64; SETS / 64],
    /// Per bucket: `tag | window | count` packed like a bucket's word, the
    /// count being the other hosts' hits; it applies only while the bucket's
    /// word has the same tag and window.
    remote: [AtomicU64; BUCKETS],
}

/// One bucket hit since the last flush, as [`RateTable::drain_dirty`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The bucket's index (set × [`WAYS`] + way): also where [`RateTable::set_remote`] writes.
    pub index: usize,
    /// The key's 24-bit tag (with the set, the key's identity on every host sharing the seed).
    pub tag: u64,
    /// The 20-bit window number.
    pub window: u64,
    /// This host's count in that window.
    pub count: u64,
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
        let (flags, now_ms) = self.clock(now_ms);
        let (si, set, tag) = self.locate(key, window_ms);
        let cur = (now_ms / window_ms) & WINDOW_MASK;
        let fresh = pack(tag, cur, 1);
        let mut seen = 1;
        for _ in 0..MAX_TRIES {
            let (way, bucket, old, new) = match lookup(set, tag) {
                Ok((way, bucket, old)) => match classify(bucket, old, now_ms, cur, window_ms) {
                    Entry::Current(count) if count >= COUNT_MAX => {
                        bucket.touch(now_ms);
                        return decide(COUNT_MAX, now_ms, window_ms, max);
                    }
                    Entry::Current(_) => (way, bucket, old, old + 1),
                    Entry::Stale => (way, bucket, old, fresh),
                },
                Err((way, bucket, old)) => (way, bucket, old, fresh),
            };
            seen = count_of(new);
            bucket.touch(now_ms);
            if bucket.word.compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let other = self.synced(flags, si, way, new);
                return decide((seen + other).min(COUNT_MAX), now_ms, window_ms, max);
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
        let (flags, now_ms) = self.clock(now_ms);
        let (si, set, tag) = self.locate(key, window_ms);
        let cur = (now_ms / window_ms) & WINDOW_MASK;
        let count = match find(set, tag) {
            Some((way, bucket, word)) => match classify(bucket, word, now_ms, cur, window_ms) {
                Entry::Current(count) => (count + self.remote(flags, si, way, word)).min(COUNT_MAX),
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
    /// more than `max` slots in one window between them. (With cross-host
    /// counting on, the other hosts' share is as of the supervisor's last
    /// flush: the bound across hosts is the one `supervisor::redis` states.)
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
        let (flags, now_ms) = self.clock(now_ms);
        let (si, set, tag) = self.locate(key, window_ms);
        let cur = (now_ms / window_ms) & WINDOW_MASK;
        let cap = max.min(COUNT_MAX);
        let refused = |count| (Decision { allowed: false, ..decide(count, now_ms, window_ms, max) }, None);
        if cap == 0 {
            return refused(0);
        }
        let mut seen = cap;
        for _ in 0..MAX_TRIES {
            let (way, bucket, old, new) = match lookup(set, tag) {
                Ok((way, bucket, old)) => match classify(bucket, old, now_ms, cur, window_ms) {
                    Entry::Current(count) if count >= cap => {
                        bucket.touch(now_ms);
                        return refused(count);
                    }
                    Entry::Current(_) => (way, bucket, old, old + 1),
                    Entry::Stale => (way, bucket, old, pack(tag, cur, 1)),
                },
                Err((way, bucket, old)) => (way, bucket, old, pack(tag, cur, 1)),
            };
            let other = self.remote(flags, si, way, new);
            if count_of(new) + other > cap {
                bucket.touch(now_ms);
                return refused((count_of(new) - 1 + other).min(COUNT_MAX));
            }
            bucket.touch(now_ms);
            if bucket.word.compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.mark(flags, si);
                let slot = Slot { window: window_of(new) };
                return (decide(count_of(new) + other, now_ms, window_ms, max), Some(slot));
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
        let flags = self.sync.flags.load(Ordering::Relaxed);
        let (si, set, tag) = self.locate(key, window_ms.max(1));
        for _ in 0..MAX_TRIES {
            let Some((_, bucket, word)) = find(set, tag) else { return };
            if window_of(word) != slot.window || count_of(word) == 0 {
                return;
            }
            if bucket.word.compare_exchange(word, word - 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.mark(flags, si);
                return;
            }
        }
    }

    /// Forget `key` on this host. Best effort: a hit racing with the reset may
    /// survive it. The other hosts' share (cross-host counting) is not forgotten.
    pub fn reset(&self, key: &[u8], window_ms: u64) {
        let (_, set, tag) = self.locate(key, window_ms.max(1));
        for _ in 0..MAX_TRIES {
            let Some((_, bucket, word)) = find(set, tag) else { return };
            if bucket.word.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    /// The sync flags, and `now_ms` on the table's clock (see [`SyncZone::clock_offset`]).
    fn clock(&self, now_ms: u64) -> (u64, u64) {
        let flags = self.sync.flags.load(Ordering::Relaxed);
        if flags == 0 {
            return (0, now_ms);
        }
        (flags, now_ms.wrapping_add(self.sync.clock_offset.load(Ordering::Relaxed)))
    }

    /// After a hit stored `word` in bucket `way` of set `si`: mark the set
    /// dirty, and return the other hosts' count for the word's key and window.
    fn synced(&self, flags: u64, si: usize, way: usize, word: u64) -> u64 {
        self.mark(flags, si);
        self.remote(flags, si, way, word)
    }

    /// Mark set `si` as hit since the last flush (cross-host counting only).
    fn mark(&self, flags: u64, si: usize) {
        if flags & SYNC_ON == 0 {
            return;
        }
        let (word, bit) = (&self.sync.dirty[si / 64], 1u64 << (si % 64));
        // A load first: a set hit again before the flush costs no locked instruction.
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// The other hosts' count for `word`'s key and window, 0 without one
    /// (or while Redis is down: each host counts alone then).
    fn remote(&self, flags: u64, si: usize, way: usize, word: u64) -> u64 {
        if flags & SYNC_REMOTE == 0 {
            return 0;
        }
        let r = self.sync.remote[si * WAYS + way].load(Ordering::Relaxed);
        let same = r != 0 && tag_of(r) == tag_of(word) && window_of(r) == window_of(word);
        if same {
            count_of(r)
        } else {
            0
        }
    }

    /// Turn cross-host counting on (supervisor, before forking): hits mark
    /// their sets dirty, and windows follow `now_ms + clock_offset_ms` (wall
    /// time, the same on every host). The other hosts' counts apply once
    /// [`RateTable::set_remote_on`] says Redis is up.
    pub fn enable_sync(&self, clock_offset_ms: u64) {
        self.sync.clock_offset.store(clock_offset_ms, Ordering::Relaxed);
        self.sync.flags.fetch_or(SYNC_ON, Ordering::Release);
    }

    /// Whether decisions add the other hosts' counts (Redis up) or not (down:
    /// each host falls back to its own count).
    pub fn set_remote_on(&self, on: bool) {
        if on {
            self.sync.flags.fetch_or(SYNC_REMOTE, Ordering::Release);
        } else {
            self.sync.flags.fetch_and(!SYNC_REMOTE, Ordering::Release);
        }
    }

    /// Every bucket in a set hit since the last call (supervisor only): the
    /// dirty marks are cleared first, so a hit during the walk marks its set
    /// again for the next call.
    pub fn drain_dirty(&self, mut f: impl FnMut(Counted)) {
        for (w, word) in self.sync.dirty.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::Acquire);
            while bits != 0 {
                let si = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                for (way, b) in self.sets[si].ways.iter().enumerate() {
                    let word = b.word.load(Ordering::Acquire);
                    if word != 0 {
                        f(Counted {
                            index: si * WAYS + way,
                            tag: tag_of(word),
                            window: window_of(word),
                            count: count_of(word),
                        });
                    }
                }
            }
        }
    }

    /// What bucket `index` holds now, if anything (supervisor only: whether a
    /// key it sent is still there, in the same window).
    pub fn bucket(&self, index: usize) -> Option<Counted> {
        let b = self.sets.get(index / WAYS)?.ways.get(index % WAYS)?;
        let word = b.word.load(Ordering::Acquire);
        (word != 0).then(|| Counted { index, tag: tag_of(word), window: window_of(word), count: count_of(word) })
    }

    /// The window number `now_ms` (monotonic) falls in, on the table's clock.
    pub fn window_at(&self, now_ms: u64, window_ms: u64) -> u64 {
        (self.clock(now_ms).1 / window_ms.max(1)) & WINDOW_MASK
    }

    /// Record the other hosts' count for bucket `index`'s key and window
    /// (supervisor only, from Redis' answer).
    pub fn set_remote(&self, index: usize, tag: u64, window: u64, count: u64) {
        if let Some(r) = self.sync.remote.get(index) {
            r.store(pack(tag & TAG_MASK, window & WINDOW_MASK, count.min(COUNT_MAX)), Ordering::Relaxed);
        }
    }

    /// The key's set (index and set) and its tag (24 bits, never 0).
    fn locate(&self, key: &[u8], window_ms: u64) -> (usize, &Set, u64) {
        let h =
            siphash::<1, 3>(self.seed[0].load(Ordering::Relaxed), self.seed[1].load(Ordering::Relaxed), window_ms, key);
        let si = (h as usize) % SETS;
        let tag = (h >> 40) & TAG_MASK;
        (si, &self.sets[si], if tag == 0 { 1 } else { tag })
    }
}

/// The bucket of `set` holding `tag`, with its way and the word as read.
fn find(set: &Set, tag: u64) -> Option<(usize, &Bucket, u64)> {
    set.ways.iter().enumerate().find_map(|(way, b)| {
        let w = b.word.load(Ordering::Acquire);
        (w != 0 && tag_of(w) == tag).then_some((way, b, w))
    })
}

/// The key's bucket (`Ok`), or, when no way holds it, the bucket a new key
/// takes over (`Err`): the first empty one, else the least recently hit.
/// Whether another key's entry is stale cannot be judged here (its window
/// length is not stored: keys of every limiter share the table), so recency
/// alone decides. Each way is read once: the victim is chosen from the same
/// reads that found no key, so two processes inserting the same new key at
/// once pick the same empty bucket and one CAS fails (it retries and finds the
/// key). Choosing the victim in a second pass, after another process had put
/// the key into the first empty way, picked the next one and gave the key two
/// buckets, each counting up to the limit.
fn lookup(set: &Set, tag: u64) -> Result<(usize, &Bucket, u64), (usize, &Bucket, u64)> {
    let mut empty = None;
    let mut best = (0, &set.ways[0], u64::MAX, u64::MAX);
    for (way, b) in set.ways.iter().enumerate() {
        let w = b.word.load(Ordering::Acquire);
        if w == 0 {
            empty = empty.or(Some((way, b)));
            continue;
        }
        if tag_of(w) == tag {
            return Ok((way, b, w));
        }
        let last = b.last_ms.load(Ordering::Relaxed);
        if last < best.3 {
            best = (way, b, w, last);
        }
    }
    Err(match empty {
        Some((way, b)) => (way, b, 0),
        None => (best.0, best.1, best.2),
    })
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
        let sync = 64 + SETS / 8 + BUCKETS * 8;
        assert_eq!(std::mem::size_of::<RateTable>(), 64 + BUCKETS * 16 + sync);
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
    fn without_sync_nothing_is_marked_dirty() {
        let t = table();
        t.hit(b"a", 1000, MIN, 5);
        let mut n = 0;
        t.drain_dirty(|_| n += 1);
        assert_eq!(n, 0);
    }

    #[test]
    fn synced_hits_are_reported_once_and_other_hosts_counts_apply_only_while_up() {
        let t = table();
        t.enable_sync(0);
        for _ in 0..3 {
            t.hit(b"k", 1000, MIN, 10);
        }
        let mut seen = Vec::new();
        t.drain_dirty(|c| seen.push(c));
        assert_eq!(seen.len(), 1, "{seen:?}");
        let c = seen[0];
        assert_eq!((c.count, c.window), (3, 0));
        let mut again = 0;
        t.drain_dirty(|_| again += 1);
        assert_eq!(again, 0, "reported once until hit again");
        // Other hosts counted 6 in this window: 3 + 6 + this hit = 10, the last allowed.
        t.set_remote(c.index, c.tag, c.window, 6);
        assert_eq!(t.hit(b"k", 1000, MIN, 10).remaining, 6, "Redis not up yet: local count only");
        t.set_remote_on(true);
        assert!(!t.hit(b"k", 1000, MIN, 10).allowed, "5 here (this one included) + 6 elsewhere > 10");
        assert_eq!(t.peek(b"k", 1000, MIN, 100).remaining, 100 - 11);
        // Redis lost: each host counts alone again.
        t.set_remote_on(false);
        assert!(t.hit(b"k", 1000, MIN, 10).allowed);
        // Another window: the remote count of the old one does not apply.
        t.set_remote_on(true);
        assert_eq!(t.hit(b"k", MIN + 1000, MIN, 10).remaining, 9);
    }

    #[test]
    fn synced_takes_count_other_hosts_and_give_back_is_reported() {
        let t = table();
        t.enable_sync(0);
        t.set_remote_on(true);
        let (_, slot) = t.take(b"login", 1000, MIN, 3);
        let mut seen = Vec::new();
        t.drain_dirty(|c| seen.push(c));
        let c = seen[0];
        t.set_remote(c.index, c.tag, c.window, 2);
        assert!(!t.take(b"login", 1000, MIN, 3).0.allowed, "1 here + 2 elsewhere = 3 taken");
        t.give_back(b"login", slot.expect("granted"), MIN);
        let mut back = Vec::new();
        t.drain_dirty(|c| back.push(c.count));
        assert_eq!(back, [0], "the slot given back is reported");
        assert!(t.take(b"login", 1000, MIN, 3).0.allowed);
    }

    #[test]
    fn the_clock_offset_aligns_windows_to_wall_time() {
        let t = table();
        t.enable_sync(59_000);
        t.hit(b"c", 500, MIN, 10);
        // 500 + 59 000 is in window 0; 1 500 + 59 000 is in window 1.
        assert_eq!(t.hit(b"c", 900, MIN, 10).remaining, 8);
        assert_eq!(t.hit(b"c", 1_500, MIN, 10).remaining, 9, "a new window 1 s later");
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
