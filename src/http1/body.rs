//! Incremental decoder for `Transfer-Encoding: chunked` request bodies.
//!
//! Fed whatever bytes have arrived, it appends the decoded data to an output
//! buffer and reports how much input it consumed. It enforces the body limit
//! as the body grows (413 as soon as it is exceeded) and rejects malformed
//! framing (400). It is strict: CRLF line ends only, at most 16 hex digits.

use crate::error::Error;

/// Longest chunk-extension or trailer line accepted.
const MAX_LINE: usize = 4096;
/// Total trailer bytes accepted.
const MAX_TRAILERS: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Size { digits: u8 },
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf { empty: bool },
    Done,
}

/// Decoder state for one chunked body.
#[derive(Debug)]
pub struct Chunked {
    state: State,
    size: u64,
    line: usize,
    trailers: usize,
    total: u64,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked { state: State::Size { digits: 0 }, size: 0, line: 0, trailers: 0, total: 0 }
    }
}

impl Chunked {
    /// Decode from `input` into `out`; returns (bytes consumed, body complete).
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>, limit: u64) -> Result<(usize, bool), Error> {
        let bad = || Error::bad_request("malformed chunked body");
        let mut i = 0;
        while i < input.len() {
            let c = input[i];
            match self.state {
                State::Size { digits } => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if digits == 16 {
                            return Err(bad());
                        }
                        let v = (c as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = (self.size << 4) | v;
                        self.state = State::Size { digits: digits + 1 };
                    }
                    b';' if digits > 0 => {
                        self.line = 0;
                        self.state = State::Ext;
                    }
                    b'\r' if digits > 0 => self.state = State::SizeLf,
                    _ => return Err(bad()),
                },
                State::Ext => {
                    self.line += 1;
                    if self.line > MAX_LINE {
                        return Err(bad());
                    }
                    if c == b'\r' {
                        self.state = State::SizeLf;
                    } else if c == b'\n' {
                        return Err(bad());
                    }
                }
                State::SizeLf => {
                    if c != b'\n' {
                        return Err(bad());
                    }
                    if self.size == 0 {
                        self.state = State::TrailerStart;
                    } else {
                        self.total = self.total.saturating_add(self.size);
                        if self.total > limit {
                            return Err(Error::PayloadTooLarge);
                        }
                        self.state = State::Data;
                    }
                }
                State::Data => {
                    let take = (self.size as usize).min(input.len() - i);
                    out.extend_from_slice(&input[i..i + take]);
                    self.size -= take as u64;
                    i += take;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                State::DataCr => {
                    if c != b'\r' {
                        return Err(bad());
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if c != b'\n' {
                        return Err(bad());
                    }
                    self.state = State::Size { digits: 0 };
                }
                State::TrailerStart | State::TrailerLine => {
                    self.trailers += 1;
                    if self.trailers > MAX_TRAILERS {
                        return Err(Error::HeaderTooLarge);
                    }
                    if c == b'\r' {
                        self.state = State::TrailerLf { empty: self.state == State::TrailerStart };
                    } else if c == b'\n' {
                        return Err(bad());
                    } else {
                        self.state = State::TrailerLine;
                    }
                }
                State::TrailerLf { empty } => {
                    if c != b'\n' {
                        return Err(bad());
                    }
                    if empty {
                        self.state = State::Done;
                        return Ok((i + 1, true));
                    }
                    self.state = State::TrailerStart;
                }
                State::Done => return Ok((i, true)),
            }
            i += 1;
        }
        Ok((i, self.state == State::Done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(parts: &[&[u8]], limit: u64) -> Result<(Vec<u8>, usize), Error> {
        let mut d = Chunked::default();
        let mut out = Vec::new();
        let mut consumed = 0;
        for p in parts {
            let (n, done) = d.decode(p, &mut out, limit)?;
            consumed += n;
            if done {
                return Ok((out, consumed));
            }
        }
        Err(Error::bad_request("incomplete"))
    }

    #[test]
    fn decodes_with_extensions_and_trailers() {
        let raw: &[u8] = b"4;x=y\r\nWiki\r\n5\r\npedia\r\n0\r\nX-T: 1\r\n\r\nGET";
        let (out, n) = decode_all(&[raw], 100).expect("ok");
        assert_eq!(out, b"Wikipedia");
        assert_eq!(&raw[n..], b"GET");
    }

    #[test]
    fn byte_by_byte() {
        let raw: &[u8] = b"A\r\n0123456789\r\n0\r\n\r\n";
        let parts: Vec<&[u8]> = raw.chunks(1).collect();
        assert_eq!(decode_all(&parts, 100).expect("ok").0, b"0123456789");
    }

    #[test]
    fn limit_and_malformed() {
        assert_eq!(decode_all(&[b"B\r\n"], 10).err().map(|e| e.status()), Some(413));
        for bad in [&b"zz\r\n"[..], b"\r\n", b"4\nabcd", b"4\r\nabcdX", b"11111111111111111\r\n"] {
            assert_eq!(decode_all(&[bad], 100).err().map(|e| e.status()), Some(400), "{bad:?}");
        }
    }
}
