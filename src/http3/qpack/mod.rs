//! QPACK (RFC 9204): field sections, the static table, Huffman, and the encoder side of a
//! dynamic table.
//!
//! forkd's decoder advertises a dynamic table capacity of 0 (RFC 9204 §2.1 allows it: a
//! request's field section is decodable on its own, no request stream is ever blocked):
//! [`decode`] turns an encoded field section into [`Fields`] under a size limit (RFC 9114
//! §4.2.2: name + value + 32 per field), and any reference to a dynamic table is
//! `QPACK_DECOMPRESSION_FAILED`. [`Encoder`] writes static-only field lines: static-table
//! indices where a field or its name is in the table, Huffman where it is shorter, literals
//! otherwise. [`encoder::TableEncoder`] adds the encoder side of a dynamic table in the peer's
//! decoder, for a peer that allows one. [`decoder::TableDecoder`] is the decoder side of a
//! dynamic table, for forkd's own HTTP/3 clients (the tests, `h3get`) that read what the
//! encoder side writes.
//! This module knows no HTTP semantics (pseudo-header rules, which fields are worth
//! inserting: `head.rs`'s).

pub mod decoder;
pub mod encoder;
mod table;

/// HPACK's Huffman code, which QPACK reuses (RFC 9204 §4.1.2): one table for both.
pub use crate::http2::hpack::huffman;

pub use table::STATIC;

/// Why a field section cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Malformed or refers to a dynamic table: a connection error (RFC 9204 §2.2.3).
    Failed(&'static str),
    /// Decodes, but its size passes the limit: the request is answered 431.
    TooLarge,
}

/// A decoded field section: every name and value in one buffer. Reused between sections.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields {
    buf: Vec<u8>,
    /// Per field: where its name starts, where its value starts (= where its name ends), where
    /// its value ends.
    spans: Vec<(u32, u32, u32)>,
    /// RFC 9114 size of the section so far.
    size: usize,
}

impl Fields {
    /// Empty, with room for `bytes` of names and values and `fields` fields.
    pub fn with_capacity(bytes: usize, fields: usize) -> Fields {
        Fields { buf: Vec::with_capacity(bytes), spans: Vec::with_capacity(fields), size: 0 }
    }

    /// Empties it, keeping the allocations.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.spans.clear();
        self.size = 0;
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there is no field.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Field `i` as `(name, value)`.
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let &(n, v, e) = self.spans.get(i)?;
        Some((&self.buf[n as usize..v as usize], &self.buf[v as usize..e as usize]))
    }

    /// Every field, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The first value of `name`.
    pub fn value(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The RFC 9114 size (name + value + 32 per field).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Adds a field (for tests and encoders' callers).
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        let n = self.buf.len() as u32;
        self.buf.extend_from_slice(name);
        let v = self.buf.len() as u32;
        self.buf.extend_from_slice(value);
        self.spans.push((n, v, self.buf.len() as u32));
        self.size += name.len() + value.len() + 32;
    }
}

/// Why [`integer`] fails when its input ends inside the integer (more may come).
pub(crate) const TRUNCATED_INTEGER: &str = "truncated integer";
/// Why [`string`] fails when its input ends inside the string (more may come).
pub(crate) const TRUNCATED_STRING: &str = "truncated string";

/// Reads a prefixed integer (RFC 7541 §5.1) whose prefix is the low `bits` bits of
/// `input[0]`; returns it and the bytes used. Values past 2^62 are refused.
pub(crate) fn integer(input: &[u8], bits: u8) -> Result<(u64, usize), DecodeError> {
    let truncated = DecodeError::Failed(TRUNCATED_INTEGER);
    let mask = (1u16 << bits) as u64 - 1;
    let first = u64::from(*input.first().ok_or(truncated)?) & mask;
    if first < mask {
        return Ok((first, 1));
    }
    let (mut value, mut shift) = (mask, 0u32);
    for (i, &b) in input.iter().enumerate().skip(1) {
        value += u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
        shift += 7;
        if shift > 56 {
            return Err(DecodeError::Failed("integer overflow"));
        }
    }
    Err(truncated)
}

/// Appends `value` as a prefixed integer with a `bits`-bit prefix; `flags` are the bits of the
/// first byte above the prefix.
fn write_integer(value: u64, bits: u8, flags: u8, out: &mut Vec<u8>) {
    let mask = (1u16 << bits) as u64 - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads a string literal whose length has a `bits`-bit prefix with the Huffman flag just above
/// it; appends the (decoded) string to `out`; returns the bytes used. The input is one
/// HEADERS payload, already bounded, and Huffman at most multiplies it by 8/5.
fn string(input: &[u8], bits: u8, out: &mut Vec<u8>) -> Result<usize, DecodeError> {
    let huffman = input.first().is_some_and(|b| b & (1 << bits) != 0);
    let (len, used) = integer(input, bits)?;
    let end = used.checked_add(usize::try_from(len).map_err(|_| DecodeError::Failed("string too long"))?);
    let raw = end.and_then(|end| input.get(used..end)).ok_or(DecodeError::Failed(TRUNCATED_STRING))?;
    if huffman {
        huffman::decode(raw, out).map_err(|_| DecodeError::Failed("bad Huffman string"))?;
    } else {
        out.extend_from_slice(raw);
    }
    Ok(used + raw.len())
}

/// Decodes the field section `input` into `out` (cleared first), with the static table
/// only. Fails with [`DecodeError::TooLarge`] as soon as the section's size passes
/// `max_size`.
pub fn decode(input: &[u8], max_size: usize, out: &mut Fields) -> Result<(), DecodeError> {
    decode_section(input, max_size, None, out).map(|_| ())
}

/// [`decode`] with a dynamic table (`None`: none, any reference to one fails); returns the
/// section's Required Insert Count (a decoder with a table acknowledges sections above 0).
pub(crate) fn decode_section(
    mut input: &[u8],
    max_size: usize,
    table: Option<&decoder::TableDecoder>,
    out: &mut Fields,
) -> Result<u64, DecodeError> {
    out.clear();
    // Required Insert Count (8-bit prefix), then sign and Delta Base (7-bit prefix).
    let (encoded, used) = integer(input, 8)?;
    input = &input[used..];
    let sign = input.first().is_some_and(|b| b & 0x80 != 0);
    let (delta, used) = integer(input, 7)?;
    input = &input[used..];
    let (required, base) = match table {
        None if encoded != 0 => {
            return Err(DecodeError::Failed("a dynamic table reference (Required Insert Count > 0)"));
        }
        None => (0, 0),
        Some(t) => {
            let required = t.required_insert_count(encoded)?;
            let base = if sign { required.checked_sub(delta + 1) } else { required.checked_add(delta) };
            (required, base.ok_or(DecodeError::Failed("a negative Base"))?)
        }
    };
    let entry = |abs: Option<u64>| dynamic_entry(table, required, abs);
    while let Some(&first) = input.first() {
        let name_at = out.buf.len();
        let used = if first & 0x80 != 0 {
            // Indexed field line: 1 T index(6).
            let (index, used) = integer(input, 6)?;
            let (name, value) = if first & 0x40 != 0 {
                let (n, v) = static_entry(index)?;
                (n.as_bytes(), v.as_bytes())
            } else {
                entry(base.checked_sub(index + 1))?
            };
            out.buf.extend_from_slice(name);
            let value_at = out.buf.len();
            out.buf.extend_from_slice(value);
            finish(out, name_at, value_at, max_size)?;
            used
        } else if first & 0x40 != 0 {
            // Literal with name reference: 0 1 N T index(4), then the value.
            let (index, used) = integer(input, 4)?;
            let name = if first & 0x10 != 0 {
                static_entry(index)?.0.as_bytes()
            } else {
                entry(base.checked_sub(index + 1))?.0
            };
            out.buf.extend_from_slice(name);
            let value_at = out.buf.len();
            let value_used = string(&input[used..], 7, &mut out.buf)?;
            finish(out, name_at, value_at, max_size)?;
            used + value_used
        } else if first & 0x20 != 0 {
            // Literal with literal name: 0 0 1 N H length(3), name, then the value.
            let name_used = string(input, 3, &mut out.buf)?;
            let value_at = out.buf.len();
            let value_used = string(&input[name_used..], 7, &mut out.buf)?;
            finish(out, name_at, value_at, max_size)?;
            name_used + value_used
        } else if first & 0x10 != 0 {
            // Indexed field line with post-base index: 0001 index(4).
            let (index, used) = integer(input, 4)?;
            let (name, value) = entry(base.checked_add(index))?;
            out.buf.extend_from_slice(name);
            let value_at = out.buf.len();
            out.buf.extend_from_slice(value);
            finish(out, name_at, value_at, max_size)?;
            used
        } else {
            // Literal with post-base name reference: 0000 N index(3), then the value.
            let (index, used) = integer(input, 3)?;
            out.buf.extend_from_slice(entry(base.checked_add(index))?.0);
            let value_at = out.buf.len();
            let value_used = string(&input[used..], 7, &mut out.buf)?;
            finish(out, name_at, value_at, max_size)?;
            used + value_used
        };
        input = &input[used..];
    }
    Ok(required)
}

/// The dynamic entry at absolute index `abs`, which must be below the Required Insert Count.
fn dynamic_entry(
    table: Option<&decoder::TableDecoder>,
    required: u64,
    abs: Option<u64>,
) -> Result<(&[u8], &[u8]), DecodeError> {
    let found = table.zip(abs.filter(|&a| a < required)).and_then(|(t, a)| t.get(a));
    found.ok_or(DecodeError::Failed("a dynamic table reference out of range"))
}

/// Static entry `index`.
fn static_entry(index: u64) -> Result<(&'static str, &'static str), DecodeError> {
    usize::try_from(index)
        .ok()
        .and_then(|i| STATIC.get(i))
        .copied()
        .ok_or(DecodeError::Failed("static table index out of range"))
}

/// Records the field just appended to `out.buf` and checks the size limit.
fn finish(out: &mut Fields, name_at: usize, value_at: usize, max_size: usize) -> Result<(), DecodeError> {
    let end = out.buf.len();
    let size = out.size + end - name_at + 32;
    if size > max_size {
        return Err(DecodeError::TooLarge);
    }
    out.size = size;
    out.spans.push((name_at as u32, value_at as u32, end as u32));
    Ok(())
}

/// Writes field sections with the static table only. Stateless (one per connection or one
/// shared: it is the same).
#[derive(Debug, Default, Clone, Copy)]
pub struct Encoder;

impl Encoder {
    /// Starts a section: Required Insert Count 0, Delta Base 0.
    pub fn begin(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[0, 0]);
    }

    /// Appends one field line. `name` may have upper-case letters (`Content-Type`): HTTP/3
    /// sends names lower-case (RFC 9114 §4.2), so they are lowered here.
    pub fn field(&self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let mut buf = [0u8; 64];
        let name = lowered(name, &mut buf);
        static_line(&name, value, table::find(&name, value), out);
    }

    /// Appends `:status` (an index when the table has the code).
    pub fn status(&self, status: u16, out: &mut Vec<u8>) {
        let digits = [b'0' + (status / 100 % 10) as u8, b'0' + (status / 10 % 10) as u8, b'0' + (status % 10) as u8];
        // A status is three digits (`http::StatusCode`: 100–999), so its value is what
        // `find_status` compares.
        let found = if (100..=999).contains(&status) {
            Some(table::find_status(status))
        } else {
            table::find(b":status", &digits)
        };
        static_line(b":status", &digits, found, out);
    }
}

/// `name` lower-case: in `buf` when it has upper-case letters and fits, else a new copy.
fn lowered<'a>(name: &'a [u8], buf: &'a mut [u8; 64]) -> std::borrow::Cow<'a, [u8]> {
    if !name.iter().any(u8::is_ascii_uppercase) {
        return std::borrow::Cow::Borrowed(name);
    }
    if let Some(lower) = buf.get_mut(..name.len()) {
        lower.copy_from_slice(name);
        lower.make_ascii_lowercase();
        return std::borrow::Cow::Borrowed(lower);
    }
    std::borrow::Cow::Owned(name.to_ascii_lowercase())
}

/// Appends the static-only field line for `name: value` (lower-case), given what the static
/// table has for it (`found`).
fn static_line(name: &[u8], value: &[u8], found: Option<table::Found>, out: &mut Vec<u8>) {
    match found {
        Some(table::Found::Exact(i)) => write_integer(i as u64, 6, 0xc0, out),
        Some(table::Found::Name(i)) => {
            write_integer(i as u64, 4, 0x50, out);
            write_string(value, 7, 0, out);
        }
        None => {
            write_string(name, 3, 0x20, out);
            write_string(value, 7, 0, out);
        }
    }
}

/// Appends a string literal with a `bits`-bit length prefix, Huffman-coded when that is
/// shorter (the Huffman flag is the bit above the prefix); `flags` are the bits above that.
fn write_string(s: &[u8], bits: u8, flags: u8, out: &mut Vec<u8>) {
    let coded = huffman::encoded_len(s);
    if coded < s.len() {
        write_integer(coded as u64, bits, flags | (1 << bits), out);
        huffman::encode(s, out);
    } else {
        write_integer(s.len() as u64, bits, flags, out);
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests;
