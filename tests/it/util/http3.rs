//! A small blocking HTTP/3 client for the integration tests: quinn-proto over a std
//! `UdpSocket`, frames and QPACK from `forkd::http3`. One connection; requests are streams;
//! every wait is bounded by a deadline (socket read timeouts, no sleeps). `h3_exchange`
//! gives an answer in the shape of an HTTP/1.1 [`Response`], for the parity tests. It
//! asserts nothing about the server beyond a completed handshake where one is required.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use forkd::http3::frame::{self, Frame, FrameReader};
use forkd::http3::qpack::{self, Encoder, Fields};
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    Event as QuicEvent, ReadError, StreamEvent, StreamId,
};

use super::http2::H2_DROPPED;
use super::tls::Pki;
use super::Response;

/// What the client has read of one stream.
#[derive(Debug, Default)]
pub struct Received {
    pub bytes: Vec<u8>,
    pub fin: bool,
    pub reset: Option<u64>,
}

/// A parsed response: every head (informational ones first), the body.
#[derive(Debug, Default)]
pub struct H3Response {
    pub heads: Vec<Vec<(String, String)>>,
    pub body: Vec<u8>,
}

impl H3Response {
    /// The final `:status`.
    pub fn status(&self) -> u16 {
        self.heads
            .last()
            .and_then(|h| h.iter().find(|(n, _)| n == ":status"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }

    /// A field of the final head.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.heads.last()?.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("JSON body: {e}: {}", self.body_str()))
    }
}

/// The client's TLS configuration: the test PKI's CA, TLS 1.3, ALPN `h3`, 0-RTT offered.
pub fn client_config(pki: &Pki) -> ClientConfig {
    client_config_with_tickets(pki).0
}

/// A session store (rustls' in-memory cache) that counts the TLS 1.3 tickets the client
/// was given: the server sends them once it has the client's Finished, which may be after
/// the answer to a request sent in 0-RTT, so a test that resumes again waits for them.
#[derive(Debug)]
pub struct TicketStore {
    inner: rustls::client::ClientSessionMemoryCache,
    received: std::sync::atomic::AtomicUsize,
}

impl TicketStore {
    /// Tickets received so far (over every connection of the configuration).
    pub fn received(&self) -> usize {
        self.received.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl rustls::client::ClientSessionStore for TicketStore {
    fn set_kx_hint(&self, name: rustls::pki_types::ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &rustls::pki_types::ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: rustls::pki_types::ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(name, value)
    }
    fn tls12_session(
        &self,
        name: &rustls::pki_types::ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &rustls::pki_types::ServerName<'static>) {
        self.inner.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: rustls::pki_types::ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.received.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(
        &self,
        name: &rustls::pki_types::ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(name)
    }
}

/// Like [`client_config`] without 0-RTT: every request goes after the handshake, as over
/// TCP (the parity tests' client).
pub fn client_config_1rtt(pki: &Pki) -> ClientConfig {
    client_config_with(pki, false).0
}

/// [`client_config`] and its session store, to wait for tickets.
pub fn client_config_with_tickets(pki: &Pki) -> (ClientConfig, Arc<TicketStore>) {
    client_config_with(pki, true)
}

fn client_config_with(pki: &Pki, early_data: bool) -> (ClientConfig, Arc<TicketStore>) {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).expect("CA PEM")).expect("CA");
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.enable_early_data = early_data;
    let store = Arc::new(TicketStore {
        inner: rustls::client::ClientSessionMemoryCache::new(32),
        received: std::sync::atomic::AtomicUsize::new(0),
    });
    tls.resumption = rustls::client::Resumption::store(store.clone());
    (ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).expect("QUIC client"))), store)
}

pub struct H3Client {
    sock: UdpSocket,
    ep: Endpoint,
    pub conn: Connection,
    ch: ConnectionHandle,
    pub streams: HashMap<StreamId, Received>,
    pub lost: Option<ConnectionError>,
    /// The server's GOAWAY arrived on its control stream.
    pub goaway: bool,
    /// The smallest stream ID of the server's GOAWAYs: requests on streams from it on were
    /// not processed (RFC 9114 §5.2).
    pub goaway_id: Option<u64>,
    /// Retry packets received (the server asked to validate the address first).
    pub retries: usize,
    /// The control stream is open.
    control: bool,
    /// Request bytes not yet taken by their stream (stream, bytes, written so far, FIN after).
    pending: Vec<(StreamId, Vec<u8>, usize, bool)>,
    buf: Vec<u8>,
}

pub const TIMEOUT: Duration = Duration::from_secs(20);

impl H3Client {
    /// Connects and completes the handshake (panics on failure).
    pub fn connect(server: SocketAddr, config: &ClientConfig) -> H3Client {
        H3Client::connect_named(server, config, "localhost")
    }

    /// [`H3Client::connect`] asking for the certificate of server name `name`.
    pub fn connect_named(server: SocketAddr, config: &ClientConfig, name: &str) -> H3Client {
        let mut c = H3Client::start_named(server, config, name);
        let deadline = Instant::now() + TIMEOUT;
        c.run_until(deadline, |c| !c.conn.is_handshaking() || c.lost.is_some());
        assert!(c.lost.is_none() && !c.conn.is_handshaking(), "HTTP/3 handshake with {server}: {:?}", c.lost);
        c
    }

    /// Connects within `timeout`: `Err` when the handshake does not complete (no server,
    /// or the connection was lost).
    pub fn try_connect(server: SocketAddr, config: &ClientConfig, timeout: Duration) -> Result<H3Client, String> {
        let mut c = H3Client::start(server, config);
        c.run_until(Instant::now() + timeout, |c| !c.conn.is_handshaking() || c.lost.is_some());
        match &c.lost {
            Some(e) => Err(format!("handshake with {server}: {e}")),
            None if c.conn.is_handshaking() => Err(format!("handshake with {server}: no answer within {timeout:?}")),
            None => Ok(c),
        }
    }

    /// Starts a connection (resuming a session `config` holds, with 0-RTT keys when it can)
    /// without waiting for the handshake; its control stream is opened.
    pub fn start(server: SocketAddr, config: &ClientConfig) -> H3Client {
        H3Client::start_named(server, config, "localhost")
    }

    fn start_named(server: SocketAddr, config: &ClientConfig, name: &str) -> H3Client {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind UDP");
        let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
        let (ch, conn) = ep.connect(Instant::now(), config.clone(), server, name).expect("connect");
        let mut c = H3Client {
            sock,
            ep,
            conn,
            ch,
            streams: HashMap::new(),
            lost: None,
            goaway: false,
            goaway_id: None,
            retries: 0,
            control: false,
            pending: Vec::new(),
            buf: vec![0; 65_536],
        };
        c.open_control();
        c.flush();
        c
    }

    /// Opens the control stream with SETTINGS once quinn lets it (with 0-RTT keys, or after
    /// the handshake).
    fn open_control(&mut self) {
        if self.control {
            return;
        }
        let Some(id) = self.conn.streams().open(Dir::Uni) else { return };
        self.control = true;
        let mut out = vec![0x00];
        frame::write_settings(&[(frame::setting::MAX_FIELD_SECTION_SIZE, 65_536)], &mut out);
        self.conn.send_stream(id).write(&out).expect("control stream");
    }

    /// Opens a request stream: the head (pseudo-headers first), `body` as one DATA frame,
    /// then FIN.
    pub fn request(&mut self, head: &[(&str, &str)], body: &[u8]) -> StreamId {
        let mut out = headers_frame(head);
        if !body.is_empty() {
            frame::write_header(frame::ty::DATA, body.len() as u64, &mut out);
            out.extend_from_slice(body);
        }
        self.send_raw(out, true)
    }

    /// Opens a request stream and writes `bytes` as they are (any frames, or part of one);
    /// FIN after them when `fin`.
    pub fn send_raw(&mut self, bytes: Vec<u8>, fin: bool) -> StreamId {
        let id = self.conn.streams().open(Dir::Bi).expect("a request stream");
        self.pending.push((id, bytes, 0, fin));
        self.write_pending();
        self.streams.entry(id).or_default();
        self.flush();
        id
    }

    /// Writes what request streams still have to send as their windows allow; FIN after it.
    fn write_pending(&mut self) {
        let conn = &mut self.conn;
        self.pending.retain_mut(|(id, out, at, fin)| {
            if *at < out.len() {
                match conn.send_stream(*id).write(&out[*at..]) {
                    Ok(n) => *at += n,
                    Err(quinn_proto::WriteError::Blocked) => {}
                    // Stopped or reset by the server (an early answer): the rest is dropped.
                    Err(_) => return false,
                }
            }
            if *at < out.len() {
                return true;
            }
            if *fin {
                let _ = conn.send_stream(*id).finish();
            }
            false
        });
    }

    /// `GET path` on a new request stream, or `None` while the server's stream limit allows
    /// no new one (a load waits for answers instead of panicking).
    pub fn try_get(&mut self, path: &str) -> Option<StreamId> {
        let id = self.conn.streams().open(Dir::Bi)?;
        let out =
            headers_frame(&[(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)]);
        self.pending.push((id, out, 0, true));
        self.write_pending();
        self.streams.entry(id).or_default();
        Some(id)
    }

    /// Closes the connection with application error `code` (`H3_NO_ERROR` is 0x100) and
    /// sends the close.
    pub fn close(&mut self, code: u64) {
        let code = quinn_proto::VarInt::from_u64(code).unwrap_or(quinn_proto::VarInt::MAX);
        self.conn.close(Instant::now(), code, bytes::Bytes::new());
        self.flush();
    }

    /// A request with `method` on `path` and extra fields.
    pub fn send(&mut self, method: &str, path: &str, fields: &[(&str, &str)], body: &[u8]) -> StreamId {
        let mut head = vec![(":method", method), (":scheme", "https"), (":authority", "localhost"), (":path", path)];
        head.extend_from_slice(fields);
        self.request(&head, body)
    }

    /// `GET path`, the whole response.
    pub fn get(&mut self, path: &str) -> H3Response {
        let id = self.send("GET", path, &[], b"");
        self.response(id)
    }

    /// Waits for stream `id` to end and parses its response (panics on a reset or timeout).
    pub fn response(&mut self, id: StreamId) -> H3Response {
        let deadline = Instant::now() + TIMEOUT;
        self.run_until(deadline, |c| {
            c.lost.is_some() || c.streams.get(&id).is_some_and(|s| s.fin || s.reset.is_some())
        });
        let s = &self.streams[&id];
        assert!(s.fin, "stream {id} ended: fin {}, reset {:?}, lost {:?}", s.fin, s.reset, self.lost);
        parse(&s.bytes)
    }

    /// Waits (until `deadline`) for stream `id` to end and parses its response: `Err` when
    /// it was reset, the connection was lost, or the time ran out.
    pub fn try_response(&mut self, id: StreamId, deadline: Instant) -> Result<H3Response, String> {
        self.run_until(deadline, |c| {
            c.lost.is_some() || c.streams.get(&id).is_some_and(|s| s.fin || s.reset.is_some())
        });
        let s = &self.streams[&id];
        if let Some(code) = s.reset {
            return Err(format!("stream {id} reset with code {code:#x}"));
        }
        if let Some(e) = &self.lost {
            return Err(format!("connection lost: {e}"));
        }
        if !s.fin {
            return Err(format!("stream {id} did not end in time ({} bytes so far)", s.bytes.len()));
        }
        Ok(parse(&s.bytes))
    }

    /// Moves the connection to a new local UDP port (a client whose address changed, as
    /// behind a NAT rebinding or on a network switch): the old socket is closed, the next
    /// datagrams go from a fresh one on 127.0.0.1, with a connection ID the server issued and
    /// the client has not used yet. Returns the new local address.
    pub fn rebind(&mut self) -> SocketAddr {
        self.sock = UdpSocket::bind("127.0.0.1:0").expect("bind UDP");
        self.conn.local_address_changed();
        self.flush();
        self.sock.local_addr().expect("local address")
    }

    /// Sends every datagram quinn has.
    pub fn flush(&mut self) {
        let mut out = Vec::new();
        while let Some(t) = self.conn.poll_transmit(Instant::now(), 1, &mut out) {
            let _ = self.sock.send_to(&out[..t.size], t.destination);
            out.clear();
        }
    }

    /// One step: send, wait for a datagram (until the next timer, `deadline` or 50 ms), feed
    /// it and the timers, read the streams.
    pub fn step(&mut self, deadline: Instant) {
        self.flush();
        let now = Instant::now();
        let until = [self.conn.poll_timeout(), Some(deadline), Some(now + Duration::from_millis(50))]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(deadline);
        let wait = until.saturating_duration_since(now).max(Duration::from_millis(1));
        self.sock.set_read_timeout(Some(wait)).expect("timeout");
        // The first datagram within `wait`, then what else is queued without blocking.
        let mut got = 0;
        while let Ok((n, from)) = self.sock.recv_from(&mut self.buf) {
            got += 1;
            // A long header of type Retry (RFC 9000 §17.2.5).
            if self.buf[0] & 0xb0 == 0xb0 {
                self.retries += 1;
            }
            let data = BytesMut::from(&self.buf[..n]);
            let mut answer = Vec::new();
            if let Some(DatagramEvent::ConnectionEvent(_, event)) =
                self.ep.handle(Instant::now(), from, None, None, data, &mut answer)
            {
                self.conn.handle_event(event);
            }
            self.sock.set_nonblocking(true).expect("nonblocking");
            if got >= 256 {
                break;
            }
        }
        self.sock.set_nonblocking(false).expect("blocking");
        let now = Instant::now();
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        while let Some(event) = self.conn.poll_endpoint_events() {
            if let Some(back) = self.ep.handle_event(self.ch, event) {
                self.conn.handle_event(back);
            }
        }
        while let Some(event) = self.conn.poll() {
            match event {
                QuicEvent::ConnectionLost { reason } => self.lost = Some(reason),
                QuicEvent::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                    while let Some(id) = self.conn.streams().accept(Dir::Uni) {
                        self.streams.entry(id).or_default();
                    }
                }
                _ => {}
            }
        }
        self.read_streams();
        self.open_control();
        self.write_pending();
        self.flush();
    }

    fn read_streams(&mut self) {
        let ids: Vec<StreamId> = self.streams.keys().copied().collect();
        for id in ids {
            let got = self.streams.entry(id).or_default();
            if got.fin || got.reset.is_some() {
                continue;
            }
            let mut recv = self.conn.recv_stream(id);
            let Ok(mut chunks) = recv.read(true) else { continue };
            loop {
                match chunks.next(usize::MAX) {
                    Ok(Some(chunk)) => got.bytes.extend_from_slice(&chunk.bytes),
                    Ok(None) => {
                        got.fin = true;
                        break;
                    }
                    Err(ReadError::Blocked) => break,
                    Err(ReadError::Reset(code)) => {
                        got.reset = Some(code.into_inner());
                        break;
                    }
                }
            }
            let _ = chunks.finalize();
            // The server's control stream: type 0x00, SETTINGS, maybe GOAWAY (type 0x07).
            if id.dir() == Dir::Uni && got.bytes.first() == Some(&0) {
                let mut reader = FrameReader::new(0);
                let mut at = 1;
                while let Ok((used, Some(f))) = reader.next(&got.bytes[at..]) {
                    at += used;
                    if let Frame::Goaway(limit) = f {
                        self.goaway = true;
                        self.goaway_id = Some(self.goaway_id.map_or(limit, |g| g.min(limit)));
                    }
                }
            }
        }
    }

    /// Steps until `done` or `deadline` (then returns anyway; the caller asserts).
    pub fn run_until(&mut self, deadline: Instant, mut done: impl FnMut(&mut H3Client) -> bool) {
        while !done(self) && Instant::now() < deadline {
            self.step(deadline);
        }
    }

    /// The body bytes received so far on `id` (DATA payloads), without waiting.
    pub fn partial(&self, id: StreamId) -> H3Response {
        self.streams.get(&id).map(|s| parse(&s.bytes)).unwrap_or_default()
    }
}

/// A dropped client closes its connection (`H3_NO_ERROR`), as a dropped TCP socket sends
/// its FIN: the server frees it at once instead of at its idle timeout.
impl Drop for H3Client {
    fn drop(&mut self) {
        if !self.conn.is_closed() {
            self.close(0x100);
        }
    }
}

/// A HEADERS frame of `head` (name, value pairs, pseudo-headers first).
pub fn headers_frame(head: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    Encoder.begin(&mut block);
    for (n, v) in head {
        Encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
    }
    let mut out = Vec::new();
    frame::write_header(frame::ty::HEADERS, block.len() as u64, &mut out);
    out.extend_from_slice(&block);
    out
}

/// A response stream's bytes as heads and body (a trailing partial frame is left out).
pub fn parse(bytes: &[u8]) -> H3Response {
    let mut r = H3Response::default();
    let mut reader = FrameReader::new(1 << 20);
    let mut at = 0;
    while at < bytes.len() {
        let Ok((used, frame)) = reader.next(&bytes[at..]) else { break };
        at += used;
        match frame {
            Some(Frame::Headers { len }) => {
                if at + len > bytes.len() {
                    break;
                }
                let mut fields = Fields::default();
                qpack::decode(&bytes[at..at + len], 1 << 20, &mut fields).expect("QPACK");
                r.heads.push(
                    fields
                        .iter()
                        .map(|(n, v)| {
                            (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned())
                        })
                        .collect(),
                );
                at += len;
            }
            Some(Frame::Data { len, .. }) => {
                r.body.extend_from_slice(&bytes[at..at + len]);
                at += len;
            }
            Some(_) => {}
            None => {
                if used == 0 {
                    break;
                }
            }
        }
    }
    r
}

/// One exchange on `c` as a [`Response`] (`version` "HTTP/3", no reason phrase, field
/// names lower-case): `headers` as given but for the connection-specific ones (a `Host`
/// becomes `:authority`), `content-length` added for a body as the HTTP/1.1 [`request`]
/// does. `Err` when the stream or the connection fails or `timeout` runs out.
///
/// [`request`]: super::request
pub fn h3_exchange(
    c: &mut H3Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, String> {
    let fields = h3_fields(method, path, headers, body.len());
    let head: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let id = c.request(&head, body);
    let r = c.try_response(id, Instant::now() + timeout).map_err(|e| format!("{method} {path}: {e}"))?;
    h3_response(r).ok_or_else(|| format!("{method} {path}: the stream ended without a final head"))
}

/// The fields of a request: the pseudo-headers, then `headers` but for the
/// connection-specific ones (a `Host` becomes `:authority`), names lower-cased, and
/// `content-length` for a body of `body_len` bytes unless given.
pub fn h3_fields(method: &str, path: &str, headers: &[(&str, &str)], body_len: usize) -> Vec<(String, String)> {
    let authority =
        headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("host")).map_or("localhost", |(_, v)| *v).to_string();
    let mut fields: Vec<(String, String)> = vec![
        (":method".into(), method.into()),
        (":scheme".into(), "https".into()),
        (":authority".into(), authority),
        (":path".into(), path.into()),
    ];
    let mut has_length = false;
    for (k, v) in headers {
        if H2_DROPPED.iter().any(|d| k.eq_ignore_ascii_case(d)) {
            continue;
        }
        has_length |= k.eq_ignore_ascii_case("content-length");
        fields.push((k.to_ascii_lowercase(), v.to_string()));
    }
    if body_len > 0 && !has_length {
        fields.push(("content-length".into(), body_len.to_string()));
    }
    fields
}

/// Whether `head` is an informational (1xx) one.
pub fn is_informational(head: &[(String, String)]) -> bool {
    head.iter().any(|(n, v)| n == ":status" && v.starts_with('1'))
}

/// An HTTP/3 response in the shape of an HTTP/1.1 [`Response`]: informational heads
/// (`103 Early Hints`) as `interim`; `None` without a final head.
pub fn h3_response(r: H3Response) -> Option<Response> {
    let shape = |head: &[(String, String)]| {
        let status = head.iter().find(|(n, _)| n == ":status").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
        let headers = head.iter().filter(|(n, _)| !n.starts_with(':')).cloned().collect();
        Response {
            version: "HTTP/3".into(),
            status,
            reason: String::new(),
            headers,
            body: Vec::new(),
            interim: Box::new([]),
        }
    };
    let (last, interim) = r.heads.split_last()?;
    if is_informational(last) {
        return None;
    }
    let mut out = shape(last);
    out.body = r.body;
    out.interim = interim.iter().map(|h| shape(h)).collect();
    Some(out)
}

#[cfg(test)]
mod selftest {
    use super::*;

    fn fields(f: &[(&str, &str)]) -> Vec<(String, String)> {
        f.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn harness_h3_fields_map_a_request_as_h2_exchange_does() {
        let f = h3_fields("POST", "/x", &[("Host", "a.example"), ("Connection", "close"), ("X-Y", "1")], 3);
        let want = fields(&[
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "a.example"),
            (":path", "/x"),
            ("x-y", "1"),
            ("content-length", "3"),
        ]);
        assert_eq!(f, want);
        let f = h3_fields("GET", "/", &[("Content-Length", "0")], 0);
        assert_eq!(f[2], (":authority".to_string(), "localhost".to_string()));
        assert_eq!(f.iter().filter(|(k, _)| k == "content-length").count(), 1, "{f:?}");
    }

    #[test]
    fn harness_h3_response_keeps_informational_heads_apart() {
        let hints = fields(&[(":status", "103"), ("link", "</a.css>; rel=preload")]);
        let last = fields(&[(":status", "200"), ("content-type", "text/plain")]);
        let r =
            h3_response(H3Response { heads: vec![hints.clone(), last], body: b"hi".to_vec() }).expect("a final head");
        assert_eq!((r.version.as_str(), r.status, r.body.as_slice()), ("HTTP/3", 200, &b"hi"[..]));
        assert_eq!(r.headers, fields(&[("content-type", "text/plain")]));
        assert_eq!(r.interim.len(), 1);
        assert_eq!(r.interim[0].status, 103);
        assert!(h3_response(H3Response { heads: vec![hints], body: Vec::new() }).is_none());
        assert!(h3_response(H3Response::default()).is_none());
    }
}
