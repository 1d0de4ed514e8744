//! The raw HTTP/1.1 client: a request builder, `Response` (the shape every protocol's
//! answer is given in), `Conn` (arbitrary bytes out, one response at a time in),
//! `send_raw`, and `Hammer` (background load). Bytes are written as given: nothing here
//! fixes a malformed request.

use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use super::*;

/// Builds a request with `Host` first, then `headers`, then `Content-Length` when `body`
/// is non-empty.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut s = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        s.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    s.push_str("\r\n");
    let mut v = s.into_bytes();
    v.extend_from_slice(body);
    v
}

#[derive(Clone)]
pub struct Response {
    pub version: String,
    pub status: u16,
    pub reason: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Interim responses read before this one (`103 Early Hints`), in order. `100
    /// Continue` and `101` are never put here: they are read as responses of their own.
    pub interim: Box<[Response]>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    pub fn header_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().filter(|(k, _)| *k == name).map(|(_, v)| v.as_str()).collect()
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }

    /// True when the response asks to close the connection.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "close"))
            .unwrap_or(false)
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in &self.interim {
            writeln!(f, "{} {} {} (interim)", i.version, i.status, i.reason)?;
            for (k, v) in &i.headers {
                writeln!(f, "  {k}: {v}")?;
            }
        }
        writeln!(f, "{} {} {}", self.version, self.status, self.reason)?;
        for (k, v) in &self.headers {
            writeln!(f, "  {k}: {v}")?;
        }
        let b = self.body_str();
        if b.len() > 600 {
            write!(
                f,
                "  body ({} bytes): {}…",
                self.body.len(),
                &b[..b.char_indices().nth(600).map(|(i, _)| i).unwrap_or(b.len())]
            )
        } else {
            write!(f, "  body ({} bytes): {}", self.body.len(), b)
        }
    }
}

/// A client connection that writes arbitrary bytes and reads one response at a time.
pub struct Conn {
    pub stream: TcpStream,
    pub(super) buf: Vec<u8>,
    pub(super) eof: bool,
    pub(super) timeout: Duration,
    log_path: Option<PathBuf>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        Self::open_with_log(addr, None)
    }

    pub fn open_with_log(addr: SocketAddr, log_path: Option<PathBuf>) -> Conn {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect {addr}: {e}{}", log_suffix(&log_path)));
        Conn::from_stream(s, log_path)
    }

    pub fn from_stream(stream: TcpStream, log_path: Option<PathBuf>) -> Conn {
        stream.set_nodelay(true).ok();
        let mut c = Conn { stream, buf: Vec::new(), eof: false, timeout: IO_TIMEOUT, log_path };
        c.set_timeout(IO_TIMEOUT);
        c
    }

    pub fn set_timeout(&mut self, d: Duration) {
        self.timeout = d;
        self.stream.set_read_timeout(Some(d)).unwrap();
        self.stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    }

    fn ctx(&self) -> String {
        log_suffix(&self.log_path)
    }

    /// Writes all of `bytes`, panicking on error.
    pub fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.try_write(bytes) {
            panic!("write failed: {e}{}", self.ctx());
        }
    }

    pub fn try_write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Bytes received but not yet consumed by a response.
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    /// Take the bytes received but not yet consumed (the caller reads the rest itself).
    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    pub(super) fn fill(&mut self) -> io::Result<usize> {
        let mut tmp = [0u8; 65536];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits up to `d` for anything from the server (bytes or EOF). True if something came.
    pub fn poll_readable(&mut self, d: Duration) -> bool {
        if !self.buf.is_empty() || self.eof {
            return true;
        }
        self.stream.set_read_timeout(Some(d)).unwrap();
        let r = self.fill();
        self.stream.set_read_timeout(Some(self.timeout)).unwrap();
        match r {
            Ok(_) => true,
            Err(e) if is_timeout(&e) => false,
            Err(_) => true, // reset counts as "something happened"
        }
    }

    /// Reads one response (panics with the server log on failure).
    pub fn read_response(&mut self) -> Response {
        self.try_read_response(false).unwrap_or_else(|e| panic!("reading response: {e}{}", self.ctx()))
    }

    /// Reads one response to a HEAD request (no body).
    pub fn read_head_response(&mut self) -> Response {
        self.try_read_response(true).unwrap_or_else(|e| panic!("reading HEAD response: {e}{}", self.ctx()))
    }

    /// Sends `GET path` and reads the response.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(&request("GET", path, &[], b""));
        self.read_response()
    }

    /// Reads one response. `head`: the request was HEAD (no body follows). Interim
    /// responses other than `100` and `101` (`103 Early Hints`) are read and kept in the
    /// final response's `interim`.
    pub fn try_read_response(&mut self, head: bool) -> io::Result<Response> {
        let mut interim = Vec::new();
        loop {
            let r = self.try_read_one(head)?;
            if (102..200).contains(&r.status) {
                interim.push(r);
            } else {
                return Ok(Response { interim: interim.into_boxed_slice(), ..r });
            }
        }
    }

    fn try_read_one(&mut self, head: bool) -> io::Result<Response> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("EOF before a complete response head; got {:?}", String::from_utf8_lossy(&self.buf)),
                ));
            }
            self.fill_ctx("response head")?;
        };
        let head_text = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end + 4);
        let mut lines = head_text.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("").to_string();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {status_line:?}")))?;
        if !version.starts_with("HTTP/1.") {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {status_line:?}")));
        }
        let reason = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad header line {l:?}")));
            };
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = Response { version, status, reason, headers, body: Vec::new(), interim: Box::default() };
        if head || (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked"))
            .unwrap_or(false);
        if chunked {
            resp.body = self.read_chunked()?;
        } else if let Some(cl) = resp.header("content-length") {
            let n: usize = cl
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad Content-Length {cl:?}")))?;
            while self.buf.len() < n {
                if self.eof {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("EOF after {} of {n} body bytes; head: {resp:?}", self.buf.len()),
                    ));
                }
                self.fill_ctx("response body")?;
            }
            resp.body = self.buf.drain(..n).collect();
        } else {
            // No length: delimited by close.
            while !self.eof {
                self.fill_ctx("close-delimited body")?;
            }
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    fn fill_ctx(&mut self, what: &str) -> io::Result<usize> {
        self.fill().map_err(|e| {
            let kind = e.kind();
            io::Error::new(
                kind,
                format!(
                    "{e} while reading {what} (after {:?}); partial: {:?}",
                    self.timeout,
                    String::from_utf8_lossy(tail_bytes(&self.buf, 400))
                ),
            )
        })
    }

    pub(super) fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    break i;
                }
                if self.eof {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in chunk size"));
                }
                self.fill_ctx("chunk size")?;
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            self.buf.drain(..line_end + 2);
            let size_str = line.split(';').next().unwrap().trim();
            let size = usize::from_str_radix(size_str, 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}")))?;
            if size == 0 {
                // Trailers until an empty line.
                loop {
                    let end = loop {
                        if let Some(i) = find(&self.buf, b"\r\n") {
                            break i;
                        }
                        if self.eof {
                            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in trailers"));
                        }
                        self.fill_ctx("trailers")?;
                    };
                    self.buf.drain(..end + 2);
                    if end == 0 {
                        return Ok(body);
                    }
                }
            }
            while self.buf.len() < size + 2 {
                if self.eof {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in chunk data"));
                }
                self.fill_ctx("chunk data")?;
            }
            body.extend_from_slice(&self.buf[..size]);
            self.buf.drain(..size + 2);
        }
    }

    /// Waits up to `within` for the server to close the connection. `Ok(elapsed)` on EOF
    /// or reset with nothing more received; `Err` describing what happened otherwise
    /// (bytes arrived, or still open at the deadline).
    pub fn expect_close(&mut self, within: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        if !self.buf.is_empty() {
            return Err(format!("unexpected bytes instead of close: {:?}", String::from_utf8_lossy(&self.buf)));
        }
        if self.eof {
            return Ok(start.elapsed());
        }
        self.stream.set_read_timeout(Some(within.max(Duration::from_millis(1)))).unwrap();
        let r = self.fill();
        self.stream.set_read_timeout(Some(self.timeout)).unwrap();
        match r {
            Ok(0) => Ok(start.elapsed()),
            Ok(_) => Err(format!(
                "unexpected bytes instead of close: {:?}",
                String::from_utf8_lossy(tail_bytes(&self.buf, 600))
            )),
            Err(e) if is_timeout(&e) => Err(format!("connection still open after {within:?}")),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(start.elapsed()),
            Err(e) => Err(format!("read error {e}")),
        }
    }

    /// Asserts the server closes the connection within `within` (EOF or reset).
    pub fn assert_closed(&mut self, within: Duration, what: &str) {
        if let Err(e) = self.expect_close(within) {
            panic!("{what}: expected the server to close the connection: {e}{}", self.ctx());
        }
    }
}

fn log_suffix(p: &Option<PathBuf>) -> String {
    match p {
        Some(p) => {
            let log = fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            format!("\n--- server log (tail) ---\n{}", tail(&log, 6000))
        }
        None => String::new(),
    }
}

pub(super) fn tail_bytes(b: &[u8], n: usize) -> &[u8] {
    &b[b.len().saturating_sub(n)..]
}

pub fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Writes `bytes` on a fresh connection and reads responses until the server closes the
/// connection (or a read times out). Returns the responses and whether it closed.
pub fn send_raw(addr: SocketAddr, bytes: &[u8]) -> (Vec<Response>, bool) {
    let mut c = Conn::open(addr);
    let _ = c.try_write(bytes);
    let mut out = Vec::new();
    loop {
        match c.try_read_response(false) {
            Ok(r) => out.push(r),
            Err(e) => {
                let closed =
                    c.eof || e.kind() == io::ErrorKind::ConnectionReset || e.kind() == io::ErrorKind::UnexpectedEof;
                return (out, closed);
            }
        }
    }
}

/// `GET path` on a fresh connection to `addr`.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    let mut c = Conn::open(addr);
    c.get(path)
}

// ---------------------------------------------------------------------------------------
// Background load
// ---------------------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct HammerReport {
    pub ok: usize,
    pub failures: Vec<String>,
    /// `(when, pid)` from `/_debug/pid` answers (when the path is `/_debug/pid`).
    pub pids: Vec<(Instant, i32)>,
}

/// Sends `GET path` on fresh connections in a loop (every ~20 ms) until stopped,
/// recording every failure (error or non-200).
pub struct Hammer {
    stop: Arc<AtomicBool>,
    done: Arc<std::sync::atomic::AtomicUsize>,
    handle: Option<JoinHandle<HammerReport>>,
}

impl Hammer {
    pub fn start(addr: SocketAddr, path: &str) -> Hammer {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let d2 = done.clone();
        let path = path.to_string();
        let handle = thread::spawn(move || {
            let mut rep = HammerReport::default();
            while !s2.load(Ordering::Relaxed) {
                let r = (|| -> io::Result<Response> {
                    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
                    let mut c = Conn::from_stream(s, None);
                    c.set_timeout(Duration::from_secs(8));
                    c.try_write(&request("GET", &path, &[], b""))?;
                    c.try_read_response(false)
                })();
                match r {
                    Ok(r) if r.status == 200 => {
                        rep.ok += 1;
                        if let Some(p) =
                            serde_json::from_slice::<serde_json::Value>(&r.body).ok().and_then(|v| v["pid"].as_i64())
                        {
                            rep.pids.push((Instant::now(), p as i32));
                        }
                    }
                    Ok(r) => rep.failures.push(format!("status {}: {:?}", r.status, r)),
                    Err(e) => rep.failures.push(format!("error: {e}")),
                }
                d2.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(20));
            }
            rep
        });
        Hammer { stop, done, handle: Some(handle) }
    }

    /// Requests completed so far (success or failure).
    pub fn count(&self) -> usize {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` more requests complete (bounded by `timeout`).
    pub fn wait_more(&self, n: usize, timeout: Duration) -> bool {
        let start = self.count();
        eventually(timeout, || self.count() >= start + n)
    }

    pub fn finish(mut self) -> HammerReport {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().expect("hammer thread")
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Self-tests of the harness (no server needed)
// ---------------------------------------------------------------------------------------

mod selftest {
    use super::*;

    /// A one-shot canned server: accepts one connection, reads until `\r\n\r\n`,
    /// writes `reply`, then closes (or not).
    fn canned(reply: &'static [u8], close: bool) -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            let mut tmp = [0u8; 1024];
            while find(&buf, b"\r\n\r\n").is_none() {
                let n = s.read(&mut tmp).unwrap();
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            s.write_all(reply).unwrap();
            if !close {
                thread::sleep(Duration::from_millis(300));
            }
        });
        (addr, h)
    }

    #[test]
    fn harness_reads_content_length_chunked_and_close_delimited() {
        let (addr, h) = canned(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: b\r\n\r\nabc\
              HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nfoo\r\n0\r\nT: 1\r\n\r\n\
              HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\n\r\n\
              HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nrest",
            true,
        );
        let (rs, closed) = send_raw(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        h.join().unwrap();
        assert!(closed);
        assert_eq!(rs.len(), 4, "{rs:?}");
        assert_eq!((rs[0].status, rs[0].body.as_slice(), rs[0].header("X-A")), (200, &b"abc"[..], Some("b")));
        assert_eq!((rs[1].status, rs[1].body.as_slice()), (201, &b"foo"[..]));
        assert_eq!((rs[2].status, rs[2].body.len(), rs[2].header("etag")), (304, 0, Some("\"e\"")));
        assert_eq!((rs[3].status, rs[3].body.as_slice(), rs[3].closes()), (200, &b"rest"[..], true));
    }

    #[test]
    fn harness_head_response_and_timeouts() {
        let (addr, h) = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n", false);
        let mut c = Conn::open(addr);
        c.send(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = c.read_head_response();
        assert_eq!((r.status, r.body.len()), (200, 0));
        assert!(c.expect_close(Duration::from_millis(100)).is_err(), "still open");
        assert!(c.expect_close(Duration::from_secs(2)).is_ok(), "closed after the canned server ends");
        h.join().unwrap();
    }
}
