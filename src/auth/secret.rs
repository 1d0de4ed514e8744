//! The HS256 signing secret: where it comes from and whether it is usable.
//!
//! This is the one place in [`crate::auth`] allowed to do I/O, and only to read
//! `auth.jwt_secret_file` once at start-up. No HTTP, no sockets, no other files. The secret's
//! bytes never appear in an error, a log line or `Debug` output; errors name the setting or the
//! file path only.

use crate::config::{Auth, JwtSecret};

use super::tokens::random_bytes;
use super::AuthError;

/// The minimum secret length in bytes (256 bits, the HS256 key size).
pub const MIN_SECRET_LEN: usize = 32;

/// Resolve the signing secret: Inline → its bytes (>= 32 bytes else Secret error); File → the file's contents with ONE trailing newline trimmed (>= 32 bytes; unreadable → Secret error naming the path, never the content); Generate → allowed only in development: 32 random bytes from OsRng (log a warn that tokens won't survive a restart); in production Generate → Secret([`crate::config::SECRET_REQUIRED`]).
///
/// A trailing `"\r\n"` counts as one newline. Any other whitespace is part of the secret.
pub fn resolve(auth: &Auth, development: bool) -> Result<Vec<u8>, AuthError> {
    match &auth.secret {
        JwtSecret::Inline(secret) => {
            if secret.len() < MIN_SECRET_LEN {
                return Err(AuthError::Secret(format!("auth.jwt_secret must be at least {MIN_SECRET_LEN} bytes")));
            }
            Ok(secret.as_bytes().to_vec())
        }
        JwtSecret::File(path) => {
            let mut bytes = std::fs::read(path)
                .map_err(|e| AuthError::Secret(format!("cannot read auth.jwt_secret_file {}: {e}", path.display())))?;
            if bytes.ends_with(b"\r\n") {
                bytes.truncate(bytes.len() - 2);
            } else if bytes.ends_with(b"\n") {
                bytes.truncate(bytes.len() - 1);
            }
            if bytes.len() < MIN_SECRET_LEN {
                return Err(AuthError::Secret(format!(
                    "auth.jwt_secret_file {} must hold at least {MIN_SECRET_LEN} bytes (after one trailing newline is trimmed)",
                    path.display()
                )));
            }
            Ok(bytes)
        }
        JwtSecret::Generate if development => {
            log::warn!(
                "no auth.jwt_secret or auth.jwt_secret_file configured: using a random signing secret; \
                 tokens will not survive a restart"
            );
            Ok(random_bytes::<MIN_SECRET_LEN>().to_vec())
        }
        JwtSecret::Generate => Err(AuthError::Secret(crate::config::SECRET_REQUIRED.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    const GOOD: &str = "0123456789abcdef0123456789abcdef";

    fn auth(secret: JwtSecret) -> Auth {
        Auth {
            secret,
            issuer: "forkd".into(),
            audience: "forkd-api".into(),
            access_ttl: Duration::from_secs(900),
            refresh_ttl: Duration::from_secs(604_800),
            argon2_memory_kib: 19456,
            argon2_iterations: 2,
            cookie_secure: true,
        }
    }

    fn secret_file(contents: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(contents).expect("write");
        file
    }

    #[test]
    fn inline() {
        for dev in [false, true] {
            assert_eq!(resolve(&auth(JwtSecret::Inline(GOOD.into())), dev), Ok(GOOD.as_bytes().to_vec()));
            let err = resolve(&auth(JwtSecret::Inline("short-secret-31-bytes-long-----".into())), dev)
                .expect_err("31 bytes is too short");
            assert_eq!(err, AuthError::Secret("auth.jwt_secret must be at least 32 bytes".into()));
            assert!(!err.to_string().contains("short-secret"), "{err}");
            assert!(resolve(&auth(JwtSecret::Inline(String::new())), dev).is_err());
        }
    }

    #[test]
    fn file_with_trailing_newline() {
        for (contents, expected) in [
            (format!("{GOOD}\n"), GOOD.to_owned()),
            (format!("{GOOD}\r\n"), GOOD.to_owned()),
            (GOOD.to_owned(), GOOD.to_owned()),
            (format!("{GOOD}\n\n"), format!("{GOOD}\n")),
            (format!(" {GOOD} \n"), format!(" {GOOD} ")),
        ] {
            let file = secret_file(contents.as_bytes());
            let got = resolve(&auth(JwtSecret::File(file.path().to_owned())), false);
            assert_eq!(got, Ok(expected.into_bytes()), "{contents:?}");
        }
    }

    #[test]
    fn file_too_short() {
        let file = secret_file(b"too-short-secret-value\n");
        let err = resolve(&auth(JwtSecret::File(file.path().to_owned())), true).expect_err("short");
        let msg = err.to_string();
        assert!(msg.contains(&file.path().display().to_string()), "{msg}");
        assert!(!msg.contains("too-short-secret-value"), "{msg}");
        // 31 bytes + a newline is still too short: only the newline is trimmed.
        let file = secret_file(format!("{}\n", &GOOD[..31]).as_bytes());
        assert!(resolve(&auth(JwtSecret::File(file.path().to_owned())), true).is_err());
    }

    #[test]
    fn missing_file_names_the_path() {
        let path = PathBuf::from("/nonexistent/forkd-test/jwt-secret-file");
        let err = resolve(&auth(JwtSecret::File(path.clone())), false).expect_err("missing");
        let AuthError::Secret(msg) = &err else { panic!("wrong variant: {err:?}") };
        assert!(msg.contains("/nonexistent/forkd-test/jwt-secret-file"), "{msg}");
        assert!(msg.contains("auth.jwt_secret_file"), "{msg}");
    }

    #[test]
    fn generate_in_production_is_refused() {
        assert_eq!(
            resolve(&auth(JwtSecret::Generate), false),
            Err(AuthError::Secret(crate::config::SECRET_REQUIRED.into()))
        );
    }

    #[test]
    fn generate_in_development() {
        let a = resolve(&auth(JwtSecret::Generate), true).expect("generated");
        let b = resolve(&auth(JwtSecret::Generate), true).expect("generated");
        assert_eq!((a.len(), b.len()), (32, 32));
        assert_ne!(a, b);
    }
}
