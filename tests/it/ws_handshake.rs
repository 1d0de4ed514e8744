//! The WebSocket handshake's refusals over HTTP/1.1 (an upgrade answered `101`) and HTTP/2
//! (an extended CONNECT, RFC 8441, answered `200`): the status, the error envelope and the
//! fields of each refusal, the authentication checks that come before the handshake's, and
//! that the connection lives on after a refusal.

use crate::h2util::H2Client;
use crate::util::*;

const APP: &str = "http://app.example";
const ALLOWED: &str = "http://allowed.example";
const EVIL: &str = "http://evil.example";

/// The RFC 6455 §1.3 example key.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn start() -> Server {
    Server::api_builder()
        .top(&format!("public_origin = \"{APP}\""))
        .set("cors", &format!("origins = [\"{ALLOWED}\"]"))
        .set("websocket", "echo = true")
        .start()
}

/// Request fields, in order.
type Fields<'a> = Vec<(&'a str, &'a str)>;

/// A complete HTTP/1.1 handshake's fields with `drop` left out and `extra` added.
fn fields<'a>(drop: &str, extra: &[(&'a str, &'a str)]) -> Fields<'a> {
    let mut h: Vec<(&str, &str)> = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", KEY),
        ("Sec-WebSocket-Version", "13"),
    ]
    .into_iter()
    .filter(|(n, _)| *n != drop)
    .collect();
    h.extend_from_slice(extra);
    h
}

/// Asserts `r` is the error `status`/`code` with `message`; `what` names the case.
fn refused(s: &Server, r: &Response, status: u16, code: &str, message: &str, what: &str) {
    let v = s.expect_err(r, status, code, what);
    ensure_eq!(s, v["message"].as_str(), Some(message), "{what}: message of {r:?}");
    let version = r.header("sec-websocket-version");
    ensure_eq!(s, version, (status == 426).then_some("13"), "{what}: Sec-WebSocket-Version of {r:?}");
}

#[test]
fn http1_handshake_refusals_keep_the_connection() {
    let s = start();
    let bad_request = |m: &'static str| (400, "BAD_REQUEST", m);
    let version = (426, "UPGRADE_REQUIRED", "WebSocket version 13 required");
    let cases: [(&str, Fields<'_>, (u16, &str, &str)); 7] = [
        ("no Upgrade", fields("Upgrade", &[]), bad_request("missing Upgrade: websocket")),
        ("Upgrade: h2c", fields("Upgrade", &[("Upgrade", "h2c")]), bad_request("missing Upgrade: websocket")),
        ("no Connection", fields("Connection", &[]), bad_request("missing Connection: upgrade")),
        ("no version", fields("Sec-WebSocket-Version", &[]), version),
        ("version 8", fields("Sec-WebSocket-Version", &[("Sec-WebSocket-Version", "8")]), version),
        ("no key", fields("Sec-WebSocket-Key", &[]), bad_request("invalid Sec-WebSocket-Key")),
        ("a short key", fields("Sec-WebSocket-Key", &[("Sec-WebSocket-Key", "c2hvcnQ=")]), {
            bad_request("invalid Sec-WebSocket-Key")
        }),
    ];
    let mut c = s.conn();
    for (what, headers, (status, code, message)) in cases {
        c.send(&request("GET", "/ws/echo", &headers, b""));
        let r = c.read_response();
        refused(&s, &r, status, code, message, what);
        ensure!(s, !r.closes(), "{what}: the connection stays open: {r:?}");
    }
    // `HEAD` is routed as `GET`, and refused by the handshake: the head only.
    c.send(&request("HEAD", "/ws/echo", &fields("", &[]), b""));
    let r = c.try_read_response(true).expect("HEAD response");
    ensure_eq!(s, r.status, 400, "HEAD: {r:?}");
    ensure!(s, r.body.is_empty(), "HEAD: no body: {r:?}");
    ensure_eq!(s, c.get("/health").status, 200, "after the refusals");
}

#[test]
fn http1_authentication_comes_before_the_handshake() {
    let s = start();
    let (_, token) = s.user("Shake");
    let chat = format!("/ws?token={}", urlencode(&token));
    let no_version = fields("Sec-WebSocket-Version", &[]);
    let with_origin = |o| fields("Sec-WebSocket-Version", &[("Origin", o)]);
    let cases: [(&str, &str, Fields<'_>, u16, &str); 4] = [
        ("no token", "/ws", no_version.clone(), 401, "UNAUTHORIZED"),
        ("a foreign Origin", &chat, with_origin(EVIL), 403, "FORBIDDEN"),
        ("a foreign Origin, echo", "/ws/echo", with_origin(EVIL), 403, "FORBIDDEN"),
        ("a good token", &chat, no_version, 426, "UPGRADE_REQUIRED"),
    ];
    for (what, path, headers, status, code) in cases {
        let mut c = s.conn();
        c.send(&request("GET", path, &headers, b""));
        let r = c.read_response();
        s.expect_err(&r, status, code, what);
    }
}

#[test]
fn a_refused_handshake_carries_the_requests_cors_fields() {
    let s = start();
    let mut c = s.conn();
    c.send(&request("GET", "/ws/echo", &fields("Sec-WebSocket-Version", &[("Origin", ALLOWED)]), b""));
    let r = c.read_response();
    refused(&s, &r, 426, "UPGRADE_REQUIRED", "WebSocket version 13 required", "allowed Origin");
    ensure_eq!(s, r.header("access-control-allow-origin"), Some(ALLOWED), "{r:?}");
    ensure_eq!(s, r.header("access-control-allow-credentials"), Some("true"), "{r:?}");
    ensure_eq!(s, r.header("vary"), Some("Origin"), "{r:?}");
    // Upgraded, the `101` carries none of them.
    let ws = s.ws_try("/ws/echo", &[("Origin", ALLOWED)]).unwrap_or_else(|r| panic!("101 expected: {r:?}"));
    ensure!(s, ws.head.header("access-control-allow-origin").is_none(), "{:?}", ws.head);
}

/// An extended CONNECT for a WebSocket on `c` with `fields`: the status, the head's fields
/// and, for a refusal, the body.
fn connect(c: &mut H2Client, path: &str, fields: &[(&str, &str)]) -> (u16, http::HeaderMap, Vec<u8>) {
    let mut req = c.build("CONNECT", path, fields);
    req.extensions_mut().insert(h2::ext::Protocol::from_static("websocket"));
    let (mut rf, _send) = c.start(req, false);
    let resp = c.head(&mut rf).unwrap_or_else(|e| panic!("CONNECT {path} {fields:?}: {e}"));
    let (parts, mut recv) = resp.into_parts();
    let body = if parts.status == 200 { Vec::new() } else { c.body(&mut recv) };
    (parts.status.as_u16(), parts.headers, body)
}

#[test]
fn http2_extended_connect_needs_version_13() {
    let s = start();
    let (_, token) = s.user("Tunnel");
    let chat = format!("/ws?token={}", urlencode(&token));
    let mut c = H2Client::h2c(s.addr());
    c.until(IO_TIMEOUT, "SETTINGS_ENABLE_CONNECT_PROTOCOL", |c| {
        c.send.is_extended_connect_protocol_enabled().then_some(())
    });
    let v13 = ("sec-websocket-version", "13");
    let cases: [(&str, &str, Fields<'_>, u16, Option<&str>); 10] = [
        ("no version", "/ws/echo", vec![], 426, Some("UPGRADE_REQUIRED")),
        ("version 8", "/ws/echo", vec![("sec-websocket-version", "8")], 426, Some("UPGRADE_REQUIRED")),
        ("version 13", "/ws/echo", vec![v13], 200, None),
        ("version 13, chat", &chat, vec![v13], 200, None),
        ("no version, chat", &chat, vec![], 426, Some("UPGRADE_REQUIRED")),
        // RFC 8441 sends no key; one that is sent is checked as over HTTP/1.1.
        ("a good key", "/ws/echo", vec![v13, ("sec-websocket-key", KEY)], 200, None),
        ("a bad key", "/ws/echo", vec![v13, ("sec-websocket-key", "c2hvcnQ=")], 400, Some("BAD_REQUEST")),
        ("a bad key, no version", "/ws/echo", vec![("sec-websocket-key", "x")], 426, Some("UPGRADE_REQUIRED")),
        ("no token, no version", "/ws", vec![], 401, Some("UNAUTHORIZED")),
        ("a foreign Origin, no version", &chat, vec![("origin", EVIL)], 403, Some("FORBIDDEN")),
    ];
    for (what, path, fields, status, code) in cases {
        let (got, head, body) = connect(&mut c, path, &fields);
        ensure_eq!(s, got, status, "{what}: {head:?} {}", String::from_utf8_lossy(&body));
        let version = head.get("sec-websocket-version").and_then(|v| v.to_str().ok());
        ensure_eq!(s, version, (status == 426).then_some("13"), "{what}: {head:?}");
        if let Some(code) = code {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{what}: {e}"));
            ensure_eq!(s, v["code"].as_str(), Some(code), "{what}: {v}");
        }
    }
    let (got, head, body) = connect(&mut c, "/ws/echo", &[("origin", ALLOWED)]);
    ensure_eq!(s, got, 426, "allowed Origin: {head:?}");
    ensure_eq!(s, head.get("access-control-allow-origin").and_then(|v| v.to_str().ok()), Some(ALLOWED), "{head:?}");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    ensure_eq!(s, v["message"].as_str(), Some("WebSocket version 13 required"), "{v}");
    ensure_eq!(s, c.get("/health").status, 200, "after the refusals");
}
