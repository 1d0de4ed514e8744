//! Origin check on unsafe methods and CORS (CONTRACT §5 CSRF, §6 CORS), with
//! `public_origin = "http://app.example"` and `[cors] origins = ["http://allowed.example"]`.

use serde_json::json;

use crate::util::*;

const PW: &str = "user-password-1";
const APP: &str = "http://app.example";
const ALLOWED: &str = "http://allowed.example";
const EVIL: &str = "http://evil.example";

fn start() -> Server {
    Server::api_builder()
        .top(&format!("public_origin = \"{APP}\""))
        .set("cors", &format!("origins = [\"{ALLOWED}\"]"))
        .start()
}

fn cors_headers(r: &Response) -> Vec<(String, String)> {
    r.headers.iter().filter(|(k, _)| k.starts_with("access-control-")).cloned().collect()
}

/// Comma-separated tokens of every `name` header, lower-cased.
fn tokens(r: &Response, name: &str) -> Vec<String> {
    r.header_all(name).iter().flat_map(|v| v.split(',')).map(|t| t.trim().to_ascii_lowercase()).collect()
}

// HTTP/3: a server with HTTP/3 has a TLS listener, whose `public_origin` must be https;
// these tests pin `public_origin = "http://app.example"`.
both!(unsafe_methods_from_a_foreign_origin_are_403);
fn unsafe_methods_from_a_foreign_origin_are_403(p: Proto) {
    let s = start().on(p);
    let (admin_user, admin) = s.admin();
    let (victim, victim_token) = s.user("Victim");
    let vpath = format!("/api/v1/users/{}", victim["id"]);
    let before = s.user_total(&admin, "");
    for origin in
        [EVIL, "null", "https://app.example", "http://app.example:8080", "http://allowed.example.evil.example"]
    {
        let email = unique_email("cross");
        let r = s.api_h(
            "POST",
            "/api/v1/users",
            None,
            Some(&json!({"name": "X", "email": email, "password": PW})),
            &[("Origin", origin)],
        );
        s.expect_err(&r, 403, "FORBIDDEN", &format!("POST sign-up with Origin: {origin}"));
        let r =
            s.api_h("PATCH", &vpath, Some(&victim_token), Some(&json!({"name": "Hijacked"})), &[("Origin", origin)]);
        s.expect_err(&r, 403, "FORBIDDEN", &format!("PATCH with Origin: {origin}"));
        let r = s.api_h(
            "PUT",
            &vpath,
            Some(&victim_token),
            Some(&json!({"name": "Hijacked", "email": email, "age": 1})),
            &[("Origin", origin)],
        );
        s.expect_err(&r, 403, "FORBIDDEN", &format!("PUT with Origin: {origin}"));
        let r = s.api_h("DELETE", &vpath, Some(&victim_token), None, &[("Origin", origin)]);
        s.expect_err(&r, 403, "FORBIDDEN", &format!("DELETE with Origin: {origin}"));
        let r = s.api_h(
            "POST",
            "/api/v1/auth/login",
            None,
            Some(&json!({"email": admin_user["email"], "password": "admin-password-1"})),
            &[("Origin", origin)],
        );
        s.expect_err(&r, 403, "FORBIDDEN", &format!("POST login with Origin: {origin}"));
    }
    ensure_eq!(s, s.user_total(&admin, ""), before, "no user created by cross-origin sign-ups");
    let g = s.expect_data(&s.api("GET", &vpath, Some(&admin), None), 200, "the victim after cross-origin writes");
    ensure_eq!(s, g, victim, "the victim is unchanged");
}

// HTTP/3: a server with HTTP/3 has a TLS listener, whose `public_origin` must be https;
// these tests pin `public_origin = "http://app.example"`.
both!(unsafe_methods_from_our_own_an_allowed_or_no_origin_are_processed);
fn unsafe_methods_from_our_own_an_allowed_or_no_origin_are_processed(p: Proto) {
    let s = start().on(p);
    for origin in [Some(APP), Some(ALLOWED), None] {
        let extra: Vec<(&str, &str)> = origin.map(|o| vec![("Origin", o)]).unwrap_or_default();
        let what = format!("Origin: {origin:?}");
        let email = unique_email("same");
        let r = s.api_h(
            "POST",
            "/api/v1/users",
            None,
            Some(&json!({"name": "Same", "email": email, "password": PW})),
            &extra,
        );
        let u = s.expect_data(&r, 201, &format!("sign-up, {what}"));
        let path = format!("/api/v1/users/{}", u["id"]);
        let body = serde_json::to_vec(&json!({"email": email, "password": PW})).unwrap();
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(&extra);
        let r = s.call_t("POST", "/api/v1/auth/login", &h, &body, SLOW_IO_TIMEOUT);
        let token = s.expect_data(&r, 200, &format!("login, {what}"))["accessToken"].as_str().unwrap().to_string();
        let r = s.api_h("PATCH", &path, Some(&token), Some(&json!({"age": 9})), &extra);
        s.expect_data(&r, 200, &format!("PATCH, {what}"));
        let auth = format!("Bearer {token}");
        let mut h = vec![("Authorization", auth.as_str())];
        h.extend_from_slice(&extra);
        s.expect_bodyless("DELETE", &path, &h, 204, &format!("DELETE, {what}"));
    }
}

// HTTP/3: a server with HTTP/3 has a TLS listener, whose `public_origin` must be https;
// these tests pin `public_origin = "http://app.example"`.
both!(allowed_origin_gets_cors_headers_with_credentials_and_vary);
fn allowed_origin_gets_cors_headers_with_credentials_and_vary(p: Proto) {
    let s = start().on(p);
    let (_, admin) = s.admin();
    let r = s.api_h("GET", "/api/v1/users", Some(&admin), None, &[("Origin", ALLOWED)]);
    s.expect_data(&r, 200, "GET with the allowed Origin");
    ensure_eq!(s, r.header("access-control-allow-origin"), Some(ALLOWED), "Access-Control-Allow-Origin in {r:?}");
    ensure_eq!(
        s,
        r.header("access-control-allow-credentials"),
        Some("true"),
        "Access-Control-Allow-Credentials in {r:?}"
    );
    ensure!(s, tokens(&r, "vary").iter().any(|t| t == "origin"), "Vary must include Origin: {r:?}");
    let r = s.api_h(
        "POST",
        "/api/v1/users",
        None,
        Some(&json!({"name": "C", "email": unique_email("c"), "password": PW})),
        &[("Origin", ALLOWED)],
    );
    s.expect_data(&r, 201, "POST with the allowed Origin");
    ensure_eq!(s, r.header("access-control-allow-origin"), Some(ALLOWED), "ACAO on a POST in {r:?}");
}

// HTTP/3: a server with HTTP/3 has a TLS listener, whose `public_origin` must be https;
// these tests pin `public_origin = "http://app.example"`.
both!(preflight_from_the_allowed_origin_is_204_with_methods_and_headers);
fn preflight_from_the_allowed_origin_is_204_with_methods_and_headers(p: Proto) {
    let s = start().on(p);
    let r = s.expect_bodyless(
        "OPTIONS",
        "/api/v1/users",
        &[
            ("Origin", ALLOWED),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization, content-type"),
        ],
        204,
        "preflight from the allowed origin",
    );
    ensure_eq!(s, r.header("access-control-allow-origin"), Some(ALLOWED), "preflight ACAO in {r:?}");
    ensure_eq!(s, r.header("access-control-allow-credentials"), Some("true"), "preflight ACAC in {r:?}");
    let methods = tokens(&r, "access-control-allow-methods");
    ensure!(s, methods.iter().any(|m| m == "post"), "Access-Control-Allow-Methods must contain POST: {r:?}");
    let headers = tokens(&r, "access-control-allow-headers");
    for h in ["authorization", "content-type"] {
        ensure!(s, headers.iter().any(|x| x == h), "Access-Control-Allow-Headers must contain {h}: {r:?}");
    }
    ensure!(s, tokens(&r, "vary").iter().any(|t| t == "origin"), "preflight Vary must include Origin: {r:?}");
}

// HTTP/3: a server with HTTP/3 has a TLS listener, whose `public_origin` must be https;
// these tests pin `public_origin = "http://app.example"`.
both!(a_foreign_origin_gets_no_cors_header_at_all);
fn a_foreign_origin_gets_no_cors_header_at_all(p: Proto) {
    let s = start().on(p);
    let (_, admin) = s.admin();
    let r = s.api_h("GET", "/api/v1/users", Some(&admin), None, &[("Origin", EVIL)]);
    s.expect_data(&r, 200, "GET (a safe method) with a foreign Origin is processed");
    ensure!(s, cors_headers(&r).is_empty(), "no Access-Control-* for {EVIL}: {r:?}");
    let r = s.call(
        "OPTIONS",
        "/api/v1/users",
        &[
            ("Origin", EVIL),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization, content-type"),
        ],
        b"",
    );
    ensure!(s, r.status < 500, "preflight from a foreign origin must not fail the server: {r:?}");
    ensure!(s, cors_headers(&r).is_empty(), "no Access-Control-* on a preflight from {EVIL}: {r:?}");
    let r = s.call("GET", "/health", &[("Origin", EVIL)], b"");
    ensure!(s, r.status == 200 && cors_headers(&r).is_empty(), "GET /health from {EVIL}: no Access-Control-*: {r:?}");
}

// HTTP/3: a server with HTTP/3 has a TLS listener, whose `public_origin` must be https;
// these tests pin `public_origin = "http://app.example"`.
both!(more_than_one_origin_line_is_403);
/// Regression: only the first `Origin` line was checked, so a good origin first and a
/// foreign one second passed. More than one `Origin` line on an unsafe method is 403, and so
/// is it on the WebSocket upgrade.
fn more_than_one_origin_line_is_403(p: Proto) {
    let s = start().on(p);
    let (_, token) = s.user("Twice");
    let pairs = [(APP, EVIL), (ALLOWED, EVIL), (APP, APP), (EVIL, APP)];
    for (first, second) in pairs {
        let what = format!("Origin: {first} then Origin: {second}");
        let email = unique_email("twice");
        let r = s.api_h(
            "POST",
            "/api/v1/users",
            None,
            Some(&json!({"name": "Twice", "email": email, "password": PW})),
            &[("Origin", first), ("Origin", second)],
        );
        s.expect_err(&r, 403, "FORBIDDEN", &format!("POST sign-up, {what}"));
        let path = format!("/ws?token={}", urlencode(&token));
        match s.ws_try(&path, &[("Origin", first), ("Origin", second)]) {
            Ok(_) => panic!("WebSocket upgrade with {what}: upgraded, expected 403\nlog:\n{}", s.log_tail()),
            Err(r) => {
                s.expect_err(&r, 403, "FORBIDDEN", &format!("WebSocket upgrade, {what}"));
            }
        }
    }
    // One good line is still fine.
    let email = unique_email("once");
    let r = s.api_h(
        "POST",
        "/api/v1/users",
        None,
        Some(&json!({"name": "Once", "email": email, "password": PW})),
        &[("Origin", APP)],
    );
    s.expect_data(&r, 201, "sign-up with one good Origin line");
}
