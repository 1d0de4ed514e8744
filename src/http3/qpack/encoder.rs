//! The encoder side of one connection's QPACK dynamic table (RFC 9204 §2.1, §3, §4.3, §4.4):
//! what we insert into the peer's decoder table, which field sections may reference it, and
//! what the peer's decoder stream tells us.
//!
//! The rules it keeps, so that no stream can ever block on it:
//! - It is off (capacity 0: every section is exactly the static-only [`Encoder`]'s) until the
//!   connection calls [`TableEncoder::enable`] with the peer's
//!   `SETTINGS_QPACK_MAX_TABLE_CAPACITY`; the capacity it then sets is the smaller of that and
//!   [`TABLE_BOUND`].
//! - A field the caller marks [`Index::Insert`] is inserted once, the first time it is sent,
//!   if it fits in what is left of the capacity; nothing is ever evicted (a fixed set of
//!   response fields fits; what does not fit stays a literal). A field marked
//!   [`Index::Never`] (a value that changes per response) is never inserted: it is a
//!   literal, and when the static table lacks its name (`x-request-id`), that name is
//!   inserted once with an empty value and named by its entry (a Literal Field Line with
//!   Name Reference), so no value of such a field ever enters the table.
//! - A section references only entries the peer's decoder has acknowledged (its Known
//!   Received Count, raised by Insert Count Increment): the section that inserts a field and
//!   every section sent before the acknowledgment arrives carry it as a literal. So the
//!   Required Insert Count of a section is never above what the decoder has, no stream is
//!   blocked, and `SETTINGS_QPACK_BLOCKED_STREAMS` is never used.
//! - Sections with dynamic references wait for their Section Acknowledgment; while more than
//!   [`MAX_UNACKNOWLEDGED`] wait (a decoder that does not acknowledge), new sections are
//!   static-only again, so the bookkeeping stays bounded.
//!
//! A run of fields fixed for the whole program (a `&'static` slice, known by its address:
//! never freed, so never another run's) is encoded once per table state and its field lines
//! copied after that ([`Section::run`]; a field whose name and value are `&'static` text is
//! kept the same way, [`Section::static_field`]). The lines are kept with the Base and the dynamic
//! flag of the section that wrote them and copied only into a section with the same two:
//! a dynamic reference is relative to the Base (RFC 9204 §4.5.2), and every entry below
//! the Base stays as it is (nothing is evicted), so the same Base gives the same indices,
//! and entries at or above it are literals either way. The run's largest reference is kept
//! too and raises the copying section's Required Insert Count, which stays at or below
//! its Base, the Known Received Count: no copied section can block.
//!
//! A field whose value changes per message but whose name is a static entry's (`date`,
//! `content-length`) is a literal naming that entry, the same line in any section: the last
//! line of each such name is kept and copied while its value repeats ([`Repeat`]).
//!
//! A malformed or impossible decoder-stream instruction is a [`DecoderStreamError`] (the
//! connection maps it to `QPACK_DECODER_STREAM_ERROR`). Which fields are worth inserting is
//! HTTP's business (`head.rs` decides); this file knows only QPACK.

use super::super::idmap::IdMap;
use super::table::{self, Found};
use super::{integer, lowered, static_line, write_integer, write_string, DecodeError, Encoder};

/// The largest dynamic table capacity we ask of a peer (its maximum may be larger).
pub const TABLE_BOUND: u64 = 4096;

/// Field sections with dynamic references that may await their acknowledgment at once.
pub const MAX_UNACKNOWLEDGED: usize = 1024;

/// The most fixed runs and static fields a connection keeps the field lines of.
const RUNS: usize = 8;

/// The most names a connection keeps the last per-message field line of.
const REPEATS: usize = 4;

/// The last field line written for a field whose value changes per message and whose name
/// is a static entry's (`date`, `content-length`): a Literal Field Line with a static Name
/// Reference, the same in any section, so the same value is copied rather than coded again
/// (`date` changes once a second).
#[derive(Debug, Default)]
struct Repeat {
    /// The name, then the value.
    field: Vec<u8>,
    /// The name's length.
    name: usize,
    line: Vec<u8>,
}

/// The field lines a fixed run was written as, and the section state they hold in.
#[derive(Debug)]
struct Run {
    /// Where the run's fields are and how many (then two zeros); or where one field's name
    /// and value are and how long.
    key: [usize; 4],
    /// The Base of the section that wrote the lines (its relative indices count from it).
    base: u64,
    /// Whether that section could reference the table.
    dynamic: bool,
    /// 1 + the largest absolute index the lines reference (0: none).
    required: u64,
    /// The entry after the last one found once the run was written.
    next: usize,
    lines: Vec<u8>,
}

/// Whether a field may be inserted into the dynamic table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// Insert it (once) and reference it once the peer has it.
    Insert,
    /// Its value changes per message: always a literal.
    Never,
}

/// A malformed or impossible instruction on the peer's decoder stream (RFC 9204 §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderStreamError(pub &'static str);

/// The encoder side of one connection's dynamic table. See the module doc.
#[derive(Debug, Default)]
pub struct TableEncoder {
    /// The capacity set on the encoder stream (0: off).
    capacity: u64,
    /// `floor(peer's maximum capacity / 32)`, for the Required Insert Count's encoding.
    max_entries: u64,
    /// Sum of the entries' sizes (name + value + 32 each).
    used: u64,
    /// Entry `i` (absolute index `i`: nothing is evicted) is `text[name.0..name.1]`,
    /// `text[name.1..value_end]`.
    entries: Vec<(u32, u32, u32)>,
    text: Vec<u8>,
    /// The decoder's Known Received Count: entries below it may be referenced.
    acknowledged: u64,
    /// Per request stream, its sections with dynamic references not yet acknowledged.
    unacknowledged: IdMap<u64, u32>,
    unacknowledged_total: usize,
    /// Encoder-stream instructions not yet taken by the connection.
    instructions: Vec<u8>,
    /// The entry after the last one found: response heads list their fields in the same
    /// order every time, so it is most often the next field's.
    next: usize,
    /// The field lines of the section being written (its prefix is known only at the end).
    lines: Vec<u8>,
    /// The section prefix being written (kept, like `lines`, so writing allocates nothing).
    prefix: Vec<u8>,
    /// The fixed runs met last, with their field lines.
    runs: Vec<Run>,
    /// The last line of each per-message field met last (by name).
    repeats: Vec<Repeat>,
}

impl TableEncoder {
    /// Turns the table on for a peer whose decoder allows `peer_max` bytes: sets the capacity
    /// to `min(peer_max, bound)` (a Set Dynamic Table Capacity instruction). Once only;
    /// returns whether the table is on (a capacity too small for any entry leaves it off).
    pub fn enable(&mut self, peer_max: u64, bound: u64) -> bool {
        let capacity = peer_max.min(bound);
        if self.capacity > 0 || capacity < 33 {
            return self.capacity > 0;
        }
        self.capacity = capacity;
        self.max_entries = peer_max / 32;
        write_integer(capacity, 5, 0x20, &mut self.instructions);
        true
    }

    /// The capacity set (0: static table only).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Entries inserted so far.
    pub fn inserted(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Entries the peer has acknowledged (its Known Received Count).
    pub fn acknowledged(&self) -> u64 {
        self.acknowledged
    }

    /// Moves the encoder-stream instructions written so far to the end of `out`.
    pub fn take_instructions(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.instructions);
    }

    /// Whether instructions wait to be taken.
    pub fn has_instructions(&self) -> bool {
        !self.instructions.is_empty()
    }

    /// Starts a field section on request stream `stream` (its QUIC stream ID); field lines
    /// go through the [`Section`], which writes the whole section into `out` when finished.
    pub fn section<'a>(&'a mut self, stream: u64, out: &'a mut Vec<u8>) -> Section<'a> {
        self.lines.clear();
        let dynamic = self.capacity > 0 && self.unacknowledged_total < MAX_UNACKNOWLEDGED;
        let base = self.acknowledged;
        Section { enc: self, out, stream, dynamic, base, required: 0 }
    }

    /// Consumes the complete instructions at the front of `input` (the peer's decoder
    /// stream); returns how many bytes they took (the rest is an instruction cut short).
    pub fn on_decoder_stream(&mut self, input: &[u8]) -> Result<usize, DecoderStreamError> {
        let mut at = 0;
        while let Some(&first) = input.get(at) {
            let bits = if first & 0x80 != 0 { 7 } else { 6 };
            let (value, used) = match integer(&input[at..], bits) {
                Ok(v) => v,
                Err(DecodeError::Failed(super::TRUNCATED_INTEGER)) => break,
                Err(_) => return Err(DecoderStreamError("an integer too large")),
            };
            if first & 0x80 != 0 {
                self.section_acknowledged(value)?;
            } else if first & 0x40 != 0 {
                if let Some(n) = self.unacknowledged.remove(&value) {
                    self.unacknowledged_total -= n as usize;
                }
            } else {
                // Insert Count Increment (RFC 9204 §4.4.3).
                if value == 0 {
                    return Err(DecoderStreamError("an Insert Count Increment of 0"));
                }
                match self.acknowledged.checked_add(value) {
                    Some(count) if count <= self.inserted() => self.acknowledged = count,
                    _ => return Err(DecoderStreamError("an Insert Count Increment past the entries inserted")),
                }
            }
            at += used;
        }
        Ok(at)
    }

    /// Section Acknowledgment for `stream` (RFC 9204 §4.4.1). Our sections reference only
    /// acknowledged entries, so it cannot raise the Known Received Count.
    fn section_acknowledged(&mut self, stream: u64) -> Result<(), DecoderStreamError> {
        let Some(n) = self.unacknowledged.get_mut(&stream) else {
            return Err(DecoderStreamError("a Section Acknowledgment with no section outstanding"));
        };
        *n -= 1;
        if *n == 0 {
            self.unacknowledged.remove(&stream);
        }
        self.unacknowledged_total -= 1;
        Ok(())
    }

    /// The absolute index of the entry `name: value`, when it is the entry after the last one
    /// found (the one most often asked for next; after the last entry, the first: the next
    /// response's first field).
    fn next_is(&mut self, name: &[u8], value: &[u8]) -> Option<u64> {
        let i = if self.next < self.entries.len() { self.next } else { 0 };
        let entry = self.entries.get(i)?;
        if !is(&self.text, entry, name, value) {
            return None;
        }
        self.next = i + 1;
        Some(i as u64)
    }

    /// The absolute index of the entry `name: value`.
    fn find(&mut self, name: &[u8], value: &[u8]) -> Option<u64> {
        if let Some(i) = self.next_is(name, value) {
            return Some(i);
        }
        let i = self.entries.iter().position(|entry| is(&self.text, entry, name, value))?;
        self.next = i + 1;
        Some(i as u64)
    }

    /// The absolute index of the entry `name` with an empty value (the name a field whose
    /// value changes per message is sent with); like [`Self::find`], the entry after the
    /// last one found is tried first, and the search goes on from it.
    fn find_name(&mut self, name: &[u8]) -> Option<u64> {
        self.find(name, b"")
    }

    /// Appends the line last written for `name: value` if it is kept (see [`Repeat`]);
    /// whether it was.
    fn repeat(&mut self, name: &[u8], value: &[u8]) -> bool {
        let same = |r: &&Repeat| r.name == name.len() && r.field[..r.name] == *name && r.field[r.name..] == *value;
        match self.repeats.iter().find(same) {
            Some(r) => {
                self.lines.extend_from_slice(&r.line);
                true
            }
            None => false,
        }
    }

    /// Keeps the line written from `start` on in `lines` as `name: value`'s, in place of
    /// the last one of that name (or of the name met longest ago).
    fn remember(&mut self, name: &[u8], value: &[u8], start: usize) {
        let i = match self.repeats.iter().position(|r| r.field[..r.name] == *name) {
            Some(i) => i,
            None if self.repeats.len() < REPEATS => {
                self.repeats.push(Repeat::default());
                self.repeats.len() - 1
            }
            None => {
                self.repeats.rotate_left(1);
                REPEATS - 1
            }
        };
        let r = &mut self.repeats[i];
        r.field.clear();
        r.field.extend_from_slice(name);
        r.field.extend_from_slice(value);
        r.name = name.len();
        r.line.clear();
        r.line.extend_from_slice(&self.lines[start..]);
    }

    /// Inserts `name: value` if it fits (an Insert With Name Reference to static entry
    /// `static_name` when there is one, else With Literal Name).
    fn insert(&mut self, name: &[u8], value: &[u8], static_name: Option<usize>) {
        let size = (name.len() + value.len() + 32) as u64;
        if self.used + size > self.capacity {
            return;
        }
        self.used += size;
        let n = self.text.len() as u32;
        self.text.extend_from_slice(name);
        let v = self.text.len() as u32;
        self.text.extend_from_slice(value);
        self.entries.push((n, v, self.text.len() as u32));
        match static_name {
            Some(i) => write_integer(i as u64, 6, 0xc0, &mut self.instructions),
            None => write_string(name, 5, 0x40, &mut self.instructions),
        }
        write_string(value, 7, 0, &mut self.instructions);
    }
}

/// Whether entry `(n, v, e)` of `text` (as [`TableEncoder`] keeps them) is `name: value`.
#[inline]
fn is(text: &[u8], &(n, v, e): &(u32, u32, u32), name: &[u8], value: &[u8]) -> bool {
    (v - n) as usize == name.len()
        && (e - v) as usize == value.len()
        && &text[n as usize..v as usize] == name
        && &text[v as usize..e as usize] == value
}

/// One field section being written (see [`TableEncoder::section`]).
#[derive(Debug)]
pub struct Section<'a> {
    enc: &'a mut TableEncoder,
    out: &'a mut Vec<u8>,
    stream: u64,
    /// Dynamic references are allowed in this section.
    dynamic: bool,
    /// The section's Base: the Known Received Count when it started (every reference is
    /// below it, so all are relative to it, none post-base).
    base: u64,
    /// 1 + the largest absolute index referenced (0: none).
    required: u64,
}

impl Section<'_> {
    /// Appends `:status` (a static index when the table has the code).
    pub fn status(&mut self, status: u16) {
        Encoder.status(status, &mut self.enc.lines);
    }

    /// Appends one field line; `name` is sent lower-case (RFC 9114 §4.2).
    pub fn field(&mut self, name: &[u8], value: &[u8], index: Index) {
        if index == Index::Never {
            // Not even an entry that holds it is referenced.
            let mut buf = [0u8; 64];
            let name = lowered(name, &mut buf);
            return self.per_message(&name, value, table::find(&name, value));
        }
        self.field_with(name, value, || index);
    }

    /// [`Self::field`], with whether the field may be inserted asked only when the answer
    /// matters: a field that is the entry after the last one found (the same head as the
    /// last response's) was inserted, so it may be, and nothing more is asked. `index` must
    /// answer the same for the same field every time.
    pub fn field_with(&mut self, name: &[u8], value: &[u8], index: impl FnOnce() -> Index) {
        // Entries are lower-case: a name that is one's needs no check.
        if self.dynamic {
            if let Some(abs) = self.enc.next_is(name, value).filter(|&abs| abs < self.base) {
                return self.reference(abs);
            }
        }
        if name.iter().any(u8::is_ascii_uppercase) {
            return self.lowered_field(name, value, index);
        }
        if self.enc.repeat(name, value) {
            return;
        }
        // An entry is inserted only when the static table has no exact match, so a field the
        // static table has is never looked for in the dynamic one. A field never to be
        // indexed is not either: it stays a literal.
        let found = table::find(name, value);
        if let Some(Found::Exact(i)) = found {
            write_integer(i as u64, 6, 0xc0, &mut self.enc.lines);
            return;
        }
        if !self.dynamic {
            return static_line(name, value, found, &mut self.enc.lines);
        }
        let insert = index() == Index::Insert;
        if !insert {
            let start = self.enc.lines.len();
            self.per_message(name, value, found);
            if found.is_some() {
                // A static name: the line holds in any section (see [`Repeat`]).
                self.enc.remember(name, value, start);
            }
            return;
        }
        let dynamic = self.enc.find(name, value);
        if let Some(abs) = dynamic.filter(|&abs| abs < self.base) {
            return self.reference(abs);
        }
        if dynamic.is_none() {
            let static_name = match found {
                Some(Found::Name(i)) => Some(i),
                _ => None,
            };
            self.enc.insert(name, value, static_name);
        }
        static_line(name, value, found, &mut self.enc.lines);
    }

    /// A field whose value changes per message: a literal (the static entry when it is one);
    /// with the table on, its name, when the static table has no entry of it, by the dynamic
    /// entry of that name
    /// (inserted once, with an empty value, by the first such field; referenced once
    /// acknowledged).
    fn per_message(&mut self, name: &[u8], value: &[u8], found: Option<Found>) {
        if self.dynamic && found.is_none() {
            match self.enc.find_name(name) {
                Some(abs) if abs < self.base => {
                    // Literal Field Line with Name Reference, dynamic (N = 0, T = 0).
                    write_integer(self.base - 1 - abs, 4, 0x40, &mut self.enc.lines);
                    write_string(value, 7, 0, &mut self.enc.lines);
                    self.required = self.required.max(abs + 1);
                    return;
                }
                Some(_) => {}
                None => self.enc.insert(name, b"", None),
            }
        }
        static_line(name, value, found, &mut self.enc.lines);
    }

    /// Appends the field lines of `run`, a run of fields fixed for the whole program, each
    /// written by `each` (which must write the same lines for the same field in the same
    /// table state, as [`Self::field_with`] does): the lines it was written as the last time
    /// when that section had this one's Base and dynamic flag, else written field by field
    /// and kept. See the module doc for why the copy is the same section.
    pub fn run(&mut self, run: &'static [(&'static str, &'static str)], each: impl Fn(&mut Self, &[u8], &[u8])) {
        self.kept([run.as_ptr() as usize, run.len(), 0, 0], run, each);
    }

    /// [`Self::run`] for one field whose name and value live for the whole program (known by
    /// where their text is).
    pub fn static_field(&mut self, name: &'static str, value: &'static str, each: impl Fn(&mut Self, &[u8], &[u8])) {
        let key = [name.as_ptr() as usize, name.len(), value.as_ptr() as usize, value.len()];
        self.kept(key, &[(name, value)], each);
    }

    /// The lines of `fields`, known by `key`, as [`Self::run`] writes them.
    fn kept(&mut self, key: [usize; 4], fields: &[(&str, &str)], each: impl Fn(&mut Self, &[u8], &[u8])) {
        let at = self.enc.runs.iter().position(|r| r.key == key);
        if let Some(r) = at.map(|i| &self.enc.runs[i]) {
            if r.base == self.base && r.dynamic == self.dynamic {
                self.enc.lines.extend_from_slice(&r.lines);
                self.required = self.required.max(r.required);
                self.enc.next = r.next;
                return;
            }
        }
        let start = self.enc.lines.len();
        let required = std::mem::take(&mut self.required);
        for (name, value) in fields {
            each(self, name.as_bytes(), value.as_bytes());
        }
        let (run_required, enc) = (self.required, &mut *self.enc);
        self.required = required.max(run_required);
        let i = match at {
            Some(i) => i,
            None => {
                if enc.runs.len() == RUNS {
                    enc.runs.remove(0);
                }
                let fresh = Run { key, base: 0, dynamic: false, required: 0, next: 0, lines: Vec::new() };
                enc.runs.push(fresh);
                enc.runs.len() - 1
            }
        };
        let r = &mut enc.runs[i];
        (r.base, r.dynamic, r.required, r.next) = (self.base, self.dynamic, run_required, enc.next);
        r.lines.clear();
        r.lines.extend_from_slice(&enc.lines[start..]);
    }

    /// [`Self::field_with`] for a name with upper-case letters (sent lowered).
    #[cold]
    fn lowered_field(&mut self, name: &[u8], value: &[u8], index: impl FnOnce() -> Index) {
        let mut buf = [0u8; 64];
        let name = lowered(name, &mut buf);
        self.field_with(&name, value, index);
    }

    /// Indexed Field Line, dynamic (T = 0), relative to the Base, for acknowledged entry `abs`.
    fn reference(&mut self, abs: u64) {
        write_integer(self.base - 1 - abs, 6, 0x80, &mut self.enc.lines);
        self.required = self.required.max(abs + 1);
    }

    /// Writes the section (prefix, then its lines) into the output and records it as awaiting
    /// acknowledgment if it references the table.
    pub fn finish(self) {
        self.finish_with(|_, _| {});
    }

    /// [`Self::finish`], with `before` first given the section's length and the output (to
    /// write what frames it) so the section is written in place, never copied.
    pub fn finish_with(self, before: impl FnOnce(usize, &mut Vec<u8>)) {
        let enc = self.enc;
        enc.prefix.clear();
        if self.required == 0 {
            enc.prefix.extend_from_slice(&[0, 0]);
        } else {
            // RFC 9204 §4.5.1.1: Required Insert Count modulo 2 × MaxEntries, plus 1; the
            // Base is at or above it (sign 0, Delta Base = Base − Required Insert Count).
            let encoded = self.required % (2 * enc.max_entries.max(1)) + 1;
            write_integer(encoded, 8, 0, &mut enc.prefix);
            write_integer(self.base - self.required, 7, 0, &mut enc.prefix);
            *enc.unacknowledged.entry(self.stream).or_insert(0) += 1;
            enc.unacknowledged_total += 1;
        }
        before(enc.prefix.len() + enc.lines.len(), self.out);
        self.out.extend_from_slice(&enc.prefix);
        self.out.extend_from_slice(&enc.lines);
    }
}
