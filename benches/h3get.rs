//! `h3get`: a small HTTP/3 load client for measuring forkd (`bin/h3bench`), release-built
//! (`cargo build --release --example h3get`). quinn-proto on one non-blocking UDP socket
//! (GSO sends and GRO receives through `forkd::sys::udp`), frames and QPACK from
//! `forkd::http3`; one thread, `-c` connections, `-m` requests in flight on each, `-n`
//! requests in all. It does not verify the server's certificate (a measuring tool only).
//!
//! ```text
//! h3get [-n N] [-c C] [-m M] [--hold SECS] ADDR PATH
//! ```
//!
//! Prints one line: requests, errors, seconds, requests/s, body bytes/s. `--hold SECS`:
//! after the requests, keeps the connections open and idle for SECS (prints `holding C`
//! first), for measuring the server's memory per idle connection.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use forkd::http3::frame::{self, Frame, FrameReader};
use forkd::http3::qpack::{self, Encoder, Fields};
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
    addr: SocketAddr,
    path: String,
}

fn usage() -> ! {
    eprintln!("usage: h3get [-n N] [-c C] [-m M] [--hold SECS] ADDR PATH");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        n: 1,
        c: 1,
        m: 1,
        hold: None,
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
}

#[derive(Default)]
struct Totals {
    done: u64,
    errors: u64,
    body: u64,
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
    let mut reader = FrameReader::new(1 << 20);
    let Ok((used, Some(Frame::Headers { len }))) = reader.next(bytes) else { return 0 };
    let Some(block) = bytes.get(used..used + len) else { return 0 };
    let mut fields = Fields::default();
    if qpack::decode(block, 1 << 20, &mut fields).is_err() {
        return 0;
    }
    let status = fields
        .iter()
        .find(|(n, _)| *n == b":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0);
    status
}

fn main() {
    let args = args();
    let sock = UdpSocket::bind(if args.addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
        .unwrap_or_else(|e| panic!("bind: {e}"));
    sock.set_nonblocking(true).unwrap_or_else(|e| panic!("nonblocking: {e}"));
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &(8 << 20));
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::SndBuf, &(4 << 20));
    udp::enable_gro(&sock);
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
            conns.insert(ch, Conn { quic, control: false, open: HashMap::new(), started: 0 });
        }
        // Requests and sends.
        for conn in conns.values_mut() {
            if conn.quic.is_handshaking() || conn.quic.is_closed() {
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
        for _ in 0..512 {
            match receiver.recv(&sock, &mut buf) {
                Ok(got) => {
                    for datagram in buf[..got.len].chunks(got.segment_size.max(1)) {
                        let mut answer = Vec::new();
                        match ep.handle(now, got.from, None, None, BytesMut::from(datagram), &mut answer) {
                            Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                                if let Some(c) = conns.get_mut(&ch) {
                                    c.quic.handle_event(event);
                                }
                            }
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
        for (ch, conn) in conns.iter_mut() {
            if conn.quic.poll_timeout().is_some_and(|t| t <= now) {
                conn.quic.handle_timeout(now);
            }
            while let Some(event) = conn.quic.poll_endpoint_events() {
                if let Some(back) = ep.handle_event(*ch, event) {
                    conn.quic.handle_event(back);
                }
            }
            let mut readable = Vec::new();
            while let Some(event) = conn.quic.poll() {
                match event {
                    Event::Stream(StreamEvent::Readable { id }) => readable.push(id),
                    Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                        while let Some(id) = conn.quic.streams().accept(Dir::Uni) {
                            readable.push(id);
                        }
                    }
                    Event::ConnectionLost { reason } => {
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
                loop {
                    match chunks.next(usize::MAX) {
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
                if fin {
                    if let Some((head, n)) = conn.open.remove(&id) {
                        if status(&head) == 200 {
                            totals.done += 1;
                            totals.body += n;
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
        "requests {} errors {} seconds {:.3} req/s {:.0} bytes/s {:.0} ({:.1} MiB/s)",
        totals.done,
        totals.errors,
        secs,
        totals.done as f64 / secs,
        totals.body as f64 / secs,
        totals.body as f64 / secs / (1 << 20) as f64
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
