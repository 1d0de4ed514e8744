//! A fake upstream HTTP/1.1 server for the tests of `/api/homepage` and `/api/chat`
//! (CONTRACT §6): `127.0.0.1:0`, std only, one thread per connection, keep-alive.
//!
//! A handler closure decides, per request, how to answer ([`Behaviour`]): a complete
//! response (Content-Length framing) after an optional delay, a chunked response whose
//! pieces come with delays between them (SSE streaming), a close without an answer, or
//! silence. The server records every request, every accepted connection and when the peer
//! (forkd) closed each connection, so a test can wait until "the upstream saw the
//! connection close".
//!
//! [`TlsFront`] puts a TLS-terminating front (rustls, certificates from a test CA made with
//! rcgen) before a fake, for `https://` upstream URLs.
//!
//! Nothing here runs unbounded: every read carries a short timeout after which the shutdown
//! flag is checked, writes time out, and dropping the [`Upstream`] stops and joins every
//! thread it started.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{eventually, find};

/// How often a blocked read wakes up to look at the shutdown flag.
const TICK: Duration = Duration::from_millis(20);
/// Bound for one write to forkd (a peer that stops reading does not block us for ever).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct UpReq {
    pub method: String,
    /// The request target as sent (origin form: path and query).
    pub path: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when it came chunked.
    pub body: Vec<u8>,
    /// Which accepted connection carried it (0, 1, … in order of acceptance).
    pub conn_id: usize,
    /// When the request was complete.
    pub at: Instant,
}

impl UpReq {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (None when it is not JSON).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// What a chunked response does after its last piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Sends the last chunk (`0\r\n\r\n`); the connection stays open for the next request.
    Finish,
    /// Closes the connection without ending the body.
    Close,
    /// Sends nothing more and never ends the body (until the peer closes or the test ends).
    Hang,
}

/// How the fake upstream answers one request.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// A complete response with `Content-Length`, written after `delay`.
    Respond { status: u16, headers: Vec<(String, String)>, body: Vec<u8>, delay: Duration },
    /// `Transfer-Encoding: chunked`: the head at once, then each piece (one chunk, non-empty)
    /// after its delay, then `then`.
    Chunked { status: u16, headers: Vec<(String, String)>, pieces: Vec<(Duration, Vec<u8>)>, then: After },
    /// Closes the connection without answering.
    Close,
    /// Never answers; the connection ends when the peer closes it or the test ends.
    Hang,
}

impl Behaviour {
    /// `status` with a JSON body.
    pub fn json(status: u16, v: &Value) -> Behaviour {
        Self::text(status, "application/json", v.to_string())
    }

    /// `status` with `body` as `content_type`.
    pub fn text(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Behaviour {
        Behaviour::Respond {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    /// A 200 JSON object of exactly `n` bytes (`{"name":"Big","avatar":null,"pad":"xxx…"}`):
    /// valid JSON that only its size makes wrong.
    pub fn padded_json_object(n: usize) -> Behaviour {
        let head = r#"{"name":"Big","avatar":null,"pad":""#;
        let tail = r#""}"#;
        assert!(n >= head.len() + tail.len(), "padded_json_object: {n} bytes is too small");
        let mut s = String::with_capacity(n);
        s.push_str(head);
        s.push_str(&"x".repeat(n - head.len() - tail.len()));
        s.push_str(tail);
        Self::text(200, "application/json", s)
    }

    /// A 200 JSON array of exactly `n` bytes (`[{"pad":"xxx…"}]`).
    pub fn padded_json_array(n: usize) -> Behaviour {
        let head = r#"[{"id":"big","status":"x","totalAmount":1.5,"pad":""#;
        let tail = r#""}]"#;
        assert!(n >= head.len() + tail.len(), "padded_json_array: {n} bytes is too small");
        let mut s = String::with_capacity(n);
        s.push_str(head);
        s.push_str(&"x".repeat(n - head.len() - tail.len()));
        s.push_str(tail);
        Self::text(200, "application/json", s)
    }

    /// A chunked 200 `text/event-stream`: each `(delay, text)` is one chunk.
    pub fn sse(pieces: Vec<(Duration, String)>, then: After) -> Behaviour {
        Behaviour::Chunked {
            status: 200,
            headers: vec![
                ("Content-Type".into(), "text/event-stream".into()),
                ("Cache-Control".into(), "no-cache".into()),
            ],
            pieces: pieces.into_iter().map(|(d, p)| (d, p.into_bytes())).collect(),
            then,
        }
    }

    /// The same response, written only after `delay` (for `Respond`; other kinds unchanged).
    pub fn after(mut self, d: Duration) -> Behaviour {
        if let Behaviour::Respond { delay, .. } = &mut self {
            *delay = d;
        }
        self
    }
}

/// One accepted connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub id: usize,
    pub accepted: Instant,
    /// Requests read on it.
    pub requests: usize,
    /// When the peer (forkd) closed it (EOF or reset seen), if it did.
    pub peer_closed: Option<Instant>,
    /// The fake closed it itself (`Close`, `After::Close`, a bad request, a stuck write).
    pub closed_by_us: bool,
}

/// One chunk written by a `Chunked` answer.
#[derive(Debug, Clone)]
pub struct PieceSent {
    pub conn_id: usize,
    pub index: usize,
    pub at: Instant,
}

#[derive(Default)]
struct Log {
    reqs: Vec<UpReq>,
    conns: Vec<ConnInfo>,
    pieces: Vec<PieceSent>,
}

type Handler = dyn Fn(&UpReq) -> Behaviour + Send + Sync + 'static;

struct State {
    stop: AtomicBool,
    log: Mutex<Log>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    handler: Box<Handler>,
}

impl State {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn conn_mut(&self, id: usize, f: impl FnOnce(&mut ConnInfo)) {
        if let Some(c) = self.log().conns.get_mut(id) {
            f(c);
        }
    }

    fn peer_closed(&self, id: usize) {
        self.conn_mut(id, |c| {
            if c.peer_closed.is_none() && !c.closed_by_us {
                c.peer_closed = Some(Instant::now());
            }
        });
    }

    fn closed_by_us(&self, id: usize) {
        self.conn_mut(id, |c| c.closed_by_us = true);
    }
}

/// A running fake upstream. Dropping it stops it (and every connection thread).
pub struct Upstream {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Upstream {
    /// Starts a fake upstream on `127.0.0.1:0` answering with `handler`.
    pub fn start(handler: impl Fn(&UpReq) -> Behaviour + Send + Sync + 'static) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("fake upstream: bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("fake upstream: nonblocking listener");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            stop: AtomicBool::new(false),
            log: Mutex::new(Log::default()),
            threads: Mutex::new(Vec::new()),
            handler: Box::new(handler),
        });
        let st = state.clone();
        let accept = thread::spawn(move || accept_loop(listener, st));
        Upstream { addr, state, accept: Some(accept) }
    }

    /// Always answers 200 with `v` as JSON.
    pub fn json(v: Value) -> Upstream {
        Self::start(move |_| Behaviour::json(200, &v))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in order of arrival.
    pub fn requests(&self) -> Vec<UpReq> {
        self.state.log().reqs.clone()
    }

    /// The requests whose target is exactly `path`.
    pub fn requests_to(&self, path: &str) -> Vec<UpReq> {
        self.state.log().reqs.iter().filter(|r| r.path == path).cloned().collect()
    }

    /// How many requests had target `path`.
    pub fn count(&self, path: &str) -> usize {
        self.state.log().reqs.iter().filter(|r| r.path == path).count()
    }

    /// How many requests in all.
    pub fn total(&self) -> usize {
        self.state.log().reqs.len()
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> usize {
        self.state.log().conns.len()
    }

    pub fn conns(&self) -> Vec<ConnInfo> {
        self.state.log().conns.clone()
    }

    pub fn conn(&self, id: usize) -> Option<ConnInfo> {
        self.state.log().conns.get(id).cloned()
    }

    /// When the peer closed connection `id`, if it did.
    pub fn peer_closed_at(&self, id: usize) -> Option<Instant> {
        self.conn(id).and_then(|c| c.peer_closed)
    }

    /// The chunks written so far on connection `conn_id`, in order.
    pub fn pieces_sent(&self, conn_id: usize) -> Vec<PieceSent> {
        self.state.log().pieces.iter().filter(|p| p.conn_id == conn_id).cloned().collect()
    }

    /// Polls until at least `n` requests arrived (bounded by `timeout`).
    pub fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        eventually(timeout, || self.total() >= n)
    }

    /// Polls until the peer closed connection `id` (bounded by `timeout`); when it did.
    pub fn wait_peer_closed(&self, id: usize, timeout: Duration) -> Option<Instant> {
        let mut at = None;
        eventually(timeout, || {
            at = self.peer_closed_at(id);
            at.is_some()
        });
        at
    }

    /// A summary of requests and connections, for failure messages.
    pub fn describe(&self) -> String {
        let log = self.state.log();
        let mut s =
            format!("fake upstream {}: {} request(s), {} connection(s)\n", self.url(), log.reqs.len(), log.conns.len());
        let t0 = log.conns.first().map(|c| c.accepted);
        let ms = |t: Instant| t0.map(|t0| t.saturating_duration_since(t0).as_millis()).unwrap_or(0);
        for r in log.reqs.iter().take(50) {
            let _ = writeln!(
                s,
                "  +{}ms conn {}: {} {} ({} body bytes)",
                ms(r.at),
                r.conn_id,
                r.method,
                r.path,
                r.body.len()
            );
        }
        for c in log.conns.iter().take(50) {
            let end = match (c.peer_closed, c.closed_by_us) {
                (Some(t), _) => format!("closed by the peer at +{}ms", ms(t)),
                (None, true) => "closed by the fake".to_string(),
                (None, false) => "open".to_string(),
            };
            let _ = writeln!(s, "  conn {}: accepted +{}ms, {} request(s), {end}", c.id, ms(c.accepted), c.requests);
        }
        s
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let threads = std::mem::take(&mut *self.state.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for h in threads {
            let _ = h.join();
        }
    }
}

/// A port on 127.0.0.1 where nothing listens (bound, read, dropped): connecting is refused.
pub fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// `http://127.0.0.1:PORT` of a [`closed_port`].
pub fn closed_url() -> String {
    format!("http://127.0.0.1:{}", closed_port())
}

fn accept_loop(listener: TcpListener, st: Arc<State>) {
    while !st.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let id = {
                    let mut log = st.log();
                    let id = log.conns.len();
                    log.conns.push(ConnInfo {
                        id,
                        accepted: Instant::now(),
                        requests: 0,
                        peer_closed: None,
                        closed_by_us: false,
                    });
                    id
                };
                let st2 = st.clone();
                let h = thread::spawn(move || serve(stream, id, st2));
                st.threads.lock().unwrap_or_else(|e| e.into_inner()).push(h);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

enum Ev {
    Data,
    Closed,
    Stopped,
    Elapsed,
}

struct Peer {
    s: TcpStream,
    buf: Vec<u8>,
    id: usize,
    st: Arc<State>,
}

impl Peer {
    /// One read (bytes appended to `buf`), waking every TICK for the shutdown flag and
    /// `until`.
    fn read_some(&mut self, until: Option<Instant>) -> Ev {
        let mut tmp = [0u8; 16384];
        loop {
            if self.st.stop.load(Ordering::SeqCst) {
                return Ev::Stopped;
            }
            let mut tick = TICK;
            if let Some(u) = until {
                let now = Instant::now();
                if now >= u {
                    return Ev::Elapsed;
                }
                tick = tick.min(u - now).max(Duration::from_millis(1));
            }
            let _ = self.s.set_read_timeout(Some(tick));
            match self.s.read(&mut tmp) {
                Ok(0) => {
                    self.st.peer_closed(self.id);
                    return Ev::Closed;
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ev::Data;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => {
                    self.st.peer_closed(self.id);
                    return Ev::Closed;
                }
            }
        }
    }

    /// Waits until `until`, buffering whatever arrives. False when the connection ended.
    fn pause(&mut self, until: Instant) -> bool {
        loop {
            match self.read_some(Some(until)) {
                Ev::Data => continue,
                Ev::Elapsed => return true,
                Ev::Closed | Ev::Stopped => return false,
            }
        }
    }

    /// Says nothing until the peer closes or the test ends.
    fn hang(&mut self) {
        while let Ev::Data = self.read_some(None) {}
    }

    /// Writes everything. False when the connection is gone (recorded) or stuck.
    fn write(&mut self, b: &[u8]) -> bool {
        match self.s.write_all(b).and_then(|_| self.s.flush()) {
            Ok(()) => true,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                self.close_ourselves();
                false
            }
            Err(_) => {
                self.st.peer_closed(self.id);
                false
            }
        }
    }

    fn close_ourselves(&mut self) {
        self.st.closed_by_us(self.id);
        let _ = self.s.shutdown(Shutdown::Both);
    }

    /// The next complete request; None when the connection ended.
    fn next_request(&mut self) -> Option<UpReq> {
        loop {
            match parse_request(&self.buf) {
                Parsed::Done { method, path, headers, body, used } => {
                    self.buf.drain(..used);
                    return Some(UpReq { method, path, headers, body, conn_id: self.id, at: Instant::now() });
                }
                Parsed::Partial => match self.read_some(None) {
                    Ev::Data => continue,
                    _ => return None,
                },
                Parsed::Bad => {
                    let _ =
                        self.s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    self.close_ourselves();
                    return None;
                }
            }
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn head_bytes(status: u16, headers: &[(String, String)], framing: &str) -> Vec<u8> {
    let mut h = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in headers {
        let _ = write!(h, "{k}: {v}\r\n");
    }
    h.push_str(framing);
    h.push_str("\r\n\r\n");
    h.into_bytes()
}

fn serve(stream: TcpStream, id: usize, st: Arc<State>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut p = Peer { s: stream, buf: Vec::new(), id, st };
    while let Some(req) = p.next_request() {
        p.st.conn_mut(id, |c| c.requests += 1);
        p.st.log().reqs.push(req.clone());
        let b = catch_unwind(AssertUnwindSafe(|| (p.st.handler)(&req)))
            .unwrap_or_else(|_| Behaviour::text(500, "text/plain", "fake upstream: the test's handler panicked"));
        match b {
            Behaviour::Respond { status, headers, body, delay } => {
                if !delay.is_zero() && !p.pause(Instant::now() + delay) {
                    return;
                }
                let mut out = head_bytes(status, &headers, &format!("Content-Length: {}", body.len()));
                out.extend_from_slice(&body);
                if !p.write(&out) {
                    return;
                }
            }
            Behaviour::Chunked { status, headers, pieces, then } => {
                if !p.write(&head_bytes(status, &headers, "Transfer-Encoding: chunked")) {
                    return;
                }
                for (index, (delay, piece)) in pieces.into_iter().enumerate() {
                    if !delay.is_zero() && !p.pause(Instant::now() + delay) {
                        return;
                    }
                    if piece.is_empty() {
                        continue; // an empty chunk would end the body
                    }
                    let mut c = format!("{:x}\r\n", piece.len()).into_bytes();
                    c.extend_from_slice(&piece);
                    c.extend_from_slice(b"\r\n");
                    if !p.write(&c) {
                        return;
                    }
                    p.st.log().pieces.push(PieceSent { conn_id: id, index, at: Instant::now() });
                }
                match then {
                    After::Finish => {
                        if !p.write(b"0\r\n\r\n") {
                            return;
                        }
                    }
                    After::Close => {
                        p.close_ourselves();
                        return;
                    }
                    After::Hang => {
                        p.hang();
                        return;
                    }
                }
            }
            Behaviour::Close => {
                p.close_ourselves();
                return;
            }
            Behaviour::Hang => {
                p.hang();
                return;
            }
        }
    }
    // The peer closed, the request was bad, or the test ended: the socket closes on drop.
}

enum Parsed {
    Done { method: String, path: String, headers: Vec<(String, String)>, body: Vec<u8>, used: usize },
    Partial,
    Bad,
}

fn parse_request(buf: &[u8]) -> Parsed {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > 64 * 1024 { Parsed::Bad } else { Parsed::Partial };
    };
    let Ok(head) = std::str::from_utf8(&buf[..head_end]) else { return Parsed::Bad };
    let mut lines = head.split("\r\n");
    let mut rl = lines.next().unwrap_or("").split(' ');
    let (Some(method), Some(path), Some(version)) = (rl.next(), rl.next(), rl.next()) else {
        return Parsed::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Parsed::Bad;
    }
    let mut headers = Vec::new();
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { return Parsed::Bad };
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let start = head_end + 4;
    let chunked = get("transfer-encoding").map(|v| v.to_ascii_lowercase().contains("chunked")).unwrap_or(false);
    let (body, used) = if chunked {
        match dechunk(&buf[start..]) {
            Parsed::Done { body, used, .. } => (body, start + used),
            other => return other,
        }
    } else {
        let n = match get("content-length").map(|v| v.parse::<usize>()) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(_)) => return Parsed::Bad,
        };
        if buf.len() < start + n {
            return Parsed::Partial;
        }
        (buf[start..start + n].to_vec(), start + n)
    };
    Parsed::Done { method: method.to_string(), path: path.to_string(), headers, body, used }
}

/// De-chunks a body at the start of `b` (only `body` and `used` of `Done` are set).
fn dechunk(b: &[u8]) -> Parsed {
    let mut body = Vec::new();
    let mut i = 0;
    loop {
        let Some(le) = find(&b[i..], b"\r\n") else { return Parsed::Partial };
        let line = String::from_utf8_lossy(&b[i..i + le]).into_owned();
        let Ok(size) = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16) else {
            return Parsed::Bad;
        };
        i += le + 2;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                let Some(le) = find(&b[i..], b"\r\n") else { return Parsed::Partial };
                i += le + 2;
                if le == 0 {
                    return Parsed::Done { method: String::new(), path: String::new(), headers: vec![], body, used: i };
                }
            }
        }
        if b.len() < i + size + 2 {
            return Parsed::Partial;
        }
        body.extend_from_slice(&b[i..i + size]);
        i += size + 2;
    }
}

// ---------------------------------------------------------------------------------------
// Self-test of the fake (no forkd involved)
// ---------------------------------------------------------------------------------------

mod selftest {
    use super::*;
    use crate::util::{request, Conn};
    use serde_json::json;

    #[test]
    fn fake_upstream_answers_and_counts() {
        let up = Upstream::start(|r| match r.path.as_str() {
            "/a" => Behaviour::json(200, &json!({"ok": true, "method": r.method})),
            "/echo" => Behaviour::text(201, "text/plain", r.body.clone()),
            "/slow" => Behaviour::json(200, &json!({"slow": true})).after(Duration::from_millis(150)),
            "/big" => Behaviour::padded_json_object(2 * 1024 * 1024),
            "/chunks" => Behaviour::sse(
                vec![(Duration::ZERO, "data: one\n\n".into()), (Duration::from_millis(50), "data: two\n\n".into())],
                After::Finish,
            ),
            "/close" => Behaviour::Close,
            "/hang" => Behaviour::Hang,
            _ => Behaviour::json(404, &json!({"error": "no such path"})),
        });
        assert!(up.url().starts_with("http://127.0.0.1:"), "url(): {}", up.url());

        // Keep-alive: several requests on one connection, Content-Length and chunked framing.
        let mut c = Conn::open(up.addr());
        let r = c.get("/a");
        assert_eq!(r.status, 200, "GET /a: {r:?}");
        assert_eq!(r.json(), json!({"ok": true, "method": "GET"}), "GET /a body");
        assert_eq!(r.header("content-type"), Some("application/json"), "GET /a content type");
        c.send(&request("POST", "/echo", &[("Content-Type", "text/plain")], b"hello body"));
        let r = c.read_response();
        assert_eq!((r.status, r.body_str().as_str()), (201, "hello body"), "POST /echo: {r:?}");
        let t = Instant::now();
        let r = c.get("/slow");
        assert!(r.status == 200 && t.elapsed() >= Duration::from_millis(140), "GET /slow after 150 ms: {r:?}");
        let r = c.get("/chunks");
        assert_eq!(r.header("transfer-encoding"), Some("chunked"), "GET /chunks must be chunked: {r:?}");
        assert_eq!(r.body_str(), "data: one\n\ndata: two\n\n", "GET /chunks body");
        let r = c.get("/big");
        assert_eq!(r.body.len(), 2 * 1024 * 1024, "GET /big: a body of exactly 2 MiB");
        assert!(serde_json::from_slice::<Value>(&r.body).is_ok(), "GET /big: the padded body is JSON");
        let r = c.get("/a");
        assert_eq!(r.status, 200, "GET /a again on the same connection: {r:?}");
        assert_eq!(up.connections(), 1, "one keep-alive connection so far:\n{}", up.describe());
        assert_eq!(up.count("/a"), 2, "two requests to /a:\n{}", up.describe());
        assert_eq!(up.total(), 6, "six requests so far:\n{}", up.describe());
        let echo = &up.requests_to("/echo")[0];
        assert_eq!(
            (echo.method.as_str(), echo.body.as_slice(), echo.header("Content-Type"), echo.conn_id),
            ("POST", &b"hello body"[..], Some("text/plain"), 0),
            "the recorded POST"
        );
        assert_eq!(up.pieces_sent(0).len(), 2, "two chunks recorded for /chunks");
        assert!(up.peer_closed_at(0).is_none(), "the client has not closed yet:\n{}", up.describe());
        drop(c);
        assert!(
            up.wait_peer_closed(0, Duration::from_secs(2)).is_some(),
            "the client's close must be recorded:\n{}",
            up.describe()
        );

        // Close without an answer.
        let mut c = Conn::open(up.addr());
        c.send(&request("GET", "/close", &[], b""));
        c.assert_closed(Duration::from_secs(2), "GET /close");
        let info = up.conn(1).expect("a second connection");
        assert!(info.closed_by_us && info.peer_closed.is_none(), "conn 1 closed by the fake: {info:?}");

        // Hang: no answer; the client's close is seen.
        let mut c = Conn::open(up.addr());
        c.send(&request("GET", "/hang", &[], b""));
        assert!(!c.poll_readable(Duration::from_millis(200)), "GET /hang must not be answered");
        assert!(up.wait_requests(8, Duration::from_secs(2)), "the /hang request is recorded:\n{}", up.describe());
        let t = Instant::now();
        drop(c);
        let closed = up.wait_peer_closed(2, Duration::from_secs(2));
        assert!(closed.is_some(), "a hanging connection sees the client's close:\n{}", up.describe());
        assert!(closed.unwrap() >= t, "closed after the client dropped it");
        assert_eq!(up.connections(), 3, "three connections:\n{}", up.describe());

        // A closed port refuses.
        let addr: SocketAddr = format!("127.0.0.1:{}", closed_port()).parse().unwrap();
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
            "closed_port(): connecting must be refused"
        );

        // Drop stops it: a later connect is refused, and dropping returns promptly even
        // with a connection still hanging.
        let mut c = Conn::open(up.addr());
        c.send(&request("GET", "/hang", &[], b""));
        assert!(up.wait_requests(9, Duration::from_secs(2)), "the second /hang is recorded");
        let addr = up.addr();
        let t = Instant::now();
        drop(up);
        assert!(t.elapsed() < Duration::from_secs(1), "dropping the fake took {:?}", t.elapsed());
        c.assert_closed(Duration::from_secs(2), "a hanging connection when the fake is dropped");
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
            "the fake still listens after drop"
        );
    }
}

// ---------------------------------------------------------------------------------------
// A TLS-terminating front for a fake upstream (for `https://` upstream URLs)
// ---------------------------------------------------------------------------------------

/// Bound for one TLS handshake on the front.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A self-signed test certificate authority (rcgen, ECDSA P-256) that issues server
/// certificates. Its certificate is written as PEM to a temp file ([`TestCa::pem_path`]),
/// e.g. for forkd's `SSL_CERT_FILE`. Several [`TlsFront`]s started with the same CA
/// ([`TlsFront::start_with_ca`]) are all trusted through that one file.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
    dir: tempfile::TempDir,
    pem_path: PathBuf,
}

impl TestCa {
    /// A fresh CA whose subject is `CN=common_name`.
    pub fn new(common_name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().expect("rcgen: CA key pair");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("rcgen: CA params");
        p.distinguished_name.push(DnType::CommonName, common_name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2045, 1, 1);
        let cert = p.self_signed(&key).expect("rcgen: self-signed CA certificate");
        let dir = tempfile::Builder::new().prefix("forkd-it-ca-").tempdir().expect("tempdir for the CA");
        let pem_path = dir.path().join("ca.pem");
        std::fs::write(&pem_path, cert.pem()).expect("write the CA certificate PEM");
        TestCa { cert, key, dir, pem_path }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A file holding [`TestCa::pem`] (lives as long as this `TestCa`).
    pub fn pem_path(&self) -> PathBuf {
        self.pem_path.clone()
    }

    /// A server certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`
    /// which become IP SANs) signed by this CA, and its private key.
    pub fn issue(
        &self,
        names: &[&str],
    ) -> (Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>) {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().expect("rcgen: server key pair");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = CertificateParams::new(names.clone())
            .unwrap_or_else(|e| panic!("rcgen: server certificate params for {names:?}: {e}"));
        p.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2045, 1, 1);
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("rcgen: sign the server certificate");
        let key_der =
            rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key_der)
    }
}

/// The ring crypto provider (explicit, so nothing depends on a process-wide default).
fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

struct FrontState {
    stop: AtomicBool,
    backend: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    accepted: AtomicUsize,
    handshakes: AtomicUsize,
    failed_handshakes: AtomicUsize,
    backend_connections: AtomicUsize,
    /// Connections that ended because forkd closed its side (EOF, close_notify, reset).
    closed_by_client: AtomicUsize,
    /// Connections that ended because the backend closed its side.
    closed_by_backend: AtomicUsize,
    /// What went wrong, in order (handshake errors above all), for failure messages.
    errors: Mutex<Vec<String>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl FrontState {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn error(&self, id: usize, what: String) {
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if e.len() < 50 {
            e.push(format!("conn {id}: {what}"));
        }
    }
}

/// A TLS-terminating front for a fake [`Upstream`]: listens on `127.0.0.1:0`, does the
/// server side of a TLS handshake (rustls, ring) with a certificate for the given names,
/// then relays the plaintext both ways to a fresh plain TCP connection to the backend,
/// one thread per connection. When forkd closes its TLS connection the backend connection
/// is closed too (so the backend fake records the peer close); when the backend closes,
/// the front sends `close_notify` and closes the TLS connection.
///
/// Dropping it stops and joins every thread it started.
pub struct TlsFront {
    addr: SocketAddr,
    names: Vec<String>,
    trusted: bool,
    ca_pem_path: PathBuf,
    _dir: tempfile::TempDir,
    state: Arc<FrontState>,
    accept: Option<JoinHandle<()>>,
}

impl TlsFront {
    /// A front for `backend` (`http://127.0.0.1:PORT[/…]` as from [`Upstream::url`], or
    /// `127.0.0.1:PORT`) with a certificate for `hostnames` signed by a fresh CA, whose
    /// certificate is at [`TlsFront::ca_pem_path`].
    pub fn start(backend: &str, hostnames: &[&str]) -> TlsFront {
        let ca = TestCa::new("forkd-it test CA");
        Self::start_with_ca(backend, hostnames, &ca)
    }

    /// Like [`TlsFront::start`] with a certificate signed by `ca` (so one CA file trusts
    /// several fronts); [`TlsFront::ca_pem_path`] holds a copy of `ca`'s certificate.
    pub fn start_with_ca(backend: &str, hostnames: &[&str], ca: &TestCa) -> TlsFront {
        let (chain, key) = ca.issue(hostnames);
        Self::launch(backend, hostnames, chain, key, &ca.pem(), true)
    }

    /// A front whose certificate is signed by a CA nobody knows: [`TlsFront::ca_pem_path`]
    /// holds the certificate of yet another CA, so even a client given that file rejects
    /// the front's certificate.
    pub fn start_untrusted(backend: &str, hostnames: &[&str]) -> TlsFront {
        let (chain, key) = TestCa::new("forkd-it UNTRUSTED CA").issue(hostnames);
        let decoy = TestCa::new("forkd-it decoy CA");
        Self::launch(backend, hostnames, chain, key, &decoy.pem(), false)
    }

    fn launch(
        backend: &str,
        hostnames: &[&str],
        chain: Vec<rustls::pki_types::CertificateDer<'static>>,
        key: rustls::pki_types::PrivateKeyDer<'static>,
        ca_pem: &str,
        trusted: bool,
    ) -> TlsFront {
        let backend = parse_backend(backend);
        let config = rustls::ServerConfig::builder_with_provider(ring_provider())
            .with_safe_default_protocol_versions()
            .expect("rustls: protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("rustls: server certificate and key");
        let dir = tempfile::Builder::new().prefix("forkd-it-tls-").tempdir().expect("tempdir for the TLS front");
        let ca_pem_path = dir.path().join("ca.pem");
        std::fs::write(&ca_pem_path, ca_pem).expect("write the CA certificate PEM");
        let listener = TcpListener::bind("127.0.0.1:0").expect("TLS front: bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("TLS front: nonblocking listener");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(FrontState {
            stop: AtomicBool::new(false),
            backend,
            config: Arc::new(config),
            accepted: AtomicUsize::new(0),
            handshakes: AtomicUsize::new(0),
            failed_handshakes: AtomicUsize::new(0),
            backend_connections: AtomicUsize::new(0),
            closed_by_client: AtomicUsize::new(0),
            closed_by_backend: AtomicUsize::new(0),
            errors: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        let accept = thread::spawn(move || front_accept_loop(listener, st));
        TlsFront {
            addr,
            names: hostnames.iter().map(|n| n.to_string()).collect(),
            trusted,
            ca_pem_path,
            _dir: dir,
            state,
            accept: Some(accept),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `https://{host}:{port}` (no trailing slash).
    pub fn url(&self, host: &str) -> String {
        format!("https://{host}:{}", self.port())
    }

    /// The PEM file of the CA to trust (for an untrusted front: NOT its issuer).
    pub fn ca_pem_path(&self) -> PathBuf {
        self.ca_pem_path.clone()
    }

    /// The names the certificate was issued for.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// TCP connections accepted.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed.
    pub fn handshakes(&self) -> usize {
        self.state.handshakes.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed (the client rejected the certificate, went away, …).
    pub fn failed_handshakes(&self) -> usize {
        self.state.failed_handshakes.load(Ordering::SeqCst)
    }

    /// Connections opened to the backend (one per completed handshake, when it connects).
    pub fn backend_connections(&self) -> usize {
        self.state.backend_connections.load(Ordering::SeqCst)
    }

    /// Relayed connections that ended because the TLS client closed its side.
    pub fn closed_by_client(&self) -> usize {
        self.state.closed_by_client.load(Ordering::SeqCst)
    }

    /// Relayed connections that ended because the backend closed its side.
    pub fn closed_by_backend(&self) -> usize {
        self.state.closed_by_backend.load(Ordering::SeqCst)
    }

    /// Errors seen so far (handshake failures with rustls's reason), in order.
    pub fn errors(&self) -> Vec<String> {
        self.state.errors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Polls until at least `n` handshakes failed (bounded by `timeout`).
    pub fn wait_failed_handshakes(&self, n: usize, timeout: Duration) -> bool {
        eventually(timeout, || self.failed_handshakes() >= n)
    }

    /// Polls until at least `n` handshakes completed (bounded by `timeout`).
    pub fn wait_handshakes(&self, n: usize, timeout: Duration) -> bool {
        eventually(timeout, || self.handshakes() >= n)
    }

    /// The counters and errors, for failure messages.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "TLS front 127.0.0.1:{} ({}, certificate for {:?}) -> backend {}: {} accepted, {} handshake(s) completed, \
             {} failed, {} backend connection(s), {} closed by the client, {} closed by the backend\n",
            self.port(),
            if self.trusted { "trusted CA" } else { "UNTRUSTED CA" },
            self.names,
            self.state.backend,
            self.accepted(),
            self.handshakes(),
            self.failed_handshakes(),
            self.backend_connections(),
            self.closed_by_client(),
            self.closed_by_backend(),
        );
        for e in self.errors() {
            let _ = writeln!(s, "  {e}");
        }
        s
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let threads = std::mem::take(&mut *self.state.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for h in threads {
            let _ = h.join();
        }
    }
}

/// `http://127.0.0.1:PORT[/path]` or `127.0.0.1:PORT` → the socket address.
fn parse_backend(s: &str) -> SocketAddr {
    let rest = s.strip_prefix("http://").unwrap_or(s);
    let hostport = rest.split('/').next().unwrap_or(rest);
    std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("TLS front: backend {s:?} is not http://HOST:PORT or HOST:PORT"))
}

fn front_accept_loop(listener: TcpListener, st: Arc<FrontState>) {
    while !st.stopped() {
        match listener.accept() {
            Ok((stream, _)) => {
                let id = st.accepted.fetch_add(1, Ordering::SeqCst);
                let st2 = st.clone();
                let h = thread::spawn(move || front_conn(stream, id, st2));
                st.threads.lock().unwrap_or_else(|e| e.into_inner()).push(h);
            }
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn is_wait(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted)
}

/// One connection: handshake, backend connection, relay until either side closes.
fn front_conn(mut tcp: TcpStream, id: usize, st: Arc<FrontState>) {
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(TICK));
    let _ = tcp.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut tls = match rustls::ServerConnection::new(st.config.clone()) {
        Ok(c) => c,
        Err(e) => {
            st.failed_handshakes.fetch_add(1, Ordering::SeqCst);
            st.error(id, format!("rustls::ServerConnection::new: {e}"));
            return;
        }
    };
    // The handshake, waking every TICK for the stop flag, bounded by HANDSHAKE_TIMEOUT.
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    while tls.is_handshaking() {
        if st.stopped() {
            return;
        }
        if Instant::now() >= deadline {
            st.failed_handshakes.fetch_add(1, Ordering::SeqCst);
            st.error(id, format!("handshake not complete within {HANDSHAKE_TIMEOUT:?}"));
            return;
        }
        match tls.complete_io(&mut tcp) {
            Ok(_) => {}
            Err(e) if is_wait(&e) => {}
            Err(e) => {
                st.failed_handshakes.fetch_add(1, Ordering::SeqCst);
                st.error(id, format!("handshake failed: {e}"));
                return;
            }
        }
    }
    st.handshakes.fetch_add(1, Ordering::SeqCst);

    let mut be = match TcpStream::connect_timeout(&st.backend, Duration::from_secs(2)) {
        Ok(s) => s,
        Err(e) => {
            st.error(id, format!("backend {} refused: {e}", st.backend));
            tls.send_close_notify();
            let _ = tls.complete_io(&mut tcp);
            let _ = tcp.shutdown(Shutdown::Both);
            return;
        }
    };
    st.backend_connections.fetch_add(1, Ordering::SeqCst);
    let _ = be.set_nodelay(true);
    let _ = be.set_read_timeout(Some(TICK));
    let _ = be.set_write_timeout(Some(WRITE_TIMEOUT));

    match relay(&mut tls, &mut tcp, &mut be, &st) {
        End::Client(why) => {
            st.closed_by_client.fetch_add(1, Ordering::SeqCst);
            if let Some(why) = why {
                st.error(id, format!("client side: {why}"));
            }
            let _ = be.shutdown(Shutdown::Both);
            let _ = tcp.shutdown(Shutdown::Both);
        }
        End::Backend(why) => {
            st.closed_by_backend.fetch_add(1, Ordering::SeqCst);
            if let Some(why) = why {
                st.error(id, format!("backend side: {why}"));
            }
            tls.send_close_notify();
            while tls.wants_write() {
                if tls.write_tls(&mut tcp).is_err() {
                    break;
                }
            }
            let _ = tcp.shutdown(Shutdown::Both);
            let _ = be.shutdown(Shutdown::Both);
        }
        End::Stopped => {
            let _ = be.shutdown(Shutdown::Both);
            let _ = tcp.shutdown(Shutdown::Both);
        }
    }
}

/// Why a relay ended (with an error message when it was not a clean close).
enum End {
    Client(Option<String>),
    Backend(Option<String>),
    Stopped,
}

/// Which of the two sockets are readable (or hung up / in error) within `timeout`.
fn poll_two(a: &TcpStream, b: &TcpStream, timeout: Duration) -> (bool, bool) {
    use std::os::fd::AsRawFd;
    let mut fds = [
        libc::pollfd { fd: a.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: b.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid array of two initialised pollfd for the duration of the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return (false, false);
    }
    let ready = |f: &libc::pollfd| f.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
    (ready(&fds[0]), ready(&fds[1]))
}

/// Writes every pending TLS record to the client.
fn flush_tls(tls: &mut rustls::ServerConnection, tcp: &mut TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(tcp) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn relay(tls: &mut rustls::ServerConnection, tcp: &mut TcpStream, be: &mut TcpStream, st: &FrontState) -> End {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Plaintext from the client (possibly already buffered by the handshake) → backend.
        loop {
            match tls.reader().read(&mut buf) {
                Ok(0) => return End::Client(None), // close_notify
                Ok(n) => {
                    if let Err(e) = be.write_all(&buf[..n]) {
                        return End::Backend(Some(format!("write to the backend: {e}")));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return End::Client(Some(format!("read: {e}"))),
            }
        }
        if let Err(e) = flush_tls(tls, tcp) {
            return End::Client(Some(format!("write: {e}")));
        }
        if st.stopped() {
            return End::Stopped;
        }
        let (client_ready, backend_ready) = poll_two(tcp, be, TICK);
        if client_ready {
            match tls.read_tls(tcp) {
                Ok(0) => return End::Client(None), // EOF without close_notify
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        let _ = flush_tls(tls, tcp);
                        return End::Client(Some(format!("TLS error: {e}")));
                    }
                }
                Err(e) if is_wait(&e) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return End::Client(None),
                Err(e) => return End::Client(Some(format!("read: {e}"))),
            }
        }
        if backend_ready {
            match be.read(&mut buf) {
                Ok(0) => return End::Backend(None),
                Ok(n) => {
                    let mut data = &buf[..n];
                    while !data.is_empty() {
                        let k = match tls.writer().write(data) {
                            Ok(k) => k,
                            Err(e) => return End::Client(Some(format!("TLS writer: {e}"))),
                        };
                        data = &data[k..];
                        if let Err(e) = flush_tls(tls, tcp) {
                            return End::Client(Some(format!("write: {e}")));
                        }
                        if k == 0 && !tls.wants_write() {
                            return End::Client(Some("TLS writer accepts nothing".into()));
                        }
                    }
                }
                Err(e) if is_wait(&e) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return End::Backend(None),
                Err(e) => return End::Backend(Some(format!("read: {e}"))),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Self-test of the TLS front (no forkd involved)
// ---------------------------------------------------------------------------------------

mod tls_selftest {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use serde_json::json;

    type TlsClient = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

    /// A rustls client trusting the certificates in `ca_pem`, connected to `front` and
    /// handshaken as `name`. `Err` with rustls's reason when the handshake fails.
    fn connect(front: &TlsFront, ca_pem: &std::path::Path, name: &str) -> Result<TlsClient, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca_pem).map_err(|e| format!("read {ca_pem:?}: {e}"))? {
            roots.add(c.map_err(|e| format!("parse {ca_pem:?}: {e}"))?).map_err(|e| format!("add root: {e}"))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(ring_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(name.to_string()).map_err(|e| format!("server name {name:?}: {e}"))?;
        let mut conn =
            rustls::ClientConnection::new(Arc::new(config), server_name).map_err(|e| format!("client: {e}"))?;
        let mut tcp = TcpStream::connect_timeout(&front.addr(), Duration::from_secs(2))
            .map_err(|e| format!("connect {}: {e}", front.addr()))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tcp.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).map_err(|e| format!("handshake: {e}"))?;
        }
        Ok(rustls::StreamOwned::new(conn, tcp))
    }

    /// `GET path` on `c`; (status, body) of a Content-Length response.
    fn get(c: &mut TlsClient, path: &str) -> (u16, Vec<u8>) {
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes()).expect("TLS write");
        c.flush().expect("TLS flush");
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
                let len: usize = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                    .and_then(|v| v.parse().ok())
                    .expect("Content-Length");
                if buf.len() >= end + 4 + len {
                    return (status, buf[end + 4..end + 4 + len].to_vec());
                }
            }
            let n = c.read(&mut tmp).unwrap_or_else(|e| panic!("TLS read of GET {path}: {e}; so far {buf:?}"));
            assert!(n > 0, "EOF before the response to GET {path} was complete: {:?}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&tmp[..n]);
        }
    }

    #[test]
    fn tls_front_serves_a_plain_backend() {
        let up = Upstream::start(|r| match r.path.as_str() {
            "/close" => Behaviour::Close,
            "/hang" => Behaviour::Hang,
            p => Behaviour::json(200, &json!({"path": p})),
        });
        let front = TlsFront::start(&up.url(), &["localhost", "127.0.0.1"]);
        assert_eq!(front.url("localhost"), format!("https://localhost:{}", front.port()));

        // Keep-alive through the front, by DNS name.
        let mut c = connect(&front, &front.ca_pem_path(), "localhost")
            .unwrap_or_else(|e| panic!("a client trusting ca_pem_path must connect: {e}\n{}", front.describe()));
        for p in ["/one", "/two"] {
            let (status, body) = get(&mut c, p);
            assert_eq!(status, 200, "GET {p} through the TLS front\n{}", front.describe());
            assert_eq!(serde_json::from_slice::<Value>(&body).ok(), Some(json!({"path": p})), "GET {p} body");
        }
        assert_eq!(up.connections(), 1, "one backend connection for one TLS connection:\n{}", up.describe());
        // By IP address (an IP SAN).
        let mut c2 = connect(&front, &front.ca_pem_path(), "127.0.0.1")
            .unwrap_or_else(|e| panic!("connect by IP SAN 127.0.0.1: {e}\n{}", front.describe()));
        assert_eq!(get(&mut c2, "/ip").0, 200, "GET /ip by IP SAN\n{}", front.describe());
        assert_eq!(
            (front.accepted(), front.handshakes(), front.failed_handshakes(), front.backend_connections()),
            (2, 2, 0, 2),
            "counters after two good connections:\n{}",
            front.describe()
        );

        // The client closes: the backend sees its connection closed.
        drop(c);
        assert!(
            up.wait_peer_closed(0, Duration::from_secs(2)).is_some(),
            "the client closed its TLS connection: the backend connection must close:\n{}{}",
            front.describe(),
            up.describe()
        );

        // The backend closes: the client gets close_notify then EOF (a clean end).
        c2.write_all(b"GET /close HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        c2.flush().unwrap();
        let mut tmp = [0u8; 64];
        let r = c2.read(&mut tmp);
        assert!(matches!(r, Ok(0)), "backend closed: the client must see a clean TLS close, got {r:?}");
        assert!(eventually(Duration::from_secs(2), || front.closed_by_backend() == 1), "{}", front.describe());

        // Wrong name: rejected by the client, counted as a failed handshake.
        let r = connect(&front, &front.ca_pem_path(), "other.example");
        assert!(r.is_err(), "a certificate for localhost must not verify as other.example");
        assert!(front.wait_failed_handshakes(1, Duration::from_secs(2)), "{}", front.describe());

        // An untrusted front: its ca_pem_path does not verify it.
        let bad = TlsFront::start_untrusted(&up.url(), &["localhost"]);
        let r = connect(&bad, &bad.ca_pem_path(), "localhost");
        assert!(r.is_err(), "the untrusted front's certificate must not verify with its ca_pem_path");
        assert!(bad.wait_failed_handshakes(1, Duration::from_secs(2)), "{}", bad.describe());
        assert_eq!((bad.handshakes(), bad.backend_connections()), (0, 0), "{}", bad.describe());
        // ... nor with the other front's CA.
        assert!(connect(&bad, &front.ca_pem_path(), "localhost").is_err(), "untrusted front vs another CA");

        // A CA shared by two fronts: one file trusts both.
        let ca = TestCa::new("shared");
        let f1 = TlsFront::start_with_ca(&up.url(), &["localhost"], &ca);
        let f2 = TlsFront::start_with_ca(&format!("{}", up.addr()), &["localhost"], &ca);
        for f in [&f1, &f2] {
            let mut c = connect(f, &ca.pem_path(), "localhost").unwrap_or_else(|e| panic!("shared CA: {e}"));
            assert_eq!(get(&mut c, "/shared").0, 200, "{}", f.describe());
        }

        // Dropping the front is prompt even with a relayed connection hanging.
        let mut c3 = connect(&front, &front.ca_pem_path(), "localhost").unwrap();
        c3.write_all(b"GET /hang HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        c3.flush().unwrap();
        assert!(eventually(Duration::from_secs(2), || up.count("/hang") == 1), "{}", up.describe());
        let addr = front.addr();
        let t = Instant::now();
        drop(front);
        assert!(t.elapsed() < Duration::from_secs(1), "dropping the TLS front took {:?}", t.elapsed());
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
            "the TLS front still listens after drop"
        );
    }
}
