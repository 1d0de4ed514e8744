//! A request head as the connection hands it to its user, and the checks of
//! it that the connection leaves to that user.
//!
//! [`RequestHead`] keeps the decoded fields in the one buffer the HPACK
//! decoder filled (copied out of the connection's, no map, no URI type),
//! with the pseudo-fields apart. It is made only from a head the machine
//! accepted (pseudo-fields present and first, connection-specific fields
//! absent, names lowercase tokens) and whose pseudo-fields parse as HTTP's
//! (a token method, a URI scheme, authority and path): [`RequestHead::new`]
//! refuses the rest, and the stream is reset.
//!
//! What it lets through is checked by [`check`], once per request, before
//! the worker turns the head into an exchange: a header list over
//! `limits.max_header_bytes` (so that the 431 is the server's JSON error, as
//! over HTTP/1.1 and HTTP/3), field values that RFC 9113 §8.2.1 makes
//! malformed, a `:scheme` that is not HTTP's, a `Host` that names another
//! origin than `:authority` (§8.3.1), and a `:protocol` (RFC 8441) other
//! than `websocket`.
//!
//! Pure functions of the head: [`check`] allocates nothing and keeps nothing.

use http::uri::{Authority, PathAndQuery, Scheme};

use super::machine::{every, is_token, HOST, PATH};
use super::machine::{Fields, Text};

/// A request's head, as received and checked against RFC 9113 §8.3.
#[derive(Debug, Clone)]
pub struct RequestHead {
    fields: Fields<Text>,
    /// `:path` up to its fragment, if it has one (as `http::Uri` takes it).
    path_len: usize,
    /// `:scheme`, kept only with an `:authority` (as `http::Uri` keeps it).
    has_scheme: bool,
    /// The request has no body (END_STREAM on its HEADERS).
    pub end_stream: bool,
}

impl RequestHead {
    /// The head of `fields` (a block the machine accepted), or `None` when
    /// a pseudo-field is not what HTTP's grammar allows: a method that is
    /// not a token, a scheme, authority or path `http::Uri` refuses, a
    /// `:protocol` or a field name that is not UTF-8.
    pub fn new(fields: &Fields, end_stream: bool) -> Option<RequestHead> {
        let method = fields.method()?;
        if method.is_empty() || !method.iter().all(|&b| is_token(b)) {
            return None;
        }
        // What `http::HeaderValue` refuses: control bytes but tab, and DEL.
        if fields.has_controls() {
            return None;
        }
        let authority = fields.authority();
        if let Some(a) = authority {
            let plain = every(a) & HOST != 0;
            if !plain || a.is_empty() || a.iter().filter(|&&b| b == b':').count() > 1 {
                Authority::try_from(a).ok()?;
            }
        }
        let has_scheme = authority.is_some() && fields.scheme().is_some();
        if let Some(scheme) = fields.scheme().filter(|_| has_scheme) {
            if scheme != b"https" && scheme != b"http" {
                Scheme::try_from(scheme).ok()?;
            }
        }
        let path_len = match fields.path() {
            Some(p) if every(p) & PATH != 0 => p.len(),
            Some(p) => PathAndQuery::try_from(p).ok()?.as_str().len(),
            None => 0,
        };
        if let Some(p) = fields.protocol() {
            std::str::from_utf8(p).ok()?;
        }
        Some(RequestHead { fields: fields.to_text(), path_len, has_scheme, end_stream })
    }

    /// `:method`.
    #[inline]
    pub fn method(&self) -> &str {
        self.fields.method_str().unwrap_or("")
    }

    /// `:scheme`. Absent on a plain CONNECT, and when the request has no
    /// `:authority` (as an `http::Uri`, which cannot hold a scheme without
    /// an authority).
    #[inline]
    pub fn scheme(&self) -> Option<&str> {
        self.fields.scheme_str().filter(|_| self.has_scheme)
    }

    /// `:authority`.
    #[inline]
    pub fn authority(&self) -> Option<&str> {
        self.fields.authority_str()
    }

    /// `:path` with the query (empty on a plain CONNECT; `/` for an
    /// `OPTIONS` or any request without one but with a scheme).
    #[inline]
    pub fn path(&self) -> &str {
        match self.fields.path_str() {
            Some(p) => p.get(..self.path_len).unwrap_or(""),
            None if self.has_scheme => "/",
            None => "",
        }
    }

    /// `:protocol`, e.g. `websocket`.
    #[inline]
    pub fn protocol(&self) -> Option<&str> {
        self.fields.protocol_str()
    }

    /// The regular fields in the order received, names lowercase.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields.iter_str()
    }

    /// The value of the first field named `name`.
    #[inline]
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(n, _)| *n == name.as_bytes()).map(|(_, v)| v)
    }

    /// The values of every field named `name`, in order.
    #[inline]
    pub fn field_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.fields.iter().filter(move |(n, _)| *n == name.as_bytes()).map(|(_, v)| v)
    }
}

/// Why a request head is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The header list (RFC 9113 §6.5.2 size) is over the limit: 431.
    TooLarge,
    /// The head is malformed or asks for what the server does not do: 400
    /// with this message.
    Malformed(&'static str),
}

/// The size of `head`'s header list as RFC 9113 §6.5.2 counts it: every
/// field, the pseudo-fields included.
pub fn header_list_size(head: &RequestHead) -> usize {
    head.fields.list_size()
}

/// Check `head` against `max_header_bytes` and the rules above; the first
/// fault found.
pub fn check(head: &RequestHead, max_header_bytes: usize) -> Result<(), Fault> {
    if header_list_size(head) > max_header_bytes {
        return Err(Fault::TooLarge);
    }
    // RFC 9113 §8.2.1: no leading or trailing whitespace in a field value.
    let padded = |v: &[u8]| matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t'));
    if head.fields.iter().any(|(_, v)| padded(v)) {
        return Err(Fault::Malformed("a field value with leading or trailing whitespace"));
    }
    if head.scheme().is_some_and(|s| !s.eq_ignore_ascii_case("http") && !s.eq_ignore_ascii_case("https")) {
        return Err(Fault::Malformed(":scheme must be http or https"));
    }
    if let Some(authority) = head.authority() {
        if head.field_all("host").any(|h| !h.eq_ignore_ascii_case(authority.as_bytes())) {
            return Err(Fault::Malformed("Host differs from :authority"));
        }
    }
    match head.protocol() {
        None => Ok(()),
        Some(_) if head.method() != "CONNECT" => Err(Fault::Malformed(":protocol without CONNECT")),
        Some(p) if p.eq_ignore_ascii_case("websocket") => Ok(()),
        Some(_) => Err(Fault::Malformed("unsupported :protocol")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of a request for `uri` (`scheme://authority/path`, or a
    /// path alone) with `fields`, as the machine would hand it over.
    fn head(method: &str, uri: &str, fields: &[(&'static str, &str)], protocol: Option<&str>) -> RequestHead {
        let mut f = Fields::default();
        f.push(b":method", method.as_bytes());
        match uri.split_once("://") {
            Some((scheme, rest)) => {
                let at = rest.find('/').unwrap_or(rest.len());
                f.push(b":scheme", scheme.as_bytes());
                let (authority, path) = rest.as_bytes().split_at(at);
                f.push(b":authority", authority);
                f.push(b":path", path);
            }
            None => f.push(b":path", uri.as_bytes()),
        }
        if let Some(p) = protocol {
            f.push(b":protocol", p.as_bytes());
        }
        for (n, v) in fields {
            f.push(n.as_bytes(), v.as_bytes());
        }
        RequestHead::new(&f, true).expect("a head")
    }

    fn get(fields: &[(&'static str, &str)]) -> RequestHead {
        head("GET", "https://example.test/health", fields, None)
    }

    #[test]
    fn the_size_is_rfc_9113s_with_the_pseudo_fields() {
        let h = get(&[("x-a", "12345")]);
        // :method GET, :scheme https, :authority example.test, :path /health, x-a.
        let want = (7 + 3) + (7 + 5) + (10 + 12) + (5 + 7) + (3 + 5) + 5 * 32;
        assert_eq!(header_list_size(&h), want);
        assert_eq!(check(&h, want), Ok(()));
        assert_eq!(check(&h, want - 1), Err(Fault::TooLarge));
    }

    #[test]
    fn a_field_value_with_outer_whitespace_is_malformed() {
        for v in [" x", "x ", "\tx", "x\t", " "] {
            assert!(matches!(check(&get(&[("x-a", v)]), 1 << 20), Err(Fault::Malformed(_))), "{v:?}");
        }
        assert_eq!(check(&get(&[("x-a", "a b\tc"), ("x-b", "")]), 1 << 20), Ok(()));
    }

    #[test]
    fn only_http_schemes_pass() {
        for uri in ["http://a/", "https://a/", "HTTPS://a/"] {
            assert_eq!(check(&head("GET", uri, &[], None), 1 << 20), Ok(()), "{uri}");
        }
        for uri in ["ftp://a/", "ws://a/", "foo://a/"] {
            assert!(check(&head("GET", uri, &[], None), 1 << 20).is_err(), "{uri}");
        }
    }

    #[test]
    fn host_must_name_the_authority() {
        assert_eq!(check(&get(&[("host", "example.test")]), 1 << 20), Ok(()));
        assert_eq!(check(&get(&[("host", "EXAMPLE.test")]), 1 << 20), Ok(()));
        assert!(check(&get(&[("host", "other.test")]), 1 << 20).is_err());
        assert!(check(&get(&[("host", "example.test"), ("host", "other.test")]), 1 << 20).is_err());
        // Without :authority, Host is the authority (the dispatcher checks it).
        assert_eq!(check(&head("GET", "/x", &[("host", "a")], None), 1 << 20), Ok(()));
    }

    #[test]
    fn only_websocket_is_a_protocol() {
        let connect = |p| head("CONNECT", "https://example.test/ws", &[], Some(p));
        assert_eq!(check(&connect("websocket"), 1 << 20), Ok(()));
        assert!(check(&connect("foo"), 1 << 20).is_err());
        assert!(check(&connect("connect-udp"), 1 << 20).is_err());
        assert!(check(&head("GET", "https://example.test/", &[], Some("websocket")), 1 << 20).is_err());
    }

    use super::super::machine::TEST_GET as GET;

    fn fields(list: &[(&str, &str)]) -> Fields {
        Fields::of(list)
    }

    #[test]
    fn a_head_keeps_the_fields_in_the_order_received() {
        let mut list = GET.to_vec();
        list.extend([("cookie", "a=1"), ("accept", "*/*"), ("cookie", "b=2")]);
        let h = RequestHead::new(&fields(&list), false).expect("a head");
        assert_eq!((h.method(), h.scheme(), h.authority(), h.path()), ("GET", Some("https"), Some("a.test"), "/"));
        let got: Vec<_> = h.fields().collect();
        assert_eq!(got, [("cookie", &b"a=1"[..]), ("accept", b"*/*"), ("cookie", b"b=2")]);
        assert_eq!(h.field("cookie"), Some(&b"a=1"[..]));
        assert_eq!(h.field_all("cookie").collect::<Vec<_>>(), [&b"a=1"[..], b"b=2"]);
        assert!(!h.end_stream);
    }

    /// What `http::Uri` and `http::HeaderValue` refuse is refused (the stream is reset), what
    /// they take is taken, as they take it.
    #[test]
    fn pseudo_fields_follow_http_s_grammar() {
        let with = |name: &str, value: &str| {
            let list: Vec<_> = GET.iter().map(|&(n, v)| (n, if n == name { value } else { v })).collect();
            RequestHead::new(&fields(&list), true)
        };
        for (name, bad) in [
            (":method", "G T"),
            (":method", "GET\u{0}"),
            (":authority", "a b"),
            (":authority", "a:1:2"),
            (":authority", ""),
            (":scheme", "ht tp"),
            (":path", "/a b"),
            (":path", "/\u{7f}"),
        ] {
            assert!(with(name, bad).is_none(), "{name}: {bad:?}");
        }
        for (name, good) in [
            (":method", "PURGE"),
            (":authority", "[::1]:8443"),
            (":authority", "user@a.test"),
            (":authority", "a.test:443"),
            (":scheme", "HTTPS"),
            (":path", "/a?b=c&d=%20e"),
            (":path", "/{x}"),
        ] {
            let h = with(name, good).unwrap_or_else(|| panic!("{name}: {good:?}"));
            let got = match name {
                ":method" => h.method(),
                ":authority" => h.authority().unwrap_or_default(),
                ":scheme" => h.scheme().unwrap_or_default(),
                _ => h.path(),
            };
            assert_eq!(got, good);
        }
        // A fragment is cut off the path, as `http::Uri` cuts it.
        assert_eq!(with(":path", "/page?q=1#top").expect("taken").path(), "/page?q=1");
        // A control byte other than tab in a value: refused; a tab inside: taken.
        let mut list = GET.to_vec();
        list.push(("x-a", "a\u{1}b"));
        assert!(RequestHead::new(&fields(&list), true).is_none());
        list.pop();
        list.push(("x-a", "a\tb"));
        assert!(RequestHead::new(&fields(&list), true).is_some());
        // Without :authority, :scheme is not kept.
        let list = [(":method", "GET"), (":scheme", "https"), (":path", "/x")];
        let h = RequestHead::new(&fields(&list), true).expect("a head");
        assert_eq!((h.scheme(), h.authority(), h.path()), (None, None, "/x"));
    }

    /// A value with obs-text (bytes that are not UTF-8, which `http::HeaderValue` takes) is
    /// taken as received; the pseudo-fields and names still read as text.
    #[test]
    fn a_value_that_is_not_utf8_is_kept_as_bytes() {
        let mut f = fields(&GET);
        f.push(b"x-latin1", b"caf\xe9");
        f.push(b"accept", b"*/*");
        let h = RequestHead::new(&f, true).expect("a head");
        assert_eq!((h.method(), h.authority(), h.path()), ("GET", Some("a.test"), "/"));
        let got: Vec<_> = h.fields().collect();
        assert_eq!(got, [("x-latin1", &b"caf\xe9"[..]), ("accept", b"*/*")]);
    }
}
