//! The request target and `Host` rules every codec applies: an HTTP/1.1
//! request line's target and `Host` field, an HTTP/2 request's `:path` and
//! `:authority`. Pure functions over bytes; nothing here parses framing,
//! writes or logs.

/// Split a request target into path and query. An absolute-form target
/// (`http://host/p?q`, RFC 9112 §3.2.2) is reduced to its path and query.
pub fn split_target(target: &str) -> (&str, &str) {
    Split::of(target).apply(target)
}

/// Where [`split_target`] cuts a target: kept by a codec that splits once
/// and slices the same target later.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    path: (usize, usize),
    query: usize,
}

impl Split {
    /// Where `target`'s path and query are.
    pub fn of(target: &str) -> Split {
        let absolute = if target.starts_with('/') {
            None
        } else {
            target.strip_prefix("http://").or_else(|| target.strip_prefix("https://"))
        };
        let from = match absolute {
            Some(rest) => {
                let authority = target.len() - rest.len();
                rest.find('/').map_or(target.len(), |i| authority + i)
            }
            None => 0,
        };
        // A byte scan: targets are short, and '?' is ASCII so the split is on a char boundary.
        match target.as_bytes()[from..].iter().position(|&b| b == b'?') {
            Some(i) => Split { path: (from, from + i), query: from + i + 1 },
            None => Split { path: (from, target.len()), query: target.len() },
        }
    }

    /// The path and query of `target`, the target this split was made of
    /// (another gives empty parts rather than a panic).
    pub fn apply(self, target: &str) -> (&str, &str) {
        (target.get(self.path.0..self.path.1).unwrap_or(""), target.get(self.query..).unwrap_or(""))
    }
}

/// Whether a `Host` value is `host [ ":" port ]` (RFC 9112 §3.2, RFC 3986
/// §3.2.2). `host` is an IP literal `[IPv6]` or a non-empty reg-name
/// (`unreserved / pct-encoded / sub-delims`, which covers dotted IPv4 and
/// the underscores found in real names); `port`, when a colon is there, is
/// 1 to 5 digits up to 65535. RFC 3986 allows an empty host and an empty
/// port; neither names anything here, so both are refused (as nginx does
/// for the host). `IPvFuture` literals and zone ids are refused too.
pub fn valid_host(v: &[u8]) -> bool {
    if let Some(inner) = v.strip_prefix(b"[") {
        return match inner.iter().position(|&c| c == b']') {
            Some(end) => {
                let rest = &inner[end + 1..];
                ipv6_literal(&inner[..end]) && (rest.is_empty() || rest.strip_prefix(b":").is_some_and(valid_port))
            }
            None => false,
        };
    }
    // A reg-name up to the first colon, then the port: one pass, the plain
    // bytes skipped by a table scan.
    let mut i = 0;
    loop {
        let rest = &v[i..];
        i += rest.iter().position(|&c| !REG_NAME[usize::from(c)]).unwrap_or(rest.len());
        match v.get(i) {
            None => return i > 0,
            Some(b':') => return i > 0 && valid_port(&v[i + 1..]),
            Some(b'%') if v.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) => i += 3,
            Some(_) => return false,
        }
    }
}

fn ipv6_literal(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| s.parse::<std::net::Ipv6Addr>().is_ok())
}

/// The bytes a `reg-name` holds as they are (`unreserved / sub-delims`), one
/// table lookup per byte.
static REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
            );
        c += 1;
    }
    t
};

fn valid_port(v: &[u8]) -> bool {
    if !(1..=5).contains(&v.len()) {
        return false;
    }
    let mut n = 0u32;
    for &d in v {
        if !d.is_ascii_digit() {
            return false;
        }
        n = n * 10 + u32::from(d - b'0');
    }
    n <= 65_535
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_form_is_reduced_to_its_path() {
        assert_eq!(split_target("http://a/x?y=1"), ("/x", "y=1"));
        assert_eq!(split_target("https://a"), ("", ""));
        assert_eq!(split_target("/p"), ("/p", ""));
        assert_eq!(split_target("/p?"), ("/p", ""));
        assert_eq!(split_target("http://a?q"), ("", ""));
        assert_eq!(split_target("https://a/b/c?d?e"), ("/b/c", "d?e"));
        assert_eq!(split_target("?x"), ("", "x"));
    }

    #[test]
    fn host_is_a_name_or_ip_literal_with_an_optional_port() {
        for ok in ["a", "a.example:8080", "[::1]:443", "127.0.0.1", "127.0.0.1:65535", "my_host", "%41b", "%41:1"] {
            assert!(valid_host(ok.as_bytes()), "{ok}");
        }
        for bad in
            ["", ":80", "a:", "a:0x1", "a:65536", "[::1", "[v1.x]", "a b", "%4", "%4:80", "a%g1", "a:8%30", "a:1:2"]
        {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }
}
