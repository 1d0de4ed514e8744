//! RESP2, the Redis wire protocol, socket-free: commands out (arrays of bulk
//! strings), replies in (simple strings, errors, integers, bulk strings,
//! arrays), decoded incrementally from whatever bytes have arrived.
//!
//! "Need more bytes" is a value (`Ok(None)`), never an error; anything a
//! server could send that does not fit the limits below is a typed
//! [`RespError`] (the connection is then dropped and made again), never a
//! panic and never an allocation sized by the peer beyond [`MAX_BULK`]. It
//! must not touch a socket.

use std::fmt;

/// The largest bulk string accepted (a bus message plus its envelope fits many times).
pub const MAX_BULK: usize = 1 << 20;
/// The most elements one array may announce.
pub const MAX_ARRAY: usize = 1024;
/// How deeply arrays may nest (pub/sub pushes are two levels deep at most).
pub const MAX_DEPTH: usize = 4;
/// The longest line (`+…`, `-…`, `:…`, a length) before its CRLF.
pub const MAX_LINE: usize = 4096;

/// One decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+OK`.
    Simple(String),
    /// `-ERR …`: the server refused the command.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$n` … (`None`: the null bulk string `$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*n` … (`None`: the null array `*-1`).
    Array(Option<Vec<Value>>),
}

/// Why bytes from the server are not a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RespError {
    /// A type byte RESP2 does not have.
    BadType(u8),
    /// A length or integer that is not a number in range.
    BadNumber,
    /// A line longer than [`MAX_LINE`].
    LineTooLong,
    /// A bulk string longer than [`MAX_BULK`].
    BulkTooLong(i64),
    /// An array longer than [`MAX_ARRAY`].
    ArrayTooLong(i64),
    /// Arrays nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A bulk string not followed by CRLF.
    MissingCrlf,
}

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespError::BadType(b) => write!(f, "unknown reply type byte 0x{b:02x}"),
            RespError::BadNumber => f.write_str("malformed number"),
            RespError::LineTooLong => write!(f, "line longer than {MAX_LINE} bytes"),
            RespError::BulkTooLong(n) => write!(f, "bulk string of {n} bytes (limit {MAX_BULK})"),
            RespError::ArrayTooLong(n) => write!(f, "array of {n} elements (limit {MAX_ARRAY})"),
            RespError::TooDeep => write!(f, "arrays nested deeper than {MAX_DEPTH}"),
            RespError::MissingCrlf => f.write_str("bulk string not ended by CRLF"),
        }
    }
}

impl std::error::Error for RespError {}

/// Append a command (an array of bulk strings) to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_decimal(out, args.len() as i64);
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        push_decimal(out, a.len() as i64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(n.to_string().as_bytes());
}

/// Decode one reply from the front of `buf`: `Ok(Some((value, used)))`,
/// `Ok(None)` when the reply is not complete yet.
pub fn decode(buf: &[u8]) -> Result<Option<(Value, usize)>, RespError> {
    let mut pos = 0;
    match value(buf, &mut pos, 0)? {
        Some(v) => Ok(Some((v, pos))),
        None => Ok(None),
    }
}

fn value(buf: &[u8], pos: &mut usize, depth: usize) -> Result<Option<Value>, RespError> {
    let Some(&kind) = buf.get(*pos) else { return Ok(None) };
    let Some(line) = line(buf, *pos + 1)? else { return Ok(None) };
    let after = *pos + 1 + line.len() + 2;
    let v = match kind {
        b'+' => Value::Simple(String::from_utf8_lossy(line).into_owned()),
        b'-' => Value::Error(String::from_utf8_lossy(line).into_owned()),
        b':' => Value::Int(number(line)?),
        b'$' => {
            let n = number(line)?;
            if n < 0 {
                *pos = after;
                return Ok(Some(Value::Bulk(None)));
            }
            if n as u64 > MAX_BULK as u64 {
                return Err(RespError::BulkTooLong(n));
            }
            let n = n as usize;
            if buf.len() < after + n + 2 {
                return Ok(None);
            }
            if &buf[after + n..after + n + 2] != b"\r\n" {
                return Err(RespError::MissingCrlf);
            }
            *pos = after + n + 2;
            return Ok(Some(Value::Bulk(Some(buf[after..after + n].to_vec()))));
        }
        b'*' => {
            let n = number(line)?;
            if n < 0 {
                *pos = after;
                return Ok(Some(Value::Array(None)));
            }
            if n as u64 > MAX_ARRAY as u64 {
                return Err(RespError::ArrayTooLong(n));
            }
            if depth >= MAX_DEPTH {
                return Err(RespError::TooDeep);
            }
            let mut at = after;
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                match value(buf, &mut at, depth + 1)? {
                    Some(v) => items.push(v),
                    None => return Ok(None),
                }
            }
            *pos = at;
            return Ok(Some(Value::Array(Some(items))));
        }
        other => return Err(RespError::BadType(other)),
    };
    *pos = after;
    Ok(Some(v))
}

/// The bytes from `start` to the next CRLF (not included), if it has arrived.
fn line(buf: &[u8], start: usize) -> Result<Option<&[u8]>, RespError> {
    let rest = buf.get(start..).unwrap_or(&[]);
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some(&rest[..i])),
        None if rest.len() >= MAX_LINE + 2 => Err(RespError::LineTooLong),
        None => Ok(None),
    }
}

fn number(line: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(line).ok().and_then(|s| s.parse::<i64>().ok()).ok_or(RespError::BadNumber)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Value {
        let (v, used) = decode(bytes).expect("valid").expect("complete");
        assert_eq!(used, bytes.len(), "the whole reply is used");
        v
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b"a\r\nb"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n");
        encode(&mut out, &[]);
        assert!(out.ends_with(b"*0\r\n"));
    }

    #[test]
    fn every_reply_type_decodes() {
        assert_eq!(one(b"+OK\r\n"), Value::Simple("OK".into()));
        assert_eq!(one(b"-ERR wrong\r\n"), Value::Error("ERR wrong".into()));
        assert_eq!(one(b":-12\r\n"), Value::Int(-12));
        assert_eq!(one(b"$5\r\nhe\r\nl\r\n"), Value::Bulk(Some(b"he\r\nl".to_vec())));
        assert_eq!(one(b"$0\r\n\r\n"), Value::Bulk(Some(Vec::new())));
        assert_eq!(one(b"$-1\r\n"), Value::Bulk(None));
        assert_eq!(one(b"*-1\r\n"), Value::Array(None));
        assert_eq!(
            one(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\n\x00\xff\x01\r\n"),
            Value::Array(Some(vec![
                Value::Bulk(Some(b"message".to_vec())),
                Value::Bulk(Some(b"ch".to_vec())),
                Value::Bulk(Some(vec![0, 0xff, 1])),
            ]))
        );
    }

    #[test]
    fn a_reply_cut_anywhere_needs_more_and_two_replies_decode_one_by_one() {
        let bytes = b"*2\r\n:1\r\n$3\r\nabc\r\n+PONG\r\n";
        let first = bytes.len() - 7;
        for cut in 0..first {
            assert_eq!(decode(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
        let (v, used) = decode(bytes).expect("valid").expect("complete");
        assert_eq!(used, first);
        assert_eq!(v, Value::Array(Some(vec![Value::Int(1), Value::Bulk(Some(b"abc".to_vec()))])));
        assert_eq!(one(&bytes[used..]), Value::Simple("PONG".into()));
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic_or_a_huge_allocation() {
        assert_eq!(decode(b"?x\r\n"), Err(RespError::BadType(b'?')));
        assert_eq!(decode(b":12a\r\n"), Err(RespError::BadNumber));
        assert_eq!(decode(b":99999999999999999999\r\n"), Err(RespError::BadNumber));
        assert_eq!(decode(b"$99999999999\r\n"), Err(RespError::BulkTooLong(99_999_999_999)));
        assert_eq!(decode(b"*9223372036854775807\r\n"), Err(RespError::ArrayTooLong(i64::MAX)));
        assert_eq!(decode(b"$3\r\nabcXY"), Err(RespError::MissingCrlf));
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert_eq!(decode(&deep), Err(RespError::TooDeep));
        let long = vec![b'+'; MAX_LINE + 10];
        assert_eq!(decode(&long), Err(RespError::LineTooLong));
        // Announced but not yet sent: wait, do not reserve what was announced.
        assert_eq!(decode(b"$1048576\r\nabc"), Ok(None));
        assert_eq!(decode(b"*1024\r\n:1\r\n"), Ok(None));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let len = (x % 40) as usize;
            let mut buf = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(b"+-:$*\r\n0123-9ab"[(x % 15) as usize]);
            }
            let _ = decode(&buf);
        }
    }
}
