//! The browser front end (CONTRACT §6): `GET /`, `GET /favicon.ico` and
//! `GET /static/{name}`.
//!
//! The page (`static/index.html`) loads its script and its style from
//! `/static/` under content-hashed names ([`crate::app::assets`]): the template
//! names them plainly (`/static/app.js`) and [`index_page`] puts in the
//! hashed URLs once per process. A name that is not a current asset's
//! hashed name (`..`, encoded forms, an old hash) is 404.
//!
//! The `<script>` and `<link rel=stylesheet>` tags carry `nonce="…"` holding
//! [`NONCE_SLOT`]: the CSP nonce is fresh per response and is only drawn when
//! the HTTP layer writes the headers, after the handler has run, so the
//! writer fills the slot in the copy of the body it writes (same length, so
//! `Content-Length` is unchanged). The page sends `no-store`: a filled page
//! must never be served again from a cache.
//!
//! The page's response carries [`early_hints`]: `Link: rel=preload` for the
//! script and the style, which the HTTP layer sends as `103 Early Hints`
//! before the page and again as fields of the page's own response.

use std::sync::OnceLock;

use crate::app::{assets, App, Ctx, Reply};
use crate::error::Error;
use crate::http::hints::EarlyHints;
use crate::http::request::Request;
use crate::http::response::{Body, Response};

/// The placeholder the page carries where the response's CSP nonce goes:
/// exactly as long as the nonce (24 base64 characters), so filling it in
/// keeps `Content-Length`.
pub const NONCE_SLOT: &[u8; 24] = b"__FORKD_CSP_NONCE_SLOT__";

/// The page's template: [`NONCE_SLOT`] in its three nonce attributes, the
/// files of `static/` by their plain names.
pub const INDEX: &[u8] = include_bytes!("../../../static/index.html");

/// How often `slot` occurs in `page` (usable at compile time).
pub const fn count_slots(page: &[u8], slot: &[u8; 24]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i + slot.len() <= page.len() {
        let mut j = 0;
        while j < slot.len() && page[i + j] == slot[j] {
            j += 1;
        }
        if j == slot.len() {
            n += 1;
        }
        i += 1;
    }
    n
}

// The build fails if the page loses a nonce slot (its two `<script>`s and its stylesheet `<link>`).
const _: () = assert!(count_slots(INDEX, NONCE_SLOT) == 3, "static/index.html must carry the nonce slot three times");

/// `Cache-Control` of `/static/*`.
pub const IMMUTABLE: &str = "max-age=31536000, immutable";

/// The files the page needs before it can run, hinted early: (plain name, `as=`).
const PRELOADS: &[(&str, &str)] = &[("app.js", "script"), ("app.css", "style")];

/// The page as served: the template with every `/static/<plain name>` replaced
/// by that file's hashed URL (built once per process).
pub fn index_page() -> &'static [u8] {
    static PAGE: OnceLock<Vec<u8>> = OnceLock::new();
    PAGE.get_or_init(|| {
        let mut page = String::from_utf8_lossy(INDEX).into_owned();
        for a in assets::all() {
            page = page.replace(&format!("\"/static/{}\"", a.plain), &format!("\"{}\"", a.url));
        }
        page.into_bytes()
    })
}

/// The page's early hints: preload its script and its style (built once per process).
pub fn early_hints() -> Option<&'static EarlyHints> {
    static HINTS: OnceLock<Option<EarlyHints>> = OnceLock::new();
    HINTS
        .get_or_init(|| {
            let urls: Option<Vec<(&str, &str)>> =
                PRELOADS.iter().map(|(plain, dest)| assets::url(plain).map(|u| (u, *dest))).collect();
            match urls.map(|u| EarlyHints::preload(&u)) {
                Some(Ok(h)) => Some(h),
                Some(Err(e)) => {
                    log::error!("front page: no early hints: {e}");
                    None
                }
                None => {
                    log::error!("front page: no early hints: a preloaded file is not embedded");
                    None
                }
            }
        })
        .as_ref()
}

/// Computes the hashed names, the page and its hints now (at worker start),
/// so the first request for `/` does not pay for them.
pub fn prepare() {
    let _ = index_page();
    let _ = early_hints();
}

/// `GET /`: the page; `no-store`, its nonce slots filled by the writer.
pub fn index(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::full(page()))
}

/// The response for `/` as the handler builds it.
pub fn page() -> Response {
    let mut r = Response::new(200);
    r.content_type = "text/html; charset=utf-8";
    r.cache_control = "no-store";
    r.body = Body::Static(index_page());
    // The writer replaces the slot with this response's CSP nonce (same length).
    r.nonce_slot = Some(NONCE_SLOT);
    r.early_hints = early_hints();
    r
}

/// `GET /favicon.ico`: the embedded icon (a day's cache: the URL is not versioned).
pub fn favicon(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let a = assets::by_plain("favicon.ico").ok_or(Error::NotFound)?;
    let mut r = serve(&a.name).ok_or(Error::NotFound)?;
    r.cache_control = "public, max-age=86400";
    Ok(Reply::full(r))
}

/// `GET /static/{name}`: an embedded file by its hashed name, cached for a year; else 404.
pub fn static_file(_: &App, _: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let name = ctx.params.get(0).ok_or(Error::NotFound)?;
    serve(name).map(Reply::full).ok_or(Error::NotFound)
}

/// The response for `/static/{name}`, or `None` for an unknown name.
pub fn serve(name: &str) -> Option<Response> {
    let a = assets::by_name(name)?;
    let mut r = Response::new(200);
    r.content_type = a.content_type;
    r.cache_control = IMMUTABLE;
    r.body = Body::Static(a.bytes);
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers::Common;
    use crate::http::response::{Delimit, RequestMeta};
    use crate::http1::writer::write_response;

    fn page_text() -> &'static str {
        std::str::from_utf8(index_page()).expect("utf-8 page")
    }

    fn file_text(plain: &str) -> &'static str {
        std::str::from_utf8(assets::by_plain(plain).expect("embedded").bytes).expect("utf-8")
    }

    #[test]
    fn slot_is_as_long_as_a_nonce() {
        let mut c = Common::new(false);
        c.write_security(&mut Vec::new(), true);
        assert_eq!(NONCE_SLOT.len(), c.nonce().len());
        assert!(NONCE_SLOT.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_'));
    }

    #[test]
    fn page_loads_its_script_and_style_by_hashed_url_with_the_nonce_slot() {
        let text = page_text();
        let slot = std::str::from_utf8(NONCE_SLOT).expect("ascii");
        let (js, css) = (assets::url("app.js").expect("js"), assets::url("app.css").expect("css"));
        let records = assets::url("records.js").expect("records.js");
        assert_eq!(text.matches(slot).count(), 3, "the slot appears only where a nonce goes");
        assert_eq!(text.matches(&format!("<script src=\"{js}\" nonce=\"{slot}\"></script>")).count(), 1, "{text}");
        assert_eq!(text.matches(&format!("<script src=\"{records}\" nonce=\"{slot}\"></script>")).count(), 1);
        assert_eq!(text.matches(&format!("<link rel=\"stylesheet\" href=\"{css}\" nonce=\"{slot}\">")).count(), 1);
        assert_eq!(text.matches("<script").count(), 2, "two scripts, both nonced");
        assert!(!text.contains("<style"), "no inline style");
        assert_eq!(text.matches("rel=\"stylesheet\"").count(), 1);
        for plain in ["/static/app.js\"", "/static/records.js\"", "/static/app.css\"", "/static/favicon.ico\""] {
            assert!(!text.contains(plain), "a plain name is left in the page: {plain}");
        }
        assert_eq!(index_page().len(), INDEX.len() + 3 * 9, "each of three names grew by `.<8 hex>`");
        assert!(std::ptr::eq(index_page(), index_page()), "built once");
    }

    #[test]
    fn page_stays_within_the_policy() {
        let (page, js, css) = (page_text(), file_text("app.js"), file_text("app.css"));
        let records = file_text("records.js");
        // Small: sign-in and sign-up, the feed, the chat and their error handling.
        assert!(page.len() + js.len() + css.len() < 20 * 1024, "page over 20 KB");
        // The records view: what the API describes, browsed and edited through the API.
        assert!(records.len() < 10 * 1024, "records.js over 10 KB");
        assert!(records.starts_with("\"use strict\";"));
        for needle in ["fetch(\"/api/openapi.json\")", "\"forkd:session\"", "\"If-Match\"", "\"PATCH\"", "\"DELETE\""] {
            assert!(records.contains(needle), "{needle}");
        }
        assert!(page.starts_with("<!doctype html>"));
        assert!(js.starts_with("\"use strict\";"));
        // Inline style attributes and handlers would need 'unsafe-inline'.
        assert!(!page.contains("style="), "style attribute");
        let handler_attr = page.match_indices(" on").any(|(i, _)| {
            let rest = &page[i + 3..];
            let n = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            n > 0 && rest[n..].starts_with('=')
        });
        assert!(!handler_attr, "inline event handler attribute");
        // Nothing external: no absolute URLs, no protocol-relative ones, no eval.
        for text in [page, js, css, records] {
            for bad in ["http://", "https://", "src=\"//", "href=\"//", "eval(", "new Function", "innerHTML", "<iframe"]
            {
                assert!(!text.contains(bad), "{bad}");
            }
        }
        for text in [js, records, css] {
            assert!(!text.contains("<script") && !text.contains("<style"), "a file holds no tag");
        }
        for needle in [
            "/api/v1/auth/login",
            "/api/v1/auth/logout",
            "api(\"/api/v1/users\", body)",
            "fetch(\"/api/events\"",
            "\"Last-Event-ID\": String(lastId)",
            "\"notification\"",
            "\"Retry-After\", \"RateLimit-Reset\"",
            "Too many requests — try again in ",
            "\"rate limited, retry in \"",
            "m.name",
            "\"/ws?token=\"",
            "type: \"join\", roomId: \"lobby\"",
            "type: \"chat\", roomId: \"lobby\", content",
            "\"offline\"",
        ] {
            assert!(js.contains(needle), "{needle}");
        }
        for needle in [
            "<div id=\"err\" role=\"alert\" hidden>",
            "<label for=\"email\">",
            "<label for=\"password\">",
            "<label for=\"su-name\">",
            "<label for=\"su-email\">",
            "<label for=\"su-password\">",
            "<label for=\"text\">",
            "<html lang=\"en\">",
        ] {
            assert!(page.contains(needle), "{needle}");
        }
        assert!(css.contains("[hidden]{display:none!important}"));
    }

    #[test]
    fn page_response_headers() {
        let r = page();
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, "text/html; charset=utf-8");
        assert_eq!(r.cache_control, "no-store");
        assert_eq!(r.body.as_bytes(), index_page());
        let hints = r.early_hints.expect("hints");
        let (js, css) = (assets::url("app.js").expect("js"), assets::url("app.css").expect("css"));
        assert_eq!(
            hints.links(),
            [format!("<{js}>; rel=preload; as=script"), format!("<{css}>; rel=preload; as=style")]
        );
    }

    /// What the HTTP/1.1 writer makes of the page: the 200 (no 103) with the
    /// `Link` fields, the CSP nonce filled into both tags.
    #[test]
    fn written_page_has_hints_and_the_header_nonce() {
        let mut common = Common::new(false);
        let meta =
            RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"r" };
        let mut out = Vec::new();
        write_response(&mut out, &page(), &meta, &mut common);
        let text = String::from_utf8(out).expect("utf-8");
        let hints = early_hints().expect("hints");
        let rest = text.as_str();
        assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "the page, no 103 first: {rest}");
        let body_at = rest.find("\r\n\r\n").expect("head end") + 4;
        let (head, body) = rest.split_at(body_at);
        assert_eq!(head.matches("\r\nLink: ").count(), 2, "{head}");
        assert!(head.contains(std::str::from_utf8(hints.fields()).expect("ascii")), "{head}");
        let nonce = common.nonce();
        assert_eq!(head.matches(&format!("'nonce-{nonce}'")).count(), 2, "{head}");
        assert!(head.contains(&format!("Content-Length: {}\r\n", index_page().len())));
        assert_eq!(body.len(), index_page().len());
        assert!(body.contains(&format!("<script src=\"{}\" nonce=\"{nonce}\">", assets::url("app.js").expect("js"))));
        assert!(body.contains(&format!(
            "<link rel=\"stylesheet\" href=\"{}\" nonce=\"{nonce}\">",
            assets::url("app.css").expect("css")
        )));
        assert!(!body.contains("__FORKD_CSP_NONCE_SLOT__"));
    }

    #[test]
    fn static_lookup() {
        let icon = assets::by_plain("favicon.ico").expect("favicon");
        assert_eq!(icon.content_type, "image/x-icon");
        assert_eq!(&icon.bytes[..4], &[0, 0, 1, 0], "ICO header");
        assert_eq!(u16::from_le_bytes([icon.bytes[4], icon.bytes[5]]), 1, "one image");
        for a in assets::all() {
            let r = serve(&a.name).expect("served");
            assert_eq!((r.status, r.content_type, r.cache_control), (200, a.content_type, IMMUTABLE));
            assert_eq!(r.body.as_bytes(), a.bytes);
        }
        let js = &assets::by_plain("app.js").expect("js").name;
        let stale = format!("app.{}.js", if js.contains("deadbeef") { "0badf00d" } else { "deadbeef" });
        for bad in [
            "",
            ".",
            "..",
            "../Cargo.toml",
            "..%2FCargo.toml",
            "%2e%2e",
            "favicon.ico",
            "/favicon.ico",
            "FAVICON.ICO",
            "index.html",
            "app.js",
            "app.css",
            stale.as_str(),
            &format!("{js}/"),
            &format!("/{js}"),
            &format!("{js}%00"),
            &format!("{js}?x"),
            &js.to_ascii_uppercase(),
            "../src/main.rs",
            "/etc/passwd",
        ] {
            assert!(serve(bad).is_none(), "{bad}");
        }
    }
}
