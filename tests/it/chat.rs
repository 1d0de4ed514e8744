//! `POST /api/chat` (CONTRACT §6): validation before any upstream is contacted (415, 400,
//! 422 with field names), the SSE response (`data: {"content":…}` per chunk, `data: [DONE]`,
//! the chunked body ends, keep-alive), the built-in echo (word by word, streamed
//! `echo_delay_ms` apart), the relay to an OpenAI-compatible upstream (request body, deltas
//! forwarded as they arrive, deltas without content skipped), upstream failures before the
//! first chunk (502 / 504 JSON errors) and after it (`event: error`, no `[DONE]`), and a
//! client that goes away cancelling the upstream request.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use quinn_proto::StreamId;

use crate::h2util::{H2Client, H2Response};
use crate::h3client::{h3_fields, h3_response, is_informational, H3Client, H3Response};
use crate::upstream::*;
use crate::util::*;

const UPSTREAM_PATH: &str = "/v1/chat/completions";
const ZERO: Duration = Duration::ZERO;

// ---------------------------------------------------------------------------------------
// Servers and bodies
// ---------------------------------------------------------------------------------------

/// A server with the built-in echo, `echo_delay_ms = delay_ms`.
fn echo_server(delay_ms: u64) -> Server {
    Server::api_builder().set("chat", &format!("echo_delay_ms = {delay_ms}")).start()
}

/// A server relaying to `url` (a full URL) with model `m1` and `upstreams.timeout_ms = 400`.
fn relay_server_to(url: &str) -> Server {
    relay_server_timeout(url, 400)
}

/// A server relaying to `url` with model `m1` and `upstreams.timeout_ms = timeout_ms`.
fn relay_server_timeout(url: &str, timeout_ms: u64) -> Server {
    Server::api_builder()
        .set("chat", &format!("upstream = \"{url}\"\nmodel = \"m1\""))
        .set("upstreams", &format!("timeout_ms = {timeout_ms}"))
        .start()
}

fn relay_server(up: &Upstream) -> Server {
    relay_server_to(&format!("{}{UPSTREAM_PATH}", up.url()))
}

fn user_msg(content: &str) -> Value {
    json!({"role": "user", "content": content})
}

fn body_of(messages: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "messages": messages })).unwrap()
}

/// One upstream SSE event carrying `content` as a delta.
fn delta(content: &str) -> String {
    format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": content}}]}))
}

const ROLE_DELTA: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const UPSTREAM_DONE: &str = "data: [DONE]\n\n";

/// An upstream streaming `contents` as deltas (`gap` before each but the first), then
/// `[DONE]`, for every request.
fn streaming_upstream(contents: &[&str], gap: Duration) -> Upstream {
    let mut pieces: Vec<(Duration, String)> =
        contents.iter().enumerate().map(|(i, c)| (if i == 0 { ZERO } else { gap }, delta(c))).collect();
    pieces.push((ZERO, UPSTREAM_DONE.to_string()));
    Upstream::start(move |_| Behaviour::sse(pieces.clone(), After::Finish))
}

// ---------------------------------------------------------------------------------------
// A client for the streamed POST response
// ---------------------------------------------------------------------------------------

/// The response of a `POST /api/chat` read incrementally: the head, then SSE events as
/// their bytes arrive (each stamped with the time of the read that completed it). Over
/// HTTP/1.1 a chunked body on a connection; over HTTP/2 the DATA of one stream.
struct ChatStream {
    src: Src,
    head: Response,
    /// The body has an end of its own: chunked over HTTP/1.1, END_STREAM over HTTP/2 (not
    /// delimited by the connection's close).
    chunked: bool,
    /// Bytes received, not yet de-chunked.
    raw: Vec<u8>,
    /// De-chunked body text, not yet parsed into events.
    text: Vec<u8>,
    /// `text[..clean]` has its CRLFs already turned into LFs (so each event costs
    /// only its own bytes, not the whole buffer).
    clean: usize,
    /// The body ended (last chunk and trailers read).
    ended: bool,
    eof: bool,
    last_read: Instant,
    /// HTTP/2: the stream ended (END_STREAM), or why it failed.
    h2_end: Option<Result<(), String>>,
}

enum Src {
    H1(Conn),
    H2(Box<(H2Client, h2::RecvStream)>),
    H3(Box<H3Src>),
}

/// One request stream of an HTTP/3 connection and how much of its body is in `raw`.
struct H3Src {
    c: H3Client,
    id: StreamId,
    taken: usize,
}

impl ChatStream {
    /// `POST /api/chat` with `body` on a fresh connection, in the server's protocol.
    fn open(s: &Server, body: &[u8]) -> Result<ChatStream, Response> {
        match s.proto() {
            Proto::H1 => Self::open_on(s.conn(), body),
            Proto::H2c => Self::open_h2(s.h2c(), body),
            Proto::H3 => Self::open_h3(s.h3(), body),
        }
    }

    /// `POST /api/chat` on a connection that already served a whole response.
    fn open_in(session: Session, body: &[u8]) -> Result<ChatStream, Response> {
        match session {
            Session::H1(c) => Self::open_on(c, body),
            Session::H2(c) => Self::open_h2(*c, body),
            Session::H3(c) => Self::open_h3(*c, body),
        }
    }

    /// `POST /api/chat` as a new stream of `c`. `Err(the whole response)` unless it is a
    /// 200 `text/event-stream`.
    fn open_h2(mut c: H2Client, body: &[u8]) -> Result<ChatStream, Response> {
        let req = c.build(
            "POST",
            "/api/chat",
            &[("content-type", "application/json"), ("content-length", &body.len().to_string())],
        );
        let (mut rf, mut send) = c.start(req, false);
        let _ = c.try_send_body(&mut send, body, Instant::now() + IO_TIMEOUT);
        let resp = c.head(&mut rf).unwrap_or_else(|e| panic!("POST /api/chat over h2c: {e}"));
        let (parts, recv) = resp.into_parts();
        let head = h2_response(H2Response { status: parts.status.as_u16(), headers: parts.headers, body: Vec::new() });
        let st = ChatStream {
            src: Src::H2(Box::new((c, recv))),
            head,
            chunked: true,
            raw: Vec::new(),
            text: Vec::new(),
            clean: 0,
            ended: false,
            eof: false,
            last_read: Instant::now(),
            h2_end: None,
        };
        let is_stream =
            st.head.status == 200 && media_type(st.head.header("content-type")).as_deref() == Some("text/event-stream");
        if !is_stream {
            return Err(st.whole_response());
        }
        Ok(st)
    }

    /// `POST /api/chat` as a new stream of `c`. `Err(the whole response)` unless it is a
    /// 200 `text/event-stream`.
    fn open_h3(mut c: H3Client, body: &[u8]) -> Result<ChatStream, Response> {
        let fields = h3_fields("POST", "/api/chat", &[("content-type", "application/json")], body.len());
        let head: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let id = c.request(&head, body);
        c.run_until(Instant::now() + IO_TIMEOUT, |c| {
            c.partial(id).heads.last().is_some_and(|h| !is_informational(h))
                || c.lost.is_some()
                || c.streams.get(&id).is_some_and(|s| s.fin || s.reset.is_some())
        });
        let heads = c.partial(id).heads;
        let head = h3_response(H3Response { heads, body: Vec::new() })
            .unwrap_or_else(|| panic!("POST /api/chat over HTTP/3: no response head: {:?}", c.streams.get(&id)));
        let st = ChatStream {
            src: Src::H3(Box::new(H3Src { c, id, taken: 0 })),
            head,
            chunked: true,
            raw: Vec::new(),
            text: Vec::new(),
            clean: 0,
            ended: false,
            eof: false,
            last_read: Instant::now(),
            h2_end: None,
        };
        let is_stream =
            st.head.status == 200 && media_type(st.head.header("content-type")).as_deref() == Some("text/event-stream");
        if !is_stream {
            return Err(st.whole_response());
        }
        Ok(st)
    }

    /// Whether the body is the DATA of one stream (HTTP/2 or HTTP/3), ended by the
    /// stream's end rather than by chunked framing.
    fn is_h2(&self) -> bool {
        matches!(self.src, Src::H2(_) | Src::H3(_))
    }

    /// The client goes away: the connection under the stream is shut both ways (HTTP/3:
    /// the QUIC connection is closed).
    fn cut(&mut self) {
        let tcp = match &mut self.src {
            Src::H1(c) => &c.stream,
            Src::H2(b) => b.0.tcp(),
            Src::H3(b) => {
                b.c.close(0x100);
                return;
            }
        };
        let _ = tcp.shutdown(std::net::Shutdown::Both);
    }

    /// `POST /api/chat` on `conn`. `Err(the whole response)` unless it is a 200
    /// `text/event-stream`.
    fn open_on(mut conn: Conn, body: &[u8]) -> Result<ChatStream, Response> {
        conn.send(&request("POST", "/api/chat", &[("Content-Type", "application/json")], body));
        let head = conn.read_head_response();
        let raw = conn.take_pending();
        let chunked = head
            .header("transfer-encoding")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked"))
            .unwrap_or(false);
        let st = ChatStream {
            src: Src::H1(conn),
            head,
            chunked,
            raw,
            text: Vec::new(),
            clean: 0,
            ended: false,
            eof: false,
            last_read: Instant::now(),
            h2_end: None,
        };
        let is_stream =
            st.head.status == 200 && media_type(st.head.header("content-type")).as_deref() == Some("text/event-stream");
        if !is_stream {
            return Err(st.whole_response());
        }
        Ok(st)
    }

    /// Reads the rest of a non-stream response (bounded) and returns it.
    fn whole_response(mut self) -> Response {
        let deadline = Instant::now() + IO_TIMEOUT;
        let n = self.head.header("content-length").and_then(|v| v.parse::<usize>().ok());
        loop {
            let _ = self.dechunk();
            let done = match n {
                _ if self.chunked => self.ended,
                Some(n) => self.text.len() >= n,
                None => self.eof,
            };
            if done || self.eof || self.fill(deadline).is_err() {
                break;
            }
        }
        let mut r = self.head.clone();
        r.body = self.text;
        r
    }

    /// One read from the socket, bounded by `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<(), String> {
        let now = Instant::now();
        if now >= deadline {
            return Err("timed out".into());
        }
        let conn = match &mut self.src {
            Src::H1(c) => c,
            Src::H2(b) => {
                let (c, recv) = &mut **b;
                let had = self.raw.len();
                loop {
                    match c.body_now(recv, &mut self.raw) {
                        Ok(true) => self.h2_end = Some(Ok(())),
                        Ok(false) => {}
                        Err(e) => self.h2_end = Some(Err(format!("the stream failed: {e}"))),
                    }
                    if self.raw.len() > had {
                        self.last_read = Instant::now();
                    }
                    if self.raw.len() > had || self.h2_end.is_some() {
                        return Ok(());
                    }
                    if c.eof {
                        self.eof = true;
                        return Ok(());
                    }
                    if Instant::now() >= deadline {
                        return Err("timed out".into());
                    }
                    c.pump();
                }
            }
            Src::H3(b) => loop {
                let body = b.c.partial(b.id).body;
                if body.len() > b.taken {
                    self.raw.extend_from_slice(&body[b.taken..]);
                    b.taken = body.len();
                    self.last_read = Instant::now();
                }
                let got = &b.c.streams[&b.id];
                if let Some(code) = got.reset {
                    self.h2_end = Some(Err(format!("the stream was reset with code {code:#x}")));
                } else if got.fin {
                    self.h2_end = Some(Ok(()));
                }
                if self.last_read >= now || self.h2_end.is_some() {
                    return Ok(());
                }
                if b.c.lost.is_some() {
                    self.eof = true;
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err("timed out".into());
                }
                b.c.step(deadline);
            },
        };
        conn.stream.set_read_timeout(Some(deadline - now)).unwrap();
        let mut tmp = [0u8; 65536];
        use std::io::Read;
        loop {
            match conn.stream.read(&mut tmp) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.raw.extend_from_slice(&tmp[..n]);
                    self.last_read = Instant::now();
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err("timed out".into()),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    self.eof = true;
                    return Ok(());
                }
                Err(e) => return Err(format!("read error: {e}")),
            }
        }
    }

    /// Moves complete chunks from `raw` to `text`; notes the end of the body.
    fn dechunk(&mut self) -> Result<(), String> {
        if self.is_h2() {
            self.text.append(&mut self.raw);
            match &self.h2_end {
                Some(Ok(())) => self.ended = true,
                Some(Err(e)) => return Err(e.clone()),
                None => {}
            }
            return Ok(());
        }
        if !self.chunked {
            self.text.append(&mut self.raw);
            if self.eof {
                self.ended = true;
            }
            return Ok(());
        }
        while !self.ended {
            let Some(le) = find(&self.raw, b"\r\n") else { return Ok(()) };
            let line = String::from_utf8_lossy(&self.raw[..le]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
                .map_err(|_| format!("bad chunk size line {line:?}"))?;
            if size == 0 {
                // Trailers until the empty line.
                let mut i = le + 2;
                loop {
                    let Some(e) = find(&self.raw[i..], b"\r\n") else { return Ok(()) };
                    i += e + 2;
                    if e == 0 {
                        break;
                    }
                }
                self.raw.drain(..i);
                self.ended = true;
                return Ok(());
            }
            if self.raw.len() < le + 2 + size + 2 {
                return Ok(());
            }
            if &self.raw[le + 2 + size..le + 2 + size + 2] != b"\r\n" {
                return Err(format!("a chunk of {size} bytes not followed by CRLF"));
            }
            self.text.extend_from_slice(&self.raw[le + 2..le + 2 + size]);
            self.raw.drain(..le + 2 + size + 2);
        }
        Ok(())
    }

    /// One complete event from `text` (comment-only blocks skipped).
    fn take_event(&mut self) -> Option<SseEvent> {
        loop {
            let from = self.clean.min(self.text.len());
            if find(&self.text[from..], b"\r\n").is_some() {
                let tail = &self.text[from..];
                let t: Vec<u8> = tail
                    .iter()
                    .enumerate()
                    .filter(|(i, &b)| !(b == b'\r' && tail.get(i + 1) == Some(&b'\n')))
                    .map(|(_, &b)| b)
                    .collect();
                self.text.truncate(from);
                self.text.extend_from_slice(&t);
            }
            // A trailing CR may pair with an LF still to come.
            self.clean = self.text.len() - usize::from(self.text.last() == Some(&b'\r'));
            let end = find(&self.text, b"\n\n")?;
            let ev = SseEvent::parse(&String::from_utf8_lossy(&self.text[..end]));
            self.text.drain(..end + 2);
            self.clean -= end + 2;
            if !ev.fields.is_empty() {
                return Some(ev);
            }
        }
    }

    /// The next event within `timeout`, with the time its last byte arrived. `Err` when the
    /// body ends first, on timeout, or on a framing error.
    fn next(&mut self, timeout: Duration) -> Result<(Instant, SseEvent), String> {
        let deadline = Instant::now() + timeout;
        loop {
            self.dechunk()?;
            if let Some(ev) = self.take_event() {
                return Ok((self.last_read, ev));
            }
            if self.ended || self.eof {
                return Err(format!(
                    "the body ended (last chunk: {}, EOF: {}) before another event; unparsed: {:?}",
                    self.ended,
                    self.eof,
                    String::from_utf8_lossy(&self.text)
                ));
            }
            self.fill(deadline).map_err(|e| {
                format!(
                    "no complete event within {timeout:?} ({e}); unparsed: {:?}",
                    String::from_utf8_lossy(&self.text)
                )
            })?;
        }
    }

    /// Every remaining event until the chunked body ends (bounded by `timeout`). `Err` with
    /// the events so far when it does not end properly.
    fn rest(&mut self, timeout: Duration) -> Result<Vec<(Instant, SseEvent)>, String> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            self.dechunk().map_err(|e| format!("{e}; events so far: {out:?}"))?;
            while let Some(ev) = self.take_event() {
                out.push((self.last_read, ev));
            }
            if self.ended {
                if !self.chunked {
                    return Err(format!("the stream must be chunked, not close-delimited; events: {out:?}"));
                }
                let left = String::from_utf8_lossy(&self.text).into_owned();
                if !left.trim().is_empty() {
                    return Err(format!("an incomplete event before the end of the body: {left:?}; events: {out:?}"));
                }
                return Ok(out);
            }
            if self.eof {
                return Err(format!(
                    "the connection closed before the chunked body ended (no last chunk); events: {out:?}; unparsed: {:?}",
                    String::from_utf8_lossy(&self.text)
                ));
            }
            self.fill(deadline)
                .map_err(|e| format!("the body did not end within {timeout:?} ({e}); events: {out:?}"))?;
        }
    }

    /// The connection after a complete response, for the next request. `Err` when bytes
    /// follow the end of the body.
    fn into_session(self) -> Result<Session, String> {
        if !self.ended || self.eof {
            return Err(format!("the response has not ended cleanly (ended {}, EOF {})", self.ended, self.eof));
        }
        if !self.raw.is_empty() {
            return Err(format!("bytes after the end of the body: {:?}", String::from_utf8_lossy(&self.raw)));
        }
        Ok(match self.src {
            Src::H1(mut c) => {
                c.set_timeout(IO_TIMEOUT);
                Session::H1(c)
            }
            Src::H2(b) => Session::H2(Box::new(b.0)),
            Src::H3(b) => Session::H3(Box::new(b.c)),
        })
    }
}

/// The `content` of a `data: {"content": …}` event (no `event:` field), else None.
fn content_of(ev: &SseEvent) -> Option<String> {
    if ev.event().is_some() {
        return None;
    }
    let v: Value = serde_json::from_str(&ev.data()).ok()?;
    if v.as_object().map(|o| o.len()) != Some(1) {
        return None;
    }
    v["content"].as_str().map(str::to_string)
}

fn is_done(ev: &SseEvent) -> bool {
    ev.event().is_none() && ev.data() == "[DONE]"
}

/// Opens a chat stream; panics with the response and the log when it is not one.
fn open_stream(s: &Server, body: &[u8], what: &str) -> ChatStream {
    ChatStream::open(s, body)
        .unwrap_or_else(|r| panic!("{what}: expected a 200 text/event-stream, got {r:?}\nlog:\n{}", s.log_tail()))
}

/// Asserts the head of a chat stream.
fn check_stream_head(s: &Server, st: &ChatStream, what: &str) {
    let h = &st.head;
    ensure_eq!(
        s,
        media_type(h.header("content-type")).as_deref(),
        Some("text/event-stream"),
        "{what}: Content-Type: {h:?}"
    );
    ensure_eq!(s, h.header("cache-control"), Some("no-cache"), "{what}: Cache-Control: {h:?}");
    if st.is_h2() {
        for f in ["connection", "keep-alive", "transfer-encoding"] {
            ensure!(s, h.header(f).is_none(), "{what}: no `{f}` over HTTP/2: {h:?}");
        }
    } else {
        ensure!(s, st.chunked, "{what}: the stream must be chunked: {h:?}");
    }
}

/// Reads the whole stream: asserts content events, then exactly one `[DONE]` last, then the
/// end of the chunked body. Returns the contents with their arrival times.
fn read_complete(s: &Server, st: &mut ChatStream, what: &str) -> Vec<(Instant, String)> {
    let evs = st.rest(Duration::from_secs(5)).unwrap_or_else(|e| panic!("{what}: {e}\nlog:\n{}", s.log_tail()));
    ensure!(
        s,
        evs.last().map(|(_, e)| is_done(e)).unwrap_or(false),
        "{what}: the last event must be `data: [DONE]`: {evs:?}"
    );
    let mut out = Vec::new();
    for (t, ev) in &evs[..evs.len() - 1] {
        let c = content_of(ev);
        ensure!(s, c.is_some(), "{what}: before [DONE] only `data: {{\"content\":…}}` events: {ev:?} in {evs:?}");
        out.push((*t, c.unwrap()));
    }
    out
}

fn contents(v: &[(Instant, String)]) -> Vec<&str> {
    v.iter().map(|(_, c)| c.as_str()).collect()
}

/// Asserts the connection of a finished stream serves a `GET /health`.
fn check_keep_alive(s: &Server, st: ChatStream, what: &str) {
    let mut c = st.into_session().unwrap_or_else(|e| panic!("{what}: {e}\nlog:\n{}", s.log_tail()));
    let r = c.get("/health");
    ensure!(s, r.status == 200, "{what}: GET /health on the same connection after the stream: {r:?}");
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

protocols!(chat_rejects_a_body_that_is_not_json);
fn chat_rejects_a_body_that_is_not_json(p: Proto) {
    let up = streaming_upstream(&["never"], ZERO);
    let s = relay_server(&up).on(p);
    let body = body_of(json!([user_msg("hi")]));
    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let r = s.call("POST", "/api/chat", &[("Content-Type", ct)], &body);
        s.expect_err(&r, 415, "UNSUPPORTED_MEDIA_TYPE", &format!("POST /api/chat with Content-Type {ct}"));
    }
    let r = s.call("POST", "/api/chat", &[("Content-Type", "application/json")], b"{\"messages\": [");
    s.expect_err(&r, 400, "BAD_REQUEST", "POST /api/chat with malformed JSON");
    ensure_eq!(s, up.total(), 0, "no upstream request for a rejected body:\n{}", up.describe());
    s.assert_healthy();
}

protocols!(chat_validates_messages_before_contacting_the_upstream);
fn chat_validates_messages_before_contacting_the_upstream(p: Proto) {
    let up = streaming_upstream(&["fine"], ZERO);
    let s = relay_server(&up).on(p);
    let many = |n: usize| Value::Array((0..n).map(|i| user_msg(&format!("m{i}"))).collect());
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "messages"),
        (json!({"messages": null}), "messages"),
        (json!({"messages": "hello"}), "messages"),
        (json!({"messages": {"role": "user", "content": "hi"}}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({ "messages": many(101) }), "messages"),
        (json!({"messages": [{"role": "bot", "content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "tool", "content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": 1, "content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"content": "hi"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
        (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        (json!({"messages": [{"role": "user", "content": null}]}), "messages[0].content"),
        (json!({"messages": [{"role": "user", "content": ["hi"]}]}), "messages[0].content"),
        (json!({"messages": [user_msg("ok"), {"role": "admin", "content": "x"}]}), "messages[1].role"),
        (json!({"messages": [user_msg("ok"), {"role": "assistant", "content": {}}]}), "messages[1].content"),
    ];
    for (body, field) in &cases {
        let shown = body.to_string();
        let shown = if shown.len() > 120 { format!("{}… ({} bytes)", &shown[..120], shown.len()) } else { shown };
        let r = s.api("POST", "/api/chat", None, Some(body));
        s.expect_invalid(&r, &[field], &format!("POST /api/chat {shown}"));
    }
    ensure_eq!(s, up.total(), 0, "validation must come before any upstream request:\n{}", up.describe());

    // The limits themselves are fine: 100 messages, every role.
    let mut hundred = many(97);
    hundred.as_array_mut().unwrap().extend([
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "assistant", "content": "ok"}),
        user_msg("last"),
    ]);
    let mut st = open_stream(&s, &body_of(hundred), "100 messages with every role");
    let got = read_complete(&s, &mut st, "100 messages");
    ensure_eq!(s, contents(&got), vec!["fine"], "100 messages are relayed");
    ensure_eq!(s, up.total(), 1, "one upstream request for the valid body:\n{}", up.describe());
}

// ---------------------------------------------------------------------------------------
// Built-in echo
// ---------------------------------------------------------------------------------------

protocols!(chat_echo_streams_the_last_user_message_word_by_word);
fn chat_echo_streams_the_last_user_message_word_by_word(p: Proto) {
    let s = echo_server(20).on(p);
    let msgs = json!([
        {"role": "system", "content": "you are an echo"},
        user_msg("not this one"),
        {"role": "assistant", "content": "nor this"},
        user_msg("hello brave new world"),
    ]);
    let mut st = open_stream(&s, &body_of(msgs), "echo");
    check_stream_head(&s, &st, "echo");
    let got = read_complete(&s, &mut st, "echo");
    ensure_eq!(
        s,
        contents(&got),
        vec!["hello", " brave", " new", " world"],
        "echo: one chunk per word of the last user message"
    );

    // The same connection carries the next chat: the last message is the assistant's, so the
    // last *user* message is echoed.
    let conn = st.into_session().unwrap_or_else(|e| panic!("echo: {e}\nlog:\n{}", s.log_tail()));
    let msgs = json!([user_msg("échos ünïcode 🌍"), {"role": "assistant", "content": "ignored words here"}]);
    let mut st = ChatStream::open_in(conn, &body_of(msgs)).unwrap_or_else(|r| {
        panic!("a second chat on the same keep-alive connection: expected a stream, got {r:?}\nlog:\n{}", s.log_tail())
    });
    let got = read_complete(&s, &mut st, "second echo on the same connection");
    ensure_eq!(
        s,
        contents(&got),
        vec!["échos", " ünïcode", " 🌍"],
        "echo of the last user message, not the assistant's"
    );
    ensure_eq!(s, contents(&got).concat(), "échos ünïcode 🌍", "the contents joined give the words");
    check_keep_alive(&s, st, "after two echo streams");
}

protocols!(chat_echo_chunks_are_streamed_not_buffered);
fn chat_echo_chunks_are_streamed_not_buffered(p: Proto) {
    let s = echo_server(150).on(p);
    let t = Instant::now();
    let mut st = open_stream(&s, &body_of(json!([user_msg("one two three")])), "echo with echo_delay_ms = 150");
    let got = read_complete(&s, &mut st, "echo with echo_delay_ms = 150");
    ensure_eq!(s, contents(&got), vec!["one", " two", " three"], "echo of three words");
    let gap = got[2].0 - got[0].0;
    ensure!(
        s,
        gap >= Duration::from_millis(250),
        "three chunks 150 ms apart must arrive as they are produced: first to last took {gap:?} (the stream was buffered?); \
         arrivals after the request: {:?}",
        got.iter().map(|(a, _)| *a - t).collect::<Vec<_>>()
    );
    ensure!(s, t.elapsed() < Duration::from_secs(3), "three words at 150 ms took {:?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------
// Relay to an OpenAI-compatible upstream
// ---------------------------------------------------------------------------------------

protocols!(chat_relay_sends_model_stream_and_messages_and_forwards_deltas);
fn chat_relay_sends_model_stream_and_messages_and_forwards_deltas(p: Proto) {
    let up = Upstream::start(|_| {
        Behaviour::sse(
            vec![
                (ZERO, ROLE_DELTA.to_string()),
                (ZERO, delta("Hel")),
                (ZERO, delta("lo")),
                (ZERO, delta(", wörld 🌍")),
                (ZERO, UPSTREAM_DONE.to_string()),
            ],
            After::Finish,
        )
    });
    let s = relay_server(&up).on(p);
    let msgs = json!([{"role": "system", "content": "be nice"}, user_msg("Say hello"), {"role": "assistant", "content": "Hi"}, user_msg("Again")]);
    let mut st = open_stream(&s, &body_of(msgs.clone()), "relay");
    check_stream_head(&s, &st, "relay");
    let got = read_complete(&s, &mut st, "relay");
    ensure_eq!(
        s,
        contents(&got),
        vec!["Hel", "lo", ", wörld 🌍"],
        "every delta's content, in order, the role delta skipped"
    );
    check_keep_alive(&s, st, "after a relayed stream");

    let reqs = up.requests();
    ensure_eq!(s, reqs.len(), 1, "one upstream request:\n{}", up.describe());
    let r = &reqs[0];
    ensure_eq!(s, (r.method.as_str(), r.path.as_str()), ("POST", UPSTREAM_PATH), "the upstream request line");
    let b = r.json();
    ensure!(s, b.is_some(), "the upstream request body must be JSON: {:?}", String::from_utf8_lossy(&r.body));
    let b = b.unwrap();
    ensure_eq!(s, b["model"], json!("m1"), "`model` of the upstream request: {b}");
    ensure_eq!(s, b["stream"], json!(true), "`stream` of the upstream request: {b}");
    ensure_eq!(s, b["messages"], msgs, "`messages` of the upstream request, as given: {b}");
}

protocols!(chat_relay_forwards_each_delta_as_it_arrives);
fn chat_relay_forwards_each_delta_as_it_arrives(p: Proto) {
    let up = streaming_upstream(&["one", " two", " three", " four"], Duration::from_millis(200));
    let s = relay_server(&up).on(p);
    let mut st = open_stream(&s, &body_of(json!([user_msg("count")])), "relay of 4 deltas 200 ms apart");
    let (first_at, first) =
        st.next(Duration::from_secs(3)).unwrap_or_else(|e| panic!("first event: {e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, content_of(&first).as_deref(), Some("one"), "the first event: {first:?}");
    let rest = read_complete(&s, &mut st, "relay of 4 deltas 200 ms apart");
    ensure_eq!(s, contents(&rest), vec![" two", " three", " four"], "the other deltas in order");
    let conn_id = up.requests()[0].conn_id;
    let sent = up.pieces_sent(conn_id);
    ensure!(s, sent.len() >= 4, "the upstream sent 4 deltas: {sent:?}");
    let last_delta_sent = sent[3].at;
    ensure!(
        s,
        first_at < last_delta_sent,
        "the first delta must reach the client before the upstream sends the last one (relayed as it arrives); \
         it arrived {:?} after",
        first_at.saturating_duration_since(last_delta_sent)
    );
    let gap = rest[2].0 - first_at;
    ensure!(s, gap >= Duration::from_millis(400), "deltas 200 ms apart arrived within {gap:?} of each other");
}

protocols!(chat_relay_skips_deltas_without_content_and_reassembles_split_events);
fn chat_relay_skips_deltas_without_content_and_reassembles_split_events(p: Proto) {
    // Events packed into one chunk, an event split across chunks (apart in time, so they
    // are separate reads), and deltas without content (role, empty delta, finish reason).
    let packed = format!("{ROLE_DELTA}{}{}", delta("A"), "data: {\"choices\":[{\"index\":0,\"delta\":{}}]}\n\n");
    let split = delta("B and C");
    let (left, right) = split.split_at(split.len() / 2);
    let pieces = vec![
        (ZERO, packed),
        (Duration::from_millis(60), left.to_string()),
        (Duration::from_millis(60), right.to_string()),
        (
            ZERO,
            format!(
                "{}data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n",
                delta("D")
            ),
        ),
        (ZERO, UPSTREAM_DONE.to_string()),
    ];
    let up = Upstream::start(move |_| Behaviour::sse(pieces.clone(), After::Finish));
    let s = relay_server(&up).on(p);
    let mut st = open_stream(&s, &body_of(json!([user_msg("go")])), "relay with packed and split events");
    let got = read_complete(&s, &mut st, "relay with packed and split events");
    ensure_eq!(s, contents(&got), vec!["A", "B and C", "D"], "only deltas with content, each once, in order");
}

protocols!(chat_relay_forwards_a_burst_larger_than_one_read);
fn chat_relay_forwards_a_burst_larger_than_one_read(p: Proto) {
    // 2 000 deltas in one ~1 MB chunk: many socket reads, many times the client's output
    // watermark (the relay pauses and resumes), all relayed, in order.
    let words: Vec<String> = (0..2000).map(|i| format!("w{i:04}{}", "x".repeat(400))).collect();
    let burst: String = words.iter().map(|w| delta(w)).collect::<String>() + UPSTREAM_DONE;
    let up = Upstream::start(move |_| Behaviour::sse(vec![(ZERO, burst.clone())], After::Finish));
    let s = relay_server(&up).on(p);
    let mut st = open_stream(&s, &body_of(json!([user_msg("go")])), "relay of a 1 MB burst");
    let got = read_complete(&s, &mut st, "relay of a 1 MB burst");
    let want: Vec<&str> = words.iter().map(String::as_str).collect();
    ensure!(s, contents(&got) == want, "all 2000 deltas in order; got {} of them", got.len());
    check_keep_alive(&s, st, "after a 1 MB burst");
}

protocols!(chat_relay_to_a_client_that_does_not_read_pauses_the_upstream);
fn chat_relay_to_a_client_that_does_not_read_pauses_the_upstream(p: Proto) {
    // The upstream has ~64 MB to send at once; the client reads nothing. Back pressure must
    // stop forkd reading the upstream (so the upstream's writes stall once the kernel
    // buffers are full), and the worker must not buffer the stream in memory.
    let piece = delta(&"y".repeat(16 * 1024));
    let n = 4000;
    let mut pieces: Vec<(Duration, String)> = (0..n).map(|_| (ZERO, piece.clone())).collect();
    pieces.push((ZERO, UPSTREAM_DONE.to_string()));
    let up = Upstream::start(move |_| Behaviour::sse(pieces.clone(), After::Finish));
    // The test upstream copies its 64 MB before it answers, which on a loaded machine takes
    // longer than the other tests' 400 ms: this test is about back pressure, not timeouts.
    let s = relay_server_timeout(&format!("{}{UPSTREAM_PATH}", up.url()), 10_000).on(p);
    let pid = s.wait_workers(1, START_TIMEOUT)[0];
    let before = anon_rss_kib(pid);
    let st = open_stream(&s, &body_of(json!([user_msg("a lot")])), "a relay nobody reads");
    ensure!(s, up.wait_requests(1, IO_TIMEOUT), "the upstream got no request:\n{}", up.describe());
    let conn_id = up.requests()[0].conn_id;
    // Wait (bounded) until the upstream stops making progress for a second.
    let (mut last, mut still_since) = (usize::MAX, Instant::now());
    let stalled = eventually(Duration::from_secs(5), || {
        let sent = up.pieces_sent(conn_id).len();
        if sent != last {
            (last, still_since) = (sent, Instant::now());
        }
        sent > 0 && still_since.elapsed() >= Duration::from_millis(1000)
    });
    let sent = up.pieces_sent(conn_id).len();
    ensure!(
        s,
        stalled && sent < n / 2,
        "the upstream kept sending to a client that reads nothing: {sent} of {n} pieces"
    );
    let grew = (anon_rss_kib(pid) - before) / 1024;
    ensure!(s, grew < 16, "the worker buffered the stream: RSS grew {grew} MiB while {sent} pieces were stuck");
    drop(st);
    s.assert_healthy();
}

// ---------------------------------------------------------------------------------------
// Upstream failures
// ---------------------------------------------------------------------------------------

protocols!(chat_upstream_refused_gives_502);
fn chat_upstream_refused_gives_502(p: Proto) {
    let s = relay_server_to(&format!("{}{UPSTREAM_PATH}", closed_url())).on(p);
    let r = s.call("POST", "/api/chat", &[("Content-Type", "application/json")], &body_of(json!([user_msg("hi")])));
    s.expect_err(&r, 502, "UPSTREAM_UNAVAILABLE", "chat upstream refusing connections");
    s.assert_healthy();
}

protocols!(chat_upstream_error_status_gives_502);
fn chat_upstream_error_status_gives_502(p: Proto) {
    let up = Upstream::start(|_| Behaviour::json(500, &json!({"error": {"message": "model overloaded"}})));
    let s = relay_server(&up).on(p);
    let r = s.call("POST", "/api/chat", &[("Content-Type", "application/json")], &body_of(json!([user_msg("hi")])));
    s.expect_err(&r, 502, "UPSTREAM_UNAVAILABLE", "chat upstream answering 500");
    ensure_eq!(s, up.total(), 1, "the upstream was asked once:\n{}", up.describe());
    s.assert_healthy();
}

protocols!(chat_upstream_silence_gives_504);
fn chat_upstream_silence_gives_504(p: Proto) {
    let up = Upstream::start(|_| Behaviour::Hang);
    let s = relay_server(&up).on(p);
    let t = Instant::now();
    let r = s.call("POST", "/api/chat", &[("Content-Type", "application/json")], &body_of(json!([user_msg("hi")])));
    let took = t.elapsed();
    s.expect_err(&r, 504, "UPSTREAM_TIMEOUT", "chat upstream silent (upstreams.timeout_ms = 400)");
    ensure!(
        s,
        took >= Duration::from_millis(350) && took < Duration::from_millis(2500),
        "the 504 must come after about timeout_ms = 400 ms; it came after {took:?}"
    );
    s.assert_healthy();
}

/// After a first delta, the upstream fails (`then`): the client must get that delta, then
/// `event: error` with a message, then the end of the chunked body and no `[DONE]`.
/// Returns the time from the delta to the error event.
fn failure_after_first_chunk(p: Proto, then: After, what: &str) -> Duration {
    let up = Upstream::start(move |_| Behaviour::sse(vec![(ZERO, delta("partial"))], then));
    let s = relay_server(&up).on(p);
    let mut st = open_stream(&s, &body_of(json!([user_msg("hi")])), what);
    let (t1, ev) = st
        .next(Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("{what}: the first delta: {e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, content_of(&ev).as_deref(), Some("partial"), "{what}: the delta before the failure: {ev:?}");
    let evs = st.rest(Duration::from_secs(4)).unwrap_or_else(|e| {
        panic!("{what}: after the delta, an error event and the end of the chunked body: {e}\nlog:\n{}", s.log_tail())
    });
    ensure!(s, !evs.iter().any(|(_, e)| is_done(e)), "{what}: no [DONE] after a failure: {evs:?}");
    ensure_eq!(s, evs.len(), 1, "{what}: exactly one event (`event: error`) after the delta: {evs:?}");
    let (t2, err) = &evs[0];
    ensure_eq!(s, err.event(), Some("error"), "{what}: `event: error`: {err:?}");
    let d: Option<Value> = serde_json::from_str(&err.data()).ok();
    ensure!(
        s,
        d.as_ref().map(|d| d["message"].is_string()).unwrap_or(false),
        "{what}: error data {{\"message\": …}}: {err:?}"
    );
    s.assert_healthy();
    t2.saturating_duration_since(t1)
}

protocols!(chat_upstream_closing_mid_stream_ends_with_an_error_event);
fn chat_upstream_closing_mid_stream_ends_with_an_error_event(p: Proto) {
    failure_after_first_chunk(p, After::Close, "upstream closes after one delta");
}

protocols!(chat_upstream_going_silent_mid_stream_ends_with_an_error_event);
fn chat_upstream_going_silent_mid_stream_ends_with_an_error_event(p: Proto) {
    let gap = failure_after_first_chunk(p, After::Hang, "upstream silent after one delta (timeout_ms = 400)");
    assert!(
        gap >= Duration::from_millis(350) && gap < Duration::from_millis(2500),
        "the error event must come about timeout_ms = 400 ms after the last delta; it came after {gap:?}"
    );
}

/// A one-shot upstream on `127.0.0.1:0`: it accepts one connection (within 10 s), reads the
/// request (head and `Content-Length` body), writes `answer` and closes: with no length in
/// `answer`'s head, a body delimited by the close. Returns the base URL and its thread.
fn close_delimited_upstream(answer: String) -> (String, std::thread::JoinHandle<Result<(), String>>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake upstream");
    let url = format!("http://{}", l.local_addr().unwrap());
    l.set_nonblocking(true).unwrap();
    let h = std::thread::spawn(move || -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sock = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        };
        sock.set_nonblocking(false).map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let need = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                let cl = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:").and_then(|v| v.trim().parse::<usize>().ok()))
                    .unwrap_or(0);
                break i + 4 + cl;
            }
            let n = sock.read(&mut tmp).map_err(|e| format!("read the request head: {e}"))?;
            if n == 0 {
                return Err("EOF before the request head".into());
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        while buf.len() < need {
            let n = sock.read(&mut tmp).map_err(|e| format!("read the request body: {e}"))?;
            if n == 0 {
                return Err("EOF in the request body".into());
            }
            buf.extend_from_slice(&tmp[..n]);
        }
        sock.write_all(answer.as_bytes()).map_err(|e| format!("write: {e}"))?;
        sock.shutdown(std::net::Shutdown::Both).map_err(|e| format!("shutdown: {e}"))
    });
    (url, h)
}

protocols!(chat_upstream_ending_cleanly_without_done_ends_the_stream_normally);
/// Regression: an upstream stream that ended cleanly (last chunk, `Content-Length` reached,
/// or the close that delimits its body) without `data: [DONE]` gave `event: error`. A clean
/// end is a normal end: `data: [DONE]`, the end of the chunked body, keep-alive.
fn chat_upstream_ending_cleanly_without_done_ends_the_stream_normally(p: Proto) {
    let up = Upstream::start(|req| {
        let last = req.json().and_then(|b| b["messages"][0]["content"].as_str().map(str::to_string));
        let body = format!("{ROLE_DELTA}{}{}", delta("one"), delta(" two"));
        match last.as_deref() {
            // `Content-Length` framing; the last event is not even followed by a blank line.
            Some("length") => Behaviour::text(200, "text/event-stream", body.trim_end().to_string() + "\n"),
            // Chunked: the last chunk without any [DONE].
            _ => Behaviour::sse(vec![(ZERO, delta("one")), (ZERO, delta(" two"))], After::Finish),
        }
    });
    let s = relay_server(&up).on(p);
    for framing in ["chunked", "length"] {
        let what = format!("an upstream ending its {framing} body without [DONE]");
        let mut st = open_stream(&s, &body_of(json!([user_msg(framing)])), &what);
        check_stream_head(&s, &st, &what);
        let got = read_complete(&s, &mut st, &what);
        ensure_eq!(s, contents(&got), vec!["one", " two"], "{what}: the deltas, then [DONE]");
        check_keep_alive(&s, st, &what);
    }

    // Read until close: no Content-Length, no chunking; the close ends the body.
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n{}{}",
        delta("three"),
        delta(" four")
    );
    let (url, fake) = close_delimited_upstream(answer);
    let s = relay_server_to(&format!("{url}{UPSTREAM_PATH}")).on(p);
    let what = "an upstream closing its read-until-close body without [DONE]";
    let mut st = open_stream(&s, &body_of(json!([user_msg("close")])), what);
    let got = read_complete(&s, &mut st, what);
    ensure_eq!(s, contents(&got), vec!["three", " four"], "{what}: the deltas, then [DONE]");
    check_keep_alive(&s, st, what);
    let r = fake.join().unwrap_or_else(|_| Err("the fake upstream panicked".into()));
    ensure!(s, r.is_ok(), "the fake upstream: {r:?}");
}

// ---------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------

/// An upstream that streams 50 deltas 200 ms apart (10 s in all).
fn long_upstream() -> Upstream {
    let words: Vec<String> = (0..50).map(|i| format!("w{i} ")).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    streaming_upstream(&words, Duration::from_millis(200))
}

/// Reads the first delta of `st`, closes the client, and asserts that `up` sees its
/// connection closed within ~2 s, early in its stream. `context` describes the path.
fn leave_mid_stream(s: &Server, mut st: ChatStream, up: &Upstream, context: &str) {
    let (_, ev) = st
        .next(Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("the first delta: {e}\n{context}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, content_of(&ev).as_deref(), Some("w0 "), "the first delta: {ev:?}");
    let conn_id = up.requests()[0].conn_id;
    st.cut();
    drop(st);
    let t = Instant::now();
    let closed = up.wait_peer_closed(conn_id, Duration::from_millis(2500));
    ensure!(
        s,
        closed.is_some(),
        "the client went away mid-stream: forkd must close the upstream connection within ~2 s:\n{context}{}",
        up.describe()
    );
    let sent = up.pieces_sent(conn_id).len();
    ensure!(
        s,
        sent < 30,
        "the upstream stopped being read early; it sent {sent} of 51 pieces (closed {:?} after the client)",
        closed.unwrap().saturating_duration_since(t)
    );
}

protocols!(chat_client_disconnect_cancels_the_upstream_request);
fn chat_client_disconnect_cancels_the_upstream_request(p: Proto) {
    let up = long_upstream();
    let s = relay_server(&up).on(p);
    let st = open_stream(&s, &body_of(json!([user_msg("talk for 10 s")])), "a long relay");
    leave_mid_stream(&s, st, &up, "");
    s.assert_healthy();
}

// ---------------------------------------------------------------------------------------
// HTTPS upstream (the fake behind a TLS front)
// ---------------------------------------------------------------------------------------

/// A server relaying to `https://localhost:PORT/v1/chat/completions` through `front`,
/// trusting the front's CA (`SSL_CERT_FILE`), with model `m1` and `upstreams.timeout_ms`.
fn relay_server_https(front: &TlsFront, timeout_ms: u64) -> Server {
    let url = format!("{}{UPSTREAM_PATH}", front.url("localhost"));
    Server::api_builder()
        .set("chat", &format!("upstream = \"{url}\"\nmodel = \"m1\""))
        .set("upstreams", &format!("timeout_ms = {timeout_ms}"))
        .env("SSL_CERT_FILE", &front.ca_pem_path().display().to_string())
        .start()
}

protocols!(chat_relay_over_https);
fn chat_relay_over_https(p: Proto) {
    let up = streaming_upstream(&["Hel", "lo", " over", " TLS 🔒"], Duration::from_millis(50));
    let front = TlsFront::start(&up.url(), &["localhost"]);
    let s = relay_server_https(&front, 2000).on(p);
    let msgs = json!([user_msg("Say hello securely")]);
    let mut st = ChatStream::open(&s, &body_of(msgs.clone())).unwrap_or_else(|r| {
        panic!(
            "relay over https: expected a 200 text/event-stream, got {r:?}\n{}{}\nlog:\n{}",
            front.describe(),
            up.describe(),
            s.log_tail()
        )
    });
    check_stream_head(&s, &st, "relay over https");
    let got = read_complete(&s, &mut st, "relay over https");
    ensure_eq!(
        s,
        contents(&got),
        vec!["Hel", "lo", " over", " TLS 🔒"],
        "every delta relayed through the TLS front, in order:\n{}{}",
        front.describe(),
        up.describe()
    );
    check_keep_alive(&s, st, "after a stream relayed over https");

    let reqs = up.requests();
    ensure_eq!(s, reqs.len(), 1, "one request reached the backend:\n{}{}", front.describe(), up.describe());
    let r = &reqs[0];
    ensure_eq!(s, (r.method.as_str(), r.path.as_str()), ("POST", UPSTREAM_PATH), "the upstream request line");
    let b = r.json().unwrap_or_default();
    ensure_eq!(
        s,
        (&b["model"], &b["stream"], &b["messages"]),
        (&json!("m1"), &json!(true), &msgs),
        "the upstream request body over https: {b}"
    );
    ensure!(
        s,
        front.handshakes() >= 1 && front.failed_handshakes() == 0,
        "the TLS front: a completed handshake, none failed:\n{}",
        front.describe()
    );
}

protocols!(chat_over_https_client_disconnect_cancels_the_upstream);
fn chat_over_https_client_disconnect_cancels_the_upstream(p: Proto) {
    let up = long_upstream();
    let front = TlsFront::start(&up.url(), &["localhost"]);
    let s = relay_server_https(&front, 2000).on(p);
    let st = ChatStream::open(&s, &body_of(json!([user_msg("talk for 10 s")]))).unwrap_or_else(|r| {
        panic!(
            "a long relay over https: expected a 200 text/event-stream, got {r:?}\n{}{}\nlog:\n{}",
            front.describe(),
            up.describe(),
            s.log_tail()
        )
    });
    // forkd closes its TLS connection; the front then closes the backend's.
    leave_mid_stream(&s, st, &up, &format!("over https, through the front:\n{}", front.describe()));
    ensure!(
        s,
        front.closed_by_client() >= 1,
        "the front must have seen forkd close the TLS connection:\n{}",
        front.describe()
    );
    s.assert_healthy();
}
