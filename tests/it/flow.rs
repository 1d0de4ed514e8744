//! The event loop's flow control, end to end: a connection that stopped reading because
//! its output backed up reads again by itself once the output drains (edge-triggered
//! readiness gives no second event for bytes already in the socket), and a peer's FIN is
//! never left unnoticed (no server socket stays in CLOSE-WAIT).

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

/// Bound for a whole flood to be answered (debug build, two shared cores).
const FLOOD: Duration = Duration::from_secs(20);

/// Writes `bytes` on a clone of `stream` from a thread of its own, so the caller reads
/// while it writes. The join result is the write's.
fn write_in_background(stream: &std::net::TcpStream, bytes: Vec<u8>) -> thread::JoinHandle<std::io::Result<()>> {
    let mut w = stream.try_clone().expect("clone stream");
    w.set_write_timeout(Some(FLOOD)).expect("write timeout");
    thread::spawn(move || w.write_all(&bytes).and_then(|()| w.flush()))
}

/// Writes `n` pipelined `GET /health` on `c` before reading anything (from a thread of
/// its own: the write finishes only if the server reads), half-closes `c` if `fin`, then
/// reads the `n` answers, each a 200.
fn pipelined_health_flood(s: &Server, c: &mut Conn, n: usize, fin: bool) {
    let burst: Vec<u8> = (0..n).flat_map(|_| request("GET", "/health", &[], b"")).collect();
    let writer = write_in_background(&c.stream, burst);
    // Only read once everything is written.
    let w = writer.join().expect("writer thread");
    assert!(w.is_ok(), "writing {n} pipelined requests: {w:?}\nlog:\n{}", s.log_tail());
    if fin {
        c.stream.shutdown(std::net::Shutdown::Write).expect("shutdown");
    }
    c.set_timeout(FLOOD);
    for i in 0..n {
        let r =
            c.try_read_response(false).unwrap_or_else(|e| panic!("response {i} of {n}: {e}\nlog:\n{}", s.log_tail()));
        assert_eq!(r.status, 200, "response {i}: {r:?}");
    }
}

/// Regression: a WebSocket client writing 20 000 messages at once got ~13 000 replies and
/// then nothing: with more than 64 KiB of replies queued the worker stopped reading,
/// wrote them out, and was never woken to read the rest of its input (the readable edge
/// had been consumed, and a flush that completes raises no writable edge).
///
/// Staged so that it shows every time: a 4 MiB message first, read at full speed, lets
/// the kernel grow the worker's receive buffer; then, with the worker stopped, the whole
/// burst lands in its socket, so no new bytes (no new edge) arrive after it resumes.
#[test]
fn a_websocket_flood_gets_every_reply_without_further_input() {
    const N: usize = 20_000;
    let s = Server::api_builder().set("websocket", "max_message_bytes = 8388608").start();
    let (_, token) = s.user("Flooder");
    let (mut ws, _) = s.ws_chat(&token);
    let _ = socket2::SockRef::from(&ws.stream).set_recv_buffer_size(8 << 20);
    ws.send_text(&"x".repeat(4 << 20));
    let warm = ws.recv_json(FLOOD);
    assert!(warm.as_ref().is_ok_and(|v| v["type"] == "error"), "the warm-up message's reply: {warm:?}");
    let mut burst = Vec::with_capacity(N * 8);
    for _ in 0..N {
        ws_client_frame(&mut burst, 0x1, b"x", true); // invalid JSON: one error reply each
    }
    let worker = s.wait_workers(1, Duration::from_secs(5))[0];
    let queued = burst.len() as u64;
    let client_port = ws.stream.local_addr().expect("local addr").port();
    kill_pid(worker, nix::sys::signal::Signal::SIGSTOP);
    let writer = write_in_background(&ws.stream, burst);
    let landed = eventually(Duration::from_secs(5), || {
        tcp_entries()
            .iter()
            .any(|e| e.remote_port == client_port && e.local_port == s.addr().port() && e.rx_queue >= queued)
    });
    kill_pid(worker, nix::sys::signal::Signal::SIGCONT);
    let (frames, end) = count_frames(&mut ws, N, FLOOD);
    assert_eq!(
        frames.text,
        N,
        "error replies within {FLOOD:?} ({end}; burst queued at once: {landed}); other frames: {}\nlog:\n{}",
        frames.other,
        s.log_tail()
    );
    let w = writer.join().expect("writer thread");
    assert!(w.is_ok(), "writing the flood: {w:?}");
    s.assert_healthy();
}

/// Frames counted by [`count_frames`].
#[derive(Default, Debug)]
struct Frames {
    /// Text frames whose payload is an `error` message.
    text: usize,
    /// Any other frame.
    other: usize,
}

/// Reads `ws` raw, as fast as it can, counting server frames until `n` error replies came,
/// the connection ends or `within` passes. Returns the counts and why it stopped.
fn count_frames(ws: &mut Ws, n: usize, within: Duration) -> (Frames, String) {
    use std::io::Read;
    let mut sock = ws.stream.try_clone().expect("clone stream");
    let mut frames = Frames::default();
    let mut buf = ws.take_pending();
    let mut tmp = vec![0u8; 1 << 20];
    let deadline = Instant::now() + within;
    loop {
        // Server frames are unmasked; replies here are short (7-bit or 16-bit lengths).
        while buf.len() >= 2 {
            let (len, hl) = match buf[1] & 0x7f {
                126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
                126 => break,
                127 => return (frames, "unexpected 64-bit frame length".into()),
                l => (l as usize, 2),
            };
            if buf.len() < hl + len {
                break;
            }
            let payload = &buf[hl..hl + len];
            if buf[0] & 0x0f == 0x1 && find(payload, br#""type":"error""#).is_some() {
                frames.text += 1;
            } else {
                frames.other += 1;
            }
            buf.drain(..hl + len);
        }
        if frames.text >= n {
            return (frames, "all replies".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (frames, "deadline".into());
        }
        sock.set_read_timeout(Some(left)).expect("read timeout");
        match sock.read(&mut tmp) {
            Ok(0) => return (frames, "EOF".into()),
            Ok(k) => buf.extend_from_slice(&tmp[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (frames, e.to_string()),
        }
    }
}

/// A client that writes 2 000 pipelined requests before it reads anything gets all 2 000
/// answers: the worker pauses while the answers back up and resumes as they drain.
#[test]
fn pipelined_flood_written_before_reading_is_answered() {
    const N: usize = 2_000;
    let s = Server::start("");
    let mut c = s.conn();
    pipelined_health_flood(&s, &mut c, N, false);
}

/// A WebSocket client that floods, half-closes and reads to the end gets every reply,
/// then the server closes its side: its FIN is not missed behind the paused input.
#[test]
fn a_websocket_flood_then_fin_is_answered_and_closed() {
    const N: usize = 20_000;
    let s = Server::api_builder().start();
    let (_, token) = s.user("Leaver");
    let (mut ws, _) = s.ws_chat(&token);
    let mut burst = Vec::with_capacity(N * 8);
    for _ in 0..N {
        ws_client_frame(&mut burst, 0x1, b"x", true);
    }
    let writer = write_in_background(&ws.stream, burst);
    let sock = ws.stream.try_clone().expect("clone");
    let shut = thread::spawn(move || {
        let w = writer.join().expect("writer thread");
        w.and_then(|()| sock.shutdown(std::net::Shutdown::Write))
    });
    let deadline = Instant::now() + FLOOD;
    let mut errors = 0;
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ws.recv(left.max(Duration::from_millis(1))) {
            Ok(WsFrame::Text(t)) if serde_json::from_str::<Value>(&t).is_ok_and(|v| v["type"] == "error") => {
                errors += 1
            }
            Ok(WsFrame::Ping(_)) => {}
            Ok(other) => break format!("frame {other:?}"),
            Err(e) => break e.to_string(),
        }
    };
    assert_eq!(errors, N, "error replies before the end ({end})\nlog:\n{}", s.log_tail());
    assert!(end.contains("EOF") || end.contains("reset"), "the server must close after the flood: {end}");
    let _ = shut.join();
    drop(ws);
    assert_no_close_wait(&s, Duration::from_secs(5), "after a WebSocket flood and FIN");
}

/// The same for HTTP/1.1: 2 000 pipelined requests, then FIN; every answer comes, then
/// the server closes.
#[test]
fn a_pipelined_flood_then_fin_is_answered_and_closed() {
    const N: usize = 2_000;
    let s = Server::start("");
    let mut c = s.conn();
    pipelined_health_flood(&s, &mut c, N, true);
    c.assert_closed(FLOOD, "after the last pipelined answer and the client's FIN");
    drop(c);
    assert_no_close_wait(&s, Duration::from_secs(5), "after a pipelined flood and FIN");
}

/// The states a connection can be in when its peer sends FIN (keeping its socket, so the
/// server's side would sit in CLOSE-WAIT): each is closed by the server within a few
/// seconds. Idle keep-alive, part of a head, part of a body, a request waiting on a pool
/// job (the client left: closed without its answer), an SSE stream, a WebSocket, a timer-driven stream (the
/// chat echo). Back-pressured input has its own tests above.
#[test]
fn a_peer_that_closes_is_closed_in_every_state() {
    const EACH: usize = 4;
    let s = Server::api_builder().set("chat", "echo_delay_ms = 200").start();
    let (_, token) = s.user("Closer");
    let half_close = |c: &std::net::TcpStream| c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut keep: Vec<std::net::TcpStream> = Vec::new();
    for _ in 0..EACH {
        let mut idle = s.conn();
        assert_eq!(idle.get("/health").status, 200);
        let mut head = s.conn();
        head.send(b"GET /health HTTP/1.1\r\nHost: x\r\n");
        let mut body = s.conn();
        body.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npart");
        let mut job = s.conn();
        job.send(&request("GET", "/_debug/sleep?ms=500", &[], b""));
        let sse = s.sse_connected(&[]);
        let (ws, _) = s.ws_chat(&token);
        let mut ticker = s.conn();
        let chat = br#"{"messages":[{"role":"user","content":"a b c d e f g h i j k l m n o p"}]}"#;
        ticker.send(&request("POST", "/api/chat", &[("Content-Type", "application/json")], chat));
        let head_seen = ticker.read_head_response();
        assert_eq!(head_seen.status, 200, "chat stream: {head_seen:?}");
        for c in [&idle.stream, &head.stream, &body.stream, &job.stream, sse.tcp(), &ws.stream, &ticker.stream] {
            half_close(c);
            keep.push(c.try_clone().expect("clone"));
        }
    }
    assert_no_close_wait(&s, Duration::from_secs(5), "after FIN in every state");
    drop(keep);
    s.assert_healthy();
}

/// A request and the client's FIN sent together, so that one readiness edge may carry
/// both: the answer comes, then the server closes. (A read that drains the socket ends
/// the read early, one system call less; it must not when the peer's end may be queued
/// behind the data, which raises no further edge.)
#[test]
fn a_request_sent_with_fin_is_answered_and_closed() {
    let s = Server::start("");
    for i in 0..20 {
        let mut c = s.conn();
        let mut bytes = request("GET", "/health", &[], b"");
        if i % 2 == 1 {
            // Pipelined: the second request after the first answer, FIN behind it.
            bytes.extend_from_slice(&request("GET", "/health", &[], b""));
        }
        c.send(&bytes);
        c.stream.shutdown(std::net::Shutdown::Write).expect("shutdown");
        c.set_timeout(Duration::from_secs(5));
        for n in 0..1 + i % 2 {
            let r = c.try_read_response(false).unwrap_or_else(|e| panic!("answer {n} ({i}): {e}\n{}", s.log_tail()));
            assert_eq!(r.status, 200);
        }
        c.assert_closed(Duration::from_secs(3), "after answering requests sent with FIN");
    }
}
