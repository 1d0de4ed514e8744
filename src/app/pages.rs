//! The browser front end (CONTRACT §6): `GET /`, `GET /favicon.ico` and
//! `GET /static/{name}`.
//!
//! Every asset is embedded at compile time from the repository's `static/`
//! folder; nothing touches the file system at run time, and a name that is
//! not in [`ASSETS`] (`..` and encoded forms included) is 404.
//!
//! The page (`static/index.html`) carries its script and its style inline,
//! each with `nonce="…"` holding [`NONCE_SLOT`]: the CSP nonce is fresh per
//! response and is only drawn when the HTTP layer writes the headers, after
//! the handler has run, so the writer fills the slot in the copy of the body
//! it writes (same length, so `Content-Length` is unchanged). The page sends
//! `no-store`: a filled page must never be served again from a cache.

use super::{App, Ctx, Reply};
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::{Body, Response};

/// The placeholder the page carries where the response's CSP nonce goes:
/// exactly as long as the nonce (24 base64 characters), so filling it in
/// keeps `Content-Length`.
pub const NONCE_SLOT: &[u8; 24] = b"__FORKD_CSP_NONCE_SLOT__";

/// The page served at `/` (with [`NONCE_SLOT`] in its two nonce attributes).
pub const INDEX: &[u8] = include_bytes!("../../static/index.html");

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

// The build fails if the page loses a nonce slot (its `<script>` and its `<style>`).
const _: () = assert!(count_slots(INDEX, NONCE_SLOT) == 2, "static/index.html must carry the nonce slot twice");

/// `Cache-Control` of `/static/*`.
pub const IMMUTABLE: &str = "max-age=31536000, immutable";

/// An embedded file.
#[derive(Debug)]
pub struct Asset {
    /// Its name under `/static/`.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
}

/// Everything `/static/{name}` serves.
pub const ASSETS: &[Asset] =
    &[Asset { name: "favicon.ico", content_type: "image/x-icon", bytes: include_bytes!("../../static/favicon.ico") }];

/// The embedded file called exactly `name`.
pub fn asset(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

/// `GET /`: the page; `no-store`, its nonce slots filled by the writer.
pub fn index(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::Now(page()))
}

/// The response for `/` as the handler builds it.
pub fn page() -> Response {
    let mut r = Response::new(200);
    r.content_type = "text/html; charset=utf-8";
    r.cache_control = "no-store";
    r.body = Body::Static(INDEX);
    // The writer replaces the slot with this response's CSP nonce (same length).
    r.nonce_slot = Some(NONCE_SLOT);
    r
}

/// `GET /favicon.ico`: the embedded icon (a day's cache: the URL is not versioned).
pub fn favicon(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mut r = serve("favicon.ico").ok_or(Error::NotFound)?;
    r.cache_control = "public, max-age=86400";
    Ok(Reply::Now(r))
}

/// `GET /static/{name}`: an embedded file, cached for a year; else 404.
pub fn static_file(_: &App, _: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let name = ctx.params.get(0).ok_or(Error::NotFound)?;
    serve(name).map(Reply::Now).ok_or(Error::NotFound)
}

/// The response for `/static/{name}`, or `None` for an unknown name.
pub fn serve(name: &str) -> Option<Response> {
    let a = asset(name)?;
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
    use crate::http::response::{write_response, Delimit, RequestMeta};

    fn page_text() -> &'static str {
        std::str::from_utf8(INDEX).expect("utf-8 page")
    }

    #[test]
    fn slot_is_as_long_as_a_nonce() {
        let mut c = Common::new(false);
        c.write_security(&mut Vec::new());
        assert_eq!(NONCE_SLOT.len(), c.nonce().len());
        assert!(NONCE_SLOT.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_'));
    }

    #[test]
    fn page_has_the_slot_in_both_nonce_places() {
        let text = page_text();
        let slot = std::str::from_utf8(NONCE_SLOT).expect("ascii");
        assert_eq!(text.matches(slot).count(), 2, "the slot appears only where a nonce goes");
        assert_eq!(text.matches(&format!("<script nonce=\"{slot}\">")).count(), 1);
        assert_eq!(text.matches(&format!("<style nonce=\"{slot}\">")).count(), 1);
        assert_eq!(text.matches("<script").count(), 1, "one script, the nonced one");
        assert_eq!(text.matches("<style").count(), 1, "one style, the nonced one");
    }

    #[test]
    fn page_stays_within_the_policy() {
        let text = page_text();
        // One small response: sign-in and sign-up, the feed, the chat and their error handling.
        assert!(text.len() + ASSETS.iter().map(|a| a.bytes.len()).sum::<usize>() < 20 * 1024, "page over 20 KB");
        assert!(text.starts_with("<!doctype html>"));
        // Inline style attributes and handlers would need 'unsafe-inline'.
        assert!(!text.contains("style="), "style attribute");
        let handler_attr = text.match_indices(" on").any(|(i, _)| {
            let rest = &text[i + 3..];
            let n = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            n > 0 && rest[n..].starts_with('=')
        });
        assert!(!handler_attr, "inline event handler attribute");
        // Nothing external: no absolute URLs, no protocol-relative ones, no eval.
        for bad in ["http://", "https://", "src=\"//", "href=\"//", "eval(", "new Function", "innerHTML", "<iframe"] {
            assert!(!text.contains(bad), "{bad}");
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
            "<div id=\"err\" role=\"alert\" hidden>",
            "m.name",
            "\"/ws?token=\"",
            "type: \"join\", roomId: \"lobby\"",
            "type: \"chat\", roomId: \"lobby\", content",
            "\"offline\"",
            "<label for=\"email\">",
            "<label for=\"password\">",
            "<label for=\"su-name\">",
            "<label for=\"su-email\">",
            "<label for=\"su-password\">",
            "<label for=\"text\">",
            "<html lang=\"en\">",
        ] {
            assert!(text.contains(needle), "{needle}");
        }
    }

    #[test]
    fn page_response_headers() {
        let r = page();
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, "text/html; charset=utf-8");
        assert_eq!(r.cache_control, "no-store");
        assert_eq!(r.body.as_bytes(), INDEX);
    }

    /// The proposed writer change, emulated: after `write_response`, the nonce
    /// of the response (`Common::nonce`) replaces the slots in the written body.
    #[test]
    fn filled_page_matches_the_header_nonce() {
        let mut common = Common::new(false);
        let meta =
            RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"r" };
        let mut out = Vec::new();
        write_response(&mut out, &page(), &meta, &mut common);
        let body_at = out.windows(4).position(|w| w == b"\r\n\r\n").expect("head end") + 4;
        let nonce = common.nonce().as_bytes().to_vec();
        let mut i = body_at;
        while i + NONCE_SLOT.len() <= out.len() {
            if &out[i..i + NONCE_SLOT.len()] == NONCE_SLOT {
                out[i..i + NONCE_SLOT.len()].copy_from_slice(&nonce);
            }
            i += 1;
        }
        let text = String::from_utf8(out).expect("utf-8");
        let (head, body) = text.split_at(body_at);
        let nonce = std::str::from_utf8(&nonce).expect("ascii");
        assert_eq!(head.matches(&format!("'nonce-{nonce}'")).count(), 2, "{head}");
        assert!(head.contains(&format!("Content-Length: {}\r\n", INDEX.len())));
        assert_eq!(body.len(), INDEX.len());
        assert!(body.contains(&format!("<script nonce=\"{nonce}\">")));
        assert!(body.contains(&format!("<style nonce=\"{nonce}\">")));
        assert!(!body.contains("__FORKD_CSP_NONCE_SLOT__"));
    }

    #[test]
    fn static_lookup() {
        let a = asset("favicon.ico").expect("favicon");
        assert_eq!(a.content_type, "image/x-icon");
        assert_eq!(&a.bytes[..4], &[0, 0, 1, 0], "ICO header");
        assert_eq!(u16::from_le_bytes([a.bytes[4], a.bytes[5]]), 1, "one image");
        let r = serve("favicon.ico").expect("served");
        assert_eq!((r.status, r.content_type, r.cache_control), (200, "image/x-icon", IMMUTABLE));
        assert_eq!(r.body.as_bytes(), a.bytes);
        for bad in [
            "",
            ".",
            "..",
            "../Cargo.toml",
            "..%2FCargo.toml",
            "%2e%2e",
            "favicon.ico/",
            "/favicon.ico",
            "FAVICON.ICO",
            "favicon.ico%00",
            "favicon%2Eico",
            "favicon.ico?x",
            "index.html",
            "app.js",
            "../src/main.rs",
            "/etc/passwd",
        ] {
            assert!(asset(bad).is_none() && serve(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn asset_names_are_plain() {
        for a in ASSETS {
            assert!(a.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')), "{}", a.name);
            assert!(!a.name.starts_with('.'));
            assert!(!a.bytes.is_empty());
        }
    }
}
