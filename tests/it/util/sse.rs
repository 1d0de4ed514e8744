//! Server-sent events read by a client: `SseStream` (one open `text/event-stream`,
//! de-chunked and parsed as it arrives, over any protocol) and `SseEvent`. It parses what
//! comes; what the events must say is the tests' part.

use std::net::TcpStream;

use serde_json::{json, Value};

use quinn_proto::StreamId;

use super::http2::{H2Client, H2Response, H2_DROPPED};
use super::http3::{h3_fields, h3_response, is_informational, H3Client, H3Response};
use super::*;

/// One SSE event: the fields in order of arrival, plus the usual accessors.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub fields: Vec<(String, String)>,
}

impl SseEvent {
    /// One event block (its lines, without the blank line that ended it); comment and
    /// empty lines are skipped.
    pub fn parse(block: &str) -> SseEvent {
        let mut ev = SseEvent::default();
        for line in block.split('\n') {
            if line.starts_with(':') || line.is_empty() {
                continue;
            }
            let (k, v) = match line.split_once(':') {
                Some((k, v)) => (k, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            ev.fields.push((k.to_string(), v.to_string()));
        }
        ev
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    pub fn event(&self) -> Option<&str> {
        self.get("event")
    }
    pub fn id(&self) -> Option<&str> {
        self.get("id")
    }
    /// The `data` lines joined with `\n` ("" when none).
    pub fn data(&self) -> String {
        self.fields.iter().filter(|(k, _)| k == "data").map(|(_, v)| v.as_str()).collect::<Vec<_>>().join("\n")
    }
    pub fn data_json(&self) -> Value {
        serde_json::from_str(&self.data()).unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {self:?}"))
    }
}

/// An open `text/event-stream` response, de-chunked and parsed incrementally: on an
/// HTTP/1.1 connection, or one stream of an HTTP/2 or HTTP/3 connection (its DATA frames).
pub struct SseStream {
    src: SseSrc,
    pub head: Response,
    text: Vec<u8>,
    chunked: bool,
    ended: bool,
}

enum SseSrc {
    H1(Conn),
    H2(Box<(H2Client, ::h2::RecvStream)>),
    H3(Box<H3Src>),
}

/// One request stream of an HTTP/3 connection and how much of its body is in `text`.
struct H3Src {
    c: H3Client,
    id: StreamId,
    taken: usize,
}

impl SseStream {
    /// Sends `GET path` with `headers` on `conn` and reads the response head. `Err(resp)` (the
    /// whole response) when it is not a 200 stream.
    pub fn open_on(mut conn: Conn, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        conn.send(&request("GET", path, headers, b""));
        let head = conn.read_head_response();
        let is_stream =
            head.status == 200 && media_type(head.header("content-type")).as_deref() == Some("text/event-stream");
        let chunked = head
            .header("transfer-encoding")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked"))
            .unwrap_or(false);
        if !is_stream {
            // Read the rest of a normal response for the error message.
            let mut head = head;
            if chunked {
                head.body = conn.read_chunked().unwrap_or_default();
            } else if let Some(n) = head.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
                while conn.buf.len() < n && conn.fill().map(|k| k > 0).unwrap_or(false) {}
                head.body = conn.buf.drain(..n.min(conn.buf.len())).collect();
            }
            return Err(head);
        }
        Ok(SseStream { src: SseSrc::H1(conn), head, text: Vec::new(), chunked, ended: false })
    }

    /// Sends `GET path` with `headers` as a new stream of `c` and waits for the response
    /// head. `Err(resp)` (the whole response) when it is not a 200 stream.
    pub fn open_h2(mut c: H2Client, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        let mut b = http::Request::builder().method("GET").uri(format!("http://{}{path}", c.addr));
        for (k, v) in headers.iter().filter(|(k, _)| !H2_DROPPED.iter().any(|d| k.eq_ignore_ascii_case(d))) {
            b = b.header(*k, *v);
        }
        let req = b.body(()).unwrap_or_else(|e| panic!("GET {path}: not a valid HTTP/2 request: {e}"));
        let (mut rf, _send) = c.start(req, true);
        let resp = c.head(&mut rf).unwrap_or_else(|e| panic!("GET {path} over h2c: {e}"));
        let (parts, mut recv) = resp.into_parts();
        let mut head =
            h2_response(H2Response { status: parts.status.as_u16(), headers: parts.headers, body: Vec::new() });
        let is_stream =
            head.status == 200 && media_type(head.header("content-type")).as_deref() == Some("text/event-stream");
        if !is_stream {
            head.body = c.body(&mut recv);
            return Err(head);
        }
        Ok(SseStream { src: SseSrc::H2(Box::new((c, recv))), head, text: Vec::new(), chunked: false, ended: false })
    }

    /// Sends `GET path` with `headers` as a new stream of `c` and waits for the response
    /// head. `Err(resp)` (the whole response) when it is not a 200 stream.
    pub fn open_h3(mut c: H3Client, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        let fields = h3_fields("GET", path, headers, 0);
        let head: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let id = c.request(&head, b"");
        let final_head = |c: &H3Client| c.partial(id).heads.last().is_some_and(|h| !is_informational(h));
        c.run_until(Instant::now() + IO_TIMEOUT, |c| {
            final_head(c) || c.lost.is_some() || c.streams.get(&id).is_some_and(|s| s.fin || s.reset.is_some())
        });
        let partial = c.partial(id);
        let Some(mut head) = h3_response(H3Response { heads: partial.heads, body: Vec::new() }) else {
            panic!("GET {path} over HTTP/3: no response head: {:?}", c.streams.get(&id));
        };
        let is_stream =
            head.status == 200 && media_type(head.header("content-type")).as_deref() == Some("text/event-stream");
        if !is_stream {
            head.body = c.try_response(id, Instant::now() + IO_TIMEOUT).map(|r| r.body).unwrap_or_default();
            return Err(head);
        }
        let src = SseSrc::H3(Box::new(H3Src { c, id, taken: 0 }));
        Ok(SseStream { src, head, text: Vec::new(), chunked: false, ended: false })
    }

    /// The HTTP/1.1 connection under the stream (panics for another protocol).
    pub fn h1_conn(&mut self) -> &mut Conn {
        match &mut self.src {
            SseSrc::H1(c) => c,
            _ => panic!("an HTTP/2 or HTTP/3 event stream has no HTTP/1.1 connection"),
        }
    }

    /// The TCP socket the stream arrives on (panics for HTTP/3, which has none).
    pub fn tcp(&self) -> &TcpStream {
        match &self.src {
            SseSrc::H1(c) => &c.stream,
            SseSrc::H2(b) => b.0.tcp(),
            SseSrc::H3(_) => panic!("an HTTP/3 event stream has no TCP socket"),
        }
    }

    /// Cuts the connection under the stream, as a client that goes away (HTTP/3: closes
    /// the QUIC connection).
    pub fn shutdown(&mut self) {
        match &mut self.src {
            SseSrc::H3(s) => s.c.close(0x100),
            _ => {
                let _ = self.tcp().shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Reads what arrives within `wait` into `text` (HTTP/2: the stream's DATA).
    fn fill_for(&mut self, wait: Duration) -> Result<(), String> {
        match &mut self.src {
            SseSrc::H1(conn) => {
                conn.stream.set_read_timeout(Some(wait.max(Duration::from_millis(1)))).unwrap();
                let r = conn.fill();
                conn.stream.set_read_timeout(Some(conn.timeout)).unwrap();
                match r {
                    Ok(_) => Ok(()),
                    Err(e) if is_timeout(&e) => Ok(()),
                    Err(e) => Err(format!("read error: {e}")),
                }
            }
            SseSrc::H2(b) => {
                let (c, recv) = &mut **b;
                let until = Instant::now() + wait;
                let had = self.text.len();
                loop {
                    match c.body_now(recv, &mut self.text) {
                        Ok(true) => {
                            self.ended = true;
                            return Ok(());
                        }
                        Ok(false) => {}
                        Err(e) => return Err(format!("stream error: {e}")),
                    }
                    if c.eof {
                        self.ended = true;
                        return Ok(());
                    }
                    if self.text.len() > had || Instant::now() >= until {
                        return Ok(());
                    }
                    c.pump();
                }
            }
            SseSrc::H3(s) => {
                let until = Instant::now() + wait;
                loop {
                    let body = s.c.partial(s.id).body;
                    if body.len() > s.taken {
                        self.text.extend_from_slice(&body[s.taken..]);
                        s.taken = body.len();
                        return Ok(());
                    }
                    let got = &s.c.streams[&s.id];
                    if let Some(code) = got.reset {
                        return Err(format!("stream reset with code {code:#x}"));
                    }
                    if got.fin || s.c.lost.is_some() {
                        self.ended = true;
                        return Ok(());
                    }
                    if Instant::now() >= until {
                        return Ok(());
                    }
                    s.c.step(until);
                }
            }
        }
    }

    /// Moves de-chunked bytes from the connection buffer into `text`. Ok(false) when the
    /// body has ended (last chunk or EOF).
    fn dechunk(&mut self) -> Result<(), String> {
        let SseSrc::H1(conn) = &mut self.src else { return Ok(()) };
        if !self.chunked {
            self.text.append(&mut conn.buf);
            return Ok(());
        }
        loop {
            let buf = &conn.buf;
            let Some(le) = find(buf, b"\r\n") else { return Ok(()) };
            let line = String::from_utf8_lossy(&buf[..le]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
                .map_err(|_| format!("bad chunk size line {line:?}"))?;
            if size == 0 {
                self.ended = true;
                conn.buf.clear();
                return Ok(());
            }
            if buf.len() < le + 2 + size + 2 {
                return Ok(());
            }
            if &buf[le + 2 + size..le + 2 + size + 2] != b"\r\n" {
                return Err(format!("chunk of {size} bytes not followed by CRLF"));
            }
            self.text.extend_from_slice(&buf[le + 2..le + 2 + size]);
            conn.buf.drain(..le + 2 + size + 2);
        }
    }

    /// Takes one complete event (a block ended by a blank line) from `text`, if any.
    /// Blocks holding only comments are skipped.
    fn take_event(&mut self) -> Option<SseEvent> {
        loop {
            // CRLF line ends become LF (on bytes, so a UTF-8 sequence split across reads stays
            // intact); then the first blank line ends an event.
            if find(&self.text, b"\r\n").is_some() {
                let mut t = Vec::with_capacity(self.text.len());
                for (i, &b) in self.text.iter().enumerate() {
                    if !(b == b'\r' && self.text.get(i + 1) == Some(&b'\n')) {
                        t.push(b);
                    }
                }
                self.text = t;
            }
            let end = find(&self.text, b"\n\n")?;
            let ev = SseEvent::parse(&String::from_utf8_lossy(&self.text[..end]));
            self.text.drain(..end + 2);
            if !ev.fields.is_empty() {
                return Some(ev);
            }
        }
    }

    /// The next event within `timeout`. `Err` on timeout, EOF or a framing error.
    pub fn next(&mut self, timeout: Duration) -> Result<SseEvent, String> {
        let deadline = Instant::now() + timeout;
        loop {
            self.dechunk()?;
            if let Some(ev) = self.take_event() {
                return Ok(ev);
            }
            let eof = matches!(&self.src, SseSrc::H1(c) if c.eof);
            if self.ended || eof {
                return Err(format!(
                    "stream ended; unparsed: {:?}",
                    String::from_utf8_lossy(tail_bytes(&self.text, 400))
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "no complete event within {timeout:?}; unparsed: {:?}",
                    String::from_utf8_lossy(tail_bytes(&self.text, 400))
                ));
            }
            self.fill_for(deadline - now)?;
        }
    }

    /// The next event that is not a heartbeat, within `timeout`.
    pub fn next_non_heartbeat(&mut self, timeout: Duration) -> Result<SseEvent, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.next(left)?;
            if ev.event() != Some("heartbeat") {
                return Ok(ev);
            }
        }
    }

    /// Reads the preamble (`retry`, `connected`): asserts it and returns the retry value.
    pub fn expect_preamble(&mut self) -> Result<String, String> {
        let first = self.next(IO_TIMEOUT)?;
        let retry = first
            .fields
            .first()
            .filter(|(k, _)| k == "retry")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("the first field must be `retry`: {first:?}"))?;
        let connected = if first.event() == Some("connected") { first } else { self.next(IO_TIMEOUT)? };
        if connected.event() != Some("connected") {
            return Err(format!("expected `event: connected` after retry, got {connected:?}"));
        }
        let d: Value =
            serde_json::from_str(&connected.data()).map_err(|e| format!("connected data ({e}): {connected:?}"))?;
        if d != json!({"message": "connected"}) {
            return Err(format!("connected data must be {{\"message\":\"connected\"}}: {connected:?}"));
        }
        Ok(retry)
    }
}

impl Session {
    /// `GET path` (with `headers`) as an event stream on this connection. `Err(the whole
    /// response)` unless it is a 200 `text/event-stream`.
    pub fn into_sse(self, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        match self {
            Session::H1(c) => SseStream::open_on(c, path, headers),
            Session::H2(c) => SseStream::open_h2(*c, path, headers),
            Session::H3(c) => SseStream::open_h3(*c, path, headers),
        }
    }
}

impl Server {
    /// `GET path` (with `headers`) as an event stream on a fresh connection, in this server's
    /// protocol. `Err(the whole response)` unless it is a 200 `text/event-stream`.
    pub fn sse_at(&self, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        self.session().into_sse(path, headers)
    }

    /// Opens `GET /api/events` (with `headers`) on a fresh connection; panics unless 200
    /// `text/event-stream`. The preamble is not read.
    pub fn sse(&self, headers: &[(&str, &str)]) -> SseStream {
        match self.sse_at("/api/events", headers) {
            Ok(s) => s,
            Err(r) => panic!("GET /api/events: expected a 200 text/event-stream, got {r:?}\nlog:\n{}", self.log_tail()),
        }
    }

    /// Like [`Server::sse`], then reads and checks the preamble.
    pub fn sse_connected(&self, headers: &[(&str, &str)]) -> SseStream {
        let mut s = self.sse(headers);
        if let Err(e) = s.expect_preamble() {
            panic!("GET /api/events preamble: {e}\nlog:\n{}", self.log_tail());
        }
        s
    }

    /// `POST /api/v1/notifications` as `token`; asserts 201; returns `data`.
    pub fn notify(&self, token: &str, title: &str, body: &str) -> Value {
        let r = self.api("POST", "/api/v1/notifications", Some(token), Some(&json!({"title": title, "body": body})));
        self.expect_data(&r, 201, &format!("POST /api/v1/notifications {title:?}"))
    }
}
