//! HTTP/3 served by the workers (RFC 9114 over QUIC on the slot's UDP socket): the real binary
//! over real UDP on 127.0.0.1, spoken to with the blocking client in `h3client.rs`.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::h3client::{client_config, H3Client, TIMEOUT};
use crate::tls::tls_server;
use crate::util::*;

const H3_ON: &str = "[http3]\nenabled = true\n";

#[test]
fn health_and_a_json_route() {
    let (server, addr, pki, _d) = tls_server(1, "", H3_ON);
    server.wait_workers(1, Duration::from_secs(10));
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let r = c.get("/health");
    assert_eq!(r.status(), 200, "{r:?}\n{}", server.log_tail());
    assert!(r.header("content-type").is_some_and(|v| v.starts_with("application/json")), "{r:?}");
    let v = r.json();
    assert!(v.is_object(), "{v}");
    let missing = c.get("/nope");
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json()["code"], "NOT_FOUND", "{}", missing.body_str());
}
