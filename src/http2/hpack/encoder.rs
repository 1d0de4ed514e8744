//! The HPACK encoder for response header blocks (RFC 7541 §6): one per connection, it
//! mirrors the dynamic table it fills in the peer's decoder.
//!
//! What each field becomes is decided by its name, as [`Encoder::encode`] documents: the
//! fields a connection repeats are inserted once and indexed after that; per-response values
//! stay literals out of the table; credentials are never-indexed literals. Knows no frames.

use super::table::Table;
use super::{entry_size, put_int, put_str, static_field, static_name};

/// The peer decoder's table size until its SETTINGS say otherwise (RFC 9113 §6.5.2).
const DEFAULT_TABLE: usize = 4096;

/// How one field is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Indexed when the table has it; otherwise a literal inserted into the table.
    Index,
    /// A literal the table never holds: the value changes from one response to the next.
    Literal,
    /// A never-indexed literal (RFC 7541 §7.1.3): a credential no hop may put in a table.
    Never,
}

/// How `name` is written: credentials never indexed; fields whose values differ on (nearly)
/// every response as literals (indexing them would only churn the table); the rest indexed.
fn policy(name: &[u8]) -> Policy {
    // A match compiles to a switch on the length first: asked for every field.
    match name {
        b"set-cookie" | b"authorization" | b"proxy-authorization" | b"cookie" => Policy::Never,
        b"date" | b"x-request-id" | b"content-length" | b"etag" | b"last-modified" | b"location" | b"content-range"
        | b"age" | b"expires" => Policy::Literal,
        _ => Policy::Index,
    }
}

/// A connection's HPACK encoder.
#[derive(Debug)]
pub struct Encoder {
    table: Table,
    /// The most table forkd will use, whatever the peer allows.
    cap: usize,
    /// Size updates owed at the start of the next block (RFC 7541 §4.2): the smallest size
    /// the table passed through and the size it ends at.
    pending: Option<(usize, usize)>,
}

impl Encoder {
    /// An encoder that fills at most `cap` bytes of the peer's table.
    pub fn new(cap: usize) -> Encoder {
        let max = cap.min(DEFAULT_TABLE);
        let pending = (max != DEFAULT_TABLE).then_some((max, max));
        Encoder { table: Table::new(max), cap, pending }
    }

    /// The peer's `SETTINGS_HEADER_TABLE_SIZE` arrived: the table shrinks (or may grow, up to
    /// the cap) and the next block starts by saying so.
    pub fn set_peer_table_size(&mut self, size: usize) {
        let max = size.min(self.cap);
        if max == self.table.max() && self.pending.is_none() {
            return;
        }
        let low = self.pending.map_or(max, |(low, _)| low.min(max));
        self.table.set_max(max);
        self.pending = Some((low, max));
    }

    /// The size of what the peer's table holds from this encoder.
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Appends one header block to `out`: `:status` first when given (a response head, not
    /// trailers), then `fields` (lowercase names) in order.
    ///
    /// `date`, `x-request-id`, `content-length`, `etag`, `last-modified`, `location`,
    /// `content-range`, `age` and `expires` are literals without indexing; `set-cookie`,
    /// `authorization`, `proxy-authorization` and `cookie` are never-indexed literals; any
    /// other field is an index when the static or dynamic table has it, else a literal
    /// inserted into the dynamic table (if it takes at most a quarter of it).
    pub fn encode<'a>(
        &mut self,
        out: &mut Vec<u8>,
        status: Option<u16>,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) {
        self.encode_marked(out, status, fields.into_iter().map(|(n, v)| (n, v, false)));
    }

    /// [`Encoder::encode`] with each field marked sensitive or not: a sensitive field (a
    /// value fresh on every response that must not reach any table, such as a CSP nonce) is
    /// a never-indexed literal whatever its name.
    pub fn encode_marked<'a>(
        &mut self,
        out: &mut Vec<u8>,
        status: Option<u16>,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8], bool)>,
    ) {
        if let Some((low, max)) = self.pending.take() {
            if low < max {
                put_int(out, 0x20, 5, low);
            }
            put_int(out, 0x20, 5, max);
        }
        if let Some(code) = status {
            let mut digits = [0u8; 3];
            let code = code.clamp(100, 999);
            digits[0] = b'0' + (code / 100) as u8;
            digits[1] = b'0' + (code / 10 % 10) as u8;
            digits[2] = b'0' + (code % 10) as u8;
            self.field(out, b":status", &digits, Policy::Index);
        }
        for (name, value, sensitive) in fields {
            self.field(out, name, value, if sensitive { Policy::Never } else { policy(name) });
        }
    }

    fn field(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8], policy: Policy) {
        if policy == Policy::Index {
            if let Some(i) = static_field(name, value) {
                put_int(out, 0x80, 7, i);
                return;
            }
            if let Some(i) = self.table.find(name, value) {
                put_int(out, 0x80, 7, 62 + i);
                return;
            }
        }
        let insert = policy == Policy::Index && entry_size(name, value) <= self.table.max() / 4;
        let (flags, prefix) = match (policy, insert) {
            (Policy::Never, _) => (0x10, 4),
            (_, true) => (0x40, 6),
            _ => (0x00, 4),
        };
        match static_name(name) {
            Some(i) => put_int(out, flags, prefix, i),
            None => {
                put_int(out, flags, prefix, 0);
                put_str(out, name);
            }
        }
        put_str(out, value);
        if insert {
            self.table.insert(name, value);
        }
    }
}
