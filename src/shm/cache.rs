//! The shared cache: small byte values (upstream answers, typically JSON
//! under 2 KiB) stored by one worker (or, with `cluster.redis_url`, by the
//! supervisor on another host's behalf) and read by every worker until they
//! expire. It lives in its own anonymous `MAP_SHARED` mapping, made by the
//! supervisor before the first fork and sized from the configuration.
//!
//! It owns a fixed array of 8 KiB slots grouped in sets of [`WAYS`] (a
//! set-associative cache, like [`RateTable`](super::ratelimit::RateTable): a
//! key can live only in the set its keyed SipHash selects), the slot layout,
//! the per-slot seqlock and the eviction rule (the key's own slot, else an
//! empty or expired one, else the least recently used of the set).
//!
//! What it must not do:
//! - allocate, or grow: the mapping is fixed; a new key evicts an old one in
//!   its set. Values larger than [`ENTRY_BYTES`] (with their key) are simply
//!   not shared;
//! - take any lock that can be held forever: a worker can be `SIGKILL`ed at
//!   *any* instruction, including in the middle of writing a slot. A slot's
//!   `seq` is odd while it is written; a writer that finds it odd for more
//!   than [`STEAL_AFTER_MS`] takes it over. Readers never wait: an odd or
//!   changed `seq` is a miss;
//! - touch shared bytes except through atomics: every header field and every
//!   data word is an `AtomicU64`, so racing readers and writers are never a
//!   data race, only (at worst) a torn copy, which the reader detects by the
//!   `seq` check and, against a writer whose slot was taken over and whose
//!   late stores land anywhere, by a checksum over the whole entry;
//! - hold pointers: the mapping is plain integers, valid at any address. The
//!   handle ([`SharedCache`]: base address, set count, seed) is ordinary
//!   process memory, copied into every worker by fork.
//!
//! It never returns another key's value: `get` compares the full key bytes,
//! not only the 64-bit hash tag. It may miss a value that is there (a slot
//! being written, a racing eviction), and two workers storing the same *new*
//! key at the same instant may each take a slot; the copy found first is
//! served until it expires or is evicted.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Bytes in one slot, header included.
pub const SLOT_BYTES: usize = 8192;
/// Header words at the start of each slot.
const HEADER_WORDS: usize = 8;
/// Data words after the header.
const DATA_WORDS: usize = SLOT_BYTES / 8 - HEADER_WORDS;
/// Bytes of key + value one entry can hold; larger values are not shared (put returns false).
pub const ENTRY_BYTES: usize = SLOT_BYTES - HEADER_WORDS * 8;
/// Slots per set: how many places a key may occupy, and how many candidates
/// eviction chooses from.
pub const WAYS: usize = 4;
/// How long a slot may stay odd (being written) before another writer
/// assumes its writer died and takes the slot over.
pub const STEAL_AFTER_MS: u64 = 1000;
/// SipHash prefix separating cache placement from other uses of the seed.
const HASH_PREFIX: u64 = u64::from_le_bytes(*b"shmcache");
/// Odd multiplier of the checksum (2^64 / φ).
const SUM_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// One slot: a 64-byte header of atomics, then the data words.
///
/// | word | field        | meaning                                                     |
/// |------|--------------|-------------------------------------------------------------|
/// | 0    | `seq`        | seqlock: even = stable, odd = being written                 |
/// | 1    | `lock_ms`    | monotonic ms a writer last tried to lock (for stealing)     |
/// | 2    | `tag`        | 64-bit keyed hash of the key; 0 = never written             |
/// | 3    | `expires_ms` | monotonic ms at which the entry stops being served          |
/// | 4    | `lens`       | key length (low 32 bits), value length (high 32 bits)       |
/// | 5    | `sum`        | checksum of `tag`, `expires_ms`, `lens` and the data words  |
/// | 6    | `last_ms`    | monotonic ms of the last put or hit (eviction hint)         |
/// | 7    | `_spare`     | unused                                                      |
/// | 8..  | `data`       | key bytes then value bytes, little-endian, zero padded      |
///
/// `lock_ms` and `last_ms` are hints outside the seqlock and the checksum.
#[repr(C, align(64))]
struct Slot {
    seq: AtomicU64,
    lock_ms: AtomicU64,
    tag: AtomicU64,
    expires_ms: AtomicU64,
    lens: AtomicU64,
    sum: AtomicU64,
    last_ms: AtomicU64,
    _spare: AtomicU64,
    data: [AtomicU64; DATA_WORDS],
}

// SAFETY: only `AtomicU64`s, all zero in an empty slot (`seq` 0, no tag), aligned to 64.
unsafe impl super::ZeroSlot for Slot {}

/// A handle on the shared cache: where the mapping is, how many sets it
/// holds and the hash key. The handle is private to each process (fork copies
/// it, and the mapping sits at the same address in every child); the mapping
/// itself is the shared part.
pub struct SharedCache {
    /// The whole mapping, `sets × WAYS` slots; all-zero is an empty cache.
    slots: &'static [Slot],
    sets: usize,
    k0: u64,
    k1: u64,
}

/// What `put` thinks of one slot of the key's set, best first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// Holds the key's tag: overwrite in place.
    Own,
    /// Never written, expired, or stuck odd for too long.
    Free,
    /// Live: evict the least recently used.
    Used(u64),
    /// Being written right now: leave alone.
    Busy,
}

impl SharedCache {
    /// Map a zeroed cache of at least `entries` slots (rounded up to whole sets). Supervisor, before fork.
    /// `seed` keys the hash that places keys (drawn from the OS by the caller, like RateTable::init).
    pub fn create(entries: usize, seed: u128) -> std::io::Result<&'static SharedCache> {
        let (slots, sets) = super::map_sets::<Slot>(entries, WAYS, "shared cache")?;
        Ok(Box::leak(Box::new(SharedCache { slots, sets, k0: seed as u64, k1: (seed >> 64) as u64 })))
    }

    /// Copy the live value for `key` into `out` (cleared first); returns its expiry (monotonic ms) or None
    /// when absent, expired (expires_ms <= now_ms), torn, or being written.
    pub fn get(&self, key: &[u8], now_ms: u64, out: &mut Vec<u8>) -> Option<u64> {
        self.get_hashed(self.hash(key), key, now_ms, out)
    }

    /// Store `value` under `key` until `expires_ms`. Returns false when it does not fit or the slot is busy.
    pub fn put(&self, key: &[u8], value: &[u8], expires_ms: u64, now_ms: u64) -> bool {
        self.put_hashed(self.hash(key), key, value, expires_ms, now_ms)
    }

    /// Number of slots (for tests/logs).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The keyed 64-bit hash of `key`: the set is `hash % sets`, the tag is
    /// the hash itself (never 0, which marks a slot never written).
    fn hash(&self, key: &[u8]) -> u64 {
        let h = super::ratelimit::siphash::<1, 3>(self.k0, self.k1, HASH_PREFIX, key);
        h.max(1)
    }

    fn set(&self, hash: u64) -> &[Slot] {
        let first = (hash % self.sets as u64) as usize * WAYS;
        &self.slots[first..first + WAYS]
    }

    /// The checksum's starting value: keyed, so that two values whose torn
    /// mix passes the check cannot be crafted offline.
    fn sum_start(&self) -> u64 {
        self.k0.rotate_left(17) ^ self.k1
    }

    fn get_hashed(&self, hash: u64, key: &[u8], now_ms: u64, out: &mut Vec<u8>) -> Option<u64> {
        out.clear();
        if key.len() > ENTRY_BYTES {
            return None;
        }
        for slot in self.set(hash) {
            if let Some(expires) = self.read(slot, hash, key, now_ms, out) {
                if slot.last_ms.load(Ordering::Relaxed) < now_ms {
                    slot.last_ms.store(now_ms, Ordering::Relaxed);
                }
                return Some(expires);
            }
            out.clear();
        }
        None
    }

    /// The seqlock read of one slot: the value for `key` appended to `out`
    /// and its expiry, or None (other key, expired, being written, torn).
    fn read(&self, slot: &Slot, hash: u64, key: &[u8], now_ms: u64, out: &mut Vec<u8>) -> Option<u64> {
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 1 || slot.tag.load(Ordering::Relaxed) != hash {
            return None;
        }
        let expires = slot.expires_ms.load(Ordering::Relaxed);
        let lens = slot.lens.load(Ordering::Relaxed);
        let stored = slot.sum.load(Ordering::Relaxed);
        let (klen, vlen) = ((lens & 0xffff_ffff) as usize, (lens >> 32) as usize);
        if expires <= now_ms || klen != key.len() || klen + vlen > ENTRY_BYTES {
            return None;
        }
        let mut sum = self.sum_start();
        sum = mix(mix(mix(sum, hash), expires), lens);
        out.reserve(vlen);
        let end = klen + vlen;
        for (i, word) in slot.data[..end.div_ceil(8)].iter().enumerate() {
            let w = word.load(Ordering::Relaxed);
            sum = mix(sum, w);
            let bytes = w.to_le_bytes();
            let at = i * 8;
            if at < klen {
                let k = (klen - at).min(8);
                if bytes[..k] != key[at..at + k] {
                    return None;
                }
            }
            let (from, to) = (klen.max(at) - at, end.min(at + 8) - at);
            if from < to {
                out.extend_from_slice(&bytes[from..to]);
            }
        }
        fence(Ordering::Acquire);
        (slot.seq.load(Ordering::Relaxed) == seq && sum == stored).then_some(expires)
    }

    fn put_hashed(&self, hash: u64, key: &[u8], value: &[u8], expires_ms: u64, now_ms: u64) -> bool {
        if key.len() + value.len() > ENTRY_BYTES {
            return false;
        }
        let set = self.set(hash);
        let mut ranked = [(Rank::Busy, 0usize, 0u64); WAYS];
        for (i, slot) in set.iter().enumerate() {
            let seq = slot.seq.load(Ordering::Acquire);
            let tag = slot.tag.load(Ordering::Relaxed);
            let rank = if seq & 1 == 1 {
                let stuck = now_ms.saturating_sub(slot.lock_ms.load(Ordering::Relaxed)) > STEAL_AFTER_MS;
                match (stuck, tag == hash) {
                    (true, true) => Rank::Own,
                    (true, false) => Rank::Free,
                    // Someone is writing this key right now: theirs is as good as ours.
                    (false, true) => return false,
                    (false, false) => Rank::Busy,
                }
            } else if tag == hash {
                Rank::Own
            } else if tag == 0 || slot.expires_ms.load(Ordering::Relaxed) <= now_ms {
                Rank::Free
            } else {
                Rank::Used(slot.last_ms.load(Ordering::Relaxed))
            };
            ranked[i] = (rank, i, seq);
        }
        ranked.sort_unstable();
        for (rank, i, seq) in ranked {
            if rank == Rank::Busy {
                break;
            }
            let slot = &set[i];
            if let Some(locked) = lock(slot, seq, now_ms) {
                self.write(slot, hash, key, value, expires_ms, now_ms);
                // Fails only if our lock was stolen (we stalled for over a
                // second): the thief owns the slot, our stores are torn.
                return slot.seq.compare_exchange(locked, locked + 1, Ordering::Release, Ordering::Relaxed).is_ok();
            }
            if rank == Rank::Own {
                // The key's slot changed under us: another writer got there first.
                return false;
            }
        }
        false
    }

    /// Fill a locked slot (Relaxed stores: the seqlock orders them).
    fn write(&self, slot: &Slot, hash: u64, key: &[u8], value: &[u8], expires_ms: u64, now_ms: u64) {
        let lens = key.len() as u64 | ((value.len() as u64) << 32);
        slot.tag.store(hash, Ordering::Relaxed);
        slot.expires_ms.store(expires_ms, Ordering::Relaxed);
        slot.lens.store(lens, Ordering::Relaxed);
        let mut sum = self.sum_start();
        sum = mix(mix(mix(sum, hash), expires_ms), lens);
        let end = key.len() + value.len();
        for (i, word) in slot.data[..end.div_ceil(8)].iter().enumerate() {
            let w = gather(key, value, i * 8);
            sum = mix(sum, w);
            word.store(w, Ordering::Relaxed);
        }
        slot.sum.store(sum, Ordering::Relaxed);
        slot.last_ms.store(now_ms, Ordering::Relaxed);
    }
}

/// Lock `slot`, whose `seq` was read as `seen`: an even `seen` becomes odd,
/// a stuck odd one becomes the next odd value (taking it over, so the stalled
/// writer's final CAS fails). Returns the odd value now held.
///
/// `lock_ms` is stamped *before* the CAS, so whoever acquires the odd `seq`
/// also sees a stamp at least as new as the lock. A stamp left by a writer
/// whose CAS failed only delays a takeover; a slot stuck odd is never stamped
/// again (writers stamp only slots they may lock).
fn lock(slot: &Slot, seen: u64, now_ms: u64) -> Option<u64> {
    let locked = if seen & 1 == 0 { seen.wrapping_add(1) } else { seen.wrapping_add(2) };
    slot.lock_ms.store(now_ms, Ordering::Relaxed);
    slot.seq.compare_exchange(seen, locked, Ordering::AcqRel, Ordering::Relaxed).ok()?;
    // Orders the odd `seq` before every data store that follows: a reader that
    // sees any of them (then fences with acquire) sees `seq` changed.
    fence(Ordering::Release);
    Some(locked)
}

/// The word at byte offset `at` of the stream `key ‖ value`, zero padded.
fn gather(key: &[u8], value: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    let mut n = 0;
    if at < key.len() {
        let k = &key[at..key.len().min(at + 8)];
        b[..k.len()].copy_from_slice(k);
        n = k.len();
    }
    if n < 8 {
        // Here `at + n >= key.len()`: the key ends inside this word or before it.
        let from = at + n - key.len();
        if from < value.len() {
            let v = &value[from..value.len().min(from + 8 - n)];
            b[n..n + v.len()].copy_from_slice(v);
        }
    }
    u64::from_le_bytes(b)
}

/// One checksum step: a bijection of `h` for each `w` (xor, odd multiply,
/// rotate), so a single differing word always changes the result.
fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(SUM_MUL).rotate_left(29)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;

    fn cache(entries: usize) -> &'static SharedCache {
        SharedCache::create(entries, SEED).expect("map cache")
    }

    fn get(c: &SharedCache, key: &[u8], now: u64) -> Option<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        c.get(key, now, &mut out).map(|exp| (out, exp))
    }

    /// The slots of the set `key` hashes to, and the index of the slot holding it.
    fn holding(c: &SharedCache, key: &[u8]) -> Vec<usize> {
        let h = c.hash(key);
        let first = (h % c.sets as u64) as usize * WAYS;
        (first..first + WAYS).filter(|&i| c.slots[i].tag.load(Ordering::Relaxed) == h).collect()
    }

    /// `n` distinct keys that all hash to the same set.
    fn same_set_keys(c: &SharedCache, n: usize) -> Vec<Vec<u8>> {
        let set_of = |k: &[u8]| c.hash(k) % c.sets as u64;
        let first = b"key:0".to_vec();
        let target = set_of(&first);
        let mut keys = vec![first];
        for i in 1.. {
            let k = format!("key:{i}").into_bytes();
            if set_of(&k) == target {
                keys.push(k);
                if keys.len() == n {
                    break;
                }
            }
        }
        keys
    }

    #[test]
    fn layout_is_fixed_and_slots_are_8_kib() {
        assert_eq!(std::mem::size_of::<Slot>(), SLOT_BYTES);
        assert_eq!(std::mem::align_of::<Slot>(), 64);
        assert_eq!(ENTRY_BYTES, 8128);
        assert_eq!(cache(0).capacity(), WAYS);
        assert_eq!(cache(5).capacity(), 8);
        assert_eq!(cache(1000).capacity(), 1000);
        assert!(SharedCache::create(usize::MAX, 1).is_err());
    }

    #[test]
    fn round_trip_and_miss_on_another_key() {
        let c = cache(64);
        let doc = br#"{"id":42,"name":"Ada"}"#;
        assert!(c.put(b"users:42", doc, 5_000, 1_000));
        assert_eq!(get(c, b"users:42", 1_001), Some((doc.to_vec(), 5_000)));
        assert_eq!(get(c, b"users:43", 1_001), None);
        assert_eq!(get(c, b"users:4", 1_001), None);
        // Every key/value length alignment survives the unaligned packing.
        for klen in 0..17 {
            let key: Vec<u8> = (0..klen).map(|i| b'a' + i as u8).collect();
            for vlen in [0, 1, 7, 8, 9, 15, 16, 17, 100] {
                let value: Vec<u8> = (0..vlen).map(|i| (i * 7 + klen) as u8).collect();
                assert!(c.put(&key, &value, 5_000, 1_000), "put {klen}/{vlen}");
                assert_eq!(get(c, &key, 1_000), Some((value, 5_000)), "get {klen}/{vlen}");
            }
        }
        let mut out = b"stale bytes".to_vec();
        assert_eq!(c.get(b"absent", 1_000, &mut out), None);
        assert!(out.is_empty(), "out is cleared on a miss");
    }

    #[test]
    fn entries_expire() {
        let c = cache(64);
        assert!(c.put(b"k", b"v", 2_000, 1_000));
        assert!(get(c, b"k", 1_999).is_some());
        assert_eq!(get(c, b"k", 2_000), None, "expires_ms <= now_ms is a miss");
        assert_eq!(get(c, b"k", 9_000), None);
    }

    #[test]
    fn overwriting_a_key_replaces_it_in_place() {
        let c = cache(64);
        assert!(c.put(b"k", b"first, longer value", 5_000, 1_000));
        let slot = holding(c, b"k");
        assert!(c.put(b"k", b"second", 6_000, 1_001));
        assert_eq!(get(c, b"k", 1_002), Some((b"second".to_vec(), 6_000)));
        assert_eq!(holding(c, b"k"), slot, "one slot, reused");
    }

    #[test]
    fn too_large_values_are_not_stored() {
        let c = cache(64);
        let key = b"big";
        let fits = vec![7u8; ENTRY_BYTES - key.len()];
        assert!(c.put(key, &fits, 5_000, 1_000));
        assert_eq!(get(c, key, 1_000), Some((fits, 5_000)));
        let other = b"other";
        let too_big = vec![9u8; ENTRY_BYTES - other.len() + 1];
        assert!(!c.put(other, &too_big, 5_000, 1_000));
        assert_eq!(get(c, other, 1_000), None);
        assert!(holding(c, other).is_empty(), "nothing stored");
        let long_key = vec![b'k'; ENTRY_BYTES + 1];
        assert!(!c.put(&long_key, b"", 5_000, 1_000));
        assert_eq!(get(c, &long_key, 1_000), None);
    }

    #[test]
    fn empty_values_and_keys_work() {
        let c = cache(64);
        assert!(c.put(b"empty", b"", 5_000, 1_000));
        assert_eq!(get(c, b"empty", 1_000), Some((Vec::new(), 5_000)));
        assert!(c.put(b"", b"no key", 5_000, 1_000));
        assert_eq!(get(c, b"", 1_000), Some((b"no key".to_vec(), 5_000)));
    }

    #[test]
    fn eviction_takes_the_least_recently_used_and_keeps_a_recently_read_one() {
        let c = cache(64);
        let keys = same_set_keys(c, WAYS + 2);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            assert!(c.put(k, k, 100_000, 1_000 + i as u64));
        }
        // keys[0] is the oldest put, but read since: keys[1] is now the LRU.
        assert!(get(c, &keys[0], 2_000).is_some());
        assert!(c.put(&keys[WAYS], b"new", 100_000, 3_000));
        assert_eq!(get(c, &keys[1], 3_001), None, "the least recently used went");
        for k in [&keys[0], &keys[2], &keys[3]] {
            assert_eq!(get(c, k, 3_001).map(|(v, _)| v), Some(k.clone()));
        }
        // Every slot was touched at 3 001 except keys[WAYS] (3 000): it goes next.
        assert!(c.put(&keys[WAYS + 1], b"newer", 100_000, 4_000));
        assert_eq!(get(c, &keys[WAYS], 4_001), None);
        assert_eq!(get(c, &keys[WAYS + 1], 4_001).map(|(v, _)| v), Some(b"newer".to_vec()));
    }

    #[test]
    fn expired_slots_are_reused_before_live_ones() {
        let c = cache(64);
        let keys = same_set_keys(c, WAYS + 1);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            // keys[2] expires early although it is the most recently used.
            let expires = if i == 2 { 5_000 } else { 100_000 };
            assert!(c.put(k, k, expires, 1_000 + i as u64));
        }
        assert!(get(c, &keys[2], 4_000).is_some());
        assert!(c.put(&keys[WAYS], b"new", 100_000, 6_000));
        assert_eq!(get(c, &keys[2], 6_001), None);
        for k in [&keys[0], &keys[1], &keys[3]] {
            assert!(get(c, k, 6_001).is_some(), "live entries stay");
        }
        assert!(get(c, &keys[WAYS], 6_001).is_some());
    }

    #[test]
    fn a_colliding_hash_never_returns_another_keys_value() {
        let c = cache(64);
        let h = 0x5eed_5eed_5eed_5eed;
        let mut out = Vec::new();
        assert!(c.put_hashed(h, b"users:1", b"one", 5_000, 1_000));
        assert_eq!(c.get_hashed(h, b"users:2", 1_000, &mut out), None, "same tag and set, other key");
        assert_eq!(c.get_hashed(h, b"users:", 1_000, &mut out), None, "a prefix of the key");
        assert_eq!(c.get_hashed(h, b"users:1\0", 1_000, &mut out), None, "the key plus a byte");
        assert!(out.is_empty());
        // The colliding key takes the slot over: the first one is gone, never confused.
        assert!(c.put_hashed(h, b"users:2", b"two", 5_000, 1_001));
        assert_eq!(c.get_hashed(h, b"users:1", 1_001, &mut out), None);
        assert_eq!(c.get_hashed(h, b"users:2", 1_001, &mut out), Some(5_000));
        assert_eq!(out, b"two");
    }

    #[test]
    fn a_stuck_writer_is_taken_over_after_a_second() {
        let c = cache(64);
        assert!(c.put(b"k", b"old", 100_000, 1_000));
        let [i] = holding(c, b"k")[..] else { panic!("one slot") };
        let slot = &c.slots[i];
        // A writer locks the slot at 10 000 and is killed mid-write.
        let seen = slot.seq.load(Ordering::Relaxed);
        let locked = lock(slot, seen, 10_000).expect("lock");
        slot.data[0].store(0xdead, Ordering::Relaxed);
        assert_eq!(get(c, b"k", 10_001), None, "being written");
        assert!(!c.put(b"k", b"new", 100_000, 10_500), "a fresh lock is respected");
        assert!(!c.put(b"k", b"new", 100_000, 11_000), "not before more than a second");
        assert_eq!(slot.seq.load(Ordering::Relaxed), locked);
        assert!(c.put(b"k", b"new", 100_000, 11_001), "a stuck lock is taken over");
        assert_eq!(get(c, b"k", 11_002), Some((b"new".to_vec(), 100_000)));
        assert_eq!(holding(c, b"k"), vec![i], "in the same slot");
        // The stalled writer wakes up: its unlock fails, its late stores are caught.
        assert!(slot.seq.compare_exchange(locked, locked + 1, Ordering::Release, Ordering::Relaxed).is_err());
        slot.lens.store(1 | (2 << 32), Ordering::Relaxed);
        assert_eq!(get(c, b"k", 11_003), None, "torn by a late store: the checksum refuses it");
        assert!(c.put(b"k", b"again", 100_000, 11_004));
        assert_eq!(get(c, b"k", 11_005), Some((b"again".to_vec(), 100_000)));
    }

    #[test]
    fn a_stuck_slot_of_another_key_is_reused_after_a_second() {
        let c = cache(4); // one set
        let keys = same_set_keys(c, WAYS + 1);
        for k in &keys[..WAYS] {
            assert!(c.put(k, k, 100_000, 1_000));
        }
        for slot in c.slots {
            let seen = slot.seq.load(Ordering::Relaxed);
            lock(slot, seen, 2_000).expect("lock");
        }
        assert!(!c.put(&keys[WAYS], b"v", 100_000, 2_500), "every slot busy");
        assert_eq!(get(c, &keys[0], 2_500), None);
        assert!(c.put(&keys[WAYS], b"v", 100_000, 3_001));
        assert_eq!(get(c, &keys[WAYS], 3_001).map(|(v, _)| v), Some(b"v".to_vec()));
    }

    #[test]
    fn a_late_store_into_a_stable_slot_fails_the_checksum() {
        let c = cache(64);
        let value = vec![b'x'; 100];
        assert!(c.put(b"k", &value, 100_000, 1_000));
        let [i] = holding(c, b"k")[..] else { panic!("one slot") };
        let slot = &c.slots[i];
        let seq = slot.seq.load(Ordering::Relaxed);
        // A zombie writer's store lands in the data without touching `seq`.
        let w = slot.data[5].load(Ordering::Relaxed);
        slot.data[5].store(w ^ 1, Ordering::Relaxed);
        assert_eq!(get(c, b"k", 1_001), None);
        slot.data[5].store(w, Ordering::Relaxed);
        assert_eq!(get(c, b"k", 1_001), Some((value, 100_000)));
        slot.expires_ms.store(200_000, Ordering::Relaxed);
        assert_eq!(get(c, b"k", 1_001), None, "header fields are covered too");
        assert_eq!(slot.seq.load(Ordering::Relaxed), seq);
    }

    /// A value that says what it is: every byte is `(key * 31 + len) % 251`,
    /// with lengths below 251, so a torn copy or another key's value shows.
    fn stamped(key: usize, len: usize) -> Vec<u8> {
        vec![((key * 31 + len) % 251) as u8; len]
    }

    fn check_stamped(key: usize, value: &[u8]) {
        let want = ((key * 31 + value.len()) % 251) as u8;
        assert!(value.iter().all(|&b| b == want), "key {key}: torn or foreign value of {} bytes", value.len());
    }

    #[test]
    fn threads_never_see_torn_or_foreign_values() {
        let c = cache(4); // one set: every key competes for the same 4 slots
        let keys: Vec<Vec<u8>> = (0..6).map(|k| format!("k{k}").into_bytes()).collect();
        let hits: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|t| {
                    let keys = &keys;
                    s.spawn(move || {
                        let mut out = Vec::with_capacity(ENTRY_BYTES);
                        let mut hits = 0;
                        for i in 0..25_000usize {
                            let k = (i * 7 + t) % keys.len();
                            if i % 3 == 0 {
                                c.put(&keys[k], &stamped(k, (i * 13 + t) % 250), u64::MAX, 1_000);
                            } else if c.get(&keys[k], 1_000, &mut out).is_some() {
                                check_stamped(k, &out);
                                hits += 1;
                            }
                        }
                        hits
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("thread")).sum()
        });
        assert!(hits > 1_000, "only {hits} hits");
    }

    #[test]
    fn writers_taken_over_mid_write_never_leak_torn_values() {
        // Clocks 1×, 2×, 3× and 4× apart: the faster threads see every odd
        // slot as stuck and take it over from live writers, whose late stores
        // then land in the thief's entry. Only the checksum stands between
        // those and the readers.
        let c = cache(4);
        let keys: Vec<Vec<u8>> = (0..3).map(|k| format!("k{k}").into_bytes()).collect();
        let (hits, refused): (usize, usize) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let keys = &keys;
                    s.spawn(move || {
                        let (mut out, mut hits, mut refused) = (Vec::with_capacity(ENTRY_BYTES), 0, 0);
                        for i in 0..25_000usize {
                            let now = 2_000 + i as u64 * 1_000 * (t + 1);
                            let k = (i + t as usize) % keys.len();
                            if i % 2 == 0 {
                                refused += usize::from(!c.put(&keys[k], &stamped(k, (i * 13) % 250), u64::MAX, now));
                            } else if c.get(&keys[k], now, &mut out).is_some() {
                                check_stamped(k, &out);
                                hits += 1;
                            }
                        }
                        (hits, refused)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("thread")).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        });
        assert!(hits > 1_000, "only {hits} hits ({refused} puts refused)");
    }

    #[test]
    fn a_reader_thread_sees_a_writer_threads_values_in_order() {
        let c = cache(64);
        let n = 20_000u64;
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=n {
                    let mut v = i.to_le_bytes().repeat(1 + (i % 50) as usize);
                    v.push(b'!');
                    assert!(c.put(b"counter", &v, u64::MAX, 1_000), "single writer, put {i}");
                }
            });
            s.spawn(|| {
                let (mut out, mut last, mut seen) = (Vec::new(), 0, 0);
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while last < n {
                    assert!(std::time::Instant::now() < deadline, "the reader never saw {n}, last {last}");
                    if c.get(b"counter", 1_000, &mut out).is_some() {
                        let i = u64::from_le_bytes(out[..8].try_into().expect("8 bytes"));
                        assert_eq!(out.len(), 8 * (1 + (i % 50) as usize) + 1);
                        assert!(out[..out.len() - 1].chunks(8).all(|w| w == i.to_le_bytes()), "torn at {i}");
                        assert!(i >= last, "went back from {last} to {i}");
                        last = i;
                        seen += 1;
                    }
                }
                assert!(seen > 0);
            });
        });
    }

    #[test]
    fn a_forked_child_writes_and_the_parent_reads() {
        use nix::sys::wait::{waitpid, WaitStatus};
        let c = cache(64);
        match crate::sys::fork().expect("fork") {
            crate::sys::Forked::Child => {
                // Never return into the test harness from the child.
                let ok = std::panic::catch_unwind(|| c.put(b"from-child", b"hello", 5_000, 1_000)).unwrap_or(false);
                std::process::exit(if ok { 0 } else { 1 });
            }
            crate::sys::Forked::Parent(pid) => {
                let status = waitpid(nix::unistd::Pid::from_raw(pid), None).expect("waitpid");
                assert!(matches!(status, WaitStatus::Exited(_, 0)), "child: {status:?}");
            }
        }
        assert_eq!(get(c, b"from-child", 1_000), Some((b"hello".to_vec(), 5_000)));
    }
}
