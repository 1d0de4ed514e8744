//! `GET /redirect` (CONTRACT §6): a redirect that cannot be turned into an
//! open redirect.
//!
//! Exactly one of two query parameters names the target:
//!
//! - `path=/x`: a same-origin absolute path. It starts with exactly one `/`
//!   whose next character is neither `/` nor `\`, holds only visible ASCII
//!   (no control characters, no whitespace, no `\` anywhere), and passes the
//!   same checks again after being percent-decoded once more, so encoded
//!   forms such as `/%2F/evil.com` or `/%5Cevil.com` are refused too.
//! - `url=https://host/…`: an `https` URL (never `http` or any other
//!   scheme: a redirect must not downgrade the user) parsed strictly as
//!   scheme `://` authority; no user info, an optional numeric port, and a
//!   host that (lower-cased, one trailing dot removed) equals one of
//!   `redirect.allowed_hosts` exactly.
//!
//! Anything else is 400 `illegal redirect target`. The `Location` header is
//! the validated value itself, made a valid URI reference: characters RFC
//! 3986 does not allow there (`"`, `<`, `>`, `^`, `` ` ``, `{`, `|`, `}`,
//! `[`, `]` in a path, a second `#`, …) are percent-encoded, while the
//! escapes already in it are kept as they are (never encoded twice).
//! Nothing else from the request is reflected.

use crate::app::{App, Ctx, Reply};
use crate::error::Error;
use crate::http::request::{query_pairs, Request};
use crate::http::response::Response;

use crate::app::validate::decode_query;

/// The one message for every refused target.
const ILLEGAL: &str = "illegal redirect target";

/// Longest accepted target, in bytes (after query decoding).
pub const MAX_TARGET: usize = 2048;

/// `GET /redirect?path=…` or `?url=…`: 302 to the validated target, else 400.
pub fn redirect(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let location = target(req.query, &app.svc.config.redirect.allowed_hosts)?;
    let mut r = Response::new(302);
    r.header("Location", location);
    Ok(Reply::full(r))
}

/// The `Location` for a raw query string, or 400: exactly one `path` or `url`
/// parameter, appearing once, whose decoded value passes [`safe_path`] or
/// [`allowed_url`] respectively.
pub fn target(query: &str, allowed_hosts: &[String]) -> Result<String, Error> {
    let mut path = None;
    let mut url = None;
    for (k, v) in query_pairs(query) {
        let slot = match k {
            "path" => &mut path,
            "url" => &mut url,
            _ => continue,
        };
        if slot.replace(v).is_some() {
            return Err(Error::bad_request(ILLEGAL)); // repeated: ambiguous
        }
    }
    let ok = match (path, url) {
        (Some(raw), None) => decode_query(raw).filter(|t| safe_path(t)),
        (None, Some(raw)) => decode_query(raw).filter(|t| allowed_url(t, allowed_hosts)),
        _ => None,
    };
    ok.map(|t| encode_location(&t)).ok_or(Error::bad_request(ILLEGAL))
}

/// `t` as a valid URI reference (RFC 3986 §3.3–3.5): every byte outside
/// `unreserved / sub-delims / ":" / "@" / "/" / "?"` is percent-encoded,
/// except a `%` that starts an escape (kept: never encoded twice) and the
/// first `#` (where the fragment starts; a later one is encoded). Applied to
/// validated targets only, whose scheme and authority hold nothing to encode.
fn encode_location(t: &str) -> String {
    let b = t.as_bytes();
    let hex = |i: usize| b.get(i).is_some_and(u8::is_ascii_hexdigit);
    let mut out = String::with_capacity(b.len());
    let mut in_fragment = false;
    for (i, &c) in b.iter().enumerate() {
        let keep = match c {
            b'%' => hex(i + 1) && hex(i + 2),
            b'#' => !std::mem::replace(&mut in_fragment, true),
            _ => c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?".contains(&c),
        };
        if keep {
            out.push(char::from(c));
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// Whether `t` (the decoded parameter value) is a safe same-origin path.
pub fn safe_path(t: &str) -> bool {
    if t.len() > MAX_TARGET || !t.bytes().all(|b| b.is_ascii_graphic()) || !path_shape(t.as_bytes()) {
        return false;
    }
    // Decode once more and check again: what some later hop might see.
    match percent_decode(t.as_bytes()) {
        Some(once) => path_shape(&once) && once.iter().all(|&b| b >= 0x80 || b.is_ascii_graphic()),
        None => false,
    }
}

/// One leading `/`, not followed by `/` or `\`, and no `\` anywhere.
fn path_shape(b: &[u8]) -> bool {
    b.first() == Some(&b'/') && !matches!(b.get(1), Some(b'/' | b'\\')) && !b.contains(&b'\\')
}

/// Percent-decode bytes once (`+` stays `+`); `None` on a malformed escape.
fn percent_decode(b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hi = (hex[0] as char).to_digit(16)?;
            let lo = (hex[1] as char).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Whether `t` is an `https` URL whose host is in `allowed_hosts`.
pub fn allowed_url(t: &str, allowed_hosts: &[String]) -> bool {
    if t.len() > MAX_TARGET || !t.bytes().all(|b| b.is_ascii_graphic()) || t.contains('\\') {
        return false;
    }
    let Some((scheme, rest)) = t.split_once("://") else { return false };
    if !scheme.eq_ignore_ascii_case("https") {
        return false;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return false;
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) => {
            let port_ok = (1..=5).contains(&port.len())
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u32>().is_ok_and(|p| p <= 65535);
            if !port_ok {
                return false;
            }
            host
        }
        None => authority,
    };
    let host = host.to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host);
    let chars_ok = host.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    chars_ok && !host.is_empty() && allowed_hosts.iter().any(|a| a == host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        vec!["allowed.example".to_string(), "docs.allowed.example".to_string()]
    }

    /// The Location for `query`, or `None` for a 400.
    fn loc(query: &str) -> Option<String> {
        match target(query, &hosts()) {
            Ok(l) => Some(l),
            Err(e) => {
                assert_eq!(e.status(), 400);
                assert_eq!(e.code(), "BAD_REQUEST");
                assert_eq!(e.to_string(), "BAD_REQUEST: illegal redirect target");
                None
            }
        }
    }

    #[test]
    fn same_origin_paths_pass_unchanged() {
        assert_eq!(loc("path=/x").as_deref(), Some("/x"));
        assert_eq!(loc("path=/").as_deref(), Some("/"));
        assert_eq!(loc("path=/a/b?c=d#e").as_deref(), Some("/a/b?c=d#e"));
        assert_eq!(loc("path=%2Fa%2Fb").as_deref(), Some("/a/b"));
        assert_eq!(loc("path=/caf%25C3%25A9").as_deref(), Some("/caf%C3%A9"));
        assert_eq!(loc("path=/a%3Fb%3Dc").as_deref(), Some("/a?b=c"));
        assert_eq!(loc("other=1&path=/x&more=2").as_deref(), Some("/x"));
        assert_eq!(loc("path=/x/./y/../z").as_deref(), Some("/x/./y/../z"));
    }

    #[test]
    fn protocol_relative_and_backslash_paths_refused() {
        for q in [
            "path=//evil.com",
            "path=///evil.com",
            "path=/\\evil.com",
            "path=/%5Cevil.com",
            "path=%5C%5Cevil.com",
            "path=\\\\evil.com",
            "path=/a\\b",
            "path=%2F%2Fevil.com",
            "path=%252F%252Fevil.com",
            "path=/%2F/evil.com",
            "path=/%252F/evil.com",
            "path=/%255Cevil.com",
            "path=/%2F%2Fevil.com",
            "path=%2F%5Cevil.com",
        ] {
            assert_eq!(loc(q), None, "{q}");
        }
    }

    #[test]
    fn controls_and_whitespace_refused() {
        for q in [
            "path=/%09/evil.com",
            "path=/\t/evil.com",
            "path=/%0A/evil.com",
            "path=/%0D%0ALocation:%20x",
            "path=/%250A",
            "path=/%2509/evil.com",
            "path=/a+b",
            "path=/a%20b",
            "path=/a%2520b",
            "path=%20/x",
            "path=/x%00",
            "path=/x%2500",
            "path=/x%7F",
            "path=/caf%C3%A9",
            "path=/%E2%80%A8",
        ] {
            assert_eq!(loc(q), None, "{q}");
        }
    }

    #[test]
    fn other_schemes_and_shapes_refused() {
        for q in [
            "path=javascript:alert(1)",
            "path=data:text/html,x",
            "path=https://allowed.example/",
            "path=evil.com",
            "path=",
            "path",
            "path=/%zz",
            "path=/%2",
            "path=/100%25",
            "path=/%25zz",
            "url=javascript:alert(1)",
            "url=data:text/html;base64,PHNjcmlwdD4=",
            "url=//evil.com",
            "url=/x",
            "url=ftp://allowed.example/",
            "url=",
        ] {
            assert_eq!(loc(q), None, "{q}");
        }
        assert_eq!(loc(&format!("path=/{}", "a".repeat(MAX_TARGET))), None);
    }

    #[test]
    fn both_neither_or_repeated_refused() {
        for q in ["", "x=1", "path=/x&url=https://allowed.example/", "url=https://allowed.example/&path=/x"] {
            assert_eq!(loc(q), None, "{q}");
        }
        assert_eq!(loc("path=/x&path=//evil.com"), None);
        assert_eq!(loc("url=https://allowed.example/&url=https://evil.com/"), None);
        assert_eq!(loc("path=/x&url="), None);
    }

    #[test]
    fn allowed_hosts_pass_unchanged() {
        for (q, want) in [
            ("url=https://allowed.example/", "https://allowed.example/"),
            ("url=https://allowed.example", "https://allowed.example"),
            ("url=https://allowed.example/a?b=c#d", "https://allowed.example/a?b=c#d"),
            ("url=https://allowed.example:8443/x", "https://allowed.example:8443/x"),
            ("url=https://ALLOWED.Example/x", "https://ALLOWED.Example/x"),
            ("url=HTTPS://allowed.example/x", "HTTPS://allowed.example/x"),
            ("url=https://allowed.example./x", "https://allowed.example./x"),
            ("url=https://docs.allowed.example?q", "https://docs.allowed.example?q"),
            ("url=https://allowed.example#frag", "https://allowed.example#frag"),
            ("url=https%3A%2F%2Fallowed.example%2Fa%3Fb%3D1%26c%3D2", "https://allowed.example/a?b=1&c=2"),
            ("url=https://allowed.example/a%2520b", "https://allowed.example/a%20b"),
        ] {
            assert_eq!(loc(q).as_deref(), Some(want), "{q}");
        }
    }

    #[test]
    fn other_hosts_and_tricks_refused() {
        for q in [
            "url=http://evil.com",
            "url=https://evil.com/",
            "url=https://allowed.example.evil.com/",
            "url=https://evilallowed.example/",
            "url=https://evil.com%23allowed.example",
            "url=https://evil.com#allowed.example",
            "url=https://evil.com?allowed.example",
            "url=https://evil.com/allowed.example",
            "url=https://allowed.example@evil.com",
            "url=https://allowed.example%40evil.com/",
            "url=https://user@allowed.example/",
            "url=https://user:pass@allowed.example/",
            "url=https://:@allowed.example/",
            "url=https://allowed.example\\@evil.com/",
            "url=https://allowed.example%5C@evil.com/",
            "url=https://allowed.example\\.evil.com/",
            "url=https:evil.com",
            "url=https:/evil.com",
            "url=https:///evil.com",
            "url=https:////evil.com",
            "url=https://",
            "url=https://:443/",
            "url=https://allowed.example:/",
            "url=https://allowed.example:99999/",
            "url=https://allowed.example:443a/",
            "url=https://allowed.example:+443/",
            "url=https://allowed.example:1:2/",
            "url=https://allowed.example../",
            "url=https://.allowed.example/",
            "url=https://%2561llowed.example/",
            "url=https://[::1]/",
            "url=https://127.0.0.1/",
            "url=https://allowed.example%09/",
            "url=https://allowed.example/%0A",
            "url=https://allowed.example/\t",
            "url=https://allowed.example/a+b",
            "url=https://allowed.exampl%C3%A9/",
            "url=%20https://allowed.example/",
            "url=httpss://allowed.example/",
            "url=http+s://allowed.example/",
            "url=javascript://allowed.example/%0Aalert(1)",
            "url=http://allowed.example/",
            "url=http://allowed.example",
            "url=HTTP://allowed.example/x",
            "url=ws://allowed.example/",
            "url=ftp://allowed.example/",
        ] {
            assert_eq!(loc(q), None, "{q}");
        }
    }

    #[test]
    fn location_is_a_valid_uri_reference() {
        for (q, want) in [
            ("path=/a%22b%3Cc%3Ed%5Ee%60f%7Bg%7Ch%7D", "/a%22b%3Cc%3Ed%5Ee%60f%7Bg%7Ch%7D"),
            ("path=/a\"b<c>d^e`f{g|h}", "/a%22b%3Cc%3Ed%5Ee%60f%7Bg%7Ch%7D"),
            ("path=/x[1]", "/x%5B1%5D"),
            ("path=/p?q=<x>#frag#more", "/p?q=%3Cx%3E#frag%23more"),
            ("path=/keep%25C3%25A9/%2541", "/keep%C3%A9/%41"),
            ("path=/a:b@c!$%26'()*%2B,;=~-._?x=/y?", "/a:b@c!$&'()*+,;=~-._?x=/y?"),
            ("url=https://allowed.example/a{b}?c=|#^", "https://allowed.example/a%7Bb%7D?c=%7C#%5E"),
            ("url=https://allowed.example/100%25", "https://allowed.example/100%25"),
            ("url=https://allowed.example/100%2525", "https://allowed.example/100%25"),
            ("url=https://allowed.example/%25zz", "https://allowed.example/%25zz"),
        ] {
            assert_eq!(loc(q).as_deref(), Some(want), "{q}");
        }
        assert_eq!(encode_location("/é \u{7f}\t%"), "/%C3%A9%20%7F%09%25", "non-ASCII, space, controls");
    }

    #[test]
    fn no_allowed_hosts_means_no_urls() {
        assert!(target("url=https://allowed.example/", &[]).is_err());
        assert_eq!(target("path=/ok", &[]).ok().as_deref(), Some("/ok"));
    }

    #[test]
    fn once_decoding() {
        assert_eq!(percent_decode(b"/%2f%5C+").as_deref(), Some(&b"//\\+"[..]));
        assert_eq!(percent_decode(b"%"), None);
        assert_eq!(percent_decode(b"%g0"), None);
    }
}
