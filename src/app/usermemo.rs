//! This worker's memo of rendered users and records: `GET /users/{id}` and a declared
//! resource's `GET /<name>/{id}` are answered on the event loop from the body and ETag the
//! pool last rendered, for as long as the entry's change counter (`shm::epochs`, one for
//! every worker) is where it was when the pool read the row. A user's key is its id; a
//! record's is [`record_key`] (its resource's place in the registry and its id). A record's
//! entry also holds its owner (the loop checks the read rule) and the counter [`ALL`], which
//! every delete that may cascade bumps (a user's, or a record's that has children): a
//! record deleted with its parent is never answered from here.
//!
//! Exact, not a time-based cache: the pool reads the counter before the row,
//! and every write to a user bumps it after its commit and before its answer
//! (`handlers::users`), so an entry is either current or seen to be stale; a
//! stale one is dropped and the request goes to the pool as before. Fills come
//! from pool jobs over a channel (the pool never touches the memo); the loop
//! takes them before each lookup. Bounded: [`MAX_ENTRIES`] slots indexed by the
//! id's low bits (a newer user takes the slot of an older one; no hashing).
//!
//! Off where the counters do not see every write: on PostgreSQL (other hosts
//! write the same rows), and after `SIGUSR2` while the old supervisor's workers
//! live (they bump the counters of another region) — on from the moment the
//! last of them is gone, for jobs made from then on.
//!
//! An entry answers without the pool, so without the store's check of the
//! caller's token (`session::confirm`): the handler uses it only for tokens
//! the table of revocations vouches for, read since that table's birth and
//! since the foreign writers were gone ([`UserMemo::settled_by`]): they may
//! have revoked accounts in another table.
//!
//! It owns only the map and its gate; it must not touch the store or sockets.

use crossbeam_channel::{Receiver, Sender};

use crate::http::response::Value;
use crate::shm::epochs::Epochs;

/// Slots (a power of two): user `id` lives in slot `id % MAX_ENTRIES`.
pub const MAX_ENTRIES: usize = 1024;
/// How often (ms) a closed gate looks whether the foreign writers are gone.
const CHECK_MS: u64 = 100;

/// The counter of cascading deletes (see the module doc).
pub const ALL: i64 = -1;

/// The memo key of record `id` of the resource at `index` in the registry.
pub fn record_key(index: usize, id: i64) -> i64 {
    ((index as i64 + 1) << 48) | (id & ((1 << 48) - 1))
}

/// What a pool job rendered for key `id`, read under counter value `epoch`.
pub struct Fill {
    /// The key: a user's id, or a [`record_key`].
    pub id: i64,
    /// The counter, read before the row.
    pub epoch: u64,
    /// The record's owner (a user: itself).
    pub owner: i64,
    /// A record's: the counter [`ALL`], read before the row; `None` for a user.
    pub all: Option<u64>,
    /// The strong ETag of the representation.
    pub tag: Value,
    /// The whole `200` body.
    pub body: Box<[u8]>,
}

struct Entry {
    id: i64,
    epoch: u64,
    owner: i64,
    all: Option<u64>,
    tag: Value,
    body: Box<[u8]>,
}

/// The memo (see the module doc).
pub struct UserMemo {
    slots: Vec<Option<Entry>>,
    fills: Receiver<Fill>,
    /// Off for good (PostgreSQL).
    on: bool,
    /// Processes that write users but bump other counters: the gate is closed until
    /// they are gone.
    foreign: Vec<i32>,
    next_check_ms: u64,
    /// Wall-clock ms from which no foreign writer was alive (0: none ever was).
    settled_ms: u64,
}

impl UserMemo {
    /// A memo fed by `fills`; `on` = the counters see every write to the store;
    /// `foreign`: pids of writers they do not see (checked until gone).
    pub fn new(on: bool, foreign: Vec<i32>) -> (UserMemo, Sender<Fill>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let settled_ms = if foreign.is_empty() { 0 } else { u64::MAX };
        (UserMemo { slots: Vec::new(), fills: rx, on, foreign, next_check_ms: 0, settled_ms }, tx)
    }

    /// Whether a job made now may fill the memo and an entry may be used.
    pub fn open(&mut self) -> bool {
        if !self.on {
            return false;
        }
        if self.foreign.is_empty() {
            return true;
        }
        let now = crate::sys::monotonic_ms();
        if now >= self.next_check_ms {
            self.next_check_ms = now + CHECK_MS;
            self.foreign.retain(|&pid| crate::sys::alive(pid));
            if self.foreign.is_empty() {
                self.settled_ms = crate::auth::jwt::now_ms();
            }
        }
        self.foreign.is_empty()
    }

    /// Whether the memo is open and no foreign writer has lived since `read_ms`
    /// (wall-clock ms), so that none can have revoked a token read then.
    pub fn settled_by(&mut self, read_ms: u64) -> bool {
        self.open() && read_ms >= self.settled_ms
    }

    /// The body, ETag and owner of key `id` if held and current.
    pub fn get(&mut self, id: i64, epochs: &Epochs) -> Option<(&Value, &[u8], i64)> {
        while let Ok(f) = self.fills.try_recv() {
            if self.slots.is_empty() {
                self.slots.resize_with(MAX_ENTRIES, || None);
            }
            let at = slot_of(f.id);
            self.slots[at] =
                Some(Entry { id: f.id, epoch: f.epoch, owner: f.owner, all: f.all, tag: f.tag, body: f.body });
        }
        if !self.open() {
            return None;
        }
        let slot = self.slots.get_mut(slot_of(id))?;
        match slot {
            Some(e) if e.id == id && e.epoch == epochs.get(id) && e.all.is_none_or(|a| a == epochs.get(ALL)) => {}
            Some(e) if e.id == id => {
                // Stale: dropped (the pool renders it again).
                *slot = None;
                return None;
            }
            _ => return None,
        }
        slot.as_ref().map(|e| (&e.tag, &e.body[..], e.owner))
    }

    /// Users held.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.slots.iter().flatten().count()
    }
}

/// The slot of user `id`.
fn slot_of(id: i64) -> usize {
    crate::shm::epochs::spread(id) & (MAX_ENTRIES - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epochs() -> &'static Epochs {
        Box::leak(Epochs::boxed())
    }

    fn fill(tx: &Sender<Fill>, id: i64, epoch: u64, body: &str) {
        tx.send(Fill { id, epoch, owner: id, all: None, tag: Value::Static("\"t\""), body: body.as_bytes().into() })
            .expect("send");
    }

    #[test]
    fn an_entry_is_used_until_its_counter_moves() {
        let e = epochs();
        let (mut m, tx) = UserMemo::new(true, Vec::new());
        assert!(m.get(1, e).is_none());
        fill(&tx, 1, e.get(1), "one");
        assert_eq!(m.get(1, e).map(|(_, b, _)| b.to_vec()), Some(b"one".to_vec()));
        e.bump(1);
        assert!(m.get(1, e).is_none(), "stale after a write");
        assert_eq!(m.held(), 0, "and dropped");
        // A fill read under the old counter is stale on arrival.
        fill(&tx, 1, e.get(1) - 1, "old");
        assert!(m.get(1, e).is_none());
    }

    #[test]
    fn a_record_entry_also_goes_stale_with_a_cascading_delete() {
        let e = epochs();
        let (mut m, tx) = UserMemo::new(true, Vec::new());
        let key = record_key(2, 7);
        assert_ne!(key, record_key(1, 7), "one key per resource");
        let (a, b) = (crate::shm::epochs::spread(key), crate::shm::epochs::spread(record_key(1, 7)));
        assert_ne!(a & 4095, b & 4095, "and their counters apart");
        assert_eq!(crate::shm::epochs::spread(7), 7, "a user's id is its own place");
        let fill = |body: &str| Fill {
            id: key,
            epoch: e.get(key),
            owner: 3,
            all: Some(e.get(ALL)),
            tag: Value::Static("\"t\""),
            body: body.as_bytes().into(),
        };
        tx.send(fill("rec")).expect("send");
        assert_eq!(m.get(key, e).map(|(_, b, o)| (b.to_vec(), o)), Some((b"rec".to_vec(), 3)));
        e.bump(ALL);
        assert!(m.get(key, e).is_none(), "stale after a delete that may cascade");
        tx.send(fill("again")).expect("send");
        assert!(m.get(key, e).is_some());
        e.bump(key);
        assert!(m.get(key, e).is_none(), "stale after its own write");
    }

    #[test]
    fn off_on_postgres_and_while_a_foreign_writer_lives() {
        let e = epochs();
        let (mut m, tx) = UserMemo::new(false, Vec::new());
        fill(&tx, 2, e.get(2), "two");
        assert!(m.get(2, e).is_none());
        // Our own pid stands for a foreign writer that is alive.
        let (mut m, tx) = UserMemo::new(true, vec![std::process::id() as i32]);
        assert!(!m.open());
        fill(&tx, 2, e.get(2), "two");
        assert!(m.get(2, e).is_none());
        assert!(!m.settled_by(u64::MAX - 1));
    }

    #[test]
    fn a_token_read_while_a_foreign_writer_lived_is_not_vouched_for() {
        let (mut m, _tx) = UserMemo::new(true, Vec::new());
        assert!(m.settled_by(0), "no foreign writer ever");
        // A pid that is gone at once: the gate opens at the first check, from then on.
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id() as i32;
        child.wait().expect("wait");
        let (mut m, _tx) = UserMemo::new(true, vec![pid]);
        let before = crate::auth::jwt::now_ms();
        assert!(m.open());
        assert!(!m.settled_by(before.saturating_sub(1)), "read while it may have lived");
        assert!(m.settled_by(crate::auth::jwt::now_ms()));
        let (mut off, _tx) = UserMemo::new(false, Vec::new());
        assert!(!off.settled_by(u64::MAX), "off on PostgreSQL");
    }

    #[test]
    fn bounded_and_a_user_sharing_a_slot_replaces_the_older() {
        let e = epochs();
        let (mut m, tx) = UserMemo::new(true, Vec::new());
        for id in 1..=(2 * MAX_ENTRIES as i64) {
            fill(&tx, id, e.get(id), "x");
        }
        let _ = m.get(1, e);
        assert_eq!(m.held(), MAX_ENTRIES);
        assert!(m.get(1, e).is_none(), "replaced by 1 + MAX_ENTRIES");
        assert!(m.get(1 + MAX_ENTRIES as i64, e).is_some());
    }
}
