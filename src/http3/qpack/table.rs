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

/// The longest name in the table (`access-control-allow-credentials`).
const LONGEST: usize = 32;

/// Static indices ordered by name length, then by name, entries of one name in index order:
/// the order [`find`] searches.
const BY_LEN: [u8; 99] = by_len();

/// Where each name length starts in [`BY_LEN`]: the entries whose name is `l` bytes long are
/// `BY_LEN[AT[l]..AT[l + 1]]`.
const AT: [u8; LONGEST + 2] = at();

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

/// Whether entry `a`'s name goes before entry `b`'s in [`BY_LEN`]: shorter first, then
/// byte-wise.
const fn before(a: usize, b: usize) -> bool {
    let (a, b) = (STATIC[a].0.as_bytes(), STATIC[b].0.as_bytes());
    a.len() < b.len() || (a.len() == b.len() && less(a, b))
}

/// [`BY_LEN`], sorted at compile time (a stable insertion sort).
const fn by_len() -> [u8; 99] {
    let mut order = [0u8; 99];
    let mut i = 0;
    while i < order.len() {
        order[i] = i as u8;
        i += 1;
    }
    let mut i = 1;
    while i < order.len() {
        let mut j = i;
        while j > 0 && before(order[j] as usize, order[j - 1] as usize) {
            let t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
            j -= 1;
        }
        i += 1;
    }
    order
}

/// [`AT`], counted at compile time.
const fn at() -> [u8; LONGEST + 2] {
    let mut at = [0u8; LONGEST + 2];
    let mut i = 0;
    while i < STATIC.len() {
        let len = STATIC[i].0.len();
        assert!(len <= LONGEST, "LONGEST is the longest name");
        // Every length above this name's starts one entry later.
        let mut l = len + 1;
        while l < at.len() {
            at[l] += 1;
            l += 1;
        }
        i += 1;
    }
    at
}

/// The `:status` entries as `(code, index)`, in index order (the table has 14 codes).
const STATUS: [(u16, u8); 14] = statuses();

/// [`STATUS`], gathered at compile time.
const fn statuses() -> [(u16, u8); 14] {
    let mut found = [(0u16, 0u8); 14];
    let (mut i, mut n) = (0, 0);
    while i < STATIC.len() {
        let (name, value) = (STATIC[i].0.as_bytes(), STATIC[i].1.as_bytes());
        if name.len() == 7 && !less(name, b":status") && !less(b":status", name) {
            let code = (value[0] - b'0') as u16 * 100 + (value[1] - b'0') as u16 * 10 + (value[2] - b'0') as u16;
            found[n] = (code, i as u8);
            n += 1;
        }
        i += 1;
    }
    assert!(n == found.len(), "STATUS holds every :status entry");
    found
}

/// [`find`] for `:status` with `code` (three digits): its entry, else the name's.
pub fn find_status(code: u16) -> Found {
    match STATUS.iter().find(|&&(c, _)| c == code) {
        Some(&(_, i)) => Found::Exact(usize::from(i)),
        None => Found::Name(usize::from(STATUS[0].1)),
    }
}

/// Looks `name: value` up: among the names of its length, its few entries.
pub fn find(name: &[u8], value: &[u8]) -> Option<Found> {
    let (Some(&from), Some(&to)) = (AT.get(name.len()), AT.get(name.len() + 1)) else { return None };
    let mut by_name = None;
    for &i in &BY_LEN[usize::from(from)..usize::from(to)] {
        let (n, v) = STATIC[usize::from(i)];
        if n.as_bytes().first() != name.first() || n.as_bytes() != name {
            if by_name.is_some() {
                // Entries of one name are together: the name's are all seen.
                break;
            }
            continue;
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
    fn a_status_is_found_as_the_search_finds_it() {
        for code in 100..=999u16 {
            assert_eq!(Some(find_status(code)), find(b":status", code.to_string().as_bytes()), "{code}");
        }
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
        assert_eq!(find(&[b'a'; LONGEST + 1], b""), None);
        assert_eq!(find(b"\xff", b""), None);
    }
}
