//! The request target and `Host` rules every codec applies: an HTTP/1.1
//! request line's target and `Host` field, an HTTP/2 request's `:path` and
//! `:authority`. Pure functions over bytes; nothing here parses framing,
//! writes or logs.

/// Split a request target into path and query. An absolute-form target
/// (`http://host/p?q`, RFC 9112 §3.2.2) is reduced to its path and query.
pub fn split_target(target: &str) -> (&str, &str) {
    let target = match target.strip_prefix("http://").or_else(|| target.strip_prefix("https://")) {
        Some(rest) => rest.find('/').map_or("", |i| &rest[i..]),
        None => target,
    };
    // A byte scan: targets are short, and '?' is ASCII so the split is on a char boundary.
    match target.bytes().position(|b| b == b'?') {
        Some(i) => (&target[..i], &target[i + 1..]),
        None => (target, ""),
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
    let (host_ok, rest) = match v.strip_prefix(b"[") {
        Some(inner) => match inner.iter().position(|&c| c == b']') {
            Some(end) => (ipv6_literal(&inner[..end]), &inner[end + 1..]),
            None => return false,
        },
        None => {
            let end = v.iter().position(|&c| c == b':').unwrap_or(v.len());
            (reg_name(&v[..end]), &v[end..])
        }
    };
    host_ok && (rest.is_empty() || rest.strip_prefix(b":").is_some_and(valid_port))
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

/// RFC 3986 `reg-name`, not empty.
fn reg_name(v: &[u8]) -> bool {
    let mut i = 0;
    while i < v.len() {
        match v[i] {
            b'%' => {
                let hex = |j: usize| v.get(j).is_some_and(u8::is_ascii_hexdigit);
                if !(hex(i + 1) && hex(i + 2)) {
                    return false;
                }
                i += 3;
            }
            c if REG_NAME[usize::from(c)] => i += 1,
            _ => return false,
        }
    }
    !v.is_empty()
}

fn valid_port(v: &[u8]) -> bool {
    (1..=5).contains(&v.len())
        && v.iter().all(u8::is_ascii_digit)
        && v.iter().fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0')) <= 65_535
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_form_is_reduced_to_its_path() {
        assert_eq!(split_target("http://a/x?y=1"), ("/x", "y=1"));
        assert_eq!(split_target("https://a"), ("", ""));
        assert_eq!(split_target("/p"), ("/p", ""));
    }

    #[test]
    fn host_is_a_name_or_ip_literal_with_an_optional_port() {
        for ok in ["a", "a.example:8080", "[::1]:443", "127.0.0.1", "my_host", "%41b"] {
            assert!(valid_host(ok.as_bytes()), "{ok}");
        }
        for bad in ["", ":80", "a:", "a:0x1", "a:65536", "[::1", "[v1.x]", "a b", "%4"] {
            assert!(!valid_host(bad.as_bytes()), "{bad}");
        }
    }
}
