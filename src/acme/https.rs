//! The blocking HTTPS client the ACME exchange runs on: one request per connection
//! (`Connection: close`) over a std `TcpStream` and rustls, with a connect deadline, a
//! deadline for the whole exchange and a bound on the answer's size. Only `https://` URLs.
//!
//! Runs on the supervisor's ACME thread only, never on a worker's loop. The answer is parsed
//! by [`parse_response`], which touches no socket.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::msg::AcmeError;

/// Longest wait for a TCP connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one request and its whole answer may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read (a certificate chain is a few KiB).
const MAX_RESPONSE: usize = 256 * 1024;

/// An answer: status, fields (names in lower case) and body.
#[derive(Debug, PartialEq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of field `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `https://host[:port]/path` split into host, port and path (with query); `None` for
/// anything else.
pub fn split(url: &str) -> Option<(&str, u16, &str)> {
    let rest = url.strip_prefix("https://")?;
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    // `[v6]` or `[v6]:port`; else `host` or `host:port`.
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']')?;
            match after {
                "" => (host, 443),
                p => (host, p.strip_prefix(':')?.parse().ok()?),
            }
        }
        None => match authority.split_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (authority, 443),
        },
    };
    (!host.is_empty() && !authority.contains('@')).then_some((host, port, path))
}

/// One request: `method` on `url`, with a JOSE body when `body` is given.
pub fn request(
    tls: &Arc<rustls::ClientConfig>,
    method: &str,
    url: &str,
    body: Option<&[u8]>,
) -> Result<Response, AcmeError> {
    let fail = |why: String| AcmeError::Transport { url: url.to_string(), why };
    let head_only = method == "HEAD";
    let (host, port, path) = split(url).ok_or_else(|| fail("not an https:// URL".into()))?;
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    let addrs: Vec<_> =
        (host, port).to_socket_addrs().map_err(|e| fail(format!("cannot resolve {host}: {e}")))?.collect();
    let mut last = format!("no address for {host}");
    let mut tcp = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    let mut tcp = tcp.ok_or_else(|| fail(last))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| fail(format!("{host} is not a valid server name")))?;
    let mut conn = rustls::ClientConnection::new(Arc::clone(tls), name).map_err(|e| fail(format!("TLS: {e}")))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: forkd/{} (ACME)\r\nAccept: application/json, */*\r\nConnection: close\r\n",
        if port == 443 { host.to_string() } else { format!("{host}:{port}") },
        env!("CARGO_PKG_VERSION"),
    );
    if let Some(body) = body {
        head.push_str(&format!("Content-Type: application/jose+json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.unwrap_or_default());
    let mut raw = Vec::new();
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    let step = |s: &rustls::Stream<'_, rustls::ClientConnection, TcpStream>| {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(fail("no complete answer within 30 s".into()));
        }
        s.sock
            .set_read_timeout(Some(left))
            .and_then(|()| s.sock.set_write_timeout(Some(left)))
            .map_err(|e| fail(e.to_string()))
    };
    step(&stream)?;
    stream.write_all(&out).map_err(|e| fail(format!("sending: {e}")))?;
    let mut buf = [0u8; 8192];
    loop {
        step(&stream)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if raw.len() > MAX_RESPONSE {
                    return Err(fail(format!("answer larger than {MAX_RESPONSE} bytes")));
                }
                // Stop at a complete answer: a CA may keep the connection open despite `close`.
                if let Ok(Some(_)) = parse_response(&raw, head_only) {
                    break;
                }
            }
            // Servers often close without close_notify; what arrived is judged below.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(fail(format!("reading: {e}"))),
        }
    }
    match parse_response(&raw, head_only) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => match parse_until_eof(&raw) {
            Some(r) => Ok(r),
            None => Err(fail("the connection closed before a complete answer".into())),
        },
        Err(why) => Err(fail(why)),
    }
}

/// The answer in `raw` once it is complete (`Ok(None)`: more bytes needed); `head_only`: the
/// answer to a HEAD, which has no body whatever its fields say. A body with neither
/// `Content-Length` nor chunked coding is only complete at the end of the stream
/// ([`parse_until_eof`]).
pub fn parse_response(raw: &[u8], head_only: bool) -> Result<Option<Response>, String> {
    let Some((status, headers, start)) = head(raw)? else { return Ok(None) };
    let rest = &raw[start..];
    let field = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let body = if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
        Some(Vec::new())
    } else if field("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = field("content-length") {
        let len: usize = len.trim().parse().map_err(|_| format!("bad Content-Length {len:?}"))?;
        (rest.len() >= len).then(|| rest[..len].to_vec())
    } else {
        None
    };
    Ok(body.map(|body| Response { status, headers, body }))
}

/// The answer in `raw`, its body being everything after the head (a body delimited by the
/// end of the stream); `None` without a complete head.
pub fn parse_until_eof(raw: &[u8]) -> Option<Response> {
    let (status, headers, start) = head(raw).ok()??;
    if headers.iter().any(|(k, _)| k == "content-length" || k == "transfer-encoding") {
        return None;
    }
    Some(Response { status, headers, body: raw[start..].to_vec() })
}

/// The status, fields and the offset of the body, once the head is complete.
type Head = (u16, Vec<(String, String)>, usize);

fn head(raw: &[u8]) -> Result<Option<Head>, String> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut fields);
    match parsed.parse(raw) {
        Ok(httparse::Status::Complete(start)) => {
            let status = parsed.code.unwrap_or(0);
            let headers = parsed
                .headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
                .collect();
            Ok(Some((status, headers, start)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(format!("malformed answer: {e}")),
    }
}

/// A chunked body, once its last chunk has arrived (trailers ignored).
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let line = std::str::from_utf8(&rest[..eol]).map_err(|_| "bad chunk size".to_string())?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| format!("bad chunk size {size:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(split("https://ca.example/dir"), Some(("ca.example", 443, "/dir")));
        assert_eq!(split("https://127.0.0.1:14000/dir?x=1"), Some(("127.0.0.1", 14000, "/dir?x=1")));
        assert_eq!(split("https://[::1]:14000/d"), Some(("::1", 14000, "/d")));
        assert_eq!(split("https://[::1]/d"), Some(("::1", 443, "/d")));
        assert_eq!(split("https://ca.example"), Some(("ca.example", 443, "/")));
        assert_eq!(split("http://ca.example/dir"), None);
        assert_eq!(split("https://u@ca.example/dir"), None);
        assert_eq!(split("https://ca.example:x/dir"), None);
    }

    #[test]
    fn an_answer_is_complete_by_its_length_or_its_last_chunk() {
        let raw = b"HTTP/1.1 201 Created\r\nReplay-Nonce: abc\r\nContent-Length: 2\r\n\r\n{}";
        let r = parse_response(raw, false).expect("parses").expect("complete");
        assert_eq!((r.status, r.header("replay-nonce"), r.body.as_slice()), (201, Some("abc"), &b"{}"[..]));
        assert_eq!(parse_response(&raw[..raw.len() - 1], false), Ok(None));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let r = parse_response(chunked, false).expect("parses").expect("complete");
        assert_eq!(r.body, b"abcde");
        assert_eq!(parse_response(&chunked[..chunked.len() - 5], false), Ok(None));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false).is_err());
        let to_eof = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        assert_eq!(parse_response(to_eof, false), Ok(None));
        assert_eq!(parse_until_eof(to_eof).map(|r| r.body), Some(b"all of it".to_vec()));
        assert_eq!(
            parse_response(b"HTTP/1.1 204 No Content\r\n\r\n", false).map(|r| r.map(|r| r.status)),
            Ok(Some(204))
        );
        assert!(parse_response(b"garbage\r\n\r\n", false).is_err());
        // A HEAD's answer ends with its head, whatever Content-Length says.
        let head = b"HTTP/1.1 200 OK\r\nReplay-Nonce: n\r\nContent-Length: 12\r\n\r\n";
        assert_eq!(parse_response(head, false), Ok(None));
        assert_eq!(parse_response(head, true).map(|r| r.map(|r| r.body.len())), Ok(Some(0)));
    }
}
