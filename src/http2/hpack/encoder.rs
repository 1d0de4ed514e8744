//! The HPACK encoder for response header blocks (RFC 7541 §6): one per connection, it
//! mirrors the dynamic table it fills in the peer's decoder.
//!
//! What each field becomes is decided by its name, as [`Encoder::encode`] documents: the
//! fields a connection repeats are inserted once and indexed after that; per-response values
//! are literals (the first `x-request-id` of a connection enters the table, so that every
//! later one names it by index); credentials are never-indexed literals. Knows no frames.
//!
//! What repeats is encoded once and copied after that: a run of fields fixed for the whole
//! program ([`Part::Fixed`]) is kept as the bytes it last encoded to, valid while the
//! dynamic table has not changed since (every insertion or resize starts a new generation,
//! because it moves the indices those bytes name); `date` enters the table once a second
//! and the entry it went into is remembered, as is the entry the first `x-request-id`
//! went into, so their indices take no search; the last literal name outside the static
//! table is kept too (a literal never depends on the table). Short values that change per response are raw literals ([`put_literal`]):
//! Huffman coding them costs more instructions than the bytes it saves are worth.

use super::table::Table;
use super::{entry_size, put_int, put_str, static_field, static_name};

/// The peer decoder's table size until its SETTINGS say otherwise (RFC 9113 §6.5.2).
const DEFAULT_TABLE: usize = 4096;

/// How one field is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// `date`: the same value for a whole second, then never again. Inserted when its
    /// second begins, an index for the rest of that second.
    Date,
    /// Indexed when the table has it; otherwise a literal inserted into the table.
    Index,
    /// A literal: the value changes from one response to the next. When the static table
    /// lacks the name (`x-request-id`), the first value enters the table with it, and every
    /// later literal names that entry by its index.
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
        b"date" => Policy::Date,
        b"x-request-id" | b"content-length" | b"etag" | b"last-modified" | b"location" | b"content-range" | b"age"
        | b"expires" => Policy::Literal,
        _ => Policy::Index,
    }
}

/// The most [`Part::Fixed`] runs and [`Part::Static`] fields an encoder keeps the bytes of.
const RUNS: usize = 8;

/// One piece of a header block for [`Encoder::encode_parts`].
#[derive(Debug, Clone, Copy)]
pub enum Part<'a> {
    /// One field (lowercase name, value), marked sensitive or not as in
    /// [`Encoder::encode_marked`].
    Field(&'a [u8], &'a [u8], bool),
    /// A run of fields that is the same on every response: one static slice always holds
    /// the same fields, so what it encodes to is kept and copied while the table has not
    /// changed. The fields are written by their names' rules, as [`Part::Field`]s unmarked.
    Fixed(&'static [(&'static str, &'static str)]),
    /// One field whose name and value live for the whole program (a `content-type` a
    /// handler names), kept as a [`Part::Fixed`] run is: known by where its text is.
    Static(&'static str, &'static str),
}

/// The bytes a [`Part::Fixed`] run or a [`Part::Static`] field encoded to, and the table
/// generation they are valid in.
#[derive(Debug)]
struct Run {
    /// Where the run's fields are and how many; or where the field's name and value are
    /// and how long.
    key: [usize; 4],
    generation: u64,
    bytes: Vec<u8>,
}

/// The encoding of one literal, kept for the next time the same input comes.
#[derive(Debug, Default)]
struct Memo {
    input: Vec<u8>,
    bytes: Vec<u8>,
}

impl Memo {
    /// Appends what `input` encodes to: the kept bytes when `input` is the last one, else
    /// `encode`'s, which are kept.
    fn put(&mut self, out: &mut Vec<u8>, input: &[u8], encode: impl FnOnce(&mut Vec<u8>)) {
        if self.input != input {
            self.input.clear();
            self.input.extend_from_slice(input);
            self.bytes.clear();
            encode(&mut self.bytes);
        }
        out.extend_from_slice(&self.bytes);
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
    /// Counts the changes to the table (insertions and resizes): bytes that name dynamic
    /// indices are valid only in the generation they were made in.
    generation: u64,
    /// The [`Part::Fixed`] runs met last, with their bytes.
    runs: Vec<Run>,
    /// The last `date` value inserted and its entry ([`Table::insert`]'s number): its index
    /// while the table holds it, with no search.
    date: (Vec<u8>, Option<u64>),
    /// The last name outside the static table written as a literal.
    name: Memo,
    /// The entry ([`Table::insert`]'s number) a [`Policy::Literal`] field whose name the
    /// static table lacks went into last: its name, while the table holds it.
    named: Option<u64>,
}

impl Encoder {
    /// An encoder that fills at most `cap` bytes of the peer's table.
    pub fn new(cap: usize) -> Encoder {
        let max = cap.min(DEFAULT_TABLE);
        let pending = (max != DEFAULT_TABLE).then_some((max, max));
        Encoder {
            table: Table::new(max),
            cap,
            pending,
            generation: 0,
            runs: Vec::new(),
            date: (Vec::new(), None),
            name: Memo::default(),
            named: None,
        }
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
        self.generation += 1;
        self.pending = Some((low, max));
    }

    /// The size of what the peer's table holds from this encoder.
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Appends one header block to `out`: `:status` first when given (a response head, not
    /// trailers), then `fields` (lowercase names) in order.
    ///
    /// `date` is inserted into the table when its value changes (once a second) and an index
    /// for the rest of that second; `x-request-id`, `content-length`, `etag`,
    /// `last-modified`, `location`, `content-range`, `age` and `expires` are literals
    /// without indexing, but for the first `x-request-id` (the static table lacks the name):
    /// it is inserted with its value, and later ones are literals naming that entry, two
    /// bytes instead of eleven (inserted again once the table evicted it); `set-cookie`,
    /// `authorization`, `proxy-authorization` and `cookie` are never-indexed literals; any
    /// other field is an index when the static or dynamic table has it, else a literal
    /// inserted into the dynamic table (if it takes at most a quarter of it). A value that
    /// stays out of the table is a raw literal up to 64 bytes, Huffman-coded above.
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
        self.encode_parts(out, status, fields.into_iter().map(|(n, v, s)| Part::Field(n, v, s)));
    }

    /// [`Encoder::encode_marked`] with fixed runs among the fields: each [`Part::Fixed`] is
    /// written as the bytes it encoded to the last time, when the table has not changed
    /// since; the block is the same as with its fields given one by one.
    pub fn encode_parts<'a>(
        &mut self,
        out: &mut Vec<u8>,
        status: Option<u16>,
        parts: impl IntoIterator<Item = Part<'a>>,
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
        // Internal iteration: a chain of parts is walked piece by piece (no check per part of
        // which piece it is in), the body inlined once.
        parts.into_iter().for_each(|part| match part {
            Part::Field(name, value, sensitive) => {
                self.field(out, name, value, if sensitive { Policy::Never } else { policy(name) })
            }
            Part::Fixed(run) => self.run(out, [run.as_ptr() as usize, run.len(), 0, 0], run),
            Part::Static(name, value) => {
                let key = [name.as_ptr() as usize, name.len(), value.as_ptr() as usize, value.len()];
                self.run(out, key, &[(name, value)]);
            }
        });
    }

    /// Writes the fixed `run` known by `key`: its kept bytes when they are of this
    /// generation, else its fields one by one, kept when writing them left the table as it
    /// was.
    fn run(&mut self, out: &mut Vec<u8>, key: [usize; 4], run: &[(&'static str, &'static str)]) {
        let at = self.runs.iter().position(|r| r.key == key);
        if let Some(r) = at.map(|i| &self.runs[i]) {
            if r.generation == self.generation {
                out.extend_from_slice(&r.bytes);
                return;
            }
        }
        let start = out.len();
        let before = self.generation;
        for (name, value) in run {
            self.field(out, name.as_bytes(), value.as_bytes(), policy(name.as_bytes()));
        }
        if self.generation != before {
            // The run inserted fields: the next time it is indices only.
            return;
        }
        let i = match at {
            Some(i) => i,
            None => {
                if self.runs.len() == RUNS {
                    self.runs.remove(0);
                }
                self.runs.push(Run { key, generation: 0, bytes: Vec::new() });
                self.runs.len() - 1
            }
        };
        let r = &mut self.runs[i];
        r.generation = self.generation;
        r.bytes.clear();
        r.bytes.extend_from_slice(&out[start..]);
    }

    fn field(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8], policy: Policy) {
        if policy == Policy::Date && self.date.0 == value {
            if let Some(i) = self.date.1.and_then(|n| self.table.position(n)) {
                put_int(out, 0x80, 7, 62 + i);
                return;
            }
        }
        if matches!(policy, Policy::Index | Policy::Date) {
            if let Some(i) = static_field(name, value) {
                put_int(out, 0x80, 7, i);
                return;
            }
            if let Some(i) = self.table.find(name, value) {
                put_int(out, 0x80, 7, 62 + i);
                return;
            }
        }
        let known = static_name(name);
        if policy == Policy::Literal && known.is_none() {
            self.fresh(out, name, value);
            return;
        }
        let insert = matches!(policy, Policy::Index | Policy::Date) && self.fits(name, value);
        let (flags, prefix) = match (policy, insert) {
            (Policy::Never, _) => (0x10, 4),
            (_, true) => (0x40, 6),
            _ => (0x00, 4),
        };
        match known {
            Some(i) => put_int(out, flags, prefix, i),
            None => {
                put_int(out, flags, prefix, 0);
                if insert {
                    put_str(out, name);
                } else {
                    self.name.put(out, name, |out| put_str(out, name));
                }
            }
        }
        if insert {
            put_str(out, value);
            let entry = self.table.insert(name, value);
            self.generation += 1;
            if policy == Policy::Date {
                self.date.0.clear();
                self.date.0.extend_from_slice(value);
                self.date.1 = entry;
            }
        } else {
            put_literal(out, value);
        }
    }

    /// Whether `name: value` may enter the table: at most a quarter of it, so one entry
    /// never evicts the fixed fields wholesale.
    fn fits(&self, name: &[u8], value: &[u8]) -> bool {
        entry_size(name, value) <= self.table.max() / 4
    }

    /// Writes a [`Policy::Literal`] field whose name the static table lacks: a literal
    /// without indexing that names the entry the last such field went into while the table
    /// holds it; else a literal inserted into the table (when it fits), whose entry the next
    /// ones name; else a literal with a literal name.
    fn fresh(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        let held = self.named.and_then(|n| self.table.position(n));
        match held.filter(|&i| self.table.get(i).is_some_and(|(n, _)| n == name)) {
            Some(i) => put_int(out, 0x00, 4, 62 + i),
            None if self.fits(name, value) => {
                put_int(out, 0x40, 6, 0);
                put_str(out, name);
                put_literal(out, value);
                self.named = self.table.insert(name, value);
                self.generation += 1;
                return;
            }
            None => {
                put_int(out, 0x00, 4, 0);
                self.name.put(out, name, |out| put_str(out, name));
            }
        }
        put_literal(out, value);
    }
}

/// Values this long or shorter are raw literals when they stay out of the table.
const RAW_LITERAL: usize = 64;

/// Appends a value that stays out of the table: raw up to [`RAW_LITERAL`] bytes, Huffman-coded
/// (when shorter) above. Such a value changes from one block to the next, so it is coded
/// every time; for a request id, coding costs ~20 instructions a byte to save a quarter of
/// ~36 bytes.
fn put_literal(out: &mut Vec<u8>, s: &[u8]) {
    if s.len() <= RAW_LITERAL {
        put_int(out, 0, 7, s.len());
        out.extend_from_slice(s);
    } else {
        put_str(out, s);
    }
}
