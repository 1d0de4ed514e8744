//! Opaque random tokens: refresh tokens (and their storage hash), refresh-token family ids,
//! CSRF tokens, and the constant-time comparison used for the CSRF double submit.
//!
//! Pure computation only: no I/O, no HTTP, no sockets, no storage. Randomness comes from the
//! operating system (`OsRng`). The tokens returned here are secrets: callers must never log
//! them; only [`hash_token`]'s output is meant to be stored.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// `N` random bytes from the operating system.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    OsRng.fill_bytes(&mut bytes);
    bytes
}

/// Lower-case hex encoding of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// A fresh refresh token: 32 random bytes (OsRng) base64url without padding, and its storage hash (hex SHA-256).
///
/// Returns `(token, hash)`: the token goes to the client, only the hash is stored.
pub fn new_refresh_token() -> (String, String) {
    let token = URL_SAFE_NO_PAD.encode(random_bytes::<32>());
    let hash = hash_token(&token);
    (token, hash)
}

/// The storage hash of a refresh token: lower-case hex SHA-256 of its UTF-8 bytes (64 characters).
pub fn hash_token(token: &str) -> String {
    to_hex(&Sha256::digest(token.as_bytes()))
}

/// A new refresh-token family id: 16 random bytes, lower-case hex (32 characters).
pub fn new_family() -> String {
    to_hex(&random_bytes::<16>())
}

/// A new CSRF token: 32 random bytes, base64url without padding (43 characters).
pub fn new_csrf_token() -> String {
    URL_SAFE_NO_PAD.encode(random_bytes::<32>())
}

/// Constant-time equality for CSRF comparison.
///
/// The running time depends only on the lengths of the inputs, never on their contents; the
/// length itself is not treated as secret (every CSRF token has the same length).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_base64url(s: &str) -> bool {
        s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    }

    fn is_lower_hex(s: &str) -> bool {
        s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    }

    #[test]
    fn refresh_token_shape_and_hash() {
        let (token, hash) = new_refresh_token();
        assert_eq!(token.len(), 43, "32 bytes base64url unpadded");
        assert!(is_base64url(&token));
        assert_eq!(URL_SAFE_NO_PAD.decode(&token).map(|v| v.len()).ok(), Some(32));
        assert_eq!(hash.len(), 64);
        assert!(is_lower_hex(&hash));
        assert_eq!(hash, hash_token(&token));
        let (other, other_hash) = new_refresh_token();
        assert_ne!(token, other);
        assert_ne!(hash, other_hash);
    }

    #[test]
    fn hash_is_stable_sha256() {
        assert_eq!(hash_token(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hash_token("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(hash_token("abc"), hash_token("abc"));
        assert_ne!(hash_token("abc"), hash_token("abd"));
    }

    #[test]
    fn family_shape() {
        let family = new_family();
        assert_eq!(family.len(), 32);
        assert!(is_lower_hex(&family));
        assert_ne!(family, new_family());
    }

    #[test]
    fn csrf_shape() {
        let csrf = new_csrf_token();
        assert_eq!(csrf.len(), 43);
        assert!(is_base64url(&csrf));
        assert!(!csrf.contains('='));
        assert_ne!(csrf, new_csrf_token());
    }

    #[test]
    fn hex_encoding() {
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(to_hex(&[]), "");
    }

    #[test]
    fn constant_time_eq_cases() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"xbc"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
        let csrf = new_csrf_token();
        assert!(constant_time_eq(csrf.as_bytes(), csrf.clone().as_bytes()));
        assert!(!constant_time_eq(csrf.as_bytes(), new_csrf_token().as_bytes()));
    }
}
