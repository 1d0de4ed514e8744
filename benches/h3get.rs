//! `h3get`: a small HTTP/3 load client for measuring forkd (`bin/h3bench`), release-built
//! (`cargo build --release --example h3get`). quinn-proto on one non-blocking UDP socket
//! (GSO sends and GRO receives through `forkd::sys::udp`), frames and QPACK from
//! `forkd::http3`; one thread, `-c` connections, `-m` requests in flight on each, `-n`
//! requests in all. It does not verify the server's certificate (a measuring tool only).
//!
//! ```text
//! h3get [-n N] [-c C] [-m M] [--hold SECS] [--qpack BYTES] ADDR PATH
//! h3get -d SECS [-c C] [-m M] [--timeout SECS] ADDR PATH
//! ```
//!
//! Prints one line: requests, errors, seconds, requests/s, body bytes/s, and the mean size of
//! a response's field section (`head bytes/response`). `--hold SECS`: after the requests,
//! keeps the connections open and idle for SECS (prints `holding C` first), for measuring
//! the server's memory per idle connection. `--qpack BYTES`: advertises a QPACK dynamic
//! table of BYTES (default 0: none), applies the server's encoder stream and acknowledges on
//! a decoder stream of its own, as a browser does (`forkd::http3::qpack::decoder`).
//!
//! `-d SECS` (`bin/drain-test --proto h3`): a load for SECS that survives servers draining
//! their connections, counted like `bin/h2load-retry` counts HTTP/2 (RFC 9114 §5.2, §4.1.1).
//! `-c` connection slots, each keeping `-m` requests in flight. A request is *retried*, not
//! failed, iff the server marked it unprocessed: its stream ID is at or above the ID of a
//! GOAWAY on its connection, or the stream was reset with `H3_REQUEST_REJECTED`. A
//! connection that received a GOAWAY opens no new stream; its slot opens a new connection at
//! once, and the old one is closed (`H3_NO_ERROR`) once its remaining requests are
//! answered. Everything else is a *failure*: a stream reset with another code (`reset`), a
//! connection lost with a request in flight below its GOAWAY's ID or with no GOAWAY at all
//! (`cut`), a non-2xx status (`non2xx`), no answer within `--timeout` (default 10 s) or still
//! none `--timeout` after the load stopped (`timeout`). Also counted, not failures by
//! themselves: `abrupt` (connections the server closed with nothing in flight but without a
//! GOAWAY or with an error code: a client that had just sent a request would have lost it),
//! `refused` (handshakes that failed, got no answer within `--timeout`, or were still waiting
//! for one after a second when the load stopped: e.g. after SIGTERM closed the port), `goaways`, `conns` (connections opened) and `hs_max_ms` (the slowest
//! handshake). The last line is one JSON object with every counter and the first failures.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use forkd::http3::frame::{self, Frame, FrameReader};
use forkd::http3::qpack::decoder::TableDecoder;
use forkd::http3::qpack::{Encoder, Fields};
use forkd::sys::udp;
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig, Event, ReadError,
    StreamEvent, StreamId, TransportConfig, VarInt,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Accepts any certificate (the tool measures; it does not authenticate).
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Handshakes in progress at most (more at once time out on a busy machine).
const HANDSHAKES: usize = 32;

struct Args {
    n: u64,
    c: usize,
    m: usize,
    hold: Option<Duration>,
    /// `-d`: run for this long, with the retry rules (see the module doc).
    duration: Option<Duration>,
    timeout: Duration,
    /// `--qpack`: the dynamic table capacity advertised.
    qpack: u64,
    addr: SocketAddr,
    path: String,
}

fn usage() -> ! {
    eprintln!("usage: h3get [-n N] [-c C] [-m M] [--hold SECS] [--qpack BYTES] ADDR PATH");
    eprintln!("       h3get -d SECS [-c C] [-m M] [--timeout SECS] ADDR PATH");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        n: 1,
        c: 1,
        m: 1,
        hold: None,
        duration: None,
        timeout: Duration::from_secs(10),
        qpack: 0,
        addr: "127.0.0.1:8443".parse().unwrap_or_else(|_| usage()),
        path: String::new(),
    };
    let mut rest = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = || it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| usage());
        match arg.as_str() {
            "-n" => a.n = num(),
            "-c" => a.c = num().max(1) as usize,
            "-m" => a.m = num().max(1) as usize,
            "--hold" => a.hold = Some(Duration::from_secs(num())),
            "-d" => a.duration = Some(Duration::from_secs(num())),
            "--timeout" => a.timeout = Duration::from_secs(num().max(1)),
            "--qpack" => a.qpack = num(),
            _ => rest.push(arg),
        }
    }
    let [addr, path] = rest.as_slice() else { usage() };
    a.addr = addr.parse().unwrap_or_else(|_| usage());
    a.path = path.clone();
    a
}

/// One connection's state.
struct Conn {
    quic: Connection,
    control: bool,
    /// Request streams open: the first bytes (for the status), bytes received.
    open: HashMap<StreamId, (Vec<u8>, u64)>,
    started: u64,
    /// The decoder side of the server's QPACK dynamic table (capacity 0: none).
    table: TableDecoder,
    /// Our QPACK decoder stream (with `--qpack`).
    decoder: Option<StreamId>,
    /// The server's unidirectional streams: bytes not yet consumed (after the type).
    uni: HashMap<StreamId, Vec<u8>>,
}

#[derive(Default)]
struct Totals {
    done: u64,
    errors: u64,
    body: u64,
    /// Field-section bytes of the responses counted in `done`.
    head: u64,
}

/// The settings a client's control stream sends: with a QPACK dynamic table of `qpack` bytes.
fn control_stream(qpack: u64) -> Vec<u8> {
    let mut s = vec![0x00];
    let mut settings = vec![(frame::setting::MAX_FIELD_SECTION_SIZE, 65_536)];
    if qpack > 0 {
        settings.push((frame::setting::QPACK_MAX_TABLE_CAPACITY, qpack));
    }
    frame::write_settings(&settings, &mut s);
    s
}

/// New bytes of one of the server's unidirectional streams: the encoder stream's
/// instructions go into the table, and the insertions are acknowledged at once.
fn server_uni(conn: &mut Conn, id: StreamId, bytes: &[u8]) {
    let buf = conn.uni.entry(id).or_default();
    buf.extend_from_slice(bytes);
    match buf.first() {
        Some(0x02) => {
            let used = conn.table.on_encoder_stream(&buf[1..]).unwrap_or_else(|e| panic!("encoder stream: {e:?}"));
            buf.drain(1..1 + used);
            let mut ack = Vec::new();
            conn.table.increment(&mut ack);
            send_decoder(conn, &ack);
        }
        // The control stream, or another: only its type is kept.
        Some(_) => buf.truncate(1),
        None => {}
    }
}

/// Writes `bytes` on our QPACK decoder stream.
fn send_decoder(conn: &mut Conn, bytes: &[u8]) {
    if let (Some(id), false) = (conn.decoder, bytes.is_empty()) {
        let _ = conn.quic.send_stream(id).write(bytes);
    }
}

fn client_config() -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap_or_else(|e| panic!("TLS 1.3: {e}"))
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let mut config =
        ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap_or_else(|e| panic!("QUIC client: {e}"))));
    let mut transport = TransportConfig::default();
    transport.stream_receive_window(VarInt::from_u32(16 << 20));
    transport.receive_window(VarInt::from_u32(32 << 20));
    transport.keep_alive_interval(Some(Duration::from_secs(5)));
    config.transport_config(Arc::new(transport));
    config
}

fn request(path: &str) -> Vec<u8> {
    let mut block = Vec::new();
    Encoder.begin(&mut block);
    for (n, v) in [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)] {
        Encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
    }
    let mut out = Vec::new();
    frame::write_header(frame::ty::HEADERS, block.len() as u64, &mut out);
    out.extend_from_slice(&block);
    out
}

/// The `:status` of a response stream's first bytes (0 if they hold no whole HEADERS frame).
fn status(bytes: &[u8]) -> u16 {
    head(bytes, &TableDecoder::new(0)).0
}

/// The `:status`, the Required Insert Count and the field section's length of a response
/// stream's first bytes, decoded with `table` (status 0 if they hold no whole HEADERS frame).
fn head(bytes: &[u8], table: &TableDecoder) -> (u16, u64, usize) {
    let mut reader = FrameReader::new(1 << 20);
    let Ok((used, Some(Frame::Headers { len }))) = reader.next(bytes) else { return (0, 0, 0) };
    let Some(block) = bytes.get(used..used + len) else { return (0, 0, 0) };
    let mut fields = Fields::default();
    let Ok(required) = table.decode(block, 1 << 20, &mut fields) else { return (0, 0, len) };
    let status = fields
        .iter()
        .find(|(n, _)| *n == b":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0);
    (status, required, len)
}

/// A non-blocking client UDP socket for `server`'s family, with large buffers and GRO.
fn client_socket(server: SocketAddr) -> UdpSocket {
    let sock =
        UdpSocket::bind(if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).unwrap_or_else(|e| panic!("bind: {e}"));
    sock.set_nonblocking(true).unwrap_or_else(|e| panic!("nonblocking: {e}"));
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &(8 << 20));
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::SndBuf, &(4 << 20));
    udp::enable_gro(&sock);
    sock
}

/// Reads what the socket has (512 receives at most): each datagram through the endpoint,
/// its connection's events to `deliver`, the endpoint's own answers sent at once.
fn receive(
    ep: &mut Endpoint,
    sock: &UdpSocket,
    receiver: &mut udp::Receiver,
    buf: &mut [u8],
    now: Instant,
    mut deliver: impl FnMut(ConnectionHandle, quinn_proto::ConnectionEvent),
) {
    for _ in 0..512 {
        match receiver.recv(sock, buf) {
            Ok(got) => {
                for datagram in buf[..got.len].chunks(got.segment_size.max(1)) {
                    let mut answer = Vec::new();
                    match ep.handle(now, got.from, None, None, BytesMut::from(datagram), &mut answer) {
                        Some(DatagramEvent::ConnectionEvent(ch, event)) => deliver(ch, event),
                        Some(DatagramEvent::Response(t)) => {
                            let _ = sock.send_to(&answer[..t.size], t.destination);
                        }
                        _ => {}
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(_) => {}
        }
    }
}

/// Runs `quic`'s timer when due and passes its endpoint events both ways.
fn turn(ep: &mut Endpoint, ch: ConnectionHandle, quic: &mut Connection, now: Instant) {
    if quic.poll_timeout().is_some_and(|t| t <= now) {
        quic.handle_timeout(now);
    }
    while let Some(event) = quic.poll_endpoint_events() {
        if let Some(back) = ep.handle_event(ch, event) {
            quic.handle_event(back);
        }
    }
}

fn main() {
    let args = args();
    if let Some(duration) = args.duration {
        drain::run(&args, duration);
        return;
    }
    let sock = client_socket(args.addr);
    let mut receiver = udp::Receiver::new();
    let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
    let config = client_config();
    let mut conns: HashMap<ConnectionHandle, Conn> = HashMap::new();
    // Connections still to open: at most HANDSHAKES handshake at a time.
    let mut to_open = args.c;
    let req = request(&args.path);
    let per_conn = args.n.div_ceil(args.c as u64);
    let mut poll = mio::Poll::new().unwrap_or_else(|e| panic!("poll: {e}"));
    let fd = sock.as_raw_fd();
    poll.registry()
        .register(&mut mio::unix::SourceFd(&fd), mio::Token(0), mio::Interest::READABLE)
        .unwrap_or_else(|e| panic!("register: {e}"));
    let mut events = mio::Events::with_capacity(4);
    let mut buf = vec![0u8; 65_536];
    let mut out = Vec::new();
    let mut totals = Totals::default();
    let mut start: Option<Instant> = None;
    let mut finished: Option<Instant> = None;
    let mut hold_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let handshaking = conns.values().filter(|c| c.quic.is_handshaking()).count();
        for _ in handshaking..HANDSHAKES {
            if to_open == 0 {
                break;
            }
            to_open -= 1;
            let (ch, quic) =
                ep.connect(now, config.clone(), args.addr, "localhost").unwrap_or_else(|e| panic!("connect: {e}"));
            let table = TableDecoder::new(args.qpack);
            let conn = Conn {
                quic,
                control: false,
                open: HashMap::new(),
                started: 0,
                table,
                decoder: None,
                uni: HashMap::new(),
            };
            conns.insert(ch, conn);
        }
        // Requests and sends.
        for conn in conns.values_mut() {
            if conn.quic.is_handshaking() || conn.quic.is_closed() {
                continue;
            }
            if !conn.control {
                if let Some(id) = conn.quic.streams().open(Dir::Uni) {
                    let _ = conn.quic.send_stream(id).write(&control_stream(args.qpack));
                    conn.control = true;
                }
            }
            if args.qpack > 0 && conn.decoder.is_none() {
                if let Some(id) = conn.quic.streams().open(Dir::Uni) {
                    let _ = conn.quic.send_stream(id).write(&[0x03]);
                    conn.decoder = Some(id);
                }
            }
            while conn.open.len() < args.m && conn.started < per_conn {
                let Some(id) = conn.quic.streams().open(Dir::Bi) else { break };
                start.get_or_insert(now);
                let _ = conn.quic.send_stream(id).write(&req);
                let _ = conn.quic.send_stream(id).finish();
                conn.open.insert(id, (Vec::new(), 0));
                conn.started += 1;
            }
        }
        for conn in conns.values_mut() {
            while let Some(t) = conn.quic.poll_transmit(now, 10, &mut out) {
                let _ = udp::send_segments(&sock, t.destination, &out[..t.size], t.segment_size.unwrap_or(t.size));
                out.clear();
            }
        }
        let all_done = to_open == 0
            && (totals.done + totals.errors >= per_conn * args.c as u64 || conns.values().all(|c| c.quic.is_closed()));
        if all_done && finished.is_none() {
            finished = Some(now);
            match args.hold {
                Some(hold) => {
                    let open = conns.values().filter(|c| !c.quic.is_closed()).count();
                    println!("holding {open}");
                    let _ = std::io::stdout().flush();
                    hold_until = Some(now + hold);
                }
                None => break,
            }
        }
        if hold_until.is_some_and(|t| t <= now) {
            break;
        }
        // Wait for datagrams or the next timer.
        let timer = conns.values_mut().filter_map(|c| c.quic.poll_timeout()).min();
        let until = [timer, hold_until, Some(now + Duration::from_millis(100))].into_iter().flatten().min();
        let wait = until.map_or(Duration::from_millis(100), |t| t.saturating_duration_since(now));
        let _ = poll.poll(&mut events, Some(wait));
        let now = Instant::now();
        receive(&mut ep, &sock, &mut receiver, &mut buf, now, |ch, event| {
            if let Some(c) = conns.get_mut(&ch) {
                c.quic.handle_event(event);
            }
        });
        for (ch, conn) in conns.iter_mut() {
            turn(&mut ep, *ch, &mut conn.quic, now);
            let mut readable = Vec::new();
            while let Some(event) = conn.quic.poll() {
                match event {
                    Event::Stream(StreamEvent::Readable { id }) => readable.push(id),
                    Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                        while let Some(id) = conn.quic.streams().accept(Dir::Uni) {
                            readable.push(id);
                        }
                    }
                    // A connection the server ends after its last answer (an idle one held by
                    // `--hold`) lost nothing.
                    Event::ConnectionLost { reason } if !conn.open.is_empty() || conn.started < per_conn => {
                        eprintln!("connection lost: {reason}");
                        totals.errors += conn.open.len() as u64 + (per_conn - conn.started);
                        conn.open.clear();
                        conn.started = per_conn;
                    }
                    _ => {}
                }
            }
            for id in readable {
                let mut recv = conn.quic.recv_stream(id);
                let Ok(mut chunks) = recv.read(true) else { continue };
                let mut fin = false;
                let mut uni = Vec::new();
                loop {
                    match chunks.next(usize::MAX) {
                        Ok(Some(chunk)) if id.dir() == Dir::Uni => uni.extend_from_slice(&chunk.bytes),
                        Ok(Some(chunk)) => {
                            if let Some((head, n)) = conn.open.get_mut(&id) {
                                if head.len() < 4096 {
                                    head.extend_from_slice(&chunk.bytes[..chunk.bytes.len().min(4096)]);
                                }
                                *n += chunk.bytes.len() as u64;
                            }
                        }
                        Ok(None) => {
                            fin = true;
                            break;
                        }
                        Err(ReadError::Blocked) => break,
                        Err(ReadError::Reset(_)) => {
                            fin = true;
                            break;
                        }
                    }
                }
                let _ = chunks.finalize();
                if !uni.is_empty() {
                    server_uni(conn, id, &uni);
                }
                if fin {
                    if let Some((bytes, n)) = conn.open.remove(&id) {
                        let (status, required, len) = head(&bytes, &conn.table);
                        let mut ack = Vec::new();
                        conn.table.acknowledge(VarInt::from(id).into_inner(), required, &mut ack);
                        send_decoder(conn, &ack);
                        if status == 200 {
                            totals.done += 1;
                            totals.body += n;
                            totals.head += len as u64;
                        } else {
                            totals.errors += 1;
                        }
                    }
                }
            }
        }
    }
    let secs = match (start, finished) {
        (Some(s), Some(f)) => f.duration_since(s).as_secs_f64().max(1e-9),
        _ => 0.0,
    };
    println!(
        "requests {} errors {} seconds {:.3} req/s {:.0} bytes/s {:.0} ({:.1} MiB/s) head bytes/response {:.1}",
        totals.done,
        totals.errors,
        secs,
        totals.done as f64 / secs,
        totals.body as f64 / secs,
        totals.body as f64 / secs / (1 << 20) as f64,
        totals.head as f64 / totals.done.max(1) as f64
    );
    for (_, conn) in conns.iter_mut() {
        conn.quic.close(Instant::now(), VarInt::from_u32(0x100), bytes::Bytes::new());
        while let Some(t) = conn.quic.poll_transmit(Instant::now(), 1, &mut out) {
            let _ = sock.send_to(&out[..t.size], t.destination);
            out.clear();
        }
    }
    if totals.errors > 0 {
        std::process::exit(1);
    }
}

/// `-d`: a load for a duration that survives draining servers, with the retry rules of the
/// module doc.
mod drain {
    use std::collections::BTreeMap;

    use quinn_proto::ConnectionError;

    use super::*;

    const H3_NO_ERROR: u64 = 0x100;
    const H3_REQUEST_REJECTED: u64 = 0x10b;
    /// Failures described in the JSON line at most.
    const FIRST_FAILURES: usize = 10;

    /// A request in flight: its stream, when it was sent, its first bytes (for the status).
    struct Req {
        id: StreamId,
        sent: Instant,
        head: Vec<u8>,
    }

    /// One connection of the load.
    struct Conn {
        quic: Connection,
        opened: Instant,
        /// The handshake completed.
        up: bool,
        control: bool,
        /// Requests in flight by raw stream ID (the number a GOAWAY carries).
        inflight: BTreeMap<u64, Req>,
        /// The server's unidirectional streams (its control stream carries GOAWAY).
        uni: HashMap<StreamId, Vec<u8>>,
        goaway: Option<u64>,
        /// Its slot moved on (GOAWAY, loss, a timeout): no new request on it.
        retired: bool,
        /// Closed by the load (its loss is then not counted).
        closed: bool,
    }

    #[derive(Default)]
    struct Counts {
        ok: u64,
        failed: u64,
        retried: u64,
        goaways: u64,
        conns: u64,
        reset: u64,
        cut: u64,
        non2xx: u64,
        timeout: u64,
        abrupt: u64,
        refused: u64,
        hs_max: Duration,
        first: Vec<String>,
    }

    impl Counts {
        fn fail(&mut self, t0: Instant, what: String) {
            self.failed += 1;
            if self.first.len() < FIRST_FAILURES {
                self.first.push(format!("+{:.3}s {what}", t0.elapsed().as_secs_f64()));
            }
        }
    }

    fn raw(id: StreamId) -> u64 {
        VarInt::from(id).into_inner()
    }

    /// The connection was lost: what was in flight from its GOAWAY's ID on is retried, the
    /// rest was cut; with nothing cut, a close without GOAWAY or with an error is abrupt.
    fn lost(conn: &mut Conn, why: &ConnectionError, n: &mut Counts, t0: Instant) {
        conn.retired = true;
        if conn.closed {
            return;
        }
        conn.closed = true;
        if !conn.up {
            n.refused += 1;
            return;
        }
        let mut cut = Vec::new();
        for (r, _) in std::mem::take(&mut conn.inflight) {
            if conn.goaway.is_some_and(|limit| r >= limit) {
                n.retried += 1;
            } else {
                cut.push(r);
            }
        }
        n.cut += cut.len() as u64;
        if !cut.is_empty() {
            n.failed += cut.len() as u64 - 1;
            n.fail(t0, format!("connection lost ({why}) with stream(s) {cut:?} in flight (GOAWAY {:?})", conn.goaway));
            return;
        }
        let clean = matches!(why, ConnectionError::ApplicationClosed(c) if c.error_code.into_inner() == H3_NO_ERROR);
        if conn.goaway.is_none() || !clean {
            n.abrupt += 1;
        }
    }

    /// New bytes on one of the server's unidirectional streams: a GOAWAY on its control
    /// stream retires the connection; the requests from its ID on are retried.
    fn uni_bytes(conn: &mut Conn, id: StreamId, bytes: &[u8], n: &mut Counts) {
        let buf = conn.uni.entry(id).or_default();
        buf.extend_from_slice(bytes);
        if buf.first() != Some(&0x00) {
            return;
        }
        let mut reader = FrameReader::new(0);
        let mut at = 1;
        let mut limit = None;
        while let Ok((used, Some(f))) = reader.next(&buf[at..]) {
            at += used;
            if let Frame::Goaway(g) = f {
                limit = Some(limit.map_or(g, |l: u64| l.min(g)));
            }
        }
        let Some(limit) = limit else { return };
        if conn.goaway.is_none() {
            n.goaways += 1;
        }
        let limit = conn.goaway.map_or(limit, |g| g.min(limit));
        conn.goaway = Some(limit);
        conn.retired = true;
        let above: Vec<u64> = conn.inflight.range(limit..).map(|(r, _)| *r).collect();
        for r in above {
            conn.inflight.remove(&r);
            n.retried += 1;
        }
    }

    pub(super) fn run(args: &Args, duration: Duration) {
        let sock = client_socket(args.addr);
        let mut receiver = udp::Receiver::new();
        let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
        let config = client_config();
        let req = request(&args.path);
        let mut poll = mio::Poll::new().unwrap_or_else(|e| panic!("poll: {e}"));
        let fd = sock.as_raw_fd();
        poll.registry()
            .register(&mut mio::unix::SourceFd(&fd), mio::Token(0), mio::Interest::READABLE)
            .unwrap_or_else(|e| panic!("register: {e}"));
        let mut events = mio::Events::with_capacity(4);
        let mut buf = vec![0u8; 65_536];
        let mut out = Vec::new();
        let mut conns: HashMap<ConnectionHandle, Conn> = HashMap::new();
        let mut n = Counts::default();
        let t0 = Instant::now();
        let stop_at = t0 + duration;
        let give_up = stop_at + args.timeout;
        let ended;
        loop {
            let now = Instant::now();
            let stopping = now >= stop_at;
            // Slots: a connection that is not retired holds one; the others open at once.
            let active = conns.values().filter(|c| !c.retired).count();
            let mut handshaking = conns.values().filter(|c| !c.up && !c.closed).count();
            if !stopping {
                for _ in active..args.c {
                    if handshaking >= HANDSHAKES {
                        break;
                    }
                    handshaking += 1;
                    let (ch, quic) = ep
                        .connect(now, config.clone(), args.addr, "localhost")
                        .unwrap_or_else(|e| panic!("connect: {e}"));
                    n.conns += 1;
                    conns.insert(
                        ch,
                        Conn {
                            quic,
                            opened: now,
                            up: false,
                            control: false,
                            inflight: BTreeMap::new(),
                            uni: HashMap::new(),
                            goaway: None,
                            retired: false,
                            closed: false,
                        },
                    );
                }
            }
            for conn in conns.values_mut() {
                if conn.closed {
                    continue;
                }
                if !conn.up {
                    let waited = now.duration_since(conn.opened);
                    if waited > args.timeout || stopping {
                        // No handshake in time (or the load ends, after a second of waiting):
                        // refused, not failed.
                        if !stopping || waited > Duration::from_secs(1) {
                            n.refused += 1;
                        }
                        conn.quic.close(now, VarInt::from_u32(H3_NO_ERROR as u32), bytes::Bytes::new());
                        conn.closed = true;
                        conn.retired = true;
                    }
                    continue;
                }
                if !conn.control {
                    if let Some(id) = conn.quic.streams().open(Dir::Uni) {
                        let mut s = vec![0x00];
                        frame::write_settings(&[(frame::setting::MAX_FIELD_SECTION_SIZE, 65_536)], &mut s);
                        let _ = conn.quic.send_stream(id).write(&s);
                        conn.control = true;
                    }
                }
                let late: Vec<u64> = conn
                    .inflight
                    .iter()
                    .filter(|(_, r)| now.duration_since(r.sent) > args.timeout)
                    .map(|(r, _)| *r)
                    .collect();
                for r in late {
                    conn.inflight.remove(&r);
                    n.timeout += 1;
                    n.fail(t0, format!("stream {r}: no answer within {:?}", args.timeout));
                    conn.retired = true;
                }
                while !conn.retired && !stopping && conn.inflight.len() < args.m {
                    let Some(id) = conn.quic.streams().open(Dir::Bi) else { break };
                    let _ = conn.quic.send_stream(id).write(&req);
                    let _ = conn.quic.send_stream(id).finish();
                    conn.inflight.insert(raw(id), Req { id, sent: now, head: Vec::new() });
                }
                if (conn.retired || stopping) && conn.inflight.is_empty() {
                    conn.quic.close(now, VarInt::from_u32(H3_NO_ERROR as u32), bytes::Bytes::new());
                    conn.closed = true;
                    conn.retired = true;
                }
            }
            for conn in conns.values_mut() {
                while let Some(t) = conn.quic.poll_transmit(now, 10, &mut out) {
                    let _ = udp::send_segments(&sock, t.destination, &out[..t.size], t.segment_size.unwrap_or(t.size));
                    out.clear();
                }
            }
            let open = conns.values().map(|c| c.inflight.len()).sum::<usize>();
            if stopping && (open == 0 || now >= give_up) {
                ended = now.min(stop_at);
                for conn in conns.values_mut() {
                    for (r, _) in std::mem::take(&mut conn.inflight) {
                        n.timeout += 1;
                        n.fail(t0, format!("stream {r}: no answer {:?} after the load stopped", args.timeout));
                    }
                }
                break;
            }
            let timer = conns.values_mut().filter_map(|c| c.quic.poll_timeout()).min();
            let until = [timer, Some(now + Duration::from_millis(20))].into_iter().flatten().min();
            let wait = until.map_or(Duration::from_millis(20), |t| t.saturating_duration_since(now));
            let _ = poll.poll(&mut events, Some(wait));
            let now = Instant::now();
            receive(&mut ep, &sock, &mut receiver, &mut buf, now, |ch, event| {
                if let Some(c) = conns.get_mut(&ch) {
                    c.quic.handle_event(event);
                }
            });
            for (ch, conn) in conns.iter_mut() {
                turn(&mut ep, *ch, &mut conn.quic, now);
                let mut readable = Vec::new();
                while let Some(event) = conn.quic.poll() {
                    match event {
                        Event::Connected => {
                            conn.up = true;
                            n.hs_max = n.hs_max.max(now.duration_since(conn.opened));
                        }
                        Event::Stream(StreamEvent::Readable { id }) => readable.push(id),
                        Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                            while let Some(id) = conn.quic.streams().accept(Dir::Uni) {
                                readable.push(id);
                            }
                        }
                        Event::ConnectionLost { reason } => lost(conn, &reason, &mut n, t0),
                        _ => {}
                    }
                }
                for id in readable {
                    let mut recv = conn.quic.recv_stream(id);
                    let Ok(mut chunks) = recv.read(true) else { continue };
                    let mut bytes = Vec::new();
                    let mut fin = false;
                    let mut reset = None;
                    loop {
                        match chunks.next(usize::MAX) {
                            Ok(Some(chunk)) => {
                                if bytes.len() < 4096 {
                                    bytes.extend_from_slice(&chunk.bytes[..chunk.bytes.len().min(4096)]);
                                }
                            }
                            Ok(None) => {
                                fin = true;
                                break;
                            }
                            Err(ReadError::Blocked) => break,
                            Err(ReadError::Reset(code)) => {
                                reset = Some(code.into_inner());
                                break;
                            }
                        }
                    }
                    let _ = chunks.finalize();
                    if id.dir() == Dir::Uni {
                        uni_bytes(conn, id, &bytes, &mut n);
                        continue;
                    }
                    let r = raw(id);
                    let Some(q) = conn.inflight.get_mut(&r) else { continue };
                    if q.head.len() < 4096 {
                        q.head.extend_from_slice(&bytes);
                    }
                    match reset {
                        Some(H3_REQUEST_REJECTED) => {
                            conn.inflight.remove(&r);
                            n.retried += 1;
                        }
                        Some(code) => {
                            conn.inflight.remove(&r);
                            n.reset += 1;
                            n.fail(t0, format!("stream {r}: reset with code {code:#x}"));
                        }
                        None if fin => {
                            if let Some(q) = conn.inflight.remove(&r) {
                                match status(&q.head) {
                                    200..=299 => n.ok += 1,
                                    other => {
                                        n.non2xx += 1;
                                        n.fail(t0, format!("stream {}: status {other}", raw(q.id)));
                                    }
                                }
                            }
                        }
                        None => {}
                    }
                }
            }
            conns.retain(|_, c| !c.quic.is_drained());
        }
        for conn in conns.values_mut() {
            if !conn.closed {
                conn.quic.close(Instant::now(), VarInt::from_u32(H3_NO_ERROR as u32), bytes::Bytes::new());
            }
            while let Some(t) = conn.quic.poll_transmit(Instant::now(), 1, &mut out) {
                let _ = sock.send_to(&out[..t.size], t.destination);
                out.clear();
            }
        }
        let elapsed = ended.duration_since(t0).as_secs_f64().max(1e-9);
        let json = serde_json::json!({
            "ok": n.ok, "failed": n.failed, "retried": n.retried, "goaways": n.goaways,
            "conns": n.conns, "reset": n.reset, "cut": n.cut, "non2xx": n.non2xx,
            "timeout": n.timeout, "abrupt": n.abrupt, "refused": n.refused,
            "hs_max_ms": n.hs_max.as_millis() as u64, "elapsed": elapsed,
            "rps": (n.ok as f64 / elapsed).round(), "first_failures": n.first,
        });
        for f in &n.first {
            println!("failure: {f}");
        }
        println!("{json}");
    }
}
