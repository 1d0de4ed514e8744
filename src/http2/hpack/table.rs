//! The dynamic table of RFC 7541 §2.3.2, one kind for both ends: the [`super::Decoder`]'s copy
//! of the peer's table and the [`super::Encoder`]'s mirror of what it inserted into the
//! peer's. Newest entry first (dynamic index 62 is the newest), evicted oldest first when the
//! size (name + value + 32 per entry, §4.1) exceeds the maximum. Knows no wire format.

use std::collections::VecDeque;

use super::entry_size;

/// One entry: name and value in one allocation, the name first.
#[derive(Debug)]
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
}

/// A bounded dynamic table.
#[derive(Debug, Default)]
pub(crate) struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// How many entries were ever inserted (and kept): the entry inserted as number `n`
    /// (0 the first) sits at position `inserted - 1 - n` while the table holds it.
    inserted: u64,
}

impl Table {
    /// An empty table of at most `max` bytes.
    pub(crate) fn new(max: usize) -> Table {
        Table { entries: VecDeque::new(), size: 0, max, inserted: 0 }
    }

    /// The size of the entries held (RFC 7541 §4.1).
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The maximum size.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Sets the maximum size, evicting what no longer fits (RFC 7541 §4.3).
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_to(max);
    }

    /// Inserts an entry, evicting old ones first; an entry larger than the table empties it
    /// and is not kept (RFC 7541 §4.4). Returns the entry's number, for [`Table::position`],
    /// when it is kept.
    pub(crate) fn insert(&mut self, name: &[u8], value: &[u8]) -> Option<u64> {
        let size = entry_size(name, value);
        if size > self.max {
            self.entries.clear();
            self.size = 0;
            return None;
        }
        self.evict_to(self.max - size);
        let mut bytes = Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        self.entries.push_front(Entry { bytes: bytes.into_boxed_slice(), name_len: name.len() });
        self.size += size;
        self.inserted += 1;
        Some(self.inserted - 1)
    }

    /// Where the entry [`Table::insert`] numbered `n` is now (0 the newest), if it was not
    /// evicted since.
    pub(crate) fn position(&self, n: u64) -> Option<usize> {
        let back = self.inserted.checked_sub(n)?.checked_sub(1)?;
        usize::try_from(back).ok().filter(|&i| i < self.entries.len())
    }

    /// Entry `i` of the dynamic table, 0 the newest.
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(i).map(|e| e.bytes.split_at(e.name_len))
    }

    /// The position of the entry `name: value`, if present.
    pub(crate) fn find(&self, name: &[u8], value: &[u8]) -> Option<usize> {
        self.entries.iter().position(|e| {
            e.name_len == name.len()
                && e.bytes.len() == name.len() + value.len()
                && e.bytes.starts_with(name)
                && e.bytes.ends_with(value)
        })
    }

    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.bytes.len() + 32,
                None => break,
            }
        }
    }
}
