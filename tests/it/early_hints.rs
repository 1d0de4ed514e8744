//! Early hints (RFC 8297) on `GET /`, and the content-hashed files they point at: over
//! HTTP/1.1 no `103 Early Hints` is sent (clients there that take the first status line
//! for the answer, such as Python's `http.client`, would read the 103 as the response;
//! browsers act on 103 only over HTTP/2 and later, which send it: tests/it/http2.rs,
//! tests/it/h3.rs); the 200 carries `Link: rel=preload` for the page's script and style,
//! the page's tags use those URLs with the response's CSP nonce, the files are served
//! immutable with their types, other names 404.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// One message of a raw HTTP/1.1 response stream: status, headers (names lower-cased),
/// body.
#[derive(Debug)]
struct Message {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Message {
    fn status(&self) -> u16 {
        self.status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect()
    }
}

/// Splits `raw` into messages: a 1xx or a `HEAD` answer has no body, others a
/// `Content-Length` one. `None` while `raw` is not yet `want` complete messages.
fn split(raw: &[u8], head: bool, want: usize) -> Option<Vec<Message>> {
    let mut out = Vec::new();
    let mut at = 0;
    while out.len() < want {
        let end = at + find(&raw[at..], b"\r\n\r\n")?;
        let text = String::from_utf8_lossy(&raw[at..end]).into_owned();
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or("").to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut m = Message { status_line, headers, body: Vec::new() };
        at = end + 4;
        if !head && m.status() >= 200 {
            let n: usize = m.all("content-length").first().and_then(|v| v.parse().ok()).unwrap_or(0);
            if raw.len() < at + n {
                return None;
            }
            m.body = raw[at..at + n].to_vec();
            at += n;
        }
        out.push(m);
    }
    (at == raw.len()).then_some(out)
}

/// Writes `request` on a fresh socket and reads until `want` whole messages arrived
/// (5 s at most); nothing may follow them.
fn exchange(s: &Server, request: &[u8], head: bool, want: usize) -> Vec<Message> {
    let mut sock = TcpStream::connect(s.addr()).expect("connect");
    sock.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    sock.write_all(request).expect("write");
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if let Some(ms) = split(&raw, head, want) {
            return ms;
        }
        ensure!(
            s,
            Instant::now() < deadline,
            "no {want} complete messages in 5 s: {:?}",
            String::from_utf8_lossy(&raw)
        );
        match sock.read(&mut buf) {
            Ok(0) => panic!("closed after {:?}\n{}", String::from_utf8_lossy(&raw), s.log_tail()),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}\n{}", s.log_tail()),
        }
    }
}

/// The two `Link` values the page must carry, from a final response: (script URL, style URL).
fn preloads(s: &Server, links: &[&str]) -> (String, String) {
    ensure_eq!(s, links.len(), 2, "two Link fields: {links:?}");
    let url = |v: &str, dest: &str| -> String {
        let rest = v.strip_prefix('<').unwrap_or("");
        let (u, params) = rest.split_once('>').unwrap_or(("", ""));
        ensure_eq!(s, params, format!("; rel=preload; as={dest}").as_str(), "parameters of {v:?}");
        u.to_string()
    };
    let (js, css) = (url(links[0], "script"), url(links[1], "style"));
    for (u, ext) in [(&js, "js"), (&css, "css")] {
        let name = u.strip_prefix("/static/app.").and_then(|n| n.strip_suffix(&format!(".{ext}"))).unwrap_or("");
        ensure!(
            s,
            name.len() == 8 && name.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{u}: /static/app.<8 hex>.{ext}"
        );
    }
    (js, css)
}

#[test]
fn get_root_over_http11_sends_the_page_with_both_preloads_and_no_103() {
    let s = Server::builder().start();
    // Exactly one message: the page (anything before or after it fails `exchange`).
    let ms = exchange(&s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false, 1);
    let page = &ms[0];
    ensure_eq!(s, page.status_line.as_str(), "HTTP/1.1 200 OK", "the page, first: {ms:?}");
    let (js, css) = preloads(&s, &page.all("link"));

    // The page loads those very URLs, with the nonce its CSP names.
    let csp = page.all("content-security-policy").first().map(|v| v.to_string()).unwrap_or_default();
    ensure!(s, !csp.contains("unsafe-inline"), "a strict CSP: {csp}");
    let nonce = csp
        .split(';')
        .find(|d| d.trim().starts_with("script-src"))
        .and_then(|d| d.split_whitespace().find_map(|t| t.strip_prefix("'nonce-")?.strip_suffix('\'')))
        .unwrap_or_default()
        .to_string();
    ensure!(s, nonce.len() >= 16, "script-src nonce in {csp}");
    ensure!(s, csp.contains(&format!("style-src 'self' 'nonce-{nonce}'")), "style-src allows the sheet: {csp}");
    let html = String::from_utf8_lossy(&page.body);
    let script = format!("<script src=\"{js}\" nonce=\"{nonce}\"></script>");
    let sheet = format!("<link rel=\"stylesheet\" href=\"{css}\" nonce=\"{nonce}\">");
    ensure!(s, html.contains(&script), "{script} in the page: {html}");
    ensure!(s, html.contains(&sheet), "{sheet} in the page: {html}");
    // Every script is a file with the nonce: none inline.
    let scripts = html.matches("<script").count();
    let files = html.matches(&format!("\" nonce=\"{nonce}\"></script>")).count();
    ensure!(s, !html.contains("<style") && scripts >= 1 && scripts == files, "nothing inline: {html}");

    // The connection goes on; no interim response on any request.
    let mut c = s.conn();
    let r = c.get("/");
    ensure!(s, r.status == 200 && r.interim.is_empty(), "GET / through the harness: {r:?}");
    ensure_eq!(s, r.header_all("link"), page.all("link"), "the same Link fields: {r:?}");
    let r = c.get("/health");
    ensure!(s, r.status == 200 && r.interim.is_empty(), "GET /health: {r:?}");
}

#[test]
fn pipelined_pages_are_answered_in_order_without_103() {
    let s = Server::builder().start();
    let req =
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let ms = exchange(&s, req, false, 3);
    let statuses: Vec<u16> = ms.iter().map(Message::status).collect();
    ensure_eq!(s, statuses, vec![200, 200, 200], "pipelined GET /, /health, /");
    ensure_eq!(s, ms[0].all("link"), ms[2].all("link"), "the same hints every time");
    ensure!(s, ms[1].all("link").is_empty(), "none on /health: {:?}", ms[1]);
}

#[test]
fn http10_and_head_get_the_same_link_fields() {
    let s = Server::builder().start();
    let links = exchange(&s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false, 1)[0]
        .all("link")
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    let ms = exchange(&s, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n", false, 1);
    ensure_eq!(s, ms[0].status(), 200, "HTTP/1.0 GET /: the page first: {ms:?}");
    ensure_eq!(s, ms[0].all("link"), links, "HTTP/1.0 still gets the Link fields");
    ensure!(s, !ms[0].body.is_empty(), "and the page");
    // HEAD: no body, nothing to preload for; the head is GET's head.
    let ms = exchange(&s, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", true, 1);
    ensure_eq!(s, ms[0].status_line.as_str(), "HTTP/1.1 200 OK", "HEAD /: {ms:?}");
    ensure_eq!(s, ms[0].all("link"), links, "HEAD gets GET's Link fields");
    // Other pages get no hints at all.
    for p in ["/health", "/favicon.ico", "/nope"] {
        let ms = exchange(&s, format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(), false, 1);
        ensure!(s, ms[0].status() >= 200 && ms[0].all("link").is_empty(), "GET {p}: {ms:?}");
    }
}

#[test]
fn hinted_files_are_immutable_with_their_types_and_other_names_404() {
    let s = Server::builder().start();
    let page = s.get("/");
    let (js, css) = preloads(&s, &page.header_all("link"));
    for (url, ty, marker) in [(&js, "text/javascript", "\"use strict\";"), (&css, "text/css", "box-sizing")] {
        let r = s.get(url);
        ensure_eq!(s, r.status, 200, "GET {url}: {r:?}");
        ensure_eq!(s, r.header("cache-control"), Some("max-age=31536000, immutable"), "Cache-Control of {url}");
        ensure_eq!(s, media_type(r.header("content-type")).as_deref(), Some(ty), "Content-Type of {url}");
        ensure!(s, r.body_str().contains(marker), "{url} holds the page's {ty}: {r:?}");
        ensure!(s, r.interim.is_empty() && r.header("link").is_none(), "no hints on {url}: {r:?}");
        // An old (or made-up) hash, the plain name, or the name with junk: 404.
        let hash = &url["/static/app.".len().."/static/app.".len() + 8];
        let other = if hash == "00000000" { "11111111" } else { "00000000" };
        let ext = &url[url.rfind('.').unwrap_or(0)..];
        for bad in [
            url.replace(hash, other),
            format!("/static/app{ext}"),
            url.replace(hash, &hash.to_ascii_uppercase()).replace("/static/app.", "/static/APP."),
            format!("{url}.map"),
            url.replace(hash, &hash[..7]),
        ] {
            let r = s.get(&bad);
            s.expect_err(&r, 404, "NOT_FOUND", &format!("GET {bad}"));
        }
    }
}

#[test]
fn curl_over_http11_gets_the_200_with_its_links_and_no_103() {
    let s = Server::builder().start();
    let Ok(out) = Command::new("curl")
        .args(["-sS", "-v", "--http1.1", "--max-time", "10", "-o", "/dev/null"])
        .arg(format!("http://{}/", s.addr()))
        .stdin(Stdio::null())
        .output()
    else {
        eprintln!("curl is not installed: skipped");
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(s, out.status.success(), "curl failed: {err}");
    ensure!(s, !err.contains(" 103"), "no 103: {err}");
    ensure!(s, err.contains("< HTTP/1.1 200 OK"), "the 200: {err}");
    ensure!(s, err.matches("< Link: </static/app.").count() == 2, "both Link fields: {err}");
}
