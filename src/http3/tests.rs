//! A quinn-proto client and this module's [`Server`] joined in memory: datagrams are handed
//! from one to the other in a loop, time is simulated (advanced to the next timer when nothing
//! moves), and the client speaks HTTP/3 with this module's own frames and QPACK. No socket, no
//! sleep; every loop is bounded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    Event as QuicEvent, ReadError, StreamEvent, StreamId, VarInt,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::conn::{ConnLimits, Event, H3Conn};
use super::error::Code;
use super::frame::{self, Frame, FrameReader};
use super::keys::QuicKeys;
use super::qpack::{self, Encoder, Fields};
use super::server::{Outgoing, Server};
use super::setup;
use super::varint;

const CLIENT: &str = "127.0.0.1:40000";
const SERVER: &str = "127.0.0.1:4433";
const SECRET: [u8; 32] = [9; 32];
/// The HTTP/3 limits of the servers here (a small field section).
const CONN: ConnLimits =
    ConnLimits { max_field_section: 4096, header_timeout: Duration::from_secs(10), keepalive: Duration::from_secs(5) };

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("literal address")
}

/// A certificate for `localhost`: the server's key and the client's trust root.
fn certificate() -> (Arc<rustls::sign::CertifiedKey>, CertificateDer<'static>) {
    certificate_for(vec!["localhost".into()])
}

/// A certificate for `names` (the first `localhost`): the server's key and the client's root.
fn certificate_for(names: Vec<String>) -> (Arc<rustls::sign::CertifiedKey>, CertificateDer<'static>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(names).expect("params").self_signed(&key).expect("cert");
    let der = CertificateDer::from(cert.der().to_vec());
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = crate::tls::provider().key_provider.load_private_key(private).expect("key loads");
    (Arc::new(rustls::sign::CertifiedKey::new(vec![der.clone()], signing)), der)
}

/// What the client has read of one stream.
#[derive(Debug, Default)]
struct Received {
    bytes: Vec<u8>,
    fin: bool,
    reset: Option<u64>,
}

/// A parsed response: every head's `:status` and fields, the body.
#[derive(Debug, Default)]
struct Response {
    heads: Vec<Fields>,
    body: Vec<u8>,
}

impl Response {
    fn status(&self) -> Option<&[u8]> {
        self.heads.last().and_then(|f| f.value(b":status"))
    }
}

struct Pair {
    /// The server's certificate and key (another worker serves the same).
    cert: Arc<rustls::sign::CertifiedKey>,
    client_config: ClientConfig,
    now: Instant,
    server: Server,
    client_ep: Endpoint,
    client: Connection,
    client_ch: ConnectionHandle,
    streams: HashMap<StreamId, Received>,
    /// Datagrams the endpoint answered by itself (Retry, reset), by first byte.
    endpoint_answers: Vec<u8>,
    /// Every datagram the client sent, for replay.
    sent: Vec<Vec<u8>>,
    lost: Option<ConnectionError>,
}

impl Pair {
    fn new(under_load: bool) -> Pair {
        Pair::with(under_load, false)
    }

    /// A pair whose server accepts 0-RTT (`early`: a session store, see `setup.rs`) and whose
    /// client offers it.
    fn with(under_load: bool, early: bool) -> Pair {
        let store: Option<Arc<dyn rustls::server::StoresServerSessions>> =
            early.then(|| rustls::server::ServerSessionMemoryCache::new(64) as _);
        Pair::with_store(under_load, store)
    }

    /// [`Pair::with`] whose server keeps sessions in `store` (0-RTT when `Some`).
    fn with_store(under_load: bool, store: Option<Arc<dyn rustls::server::StoresServerSessions>>) -> Pair {
        Pair::with_limits(under_load, store, setup::Limits { max_field_section: 4096, ..setup::Limits::default() })
    }

    /// [`Pair::with_store`] whose server has `limits`.
    fn with_limits(
        under_load: bool,
        store: Option<Arc<dyn rustls::server::StoresServerSessions>>,
        limits: setup::Limits,
    ) -> Pair {
        Pair::with_all(under_load, store, limits, CONN)
    }

    /// A pair whose server has the HTTP/3 limits `conn`.
    fn with_conn(conn: ConnLimits) -> Pair {
        let limits = setup::Limits { max_field_section: 4096, ..setup::Limits::default() };
        Pair::with_all(false, None, limits, conn)
    }

    /// [`Pair::with_limits`] whose server has the HTTP/3 limits `conn`.
    fn with_all(
        under_load: bool,
        store: Option<Arc<dyn rustls::server::StoresServerSessions>>,
        limits: setup::Limits,
        conn: ConnLimits,
    ) -> Pair {
        Pair::with_certificate(under_load, store, limits, conn, certificate())
    }

    /// [`Pair::with_all`] whose server has the certificate `cert` (key, root).
    fn with_certificate(
        under_load: bool,
        store: Option<Arc<dyn rustls::server::StoresServerSessions>>,
        limits: setup::Limits,
        conn: ConnLimits,
        cert: (Arc<rustls::sign::CertifiedKey>, CertificateDer<'static>),
    ) -> Pair {
        let mut pair = Pair::connected(under_load, store, limits, conn, cert, None);
        pair.open_client_control(&[]);
        pair
    }

    /// A pair whose client grants each stream only `window` bytes until it reads them.
    fn with_stream_window(window: u32) -> Pair {
        let limits = setup::Limits { max_field_section: 4096, ..setup::Limits::default() };
        let mut transport = quinn_proto::TransportConfig::default();
        transport.stream_receive_window(VarInt::from_u32(window));
        let mut pair = Pair::connected(false, None, limits, CONN, certificate(), Some(transport));
        pair.open_client_control(&[]);
        pair
    }

    /// A pair whose client's decoder allows a QPACK dynamic table of `capacity` bytes.
    fn with_qpack(capacity: u64) -> Pair {
        let limits = setup::Limits { max_field_section: 4096, ..setup::Limits::default() };
        let mut pair = Pair::connected(false, None, limits, CONN, certificate(), None);
        pair.open_client_control(&[(frame::setting::QPACK_MAX_TABLE_CAPACITY, capacity)]);
        pair
    }

    /// [`Pair::with_certificate`] with the handshake done and no client control stream yet;
    /// the client's QUIC settings are `transport` when given.
    fn connected(
        under_load: bool,
        store: Option<Arc<dyn rustls::server::StoresServerSessions>>,
        limits: setup::Limits,
        conn: ConnLimits,
        cert: (Arc<rustls::sign::CertifiedKey>, CertificateDer<'static>),
        transport: Option<quinn_proto::TransportConfig>,
    ) -> Pair {
        let early = store.is_some();
        let (key, root) = cert;
        let keys = QuicKeys::derive(&SECRET);
        let config = setup::server_config(Arc::clone(&key), &keys, &limits, store).expect("server config");
        let mut server = Server::new(setup::endpoint_config(&keys, 1), config, conn);
        server.set_under_load(under_load);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).expect("root");
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(crate::tls::provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        tls.enable_early_data = early;
        let mut client_config = ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).expect("QUIC client")));
        if let Some(transport) = transport {
            client_config.transport_config(Arc::new(transport));
        }
        let mut client_ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
        let now = Instant::now();
        let (client_ch, client) =
            client_ep.connect(now, client_config.clone(), addr(SERVER), "localhost").expect("connect");
        let mut pair = Pair {
            cert: key,
            client_config,
            now,
            server,
            client_ep,
            client,
            client_ch,
            streams: HashMap::new(),
            endpoint_answers: Vec::new(),
            sent: Vec::new(),
            lost: None,
        };
        pair.run_until(|p| !p.client.is_handshaking());
        assert!(pair.lost.is_none(), "handshake failed: {:?}", pair.lost);
        pair
    }

    /// A new client connection (resuming the last session, with 0-RTT when offered), without
    /// waiting for its handshake.
    fn reconnect(&mut self) {
        let (ch, conn) =
            self.client_ep.connect(self.now, self.client_config.clone(), addr(SERVER), "localhost").expect("connect");
        (self.client_ch, self.client) = (ch, conn);
        self.streams.clear();
        self.lost = None;
    }

    /// The client's control stream with its SETTINGS (`extra` after its field section size).
    fn open_client_control(&mut self, extra: &[(u64, u64)]) {
        let id = self.client.streams().open(Dir::Uni).expect("a uni stream");
        let mut out = vec![0x00];
        let mut settings = vec![(frame::setting::MAX_FIELD_SECTION_SIZE, 8192)];
        settings.extend_from_slice(extra);
        frame::write_settings(&settings, &mut out);
        self.client.send_stream(id).write(&out).expect("written");
    }

    /// Opens a request stream and writes `head` (name, value pairs, pseudo-headers first),
    /// then `body` as one DATA frame; FIN when `fin`.
    fn request(&mut self, head: &[(&str, &str)], body: &[u8], fin: bool) -> StreamId {
        self.request_raw(head, &[], body, fin)
    }

    /// [`Self::request`] with `raw` field lines appended to the encoded section as they are.
    fn request_raw(&mut self, head: &[(&str, &str)], raw: &[u8], body: &[u8], fin: bool) -> StreamId {
        let id = self.client.streams().open(Dir::Bi).expect("a request stream");
        let mut block = Vec::new();
        Encoder.begin(&mut block);
        for (n, v) in head {
            Encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
        }
        block.extend_from_slice(raw);
        let mut out = Vec::new();
        frame::write_header(frame::ty::HEADERS, block.len() as u64, &mut out);
        out.extend_from_slice(&block);
        if !body.is_empty() {
            frame::write_header(frame::ty::DATA, body.len() as u64, &mut out);
            out.extend_from_slice(body);
        }
        self.client.send_stream(id).write(&out).expect("written");
        if fin {
            self.client.send_stream(id).finish().expect("finished");
        }
        id
    }

    fn get(&mut self, path: &str) -> StreamId {
        self.request(
            &[(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)],
            b"",
            true,
        )
    }

    /// Hands a datagram from the server to the client.
    fn deliver_to_client(&mut self, bytes: &[u8]) {
        let mut buf = Vec::new();
        if let Some(DatagramEvent::ConnectionEvent(_, event)) =
            self.client_ep.handle(self.now, addr(SERVER), None, None, BytesMut::from(bytes), &mut buf)
        {
            self.client.handle_event(event);
        }
    }

    /// Moves every pending datagram both ways once; whether any moved.
    fn pump(&mut self) -> bool {
        let mut moved = false;
        let mut buf = Vec::new();
        while let Some(t) = self.client.poll_transmit(self.now, 1, &mut buf) {
            moved = true;
            let datagram = buf[..t.size].to_vec();
            self.sent.push(datagram.clone());
            let mut answers: Vec<Outgoing> = Vec::new();
            self.server.handle_datagram(
                self.now,
                addr(CLIENT),
                None,
                None,
                BytesMut::from(&datagram[..]),
                &mut answers,
            );
            for answer in answers {
                self.endpoint_answers.push(answer.bytes[0]);
                self.deliver_to_client(&answer.bytes[..answer.transmit.size]);
            }
            buf.clear();
        }
        for ch in self.server.handles() {
            while let Some(out) = self.server.poll_transmit(self.now, ch, 1) {
                moved = true;
                self.deliver_to_client(&out.bytes[..out.transmit.size]);
            }
            self.server.after_send(ch);
        }
        while let Some(event) = self.client.poll_endpoint_events() {
            if let Some(back) = self.client_ep.handle_event(self.client_ch, event) {
                self.client.handle_event(back);
            }
        }
        while let Some(event) = self.client.poll() {
            match event {
                QuicEvent::ConnectionLost { reason } => self.lost = Some(reason),
                QuicEvent::Stream(StreamEvent::Opened { dir }) => {
                    while let Some(id) = self.client.streams().accept(dir) {
                        self.streams.entry(id).or_default();
                    }
                }
                _ => {}
            }
        }
        self.read_client_streams();
        moved
    }

    /// Reads everything the client's streams have.
    fn read_client_streams(&mut self) {
        let ids: Vec<StreamId> = self.streams.keys().copied().collect();
        for id in ids {
            let mut recv = self.client.recv_stream(id);
            let Ok(mut chunks) = recv.read(true) else { continue };
            let got = self.streams.entry(id).or_default();
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
        }
    }

    /// Pumps (advancing the clock to the next timer when nothing moves) until `done`, at most
    /// 20 000 steps.
    fn run_until(&mut self, mut done: impl FnMut(&mut Pair) -> bool) {
        for _ in 0..20_000 {
            if done(self) {
                return;
            }
            if !self.pump() {
                let next = [self.client.poll_timeout(), self.server.next_timeout()].into_iter().flatten().min();
                let Some(next) = next else { panic!("nothing moves and no timer is set") };
                self.now = self.now.max(next);
                self.client.handle_timeout(self.now);
                let _ = self.server.handle_timeouts(self.now);
            }
        }
        panic!("not done after 20 000 steps");
    }

    /// Answers every request the server sees with `status` and no body, until the client has
    /// the whole response on stream `id`.
    fn answer_until_fin(&mut self, id: StreamId, status: u16) {
        self.run_until(|p| {
            for (ch, event) in p.server_events() {
                if let Event::Request { stream, .. } = event {
                    let conn = p.server.conn(ch).expect("connection");
                    conn.send_head(stream, status, []).expect("open");
                    conn.finish(stream).expect("open");
                }
            }
            p.streams[&id].fin
        });
    }

    /// Every server connection's events, in order.
    fn server_events(&mut self) -> Vec<(ConnectionHandle, Event)> {
        let mut events = Vec::new();
        for ch in self.server.handles() {
            let conn = self.server.conn(ch).expect("listed");
            while let Some(e) = conn.poll_event() {
                events.push((ch, e));
            }
        }
        events
    }

    /// The one server connection.
    fn conn(&mut self) -> &mut H3Conn {
        let ch = self.server.handles()[0];
        self.server.conn(ch).expect("a connection")
    }

    /// Tracks a stream the client opened (to read its answer).
    fn watch(&mut self, id: StreamId) {
        self.streams.entry(id).or_default();
    }

    /// The response on `id`, parsed with this module's frames and QPACK.
    fn response(&self, id: StreamId) -> Response {
        let bytes = &self.streams[&id].bytes;
        let (mut reader, mut at, mut resp) = (FrameReader::new(1 << 20), 0, Response::default());
        loop {
            let (drop, frame) = reader.next(&bytes[at..]).expect("valid frames");
            at += drop;
            match frame {
                None => return resp,
                Some(Frame::Headers { len }) => {
                    let mut fields = Fields::default();
                    qpack::decode(&bytes[at..at + len], 1 << 20, &mut fields).expect("decodes");
                    resp.heads.push(fields);
                    at += len;
                }
                Some(Frame::Data { len, .. }) => {
                    resp.body.extend_from_slice(&bytes[at..at + len]);
                    at += len;
                }
                Some(other) => panic!("{other:?} on a request stream"),
            }
        }
    }

    /// The bytes (after the type) of the server's unidirectional stream of type `ty`.
    fn server_uni(&self, ty: u64) -> Option<&[u8]> {
        self.streams.iter().filter(|(id, _)| id.dir() == Dir::Uni).find_map(|(_, got)| {
            let (t, used) = varint::decode(&got.bytes)?;
            (t == ty).then(|| &got.bytes[used..])
        })
    }

    /// The server's unidirectional streams, by type.
    fn server_uni_types(&self) -> Vec<u64> {
        let mut types: Vec<u64> = self
            .streams
            .iter()
            .filter(|(id, _)| id.dir() == Dir::Uni)
            .filter_map(|(_, got)| varint::decode(&got.bytes).map(|(t, _)| t))
            .collect();
        types.sort_unstable();
        types
    }

    /// The frames on the server's control stream so far (after its type byte).
    fn server_control(&self) -> Vec<Frame> {
        let Some(bytes) = self.server_uni(0x00) else { return Vec::new() };
        let (mut reader, mut at, mut frames) = (FrameReader::new(1024), 0, Vec::new());
        while let (drop, Some(frame)) = reader.next(&bytes[at..]).expect("valid frames") {
            at += drop;
            frames.push(frame);
        }
        frames
    }
}

fn bytes_of(pattern_len: usize) -> Vec<u8> {
    (0..pattern_len).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn a_get_and_a_post_are_answered() {
    let mut p = Pair::new(false);
    let get = p.get("/hello?x=1");
    let body = bytes_of(3000);
    let post = p.request(
        &[
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "localhost"),
            (":path", "/echo"),
            ("content-length", "3000"),
        ],
        &body,
        true,
    );
    p.watch(get);
    p.watch(post);
    let mut received: HashMap<StreamId, Vec<u8>> = HashMap::new();
    let mut answered = 0;
    p.run_until(|p| {
        for (ch, event) in p.server_events() {
            let conn = p.server.conn(ch).expect("connection");
            match event {
                Event::Request { stream, head } => {
                    assert!(!head.early);
                    assert_eq!(head.authority(), Some("localhost"));
                    if head.method() == "GET" {
                        assert_eq!(head.path(), "/hello?x=1");
                        let fields: [(&[u8], &[u8]); 1] = [(b"content-type", b"text/plain")];
                        conn.send_head(stream, 200, fields).expect("open");
                        conn.send_data(stream, Bytes::from_static(b"hello")).expect("open");
                        conn.finish(stream).expect("open");
                        answered += 1;
                    } else {
                        assert_eq!((head.method(), head.content_length), ("POST", Some(3000)));
                        received.insert(stream, Vec::new());
                    }
                }
                Event::Data { stream, data } => received.get_mut(&stream).expect("a POST").extend_from_slice(&data),
                Event::End { stream } => {
                    if let Some(body) = received.remove(&stream) {
                        conn.send_head(stream, 201, []).expect("open");
                        conn.send_data(stream, Bytes::from(body)).expect("open");
                        conn.finish(stream).expect("open");
                        answered += 1;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        answered == 2 && p.streams[&get].fin && p.streams[&post].fin
    });
    let resp = p.response(get);
    assert_eq!((resp.status(), resp.body.as_slice()), (Some(&b"200"[..]), &b"hello"[..]));
    assert_eq!(resp.heads[0].value(b"content-type"), Some(&b"text/plain"[..]));
    let resp = p.response(post);
    assert_eq!(resp.status(), Some(&b"201"[..]));
    assert!(resp.body == body, "the body comes back byte for byte");
    // The server's control stream opened with its SETTINGS.
    let settings = frame::Settings { max_field_section_size: Some(4096), ..frame::Settings::default() };
    assert_eq!(p.server_control().first(), Some(&Frame::Settings(settings)));
    assert_eq!(p.conn().peer_settings().and_then(|s| s.max_field_section_size), Some(8192));
}

#[test]
fn a_large_response_waits_for_flow_control() {
    let mut p = Pair::new(false);
    let id = p.get("/big");
    p.watch(id);
    const TOTAL: usize = 2 << 20;
    const CHUNK: usize = 16 * 1024;
    let body = Bytes::from(bytes_of(TOTAL));
    let (mut sent, mut stream, mut pauses, mut writable) = (0usize, None, 0, 0);
    p.run_until(|p| {
        for (_, event) in p.server_events() {
            match event {
                Event::Request { stream: s, .. } => {
                    stream = Some(s);
                    p.conn().send_head(s, 200, []).expect("open");
                }
                Event::End { .. } => {}
                Event::Writable { .. } => writable += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        if let Some(s) = stream {
            let conn = p.conn();
            while sent < TOTAL && conn.may_send(s) {
                conn.send_data(s, body.slice(sent..sent + CHUNK)).expect("open");
                sent += CHUNK;
            }
            if sent < TOTAL {
                pauses += 1;
                assert!(conn.queued(s) <= super::conn::WATERMARK + CHUNK + 16, "the queue stays bounded");
            } else if conn.may_send(s) {
                conn.finish(s).expect("open");
            }
        }
        p.streams[&id].fin
    });
    assert!(pauses > 0 && writable > 0, "the producer was paused ({pauses}) and resumed ({writable})");
    let resp = p.response(id);
    assert!(resp.body == body, "2 MiB arrive in order, byte for byte ({} bytes)", resp.body.len());
}

#[test]
fn a_head_written_with_its_body_arrives_whole_past_a_small_stream_window() {
    // 300 bytes of window: the first write of each response is cut short, the rest queued.
    let mut p = Pair::with_stream_window(300);
    let bodies = [Bytes::from(bytes_of(1000)), Bytes::from(bytes_of(5000)), Bytes::new()];
    let ids = [p.get("/small"), p.get("/large"), p.get("/none")];
    for id in ids {
        p.watch(id);
    }
    let fields = crate::http2::ResponseFields::from_pairs(&[("content-type", "text/plain")]).expect("valid");
    let mut cut = 0;
    p.run_until(|p| {
        for (_, event) in p.server_events() {
            if let Event::Request { stream, .. } = event {
                let i = ids.iter().position(|id| *id == stream).expect("one of ours");
                let conn = p.conn();
                conn.send_response(stream, 200, &fields, bodies[i].clone()).expect("open");
                cut += usize::from(conn.queued(stream) > 0);
                conn.finish(stream).expect("open");
            }
        }
        ids.iter().all(|id| p.streams[id].fin)
    });
    assert!(cut >= 2, "the window cut {cut} responses");
    for (id, body) in ids.iter().zip(&bodies) {
        let resp = p.response(*id);
        assert_eq!((resp.heads.len(), resp.status()), (1, Some(&b"200"[..])));
        assert_eq!(resp.heads[0].value(b"content-type"), Some(&b"text/plain"[..]));
        assert!(resp.body == *body, "{} body bytes arrive in order", body.len());
    }
}

#[test]
fn under_load_a_client_is_retried_then_served() {
    let mut p = Pair::new(true);
    assert!(
        p.endpoint_answers.iter().any(|b| b & 0xf0 == 0xf0),
        "a Retry packet (long header, type 3) was sent: {:02x?}",
        p.endpoint_answers
    );
    let id = p.get("/");
    p.watch(id);
    p.answer_until_fin(id, 204);
    assert_eq!(p.response(id).status(), Some(&b"204"[..]));
}

#[test]
fn goaway_finishes_open_requests_then_closes() {
    let mut p = Pair::new(false);
    let first = p.get("/slow");
    p.watch(first);
    let mut pending = None;
    p.run_until(|p| {
        for (_, event) in p.server_events() {
            if let Event::Request { stream, .. } = event {
                pending = Some(stream);
            }
        }
        pending.is_some()
    });
    let now = p.now;
    p.conn().go_away(now);
    p.run_until(|p| p.server_control().iter().any(|f| matches!(f, Frame::Goaway(_))));
    assert_eq!(p.server_control().last(), Some(&Frame::Goaway(4)), "the next request stream is refused");
    // A request sent after GOAWAY is refused; the open one is still answered.
    let late = p.get("/late");
    p.watch(late);
    p.run_until(|p| p.streams[&late].reset.is_some());
    assert_eq!(p.streams[&late].reset, Some(Code::RequestRejected.value()));
    let stream = pending.expect("a request");
    p.conn().send_head(stream, 200, []).expect("still open");
    p.conn().finish(stream).expect("still open");
    p.run_until(|p| p.lost.is_some());
    assert_eq!(p.response(first).status(), Some(&b"200"[..]));
    match &p.lost {
        Some(ConnectionError::ApplicationClosed(close)) => assert_eq!(close.error_code, VarInt::from_u32(0x100)),
        other => panic!("closed with H3_NO_ERROR, not {other:?}"),
    }
}

#[test]
fn a_malformed_request_resets_its_stream_only() {
    let mut p = Pair::new(false);
    // A literal field line with the literal name `Upper` (the encoder would lower it).
    let upper = [&[0x25u8][..], b"Upper", &[0x01, b'x']].concat();
    let bad = p.request_raw(&[(":method", "GET"), (":scheme", "https"), (":path", "/")], &upper, b"", true);
    let conn_specific =
        p.request(&[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("connection", "close")], b"", true);
    let big = "v".repeat(5000);
    let too_large = p.request(&[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("x-big", &big)], b"", true);
    for id in [bad, conn_specific, too_large] {
        p.watch(id);
    }
    let mut large = 0;
    p.run_until(|p| {
        for (ch, event) in p.server_events() {
            if let Event::TooLarge { stream } = event {
                large += 1;
                let conn = p.server.conn(ch).expect("connection");
                conn.send_head(stream, 431, []).expect("open");
                conn.finish(stream).expect("open");
            }
        }
        p.streams[&bad].reset.is_some() && p.streams[&conn_specific].reset.is_some() && p.streams[&too_large].fin
    });
    assert_eq!(p.streams[&bad].reset, Some(Code::MessageError.value()));
    assert_eq!(p.streams[&conn_specific].reset, Some(Code::MessageError.value()));
    assert_eq!((large, p.response(too_large).status()), (1, Some(&b"431"[..])));
    // The connection lives on.
    let ok = p.get("/");
    p.watch(ok);
    p.answer_until_fin(ok, 200);
    assert!(p.lost.is_none());
}

#[test]
fn a_control_stream_without_settings_closes_the_connection() {
    let mut p = Pair::new(false);
    // A second control stream: H3_STREAM_CREATION_ERROR.
    let id = p.client.streams().open(Dir::Uni).expect("uni");
    p.client.send_stream(id).write(&[0x00]).expect("written");
    p.run_until(|p| p.lost.is_some());
    match &p.lost {
        Some(ConnectionError::ApplicationClosed(close)) => {
            assert_eq!(close.error_code, VarInt::from_u64(Code::StreamCreationError.value()).expect("fits"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn another_worker_answers_a_stray_packet_with_a_stateless_reset() {
    let mut p = Pair::new(false);
    // Requests until the client sends a datagram of 1-RTT packets alone (early ones carry
    // Handshake packets too).
    for _ in 0..5 {
        let id = p.get("/");
        p.watch(id);
        p.run_until(|p| {
            for (ch, event) in p.server_events() {
                if let Event::Request { stream, .. } = event {
                    let conn = p.server.conn(ch).expect("connection");
                    conn.send_head(stream, 204, []).expect("open");
                    conn.finish(stream).expect("open");
                }
            }
            p.streams[&id].fin
        });
        if p.sent.iter().any(|d| d[0] & 0x80 == 0) {
            break;
        }
    }
    // A 1-RTT packet for a CID of slot 1.
    let stray = p.sent.iter().rev().find(|d| d[0] & 0x80 == 0).expect("a 1-RTT datagram").clone();
    assert_eq!(stray[0] & 0x80, 0, "a short-header packet");
    let (key, _) = certificate();
    let keys = QuicKeys::derive(&SECRET);
    let config = setup::server_config(key, &keys, &setup::Limits::default(), None).expect("config");
    let mut other = Server::new(setup::endpoint_config(&keys, 2), config, CONN);
    let mut answers = Vec::new();
    let later = p.now + Duration::from_secs(1);
    let padded = [&stray[..], &[0u8; 40][..]].concat();
    other.handle_datagram(later, addr(CLIENT), None, None, BytesMut::from(&padded[..]), &mut answers);
    assert_eq!(answers.len(), 1, "a stateless reset");
    assert_eq!(super::keys::slot_of(&stray[1..13]), Some(1), "the packet names slot 1");
    // The reset ends with the token the client was given for that CID: it resets the client.
    let reset = answers.remove(0);
    p.deliver_to_client(&reset.bytes[..reset.transmit.size]);
    p.run_until(|p| p.lost.is_some());
    assert!(matches!(p.lost, Some(ConnectionError::Reset)), "{:?}", p.lost);
    // A packet with a CID no forkd worker issued gets nothing.
    let mut forged = padded.clone();
    forged[5] ^= 0xff;
    other.handle_datagram(later, addr(CLIENT), None, None, BytesMut::from(&forged[..]), &mut answers);
    assert!(answers.is_empty(), "a forged CID is dropped");
}

#[test]
fn a_sibling_of_the_same_slot_drops_the_others_packets_instead_of_resetting() {
    let mut p = Pair::new(false);
    for _ in 0..5 {
        let id = p.get("/");
        p.watch(id);
        p.answer_until_fin(id, 204);
        if p.sent.iter().any(|d| d[0] & 0x80 == 0) {
            break;
        }
    }
    // The pair's server is slot 1, generation 0; a 1-RTT packet of one of its connections.
    let stray = p.sent.iter().rev().find(|d| d[0] & 0x80 == 0).expect("a 1-RTT datagram").clone();
    let padded = [&stray[..], &[0u8; 40][..]].concat();
    let first_initial = p.sent[0].clone();
    assert_ne!(first_initial[0] & 0x80, 0, "the client's first datagram has a long header");
    let (key, _) = certificate();
    let keys = QuicKeys::derive(&SECRET);
    let sibling = |gen: u8, on: bool, refuse_new: bool| {
        let config = setup::server_config(key.clone(), &keys, &setup::Limits::default(), None).expect("config");
        let mut s = Server::new(setup::worker_endpoint_config(&keys, 1, gen), config, CONN);
        s.set_identity(1, gen, keys.worker_cids(1, gen));
        s.set_sibling(on, refuse_new);
        s
    };
    let later = p.now + Duration::from_secs(1);
    let answers_to = |s: &mut Server, datagram: &[u8]| {
        let mut answers = Vec::new();
        let ch = s.handle_datagram(later, addr(CLIENT), None, None, BytesMut::from(datagram), &mut answers);
        (ch.is_some(), answers.len())
    };
    // Generation 7 beside its sibling: the packet is the sibling's, dropped.
    assert_eq!(answers_to(&mut sibling(7, true, false), &padded), (false, 0), "dropped, no reset");
    // Alone (the sibling is gone): a stateless reset, as any worker answers.
    assert_eq!(answers_to(&mut sibling(7, false, false), &padded), (false, 1), "a stateless reset");
    // A new client's Initial: taken unless the worker drains beside a successor.
    assert!(answers_to(&mut sibling(7, true, false), &first_initial).0, "a new connection");
    assert_eq!(answers_to(&mut sibling(7, true, true), &first_initial), (false, 0), "left to the successor");
}

#[test]
fn zero_rtt_requests_are_marked_early() {
    let mut p = Pair::with(false, true);
    // Let the session ticket arrive, then leave.
    let id = p.get("/");
    p.watch(id);
    p.run_until(|p| {
        for (ch, event) in p.server_events() {
            if let Event::Request { stream, head } = event {
                assert!(!head.early, "a 1-RTT request");
                let conn = p.server.conn(ch).expect("connection");
                conn.send_head(stream, 204, []).expect("open");
                conn.finish(stream).expect("open");
            }
        }
        p.streams[&id].fin
    });
    p.reconnect();
    assert!(p.client.has_0rtt(), "the client resumes with 0-RTT keys");
    let get = p.get("/early");
    let post = p.request(
        &[(":method", "POST"), (":scheme", "https"), (":authority", "localhost"), (":path", "/x")],
        b"",
        true,
    );
    let mut early: HashMap<StreamId, (bool, bool)> = HashMap::new();
    p.run_until(|p| {
        for (_, event) in p.server_events() {
            if let Event::Request { stream, head } = event {
                early.insert(stream, (head.early, head.safe_for_early_data()));
            }
        }
        early.len() == 2
    });
    assert_eq!(early[&get], (true, true), "GET from early data: served");
    assert_eq!(early[&post], (true, false), "POST from early data: to be answered 425");
    p.run_until(|p| !p.client.is_handshaking());
    assert!(p.client.accepted_0rtt());
}

/// Serves one request on a fresh pair whose server keeps sessions in `store`, then puts
/// another worker (slot 2, its own `Server`, sessions in `other`) in its place and resumes:
/// whether that worker accepted 0-RTT, and whether it marked the early GET as early.
fn resume_on_another_worker(
    store: Arc<dyn rustls::server::StoresServerSessions>,
    other: Arc<dyn rustls::server::StoresServerSessions>,
) -> (bool, bool) {
    let mut p = Pair::with_store(false, Some(store));
    let id = p.get("/");
    p.watch(id);
    p.answer_until_fin(id, 204);
    let keys = QuicKeys::derive(&SECRET);
    let limits = setup::Limits { max_field_section: 4096, ..setup::Limits::default() };
    let config = setup::server_config(Arc::clone(&p.cert), &keys, &limits, Some(other)).expect("config");
    p.server = Server::new(setup::endpoint_config(&keys, 2), config, CONN);
    p.reconnect();
    assert!(p.client.has_0rtt(), "the client offers 0-RTT");
    let get = p.get("/early");
    // A refused 0-RTT request is not sent again by quinn: look until the handshake is over
    // and a few exchanges after.
    let mut early = None;
    let mut look = |p: &mut Pair| {
        for (_, event) in p.server_events() {
            if let Event::Request { stream, head } = event {
                if stream == get {
                    early = Some(head.early);
                }
            }
        }
    };
    p.run_until(|p| {
        look(p);
        !p.client.is_handshaking()
    });
    for _ in 0..8 {
        p.pump();
        look(&mut p);
    }
    assert!(p.lost.is_none(), "{:?}", p.lost);
    (p.client.accepted_0rtt(), early == Some(true))
}

#[test]
fn zero_rtt_resumes_on_another_worker_through_the_shared_store() {
    let shared = crate::shm::sessions::SharedSessions::create(64, 7).expect("map");
    let store =
        || Arc::new(crate::shm::sessions::SessionStore(shared)) as Arc<dyn rustls::server::StoresServerSessions>;
    assert_eq!(resume_on_another_worker(store(), store()), (true, true), "0-RTT accepted by the other worker");
    // (Control) with a store per worker, the other worker cannot resume: no 0-RTT.
    let own = || rustls::server::ServerSessionMemoryCache::new(64) as Arc<dyn rustls::server::StoresServerSessions>;
    assert_eq!(resume_on_another_worker(own(), own()), (false, false), "0-RTT refused without a shared store");
}

#[test]
fn goaway_on_an_idle_connection_arrives_before_the_close() {
    let mut p = Pair::new(false);
    let first = p.get("/");
    p.watch(first);
    p.answer_until_fin(first, 204);
    // The client's (delayed) ACK of the answer reaches the server: its request is over.
    p.now += Duration::from_millis(100);
    p.client.handle_timeout(p.now);
    let _ = p.server.handle_timeouts(p.now);
    while p.pump() {}
    // Nothing open: the close follows the GOAWAY, which must not be lost with it (the client
    // may have requests on the way it must know were not processed).
    let now = p.now;
    p.conn().go_away(now);
    p.run_until(|p| p.lost.is_some());
    assert!(
        p.server_control().iter().any(|f| matches!(f, Frame::Goaway(_))),
        "GOAWAY before the close: {:?}",
        p.server_control()
    );
    match &p.lost {
        Some(ConnectionError::ApplicationClosed(close)) => assert_eq!(close.error_code, VarInt::from_u32(0x100)),
        other => panic!("closed with H3_NO_ERROR, not {other:?}"),
    }
}

#[test]
fn an_idle_connection_is_forgotten_after_the_idle_timeout() {
    // The client would wait 30 s (quinn's default); the server's 2 s is what counts.
    let limits =
        setup::Limits { max_field_section: 4096, idle_timeout: Duration::from_secs(2), ..setup::Limits::default() };
    let mut p = Pair::with_limits(false, None, limits);
    let id = p.get("/");
    p.watch(id);
    p.answer_until_fin(id, 204);
    let quiet_since = p.now;
    p.run_until(|p| p.server.is_empty());
    let idle = p.now - quiet_since;
    assert!(idle >= Duration::from_millis(1_900) && idle < Duration::from_secs(5), "forgotten after {idle:?}");
}

#[test]
fn a_head_late_past_the_header_timeout_is_reported_once() {
    let mut p = Pair::with_conn(ConnLimits { header_timeout: Duration::from_secs(1), ..CONN });
    // Ten bytes of a head, then nothing; a whole request beside it.
    let id = p.client.streams().open(Dir::Bi).expect("a stream");
    let mut block = Vec::new();
    Encoder.begin(&mut block);
    Encoder.field(b":method", b"GET", &mut block);
    Encoder.field(b":path", b"/a-long-enough-path", &mut block);
    let mut head = Vec::new();
    frame::write_header(frame::ty::HEADERS, block.len() as u64, &mut head);
    head.extend_from_slice(&block);
    p.client.send_stream(id).write(&head[..10]).expect("written");
    p.watch(id);
    let whole = p.get("/");
    let opened = p.now;
    let (mut late, mut requests) = (Vec::new(), 0);
    p.run_until(|p| {
        for (ch, event) in p.server_events() {
            match event {
                Event::HeadTimeout { stream } => {
                    late.push((stream, p.now - opened));
                    let conn = p.server.conn(ch).expect("connection");
                    conn.send_head(stream, 408, []).expect("open");
                    conn.finish(stream).expect("open");
                }
                Event::Request { stream, .. } => {
                    assert_eq!(stream, whole);
                    requests += 1;
                }
                _ => {}
            }
        }
        p.streams[&id].fin
    });
    assert_eq!(late.len(), 1, "one report, for the late head only: {late:?}");
    assert_eq!(late[0].0, id);
    assert!(late[0].1 >= Duration::from_secs(1) && late[0].1 < Duration::from_millis(1_500), "{late:?}");
    assert_eq!((requests, p.response(id).status()), (1, Some(&b"408"[..])));
}

#[test]
fn pings_do_not_keep_open_a_connection_with_no_request_stream() {
    let mut p = Pair::with_conn(ConnLimits { keepalive: Duration::from_secs(1), ..CONN });
    let id = p.get("/");
    p.watch(id);
    p.answer_until_fin(id, 204);
    let answered = p.now;
    // A PING every 100 ms: the QUIC connection is never idle.
    while p.lost.is_none() && p.now < answered + Duration::from_secs(4) {
        p.now += Duration::from_millis(100);
        p.client.ping();
        p.client.handle_timeout(p.now);
        let _ = p.server.handle_timeouts(p.now);
        while p.pump() {}
    }
    let after = p.now - answered;
    assert!(p.server_control().iter().any(|f| matches!(f, Frame::Goaway(4))), "{:?}", p.server_control());
    match &p.lost {
        Some(ConnectionError::ApplicationClosed(close)) => assert_eq!(close.error_code, VarInt::from_u32(0x100)),
        other => panic!("closed with H3_NO_ERROR, not {other:?}"),
    }
    assert!(after >= Duration::from_secs(1) && after < Duration::from_secs(3), "closed {after:?} after the answer");
}

#[test]
fn a_stream_the_client_stops_is_reset_and_its_credit_comes_back() {
    let limits = setup::Limits { max_field_section: 4096, max_streams: 2, ..setup::Limits::default() };
    let mut p = Pair::with_limits(false, None, limits);
    // Two answers that go on (event streams), both stopped by the client once their heads
    // are in.
    let ids = [p.get("/events"), p.get("/events")];
    for id in ids {
        p.watch(id);
    }
    let mut aborted = 0;
    p.run_until(|p| {
        for (ch, event) in p.server_events() {
            let conn = p.server.conn(ch).expect("connection");
            match event {
                Event::Request { stream, .. } => conn.send_head(stream, 200, []).expect("open"),
                Event::Aborted { .. } => aborted += 1,
                _ => {}
            }
        }
        ids.iter().all(|id| !p.streams[id].bytes.is_empty())
    });
    assert!(p.client.streams().open(Dir::Bi).is_none(), "the limit of 2 is reached");
    for id in ids {
        p.client.recv_stream(id).stop(VarInt::from_u32(Code::RequestCancelled.value() as u32)).expect("open");
        p.streams.remove(&id);
    }
    let mut third = None;
    p.run_until(|p| {
        for (_, event) in p.server_events() {
            if let Event::Aborted { .. } = event {
                aborted += 1;
            }
        }
        third = p.client.streams().open(Dir::Bi);
        third.is_some()
    });
    assert_eq!(aborted, 2, "each stopped stream is over for its producer");
}

#[test]
fn answers_before_address_validation_stay_within_three_times_what_arrived() {
    let mut p = Pair::with(false, true);
    // A session to resume, then a client whose datagrams reach the server while the
    // server's never come back: its address is never validated.
    let id = p.get("/");
    p.watch(id);
    p.answer_until_fin(id, 204);
    p.reconnect();
    assert!(p.client.has_0rtt(), "the client resumes with 0-RTT keys");
    // Requests that fill the first datagram and spill into a smaller second one.
    let path = format!("/{}", "e".repeat(300));
    for _ in 0..4 {
        p.get(&path);
    }
    let (mut received, mut sent, mut new) = (0, 0, None);
    let mut buf = Vec::new();
    while let Some(t) = p.client.poll_transmit(p.now, 1, &mut buf) {
        received += t.size;
        let mut answers = Vec::new();
        let datagram = BytesMut::from(&buf[..t.size]);
        new = new.or(p.server.handle_datagram(p.now, addr(CLIENT), None, None, datagram, &mut answers));
        sent += answers.iter().map(|a| a.transmit.size).sum::<usize>();
        buf.clear();
    }
    let new = new.expect("a new connection");
    // Every early GET is answered with 2 000 bytes; the server's loss timers fire as they will.
    let body = Bytes::from(vec![b'x'; 2000]);
    let end = p.now + Duration::from_secs(20);
    while p.now < end {
        let Some(conn) = p.server.conn(new) else { break };
        while let Some(event) = conn.poll_event() {
            if let Event::Request { stream, .. } = event {
                conn.send_head(stream, 200, []).expect("open");
                conn.send_data(stream, body.clone()).expect("open");
                conn.finish(stream).expect("open");
            }
        }
        while let Some(out) = p.server.poll_transmit(p.now, new, 10) {
            sent += out.transmit.size;
        }
        let Some(next) = p.server.conn(new).and_then(H3Conn::poll_timeout) else { break };
        p.now = p.now.max(next);
        let _ = p.server.handle_timeouts(p.now);
    }
    eprintln!("{sent} bytes for {received}: {:.2}x", sent as f64 / received as f64);
    assert!(sent > 0 && sent <= 3 * received, "{sent} bytes for {received}: {:.2}x", sent as f64 / received as f64);
}

#[test]
fn a_certificate_larger_than_the_first_flight_does_not_wait_for_loss_timers() {
    // The client's Handshake packets validate its address as they do quinn's: the rest of a
    // long chain goes out on their arrival, not after loss timers.
    let names: Vec<String> =
        std::iter::once("localhost".to_string()).chain((0..400).map(|i| format!("host-{i}.example.org"))).collect();
    let cert = certificate_for(names);
    assert!(cert.1.len() > 8_000, "a certificate of {} bytes", cert.1.len());
    let limits = setup::Limits { max_field_section: 4096, ..setup::Limits::default() };
    let start = Instant::now();
    let p = Pair::with_certificate(false, None, limits, CONN, cert);
    let took = p.now - start;
    assert!(took < Duration::from_millis(200), "the handshake took {took:?} of loss timers");
}

#[test]
fn a_handshake_not_done_within_the_header_timeout_is_closed() {
    let mut p = Pair::with_conn(ConnLimits { header_timeout: Duration::from_secs(1), ..CONN });
    // A second client whose first flight arrives and which never answers.
    p.reconnect();
    let (start, mut buf, mut new) = (p.now, Vec::new(), None);
    while let Some(t) = p.client.poll_transmit(p.now, 1, &mut buf) {
        let datagram = BytesMut::from(&buf[..t.size]);
        new = new.or(p.server.handle_datagram(p.now, addr(CLIENT), None, None, datagram, &mut Vec::new()));
        buf.clear();
    }
    let new = new.expect("a new connection");
    while p.server.conn(new).is_some_and(|c| !c.quic().is_closed()) && p.now < start + Duration::from_secs(60) {
        while p.server.poll_transmit(p.now, new, 10).is_some() {}
        let Some(next) = p.server.conn(new).and_then(H3Conn::poll_timeout) else { break };
        p.now = p.now.max(next);
        let _ = p.server.handle_timeouts(p.now);
    }
    let took = p.now - start;
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(2), "closed after {took:?}");
}

/// The payload of the first HEADERS frame of a response stream's bytes.
fn first_field_section(bytes: &[u8]) -> Vec<u8> {
    let mut reader = FrameReader::new(1 << 20);
    match reader.next(bytes).expect("valid frames") {
        (at, Some(Frame::Headers { len })) => bytes[at..at + len].to_vec(),
        other => panic!("{other:?}: no HEADERS first"),
    }
}

/// Answers GET `path` with the fixed fields of an API response and a fresh request id; the
/// response's stream.
fn get_answered(p: &mut Pair, path: &str, request_id: &str) -> StreamId {
    let id = p.get(path);
    p.watch(id);
    p.run_until(|p| {
        for (ch, event) in p.server_events() {
            if let Event::Request { stream, .. } = event {
                let fields: [(&[u8], &[u8]); 5] = [
                    (b"content-type", b"application/json"),
                    (b"server", b"forkd"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"strict-origin-when-cross-origin"),
                    (b"x-request-id", request_id.as_bytes()),
                ];
                let conn = p.server.conn(ch).expect("connection");
                conn.send_head(stream, 200, fields).expect("open");
                conn.finish(stream).expect("open");
            }
        }
        p.streams[&id].fin
    });
    id
}

#[test]
fn a_client_without_a_dynamic_table_gets_no_encoder_stream_and_static_sections() {
    let mut p = Pair::new(false);
    for (i, path) in ["/a", "/b", "/c"].into_iter().enumerate() {
        let id = get_answered(&mut p, path, &format!("id-{i}"));
        let section = first_field_section(&p.streams[&id].bytes);
        assert_eq!(section[..2], [0, 0], "Required Insert Count 0, Base 0");
        assert_eq!(p.response(id).status(), Some(&b"200"[..]));
    }
    assert_eq!(p.server_uni_types(), [0x00], "the control stream only");
    assert_eq!((p.conn().qpack().capacity(), p.conn().qpack().inserted()), (0, 0));
}

#[test]
fn a_client_with_a_dynamic_table_gets_the_fixed_fields_as_references_once_acknowledged() {
    let mut p = Pair::with_qpack(16_384);
    let mut table = qpack::decoder::TableDecoder::new(16_384);
    // The first answer inserts the fixed fields and the request id's name (not its value)
    // and carries them as literals: it decodes without the table.
    let first = get_answered(&mut p, "/1", "id-1");
    p.run_until(|p| p.server_uni(0x02).is_some_and(|b| !b.is_empty()));
    assert_eq!(p.server_uni_types(), [0x00, 0x02], "control and QPACK encoder streams");
    let instructions = p.server_uni(0x02).expect("encoder stream").to_vec();
    assert_eq!(&instructions[..3], [0x3f, 0xe1, 0x1f], "Set Dynamic Table Capacity 4096 (our bound) first");
    assert_eq!(table.on_encoder_stream(&instructions), Ok(instructions.len()));
    assert_eq!(table.inserted(), 4, "server, x-frame-options, referrer-policy (content-type is static), x-request-id");
    assert_eq!(table.get(3), Some((&b"x-request-id"[..], &b""[..])), "the name, no value");
    let before = first_field_section(&p.streams[&first].bytes);
    assert_eq!(before[..2], [0, 0]);
    // The client's decoder stream acknowledges the insertions.
    let decoder = p.client.streams().open(Dir::Uni).expect("a uni stream");
    let mut out = vec![0x03];
    table.increment(&mut out);
    p.client.send_stream(decoder).write(&out).expect("written");
    p.run_until(|p| p.conn().qpack().acknowledged() == 4);
    // From then on the fixed fields are one byte each; the request id is a literal value
    // after its entry's name.
    let second = get_answered(&mut p, "/2", "id-2");
    let after = first_field_section(&p.streams[&second].bytes);
    let mut fields = Fields::default();
    let required = table.decode(&after, 4096, &mut fields).expect("decodes with the table");
    assert_eq!(required, 4);
    let got: Vec<(&[u8], &[u8])> = fields.iter().collect();
    assert_eq!(
        got,
        [
            (&b":status"[..], &b"200"[..]),
            (b"content-type", b"application/json"),
            (b"server", b"forkd"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"strict-origin-when-cross-origin"),
            (b"x-request-id", b"id-2"),
        ]
    );
    assert!(after.len() + 30 < before.len(), "{} bytes with the table, {} without", after.len(), before.len());
    // Its Section Acknowledgment is taken; a second one for the same stream is a
    // QPACK_DECODER_STREAM_ERROR that closes the connection.
    let mut ack = Vec::new();
    table.acknowledge(VarInt::from(second).into_inner(), required, &mut ack);
    p.client.send_stream(decoder).write(&ack).expect("written");
    let third = get_answered(&mut p, "/3", "id-3");
    assert!(p.lost.is_none(), "{:?}", p.lost);
    assert_ne!(first_field_section(&p.streams[&third].bytes)[0], 0, "it references the table");
    p.client.send_stream(decoder).write(&ack).expect("written");
    p.run_until(|p| p.lost.is_some());
    match &p.lost {
        Some(ConnectionError::ApplicationClosed(close)) => {
            assert_eq!(close.error_code, VarInt::from_u64(Code::QpackDecoderStreamError.value()).expect("fits"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_client_that_stops_our_encoder_stream_closes_the_connection() {
    let mut p = Pair::with_qpack(4096);
    let _ = get_answered(&mut p, "/1", "id-1");
    p.run_until(|p| p.server_uni(0x02).is_some());
    let encoder = p.streams.iter().find(|(id, r)| id.dir() == Dir::Uni && r.bytes.first() == Some(&0x02));
    let encoder = *encoder.expect("the encoder stream").0;
    p.client.recv_stream(encoder).stop(VarInt::from_u32(0x100)).expect("stopped");
    p.run_until(|p| p.lost.is_some());
    match &p.lost {
        Some(ConnectionError::ApplicationClosed(close)) => {
            assert_eq!(close.error_code, VarInt::from_u64(Code::ClosedCriticalStream.value()).expect("fits"))
        }
        other => panic!("{other:?}"),
    }
}
