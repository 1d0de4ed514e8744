//! The WebSocket opening handshake (RFC 6455 §4.2): checking an upgrade
//! request and writing the `101 Switching Protocols` head.
//!
//! It sees header names and values only: no sockets, no routing, no auth (the
//! caller checks the token and `Origin` first). It never decides the HTTP
//! status of a refusal beyond what [`HandshakeError`] documents.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha1::{Digest, Sha1};

/// The GUID every accept value is derived with (RFC 6455 §1.3).
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Why an upgrade request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// The method is not `GET`: answer 400.
    Method,
    /// No `Upgrade: websocket`: answer 400.
    Upgrade,
    /// No `upgrade` token in `Connection`: answer 400.
    Connection,
    /// `Sec-WebSocket-Version` missing or not `13`: answer 426 with
    /// `Sec-WebSocket-Version: 13`.
    Version,
    /// `Sec-WebSocket-Key` missing or not the base64 of 16 bytes: answer 400.
    Key,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandshakeError::Method => "websocket upgrade requires GET",
            HandshakeError::Upgrade => "missing Upgrade: websocket",
            HandshakeError::Connection => "missing Connection: upgrade",
            HandshakeError::Version => "unsupported Sec-WebSocket-Version",
            HandshakeError::Key => "invalid Sec-WebSocket-Key",
        })
    }
}

impl std::error::Error for HandshakeError {}

/// Check an upgrade request and return its `Sec-WebSocket-Accept` value.
///
/// `method` is the request method as sent; `headers` yields every header
/// field as `(name, value)` (repeated fields are all looked at, so pass them
/// all, e.g. `req.headers.iter().map(|h| (h.name, h.value))`).
pub fn accept_key<'a>(
    method: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<String, HandshakeError> {
    if method != "GET" {
        return Err(HandshakeError::Method);
    }
    let (mut upgrade, mut connection, mut version, mut key) = (false, false, None, None);
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("upgrade") {
            upgrade |= has_token(value, "websocket");
        } else if name.eq_ignore_ascii_case("connection") {
            connection |= has_token(value, "upgrade");
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            version = Some(value.trim_ascii());
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            key = Some(value.trim_ascii());
        }
    }
    if !upgrade {
        return Err(HandshakeError::Upgrade);
    }
    if !connection {
        return Err(HandshakeError::Connection);
    }
    if version != Some(b"13") {
        return Err(HandshakeError::Version);
    }
    let key = key.ok_or(HandshakeError::Key)?;
    match STANDARD.decode(key) {
        Ok(raw) if raw.len() == 16 => {}
        _ => return Err(HandshakeError::Key),
    }
    let digest = Sha1::new().chain_update(key).chain_update(GUID).finalize();
    Ok(STANDARD.encode(digest))
}

/// Append the complete `101 Switching Protocols` response head (ending in the
/// blank line) for an accept value from [`accept_key`].
pub fn switching_protocols(accept: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n");
    out.extend_from_slice(b"Sec-WebSocket-Accept: ");
    out.extend_from_slice(accept.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

/// `value` is a comma-separated token list containing `token` (any case).
fn has_token(value: &[u8], token: &str) -> bool {
    value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: [(&str, &[u8]); 5] = [
        ("Host", b"example.com"),
        ("Upgrade", b"WebSocket"),
        ("Connection", b"keep-alive, Upgrade"),
        ("Sec-WebSocket-Version", b"13"),
        ("Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
    ];

    type Headers = Vec<(&'static str, &'static [u8])>;

    /// `GOOD` with header `name` replaced by `value` (or removed when `None`).
    fn with(name: &str, value: Option<&'static [u8]>) -> Headers {
        let mut h: Vec<_> = GOOD.iter().copied().filter(|(n, _)| *n != name).collect();
        if let Some(v) = value {
            h.push((GOOD.iter().find(|(n, _)| *n == name).unwrap().0, v));
        }
        h
    }

    #[test]
    fn rfc_example_key() {
        assert_eq!(accept_key("GET", GOOD).unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn connection_token_may_be_in_a_second_field() {
        let mut h = with("Connection", Some(b"keep-alive"));
        h.push(("connection", b"UPGRADE"));
        assert!(accept_key("GET", h).is_ok());
    }

    #[test]
    fn rejections() {
        use HandshakeError::*;
        let cases: [(&str, Headers, HandshakeError); 11] = [
            ("POST", GOOD.to_vec(), Method),
            ("GET", with("Upgrade", None), Upgrade),
            ("GET", with("Upgrade", Some(b"h2c")), Upgrade),
            ("GET", with("Connection", None), Connection),
            ("GET", with("Connection", Some(b"keep-alive")), Connection),
            ("GET", with("Sec-WebSocket-Version", None), Version),
            ("GET", with("Sec-WebSocket-Version", Some(b"8")), Version),
            ("GET", with("Sec-WebSocket-Key", None), Key),
            ("GET", with("Sec-WebSocket-Key", Some(b"not base64!")), Key),
            ("GET", with("Sec-WebSocket-Key", Some(b"AAAAAAAAAAAAAAAAAAAAAAAAAAAA")), Key), // 21 bytes
            ("GET", with("Sec-WebSocket-Key", Some(b"")), Key),
        ];
        for (method, headers, want) in cases {
            assert_eq!(accept_key(method, headers.clone()), Err(want), "{method} {headers:?}");
        }
    }

    #[test]
    fn response_head() {
        let mut out = Vec::new();
        switching_protocols("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", &mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
        );
    }
}
