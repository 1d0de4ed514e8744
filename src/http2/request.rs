//! The checks of a request head that the connection leaves to its user.
//!
//! The connection validates the framing of a request (pseudo-fields present and first,
//! connection-specific fields absent, names lowercase) and refuses a header
//! list over its own limit. What it lets through is checked here, once per
//! request, before the worker turns the head into an exchange: a header list
//! over `limits.max_header_bytes` (so that the 431 is the server's JSON
//! error, as over HTTP/1.1 and HTTP/3), field values that RFC 9113 §8.2.1
//! makes malformed, a `:scheme` that is not HTTP's, a `Host` that names
//! another origin than `:authority` (§8.3.1), and a `:protocol` (RFC 8441)
//! other than `websocket`.
//!
//! Pure functions of the head: no allocation, nothing kept.

use super::conn::RequestHead;

/// Why a request head is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The header list (RFC 9113 §6.5.2 size) is over the limit: 431.
    TooLarge,
    /// The head is malformed or asks for what the server does not do: 400
    /// with this message.
    Malformed(&'static str),
}

/// The RFC 9113 §6.5.2 size of one field: name, value and 32 octets.
fn field_size(name: &str, value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// The size of `head`'s header list as RFC 9113 §6.5.2 counts it (and h2
/// does): every field, the pseudo-fields included.
pub fn header_list_size(head: &RequestHead) -> usize {
    let pseudo = [
        Some((":method", head.method.as_str())),
        head.scheme().map(|s| (":scheme", s)),
        head.authority().map(|a| (":authority", a)),
        Some((":path", head.path())).filter(|(_, p)| !p.is_empty()),
        head.protocol().map(|p| (":protocol", p)),
    ];
    let pseudo: usize = pseudo.iter().flatten().map(|(n, v)| field_size(n, v.as_bytes())).sum();
    pseudo + head.headers.iter().map(|(n, v)| field_size(n.as_str(), v.as_bytes())).sum::<usize>()
}

/// Check `head` against `max_header_bytes` and the rules above; the first
/// fault found.
pub fn check(head: &RequestHead, max_header_bytes: usize) -> Result<(), Fault> {
    if header_list_size(head) > max_header_bytes {
        return Err(Fault::TooLarge);
    }
    // RFC 9113 §8.2.1: no leading or trailing whitespace in a field value.
    let padded = |v: &[u8]| matches!(v.first(), Some(b' ' | b'\t')) || matches!(v.last(), Some(b' ' | b'\t'));
    if head.headers.values().any(|v| padded(v.as_bytes())) {
        return Err(Fault::Malformed("a field value with leading or trailing whitespace"));
    }
    if head.scheme().is_some_and(|s| !s.eq_ignore_ascii_case("http") && !s.eq_ignore_ascii_case("https")) {
        return Err(Fault::Malformed(":scheme must be http or https"));
    }
    if let Some(authority) = head.authority() {
        if head
            .headers
            .get_all(http::header::HOST)
            .iter()
            .any(|h| !h.as_bytes().eq_ignore_ascii_case(authority.as_bytes()))
        {
            return Err(Fault::Malformed("Host differs from :authority"));
        }
    }
    match head.protocol() {
        None => Ok(()),
        Some(_) if head.method != http::Method::CONNECT => Err(Fault::Malformed(":protocol without CONNECT")),
        Some(p) if p.eq_ignore_ascii_case("websocket") => Ok(()),
        Some(_) => Err(Fault::Malformed("unsupported :protocol")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, Method, Uri};

    fn head(method: Method, uri: &str, fields: &[(&'static str, &str)], protocol: Option<&str>) -> RequestHead {
        let mut headers = HeaderMap::new();
        for (n, v) in fields {
            headers.append(*n, HeaderValue::from_str(v).expect("value"));
        }
        RequestHead {
            method,
            uri: uri.parse::<Uri>().expect("uri"),
            protocol: protocol.map(Into::into),
            headers,
            end_stream: true,
        }
    }

    fn get(fields: &[(&'static str, &str)]) -> RequestHead {
        head(Method::GET, "https://example.test/health", fields, None)
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
            assert_eq!(check(&head(Method::GET, uri, &[], None), 1 << 20), Ok(()), "{uri}");
        }
        for uri in ["ftp://a/", "ws://a/", "foo://a/"] {
            assert!(check(&head(Method::GET, uri, &[], None), 1 << 20).is_err(), "{uri}");
        }
    }

    #[test]
    fn host_must_name_the_authority() {
        assert_eq!(check(&get(&[("host", "example.test")]), 1 << 20), Ok(()));
        assert_eq!(check(&get(&[("host", "EXAMPLE.test")]), 1 << 20), Ok(()));
        assert!(check(&get(&[("host", "other.test")]), 1 << 20).is_err());
        assert!(check(&get(&[("host", "example.test"), ("host", "other.test")]), 1 << 20).is_err());
        // Without :authority, Host is the authority (the dispatcher checks it).
        assert_eq!(check(&head(Method::GET, "/x", &[("host", "a")], None), 1 << 20), Ok(()));
    }

    #[test]
    fn only_websocket_is_a_protocol() {
        let connect = |p| head(Method::CONNECT, "https://example.test/ws", &[], Some(p));
        assert_eq!(check(&connect("websocket"), 1 << 20), Ok(()));
        assert!(check(&connect("foo"), 1 << 20).is_err());
        assert!(check(&connect("connect-udp"), 1 << 20).is_err());
        assert!(check(&head(Method::GET, "https://example.test/", &[], Some("websocket")), 1 << 20).is_err());
    }
}
