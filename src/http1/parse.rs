//! Parsing and validating a request head (RFC 9112; CONTRACT §10).
//!
//! `httparse` does the tokenising; this module adds the rules that keep a
//! server safe from smuggling and abuse: one framing per message, a bounded
//! head, `Host` on HTTP/1.1 and a `Host` value that is a valid
//! `host[:port]`, `Transfer-Encoding` exactly `chunked`. It only
//! reads bytes and returns values or [`Error`]s; it never writes or logs.

use std::mem::MaybeUninit;

use crate::error::Error;

use crate::http::request::Method;
use crate::http::target::{valid_host, Split};

/// At most this many header fields; more is answered 431.
pub const MAX_HEADERS: usize = 100;

/// Room for [`MAX_HEADERS`] fields, not initialised: `httparse` writes only
/// the fields a head has (an initialised array would cost 3 200 bytes of
/// stores per request).
pub fn header_slots<'b>() -> [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS] {
    [MaybeUninit::uninit(); MAX_HEADERS]
}

/// How the body of a request is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// What the connection needs to know about a parsed head.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    /// Bytes of the head including the blank line.
    pub len: usize,
    /// The method.
    pub method: Method,
    /// HTTP/1.0.
    pub http10: bool,
    /// Body framing.
    pub framing: Framing,
    /// The connection may stay open after the response.
    pub keep_alive: bool,
    /// The client sent `Expect: 100-continue`.
    pub expect_continue: bool,
    /// Where the target's path and query are (split once, here).
    pub split: Split,
    /// The `Host` value was the one the caller saw valid before (not checked again).
    pub host_seen: bool,
}

/// The longest `Host` value a connection remembers as seen valid ([`parse_seen`]).
pub const HOST_MEMO: usize = 64;

/// Parse a head from `buf` into `headers` ([`header_slots`]). `Ok(None)` means "need more bytes".
pub fn parse<'h, 'b>(
    buf: &'b [u8],
    headers: &'h mut [MaybeUninit<httparse::Header<'b>>],
    max_head: usize,
) -> Result<Option<(Head, httparse::Request<'h, 'b>)>, Error> {
    parse_seen(buf, headers, max_head, b"")
}

/// [`parse`] for a connection whose earlier request carried the `Host` value `seen`
/// (checked valid then; empty: none): the same bytes again are not checked again.
pub fn parse_seen<'h, 'b>(
    buf: &'b [u8],
    headers: &'h mut [MaybeUninit<httparse::Header<'b>>],
    max_head: usize,
    seen: &[u8],
) -> Result<Option<(Head, httparse::Request<'h, 'b>)>, Error> {
    let mut parsed = httparse::Request::new(&mut []);
    let status = match parsed.parse_with_uninit_headers(buf, headers) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(Error::HeaderTooLarge),
        Err(_) => return Err(Error::bad_request("malformed request")),
    };
    let len = match status {
        httparse::Status::Partial => {
            if buf.len() > max_head {
                return Err(Error::HeaderTooLarge);
            }
            return Ok(None);
        }
        httparse::Status::Complete(n) => n,
    };
    if len > max_head {
        return Err(Error::HeaderTooLarge);
    }
    let head = validate(&parsed, len, seen)?;
    Ok(Some((head, parsed)))
}

/// The `Host` value of a parsed head (trimmed), to remember for [`parse_seen`].
pub fn host_value<'b>(headers: &[httparse::Header<'b>]) -> Option<&'b [u8]> {
    headers.iter().find(|h| h.name.eq_ignore_ascii_case("host")).map(|h| trim(h.value))
}

fn validate(req: &httparse::Request<'_, '_>, len: usize, seen: &[u8]) -> Result<Head, Error> {
    let method = Method::parse(req.method.unwrap_or(""));
    let http10 = req.version == Some(0);
    let path = req.path.unwrap_or("");
    let split = Split::of(path);
    let origin_form = split.apply(path).0.starts_with('/');
    if !(origin_form || (path == "*" && method == Method::Options)) {
        return Err(Error::bad_request("malformed request target"));
    }
    let mut host = 0;
    let mut host_seen = false;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut te_seen = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            host += 1;
            let v = trim(h.value);
            host_seen = !seen.is_empty() && v == seen;
            if !host_seen && !valid_host(v) {
                return Err(Error::bad_request("invalid Host"));
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            for part in h.value.split(|&c| c == b',') {
                let v = parse_length(trim(part)).ok_or_else(|| Error::bad_request("invalid Content-Length"))?;
                match length {
                    Some(prev) if prev != v => return Err(Error::bad_request("conflicting Content-Length")),
                    _ => length = Some(v),
                }
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if te_seen || !trim(h.value).eq_ignore_ascii_case(b"chunked") {
                return Err(Error::bad_request("unsupported Transfer-Encoding"));
            }
            te_seen = true;
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&c| c == b',') {
                let t = trim(token);
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive_token = true;
                }
            }
        } else if name.eq_ignore_ascii_case("expect") {
            if trim(h.value).eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            } else {
                return Err(Error::ExpectationFailed);
            }
        }
    }
    if !http10 && host != 1 {
        return Err(Error::bad_request("missing or repeated Host"));
    }
    if chunked && length.is_some() {
        return Err(Error::bad_request("Content-Length with Transfer-Encoding"));
    }
    let framing = match (chunked, length) {
        (true, _) => Framing::Chunked,
        (false, Some(0)) | (false, None) => Framing::None,
        (false, Some(n)) => Framing::Length(n),
    };
    let keep_alive = if http10 { keep_alive_token && !close } else { !close };
    Ok(Head {
        len,
        method,
        http10,
        framing,
        keep_alive: keep_alive && !(http10 && chunked),
        expect_continue: expect_continue && framing != Framing::None,
        split,
        host_seen,
    })
}

fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |acc, d| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Option<Head>, Error> {
        let mut h = header_slots();
        parse(raw.as_bytes(), &mut h, 4096).map(|o| o.map(|(h, _)| h))
    }

    fn status(raw: &str) -> u16 {
        match head(raw) {
            Ok(_) => 0,
            Err(e) => e.status(),
        }
    }

    #[test]
    fn simple_get_keeps_alive() {
        let h = head("GET /x?a=1 HTTP/1.1\r\nHost: a\r\n\r\n").expect("ok").expect("complete");
        assert_eq!(h.method, Method::Get);
        assert!(h.keep_alive);
        assert_eq!(h.framing, Framing::None);
    }

    #[test]
    fn a_host_seen_before_is_taken_and_any_other_is_checked() {
        let seen = |raw: &str, seen: &[u8]| {
            let mut h = header_slots();
            parse_seen(raw.as_bytes(), &mut h, 4096, seen).map(|o| o.map(|(h, _)| h.host_seen))
        };
        assert_eq!(seen("GET / HTTP/1.1\r\nHost: a:80\r\n\r\n", b"a:80").ok(), Some(Some(true)));
        assert_eq!(seen("GET / HTTP/1.1\r\nHost: b:80\r\n\r\n", b"a:80").ok(), Some(Some(false)));
        assert_eq!(seen("GET / HTTP/1.1\r\nHost: b:\r\n\r\n", b"a:80").map_err(|e| e.status()).err(), Some(400));
        // Nothing seen: an empty Host is checked (and refused), not taken as the empty memo.
        assert_eq!(seen("GET / HTTP/1.1\r\nHost: \r\n\r\n", b"").map_err(|e| e.status()).err(), Some(400));
        // A repeated Host is refused whatever was seen.
        let twice = "GET / HTTP/1.1\r\nHost: a:80\r\nHost: a:80\r\n\r\n";
        assert_eq!(seen(twice, b"a:80").map_err(|e| e.status()).err(), Some(400));
        let mut h = header_slots();
        let (_, req) = parse(b"GET / HTTP/1.1\r\nHost:  a:80 \r\n\r\n", &mut h, 4096).expect("ok").expect("complete");
        assert_eq!(host_value(req.headers), Some(&b"a:80"[..]));
    }

    #[test]
    fn partial_then_too_large() {
        assert!(head("GET / HTTP/1.1\r\nHost: a\r\n").expect("ok").is_none());
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(5000));
        assert_eq!(status(&big), 431);
    }

    #[test]
    fn smuggling_shapes_are_400() {
        for raw in [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET\r\n\r\n",
            "GET / HTTP/9.9\r\nHost: a\r\n\r\n",
            "G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET x HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(status(raw), 400, "{raw:?}");
        }
    }

    fn host(value: &str) -> u16 {
        status(&format!("GET / HTTP/1.1\r\nHost: {value}\r\n\r\n"))
    }

    #[test]
    fn host_must_be_host_and_optional_port() {
        for ok in [
            "localhost",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
            "[2001:db8::a:b]:443",
            "[::ffff:192.0.2.1]",
            "example.com",
            "Example.COM:80",
            "a-b.c_d",
            "caf%C3%A9.example",
            "a~b!$&'()*+,;=",
            "x:0",
            "x:65535",
        ] {
            assert_eq!(host(ok), 0, "Host: {ok:?} is valid");
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "a@b",
            "[::1",
            "::1",
            "[::1]x",
            "[::1]:",
            "[zz::1]",
            "[v1.x]",
            "[fe80::1%25eth0]",
            "a:b:c",
            "a:",
            ":80",
            "a:99999",
            "a:65536",
            "a:123456",
            "a:8o",
            "a:+80",
            "a%",
            "a%2",
            "a%zz",
            "a\\b",
            "a?b",
            "a#b",
            "a\"b",
            "<a>",
            "a[b",
            "é.example",
        ] {
            assert_eq!(host(bad), 400, "Host: {bad:?} is invalid");
        }
        // HTTP/1.0 needs no Host, but one it sends is checked all the same.
        assert!(head("GET / HTTP/1.0\r\n\r\n").expect("ok").is_some());
        assert_eq!(status("GET / HTTP/1.0\r\nHost: a b\r\n\r\n"), 400);
    }

    #[test]
    fn absolute_form_is_reduced_to_its_path() {
        assert!(head("GET http://a/x?y=1 HTTP/1.1\r\nHost: a\r\n\r\n").expect("ok").is_some());
        assert_eq!(status("GET http://a HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    }

    #[test]
    fn identical_lengths_are_fine() {
        let h = head("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n")
            .expect("ok")
            .expect("complete");
        assert_eq!(h.framing, Framing::Length(3));
    }

    #[test]
    fn http10_closes_unless_asked() {
        let h = head("GET / HTTP/1.0\r\n\r\n").expect("ok").expect("c");
        assert!(!h.keep_alive);
        let h = head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").expect("ok").expect("c");
        assert!(h.keep_alive);
        let h = head("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").expect("ok").expect("c");
        assert!(!h.keep_alive);
    }

    #[test]
    fn expect_other_than_continue_is_417() {
        assert_eq!(status("POST / HTTP/1.1\r\nHost: a\r\nExpect: x\r\nContent-Length: 1\r\n\r\n"), 417);
    }
}
