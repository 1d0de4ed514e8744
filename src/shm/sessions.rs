//! The shared TLS session store of HTTP/3: rustls's stateful resumption (the only kind it
//! serves 0-RTT on) with the sessions in one anonymous `MAP_SHARED` mapping, made by the
//! supervisor before the first fork, so that a client resumes with 0-RTT on whichever worker
//! its packets reach, and a session is used once across all of them (RFC 8446 §8: single-use
//! tickets are the anti-replay defence for 0-RTT).
//!
//! It owns a fixed array of [`SLOT_BYTES`] slots grouped in sets of [`WAYS`] (a key lives
//! only in the set its keyed SipHash selects, as in [`cache`](super::cache)), the slot
//! layout, the per-slot state word and the eviction rule (a free slot, else the oldest put of
//! the set), and [`SessionStore`], rustls's `StoresServerSessions` over it.
//!
//! What it must not do:
//! - allocate in the mapping, or grow: a new session evicts the oldest of its set; a key
//!   longer than [`KEY_MAX`] or an entry longer than [`ENTRY_BYTES`] is not stored (`put`
//!   returns false and the client simply does a full handshake next time);
//! - take a lock that can be held forever, or spin: a worker can be `SIGKILL`ed at any
//!   instruction. Each slot has one state word, `version << 2 | live << 1 | busy`. A writer
//!   makes it busy with one CAS, writes, and makes it live with a second CAS; a worker killed
//!   in between leaves the slot busy, which readers treat as a miss and which another writer
//!   takes over after [`STEAL_AFTER_MS`]. Nobody ever waits for a slot;
//! - let two takers have one session: `take` copies the entry, checks it, then moves the
//!   state word from the exact value it read to "not live" with one CAS. Of any number of
//!   processes taking the same session, one CAS succeeds; the others (and a `take` that raced
//!   with a rewrite of the slot) get `None`;
//! - touch shared bytes except through atomics (a torn copy is caught by the state word and,
//!   against a writer whose slot was taken over, by a keyed checksum), or hold pointers.
//!
//! One copy per key: a put finds the key's live slot first. Two processes putting the same
//! *new* key at the same instant could each take a slot; rustls never does (a session ID is
//! 32 random bytes, put once).
//!
//! Eviction is by age within a set (8 slots), not across the whole store: the store forgets
//! a session early only when its set is full of younger ones. Sessions are not expired here:
//! rustls checks a resumed session's age itself.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Bytes in one slot, header included.
pub const SLOT_BYTES: usize = 512;
/// Header words at the start of each slot.
const HEADER_WORDS: usize = 8;
/// Data words after the header.
const DATA_WORDS: usize = SLOT_BYTES / 8 - HEADER_WORDS;
/// Bytes of key + value one entry holds: measured, a 32-byte session ID and a 68-byte
/// session for SNI `localhost` and ALPN `h3`; the longest DNS name (253) makes it ~350.
pub const ENTRY_BYTES: usize = DATA_WORDS * 8;
/// The longest key stored (rustls's session IDs are 32 bytes).
pub const KEY_MAX: usize = 64;
/// Sessions the supervisor's store holds (2 MiB of address space; a page costs memory once
/// a session was stored in it).
pub const ENTRIES: usize = 4096;
/// Slots per set.
pub const WAYS: usize = 8;
/// How long a slot may stay busy before another writer assumes its writer died.
pub const STEAL_AFTER_MS: u64 = 1000;
/// SipHash prefix separating session placement from other uses of a seed.
const HASH_PREFIX: u64 = u64::from_le_bytes(*b"sessions");
/// Odd multiplier of the checksum (2^64 / φ).
const SUM_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// State bits: the slot is being written.
const BUSY: u64 = 1;
/// State bits: the slot holds a session.
const LIVE: u64 = 2;
/// One step of the state's version (above the two flags).
const STEP: u64 = 4;

/// One slot: a 64-byte header of atomics, then the data words (key then value, little
/// endian, zero padded).
#[repr(C, align(64))]
struct Slot {
    /// `version << 2 | LIVE | BUSY`; every change bumps the version.
    state: AtomicU64,
    /// Monotonic ms at which a writer last tried to make the slot busy (for stealing).
    lock_ms: AtomicU64,
    /// Keyed 64-bit hash of the key.
    tag: AtomicU64,
    /// Key length (low 32 bits), value length (high 32 bits).
    lens: AtomicU64,
    /// Checksum of `tag`, `lens` and the data words.
    sum: AtomicU64,
    /// Monotonic ms of the put (eviction: oldest first).
    put_ms: AtomicU64,
    _spare: [AtomicU64; 2],
    data: [AtomicU64; DATA_WORDS],
}

// SAFETY: only `AtomicU64`s, all zero in an empty slot (state 0: not live, not busy),
// aligned to 64.
unsafe impl super::ZeroSlot for Slot {}

/// The store: where the mapping is, how many sets it holds, the hash key. The handle is
/// process memory copied into every worker by fork; the mapping is the shared part.
pub struct SharedSessions {
    slots: &'static [Slot],
    sets: usize,
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for SharedSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedSessions({} slots)", self.slots.len())
    }
}

/// What `put` thinks of one slot of the key's set, best first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// Holds the same key: replace it there (one copy per key).
    Own,
    /// Holds nothing, or stuck busy: take it.
    Free,
    /// Live: evict the oldest.
    Used(u64),
    /// Being written right now: leave alone.
    Busy,
}

impl SharedSessions {
    /// Map an empty store of at least `entries` slots (whole sets). Supervisor, before fork;
    /// `seed` keys the placement hash and the checksum (drawn from the OS by the caller).
    pub fn create(entries: usize, seed: u128) -> std::io::Result<&'static SharedSessions> {
        let (slots, sets) = super::map_sets::<Slot>(entries, WAYS, "session store")?;
        Ok(Box::leak(Box::new(SharedSessions { slots, sets, k0: seed as u64, k1: (seed >> 64) as u64 })))
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Store `value` under `key` (replacing the key's session if it has one). False when it
    /// does not fit, or every slot of its set is being written.
    pub fn put(&self, key: &[u8], value: &[u8], now_ms: u64) -> bool {
        if key.len() > KEY_MAX || key.len() + value.len() > ENTRY_BYTES {
            return false;
        }
        let hash = self.hash(key);
        let set = self.set(hash);
        let mut ranked = [(Rank::Busy, 0usize, 0u64); WAYS];
        for (i, slot) in set.iter().enumerate() {
            let state = slot.state.load(Ordering::Acquire);
            let rank = if state & BUSY != 0 {
                let stuck = now_ms.saturating_sub(slot.lock_ms.load(Ordering::Relaxed)) > STEAL_AFTER_MS;
                if stuck {
                    Rank::Free
                } else {
                    Rank::Busy
                }
            } else if state & LIVE != 0 && slot.tag.load(Ordering::Relaxed) == hash {
                Rank::Own
            } else if state & LIVE == 0 {
                Rank::Free
            } else {
                Rank::Used(slot.put_ms.load(Ordering::Relaxed))
            };
            ranked[i] = (rank, i, state);
        }
        ranked.sort_unstable();
        for (rank, i, state) in ranked {
            if rank == Rank::Busy {
                break;
            }
            let slot = &set[i];
            let busy = (state & !(LIVE | BUSY)).wrapping_add(STEP) | BUSY;
            slot.lock_ms.store(now_ms, Ordering::Relaxed);
            if slot.state.compare_exchange(state, busy, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                if rank == Rank::Own {
                    // The key's slot changed under us: another process got there first
                    // (a second copy elsewhere could be taken twice).
                    return false;
                }
                continue;
            }
            // Orders the busy state before every data store below.
            fence(Ordering::Release);
            self.write(slot, hash, key, value, now_ms);
            let live = (busy & !BUSY).wrapping_add(STEP) | LIVE;
            // Fails only if the slot was taken over (we stalled for over a second).
            return slot.state.compare_exchange(busy, live, Ordering::Release, Ordering::Relaxed).is_ok();
        }
        false
    }

    /// Copy the session stored under `key` into `out` (cleared first); false when absent,
    /// being written or torn.
    pub fn get(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        self.find(key, out).is_some()
    }

    /// Copy the session stored under `key` into `out` (cleared first) and remove it; true
    /// for exactly one caller across every process per stored session.
    pub fn take(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        let Some((slot, state)) = self.find(key, out) else { return false };
        let empty = (state & !(LIVE | BUSY)).wrapping_add(STEP);
        if slot.state.compare_exchange(state, empty, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return true;
        }
        out.clear();
        false
    }

    /// The slot holding `key`, its state as read, and the value copied into `out`.
    fn find(&self, key: &[u8], out: &mut Vec<u8>) -> Option<(&Slot, u64)> {
        out.clear();
        if key.len() > KEY_MAX {
            return None;
        }
        let hash = self.hash(key);
        for slot in self.set(hash) {
            if let Some(state) = self.read(slot, hash, key, out) {
                return Some((slot, state));
            }
            out.clear();
        }
        None
    }

    /// The seqlock read of one slot: the value for `key` appended to `out` and the state it
    /// was read under, or None (another key, empty, busy, torn).
    fn read(&self, slot: &Slot, hash: u64, key: &[u8], out: &mut Vec<u8>) -> Option<u64> {
        let state = slot.state.load(Ordering::Acquire);
        if state & (LIVE | BUSY) != LIVE || slot.tag.load(Ordering::Relaxed) != hash {
            return None;
        }
        let lens = slot.lens.load(Ordering::Relaxed);
        let stored = slot.sum.load(Ordering::Relaxed);
        let (klen, vlen) = ((lens & 0xffff_ffff) as usize, (lens >> 32) as usize);
        if klen != key.len() || klen + vlen > ENTRY_BYTES {
            return None;
        }
        let mut sum = mix(mix(self.sum_start(), hash), lens);
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
        (slot.state.load(Ordering::Relaxed) == state && sum == stored).then_some(state)
    }

    /// Fill a busy slot (Relaxed stores: the state word orders them).
    fn write(&self, slot: &Slot, hash: u64, key: &[u8], value: &[u8], now_ms: u64) {
        let lens = key.len() as u64 | ((value.len() as u64) << 32);
        slot.tag.store(hash, Ordering::Relaxed);
        slot.lens.store(lens, Ordering::Relaxed);
        let mut sum = mix(mix(self.sum_start(), hash), lens);
        let end = key.len() + value.len();
        for (i, word) in slot.data[..end.div_ceil(8)].iter().enumerate() {
            let w = gather(key, value, i * 8);
            sum = mix(sum, w);
            word.store(w, Ordering::Relaxed);
        }
        slot.sum.store(sum, Ordering::Relaxed);
        slot.put_ms.store(now_ms, Ordering::Relaxed);
    }

    /// The keyed 64-bit hash of `key`: the set is `hash % sets`, the tag the hash itself.
    fn hash(&self, key: &[u8]) -> u64 {
        super::ratelimit::siphash::<1, 3>(self.k0, self.k1, HASH_PREFIX, key)
    }

    fn set(&self, hash: u64) -> &[Slot] {
        let first = (hash % self.sets as u64) as usize * WAYS;
        &self.slots[first..first + WAYS]
    }

    /// The checksum's keyed starting value.
    fn sum_start(&self) -> u64 {
        self.k1.rotate_left(23) ^ self.k0
    }
}

/// The word at byte offset `at` of the stream `key ‖ value`, zero padded.
fn gather(key: &[u8], value: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, byte) in b.iter_mut().enumerate() {
        let p = at + i;
        *byte = match p.checked_sub(key.len()) {
            None => key[p],
            Some(v) => value.get(v).copied().unwrap_or(0),
        };
    }
    u64::from_le_bytes(b)
}

/// One checksum step: a bijection of `h` for each `w`.
fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(SUM_MUL).rotate_left(29)
}

/// The store made before fork, when HTTP/3 serves 0-RTT (set once by the supervisor,
/// inherited by every worker through fork).
static SHARED: OnceLock<&'static SharedSessions> = OnceLock::new();

/// Make `store` the one [`shared`] returns (supervisor, before fork; later calls are ignored).
pub fn install(store: &'static SharedSessions) {
    let _ = SHARED.set(store);
}

/// The store the supervisor made before fork, if any.
pub fn shared() -> Option<&'static SharedSessions> {
    SHARED.get().copied()
}

/// rustls's `StoresServerSessions` over a [`SharedSessions`].
#[derive(Debug, Clone, Copy)]
pub struct SessionStore(pub &'static SharedSessions);

impl rustls::server::StoresServerSessions for SessionStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.0.put(&key, &value, crate::sys::monotonic_ms())
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.0.get(key, &mut out).then_some(out)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.0.take(key, &mut out).then_some(out)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::StoresServerSessions;

    const SEED: u128 = 0x0f1e_2d3c_4b5a_6978_8796_a5b4_c3d2_e1f0;

    fn store(entries: usize) -> &'static SharedSessions {
        SharedSessions::create(entries, SEED).expect("map")
    }

    fn id(i: u32) -> Vec<u8> {
        let mut k = vec![0x11; 32];
        k[..4].copy_from_slice(&i.to_be_bytes());
        k
    }

    /// `n` distinct 32-byte keys that all hash to one set.
    fn same_set_keys(s: &SharedSessions, n: usize) -> Vec<Vec<u8>> {
        let set_of = |k: &[u8]| s.hash(k) % s.sets as u64;
        let target = set_of(&id(0));
        (0..).map(id).filter(|k| set_of(k) == target).take(n).collect()
    }

    #[test]
    fn layout_is_fixed() {
        assert_eq!(std::mem::size_of::<Slot>(), SLOT_BYTES);
        assert_eq!(ENTRY_BYTES, 448);
        assert_eq!(store(0).capacity(), WAYS);
        assert_eq!(store(1000).capacity(), 1000);
        assert!(SharedSessions::create(usize::MAX, 1).is_err());
    }

    #[test]
    fn put_get_take_and_a_second_take_finds_nothing() {
        let s = store(64);
        let value: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        assert!(s.put(&id(1), &value, 1_000));
        let mut out = Vec::new();
        assert!(s.get(&id(1), &mut out));
        assert_eq!(out, value);
        assert!(s.get(&id(1), &mut out), "get leaves it");
        assert!(!s.get(&id(2), &mut out));
        assert!(out.is_empty());
        assert!(s.take(&id(1), &mut out));
        assert_eq!(out, value);
        assert!(!s.take(&id(1), &mut out), "single use");
        assert!(!s.get(&id(1), &mut out));
        // Every key/value length alignment survives the packing.
        for klen in [0, 1, 7, 8, 9, 32, 64] {
            for vlen in [0, 1, 7, 8, 9, 100, ENTRY_BYTES - klen] {
                let key: Vec<u8> = (0..klen).map(|i| i as u8 ^ 0x5a).collect();
                let value: Vec<u8> = (0..vlen).map(|i| (i + klen) as u8).collect();
                assert!(s.put(&key, &value, 1_000), "{klen}/{vlen}");
                assert!(s.take(&key, &mut out), "{klen}/{vlen}");
                assert_eq!(out, value, "{klen}/{vlen}");
            }
        }
    }

    #[test]
    fn bounded_keys_and_values() {
        let s = store(8);
        assert!(!s.put(&[1; KEY_MAX + 1], b"v", 1));
        assert!(!s.put(&id(1), &vec![0; ENTRY_BYTES - 31], 1));
        assert!(s.put(&id(1), &vec![0; ENTRY_BYTES - 32], 1));
    }

    #[test]
    fn a_put_replaces_the_keys_session() {
        let s = store(64);
        let keys = same_set_keys(s, 2);
        let mut out = Vec::new();
        assert!(s.put(&keys[0], b"other", 1));
        assert!(s.put(&keys[1], b"first", 1));
        // A free slot before the key's own one: the put must still replace in place.
        assert!(s.take(&keys[0], &mut out));
        assert!(s.put(&keys[1], b"second", 2));
        assert!(s.take(&keys[1], &mut out));
        assert_eq!(out, b"second");
        assert!(!s.take(&keys[1], &mut out), "one copy only");
    }

    #[test]
    fn the_oldest_of_a_full_set_is_evicted() {
        let s = store(64);
        let keys = same_set_keys(s, WAYS + 2);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            assert!(s.put(k, b"session", 100 + i as u64));
        }
        assert!(s.put(&keys[WAYS], b"new", 500));
        let mut out = Vec::new();
        assert!(!s.get(&keys[0], &mut out), "the oldest went");
        assert!(keys[1..=WAYS].iter().all(|k| s.get(k, &mut out)), "the rest stay");
        // A taken session frees its slot: the next put uses it, evicting nobody.
        assert!(s.take(&keys[3], &mut out));
        assert!(s.put(&keys[WAYS + 1], b"newer", 600));
        assert!(keys[1..=WAYS + 1].iter().filter(|&k| k != &keys[3]).all(|k| s.get(k, &mut out)));
    }

    #[test]
    fn a_slot_left_busy_by_a_dead_writer_is_a_miss_then_taken_over() {
        let s = store(8);
        let keys = same_set_keys(s, WAYS);
        for k in &keys {
            assert!(s.put(k, b"v", 1_000));
        }
        // A writer killed between its two CASes: slot 0 stays busy, stamped at 1 000.
        let slot = &s.set(s.hash(&keys[0]))[0];
        let victim = keys.iter().find(|k| s.read(slot, s.hash(k), k, &mut Vec::new()).is_some()).expect("in slot 0");
        let st = slot.state.load(Ordering::Relaxed);
        slot.state.store(((st & !LIVE) + STEP) | BUSY, Ordering::Relaxed);
        slot.lock_ms.store(1_000, Ordering::Relaxed);
        let mut out = Vec::new();
        assert!(!s.get(victim, &mut out) && !s.take(victim, &mut out), "busy: a miss, no waiting");
        // Within the second, a put evicts a live slot instead; after it, the busy one.
        assert!(s.put(&id(900_001), b"a", 1_500));
        assert_eq!(slot.state.load(Ordering::Relaxed) & BUSY, BUSY);
        assert!(s.put(victim, b"again", 2_500));
        assert!(s.take(victim, &mut out));
        assert_eq!(out, b"again");
    }

    #[test]
    fn concurrent_takers_get_a_session_once() {
        let s = store(64);
        for round in 0..200u32 {
            assert!(s.put(&id(round), b"session", 1));
            let winners: usize = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..4)
                    .map(|_| scope.spawn(|| usize::from(s.take(&id(round), &mut Vec::with_capacity(64)))))
                    .collect();
                handles.into_iter().map(|h| h.join().expect("thread")).sum()
            });
            assert_eq!(winners, 1, "round {round}");
        }
    }

    #[test]
    fn a_session_put_in_one_process_is_taken_once_from_another() {
        let s = store(64);
        assert!(s.put(&id(7), b"made by the parent", 1));
        let mut out = Vec::with_capacity(ENTRY_BYTES);
        match crate::sys::fork().expect("fork") {
            crate::sys::Forked::Child => {
                // No allocation here (the test harness has threads): `out` has its capacity.
                let code = if s.take(&id(7), &mut out) && out == b"made by the parent" { 0 } else { 1 };
                let code = if s.put(&id(8), b"made by the child", 2) { code } else { 1 };
                // SAFETY: _exit ends the child without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            crate::sys::Forked::Parent(pid) => {
                let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).expect("wait");
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0));
            }
        }
        assert!(!s.take(&id(7), &mut out), "the child took it: single use across processes");
        let store = SessionStore(s);
        assert_eq!(store.take(&id(8)).as_deref(), Some(&b"made by the child"[..]));
        assert!(store.can_cache());
        assert!(store.put(id(9), b"via rustls".to_vec()));
        assert_eq!(store.get(&id(9)).as_deref(), Some(&b"via rustls"[..]));
        assert_eq!(store.take(&id(9)).as_deref(), Some(&b"via rustls"[..]));
        assert_eq!(store.take(&id(9)), None);
    }
}
