//! RFC 6455 framing for one upgraded connection: a bytes-in/bytes-out state
//! machine ([`WsConn`]) that parses client frames, reassembles messages,
//! validates text as it arrives, answers pings and runs the close handshake.
//!
//! It owns no socket, timer or thread: the event loop feeds it whatever bytes
//! arrived and flushes whatever it appends to `out`. Peer input never makes
//! it panic or allocate beyond the message limit; every violation becomes one
//! [`WsError`] and one close frame, mapped in [`WsError::close_code`].

use std::fmt;

const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// Control frame payloads are at most this long (RFC 6455 §5.5).
const MAX_CONTROL: usize = 125;

/// A complete message from the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A text message (valid UTF-8).
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
}

/// What [`WsConn::read`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A complete message.
    Message(Message),
    /// The connection is over: flush `out`, then close the TCP connection.
    /// `code` is the peer's close code (1005 when its close frame had none),
    /// or the code we sent when closing on a protocol violation.
    Closed {
        /// The close status code.
        code: u16,
    },
}

/// A protocol violation by the peer. Each closes the connection with
/// [`WsError::close_code`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WsError {
    /// A reserved bit or reserved opcode (1002).
    Reserved,
    /// A client frame without a mask (1002).
    Unmasked,
    /// A fragmented control frame, or one over 125 bytes (1002).
    BadControl,
    /// A continuation with no message started, or a new data frame inside a
    /// fragmented message (1002).
    BadFragment,
    /// A close payload of one byte or with a code that may not be sent (1002).
    BadClose,
    /// Text or a close reason that is not UTF-8 (1007).
    InvalidUtf8,
    /// A message over the size limit (1009).
    TooBig,
}

impl WsError {
    /// The close status code sent for this violation (RFC 6455 §7.4.1).
    pub fn close_code(self) -> u16 {
        match self {
            WsError::InvalidUtf8 => 1007,
            WsError::TooBig => 1009,
            _ => 1002,
        }
    }
}

impl fmt::Display for WsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WsError::Reserved => "reserved bit or opcode",
            WsError::Unmasked => "unmasked client frame",
            WsError::BadControl => "invalid control frame",
            WsError::BadFragment => "invalid fragmentation",
            WsError::BadClose => "invalid close frame",
            WsError::InvalidUtf8 => "invalid UTF-8",
            WsError::TooBig => "message too big",
        })
    }
}

impl std::error::Error for WsError {}

/// Where the close handshake stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Messages flow both ways.
    Open,
    /// We sent a close frame and wait for the peer's.
    CloseSent,
    /// Done: input is ignored, nothing more is written.
    Closed,
}

/// The frame whose payload is being read.
#[derive(Clone, Copy, Debug)]
struct Frame {
    opcode: u8,
    fin: bool,
    mask: [u8; 4],
    /// Payload bytes still to come.
    left: u64,
    /// Payload bytes already read, modulo 4 (the mask phase).
    phase: usize,
}

/// One WebSocket connection after a successful handshake (server side).
#[derive(Debug)]
pub struct WsConn {
    max_message: usize,
    phase: Phase,
    /// The header being read while `frame` is `None`.
    head: [u8; 14],
    head_len: usize,
    frame: Option<Frame>,
    /// Whether the message being assembled is text; `None` between messages.
    text: Option<bool>,
    message: Vec<u8>,
    utf8: Utf8,
    control: Vec<u8>,
    pong: bool,
    error: Option<WsError>,
}

impl WsConn {
    /// A connection accepting messages of at most `max_message_bytes`
    /// (larger ones close it with 1009).
    pub fn new(max_message_bytes: usize) -> WsConn {
        WsConn {
            max_message: max_message_bytes,
            phase: Phase::Open,
            head: [0; 14],
            head_len: 0,
            frame: None,
            text: None,
            message: Vec::new(),
            utf8: Utf8::default(),
            control: Vec::with_capacity(MAX_CONTROL),
            pong: false,
            error: None,
        }
    }

    /// Consume input bytes (any split, partial frames included). Appends
    /// protocol output (pongs, close frames) to `out` and at most one event
    /// to `events`: a complete message, or the end of the connection.
    ///
    /// Returns how many bytes were consumed; partial frames are buffered
    /// here. It stops right after a message so that replies to it go out
    /// before anything later input causes (a pong, a close on a violation):
    /// drain the consumed bytes, handle the event, and call again while
    /// input is left. On a protocol violation it writes the close frame,
    /// emits [`Event::Closed`] and consumes (ignores) all further input.
    /// Messages arriving after we started closing are dropped.
    ///
    /// ```text
    /// while !buf.is_empty() {
    ///     let n = ws.read(&buf, &mut out, &mut events);
    ///     buf.drain(..n);
    ///     for event in events.drain(..) { /* reply with ws.send_*(…, &mut out) */ }
    /// }
    /// ```
    pub fn read(&mut self, input: &[u8], out: &mut Vec<u8>, events: &mut Vec<Event>) -> usize {
        let (mut pos, before) = (0, events.len());
        while pos < input.len() && events.len() == before && self.phase != Phase::Closed {
            match self.step(&input[pos..], out, events) {
                Ok(n) => pos += n,
                Err(e) => self.fail(e, out, events),
            }
        }
        if self.phase == Phase::Closed {
            input.len()
        } else {
            pos
        }
    }

    /// Queue a text message (one unmasked frame). Ignored once closing.
    pub fn send_text(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.phase == Phase::Open {
            write_frame(out, TEXT, text.as_bytes());
        }
    }

    /// Whether messages may still be sent (the close handshake has not started).
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Queue a binary message (one unmasked frame). Ignored once closing.
    pub fn send_binary(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.phase == Phase::Open {
            write_frame(out, BINARY, data);
        }
    }

    /// Queue a ping; `payload` beyond 125 bytes is cut off. Ignored once
    /// closing.
    pub fn ping(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        if self.phase == Phase::Open {
            write_frame(out, PING, &payload[..payload.len().min(MAX_CONTROL)]);
        }
    }

    /// Start the close handshake with `code` (e.g. 1001 on shutdown) and a
    /// reason cut to fit a control frame. Later sends are ignored;
    /// [`Event::Closed`] follows when the peer's close arrives, so the caller
    /// applies a timeout. Ignored once closing.
    pub fn close(&mut self, code: u16, reason: &str, out: &mut Vec<u8>) {
        if self.phase == Phase::Open {
            write_close(out, code, reason);
            self.phase = Phase::CloseSent;
        }
    }

    /// Whether a pong arrived since the last call (for the dead-peer timer).
    pub fn take_pong(&mut self) -> bool {
        std::mem::take(&mut self.pong)
    }

    /// Whether a close frame was sent or received: no more messages go out.
    pub fn is_closing(&self) -> bool {
        self.phase != Phase::Open
    }

    /// The violation that closed the connection, if one did (for the log).
    pub fn error(&self) -> Option<WsError> {
        self.error
    }

    /// Consume a prefix of `input` (at least one byte): header or payload.
    fn step(&mut self, input: &[u8], out: &mut Vec<u8>, events: &mut Vec<Event>) -> Result<usize, WsError> {
        let Some(mut frame) = self.frame else { return self.read_head(input, out, events) };
        let n = frame.left.min(input.len() as u64) as usize;
        let buf = if frame.opcode >= CLOSE { &mut self.control } else { &mut self.message };
        let start = buf.len();
        buf.extend_from_slice(&input[..n]);
        unmask(&mut buf[start..], frame.mask, frame.phase);
        if frame.opcode < CLOSE && self.text == Some(true) {
            self.utf8.feed(&self.message[start..])?;
        }
        frame.left -= n as u64;
        frame.phase = (frame.phase + n) % 4;
        self.frame = Some(frame);
        if frame.left == 0 {
            self.end_frame(frame, out, events)?;
        }
        Ok(n)
    }

    /// Buffer header bytes; check what is known as early as it is known.
    fn read_head(&mut self, input: &[u8], out: &mut Vec<u8>, events: &mut Vec<Event>) -> Result<usize, WsError> {
        // Two bytes, then the extended length (if any) and the mask key.
        let need = match (self.head_len, self.head[1] & 0x7f) {
            (0 | 1, _) => 2,
            (_, 126) => 2 + 2 + 4,
            (_, 127) => 2 + 8 + 4,
            _ => 2 + 4,
        };
        let n = (need - self.head_len).min(input.len());
        self.head[self.head_len..self.head_len + n].copy_from_slice(&input[..n]);
        self.head_len += n;
        if self.head_len == 2 {
            self.check_start()?;
        }
        if self.head_len < need || need == 2 {
            return Ok(n);
        }
        let (b0, b1) = (self.head[0], self.head[1]);
        let (extended, mask) = self.head[2..need].split_at(need - 6);
        let len = match extended {
            [] => u64::from(b1 & 0x7f),
            bytes => bytes.iter().fold(0, |len, &b| len << 8 | u64::from(b)),
        };
        let frame = Frame {
            opcode: b0 & 0x0f,
            fin: b0 & 0x80 != 0,
            mask: [mask[0], mask[1], mask[2], mask[3]],
            left: len,
            phase: 0,
        };
        self.head_len = 0;
        if frame.opcode < CLOSE {
            if len > (self.max_message - self.message.len()) as u64 {
                return Err(WsError::TooBig);
            }
            if frame.opcode != CONTINUATION {
                self.text = Some(frame.opcode == TEXT);
            }
        }
        self.frame = Some(frame);
        if len == 0 {
            self.end_frame(frame, out, events)?;
        }
        Ok(n)
    }

    /// Check the first two header bytes: bits, opcode, fragmentation, mask.
    fn check_start(&self) -> Result<(), WsError> {
        let (b0, b1) = (self.head[0], self.head[1]);
        if b0 & 0x70 != 0 {
            return Err(WsError::Reserved);
        }
        match b0 & 0x0f {
            CONTINUATION if self.text.is_none() => return Err(WsError::BadFragment),
            TEXT | BINARY if self.text.is_some() => return Err(WsError::BadFragment),
            CONTINUATION | TEXT | BINARY => {}
            CLOSE | PING | PONG if b0 & 0x80 == 0 || usize::from(b1 & 0x7f) > MAX_CONTROL => {
                return Err(WsError::BadControl)
            }
            CLOSE | PING | PONG => {}
            _ => return Err(WsError::Reserved),
        }
        if b1 & 0x80 == 0 {
            return Err(WsError::Unmasked);
        }
        Ok(())
    }

    /// A frame's payload is complete: finish a message or act on a control.
    fn end_frame(&mut self, frame: Frame, out: &mut Vec<u8>, events: &mut Vec<Event>) -> Result<(), WsError> {
        self.frame = None;
        match frame.opcode {
            PING if self.phase == Phase::Open => write_frame(out, PONG, &self.control),
            PING => {} // closing: no more pongs
            PONG => self.pong = true,
            CLOSE => {
                let code = parse_close(&self.control)?;
                if self.phase == Phase::Open {
                    write_close(out, if code == 1005 { 1000 } else { code }, "");
                }
                self.phase = Phase::Closed;
                events.push(Event::Closed { code });
            }
            _ if frame.fin => {
                let data = std::mem::take(&mut self.message);
                let message = if self.text.take() == Some(true) {
                    self.utf8.finish()?;
                    Message::Text(String::from_utf8(data).map_err(|_| WsError::InvalidUtf8)?)
                } else {
                    Message::Binary(data)
                };
                if self.phase == Phase::Open {
                    events.push(Event::Message(message));
                }
            }
            _ => {}
        }
        self.control.clear();
        Ok(())
    }

    /// Close on a violation: one close frame (unless already sent), done.
    fn fail(&mut self, error: WsError, out: &mut Vec<u8>, events: &mut Vec<Event>) {
        if self.phase == Phase::Open {
            write_close(out, error.close_code(), &error.to_string());
        }
        self.phase = Phase::Closed;
        self.error = Some(error);
        self.message = Vec::new();
        events.push(Event::Closed { code: error.close_code() });
    }
}

/// The close code of a close payload (1005 for an empty one).
fn parse_close(payload: &[u8]) -> Result<u16, WsError> {
    match payload {
        [] => Ok(1005),
        [_] => Err(WsError::BadClose),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            // Codes a peer may send (RFC 6455 §7.4, IANA registry): not 1004–1006, 1015 or unassigned.
            if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
                return Err(WsError::BadClose);
            }
            std::str::from_utf8(reason).map_err(|_| WsError::InvalidUtf8)?;
            Ok(code)
        }
    }
}

/// Append the text message `text` as one unmasked frame: the bytes
/// [`WsConn::send_text`] queues, encoded once for many receivers.
pub fn text_frame(out: &mut Vec<u8>, text: &str) {
    write_frame(out, TEXT, text.as_bytes());
}

/// Append one unmasked, final frame.
fn write_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Append a close frame; the reason is cut (at a character) to fit.
fn write_close(out: &mut Vec<u8>, code: u16, reason: &str) {
    let mut end = reason.len().min(MAX_CONTROL - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut payload = [0u8; MAX_CONTROL];
    payload[..2].copy_from_slice(&code.to_be_bytes());
    payload[2..2 + end].copy_from_slice(&reason.as_bytes()[..end]);
    write_frame(out, CLOSE, &payload[..2 + end]);
}

/// XOR `buf` with `mask`, starting `phase` bytes into the mask; eight bytes
/// at a time.
fn unmask(buf: &mut [u8], mask: [u8; 4], phase: usize) {
    let m: [u8; 4] = std::array::from_fn(|i| mask[(phase + i) % 4]);
    let wide = u64::from_ne_bytes([m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]]);
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= m[i % 4];
    }
}

/// Incremental UTF-8 validation across frames and reads: rejects at the
/// first byte that cannot belong to a valid sequence, keeping only the
/// unfinished code point (at most 3 bytes) between calls.
#[derive(Debug, Default)]
struct Utf8 {
    pending: [u8; 4],
    len: usize,
}

impl Utf8 {
    /// Validate the next bytes of a message.
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), WsError> {
        while self.len > 0 {
            let Some((&b, rest)) = bytes.split_first() else { return Ok(()) };
            bytes = rest;
            self.pending[self.len] = b;
            self.len += 1;
            match std::str::from_utf8(&self.pending[..self.len]) {
                Ok(_) => self.len = 0,
                Err(e) if e.error_len().is_some() => return Err(WsError::InvalidUtf8),
                Err(_) => {}
            }
        }
        match std::str::from_utf8(bytes) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_some() => Err(WsError::InvalidUtf8),
            Err(e) => {
                let tail = &bytes[e.valid_up_to()..];
                self.pending[..tail.len()].copy_from_slice(tail);
                self.len = tail.len();
                Ok(())
            }
        }
    }

    /// The message ended: no code point may be left unfinished.
    fn finish(&mut self) -> Result<(), WsError> {
        let unfinished = self.len != 0;
        self.len = 0;
        if unfinished {
            Err(WsError::InvalidUtf8)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// A masked client frame; `b0` is the first header byte as sent.
    fn raw(b0: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        write_frame(&mut f, 0, payload);
        f[0] = b0;
        f[1] |= 0x80;
        let start = f.len() - payload.len();
        f.splice(start..start, KEY);
        unmask(&mut f[start + 4..], KEY, 0);
        f
    }

    /// A masked client frame with FIN set when `fin`.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        raw(if fin { 0x80 } else { 0 } | opcode, payload)
    }

    fn close_payload(code: u16, reason: &[u8]) -> Vec<u8> {
        [&code.to_be_bytes()[..], reason].concat()
    }

    /// Decode the server's (unmasked) frames as `(first byte, payload)`.
    fn frames(mut out: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            assert_eq!(out[1] & 0x80, 0, "server frames are unmasked");
            let (len, at) = match out[1] {
                126 => (u16::from_be_bytes([out[2], out[3]]) as usize, 4),
                127 => (u64::from_be_bytes(out[2..10].try_into().unwrap()) as usize, 10),
                n => (n as usize, 2),
            };
            v.push((out[0], out[at..at + len].to_vec()));
            out = &out[at + len..];
        }
        v
    }

    /// Feed `input` as a caller does, reading until all is consumed; return
    /// `(out, events)`.
    fn feed(ws: &mut WsConn, mut input: &[u8]) -> (Vec<u8>, Vec<Event>) {
        let (mut out, mut events) = (Vec::new(), Vec::new());
        while !input.is_empty() {
            let before = events.len();
            let n = ws.read(input, &mut out, &mut events);
            assert!(n > 0 && events.len() - before <= 1);
            input = &input[n..];
        }
        (out, events)
    }

    fn text(s: &str) -> Event {
        Event::Message(Message::Text(s.into()))
    }

    /// The single close frame in `out` as (code, reason).
    fn close_frame(out: &[u8]) -> u16 {
        let f = frames(out);
        assert_eq!(f.len(), 1, "one frame expected in {out:?}");
        assert_eq!(f[0].0, 0x88);
        u16::from_be_bytes([f[0].1[0], f[0].1[1]])
    }

    #[test]
    fn round_trips_with_every_length_encoding() {
        for (len, header) in [(5, 2), (125, 2), (126, 4), (300, 4), (65535, 4), (65536, 10), (70000, 10)] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut ws = WsConn::new(1 << 20);
            let (out, events) = feed(&mut ws, &frame(true, BINARY, &payload));
            assert!(out.is_empty());
            assert_eq!(events, [Event::Message(Message::Binary(payload.clone()))]);

            let s = "é".repeat(len / 2) + &"x".repeat(len % 2);
            let (out, events) = feed(&mut ws, &frame(true, TEXT, s.as_bytes()));
            assert!(out.is_empty());
            assert_eq!(events, [text(&s)]);

            let mut out = Vec::new();
            ws.send_binary(&payload, &mut out);
            assert_eq!(out.len(), header + len, "len {len}");
            assert_eq!(frames(&out), [(0x82, payload.clone())]);
            out.clear();
            ws.send_text(&s, &mut out);
            assert_eq!(frames(&out), [(0x81, s.into_bytes())]);
        }
    }

    #[test]
    fn byte_by_byte() {
        let mut ws = WsConn::new(1 << 20);
        let input = [frame(true, TEXT, "héllo 𝄞".as_bytes()), frame(true, BINARY, &[7; 300])].concat();
        let (mut out, mut events) = (Vec::new(), Vec::new());
        for b in &input {
            assert_eq!(ws.read(std::slice::from_ref(b), &mut out, &mut events), 1);
        }
        assert!(out.is_empty());
        assert_eq!(events, [text("héllo 𝄞"), Event::Message(Message::Binary(vec![7; 300]))]);
    }

    #[test]
    fn read_stops_after_each_message_so_replies_keep_their_order() {
        // Autobahn 3.2: a message, then a violation, in one read; the echo
        // must go out before the close.
        let mut ws = WsConn::new(64);
        let first = frame(true, TEXT, b"Hello");
        let input = [&first[..], &raw(0x80 | 0x20 | TEXT, b"x"), &frame(true, PING, b"p")].concat();
        let (mut out, mut events) = (Vec::new(), Vec::new());
        assert_eq!(ws.read(&input, &mut out, &mut events), first.len());
        assert_eq!(events, [text("Hello")]);
        ws.send_text("Hello", &mut out);
        assert_eq!(ws.read(&input[first.len()..], &mut out, &mut events), input.len() - first.len());
        assert_eq!(events[1..], [Event::Closed { code: 1002 }]);
        assert_eq!(frames(&out)[0], (0x81, b"Hello".to_vec()));
        assert_eq!(frames(&out)[1].0, 0x88);
        assert_eq!(frames(&out).len(), 2);
    }

    #[test]
    fn fragments_with_an_interleaved_ping() {
        let mut ws = WsConn::new(1 << 20);
        let input = [
            frame(false, TEXT, b"Hel"),
            frame(true, PING, b"are you there"),
            frame(false, CONTINUATION, b"lo, "),
            frame(true, PONG, b""),
            frame(true, CONTINUATION, b"world"),
        ]
        .concat();
        let (out, events) = feed(&mut ws, &input);
        assert_eq!(frames(&out), [(0x8a, b"are you there".to_vec())]);
        assert_eq!(events, [text("Hello, world")]);
        assert!(ws.take_pong());
        assert!(!ws.take_pong());
    }

    #[test]
    fn empty_frames() {
        let mut ws = WsConn::new(16);
        let input = [frame(false, TEXT, b""), frame(true, CONTINUATION, b""), frame(true, BINARY, b"")].concat();
        let (_, events) = feed(&mut ws, &input);
        assert_eq!(events, [text(""), Event::Message(Message::Binary(vec![]))]);
    }

    #[test]
    fn violations_close_with_the_right_code() {
        let cases: Vec<(&str, Vec<u8>, u16)> = vec![
            ("rsv1", raw(0x80 | 0x40 | TEXT, b"x"), 1002),
            ("rsv3 on ping", raw(0x80 | 0x10 | PING, b""), 1002),
            ("opcode 3", frame(true, 3, b""), 1002),
            ("opcode 0xb", frame(true, 0xb, b""), 1002),
            ("unmasked", vec![0x81, 0x01, b'x'], 1002),
            ("ping of 126 bytes", frame(true, PING, &[0; 126]), 1002),
            ("fragmented ping", frame(false, PING, b"x"), 1002),
            ("fragmented close", frame(false, CLOSE, &close_payload(1000, b"")), 1002),
            ("continuation first", frame(true, CONTINUATION, b"x"), 1002),
            ("text inside a fragmented message", [frame(false, TEXT, b"a"), frame(true, TEXT, b"b")].concat(), 1002),
            (
                "binary inside a fragmented message",
                [frame(false, BINARY, b"a"), frame(true, BINARY, b"b")].concat(),
                1002,
            ),
            ("close of 1 byte", frame(true, CLOSE, &[3]), 1002),
            (
                "invalid utf-8 text",
                frame(true, TEXT, b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"),
                1007,
            ),
            ("truncated utf-8 at the end", frame(true, TEXT, b"ab\xe2\x82"), 1007),
            ("invalid close reason", frame(true, CLOSE, &close_payload(1000, b"\xff")), 1007),
            ("too big", frame(true, BINARY, &[0; 17]), 1009),
            (
                "too big in total",
                [frame(false, TEXT, &[b'a'; 10]), frame(true, CONTINUATION, &[b'a'; 7])].concat(),
                1009,
            ),
        ];
        let codes = [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535];
        let bad_codes = codes.iter().map(|&c| ("close code", frame(true, CLOSE, &close_payload(c, b"")), 1002));
        for (name, input, code) in cases.into_iter().chain(bad_codes) {
            let mut ws = WsConn::new(16);
            let (out, events) = feed(&mut ws, &input);
            assert_eq!(close_frame(&out), code, "{name}");
            assert_eq!(events, [Event::Closed { code }], "{name}");
            assert_eq!(ws.error().map(WsError::close_code), Some(code), "{name}");
            assert!(ws.is_closing());
            // Everything after a violation is ignored.
            let (out, events) = feed(&mut ws, &frame(true, PING, b"x"));
            assert!(out.is_empty() && events.is_empty(), "{name}");
        }
    }

    #[test]
    fn valid_close_codes_are_echoed() {
        for code in [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999] {
            let mut ws = WsConn::new(16);
            let (out, events) = feed(&mut ws, &frame(true, CLOSE, &close_payload(code, "ok ✓".as_bytes())));
            assert_eq!(close_frame(&out), code);
            assert_eq!(events, [Event::Closed { code }]);
            assert_eq!(ws.error(), None);
        }
    }

    #[test]
    fn invalid_utf8_fails_before_the_message_ends() {
        // Across fragments: the second (non-final) fragment holds the bad byte.
        let mut ws = WsConn::new(1 << 10);
        let (out, events) = feed(&mut ws, &frame(false, TEXT, "κόσμε".as_bytes()));
        assert!(out.is_empty() && events.is_empty());
        let (out, events) = feed(&mut ws, &frame(false, CONTINUATION, b"ok\xf4\x90\x80\x80"));
        assert_eq!(close_frame(&out), 1007);
        assert_eq!(events, [Event::Closed { code: 1007 }]);

        // Within one frame whose payload has only partly arrived.
        let mut ws = WsConn::new(1 << 10);
        let input = frame(true, TEXT, b"abc\xc0\xafdefghijklmnop");
        let (out, _) = feed(&mut ws, &input[..2 + 4 + 3]);
        assert!(out.is_empty());
        let (out, events) = feed(&mut ws, &input[2 + 4 + 3..2 + 4 + 4]);
        assert_eq!(close_frame(&out), 1007);
        assert_eq!(events, [Event::Closed { code: 1007 }]);
    }

    #[test]
    fn code_point_split_across_fragments() {
        let clef = "𝄞".as_bytes(); // F0 9D 84 9E
        for split in 1..4 {
            let mut ws = WsConn::new(64);
            let input = [
                frame(false, TEXT, &[b"a", &clef[..split]].concat()),
                frame(false, CONTINUATION, &clef[split..split]),
                frame(true, CONTINUATION, &[&clef[split..], b"b"].concat()),
            ]
            .concat();
            let (out, events) = feed(&mut ws, &input);
            assert!(out.is_empty());
            assert_eq!(events, [text("a𝄞b")]);
        }
    }

    #[test]
    fn huge_length_is_refused_without_allocating() {
        let mut ws = WsConn::new(1 << 16);
        let mut head = vec![0x82, 0x80 | 127];
        head.extend_from_slice(&(1u64 << 63).to_be_bytes());
        head.extend_from_slice(&KEY);
        let (out, events) = feed(&mut ws, &head);
        assert_eq!(close_frame(&out), 1009);
        assert_eq!(events, [Event::Closed { code: 1009 }]);
        assert_eq!(ws.message.capacity(), 0);
    }

    #[test]
    fn big_message() {
        let payload = vec![b'a'; 16 << 20];
        let mut ws = WsConn::new(16 << 20);
        let input = frame(true, TEXT, &payload);
        let started = std::time::Instant::now();
        let (_, events) = feed(&mut ws, &input);
        assert!(matches!(&events[..], [Event::Message(Message::Text(s))] if s.len() == 16 << 20));
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn peer_initiated_close() {
        let mut ws = WsConn::new(64);
        let (out, events) = feed(&mut ws, &frame(true, CLOSE, &close_payload(1001, b"going away")));
        assert_eq!(frames(&out), [(0x88, close_payload(1001, b""))]);
        assert_eq!(events, [Event::Closed { code: 1001 }]);
        assert!(ws.is_closing());
        let mut out = Vec::new();
        ws.send_text("late", &mut out);
        ws.close(1000, "", &mut out);
        assert!(out.is_empty());

        // An empty close is answered with 1000.
        let mut ws = WsConn::new(64);
        let (out, events) = feed(&mut ws, &frame(true, CLOSE, b""));
        assert_eq!(close_frame(&out), 1000);
        assert_eq!(events, [Event::Closed { code: 1005 }]);
    }

    #[test]
    fn server_initiated_close() {
        let mut ws = WsConn::new(64);
        let mut out = Vec::new();
        ws.close(1001, "shutting down", &mut out);
        assert_eq!(frames(&out), [(0x88, close_payload(1001, b"shutting down"))]);
        assert!(ws.is_closing());
        out.clear();
        ws.send_text("x", &mut out);
        ws.send_binary(b"x", &mut out);
        ws.ping(b"x", &mut out);
        ws.close(1000, "again", &mut out);
        assert!(out.is_empty());

        // The peer's in-flight message is dropped; its close ends it, unanswered.
        let (out, events) = feed(&mut ws, &[frame(true, TEXT, b"in flight"), frame(true, PING, b"p")].concat());
        assert!(out.is_empty() && events.is_empty());
        let (out, events) = feed(&mut ws, &frame(true, CLOSE, &close_payload(1001, b"")));
        assert!(out.is_empty());
        assert_eq!(events, [Event::Closed { code: 1001 }]);
    }

    #[test]
    fn long_close_reason_and_ping_are_cut() {
        let mut out = Vec::new();
        WsConn::new(64).close(1000, &"é".repeat(100), &mut out);
        let f = frames(&out);
        assert_eq!(f[0].1.len(), 2 + 122);
        assert!(std::str::from_utf8(&f[0].1[2..]).is_ok());
        out.clear();
        WsConn::new(64).ping(&[1; 200], &mut out);
        assert_eq!(frames(&out), [(0x89, vec![1; 125])]);
    }
}
