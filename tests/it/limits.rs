//! Limits: head size (431), body size (413), head timeout (408), keep-alive timeout,
//! and the per-worker connection ceiling (CONTRACT §2 [limits], §10).

use std::time::{Duration, Instant};

use crate::util::*;

#[test]
fn header_over_max_header_bytes_gets_431() {
    let server = Server::builder().set("limits", "max_header_bytes = 2048").start();
    let mut c = server.conn();
    let big = "a".repeat(4000);
    c.send(&request("GET", "/health", &[("X-Big", &big)], b""));
    let r = c.read_response();
    assert_json_error(&r, 431, None, "4000-byte header with max_header_bytes = 2048");
    server.assert_healthy();
}

#[test]
fn header_under_max_header_bytes_is_accepted() {
    let server = Server::builder().set("limits", "max_header_bytes = 2048").start();
    let mut c = server.conn();
    let ok = "a".repeat(1500);
    c.send(&request("GET", "/health", &[("X-Ok", &ok)], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200, "1500-byte header under a 2048 limit: {r:?}");
}

#[test]
fn endless_head_without_terminator_gets_431() {
    let server = Server::builder().set("limits", "max_header_bytes = 2048").start();
    let mut c = server.conn();
    c.send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ");
    let mut sent = 0;
    // Keep the head growing (never a CRLFCRLF) until the server answers; stop at 16 KiB.
    while sent < 16 * 1024 {
        if c.try_write(&[b'a'; 256]).is_err() {
            break;
        }
        sent += 256;
        if c.poll_readable(Duration::from_millis(30)) {
            break;
        }
    }
    let r = c.read_response();
    assert_json_error(&r, 431, None, &format!("head growing without end ({sent} bytes sent)"));
    assert!(sent <= 8 * 1024, "the server only answered after {sent} head bytes with a 2048 limit");
    server.assert_healthy();
}

#[test]
fn content_length_over_body_limit_gets_413_before_the_body_is_sent() {
    let server = Server::start("");
    let mut c = server.conn();
    // Head only: no body byte is ever sent.
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 20000\r\n\r\n");
    let r = c.read_response();
    assert_json_error(
        &r,
        413,
        Some("PAYLOAD_TOO_LARGE"),
        "Content-Length 20000 over json_body_bytes 10240, no body sent",
    );
    server.assert_healthy();
}

#[test]
fn configured_body_limit_is_used() {
    let server = Server::builder().set("limits", "json_body_bytes = 100").start();
    let r = {
        let mut c = server.conn();
        c.send(&request("POST", "/_debug/echo", &[], &[b'x'; 100]));
        c.read_response()
    };
    assert_eq!(r.status, 200, "a 100-byte body with json_body_bytes = 100: {r:?}");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n");
    let r = c.read_response();
    assert_json_error(&r, 413, Some("PAYLOAD_TOO_LARGE"), "Content-Length 101 with json_body_bytes = 100");
}

#[test]
fn body_at_the_default_limit_is_accepted() {
    let server = Server::start("");
    let mut c = server.conn();
    let body = vec![b'y'; 10240];
    c.send(&request("POST", "/_debug/echo", &[], &body));
    let r = c.read_response();
    assert_eq!(r.status, 200, "10240-byte body at the default limit: {r:?}");
    assert_eq!(r.body.len(), 10240);
}

#[test]
fn chunked_body_growing_past_the_limit_gets_413() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    let chunk = {
        let mut v = b"3e8\r\n".to_vec(); // 1000 bytes
        v.extend_from_slice(&[b'z'; 1000]);
        v.extend_from_slice(b"\r\n");
        v
    };
    let mut sent = 0;
    // Up to 40 000 bytes; stop as soon as the server answers.
    while sent < 40_000 {
        if c.try_write(&chunk).is_err() {
            break;
        }
        sent += 1000;
        if c.poll_readable(Duration::from_millis(30)) {
            break;
        }
    }
    let r = c.read_response();
    assert_json_error(&r, 413, Some("PAYLOAD_TOO_LARGE"), &format!("chunked body ({sent} bytes sent)"));
    assert!(sent <= 20_000, "413 came only after {sent} body bytes (limit 10240)");
    server.assert_healthy();
}

#[test]
fn incomplete_head_gets_408_then_close() {
    let server = Server::builder().set("limits", "header_timeout_ms = 500").start();
    let mut c = server.conn();
    let t = Instant::now();
    c.send(b"GET / HTTP/1.1\r\n");
    let r = c.read_response();
    let elapsed = t.elapsed();
    eprintln!("timing: 408 after {elapsed:?} (header_timeout_ms = 500)");
    assert_json_error(&r, 408, None, "incomplete head with header_timeout_ms = 500");
    assert!(r.closes(), "408 must carry `Connection: close`: {r:?}");
    assert!(elapsed >= Duration::from_millis(400), "408 came too early: {elapsed:?} (timeout 500 ms)");
    assert!(elapsed <= Duration::from_millis(2500), "408 came too late: {elapsed:?} (timeout 500 ms)");
    c.assert_closed(Duration::from_secs(2), "after 408");
    server.assert_healthy();
}

#[test]
fn slow_but_complete_head_within_timeout_is_served() {
    let server = Server::builder().set("limits", "header_timeout_ms = 1500").start();
    let mut c = server.conn();
    c.send(b"GET /health HTTP/1.1\r\n");
    std::thread::sleep(Duration::from_millis(200)); // a slow client, well inside the timeout
    c.send(b"Host: x\r\n");
    std::thread::sleep(Duration::from_millis(200));
    c.send(b"\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn idle_keep_alive_connection_is_closed_after_keepalive_timeout() {
    let server = Server::builder().set("limits", "keepalive_timeout_ms = 300").start();
    let mut c = server.conn();
    let r = c.get("/health");
    assert_eq!(r.status, 200, "{r:?}");
    let elapsed = c.expect_close(Duration::from_secs(3)).unwrap_or_else(|e| {
        panic!("idle keep-alive with keepalive_timeout_ms = 300: {e}\nlog:\n{}", server.log_tail())
    });
    eprintln!("timing: idle close after {elapsed:?} (keepalive_timeout_ms = 300)");
    assert!(elapsed >= Duration::from_millis(200), "closed too early: {elapsed:?}");
    assert!(elapsed <= Duration::from_millis(2000), "closed too late: {elapsed:?}");
}

#[test]
fn connection_over_max_connections_waits_instead_of_failing() {
    let server = Server::builder()
        .set("limits", "max_connections = 5\nkeepalive_timeout_ms = 30000\nheader_timeout_ms = 30000")
        .start();
    let mut held: Vec<Conn> = (0..5)
        .map(|i| {
            let mut c = server.conn();
            let r = c.get("/health");
            assert_eq!(r.status, 200, "held connection {i}: {r:?}");
            c
        })
        .collect();
    let mut sixth = server.conn();
    sixth.send(&request("GET", "/health", &[], b""));
    // At the ceiling the worker must not take the 6th connection: nothing for 500 ms
    // (bounded; we are checking that something does NOT happen).
    let early = sixth.poll_readable(Duration::from_millis(500));
    assert!(
        !early,
        "the 6th connection was answered or closed while 5 were open (max_connections = 5): {:?}",
        String::from_utf8_lossy(sixth.pending())
    );
    held.remove(0); // close one of the five
    let r = sixth.read_response();
    assert_eq!(r.status, 200, "the 6th connection after one of the 5 closed: {r:?}");
    // The others are still alive.
    for (i, c) in held.iter_mut().enumerate() {
        let r = c.get("/health");
        assert_eq!(r.status, 200, "held connection {i} after the 6th was served: {r:?}");
    }
}

#[test]
fn a_body_trickled_a_byte_at_a_time_gets_408_at_the_body_timeout() {
    // Regression: the body timer restarted on every byte, so one byte every
    // 200 ms held the connection for as long as the client liked.
    let server = Server::builder().set("limits", "header_timeout_ms = 10000\nbody_timeout_ms = 1000").start();
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n");
    let t = Instant::now();
    let mut answered = false;
    while t.elapsed() < Duration::from_secs(6) {
        if c.try_write(b"x").is_err() || c.poll_readable(Duration::from_millis(200)) {
            answered = true;
            break;
        }
    }
    let elapsed = t.elapsed();
    assert!(answered, "a body trickled for {elapsed:?} was never answered (body_timeout_ms = 1000)");
    let r = c.read_response();
    assert_json_error(&r, 408, None, "body trickled past body_timeout_ms = 1000");
    assert!(r.closes(), "408 must carry `Connection: close`: {r:?}");
    assert!(elapsed <= Duration::from_millis(3000), "408 came too late: {elapsed:?} (body timeout 1000 ms)");
    server.assert_healthy();
}

#[test]
fn a_413_reaches_a_client_still_sending_its_body() {
    // Regression: the 413 was followed by a plain close while the body was
    // still arriving; the unread bytes made the kernel reset the connection,
    // so a client still writing (a proxy forwarding the body, as nginx does)
    // got a write error instead of the answer: a 502 behind nginx. After a
    // lingering close the client can finish writing and then read the 413.
    let server = Server::start("");
    for round in 0..3 {
        let mut c = server.conn();
        c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 16777216\r\n\r\n");
        // The whole declared body, as a client that does not wait for an early answer sends it.
        let chunk = vec![b'x'; 16 * 1024];
        for i in 0..1024 {
            if let Err(e) = c.try_write(&chunk) {
                panic!(
                    "round {round}: writing the body failed after {} bytes: {e}\nlog:\n{}",
                    i * chunk.len(),
                    server.log_tail()
                );
            }
        }
        let r = c
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("round {round}: the 413 was lost: {e}\nlog:\n{}", server.log_tail()));
        assert_json_error(&r, 413, None, &format!("round {round}: 16 MiB declared and sent"));
        assert!(r.closes(), "413 must carry `Connection: close`: {r:?}");
    }
    server.assert_healthy();
}
