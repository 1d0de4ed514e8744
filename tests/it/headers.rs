//! Headers on every response: the security set, the CSP (an HTML document's with a fresh
//! nonce, every other response's one fixed policy), `Date`, `Server`, `Cache-Control`, and
//! `x-request-id`.

use crate::util::*;

const FIXED: [(&str, &str); 9] = [
    ("strict-transport-security", "max-age=31536000; includeSubDomains; preload"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("x-xss-protection", "0"),
    ("referrer-policy", "strict-origin-when-cross-origin"),
    ("permissions-policy", "camera=(), microphone=(), geolocation=()"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-embedder-policy", "require-corp"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// The policy of every response that is not an HTML document: the same bytes every time.
const API_CSP: &str =
    "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; report-uri /csp-report";

/// An HTML document's CSP with the nonce `n` in both places.
fn csp_for(n: &str) -> String {
    format!(
        "default-src 'none'; script-src 'nonce-{n}' 'strict-dynamic'; style-src 'self' 'nonce-{n}'; \
         img-src 'self'; font-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; \
         form-action 'self'; report-uri /csp-report"
    )
}

/// Extracts the nonce from a CSP value and checks the whole value against the template.
fn csp_nonce(value: &str) -> Result<String, String> {
    let start = value.find("'nonce-").ok_or_else(|| format!("no 'nonce-…' in CSP {value:?}"))? + 7;
    let len = value[start..].find('\'').ok_or_else(|| format!("unterminated nonce in CSP {value:?}"))?;
    let n = &value[start..start + len];
    let expected = csp_for(n);
    if value != expected {
        return Err(format!("CSP differs from the contract\n expected: {expected}\n actual:   {value}"));
    }
    if n.len() < 16
        || !n.bytes().all(|c| c.is_ascii_alphanumeric() || b"+/=-_".contains(&c))
        || base64_decode(n).is_none()
    {
        return Err(format!("nonce {n:?} is not base64 of at least 12 bytes"));
    }
    Ok(n.to_string())
}

/// Every problem with the §4 header set on `r` (`report_only`: the CSP header name).
fn security_header_problems(r: &Response, report_only: bool) -> Vec<String> {
    let mut p = Vec::new();
    for (name, want) in FIXED {
        match r.header_all(name).as_slice() {
            [v] if *v == want => {}
            vs => p.push(format!("{name}: expected [{want:?}], got {vs:?}")),
        }
    }
    let (csp_name, other) = if report_only {
        ("content-security-policy-report-only", "content-security-policy")
    } else {
        ("content-security-policy", "content-security-policy-report-only")
    };
    let document = r.header("content-type").is_some_and(|t| t.starts_with("text/html"));
    match r.header_all(csp_name).as_slice() {
        [v] if document => {
            if let Err(e) = csp_nonce(v) {
                p.push(e);
            }
        }
        [v] if *v != API_CSP => p.push(format!("{csp_name}: expected the fixed policy {API_CSP:?}, got {v:?}")),
        [_] => {}
        vs => p.push(format!("{csp_name}: expected exactly one, got {vs:?}")),
    }
    if r.header(other).is_some() {
        p.push(format!("unexpected {other} header"));
    }
    match r.header("date") {
        Some(d) => match parse_imf_fixdate(d) {
            Some(t) if (t - now_unix()).abs() <= 120 => {}
            Some(t) => p.push(format!("Date {d:?} is {}s away from now", t - now_unix())),
            None => p.push(format!("Date {d:?} is not an IMF-fixdate")),
        },
        None => p.push("no Date header".into()),
    }
    match r.header("server") {
        Some("forkd") => {}
        other => p.push(format!("Server: expected \"forkd\" (no version), got {other:?}")),
    }
    if r.header("x-powered-by").is_some() {
        p.push("X-Powered-By must not be sent".into());
    }
    match r.header("x-request-id") {
        Some(id) if !id.is_empty() => {}
        other => p.push(format!("x-request-id missing: {other:?}")),
    }
    p
}

pub(crate) fn assert_security_headers(r: &Response, what: &str) {
    let p = security_header_problems(r, false);
    assert!(p.is_empty(), "{what}: header problems:\n  {}\nresponse: {r:?}", p.join("\n  "));
}

fn assert_no_store(r: &Response, what: &str) {
    assert_eq!(r.header("cache-control"), Some("no-store"), "{what}: expected Cache-Control: no-store, got {r:?}");
}

protocols!(security_headers_on_success_responses);
fn security_headers_on_success_responses(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r = c.get("/health");
    assert_security_headers(&r, "GET /health");
    assert_no_store(&r, "GET /health");
    let r = c.get("/health/ready");
    assert_security_headers(&r, "GET /health/ready");
    let r = c.get("/api/config");
    assert_security_headers(&r, "GET /api/config");
    let r = c.request("HEAD", "/health", &[], b"");
    assert_security_headers(&r, "HEAD /health");
    let etag = c.get("/api/config").header("etag").unwrap_or("\"x\"").to_string();
    let r = c.request("GET", "/api/config", &[("If-None-Match", &etag)], b"");
    assert_security_headers(&r, "304 from /api/config");
    let r = c.request("POST", "/_debug/echo", &[], b"abc");
    assert_security_headers(&r, "POST /_debug/echo");
}

protocols!(security_headers_on_404_and_405);
fn security_headers_on_404_and_405(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r = c.get("/no/such/path");
    assert_json_error(&r, 404, Some("NOT_FOUND"), "unknown path");
    assert_security_headers(&r, "404");
    assert_no_store(&r, "404");
    let r = c.request("POST", "/health", &[("Content-Length", "0")], b"");
    assert_json_error(&r, 405, Some("METHOD_NOT_ALLOWED"), "POST /health");
    assert_security_headers(&r, "405");
    assert_no_store(&r, "405");
}

#[test]
fn security_headers_on_400() {
    let server = Server::start("");
    let (resps, _) = send_raw(server.addr(), b"GET /x HTTP/9.9\r\nHost: x\r\n\r\n");
    let r = resps.first().unwrap_or_else(|| panic!("no response to a malformed request\nlog:\n{}", server.log_tail()));
    assert_json_error(r, 400, Some("BAD_REQUEST"), "malformed request line");
    assert_security_headers(r, "400");
    assert_no_store(r, "400");
}

#[test]
fn security_headers_on_413_and_431() {
    let server = Server::builder().set("limits", "max_header_bytes = 2048").start();
    let mut c = server.conn();
    c.send(b"POST /_debug/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n");
    let r = c.read_response();
    assert_json_error(&r, 413, Some("PAYLOAD_TOO_LARGE"), "Content-Length 20000");
    assert_security_headers(&r, "413");
    assert_no_store(&r, "413");

    let mut c = server.conn();
    c.send(&request("GET", "/health", &[("X-Big", &"b".repeat(4000))], b""));
    let r = c.read_response();
    assert_json_error(&r, 431, None, "4000-byte header");
    assert_security_headers(&r, "431");
    assert_no_store(&r, "431");
}

#[test]
fn security_headers_on_408() {
    let server = Server::builder().set("limits", "header_timeout_ms = 300").start();
    let mut c = server.conn();
    c.send(b"GET /health HTTP/1.1\r\n");
    let r = c.read_response();
    assert_json_error(&r, 408, None, "incomplete head");
    assert_security_headers(&r, "408");
    assert_no_store(&r, "408");
}

protocols!(security_headers_on_500);
fn security_headers_on_500(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/_debug/panic");
    assert_json_error(&r, 500, Some("INTERNAL_ERROR"), "GET /_debug/panic");
    assert_security_headers(&r, "500");
    assert_no_store(&r, "500");
}

protocols!(an_html_document_gets_a_fresh_nonce_every_time);
fn an_html_document_gets_a_fresh_nonce_every_time(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r1 = c.get("/");
    let r2 = c.get("/");
    let r3 = server.get("/");
    let n: Vec<String> = [&r1, &r2, &r3]
        .iter()
        .map(|r| {
            assert_security_headers(r, "GET /");
            csp_nonce(r.header("content-security-policy").unwrap_or("")).unwrap_or_else(|e| panic!("{e}\n{r:?}"))
        })
        .collect();
    assert_ne!(n[0], n[1], "two responses on one connection share a CSP nonce");
    assert_ne!(n[1], n[2], "two responses share a CSP nonce");
    assert_ne!(n[0], n[2], "two responses share a CSP nonce");
}

protocols!(every_other_response_gets_the_one_fixed_policy);
fn every_other_response_gets_the_one_fixed_policy(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    for r in [c.get("/health"), c.get("/health"), server.get("/nope"), c.get("/api/openapi.json")] {
        assert_eq!(r.header_all("content-security-policy"), [API_CSP], "{r:?}");
        assert!(!r.header("content-type").unwrap_or("").starts_with("text/html"), "{r:?}");
    }
}

protocols!(csp_report_only_option_renames_the_header);
fn csp_report_only_option_renames_the_header(p: Proto) {
    let server = Server::start("csp_report_only = true").on(p);
    let r = server.get("/health");
    let p = security_header_problems(&r, true);
    assert!(p.is_empty(), "with csp_report_only = true:\n  {}\n{r:?}", p.join("\n  "));
    let r = server.get("/nope");
    let p = security_header_problems(&r, true);
    assert!(p.is_empty(), "404 with csp_report_only = true:\n  {}\n{r:?}", p.join("\n  "));
}

protocols!(date_header_is_a_current_imf_fixdate);
fn date_header_is_a_current_imf_fixdate(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/health");
    let d = r.header("date").unwrap_or_else(|| panic!("no Date: {r:?}"));
    let t = parse_imf_fixdate(d).unwrap_or_else(|| panic!("Date {d:?} is not an IMF-fixdate"));
    assert!((t - now_unix()).abs() <= 5, "Date {d:?} is {}s away from now", t - now_unix());
}

protocols!(server_header_carries_no_version);
fn server_header_carries_no_version(p: Proto) {
    let server = Server::start("").on(p);
    for path in ["/health", "/nope"] {
        let r = server.get(path);
        let s = r.header("server").unwrap_or("");
        assert_eq!(s, "forkd", "{path}: {r:?}");
        assert!(!s.bytes().any(|b| b.is_ascii_digit()), "{path}: Server header has digits: {s:?}");
        assert!(r.header("x-powered-by").is_none(), "{path}: X-Powered-By present: {r:?}");
    }
}

protocols!(request_id_is_echoed_when_valid);
fn request_id_is_echoed_when_valid(p: Proto) {
    let server = Server::start("").on(p);
    let max = "a".repeat(128);
    for id in ["abc-123._X", "Z", "0123456789", max.as_str()] {
        let r = server.get_with("/health", &[("X-Request-Id", id)]);
        assert_eq!(r.header("x-request-id"), Some(id), "valid id {id:?} not echoed: {r:?}");
    }
    // On an error response too.
    let r = server.get_with("/nope", &[("X-Request-Id", "err-id-1")]);
    assert_eq!(r.header("x-request-id"), Some("err-id-1"), "{r:?}");
}

protocols!(request_id_is_replaced_by_a_uuid_when_invalid);
fn request_id_is_replaced_by_a_uuid_when_invalid(p: Proto) {
    let server = Server::start("").on(p);
    let too_long = "a".repeat(129);
    for id in [too_long.as_str(), "a b", "<x>", "", "a/b"] {
        let r = server.get_with("/health", &[("X-Request-Id", id)]);
        assert_eq!(r.status, 200, "request with x-request-id {id:?}: {r:?}");
        let got = r.header("x-request-id").unwrap_or("");
        assert!(is_uuid_v4(got), "invalid id {id:?}: expected a fresh lower-case UUID v4, got {got:?}");
    }
}

protocols!(request_ids_are_fresh_uuids_when_absent);
fn request_ids_are_fresh_uuids_when_absent(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let a = c.get("/health");
    let b = c.get("/health");
    let (a, b) = (a.header("x-request-id").unwrap_or(""), b.header("x-request-id").unwrap_or(""));
    assert!(is_uuid_v4(a), "expected a UUID v4, got {a:?}");
    assert!(is_uuid_v4(b), "expected a UUID v4, got {b:?}");
    assert_ne!(a, b, "two requests without an id got the same one");
}

protocols!(api_config_is_cacheable_not_no_store);
fn api_config_is_cacheable_not_no_store(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/api/config");
    assert_eq!(r.header("cache-control"), Some("public, max-age=3600"), "{r:?}");
}
