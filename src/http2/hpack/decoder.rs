//! The HPACK decoder (RFC 7541 §3, §6): one per connection, it keeps the peer encoder's
//! dynamic table and turns complete header blocks into fields. It never sees frames; the
//! caller joins HEADERS and CONTINUATION payloads first.

use super::table::Table;
use super::{entry_size, get_int, get_str, HpackError, STATIC};

/// A connection's HPACK decoder.
#[derive(Debug)]
pub struct Decoder {
    table: Table,
    /// The table size forkd advertised (`SETTINGS_HEADER_TABLE_SIZE`): no size update may
    /// go above it.
    limit: usize,
    /// Scratch for literal names and values, kept between blocks so decoding allocates
    /// only while they grow.
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Decoder {
    /// A decoder whose peer may use a dynamic table of up to `limit` bytes.
    pub fn new(limit: usize) -> Decoder {
        Decoder { table: Table::new(limit), limit, name: Vec::new(), value: Vec::new() }
    }

    /// The size of the dynamic table's entries now.
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Decodes one complete header block, handing each field to `field` in order.
    ///
    /// Fields stop being handed over once their total size (name + value + 32 each) passes
    /// `max_list`, but the block is decoded to its end so the dynamic table stays in step
    /// with the peer's; the result is then [`HpackError::ListTooLarge`]. Every other error
    /// leaves the table unusable: the connection must end with `COMPRESSION_ERROR`.
    pub fn decode(
        &mut self,
        mut block: &[u8],
        max_list: usize,
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut list = 0usize;
        let mut fields_seen = false;
        let mut emit = |name: &[u8], value: &[u8]| {
            list = list.saturating_add(entry_size(name, value));
            if list <= max_list {
                field(name, value);
            }
        };
        while let Some(&b) = block.first() {
            let used = if b & 0x80 != 0 {
                // Indexed field (§6.1).
                let (index, n) = get_int(block, 7)?;
                let (name, value) = entry(&self.table, index)?;
                emit(name, value);
                fields_seen = true;
                n
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only before the block's first field.
                let (size, n) = get_int(block, 5)?;
                if fields_seen || size > self.limit {
                    return Err(HpackError::BadSizeUpdate);
                }
                self.table.set_max(size);
                n
            } else {
                // A literal: with incremental indexing (01), without (0000), never indexed (0001).
                let (prefix, index_it) = if b & 0xc0 == 0x40 { (6, true) } else { (4, false) };
                let (index, mut n) = get_int(block, prefix)?;
                if index == 0 {
                    n += get_str(&block[n..], &mut self.name)?;
                } else {
                    let name = entry(&self.table, index)?.0;
                    self.name.clear();
                    self.name.extend_from_slice(name);
                }
                n += get_str(&block[n..], &mut self.value)?;
                emit(&self.name, &self.value);
                if index_it {
                    self.table.insert(&self.name, &self.value);
                }
                fields_seen = true;
                n
            };
            block = &block[used..];
        }
        if list > max_list {
            return Err(HpackError::ListTooLarge);
        }
        Ok(())
    }
}

/// Entry `index` of the static table followed by the dynamic one (RFC 7541 §2.3.3).
fn entry(table: &Table, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
    match index {
        0 => Err(HpackError::BadIndex),
        1..=61 => {
            let (n, v) = STATIC[index - 1];
            Ok((n.as_bytes(), v.as_bytes()))
        }
        _ => table.get(index - 62).ok_or(HpackError::BadIndex),
    }
}
