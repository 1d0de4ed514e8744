//! The outbound HTTP/1.1 client's protocol half: where upstreams are, what a
//! request looks like on the wire, and an incremental response reader.
//!
//! It owns [`Endpoint`] (an upstream URL resolved to socket addresses once,
//! in the supervisor before fork, so the event loop never calls the
//! resolver; for `https://`, the TLS client configuration with the trusted
//! roots, also loaded once), [`write_request`] and [`ResponseReader`] (status line, headers,
//! `Content-Length` / chunked / read-until-close bodies, a size cap). It must
//! not touch a socket, a poll or a timer: the worker's `upstream` module moves
//! the bytes and keeps the connection pool; the app decides what a response
//! means. Like `http1::codec`, everything here is testable from byte slices.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use crate::config::Config;
use crate::http1::body::Chunked;

/// Longest response head accepted from an upstream.
pub const MAX_HEAD: usize = 16 * 1024;

/// One configured upstream: a URL resolved once.
#[derive(Debug)]
pub struct Endpoint {
    /// Index in the worker's per-endpoint connection pools.
    pub id: usize,
    /// The URL as configured (for logs).
    pub url: String,
    /// `Host` header value: the URL's authority.
    pub host: String,
    /// The URL's path and query (no trailing `/`; empty for the root).
    pub path: String,
    /// Where to connect, tried in order.
    pub addrs: Vec<SocketAddr>,
    /// `https://`: how to speak TLS to it.
    pub tls: Option<Tls>,
}

/// TLS towards one upstream: the shared client configuration and the name
/// the certificate must carry (also sent as SNI).
#[derive(Debug, Clone)]
pub struct Tls {
    /// Trusted roots, protocol versions, ALPN `http/1.1`.
    pub config: Arc<rustls::ClientConfig>,
    /// The URL's host.
    pub name: rustls::pki_types::ServerName<'static>,
}

/// The TLS client configuration: the system's trusted roots (or those of the
/// file named by `SSL_CERT_FILE`, the OpenSSL convention), TLS 1.2 and 1.3
/// with ring, ALPN `http/1.1`. Loaded once, in the supervisor.
pub fn tls_config() -> io::Result<Arc<rustls::ClientConfig>> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("https upstreams need trusted root certificates and none were found{why}"),
        ));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Why an upstream exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// No connection could be made (refused, unreachable).
    Connect(String),
    /// Nothing arrived within the deadline.
    Timeout,
    /// The upstream closed before the response was complete.
    Closed,
    /// The response broke HTTP/1.1 framing rules.
    Protocol(&'static str),
    /// The response body exceeded the cap.
    TooLarge,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Connect(e) => write!(f, "connect failed: {e}"),
            ClientError::Timeout => f.write_str("timed out"),
            ClientError::Closed => f.write_str("connection closed before the response was complete"),
            ClientError::Protocol(what) => write!(f, "malformed response: {what}"),
            ClientError::TooLarge => f.write_str("response body too large"),
        }
    }
}

impl Endpoint {
    /// Parse an `http(s)://host[:port][/path][?query]` URL and resolve its
    /// host (blocking: call before the event loop runs). A trailing `/` is
    /// dropped. `tls` is the configuration for `https://` URLs.
    pub fn resolve(id: usize, url: &str, tls: Option<&Arc<rustls::ClientConfig>>) -> io::Result<Endpoint> {
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {why}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| invalid("not a URL"))?;
        let https = scheme.eq_ignore_ascii_case("https");
        if !https && !scheme.eq_ignore_ascii_case("http") {
            return Err(invalid("only http:// and https:// upstreams are supported"));
        }
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let default_port = if https { 443 } else { 80 };
        let (host, port) = split_authority(authority, default_port).ok_or_else(|| invalid("bad host or port"))?;
        let tls = if https {
            let config = tls.ok_or_else(|| invalid("no TLS configuration"))?;
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|_| invalid("the host is not a valid TLS server name"))?;
            Some(Tls { config: Arc::clone(config), name })
        } else {
            None
        };
        let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
        if addrs.is_empty() {
            return Err(invalid("the host name resolved to no address"));
        }
        let path = path.trim_end_matches('/');
        let path = if path.starts_with('?') { format!("/{path}") } else { path.to_string() };
        Ok(Endpoint { id, url: url.to_string(), host: authority.to_string(), path, addrs, tls })
    }
}

/// `host[:port]` (IPv6 in brackets) → (host without brackets, port or `default_port`).
fn split_authority(a: &str, default_port: u16) -> Option<(&str, u16)> {
    if a.is_empty() || a.contains('@') {
        return None;
    }
    let (host, port) = match a.strip_prefix('[') {
        Some(rest) => {
            let (ip, after) = rest.split_once(']')?;
            (ip, after)
        }
        None => match a.rsplit_once(':') {
            Some((h, p)) => (h, a.get(h.len()..).unwrap_or(p)),
            None => (a, ""),
        },
    };
    let port = match port.strip_prefix(':') {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
        None if port.is_empty() => default_port,
        None => return None,
    };
    (!host.is_empty()).then_some((host, port))
}

/// Every upstream the configuration names, resolved once before fork.
#[derive(Debug, Default)]
pub struct Endpoints {
    /// `upstreams.users`.
    pub users: Option<Arc<Endpoint>>,
    /// `upstreams.orders`.
    pub orders: Option<Arc<Endpoint>>,
    /// `upstreams.recommendations`.
    pub recommendations: Option<Arc<Endpoint>>,
    /// `chat.upstream`.
    pub chat: Option<Arc<Endpoint>>,
}

/// How many endpoints [`Endpoints`] can hold (the worker's pool count).
pub const ENDPOINTS: usize = 4;

impl Endpoints {
    /// Resolve every configured upstream (blocking; the supervisor, before fork).
    pub fn resolve(config: &Config) -> io::Result<Endpoints> {
        let u = &config.upstreams;
        let urls = [&u.users, &u.orders, &u.recommendations, &config.chat.upstream];
        let https = urls
            .iter()
            .filter_map(|u| u.as_deref())
            .any(|u| u.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")));
        let tls = if https { Some(tls_config()?) } else { None };
        let one = |id: usize, url: &Option<String>| -> io::Result<Option<Arc<Endpoint>>> {
            url.as_deref().map(|u| Endpoint::resolve(id, u, tls.as_ref()).map(Arc::new)).transpose()
        };
        Ok(Endpoints {
            users: one(0, &u.users)?,
            orders: one(1, &u.orders)?,
            recommendations: one(2, &u.recommendations)?,
            chat: one(3, &config.chat.upstream)?,
        })
    }
}

/// A request to send upstream.
#[derive(Debug)]
pub struct Outbound {
    /// Where.
    pub endpoint: Arc<Endpoint>,
    /// `GET` or `POST`.
    pub method: &'static str,
    /// Path and query, appended to the endpoint's path.
    pub path: String,
    /// Extra headers (`Host`, `Content-Length` and `Connection` are written here).
    pub headers: Vec<(&'static str, String)>,
    /// Request body (empty for none).
    pub body: Vec<u8>,
    /// Largest response body accepted.
    pub max_body: u64,
    /// How long without progress before the exchange fails with [`ClientError::Timeout`].
    pub timeout: std::time::Duration,
    /// `true`: the timeout bounds the whole exchange; `false`: each silence
    /// between reads (a stream).
    pub total_deadline: bool,
    /// A `GET` whose answer does not depend on who asks: while one is in flight
    /// in this worker, the same request joins it instead of going out again
    /// (like nginx's `proxy_cache_lock`).
    pub coalesce: bool,
}

impl Outbound {
    /// Safe to send again on a fresh connection when a reused one turned out dead.
    pub fn idempotent(&self) -> bool {
        self.method == "GET"
    }
}

/// Serialize `req` for the wire into `out`.
pub fn write_request(req: &Outbound, out: &mut Vec<u8>) {
    let ep = &req.endpoint;
    out.extend_from_slice(req.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(ep.path.as_bytes());
    if ep.path.is_empty() && !req.path.starts_with('/') {
        out.push(b'/');
    }
    out.extend_from_slice(req.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(ep.host.as_bytes());
    out.extend_from_slice(b"\r\nConnection: keep-alive\r\n");
    for (k, v) in &req.headers {
        // Header values come from our own code, but never let one break the framing.
        if v.bytes().any(|b| b == b'\r' || b == b'\n') {
            continue;
        }
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !req.body.is_empty() || req.method == "POST" {
        out.extend_from_slice(format!("Content-Length: {}\r\n", req.body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&req.body);
}

/// The parts of a response head the client acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
}

#[derive(Debug)]
enum Body {
    /// Still reading the head.
    Head,
    /// `Content-Length`: bytes left.
    Length(u64),
    Chunked(Chunked),
    /// No framing: the body ends when the upstream closes.
    UntilClose,
    Done,
}

/// Incremental reader of one response.
#[derive(Debug)]
pub struct ResponseReader {
    head: Option<Head>,
    body: Body,
    max_body: u64,
    received: u64,
    head_request: bool,
}

impl ResponseReader {
    /// A reader for the response to a request (`head_request`: a `HEAD`,
    /// whose response has no body), accepting at most `max_body` body bytes.
    pub fn new(max_body: u64, head_request: bool) -> ResponseReader {
        ResponseReader { head: None, body: Body::Head, max_body, received: 0, head_request }
    }

    /// The head, once read.
    pub fn head(&self) -> Option<&Head> {
        self.head.as_ref()
    }

    /// The whole response has been read.
    pub fn is_done(&self) -> bool {
        matches!(self.body, Body::Done)
    }

    /// Consume from `input`, appending body bytes to `body`; returns how many
    /// input bytes were used. Call again with the rest after more arrives.
    pub fn feed(&mut self, input: &[u8], body: &mut Vec<u8>) -> Result<usize, ClientError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match &mut self.body {
                Body::Done => return Ok(used),
                Body::Head => match self.parse_head(rest)? {
                    Some(n) => used += n,
                    None => return Ok(used),
                },
                Body::Length(left) => {
                    let n = (*left).min(rest.len() as u64) as usize;
                    body.extend_from_slice(&rest[..n]);
                    *left -= n as u64;
                    used += n;
                    if *left == 0 {
                        self.body = Body::Done;
                    }
                    return Ok(used);
                }
                Body::Chunked(dec) => {
                    let before = body.len();
                    let (n, done) = dec.decode(rest, body, self.max_body).map_err(|e| match e {
                        crate::error::Error::PayloadTooLarge => ClientError::TooLarge,
                        _ => ClientError::Protocol("bad chunked framing"),
                    })?;
                    self.received += (body.len() - before) as u64;
                    used += n;
                    if done {
                        self.body = Body::Done;
                    }
                    return Ok(used);
                }
                Body::UntilClose => {
                    self.received += rest.len() as u64;
                    if self.received > self.max_body {
                        return Err(ClientError::TooLarge);
                    }
                    body.extend_from_slice(rest);
                    return Ok(input.len());
                }
            }
        }
    }

    /// The upstream closed its side. Completes a read-until-close body;
    /// anything else unfinished is [`ClientError::Closed`].
    pub fn eof(&mut self) -> Result<(), ClientError> {
        match self.body {
            Body::Done => Ok(()),
            Body::UntilClose => {
                self.body = Body::Done;
                Ok(())
            }
            _ => Err(ClientError::Closed),
        }
    }

    /// Parse a head from `input`: `Some(bytes used)` once complete.
    fn parse_head(&mut self, input: &[u8]) -> Result<Option<usize>, ClientError> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(input) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if input.len() > MAX_HEAD => {
                return Err(ClientError::Protocol("head too large"))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(ClientError::Protocol("too many headers")),
            Err(_) => return Err(ClientError::Protocol("bad status line or header")),
        };
        if n > MAX_HEAD {
            return Err(ClientError::Protocol("head too large"));
        }
        let status = resp.code.unwrap_or(0);
        let http11 = resp.version == Some(1);
        // Interim responses (100 Continue, 103 Early Hints) precede the real one.
        if (100..200).contains(&status) && status != 101 {
            return Ok(Some(n));
        }
        let mut length: Option<u64> = None;
        let mut chunked = false;
        let mut close = !http11;
        let mut content_type = None;
        for h in resp.headers.iter() {
            let v = std::str::from_utf8(h.value).map_err(|_| ClientError::Protocol("non-ASCII header"))?.trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                let len = v.parse::<u64>().map_err(|_| ClientError::Protocol("bad Content-Length"))?;
                if length.is_some_and(|l| l != len) {
                    return Err(ClientError::Protocol("conflicting Content-Length"));
                }
                length = Some(len);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let last = v.rsplit(',').next().unwrap_or("").trim();
                if !last.eq_ignore_ascii_case("chunked") {
                    return Err(ClientError::Protocol("unsupported Transfer-Encoding"));
                }
                chunked = true;
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in v.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") && !http11 {
                        close = false;
                    }
                }
            } else if h.name.eq_ignore_ascii_case("content-type") {
                content_type = Some(v.to_string());
            }
        }
        let no_body = self.head_request || status == 204 || status == 304 || status == 101;
        self.body = if no_body {
            Body::Done
        } else if chunked {
            // Both framings: chunked wins, and the connection cannot be trusted after it.
            if length.is_some() {
                close = true;
            }
            Body::Chunked(Chunked::default())
        } else if let Some(len) = length {
            if len > self.max_body {
                return Err(ClientError::TooLarge);
            }
            if len == 0 {
                Body::Done
            } else {
                Body::Length(len)
            }
        } else {
            close = true;
            Body::UntilClose
        };
        self.head = Some(Head { status, keep_alive: !close, content_type });
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(r: &mut ResponseReader, parts: &[&[u8]]) -> Result<Vec<u8>, ClientError> {
        let mut buf = Vec::new();
        let mut body = Vec::new();
        for p in parts {
            buf.extend_from_slice(p);
            let n = r.feed(&buf, &mut body)?;
            buf.drain(..n);
        }
        Ok(body)
    }

    #[test]
    fn content_length_body_in_pieces() {
        let mut r = ResponseReader::new(1024, false);
        let body = read_all(&mut r, &[b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 5\r\n\r\nhe", b"llo"]).unwrap();
        assert_eq!(body, b"hello");
        assert!(r.is_done());
        assert_eq!(r.head().map(|h| (h.status, h.keep_alive)), Some((200, true)));
    }

    #[test]
    fn chunked_body_and_bytes_after_it_stay_unread() {
        let mut r = ResponseReader::new(1024, false);
        let mut body = Vec::new();
        let input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nHTTP/1.1";
        let n = r.feed(input, &mut body).unwrap();
        assert_eq!(body, b"abcde");
        assert!(r.is_done());
        assert_eq!(&input[n..], b"HTTP/1.1");
    }

    #[test]
    fn read_until_close_completes_on_eof_and_never_keeps_alive() {
        let mut r = ResponseReader::new(1024, false);
        let body = read_all(&mut r, &[b"HTTP/1.1 200 OK\r\n\r\nabc"]).unwrap();
        assert_eq!(body, b"abc");
        assert!(!r.is_done());
        assert_eq!(r.eof(), Ok(()));
        assert!(r.is_done());
        assert!(!r.head().unwrap().keep_alive);
    }

    #[test]
    fn eof_inside_a_framed_body_is_an_error() {
        let mut r = ResponseReader::new(1024, false);
        read_all(&mut r, &[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"]).unwrap();
        assert_eq!(r.eof(), Err(ClientError::Closed));
        let mut r = ResponseReader::new(1024, false);
        assert_eq!(r.eof(), Err(ClientError::Closed));
    }

    #[test]
    fn bodies_over_the_cap_fail_early() {
        let mut r = ResponseReader::new(4, false);
        assert_eq!(read_all(&mut r, &[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"]), Err(ClientError::TooLarge));
        let mut r = ResponseReader::new(4, false);
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n";
        assert_eq!(read_all(&mut r, &[chunked]), Err(ClientError::TooLarge));
        let mut r = ResponseReader::new(4, false);
        assert_eq!(read_all(&mut r, &[b"HTTP/1.1 200 OK\r\n\r\nabcde"]), Err(ClientError::TooLarge));
    }

    #[test]
    fn malformed_heads_are_protocol_errors() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"garbage\r\n\r\n",
        ] {
            let mut r = ResponseReader::new(1024, false);
            assert!(matches!(read_all(&mut r, &[bad]), Err(ClientError::Protocol(_))), "{bad:?}");
        }
        let mut r = ResponseReader::new(1024, false);
        let huge = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &[b'a'; MAX_HEAD + 10]].concat();
        assert!(matches!(read_all(&mut r, &[&huge]), Err(ClientError::Protocol(_))));
    }

    #[test]
    fn interim_responses_are_skipped_and_close_is_honoured() {
        let mut r = ResponseReader::new(1024, false);
        let body = read_all(
            &mut r,
            &[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 No\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno"],
        )
        .unwrap();
        assert_eq!(body, b"no");
        assert_eq!(r.head().map(|h| (h.status, h.keep_alive)), Some((503, false)));
        let mut r = ResponseReader::new(1024, false);
        read_all(&mut r, &[b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"]).unwrap();
        assert!(!r.head().unwrap().keep_alive && r.is_done());
    }

    #[test]
    fn head_requests_and_204_have_no_body() {
        let mut r = ResponseReader::new(1024, true);
        read_all(&mut r, &[b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n"]).unwrap();
        assert!(r.is_done());
        let mut r = ResponseReader::new(1024, false);
        read_all(&mut r, &[b"HTTP/1.1 204 No Content\r\n\r\n"]).unwrap();
        assert!(r.is_done());
    }

    fn empty_tls() -> Arc<rustls::ClientConfig> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Arc::new(config)
    }

    #[test]
    fn urls_resolve_and_keep_their_path() {
        let e = Endpoint::resolve(0, "http://127.0.0.1:8080/v1/", None).unwrap();
        assert_eq!((e.host.as_str(), e.path.as_str()), ("127.0.0.1:8080", "/v1"));
        assert_eq!(e.addrs, vec!["127.0.0.1:8080".parse::<SocketAddr>().unwrap()]);
        assert!(e.tls.is_none());
        let e = Endpoint::resolve(0, "http://[::1]", None).unwrap();
        assert_eq!((e.host.as_str(), e.path.as_str(), e.addrs[0].port()), ("[::1]", "", 80));
        for bad in ["https://127.0.0.1", "ftp://x", "http://", "http://a:0", "http://u@127.0.0.1", "http://a:99999"] {
            assert!(Endpoint::resolve(0, bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn https_urls_default_to_443_and_carry_their_server_name() {
        let tls = empty_tls();
        let e = Endpoint::resolve(0, "https://127.0.0.1/v1/chat", Some(&tls)).unwrap();
        assert_eq!((e.addrs[0].port(), e.path.as_str()), (443, "/v1/chat"));
        let name = e.tls.map(|t| t.name.to_str().into_owned());
        assert_eq!(name.as_deref(), Some("127.0.0.1"));
        let e = Endpoint::resolve(0, "HTTPS://localhost:8443", Some(&tls)).unwrap();
        assert_eq!(e.tls.map(|t| t.name.to_str().into_owned()).as_deref(), Some("localhost"));
    }

    #[test]
    fn requests_are_written_with_host_and_length() {
        let endpoint = Arc::new(Endpoint::resolve(0, "http://127.0.0.1:9/base", None).unwrap());
        let req = Outbound {
            endpoint,
            method: "POST",
            path: "/x?y=1".into(),
            headers: vec![("Accept", "application/json".into()), ("X-Bad", "a\r\nInjected: 1".into())],
            body: b"{}".to_vec(),
            max_body: 10,
            timeout: std::time::Duration::from_secs(1),
            total_deadline: true,
            coalesce: false,
        };
        let mut out = Vec::new();
        write_request(&req, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /base/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: keep-alive\r\n\
             Accept: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
    }
}
