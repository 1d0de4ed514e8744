//! Access log on stderr: one line per request, text and JSON formats, secrets redacted.

use std::time::Duration;

use crate::util::*;

const LOG_WAIT: Duration = Duration::from_secs(5);

/// All maximal runs of ASCII digits in `s`.
fn numbers(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).filter_map(|t| t.parse().ok()).collect()
}

/// A duration written like `12ms`, `0.4ms`, `350µs`, `350us`, `1.2s`, or `duration=3`.
fn has_duration(line: &str) -> bool {
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if !c.is_ascii_digit() {
            continue;
        }
        let rest = &line[i + 1..];
        if ["ms", "µs", "us", "ns", "s ", "s\t"].iter().any(|u| rest.starts_with(u)) || rest == "s" {
            return true;
        }
    }
    let l = line.to_ascii_lowercase();
    ["duration=", "duration_ms=", "took=", "elapsed=", "time="].iter().any(|k| l.contains(k))
}

#[test]
fn access_log_text_line_has_the_request_facts() {
    let server = Server::start("");
    let pid = server.debug_pid();
    let r = server.get_with("/_debug/big?kb=3", &[("X-Request-Id", "log-text-1")]);
    assert_eq!(r.status, 200, "{:?}", r.headers);
    let line = server.wait_log_line(LOG_WAIT, |l| l.contains("id=log-text-1"));
    let mut missing = Vec::new();
    if !line.contains("GET") {
        missing.push("method GET");
    }
    if !line.contains("/_debug/big") {
        missing.push("path /_debug/big");
    }
    if !numbers(&line).contains(&200) {
        missing.push("status 200");
    }
    if !numbers(&line).iter().any(|n| (3072..3072 + 4096).contains(n)) {
        missing.push("byte count (~3072)");
    }
    if !has_duration(&line) {
        missing.push("a duration");
    }
    if !line.contains(&format!("pid={pid}")) {
        missing.push("pid=<worker pid>");
    }
    assert!(missing.is_empty(), "access log line lacks {missing:?}:\n{line}");
}

protocols!(access_lines_name_the_client_the_proxy_forwarded);
fn access_lines_name_the_client_the_proxy_forwarded(p: Proto) {
    // Trusted (loopback is the proxy): the forwarded client; not trusted: the peer.
    for (trusted, want) in [("\"127.0.0.1/32\", \"::1/128\"", "203.0.113.9"), ("", "127.0.0.1")] {
        let server = Server::builder().set("proxy", &format!("trusted = [{trusted}]")).start().on(p);
        let id = format!("log-client-{}", trusted.len());
        let r = server.get_with("/health", &[("X-Request-Id", &id), ("X-Forwarded-For", "198.51.100.1, 203.0.113.9")]);
        assert_eq!(r.status, 200, "{r:?}");
        let line = server.wait_log_line(LOG_WAIT, |l| l.contains(&format!("id={id}")));
        assert!(line.contains(&format!(" client={want} ")), "trusted [{trusted}]: expected client={want}:\n{line}");
    }
}

#[test]
fn access_log_has_one_line_per_request() {
    let server = Server::start("");
    let mut c = server.conn();
    for i in 0..3 {
        let id = format!("one-line-{i}");
        c.send(&request("GET", "/health", &[("X-Request-Id", &id)], b""));
        assert_eq!(c.read_response().status, 200);
    }
    let r = server.get_with("/nope", &[("X-Request-Id", "one-line-404")]);
    assert_eq!(r.status, 404);
    server.wait_log_line(LOG_WAIT, |l| l.contains("id=one-line-404"));
    // Give the other lines the same chance, then count.
    for i in 0..3 {
        let id = format!("id=one-line-{i}");
        server.wait_log_line(LOG_WAIT, |l| l.contains(&id));
    }
    let logs = server.logs();
    for id in ["one-line-0", "one-line-1", "one-line-2", "one-line-404"] {
        let n = logs.lines().filter(|l| l.contains(&format!("id={id}"))).count();
        assert_eq!(n, 1, "expected exactly one access line for {id}, found {n}\nlog:\n{}", server.log_tail());
    }
    let line = logs.lines().find(|l| l.contains("id=one-line-404")).unwrap();
    assert!(numbers(line).contains(&404), "404 access line lacks the status: {line}");
}

#[test]
fn token_query_value_never_reaches_the_log() {
    let server = Server::start("");
    let secret = "SuperSecretTok3nValue";
    let r = server.get_with(&format!("/health?token={secret}&page=2"), &[("X-Request-Id", "log-redact-1")]);
    assert_eq!(r.status, 200, "{r:?}");
    let r = server.get_with(&format!("/nope?a=1&token={secret}"), &[("X-Request-Id", "log-redact-2")]);
    assert_eq!(r.status, 404, "{r:?}");
    let line = server.wait_log_line(LOG_WAIT, |l| l.contains("id=log-redact-1"));
    server.wait_log_line(LOG_WAIT, |l| l.contains("id=log-redact-2"));
    let logs = server.logs();
    assert!(!logs.contains(secret), "the token value appears in the log:\n{}", server.log_tail());
    assert!(line.contains("token=REDACTED"), "expected token=REDACTED in the access line:\n{line}");
}

#[test]
fn json_log_format_writes_only_json_objects() {
    let server = Server::start("log_format = \"json\"");
    let pid = server.debug_pid();
    let r = server.get_with("/health?token=JsonSecretTok", &[("X-Request-Id", "log-json-1")]);
    assert_eq!(r.status, 200, "{r:?}");
    let line = server.wait_log_line(LOG_WAIT, |l| l.contains("log-json-1"));
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("access line is not JSON ({e}):\n{line}"));
    let mut problems = Vec::new();
    if v["method"] != "GET" {
        problems.push(format!("method: {}", v["method"]));
    }
    if !v["path"].as_str().map(|p| p.starts_with("/health")).unwrap_or(false) {
        problems.push(format!("path: {}", v["path"]));
    }
    if v["status"] != 200 {
        problems.push(format!("status: {} (expected the number 200)", v["status"]));
    }
    if v["bytes"].as_u64().map(|b| b < 15).unwrap_or(true) {
        problems.push(format!("bytes: {}", v["bytes"]));
    }
    if !v["durationMs"].is_number() {
        problems.push(format!("durationMs: {}", v["durationMs"]));
    }
    if v["requestId"] != "log-json-1" {
        problems.push(format!("requestId: {}", v["requestId"]));
    }
    if v["pid"].as_i64() != Some(pid as i64) {
        problems.push(format!("pid: {} (worker is {pid})", v["pid"]));
    }
    assert!(problems.is_empty(), "JSON access line problems {problems:?}:\n{line}");
    let logs = server.logs();
    assert!(!logs.contains("JsonSecretTok"), "the token value appears in the JSON log");
    for l in logs.lines().filter(|l| !l.trim().is_empty()) {
        let ok = serde_json::from_str::<serde_json::Value>(l).map(|v| v.is_object()).unwrap_or(false);
        assert!(ok, "with log_format = \"json\" every stderr line must be a JSON object; this one is not:\n{l}");
    }
}

/// Regression: a request rejected after its head was parsed (here a bad chunk size) was
/// logged as `OTHER - 400`, losing the method and path.
#[test]
fn access_log_keeps_method_and_path_of_a_request_rejected_mid_body() {
    let server = Server::start("");
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 400, "{r:?}");
    let line = server.wait_log_line(LOG_WAIT, |l| l.contains(" 400 "));
    assert!(line.contains("POST /_debug/echo 400"), "method and path missing from:\n{line}");
}

#[test]
fn start_up_logs_the_supervisor_pid_and_the_url_to_open() {
    let server = Server::start("");
    let pid = server.pid();
    let starting = server.wait_log_line(LOG_WAIT, |l| l.contains("starting: "));
    assert!(
        starting.contains(&format!("supervisor pid {pid},")),
        "the start line must name the supervisor pid {pid}: {starting}"
    );
    let ready = server.wait_log_line(LOG_WAIT, |l| l.contains("ready: "));
    let url = format!("http://127.0.0.1:{}/", server.addr().port());
    assert!(
        ready.contains(&format!("supervisor pid {pid}:")),
        "the ready line must name the supervisor pid {pid}: {ready}"
    );
    assert!(ready.ends_with(&format!("open {url}")), "the ready line must end with the URL to open, {url}: {ready}");
    assert_eq!(server.get("/").status, 200, "the URL logged is the page");
}

/// The write syscalls a process has made (`/proc/PID/io`).
fn write_calls(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_else(|e| panic!("/proc/{pid}/io: {e}"));
    io.lines().find_map(|l| l.strip_prefix("syscw: ")).and_then(|v| v.trim().parse().ok()).expect("syscw")
}

/// Access lines are written once per loop turn, not once per request: 32 pipelined requests
/// answered in one turn cost the worker a handful of writes (the responses and the log), not
/// one more per request; and every line is there, in request order.
#[test]
fn access_lines_of_a_turn_go_out_in_one_write_and_in_order() {
    const N: usize = 32;
    let server = Server::start("");
    let pid = server.debug_pid();
    let mut c = server.conn();
    // Warm-up: the connection and the worker's buffers exist before the count starts.
    c.send(&request("GET", "/health", &[("x-request-id", "batch-warm")], b""));
    let _ = c.read_response();
    let before = write_calls(pid);
    let mut burst = Vec::new();
    for i in 0..N {
        burst.extend_from_slice(&request("GET", "/health", &[("x-request-id", &format!("batch-{i:02}"))], b""));
    }
    c.send(&burst);
    for _ in 0..N {
        let r = c.read_response();
        assert_eq!(r.status, 200, "{r:?}");
    }
    server.wait_log_line(LOG_WAIT, |l| l.contains("id=batch-31"));
    let writes = write_calls(pid) - before;
    assert!(writes < 8, "{N} pipelined requests took {writes} write calls: one access-log write per request?");
    let log = server.log_tail();
    let order: Vec<usize> = (0..N).filter_map(|i| log.find(&format!("id=batch-{i:02} "))).collect();
    assert_eq!(order.len(), N, "every request has its line:\n{log}");
    assert!(order.windows(2).all(|w| w[0] < w[1]), "the lines are in request order:\n{log}");
}

/// A user agent with what would end a quoted field or look like another field.
const QUOTING_UA: &str = r#"Mozilla/5.0 "quoted" \back pid=1 client=6.6.6.6"#;

protocols!(access_lines_carry_the_protocol_tls_agent_and_referer);
fn access_lines_carry_the_protocol_tls_agent_and_referer(p: Proto) {
    let (protocol, tls) = match p {
        Proto::H1 => ("HTTP/1.1", None),
        Proto::H2c => ("HTTP/2.0", None),
        Proto::H3 => ("HTTP/3.0", Some("TLSv1.3")),
    };
    let referer = "https://a.example/page?q=\"x\"";
    for json in [false, true] {
        let builder = if json { Server::builder().top("log_format = \"json\"") } else { Server::builder() };
        let s = builder.start().on(p);
        let id = format!("log-fields-{json}");
        let r = s.get_with("/health", &[("X-Request-Id", &id), ("User-Agent", QUOTING_UA), ("Referer", referer)]);
        assert_eq!(r.status, 200, "{r:?}");
        let line = s.wait_log_line(LOG_WAIT, |l| l.contains(&id));
        if json {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(v["protocol"], protocol, "{line}");
            assert_eq!(v["tls"].as_str(), tls, "{line}");
            assert_eq!((v["userAgent"].as_str(), v["referer"].as_str()), (Some(QUOTING_UA), Some(referer)), "{line}");
            assert_eq!(v["pid"].as_i64(), Some(i64::from(s.debug_pid())), "the agent's pid=1 is not the pid");
        } else {
            let want_tls = tls.map(|t| format!(" tls={t}")).unwrap_or_default();
            let ua = r#"ua="Mozilla/5.0 \"quoted\" \\back pid=1 client=6.6.6.6""#;
            let want =
                format!(" protocol={protocol}{want_tls} {ua} referer=\"https://a.example/page?q=\\\"x\\\"\" pid=");
            assert!(line.contains(&want), "expected {want:?} in:\n{line}");
            assert!(line.contains(" client=127.0.0.1 protocol="), "the real client, outside the quotes:\n{line}");
        }
    }
    // A request without either field: no key, in either format.
    let s = Server::builder().top("log_format = \"json\"").start().on(p);
    assert_eq!(s.get_with("/health", &[("X-Request-Id", "log-no-fields")]).status, 200);
    let line = s.wait_log_line(LOG_WAIT, |l| l.contains("log-no-fields"));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let agent = v.get("userAgent").and_then(|a| a.as_str());
    assert!(agent.is_none_or(|a| !a.is_empty()) && v.get("referer").is_none(), "{line}");
}

#[test]
fn access_lines_name_the_tls_version_of_the_connection_on_h1_and_h2() {
    use crate::util::tls::{client_config, https_get_on, tls_server};
    let (s, tls_addr, pki, _dir) = tls_server(1, "", "");
    for (version, name) in [(&rustls::version::TLS13, "TLSv1.3"), (&rustls::version::TLS12, "TLSv1.2")] {
        let id = format!("log-{name}");
        let sock = std::net::TcpStream::connect_timeout(&tls_addr, IO_TIMEOUT).expect("connect");
        let r = https_get_on(sock, &client_config(&pki, &[version]), "/health", &[("X-Request-Id", &id)]);
        assert_eq!(r.status, 200, "{}", r.head);
        let line = s.wait_log_line(LOG_WAIT, |l| l.contains(&format!(" id={id} ")));
        assert!(line.contains(&format!(" protocol=HTTP/1.1 tls={name} ")), "{line}");
    }
    // HTTP/2 over the same TLS listener (ALPN h2) names both.
    let mut h2 = crate::h2util::H2Client::tls(tls_addr, crate::h2util::h2_tls_config(&pki.ca_pem));
    let r = h2.request("GET", "/health", &[("x-request-id", "log-h2-tls")], None);
    assert_eq!(r.status, 200, "{r:?}");
    let line = s.wait_log_line(LOG_WAIT, |l| l.contains(" id=log-h2-tls "));
    assert!(line.contains(" protocol=HTTP/2.0 tls=TLSv1.3 "), "{line}");
    let line = {
        assert_eq!(s.get_with("/health", &[("X-Request-Id", "log-plain")]).status, 200);
        s.wait_log_line(LOG_WAIT, |l| l.contains(" id=log-plain "))
    };
    assert!(line.contains(" protocol=HTTP/1.1 ") && !line.contains(" tls="), "plain: no tls=\n{line}");
}
