//! Request heads from decoded field sections (RFC 9114 §4.1–§4.3): the pseudo-header rules
//! and the fields HTTP/3 forbids, checked once here; and response heads encoded for the wire,
//! with the rule of which response fields go into the peer's QPACK dynamic table
//! ([`indexing`]: the fixed ones, never a value that changes per response).
//!
//! A request that breaks a rule is malformed: its stream is reset with `H3_MESSAGE_ERROR`
//! (RFC 9114 §4.1.2); the connection lives on. This file knows nothing of quinn or streams.

use super::error::{Code, H3Error};
use super::frame;
use super::qpack::encoder::{Index, Section, TableEncoder};
use super::qpack::Fields;
use crate::http2::hpack::Part;
use crate::http2::ResponseFields;

/// Fields that are connection-specific in HTTP/1.1 and malformed in HTTP/3 (RFC 9114 §4.2).
const CONNECTION_SPECIFIC: [&[u8]; 5] =
    [b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"];

/// A checked request head: the decoded fields, and the pseudo-headers' values as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    fields: Fields,
    /// The values of `:method`, `:scheme`, `:authority` and `:path` (those sent), checked
    /// visible ASCII once, so each is read as text with no further check.
    text: String,
    /// Where each of the four is in `text` (`None`: not sent).
    spans: [Option<(u32, u32)>; 4],
    /// The first regular field (pseudo-headers come before it).
    regular: usize,
    /// `content-length`, when sent.
    pub content_length: Option<u64>,
    /// The head arrived in 0-RTT early data (before the handshake completed): only safe
    /// methods may be served from it (RFC 8470: anything else is answered 425).
    pub early: bool,
}

fn malformed(why: &'static str) -> H3Error {
    H3Error::stream(Code::MessageError, why)
}

/// Whether `name` is a valid lower-case field name (a token with no upper-case letter).
fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.iter().all(|&c| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(
                    c,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// Whether `value` may be a field value: no NUL, CR or LF, no leading or trailing white space.
fn valid_value(value: &[u8]) -> bool {
    !value.iter().any(|&c| c == 0 || c == b'\r' || c == b'\n')
        && !value.first().is_some_and(|c| *c == b' ' || *c == b'\t')
        && !value.last().is_some_and(|c| *c == b' ' || *c == b'\t')
}

impl RequestHead {
    /// Checks `fields` as a request head: pseudo-headers (`:method`, `:scheme`, `:authority`,
    /// `:path`) first, each at most once, no other; `:scheme` and a non-empty `:path` unless the
    /// method is CONNECT; lower-case names; no connection-specific field; `te` only
    /// `trailers`; `host` equal to `:authority` when both are sent; one valid `content-length`.
    pub fn from_fields(fields: Fields, early: bool) -> Result<RequestHead, H3Error> {
        let (mut method, mut scheme, mut authority, mut path) = (None, None, None, None);
        let mut regular = fields.len();
        let mut content_length = None;
        for (i, (name, value)) in fields.iter().enumerate() {
            if let Some(pseudo) = name.strip_prefix(b":") {
                if regular < fields.len() {
                    return Err(malformed("a pseudo-header after a regular field"));
                }
                let slot = match pseudo {
                    b"method" => &mut method,
                    b"scheme" => &mut scheme,
                    b"authority" => &mut authority,
                    b"path" => &mut path,
                    _ => return Err(malformed("an unknown or response pseudo-header")),
                };
                if slot.replace(i).is_some() {
                    return Err(malformed("a pseudo-header twice"));
                }
                if !value.iter().all(|c| c.is_ascii_graphic()) {
                    return Err(malformed("a pseudo-header value that is not visible ASCII"));
                }
                continue;
            }
            regular = regular.min(i);
            if !valid_name(name) {
                return Err(malformed("a field name that is not a lower-case token"));
            }
            if !valid_value(value) {
                return Err(malformed("a field value with NUL, CR, LF or surrounding space"));
            }
            if CONNECTION_SPECIFIC.contains(&name) || (name == b"te" && value != b"trailers") {
                return Err(malformed("a connection-specific field"));
            }
            if name == b"content-length" {
                let n = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or(malformed("a bad content-length"))?;
                if content_length.replace(n).is_some_and(|old| old != n) {
                    return Err(malformed("conflicting content-length"));
                }
            }
        }
        if method.is_none() {
            return Err(malformed("no :method"));
        }
        let slots = [method, scheme, authority, path];
        let mut text =
            Vec::with_capacity(slots.iter().flatten().filter_map(|&i| fields.get(i)).map(|(_, v)| v.len()).sum());
        let mut spans = [None; 4];
        for (span, i) in spans.iter_mut().zip(slots) {
            if let Some((_, value)) = i.and_then(|i| fields.get(i)) {
                let start = text.len() as u32;
                text.extend_from_slice(value);
                *span = Some((start, text.len() as u32));
            }
        }
        // Checked visible ASCII above: this cannot fail.
        let text = String::from_utf8(text).map_err(|_| malformed("a pseudo-header value that is not ASCII"))?;
        let head = RequestHead { fields, text, spans, regular, content_length, early };
        if head.method() == "CONNECT" {
            if scheme.is_some() || path.is_some() || authority.is_none() {
                return Err(malformed("CONNECT needs :authority and no :scheme or :path"));
            }
        } else if scheme.is_none() || head.path().is_empty() {
            return Err(malformed("no :scheme or an empty :path"));
        }
        if let (Some(authority), Some(host)) = (head.authority(), head.fields.value(b"host")) {
            if authority.as_bytes() != host {
                return Err(malformed(":authority and host differ"));
            }
        }
        Ok(head)
    }

    /// Pseudo-header `i` (0 `:method`, 1 `:scheme`, 2 `:authority`, 3 `:path`), when sent.
    fn pseudo(&self, i: usize) -> Option<&str> {
        let (start, end) = self.spans[i]?;
        self.text.get(start as usize..end as usize)
    }

    /// `:method`.
    pub fn method(&self) -> &str {
        self.pseudo(0).unwrap_or("")
    }

    /// `:scheme`, when sent.
    pub fn scheme(&self) -> Option<&str> {
        self.pseudo(1)
    }

    /// `:authority`, when sent.
    pub fn authority(&self) -> Option<&str> {
        self.pseudo(2)
    }

    /// `:path`: the path and query (`""` for CONNECT).
    pub fn path(&self) -> &str {
        self.pseudo(3).unwrap_or("")
    }

    /// The regular fields (no pseudo-headers), in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.fields.iter().skip(self.regular)
    }

    /// Whether the method may be served from 0-RTT early data (RFC 8470 §3 with the
    /// contract's set: GET, HEAD and OPTIONS).
    pub fn safe_for_early_data(&self) -> bool {
        matches!(self.method(), "GET" | "HEAD" | "OPTIONS")
    }
}

/// Response fields whose value changes from one response to the next (or is specific to one
/// client): inserting them would fill the dynamic table with entries never used again.
const PER_RESPONSE: [&[u8]; 13] = [
    b"date",
    b"x-request-id",
    b"content-length",
    b"content-range",
    b"etag",
    b"last-modified",
    b"set-cookie",
    b"location",
    b"age",
    b"expires",
    b"retry-after",
    b"content-disposition",
    b"x-csrf-token",
];

/// Whether a response field goes into the peer's dynamic table: every field but those of
/// [`PER_RESPONSE`] and a policy that carries a nonce (an HTML document's CSP, fresh per
/// response). `date` changes once a second: inserting it would take a new entry each second
/// in a table nothing is evicted from, so it stays a literal (with the static table's name).
pub fn indexing(name: &[u8], value: &[u8]) -> Index {
    // `str::contains` searches with SIMD; a value that is not UTF-8 is scanned as bytes.
    let nonce = || match std::str::from_utf8(value) {
        Ok(v) => v.contains("nonce-"),
        Err(_) => value.windows(6).any(|w| w == b"nonce-"),
    };
    if PER_RESPONSE.iter().any(|n| n.eq_ignore_ascii_case(name))
        || (name.len() >= 23 && name[..23].eq_ignore_ascii_case(b"content-security-policy") && nonce())
    {
        Index::Never
    } else {
        Index::Insert
    }
}

/// Appends a whole HEADERS frame for a response head on request stream `stream` (its QUIC
/// stream ID): `:status`, then `fields` (names lower-cased on the way; connection-specific
/// fields left out, RFC 9114 §4.2), encoded by `qpack` (the connection's dynamic table:
/// fixed fields inserted once, then referenced, see [`indexing`]; with the table off, the
/// static table only).
pub fn write_response_head<'a>(
    status: u16,
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    qpack: &mut TableEncoder,
    stream: u64,
    out: &mut Vec<u8>,
) {
    let mut section = qpack.section(stream, out);
    section.status(status);
    for (name, value) in fields {
        field(&mut section, name, value);
    }
    section.finish_with(|len, out| frame::write_header(frame::ty::HEADERS, len as u64, out));
}

/// [`write_response_head`] for a response's [`ResponseFields`]: the same frame, with the
/// run of fields every response of its kind shares written as one ([`Section::run`]: its
/// field lines are encoded once per table state and copied after that), and so is each
/// field of the program's text (a handler's `content-type`, [`Section::static_field`]).
pub fn write_response_fields(
    status: u16,
    fields: &ResponseFields,
    qpack: &mut TableEncoder,
    stream: u64,
    out: &mut Vec<u8>,
) {
    let mut section = qpack.section(stream, out);
    section.status(status);
    for part in fields.parts() {
        match part {
            Part::Field(name, value, _) => field(&mut section, name, value),
            Part::Static(name, value) => section.static_field(name, value, field),
            Part::Fixed(run) => section.run(run, field),
        }
    }
    section.finish_with(|len, out| frame::write_header(frame::ty::HEADERS, len as u64, out));
}

/// One response field line, unless the field is connection-specific.
fn field(section: &mut Section<'_>, name: &[u8], value: &[u8]) {
    if CONNECTION_SPECIFIC.iter().any(|c| c.eq_ignore_ascii_case(name)) {
        return;
    }
    section.field_with(name, value, || indexing(name, value));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> Fields {
        let mut f = Fields::default();
        for (n, v) in list {
            f.push(n.as_bytes(), v.as_bytes());
        }
        f
    }

    const GET: [(&str, &str); 4] =
        [(":method", "GET"), (":scheme", "https"), (":authority", "a.example"), (":path", "/x?y=1")];

    #[test]
    fn a_good_request() {
        let mut list = GET.to_vec();
        list.extend([("accept", "*/*"), ("host", "a.example"), ("te", "trailers"), ("content-length", "0")]);
        let head = RequestHead::from_fields(fields(&list), true).expect("valid");
        assert_eq!(
            (head.method(), head.scheme(), head.authority(), head.path()),
            ("GET", Some("https"), Some("a.example"), "/x?y=1")
        );
        assert_eq!(head.fields().count(), 4);
        assert_eq!((head.content_length, head.early, head.safe_for_early_data()), (Some(0), true, true));
        let connect = RequestHead::from_fields(fields(&[(":method", "CONNECT"), (":authority", "a:443")]), false);
        assert_eq!(connect.map(|h| h.path().to_string()), Ok(String::new()));
    }

    #[test]
    fn malformed_requests_are_message_errors() {
        let with = |extra: &[(&str, &str)]| {
            let mut list = GET.to_vec();
            list.extend_from_slice(extra);
            fields(&list)
        };
        let cases = [
            fields(&GET[1..]),                                                  // no :method
            fields(&[(":method", "GET"), (":authority", "a"), (":path", "/")]), // no :scheme
            fields(&[(":method", "GET"), (":scheme", "https"), (":path", "")]), // empty :path
            fields(&[(":method", "CONNECT"), (":authority", "a"), (":path", "/")]),
            with(&[(":path", "/again")]),
            with(&[("accept", "*/*"), (":status", "200")]),
            with(&[(":protocol", "websocket")]),
            with(&[("Accept", "*/*")]),
            with(&[("connection", "close")]),
            with(&[("transfer-encoding", "chunked")]),
            with(&[("upgrade", "h2c")]),
            with(&[("keep-alive", "5")]),
            with(&[("te", "gzip")]),
            with(&[("host", "b.example")]),
            with(&[("content-length", "1x")]),
            with(&[("content-length", "1"), ("content-length", "2")]),
            with(&[("x-a", "a\r\nb")]),
            with(&[("x-a", " padded")]),
            fields(&[(":method", "GET"), (":scheme", "https"), (":path", "/a b")]),
        ];
        for (i, f) in cases.into_iter().enumerate() {
            let err = RequestHead::from_fields(f, false).expect_err("malformed");
            assert_eq!((i, err.code(), err.is_connection()), (i, Code::MessageError, false), "{err}");
        }
    }

    /// The HEADERS frame's field section in `out`.
    fn section_of(out: &[u8]) -> &[u8] {
        let (drop, f) = frame::FrameReader::new(1 << 16).next(out).expect("frame");
        let Some(frame::Frame::Headers { len }) = f else { panic!("{f:?}") };
        &out[drop..drop + len]
    }

    #[test]
    fn response_fields_with_their_run_copied_are_the_heads_field_by_field() {
        use crate::http::headers::Common;
        use crate::http::response::{Delimit, RequestMeta, Response};
        use crate::http2::Heads;
        use crate::http3::qpack::decoder::TableDecoder;
        let meta =
            RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"id-1" };
        let (mut heads, mut common) = (Heads::new(), Common::new(false));
        let mut api = || heads.build(&mut Response::static_json(b"{}"), &meta, &mut common).expect("builds");
        let mut page = Response::new(200);
        page.content_type = "text/html; charset=utf-8";
        let heads = [api(), api(), Heads::new().build(&mut page, &meta, &mut Common::new(false)).expect("builds")];
        let (mut by_field, mut by_run) = (TableEncoder::default(), TableEncoder::default());
        let mut dec = TableDecoder::new(4096);
        assert!(by_field.enable(4096, 4096) && by_run.enable(4096, 4096));
        for (round, stream) in (0..12u64).map(|i| (i, 4 * i)) {
            let head = &heads[round as usize % heads.len()];
            let (mut want, mut got) = (Vec::new(), Vec::new());
            write_response_head(200, head.fields.iter().map(|(n, v, _)| (n, v)), &mut by_field, stream, &mut want);
            write_response_fields(200, &head.fields, &mut by_run, stream, &mut got);
            assert_eq!(got, want, "round {round}");
            let mut instructions = Vec::new();
            by_run.take_instructions(&mut instructions);
            by_field.take_instructions(&mut Vec::new());
            assert_eq!(dec.on_encoder_stream(&instructions), Ok(instructions.len()));
            let mut decoded = Fields::default();
            dec.decode(section_of(&got), 1 << 16, &mut decoded).expect("decodes");
            let names: Vec<_> = decoded.iter().skip(1).map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
            let sent: Vec<_> = head.fields.iter().map(|(n, v, _)| (n.to_vec(), v.to_vec())).collect();
            assert_eq!(names, sent, "round {round}");
            if round == 4 {
                // The decoder acknowledges all it has: the Base moves, the runs are rewritten.
                let mut ack = Vec::new();
                dec.increment(&mut ack);
                assert_eq!(by_field.on_decoder_stream(&ack), Ok(ack.len()));
                assert_eq!(by_run.on_decoder_stream(&ack), Ok(ack.len()));
            }
        }
        assert!(by_run.acknowledged() > 0);
    }

    #[test]
    fn response_heads_leave_connection_fields_out() {
        let mut out = Vec::new();
        let fields: [(&[u8], &[u8]); 3] = [(b"Content-Type", b"text/plain"), (b"Connection", b"close"), (b"x-a", b"1")];
        write_response_head(404, fields, &mut TableEncoder::default(), 0, &mut out);
        let mut reader = frame::FrameReader::new(1024);
        let (drop, f) = reader.next(&out).expect("frame");
        let Some(frame::Frame::Headers { len }) = f else { panic!("{f:?}") };
        let mut decoded = Fields::default();
        super::super::qpack::decode(&out[drop..drop + len], 1024, &mut decoded).expect("decodes");
        let got: Vec<(&[u8], &[u8])> = decoded.iter().collect();
        assert_eq!(got, [(&b":status"[..], &b"404"[..]), (b"content-type", b"text/plain"), (b"x-a", b"1")]);
    }
}
