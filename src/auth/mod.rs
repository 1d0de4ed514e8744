//! Authentication primitives: password hashing ([`password`]), access tokens ([`jwt`]),
//! refresh/CSRF tokens ([`tokens`]) and the signing secret ([`secret`]).
//!
//! This module owns only pure computation on values handed to it. It does no I/O (the one
//! exception is [`secret::resolve`] reading `auth.jwt_secret_file` once at start-up), speaks no
//! HTTP, opens no sockets and touches no database; cookies, headers and storage are the
//! callers' business. Password hashing is CPU- and memory-heavy and must only ever be called
//! from the worker's thread pool, never from the event loop.
//!
//! Nothing here ever writes a secret (signing key, password, token) to a log line or to
//! `Debug` output.

use std::fmt;

pub mod jwt;
pub mod password;
pub mod secret;
pub mod tokens;

pub use jwt::{Claims, Jwt};
pub use password::Passwords;

/// Why an authentication primitive failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// Any problem with a presented token (malformed, bad signature, wrong algorithm, expired,
    /// wrong issuer or audience, missing claim). Deliberately carries no detail.
    Invalid,
    /// Hashing or signing failed (bad argon2 parameters, RNG failure, encoder failure).
    Hash(String),
    /// The signing secret is unusable (too short, unreadable file, missing in production).
    Secret(String),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Invalid => f.write_str("invalid token"),
            AuthError::Hash(msg) => write!(f, "hashing failed: {msg}"),
            AuthError::Secret(msg) => write!(f, "signing secret unusable: {msg}"),
        }
    }
}

impl std::error::Error for AuthError {}

#[cfg(test)]
mod tests {
    use super::{AuthError, Jwt, Passwords};

    /// Both are shared by the worker's event loop and its thread pool.
    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
        assert_send_sync::<Jwt>();
        assert_send_sync::<Passwords>();
        assert_send_sync::<AuthError>();
    }

    #[test]
    fn display() {
        assert_eq!(AuthError::Invalid.to_string(), "invalid token");
        assert_eq!(AuthError::Hash("x".into()).to_string(), "hashing failed: x");
        assert_eq!(AuthError::Secret("y".into()).to_string(), "signing secret unusable: y");
        let boxed: Box<dyn std::error::Error> = Box::new(AuthError::Invalid);
        assert_eq!(boxed.to_string(), "invalid token");
    }
}
