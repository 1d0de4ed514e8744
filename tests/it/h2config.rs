//! `[http2]`: the configured numbers are what the server's SETTINGS frame announces and what it
//! enforces (a stream beyond `max_concurrent_streams` is refused), they change on HUP, and
//! `enabled = false` leaves HTTP/1.1 alone on both listeners (no SETTINGS answers a
//! prior-knowledge preface; ALPN picks `http/1.1` even for a client offering only `h2` first).

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::h2util::wire::*;
use crate::tls::{client_config, https_get, tls_server};
use crate::util::*;

/// SETTINGS identifiers (RFC 9113 §6.5.2).
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
const INITIAL_WINDOW_SIZE: u16 = 0x4;
const MAX_FRAME_SIZE: u16 = 0x5;

const CONFIGURED: &str = "max_concurrent_streams = 7\ninitial_window_size = 100000\nmax_frame_size = 32768";

/// One frame: 3-byte length, type, flags, 4-byte stream id.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A frame the server sent: type, flags, stream, payload.
type Frame = (u8, u8, u32, Vec<u8>);

/// A raw h2c connection: the preface and an empty SETTINGS are sent on open.
struct Raw {
    sock: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    fn open(addr: SocketAddr) -> Raw {
        let mut sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        sock.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        sock.write_all(&hello).expect("send the preface");
        Raw { sock, buf: Vec::new() }
    }

    /// The next whole frame, or `None` when the connection ends or `timeout` passes first.
    fn next(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let b: Vec<u8> = self.buf.drain(..9 + len).collect();
                    let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
                    return Some((b[3], b[4], stream, b[9..].to_vec()));
                }
            }
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            self.sock.set_read_timeout(Some(left)).expect("timeout");
            let mut tmp = [0u8; 16 * 1024];
            match self.sock.read(&mut tmp) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }

    /// The first frame matching `f`, skipping others.
    fn find(&mut self, what: &str, mut f: impl FnMut(&Frame) -> bool) -> Frame {
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(frame) if f(&frame) => return frame,
                Some(_) => {}
                None => panic!("no {what} before the connection ended or {IO_TIMEOUT:?} passed"),
            }
        }
    }

    /// The server's first SETTINGS frame, as (identifier, value) pairs.
    fn server_settings(&mut self) -> Vec<(u16, u32)> {
        let (_, _, _, p) = self.find("SETTINGS", |(kind, flags, _, _)| *kind == SETTINGS && flags & ACK == 0);
        p.chunks_exact(6)
            .map(|c| (u16::from_be_bytes([c[0], c[1]]), u32::from_be_bytes([c[2], c[3], c[4], c[5]])))
            .collect()
    }
}

/// The value of setting `id`, if announced.
fn setting(settings: &[(u16, u32)], id: u16) -> Option<u32> {
    settings.iter().rev().find(|(i, _)| *i == id).map(|(_, v)| *v)
}

/// A `GET /api/events` header block (an event stream: the response never ends by itself).
fn events_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
    b.push(0x04); // :path, literal without indexing (static name 4)
    b.push(11);
    b.extend_from_slice(b"/api/events");
    b.push(0x01); // :authority, literal without indexing (static name 1)
    b.push(9);
    b.extend_from_slice(b"localhost");
    b
}

#[test]
fn the_settings_frame_carries_the_configured_values_and_an_eighth_stream_is_refused() {
    let server = Server::builder().set("http2", CONFIGURED).start();
    let mut raw = Raw::open(server.addr());
    let settings = raw.server_settings();
    assert_eq!(setting(&settings, MAX_CONCURRENT_STREAMS), Some(7), "{settings:?}");
    assert_eq!(setting(&settings, INITIAL_WINDOW_SIZE), Some(100_000), "{settings:?}");
    assert_eq!(setting(&settings, MAX_FRAME_SIZE), Some(32_768), "{settings:?}");
    // Eight event streams at once: seven are answered, the eighth is refused.
    let mut burst = frame(SETTINGS, ACK, 0, &[]);
    for i in 0..8 {
        burst.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i, &events_block()));
    }
    raw.sock.write_all(&burst).expect("send eight requests");
    let (_, _, stream, p) = raw.find("RST_STREAM", |(kind, ..)| *kind == RST_STREAM);
    assert_eq!((stream, u32::from_be_bytes([p[0], p[1], p[2], p[3]])), (15, REFUSED_STREAM));
    let mut answered = BTreeSet::new();
    while answered.len() < 7 {
        let (_, _, stream, _) = raw.find("HEADERS", |(kind, ..)| *kind == HEADERS);
        answered.insert(stream);
    }
    assert_eq!(answered, (0..7).map(|i| 1 + 2 * i).collect(), "the first seven streams are served");
}

#[test]
fn the_defaults_announce_128_streams_and_a_65535_window() {
    let server = Server::start("");
    let settings = Raw::open(server.addr()).server_settings();
    assert_eq!(setting(&settings, MAX_CONCURRENT_STREAMS), Some(128), "{settings:?}");
    assert_eq!(setting(&settings, INITIAL_WINDOW_SIZE).unwrap_or(65_535), 65_535, "{settings:?}");
    assert_eq!(setting(&settings, MAX_FRAME_SIZE).unwrap_or(16_384), 16_384, "{settings:?}");
}

#[test]
fn hup_gives_new_workers_the_new_settings() {
    let s = Server::builder().set("http2", CONFIGURED).start();
    let old: BTreeSet<i32> = s.wait_workers(1, START_TIMEOUT).into_iter().collect();
    let text = s.config_text.replace("max_concurrent_streams = 7", "max_concurrent_streams = 9");
    assert_ne!(text, s.config_text);
    std::fs::write(s.config_path(), text).expect("write config");
    s.signal(Signal::SIGHUP);
    let replaced = eventually(Duration::from_secs(15), || {
        let now: BTreeSet<i32> = s.workers().into_iter().collect();
        now.len() == 1 && now.is_disjoint(&old)
    });
    assert!(replaced, "after SIGHUP the worker must be new\n{}", s.log_tail());
    let settings = Raw::open(s.addr()).server_settings();
    assert_eq!(setting(&settings, MAX_CONCURRENT_STREAMS), Some(9), "{settings:?}");
}

#[test]
fn disabled_a_prior_knowledge_preface_is_an_http1_bad_request() {
    let server = Server::builder().set("http2", "enabled = false").start();
    let mut sock = TcpStream::connect_timeout(&server.addr(), IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    sock.write_all(&hello).expect("send the preface");
    let mut got = Vec::new();
    let _ = sock.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 "), "an HTTP/1.1 answer, not SETTINGS: {text:?}");
    // `PRI * HTTP/2.0` is a malformed HTTP/1.1 request: 400, and the connection closes.
    assert!(text.starts_with("HTTP/1.1 400 "), "400 Bad Request: {text:?}");
    assert!(text.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{text:?}");
    // Plain HTTP/1.1 is served as before.
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn disabled_alpn_yields_http11_even_to_a_client_preferring_h2() {
    let (server, addr, pki, _d) = tls_server(1, "", "[http2]\nenabled = false\n");
    let mut config = (*client_config(&pki, rustls::DEFAULT_VERSIONS)).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let r = https_get(addr, &std::sync::Arc::new(config), "/health");
    assert_eq!(r.status, 200, "{}\n{}", r.head, server.log_tail());
    assert_eq!(r.alpn.as_deref(), Some(&b"http/1.1"[..]), "ALPN http/1.1");
}

#[test]
fn enabled_alpn_yields_h2_to_a_client_preferring_it() {
    let (_server, addr, pki, _d) = tls_server(1, "", "");
    let mut config = (*client_config(&pki, rustls::DEFAULT_VERSIONS)).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut session = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("client session");
    let mut sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    while session.is_handshaking() {
        session.complete_io(&mut sock).expect("handshake");
    }
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]));
}
