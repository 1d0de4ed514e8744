//! Response heads built straight from the protocol-neutral [`Response`]:
//! the status, the regular fields as a [`ResponseFields`] list and the body
//! as [`Bytes`], ready for [`super::H2Conn::respond_with`] and for HTTP/3's
//! QPACK encoder alike.
//!
//! This module owns the HTTP/2 and HTTP/3 form of the fields every response
//! carries and of the fields a [`Response`] adds; it must stay
//! field for field what `write_response` writes for HTTP/1.1, minus the
//! connection-specific fields both forbid (RFC 9113 §8.2.2, RFC 9114
//! §4.2). The unit tests hold the two side by side. It knows no wire format.
//!
//! Cost: a head is built without a map and, but for a response's own
//! fields, without an allocation. The fields every response of a kind
//! shares (the API policy and the security fields) are one static run
//! ([`hpack::Part::Fixed`]), which an HPACK encoder writes as the bytes it
//! made the last time. The values that change (`date` once a second, an
//! HTML document's CSP with its nonce, `x-request-id`, `content-length`)
//! are written into one shared arena and handed out as refcounted slices.
//! An HTML document's CSP is fresh every time and carries a nonce: it is
//! marked sensitive, which makes the HPACK encoder send it as a literal
//! that is never indexed instead of inserting each one into the dynamic
//! table, where they would evict the fixed fields (which then encode as
//! one-byte indices on every later response). `x-request-id` is fresh too
//! but no secret: the encoder's rule for its name applies (its first value
//! enters the table, later ones name that entry).

use bytes::{Bytes, BytesMut};
use http::StatusCode;

use super::hpack::Part;
use super::machine::is_token;
use super::H2Error;
use crate::http::headers::{Common, API_CSP, SECURITY_FIELDS};
use crate::http::response::{itoa_buf, sends_early_hints, Body, Delimit, Inline, RequestMeta, Response, Value};

/// Fresh bytes are carved from arena blocks of this size.
const ARENA_BLOCK: usize = 8 * 1024;

/// Connection-specific header fields (RFC 9113 §8.2.2): never sent.
pub(crate) const HOP_BY_HOP: [&str; 5] =
    ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"];

/// A static run of fields.
type Run = [(&'static str, &'static str)];

const CSP: &str = "content-security-policy";
const CSP_REPORT_ONLY: &str = "content-security-policy-report-only";

/// The fixed API policy under the CSP field `name`, then the security fields.
const fn api_run(name: &'static str) -> [(&'static str, &'static str); 11] {
    let mut run = [(name, API_CSP); 11];
    let mut i = 0;
    while i < SECURITY_FIELDS.len() {
        run[i + 1] = SECURITY_FIELDS[i];
        i += 1;
    }
    run
}

/// The run that ends every API response (statics: a run is known by its address).
static API_RUN: [(&str, &str); 11] = api_run(CSP);
/// [`API_RUN`] when the policy is only reported.
static API_RUN_REPORT_ONLY: [(&str, &str); 11] = api_run(CSP_REPORT_ONLY);
/// The run that ends an HTML document's head, after its own CSP.
static SECURITY_RUN: [(&str, &str); 10] = SECURITY_FIELDS;

/// One field of this response: a name known at compile time and a value.
#[derive(Debug, Clone)]
struct Field {
    name: &'static str,
    value: Text,
    /// Fresh on every response: a never-indexed literal in HPACK.
    sensitive: bool,
}

/// A field value: text of the program (an HPACK encoder keeps what it encodes to) or
/// bytes of this response.
#[derive(Debug, Clone)]
enum Text {
    Static(&'static str),
    Shared(Bytes),
}

impl Field {
    #[inline]
    fn value(&self) -> &[u8] {
        match &self.value {
            Text::Static(s) => s.as_bytes(),
            Text::Shared(b) => b,
        }
    }

    #[inline]
    fn part(&self) -> Part<'_> {
        match self.value {
            Text::Static(s) if !self.sensitive => Part::Static(self.name, s),
            _ => Part::Field(self.name.as_bytes(), self.value(), self.sensitive),
        }
    }
}

/// A response head's regular fields (lowercase names, no connection-specific
/// ones), in `write_response`'s order: the leading fields of this response
/// (`date`, `content-type`, `content-length`, `cache-control`,
/// `x-request-id`, an HTML document's CSP), the static run every response
/// of its kind shares, the `link`s of its early hints, then the response's
/// own fields.
#[derive(Debug, Default)]
pub struct ResponseFields {
    lead: [Option<Field>; 6],
    fixed: &'static Run,
    links: &'static [String],
    own: Vec<(Value, Value)>,
}

impl ResponseFields {
    /// The fields `(name, value)` of `list`, in order, connection-specific
    /// ones and a `te` other than `trailers` left out; names lower-cased.
    pub fn from_pairs<N, V>(list: &[(N, V)]) -> Result<ResponseFields, H2Error>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut own = Vec::with_capacity(list.len());
        for (name, value) in list {
            let name = std::str::from_utf8(name.as_ref()).map_err(|_| H2Error::InvalidHead("header name"))?;
            let value = std::str::from_utf8(value.as_ref()).map_err(|_| H2Error::InvalidHead("header value"))?;
            if allowed(name, value)? {
                own.push((Value::Owned(name.to_ascii_lowercase()), Value::Owned(value.to_owned())));
            }
        }
        Ok(ResponseFields { own, ..ResponseFields::default() })
    }

    /// The fields in order: name, value, and whether the value is fresh on
    /// every response (never to be indexed).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8], bool)> {
        let lead = self.lead.iter().flatten().map(|f| (f.name.as_bytes(), f.value(), f.sensitive));
        let fixed = self.fixed.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes(), false));
        let links = self.links.iter().map(|l| (&b"link"[..], l.as_bytes(), false));
        let own = self.own.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes(), false));
        lead.chain(fixed).chain(links).chain(own)
    }

    /// The fields as HPACK [`Part`]s: the static run as one.
    #[inline]
    pub fn parts(&self) -> Parts<'_> {
        Parts {
            lead: self.lead.iter(),
            fixed: (!self.fixed.is_empty()).then_some(self.fixed),
            links: self.links.iter(),
            own: self.own.iter(),
        }
    }

    /// The value of the first field named `name`, if any.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(n, _, _)| *n == name.as_bytes()).map(|(_, v, _)| v)
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.lead.iter().flatten().count() + self.fixed.len() + self.links.len() + self.own.len()
    }

    /// No field at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`ResponseFields::parts`]: its four lists one after the other. Written out rather than
/// chained: it is walked once per response head, and a chain of iterators asks at every
/// step which list it is in through calls the compiler does not always inline.
pub struct Parts<'a> {
    lead: std::slice::Iter<'a, Option<Field>>,
    fixed: Option<&'static Run>,
    links: std::slice::Iter<'a, String>,
    own: std::slice::Iter<'a, (Value, Value)>,
}

impl<'a> Iterator for Parts<'a> {
    type Item = Part<'a>;

    // Its one caller is the HPACK encoder's loop, once per response head: inlined there
    // whatever units of code generation the build splits the crate into.
    #[inline(always)]
    fn next(&mut self) -> Option<Part<'a>> {
        if let Some(f) = self.lead.find_map(Option::as_ref) {
            return Some(f.part());
        }
        if let Some(run) = self.fixed.take() {
            return Some(Part::Fixed(run));
        }
        if let Some(l) = self.links.next() {
            return Some(Part::Field(b"link", l.as_bytes(), false));
        }
        self.own.next().map(|(n, v)| Part::Field(n.as_bytes(), v.as_bytes(), false))
    }
}

/// Checks a response's own field `name: value`: `false` for one HTTP/2
/// forbids (connection-specific, or `te` other than `trailers`), an error
/// for a name that is not a token or a value that is not visible ASCII.
fn allowed(name: &str, value: &str) -> Result<bool, H2Error> {
    if name.is_empty() || !name.bytes().all(is_token) {
        return Err(H2Error::InvalidHead("header name"));
    }
    if HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
        || (name.eq_ignore_ascii_case("te") && value != "trailers")
    {
        return Ok(false);
    }
    if !valid_value(value.as_bytes()) {
        return Err(H2Error::InvalidHead("header value"));
    }
    Ok(true)
}

/// `name` in lower case: itself when it has no upper-case letter, else a
/// copy (in place when short).
fn lowercase(name: &'static str) -> Value {
    if !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Value::Static(name);
    }
    let mut buf = [0u8; Inline::CAP];
    if let Some(dest) = buf.get_mut(..name.len()) {
        dest.copy_from_slice(name.as_bytes());
        dest.make_ascii_lowercase();
        let mut inline = Inline::default();
        if inline.push(std::str::from_utf8(dest).unwrap_or_default()) {
            return Value::Inline(inline);
        }
    }
    Value::Owned(name.to_ascii_lowercase())
}

/// Visible ASCII, space and tab: what a value may hold (as
/// `http::HeaderValue::from_str` requires).
fn valid_value(v: &[u8]) -> bool {
    // No early exit: the loop compiles to vector compares.
    v.iter().fold(true, |ok, &b| ok & ((b == b'\t') | (0x20..0x7f).contains(&b)))
}

/// A response head and body, with no wire format yet.
#[derive(Debug)]
pub struct Head {
    /// The `Link` fields of a `103 Early Hints` to send first, if any (boxed: rare, and a
    /// head is moved a few times on its way out).
    pub hints: Option<Box<ResponseFields>>,
    /// `:status`.
    pub status: StatusCode,
    /// The regular fields, connection-specific ones left out.
    pub fields: ResponseFields,
    /// The body to send now (empty: none, or it follows later).
    pub body: Bytes,
}

/// Builds [`Head`]s; one per connection, keeping its arena and the current
/// `date` value between responses.
#[derive(Debug, Default)]
pub struct Heads {
    arena: BytesMut,
    /// The `date` value and the second it was made for.
    date: Option<(u64, Bytes)>,
}

impl Heads {
    /// An empty builder (no allocation until the first head).
    pub fn new() -> Heads {
        Heads::default()
    }

    /// The head (and whole body, for `Delimit::Length`) of `resp`,
    /// answering a request described by `meta`: the same fields
    /// `write_response` writes for HTTP/1.1 with the same arguments, in the
    /// same order, minus the connection-specific ones. Takes the body and
    /// the own fields out of `resp`. A fresh CSP nonce is drawn from
    /// `common` for an HTML document (and put into the body's nonce slot,
    /// if any).
    pub fn build(&mut self, resp: &mut Response, meta: &RequestMeta<'_>, common: &mut Common) -> Result<Head, H2Error> {
        let status = StatusCode::from_u16(resp.status).map_err(|_| H2Error::InvalidHead("status"))?;
        let body_len = resp.body.as_bytes().len();
        let bodyless = resp.status == 204 || resp.status == 304 || resp.status < 200 || meta.delimit != Delimit::Length;
        let links: &'static [String] = resp.early_hints.map_or(&[], |h| h.links());
        if !links.iter().all(|l| valid_value(l.as_bytes())) {
            return Err(H2Error::InvalidHead("link"));
        }
        let hints = match resp.early_hints {
            Some(_) if sends_early_hints(resp.status, meta) => {
                Some(Box::new(ResponseFields { links, ..ResponseFields::default() }))
            }
            _ => None,
        };
        let length = match meta.delimit {
            Delimit::Sized(n) => Some(n),
            Delimit::Length if !bodyless => Some(body_len as u64),
            _ => None,
        };
        let report_only = common.csp_field_name() == CSP_REPORT_ONLY;
        // Filled in place: a head is a few hundred bytes, each move of it a copy.
        let mut head =
            Head { hints, status, fields: ResponseFields { links, ..ResponseFields::default() }, body: Bytes::new() };
        let lead = &mut head.fields.lead;
        lead[0] = Some(Field { name: "date", value: Text::Shared(self.date(common)), sensitive: false });
        if length.is_some() || meta.delimit == Delimit::Chunked {
            lead[1] = Some(Field { name: "content-type", value: static_value(resp.content_type)?, sensitive: false });
        }
        if let Some(n) = length {
            let mut digits = itoa_buf(n as usize);
            lead[2] = Some(Field {
                name: "content-length",
                value: Text::Shared(self.value(&[digits.as_slice()])?),
                sensitive: false,
            });
        }
        lead[3] = Some(Field { name: "cache-control", value: static_value(resp.cache_control)?, sensitive: false });
        lead[4] = Some(Field {
            name: "x-request-id",
            value: Text::Shared(self.value(&[meta.request_id])?),
            sensitive: false,
        });
        head.fields.fixed = if resp.is_document() {
            let name = if report_only { CSP_REPORT_ONLY } else { CSP };
            lead[5] = Some(Field { name, value: Text::Shared(self.value(&common.fresh_csp())?), sensitive: true });
            &SECURITY_RUN
        } else if report_only {
            &API_RUN_REPORT_ONLY
        } else {
            &API_RUN
        };
        if !resp.headers.is_empty() {
            let own = &mut head.fields.own;
            own.reserve(resp.headers.len());
            for (name, value) in std::mem::take(&mut resp.headers) {
                if allowed(name, &value)? {
                    own.push((lowercase(name), value));
                }
            }
        }
        if !(meta.head || bodyless) {
            head.body = match (std::mem::take(&mut resp.body), resp.nonce_slot) {
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
            };
        }
        Ok(head)
    }

    /// The `date` value of `common`'s current second (made once a second).
    fn date(&mut self, common: &Common) -> Bytes {
        let (secs, text) = common.date();
        match &self.date {
            Some((s, v)) if *s == secs => v.clone(),
            _ => {
                let v = Bytes::copy_from_slice(text);
                self.date = Some((secs, v.clone()));
                v
            }
        }
    }

    /// A value made of `parts`, in the arena, checked.
    fn value(&mut self, parts: &[&[u8]]) -> Result<Bytes, H2Error> {
        if !parts.iter().all(|p| valid_value(p)) {
            return Err(H2Error::InvalidHead("header value"));
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.arena.capacity() < len {
            // Reclaims the block in place when every value cut from it is gone.
            self.arena.reserve(len.max(ARENA_BLOCK));
        }
        for p in parts {
            self.arena.extend_from_slice(p);
        }
        Ok(self.arena.split().freeze())
    }
}

/// A value that lives for the whole program, checked and not copied.
fn static_value(s: &'static str) -> Result<Text, H2Error> {
    if valid_value(s.as_bytes()) {
        Ok(Text::Static(s))
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

    fn fields_of(list: &ResponseFields) -> Fields {
        list.iter().map(|(n, v, _)| (String::from_utf8_lossy(n).into_owned(), v.to_vec())).collect()
    }

    /// The value of `name` in `list` as text ("" when absent).
    fn get<'a>(list: &'a ResponseFields, name: &str) -> &'a str {
        list.get(name).map_or("", |v| std::str::from_utf8(v).expect("ascii"))
    }

    fn has(list: &ResponseFields, name: &str) -> bool {
        list.get(name).is_some()
    }

    fn count(list: &ResponseFields, name: &str) -> usize {
        list.iter().filter(|(n, _, _)| *n == name.as_bytes()).count()
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
        let h2_hints: Vec<Fields> = head.hints.iter().map(|h| fields_of(h)).collect();
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
        let names: Vec<String> = fields_of(&head.fields).into_iter().map(|(n, _)| n).collect();
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
        assert_eq!(get(&head.fields, "content-length"), "15");
        assert_eq!(get(&head.fields, "x-request-id"), "0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77");
        assert_eq!(&head.body[..], b"{\"status\":\"ok\"}");
        assert!(head.hints.is_none());
    }

    #[test]
    fn only_a_policy_with_a_nonce_is_marked_never_to_be_indexed() {
        let mut common = Common::new(false);
        let mut resp = Response::static_json(b"{}");
        let head = Heads::new().build(&mut resp, &meta(Delimit::Length, false), &mut common).expect("builds");
        for (name, _, sensitive) in head.fields.iter() {
            // An API response's policy is the fixed one: indexed like the other fixed fields;
            // the request id is left to the encoder's rule for its name.
            assert!(!sensitive, "{}", String::from_utf8_lossy(name));
        }
        assert_eq!(get(&head.fields, "content-security-policy"), API_CSP);
        let mut page = Response::new(200);
        page.content_type = "text/html; charset=utf-8";
        let head = Heads::new().build(&mut page, &meta(Delimit::Length, false), &mut common).expect("builds");
        for (name, _, sensitive) in head.fields.iter() {
            let fresh = name == b"content-security-policy";
            assert_eq!(sensitive, fresh, "{}: a document's policy carries its nonce", String::from_utf8_lossy(name));
        }
    }

    /// The fields of `parts`, each fixed run spelled out.
    fn spelled_out<'a>(parts: impl Iterator<Item = Part<'a>>) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        let mut all = Vec::new();
        for part in parts {
            match part {
                Part::Field(n, v, s) => all.push((n.to_vec(), v.to_vec(), s)),
                Part::Fixed(run) => {
                    all.extend(run.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec(), false)))
                }
                Part::Static(n, v) => all.push((n.as_bytes().to_vec(), v.as_bytes().to_vec(), false)),
            }
        }
        all
    }

    #[test]
    fn the_shared_fields_are_one_static_run_among_the_parts() {
        let mut common = Common::new(false);
        let api = Heads::new().build(&mut Response::static_json(b"{}"), &meta(Delimit::Length, false), &mut common);
        let mut page = Response::new(200);
        page.content_type = "text/html; charset=utf-8";
        page.header("X-Custom", "yes");
        page.early_hints = Some(hints());
        let page = Heads::new().build(&mut page, &meta(Delimit::Length, false), &mut common);
        for (head, run) in [(api.expect("builds"), &API_RUN[..]), (page.expect("builds"), &SECURITY_RUN[..])] {
            let fixed: Vec<_> = head.fields.parts().filter(|p| matches!(p, Part::Fixed(_))).collect();
            assert!(matches!(fixed[..], [Part::Fixed(r)] if std::ptr::eq(r, run)), "{fixed:?}");
            // The handler's static content-type and cache-control are kept by the encoder too.
            let statics: Vec<_> =
                head.fields.parts().filter_map(|p| if let Part::Static(n, _) = p { Some(n) } else { None }).collect();
            assert_eq!(statics, ["content-type", "cache-control"]);
            let listed: Vec<_> = head.fields.iter().map(|(n, v, s)| (n.to_vec(), v.to_vec(), s)).collect();
            assert_eq!(spelled_out(head.fields.parts()), listed);
            assert_eq!(head.fields.len(), listed.len());
        }
    }

    #[test]
    fn head_and_bodyless_statuses() {
        // HEAD: GET's fields (with its length), no body.
        let head = same_as_h1(|| Response::static_json(b"{\"a\":1}"), &meta(Delimit::Length, true), false);
        assert_eq!(get(&head.fields, "content-length"), "7");
        assert!(head.body.is_empty());
        for status in [204, 304] {
            let head = same_as_h1(|| Response::new(status), &meta(Delimit::Length, false), false);
            assert!(!has(&head.fields, "content-length") && !has(&head.fields, "content-type"));
        }
    }

    #[test]
    fn streamed_bodies_and_the_tunnel() {
        // Chunked over HTTP/1.1: a type, no length, no transfer-encoding.
        let head = same_as_h1(|| Response::new(200), &meta(Delimit::Chunked, false), false);
        assert!(has(&head.fields, "content-type") && !has(&head.fields, "transfer-encoding"));
        let head = same_as_h1(|| Response::new(206), &meta(Delimit::Sized(12345), false), false);
        assert_eq!(get(&head.fields, "content-length"), "12345");
        let head = same_as_h1(|| Response::new(200), &meta(Delimit::Upgrade, false), false);
        assert!(!has(&head.fields, "connection") && !has(&head.fields, "content-type"));
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
                assert_eq!(get(&head.fields, "content-length"), body.len().to_string());
                same_as_h1_with(&mut heads, || Response::new(204), &meta(Delimit::Length, false), report_only);
                same_as_h1_with(&mut heads, || Response::new(200), &meta(Delimit::Chunked, false), report_only);
                let len = 1000 + u64::from(round);
                let head =
                    same_as_h1_with(&mut heads, || Response::new(206), &meta(Delimit::Sized(len), false), report_only);
                assert_eq!(get(&head.fields, "content-length"), len.to_string());
                let mut cached = Response::static_json(b"{}");
                cached.cache_control = "public, max-age=60";
                let head = heads
                    .build(&mut cached, &meta(Delimit::Length, false), &mut Common::new(report_only))
                    .expect("builds");
                assert_eq!(get(&head.fields, "cache-control"), "public, max-age=60");
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
        assert_eq!(count(&hints, "link"), 2);
        assert_eq!(count(&head.fields, "link"), 2);
        // Not to HEAD: the final head still has the links.
        let head = same_as_h1(make, &meta(Delimit::Length, true), false);
        assert!(head.hints.is_none());
        assert_eq!(count(&head.fields, "link"), 2);
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
        assert_eq!(get(&head.fields, "cache-control"), "public, max-age=60");
        assert_eq!(get(&head.fields, "location"), "/elsewhere");
        assert_eq!(get(&head.fields, "etag"), "\"42\"");
        let vary: Vec<_> = head.fields.iter().filter(|(n, _, _)| *n == b"vary").map(|(_, v, _)| v).collect();
        assert_eq!(vary, [&b"Accept-Encoding"[..], b"Origin"]);
        assert!(has(&head.fields, "content-security-policy-report-only"));
        assert!(!has(&head.fields, "content-security-policy"));
        for name in HOP_BY_HOP {
            assert!(!has(&head.fields, name), "{name}");
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
            assert_eq!(get(&head.fields, "x-request-id"), id.as_str());
        }
    }
}
