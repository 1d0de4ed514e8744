//! `h2ceiling`: what an HTTP/2 `/health` costs with a socket-free codec of
//! our own instead of the `h2` crate, as a reference for `bin/loadtest
//! --proto h2c --with-h2ceiling` and `bin/bench-instructions`.
//!
//! It speaks just enough HTTP/2 (RFC 9113) over prior-knowledge h2c to
//! answer `GET /health` the way forkd does: the connection preface,
//! SETTINGS and their ACK, PING, WINDOW_UPDATE (both windows), HEADERS and
//! CONTINUATION (HPACK decoding with the static and the dynamic table,
//! Huffman included), DATA, RST_STREAM and GOAWAY. Each response is
//! `:status`, the fields forkd sends with `/health` (copied once, at start,
//! from a running forkd with `--copy-from`), a fresh `date` each second and
//! a fresh `x-request-id` (a random UUID) each response, both Huffman-coded
//! literals; the fixed fields are inserted into the peer's HPACK table on a
//! connection's first response and sent as one-byte indices after that, as
//! h2's encoder does with forkd's fixed policy. Any other path gets a 404
//! with no body. Like forkd it runs N single-threaded mio loops (threads
//! here, one `SO_REUSEPORT` listener each), reads until `WouldBlock`,
//! answers every request of a read and writes once.
//!
//! Not a server: no routing, no request limits beyond the frame size, no
//! priorities, no server push, no TLS. Whatever forkd spends beyond this on
//! HTTP/2 is the price of the `h2` crate and of forkd's own layers.
//!
//! Usage: h2ceiling --listen 127.0.0.1:PORT [--threads 2]
//!                  --copy-from 127.0.0.1:PORT [--path /health]
//! Built as a cargo example: `cargo build --release --example h2ceiling`.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::time::{Duration, SystemTime};

use forkd::http2::hpack::{huffman, put_int, Decoder, STATIC};
use forkd::http2::wire::flag::{ACK, END_HEADERS, END_STREAM, PADDED, PRIORITY as PRIORITY_FLAG};
use forkd::http2::wire::kind::{CONTINUATION, DATA, GOAWAY, HEADERS, PING, RST_STREAM, SETTINGS, WINDOW_UPDATE};
use mio::net::TcpStream;

#[path = "mio_serve.rs"]
mod mio_serve;
use mio_serve::{write_out, Args, Service};
/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE we accept (the protocol's default).
const MAX_FRAME: usize = 16_384;
/// Our HPACK decoder's table size (the protocol's default; never changed).
const DECODER_TABLE: usize = 4096;
/// Read size per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// Static index of `date`.
const DATE: usize = 33;

/// An HTTP/2 error code (RFC 9113 §7) that ends the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum H2Error {
    Protocol = 0x1,
    FlowControl = 0x3,
    FrameSize = 0x6,
    Compression = 0x9,
}

/// What the connection does after a call to [`Codec::on_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Go on reading.
    Read,
    /// Write what is queued, then close (a GOAWAY was sent or received).
    Close,
}

/// The fixed part of the `/health` answer: what forkd sends, minus `date`
/// and `x-request-id`.
struct Answer {
    /// Field names (lowercase) and values.
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    path: Vec<u8>,
}

// ------------------------------------------------------------------ HPACK

/// Append a string literal, Huffman-coded (RFC 7541 §5.2).
fn put_huffman(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0x80, 7, huffman::encoded_len(s));
    huffman::encode(s, out);
}

// ------------------------------------------------------------------ per-thread state

/// What every connection of a thread shares: the fixed answer, the clock
/// and the request-id generator.
struct Shared {
    answer: &'static Answer,
    /// Whole seconds of the cached date.
    date_secs: u64,
    /// The `date` value, Huffman-coded, with its length prefix.
    date: Vec<u8>,
    rng: u64,
}

impl Shared {
    fn new(answer: &'static Answer) -> Shared {
        let seed = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        let mut s = Shared { answer, date_secs: u64::MAX, date: Vec::new(), rng: seed | 1 };
        s.tick();
        s
    }

    /// Refresh the date if the second changed (once per loop turn).
    fn tick(&mut self) {
        let now = SystemTime::now();
        let secs = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if secs != self.date_secs {
            self.date_secs = secs;
            self.date.clear();
            put_huffman(&mut self.date, httpdate::fmt_http_date(now).as_bytes());
        }
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A fresh random (version 4) UUID, as forkd's request ids are.
    fn request_id(&mut self) -> [u8; 36] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let (a, b) = (self.next_u64(), self.next_u64());
        let bits =
            (u128::from(a) << 64 | u128::from(b)) & !(0xf000 << 64) & !(0xc << 60) | (0x4000 << 64) | (0x8 << 60);
        let mut out = [b'-'; 36];
        let mut nibble = 0;
        for (i, slot) in out.iter_mut().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                continue;
            }
            *slot = HEX[((bits >> (124 - 4 * nibble)) & 0xf) as usize];
            nibble += 1;
        }
        out
    }
}

// ------------------------------------------------------------------ the codec

/// One connection's HTTP/2 state: bytes in, frames out. No socket.
struct Codec {
    preface: bool,
    decoder: Decoder,
    /// The fixed fields are in the peer's table (from the second response on).
    fixed_indexed: bool,
    /// The fixed fields fit the peer's table (its SETTINGS_HEADER_TABLE_SIZE).
    fixed_fit: bool,
    peer_table: usize,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE: each new stream's send window.
    peer_window: i64,
    /// The connection's send window.
    conn_window: i64,
    /// Streams whose answer waits for window: (id, its send window, not found).
    blocked: VecDeque<(u32, i64, bool)>,
    /// A header block continued in CONTINUATION frames: stream, END_STREAM, bytes.
    continued: Option<(u32, bool)>,
    block: Vec<u8>,
    /// Streams with a request body still coming: (id, not found).
    uploading: Vec<(u32, bool)>,
    last_stream: u32,
}

impl Codec {
    fn new() -> Codec {
        Codec {
            preface: false,
            decoder: Decoder::new(DECODER_TABLE),
            fixed_indexed: false,
            fixed_fit: true,
            peer_table: 4096,
            peer_window: 65_535,
            conn_window: 65_535,
            blocked: VecDeque::new(),
            continued: None,
            block: Vec::new(),
            uploading: Vec::new(),
            last_stream: 0,
        }
    }

    /// The server preface: our SETTINGS (at most 128 concurrent streams).
    fn start(out: &mut Vec<u8>) {
        frame_head(out, 6, SETTINGS, 0, 0);
        out.extend_from_slice(&[0, 3, 0, 0, 0, 128]);
    }

    /// Consume every whole frame at the start of `input` (the rest stays),
    /// appending what they call for to `out`.
    fn on_bytes(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>, shared: &mut Shared) -> Next {
        let mut at = 0;
        if !self.preface {
            if input.len() < PREFACE.len() {
                return Next::Read;
            }
            if &input[..PREFACE.len()] != PREFACE {
                return Next::Close;
            }
            self.preface = true;
            at = PREFACE.len();
        }
        let mut next = Next::Read;
        while input.len() - at >= 9 {
            let h = &input[at..at + 9];
            let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            if len > MAX_FRAME {
                next = self.go_away(out, H2Error::FrameSize);
                break;
            }
            if input.len() - at - 9 < len {
                break;
            }
            let payload = &input[at + 9..at + 9 + len];
            at += 9 + len;
            if let Err(e) = self.frame(kind, flags, stream, payload, out, shared) {
                next = self.go_away(out, e);
                break;
            }
            if kind == GOAWAY {
                next = Next::Close;
                break;
            }
        }
        input.drain(..at);
        next
    }

    fn go_away(&self, out: &mut Vec<u8>, e: H2Error) -> Next {
        frame_head(out, 8, GOAWAY, 0, 0);
        out.extend_from_slice(&self.last_stream.to_be_bytes());
        out.extend_from_slice(&(e as u32).to_be_bytes());
        Next::Close
    }

    fn frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
        shared: &mut Shared,
    ) -> Result<(), H2Error> {
        if self.continued.is_some() && kind != CONTINUATION {
            return Err(H2Error::Protocol);
        }
        match kind {
            HEADERS => {
                if stream == 0 || stream % 2 == 0 || stream <= self.last_stream {
                    return Err(H2Error::Protocol);
                }
                self.last_stream = stream;
                let mut p = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = *p.first().ok_or(H2Error::FrameSize)? as usize;
                    p = &p[1..];
                }
                if flags & PRIORITY_FLAG != 0 {
                    p = p.get(5..).ok_or(H2Error::FrameSize)?;
                }
                let p = p.get(..p.len().checked_sub(pad).ok_or(H2Error::Protocol)?).ok_or(H2Error::Protocol)?;
                let end_stream = flags & END_STREAM != 0;
                if flags & END_HEADERS != 0 {
                    self.request(stream, end_stream, p, out, shared)?;
                } else {
                    self.block.clear();
                    self.block.extend_from_slice(p);
                    self.continued = Some((stream, end_stream));
                }
            }
            CONTINUATION => {
                let Some((id, end_stream)) = self.continued else { return Err(H2Error::Protocol) };
                if id != stream || self.block.len() + payload.len() > 64 * 1024 {
                    return Err(H2Error::Protocol);
                }
                self.block.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    self.continued = None;
                    let block = std::mem::take(&mut self.block);
                    let r = self.request(id, end_stream, &block, out, shared);
                    self.block = block;
                    r?;
                }
            }
            DATA => {
                if stream == 0 {
                    return Err(H2Error::Protocol);
                }
                // Hand the bytes back at once: the body is not read.
                if !payload.is_empty() {
                    window_update(out, 0, payload.len() as u32);
                    if flags & END_STREAM == 0 {
                        window_update(out, stream, payload.len() as u32);
                    }
                }
                if flags & END_STREAM != 0 {
                    if let Some(i) = self.uploading.iter().position(|&(id, _)| id == stream) {
                        let (_, not_found) = self.uploading.swap_remove(i);
                        self.answer(stream, not_found, self.peer_window, out, shared);
                    }
                }
            }
            SETTINGS => {
                if stream != 0 || payload.len() % 6 != 0 {
                    return Err(H2Error::FrameSize);
                }
                if flags & ACK == 0 {
                    for s in payload.chunks_exact(6) {
                        let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                        match u16::from_be_bytes([s[0], s[1]]) {
                            1 => {
                                self.peer_table = value as usize;
                                self.fixed_fit = fixed_size(shared.answer) <= self.peer_table;
                            }
                            4 => {
                                if value > 0x7fff_ffff {
                                    return Err(H2Error::FlowControl);
                                }
                                self.peer_window = i64::from(value);
                            }
                            _ => {}
                        }
                    }
                    frame_head(out, 0, SETTINGS, ACK, 0);
                }
            }
            PING => {
                if payload.len() != 8 {
                    return Err(H2Error::FrameSize);
                }
                if flags & ACK == 0 {
                    frame_head(out, 8, PING, ACK, 0);
                    out.extend_from_slice(payload);
                }
            }
            WINDOW_UPDATE => {
                let b = payload.get(..4).ok_or(H2Error::FrameSize)?;
                let inc = i64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff);
                if stream == 0 {
                    self.conn_window += inc;
                } else if let Some(s) = self.blocked.iter_mut().find(|s| s.0 == stream) {
                    s.1 += inc;
                }
                self.unblock(out, shared);
            }
            RST_STREAM => {
                self.blocked.retain(|s| s.0 != stream);
                self.uploading.retain(|s| s.0 != stream);
            }
            _ => {} // PRIORITY, GOAWAY (the caller closes), unknown types
        }
        Ok(())
    }

    /// A request's header block arrived: decode it, answer once it ended.
    fn request(
        &mut self,
        stream: u32,
        end_stream: bool,
        block: &[u8],
        out: &mut Vec<u8>,
        shared: &mut Shared,
    ) -> Result<(), H2Error> {
        let mut found = false;
        let path = &shared.answer.path;
        let fields = |name: &[u8], value: &[u8]| {
            if name == b":path" {
                found = value == &path[..];
            }
        };
        self.decoder.decode(block, usize::MAX, fields).map_err(|_| H2Error::Compression)?;
        if end_stream {
            self.answer(stream, !found, self.peer_window, out, shared);
        } else {
            self.uploading.push((stream, !found));
        }
        Ok(())
    }

    /// Answer `stream` now if both windows allow its body, else later.
    fn answer(&mut self, stream: u32, not_found: bool, window: i64, out: &mut Vec<u8>, shared: &mut Shared) {
        let need = if not_found { 0 } else { shared.answer.body.len() as i64 };
        if need > 0 && (need > window || need > self.conn_window || !self.blocked.is_empty()) {
            self.blocked.push_back((stream, window, not_found));
            return;
        }
        self.conn_window -= need;
        self.respond(stream, not_found, out, shared);
    }

    fn unblock(&mut self, out: &mut Vec<u8>, shared: &mut Shared) {
        let need = shared.answer.body.len() as i64;
        while let Some(&(stream, window, not_found)) = self.blocked.front() {
            if need > window || need > self.conn_window {
                break;
            }
            self.blocked.pop_front();
            self.conn_window -= need;
            self.respond(stream, not_found, out, shared);
        }
    }

    /// HEADERS (and DATA) answering `stream`.
    fn respond(&mut self, stream: u32, not_found: bool, out: &mut Vec<u8>, shared: &mut Shared) {
        let start = out.len();
        frame_head(out, 0, HEADERS, END_HEADERS | if not_found { END_STREAM } else { 0 }, stream);
        if not_found {
            out.push(0x80 | 13); // :status 404
            put_int(out, 0, 4, 28); // content-length: 0, literal without indexing
            out.extend_from_slice(&[1, b'0']);
        } else {
            out.push(0x80 | 8); // :status 200
            put_int(out, 0, 4, DATE);
            out.extend_from_slice(&shared.date);
            out.push(0); // x-request-id: literal name and value, without indexing
            put_huffman(out, b"x-request-id");
            let id = shared.request_id();
            put_huffman(out, &id);
            let fields = &shared.answer.fields;
            if self.fixed_indexed {
                // Inserted in order: the last is the newest, index 62.
                for i in 0..fields.len() {
                    put_int(out, 0x80, 7, 62 + fields.len() - 1 - i);
                }
            } else {
                for (name, value) in fields {
                    let flags = if self.fixed_fit { 0x40 } else { 0 };
                    let prefix = if self.fixed_fit { 6 } else { 4 };
                    match STATIC.iter().position(|(n, _)| n.as_bytes() == &name[..]) {
                        Some(i) => put_int(out, flags, prefix, i + 1),
                        None => {
                            out.push(flags);
                            put_huffman(out, name);
                        }
                    }
                    put_huffman(out, value);
                }
                self.fixed_indexed = self.fixed_fit;
            }
        }
        let len = out.len() - start - 9;
        out[start..start + 3].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        if !not_found {
            let body = &shared.answer.body;
            frame_head(out, body.len(), DATA, END_STREAM, stream);
            out.extend_from_slice(body);
        }
    }
}

/// The HPACK table size the fixed fields take (RFC 7541 §4.1).
fn fixed_size(answer: &Answer) -> usize {
    answer.fields.iter().map(|(n, v)| 32 + n.len() + v.len()).sum()
}

fn frame_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

fn window_update(out: &mut Vec<u8>, stream: u32, inc: u32) {
    frame_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&inc.to_be_bytes());
}

// ------------------------------------------------------------------ start-up

const USAGE: &str = "h2ceiling --listen ADDR [--threads N] --copy-from ADDR [--path /health]";

/// The fields and body forkd answers `GET path` with (over HTTP/1.1: the
/// same fields as over HTTP/2 but the connection-specific ones), without
/// the per-response `date` and `x-request-id`.
fn copy_answer(addr: SocketAddr, path: &str) -> io::Result<Answer> {
    let mut s = StdStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| io::Error::other("no response head"))? + 4;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut fields = Vec::new();
    for line in head.lines().skip(1).filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or_else(|| io::Error::other("a field without ':'"))?;
        let name = name.trim().to_ascii_lowercase();
        if matches!(name.as_str(), "date" | "x-request-id" | "connection" | "keep-alive" | "transfer-encoding") {
            continue;
        }
        fields.push((name.into_bytes(), value.trim().as_bytes().to_vec()));
    }
    Ok(Answer { fields, body: buf[end..].to_vec(), path: path.as_bytes().to_vec() })
}

// ------------------------------------------------------------------ the loop

struct Conn {
    stream: TcpStream,
    codec: Codec,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
}

impl Service for Shared {
    type Conn = Conn;

    fn open(&mut self, stream: TcpStream) -> Conn {
        let mut out = Vec::with_capacity(READ_CHUNK);
        Codec::start(&mut out);
        Conn { stream, codec: Codec::new(), inbuf: Vec::new(), out, sent: 0 }
    }

    fn stream(conn: &mut Conn) -> &mut TcpStream {
        &mut conn.stream
    }

    /// Read until `WouldBlock`, run the codec, write until `WouldBlock`.
    fn ready(&mut self, c: &mut Conn) -> bool {
        let mut open = true;
        loop {
            let len = c.inbuf.len();
            c.inbuf.resize(len + READ_CHUNK, 0);
            match c.stream.read(&mut c.inbuf[len..]) {
                Ok(0) => {
                    c.inbuf.truncate(len);
                    open = false;
                    break;
                }
                Ok(n) => c.inbuf.truncate(len + n),
                Err(e) => {
                    c.inbuf.truncate(len);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => break,
                        io::ErrorKind::Interrupted => {}
                        _ => return false,
                    }
                }
            }
        }
        if c.codec.on_bytes(&mut c.inbuf, &mut c.out, self) == Next::Close {
            open = false;
        }
        if !write_out(&mut c.stream, &mut c.out, &mut c.sent) {
            return false;
        }
        open || c.sent < c.out.len()
    }

    fn turn(&mut self) {
        self.tick();
    }
}

fn main() {
    let (args, answer) = match Args::parse(USAGE).and_then(|a| {
        let (Some(from), None) = (a.copy_from, &a.response) else {
            eprintln!("usage: {USAGE}");
            std::process::exit(2)
        };
        let answer = copy_answer(from, &a.path)?;
        Ok((a, answer))
    }) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("h2ceiling: {e}");
            std::process::exit(1)
        }
    };
    let answer: &'static Answer = Box::leak(Box::new(answer));
    eprintln!(
        "h2ceiling: {} threads on {}, {} fixed fields ({} bytes of HPACK table), {} body bytes",
        args.threads,
        args.listen,
        answer.fields.len(),
        fixed_size(answer),
        answer.body.len()
    );
    mio_serve::run("h2ceiling", args.threads, args.listen, move || Shared::new(answer));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> &'static Answer {
        Box::leak(Box::new(Answer {
            fields: vec![
                (b"content-type".to_vec(), b"application/json".to_vec()),
                (b"server".to_vec(), b"forkd".to_vec()),
                (b"x-frame-options".to_vec(), b"DENY".to_vec()),
            ],
            body: b"{\"status\":\"ok\"}".to_vec(),
            path: b"/health".to_vec(),
        }))
    }

    /// A GET for `path` on `stream` as a client's first request: literal
    /// fields with incremental indexing, the path Huffman-coded.
    fn get(stream: u32, path: &str) -> Vec<u8> {
        let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
        put_int(&mut block, 0x40, 6, 4);
        put_huffman(&mut block, path.as_bytes());
        put_int(&mut block, 0x40, 6, 1);
        block.extend_from_slice(&[9]);
        block.extend_from_slice(b"localhost");
        let mut f = Vec::new();
        frame_head(&mut f, block.len(), HEADERS, END_HEADERS | END_STREAM, stream);
        f.extend_from_slice(&block);
        f
    }

    /// The frames in `out`: (type, flags, stream, payload).
    fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while out.len() >= 9 {
            let len = (out[0] as usize) << 16 | (out[1] as usize) << 8 | out[2] as usize;
            let stream = u32::from_be_bytes([out[5], out[6], out[7], out[8]]);
            v.push((out[3], out[4], stream, out[9..9 + len].to_vec()));
            out = &out[9 + len..];
        }
        v
    }

    #[test]
    fn two_gets_are_answered_and_the_second_head_is_indices_and_two_literals() {
        let mut shared = Shared::new(answer());
        let mut codec = Codec::new();
        let mut input = PREFACE.to_vec();
        frame_head(&mut input, 0, SETTINGS, 0, 0);
        input.extend(get(1, "/health"));
        input.extend(get(3, "/health"));
        let mut out = Vec::new();
        assert_eq!(codec.on_bytes(&mut input, &mut out, &mut shared), Next::Read);
        assert!(input.is_empty());
        let f = frames(&out);
        let kinds: Vec<_> = f.iter().map(|x| (x.0, x.2)).collect();
        assert_eq!(kinds, [(SETTINGS, 0), (HEADERS, 1), (DATA, 1), (HEADERS, 3), (DATA, 3)]);
        // The client's decoder sees every field of both answers.
        let mut client = Decoder::new(DECODER_TABLE);
        for head in [&f[1].3, &f[3].3] {
            let mut seen = Vec::new();
            client.decode(head, usize::MAX, |n, v| seen.push((n.to_vec(), v.to_vec()))).expect("our own block decodes");
            let names: Vec<_> = seen.iter().map(|(n, _)| String::from_utf8_lossy(n).into_owned()).collect();
            assert_eq!(names, [":status", "date", "x-request-id", "content-type", "server", "x-frame-options"]);
            assert_eq!(seen[2].1.len(), 36);
        }
        // Second head: :status (1) + date + request id + three one-byte indices.
        assert!(f[3].3.len() < f[1].3.len());
        assert_eq!(&f[3].3[f[3].3.len() - 3..], &[0x80 | 64, 0x80 | 63, 0x80 | 62]);
        assert_eq!(f[2].3, b"{\"status\":\"ok\"}");
        assert_ne!(f[1].3[..], f[3].3[..]);
    }

    #[test]
    fn another_path_gets_404_and_a_ping_its_ack() {
        let mut shared = Shared::new(answer());
        let mut codec = Codec::new();
        let mut input = PREFACE.to_vec();
        input.extend(get(1, "/nope"));
        frame_head(&mut input, 8, PING, 0, 0);
        input.extend_from_slice(b"12345678");
        let mut out = Vec::new();
        codec.on_bytes(&mut input, &mut out, &mut shared);
        let f = frames(&out);
        assert_eq!((f[0].0, f[0].1 & END_STREAM, f[0].3[0]), (HEADERS, END_STREAM, 0x80 | 13));
        assert_eq!((f[1].0, f[1].1, &f[1].3[..]), (PING, ACK, &b"12345678"[..]));
    }

    #[test]
    fn a_body_waits_for_the_window_and_goes_when_it_opens() {
        let mut shared = Shared::new(answer());
        let mut codec = Codec::new();
        let mut input = PREFACE.to_vec();
        frame_head(&mut input, 6, SETTINGS, 0, 0);
        input.extend_from_slice(&[0, 4, 0, 0, 0, 0]); // INITIAL_WINDOW_SIZE 0
        input.extend(get(1, "/health"));
        let mut out = Vec::new();
        codec.on_bytes(&mut input, &mut out, &mut shared);
        assert_eq!(frames(&out).iter().map(|x| x.0).collect::<Vec<_>>(), [SETTINGS]);
        out.clear();
        window_update(&mut input, 1, 100);
        codec.on_bytes(&mut input, &mut out, &mut shared);
        assert_eq!(frames(&out).iter().map(|x| x.0).collect::<Vec<_>>(), [HEADERS, DATA]);
    }

    #[test]
    fn bad_input_ends_the_connection_with_the_documented_goaway() {
        let mut shared = Shared::new(answer());
        for (bytes, code) in [
            (vec![0, 0x40, 1, HEADERS, 0, 0, 0, 0, 1], H2Error::FrameSize), // longer than 16 KiB
            (vec![0, 0, 1, HEADERS, END_HEADERS, 0, 0, 0, 1, 0xbf], H2Error::Compression), // index 63: empty table
            (vec![0, 0, 0, HEADERS, END_HEADERS, 0, 0, 0, 2], H2Error::Protocol), // an even stream id
        ] {
            let mut codec = Codec::new();
            let mut input = PREFACE.to_vec();
            input.extend(bytes);
            let mut out = Vec::new();
            assert_eq!(codec.on_bytes(&mut input, &mut out, &mut shared), Next::Close);
            let f = frames(&out);
            assert_eq!(
                (f[0].0, u32::from_be_bytes([f[0].3[4], f[0].3[5], f[0].3[6], f[0].3[7]])),
                (GOAWAY, code as u32)
            );
        }
    }
}
