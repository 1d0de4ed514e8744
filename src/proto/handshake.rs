//! The WebSocket opening handshake, as each codec checks it: the HTTP/1.1
//! upgrade (RFC 6455 §4.2, [`accept_key`] and the `101 Switching Protocols`
//! head) and the HTTP/2 extended CONNECT (RFC 8441 §5, [`extended_connect`]).
//!
//! It sees header names and values only: no sockets, no routing, no auth (the
//! handler checks the token and `Origin` before any of this runs). It never
//! decides the HTTP status of a refusal beyond what [`HandshakeError`]
//! documents; `crate::error` maps it to the response.

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

impl HandshakeError {
    /// What is wrong, for the client.
    pub fn message(self) -> &'static str {
        match self {
            HandshakeError::Method => "websocket upgrade requires GET",
            HandshakeError::Upgrade => "missing Upgrade: websocket",
            HandshakeError::Connection => "missing Connection: upgrade",
            HandshakeError::Version => "unsupported Sec-WebSocket-Version",
            HandshakeError::Key => "invalid Sec-WebSocket-Key",
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
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
    let key = key.filter(|k| valid_key(k)).ok_or(HandshakeError::Key)?;
    let digest = Sha1::new().chain_update(key).chain_update(GUID).finalize();
    Ok(STANDARD.encode(digest))
}

/// Check an HTTP/2 extended CONNECT whose `:protocol` is `websocket` (RFC 8441
/// §5): the stream is the WebSocket once it is answered `200`.
///
/// The CONNECT itself stands for `Upgrade`, `Connection` and the method, so
/// only `Sec-WebSocket-Version` must be `13` ([`HandshakeError::Version`]).
/// RFC 8441 sends no `Sec-WebSocket-Key` and no accept answers it; a key that
/// is sent all the same must be well-formed, as over HTTP/1.1
/// ([`HandshakeError::Key`], checked after the version). `fields` yields every
/// request field as `(name, value)`; of a repeated field the last counts.
pub fn extended_connect<'a>(fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Result<(), HandshakeError> {
    let (mut version, mut key) = (None, None);
    for (name, value) in fields {
        if name.eq_ignore_ascii_case("sec-websocket-version") {
            version = Some(value.trim_ascii());
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            key = Some(value.trim_ascii());
        }
    }
    if version != Some(b"13") {
        return Err(HandshakeError::Version);
    }
    match key {
        Some(k) if !valid_key(k) => Err(HandshakeError::Key),
        _ => Ok(()),
    }
}

/// `key` is the base64 of 16 bytes (RFC 6455 §4.1).
fn valid_key(key: &[u8]) -> bool {
    matches!(STANDARD.decode(key), Ok(raw) if raw.len() == 16)
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
    fn an_extended_connect_needs_version_13_and_no_key() {
        use HandshakeError::*;
        type Fields = &'static [(&'static str, &'static [u8])];
        let cases: [(Fields, Result<(), HandshakeError>); 9] = [
            (&[("sec-websocket-version", b"13")], Ok(())),
            (&[("host", b"x"), ("sec-websocket-version", b" 13 ")], Ok(())),
            (&[], Err(Version)),
            (&[("sec-websocket-version", b"8")], Err(Version)),
            (&[("sec-websocket-version", b"")], Err(Version)),
            // Of a repeated field the last counts.
            (&[("sec-websocket-version", b"13"), ("sec-websocket-version", b"8")], Err(Version)),
            (&[("sec-websocket-version", b"13"), ("sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ==")], Ok(())),
            (&[("sec-websocket-version", b"13"), ("sec-websocket-key", b"c2hvcnQ=")], Err(Key)),
            // The version is checked first.
            (&[("sec-websocket-key", b"c2hvcnQ=")], Err(Version)),
        ];
        for (fields, want) in cases {
            assert_eq!(extended_connect(fields.iter().copied()), want, "{fields:?}");
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
