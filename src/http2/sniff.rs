//! Which protocol a connection speaks, from its first bytes: the HTTP/2 client preface
//! (prior knowledge, h2c) or, over TLS, the protocol ALPN chose. A pure function of bytes
//! the caller has read; it must not read a socket.

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a connection say it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniff {
    /// HTTP/1.1.
    H1,
    /// HTTP/2.
    H2,
    /// Not known yet: more bytes (or the TLS handshake) are needed.
    Wait,
}

/// Classify a connection from its first plaintext bytes and, over TLS, the
/// protocol ALPN chose (`Some` once the handshake is done).
pub fn sniff(first: &[u8], tls: Option<Option<&[u8]>>) -> Sniff {
    match tls {
        Some(None) => Sniff::Wait,
        Some(Some(alpn)) if alpn == b"h2" => Sniff::H2,
        Some(Some(_)) => Sniff::H1,
        None if first.len() >= PREFACE.len() => {
            if first.starts_with(PREFACE) {
                Sniff::H2
            } else {
                Sniff::H1
            }
        }
        None if PREFACE.starts_with(first) => Sniff::Wait,
        None => Sniff::H1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_makes_a_connection_http2() {
        assert_eq!(sniff(PREFACE, None), Sniff::H2);
        assert_eq!(sniff(&PREFACE[..10], None), Sniff::Wait);
        assert_eq!(sniff(b"", None), Sniff::Wait);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n", None), Sniff::H1);
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", None), Sniff::H1);
        assert_eq!(sniff(b"", Some(None)), Sniff::Wait);
        assert_eq!(sniff(b"", Some(Some(b"h2"))), Sniff::H2);
        assert_eq!(sniff(PREFACE, Some(Some(b"http/1.1"))), Sniff::H1);
    }
}
