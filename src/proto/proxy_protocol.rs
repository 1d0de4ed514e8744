//! The PROXY protocol header a TCP balancer (HAProxy `send-proxy` / `send-proxy-v2`, nginx
//! stream `proxy_protocol on`, cloud network balancers) writes before the client's first byte,
//! naming the client it accepted the connection from: version 1 (one text line) and version 2
//! (binary), as haproxy.org's `proxy-protocol.txt` defines them.
//!
//! [`parse`] reads the start of a connection's input and says whether it holds a whole header
//! ([`Parse::Done`]: the client's address and how many bytes the header took), needs more
//! bytes ([`Parse::Incomplete`]) or is not a header forkd accepts ([`Parse::Invalid`]). The
//! bytes after the header are the client's own (a TLS ClientHello, an HTTP request) and are
//! never looked at.
//!
//! What peer input can never do here: make it read past what it was given or past
//! [`MAX_HEADER`] bytes, panic, or name a client that is not a plain IPv4 or IPv6 address (a
//! `LOCAL` or `UNKNOWN` header, a v2 `AF_UNSPEC` one, name none: the TCP peer stays the
//! client). This file knows no socket, and it does not decide whom to believe: the worker
//! reads a header only from a trusted peer.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The longest version 1 header, `\r\n` included (the specification's bound).
pub const MAX_V1: usize = 107;

/// The longest header accepted, either version: a version 2 header is 16 bytes and the
/// addresses and TLVs its length field counts, 2 KiB in all here (a balancer's TLVs, a TLS
/// client's certificate name or a unique id, stay far below).
pub const MAX_HEADER: usize = 2048;

/// The 12 bytes a version 2 header starts with.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// What the start of a connection's input holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// A prefix of a header: read more (the worker's header deadline bounds the wait).
    Incomplete,
    /// A whole header.
    Done(Header),
    /// Not a header this parser accepts: the connection is closed without an answer.
    Invalid(ProxyError),
}

/// A whole header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The client the balancer accepted the connection from; `None` for a `LOCAL` (v2) or
    /// `UNKNOWN` (v1) header, or an `AF_UNSPEC` address (v2): the TCP peer is the client.
    pub source: Option<SocketAddr>,
    /// The header's bytes, to drop from the input: the client's bytes start after them.
    pub len: usize,
}

/// Why the input is not a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyError {
    /// It starts neither with `PROXY ` nor with the version 2 signature.
    NotProxy,
    /// Version 1: no `\r\n` within [`MAX_V1`] bytes, or a lone `\r` or `\n` before it.
    NoCrlf,
    /// Version 1: not `TCP4`, `TCP6` or `UNKNOWN`, or not four fields after it.
    BadLine,
    /// An address or port that does not parse, or does not fit its family.
    BadAddress,
    /// Version 2: a version nibble other than 2, or a command neither `LOCAL` nor `PROXY`.
    BadVersion,
    /// Version 2 `PROXY`: a family and transport other than TCP over IPv4 or IPv6, or unspecified.
    BadFamily,
    /// Version 2: a length too short for its addresses, or a header above [`MAX_HEADER`].
    BadLength,
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyError::NotProxy => "no PROXY protocol header",
            ProxyError::NoCrlf => "a version 1 line without its CRLF within 107 bytes",
            ProxyError::BadLine => "a version 1 line that is not TCP4, TCP6 or UNKNOWN with four fields",
            ProxyError::BadAddress => "an address or port that does not parse",
            ProxyError::BadVersion => "a version 2 header with a bad version or command",
            ProxyError::BadFamily => "a version 2 PROXY header that is not TCP over IPv4 or IPv6",
            ProxyError::BadLength => "a version 2 length that does not fit",
        })
    }
}

impl std::error::Error for ProxyError {}

/// Read the header at the start of `input` (all the connection's bytes so far).
pub fn parse(input: &[u8]) -> Parse {
    let v1 = b"PROXY ";
    let n = input.len().min(V2_SIGNATURE.len());
    if input[..n] == V2_SIGNATURE[..n] {
        return if n < V2_SIGNATURE.len() { Parse::Incomplete } else { v2(input) };
    }
    let n = input.len().min(v1.len());
    if input[..n] != v1[..n] {
        return Parse::Invalid(ProxyError::NotProxy);
    }
    v1_line(input)
}

/// Version 1: `PROXY TCP4|TCP6 src dst sport dport\r\n` or `PROXY UNKNOWN...\r\n`.
fn v1_line(input: &[u8]) -> Parse {
    let window = &input[..input.len().min(MAX_V1)];
    let Some(end) = window.iter().position(|b| *b == b'\r' || *b == b'\n') else {
        return if input.len() >= MAX_V1 { Parse::Invalid(ProxyError::NoCrlf) } else { Parse::Incomplete };
    };
    match window.get(end..end + 2) {
        Some(b"\r\n") => {}
        None if window[end] == b'\r' && input.len() < MAX_V1 => return Parse::Incomplete,
        _ => return Parse::Invalid(ProxyError::NoCrlf),
    }
    let len = end + 2;
    let line = &window[b"PROXY ".len()..end];
    if line.starts_with(b"UNKNOWN") {
        // The rest of an UNKNOWN line is to be ignored, whatever it says.
        return Parse::Done(Header { source: None, len });
    }
    let Ok(line) = std::str::from_utf8(line) else { return Parse::Invalid(ProxyError::BadLine) };
    let mut fields = line.split(' ');
    let (Some(family), Some(src), Some(dst), Some(sport), Some(dport), None) =
        (fields.next(), fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Parse::Invalid(ProxyError::BadLine);
    };
    // The destination must parse too, though only the source is used.
    let src = match family {
        "TCP4" => match (src.parse::<Ipv4Addr>(), dst.parse::<Ipv4Addr>()) {
            (Ok(s), Ok(_)) => IpAddr::V4(s),
            _ => return Parse::Invalid(ProxyError::BadAddress),
        },
        "TCP6" => match (src.parse::<Ipv6Addr>(), dst.parse::<Ipv6Addr>()) {
            (Ok(s), Ok(_)) => IpAddr::V6(s),
            _ => return Parse::Invalid(ProxyError::BadAddress),
        },
        _ => return Parse::Invalid(ProxyError::BadLine),
    };
    match (port(sport), port(dport)) {
        (Some(sport), Some(_)) => Parse::Done(Header { source: Some(SocketAddr::new(src, sport)), len }),
        _ => Parse::Invalid(ProxyError::BadAddress),
    }
}

/// A version 1 port: 1 to 5 decimal digits, at most 65535, no sign, no leading zero.
fn port(s: &str) -> Option<u16> {
    let digits = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits && (s == "0" || !s.starts_with('0'))).then(|| s.parse().ok()).flatten()
}

/// Version 2: the signature, version and command, family and transport, length, addresses,
/// then TLVs (skipped: the length covers them).
fn v2(input: &[u8]) -> Parse {
    let Some(fixed) = input.get(..16) else { return Parse::Incomplete };
    let (ver_cmd, family) = (fixed[12], fixed[13]);
    let local = match ver_cmd {
        0x20 => true,
        0x21 => false,
        _ => return Parse::Invalid(ProxyError::BadVersion),
    };
    let len = 16 + usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    // The family decides how many address bytes the length must hold; LOCAL ignores it.
    let need = match (local, family) {
        (true, _) | (false, 0x00) => 0,
        (false, 0x11) => 12,
        (false, 0x21) => 36,
        (false, _) => return Parse::Invalid(ProxyError::BadFamily),
    };
    if len > MAX_HEADER || len - 16 < need {
        return Parse::Invalid(ProxyError::BadLength);
    }
    let Some(header) = input.get(..len) else { return Parse::Incomplete };
    let a = &header[16..];
    let source = match need {
        12 => {
            let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be_bytes([a[8], a[9]])))
        }
        36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&a[..16]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), u16::from_be_bytes([a[32], a[33]])))
        }
        _ => None,
    };
    Parse::Done(Header { source, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(input: &[u8]) -> Header {
        match parse(input) {
            Parse::Done(h) => h,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
        }
    }

    fn invalid(input: &[u8]) -> ProxyError {
        match parse(input) {
            Parse::Invalid(e) => e,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
        }
    }

    fn addr(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap_or_else(|_| panic!("{s} is a socket address")))
    }

    /// A version 2 header: command, family byte, address bytes, then `tlvs`.
    fn v2(command: u8, family: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend_from_slice(&u16::try_from(addrs.len() + tlvs.len()).unwrap_or(u16::MAX).to_be_bytes());
        h.extend_from_slice(addrs);
        h.extend_from_slice(tlvs);
        h
    }

    fn v2_tcp4() -> Vec<u8> {
        v2(1, 0x11, &[198, 51, 100, 7, 10, 0, 0, 1, 0x12, 0x34, 0x01, 0xbb], &[])
    }

    fn v2_tcp6() -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().map(|i| i.octets()).unwrap_or_default());
        a.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        a.extend_from_slice(&[0xc3, 0x50, 0x01, 0xbb]);
        v2(1, 0x21, &a, &[])
    }

    #[test]
    fn version_1_names_the_client_and_its_length() {
        let line = b"PROXY TCP4 198.51.100.7 10.0.0.1 4660 443\r\n";
        assert_eq!(done(line), Header { source: addr("198.51.100.7:4660"), len: line.len() });
        let line = b"PROXY TCP6 2001:db8::7 ::1 50000 443\r\n";
        assert_eq!(done(line), Header { source: addr("[2001:db8::7]:50000"), len: line.len() });
        let mut with_request = b"PROXY TCP4 192.0.2.1 192.0.2.2 0 65535\r\n".to_vec();
        let len = with_request.len();
        with_request.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(done(&with_request), Header { source: addr("192.0.2.1:0"), len }, "what follows is not read");
    }

    #[test]
    fn version_1_unknown_names_no_client() {
        assert_eq!(done(b"PROXY UNKNOWN\r\n"), Header { source: None, len: 15 });
        let line = b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n";
        assert_eq!(done(line), Header { source: None, len: line.len() }, "the rest of the line is ignored");
    }

    #[test]
    fn the_longest_version_1_line_is_accepted_and_one_byte_more_is_not() {
        let widest = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert_eq!(done(widest).source, addr("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"));
        let mut unknown = b"PROXY UNKNOWN ".to_vec();
        unknown.resize(MAX_V1 - 2, b'x');
        unknown.extend_from_slice(b"\r\n");
        assert_eq!(done(&unknown).len, MAX_V1);
        unknown.insert(20, b'x');
        assert_eq!(invalid(&unknown), ProxyError::NoCrlf);
        assert_eq!(invalid(&[b"PROXY ".as_slice(), &[b'x'; 200]].concat()), ProxyError::NoCrlf);
    }

    #[test]
    fn version_2_names_the_client_over_ipv4_and_ipv6() {
        assert_eq!(done(&v2_tcp4()), Header { source: addr("198.51.100.7:4660"), len: 28 });
        assert_eq!(done(&v2_tcp6()), Header { source: addr("[2001:db8::7]:50000"), len: 52 });
    }

    #[test]
    fn version_2_skips_tlvs_and_stops_at_its_length() {
        // PP2_TYPE_ALPN "h2", PP2_TYPE_AUTHORITY "example.com": counted by the length, not read.
        let tlvs = [&[0x01, 0x00, 0x02][..], b"h2", &[0x02, 0x00, 0x0b], b"example.com"].concat();
        let mut h = v2(1, 0x11, &[192, 0, 2, 1, 192, 0, 2, 2, 0, 80, 0, 80], &tlvs);
        let len = h.len();
        h.extend_from_slice(b"\x16\x03\x01 a ClientHello");
        assert_eq!(done(&h), Header { source: addr("192.0.2.1:80"), len });
    }

    #[test]
    fn version_2_local_and_unspec_name_no_client() {
        assert_eq!(done(&v2(0, 0x00, &[], &[])), Header { source: None, len: 16 }, "a balancer's health check");
        let local_with_addrs = v2(0, 0x11, &[1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2], &[]);
        assert_eq!(done(&local_with_addrs), Header { source: None, len: 28 }, "LOCAL: addresses skipped");
        assert_eq!(done(&v2(0, 0x31, &[0; 216], &[])).len, 232, "LOCAL ignores the family, not the length");
        assert_eq!(done(&v2(1, 0x00, &[0; 4], &[])), Header { source: None, len: 20 }, "PROXY, AF_UNSPEC");
    }

    #[test]
    fn every_prefix_of_a_header_is_incomplete() {
        let mut longest = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ".to_vec();
        longest.extend_from_slice(b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n");
        let tlvs = [0x04u8, 0x00, 0x03, b'a', b'b', b'c'];
        let headers = [
            b"PROXY TCP4 198.51.100.7 10.0.0.1 4660 443\r\n".to_vec(),
            b"PROXY UNKNOWN\r\n".to_vec(),
            longest,
            v2_tcp4(),
            v2_tcp6(),
            v2(0, 0x00, &[], &[]),
            v2(1, 0x11, &[1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2], &tlvs),
        ];
        for h in headers {
            for cut in 0..h.len() {
                assert_eq!(parse(&h[..cut]), Parse::Incomplete, "{:?} cut at {cut}", String::from_utf8_lossy(&h));
            }
            assert_eq!(done(&h).len, h.len());
        }
    }

    #[test]
    fn what_is_no_header_is_refused_at_its_first_wrong_byte() {
        for input in
            [&b"GET / HTTP/1.1\r\n"[..], b"\x16\x03\x01\x02\x00", b"proxy TCP4", b"PROXY\r\n", b"PRI * HTTP/2.0"]
        {
            assert_eq!(invalid(input), ProxyError::NotProxy, "{:?}", String::from_utf8_lossy(input));
        }
        assert_eq!(invalid(b"G"), ProxyError::NotProxy, "one byte is enough to tell");
        assert_eq!(invalid(b"\r\n\r\n\x01"), ProxyError::NotProxy);
        assert_eq!(invalid(b"\r\n\r\n\0\r\nQUIX\n"), ProxyError::NotProxy, "a bad signature");
        assert_eq!(
            invalid(b"\r\n\r\n\0\r\nQUIT\n\x11\x11\x00\x0c"),
            ProxyError::BadVersion,
            "version 1 in a v2 header"
        );
        assert_eq!(invalid(&v2(2, 0x11, &[0; 12], &[])), ProxyError::BadVersion, "command 2");
    }

    #[test]
    fn bad_version_1_lines_are_refused() {
        let bad: &[(&[u8], ProxyError)] = &[
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 4660\r\n", ProxyError::BadLine),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 4660 443 x\r\n", ProxyError::BadLine),
            (b"PROXY TCP4  198.51.100.7 10.0.0.1 4660 443\r\n", ProxyError::BadLine),
            (b"PROXY UDP4 198.51.100.7 10.0.0.1 4660 443\r\n", ProxyError::BadLine),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 4660 443 \r\n", ProxyError::BadLine),
            (b"PROXY TCP4 \xff\xfe 10.0.0.1 4660 443\r\n", ProxyError::BadLine),
            (b"PROXY TCP4 2001:db8::7 10.0.0.1 4660 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP6 198.51.100.7 ::1 4660 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP4 198.51.100.256 10.0.0.1 4660 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 65536 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 +80 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 080 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 80 \r\n", ProxyError::BadAddress),
            (b"PROXY TCP6 fe80::1%eth0 ::1 80 443\r\n", ProxyError::BadAddress),
            (b"PROXY TCP4 198.51.100.7 10.0.0.1 80 443\n", ProxyError::NoCrlf),
            (b"PROXY TCP4 198.51.100.7\r10.0.0.1 80 443\r\n", ProxyError::NoCrlf),
        ];
        for (line, want) in bad {
            assert_eq!(invalid(line), *want, "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn bad_version_2_headers_are_refused() {
        assert_eq!(invalid(&v2(1, 0x12, &[0; 12], &[])), ProxyError::BadFamily, "UDP over IPv4");
        assert_eq!(invalid(&v2(1, 0x31, &[0; 216], &[])), ProxyError::BadFamily, "AF_UNIX");
        assert_eq!(invalid(&v2(1, 0x10, &[0; 12], &[])), ProxyError::BadFamily, "IPv4, unspecified transport");
        assert_eq!(invalid(&v2(1, 0x11, &[0; 11], &[])), ProxyError::BadLength, "IPv4 addresses cut short");
        assert_eq!(invalid(&v2(1, 0x21, &[0; 12], &[])), ProxyError::BadLength, "IPv6 with IPv4's length");
        // Refused on the length field alone: no need to wait for 64 KiB that will not be read.
        let mut huge = v2(1, 0x11, &[0; 12], &[]);
        huge[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(invalid(&huge[..16]), ProxyError::BadLength);
        let mut at_max = v2(0, 0x00, &[0; MAX_HEADER - 16], &[]);
        assert_eq!(done(&at_max).len, MAX_HEADER);
        at_max[14..16].copy_from_slice(&u16::try_from(MAX_HEADER - 15).unwrap_or(0).to_be_bytes());
        assert_eq!(invalid(&at_max), ProxyError::BadLength, "one byte above the bound");
    }
}
