//! HPACK (RFC 7541), socket-free: the field compression of HTTP/2 header blocks.
//!
//! [`Decoder`] turns a complete header block (HEADERS plus its CONTINUATIONs, already joined)
//! into fields handed to a callback, keeping the dynamic table of the peer's encoder, bounded
//! by the table size forkd advertises (`SETTINGS_HEADER_TABLE_SIZE`) and by a header list size
//! limit. [`Encoder`] writes response field blocks: fields a connection repeats (the fixed
//! security head, `server`, `content-type`...) are inserted into the peer's dynamic table once
//! and sent as one-byte indices after that; fields that change on every response (`date`,
//! `x-request-id`, `content-length`...) are literals (`date` enters the table for its second;
//! the first `x-request-id` enters it so that later ones name it by index); credentials
//! (`set-cookie`, `authorization`...) are never-indexed literals (RFC 7541 §7.1.3), so no
//! intermediary may index them either. [`huffman`] is the one Huffman table forkd has; QPACK
//! reuses it.
//!
//! This module knows bytes and tables only: no frames, no streams, no HTTP semantics
//! (pseudo-header rules are `super::request`'s).

mod decoder;
mod encoder;
pub mod huffman;
mod table;
#[cfg(test)]
mod tests;

pub use decoder::Decoder;
pub use encoder::{Encoder, Part};

/// Why a header block cannot be decoded. Every variant but [`HpackError::ListTooLarge`] is a
/// connection error of type `COMPRESSION_ERROR` (RFC 9113 §4.3): the decoder's table may no
/// longer match the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HpackError {
    /// The block ends inside an integer, a string or a representation.
    Truncated,
    /// An integer larger than any table, string or size forkd accepts.
    IntegerOverflow,
    /// Index 0, or an index past the static and dynamic tables.
    BadIndex,
    /// A Huffman string with EOS inside, or bad padding (RFC 7541 §5.2).
    BadHuffman,
    /// A dynamic table size update above the size forkd advertised, or one that does not
    /// open the block (RFC 7541 §4.2, §6.3).
    BadSizeUpdate,
    /// The decoded fields exceed the header list size limit (name + value + 32 each, RFC
    /// 9113 §6.5.2). The whole block was still decoded, so the table stays in step with the
    /// peer's: a stream error, not a connection error.
    ListTooLarge,
}

impl std::fmt::Display for HpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HpackError::Truncated => "HPACK: truncated header block",
            HpackError::IntegerOverflow => "HPACK: integer overflow",
            HpackError::BadIndex => "HPACK: bad table index",
            HpackError::BadHuffman => "HPACK: bad Huffman string",
            HpackError::BadSizeUpdate => "HPACK: bad dynamic table size update",
            HpackError::ListTooLarge => "HPACK: header list too large",
        })
    }
}

impl std::error::Error for HpackError {}

/// The largest integer a decoder accepts: far above any table size or string length forkd
/// allows, far below `usize` overflow.
const MAX_INT: usize = 1 << 28;

/// Every entry costs its name, its value and 32 bytes of overhead (RFC 7541 §4.1).
pub(crate) const fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// Appends `value` as an integer with an `n`-bit prefix (RFC 7541 §5.1); `flags` are the
/// first byte's bits above the prefix.
pub fn put_int(out: &mut Vec<u8>, flags: u8, n: u8, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// The integer with an `n`-bit prefix at the start of `input`: its value and its length.
pub fn get_int(input: &[u8], n: u8) -> Result<(usize, usize), HpackError> {
    let max = (1usize << n) - 1;
    let first = usize::from(*input.first().ok_or(HpackError::Truncated)?) & max;
    if first < max {
        return Ok((first, 1));
    }
    let mut value = max;
    let mut shift = 0u32;
    for (i, &b) in input.iter().enumerate().skip(1) {
        value += usize::from(b & 0x7f) << shift;
        if value > MAX_INT {
            return Err(HpackError::IntegerOverflow);
        }
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
        shift += 7;
        if shift > 28 {
            return Err(HpackError::IntegerOverflow);
        }
    }
    Err(HpackError::Truncated)
}

/// Appends a string literal (RFC 7541 §5.2), Huffman-coded when that is shorter.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    let coded = huffman::encoded_len(s);
    if coded < s.len() {
        put_int(out, 0x80, 7, coded);
        huffman::encode(s, out);
    } else {
        put_int(out, 0, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// The string literal at the start of `input`, decoded into `out` (cleared first); returns
/// the length it took in `input`.
pub fn get_str(input: &[u8], out: &mut Vec<u8>) -> Result<usize, HpackError> {
    let huff = input.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let (len, n) = get_int(input, 7)?;
    let end = n.checked_add(len).ok_or(HpackError::IntegerOverflow)?;
    let raw = input.get(n..end).ok_or(HpackError::Truncated)?;
    out.clear();
    if huff {
        huffman::decode(raw, out).map_err(|_| HpackError::BadHuffman)?;
    } else {
        out.extend_from_slice(raw);
    }
    Ok(end)
}

/// The static table (RFC 7541 Appendix A); entry `i` has index `i + 1`.
pub const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The static index of `name`'s first entry, if the static table has the name.
pub(crate) fn static_name(name: &[u8]) -> Option<usize> {
    // A match on the bytes compiles to a switch on the length, then a few compares: the
    // encoder asks this for every literal it writes.
    Some(match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => return None,
    })
}

/// The static index of the entry `name: value`, if the static table has the field itself.
pub(crate) fn static_field(name: &[u8], value: &[u8]) -> Option<usize> {
    // Only these names have entries with values; the encoder asks this for every field.
    Some(match name {
        b":method" => match value {
            b"GET" => 2,
            b"POST" => 3,
            _ => return None,
        },
        b":path" => match value {
            b"/" => 4,
            b"/index.html" => 5,
            _ => return None,
        },
        b":scheme" => match value {
            b"http" => 6,
            b"https" => 7,
            _ => return None,
        },
        b":status" => match value {
            b"200" => 8,
            b"204" => 9,
            b"206" => 10,
            b"304" => 11,
            b"400" => 12,
            b"404" => 13,
            b"500" => 14,
            _ => return None,
        },
        b"accept-encoding" => match value {
            b"gzip, deflate" => 16,
            _ => return None,
        },
        _ => return None,
    })
}
