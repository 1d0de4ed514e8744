//! The compression phase, after a response is decorated: a body worth compressing goes out
//! in the coding the request's `Accept-Encoding` allows (`crate::http::encoding`), with
//! `Content-Encoding`, `Vary: Accept-Encoding` and an `ETag` of its own per coding.
//!
//! Where the work happens is the point of this module:
//! - a pool job's response is compressed inside the job ([`Plan::finish`]), never on the loop;
//! - a body fixed for the process's life (`Body::Static`: the OpenAPI document, the
//!   `/api/docs` page, the `/static/*` files) is compressed once per coding at the best level
//!   and kept beside it ([`Precompressed`]); the embedded files at start ([`Precompressed::warm`]),
//!   the documents when they are first rendered;
//! - any other body made on the loop is sent as it is: per-request work stays off the loop.
//!
//! A response shorter than `min_bytes` costs one comparison of its length ([`worth_a_look`]).
//!
//! Never compressed: responses of the auth routes and any response with `Set-Cookie` (they
//! carry tokens next to text an attacker may choose: BREACH); statuses other than 2xx, and
//! 204 and 206 among them; pages whose body gets a CSP nonce as it is written; bodies that do
//! not get smaller. Event streams, downloads and WebSocket never reach this phase.
//!
//! It must not touch sockets or framing, pick routes, or compress a body on the loop per request.

use std::cell::RefCell;
use std::io::Write;

use flate2::write::GzEncoder;

use crate::config::Config;
use crate::http::encoding::{self, Coding};
use crate::http::fields::Fields;
use crate::http::response::{Body, Response, Value};

/// The gzip level of bodies compressed once for the process's life.
const BEST: u32 = 9;

/// At most this many fixed bodies are kept compressed per process (there are about ten).
const MAX_PRECOMPRESSED: usize = 64;

/// What a request allows for its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Never compressed and never said to vary: compression is off, or the route answers
    /// with tokens.
    Never,
    /// Sent as it is; an eligible response still says `Vary: Accept-Encoding`.
    Identity,
    /// An eligible response is compressed with this coding.
    Encode(Coding),
}

impl Plan {
    /// The plan for a request to `path` with header `fields`.
    pub fn new(config: &Config, path: &str, fields: Fields<'_>) -> Plan {
        if !config.compression.enabled || token_route(path) {
            return Plan::Never;
        }
        match encoding::negotiate(fields, Coding::ALL) {
            Some(c) => Plan::Encode(c),
            None => Plan::Identity,
        }
    }

    /// A pool job's response, compressed here (on the pool) when eligible.
    pub fn finish(self, mut r: Response, config: &Config) -> Response {
        if self == Plan::Never || !eligible(&r, config.compression.min_bytes) {
            return r;
        }
        vary(&mut r);
        if let Plan::Encode(c) = self {
            if let Some(z) = compress(c, r.body.as_bytes(), config.compression.level) {
                r.body = Body::Bytes(z);
                mark(&mut r, c);
            }
        }
        r
    }

    /// A response made on the loop: a fixed body in its kept compressed form, when eligible.
    /// Any other body is left as it is (and does not vary).
    pub fn on_loop(self, r: &mut Response, config: &Config, kept: &RefCell<Precompressed>) {
        let Body::Static(body) = r.body else { return };
        if self == Plan::Never || !eligible(r, config.compression.min_bytes) {
            return;
        }
        vary(r);
        if let Plan::Encode(c) = self {
            if let Some(z) = kept.borrow_mut().get(body, c) {
                r.body = Body::Static(z);
                mark(r, c);
            }
        }
    }
}

/// Whether a response with this body may need the phase at all: the one check every
/// response pays (a length comparison), before any header is read.
pub fn worth_a_look(r: &Response, config: &Config) -> bool {
    config.compression.enabled && r.body.as_bytes().len() >= config.compression.min_bytes
}

/// The auth routes (`/api/auth/*`, `/api/v1/auth/*`): their answers carry tokens.
fn token_route(path: &str) -> bool {
    path.starts_with("/api/auth/") || path.starts_with("/api/v1/auth/")
}

/// Whether `r` may be compressed: a 2xx with a whole body (not 204 or 206) of at least
/// `min_bytes`, of a compressible type, with no token cookie, no coding yet and no nonce slot.
fn eligible(r: &Response, min_bytes: usize) -> bool {
    let s = r.status;
    (200..300).contains(&s)
        && s != 204
        && s != 206
        && r.body.as_bytes().len() >= min_bytes
        && r.nonce_slot.is_none()
        && compressible(r.content_type)
        && !r
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("set-cookie") || n.eq_ignore_ascii_case("content-encoding"))
}

/// Text types: JSON, HTML, CSS, JavaScript, SVG, XML (never `text/event-stream`).
fn compressible(content_type: &str) -> bool {
    let t = content_type.split(';').next().unwrap_or_default().trim();
    let text = t.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("text/"));
    (text && !t.eq_ignore_ascii_case("text/event-stream"))
        || ["application/json", "application/javascript", "application/xml", "image/svg+xml"]
            .iter()
            .any(|k| t.eq_ignore_ascii_case(k))
        || t.get(t.len().saturating_sub(5)..).is_some_and(|s| s.eq_ignore_ascii_case("+json"))
}

fn vary(r: &mut Response) {
    r.header("Vary", "Accept-Encoding");
}

/// `Content-Encoding`, and each `ETag` made the coding's own (`"abc"` → `"abc-gzip"`).
fn mark(r: &mut Response, c: Coding) {
    for (name, value) in &mut r.headers {
        if name.eq_ignore_ascii_case("etag") {
            *value = coded_etag(value, c);
        }
    }
    r.header("Content-Encoding", c.token());
}

/// `etag` with `-<coding>` before its closing quote (weak or strong); as it is when unquoted.
fn coded_etag(etag: &str, c: Coding) -> Value {
    match etag.strip_suffix('"') {
        Some(open) if etag.len() >= 2 => Value::display(format_args!("{open}-{}\"", c.token())),
        _ => Value::from(etag.to_owned()),
    }
}

/// Whether the entity tag `tag` (from `If-None-Match`) is `etag` in one of the codings
/// ([`coded_etag`]): a client that holds the gzip form asks with that form's tag.
pub fn is_coded_form(tag: &[u8], etag: &[u8]) -> bool {
    let (Some(open), Some(tag_open)) = (etag.strip_suffix(b"\""), tag.strip_suffix(b"\"")) else { return false };
    Coding::ALL.iter().any(|c| {
        tag_open
            .strip_prefix(open)
            .and_then(|rest| rest.strip_prefix(b"-"))
            .is_some_and(|token| token == c.token().as_bytes())
    })
}

/// `body` compressed with `c` at `level`; `None` when it would not get smaller.
fn compress(c: Coding, body: &[u8], level: u32) -> Option<Vec<u8>> {
    let out = match c {
        Coding::Gzip => {
            let mut z = GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::new(level));
            z.write_all(body).ok()?;
            z.finish().ok()?
        }
    };
    (out.len() < body.len()).then_some(out)
}

/// The compressed forms of the bodies fixed for the process's life, made once each at the
/// best level. A body is known by its address and length: it lives forever, so neither can
/// be another body's.
#[derive(Default)]
pub struct Precompressed {
    entries: Vec<Kept>,
}

struct Kept {
    at: usize,
    len: usize,
    coding: Coding,
    /// `None`: the coding does not make it smaller.
    form: Option<&'static [u8]>,
}

impl Precompressed {
    /// `body` in coding `c`: made and kept on first use; `None` when it does not get smaller
    /// (or more bodies than expected are kept: then sent as they are).
    pub fn get(&mut self, body: &'static [u8], c: Coding) -> Option<&'static [u8]> {
        let (at, len) = (body.as_ptr() as usize, body.len());
        if let Some(k) = self.entries.iter().find(|k| k.at == at && k.len == len && k.coding == c) {
            return k.form;
        }
        if self.entries.len() >= MAX_PRECOMPRESSED {
            return None;
        }
        // Leaked once per body and coding, like the body itself.
        let form = compress(c, body, BEST).map(|z| &*Box::leak(z.into_boxed_slice()));
        self.entries.push(Kept { at, len, coding: c, form });
        form
    }

    /// Compresses, in every coding, each embedded file worth it (`/static/*`), so that no
    /// request pays for it.
    pub fn warm(&mut self, config: &Config) {
        if !config.compression.enabled {
            return;
        }
        for a in crate::app::handlers::assets::all() {
            if a.bytes.len() >= config.compression.min_bytes && compressible(a.content_type) {
                for &c in Coding::ALL {
                    self.get(a.bytes, c);
                }
            }
        }
    }

    /// How many forms are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn gunzip(z: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(z).read_to_end(&mut out).expect("gzip");
        out
    }

    fn big_json() -> Vec<u8> {
        format!("[{}0]", "{\"name\":\"someone\",\"email\":\"a@example.test\"},".repeat(100)).into_bytes()
    }

    fn json(status: u16, body: Vec<u8>) -> Response {
        let mut r = Response::new(status);
        r.body = Body::Bytes(body);
        r
    }

    fn header<'a>(r: &'a Response, name: &str) -> Vec<&'a str> {
        r.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    fn plan(accept: &str) -> Plan {
        let lines = [httparse::Header { name: "Accept-Encoding", value: accept.as_bytes() }];
        Plan::new(&Config::default(), "/api/v1/users", Fields::new(&lines))
    }

    #[test]
    fn a_large_json_body_is_gzipped_with_vary_and_a_coded_etag() {
        let config = Config::default();
        let mut r = json(200, big_json());
        r.header("ETag", "\"abc\"");
        let r = plan("gzip").finish(r, &config);
        assert_eq!(header(&r, "Content-Encoding"), ["gzip"]);
        assert_eq!(header(&r, "Vary"), ["Accept-Encoding"]);
        assert_eq!(header(&r, "ETag"), ["\"abc-gzip\""]);
        assert!(r.body.as_bytes().len() < big_json().len());
        assert_eq!(gunzip(r.body.as_bytes()), big_json());
    }

    #[test]
    fn identity_still_says_vary_and_small_bodies_are_untouched() {
        let config = Config::default();
        let r = plan("br").finish(json(200, big_json()), &config);
        assert_eq!((header(&r, "Vary"), header(&r, "Content-Encoding")), (vec!["Accept-Encoding"], vec![]));
        assert_eq!(r.body.as_bytes(), big_json());
        let small = plan("gzip").finish(json(200, b"{\"status\":\"ok\"}".to_vec()), &config);
        assert!(small.headers.is_empty() && small.body.as_bytes() == b"{\"status\":\"ok\"}");
        assert!(!worth_a_look(&small, &config), "below min_bytes: the one check");
    }

    #[test]
    fn token_responses_and_other_kinds_are_never_compressed() {
        let config = Config::default();
        let lines = [httparse::Header { name: "Accept-Encoding", value: b"gzip" }];
        assert_eq!(Plan::new(&config, "/api/v1/auth/login", Fields::new(&lines)), Plan::Never);
        assert_eq!(Plan::new(&config, "/api/auth/refresh", Fields::new(&lines)), Plan::Never);
        assert_eq!(Plan::new(&config, "/api/v1/users", Fields::new(&lines)), Plan::Encode(Coding::Gzip));
        let mut cookie = json(200, big_json());
        cookie.header("Set-Cookie", "refresh_token=x");
        let untouched = |r: Response| {
            let r = plan("gzip").finish(r, &config);
            header(&r, "Content-Encoding").is_empty() && header(&r, "Vary").is_empty()
        };
        assert!(untouched(cookie));
        for status in [204, 206, 304, 404, 500] {
            assert!(untouched(json(status, big_json())), "{status}");
        }
        let mut stream = json(200, big_json());
        stream.content_type = "text/event-stream";
        assert!(untouched(stream));
        let mut image = json(200, big_json());
        image.content_type = "image/png";
        assert!(untouched(image));
        let mut page = json(200, big_json());
        page.nonce_slot = Some(b"nonce-slot-xxxxxxxxxxxxx");
        assert!(untouched(page));
        let mut off = Config::default();
        off.compression.enabled = false;
        assert_eq!(Plan::new(&off, "/api/openapi.json", Fields::new(&lines)), Plan::Never);
    }

    #[test]
    fn compressible_types() {
        for t in ["application/json", "text/html; charset=utf-8", "text/css", "application/problem+json", "TEXT/PLAIN"]
        {
            assert!(compressible(t), "{t}");
        }
        for t in ["text/event-stream", "image/png", "application/octet-stream", "image/x-icon"] {
            assert!(!compressible(t), "{t}");
        }
    }

    #[test]
    fn a_fixed_body_is_compressed_once_and_kept() {
        let config = Config::default();
        let body: &'static [u8] = Box::leak(big_json().into_boxed_slice());
        let kept = RefCell::new(Precompressed::default());
        let mut first = Response::static_json(body);
        plan("gzip").on_loop(&mut first, &config, &kept);
        let mut second = Response::static_json(body);
        plan("gzip").on_loop(&mut second, &config, &kept);
        assert_eq!(kept.borrow().len(), 1, "one form for one body and coding");
        assert_eq!(first.body.as_bytes().as_ptr(), second.body.as_bytes().as_ptr(), "the same bytes");
        assert_eq!(gunzip(second.body.as_bytes()), body);
        assert_eq!(header(&second, "Content-Encoding"), ["gzip"]);
        let mut per_request = json(200, big_json());
        plan("gzip").on_loop(&mut per_request, &config, &kept);
        assert!(per_request.headers.is_empty(), "a body made per request stays as it is on the loop");
    }

    #[test]
    fn the_embedded_files_are_warmed_at_start() {
        let mut kept = Precompressed::default();
        kept.warm(&Config::default());
        let before = kept.len();
        let js = crate::app::handlers::assets::by_plain("app.js").expect("app.js");
        assert!(kept.get(js.bytes, Coding::Gzip).is_some());
        assert!(before > 0);
        assert_eq!(kept.len(), before, "already there");
    }

    #[test]
    fn etags_per_coding() {
        assert_eq!(coded_etag("\"abc\"", Coding::Gzip), "\"abc-gzip\"");
        assert_eq!(coded_etag("W/\"abc\"", Coding::Gzip), "W/\"abc-gzip\"");
        assert_eq!(coded_etag("abc", Coding::Gzip), "abc");
        assert!(is_coded_form(b"\"abc-gzip\"", b"\"abc\""));
        assert!(!is_coded_form(b"\"abc-br0\"", b"\"abc\""));
        assert!(!is_coded_form(b"\"abc\"", b"\"abc\""));
    }
}
