//! The decoder side of a QPACK dynamic table (RFC 9204 §3.2, §4.3, §4.4), for forkd's own
//! HTTP/3 clients (the tests and `h3get`), which read what [`super::encoder::TableEncoder`]
//! writes: it applies the peer's encoder-stream instructions (evicting the oldest entries
//! when an insertion needs room), decodes field sections that reference the table, and
//! writes the decoder-stream instructions that acknowledge them.
//!
//! forkd's server does not use it: it advertises a table capacity of 0, so a client never
//! inserts. It never blocks either: a section whose Required Insert Count is above the
//! entries received fails (an encoder that references only acknowledged entries, as ours
//! does, never sends one). Every malformed instruction or section is a [`DecodeError`]; peer
//! input never panics it.

use std::collections::VecDeque;

use super::{decode_section, integer, string, write_integer, DecodeError, Fields, STATIC};
use super::{TRUNCATED_INTEGER, TRUNCATED_STRING};

/// The decoder side of one connection's dynamic table. See the module doc.
#[derive(Debug, Default)]
pub struct TableDecoder {
    /// The capacity we advertised (`SETTINGS_QPACK_MAX_TABLE_CAPACITY`).
    max_capacity: u64,
    /// The capacity the encoder set.
    capacity: u64,
    /// Sum of the entries' sizes (name + value + 32 each).
    size: u64,
    /// The entries still in the table, oldest first.
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// Entries ever inserted (the Insert Count).
    inserted: u64,
    /// Of those, how many the encoder knows we have.
    reported: u64,
}

impl TableDecoder {
    /// A table for a decoder that advertised `max_capacity` bytes.
    pub fn new(max_capacity: u64) -> TableDecoder {
        TableDecoder { max_capacity, ..TableDecoder::default() }
    }

    /// Entries ever inserted (the Insert Count).
    pub fn inserted(&self) -> u64 {
        self.inserted
    }

    /// Entries in the table now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Applies the complete instructions at the front of `input` (the encoder stream's
    /// bytes); returns how many bytes they took (the rest is an instruction cut short).
    pub fn on_encoder_stream(&mut self, input: &[u8]) -> Result<usize, DecodeError> {
        let mut at = 0;
        while at < input.len() {
            match self.instruction(&input[at..]) {
                Ok(used) => at += used,
                Err(DecodeError::Failed(TRUNCATED_INTEGER | TRUNCATED_STRING)) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(at)
    }

    /// Decodes a field section (see [`super::decode`]); returns its Required Insert Count, to
    /// hand to [`Self::acknowledge`].
    pub fn decode(&self, input: &[u8], max_size: usize, out: &mut Fields) -> Result<u64, DecodeError> {
        decode_section(input, max_size, Some(self), out)
    }

    /// Appends the decoder-stream instructions owed after decoding a section of `stream` with
    /// Required Insert Count `required`: a Section Acknowledgment when it is above 0, then an
    /// Insert Count Increment for the entries the encoder does not know we have.
    pub fn acknowledge(&mut self, stream: u64, required: u64, out: &mut Vec<u8>) {
        if required > 0 {
            write_integer(stream, 7, 0x80, out);
            self.reported = self.reported.max(required);
        }
        self.increment(out);
    }

    /// Appends an Insert Count Increment for the entries received and not yet reported.
    pub fn increment(&mut self, out: &mut Vec<u8>) {
        if self.inserted > self.reported {
            write_integer(self.inserted - self.reported, 6, 0x00, out);
            self.reported = self.inserted;
        }
    }

    /// The Required Insert Count an encoded prefix means (RFC 9204 §4.5.1.1).
    pub(crate) fn required_insert_count(&self, encoded: u64) -> Result<u64, DecodeError> {
        if encoded == 0 {
            return Ok(0);
        }
        let bad = DecodeError::Failed("a bad Required Insert Count");
        let max_entries = self.max_capacity / 32;
        let full_range = 2 * max_entries;
        if encoded > full_range {
            return Err(bad);
        }
        let max_value = self.inserted + max_entries;
        let max_wrapped = (max_value / full_range) * full_range;
        let mut required = max_wrapped + encoded - 1;
        if required > max_value {
            if required <= full_range {
                return Err(bad);
            }
            required -= full_range;
        }
        if required == 0 {
            return Err(bad);
        }
        if required > self.inserted {
            return Err(DecodeError::Failed("a section that would block (entries not received)"));
        }
        Ok(required)
    }

    /// The entry at absolute index `abs`, if it is still in the table.
    pub(crate) fn get(&self, abs: u64) -> Option<(&[u8], &[u8])> {
        let evicted = self.inserted - self.entries.len() as u64;
        let i = usize::try_from(abs.checked_sub(evicted)?).ok()?;
        self.entries.get(i).map(|(n, v)| (n.as_slice(), v.as_slice()))
    }

    /// The entry `relative` places before the newest (encoder-stream relative indexing).
    fn relative(&self, relative: u64) -> Result<(Vec<u8>, Vec<u8>), DecodeError> {
        let abs = self.inserted.checked_sub(relative + 1);
        let entry = abs.and_then(|a| self.get(a)).ok_or(DecodeError::Failed("a reference to no entry"))?;
        Ok((entry.0.to_vec(), entry.1.to_vec()))
    }

    /// One instruction at the front of `input`; the bytes it took.
    fn instruction(&mut self, input: &[u8]) -> Result<usize, DecodeError> {
        let first = input[0];
        if first & 0x80 != 0 {
            // Insert With Name Reference: 1 T index(6), then the value.
            let (index, used) = integer(input, 6)?;
            let name = if first & 0x40 != 0 {
                let entry = usize::try_from(index).ok().and_then(|i| STATIC.get(i));
                entry.ok_or(DecodeError::Failed("static table index out of range"))?.0.as_bytes().to_vec()
            } else {
                self.relative(index)?.0
            };
            let mut value = Vec::new();
            let value_used = string(&input[used..], 7, &mut value)?;
            self.insert(name, value)?;
            Ok(used + value_used)
        } else if first & 0x40 != 0 {
            // Insert With Literal Name: 01 H length(5), name, then the value.
            let (mut name, mut value) = (Vec::new(), Vec::new());
            let name_used = string(input, 5, &mut name)?;
            let value_used = string(&input[name_used..], 7, &mut value)?;
            self.insert(name, value)?;
            Ok(name_used + value_used)
        } else if first & 0x20 != 0 {
            // Set Dynamic Table Capacity: 001 capacity(5).
            let (capacity, used) = integer(input, 5)?;
            if capacity > self.max_capacity {
                return Err(DecodeError::Failed("a capacity above the maximum advertised"));
            }
            self.capacity = capacity;
            self.evict_to(capacity);
            Ok(used)
        } else {
            // Duplicate: 000 index(5).
            let (index, used) = integer(input, 5)?;
            let (name, value) = self.relative(index)?;
            self.insert(name, value)?;
            Ok(used)
        }
    }

    /// Adds an entry, evicting the oldest ones to make room.
    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) -> Result<(), DecodeError> {
        let size = (name.len() + value.len() + 32) as u64;
        if size > self.capacity {
            return Err(DecodeError::Failed("an entry larger than the table"));
        }
        self.evict_to(self.capacity - size);
        self.size += size;
        self.entries.push_back((name, value));
        self.inserted += 1;
        Ok(())
    }

    /// Evicts the oldest entries until the table holds at most `size` bytes.
    fn evict_to(&mut self, size: u64) {
        while self.size > size {
            let Some((n, v)) = self.entries.pop_front() else { break };
            self.size -= (n.len() + v.len() + 32) as u64;
        }
    }
}
