//! A response as handlers build it, and what every codec needs to know to
//! put it on the wire: how its body is delimited ([`Delimit`]), what the
//! request it answers asks of it ([`RequestMeta`]), the reason phrase, and
//! when `103 Early Hints` precede it. Protocol-neutral: the HTTP/1.1 bytes
//! are written by `http1::writer`, the HTTP/2 head by `http2::head`. It must
//! not know about routes or sockets.

use std::borrow::Cow;

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

    /// `n` in decimal, in place.
    pub fn uint(n: u64) -> Value {
        let mut i = Inline::default();
        // A u64 has at most 20 digits: it always fits.
        i.push_uint(n);
        Value::Inline(i)
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

    /// Appends `s` when it fits; `false` (and nothing appended) when it does not.
    pub fn push(&mut self, s: &str) -> bool {
        std::fmt::Write::write_str(self, s).is_ok()
    }

    /// Appends `n` in decimal (no formatting machinery) when it fits.
    pub fn push_uint(&mut self, n: u64) -> bool {
        let digits = if n == 0 { 1 } else { n.ilog10() as usize + 1 };
        let at = usize::from(self.len);
        let Some(dest) = self.buf.get_mut(at..at + digits) else { return false };
        let mut m = n;
        for d in dest.iter_mut().rev() {
            *d = b'0' + (m % 10) as u8;
            m /= 10;
        }
        // ASCII digits: the text stays UTF-8.
        self.len = (at + digits) as u8;
        true
    }

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
    /// An HTML document: the one kind of response where a script may run (it gets the CSP
    /// with a nonce; every other response the fixed policy).
    pub fn is_document(&self) -> bool {
        self.content_type.starts_with("text/html")
    }

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
    /// `Transfer-Encoding: chunked`; the body follows later as chunks (`http1::writer::BodyWriter::Chunked`).
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

/// Whether a final response with early hints is preceded by `103 Early Hints`
/// (over HTTP/2 and HTTP/3: the HTTP/1.1 writer never sends one).
///
/// Not to an HTTP/1.0 request: a 1.0 client may not understand a 1xx, and
/// RFC 9110 §15.2 forbids sending it one. Not to `HEAD` either: the hints
/// say what the body will need, and a `HEAD` response has no body (its
/// final head still carries the `Link` fields, as `GET`'s would). Not with a
/// `101` or another 1xx: the hints are for a final response's body.
pub fn sends_early_hints(status: u16, meta: &RequestMeta<'_>) -> bool {
    !meta.http10 && !meta.head && status >= 200 && meta.delimit != Delimit::Upgrade
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
    fn numbers_in_place_without_fmt() {
        for n in [0, 7, 10, 1_000_000_000_000, u64::MAX] {
            let v = Value::uint(n);
            assert!(matches!(v, Value::Inline(_)));
            assert_eq!(v.as_str(), n.to_string());
        }
        let mut i = Inline::default();
        assert!(i.push_uint(60) && i.push(";w=") && i.push_uint(15));
        assert_eq!(i.as_str(), "60;w=15");
        assert!(!i.push(&"x".repeat(Inline::CAP)), "too long: refused");
        assert_eq!(i.as_str(), "60;w=15", "and nothing appended");
    }

    #[test]
    fn digits() {
        assert_eq!(itoa_buf(0).as_slice(), b"0");
        assert_eq!(itoa_buf(15).as_slice(), b"15");
        assert_eq!(itoa_buf(usize::MAX).as_slice(), usize::MAX.to_string().as_bytes());
    }
}
