//! The PROXY protocol (`proxy_protocol = true`, `tls.proxy_protocol = true`): a v1 or v2
//! header from a trusted balancer names the client (the access log's `client=`, the rate
//! limit's budget) on the plain and on the TLS listener; no header, a bad one, one that comes
//! too late or one from an untrusted peer closes the connection with no answer, and the
//! worker goes on serving. The test client is on 127.0.0.1, so trusting `127.0.0.1/32` makes
//! it the balancer.

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use crate::util::tls::{client_config, https_get_on, tls_server};
use crate::util::*;

const LOG_WAIT: Duration = Duration::from_secs(5);

/// A v1 header naming `client` (IPv4 or IPv6) to 127.0.0.1:443.
fn v1(client: &str, port: u16) -> Vec<u8> {
    let (family, dst) = if client.contains(':') { ("TCP6", "::1") } else { ("TCP4", "127.0.0.1") };
    format!("PROXY {family} {client} {dst} {port} 443\r\n").into_bytes()
}

/// A v2 header: `PROXY` naming the IPv4 `client` (with a TLV), or `LOCAL` when `None`.
fn v2(client: Option<[u8; 4]>) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    match client {
        Some(ip) => {
            // Addresses, ports, then a PP2_TYPE_AUTHORITY TLV the server skips.
            let body = [&ip[..], &[127, 0, 0, 1], &[0x30, 0x39, 0x01, 0xbb], &[0x02, 0x00, 0x01], b"a"].concat();
            h.extend_from_slice(&[0x21, 0x11]);
            h.extend_from_slice(&(body.len() as u16).to_be_bytes());
            h.extend_from_slice(&body);
        }
        None => h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]),
    }
    h
}

/// A server whose plain listener wants a PROXY header, rate-limited to 3 requests a client.
fn proxied(trusted: &str) -> Server {
    Server::builder()
        .top("proxy_protocol = true")
        .set("proxy", &format!("trusted = {trusted}"))
        .set("rate_limit", "enabled = true\nmax = 3\nwindow_secs = 900")
        .start()
}

/// `header` then `GET /api/config` (`X-Request-Id: id`) in one write, on a new connection.
fn call(s: &Server, header: &[u8], id: &str) -> Response {
    let mut c = s.conn();
    let req = request("GET", "/api/config", &[("X-Request-Id", id), ("Connection", "close")], b"");
    c.send(&[header, &req].concat());
    c.read_response()
}

/// The `client=` of the access line of request `id`.
fn logged_client(s: &Server, id: &str) -> String {
    let line = s.wait_log_line(LOG_WAIT, |l| l.contains(&format!(" id={id} ")));
    let client = line.split(' ').find_map(|f| f.strip_prefix("client="));
    client.unwrap_or_else(|| panic!("no client= in {line}")).to_string()
}

#[test]
fn v1_and_v2_headers_name_the_client_and_its_budget() {
    let s = proxied(r#"["127.0.0.1/32"]"#);
    let cases: [(&str, Vec<u8>, &str, &str); 6] = [
        ("v1-a", v1("198.51.100.7", 50000), "198.51.100.7", "2"),
        ("v2-a", v2(Some([198, 51, 100, 7])), "198.51.100.7", "1"),
        ("v1-b", v1("203.0.113.5", 1), "203.0.113.5", "2"),
        ("v1-v6", v1("2001:db8::17", 4711), "2001:db8::17", "2"),
        ("v2-local", v2(None), "127.0.0.1", "2"),
        ("v1-unknown", b"PROXY UNKNOWN\r\n".to_vec(), "127.0.0.1", "1"),
    ];
    for (id, header, client, remaining) in cases {
        let r = call(&s, &header, id);
        assert_eq!(r.status, 200, "{id}: {r:?}\n{}", s.log_tail());
        assert_eq!(logged_client(&s, id), client, "{id}: the access log's client");
        assert_eq!(r.header("ratelimit-remaining"), Some(remaining), "{id}: the client's own budget");
    }
}

#[test]
fn the_named_client_is_a_peer_like_any_other() {
    // 10.0.0.0/8 is an HTTP proxy behind the TCP balancer: its forwarded fields are believed.
    let s = proxied(r#"["127.0.0.1/32", "10.0.0.0/8"]"#);
    let xff = |header: Vec<u8>, id: &str, xff: &str| {
        let mut c = s.conn();
        let req = request("GET", "/health", &[("X-Request-Id", id), ("X-Forwarded-For", xff)], b"");
        c.send(&[&header[..], &req].concat());
        assert_eq!(c.read_response().status, 200, "{id}");
        logged_client(&s, id)
    };
    assert_eq!(xff(v1("10.1.2.3", 1), "via-proxy", "198.51.100.50"), "198.51.100.50", "a trusted proxy's word");
    assert_eq!(xff(v1("198.51.100.7", 1), "spoofed", "6.6.6.6"), "198.51.100.7", "a client's own field: ignored");
    assert_eq!(xff(v2(None), "local", "198.51.100.60"), "198.51.100.60", "LOCAL: the balancer, trusted, is the peer");
}

#[test]
fn http2_with_prior_knowledge_follows_the_header() {
    let s = proxied(r#"["127.0.0.1/32"]"#);
    let mut sock = TcpStream::connect_timeout(&s.addr(), IO_TIMEOUT).expect("connect");
    sock.write_all(&v2(Some([198, 51, 100, 33]))).expect("send the header");
    let mut h2 = crate::h2util::H2Client::h2c_on(sock, h2::client::Builder::new());
    let r = h2.request("GET", "/health", &[("x-request-id", "pp-h2c")], None);
    assert_eq!(r.status, 200, "{r:?}");
    let line = s.wait_log_line(LOG_WAIT, |l| l.contains(" id=pp-h2c "));
    assert!(line.contains(" client=198.51.100.33 protocol=HTTP/2.0 "), "{line}");
}

#[test]
fn a_header_split_across_writes_is_read_whole() {
    let s = proxied(r#"["127.0.0.1/32"]"#);
    for (id, header) in [("split-v1", v1("198.51.100.8", 8080)), ("split-v2", v2(Some([198, 51, 100, 9])))] {
        let mut c = s.conn();
        // Each piece on its own segment: the server sees a prefix, then waits for the rest.
        for piece in header.chunks(5) {
            c.send(piece);
            thread::sleep(Duration::from_millis(30));
        }
        c.send(&request("GET", "/health", &[("X-Request-Id", id)], b""));
        let r = c.read_response();
        assert_eq!(r.status, 200, "{id}: {r:?}");
        // The connection stays HTTP/1.1 keep-alive after the header: a second request on it.
        c.send(&request("GET", "/health", &[("X-Request-Id", &format!("{id}-again"))], b""));
        assert_eq!(c.read_response().status, 200, "{id}: a second request");
        let want = if id == "split-v1" { "198.51.100.8" } else { "198.51.100.9" };
        assert_eq!(logged_client(&s, &format!("{id}-again")), want);
    }
}

#[test]
fn no_header_or_a_bad_one_closes_the_connection_unanswered() {
    let s = Server::builder()
        .top("proxy_protocol = true")
        .set("proxy", r#"trusted = ["127.0.0.1/32"]"#)
        .set("limits", "header_timeout_ms = 500")
        .start();
    let bad: [(&str, &[u8]); 5] = [
        ("a request without a header", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("a TLS ClientHello without a header", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"),
        ("a v1 line with a bad address", b"PROXY TCP4 198.51.100.300 127.0.0.1 1 443\r\nGET / HTTP/1.1\r\n\r\n"),
        ("a v1 line with no CRLF", b"PROXY xxxxxxx"),
        ("a v2 header with a bad version", b"\r\n\r\n\0\r\nQUIT\n\x11\x11\x00\x0c"),
    ];
    for (what, bytes) in bad {
        let mut c = s.conn();
        c.send(bytes);
        if what.contains("no CRLF") {
            // The rest of a longest line, and more: refused at 107 bytes, not waited for.
            c.send(&[b'x'; 200]);
        }
        c.assert_closed(Duration::from_secs(3), what);
        assert_eq!(call(&s, &v1("198.51.100.1", 1), what).status, 200, "served after {what}");
    }
    // Nothing at all, or a prefix that never ends: closed at the header timeout.
    for (what, bytes) in [("silence", &b""[..]), ("half a header", &b"PROXY TCP4 198.51"[..])] {
        let mut c = s.conn();
        c.send(bytes);
        c.assert_closed(Duration::from_secs(5), what);
    }
    assert_eq!(call(&s, &v2(None), "after-timeouts").status, 200, "the worker still serves");
    // Each closed connection is counted (`/metrics` through a LOCAL header: a loopback peer).
    let mut c = s.conn();
    c.send(&[&v2(None)[..], &request("GET", "/metrics", &[], b"")].concat());
    let metrics = c.read_response().body_str();
    assert!(metrics.contains("\nforkd_proxy_protocol_refused_total 7\n"), "{metrics}");
}

#[test]
fn an_untrusted_peer_is_closed_before_its_header_is_read() {
    // The TLS listener wants the header; the plain one (the harness's readiness probe) not.
    let untrusted = "[proxy]\ntrusted = [\"10.0.0.0/8\"]\n";
    let (s, tls_addr, _pki, _dir) = tls_server(1, "proxy_protocol = true\n", untrusted);
    for header in [v1("198.51.100.7", 1), v2(Some([198, 51, 100, 7])), b"PROXY UNKNOWN\r\n".to_vec()] {
        let sock = TcpStream::connect_timeout(&tls_addr, IO_TIMEOUT).expect("connect");
        let mut c = Conn::from_stream(sock, None);
        // The write may already fail: the connection is closed as soon as it is accepted.
        let _ = c.try_write(&header);
        c.assert_closed(Duration::from_secs(3), "a header from 127.0.0.1, not in proxy.trusted");
    }
    assert_eq!(s.get("/health").status, 200, "the worker still serves");
    let metrics = s.get("/metrics").body_str();
    assert!(metrics.contains("\nforkd_proxy_protocol_refused_total 3\n"), "{metrics}");
}

#[test]
fn a_header_before_the_client_hello_names_the_client_over_tls() {
    let trusted = "[proxy]\ntrusted = [\"127.0.0.1/32\"]\n";
    let (s, tls_addr, pki, _dir) = tls_server(1, "proxy_protocol = true\n", trusted);
    let config = client_config(&pki, &[&rustls::version::TLS13]);
    let connect = |header: &[u8]| {
        let mut sock = TcpStream::connect_timeout(&tls_addr, IO_TIMEOUT).expect("connect");
        sock.write_all(header).expect("send the header");
        sock
    };
    for (id, header, client) in [("tls-v1", v1("198.51.100.21", 1), "198.51.100.21"), ("tls-v2", v2(None), "127.0.0.1")]
    {
        let r = https_get_on(connect(&header), &config, "/health", &[("X-Request-Id", id)]);
        assert_eq!(r.status, 200, "{id}: {}", r.head);
        assert_eq!(logged_client(&s, id), client, "{id}");
    }
    // A ClientHello with no header first: closed, no handshake.
    let mut c = Conn::from_stream(connect(b""), None);
    c.send(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03");
    c.assert_closed(Duration::from_secs(3), "a ClientHello without a header");
    // The plain listener has no `proxy_protocol`: served as ever.
    assert_eq!(s.get("/health").status, 200);
}
