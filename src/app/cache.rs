//! The worker's own cache of upstream answers: a bounded LRU with per-entry
//! expiry, the first level in front of the cache shared by all workers
//! (`crate::shm::cache`).
//!
//! It owns entries (key → bytes, expiry) in a slab threaded on an intrusive
//! doubly linked recency list, so a hit, an insert and an eviction are O(1)
//! with no allocation beyond the key and value themselves. It is used only
//! on the event loop thread (handlers and call continuations), so it needs
//! no lock: `Rc<RefCell<_>>`, never shared with the pool.

use std::collections::HashMap;
use std::rc::Rc;

const NIL: usize = usize::MAX;

struct Node {
    key: Rc<str>,
    value: Rc<[u8]>,
    expires_ms: u64,
    prev: usize,
    next: usize,
}

/// Bytes of values one worker's cache may hold, whatever `cache_entries` says:
/// a thousand users' pages of large upstream answers must not grow a worker
/// towards its memory ceiling.
pub const MAX_BYTES: usize = 32 << 20;

/// A least-recently-used cache of byte values with expiry, bounded in entries
/// and in bytes.
pub struct Lru {
    map: HashMap<Rc<str>, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
    cap: usize,
    /// Bytes of all values held, and the most allowed.
    bytes: usize,
    max_bytes: usize,
}

impl Lru {
    /// An empty cache holding at most `cap` entries (at least 1) and `max_bytes` of values.
    pub fn new(cap: usize, max_bytes: usize) -> Lru {
        Lru {
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            cap: cap.max(1),
            bytes: 0,
            max_bytes,
        }
    }

    /// Entries held (expired ones included until touched or evicted).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The value for `key` if present and not expired at `now_ms`; a hit
    /// becomes the most recently used, an expired entry is dropped.
    pub fn get(&mut self, key: &str, now_ms: u64) -> Option<(Rc<[u8]>, u64)> {
        let i = *self.map.get(key)?;
        if self.nodes[i].expires_ms <= now_ms {
            self.remove(i);
            return None;
        }
        self.unlink(i);
        self.push_front(i);
        let n = &self.nodes[i];
        Some((Rc::clone(&n.value), n.expires_ms))
    }

    /// Store `value` under `key` until `expires_ms`, evicting the least
    /// recently used entries while over either bound. A value larger than the
    /// whole byte budget is not stored.
    pub fn put(&mut self, key: &str, value: Rc<[u8]>, expires_ms: u64) {
        if let Some(&i) = self.map.get(key) {
            self.remove(i);
        }
        if value.len() > self.max_bytes {
            return;
        }
        while (self.map.len() >= self.cap || self.bytes + value.len() > self.max_bytes) && self.tail != NIL {
            self.remove(self.tail);
        }
        self.bytes += value.len();
        let key: Rc<str> = Rc::from(key);
        let node = Node { key: Rc::clone(&key), value, expires_ms, prev: NIL, next: NIL };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.map.insert(key, i);
        self.push_front(i);
    }

    fn remove(&mut self, i: usize) {
        self.unlink(i);
        let key = Rc::clone(&self.nodes[i].key);
        self.map.remove(&key);
        self.bytes -= self.nodes[i].value.len();
        self.nodes[i].value = Rc::from(&[][..]);
        self.free.push(i);
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
        self.nodes[i].prev = NIL;
        self.nodes[i].next = NIL;
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].next = self.head;
        self.nodes[i].prev = NIL;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Rc<[u8]> {
        Rc::from(s.as_bytes())
    }

    fn get(c: &mut Lru, k: &str, now: u64) -> Option<String> {
        c.get(k, now).map(|(b, _)| String::from_utf8_lossy(&b).into_owned())
    }

    #[test]
    fn hits_misses_and_overwrites() {
        let mut c = Lru::new(4, 1 << 20);
        c.put("a", v("1"), 100);
        assert_eq!(get(&mut c, "a", 0), Some("1".into()));
        assert_eq!(get(&mut c, "b", 0), None);
        c.put("a", v("2"), 100);
        assert_eq!(get(&mut c, "a", 0), Some("2".into()));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn entries_expire() {
        let mut c = Lru::new(4, 1 << 20);
        c.put("a", v("1"), 100);
        assert_eq!(get(&mut c, "a", 99), Some("1".into()));
        assert_eq!(get(&mut c, "a", 100), None);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let mut c = Lru::new(3, 1 << 20);
        c.put("a", v("1"), 100);
        c.put("b", v("2"), 100);
        c.put("c", v("3"), 100);
        assert!(get(&mut c, "a", 0).is_some()); // a is now the most recent; b the least
        c.put("d", v("4"), 100);
        assert_eq!(get(&mut c, "b", 0), None);
        for k in ["a", "c", "d"] {
            assert!(get(&mut c, k, 0).is_some(), "{k} evicted");
        }
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn the_byte_budget_evicts_and_refuses_what_cannot_fit() {
        let mut c = Lru::new(100, 10);
        c.put("a", v("1234"), 100);
        c.put("b", v("1234"), 100);
        c.put("c", v("1234"), 100); // 12 > 10: a goes
        assert_eq!(get(&mut c, "a", 0), None);
        assert!(get(&mut c, "b", 0).is_some() && get(&mut c, "c", 0).is_some());
        c.put("huge", v("12345678901"), 100);
        assert_eq!(get(&mut c, "huge", 0), None);
        c.put("b", v("12"), 100); // replacing gives its bytes back
        assert_eq!(c.bytes, 6);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn slots_are_reused_and_the_bound_holds_under_churn() {
        let mut c = Lru::new(10, 1 << 20);
        for i in 0..10_000u64 {
            c.put(&format!("k{i}"), v("x"), if i % 3 == 0 { 0 } else { 1000 });
            let _ = c.get(&format!("k{}", i / 2), 1);
        }
        assert!(c.len() <= 10);
        assert!(c.nodes.len() <= 11, "slab grew to {}", c.nodes.len());
    }
}
