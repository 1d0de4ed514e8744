//! HTTP/3 under abuse (issue #22): the anti-amplification limit before a client's address is
//! validated, the head and body timeouts per stream, GOAWAY for a connection with no request
//! stream (whatever PINGs it gets), a burst of requests past the stream limit, and the memory
//! of stalled downloads.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn_proto::{ConnectionError, VarInt};

use crate::h3client::{client_config, client_config_with_tickets, headers_frame, H3Client, TIMEOUT};
use crate::tls::tls_server;
use crate::util::*;

/// HTTP/3 on, no rate limit.
const H3_FREE: &str = "[rate_limit]\nenabled = false\n[http3]\nenabled = true\n";

/// `H3_NO_ERROR`.
const NO_ERROR: u32 = 0x100;
/// `H3_REQUEST_CANCELLED`.
const REQUEST_CANCELLED: u32 = 0x10c;

/// A UDP relay between a client and the server: it forwards the client's datagrams (each
/// `copies` times), counts the bytes both ways, and drops the server's, so the handshake
/// never completes and the client's address is never validated.
struct Relay {
    /// The client sends here.
    front: UdpSocket,
    /// The server sees this address.
    back: UdpSocket,
    server: SocketAddr,
    sent: usize,
    received: usize,
}

impl Relay {
    fn new(server: SocketAddr) -> Relay {
        let front = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let back = UdpSocket::bind("127.0.0.1:0").expect("bind");
        Relay { front, back, server, sent: 0, received: 0 }
    }

    fn addr(&self) -> SocketAddr {
        self.front.local_addr().expect("local address")
    }

    /// Forwards what the client has sent so far, each datagram `copies` times.
    fn forward(&mut self, copies: usize) {
        let mut buf = vec![0; 65_536];
        self.front.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
        while let Ok(n) = self.front.recv(&mut buf) {
            for _ in 0..copies {
                self.back.send_to(&buf[..n], self.server).expect("send");
                self.sent += n;
            }
            self.front.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        }
    }

    /// Counts what the server sends until it has been quiet for `quiet` (at most `max`): its
    /// first flight and any probe its loss timers send.
    fn drain(&mut self, quiet: Duration, max: Duration) {
        let mut buf = vec![0; 65_536];
        let end = Instant::now() + max;
        self.back.set_read_timeout(Some(quiet)).expect("timeout");
        while Instant::now() < end {
            match self.back.recv(&mut buf) {
                Ok(n) => self.received += n,
                Err(_) => break,
            }
        }
    }
}

/// One handshake that never completes: the client's first flight sent `copies` times from
/// the relay, with `early` GETs in 0-RTT (resuming a session of a first, direct connection
/// when `early` > 0); bytes in and bytes back.
fn unvalidated(server: SocketAddr, pki: &crate::tls::Pki, copies: usize, early: usize) -> (usize, usize) {
    let (config, tickets) = client_config_with_tickets(pki);
    if early > 0 {
        let mut first = H3Client::connect(server, &config);
        assert_eq!(first.get("/health").status(), 200);
        first.run_until(Instant::now() + TIMEOUT, |c| c.lost.is_some() || tickets.received() > 0);
    }
    let mut relay = Relay::new(server);
    let mut c = H3Client::start(relay.addr(), &config);
    assert_eq!(c.conn.has_0rtt(), early > 0, "0-RTT keys exactly when resuming");
    for _ in 0..early {
        c.send("GET", "/health", &[], b"");
    }
    relay.forward(copies);
    relay.drain(Duration::from_millis(1_500), Duration::from_secs(8));
    (relay.sent, relay.received)
}

#[test]
fn before_address_validation_the_server_sends_at_most_three_times_what_it_got() {
    // quinn lets a datagram start while any of the 3x budget is left, and fills it: a resumed
    // Initial with early GETs got more than 3x back (RFC 9000 §8.1).
    let (server, addr, pki, _d) = tls_server(1, "", H3_FREE);
    let cases = [("one Initial", 1, 0), ("an Initial sent twice", 2, 0)]
        .into_iter()
        .chain((1..=4).map(|n| ("a resumed Initial with early GETs", 1, n)));
    let pki = &pki;
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .map(|(what, copies, early)| (what, early, s.spawn(move || unvalidated(addr, pki, copies, early))))
            .collect();
        handles.into_iter().map(|(what, early, h)| (what, early, h.join().expect("case"))).collect()
    });
    for (what, early, (sent, received)) in results {
        let ratio = received as f64 / sent as f64;
        eprintln!("{what} ({early} GETs): {sent} bytes in, {received} back ({ratio:.2}x)");
        assert!(received > 0, "{what}: the server answered\n{}", server.log_tail());
        assert!(received <= 3 * sent, "{what} ({early} GETs): {received} bytes back for {sent} ({ratio:.2}x)");
    }
}

#[test]
fn a_stalled_head_or_body_gets_408_on_its_stream_only() {
    let (server, addr, pki, _d) =
        tls_server(1, "", &format!("{H3_FREE}[limits]\nheader_timeout_ms = 1000\nbody_timeout_ms = 1000\n"));
    let mut c = H3Client::connect(addr, &client_config(&pki));
    // The first 10 bytes of a head, then nothing; and a body of 10 bytes out of 100.
    let head = headers_frame(&[(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", "/")]);
    let cut_head = c.send_raw(head[..10].to_vec(), false);
    let mut post = headers_frame(&[
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", "/api/v1/users"),
        ("content-type", "application/json"),
        ("content-length", "100"),
    ]);
    post.extend_from_slice(&[0x00, 0x40, 100]);
    post.extend_from_slice(b"{\"name\": \"");
    let cut_body = c.send_raw(post, false);
    let started = Instant::now();
    let ended = |c: &H3Client, id| c.streams.get(&id).is_some_and(|s| s.fin || s.reset.is_some());
    c.run_until(started + Duration::from_secs(6), |c| c.lost.is_some() || (ended(c, cut_head) && ended(c, cut_body)));
    let elapsed = started.elapsed();
    for (what, id) in [("head", cut_head), ("body", cut_body)] {
        let s = &c.streams[&id];
        assert!(s.fin, "the stalled {what} was answered (after {elapsed:?}): {s:?}\n{}", server.log_tail());
        let r = c.partial(id);
        assert_eq!(r.status(), 408, "{what}: {r:?}");
        assert_eq!(r.json()["code"], "REQUEST_TIMEOUT", "{what}: {}", r.body_str());
    }
    assert!(elapsed >= Duration::from_millis(900), "not before the timeout: {elapsed:?}");
    // The connection serves on.
    assert_eq!(c.get("/health").status(), 200);
    assert!(c.lost.is_none(), "{:?}", c.lost);
}

#[test]
fn a_connection_with_no_request_stream_gets_goaway_after_keepalive_despite_pings() {
    let (server, addr, pki, _d) = tls_server(1, "", &format!("{H3_FREE}[limits]\nkeepalive_timeout_ms = 1000\n"));
    let config = client_config(&pki);
    let mut idle = H3Client::connect(addr, &config);
    assert_eq!(idle.get("/health").status(), 200);
    // An open event stream is not idle, however long it stays quiet.
    let mut busy = H3Client::connect(addr, &config);
    let events = busy.send("GET", "/api/events", &[("accept", "text/event-stream")], b"");
    let started = Instant::now();
    let mut goaway_after = None;
    // PINGs keep both QUIC connections alive: only HTTP/3's own idle timer may end one.
    while started.elapsed() < Duration::from_secs(6) && idle.lost.is_none() {
        for c in [&mut idle, &mut busy] {
            c.conn.ping();
            c.step(Instant::now() + Duration::from_millis(50));
        }
        if idle.goaway && goaway_after.is_none() {
            goaway_after = Some(started.elapsed());
        }
    }
    let goaway_after = goaway_after.unwrap_or_else(|| panic!("no GOAWAY within 6 s\n{}", server.log_tail()));
    assert!(goaway_after >= Duration::from_millis(900), "GOAWAY after {goaway_after:?}, before the keep-alive");
    match &idle.lost {
        Some(ConnectionError::ApplicationClosed(close)) => assert_eq!(close.error_code, VarInt::from_u32(NO_ERROR)),
        other => panic!("closed with H3_NO_ERROR after the GOAWAY, not {other:?}"),
    }
    assert!(!busy.goaway && busy.lost.is_none(), "the connection with a stream open stays: {:?}", busy.lost);
    let s = &busy.streams[&events];
    assert!(!s.fin && s.reset.is_none() && !s.bytes.is_empty(), "the event stream is open: {s:?}");
    eprintln!("idle HTTP/3 connection: GOAWAY after {goaway_after:?} (keepalive_timeout_ms = 1000)");
}

#[test]
fn a_burst_past_the_stream_limit_is_served_as_cancelled_streams_give_their_credit_back() {
    // 148 requests at once on a client that queues what the limit (128) does not allow yet:
    // 128 event streams it cancels (STOP_SENDING) once their heads arrive, then 20 GETs. A
    // stopped stream the server never reset held its credit: the 20 waited for ever.
    let (server, addr, pki, _d) = tls_server(1, "", H3_FREE);
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let paths = std::iter::repeat_n("/api/events", 128).chain(std::iter::repeat_n("/health", 20));
    let mut queued: Vec<&str> = paths.collect();
    queued.reverse();
    let (mut events, mut gets) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    let answered = |c: &H3Client, gets: &[quinn_proto::StreamId]| {
        gets.iter().filter(|id| c.streams.get(id).is_some_and(|s| s.fin)).count()
    };
    while (answered(&c, &gets) < 20) && c.lost.is_none() && Instant::now() < deadline {
        while let Some(path) = queued.last() {
            let Some(id) = c.try_get(path) else { break };
            if *path == "/health" {
                gets.push(id)
            } else {
                events.push(id)
            }
            queued.pop();
        }
        c.step(deadline);
        // Cancel each event stream once its head is in.
        for id in &events {
            if c.streams.get(id).is_some_and(|s| !s.bytes.is_empty()) {
                let _ = c.conn.recv_stream(*id).stop(VarInt::from_u32(REQUEST_CANCELLED));
                c.streams.remove(id);
            }
        }
        c.flush();
    }
    assert_eq!(events.len(), 128, "the event streams opened");
    assert_eq!(
        (gets.len(), answered(&c, &gets)),
        (20, 20),
        "the 20 queued GETs were sent and answered (lost {:?}, {} queued)\n{}",
        c.lost,
        queued.len(),
        server.log_tail()
    );
    for id in &gets {
        assert_eq!(c.partial(*id).status(), 200);
    }
}

#[test]
fn stalled_downloads_hold_little_memory() {
    // 4 connections x 100 streams of a download whose client keeps each stream's window at
    // 2 KiB: the worker read two 64 KiB slices ahead of every stream.
    let files = tempfile::Builder::new().prefix("forkd-h3stall-").tempdir().expect("tempdir");
    std::fs::write(files.path().join("big.bin"), vec![7u8; 8 << 20]).expect("write");
    let extra = format!("{H3_FREE}[download]\ndir = \"{}\"\n", files.path().display());
    let (server, addr, pki, _d) = tls_server(1, "", &extra);
    let worker = server.wait_workers(1, Duration::from_secs(10))[0];
    let mut config = client_config(&pki);
    let mut transport = quinn_proto::TransportConfig::default();
    transport.stream_receive_window(VarInt::from_u32(2048));
    transport.receive_window(VarInt::from_u32(64 << 20));
    config.transport_config(Arc::new(transport));
    let mut clients: Vec<H3Client> = (0..4).map(|_| H3Client::connect(addr, &config)).collect();
    for c in &mut clients {
        assert_eq!(c.get("/health").status(), 200);
    }
    let before = anon_rss_kib(worker);
    for c in &mut clients {
        for _ in 0..100 {
            let id = c.send("GET", "/download/big.bin", &[], b"");
            // Never read: the stream's window stays where it is.
            c.streams.remove(&id);
        }
    }
    // Until nothing more arrives for half a second: the server sent what the windows allow.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut last, mut quiet_since) = (0, Instant::now());
    while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_millis(500) {
        for c in &mut clients {
            c.step(Instant::now() + Duration::from_millis(20));
        }
        let got: u64 = clients.iter().map(|c| c.conn.stats().udp_rx.bytes).sum();
        if got != last {
            (last, quiet_since) = (got, Instant::now());
        }
    }
    let stalled = anon_rss_kib(worker);
    assert!(clients.iter().all(|c| c.lost.is_none()), "{:?}", clients.iter().map(|c| &c.lost).collect::<Vec<_>>());
    for c in &mut clients {
        c.close(NO_ERROR.into());
    }
    let after = eventually_some(Duration::from_secs(5), || {
        let r = server.get("/health");
        (r.status == 200).then(|| anon_rss_kib(worker))
    });
    eprintln!(
        "400 stalled HTTP/3 downloads: worker RSS {before} KiB -> {stalled} KiB ({} KiB, {:.1} KiB a stream); \
         {after:?} KiB after the clients left",
        stalled - before,
        (stalled - before) as f64 / 400.0
    );
    assert!(stalled - before < 10 * 1024, "400 stalled streams grew the worker by {} KiB", stalled - before);
}
