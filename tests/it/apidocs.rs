//! `GET /api/docs`: the API reference as an HTML page rendered from the OpenAPI document,
//! under the same security headers as every page, the same on every protocol, with the
//! declared resources in it and the operator's strings escaped; linked from the front page.

use crate::headers::assert_security_headers;
use crate::util::*;

/// A declared resource whose enum values carry markup (names are restricted to
/// `[a-z0-9_]`; values are any non-empty string).
const DECLARED: &str = r#"
[[resources]]
name = "articles"
read = "public"

[resources.fields.title]
type = "string"
required = true
max = 120

[resources.fields.state]
type = "enum"
values = ["draft", "<script>alert(1)</script>", "a\"b'c&d"]
default = "draft"
"#;

protocols!(api_docs_is_an_html_reference_of_every_route);
fn api_docs_is_an_html_reference_of_every_route(p: Proto) {
    let mut s = Server::start(DECLARED).on(p);
    let r = s.get("/api/docs");
    ensure!(s, r.status == 200, "GET /api/docs: {r:?}");
    ensure_eq!(s, r.header("content-type"), Some("text/html; charset=utf-8"), "Content-Type");
    ensure_eq!(s, r.header("cache-control"), Some("public, max-age=3600"), "Cache-Control");
    assert_security_headers(&r, "GET /api/docs");
    let html = r.body_str();
    ensure!(s, html.starts_with("<!doctype html>"), "not an HTML document: {}", &html[..html.len().min(200)]);
    for needle in [
        // Built-in routes, with a parameter's limits and a body's.
        "<span class=\"m m-get\">GET</span> <code>/api/v1/users</code>",
        "<span class=\"m m-post\">POST</span> <code>/api/v1/auth/login</code>",
        "<code>limit</code></td><td>query</td><td>no</td><td>integer</td><td>value 1 to 100",
        "<code>password</code></td><td>string</td><td>yes</td><td>length 8 to 128",
        // The declared resource's routes and its field's limit.
        "<span class=\"m m-get\">GET</span> <code>/api/v1/articles</code>",
        "<span class=\"m m-patch\">PATCH</span> <code>/api/v1/articles/{id}</code>",
        "<code>title</code></td><td>string</td><td>yes</td><td>length at most 120",
        // Error statuses, their codes and the envelope.
        "<tr><td>404</td><td>No such resource",
        "<code>code</code> <code>VALIDATION_ERROR</code>",
        "<section id=\"errors\">",
        "<tr><td>429</td><td><code>RATE_LIMITED</code></td>",
        // The page lists itself, and links the JSON document.
        "<code>/api/docs</code></h3>",
        "<a href=\"/api/openapi.json\">",
    ] {
        ensure!(s, html.contains(needle), "{needle:?} is not on the page");
    }
    // The operator's strings are text, never markup.
    ensure!(s, html.contains("<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>"), "the enum value, escaped");
    ensure!(s, html.contains("<code>a&quot;b&#39;c&amp;d</code>"), "quotes and ampersand escaped");
    ensure!(s, !html.contains("<script"), "a <script> on a page that must have none");
    ensure!(s, !html.contains("style="), "an inline style attribute");

    // Its one stylesheet is a /static file the CSP's style-src 'self' allows.
    let css = html.split("<link rel=\"stylesheet\" href=\"").nth(1).and_then(|t| t.split('"').next());
    let css = css.unwrap_or_default().to_owned();
    ensure!(s, css.starts_with("/static/docs.") && css.ends_with(".css"), "stylesheet {css:?}");
    let c = s.get(&css);
    ensure!(s, c.status == 200 && !c.body.is_empty(), "GET {css}: {c:?}");
    ensure_eq!(s, media_type(c.header("content-type")).as_deref(), Some("text/css"), "Content-Type of {css}");

    // HEAD: the same head, no body.
    let mut session = s.session();
    let h = session.request("HEAD", "/api/docs", &[], b"");
    ensure!(s, h.status == 200 && h.body.is_empty(), "HEAD /api/docs: {h:?}");
    ensure_eq!(s, h.header("content-type"), Some("text/html; charset=utf-8"), "HEAD Content-Type");
    let length = r.body.len().to_string();
    ensure_eq!(s, h.header("content-length"), Some(length.as_str()), "HEAD Content-Length");

    // Built once: the same bytes again, and the same bytes over HTTP/1.1.
    ensure!(s, s.get("/api/docs").body == r.body, "a second GET gave another page");
    s.set_proto(Proto::H1);
    ensure!(s, s.get("/api/docs").body == r.body, "the page over {p:?} differs from HTTP/1.1's");

    // The front page says what the service is and links the reference and the document.
    let front = s.get("/").body_str();
    for link in ["<a href=\"/api/docs\">", "<a href=\"/api/openapi.json\">"] {
        ensure!(s, front.contains(link), "the front page lacks {link}");
    }
}
