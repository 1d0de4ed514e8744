//! Browser-facing routes (CONTRACT §6): `POST /csp-report`, `GET /redirect` (an open-redirect
//! guard), `GET /` with its CSP nonce, `/favicon.ico` and `/static/*`.

use std::time::Duration;

use serde_json::json;

use crate::util::*;

fn csp_report_body(directive: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"csp-report": {
        "document-uri": "http://127.0.0.1:8080/",
        "referrer": "",
        "violated-directive": directive,
        "effective-directive": directive,
        "blocked-uri": "http://evil.example/x.js",
        "original-policy": "default-src 'none'; report-uri /csp-report",
        "disposition": "enforce",
        "status-code": 200
    }}))
    .unwrap()
}

/// Posts a report, asserts 204 without a body, and waits for a new log line naming `marker`.
fn post_report(s: &Server, ct: &str, body: &[u8], marker: &str, what: &str) {
    let before = s.logs().lines().filter(|l| l.contains(marker)).count();
    let r = s.call("POST", "/csp-report", &[("Content-Type", ct)], body);
    ensure!(s, r.status == 204, "{what}: expected 204, got {r:?}");
    ensure!(s, r.body.is_empty(), "{what}: 204 without a body: {r:?}");
    let logged =
        eventually(Duration::from_secs(3), || s.logs().lines().filter(|l| l.contains(marker)).count() > before);
    ensure!(s, logged, "{what}: a log line naming the violated directive {marker:?} must appear");
}

protocols!(csp_report_accepts_the_three_formats_and_logs_the_directive);
fn csp_report_accepts_the_three_formats_and_logs_the_directive(p: Proto) {
    let s = Server::builder().start().on(p);
    post_report(
        &s,
        "application/csp-report",
        &csp_report_body("script-src-elem"),
        "script-src-elem",
        "application/csp-report",
    );
    post_report(&s, "application/json", &csp_report_body("style-src-attr"), "style-src-attr", "application/json");
    let reports = serde_json::to_vec(&json!([{
        "type": "csp-violation",
        "age": 10,
        "url": "http://127.0.0.1:8080/",
        "user_agent": "Mozilla/5.0",
        "body": {
            "documentURL": "http://127.0.0.1:8080/",
            "effectiveDirective": "frame-src",
            "blockedURL": "http://evil.example/frame",
            "originalPolicy": "default-src 'none'",
            "disposition": "enforce",
            "statusCode": 200
        }
    }]))
    .unwrap();
    post_report(&s, "application/reports+json", &reports, "frame-src", "application/reports+json");

    let r = s.call("POST", "/csp-report", &[("Content-Type", "application/csp-report")], b"{\"csp-report\": {");
    s.expect_err(&r, 400, "BAD_REQUEST", "malformed JSON report");
    let r = s.call("POST", "/csp-report", &[("Content-Type", "application/reports+json")], b"[{");
    s.expect_err(&r, 400, "BAD_REQUEST", "malformed reports+json");
    let r = s.call("POST", "/csp-report", &[("Content-Type", "text/plain")], &csp_report_body("img-src"));
    let e = s.expect_err(&r, 415, "UNSUPPORTED_MEDIA_TYPE", "text/plain report");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("Content-Type must be") && msg.contains("application/csp-report"),
        "the 415 names the report media types: {msg:?}"
    );
    s.assert_healthy();
}

protocols!(csp_report_is_rate_limited);
fn csp_report_is_rate_limited(p: Proto) {
    let s = Server::builder().set("rate_limit", "enabled = true\nmax = 3\nwindow_secs = 900").start().on(p);
    let body = csp_report_body("img-src");
    for i in 0..3 {
        let r = s.call("POST", "/csp-report", &[("Content-Type", "application/csp-report")], &body);
        ensure!(s, r.status == 204, "report #{} (max 3): {r:?}", i + 1);
        ensure_eq!(s, r.header("ratelimit-policy"), Some("3;w=900"), "RateLimit-Policy on /csp-report");
    }
    let r = s.call("POST", "/csp-report", &[("Content-Type", "application/csp-report")], &body);
    s.expect_err(&r, 429, "RATE_LIMITED", "4th report (max 3)");
    ensure!(s, r.header("retry-after").and_then(|v| v.parse::<u64>().ok()).is_some(), "Retry-After on 429: {r:?}");
}

protocols!(redirect_allows_local_paths_and_listed_hosts_only);
fn redirect_allows_local_paths_and_listed_hosts_only(p: Proto) {
    let s = Server::builder().set("redirect", "allowed_hosts = [\"allowed.example\"]").start().on(p);
    let r = s.get("/redirect?path=/x");
    ensure!(s, r.status == 302, "path=/x: expected 302, got {r:?}");
    ensure_eq!(s, r.header("location"), Some("/x"), "Location for path=/x");
    let r = s.get("/redirect?path=%2Fdeep%2Fpage%3Fa%3D1");
    ensure!(s, r.status == 302, "path=/deep/page?a=1 (encoded): expected 302, got {r:?}");
    ensure!(s, r.header("location").map(|l| l.starts_with("/deep/page")).unwrap_or(false), "Location: {r:?}");
    let q = format!("/redirect?url={}", urlencode("https://allowed.example/p"));
    let r = s.get(&q);
    ensure!(s, r.status == 302, "url=https://allowed.example/p: expected 302, got {r:?}");
    ensure_eq!(s, r.header("location"), Some("https://allowed.example/p"), "Location for the allowed host");

    let bad: Vec<String> = vec![
        "path=//evil.com".into(),
        "path=/%5Cevil.com".into(),
        "path=%2F%2Fevil.com".into(),
        "path=/%09/evil.com".into(),
        format!("url={}", urlencode("https:evil.com")),
        format!("url={}", urlencode("javascript:alert(1)")),
        format!("url={}", urlencode("https://allowed.example@evil.com")),
        format!("url={}", urlencode("https://evil.com")),
        format!("url={}", urlencode("https://allowed.example.evil.com")),
        "url=javascript:alert(1)".into(),
        "path=evil.com".into(),
        String::new(),
    ];
    for q in bad {
        let path = if q.is_empty() { "/redirect".to_string() } else { format!("/redirect?{q}") };
        let r = s.get(&path);
        ensure!(s, r.header("location").is_none(), "GET {path} must not redirect: {r:?}");
        s.expect_err(&r, 400, "BAD_REQUEST", &format!("GET {path}"));
    }
}

protocols!(redirect_location_is_a_valid_uri_and_only_https_urls_redirect);
/// Regression: `/redirect` copied characters that are not allowed in a URI (`"`, `<`, `>`,
/// `^`, backtick, `{`, `|`, `}`) into `Location`; they are percent-encoded now, and escapes
/// already there are kept as they are (never encoded twice). And `url=http://<allowed>`
/// redirected: only `https://` may.
fn redirect_location_is_a_valid_uri_and_only_https_urls_redirect(p: Proto) {
    let s = Server::builder().set("redirect", "allowed_hosts = [\"allowed.example\"]").start().on(p);
    for (target, want) in [
        ("/a\"b<c>d^e`f{g|h}", "/a%22b%3Cc%3Ed%5Ee%60f%7Bg%7Ch%7D"),
        ("/p?q=<x>#frag#more", "/p?q=%3Cx%3E#frag%23more"),
        ("/caf%C3%A9?x=%7B%7D", "/caf%C3%A9?x=%7B%7D"),
        ("https://allowed.example/a{b}?c=|#^", "https://allowed.example/a%7Bb%7D?c=%7C#%5E"),
        ("https://allowed.example/100%", "https://allowed.example/100%25"),
    ] {
        let key = if target.starts_with('/') { "path" } else { "url" };
        let path = format!("/redirect?{key}={}", urlencode(target));
        let r = s.get(&path);
        ensure!(s, r.status == 302, "GET {path} ({target}): expected 302, got {r:?}");
        ensure_eq!(s, r.header("location"), Some(want), "Location for {target}");
    }
    for url in ["http://allowed.example/", "http://allowed.example", "HTTP://allowed.example/x"] {
        let path = format!("/redirect?url={}", urlencode(url));
        let r = s.get(&path);
        ensure!(s, r.header("location").is_none(), "GET {path} must not redirect: {r:?}");
        s.expect_err(&r, 400, "BAD_REQUEST", &format!("GET {path}"));
    }
}

/// The value of attribute `name` in the tag text `tag` (`name="v"` or `name='v'`).
fn attr(tag: &str, name: &str) -> Option<String> {
    let lower = tag.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find(&format!("{name}=")) {
        let at = from + i;
        let before_ok = at == 0 || lower.as_bytes()[at - 1].is_ascii_whitespace();
        let v = &tag[at + name.len() + 1..];
        if before_ok {
            let q = v.chars().next()?;
            if q == '"' || q == '\'' {
                return v[1..].find(q).map(|e| v[1..1 + e].to_string());
            }
            return Some(v.split(|c: char| c.is_whitespace() || c == '>').next().unwrap_or("").to_string());
        }
        from = at + 1;
    }
    None
}

/// The opening tags `<name …>` in `html`.
fn tags<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let lower = html.to_ascii_lowercase();
    let open = format!("<{name}");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = lower[from..].find(&open) {
        let at = from + i;
        let after = lower.as_bytes().get(at + open.len()).copied().unwrap_or(b'>');
        let end = lower[at..].find('>').map(|e| at + e + 1).unwrap_or(html.len());
        if after == b'>' || after.is_ascii_whitespace() {
            out.push(&html[at..end]);
        }
        from = end.max(at + 1);
    }
    out
}

/// The nonce of `'nonce-…'` in `directive` (e.g. `script-src`) of a CSP.
fn csp_nonce(csp: &str, directive: &str) -> Option<String> {
    let d = csp.split(';').map(str::trim).find(|d| d.split_whitespace().next() == Some(directive))?;
    d.split_whitespace().find_map(|t| t.strip_prefix("'nonce-").and_then(|n| n.strip_suffix('\'')).map(str::to_string))
}

protocols!(index_page_nonce_favicon_and_static);
fn index_page_nonce_favicon_and_static(p: Proto) {
    let s = Server::builder().start().on(p);
    let page = |what: &str| -> (Response, String, String) {
        let r = s.get("/");
        ensure!(s, r.status == 200, "{what}: GET / → 200, got {r:?}");
        ensure_eq!(s, media_type(r.header("content-type")).as_deref(), Some("text/html"), "{what}: Content-Type");
        let csp = r.header("content-security-policy").unwrap_or("").to_string();
        let nonce = csp_nonce(&csp, "script-src");
        ensure!(s, nonce.is_some(), "{what}: CSP must carry script-src 'nonce-…': {csp:?}");
        let nonce = nonce.unwrap();
        let html = r.body_str();
        let scripts = tags(&html, "script");
        let inline: Vec<&&str> = scripts.iter().filter(|t| attr(t, "nonce").is_some()).collect();
        ensure!(s, !inline.is_empty(), "{what}: the page must have a <script nonce=…>: {r:?}");
        for t in tags(&html, "script") {
            // Under 'strict-dynamic', 'self' is ignored: every parser-inserted script, external
            // ones included, needs the nonce.
            ensure_eq!(
                s,
                attr(t, "nonce").as_deref(),
                Some(nonce.as_str()),
                "{what}: nonce of {t:?} vs script-src in {csp:?}"
            );
        }
        let sheets = tags(&html, "link").into_iter().filter(|t| attr(t, "rel").as_deref() == Some("stylesheet"));
        for t in tags(&html, "style").into_iter().chain(sheets) {
            let sn = csp_nonce(&csp, "style-src");
            ensure!(s, sn.is_some(), "{what}: a <style> or stylesheet needs a style-src nonce in {csp:?}");
            ensure_eq!(s, attr(t, "nonce"), sn, "{what}: nonce of {t:?} vs style-src in {csp:?}");
        }
        (r, nonce, html)
    };
    let (_, n1, html) = page("first GET /");
    let (_, n2, _) = page("second GET /");
    ensure!(s, n1 != n2, "the nonce must be fresh per response: {n1:?} twice");
    ensure!(s, n1.len() >= 16, "the nonce must be long enough to be unguessable: {n1:?}");

    let r = s.get("/favicon.ico");
    ensure!(s, r.status == 200 && !r.body.is_empty(), "GET /favicon.ico → 200 with a body: {r:?}");

    // Every local file the page references answers 200 (no failing request of its own).
    let mut refs: Vec<String> = Vec::new();
    for (tag, a) in [("script", "src"), ("link", "href"), ("img", "src")] {
        for t in tags(&html, tag) {
            if let Some(v) = attr(t, a) {
                if v.starts_with('/') && !v.starts_with("//") {
                    refs.push(v);
                }
            }
        }
    }
    for p in &refs {
        let r = s.get(p);
        ensure!(s, r.status == 200 && !r.body.is_empty(), "GET {p} (referenced by the page) → 200: {r:?}");
    }
    // The /static files the page references (its script and style); when it references
    // none under /static/, the same files by name under /static/.
    let mut statics: Vec<String> = refs.iter().filter(|p| p.starts_with("/static/")).cloned().collect();
    if statics.is_empty() {
        statics = refs
            .iter()
            .filter_map(|p| p.rsplit('/').next())
            .filter(|n| !n.is_empty())
            .map(|n| format!("/static/{n}"))
            .collect();
    }
    ensure!(s, !statics.is_empty(), "the page references no local file to find under /static/: {html}");
    for p in &statics {
        let r = s.get(p);
        ensure!(s, r.status == 200 && !r.body.is_empty(), "GET {p} → 200: {r:?}");
        ensure_eq!(s, r.header("cache-control"), Some("max-age=31536000, immutable"), "Cache-Control of {p}");
        let ct = media_type(r.header("content-type")).unwrap_or_default();
        if p.ends_with(".js") {
            ensure!(s, ct == "text/javascript" || ct == "application/javascript", "Content-Type of {p}: {ct:?}");
        } else if p.ends_with(".css") {
            ensure_eq!(s, ct.as_str(), "text/css", "Content-Type of {p}");
        }
    }
    for p in ["/static/nope.js", "/static/../Cargo.toml", "/static/%2e%2e/Cargo.toml", "/static/..%2fCargo.toml"] {
        let r = s.get(p);
        s.expect_err(&r, 404, "NOT_FOUND", &format!("GET {p}"));
    }
}
