//! HTTP/2 frames (RFC 9113 §4, §6) from and to byte slices: [`parse`] reads one frame off the
//! front of a buffer and checks what a frame alone can break (lengths, stream ids, padding,
//! SETTINGS values); the `put_*` functions append frames a server sends.
//!
//! This module owns the wire format only. What a frame means for a stream or a window, and
//! which frames may follow which, belongs to the connection state machine; header blocks are
//! `super::hpack`'s; the frame-header walkers that count frames for the defences read
//! `super::frame`'s constants.

/// An error code (RFC 9113 §7), as RST_STREAM and GOAWAY carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    /// Graceful shutdown, or no error.
    pub const NO_ERROR: Reason = Reason(0x0);
    /// A protocol error not covered by a more specific code.
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    /// An unexpected internal error.
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    /// A flow-control limit was broken.
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    /// SETTINGS were not acknowledged in time.
    pub const SETTINGS_TIMEOUT: Reason = Reason(0x4);
    /// A frame arrived after the stream was half-closed.
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    /// A frame had an invalid size.
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    /// The stream was refused before any processing.
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    /// The stream is no longer needed.
    pub const CANCEL: Reason = Reason(0x8);
    /// The header compression context cannot be kept.
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    /// A CONNECT tunnel's connection failed.
    pub const CONNECT_ERROR: Reason = Reason(0xa);
    /// The peer generates excessive load.
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
    /// The transport does not meet minimum security requirements.
    pub const INADEQUATE_SECURITY: Reason = Reason(0xc);
    /// The request must be retried over HTTP/1.1.
    pub const HTTP_1_1_REQUIRED: Reason = Reason(0xd);
}

impl From<Reason> for u32 {
    fn from(r: Reason) -> u32 {
        r.0
    }
}

/// The frame header's length (RFC 9113 §4.1).
pub const HEADER_LEN: usize = 9;
/// The smallest (and default) SETTINGS_MAX_FRAME_SIZE (RFC 9113 §6.5.2).
pub const MIN_MAX_FRAME: usize = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE.
pub const MAX_MAX_FRAME: usize = (1 << 24) - 1;
/// The largest flow-control window (RFC 9113 §6.9.1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Frame types (RFC 9113 §6).
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// PRIORITY.
    pub const PRIORITY: u8 = 0x2;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    /// END_STREAM.
    pub const END_STREAM: u8 = 0x1;
    /// ACK.
    pub const ACK: u8 = 0x1;
    /// END_HEADERS.
    pub const END_HEADERS: u8 = 0x4;
    /// PADDED.
    pub const PADDED: u8 = 0x8;
    /// PRIORITY.
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers (RFC 9113 §6.5.2, RFC 8441 §3).
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441).
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
}

/// One frame read off a buffer; payloads borrow from it. `stream` is the stream id, with the
/// reserved bit cleared; `end_stream`, `end_headers` and `ack` are the frame's flags.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// DATA, padding removed.
    Data {
        /// The stream.
        stream: u32,
        /// END_STREAM.
        end_stream: bool,
        /// The data, without padding.
        data: &'a [u8],
        /// The whole payload, padding included: what flow control counts (RFC 9113 §6.1).
        flow_len: usize,
    },
    /// HEADERS, padding and priority fields removed.
    Headers {
        /// The stream.
        stream: u32,
        /// END_STREAM.
        end_stream: bool,
        /// END_HEADERS: no CONTINUATION follows.
        end_headers: bool,
        /// The header block fragment.
        block: &'a [u8],
    },
    /// PRIORITY: deprecated (RFC 9113 §5.3.2), read to be ignored.
    Priority {
        /// The stream.
        stream: u32,
    },
    /// RST_STREAM.
    RstStream {
        /// The stream.
        stream: u32,
        /// Why.
        reason: Reason,
    },
    /// SETTINGS (not an ACK): the values, already checked.
    Settings(Settings<'a>),
    /// A SETTINGS acknowledgement.
    SettingsAck,
    /// PING.
    Ping {
        /// The ACK flag.
        ack: bool,
        /// The opaque data an acknowledgement echoes.
        data: [u8; 8],
    },
    /// GOAWAY.
    GoAway {
        /// The last stream the peer processed.
        last_stream: u32,
        /// Why.
        reason: Reason,
        /// Additional debug data.
        debug: &'a [u8],
    },
    /// WINDOW_UPDATE; an increment of 0 is for the caller to refuse (a stream error on a
    /// stream, a connection error on stream 0).
    WindowUpdate {
        /// The stream, 0 for the connection.
        stream: u32,
        /// The increment, reserved bit cleared.
        increment: u32,
    },
    /// CONTINUATION.
    Continuation {
        /// The stream.
        stream: u32,
        /// END_HEADERS: the block ends here.
        end_headers: bool,
        /// The header block fragment.
        block: &'a [u8],
    },
    /// A frame of an unknown type, to be ignored (RFC 9113 §4.1).
    Unknown,
}

/// A SETTINGS frame's checked payload: its `(identifier, value)` pairs in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings<'a>(&'a [u8]);

impl<'a> Settings<'a> {
    /// The pairs in the order sent (a later value for an identifier overrides an earlier one).
    pub fn iter(&self) -> impl Iterator<Item = (u16, u32)> + 'a {
        self.0.chunks_exact(6).map(|c| (u16::from_be_bytes([c[0], c[1]]), u32::from_be_bytes([c[2], c[3], c[4], c[5]])))
    }
}

/// A frame that breaks RFC 9113 on its own: a connection error with this code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameError(pub Reason);

/// Reads the frame at the front of `buf`, whose payload may be at most `max_frame` bytes
/// (forkd's SETTINGS_MAX_FRAME_SIZE). `Ok(None)`: not all of it is here yet. Otherwise the
/// frame and the bytes it took.
pub fn parse(buf: &[u8], max_frame: usize) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(head) = buf.get(..HEADER_LEN) else { return Ok(None) };
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    if len > max_frame {
        return Err(FrameError(Reason::FRAME_SIZE_ERROR));
    }
    let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN + len) else { return Ok(None) };
    let (kind, flags) = (head[3], head[4]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & MAX_WINDOW;
    let frame = frame(kind, flags, stream, payload)?;
    Ok(Some((frame, HEADER_LEN + len)))
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<Frame<'_>, FrameError> {
    let protocol = Err(FrameError(Reason::PROTOCOL_ERROR));
    let size = Err(FrameError(Reason::FRAME_SIZE_ERROR));
    let on_stream = stream != 0;
    match kind {
        kind::DATA => {
            if !on_stream {
                return protocol;
            }
            let data = unpad(flags, payload)?;
            Ok(Frame::Data { stream, end_stream: flags & flag::END_STREAM != 0, data, flow_len: payload.len() })
        }
        kind::HEADERS => {
            if !on_stream {
                return protocol;
            }
            let mut block = unpad(flags, payload)?;
            if flags & flag::PRIORITY != 0 {
                block = block.get(5..).ok_or(FrameError(Reason::FRAME_SIZE_ERROR))?;
            }
            Ok(Frame::Headers {
                stream,
                end_stream: flags & flag::END_STREAM != 0,
                end_headers: flags & flag::END_HEADERS != 0,
                block,
            })
        }
        kind::PRIORITY => match (on_stream, payload.len()) {
            (false, _) => protocol,
            (true, 5) => Ok(Frame::Priority { stream }),
            _ => size,
        },
        kind::RST_STREAM => match (on_stream, <[u8; 4]>::try_from(payload)) {
            (false, _) => protocol,
            (true, Ok(code)) => Ok(Frame::RstStream { stream, reason: Reason(u32::from_be_bytes(code)) }),
            _ => size,
        },
        kind::SETTINGS => {
            if on_stream {
                return protocol;
            }
            if flags & flag::ACK != 0 {
                return if payload.is_empty() { Ok(Frame::SettingsAck) } else { size };
            }
            if payload.len() % 6 != 0 {
                return size;
            }
            let settings = Settings(payload);
            for (id, value) in settings.iter() {
                match id {
                    setting::ENABLE_PUSH | setting::ENABLE_CONNECT_PROTOCOL if value > 1 => return protocol,
                    setting::INITIAL_WINDOW_SIZE if value > MAX_WINDOW => {
                        return Err(FrameError(Reason::FLOW_CONTROL_ERROR))
                    }
                    setting::MAX_FRAME_SIZE if !(MIN_MAX_FRAME..=MAX_MAX_FRAME).contains(&(value as usize)) => {
                        return protocol
                    }
                    _ => {}
                }
            }
            Ok(Frame::Settings(settings))
        }
        kind::PUSH_PROMISE => protocol,
        kind::PING => match (on_stream, <[u8; 8]>::try_from(payload)) {
            (true, _) => protocol,
            (false, Ok(data)) => Ok(Frame::Ping { ack: flags & flag::ACK != 0, data }),
            _ => size,
        },
        kind::GOAWAY => {
            if on_stream {
                return protocol;
            }
            if payload.len() < 8 {
                return size;
            }
            let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & MAX_WINDOW;
            let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
            Ok(Frame::GoAway { last_stream: last, reason: Reason(code), debug: &payload[8..] })
        }
        kind::WINDOW_UPDATE => match <[u8; 4]>::try_from(payload) {
            Ok(inc) => Ok(Frame::WindowUpdate { stream, increment: u32::from_be_bytes(inc) & MAX_WINDOW }),
            Err(_) => size,
        },
        kind::CONTINUATION => {
            if !on_stream {
                return protocol;
            }
            Ok(Frame::Continuation { stream, end_headers: flags & flag::END_HEADERS != 0, block: payload })
        }
        _ => Ok(Frame::Unknown),
    }
}

/// A DATA or HEADERS payload without its padding (RFC 9113 §6.1): padding as long as the
/// payload or longer is a PROTOCOL_ERROR.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], FrameError> {
    if flags & flag::PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload.split_first().ok_or(FrameError(Reason::FRAME_SIZE_ERROR))?;
    let keep = rest.len().checked_sub(usize::from(pad)).ok_or(FrameError(Reason::PROTOCOL_ERROR))?;
    Ok(&rest[..keep])
}

/// Appends a frame header.
fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = len as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & MAX_WINDOW).to_be_bytes());
}

/// Appends a SETTINGS frame with `pairs`.
pub fn put_settings(out: &mut Vec<u8>, pairs: &[(u16, u32)]) {
    put_head(out, pairs.len() * 6, kind::SETTINGS, 0, 0);
    for (id, value) in pairs {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn put_settings_ack(out: &mut Vec<u8>) {
    put_head(out, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends the PING acknowledgement of `data`.
pub fn put_ping_ack(out: &mut Vec<u8>, data: [u8; 8]) {
    put_head(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(&data);
}

/// Appends a PING (not an acknowledgement) carrying `data`.
pub fn put_ping(out: &mut Vec<u8>, data: [u8; 8]) {
    put_head(out, 8, kind::PING, 0, 0);
    out.extend_from_slice(&data);
}

/// Appends a WINDOW_UPDATE (`stream` 0: the connection's window).
pub fn put_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    put_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & MAX_WINDOW).to_be_bytes());
}

/// Appends a RST_STREAM.
pub fn put_rst_stream(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    put_head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Appends a GOAWAY naming the last stream processed.
pub fn put_goaway(out: &mut Vec<u8>, last_stream: u32, reason: Reason, debug: &[u8]) {
    put_head(out, 8 + debug.len(), kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & MAX_WINDOW).to_be_bytes());
    out.extend_from_slice(&reason.0.to_be_bytes());
    out.extend_from_slice(debug);
}

/// Appends one DATA frame; `data` must fit the peer's SETTINGS_MAX_FRAME_SIZE.
pub fn put_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end_stream: bool) {
    put_head(out, data.len(), kind::DATA, if end_stream { flag::END_STREAM } else { 0 }, stream);
    out.extend_from_slice(data);
}

/// Appends a header block as HEADERS plus as many CONTINUATIONs as `max_frame` (the peer's
/// SETTINGS_MAX_FRAME_SIZE) requires.
pub fn put_headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool, max_frame: usize) {
    let max_frame = max_frame.clamp(MIN_MAX_FRAME, MAX_MAX_FRAME);
    let mut chunks = block.chunks(max_frame).peekable();
    let first = chunks.next().unwrap_or_default();
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= flag::END_HEADERS;
    }
    put_head(out, first.len(), kind::HEADERS, flags, stream);
    out.extend_from_slice(first);
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() { flag::END_HEADERS } else { 0 };
        put_head(out, chunk.len(), kind::CONTINUATION, flags, stream);
        out.extend_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_head(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    fn one(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
        match parse(bytes, MIN_MAX_FRAME)? {
            Some((frame, used)) => {
                assert_eq!(used, bytes.len());
                Ok(frame)
            }
            None => panic!("incomplete: {bytes:02x?}"),
        }
    }

    #[test]
    fn incomplete_frames_wait_for_more() {
        let bytes = raw(kind::PING, 0, 0, &[7; 8]);
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut], MIN_MAX_FRAME), Ok(None), "cut at {cut}");
        }
        assert_eq!(one(&bytes), Ok(Frame::Ping { ack: false, data: [7; 8] }));
    }

    #[test]
    fn padding_is_removed_and_counted_for_flow_control() {
        let bytes = raw(kind::DATA, flag::PADDED | flag::END_STREAM, 1, b"\x03abcPPP");
        assert_eq!(one(&bytes), Ok(Frame::Data { stream: 1, end_stream: true, data: b"abc", flow_len: 7 }));
        let mut payload = vec![2];
        payload.extend_from_slice(&[0x80, 0, 0, 3, 16]);
        payload.extend_from_slice(b"\x82\x84PP");
        let bytes = raw(kind::HEADERS, flag::PADDED | flag::PRIORITY | flag::END_HEADERS, 3, &payload);
        assert_eq!(
            one(&bytes),
            Ok(Frame::Headers { stream: 3, end_stream: false, end_headers: true, block: b"\x82\x84" })
        );
        let bytes = raw(kind::DATA, flag::PADDED, 1, b"\x07abc");
        assert_eq!(one(&bytes), Err(FrameError(Reason::PROTOCOL_ERROR)), "padding past the payload");
    }

    #[test]
    fn frames_break_the_rules_alone() {
        let cases: [(&str, Vec<u8>, Reason); 13] = [
            ("DATA on stream 0", raw(kind::DATA, 0, 0, b"x"), Reason::PROTOCOL_ERROR),
            ("HEADERS on stream 0", raw(kind::HEADERS, 4, 0, b"\x82"), Reason::PROTOCOL_ERROR),
            ("SETTINGS on a stream", raw(kind::SETTINGS, 0, 1, b""), Reason::PROTOCOL_ERROR),
            ("SETTINGS of 5 bytes", raw(kind::SETTINGS, 0, 0, &[0; 5]), Reason::FRAME_SIZE_ERROR),
            ("SETTINGS ACK with a payload", raw(kind::SETTINGS, 1, 0, &[0; 6]), Reason::FRAME_SIZE_ERROR),
            ("ENABLE_PUSH 2", raw(kind::SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 2]), Reason::PROTOCOL_ERROR),
            ("window 2^31", raw(kind::SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0]), Reason::FLOW_CONTROL_ERROR),
            ("MAX_FRAME_SIZE too small", raw(kind::SETTINGS, 0, 0, &[0, 5, 0, 0, 0x3f, 0xff]), Reason::PROTOCOL_ERROR),
            ("PING of 7 bytes", raw(kind::PING, 0, 0, &[0; 7]), Reason::FRAME_SIZE_ERROR),
            ("PING on a stream", raw(kind::PING, 0, 1, &[0; 8]), Reason::PROTOCOL_ERROR),
            ("PUSH_PROMISE from a client", raw(kind::PUSH_PROMISE, 4, 1, &[0; 4]), Reason::PROTOCOL_ERROR),
            ("RST_STREAM of 3 bytes", raw(kind::RST_STREAM, 0, 1, &[0; 3]), Reason::FRAME_SIZE_ERROR),
            ("WINDOW_UPDATE of 5 bytes", raw(kind::WINDOW_UPDATE, 0, 1, &[0; 5]), Reason::FRAME_SIZE_ERROR),
        ];
        for (what, bytes, reason) in cases {
            assert_eq!(one(&bytes), Err(FrameError(reason)), "{what}");
        }
        let big = raw(kind::DATA, 0, 1, &vec![0; MIN_MAX_FRAME + 1]);
        assert_eq!(
            parse(&big[..HEADER_LEN], MIN_MAX_FRAME),
            Err(FrameError(Reason::FRAME_SIZE_ERROR)),
            "judged on the header"
        );
    }

    #[test]
    fn control_frames_read_back() {
        let mut out = Vec::new();
        put_settings(&mut out, &[(setting::MAX_CONCURRENT_STREAMS, 100), (setting::ENABLE_CONNECT_PROTOCOL, 1)]);
        match one(&out) {
            Ok(Frame::Settings(s)) => assert_eq!(s.iter().collect::<Vec<_>>(), [(3, 100), (8, 1)]),
            other => panic!("{other:?}"),
        }
        for (write, want) in [
            (put_settings_ack as fn(&mut Vec<u8>), Frame::SettingsAck),
            (|o: &mut Vec<u8>| put_ping_ack(o, *b"12345678"), Frame::Ping { ack: true, data: *b"12345678" }),
            (|o: &mut Vec<u8>| put_window_update(o, 0, 65_535), Frame::WindowUpdate { stream: 0, increment: 65_535 }),
            (
                |o: &mut Vec<u8>| put_rst_stream(o, 5, Reason::CANCEL),
                Frame::RstStream { stream: 5, reason: Reason::CANCEL },
            ),
            (
                |o: &mut Vec<u8>| put_goaway(o, 7, Reason::ENHANCE_YOUR_CALM, b"calm"),
                Frame::GoAway { last_stream: 7, reason: Reason::ENHANCE_YOUR_CALM, debug: b"calm" },
            ),
            (
                |o: &mut Vec<u8>| put_data(o, 9, b"body", true),
                Frame::Data { stream: 9, end_stream: true, data: b"body", flow_len: 4 },
            ),
        ] {
            let mut out = Vec::new();
            write(&mut out);
            assert_eq!(one(&out), Ok(want));
        }
        let mut out = Vec::new();
        put_window_update(&mut out, 1, 0);
        assert_eq!(one(&out), Ok(Frame::WindowUpdate { stream: 1, increment: 0 }), "0 is the caller's to refuse");
        assert_eq!(one(&raw(0xfa, 0xff, 3, b"whatever")), Ok(Frame::Unknown));
        assert_eq!(one(&raw(kind::PRIORITY, 0, 3, &[0; 5])), Ok(Frame::Priority { stream: 3 }));
    }

    /// A block larger than a frame goes out as HEADERS plus CONTINUATIONs, END_HEADERS on
    /// the last only, END_STREAM on the HEADERS.
    #[test]
    fn big_header_blocks_are_split_into_continuations() {
        let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        put_headers(&mut out, 1, &block, true, MIN_MAX_FRAME);
        let mut rest = &out[..];
        let mut joined = Vec::new();
        let mut frames = Vec::new();
        while let Some((frame, used)) = parse(rest, MIN_MAX_FRAME).unwrap() {
            rest = &rest[used..];
            match frame {
                Frame::Headers { block, end_stream, end_headers, .. } => {
                    frames.push(("headers", end_stream, end_headers));
                    joined.extend_from_slice(block);
                }
                Frame::Continuation { block, end_headers, .. } => {
                    frames.push(("continuation", false, end_headers));
                    joined.extend_from_slice(block);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(frames, [("headers", true, false), ("continuation", false, false), ("continuation", false, true)]);
        assert_eq!(joined, block);
        let mut small = Vec::new();
        put_headers(&mut small, 1, b"\x88", false, MIN_MAX_FRAME);
        assert_eq!(one(&small), Ok(Frame::Headers { stream: 1, end_stream: false, end_headers: true, block: b"\x88" }));
    }
}
