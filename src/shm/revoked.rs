//! Recent revocations of access tokens, one table for every worker of this supervisor: when
//! an account is deleted or its password or role changes, the worker that made the change
//! records the instant here (after the commit, before its answer), and every worker's event
//! loop refuses, from its next request on, the account's access tokens read from the store
//! before that instant. It is what lets the loop answer 401 at once without asking the store.
//!
//! **Shape.** One packed word per slot, [`SLOTS`] slots, no locks: a slot holds a tag naming
//! one account (`id / SLOTS + 1`; the slot itself is `id % SLOTS`) and the revocation
//! instant, in milliseconds after the table's birth. Ids are given in order, so accounts share
//! a slot only past [`SLOTS`] accounts, and then only when two of them are revoked within one
//! access-token lifetime: the slot then says "every account here" ([`TAG_ALL`]) until the
//! newest of the two instants, which refuses tokens of neighbours too (they refresh; never
//! the other way round). An entry whose instant is older than the longest access-token
//! lifetime concerns only expired tokens and is simply overwritten.
//!
//! **What it knows.** Only revocations made since the supervisor mapped it, by its own
//! workers: a token read before the table's birth ([`Revocations::covers`] is false) may have
//! been revoked before it, and a revocation made by another host (PostgreSQL) or by the
//! workers of another supervisor (during a binary upgrade) is not here. The store is the truth
//! for both (`app::session::confirm`, on the pool); this table never says a revoked token is
//! good for a reason the store would not, and never grows.
//!
//! It must not know what a user or a token is beyond an id and an instant, and must not
//! allocate or hold pointers (it lives in the shared region).

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots in the table (a power of two): user `id` lives in slot `id % SLOTS`.
pub const SLOTS: usize = 16384;
/// Bits of a slot holding the instant (ms after the table's birth: 139 years).
const TIME_BITS: u32 = 42;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// The tag that stands for every account of its slot (and for ids too large to tag).
const TAG_ALL: u64 = u64::MAX >> TIME_BITS;
/// An entry is overwritten only this long after every token it concerns expired: `exp` is
/// whole seconds, checked against the wall clock's second.
const EXPIRY_ROUNDING_MS: u64 = 1000;

/// The table (see the module doc). All-zero is a valid, empty table born at the epoch.
#[repr(C)]
pub struct Revocations {
    /// Wall-clock ms when the supervisor created the table.
    born_ms: AtomicU64,
    /// The longest access-token lifetime any worker issued or revoked under (a reload may
    /// lengthen it while tokens of the old length live).
    longest_ttl_ms: AtomicU64,
    slots: [AtomicU64; SLOTS],
}

impl Revocations {
    /// An empty table on the heap (tests; the workers' lives in the shared region).
    #[cfg(test)]
    pub fn boxed(born_ms: u64) -> Box<Revocations> {
        let table = Box::new(Revocations {
            born_ms: AtomicU64::new(0),
            longest_ttl_ms: AtomicU64::new(0),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        });
        table.start(born_ms);
        table
    }

    /// Stamp the table's birth (supervisor, right after mapping it, before forking).
    pub fn start(&self, now_ms: u64) {
        self.born_ms.store(now_ms, Ordering::Release);
    }

    /// Whether every revocation that could concern a token read at `read_ms` was made since
    /// this table exists (by this supervisor's workers).
    pub fn covers(&self, read_ms: u64) -> bool {
        read_ms >= self.born_ms.load(Ordering::Acquire)
    }

    /// Note that a worker issues access tokens living `ttl_ms` (call when issuing).
    pub fn note_ttl(&self, ttl_ms: u64) {
        if self.longest_ttl_ms.load(Ordering::Relaxed) < ttl_ms {
            self.longest_ttl_ms.fetch_max(ttl_ms, Ordering::AcqRel);
        }
    }

    /// Record that user `id`'s tokens read at or before `now_ms` are void. Call after the
    /// change committed and before the writer's answer goes out; `ttl_ms` is the caller's
    /// access-token lifetime.
    pub fn revoke(&self, id: i64, now_ms: u64, ttl_ms: u64) {
        self.note_ttl(ttl_ms);
        let longest = self.longest_ttl_ms.load(Ordering::Acquire);
        let at = now_ms.saturating_sub(self.born_ms.load(Ordering::Acquire)).min(TIME_MASK);
        let tag = tag_of(id);
        let slot = self.slot(id);
        let mut current = slot.load(Ordering::Acquire);
        loop {
            let (held, held_at) = unpack(current);
            let new = if current == 0 || held == tag {
                pack(tag, at.max(held_at))
            } else if held_at.saturating_add(longest).saturating_add(EXPIRY_ROUNDING_MS) < at {
                // Every token the other entry concerns has expired.
                pack(tag, at)
            } else {
                pack(TAG_ALL, at.max(held_at))
            };
            match slot.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => current = now,
            }
        }
    }

    /// Whether a token of user `id` whose account was read at `read_ms` is void by a
    /// revocation recorded here. One load; on the event loop for every request with a token.
    pub fn revoked(&self, id: i64, read_ms: u64) -> bool {
        let v = self.slot(id).load(Ordering::Acquire);
        if v == 0 {
            return false;
        }
        let (held, held_at) = unpack(v);
        (held == tag_of(id) || held == TAG_ALL)
            && read_ms <= self.born_ms.load(Ordering::Relaxed).saturating_add(held_at)
    }

    fn slot(&self, id: i64) -> &AtomicU64 {
        &self.slots[(id as u64 as usize) & (SLOTS - 1)]
    }
}

/// The tag of `id` in its slot: never 0 (an empty slot), [`TAG_ALL`] for ids too large.
fn tag_of(id: i64) -> u64 {
    ((id as u64) / SLOTS as u64).saturating_add(1).min(TAG_ALL)
}

fn pack(tag: u64, at: u64) -> u64 {
    (tag << TIME_BITS) | (at & TIME_MASK)
}

fn unpack(v: u64) -> (u64, u64) {
    (v >> TIME_BITS, v & TIME_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BORN: u64 = 1_800_000_000_000;
    const TTL: u64 = 900_000;

    #[test]
    fn a_revocation_voids_the_tokens_read_before_it_and_no_later_one() {
        let t = Revocations::boxed(BORN);
        let at = BORN + 60_000;
        assert!(!t.revoked(7, at - 1), "nothing recorded yet");
        t.revoke(7, at, TTL);
        assert!(t.revoked(7, at - 5_000) && t.revoked(7, at - 1));
        assert!(t.revoked(7, at), "read in the same millisecond: refused (it may have seen the old row)");
        assert!(!t.revoked(7, at + 1), "read after: a login after the change");
        assert!(!t.revoked(8, at - 1), "another account");
        assert!(t.revoked(7, BORN - 10_000), "read before the table's birth, revoked since");
        // A later revocation moves the instant on; an earlier one never moves it back.
        t.revoke(7, at + 100, TTL);
        t.revoke(7, at + 50, TTL);
        assert!(t.revoked(7, at + 100) && !t.revoked(7, at + 101));
    }

    #[test]
    fn accounts_sharing_a_slot_are_told_apart_until_two_are_revoked_within_a_lifetime() {
        let t = Revocations::boxed(BORN);
        let (a, b) = (5, 5 + SLOTS as i64);
        let at = BORN + 1_000;
        t.revoke(a, at, TTL);
        assert!(t.revoked(a, at - 1));
        assert!(!t.revoked(b, at - 1), "the same slot, another tag: exact");
        // b revoked while a's entry still matters: the slot refuses both, up to the newest.
        t.revoke(b, at + 10, TTL);
        assert!(t.revoked(a, at - 1) && t.revoked(b, at + 5) && t.revoked(a, at + 5), "conservative");
        assert!(!t.revoked(a, at + 11) && !t.revoked(b, at + 11), "tokens read after both are fine");
        assert!(!t.revoked(6, at - 1), "other slots untouched");
        // Long after every concerned token expired, a new revocation takes the slot alone.
        let later = at + 10 + TTL + EXPIRY_ROUNDING_MS + 1;
        t.revoke(b, later, TTL);
        assert!(t.revoked(b, later - 1) && !t.revoked(a, later - 1), "exact again");
    }

    #[test]
    fn the_longest_lifetime_any_worker_used_keeps_an_entry() {
        let t = Revocations::boxed(BORN);
        t.note_ttl(10 * TTL); // a reload lengthened the lifetime: tokens of that length live
        let (a, b) = (1, 1 + SLOTS as i64);
        t.revoke(a, BORN + 1_000, TTL);
        t.revoke(b, BORN + 1_000 + 2 * TTL, TTL);
        assert!(t.revoked(a, BORN + 999), "a's entry outlives the shorter lifetime");
    }

    #[test]
    fn the_table_knows_what_it_has_seen_since_its_birth() {
        let t = Revocations::boxed(BORN);
        assert!(t.covers(BORN) && t.covers(BORN + 1));
        assert!(!t.covers(BORN - 1), "read before the table existed: only the store knows");
    }

    #[test]
    fn ids_beyond_the_tags_are_refused_with_their_whole_slot() {
        let t = Revocations::boxed(BORN);
        let huge = i64::MAX;
        t.revoke(huge, BORN + 5, TTL);
        assert!(t.revoked(huge, BORN + 5));
        let neighbour = huge - SLOTS as i64;
        assert!(t.revoked(neighbour, BORN + 5), "a slot-mate: refused, never let through");
        assert_eq!(tag_of(1), 1);
        assert_eq!(tag_of(-1), TAG_ALL);
    }

    #[test]
    fn forked_workers_see_each_others_revocations() {
        use nix::sys::wait::{waitpid, WaitStatus};
        let region = crate::shm::Region::create().expect("map region");
        let t = &region.revoked;
        let at = crate::auth::jwt::now_ms();
        match crate::sys::fork().expect("fork") {
            crate::sys::Forked::Child => {
                let ok = std::panic::catch_unwind(|| t.revoke(42, at, TTL)).is_ok();
                std::process::exit(if ok { 0 } else { 1 });
            }
            crate::sys::Forked::Parent(pid) => {
                let status = waitpid(nix::unistd::Pid::from_raw(pid), None).expect("waitpid");
                assert!(matches!(status, WaitStatus::Exited(_, 0)), "child: {status:?}");
            }
        }
        assert!(t.revoked(42, at - 1) && !t.revoked(42, at + 1) && !t.revoked(43, at - 1));
    }
}
