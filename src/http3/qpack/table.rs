//! The QPACK static table (RFC 9204 Appendix A): 99 fields, indexed from 0, and its lookup.
//! The dynamic tables are `encoder.rs`'s and `decoder.rs`'s.

/// `(name, value)` by index.
pub const STATIC: [(&str, &str); 99] = [
    (":authority", ""),
    (":path", "/"),
    ("age", "0"),
    ("content-disposition", ""),
    ("content-length", "0"),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("referer", ""),
    ("set-cookie", ""),
    (":method", "CONNECT"),
    (":method", "DELETE"),
    (":method", "GET"),
    (":method", "HEAD"),
    (":method", "OPTIONS"),
    (":method", "POST"),
    (":method", "PUT"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "103"),
    (":status", "200"),
    (":status", "304"),
    (":status", "404"),
    (":status", "503"),
    ("accept", "*/*"),
    ("accept", "application/dns-message"),
    ("accept-encoding", "gzip, deflate, br"),
    ("accept-ranges", "bytes"),
    ("access-control-allow-headers", "cache-control"),
    ("access-control-allow-headers", "content-type"),
    ("access-control-allow-origin", "*"),
    ("cache-control", "max-age=0"),
    ("cache-control", "max-age=2592000"),
    ("cache-control", "max-age=604800"),
    ("cache-control", "no-cache"),
    ("cache-control", "no-store"),
    ("cache-control", "public, max-age=31536000"),
    ("content-encoding", "br"),
    ("content-encoding", "gzip"),
    ("content-type", "application/dns-message"),
    ("content-type", "application/javascript"),
    ("content-type", "application/json"),
    ("content-type", "application/x-www-form-urlencoded"),
    ("content-type", "image/gif"),
    ("content-type", "image/jpeg"),
    ("content-type", "image/png"),
    ("content-type", "text/css"),
    ("content-type", "text/html; charset=utf-8"),
    ("content-type", "text/plain"),
    ("content-type", "text/plain;charset=utf-8"),
    ("range", "bytes=0-"),
    ("strict-transport-security", "max-age=31536000"),
    ("strict-transport-security", "max-age=31536000; includesubdomains"),
    ("strict-transport-security", "max-age=31536000; includesubdomains; preload"),
    ("vary", "accept-encoding"),
    ("vary", "origin"),
    ("x-content-type-options", "nosniff"),
    ("x-xss-protection", "1; mode=block"),
    (":status", "100"),
    (":status", "204"),
    (":status", "206"),
    (":status", "302"),
    (":status", "400"),
    (":status", "403"),
    (":status", "421"),
    (":status", "425"),
    (":status", "500"),
    ("accept-language", ""),
    ("access-control-allow-credentials", "FALSE"),
    ("access-control-allow-credentials", "TRUE"),
    ("access-control-allow-headers", "*"),
    ("access-control-allow-methods", "get"),
    ("access-control-allow-methods", "get, post, options"),
    ("access-control-allow-methods", "options"),
    ("access-control-expose-headers", "content-length"),
    ("access-control-request-headers", "content-type"),
    ("access-control-request-method", "get"),
    ("access-control-request-method", "post"),
    ("alt-svc", "clear"),
    ("authorization", ""),
    ("content-security-policy", "script-src 'none'; object-src 'none'; base-uri 'none'"),
    ("early-data", "1"),
    ("expect-ct", ""),
    ("forwarded", ""),
    ("if-range", ""),
    ("origin", ""),
    ("purpose", "prefetch"),
    ("server", ""),
    ("timing-allow-origin", "*"),
    ("upgrade-insecure-requests", "1"),
    ("user-agent", ""),
    ("x-forwarded-for", ""),
    ("x-frame-options", "deny"),
    ("x-frame-options", "sameorigin"),
];

/// What the static table has for a field: the index of the exact field, else of a field with
/// that name (`name` lower-case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// `name: value` is entry `i`.
    Exact(usize),
    /// Entry `i` has the name (the first such entry).
    Name(usize),
}

/// Static indices ordered by name, entries of one name in index order: the order [`find`]
/// searches.
const BY_NAME: [u8; 99] = by_name();

/// Byte-wise `a < b`, as `<` on slices orders them (usable in a constant).
const fn less(a: &[u8], b: &[u8]) -> bool {
    let mut i = 0;
    while i < a.len() && i < b.len() {
        if a[i] != b[i] {
            return a[i] < b[i];
        }
        i += 1;
    }
    a.len() < b.len()
}

/// [`BY_NAME`], sorted at compile time (a stable insertion sort).
const fn by_name() -> [u8; 99] {
    let mut order = [0u8; 99];
    let mut i = 0;
    while i < order.len() {
        order[i] = i as u8;
        i += 1;
    }
    let mut i = 1;
    while i < order.len() {
        let mut j = i;
        while j > 0 && less(STATIC[order[j] as usize].0.as_bytes(), STATIC[order[j - 1] as usize].0.as_bytes()) {
            let t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
            j -= 1;
        }
        i += 1;
    }
    order
}

/// Looks `name: value` up: a binary search for the name, then its few entries.
pub fn find(name: &[u8], value: &[u8]) -> Option<Found> {
    let start = BY_NAME.partition_point(|&i| STATIC[usize::from(i)].0.as_bytes() < name);
    let mut by_name = None;
    for &i in &BY_NAME[start..] {
        let (n, v) = STATIC[usize::from(i)];
        if n.as_bytes() != name {
            break;
        }
        if v.as_bytes() == value {
            return Some(Found::Exact(usize::from(i)));
        }
        by_name.get_or_insert(usize::from(i));
    }
    by_name.map(Found::Name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert_eq!(STATIC[0], (":authority", ""));
        assert_eq!(STATIC[98], ("x-frame-options", "sameorigin"));
        assert_eq!(find(b":method", b"GET"), Some(Found::Exact(17)));
        assert_eq!(find(b":status", b"418"), Some(Found::Name(24)));
        assert_eq!(find(b"content-type", b"application/json"), Some(Found::Exact(46)));
        assert_eq!(find(b"x-request-id", b"1"), None);
    }

    /// What `find` must answer: the first exact entry, else the first entry of the name.
    fn scan(name: &[u8], value: &[u8]) -> Option<Found> {
        let exact = STATIC.iter().position(|(n, v)| n.as_bytes() == name && v.as_bytes() == value);
        let named = STATIC.iter().position(|(n, _)| n.as_bytes() == name);
        exact.map(Found::Exact).or(named.map(Found::Name))
    }

    #[test]
    fn the_search_finds_what_a_scan_of_the_whole_table_finds() {
        for (n, v) in STATIC {
            for value in [v, "", "other", "0"] {
                assert_eq!(find(n.as_bytes(), value.as_bytes()), scan(n.as_bytes(), value.as_bytes()), "{n}: {value}");
            }
            for name in [&n[..n.len() - 1], &format!("{n}x"), &format!("{n}-"), &n.to_uppercase()] {
                assert_eq!(find(name.as_bytes(), b""), scan(name.as_bytes(), b""), "{name}");
            }
        }
        assert_eq!(find(b"", b""), None);
        assert_eq!(find(b"\xff", b""), None);
    }
}
