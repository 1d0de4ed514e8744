//! Reference endpoints (CONTRACT §6: /health, /health/ready, /api/config), routing errors
//! (§3: 404, 405), the debug routes, and panics turned into 500 (the worker survives).

use std::time::Duration;

use crate::util::*;

protocols!(health_returns_ok_json);
fn health_returns_ok_json(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/health");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body_str(), r#"{"status":"ok"}"#, "{r:?}");
    assert_eq!(media_type(r.header("content-type")).as_deref(), Some("application/json"), "{r:?}");
    assert_eq!(r.header("content-length"), Some("15"), "{r:?}");
}

protocols!(health_ready_returns_ok);
fn health_ready_returns_ok(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/health/ready");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), serde_json::json!({"status": "ok"}), "{r:?}");
    assert_eq!(media_type(r.header("content-type")).as_deref(), Some("application/json"), "{r:?}");
}

protocols!(api_config_returns_envelope_with_cache_headers);
fn api_config_returns_envelope_with_cache_headers(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/api/config");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(media_type(r.header("content-type")).as_deref(), Some("application/json"), "{r:?}");
    let v = r.json();
    assert_eq!(v["code"], 200, "{r:?}");
    assert_eq!(v["message"], "OK", "{r:?}");
    assert!(v["data"].is_object(), "data must be an object of public settings: {r:?}");
    assert_eq!(r.header("cache-control"), Some("public, max-age=3600"), "{r:?}");
    let etag = r.header("etag").unwrap_or_else(|| panic!("no ETag: {r:?}"));
    assert!(
        etag.len() >= 3 && etag.starts_with('"') && etag.ends_with('"'),
        "ETag must be strong and quoted: {etag:?}"
    );
    // Stable across requests.
    let r2 = server.get("/api/config");
    assert_eq!(r2.header("etag"), Some(etag), "ETag changed between two requests: {r2:?}");
}

protocols!(api_config_does_not_leak_secrets);
fn api_config_does_not_leak_secrets(p: Proto) {
    let server = Server::builder()
        .set("auth", &format!("jwt_secret = \"{}\"", "S3cr3tValueForTests-0123456789abcdef"))
        .start()
        .on(p);
    let r = server.get("/api/config");
    assert_eq!(r.status, 200, "{r:?}");
    let b = r.body_str();
    assert!(!b.contains("S3cr3tValueForTests"), "the JWT secret appears in /api/config: {b}");
    assert!(!b.contains(&server.dir().display().to_string()), "a server path appears in /api/config: {b}");
}

fn config_etag(server: &Server) -> String {
    let r = server.get("/api/config");
    r.header("etag").unwrap_or_else(|| panic!("no ETag on /api/config: {r:?}")).to_string()
}

fn assert_304(server: &Server, inm: &str, etag: &str) {
    let mut c = server.session();
    let r = c.request("GET", "/api/config", &[("If-None-Match", inm)], b"");
    assert_eq!(r.status, 304, "If-None-Match: {inm}: {r:?}");
    assert_eq!(r.header("etag"), Some(etag), "304 must repeat the ETag: {r:?}");
    // No body: the next response on this connection must parse cleanly.
    let next = c.get("/health");
    assert_eq!(next.status, 200, "request after a 304 (a stray body would break it): {next:?}");
}

protocols!(api_config_if_none_match_exact_gives_304);
fn api_config_if_none_match_exact_gives_304(p: Proto) {
    let server = Server::start("").on(p);
    let etag = config_etag(&server);
    assert_304(&server, &etag, &etag);
}

protocols!(api_config_if_none_match_in_a_list_gives_304);
fn api_config_if_none_match_in_a_list_gives_304(p: Proto) {
    let server = Server::start("").on(p);
    let etag = config_etag(&server);
    assert_304(&server, &format!("\"other\", {etag}, \"x\""), &etag);
}

protocols!(api_config_if_none_match_star_gives_304);
fn api_config_if_none_match_star_gives_304(p: Proto) {
    let server = Server::start("").on(p);
    let etag = config_etag(&server);
    assert_304(&server, "*", &etag);
}

protocols!(api_config_if_none_match_mismatch_gives_200);
fn api_config_if_none_match_mismatch_gives_200(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get_with("/api/config", &[("If-None-Match", "\"definitely-not-it\"")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.json()["data"].is_object(), "{r:?}");
}

protocols!(unknown_path_is_404_json);
fn unknown_path_is_404_json(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/no/such/thing");
    assert_json_error(&r, 404, Some("NOT_FOUND"), "GET /no/such/thing");
    assert_eq!(r.json()["message"], "resource not found", "{r:?}");
}

protocols!(known_path_with_wrong_method_is_405_with_allow);
fn known_path_with_wrong_method_is_405_with_allow(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r = c.request("POST", "/health", &[("Content-Length", "0")], b"");
    assert_json_error(&r, 405, Some("METHOD_NOT_ALLOWED"), "POST /health");
    assert_eq!(r.header("allow"), Some("GET, HEAD"), "{r:?}");
    let r = c.request("DELETE", "/health", &[], b"");
    assert_json_error(&r, 405, Some("METHOD_NOT_ALLOWED"), "DELETE /health");
}

protocols!(debug_pid_reports_a_worker_pid);
fn debug_pid_reports_a_worker_pid(p: Proto) {
    let server = Server::start("").on(p);
    let pid = server.debug_pid();
    let workers = server.wait_workers(1, Duration::from_secs(5));
    assert_eq!(workers, vec![pid], "/_debug/pid must be the worker, a child of the supervisor {}", server.pid());
}

protocols!(debug_big_body_arrives_whole);
fn debug_big_body_arrives_whole(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/_debug/big?kb=2048");
    assert_eq!(r.status, 200, "{:?}", r.headers);
    assert_eq!(r.body.len(), 2048 * 1024, "{:?}", r.headers);
    assert!(r.body.iter().all(|&b| b == b'x'), "body is not all 'x'");
}

protocols!(debug_sleep_answers_after_sleeping);
fn debug_sleep_answers_after_sleeping(p: Proto) {
    let server = Server::start("").on(p);
    let t = std::time::Instant::now();
    let r = server.get("/_debug/sleep?ms=200");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["slept"], 200, "{r:?}");
    assert!(t.elapsed() >= Duration::from_millis(190), "answered too soon: {:?}", t.elapsed());
}

protocols!(debug_block_answers_after_blocking);
fn debug_block_answers_after_blocking(p: Proto) {
    let server = Server::start("").on(p);
    let t = std::time::Instant::now();
    let r = server.get("/_debug/block?ms=150");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(t.elapsed() >= Duration::from_millis(140), "answered too soon: {:?}", t.elapsed());
    server.assert_healthy();
}

protocols!(head_and_get_health_send_the_same_header_names);
fn head_and_get_health_send_the_same_header_names(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let get = c.get("/health");
    let head = c.request("HEAD", "/health", &[], b"");
    let names = |r: &Response| {
        let mut v: Vec<String> = r.headers.iter().map(|(k, _)| k.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&head), names(&get), "HEAD vs GET /health header names\nHEAD: {head:?}\nGET: {get:?}");
    for h in ["content-length", "content-type", "cache-control"] {
        assert_eq!(head.header(h), get.header(h), "HEAD vs GET /health `{h}`");
    }
}

protocols!(debug_routes_absent_when_disabled);
fn debug_routes_absent_when_disabled(p: Proto) {
    let server = Server::start("[debug]\nroutes = false").on(p);
    for path in ["/_debug/pid", "/_debug/panic", "/_debug/sleep?ms=1"] {
        let r = server.get(path);
        assert_json_error(&r, 404, Some("NOT_FOUND"), &format!("{path} with debug routes off"));
    }
}

/// The allocation counter exists only in a `count-alloc` build (bin/alloc-count): the
/// binary the tests run is a normal one, whose allocator counts nothing.
#[cfg(not(feature = "count-alloc"))]
#[test]
fn allocation_counts_are_not_served_by_a_normal_build() {
    let server = Server::start("");
    let r = server.get("/_debug/allocations");
    assert_json_error(&r, 404, Some("NOT_FOUND"), "/_debug/allocations without the count-alloc feature");
}

protocols!(handler_panic_is_500_and_worker_survives);
fn handler_panic_is_500_and_worker_survives(p: Proto) {
    let server = Server::start("").on(p);
    let before = server.debug_pid();
    let r = server.get("/_debug/panic");
    assert_json_error(&r, 500, Some("INTERNAL_ERROR"), "GET /_debug/panic");
    let v = r.json();
    assert_eq!(v["message"], "internal server error", "{r:?}");
    assert!(v["stack"].as_str().map(|s| !s.is_empty()).unwrap_or(false), "development errors carry a `stack`: {r:?}");
    assert_eq!(server.debug_pid(), before, "the worker was replaced after a handler panic");
}

protocols!(pool_job_panic_is_500_and_worker_survives);
fn pool_job_panic_is_500_and_worker_survives(p: Proto) {
    let server = Server::start("").on(p);
    let before = server.debug_pid();
    let r = server.get("/_debug/pool-panic");
    assert_json_error(&r, 500, Some("INTERNAL_ERROR"), "GET /_debug/pool-panic");
    assert_eq!(r.json()["message"], "internal server error", "{r:?}");
    assert_eq!(server.debug_pid(), before, "the worker was replaced after a pool-job panic");
    // The pool still works.
    let r = server.get("/_debug/sleep?ms=10");
    assert_eq!(r.status, 200, "pool after a panicking job: {r:?}");
}

protocols!(panic_keeps_the_connection_usable);
fn panic_keeps_the_connection_usable(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r = c.get("/_debug/panic");
    assert_eq!(r.status, 500, "{r:?}");
    if !r.closes() {
        let r = c.get("/health");
        assert_eq!(r.status, 200, "same connection after a 500: {r:?}");
    }
    // Several panics in a row do not wear the worker down.
    for _ in 0..5 {
        assert_eq!(server.get("/_debug/panic").status, 500);
        assert_eq!(server.get("/_debug/pool-panic").status, 500);
    }
    server.assert_healthy();
}
