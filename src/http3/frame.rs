//! HTTP/3 frames (RFC 9114 §7): the reader that cuts a stream's bytes into frames and the
//! writers for the frames a server sends.
//!
//! [`FrameReader`] is incremental: it is handed the stream's unread bytes and returns one
//! [`Frame`] at a time, or `None` when it needs more. A DATA payload is never buffered: the
//! reader returns what is there of it ([`Frame::Data`]) and counts the rest. HEADERS and
//! SETTINGS payloads are whole before they are returned, so their size is bounded
//! ([`FrameReader::new`]): a HEADERS frame beyond the bound is a connection error
//! (`H3_EXCESSIVE_LOAD`) found from its length alone, before a byte of it is buffered.
//! Reserved (`0x1f * N + 0x21`) and unknown frame types are skipped; the HTTP/2 frame types
//! HTTP/3 reserves (0x02, 0x06, 0x08, 0x09) are `H3_FRAME_UNEXPECTED`.
//!
//! Which frame may come on which stream is the stream's business (`stream.rs`); this file
//! only knows the syntax. It must not touch quinn.

use super::error::{Code, H3Error};
use super::varint;

/// Frame types (RFC 9114 §11.2.1).
pub mod ty {
    /// DATA
    pub const DATA: u64 = 0x00;
    /// HEADERS
    pub const HEADERS: u64 = 0x01;
    /// CANCEL_PUSH
    pub const CANCEL_PUSH: u64 = 0x03;
    /// SETTINGS
    pub const SETTINGS: u64 = 0x04;
    /// PUSH_PROMISE
    pub const PUSH_PROMISE: u64 = 0x05;
    /// GOAWAY
    pub const GOAWAY: u64 = 0x07;
    /// MAX_PUSH_ID
    pub const MAX_PUSH_ID: u64 = 0x0d;
}

/// Setting identifiers (RFC 9114 §7.2.4.1, RFC 9204 §5, RFC 9220).
pub mod setting {
    /// QPACK dynamic table capacity the sender's decoder allows.
    pub const QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
    /// Largest field section the sender accepts (RFC 9114 size: name + value + 32 per field).
    pub const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
    /// Streams the sender's decoder lets block.
    pub const QPACK_BLOCKED_STREAMS: u64 = 0x07;
    /// Extended CONNECT (RFC 9220).
    pub const ENABLE_CONNECT_PROTOCOL: u64 = 0x08;
}

/// Longest SETTINGS, GOAWAY, CANCEL_PUSH or MAX_PUSH_ID payload accepted.
const MAX_CONTROL_PAYLOAD: u64 = 4096;

/// The peer's SETTINGS that matter to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    /// `SETTINGS_MAX_FIELD_SECTION_SIZE`; `None`: unlimited.
    pub max_field_section_size: Option<u64>,
    /// `SETTINGS_QPACK_MAX_TABLE_CAPACITY`: the dynamic table our encoder may fill.
    pub qpack_max_table_capacity: u64,
    /// `SETTINGS_QPACK_BLOCKED_STREAMS` (our encoder never blocks a stream: unused).
    pub qpack_blocked_streams: u64,
}

/// One frame, or the part of a DATA payload that has arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The next `len` input bytes are DATA payload, for the caller to take; `start` is true
    /// for a frame's first piece (an empty DATA frame is one piece of length 0).
    Data {
        /// Payload bytes at the front of the input now.
        len: usize,
        /// This is the frame's first piece.
        start: bool,
    },
    /// The next `len` input bytes are a whole HEADERS payload (an encoded field section).
    Headers {
        /// The payload length.
        len: usize,
    },
    /// SETTINGS.
    Settings(Settings),
    /// GOAWAY with its stream or push ID.
    Goaway(u64),
    /// CANCEL_PUSH.
    CancelPush(u64),
    /// MAX_PUSH_ID.
    MaxPushId(u64),
}

/// Where the reader is inside the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At a frame boundary.
    Header,
    /// Inside a DATA payload with this many bytes to go.
    Data(u64),
    /// Skipping an unknown frame's payload.
    Skip(u64),
}

/// Cuts a stream into frames. See the module doc.
#[derive(Debug)]
pub struct FrameReader {
    state: State,
    /// Largest HEADERS payload taken whole.
    max_headers: u64,
}

impl FrameReader {
    /// A reader at the start of a stream that takes HEADERS payloads of up to `max_headers`
    /// bytes.
    pub fn new(max_headers: usize) -> FrameReader {
        FrameReader { state: State::Header, max_headers: max_headers as u64 }
    }

    /// Whether the reader is at a frame boundary (a stream may end only there).
    pub fn at_boundary(&self) -> bool {
        self.state == State::Header
    }

    /// The next frame in `input` (the stream's bytes not yet consumed). Returns how many
    /// bytes the caller drops from the front of its input, and then the frame, or `None` when
    /// more bytes are needed. After [`Frame::Data`] and [`Frame::Headers`] the payload is the
    /// next `len` bytes (after the dropped ones), which the caller also consumes. Unknown and
    /// reserved frames are skipped inside (their bytes are in the count). A client's
    /// PUSH_PROMISE is an error here (RFC 9114 §7.2.5).
    pub fn next(&mut self, input: &[u8]) -> Result<(usize, Option<Frame>), H3Error> {
        let mut dropped = 0usize;
        loop {
            let rest = &input[dropped..];
            match self.state {
                State::Data(left) => {
                    if rest.is_empty() {
                        return Ok((dropped, None));
                    }
                    let len = left.min(rest.len() as u64);
                    self.state = if len == left { State::Header } else { State::Data(left - len) };
                    return Ok((dropped, Some(Frame::Data { len: len as usize, start: false })));
                }
                State::Skip(left) => {
                    let len = left.min(rest.len() as u64);
                    dropped += len as usize;
                    if len < left {
                        self.state = State::Skip(left - len);
                        return Ok((dropped, None));
                    }
                    self.state = State::Header;
                }
                State::Header => {
                    let Some((ty, a)) = varint::decode(rest) else { return Ok((dropped, None)) };
                    let Some((len, b)) = varint::decode(&rest[a..]) else { return Ok((dropped, None)) };
                    let head = a + b;
                    let available = (rest.len() - head) as u64;
                    match ty {
                        ty::DATA => {
                            let now = len.min(available);
                            self.state = if now == len { State::Header } else { State::Data(len - now) };
                            return Ok((dropped + head, Some(Frame::Data { len: now as usize, start: true })));
                        }
                        ty::HEADERS => {
                            if len > self.max_headers {
                                return Err(H3Error::conn(
                                    Code::ExcessiveLoad,
                                    "HEADERS frame beyond the field section limit",
                                ));
                            }
                            if available < len {
                                return Ok((dropped, None));
                            }
                            return Ok((dropped + head, Some(Frame::Headers { len: len as usize })));
                        }
                        0x02 | 0x06 | 0x08 | 0x09 => {
                            return Err(H3Error::conn(Code::FrameUnexpected, "an HTTP/2 frame type"));
                        }
                        ty::PUSH_PROMISE => {
                            return Err(H3Error::conn(Code::FrameUnexpected, "PUSH_PROMISE from a client"));
                        }
                        ty::SETTINGS | ty::GOAWAY | ty::CANCEL_PUSH | ty::MAX_PUSH_ID => {
                            if len > MAX_CONTROL_PAYLOAD {
                                return Err(H3Error::conn(Code::ExcessiveLoad, "control frame too long"));
                            }
                            if available < len {
                                return Ok((dropped, None));
                            }
                            let frame = control(ty, &rest[head..head + len as usize])?;
                            return Ok((dropped + head + len as usize, Some(frame)));
                        }
                        _ => {
                            dropped += head;
                            self.state = State::Skip(len);
                        }
                    }
                }
            }
        }
    }
}

/// A SETTINGS, GOAWAY, CANCEL_PUSH or MAX_PUSH_ID payload.
fn control(ty: u64, payload: &[u8]) -> Result<Frame, H3Error> {
    if ty == ty::SETTINGS {
        return settings(payload).map(Frame::Settings);
    }
    let bad = H3Error::conn(Code::FrameError, "malformed frame payload");
    let (id, used) = varint::decode(payload).ok_or(bad)?;
    if used != payload.len() {
        return Err(bad);
    }
    Ok(match ty {
        ty::GOAWAY => Frame::Goaway(id),
        ty::CANCEL_PUSH => Frame::CancelPush(id),
        _ => Frame::MaxPushId(id),
    })
}

/// A SETTINGS payload: pairs of varints; a duplicate or an HTTP/2-only identifier is
/// `H3_SETTINGS_ERROR`; unknown identifiers are ignored.
fn settings(mut payload: &[u8]) -> Result<Settings, H3Error> {
    let bad = H3Error::conn(Code::FrameError, "malformed SETTINGS");
    let mut settings = Settings::default();
    let mut seen: Vec<u64> = Vec::new();
    while !payload.is_empty() {
        let (id, a) = varint::decode(payload).ok_or(bad)?;
        let (value, b) = varint::decode(&payload[a..]).ok_or(bad)?;
        payload = &payload[a + b..];
        if seen.contains(&id) {
            return Err(H3Error::conn(Code::SettingsError, "a setting sent twice"));
        }
        if seen.len() < 64 {
            seen.push(id);
        }
        match id {
            0x02..=0x05 => return Err(H3Error::conn(Code::SettingsError, "an HTTP/2 setting")),
            setting::QPACK_MAX_TABLE_CAPACITY => settings.qpack_max_table_capacity = value,
            setting::MAX_FIELD_SECTION_SIZE => settings.max_field_section_size = Some(value),
            setting::QPACK_BLOCKED_STREAMS => settings.qpack_blocked_streams = value,
            _ => {}
        }
    }
    Ok(settings)
}

/// Appends a frame header: type and payload length.
pub fn write_header(ty: u64, len: u64, out: &mut Vec<u8>) {
    varint::encode(ty, out);
    varint::encode(len, out);
}

/// Appends a SETTINGS frame with `pairs`.
pub fn write_settings(pairs: &[(u64, u64)], out: &mut Vec<u8>) {
    let len: usize = pairs.iter().map(|&(id, v)| varint::len(id) + varint::len(v)).sum();
    write_header(ty::SETTINGS, len as u64, out);
    for &(id, v) in pairs {
        varint::encode(id, out);
        varint::encode(v, out);
    }
}

/// Appends a GOAWAY frame for stream `id`.
pub fn write_goaway(id: u64, out: &mut Vec<u8>) {
    write_header(ty::GOAWAY, varint::len(id) as u64, out);
    varint::encode(id, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every frame in `input`, fed in pieces of `step` bytes, with DATA pieces joined per
    /// frame and HEADERS payloads shown as bytes.
    fn frames(input: &[u8], step: usize) -> Result<Vec<(Frame, Vec<u8>)>, H3Error> {
        let mut reader = FrameReader::new(64);
        let (mut buf, mut fed, mut out) = (Vec::new(), 0, Vec::<(Frame, Vec<u8>)>::new());
        loop {
            let (drop, frame) = reader.next(&buf)?;
            buf.drain(..drop);
            match frame {
                None if fed == input.len() => return Ok(out),
                None => {
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
                Some(Frame::Data { len, start }) => {
                    let bytes: Vec<u8> = buf.drain(..len).collect();
                    match out.last_mut() {
                        Some((Frame::Data { len: total, .. }, joined)) if !start => {
                            *total += len;
                            joined.extend(bytes);
                        }
                        _ => out.push((Frame::Data { len, start: true }, bytes)),
                    }
                }
                Some(Frame::Headers { len }) => out.push((Frame::Headers { len }, buf.drain(..len).collect())),
                Some(other) => out.push((other, Vec::new())),
            }
        }
    }

    #[test]
    fn frames_in_any_pieces() {
        let mut input = Vec::new();
        write_settings(&[(setting::MAX_FIELD_SECTION_SIZE, 16_384), (0x21, 7)], &mut input);
        write_header(ty::HEADERS, 3, &mut input);
        input.extend_from_slice(&[0, 0, 0xd1]);
        write_header(0x21 + 0x1f * 3, 5, &mut input); // reserved: skipped
        input.extend_from_slice(b"grease");
        input.pop();
        write_header(ty::DATA, 11, &mut input);
        input.extend_from_slice(b"hello world");
        write_header(ty::DATA, 0, &mut input);
        write_goaway(8, &mut input);
        let settings = Settings { max_field_section_size: Some(16_384), ..Settings::default() };
        let want = vec![
            (Frame::Settings(settings), vec![]),
            (Frame::Headers { len: 3 }, vec![0, 0, 0xd1]),
            (Frame::Data { len: 11, start: true }, b"hello world".to_vec()),
            (Frame::Data { len: 0, start: true }, vec![]),
            (Frame::Goaway(8), vec![]),
        ];
        for step in [1, 2, 3, 7, input.len()] {
            assert_eq!(frames(&input, step), Ok(want.clone()), "step {step}");
        }
    }

    fn error_of(input: &[u8]) -> Option<Code> {
        frames(input, 1).err().map(|e| {
            assert!(e.is_connection(), "{e}");
            e.code()
        })
    }

    #[test]
    fn malformed_and_forbidden_frames() {
        // HTTP/2 frame types reserved by HTTP/3, and a client's PUSH_PROMISE.
        for t in [0x02u8, 0x06, 0x08, 0x09, 0x05] {
            assert_eq!(error_of(&[t, 0]), Some(Code::FrameUnexpected), "type {t:#x}");
        }
        // A HEADERS frame beyond the limit fails from its header alone.
        assert_eq!(error_of(&[0x01, 0x40, 65]), Some(Code::ExcessiveLoad));
        assert_eq!(error_of(&[0x04, 0x50, 0x01]), Some(Code::ExcessiveLoad), "4097-byte SETTINGS");
        // SETTINGS: a duplicate, an HTTP/2 setting, a truncated pair.
        assert_eq!(error_of(&[0x04, 4, 0x06, 1, 0x06, 2]), Some(Code::SettingsError));
        assert_eq!(error_of(&[0x04, 2, 0x03, 1]), Some(Code::SettingsError));
        assert_eq!(error_of(&[0x04, 1, 0x06]), Some(Code::FrameError));
        // GOAWAY with trailing bytes, or none.
        assert_eq!(error_of(&[0x07, 2, 4, 4]), Some(Code::FrameError));
        assert_eq!(error_of(&[0x07, 0]), Some(Code::FrameError));
        // Truncated input is not an error: more is needed.
        assert_eq!(frames(&[0x01, 0x05, 1, 2], 1), Ok(vec![]));
        assert!(FrameReader::new(10).at_boundary());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        for _ in 0..2000 {
            let len = (seed % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = frames(&bytes, 1 + (seed % 5) as usize);
        }
    }
}
