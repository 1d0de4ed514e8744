//! HTTP/2 response heads built straight from the protocol-neutral
//! [`Response`]: the `:status`, an `http::HeaderMap` and the body as
//! [`Bytes`], ready for [`super::H2Conn::respond_with`].
//!
//! This module owns the HTTP/2 form of the fields every response carries
//! (CONTRACT §4) and of the fields a [`Response`] adds; it must stay field
//! for field what `write_response` writes for HTTP/1.1, minus the
//! connection-specific fields HTTP/2 forbids (RFC 9113 §8.2.2). The unit
//! tests hold the two side by side.
//!
//! Cost: the fixed fields are compile-time constants (a clone is a pointer
//! copy); the values that change (`date` once a second, the CSP with its
//! nonce, `x-request-id`, `content-length`) are written into one shared
//! arena and handed out as refcounted slices, so a head costs no allocation
//! beyond the `HeaderMap`. An HTML document's CSP (with its nonce) and
//! `x-request-id` are fresh every time: they are marked sensitive, which makes the HPACK
//! encoder send them as literals that are never indexed instead of inserting each one
//! into the dynamic table, where they would evict the fixed fields (which
//! then encode as one-byte indices on every later response).

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use super::H2Error;
use crate::http::headers::{Common, API_CSP, SECURITY_FIELDS};
use crate::http::response::{itoa_buf, sends_early_hints, Body, Delimit, RequestMeta, Response};

/// Fresh bytes are carved from arena blocks of this size.
const ARENA_BLOCK: usize = 8 * 1024;

/// Connection-specific header fields (RFC 9113 §8.2.2): never sent.
pub(crate) const HOP_BY_HOP: [&str; 5] =
    ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"];

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const CSP: HeaderName = HeaderName::from_static("content-security-policy");
const CSP_REPORT_ONLY: HeaderName = HeaderName::from_static("content-security-policy-report-only");

const fn security_field(i: usize) -> (HeaderName, HeaderValue) {
    (HeaderName::from_static(SECURITY_FIELDS[i].0), HeaderValue::from_static(SECURITY_FIELDS[i].1))
}

/// [`SECURITY_FIELDS`] as HTTP/2 fields, validated at compile time.
const SECURITY: [(HeaderName, HeaderValue); 10] = [
    security_field(0),
    security_field(1),
    security_field(2),
    security_field(3),
    security_field(4),
    security_field(5),
    security_field(6),
    security_field(7),
    security_field(8),
    security_field(9),
];

/// A response head and body in HTTP/2 form.
#[derive(Debug)]
pub struct Head {
    /// The `Link` fields of a `103 Early Hints` to send first, if any.
    pub hints: Option<HeaderMap>,
    /// `:status`.
    pub status: StatusCode,
    /// The regular fields, connection-specific ones left out.
    pub fields: HeaderMap,
    /// The body to send now (empty: none, or it follows later).
    pub body: Bytes,
}

/// Builds [`Head`]s; one per connection, keeping its arena and the current
/// `date` value between responses.
#[derive(Debug, Default)]
pub struct Heads {
    arena: BytesMut,
    /// The `date` value and the second it was made for.
    date: Option<(u64, HeaderValue)>,
    /// The fields every head of one [`Shape`] starts with, made on first
    /// use: cloning one and setting the values that change costs a fraction
    /// of inserting the fields one by one (each insert hashes its name).
    templates: [Option<HeaderMap>; Shape::COUNT],
}

/// Which of the leading fields a head has; indexes [`Heads`]' templates.
#[derive(Clone, Copy)]
struct Shape {
    content_type: bool,
    content_length: bool,
    report_only: bool,
}

impl Shape {
    const COUNT: usize = 8;

    fn index(self) -> usize {
        usize::from(self.content_type) | usize::from(self.content_length) << 1 | usize::from(self.report_only) << 2
    }

    /// The leading fields in `write_response`'s order: `date`,
    /// [`content-type`], [`content-length`], `cache-control`,
    /// `x-request-id`, the CSP (empty values, set per head), then the fixed
    /// security fields.
    fn template(self) -> HeaderMap {
        let empty = HeaderValue::from_static("");
        let mut map = HeaderMap::with_capacity(16);
        map.append(http::header::DATE, empty.clone());
        if self.content_type {
            map.append(http::header::CONTENT_TYPE, empty.clone());
        }
        if self.content_length {
            map.append(http::header::CONTENT_LENGTH, empty.clone());
        }
        map.append(http::header::CACHE_CONTROL, empty.clone());
        map.append(X_REQUEST_ID, empty.clone());
        map.append(if self.report_only { CSP_REPORT_ONLY } else { CSP }, empty);
        for (name, value) in SECURITY {
            map.append(name, value);
        }
        map
    }
}

impl Heads {
    /// An empty builder (no allocation until the first head).
    pub fn new() -> Heads {
        Heads::default()
    }

    /// The HTTP/2 head (and whole body, for `Delimit::Length`) of `resp`,
    /// answering a request described by `meta`: the same fields
    /// `write_response` writes for HTTP/1.1 with the same arguments, in the
    /// same order, minus the connection-specific ones. Takes the body out
    /// of `resp`. A fresh CSP nonce is drawn from `common` (and put into the
    /// body's nonce slot, if any).
    pub fn build(&mut self, resp: &mut Response, meta: &RequestMeta<'_>, common: &mut Common) -> Result<Head, H2Error> {
        let status = StatusCode::from_u16(resp.status).map_err(|_| H2Error::InvalidHead("status"))?;
        let body_len = resp.body.as_bytes().len();
        let bodyless = resp.status == 204 || resp.status == 304 || resp.status < 200 || meta.delimit != Delimit::Length;
        let links = resp.early_hints.map_or(&[][..], |h| h.links());
        let hints = match resp.early_hints {
            Some(_) if sends_early_hints(resp.status, meta) => {
                let mut map = HeaderMap::with_capacity(links.len());
                for l in links {
                    map.append(http::header::LINK, HeaderValue::from_str(l).map_err(|_| H2Error::InvalidHead("link"))?);
                }
                Some(map)
            }
            _ => None,
        };
        let length = match meta.delimit {
            Delimit::Sized(n) => Some(n),
            Delimit::Length if !bodyless => Some(body_len as u64),
            _ => None,
        };
        let shape = Shape {
            content_type: length.is_some() || meta.delimit == Delimit::Chunked,
            content_length: length.is_some(),
            report_only: common.csp_field_name() == CSP_REPORT_ONLY.as_str(),
        };
        // The values in the template's order.
        let mut leading = [const { None }; 6];
        leading[0] = Some(self.date(common));
        if shape.content_type {
            leading[1] = Some(static_value(resp.content_type)?);
        }
        if let Some(n) = length {
            let mut digits = itoa_buf(n as usize);
            leading[2] = Some(self.value(&[digits.as_slice()], false)?);
        }
        leading[3] = Some(static_value(resp.cache_control)?);
        leading[4] = Some(self.value(&[meta.request_id], true)?);
        leading[5] = Some(if resp.is_document() {
            self.value(&common.fresh_csp(), true)?
        } else {
            HeaderValue::from_static(API_CSP)
        });
        let mut fields = self.templates[shape.index()].get_or_insert_with(|| shape.template()).clone();
        for (slot, value) in fields.values_mut().zip(leading.into_iter().flatten()) {
            *slot = value;
        }
        for l in links {
            fields.append(http::header::LINK, HeaderValue::from_str(l).map_err(|_| H2Error::InvalidHead("link"))?);
        }
        for (name, value) in &resp.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| H2Error::InvalidHead("header name"))?;
            if HOP_BY_HOP.contains(&name.as_str()) || (name == http::header::TE && value != "trailers") {
                continue;
            }
            let value = match value {
                crate::http::response::Value::Static(s) => static_value(s)?,
                other => HeaderValue::from_str(other).map_err(|_| H2Error::InvalidHead("header value"))?,
            };
            fields.append(name, value);
        }
        let body = if meta.head || bodyless {
            Bytes::new()
        } else {
            match (std::mem::take(&mut resp.body), resp.nonce_slot) {
                (Body::Empty, _) => Bytes::new(),
                (Body::Static(b), None) => Bytes::from_static(b),
                (Body::Static(b), Some(slot)) => {
                    let mut v = b.to_vec();
                    common.fill_nonce(&mut v, slot);
                    Bytes::from(v)
                }
                (Body::Bytes(mut v), slot) => {
                    if let Some(slot) = slot {
                        common.fill_nonce(&mut v, slot);
                    }
                    Bytes::from(v)
                }
            }
        };
        Ok(Head { hints, status, fields, body })
    }

    /// The `date` value of `common`'s current second (made once a second).
    fn date(&mut self, common: &Common) -> HeaderValue {
        let (secs, text) = common.date();
        match &self.date {
            Some((s, v)) if *s == secs => v.clone(),
            _ => {
                // 29 bytes of an HTTP date; a value that fails (never) goes out empty.
                let v = HeaderValue::from_bytes(text).unwrap_or_else(|_| HeaderValue::from_static(""));
                self.date = Some((secs, v.clone()));
                v
            }
        }
    }

    /// A value made of `parts`, in the arena, validated.
    fn value(&mut self, parts: &[&[u8]], sensitive: bool) -> Result<HeaderValue, H2Error> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.arena.capacity() < len {
            // Reclaims the block in place when every value cut from it is gone.
            self.arena.reserve(len.max(ARENA_BLOCK));
        }
        for p in parts {
            self.arena.extend_from_slice(p);
        }
        let mut v = HeaderValue::from_maybe_shared(self.arena.split().freeze())
            .map_err(|_| H2Error::InvalidHead("header value"))?;
        v.set_sensitive(sensitive);
        Ok(v)
    }
}

/// A value that lives for the whole program, checked (as
/// `HeaderValue::from_static` would, without its panic) and not copied.
fn static_value(s: &'static str) -> Result<HeaderValue, H2Error> {
    if s.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        Ok(HeaderValue::from_static(s))
    } else {
        Err(H2Error::InvalidHead("header value"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::hints::EarlyHints;
    use crate::http1::writer::write_response;
    use std::sync::OnceLock;

    fn hints() -> &'static EarlyHints {
        static H: OnceLock<EarlyHints> = OnceLock::new();
        H.get_or_init(|| EarlyHints::preload(&[("/static/a.js", "script"), ("/static/b.css", "style")]).expect("valid"))
    }

    /// The fields of one HTTP/1.1 message, names lower-cased.
    type Fields = Vec<(String, Vec<u8>)>;

    /// `write_response`'s output parsed back: each message's status and
    /// fields (a `103` first, if any), and the body.
    fn render_h1(resp: &Response, meta: &RequestMeta<'_>, common: &mut Common) -> (Vec<(u16, Fields)>, Vec<u8>) {
        let mut out = Vec::new();
        write_response(&mut out, resp, meta, common);
        let mut at = 0;
        let mut heads = Vec::new();
        loop {
            let mut raw = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut raw);
            let n = match r.parse(&out[at..]) {
                Ok(httparse::Status::Complete(n)) => n,
                other => panic!("unparsable: {other:?}"),
            };
            let fields = r.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect();
            let status = r.code.expect("status");
            heads.push((status, fields));
            at += n;
            if status != 103 {
                return (heads, out[at..].to_vec());
            }
        }
    }

    fn fields_of(map: &HeaderMap) -> Fields {
        map.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect()
    }

    /// The fields HTTP/1.1 sends that HTTP/2 must not.
    fn h2_only(fields: Fields) -> Fields {
        fields.into_iter().filter(|(n, _)| !HOP_BY_HOP.contains(&n.as_str())).collect()
    }

    /// The nonce in a CSP value (an HTML document's), or nothing (the fixed policy).
    fn nonce_of(fields: &Fields) -> Vec<u8> {
        let (_, csp) = fields.iter().find(|(n, _)| n.starts_with("content-security-policy")).expect("a CSP");
        let text = std::str::from_utf8(csp).expect("ascii");
        match text.find("'nonce-") {
            Some(at) => text.as_bytes()[at + "'nonce-".len()..at + "'nonce-".len() + 24].to_vec(),
            None => {
                assert_eq!(text, API_CSP, "no nonce: the fixed policy");
                Vec::new()
            }
        }
    }

    /// `fields` with every occurrence of `nonce` replaced by a marker.
    fn without_nonce(fields: Fields, nonce: &[u8]) -> Fields {
        let marker = b"NONCE-NONCE-NONCE-NONCE-";
        fields
            .into_iter()
            .map(|(n, v)| {
                let mut v = v;
                let mut i = 0;
                while !nonce.is_empty() && i + nonce.len() <= v.len() {
                    if &v[i..i + nonce.len()] == nonce {
                        v[i..i + nonce.len()].copy_from_slice(marker);
                    }
                    i += 1;
                }
                (n, v)
            })
            .collect()
    }

    /// Build `make()` both ways and require the same status, the same fields
    /// in the same order (HTTP/1.1's minus the connection fields), the same
    /// body, nonces aside (each build draws one), and HTTP/2's early hints
    /// (HTTP/1.1 has none) to be the final head's Link fields.
    fn same_as_h1(make: impl Fn() -> Response, meta: &RequestMeta<'_>, report_only: bool) -> Head {
        same_as_h1_with(&mut Heads::new(), make, meta, report_only)
    }

    /// [`same_as_h1`] with the builder `heads` (and the templates it made).
    fn same_as_h1_with(
        heads: &mut Heads,
        make: impl Fn() -> Response,
        meta: &RequestMeta<'_>,
        report_only: bool,
    ) -> Head {
        let mut common = Common::new(report_only);
        let (h1, h1_body) = render_h1(&make(), meta, &mut common);
        let mut resp = make();
        let head = heads.build(&mut resp, meta, &mut common).expect("builds");
        let (status, h1_fields) = h1.last().cloned().expect("a final head");
        assert_eq!(head.status.as_u16(), status);
        assert_eq!(h1.len(), 1, "HTTP/1.1 sends no interim response");
        // HTTP/2's 103, when it sends one, carries the final head's Link fields.
        let links: Fields = h1_fields.iter().filter(|(n, _)| n == "link").cloned().collect();
        let hinted = make().early_hints.is_some() && sends_early_hints(status, meta);
        let want_hints: Vec<Fields> = if hinted { vec![links] } else { Vec::new() };
        let h1_nonce = nonce_of(&h1_fields);
        let h2_fields = fields_of(&head.fields);
        let h2_nonce = nonce_of(&h2_fields);
        if !h1_nonce.is_empty() {
            assert_ne!(h1_nonce, h2_nonce, "a fresh nonce per response");
        }
        assert_eq!(without_nonce(h2_fields, &h2_nonce), without_nonce(h2_only(h1_fields), &h1_nonce));
        let h2_hints: Vec<Fields> = head.hints.iter().map(fields_of).collect();
        assert_eq!(h2_hints, want_hints);
        let unnonce = |body: &[u8], nonce: &[u8]| match std::str::from_utf8(nonce).expect("ascii") {
            "" => String::from_utf8_lossy(body).into_owned(),
            n => String::from_utf8_lossy(body).replace(n, "N"),
        };
        let body = unnonce(&head.body, &h2_nonce);
        let h1_body = unnonce(&h1_body, &h1_nonce);
        assert_eq!(body, h1_body);
        head
    }

    fn meta(delimit: Delimit, head: bool) -> RequestMeta<'static> {
        RequestMeta {
            delimit,
            head,
            http10: false,
            keep_alive: true,
            request_id: b"0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77",
        }
    }

    #[test]
    fn health_is_field_for_field_the_http1_head() {
        let head = same_as_h1(|| Response::static_json(b"{\"status\":\"ok\"}"), &meta(Delimit::Length, false), false);
        let names: Vec<&str> = head.fields.keys().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "date",
                "content-type",
                "content-length",
                "cache-control",
                "x-request-id",
                "content-security-policy",
                "server",
                "strict-transport-security",
                "x-content-type-options",
                "x-frame-options",
                "x-xss-protection",
                "referrer-policy",
                "permissions-policy",
                "cross-origin-opener-policy",
                "cross-origin-embedder-policy",
                "cross-origin-resource-policy",
            ]
        );
        assert_eq!(head.fields["content-length"], "15");
        assert_eq!(head.fields["x-request-id"], "0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77");
        assert_eq!(&head.body[..], b"{\"status\":\"ok\"}");
        assert!(head.hints.is_none());
    }

    #[test]
    fn values_that_change_per_response_are_never_indexed_the_rest_may_be() {
        let mut common = Common::new(false);
        let mut resp = Response::static_json(b"{}");
        let head = Heads::new().build(&mut resp, &meta(Delimit::Length, false), &mut common).expect("builds");
        for (name, value) in &head.fields {
            // An API response's policy is the fixed one: indexed like the other fixed fields.
            assert_eq!(value.is_sensitive(), name == "x-request-id", "{name}");
        }
        assert_eq!(head.fields["content-security-policy"], API_CSP);
        let mut page = Response::new(200);
        page.content_type = "text/html; charset=utf-8";
        let head = Heads::new().build(&mut page, &meta(Delimit::Length, false), &mut common).expect("builds");
        for (name, value) in &head.fields {
            let fresh = name == "x-request-id" || name == "content-security-policy";
            assert_eq!(value.is_sensitive(), fresh, "{name}: a document's policy carries its nonce");
        }
    }

    #[test]
    fn head_and_bodyless_statuses() {
        // HEAD: GET's fields (with its length), no body.
        let head = same_as_h1(|| Response::static_json(b"{\"a\":1}"), &meta(Delimit::Length, true), false);
        assert_eq!(head.fields["content-length"], "7");
        assert!(head.body.is_empty());
        for status in [204, 304] {
            let head = same_as_h1(|| Response::new(status), &meta(Delimit::Length, false), false);
            assert!(!head.fields.contains_key("content-length") && !head.fields.contains_key("content-type"));
        }
    }

    #[test]
    fn streamed_bodies_and_the_tunnel() {
        // Chunked over HTTP/1.1: a type, no length, no transfer-encoding.
        let head = same_as_h1(|| Response::new(200), &meta(Delimit::Chunked, false), false);
        assert!(head.fields.contains_key("content-type") && !head.fields.contains_key("transfer-encoding"));
        let head = same_as_h1(|| Response::new(206), &meta(Delimit::Sized(12345), false), false);
        assert_eq!(head.fields["content-length"], "12345");
        let head = same_as_h1(|| Response::new(200), &meta(Delimit::Upgrade, false), false);
        assert!(!head.fields.contains_key("connection") && !head.fields.contains_key("content-type"));
    }

    #[test]
    fn one_builder_serves_every_shape_from_its_templates() {
        // Each shape (with or without a type and a length, either CSP name)
        // has its own template, made once, then cloned: heads of shapes in
        // turn from one builder stay field for field the HTTP/1.1 heads, with
        // the values of their own response, never a previous one's.
        let mut heads = Heads::new();
        for round in 0..2u8 {
            for report_only in [false, true] {
                let body: &'static [u8] = if round == 0 { b"{}" } else { b"{\"round\":1}" };
                let head = same_as_h1_with(
                    &mut heads,
                    || Response::static_json(body),
                    &meta(Delimit::Length, false),
                    report_only,
                );
                assert_eq!(head.fields["content-length"], body.len().to_string().as_str());
                same_as_h1_with(&mut heads, || Response::new(204), &meta(Delimit::Length, false), report_only);
                same_as_h1_with(&mut heads, || Response::new(200), &meta(Delimit::Chunked, false), report_only);
                let len = 1000 + u64::from(round);
                let head =
                    same_as_h1_with(&mut heads, || Response::new(206), &meta(Delimit::Sized(len), false), report_only);
                assert_eq!(head.fields["content-length"], len.to_string().as_str());
                let mut cached = Response::static_json(b"{}");
                cached.cache_control = "public, max-age=60";
                let head = heads
                    .build(&mut cached, &meta(Delimit::Length, false), &mut Common::new(report_only))
                    .expect("builds");
                assert_eq!(head.fields["cache-control"], "public, max-age=60");
            }
        }
    }

    #[test]
    fn early_hints_come_first_and_stay_in_the_final_head() {
        let make = || {
            let mut r = Response::new(200);
            r.content_type = "text/html; charset=utf-8";
            r.body = Body::Static(b"<html>page</html>");
            r.early_hints = Some(hints());
            r
        };
        let head = same_as_h1(make, &meta(Delimit::Length, false), false);
        let hints = head.hints.expect("a 103");
        assert_eq!(hints.get_all("link").iter().count(), 2);
        assert_eq!(head.fields.get_all("link").iter().count(), 2);
        // Not to HEAD: the final head still has the links.
        let head = same_as_h1(make, &meta(Delimit::Length, true), false);
        assert!(head.hints.is_none());
        assert_eq!(head.fields.get_all("link").iter().count(), 2);
    }

    #[test]
    fn extra_fields_in_order_connection_fields_dropped() {
        let make = || {
            let mut r = Response::new(302);
            r.cache_control = "public, max-age=60";
            r.header("Location", "/elsewhere");
            r.header("ETag", format!("\"{}\"", 42));
            r.header("Vary", "Accept-Encoding");
            r.header("Vary", "Origin");
            r.header("Connection", "close");
            r.header("Keep-Alive", "timeout=5");
            r.header("Transfer-Encoding", "chunked");
            r.header("Upgrade", "h2c");
            r.header("X-Custom", "yes");
            r.close = true;
            r
        };
        let head = same_as_h1(make, &meta(Delimit::Length, false), true);
        assert_eq!(head.fields["cache-control"], "public, max-age=60");
        assert_eq!(head.fields["location"], "/elsewhere");
        assert_eq!(head.fields["etag"], "\"42\"");
        let vary: Vec<_> = head.fields.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept-Encoding", "Origin"]);
        assert!(head.fields.contains_key("content-security-policy-report-only"));
        assert!(!head.fields.contains_key("content-security-policy"));
        for name in HOP_BY_HOP {
            assert!(!head.fields.contains_key(name), "{name}");
        }
    }

    #[test]
    fn the_nonce_slot_gets_the_head_s_nonce() {
        static SLOT: [u8; 24] = *b"@@@@@@NONCE-SLOT@@@@@@@@";
        let make = || {
            let mut r = Response::new(200);
            r.content_type = "text/html; charset=utf-8";
            r.body = Body::Static(b"<script nonce=\"@@@@@@NONCE-SLOT@@@@@@@@\"></script>");
            r.nonce_slot = Some(&SLOT);
            r
        };
        let head = same_as_h1(make, &meta(Delimit::Length, false), false);
        let nonce = nonce_of(&fields_of(&head.fields));
        let expected = format!("<script nonce=\"{}\"></script>", String::from_utf8_lossy(&nonce));
        assert_eq!(String::from_utf8_lossy(&head.body), expected);
    }

    #[test]
    fn bad_values_are_refused_not_sent() {
        let mut resp = Response::new(200);
        resp.header("x-bad", String::from("a\r\nb: c"));
        let built = Heads::new().build(&mut resp, &meta(Delimit::Length, false), &mut Common::new(false));
        assert!(matches!(built, Err(H2Error::InvalidHead(_))));
        let mut resp = Response::new(200);
        let bad_id = RequestMeta { request_id: b"a\nb", ..meta(Delimit::Length, false) };
        assert!(Heads::new().build(&mut resp, &bad_id, &mut Common::new(false)).is_err());
    }

    #[test]
    fn many_heads_share_arena_blocks_and_stay_intact() {
        let mut heads = Heads::new();
        let mut common = Common::new(false);
        let mut kept = Vec::new();
        for i in 0..200 {
            let id = format!("req-{i}");
            let m = RequestMeta { request_id: id.as_bytes(), ..meta(Delimit::Length, false) };
            let mut resp = Response::static_json(b"{}");
            let head = heads.build(&mut resp, &m, &mut common).expect("builds");
            kept.push((id, head));
        }
        for (id, head) in &kept {
            assert_eq!(head.fields["x-request-id"], id.as_str());
        }
    }
}
