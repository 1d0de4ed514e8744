//! Who the client is behind a proxy or load balancer ([`decide`]): the address and the scheme
//! the rate limits, the login limiter, `/metrics`' loopback check, the https redirect and the
//! access log go by, from the TCP peer, the `[proxy] trusted` networks and the request's
//! `Forwarded` (RFC 7239), `X-Forwarded-For` and `X-Forwarded-Proto` fields — nginx's
//! `real_ip_recursive on` with `set_real_ip_from`, Caddy's `trusted_proxies`.
//!
//! The rules:
//! - A peer outside `trusted` is the client, over the connection's own scheme: the fields are
//!   not read (anyone can write them).
//! - From a trusted peer, the list is `Forwarded`'s `for=` values when that field is present,
//!   else `X-Forwarded-For`'s addresses; several field lines are one list, in order. It is
//!   walked from the right (the hop nearest forkd): trusted addresses are skipped, the first
//!   one that is not trusted is the client. When every address is trusted, the leftmost is.
//! - An entry that is not an address (garbage, `for=unknown`, an obfuscated `for=_id`, an
//!   element without `for=`) ends the walk, and the client is the last address read to its
//!   right — the trusted hop that wrote it, or the peer. Nothing to its left is believed: a
//!   proxy that does not know its client cannot vouch for what the client claimed.
//! - The scheme (`http` or `https`, any case): with `Forwarded`, the `proto=` of the element
//!   the client came from; with `X-Forwarded-For`, the `X-Forwarded-Proto` entry at the
//!   client's position when that field lists one entry per hop, else (or when that entry says
//!   neither) its last entry — the nearest proxy's word. Nothing usable leaves the
//!   connection's own scheme.
//!
//! This file reads fields only; it knows no socket, codec or configuration file.

use std::net::IpAddr;

use super::fields::Fields;
use crate::config::Cidr;

/// The client as forkd believes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client's address (IPv4-mapped IPv6 as IPv4).
    pub addr: IpAddr,
    /// The client reached the first trusted proxy (or forkd) over https.
    pub secure: bool,
}

/// The client of a request that came from `peer` (over TLS when `secure`) with `fields`, when
/// the proxies in `trusted` are believed. See the module doc for the rules.
pub fn decide(peer: IpAddr, secure: bool, fields: &Fields<'_>, trusted: &[Cidr]) -> Client {
    let peer = peer.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    if trusted.is_empty() || !is_trusted(peer) {
        return Client { addr: peer, secure };
    }
    // Each hop's address and scheme, leftmost first, and the scheme for a hop that names none.
    let (hops, otherwise): (Vec<Hop>, Option<bool>) = if fields.get("forwarded").is_some() {
        (fields.get_all("forwarded").flat_map(elements).collect(), None)
    } else {
        let addrs: Vec<Option<IpAddr>> = list(fields.get_all("x-forwarded-for")).map(address).collect();
        let protos: Vec<Option<bool>> = list(fields.get_all("x-forwarded-proto")).map(scheme).collect();
        let aligned = protos.len() == addrs.len();
        let hops = addrs.iter().enumerate();
        let hops = hops.map(|(i, &addr)| Hop { addr, secure: if aligned { protos[i] } else { None } }).collect();
        (hops, protos.last().copied().flatten())
    };
    let mut client = Client { addr: peer, secure: otherwise.unwrap_or(secure) };
    for hop in hops.iter().rev() {
        let Some(addr) = hop.addr else { break };
        client = Client { addr, secure: hop.secure.or(otherwise).unwrap_or(secure) };
        if !is_trusted(addr) {
            break;
        }
    }
    client
}

/// The entries of a comma-separated field over all its lines, in order, trimmed; empty
/// entries (`a, ,b`) are not entries (RFC 9110 §5.6.1).
fn list<'a>(lines: impl Iterator<Item = &'a [u8]>) -> impl Iterator<Item = &'a [u8]> {
    lines.flat_map(|line| line.split(|b| *b == b',')).map(<[u8]>::trim_ascii).filter(|e| !e.is_empty())
}

/// An address as proxies write one: `192.0.2.1`, `192.0.2.1:443`, `2001:db8::1`, `[2001:db8::1]`
/// or `[2001:db8::1]:443`; the port (digits or an RFC 7239 obfuscated `_port`) is dropped.
fn address(s: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(s).ok()?;
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
        (IpAddr::V6(host.parse().ok()?), port)
    } else if let Ok(ip) = s.parse::<IpAddr>() {
        (ip, None)
    } else {
        let (host, port) = s.split_once(':')?;
        (IpAddr::V4(host.parse().ok()?), Some(port))
    };
    let port_ok = port.is_none_or(|p| {
        p.parse::<u16>().is_ok() && p.bytes().all(|b| b.is_ascii_digit())
            || p.strip_prefix('_').is_some_and(|o| !o.is_empty() && o.bytes().all(obfuscated))
    });
    port_ok.then(|| host.to_canonical())
}

/// A byte of an obfuscated node or port (RFC 7239 §6.3).
fn obfuscated(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// `https` → `Some(true)`, `http` → `Some(false)` (any case); anything else → `None`.
fn scheme(s: &[u8]) -> Option<bool> {
    if s.eq_ignore_ascii_case(b"https") {
        Some(true)
    } else if s.eq_ignore_ascii_case(b"http") {
        Some(false)
    } else {
        None
    }
}

/// What one `Forwarded` element or `X-Forwarded-For` entry says about the hop it describes.
struct Hop {
    /// Its `for=` as an address; `None` when absent, `unknown`, obfuscated or malformed.
    addr: Option<IpAddr>,
    /// Its `proto=` (`Some(true)` for https); `None` when absent or neither http nor https.
    secure: Option<bool>,
}

/// The elements of one `Forwarded` line (`for=a;proto=https, for="[::1]:80"`), in order.
fn elements(line: &[u8]) -> impl Iterator<Item = Hop> + '_ {
    split_unquoted(line, b',').into_iter().map(<[u8]>::trim_ascii).filter(|e| !e.is_empty()).map(element)
}

/// One element's `for=` and `proto=` (names in any case; other parameters are not read).
fn element(raw: &[u8]) -> Hop {
    let mut element = Hop { addr: None, secure: None };
    for pair in split_unquoted(raw, b';') {
        let Some(eq) = pair.iter().position(|b| *b == b'=') else { continue };
        let (name, value) = (pair[..eq].trim_ascii(), unquote(pair[eq + 1..].trim_ascii()));
        if name.eq_ignore_ascii_case(b"for") {
            element.addr = address(&value);
        } else if name.eq_ignore_ascii_case(b"proto") {
            element.secure = scheme(&value);
        }
    }
    element
}

/// `s` cut at every `sep` that is not inside a quoted string (where `\` escapes a byte).
fn split_unquoted(s: &[u8], sep: u8) -> Vec<&[u8]> {
    let (mut out, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, &b) in s.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            _ if b == sep && !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A token as is, or a quoted string's content with its escapes resolved.
fn unquote(v: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let Some(inner) = v.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")) else { return v.into() };
    let mut out = Vec::with_capacity(inner.len());
    let mut escaped = false;
    for &b in inner {
        if escaped || b != b'\\' {
            out.push(b);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: &str = "10.0.0.5";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|_| panic!("{s} is an address"))
    }

    fn trusted() -> Vec<Cidr> {
        ["10.0.0.0/8", "127.0.0.1/32", "::1/128", "2001:db8:1::/48"]
            .iter()
            .map(|s| s.parse().unwrap_or_else(|_| panic!("{s} is a network")))
            .collect()
    }

    /// The client of a plain-HTTP request from `peer` with `fields`, `[proxy] trusted` as above.
    fn from(peer: &str, fields: &[(&'static str, &'static str)]) -> Client {
        let lines: Vec<httparse::Header<'_>> =
            fields.iter().map(|(name, value)| httparse::Header { name, value: value.as_bytes() }).collect();
        decide(ip(peer), false, &Fields::new(&lines), &trusted())
    }

    fn addr(peer: &str, fields: &[(&'static str, &'static str)]) -> String {
        from(peer, fields).addr.to_string()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_writes() {
        let spoof =
            [("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=5.6.7.8;proto=https"), ("x-forwarded-proto", "https")];
        assert_eq!(from("203.0.113.7", &spoof), Client { addr: ip("203.0.113.7"), secure: false });
        let fields = Fields::new(&[]);
        let none = decide(ip("10.0.0.5"), true, &fields, &[]);
        assert_eq!(none, Client { addr: ip("10.0.0.5"), secure: true }, "nothing trusted: the peer, as it came");
        let lines = [httparse::Header { name: "X-Forwarded-For", value: b"1.2.3.4" }];
        assert_eq!(decide(ip("10.0.0.5"), false, &Fields::new(&lines), &[]).addr, ip("10.0.0.5"));
    }

    #[test]
    fn a_trusted_peer_names_the_rightmost_untrusted_hop() {
        assert_eq!(addr(PEER, &[]), PEER, "no field: the peer");
        assert_eq!(addr(PEER, &[("X-Forwarded-For", "198.51.100.1")]), "198.51.100.1");
        // The leftmost entry is whatever the client wrote; the proxies append to the right.
        assert_eq!(addr(PEER, &[("x-forwarded-for", "6.6.6.6, 198.51.100.1, 10.1.1.1")]), "198.51.100.1");
        assert_eq!(addr(PEER, &[("x-forwarded-for", "6.6.6.6,198.51.100.1,127.0.0.1")]), "198.51.100.1");
        assert_eq!(addr("::ffff:10.0.0.5", &[("x-forwarded-for", "198.51.100.1")]), "198.51.100.1", "a mapped peer");
    }

    #[test]
    fn every_hop_trusted_leaves_the_leftmost() {
        assert_eq!(addr(PEER, &[("x-forwarded-for", "10.9.9.9, 127.0.0.1, 10.1.1.1")]), "10.9.9.9");
        assert_eq!(addr(PEER, &[("forwarded", "for=10.9.9.9, for=127.0.0.1")]), "10.9.9.9");
    }

    #[test]
    fn several_lines_are_one_list_in_order() {
        let two = [("x-forwarded-for", "6.6.6.6, 198.51.100.1"), ("X-Forwarded-For", "10.1.1.1")];
        assert_eq!(addr(PEER, &two), "198.51.100.1");
        let two = [("x-forwarded-for", "198.51.100.1"), ("x-forwarded-for", "198.51.100.2, 10.1.1.1")];
        assert_eq!(addr(PEER, &two), "198.51.100.2");
        let two = [("forwarded", "for=198.51.100.1"), ("Forwarded", "for=198.51.100.2;proto=https, for=10.1.1.1")];
        assert_eq!(from(PEER, &two), Client { addr: ip("198.51.100.2"), secure: true });
        assert_eq!(addr(PEER, &[("x-forwarded-for", "198.51.100.1, , 10.1.1.1,")]), "198.51.100.1", "empty entries");
    }

    #[test]
    fn forwarded_wins_over_x_forwarded_for() {
        let both = [("x-forwarded-for", "198.51.100.9"), ("forwarded", "for=198.51.100.1")];
        assert_eq!(addr(PEER, &both), "198.51.100.1");
        assert_eq!(
            addr(PEER, &[("forwarded", r#"For="198.51.100.1:4711";PROTO=http;by=10.0.0.1;host="a.example""#)]),
            "198.51.100.1"
        );
        let quoted = [("forwarded", r#"for="evil, for=1.1.1.1;x", for=198.51.100.2"#)];
        assert_eq!(addr(PEER, &quoted), "198.51.100.2", "a comma inside quotes is not a new element");
    }

    #[test]
    fn ipv6_in_every_spelling() {
        assert_eq!(addr(PEER, &[("forwarded", r#"for="[2001:db8:cafe::17]:4711""#)]), "2001:db8:cafe::17");
        assert_eq!(addr(PEER, &[("forwarded", r#"for="[2001:db8:cafe::17]""#)]), "2001:db8:cafe::17");
        assert_eq!(addr(PEER, &[("x-forwarded-for", "2001:db8:cafe::17")]), "2001:db8:cafe::17");
        assert_eq!(addr(PEER, &[("x-forwarded-for", "[2001:db8:cafe::17]:443")]), "2001:db8:cafe::17");
        assert_eq!(addr(PEER, &[("x-forwarded-for", "::ffff:198.51.100.1")]), "198.51.100.1", "mapped: as IPv4");
        assert_eq!(addr("::1", &[("x-forwarded-for", "2001:db8:cafe::17, 2001:db8:1::2")]), "2001:db8:cafe::17");
        assert_eq!(addr(PEER, &[("x-forwarded-for", "198.51.100.1:8080")]), "198.51.100.1");
    }

    #[test]
    fn a_malformed_or_unknown_entry_stops_at_the_last_good_hop() {
        // Nothing to the left of what a trusted proxy could not name is believed.
        assert_eq!(addr(PEER, &[("x-forwarded-for", "198.51.100.1, bogus, 10.1.1.1")]), "10.1.1.1");
        assert_eq!(addr(PEER, &[("x-forwarded-for", "198.51.100.1, bogus")]), PEER);
        for bad in ["1.2.3", "[::1", "[::1]x", "::1]", "1.2.3.4:99999", "1.2.3.4:", "fe80::1%eth0", "a.example"] {
            let fields = [("x-forwarded-for", "198.51.100.1"), ("x-forwarded-for", bad)];
            assert_eq!(addr(PEER, &fields), PEER, "{bad:?}");
        }
        for element in ["for=unknown", "for=_hidden", "for=\"_gazonk\"", "proto=https", "for=\"[::1\"", "for="] {
            let line: &'static str = Box::leak(format!("for=198.51.100.1, {element}, for=10.1.1.1").into_boxed_str());
            assert_eq!(addr(PEER, &[("forwarded", line)]), "10.1.1.1", "{element:?}");
        }
        assert_eq!(addr(PEER, &[("forwarded", r#"for="[2001:db8::1]:_port""#)]), "2001:db8::1", "obfuscated port");
    }

    #[test]
    fn the_scheme_comes_from_the_clients_hop() {
        let https = |fields: &[(&'static str, &'static str)]| from(PEER, fields).secure;
        assert!(https(&[("x-forwarded-proto", "https")]), "no X-Forwarded-For: the proxy's word on the peer");
        assert!(https(&[("x-forwarded-for", "198.51.100.1"), ("x-forwarded-proto", "HTTPS")]));
        assert!(!https(&[("x-forwarded-for", "198.51.100.1"), ("x-forwarded-proto", "ftp")]), "not http(s): ignored");
        // One entry per hop: the client's; otherwise the last.
        let aligned = [("x-forwarded-for", "198.51.100.1, 10.1.1.1"), ("x-forwarded-proto", "https, http")];
        assert!(https(&aligned));
        let last = [("x-forwarded-for", "6.6.6.6, 198.51.100.1, 10.1.1.1"), ("x-forwarded-proto", "http, https")];
        assert!(https(&last));
        assert!(https(&[("forwarded", "for=198.51.100.1;proto=https, for=10.1.1.1;proto=http")]));
        assert!(!https(&[("forwarded", "for=198.51.100.1;proto=http, for=10.1.1.1;proto=https")]));
        assert!(!https(&[("forwarded", "for=198.51.100.1"), ("x-forwarded-proto", "https")]), "Forwarded alone");
        // Over TLS, no field says otherwise: still secure.
        let fields = Fields::new(&[]);
        assert!(decide(ip(PEER), true, &fields, &trusted()).secure);
        let lines = [httparse::Header { name: "x-forwarded-proto", value: b"https" }];
        assert!(!decide(ip("203.0.113.7"), false, &Fields::new(&lines), &trusted()).secure, "untrusted: ignored");
    }
}
