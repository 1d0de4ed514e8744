//! HTTP/1.1 framing and robustness (CONTRACT §10, RFC 9112).

use std::time::{Duration, Instant};

use crate::util::*;

/// Sends `raw` on a fresh connection and asserts: 400 `BAD_REQUEST` JSON with
/// `Connection: close`, then the server closes, and the worker still serves `/health`.
fn assert_bad_request(raw: &[u8]) {
    let server = Server::start("");
    let what = format!("request {:?}", String::from_utf8_lossy(raw));
    let mut c = server.conn();
    c.send(raw);
    let r = c.read_response();
    assert_json_error(&r, 400, Some("BAD_REQUEST"), &what);
    assert!(r.closes(), "{what}: expected `Connection: close` on the 400, got {r:?}");
    c.assert_closed(Duration::from_secs(3), &what);
    server.assert_healthy();
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let server = Server::start("");
    let mut c = server.conn();
    for i in 0..5 {
        let id = format!("ka-{i}");
        c.send(&request("GET", "/health", &[("X-Request-Id", &id)], b""));
        let r = c.read_response();
        assert_eq!(r.status, 200, "request {i} on the same connection: {r:?}");
        assert_eq!(r.header("x-request-id"), Some(id.as_str()), "request {i}: {r:?}");
        assert!(!r.closes(), "request {i}: keep-alive expected, got {r:?}");
    }
}

#[test]
fn connection_close_is_honoured() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(&request("GET", "/health", &[("Connection", "close")], b""));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.closes(), "expected `Connection: close` in the response, got {r:?}");
    c.assert_closed(Duration::from_secs(2), "after Connection: close");
}

#[test]
fn http10_closes_by_default() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"GET /health HTTP/1.0\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"{\"status\":\"ok\"}", "{r:?}");
    c.assert_closed(Duration::from_secs(2), "HTTP/1.0 without keep-alive");
}

#[test]
fn http10_keep_alive_when_asked() {
    let server = Server::start("");
    let mut c = server.conn();
    for i in 0..2 {
        c.send(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        let r = c.read_response();
        assert_eq!(r.status, 200, "HTTP/1.0 keep-alive request {i}: {r:?}");
        assert!(!r.closes(), "HTTP/1.0 keep-alive request {i}: the server said close: {r:?}");
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let server = Server::start("");
    let mut c = server.conn();
    let mut all = Vec::new();
    // A slow pooled request first: the fast ones behind it must wait for their turn.
    all.extend(request("GET", "/_debug/sleep?ms=300", &[("X-Request-Id", "p1")], b""));
    all.extend(request("GET", "/health", &[("X-Request-Id", "p2")], b""));
    all.extend(request("GET", "/nope", &[("X-Request-Id", "p3")], b""));
    all.extend(request("POST", "/_debug/echo", &[("X-Request-Id", "p4")], b"four"));
    all.extend(request("GET", "/health", &[("X-Request-Id", "p5")], b""));
    c.send(&all);
    let expected: [(&str, u16, &[u8]); 5] = [
        ("p1", 200, b""),
        ("p2", 200, b"{\"status\":\"ok\"}"),
        ("p3", 404, b""),
        ("p4", 200, b"four"),
        ("p5", 200, b"{\"status\":\"ok\"}"),
    ];
    for (id, status, body) in expected {
        let r = c.read_response();
        assert_eq!(
            r.header("x-request-id"),
            Some(id),
            "pipelined responses out of order: expected {id} next, got {r:?}"
        );
        assert_eq!(r.status, status, "pipelined {id}: {r:?}");
        if !body.is_empty() {
            assert_eq!(r.body, body, "pipelined {id}: {r:?}");
        }
        if id == "p1" {
            assert_eq!(r.json()["slept"], 300, "pipelined {id}: {r:?}");
        }
    }
}

#[test]
fn content_length_body_is_echoed() {
    let server = Server::start("");
    let mut c = server.conn();
    let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    c.send(&request("POST", "/_debug/echo", &[], &body));
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body.len(), body.len(), "{r:?}");
    assert!(r.body == body, "echoed body differs from the request body");
    assert_eq!(media_type(r.header("content-type")).as_deref(), Some("application/octet-stream"), "{r:?}");
    // The connection is still usable afterwards.
    let r = c.get("/health");
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn content_length_body_split_over_several_writes_is_echoed() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhel");
    // Bounded pause so the server sees a partial body; nothing to poll for here.
    std::thread::sleep(Duration::from_millis(50));
    c.send(b"lo ");
    std::thread::sleep(Duration::from_millis(50));
    c.send(b"world");
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"hello world", "{r:?}");
}

#[test]
fn chunked_body_with_extensions_and_trailers_is_echoed() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(
        b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;ext=1\r\nhello\r\n\
          1;name=\"quoted value\"\r\n \r\n\
          A\r\n0123456789\r\n\
          6\r\nworld!\r\n\
          0\r\nX-Trailer: yes\r\nX-Other: 2\r\n\r\n",
    );
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body_str(), "hello 0123456789world!", "{r:?}");
    // The trailers were consumed: the next request on the connection parses cleanly.
    let r = c.get("/health");
    assert_eq!(r.status, 200, "request after a chunked body with trailers: {r:?}");
}

#[test]
fn chunked_body_arriving_in_pieces_is_echoed() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab");
    std::thread::sleep(Duration::from_millis(50)); // let the server see a partial chunk
    c.send(b"c\r\n");
    std::thread::sleep(Duration::from_millis(50));
    c.send(b"2\r\nde\r\n0\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body_str(), "abcde", "{r:?}");
}

#[test]
fn expect_100_continue_gets_interim_response_before_body() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n");
    let interim = c.read_response();
    assert_eq!(interim.status, 100, "expected `100 Continue` before sending the body, got {interim:?}");
    c.send(b"hello world");
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"hello world", "{r:?}");
}

#[test]
fn expect_100_continue_over_the_body_limit_gets_413_without_100() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 20000\r\n\r\n");
    let r = c.read_response();
    assert_json_error(&r, 413, Some("PAYLOAD_TOO_LARGE"), "Expect: 100-continue with Content-Length 20000");
    server.assert_healthy();
}

#[test]
fn two_identical_content_lengths_are_accepted() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello");
    let r = c.read_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"hello", "{r:?}");
}

#[test]
fn head_health_has_the_get_headers_and_no_body() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(&request("HEAD", "/health", &[], b""));
    let r = c.read_head_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-length"), Some("15"), "HEAD /health: {r:?}");
    assert_eq!(media_type(r.header("content-type")).as_deref(), Some("application/json"), "{r:?}");
    // If the server had sent a body, it would be parsed as the next response here.
    let next = c.get("/health");
    assert_eq!(next.status, 200, "response after HEAD (a stray body would break this): {next:?}");
    assert_eq!(next.body, b"{\"status\":\"ok\"}", "{next:?}");
}

// --- 400 and close ------------------------------------------------------------------

#[test]
fn rejects_content_length_with_transfer_encoding() {
    assert_bad_request(
        b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
}

#[test]
fn rejects_two_different_content_lengths() {
    assert_bad_request(
        b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    );
}

#[test]
fn rejects_transfer_encoding_gzip_chunked() {
    assert_bad_request(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n");
}

#[test]
fn rejects_transfer_encoding_identity() {
    assert_bad_request(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n");
}

#[test]
fn rejects_bad_chunk_size() {
    assert_bad_request(
        b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    );
}

#[test]
fn rejects_whitespace_before_header_colon() {
    assert_bad_request(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Foo : bar\r\n\r\n");
}

#[test]
fn rejects_whitespace_before_colon_in_host() {
    assert_bad_request(b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n");
}

#[test]
fn rejects_obs_fold() {
    assert_bad_request(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Foo: a\r\n  folded\r\n\r\n");
}

#[test]
fn rejects_http11_without_host() {
    assert_bad_request(b"GET /health HTTP/1.1\r\nAccept: */*\r\n\r\n");
}

#[test]
fn rejects_request_line_without_target() {
    assert_bad_request(b"GET\r\n\r\n");
}

#[test]
fn rejects_unknown_http_version() {
    assert_bad_request(b"GET /x HTTP/9.9\r\nHost: x\r\n\r\n");
}

#[test]
fn rejects_method_with_bad_characters() {
    assert_bad_request(b"G(E)T /health HTTP/1.1\r\nHost: x\r\n\r\n");
}

#[test]
fn hostile_request_does_not_disturb_other_connections() {
    let server = Server::start("");
    let mut good = server.conn();
    assert_eq!(good.get("/health").status, 200);
    let (resps, closed) = send_raw(server.addr(), b"GET /x HTTP/9.9\r\nHost: x\r\n\r\n");
    assert!(closed && resps.len() == 1 && resps[0].status == 400, "hostile request: closed={closed} {resps:?}");
    let t = Instant::now();
    let r = good.get("/health");
    assert_eq!(r.status, 200, "the other keep-alive connection after a hostile one: {r:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
}

/// Regression: any `Host` value was accepted (`a b`, `a/b`, `a@b`, `[::1`, `a:b:c` got 200).
/// RFC 9112 §3.2: `Host` is `host[:port]` (RFC 3986): 400 and close otherwise; valid forms,
/// an underscore and percent-encoded reg-names included, are still served.
#[test]
fn invalid_host_values_are_400_and_valid_ones_served() {
    let server = Server::start("");
    let bad = [
        "a b", "a/b", "a@b", "[::1", "::1", "a:b:c", "a:", "a:99999", "a:8o", "[::1]x", "[zz::1]", "a%2", "a%zz",
        "a\\b", "a?b", "a#b", "a\"b", "<a>", "",
    ];
    for host in bad {
        let what = format!("Host: {host:?}");
        let mut c = server.conn();
        c.send(format!("GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        let r = c.read_response();
        assert_json_error(&r, 400, Some("BAD_REQUEST"), &what);
        assert!(r.closes(), "{what}: expected `Connection: close` on the 400, got {r:?}");
        c.assert_closed(Duration::from_secs(3), &what);
    }
    let good = [
        "localhost",
        "127.0.0.1:8080",
        "[::1]:8080",
        "[::1]",
        "example.com",
        "a-b.c_d",
        "EXAMPLE.com:80",
        "caf%C3%A9.example",
        "a~b!$&'()*+,;=",
    ];
    let mut c = server.conn();
    for host in good {
        c.send(format!("GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        let r = c.read_response();
        assert_eq!(r.status, 200, "Host: {host:?} must be served: {r:?}");
    }
    server.assert_healthy();
}

#[test]
fn head_on_an_event_stream_sends_the_head_only_and_the_connection_goes_on() {
    // Regression: HEAD /api/events wrote the SSE body after the head and the
    // next response on the connection was corrupted.
    let server = Server::api_builder().start();
    let mut c = server.conn();
    c.send(&request("HEAD", "/api/events", &[], b""));
    let r = c.read_head_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("text/event-stream"), "{r:?}");
    assert!(r.body.is_empty(), "HEAD got a body: {r:?}");
    let next = c.get("/health");
    assert_eq!(next.status, 200, "the request after HEAD on the same connection: {next:?}");
    assert_eq!(next.body_str(), r#"{"status":"ok"}"#);
    assert!(c.pending().is_empty(), "bytes after the /health answer: {:?}", String::from_utf8_lossy(c.pending()));
}
