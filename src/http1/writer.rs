//! The HTTP/1.1 response writer: a [`Response`] rendered into the
//! connection's output buffer (status line, `Date`, framing fields,
//! `Connection`, the request id, the pre-rendered security block from
//! [`Common`], the body), and the framing of a body that follows its head
//! ([`BodyWriter`]: chunked, sized, raw after a `101`, nothing for `HEAD`).
//! Nothing else writes HTTP/1.1 framing. It must not know about routes or
//! sockets.

use crate::http::headers::Common;
use crate::http::response::{itoa_buf, reason, Delimit, RequestMeta, Response};

/// Serialise `resp` into `out`; returns the number of body bytes written.
///
/// A response with early hints carries their `Link` fields, and no
/// `103 Early Hints` goes before it: HTTP/1.1 clients that take the first
/// status line for the answer (Python's `http.client`, so `requests`) would
/// read the 103 as the whole response, and browsers act on a 103 only over
/// HTTP/2 and HTTP/3, which send it.
pub fn write_response(out: &mut Vec<u8>, resp: &Response, meta: &RequestMeta<'_>, common: &mut Common) -> usize {
    let body = resp.body.as_bytes();
    let bodyless = resp.status == 204 || resp.status == 304 || resp.status < 200 || meta.delimit != Delimit::Length;
    let hinted = resp.early_hints.map_or(0, |h| h.fields().len());
    out.reserve(common.block_len() + 256 + hinted + if meta.head { 0 } else { body.len() });
    // Status line to `x-request-id: `: the same bytes for every response of
    // one shape within one second, so copied whole from the last such head.
    let conn = if meta.delimit == Delimit::Upgrade {
        1
    } else if !meta.keep_alive || resp.close {
        2
    } else if meta.http10 || meta.delimit == Delimit::Chunked {
        3
    } else {
        0
    };
    let (kind, n) = match meta.delimit {
        Delimit::Length if bodyless => (0, 0),
        Delimit::Length => (1, body.len()),
        Delimit::Sized(n) => (2, n as usize),
        Delimit::Chunked => (3, 0),
        Delimit::Upgrade => (4, 0),
    };
    // Both strings are `'static`: where they are and how long says what they are.
    let key = [
        usize::from(resp.status) | kind << 16 | conn << 24,
        n,
        resp.content_type.as_ptr() as usize,
        resp.content_type.len(),
        resp.cache_control.as_ptr() as usize,
        resp.cache_control.len(),
        common.date().0 as usize,
        0,
    ];
    match common.template.get(&key) {
        Some(head) => out.extend_from_slice(head),
        None => {
            let start = out.len();
            write_opening(out, resp, meta, common, body.len(), bodyless, CONNECTION[conn]);
            common.template.put(key, &out[start..]);
        }
    }
    out.extend_from_slice(meta.request_id);
    out.extend_from_slice(b"\r\n");
    common.write_security(out, resp.is_document());
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

/// The `Connection` field a head carries, by the kind [`write_response`] picks.
const CONNECTION: [&[u8]; 4] =
    [b"", b"Connection: Upgrade\r\n", b"Connection: close\r\n", b"Connection: keep-alive\r\n"];

/// The opening of a head, status line to `x-request-id: ` (what
/// [`write_response`] keeps as its template).
fn write_opening(
    out: &mut Vec<u8>,
    resp: &Response,
    meta: &RequestMeta<'_>,
    common: &Common,
    body_len: usize,
    bodyless: bool,
    connection: &[u8],
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa_buf(usize::from(resp.status)).as_slice());
    out.push(b' ');
    out.extend_from_slice(reason(resp.status).as_bytes());
    out.extend_from_slice(b"\r\n");
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
        out.extend_from_slice(itoa_buf(body_len).as_slice());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Cache-Control: ");
    out.extend_from_slice(resp.cache_control.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(connection);
    out.extend_from_slice(b"x-request-id: ");
}

/// How the body of the response in progress is framed on the wire: the
/// HTTP/1.1 codec keeps one per exchange ([`super::codec::Http1`]) and frames
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::hints::EarlyHints;
    use crate::http::response::Body;

    /// The head up to the CSP field (after it, the nonce differs per response).
    fn opening(out: &[u8]) -> String {
        let text = String::from_utf8_lossy(out);
        text[..text.find("Content-Security-Policy").expect("a CSP field")].to_string()
    }

    #[test]
    fn a_head_from_the_template_is_the_head_written_afresh() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let mut common = Common::new(false);
        common.tick(at);
        let base =
            RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"r-1" };
        let mut text = Response::static_json(b"<p>");
        text.content_type = "text/html";
        let mut cached = Response::static_json(b"{}");
        cached.cache_control = "public, max-age=60";
        let mut closing = Response::static_json(b"{}");
        closing.close = true;
        let shapes: Vec<(Response, RequestMeta<'_>)> = vec![
            (Response::static_json(b"{\"status\":\"ok\"}"), RequestMeta { ..base }),
            (Response::static_json(b"{\"status\":\"ok\"}"), RequestMeta { request_id: b"another-id", ..base }),
            (Response::static_json(b"{\"status\":\"no\"}"), RequestMeta { ..base }),
            (Response::static_json(b"{\"a\":1}"), RequestMeta { ..base }),
            (Response::static_json(b"{\"a\":1}"), RequestMeta { head: true, ..base }),
            (Response::static_json(b"{\"a\":1}"), RequestMeta { http10: true, ..base }),
            (Response::static_json(b"{\"a\":1}"), RequestMeta { keep_alive: false, ..base }),
            (closing, RequestMeta { ..base }),
            (Response::new(404), RequestMeta { ..base }),
            (Response::new(204), RequestMeta { ..base }),
            (Response::new(304), RequestMeta { ..base }),
            (text, RequestMeta { ..base }),
            (cached, RequestMeta { ..base }),
            (Response::new(200), RequestMeta { delimit: Delimit::Chunked, ..base }),
            (Response::new(200), RequestMeta { delimit: Delimit::Sized(5), ..base }),
            (Response::new(200), RequestMeta { delimit: Delimit::Sized(6), ..base }),
            (Response::new(101), RequestMeta { delimit: Delimit::Upgrade, ..base }),
        ];
        // Each shape after every other (and after itself): as a fresh writer would write it.
        for (first, m1) in &shapes {
            for (second, m2) in &shapes {
                write_response(&mut Vec::new(), first, m1, &mut common);
                let mut got = Vec::new();
                write_response(&mut got, second, m2, &mut common);
                let mut fresh = Common::new(false);
                fresh.tick(at);
                let mut want = Vec::new();
                write_response(&mut want, second, m2, &mut fresh);
                assert_eq!(opening(&got), opening(&want));
                assert!(
                    opening(&got).ends_with(&format!("x-request-id: {}\r\n", String::from_utf8_lossy(m2.request_id)))
                );
            }
        }
        // The next second: a new `Date`, whatever was kept.
        let (resp, meta) = &shapes[0];
        let mut before = Vec::new();
        write_response(&mut before, resp, meta, &mut common);
        common.tick(at + std::time::Duration::from_secs(1));
        let mut after = Vec::new();
        write_response(&mut after, resp, meta, &mut common);
        assert!(opening(&before).contains("Date: Tue, 14 Nov 2023 22:13:20 GMT\r\n"), "{}", opening(&before));
        assert!(opening(&after).contains("Date: Tue, 14 Nov 2023 22:13:21 GMT\r\n"), "{}", opening(&after));
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
    fn early_hints_are_link_fields_of_the_final_response_and_never_a_103() {
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
            ("HTTP/1.1 GET", RequestMeta { ..base }),
            ("HTTP/1.0 GET", RequestMeta { http10: true, ..base }),
            ("HEAD", RequestMeta { head: true, ..base }),
            ("upgrade", RequestMeta { delimit: Delimit::Upgrade, ..base }),
            ("chunked", RequestMeta { delimit: Delimit::Chunked, ..base }),
        ];
        for (what, meta) in cases {
            let text = write(&resp, &meta);
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{what}: the final response first: {text}");
            assert!(!text.contains("103"), "{what}: no 103: {text}");
            assert_eq!(text.matches("Link: ").count(), 2, "{what}: {text}");
            assert!(text.contains(link), "{what}: the response carries the Link fields: {text}");
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
