//! A WebSocket (RFC 6455) client over a raw TCP connection: the handshake, masked frames
//! out, server frames in, and the chat endpoint's greeting. HTTP/1.1 upgrades only:
//! WebSocket over HTTP/2 is `http2::ws_connect`.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use base64::Engine as _;

use serde_json::Value;

use super::*;

pub const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for `key`.
pub fn ws_accept(key: &str) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(key.as_bytes());
    h.update(WS_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    use rand::RngCore;
    let mut b = [0u8; N];
    rand::thread_rng().fill_bytes(&mut b);
    b
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsFrame {
    Text(String),
    Binary(Vec<u8>),
    /// Close code (None when the payload is empty) and reason.
    Close(Option<u16>, String),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

/// A WebSocket client over a raw TcpStream: masked frames out, server frames in.
pub struct Ws {
    pub stream: TcpStream,
    pub head: Response,
    buf: Vec<u8>,
    /// The server's close frame, once seen.
    pub closed: Option<WsFrame>,
}

/// The handshake request for `path` (extra headers after the standard ones) and its key.
pub fn ws_handshake_request(path: &str, headers: &[(&str, &str)]) -> (Vec<u8>, String) {
    let key = base64::engine::general_purpose::STANDARD.encode(rand_bytes::<16>());
    let mut h: Vec<(&str, &str)> = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", &key),
        ("Sec-WebSocket-Version", "13"),
    ];
    h.extend_from_slice(headers);
    (request("GET", path, &h, b""), key)
}

/// Appends one client frame to `out`: FIN as given, masked with a random key.
pub fn ws_client_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8], fin: bool) {
    out.push(if fin { 0x80 } else { 0 } | (opcode & 0x0f));
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else if n <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    let mask = rand_bytes::<4>();
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

impl Ws {
    /// Handshake on `conn`. `Err(response)` when the server does not answer 101 (then the
    /// whole response is read); panics when a 101 carries a wrong `Sec-WebSocket-Accept`.
    pub fn connect_on(mut conn: Conn, path: &str, headers: &[(&str, &str)]) -> Result<Ws, Response> {
        let (req, key) = ws_handshake_request(path, headers);
        conn.send(&req);
        let head = conn.read_head_response();
        if head.status != 101 {
            let mut r = head;
            if let Some(n) = r.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
                while conn.buf.len() < n && conn.fill().map(|k| k > 0).unwrap_or(false) {}
                r.body = conn.buf.drain(..n.min(conn.buf.len())).collect();
            } else if r.header("transfer-encoding").is_some() {
                r.body = conn.read_chunked().unwrap_or_default();
            }
            return Err(r);
        }
        assert_eq!(
            head.header("sec-websocket-accept"),
            Some(ws_accept(&key).as_str()),
            "101 with a wrong Sec-WebSocket-Accept: {head:?}"
        );
        let buf = std::mem::take(&mut conn.buf);
        let stream = conn.stream.try_clone().expect("clone stream");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        Ok(Ws { stream, head, buf, closed: None })
    }

    /// Bytes received but not yet parsed into frames (the caller reads the rest itself).
    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Writes one frame: FIN as given, masked with a random key.
    pub fn send_frame(&mut self, opcode: u8, payload: &[u8], fin: bool) -> io::Result<()> {
        let mut f = Vec::with_capacity(payload.len() + 14);
        ws_client_frame(&mut f, opcode, payload, fin);
        self.stream.write_all(&f)?;
        self.stream.flush()
    }

    pub fn send_text(&mut self, s: &str) {
        self.send_frame(0x1, s.as_bytes(), true).expect("WebSocket write (text)");
    }

    pub fn send_json(&mut self, v: &Value) {
        self.send_text(&v.to_string());
    }

    pub fn send_binary(&mut self, b: &[u8]) {
        self.send_frame(0x2, b, true).expect("WebSocket write (binary)");
    }

    pub fn ping(&mut self, payload: &[u8]) {
        self.send_frame(0x9, payload, true).expect("WebSocket write (ping)");
    }

    /// Sends a close frame with `code` (the server should answer with its own).
    pub fn close(&mut self, code: u16) {
        let _ = self.send_frame(0x8, &code.to_be_bytes(), true);
    }

    fn fill(&mut self, deadline: Instant) -> io::Result<()> {
        let now = Instant::now();
        if now >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline"));
        }
        self.stream.set_read_timeout(Some(deadline - now)).unwrap();
        let mut tmp = [0u8; 65536];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF")),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// One raw frame: (fin, opcode, payload). Server frames must not be masked.
    fn read_raw(&mut self, deadline: Instant) -> io::Result<(bool, u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 2 {
                let b0 = self.buf[0];
                let b1 = self.buf[1];
                if b1 & 0x80 != 0 {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "server frame is masked"));
                }
                let (len, hl) = match b1 & 0x7f {
                    126 if self.buf.len() >= 4 => (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4),
                    127 if self.buf.len() >= 10 => {
                        (u64::from_be_bytes(self.buf[2..10].try_into().unwrap()) as usize, 10)
                    }
                    126 | 127 => (usize::MAX, 0),
                    n => (n as usize, 2),
                };
                if len != usize::MAX && self.buf.len() >= hl + len {
                    let payload = self.buf[hl..hl + len].to_vec();
                    self.buf.drain(..hl + len);
                    return Ok((b0 & 0x80 != 0, b0 & 0x0f, payload));
                }
            }
            self.fill(deadline)?;
        }
    }

    /// The next frame or whole message (continuations joined) within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<WsFrame> {
        let deadline = Instant::now() + timeout;
        let mut msg: Option<(u8, Vec<u8>)> = None;
        loop {
            let (fin, op, payload) = self.read_raw(deadline)?;
            let frame = match op {
                0x0 => {
                    let Some((_, m)) = msg.as_mut() else {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "continuation without a start"));
                    };
                    m.extend_from_slice(&payload);
                    if !fin {
                        continue;
                    }
                    let (op, m) = msg.take().unwrap();
                    (op, m)
                }
                0x1 | 0x2 if !fin => {
                    msg = Some((op, payload));
                    continue;
                }
                _ => (op, payload),
            };
            return Ok(match frame {
                (0x1, p) => WsFrame::Text(
                    String::from_utf8(p).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "text not UTF-8"))?,
                ),
                (0x2, p) => WsFrame::Binary(p),
                (0x8, p) => {
                    let code = (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]));
                    let reason = String::from_utf8_lossy(p.get(2..).unwrap_or(&[])).into_owned();
                    let f = WsFrame::Close(code, reason);
                    self.closed = Some(f.clone());
                    f
                }
                (0x9, p) => WsFrame::Ping(p),
                (0xA, p) => WsFrame::Pong(p),
                (op, _) => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("opcode {op:#x}"))),
            });
        }
    }

    /// The next text message parsed as JSON, answering pings and skipping pongs. `Err` on a
    /// close, a binary message, a timeout or a read error.
    pub fn recv_json(&mut self, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left.max(Duration::from_millis(1))) {
                Ok(WsFrame::Text(t)) => {
                    return serde_json::from_str(&t).map_err(|e| format!("text message is not JSON ({e}): {t:?}"))
                }
                Ok(WsFrame::Ping(p)) => {
                    let _ = self.send_frame(0xA, &p, true);
                }
                Ok(WsFrame::Pong(_)) => {}
                Ok(other) => return Err(format!("expected a JSON text message, got {other:?}")),
                Err(e) if is_timeout(&e) => return Err(format!("no message within {timeout:?}")),
                Err(e) => return Err(format!("read error: {e}")),
            }
        }
    }

    /// Waits for the server's close frame (skipping data, pings, pongs) within `timeout`.
    pub fn expect_close_frame(&mut self, timeout: Duration) -> Result<(Option<u16>, String), String> {
        let deadline = Instant::now() + timeout;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left.max(Duration::from_millis(1))) {
                Ok(WsFrame::Close(c, r)) => return Ok((c, r)),
                Ok(f) => skipped.push(f),
                Err(e) => return Err(format!("no close frame ({e}); frames before: {skipped:?}")),
            }
        }
    }
}

impl Server {
    /// Opens a WebSocket on a fresh connection: `Err(response)` when not upgraded.
    pub fn ws_try(&self, path: &str, headers: &[(&str, &str)]) -> Result<Ws, Response> {
        Ws::connect_on(self.conn(), path, headers)
    }

    /// `/ws?token=…`, asserting 101 and the `connected` greeting (returned).
    pub fn ws_chat(&self, token: &str) -> (Ws, Value) {
        let path = format!("/ws?token={}", urlencode(token));
        let mut ws = self
            .ws_try(&path, &[])
            .unwrap_or_else(|r| panic!("GET /ws: expected 101, got {r:?}\nlog:\n{}", self.log_tail()));
        let hello = ws
            .recv_json(IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("/ws: the first message: {e}\nlog:\n{}", self.log_tail()));
        (ws, hello)
    }
}

mod selftest_streams {
    use super::*;

    #[test]
    fn harness_ws_accept_matches_rfc6455_example() {
        assert_eq!(ws_accept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}
