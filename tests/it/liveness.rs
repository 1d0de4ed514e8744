//! Liveness: every state that waits for the peer has a deadline, and notices the peer's
//! FIN. A connection that stops inside the HTTP/2 preface gets the 408 of an incomplete
//! head at the header timeout (the protocol sniff is part of the head); an HTTP/2 header
//! block that never ends is cut at the header timeout; a client that leaves while its
//! request waits is closed at once. No server socket stays in CLOSE-WAIT, and no slot of
//! `max_connections` stays taken by a client that is gone (issue 22, item 2).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::h2util::wire::*;
use crate::h2util::H2Client;
use crate::tls::{client_config, tls_server};
use crate::util::*;

/// `limits.header_timeout_ms` of these tests.
const HEADER_TIMEOUT: Duration = Duration::from_millis(300);
/// The `[limits]` of these tests: a short header timeout, a keep-alive timeout long enough
/// that it never explains a close seen here.
const LIMITS: &str = "header_timeout_ms = 300\nkeepalive_timeout_ms = 30000";
/// How late a timer may fire on a loaded two-core machine (debug build).
const LATE: Duration = Duration::from_secs(2);
/// A timer never fires before its time; the measurement may start a little after the
/// server's clock did.
const EARLY: Duration = Duration::from_millis(50);
/// How soon a peer's FIN must be acted on: far less than any heartbeat or timeout here.
const PROMPT: Duration = Duration::from_secs(2);

/// Asserts the time from `start` to a timeout's effect is the header timeout (plus slack).
fn assert_at_header_timeout(elapsed: Duration, what: &str) {
    eprintln!("timing: {what}: after {elapsed:?} (header_timeout_ms = 300)");
    assert!(elapsed + EARLY >= HEADER_TIMEOUT, "{what}: too early, after {elapsed:?}");
    assert!(elapsed <= HEADER_TIMEOUT + LATE, "{what}: too late, after {elapsed:?}");
}

/// The header names of `r` that every error carries, for comparing two answers.
fn header_names(r: &Response) -> Vec<String> {
    let mut names: Vec<String> = r.headers.iter().map(|(k, _)| k.clone()).collect();
    names.sort();
    names
}

#[test]
fn a_prefix_of_the_http2_preface_gets_the_408_of_an_incomplete_head() {
    let s = Server::builder().set("limits", LIMITS).start();
    let cases: [(&str, &[u8]); 4] = [
        ("`P`", b"P"),
        ("`PRI * HTTP`", b"PRI * HTTP"),
        ("the preface minus one byte", &PREFACE[..PREFACE.len() - 1]),
        ("`GET / HTT`", b"GET / HTT"),
    ];
    let mut sent: Vec<(Conn, Instant)> = cases
        .iter()
        .map(|(_, bytes)| {
            let mut c = s.conn();
            let t = Instant::now();
            c.send(bytes);
            (c, t)
        })
        .collect();
    let mut answers = Vec::new();
    for ((c, t), (what, _)) in sent.iter_mut().zip(cases) {
        c.set_timeout(HEADER_TIMEOUT + LATE);
        let r = c
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("{what}: no answer within {:?}: {e}\nlog:\n{}", t.elapsed(), s.log_tail()));
        assert_at_header_timeout(t.elapsed(), what);
        assert_json_error(&r, 408, None, what);
        assert!(r.closes(), "{what}: the 408 must carry `Connection: close`: {r:?}");
        c.assert_closed(LATE, &format!("{what}: after its 408"));
        answers.push(r);
    }
    // What an incomplete HTTP/1.1 head gets, field for field.
    let head = &answers[3];
    for (r, (what, _)) in answers.iter().zip(cases) {
        assert_eq!(r.json()["code"], head.json()["code"], "{what}: the error code of `GET / HTT`");
        assert_eq!(header_names(r), header_names(head), "{what}: the header fields of `GET / HTT`");
    }
    s.assert_healthy();
}

/// The exact flood of the issue, scaled down: more one-byte connections than
/// `max_connections`, held past the header timeout, then closed by the client.
#[test]
fn one_byte_connections_held_then_closed_leave_no_close_wait_and_no_slot_taken() {
    const MAX: usize = 50;
    let s = Server::builder().set("limits", &format!("{LIMITS}\nmax_connections = {MAX}")).start();
    let conns: Vec<TcpStream> = (0..2 * MAX)
        .map(|i| {
            let mut c = TcpStream::connect_timeout(&s.addr(), IO_TIMEOUT).expect("connect");
            c.write_all(b"P").unwrap_or_else(|e| panic!("connection {i}: {e}"));
            c
        })
        .collect();
    // The attack's hold time (the clients held 3 s): past the header timeout.
    thread::sleep(HEADER_TIMEOUT * 3);
    drop(conns);
    let took = assert_no_close_wait(&s, Duration::from_secs(10), "100 one-byte connections closed by their clients");
    eprintln!("timing: no CLOSE-WAIT {took:?} after the clients closed");
    let r = s
        .try_get("/health", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("/health after the flood: {e}\nlog:\n{}", s.log_tail()));
    assert_eq!(r.status, 200, "/health after the flood: {r:?}");
}

/// A client that half-closes or closes while its request waits on a slow pool job is
/// gone: its connection closes at once, not when the job ends.
#[test]
fn a_client_that_leaves_while_its_request_waits_on_a_job_is_closed_at_once() {
    const JOB: Duration = Duration::from_secs(8);
    let s = Server::builder().set("limits", LIMITS).start();
    let path = format!("/_debug/sleep?ms={}", JOB.as_millis());
    let mut half = s.conn();
    let mut gone = s.conn();
    for c in [&mut half, &mut gone] {
        c.send(&request("GET", &path, &[], b""));
    }
    // The job runs: no answer yet.
    assert!(!half.poll_readable(Duration::from_millis(300)), "answered before the job ended");
    let t = Instant::now();
    half.stream.shutdown(std::net::Shutdown::Write).expect("half-close");
    drop(gone);
    let took = assert_no_close_wait(&s, PROMPT, "clients that left while their request waited on a job");
    eprintln!("timing: closed {took:?} after the clients left (the job takes {JOB:?})");
    half.assert_closed(PROMPT.saturating_sub(t.elapsed()), "a half-closed client waiting on a job");
    assert!(t.elapsed() < JOB, "closed only when the job ended");
    s.assert_healthy();
}

/// One HTTP/2 frame: 3-byte length, type, flags, 4-byte stream id.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A GET header block for `path` (literal fields, no Huffman, no indexing).
fn get_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x04, path.len() as u8]; // :method GET, :scheme http, :path
    b.extend_from_slice(path.as_bytes());
    b.extend_from_slice(&[0x01, 9]); // :authority
    b.extend_from_slice(b"localhost");
    b
}

/// Reads frames from `sock` until the server closes it or `within` passes. Returns the
/// first GOAWAY's (last stream id, error code) and when the close came, if it did.
fn goaway_then_close(sock: &mut TcpStream, within: Duration) -> (Option<(u32, u32)>, Option<Instant>) {
    let deadline = Instant::now() + within;
    let (mut buf, mut tmp) = (Vec::new(), [0u8; 16 * 1024]);
    let mut goaway = None;
    loop {
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            if buf[3] == GOAWAY && goaway.is_none() && len >= 8 {
                let p = &buf[9..17];
                let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                goaway = Some((last, u32::from_be_bytes([p[4], p[5], p[6], p[7]])));
            }
            buf.drain(..9 + len);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (goaway, None);
        }
        sock.set_read_timeout(Some(left)).expect("timeout");
        match sock.read(&mut tmp) {
            Ok(0) => return (goaway, Some(Instant::now())),
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (goaway, Some(Instant::now())),
            Err(e) if is_timeout(&e) => {}
            Err(e) => panic!("read: {e}"),
        }
    }
}

const PROTOCOL_ERROR: u32 = 0x1;

/// A HEADERS frame without END_HEADERS whose CONTINUATION never comes: the stream cannot
/// be answered (its head is unknown, and nothing but the CONTINUATION may follow on the
/// connection), so the connection ends at the header timeout with GOAWAY(PROTOCOL_ERROR),
/// as nginx ends it, whether or not another stream is open.
#[test]
fn an_http2_header_block_that_never_ends_is_cut_at_the_header_timeout() {
    let s = Server::builder().set("limits", LIMITS).start();
    for open_stream in [false, true] {
        let what = if open_stream { "with a stream waiting on a job" } else { "alone" };
        let mut sock = TcpStream::connect_timeout(&s.addr(), IO_TIMEOUT).expect("connect");
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        if open_stream {
            bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &get_block("/_debug/sleep?ms=8000")));
        }
        let stalled = if open_stream { 3 } else { 1 };
        bytes.extend(frame(HEADERS, END_STREAM, stalled, &get_block("/health")));
        let t = Instant::now();
        sock.write_all(&bytes).expect("send");
        let (goaway, closed) = goaway_then_close(&mut sock, HEADER_TIMEOUT + LATE);
        let Some(closed) = closed else {
            panic!("{what}: still open {:?} after a header block without its end\nlog:\n{}", t.elapsed(), s.log_tail())
        };
        assert_at_header_timeout(closed - t, &format!("HTTP/2 header block without its end, {what}"));
        let last = u32::from(open_stream);
        assert_eq!(goaway, Some((last, PROTOCOL_ERROR)), "{what}: GOAWAY(last stream {last}, PROTOCOL_ERROR)");
    }
    s.assert_healthy();
}

/// Over HTTP/2 the peer's FIN ends the connection whatever its streams wait for (an idle
/// event stream between heartbeats, a slow job): the connection closes at once.
#[test]
fn an_http2_client_that_leaves_with_streams_open_is_closed_at_once() {
    let s = Server::builder().set("limits", LIMITS).start();
    let mut c = H2Client::h2c(s.addr());
    let (mut events, _) = c.start(c.build("GET", "/api/events", &[]), true);
    let head = c.head(&mut events).expect("event stream head");
    assert_eq!(head.status(), 200);
    let _job = c.start(c.build("GET", "/_debug/sleep?ms=8000", &[]), true);
    for _ in 0..20 {
        c.pump();
    }
    c.tcp().shutdown(std::net::Shutdown::Write).expect("half-close");
    let took = assert_no_close_wait(&s, PROMPT, "an HTTP/2 client that left with streams open");
    eprintln!("timing: HTTP/2 connection closed {took:?} after the client's FIN");
    s.assert_healthy();
}

/// The TLS listener: a preface prefix after an `http/1.1` handshake is an incomplete head
/// (408); after an `h2` handshake, an incomplete preface (closed); half a ClientHello, an
/// incomplete handshake (closed). Each at the header timeout; and a client that leaves in
/// the middle of its handshake is noticed at once.
#[test]
fn the_tls_listener_times_out_a_stalled_head_handshake_or_preface() {
    let (s, addr, pki, _d) = tls_server(1, "", &format!("[limits]\n{LIMITS}\n"));
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let what = format!("`PRI * HTTP` after ALPN {}", String::from_utf8_lossy(alpn));
        let mut config = (*client_config(&pki, rustls::DEFAULT_VERSIONS)).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let session = rustls::ClientConnection::new(Arc::new(config), name.clone()).expect("session");
        let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        sock.set_read_timeout(Some(HEADER_TIMEOUT + LATE)).expect("timeout");
        let mut tls = rustls::StreamOwned::new(session, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).expect("handshake");
        }
        assert_eq!(tls.conn.alpn_protocol(), Some(alpn), "{what}: ALPN");
        let t = Instant::now();
        tls.write_all(b"PRI * HTTP").and_then(|()| tls.flush()).expect("send");
        let mut got = Vec::new();
        match tls.read_to_end(&mut got) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(e) => panic!("{what}: not closed: {e} after {:?}\nlog:\n{}", t.elapsed(), s.log_tail()),
        }
        assert_at_header_timeout(t.elapsed(), &what);
        let text = String::from_utf8_lossy(&got);
        if alpn == b"h2" {
            assert!(!text.contains("HTTP/1.1"), "{what}: an HTTP/1.1 answer on an h2 connection: {text}");
        } else {
            assert!(text.starts_with("HTTP/1.1 408"), "{what}: {text}");
            assert!(text.contains("application/json"), "{what}: {text}");
        }
    }
    // Half a ClientHello, then silence: closed at the header timeout.
    const HALF_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
    let mut sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(HEADER_TIMEOUT + LATE)).expect("timeout");
    let t = Instant::now();
    sock.write_all(HALF_HELLO).expect("send");
    let end = sock.read(&mut [0u8; 64]);
    assert!(
        matches!(end, Ok(0)) || end.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "half a ClientHello: not closed ({end:?})"
    );
    assert_at_header_timeout(t.elapsed(), "half a ClientHello");
    // Half a ClientHello, then the client goes: noticed at once.
    let mut socks: Vec<TcpStream> =
        (0..4).map(|_| TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect")).collect();
    for sock in &mut socks {
        sock.write_all(HALF_HELLO).expect("send");
    }
    drop(socks);
    let port = addr.port();
    let ok = eventually(PROMPT, || tcp_sockets(port, TCP_CLOSE_WAIT) == 0);
    assert!(ok, "clients gone in their handshake: {} in CLOSE-WAIT", tcp_sockets(port, TCP_CLOSE_WAIT));
    s.assert_healthy();
}

/// The plain listener's connections after a 408 or in the sniff are noticed when their
/// client leaves, before or after the header timeout (the 408 ends the sniff: the
/// connection then lingers until the client's FIN).
#[test]
fn a_client_that_leaves_in_the_sniff_is_noticed_before_and_after_the_header_timeout() {
    let s = Server::builder().set("limits", LIMITS).start();
    let addr: SocketAddr = s.addr();
    // Before: the FIN arrives while the server waits for the rest of the preface.
    let early: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut c = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
            c.write_all(b"PRI * HTTP").expect("send");
            c
        })
        .collect();
    drop(early);
    assert_no_close_wait(&s, PROMPT, "clients gone inside the preface, before the header timeout");
    // After: the 408 came first; the client reads it, then closes.
    let mut late = s.conn();
    late.send(b"PRI * HTTP");
    late.set_timeout(HEADER_TIMEOUT + LATE);
    let r = late.try_read_response(false).unwrap_or_else(|e| panic!("no 408: {e}\nlog:\n{}", s.log_tail()));
    assert_eq!(r.status, 408);
    let t = Instant::now();
    drop(late);
    let took = assert_no_close_wait(&s, PROMPT, "a client gone after its 408");
    assert!(t.elapsed() < PROMPT, "{took:?}");
    s.assert_healthy();
}

/// An event stream idle between heartbeats (30 s apart here): its client's FIN closes it
/// at once, over plain TCP and over TLS.
#[test]
fn a_client_that_leaves_an_idle_event_stream_is_closed_long_before_its_heartbeat() {
    let (s, addr, pki, _d) = tls_server(1, "", &format!("[limits]\n{LIMITS}\n\n[sse]\nheartbeat_ms = 30000\n"));
    let plain = s.sse_connected(&[]);
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(client_config(&pki, rustls::DEFAULT_VERSIONS), name).expect("session");
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    let req = format!("GET /api/events HTTP/1.1\r\nHost: localhost:{}\r\n\r\n", addr.port());
    tls.write_all(req.as_bytes()).expect("send over TLS");
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while find(&head, b"\r\n\r\n").is_none() {
        let n = tls.read(&mut buf).unwrap_or_else(|e| panic!("event stream over TLS: {e}\nlog:\n{}", s.log_tail()));
        assert!(n > 0, "event stream over TLS: closed before its head");
        head.extend_from_slice(&buf[..n]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    plain.tcp().shutdown(std::net::Shutdown::Write).expect("half-close");
    tls.sock.shutdown(std::net::Shutdown::Write).expect("half-close");
    for port in [s.addr().port(), addr.port()] {
        let t = Instant::now();
        let ok = eventually(PROMPT, || tcp_sockets(port, TCP_CLOSE_WAIT) == 0);
        assert!(ok, "port {port}: an idle event stream whose client left is still in CLOSE-WAIT\n{}", s.log_tail());
        eprintln!("timing: event stream on port {port} closed {:?} after its client's FIN", t.elapsed());
    }
    s.assert_healthy();
}

/// An HTTP/2 client that writes a long burst, then its FIN, and reads nothing. The worker's
/// loop is blocked meanwhile (`/_debug/block`), so the burst and the FIN wait in the socket
/// together, behind more input than one drive of the connection reads (it yields to the
/// other connections after a budget). No new readiness edge comes for bytes already in the
/// socket: a drive that stops at its budget must come back for the rest, or the FIN is
/// never seen.
#[test]
fn an_http2_fin_behind_a_long_burst_is_seen() {
    const WARM: usize = 64 << 20;
    const BURST: usize = (9 << 20) / 2;
    let s = Server::builder().set("limits", LIMITS).start();
    let mut sock = TcpStream::connect_timeout(&s.addr(), IO_TIMEOUT).expect("connect");
    sock.set_write_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[]));
    // Frames of an unknown type (0x20), which h2 skips: no answer, no stream.
    let filler = frame(0x20, 0, 0, &[0; 16_384]);
    // Read at full speed first, so that the kernel grows the socket's receive buffer.
    while bytes.len() < WARM {
        bytes.extend_from_slice(&filler);
    }
    sock.write_all(&bytes).expect("warm-up");
    let server_side = |of: &TcpStream| {
        let port = of.local_addr().expect("addr").port();
        move || tcp_entries().into_iter().find(|e| e.remote_port == port).map(|e| e.rx_queue)
    };
    let queued = server_side(&sock);
    assert!(eventually(IO_TIMEOUT, || queued() == Some(0)), "the warm-up was not read: {:?}", queued());
    // Block the worker's loop: once its request is read, the loop is inside the handler.
    let mut blocker = s.conn();
    blocker.send(&request("GET", "/_debug/block?ms=1500", &[], b""));
    let unread = server_side(&blocker.stream);
    assert!(eventually(IO_TIMEOUT, || unread() == Some(0)), "the blocking request was not read");
    let block = thread::spawn(move || blocker.read_response());
    // As much as the sockets take while the loop is blocked, then the FIN behind it.
    let sent = sock.write(&filler.repeat(BURST / filler.len())).expect("burst");
    sock.shutdown(std::net::Shutdown::Write).expect("half-close");
    let t = Instant::now();
    assert_eq!(block.join().expect("block").status, 200);
    let took = assert_no_close_wait(&s, PROMPT, "an HTTP/2 FIN behind a long burst");
    eprintln!("timing: closed {took:?} after the loop resumed ({:?} after the FIN behind {sent} bytes)", t.elapsed());
    s.assert_healthy();
}
