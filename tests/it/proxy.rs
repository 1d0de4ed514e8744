//! The real client behind a proxy (`[proxy] trusted`): from a trusted peer, the rate limit,
//! `/metrics`' loopback check and the https redirect go by the client `X-Forwarded-For`,
//! `Forwarded` and `X-Forwarded-Proto` name; from any other peer those headers are spoofing
//! and change nothing. The test client is on 127.0.0.1, so trusting `127.0.0.1/32` makes it
//! the proxy.

use std::fs;

use serde_json::json;

use crate::util::*;

/// A server with `[rate_limit] max = 3` whose `[proxy] trusted` is `trusted` (TOML array).
fn limited(trusted: &str) -> ServerBuilder {
    Server::builder()
        .set("rate_limit", "enabled = true\nmax = 3\nwindow_secs = 900")
        .set("proxy", &format!("trusted = {trusted}"))
}

/// `GET /api/config` with `headers`: its `RateLimit-Remaining`, or `429` when refused.
fn remaining(s: &Server, headers: &[(&str, &str)]) -> String {
    let r = s.get_with("/api/config", headers);
    match r.status {
        429 => "429".to_string(),
        200 => r.header("ratelimit-remaining").unwrap_or("none").to_string(),
        _ => panic!("GET /api/config with {headers:?}: {r:?}\n{}", s.log_tail()),
    }
}

protocols!(a_trusted_proxy_gives_each_forwarded_client_its_own_budget);
fn a_trusted_proxy_gives_each_forwarded_client_its_own_budget(p: Proto) {
    let s = limited(r#"["127.0.0.1/32", "::1/128"]"#).start().on(p);
    let a = [("X-Forwarded-For", "198.51.100.1")];
    let b = [("X-Forwarded-For", "198.51.100.2")];
    ensure_eq!(s, remaining(&s, &a), "2", "client A's first request");
    ensure_eq!(s, remaining(&s, &a), "1", "client A's second request shares A's budget");
    ensure_eq!(s, remaining(&s, &b), "2", "client B has a budget of its own");
    // What a client writes to the left of what the proxy appended is not believed.
    let a_spoofing = [("X-Forwarded-For", "203.0.113.99, 198.51.100.1")];
    ensure_eq!(s, remaining(&s, &a_spoofing), "0", "A naming another address on the left is still A");
    ensure_eq!(s, remaining(&s, &a), "429", "A has spent its budget");
    // `Forwarded` names the same client the same way; it wins over X-Forwarded-For.
    let b_forwarded = [("Forwarded", "for=198.51.100.2;proto=http"), ("X-Forwarded-For", "198.51.100.1")];
    ensure_eq!(s, remaining(&s, &b_forwarded), "1", "B by Forwarded");
    let b_v6 = [("Forwarded", r#"for="[2001:db8::2]:4711""#)];
    ensure_eq!(s, remaining(&s, &b_v6), "2", "an IPv6 client has its own budget");
    ensure_eq!(s, remaining(&s, &[]), "2", "the proxy's own requests count for the proxy");
}

protocols!(login_failures_count_per_forwarded_client);
fn login_failures_count_per_forwarded_client(p: Proto) {
    let s = Server::builder()
        .fast_argon2()
        .jwt_secret(TEST_JWT_SECRET)
        .set("rate_limit", "enabled = true\nmax = 1000\nwindow_secs = 900\nlogin_max_failures = 2")
        .set("proxy", r#"trusted = ["127.0.0.1/32"]"#)
        .start()
        .on(p);
    let email = unique_email("proxied");
    s.create_user(&email, "Proxied", "user", "right-password-1");
    let login = |client: &str, pw: &str| -> Response {
        let body = serde_json::to_vec(&json!({"email": email, "password": pw})).expect("json");
        let headers = [("Content-Type", "application/json"), ("X-Forwarded-For", client)];
        s.call_t("POST", "/api/v1/auth/login", &headers, &body, SLOW_IO_TIMEOUT)
    };
    for i in 1..=2 {
        s.expect_err(&login("198.51.100.1", "wrong"), 401, "UNAUTHORIZED", &format!("client A's failure #{i}"));
    }
    let r = login("198.51.100.1", "right-password-1");
    ensure_eq!(s, r.status, 429, "client A spent its failures: {r:?}");
    s.expect_data(&login("198.51.100.2", "right-password-1"), 200, "client B has failures of its own left");
}

protocols!(from_an_untrusted_peer_forwarded_headers_are_ignored);
fn from_an_untrusted_peer_forwarded_headers_are_ignored(p: Proto) {
    // Nothing trusted (the default), then a trusted network that is not the client's.
    for trusted in ["[]", r#"["10.0.0.0/8"]"#] {
        let s = limited(trusted).start().on(p);
        let spoofs: [&[(&str, &str)]; 4] = [
            &[("X-Forwarded-For", "198.51.100.1")],
            &[("X-Forwarded-For", "198.51.100.2")],
            &[("Forwarded", "for=198.51.100.3")],
            &[("X-Forwarded-For", "198.51.100.4"), ("X-Real-IP", "198.51.100.4")],
        ];
        let got: Vec<String> = spoofs.iter().map(|h| remaining(&s, h)).collect();
        ensure_eq!(s, got, ["2", "1", "0", "429"], "trusted = {trusted}: one budget, the peer's, for every spoof");
    }
}

protocols!(metrics_stay_closed_to_clients_a_local_proxy_forwards);
fn metrics_stay_closed_to_clients_a_local_proxy_forwards(p: Proto) {
    let s = Server::builder().set("proxy", r#"trusted = ["127.0.0.1/32"]"#).start().on(p);
    ensure_eq!(s, s.get("/metrics").status, 200, "the proxy host itself scrapes /metrics");
    let remote = s.get_with("/metrics", &[("X-Forwarded-For", "198.51.100.1")]);
    ensure_eq!(s, remote.status, 404, "a remote client through the local proxy: {remote:?}");
    let local = s.get_with("/metrics", &[("X-Forwarded-For", "127.0.0.1")]);
    ensure_eq!(s, local.status, 200, "a loopback client through the proxy: {local:?}");
}

both!(a_proxy_that_terminated_tls_is_not_redirected_to_https);
fn a_proxy_that_terminated_tls_is_not_redirected_to_https(p: Proto) {
    for (trusted, want) in [(r#"["127.0.0.1/32"]"#, 200), ("[]", 308)] {
        let s = Server::builder()
            .http3() // a TLS listener, which `redirect_http` needs
            .set("tls", "redirect_http = true")
            .set("proxy", &format!("trusted = {trusted}"))
            .start()
            .on(p);
        ensure_eq!(s, s.get("/api/config").status, 308, "trusted = {trusted}: plain HTTP moves to https");
        let r = s.get_with("/api/config", &[("X-Forwarded-Proto", "https")]);
        ensure_eq!(s, r.status, want, "trusted = {trusted}: the proxy says its client used https: {r:?}");
        let r = s.get_with("/api/config", &[("Forwarded", "for=198.51.100.1;proto=https")]);
        ensure_eq!(s, r.status, want, "trusted = {trusted}: Forwarded proto=https: {r:?}");
    }
}

/// HTTP/3 is always https: a scheme in the fields changes that only when a trusted proxy
/// wrote it (its client came over http, so the request moves to https as any plain one);
/// from any other peer `proto=http` is spoofing and the connection's own https stands.
#[test]
fn over_http3_a_forwarded_scheme_counts_only_from_a_trusted_proxy() {
    with_http3(|| {
        for (trusted, want) in [("[]", 200), (r#"["10.0.0.0/8"]"#, 200), (r#"["127.0.0.1/32", "::1/128"]"#, 308)] {
            let s = Server::builder()
                .http3()
                .set("tls", "redirect_http = true")
                .set("proxy", &format!("trusted = {trusted}"))
                .start()
                .on(Proto::H3);
            ensure_eq!(s, s.get("/api/config").status, 200, "trusted = {trusted}: HTTP/3 is https already");
            let spoofs: [&[(&str, &str)]; 2] =
                [&[("X-Forwarded-Proto", "http")], &[("Forwarded", "for=198.51.100.1;proto=http")]];
            for spoof in spoofs {
                let r = s.get_with("/api/config", spoof);
                ensure_eq!(s, r.status, want, "trusted = {trusted}: {spoof:?}: {r:?}");
            }
        }
    });
}

#[test]
fn a_bad_network_stops_serve_with_one_line_and_exit_2() {
    let d = tempfile::tempdir().expect("temp dir");
    let extra = "[proxy]\ntrusted = [\"10.0.0.0/8\", \"10.0.0.0/33\"]\n";
    let path = d.path().join("forkd.toml");
    fs::write(&path, render_config(&format!("127.0.0.1:{}", free_port()), &d.path().join("data"), extra))
        .expect("write config");
    let out = run_forkd(d.path(), &["serve", "--config", path.to_str().expect("utf-8")], &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    let want = r#"proxy.trusted[1] = "10.0.0.0/33": must be an address or a network addr/prefix (10.0.0.0/8, ::1/128)"#;
    assert_eq!(out.stderr.trim_end(), format!("forkd: config: {want}"), "one line: {out:?}");
}
