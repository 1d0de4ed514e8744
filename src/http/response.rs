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

/// A response before serialisation.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`; JSON unless a handler says otherwise.
    pub content_type: &'static str,
    /// `Cache-Control`; `no-store` unless a route says otherwise (§4).
    pub cache_control: &'static str,
    /// Further headers (name, value); static values cost no allocation.
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
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
    pub fn header(&mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> &mut Response {
        self.headers.push((name, value.into()));
        self
    }
}

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
    fn digits() {
        assert_eq!(itoa_buf(0).as_slice(), b"0");
        assert_eq!(itoa_buf(15).as_slice(), b"15");
        assert_eq!(itoa_buf(usize::MAX).as_slice(), usize::MAX.to_string().as_bytes());
    }
}
