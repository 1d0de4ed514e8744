//! A response as handlers build it, and its serialisation to HTTP/1.1 bytes.
//!
//! Handlers fill a [`Response`]; [`write_response`] renders the status line,
//! the per-response headers, the pre-rendered security block from
//! [`super::headers::Common`] and the body, straight into the connection's
//! output buffer, once. It must not know about routes or sockets.

use std::borrow::Cow;
use std::io::Write;

use super::headers::Common;
use super::hints::EarlyHints;

/// A response body.
#[derive(Debug, Default)]
pub enum Body {
    /// No body (Content-Length: 0, or none at all for 204/304).
    #[default]
    Empty,
    /// Bytes that live for the whole program.
    Static(&'static [u8]),
    /// Owned bytes.
    Bytes(Vec<u8>),
}

impl Body {
    /// The body's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Body::Empty => b"",
            Body::Static(b) => b,
            Body::Bytes(b) => b,
        }
    }
}

/// A header value: text that lives as long as the program, a short value held
/// in place ([`Inline`]: an ETag, a number; no allocation), or owned text.
#[derive(Clone)]
pub enum Value {
    /// Text that lives forever.
    Static(&'static str),
    /// Up to [`Inline::CAP`] bytes, in place.
    Inline(Inline),
    /// Owned text.
    Owned(String),
}

impl Value {
    /// `v` formatted: in place when it fits [`Inline::CAP`] bytes, else allocated.
    pub fn display(v: impl std::fmt::Display) -> Value {
        use std::fmt::Write;
        let mut inline = Inline::default();
        if write!(inline, "{v}").is_ok() {
            Value::Inline(inline)
        } else {
            Value::Owned(v.to_string())
        }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match self {
            Value::Static(s) => s,
            Value::Inline(i) => i.as_str(),
            Value::Owned(s) => s,
        }
    }
}

impl std::ops::Deref for Value {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Value {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Value {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Value {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Value {
        Value::Static(s)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Owned(s)
    }
}

impl From<Cow<'static, str>> for Value {
    fn from(s: Cow<'static, str>) -> Value {
        match s {
            Cow::Borrowed(s) => Value::Static(s),
            Cow::Owned(s) => Value::Owned(s),
        }
    }
}

impl From<Inline> for Value {
    fn from(i: Inline) -> Value {
        Value::Inline(i)
    }
}

/// Up to [`Inline::CAP`] bytes of text held in place; written with `write!`
/// (which fails, leaving what fitted, when the text is longer).
#[derive(Clone, Copy, Default)]
pub struct Inline {
    len: u8,
    buf: [u8; Inline::CAP],
}

impl Inline {
    /// The longest text held in place: an ETag (18), a `u64` (20).
    pub const CAP: usize = 22;

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only whole `str`s are ever appended, so this is always UTF-8.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Write for Inline {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let at = usize::from(self.len);
        let end = at + s.len();
        let dest = self.buf.get_mut(at..end).ok_or(std::fmt::Error)?;
        dest.copy_from_slice(s.as_bytes());
        self.len = end as u8;
        Ok(())
    }
}

/// A response before serialisation.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`; JSON unless a handler says otherwise.
    pub content_type: &'static str,
    /// `Cache-Control`; `no-store` unless a route says otherwise (§4).
    pub cache_control: &'static str,
    /// Further headers (name, value); static and short values cost no
    /// allocation, and the first one reserves room for [`HEADERS_RESERVED`].
    pub headers: Vec<(&'static str, Value)>,
    /// The body.
    pub body: Body,
    /// Close the connection after this response.
    pub close: bool,
    /// A 24-byte marker in the body to replace with this response's CSP
    /// nonce as the body is written (pages with inline scripts). Only fixed
    /// pages set it, never a body holding user data.
    pub nonce_slot: Option<&'static [u8; 24]>,
    /// `Link` hints: sent first as `103 Early Hints` where the request allows
    /// an interim response ([`sends_early_hints`]), and as fields of this response.
    pub early_hints: Option<&'static EarlyHints>,
}

impl Response {
    /// An empty JSON response with `status`.
    pub fn new(status: u16) -> Response {
        Response {
            status,
            content_type: "application/json",
            cache_control: "no-store",
            headers: Vec::new(),
            body: Body::Empty,
            close: false,
            nonce_slot: None,
            early_hints: None,
        }
    }

    /// A 200 with a body that lives forever.
    pub fn static_json(body: &'static [u8]) -> Response {
        let mut r = Response::new(200);
        r.body = Body::Static(body);
        r
    }

    /// `{"code": status, "message": "OK"|"Created", "data": data}` (§3).
    pub fn envelope(status: u16, data: &impl serde::Serialize) -> Response {
        let message = if status == 201 { "Created" } else { "OK" };
        let mut r = Response::new(status);
        let env = serde_json::json!({"code": status, "message": message, "data": data});
        r.body = Body::Bytes(serde_json::to_vec(&env).unwrap_or_default());
        r
    }

    /// Add a header.
    pub fn header(&mut self, name: &'static str, value: impl Into<Value>) -> &mut Response {
        if self.headers.capacity() == 0 {
            self.headers.reserve_exact(HEADERS_RESERVED);
        }
        self.headers.push((name, value.into()));
        self
    }
}

/// Room the first [`Response::header`] makes: an API response's own header
/// plus the decoration (`RateLimit-*`, CORS) fit without growing the vector.
pub const HEADERS_RESERVED: usize = 8;

/// How the response body is delimited on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delimit {
    /// `Content-Length` and the whole body now.
    Length,
    /// `Transfer-Encoding: chunked`; the body follows later as chunks ([`BodyWriter::Chunked`]).
    Chunked,
    /// `101 Switching Protocols`: no body framing; another protocol follows.
    Upgrade,
    /// `Content-Length: n`; the body follows later, written by the caller (downloads).
    Sized(u64),
}

/// What the connection knows about the request a response answers.
pub struct RequestMeta<'a> {
    /// Body framing.
    pub delimit: Delimit,
    /// The request was `HEAD`: headers only.
    pub head: bool,
    /// HTTP/1.0 request (a kept-alive 1.0 connection must say so).
    pub http10: bool,
    /// The connection stays open after this response.
    pub keep_alive: bool,
    /// The `x-request-id` to send.
    pub request_id: &'a [u8],
}

/// The reason phrase for a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// Whether a final response with early hints is preceded by `103 Early Hints`.
///
/// Not to an HTTP/1.0 request: a 1.0 client may not understand a 1xx, and
/// RFC 9110 §15.2 forbids sending it one. Not to `HEAD` either: the hints
/// say what the body will need, and a `HEAD` response has no body (its
/// final head still carries the `Link` fields, as `GET`'s would). Not with a
/// `101` or another 1xx: the hints are for a final response's body.
pub fn sends_early_hints(status: u16, meta: &RequestMeta<'_>) -> bool {
    !meta.http10 && !meta.head && status >= 200 && meta.delimit != Delimit::Upgrade
}

/// Serialise `resp` into `out`; returns the number of body bytes written.
/// A response with early hints is preceded by its `103 Early Hints` message
/// when [`sends_early_hints`] allows.
pub fn write_response(out: &mut Vec<u8>, resp: &Response, meta: &RequestMeta<'_>, common: &mut Common) -> usize {
    let body = resp.body.as_bytes();
    let bodyless = resp.status == 204 || resp.status == 304 || resp.status < 200 || meta.delimit != Delimit::Length;
    let hinted = resp.early_hints.map_or(0, |h| h.informational().len() + h.fields().len());
    out.reserve(common.block_len() + 256 + hinted + if meta.head { 0 } else { body.len() });
    if let Some(hints) = resp.early_hints {
        if sends_early_hints(resp.status, meta) {
            out.extend_from_slice(hints.informational());
        }
    }
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    common.write_date(out);
    if let Delimit::Sized(n) = meta.delimit {
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(resp.content_type.as_bytes());
        out.extend_from_slice(b"\r\nContent-Length: ");
        out.extend_from_slice(itoa_buf(n as usize).as_slice());
        out.extend_from_slice(b"\r\n");
    }
    if meta.delimit == Delimit::Chunked {
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(resp.content_type.as_bytes());
        out.extend_from_slice(b"\r\nTransfer-Encoding: chunked\r\n");
    }
    if !bodyless {
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(resp.content_type.as_bytes());
        out.extend_from_slice(b"\r\nContent-Length: ");
        let mut n = itoa_buf(body.len());
        out.extend_from_slice(n.as_slice());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Cache-Control: ");
    out.extend_from_slice(resp.cache_control.as_bytes());
    out.extend_from_slice(b"\r\n");
    if meta.delimit == Delimit::Upgrade {
        out.extend_from_slice(b"Connection: Upgrade\r\n");
    } else if !meta.keep_alive || resp.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if meta.http10 || meta.delimit == Delimit::Chunked {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"x-request-id: ");
    out.extend_from_slice(meta.request_id);
    out.extend_from_slice(b"\r\n");
    common.write_security(out);
    if let Some(hints) = resp.early_hints {
        out.extend_from_slice(hints.fields());
    }
    for (name, value) in &resp.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if meta.head || bodyless {
        0
    } else {
        let start = out.len();
        out.extend_from_slice(body);
        if let Some(slot) = resp.nonce_slot {
            common.fill_nonce(&mut out[start..], slot);
        }
        body.len()
    }
}

/// How the body of the response in progress is framed on the wire: the
/// HTTP/1.1 codec keeps one per exchange ([`super::conn::Http1`]) and frames
/// every body byte the worker or a producer hands it. Nothing else writes
/// chunk framing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BodyWriter {
    /// No body follows the head (a whole response was written already, or the
    /// request was `HEAD`): body bytes are discarded, the end writes nothing.
    #[default]
    None,
    /// `Transfer-Encoding: chunked`: each piece is one chunk; the end is the last chunk.
    Chunked,
    /// `Content-Length`: this many body bytes remain; more than that is never sent.
    Sized(u64),
    /// After a `101`: another protocol's bytes, written as they are.
    Raw,
}

impl BodyWriter {
    /// The framing the head described by `delimit` announces (`head`: the request was
    /// `HEAD`, so no body follows whatever the response is).
    pub fn for_head(delimit: Delimit, head: bool) -> BodyWriter {
        match delimit {
            Delimit::Upgrade => BodyWriter::Raw,
            _ if head => BodyWriter::None,
            Delimit::Length => BodyWriter::None,
            Delimit::Chunked => BodyWriter::Chunked,
            Delimit::Sized(n) => BodyWriter::Sized(n),
        }
    }

    /// Whether body bytes follow the head at all.
    pub fn expects_body(&self) -> bool {
        *self != BodyWriter::None
    }

    /// Append `bytes` of the body to `out`, framed (an empty slice writes nothing).
    pub fn data(&mut self, out: &mut Vec<u8>, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self {
            BodyWriter::None => {}
            BodyWriter::Chunked => {
                let mut hex = [0u8; 16];
                let digits = hex_digits(bytes.len(), &mut hex);
                out.reserve(digits.len() + bytes.len() + 4);
                out.extend_from_slice(digits);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            BodyWriter::Sized(left) => {
                let n = (bytes.len() as u64).min(*left);
                out.extend_from_slice(&bytes[..n as usize]);
                *left -= n;
            }
            BodyWriter::Raw => out.extend_from_slice(bytes),
        }
    }

    /// [`BodyWriter::data`] for an owned buffer: when the framing adds nothing and
    /// `out` is empty, `bytes` becomes the output without a copy (a download's
    /// slices). Returns the buffer left over (the old output, or `bytes`), for reuse.
    pub fn data_owned(&mut self, out: &mut Vec<u8>, bytes: Vec<u8>) -> Vec<u8> {
        let whole = match *self {
            BodyWriter::Sized(left) => bytes.len() as u64 <= left,
            BodyWriter::Raw => true,
            BodyWriter::None | BodyWriter::Chunked => false,
        };
        if whole && out.is_empty() {
            if let BodyWriter::Sized(left) = self {
                *left -= bytes.len() as u64;
            }
            return std::mem::replace(out, bytes);
        }
        self.data(out, &bytes);
        bytes
    }

    /// How many of the next `want` body bytes may go to the socket exactly as they are,
    /// bypassing the output buffer (a file sent with `sendfile(2)`): up to what is left of
    /// a sized body; none for any other framing, whose bytes need framing or are discarded.
    pub fn passthrough(&self, want: u64) -> u64 {
        match *self {
            BodyWriter::Sized(left) => want.min(left),
            BodyWriter::None | BodyWriter::Chunked | BodyWriter::Raw => 0,
        }
    }

    /// `n` body bytes (at most what [`BodyWriter::passthrough`] allowed) went to the socket
    /// directly.
    pub fn passed(&mut self, n: u64) {
        if let BodyWriter::Sized(left) = self {
            *left -= n.min(*left);
        }
    }

    /// The body is complete: append its end (the last chunk, for chunked framing).
    /// Nothing more is framed after it.
    pub fn end(&mut self, out: &mut Vec<u8>) {
        if *self == BodyWriter::Chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        *self = BodyWriter::None;
    }
}

/// Lower-case hexadecimal digits of `n`, in `buf`.
fn hex_digits(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    &buf[start..]
}

/// Decimal digits of `n` without allocating.
pub struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    /// The digits.
    pub fn as_slice(&mut self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Format `n` in decimal into a stack buffer.
pub fn itoa_buf(mut n: usize) -> Digits {
    let mut d = Digits { buf: [0; 20], start: 20 };
    loop {
        d.start -= 1;
        d.buf[d.start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_header_values_are_held_in_place() {
        let etag = Value::display(format_args!("\"{:016x}\"", u64::MAX));
        assert!(matches!(etag, Value::Inline(_)), "{etag:?}");
        assert_eq!(etag, "\"ffffffffffffffff\"");
        let n = Value::display(u64::MAX);
        assert!(matches!(n, Value::Inline(_)));
        assert_eq!(n.as_str(), u64::MAX.to_string());
        let long = Value::display("x".repeat(Inline::CAP + 1));
        assert!(matches!(long, Value::Owned(_)), "too long to fit: allocated");
        assert_eq!(long.len(), Inline::CAP + 1);
        let fits = Value::display("é".repeat(Inline::CAP / 2));
        assert!(matches!(fits, Value::Inline(_)) && fits == "é".repeat(Inline::CAP / 2).as_str());
        let (fixed, owned) = (Value::from("static"), Value::from(String::from("owned")));
        assert!(matches!(fixed, Value::Static(_)) && fixed == "static");
        assert!(matches!(owned, Value::Owned(_)) && owned == "owned");
        let mut r = Response::new(200);
        for i in 0..HEADERS_RESERVED {
            r.header("X-N", Value::display(i));
        }
        assert_eq!(r.headers.capacity(), HEADERS_RESERVED, "reserved once, never grown");
    }

    #[test]
    fn digits() {
        assert_eq!(itoa_buf(0).as_slice(), b"0");
        assert_eq!(itoa_buf(15).as_slice(), b"15");
        assert_eq!(itoa_buf(usize::MAX).as_slice(), usize::MAX.to_string().as_bytes());
    }

    #[test]
    fn head_and_304_have_no_body() {
        let mut common = Common::new(false);
        let meta =
            RequestMeta { delimit: Delimit::Length, head: true, http10: false, keep_alive: true, request_id: b"abc" };
        let mut out = Vec::new();
        let n = write_response(&mut out, &Response::static_json(b"{\"a\":1}"), &meta, &mut common);
        assert_eq!(n, 0);
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("Content-Length: 7\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n"));
        let mut out = Vec::new();
        let meta = RequestMeta { delimit: Delimit::Length, head: false, ..meta };
        write_response(&mut out, &Response::new(304), &meta, &mut common);
        let text = String::from_utf8(out).expect("utf8");
        assert!(!text.contains("Content-Length"), "{text}");
    }

    #[test]
    fn close_and_http10_keep_alive() {
        let mut common = Common::new(false);
        let mut out = Vec::new();
        let meta =
            RequestMeta { delimit: Delimit::Length, head: false, http10: true, keep_alive: true, request_id: b"r" };
        write_response(&mut out, &Response::new(200), &meta, &mut common);
        assert!(String::from_utf8_lossy(&out).contains("Connection: keep-alive\r\n"));
        let mut out = Vec::new();
        let meta = RequestMeta { keep_alive: false, ..meta };
        write_response(&mut out, &Response::new(200), &meta, &mut common);
        assert!(String::from_utf8_lossy(&out).contains("Connection: close\r\n"));
    }

    #[test]
    fn early_hints_precede_a_final_response_to_http11_get_only() {
        let hints: &'static EarlyHints = Box::leak(Box::new(
            EarlyHints::preload(&[("/static/a.1.js", "script"), ("/static/a.2.css", "style")]).expect("valid"),
        ));
        let mut resp = Response::new(200);
        resp.body = Body::Static(b"<p>");
        resp.early_hints = Some(hints);
        let base =
            RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"r" };
        let link =
            "Link: </static/a.1.js>; rel=preload; as=script\r\nLink: </static/a.2.css>; rel=preload; as=style\r\n";
        let write = |resp: &Response, meta: &RequestMeta<'_>| {
            let mut out = Vec::new();
            write_response(&mut out, resp, meta, &mut Common::new(false));
            String::from_utf8(out).expect("utf8")
        };
        let cases = [
            ("HTTP/1.1 GET", RequestMeta { ..base }, true),
            ("HTTP/1.0 GET", RequestMeta { http10: true, ..base }, false),
            ("HEAD", RequestMeta { head: true, ..base }, false),
            ("upgrade", RequestMeta { delimit: Delimit::Upgrade, ..base }, false),
            ("chunked", RequestMeta { delimit: Delimit::Chunked, ..base }, true),
        ];
        for (what, meta, early) in cases {
            let text = write(&resp, &meta);
            assert_eq!(
                text.starts_with(&format!("HTTP/1.1 103 Early Hints\r\n{link}\r\nHTTP/1.1 200 OK\r\n")),
                early,
                "{what}: {text}"
            );
            assert_eq!(text.matches("103 Early Hints").count(), usize::from(early), "{what}: {text}");
            assert_eq!(text.matches("Link: ").count(), 2 + 2 * usize::from(early), "{what}: {text}");
            let head = &text[text.find("HTTP/1.1 200").expect("final")..];
            assert!(head.contains(link), "{what}: the final response carries the Link fields: {text}");
        }
        // Never before another interim response, and not without hints.
        let mut cont = Response::new(100);
        cont.early_hints = Some(hints);
        assert!(!write(&cont, &base).contains("103"));
        resp.early_hints = None;
        let text = write(&resp, &base);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n") && !text.contains("Link:"), "{text}");
    }

    #[test]
    fn chunked_data_and_end() {
        let mut w = BodyWriter::for_head(Delimit::Chunked, false);
        let mut out = Vec::new();
        w.data(&mut out, b"hello");
        w.data(&mut out, b"");
        w.data(&mut out, &[b'x'; 300]);
        w.end(&mut out);
        let mut want = b"5\r\nhello\r\n12c\r\n".to_vec();
        want.extend_from_slice(&[b'x'; 300]);
        want.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(out, want);
        // Ended: nothing more is framed.
        w.data(&mut out, b"late");
        w.end(&mut out);
        assert_eq!(out, want);
    }

    #[test]
    fn head_frames_no_body_of_any_kind() {
        for delimit in [Delimit::Length, Delimit::Chunked, Delimit::Sized(5)] {
            let mut w = BodyWriter::for_head(delimit, true);
            assert!(!w.expects_body(), "{delimit:?}");
            let mut out = Vec::new();
            w.data(&mut out, b"hello");
            let spare = w.data_owned(&mut out, b"world".to_vec());
            w.end(&mut out);
            assert!(out.is_empty(), "{delimit:?}: {out:?}");
            assert_eq!(spare, b"world");
        }
    }

    #[test]
    fn sized_never_sends_more_than_announced_and_moves_whole_buffers() {
        let mut w = BodyWriter::for_head(Delimit::Sized(8), false);
        let mut out = Vec::new();
        let old = w.data_owned(&mut out, b"abcde".to_vec());
        assert!(old.is_empty());
        assert_eq!(out, b"abcde");
        // Not empty: copied, and cut at the announced length.
        let spare = w.data_owned(&mut out, b"fghij".to_vec());
        assert_eq!(spare, b"fghij");
        assert_eq!(out, b"abcdefgh");
        w.end(&mut out);
        assert_eq!(out, b"abcdefgh");
        let mut raw = BodyWriter::for_head(Delimit::Upgrade, false);
        raw.data(&mut out, b"\x81\x00");
        assert!(out.ends_with(b"\x81\x00"));
    }

    #[test]
    fn only_a_sized_body_passes_through_and_never_past_its_length() {
        let mut w = BodyWriter::for_head(Delimit::Sized(10), false);
        assert_eq!(w.passthrough(4), 4);
        w.passed(4);
        assert_eq!(w.passthrough(100), 6, "what is left of the announced length");
        w.passed(6);
        assert_eq!(w.passthrough(1), 0);
        let mut out = Vec::new();
        w.data(&mut out, b"more");
        assert!(out.is_empty(), "nothing past the length, direct or buffered");
        for delimit in [Delimit::Chunked, Delimit::Length, Delimit::Upgrade] {
            assert_eq!(BodyWriter::for_head(delimit, false).passthrough(4), 0, "{delimit:?} frames or drops");
        }
        assert_eq!(BodyWriter::for_head(Delimit::Sized(10), true).passthrough(4), 0, "HEAD sends no body");
    }
}
