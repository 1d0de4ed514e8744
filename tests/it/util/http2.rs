//! A small blocking HTTP/2 test client: the `h2` crate's client polled by hand
//! (no-op waker, no runtime) over `forkd::http2::Io` (an in-memory duplex),
//! whose bytes this module moves to and from a std `TcpStream` (or a rustls
//! client stream) with short read timeouts. Every wait is bounded. `h2_exchange` gives an
//! answer in the shape of an HTTP/1.1 [`Response`], for the parity tests; `wire` writes
//! frames by hand for tests of malformed input. It asserts nothing about the server.

#![allow(dead_code)]

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use forkd::http2::Io;
use h2::client::{self, ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};

use super::{Response, IO_TIMEOUT};

/// One read's wait while pumping.
const TICK: Duration = Duration::from_millis(5);

fn cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

enum Wire {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.read(buf),
            Wire::Tls(s) => s.read(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Wire::Plain(s) => s.write_all(buf),
            Wire::Tls(s) => {
                s.write_all(buf)?;
                s.flush()
            }
        }
    }
}

/// A whole response.
#[derive(Debug)]
pub struct H2Response {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl H2Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body_str()))
    }
}

/// One HTTP/2 client connection.
pub struct H2Client {
    wire: Wire,
    io: Io,
    conn: Pin<Box<client::Connection<Io, Bytes>>>,
    pub send: SendRequest<Bytes>,
    /// How the connection ended, once it did.
    pub ended: Option<Result<(), h2::Error>>,
    /// The server closed the socket.
    pub eof: bool,
    /// Every byte the server sent.
    pub received: usize,
    pub addr: SocketAddr,
}

impl H2Client {
    /// Prior knowledge over plain TCP (h2c).
    pub fn h2c(addr: SocketAddr) -> H2Client {
        Self::h2c_with(addr, client::Builder::new())
    }

    /// h2c with client settings (e.g. a tiny initial window).
    pub fn h2c_with(addr: SocketAddr, builder: client::Builder) -> H2Client {
        let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        Self::h2c_on(sock, builder)
    }

    /// h2c on a connected socket (which may have carried bytes before the preface, e.g. a
    /// PROXY protocol header).
    pub fn h2c_on(sock: TcpStream, builder: client::Builder) -> H2Client {
        let addr = sock.peer_addr().expect("peer address");
        sock.set_read_timeout(Some(TICK)).expect("timeout");
        sock.set_nodelay(true).expect("nodelay");
        Self::handshake(Wire::Plain(sock), addr, builder)
    }

    /// HTTP/2 over TLS: `config` must offer ALPN `h2`; panics unless the server chose it.
    pub fn tls(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> H2Client {
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let session = rustls::ClientConnection::new(config, name).expect("client session");
        let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        let mut tls = rustls::StreamOwned::new(session, sock);
        let deadline = Instant::now() + IO_TIMEOUT;
        while tls.conn.is_handshaking() {
            assert!(Instant::now() < deadline, "TLS handshake timed out");
            tls.conn.complete_io(&mut tls.sock).expect("TLS handshake");
        }
        assert_eq!(tls.conn.alpn_protocol(), Some(&b"h2"[..]), "ALPN h2");
        tls.sock.set_read_timeout(Some(TICK)).expect("timeout");
        Self::handshake(Wire::Tls(Box::new(tls)), addr, client::Builder::new())
    }

    fn handshake(wire: Wire, addr: SocketAddr, builder: client::Builder) -> H2Client {
        let io = Io::new(1 << 22);
        let mut hs = Box::pin(builder.handshake::<Io, Bytes>(io.clone()));
        let mut c = None;
        // The client handshake completes without the server's answer (it only queues the preface).
        for _ in 0..10 {
            if let Poll::Ready(r) = hs.as_mut().poll(&mut cx()) {
                c = Some(r.expect("client handshake"));
                break;
            }
        }
        let (send, conn) = c.expect("handshake pending");
        let mut client = H2Client { wire, io, conn: Box::pin(conn), send, ended: None, eof: false, received: 0, addr };
        client.pump();
        client
    }

    /// Poll the connection, write what it queued, read what arrived (one short wait).
    /// Returns whether bytes arrived.
    pub fn pump(&mut self) -> bool {
        if self.ended.is_none() {
            if let Poll::Ready(r) = self.conn.as_mut().poll(&mut cx()) {
                self.ended = Some(r);
            }
        }
        let mut out = Vec::new();
        self.io.drain_output(&mut out);
        if !out.is_empty() && !self.eof && self.wire.write_all(&out).is_err() {
            self.eof = true;
        }
        let mut got = false;
        if !self.eof {
            let mut buf = vec![0u8; 64 * 1024];
            match self.wire.read(&mut buf) {
                Ok(0) => {
                    self.eof = true;
                    self.io.feed_eof();
                }
                Ok(n) => {
                    self.received += n;
                    self.io.feed(&buf[..n]);
                    got = true;
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.eof = true;
                    self.io.feed_eof();
                }
            }
        }
        if self.ended.is_none() {
            if let Poll::Ready(r) = self.conn.as_mut().poll(&mut cx()) {
                self.ended = Some(r);
            }
        }
        got
    }

    /// Pump until `f` gives something, or panic after `timeout`.
    pub fn until<T>(&mut self, timeout: Duration, what: &str, mut f: impl FnMut(&mut Self) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = f(self) {
                return t;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            self.pump();
        }
    }

    /// Start a request (`end`: no body follows).
    pub fn start(&mut self, req: http::Request<()>, end: bool) -> (ResponseFuture, SendStream<Bytes>) {
        let ready = self.until(IO_TIMEOUT, "a stream slot", |c| match c.send.poll_ready(&mut cx()) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        });
        ready.expect("connection ready");
        self.send.send_request(req, end).expect("send_request")
    }

    /// Wait for the response head (or the stream's error).
    pub fn head(&mut self, rf: &mut ResponseFuture) -> Result<http::Response<RecvStream>, h2::Error> {
        self.until(IO_TIMEOUT, "a response head", |_| match Pin::new(&mut *rf).poll(&mut cx()) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        })
    }

    /// Whatever body bytes are there now (released); `true` once the body ended.
    pub fn body_now(&mut self, body: &mut RecvStream, into: &mut Vec<u8>) -> Result<bool, h2::Error> {
        loop {
            match body.poll_data(&mut cx()) {
                Poll::Ready(Some(Ok(chunk))) => {
                    into.extend_from_slice(&chunk);
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                Poll::Ready(Some(Err(e))) => return Err(e),
                Poll::Ready(None) => return Ok(true),
                Poll::Pending => return Ok(body.is_end_stream()),
            }
        }
    }

    /// Read the body to its end.
    pub fn body(&mut self, body: &mut RecvStream) -> Vec<u8> {
        let mut into = Vec::new();
        self.until(IO_TIMEOUT, "the end of a body", |c| match c.body_now(body, &mut into) {
            Ok(true) => Some(()),
            Ok(false) => None,
            Err(e) => panic!("body error: {e}"),
        });
        into
    }

    /// Send `data` as the request body (as flow control allows), ending the stream.
    pub fn send_body(&mut self, send: &mut SendStream<Bytes>, data: &[u8]) {
        let mut at = 0;
        while at < data.len() {
            send.reserve_capacity(data.len() - at);
            let n = self.until(IO_TIMEOUT, "send capacity", |_| match send.poll_capacity(&mut cx()) {
                Poll::Ready(Some(Ok(n))) if n > 0 => Some(n),
                Poll::Ready(Some(Ok(_))) | Poll::Pending => None,
                Poll::Ready(Some(Err(e))) => panic!("capacity: {e}"),
                Poll::Ready(None) => panic!("stream closed"),
            });
            let n = n.min(data.len() - at);
            send.send_data(Bytes::copy_from_slice(&data[at..at + n]), at + n == data.len()).expect("send_data");
            at += n;
        }
        if data.is_empty() {
            send.send_data(Bytes::new(), true).expect("end");
        }
        self.pump();
    }

    /// One whole exchange.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> H2Response {
        let req = self.build(method, path, headers);
        let (mut rf, mut send) = self.start(req, body.is_none());
        if let Some(b) = body {
            self.send_body(&mut send, b);
        }
        let resp = self.head(&mut rf).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let (parts, mut recv) = resp.into_parts();
        let body = if method == "HEAD" { Vec::new() } else { self.body(&mut recv) };
        H2Response { status: parts.status.as_u16(), headers: parts.headers, body }
    }

    /// Sends `data` as the request body, ending the stream, until the stream is closed or
    /// `deadline`; `Err` says why it stopped short.
    pub fn try_send_body(
        &mut self,
        send: &mut SendStream<Bytes>,
        data: &[u8],
        deadline: Instant,
    ) -> Result<(), String> {
        let mut at = 0;
        while at < data.len() {
            send.reserve_capacity(data.len() - at);
            let n = loop {
                match send.poll_capacity(&mut cx()) {
                    Poll::Ready(Some(Ok(n))) if n > 0 => break n,
                    Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
                    Poll::Ready(Some(Err(e))) => return Err(format!("after {at} bytes: {e}")),
                    Poll::Ready(None) => return Err(format!("stream closed after {at} bytes")),
                }
                if Instant::now() >= deadline || self.eof {
                    return Err(format!("no send capacity after {at} bytes"));
                }
                self.pump();
            };
            let n = n.min(data.len() - at);
            send.send_data(Bytes::copy_from_slice(&data[at..at + n]), at + n == data.len())
                .map_err(|e| format!("after {at} bytes: {e}"))?;
            at += n;
        }
        self.pump();
        Ok(())
    }

    /// One whole exchange, every wait bounded by `timeout`; the body is read to its end
    /// for every method (a HEAD response must end without DATA). `Err` when the stream or
    /// the connection fails, or the time runs out.
    pub fn exchange(&mut self, req: http::Request<()>, body: &[u8], timeout: Duration) -> Result<H2Response, String> {
        let deadline = Instant::now() + timeout;
        let what = format!("{} {}", req.method(), req.uri());
        let (mut rf, mut send) = self.start(req, body.is_empty());
        if !body.is_empty() {
            // The server may answer before the body is all sent (413 from Content-Length) and
            // end the stream (RST_STREAM NO_ERROR): then the answer is what counts.
            let _ = self.try_send_body(&mut send, body, deadline);
        }
        let resp = loop {
            match Pin::new(&mut rf).poll(&mut cx()) {
                Poll::Ready(r) => break r.map_err(|e| format!("{what}: {e}"))?,
                Poll::Pending if self.ended.is_some() || self.eof => {
                    return Err(format!("{what}: the connection ended before the response ({:?})", self.ended))
                }
                Poll::Pending if Instant::now() >= deadline => {
                    return Err(format!("{what}: no response head within {timeout:?}"))
                }
                Poll::Pending => {
                    self.pump();
                }
            }
        };
        let (parts, mut recv) = resp.into_parts();
        let mut into = Vec::new();
        loop {
            match self.body_now(&mut recv, &mut into) {
                Ok(true) => break,
                Ok(false) if Instant::now() >= deadline => {
                    return Err(format!("{what}: the body did not end within {timeout:?} ({} bytes)", into.len()))
                }
                Ok(false) if self.eof => return Err(format!("{what}: EOF inside the body ({} bytes)", into.len())),
                Ok(false) => {
                    self.pump();
                }
                Err(e) => return Err(format!("{what}: body error after {} bytes: {e}", into.len())),
            }
        }
        Ok(H2Response { status: parts.status.as_u16(), headers: parts.headers, body: into })
    }

    /// The TCP socket under the connection (h2c only).
    pub fn tcp(&self) -> &TcpStream {
        match &self.wire {
            Wire::Plain(s) => s,
            Wire::Tls(s) => &s.sock,
        }
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> H2Response {
        self.request("GET", path, &[], None)
    }

    /// A request for `path` on this server (`:authority` = its address).
    pub fn build(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> http::Request<()> {
        let mut b = http::Request::builder().method(method).uri(format!("http://{}{path}", self.addr));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request")
    }

    /// Pump until the connection ended (GOAWAY then close, or EOF); `true` if it did in time.
    pub fn wait_end(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.ended.is_some() || self.eof {
                return true;
            }
            self.pump();
        }
        false
    }
}

/// A rustls client config trusting `ca_pem` that offers ALPN `h2` (then http/1.1).
pub fn h2_tls_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("CA PEM")).expect("CA");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A WebSocket over HTTP/2 (RFC 8441): a fresh h2c connection to `addr`, the server's
/// SETTINGS_ENABLE_CONNECT_PROTOCOL awaited, then `CONNECT /ws?token=…` with
/// `:protocol = websocket`. Returns the client, the response head and the stream's sender.
pub fn ws_connect(
    addr: std::net::SocketAddr,
    token: &str,
) -> (H2Client, http::Response<h2::RecvStream>, SendStream<Bytes>) {
    let mut c = H2Client::h2c(addr);
    c.until(IO_TIMEOUT, "SETTINGS_ENABLE_CONNECT_PROTOCOL", |c| {
        c.send.is_extended_connect_protocol_enabled().then_some(())
    });
    let mut req = http::Request::builder()
        .method("CONNECT")
        .uri(format!("http://{addr}/ws?token={}", crate::util::urlencode(token)))
        .header("sec-websocket-version", "13")
        .body(())
        .expect("request");
    req.extensions_mut().insert(h2::ext::Protocol::from_static("websocket"));
    let (mut rf, send) = c.start(req, false);
    let resp = c.head(&mut rf).expect("head");
    (c, resp, send)
}

/// RFC 9113 wire constants for the tests that write frames by hand (floods, the drain load).
#[allow(dead_code)]
pub mod wire {
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    // Frame types.
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
    pub const PRIORITY_FRAME: u8 = 0x2;
    // Flags.
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
    // Error codes.
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
    pub const REFUSED_STREAM: u32 = 0x7;
}

/// Headers that HTTP/2 forbids (RFC 9113 §8.2.2) or expresses as pseudo-headers: not sent.
pub(super) const H2_DROPPED: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"];

/// One exchange on `c` as a [`Response`] (`version` "HTTP/2", no reason phrase, header
/// names lower-case as HTTP/2 has them): `headers` as given but for the connection-specific
/// ones (a `Host` becomes `:authority`), `Content-Length` added for a body as the HTTP/1.1
/// [`request`] does. `Err` when the stream or the connection fails or `timeout` runs out.
pub fn h2_exchange(
    c: &mut H2Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, String> {
    let authority = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map_or_else(|| c.addr.to_string(), |(_, v)| v.to_string());
    let mut b = http::Request::builder().method(method).uri(format!("http://{authority}{path}"));
    let mut has_length = false;
    for (k, v) in headers {
        if H2_DROPPED.iter().any(|d| k.eq_ignore_ascii_case(d)) {
            continue;
        }
        has_length |= k.eq_ignore_ascii_case("content-length");
        b = b.header(*k, *v);
    }
    if !body.is_empty() && !has_length {
        b = b.header("content-length", body.len());
    }
    let req = b.body(()).map_err(|e| format!("{method} {path}: not a valid HTTP/2 request: {e}"))?;
    let r = c.exchange(req, body, timeout)?;
    Ok(h2_response(r))
}

/// An HTTP/2 response in the shape of an HTTP/1.1 [`Response`].
pub fn h2_response(r: H2Response) -> Response {
    let headers = r
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    Response {
        version: "HTTP/2".into(),
        status: r.status,
        reason: String::new(),
        headers,
        body: r.body,
        interim: Box::new([]),
    }
}
