//! HTTP/2: prior knowledge (h2c) on `listen`, ALPN `h2` on `tls.listen`; the same
//! routes, headers, envelopes and limits as HTTP/1.1, framed per stream.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;

use crate::h2util::*;
use crate::util::*;

/// Headers HTTP/2 must never carry.
const HOP_BY_HOP: [&str; 4] = ["connection", "keep-alive", "transfer-encoding", "upgrade"];

/// Fields whose value changes per response.
const PER_RESPONSE: [&str; 5] = ["date", "x-request-id", "content-security-policy", "content-length", "age"];

fn assert_same_headers(h1: &Response, h2: &H2Response, what: &str) {
    for name in HOP_BY_HOP {
        assert!(h2.headers.get(name).is_none(), "{what}: {name} over HTTP/2: {:?}", h2.headers);
    }
    for (name, value) in &h1.headers {
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        let got = h2.headers.get(name.as_str()).and_then(|v| v.to_str().ok());
        assert!(got.is_some(), "{what}: {name} missing over HTTP/2: {:?}", h2.headers);
        if !PER_RESPONSE.contains(&name.as_str()) && !name.starts_with("ratelimit") {
            assert_eq!(got, Some(value.as_str()), "{what}: {name}");
        }
    }
    assert!(h2.header("x-request-id").is_some_and(is_uuid_v4), "{what}: request id");
}

#[test]
fn prior_knowledge_serves_health_and_config_with_the_same_headers() {
    let server = Server::start("");
    let mut c = H2Client::h2c(server.addr());
    let r = c.get("/health");
    assert_eq!(r.status, 200, "{r:?}\n{}", server.log_tail());
    let h1 = server.get("/health");
    assert_eq!(r.body, h1.body);
    assert_same_headers(&h1, &r, "/health");
    let r = c.get("/api/config");
    assert_eq!(r.status, 200, "{r:?}");
    assert_same_headers(&server.get("/api/config"), &r, "/api/config");
    // A 404 envelope, as over HTTP/1.1.
    let r = c.get("/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["code"], json!("NOT_FOUND"), "{}", r.body_str());
    assert_same_headers(&server.get("/nope"), &r, "/nope");
    // The access log names the exchanges.
    server.wait_log_line(IO_TIMEOUT, |l| l.contains("/api/config"));
}

#[test]
fn tls_alpn_h2_serves_health_and_config() {
    let (server, addr, pki, _d) = crate::tls::tls_server(1, "", "");
    let mut c = H2Client::tls(addr, h2_tls_config(&pki.ca_pem));
    let r = c.get("/health");
    assert_eq!(r.status, 200, "{r:?}\n{}", server.log_tail());
    assert_same_headers(&server.get("/health"), &r, "/health over TLS");
    let r = c.get("/api/config");
    assert_eq!(r.status, 200, "{r:?}");
    // A client offering only http/1.1 still gets HTTP/1.1.
    let old = crate::tls::client_config(&pki, rustls::DEFAULT_VERSIONS);
    let r = crate::tls::https_get(addr, &old, "/health");
    assert_eq!((r.status, r.alpn.as_deref()), (200, Some(&b"http/1.1"[..])));
}

#[test]
fn sign_up_login_and_a_bearer_request_over_h2() {
    let server = Server::start_api();
    let mut c = H2Client::h2c(server.addr());
    let json_ct = [("content-type", "application/json")];
    let email = unique_email("h2");
    let body = serde_json::to_vec(&json!({"name": "Ada", "email": email, "password": "correct horse 42"})).unwrap();
    let r = c.request("POST", "/api/v1/users", &json_ct, Some(&body));
    assert_eq!(r.status, 201, "{}\n{}", r.body_str(), server.log_tail());
    let id = r.json()["data"]["id"].as_i64().expect("id");
    let body = serde_json::to_vec(&json!({"email": email, "password": "correct horse 42"})).unwrap();
    let r = c.request("POST", "/api/v1/auth/login", &json_ct, Some(&body));
    assert_eq!(r.status, 200, "{}", r.body_str());
    let token = r.json()["data"]["accessToken"].as_str().expect("token").to_string();
    let bearer = format!("Bearer {token}");
    let r = c.request("GET", &format!("/api/v1/users/{id}"), &[("authorization", &bearer)], None);
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.json()["data"]["email"], json!(email));
    // A 422 envelope: the same as over HTTP/1.1.
    let bad = serde_json::to_vec(&json!({"name": "", "email": "nope", "password": "x"})).unwrap();
    let r = c.request("POST", "/api/v1/users", &json_ct, Some(&bad));
    let h1 = server.call("POST", "/api/v1/users", &[("Content-Type", "application/json")], &bad);
    assert_eq!((r.status, h1.status), (422, 422), "{}", r.body_str());
    assert_eq!(r.json()["code"], h1.json()["code"]);
    assert_same_headers(&h1, &r, "422");
    // No token: the same 401 envelope.
    let r = c.request("GET", &format!("/api/v1/users/{id}"), &[], None);
    assert_eq!(r.status, 401, "{}", r.body_str());
}

#[test]
fn many_concurrent_streams_on_one_connection() {
    let server = Server::start("");
    let mut c = H2Client::h2c(server.addr());
    let mut pending = Vec::new();
    for i in 0..60 {
        let path = if i % 2 == 0 { "/health" } else { "/api/config" };
        let req = c.build("GET", path, &[]);
        pending.push(c.start(req, true).0);
    }
    for mut rf in pending {
        let resp = c.head(&mut rf).expect("response");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        assert!(!c.body(&mut body).is_empty());
    }
}

#[test]
fn an_oversized_body_is_413_on_its_stream_only() {
    let server = Server::start("");
    let mut c = H2Client::h2c(server.addr());
    // Declared too large: answered at once.
    let big = vec![b'x'; 20_000];
    let req = c.build("POST", "/api/v1/users", &[("content-type", "application/json"), ("content-length", "20000")]);
    let (mut rf, _send) = c.start(req, false);
    let resp = c.head(&mut rf).expect("413 head");
    assert_eq!(resp.status(), 413);
    // Undeclared and too large: 413 once the limit is passed, the rest refused.
    let req = c.build("POST", "/api/v1/users", &[("content-type", "application/json")]);
    let (mut rf, mut send) = c.start(req, false);
    send.reserve_capacity(big.len());
    send.send_data(bytes::Bytes::copy_from_slice(&big[..12_000]), false).expect("data");
    let resp = c.head(&mut rf).expect("413 head");
    assert_eq!(resp.status(), 413);
    let mut body = resp.into_body();
    let text = String::from_utf8(c.body(&mut body)).expect("utf-8");
    assert!(text.contains("PAYLOAD_TOO_LARGE") || text.contains("413"), "{text}");
    // The connection goes on.
    assert_eq!(c.get("/health").status, 200);
    assert!(c.ended.is_none(), "the connection must stay open: {:?}", c.ended);
}

#[test]
fn head_gets_the_head_only() {
    let server = Server::start("");
    let mut c = H2Client::h2c(server.addr());
    let get = c.get("/health");
    let r = c.request("HEAD", "/health", &[], None);
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-length").map(str::to_owned), Some(get.body.len().to_string()));
    assert_eq!(c.get("/health").status, 200);
}

#[test]
fn an_upgrade_to_h2c_is_served_as_http1() {
    let server = Server::start("");
    let mut conn = server.conn();
    conn.send(
        format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
             HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
            server.addr()
        )
        .as_bytes(),
    );
    let r = conn.read_response();
    assert_eq!((r.version.as_str(), r.status), ("HTTP/1.1", 200), "{r:?}");
    assert!(r.header("upgrade").is_none());
}

#[test]
fn a_request_without_authority_uses_its_host_field_and_a_bad_one_is_400() {
    let server = Server::start("");
    let mut c = H2Client::h2c(server.addr());
    // `:authority` with an invalid host.
    let req = http::Request::get("http://bad_host!:99999/health").body(()).expect("req");
    let (mut rf, _) = c.start(req, true);
    let resp = c.head(&mut rf).expect("head");
    assert_eq!(resp.status(), 400);
    // No `:authority`: the `host` field plays its role.
    let host = server.addr().to_string();
    let req = http::Request::get("/health").header("host", host.as_str()).body(()).expect("req");
    let (mut rf, _) = c.start(req, true);
    let resp = c.head(&mut rf).expect("head");
    assert_eq!(resp.status(), 200);
    // Neither: 400, as a missing Host over HTTP/1.1.
    let req = http::Request::get("/health").body(()).expect("req");
    let (mut rf, _) = c.start(req, true);
    let resp = c.head(&mut rf).expect("head");
    assert_eq!(resp.status(), 400);
    let r = c.get("/health");
    assert_eq!(r.status, 200);
}

#[test]
fn a_garbage_preface_and_a_reset_flood_do_not_hurt_another_connection() {
    let server = Server::start("");
    let mut other = H2Client::h2c(server.addr());
    assert_eq!(other.get("/health").status, 200);
    // A garbage preface: HTTP/1.1 sees a bad request line.
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n\x00\x00\x00\x04\x00").expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(buf.starts_with(b"HTTP/1.1 4"), "{}", String::from_utf8_lossy(&buf));
    // A slow rapid reset: one request and its reset at a time.
    let mut c = H2Client::h2c(server.addr());
    let started = Instant::now();
    for _ in 0..400 {
        if c.ended.is_some() || c.eof {
            break;
        }
        let req = c.build("GET", "/health", &[]);
        let Ok((_rf, mut send)) = c.send.send_request(req, false) else { break };
        send.send_reset(h2::Reason::CANCEL);
        c.pump();
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    let resets = started.elapsed();
    assert!(c.wait_end(IO_TIMEOUT), "the connection must end");
    match &c.ended {
        Some(Err(e)) => assert_eq!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{e}"),
        other => panic!("GOAWAY(ENHANCE_YOUR_CALM) expected after {resets:?}: {other:?}"),
    }
    assert_eq!(H2Client::h2c(server.addr()).get("/health").status, 200);
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn an_idle_connection_gets_goaway_after_the_keepalive_timeout() {
    let server = Server::builder().set("limits", "keepalive_timeout_ms = 300").start();
    let mut c = H2Client::h2c(server.addr());
    assert_eq!(c.get("/health").status, 200);
    let t = Instant::now();
    assert!(c.wait_end(Duration::from_secs(5)), "no GOAWAY/close");
    assert!(t.elapsed() >= Duration::from_millis(250), "{:?}", t.elapsed());
}

#[test]
fn a_late_body_gets_408_on_its_stream() {
    let server = Server::builder().set("limits", "body_timeout_ms = 300").start();
    let mut c = H2Client::h2c(server.addr());
    let req = c.build("POST", "/api/v1/users", &[("content-type", "application/json")]);
    let (mut rf, _send) = c.start(req, false);
    let resp = c.head(&mut rf).expect("408 head");
    assert_eq!(resp.status(), 408);
    assert_eq!(c.get("/health").status, 200);
}

#[test]
fn sigterm_sends_goaway_and_an_open_stream_finishes() {
    let mut server = Server::start("");
    let mut c = H2Client::h2c(server.addr());
    assert_eq!(c.get("/health").status, 200);
    let req = c.build("POST", "/api/v1/users", &[("content-type", "application/json")]);
    let (mut rf, mut send) = c.start(req, false);
    c.pump();
    server.signal(Signal::SIGTERM);
    // The GOAWAY arrives: new streams are refused by the client library.
    let goaway = eventually(IO_TIMEOUT, || {
        c.pump();
        let req = c.build("GET", "/health", &[]);
        match c.send.poll_ready(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(Err(_)) => true,
            _ => c.send.clone().send_request(req, true).is_err(),
        }
    });
    assert!(goaway, "no GOAWAY\n{}", server.log_tail());
    // The open stream finishes.
    c.send_body(&mut send, b"{}");
    let resp = c.head(&mut rf).expect("the open stream's answer");
    assert_eq!(resp.status(), 422);
    assert!(c.wait_end(IO_TIMEOUT), "the connection ends");
    assert!(server.wait_exit(Duration::from_secs(15)).is_some(), "server exits");
}

/// `curl` with its HTTP/2 support, when installed: prior knowledge and a POST.
#[test]
fn curl_with_prior_knowledge_when_installed() {
    let has_h2 = curl_has_http2();
    if !has_h2 {
        eprintln!("curl with HTTP/2 not installed: skipped");
        return;
    }
    let server = Server::start("");
    let url = format!("http://{}/health", server.addr());
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http2-prior-knowledge", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{http_version}", &url])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 2", "{}", String::from_utf8_lossy(&out.stderr));
}

/// Pump until `body` (read as it comes, released) contains `needle`; returns what was read.
fn read_until(c: &mut H2Client, body: &mut h2::RecvStream, into: &mut Vec<u8>, needle: &str) -> String {
    c.until(IO_TIMEOUT, needle, |c| {
        let ended = c.body_now(body, into).expect("body");
        let text = String::from_utf8_lossy(into).into_owned();
        if text.contains(needle) {
            Some(())
        } else {
            assert!(!ended, "the body ended without {needle:?}: {text}");
            None
        }
    });
    String::from_utf8_lossy(into).into_owned()
}

#[test]
fn sse_over_h2_gets_heartbeats_a_notification_and_a_replay() {
    let server = Server::api_builder().set("sse", "heartbeat_ms = 300").start();
    let (_, admin) = server.admin();
    let mut c = H2Client::h2c(server.addr());
    let (mut rf, _) = c.start(c.build("GET", "/api/events", &[]), true);
    let resp = c.head(&mut rf).expect("head");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("text/event-stream"));
    for name in HOP_BY_HOP {
        assert!(resp.headers().get(name).is_none(), "{name}: {:?}", resp.headers());
    }
    let mut body = resp.into_body();
    let mut got = Vec::new();
    read_until(&mut c, &mut body, &mut got, "retry:");
    read_until(&mut c, &mut body, &mut got, "event: heartbeat");
    // Another stream on the same connection meanwhile.
    assert_eq!(c.get("/health").status, 200);
    let n = server.notify(&admin, "over h2", "hello");
    let text = read_until(&mut c, &mut body, &mut got, "over h2");
    assert!(text.contains("event: notification"), "{text}");
    // A second stream with Last-Event-ID 0 replays it.
    let (mut rf, _) = c.start(c.build("GET", "/api/events", &[("last-event-id", "0")]), true);
    let mut replay = c.head(&mut rf).expect("head").into_body();
    let mut got2 = Vec::new();
    let text = read_until(&mut c, &mut replay, &mut got2, "over h2");
    assert!(text.contains(&format!("id: {}", n["id"])), "{text}");
    // Two subscribers counted while open.
    assert!(server.get("/metrics").body_str().contains("sse"), "metrics");
}

#[test]
fn the_chat_echo_streams_over_h2() {
    let server = Server::api_builder().set("chat", "echo_delay_ms = 10").start();
    let mut c = H2Client::h2c(server.addr());
    let body = serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "one two three"}]})).unwrap();
    let r = c.request("POST", "/api/chat", &[("content-type", "application/json")], Some(&body));
    assert_eq!(r.status, 200, "{}", r.body_str());
    let text = r.body_str();
    assert!(text.contains("three") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(r.header("transfer-encoding").is_none());
}

/// A server with `[download] dir` in a temp dir holding `name` = `data`.
fn download_server(name: &str, data: &[u8]) -> (Server, tempfile::TempDir) {
    let tmp = tempfile::Builder::new().prefix("forkd-h2dl-").tempdir().expect("tempdir");
    std::fs::write(tmp.path().join(name), data).expect("write");
    let s = Server::builder().set("download", &format!("dir = \"{}\"", tmp.path().display())).start();
    (s, tmp)
}

fn pattern(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_download_with_range_and_head_over_h2() {
    let data = pattern(700_000);
    let (server, _tmp) = download_server("data.bin", &data);
    let mut c = H2Client::h2c(server.addr());
    let r = c.get("/download/data.bin");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("content-length"), Some("700000"));
    assert!(r.body == data, "the body differs ({} bytes)", r.body.len());
    let r = c.request("GET", "/download/data.bin", &[("range", "bytes=100000-100099")], None);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &data[100_000..100_100]);
    assert_eq!(r.header("content-range"), Some("bytes 100000-100099/700000"));
    let r = c.request("HEAD", "/download/data.bin", &[], None);
    assert_eq!((r.status, r.header("content-length")), (200, Some("700000")));
    assert!(r.body.is_empty());
}

#[test]
fn a_stalled_download_holds_bounded_memory_and_stalls_no_neighbour() {
    let size = 48 << 20;
    let (server, _tmp) = download_server("big.bin", &pattern(size));
    let worker = server.wait_workers(1, IO_TIMEOUT)[0];
    // A big connection window, the default stream window: only the download's stream stalls.
    let mut builder = h2::client::Builder::new();
    builder.initial_connection_window_size(64 << 20);
    let mut c = H2Client::h2c_with(server.addr(), builder);
    assert_eq!(c.get("/health").status, 200);
    let before = anon_rss_kib(worker);
    let (mut rf, _) = c.start(c.build("GET", "/download/big.bin", &[]), true);
    let resp = c.head(&mut rf).expect("head");
    assert_eq!(resp.status(), 200);
    // Never read: the stream's window (64 KiB) closes.
    let _body = resp.into_body();
    for _ in 0..100 {
        c.pump();
    }
    assert!(c.received < 1 << 20, "{} bytes past a closed window", c.received);
    // A neighbour on the same connection.
    let t = Instant::now();
    assert_eq!(c.get("/health").status, 200);
    assert!(t.elapsed() < Duration::from_secs(2));
    let after = anon_rss_kib(worker);
    assert!(after < before + 8 * 1024, "worker RSS {before} KiB → {after} KiB for a stalled {size}-byte download");
}

#[test]
fn the_homepage_gathers_its_upstreams_per_stream() {
    use crate::upstream::{Behaviour, Upstream};
    let up = Upstream::start(|r| {
        if r.path.ends_with("/orders") || r.path.ends_with("/recommendations") {
            Behaviour::json(200, &json!([]))
        } else {
            Behaviour::json(200, &json!({"id": 1, "name": "Upstream User", "avatar": "a.png"}))
        }
    });
    let url = up.url();
    let server = Server::api_builder()
        .set("upstreams", &format!("users = \"{url}\"\norders = \"{url}\"\nrecommendations = \"{url}\""))
        .start();
    let (_, token) = server.user("Home");
    let bearer = format!("Bearer {token}");
    let mut c = H2Client::h2c(server.addr());
    // Several at once on one connection, each waiting on its own upstream calls.
    let mut pending = Vec::new();
    for _ in 0..4 {
        let req = c.build("GET", "/api/homepage", &[("authorization", &bearer)]);
        pending.push(c.start(req, true).0);
    }
    for mut rf in pending {
        let resp = c.head(&mut rf).expect("head");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let v: serde_json::Value = serde_json::from_slice(&c.body(&mut body)).expect("json");
        assert_eq!(v["data"]["user"]["name"], json!("Upstream User"), "{v}");
    }
}

#[test]
fn the_chat_relay_streams_over_h2() {
    use crate::upstream::{After, Behaviour, Upstream};
    let mut pieces: Vec<(Duration, String)> = ["Hel", "lo ", "h2"]
        .iter()
        .map(|c| {
            let d = json!({"choices": [{"index": 0, "delta": {"content": c}}]});
            (Duration::from_millis(20), format!("data: {d}\n\n"))
        })
        .collect();
    pieces.push((Duration::ZERO, "data: [DONE]\n\n".to_string()));
    let up = Upstream::start(move |_| Behaviour::sse(pieces.clone(), After::Finish));
    let server = Server::api_builder()
        .set("chat", &format!("upstream = \"{}/v1/chat/completions\"\nmodel = \"m1\"", up.url()))
        .start();
    let mut c = H2Client::h2c(server.addr());
    let body = serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
    let r = c.request("POST", "/api/chat", &[("content-type", "application/json")], Some(&body));
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), server.log_tail());
    let text = r.body_str();
    for piece in ["Hel", "lo ", "h2"] {
        assert!(text.contains(piece), "{text}");
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(c.get("/health").status, 200);
}

/// A masked client text frame.
pub(crate) fn ws_text_frame(text: &str) -> Vec<u8> {
    let p = text.as_bytes();
    let mut f = vec![0x81];
    if p.len() < 126 {
        f.push(0x80 | p.len() as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(p.len() as u16).to_be_bytes());
    }
    let mask = [0x12, 0x34, 0x56, 0x78];
    f.extend_from_slice(&mask);
    f.extend(p.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Complete server frames at the start of `buf` (opcode, payload), removed from it.
pub(crate) fn ws_frames(buf: &mut Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    loop {
        if buf.len() < 2 {
            return frames;
        }
        let (mut at, mut len) = (2, (buf[1] & 0x7f) as usize);
        if len == 126 {
            if buf.len() < 4 {
                return frames;
            }
            len = u16::from_be_bytes([buf[2], buf[3]]) as usize;
            at = 4;
        } else if len == 127 {
            if buf.len() < 10 {
                return frames;
            }
            len = u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes")) as usize;
            at = 10;
        }
        if buf.len() < at + len {
            return frames;
        }
        frames.push((buf[0] & 0x0f, buf[at..at + len].to_vec()));
        buf.drain(..at + len);
    }
}

/// The next JSON text message on an h2 WebSocket whose content matches `pred`.
pub(crate) fn ws_recv_until(
    c: &mut H2Client,
    body: &mut h2::RecvStream,
    buf: &mut Vec<u8>,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut pending: std::collections::VecDeque<serde_json::Value> = Default::default();
    c.until(IO_TIMEOUT, "a WebSocket message", |c| {
        while let Some(m) = pending.pop_front() {
            if pred(&m) {
                return Some(m);
            }
        }
        let _ = c.body_now(body, buf).expect("body");
        for (op, payload) in ws_frames(buf) {
            if op == 1 {
                pending.push_back(serde_json::from_slice(&payload).expect("JSON message"));
            }
        }
        None
    })
}

#[test]
fn websocket_chat_by_extended_connect_meets_an_http1_member() {
    let s = Server::api_builder().start();
    let (ua, ta) = s.user("Alice");
    let (ub, tb) = s.user("Bob");
    let (a_id, b_id) = (ua["id"].as_i64().expect("id"), ub["id"].as_i64().expect("id"));
    let (mut c, resp, mut send) = crate::h2util::ws_connect(s.addr(), &ta);
    assert_eq!(resp.status(), 200, "{resp:?}\n{}", s.log_tail());
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let hello = ws_recv_until(&mut c, &mut body, &mut buf, |_| true);
    assert_eq!(hello["type"], json!("connected"), "{hello}");
    // Bob over HTTP/1.1 joins room r and sees his own marker (his join is in place).
    let (mut b, _) = s.ws_chat(&tb);
    b.send_json(&json!({"type": "join", "roomId": "r"}));
    b.send_json(&json!({"type": "chat", "roomId": "r", "content": "bob-marker"}));
    loop {
        let m = b.recv_json(IO_TIMEOUT).expect("bob's marker");
        if m["content"] == json!("bob-marker") {
            assert_eq!(m["from"], json!(b_id));
            break;
        }
    }
    // Alice (HTTP/2) chats in r: both get it.
    send.send_data(bytes::Bytes::from(ws_text_frame(&json!({"type": "join", "roomId": "r"}).to_string())), false)
        .expect("send");
    let hi = json!({"type": "chat", "roomId": "r", "content": "hello from h2"}).to_string();
    send.send_data(bytes::Bytes::from(ws_text_frame(&hi)), false).expect("send");
    let m = ws_recv_until(&mut c, &mut body, &mut buf, |m| m["content"] == json!("hello from h2"));
    assert_eq!(m["from"], json!(a_id));
    loop {
        let m = b.recv_json(IO_TIMEOUT).expect("alice's chat over HTTP/1.1");
        if m["content"] == json!("hello from h2") {
            assert_eq!(m["from"], json!(a_id));
            break;
        }
    }
    // Bob answers: Alice gets it on her stream.
    b.send_json(&json!({"type": "chat", "roomId": "r", "content": "hi back"}));
    let m = ws_recv_until(&mut c, &mut body, &mut buf, |m| m["content"] == json!("hi back"));
    assert_eq!(m["from"], json!(b_id));
    // Another stream on the same connection still works.
    assert_eq!(c.get("/health").status, 200);
    // `/ws` over HTTP/1.1 still works (Bob's), and a plain GET /ws over h2 is refused.
    let r = c.get(&format!("/ws?token={}", urlencode(&ta)));
    assert_eq!(r.status, 400, "{}", r.body_str());
}

#[test]
fn sigterm_ends_an_h2_event_stream_and_cuts_a_stuck_stream_at_the_deadline() {
    let mut server = Server::api_builder().top("shutdown_timeout_ms = 2000").start();
    let mut c = H2Client::h2c(server.addr());
    let (mut rf, _) = c.start(c.build("GET", "/api/events", &[]), true);
    let mut events = c.head(&mut rf).expect("head").into_body();
    let mut got = Vec::new();
    read_until(&mut c, &mut events, &mut got, "retry:");
    // A second stream that never finishes its body.
    let req = c.build("POST", "/api/v1/users", &[("content-type", "application/json")]);
    let (_stuck, _send) = c.start(req, false);
    c.pump();
    let t = Instant::now();
    server.signal(Signal::SIGTERM);
    // The event stream ends as over HTTP/1.1 (its END_STREAM), the other one is cut later.
    c.until(IO_TIMEOUT, "the end of the event stream", |c| {
        c.body_now(&mut events, &mut got).expect("body").then_some(())
    });
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
    assert!(c.wait_end(Duration::from_secs(5)), "the connection must be cut at the deadline");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some(), "the server exits");
}

/// `GET /` over HTTP/2: `103 Early Hints` before the page (seen through curl, when it has HTTP/2).
#[test]
fn get_root_sends_early_hints_over_h2_when_curl_is_installed() {
    let has_h2 = curl_has_http2();
    let server = Server::start("");
    // Whatever the client, the final response carries the same `Link` fields.
    let mut c = H2Client::h2c(server.addr());
    let r = c.get("/");
    assert_eq!(r.status, 200);
    let h1 = server.get("/");
    assert_eq!(
        r.headers.get_all("link").iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>(),
        h1.header_all("link")
    );
    if !has_h2 {
        eprintln!("curl with HTTP/2 not installed: the 103 itself is not checked");
        return;
    }
    let url = format!("http://{}/", server.addr());
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http2-prior-knowledge", "-D", "-", "-o", "/dev/null", &url])
        .output()
        .expect("curl");
    let heads = String::from_utf8_lossy(&out.stdout);
    let hints = heads.find("HTTP/2 103").unwrap_or_else(|| panic!("no 103: {heads}"));
    let page = heads.find("HTTP/2 200").unwrap_or_else(|| panic!("no 200: {heads}"));
    assert!(hints < page, "{heads}");
    assert!(heads[hints..page].to_ascii_lowercase().contains("link: <"), "{heads}");
}

/// Browsers send each cookie in its own `cookie` field over HTTP/2 (RFC 9113 §8.2.3):
/// every field reaches the handlers (which read them all), so the cookie refresh
/// (refresh cookie + CSRF cookie + header) works.
#[test]
fn split_cookie_fields_are_one_cookie_header_for_the_handlers() {
    let server = Server::start_api();
    let email = unique_email("h2cookie");
    server.signup("Cookie", &email, "correct horse 42", None);
    let mut c = H2Client::h2c(server.addr());
    let body = serde_json::to_vec(&json!({"email": email, "password": "correct horse 42"})).unwrap();
    let r = c.request("POST", "/api/v1/auth/login", &[("content-type", "application/json")], Some(&body));
    assert_eq!(r.status, 200, "{}", r.body_str());
    let cookie = |name: &str| {
        r.headers
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| {
                v.strip_prefix(&format!("{name}=")).map(|rest| rest.split(';').next().unwrap_or("").to_string())
            })
            .unwrap_or_else(|| panic!("no {name} cookie: {:?}", r.headers))
    };
    let (rt, csrf) = (cookie("refresh_token"), cookie("csrf_token"));
    let rt_field = format!("refresh_token={rt}");
    let csrf_field = format!("csrf_token={csrf}");
    let headers = [("cookie", rt_field.as_str()), ("cookie", csrf_field.as_str()), ("x-csrf-token", csrf.as_str())];
    let r = c.request("POST", "/api/v1/auth/refresh", &headers, Some(b""));
    assert_eq!(r.status, 200, "{}", r.body_str());
}

/// An h2 event stream whose reader never releases flow-control capacity: once
/// more than `MAX_BACKLOG` (1 MiB) of events wait behind its closed window, the
/// server resets that stream (RST_STREAM CANCEL) instead of buffering without
/// bound; the worker's memory stays bounded and the connection carries on.
#[test]
fn an_h2_event_stream_that_never_reads_is_reset_past_the_backlog() {
    let s = Server::api_builder().workers(1).start();
    let worker = s.wait_workers(1, IO_TIMEOUT)[0];
    let (_, admin) = s.admin();
    // A big connection window, the default stream window (65 535): only the event stream stalls.
    let mut builder = h2::client::Builder::new();
    builder.initial_connection_window_size(64 << 20);
    let mut c = H2Client::h2c_with(s.addr(), builder);
    assert_eq!(c.get("/health").status, 200);
    let (mut rf, _) = c.start(c.build("GET", "/api/events", &[]), true);
    let resp = c.head(&mut rf).expect("head");
    assert_eq!(resp.status(), 200, "{resp:?}");
    let mut events = resp.into_body();
    let mut got = Vec::new();
    // Subscribed once the preamble is there; from here on nothing is read or released.
    read_until(&mut c, &mut events, &mut got, "connected");
    let before = anon_rss_kib(worker);
    // Within the API's limits (characters, not bytes): 2000 four-byte characters of
    // body and 200 of title, about 9 KB an event; 160 of them are ~1.4 MB unsent.
    let body = "\u{1D11E}".repeat(2000);
    let title = "\u{1D11E}".repeat(190);
    let t = Instant::now();
    for i in 0..160 {
        s.notify(&admin, &format!("{title}{i:03}"), &body);
        c.pump();
    }
    assert!(t.elapsed() < Duration::from_secs(12), "publishing took {:?}", t.elapsed());
    // The server gives up on the stream (its log says so) …
    s.wait_log_line(IO_TIMEOUT, |l| l.contains("event stream is not reading"));
    let after = anon_rss_kib(worker);
    assert!(after < before + 16 * 1024, "worker RSS {before} KiB → {after} KiB for a stalled event stream");
    // … and, reading at last, the client finds the window's worth of events then RST_STREAM.
    let err = c.until(IO_TIMEOUT, "RST_STREAM on the event stream", |c| match c.body_now(&mut events, &mut got) {
        Err(e) => Some(e),
        Ok(true) => panic!("the event stream ended without a reset ({} bytes)", got.len()),
        Ok(false) => None,
    });
    assert!(err.is_reset() && err.is_remote(), "{err:?}");
    assert_eq!(err.reason(), Some(h2::Reason::CANCEL), "{err:?}");
    assert!(got.len() < 1 << 20, "{} bytes arrived past a closed stream window", got.len());
    // The connection is still fine: another stream on it, and a new connection.
    let t = Instant::now();
    assert_eq!(c.get("/health").status, 200);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(c.ended.is_none() && !c.eof, "the connection must survive the reset");
    assert_eq!(H2Client::h2c(s.addr()).get("/health").status, 200);
}
