//! `[cluster]`: the settings that let several hosts run as one service. `database_url` moves
//! the store to PostgreSQL; `redis_url` shares rate limits, login failures and the bus
//! between hosts (parsed by `redis::parse_url`, the one parser the supervisor also uses).
//!
//! The database URL may hold a password. It is kept in a [`DatabaseUrl`] whose `Debug` and
//! `Display` show the URL without it, so neither a log line, an error, `print-config` nor a
//! `{:?}` of the configuration ever prints it.
//!
//! TLS to PostgreSQL: `sslmode=require` (or `verify-full`, the same here) makes the connection
//! TLS, the server's certificate verified for the URL's host against the system's roots or,
//! with `sslrootcert=/path/ca.pem`, against that file's certificates only. This is stricter
//! than libpq's `require` (which encrypts without checking who answers); a certificate that
//! does not verify fails the connection. Without it the connection is plain TCP.
//!
//! This file must not connect to anything: it parses and checks the text only.

use std::fmt;
use std::str::FromStr;

/// `[cluster]`, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cluster {
    /// The store lives in PostgreSQL at this URL; `None`: SQLite under `data_dir`.
    pub database_url: Option<DatabaseUrl>,
    /// Rate limits, login failures and the bus are shared through this Redis; `None`: this
    /// host alone (shared memory). Its `Debug`/`Display` never show the password.
    pub redis_url: Option<crate::redis::RedisTarget>,
}

/// A PostgreSQL URL (`postgres://user:password@host:5432/db?…`), checked by the client's own
/// parser. Its `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    /// What the client parses: the URL without the parameters it does not know
    /// (`sslrootcert`), `verify-full` written as `require`.
    url: String,
    /// `sslrootcert`: the PEM file of the roots a TLS server's certificate must chain to.
    root_cert: Option<String>,
    /// `sslmode=require` (or `verify-full`): every connection is TLS.
    tls: bool,
}

impl DatabaseUrl {
    /// The URL for the client, password included: for the connection only, never for output.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// Whether the URL carries a password (in its user info or a `password=` parameter).
    pub fn has_password(&self) -> bool {
        without_password(&self.url) != self.url
    }

    /// `sslrootcert`, if given (only with `sslmode=require`).
    pub fn root_cert(&self) -> Option<&str> {
        self.root_cert.as_deref()
    }

    /// Whether every connection is TLS (`sslmode=require` or `verify-full`).
    pub fn tls(&self) -> bool {
        self.tls
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&without_password(&self.url))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({:?}, root_cert: {:?})", without_password(&self.url), self.root_cert)
    }
}

/// `%XX` escapes of a URL query value decoded; `None` if one is malformed or the result is
/// not UTF-8.
fn percent_decode(v: &str) -> Option<String> {
    let mut out = Vec::with_capacity(v.len());
    let mut bytes = v.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = |c: Option<u8>| c.and_then(|c| (c as char).to_digit(16));
        let (hi, lo) = (hex(bytes.next())?, hex(bytes.next())?);
        out.push(u8::try_from(hi * 16 + lo).ok()?);
    }
    String::from_utf8(out).ok()
}

impl FromStr for DatabaseUrl {
    type Err = String;

    /// Accepts `postgres://` or `postgresql://` URLs that name at least one host; TLS with
    /// `sslmode=require` or `verify-full` (see the module doc), `sslrootcert` only with it.
    /// The error says what is allowed and never repeats the password.
    fn from_str(v: &str) -> Result<DatabaseUrl, String> {
        const ALLOWED: &str = "empty or a postgres:// URL (postgres://user@host:5432/db)";
        let scheme_ok = ["postgres://", "postgresql://"]
            .iter()
            .any(|s| v.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s)));
        if !scheme_ok || v.contains(char::is_whitespace) {
            return Err(ALLOWED.to_string());
        }
        // The client parses the scheme case-sensitively: hand it the lower-case form.
        let (scheme, rest) = v.split_once("://").unwrap_or((v, ""));
        // The parameters the client does not know are taken out here.
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut root_cert = None;
        let mut kept = Vec::new();
        for param in query.split('&').filter(|p| !p.is_empty()) {
            match param.split_once('=') {
                Some(("sslrootcert", path)) => {
                    let path = percent_decode(path).filter(|p| p.starts_with('/')).ok_or_else(|| {
                        "sslrootcert must be an absolute path to a PEM file of root certificates".to_string()
                    })?;
                    root_cert = Some(path);
                }
                Some(("sslmode", "verify-full")) => kept.push("sslmode=require"),
                Some(("sslmode", "verify-ca")) => {
                    return Err("sslmode=verify-ca: use require or verify-full (the host name is always checked)".into())
                }
                _ => kept.push(param),
            }
        }
        let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
        let normal = format!("{}://{base}{query}", scheme.to_ascii_lowercase());
        let parsed = tokio_postgres::Config::from_str(&normal).map_err(|_| ALLOWED.to_string())?;
        if parsed.get_hosts().is_empty() {
            return Err(format!("{ALLOWED}: a host is required"));
        }
        let tls = parsed.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
        if root_cert.is_some() && !tls {
            return Err("sslrootcert needs sslmode=require (or verify-full)".into());
        }
        Ok(DatabaseUrl { url: normal, root_cert, tls })
    }
}

/// `url` without its password, read the way the PostgreSQL client reads it: the user info is
/// everything before the first `@` (its password after the first `:`), and a `password=`
/// query parameter is dropped whole. Also used for Redis URLs in messages.
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let rest = match rest.split_once('@') {
        Some((creds, after)) => match creds.split_once(':') {
            Some((user, _password)) => format!("{user}@{after}"),
            None => rest.to_string(),
        },
        None => rest.to_string(),
    };
    let rest = match rest.split_once('?') {
        Some((base, query)) => {
            let kept: Vec<&str> =
                query.split('&').filter(|p| !p.to_ascii_lowercase().starts_with("password=")).collect();
            if kept.is_empty() {
                base.to_string()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        }
        None => rest,
    };
    format!("{scheme}://{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_accepted_and_refused() {
        for ok in [
            "postgres://forkd@db.internal:5432/forkd",
            "postgresql://forkd:s3cret@127.0.0.1/forkd?connect_timeout=2",
            "POSTGRES://u@[::1]:5433/x",
            "postgres://u@h1:5432,h2:5432/x?application_name=forkd",
            "postgres://u@h/db?sslmode=require",
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/etc/forkd/pg-ca.pem",
        ] {
            assert!(ok.parse::<DatabaseUrl>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "mysql://u@h/db",
            "http://u@h/db",
            "postgres:///db",
            "postgres://u@h/db?nonsense=1",
            "postgres://u@h/db?sslrootcert=/etc/ca.pem",
            "postgres://u@h/db?sslmode=require&sslrootcert=relative.pem",
            "postgres://u@h/db?sslmode=require&sslrootcert=%2",
            "postgres://u@h/db?sslmode=verify-ca",
            "postgres://u@h:notaport/db",
            "postgres://u@h/d b",
        ] {
            let err = bad.parse::<DatabaseUrl>().expect_err(bad);
            assert!(!err.contains("s3cret"), "{err}");
        }
        let upper: DatabaseUrl = "PostgreSQL://u@h/db".parse().expect("scheme in any case");
        assert_eq!(upper.expose(), "postgresql://u@h/db");
        // What the client gets: no sslrootcert, verify-full as require; the path is kept.
        let tls: DatabaseUrl =
            "postgres://u:pw@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&application_name=a"
                .parse()
                .expect("valid");
        assert_eq!(tls.expose(), "postgres://u:pw@h/db?sslmode=require&application_name=a");
        assert_eq!(tls.root_cert(), Some("/etc/ca x.pem"));
        assert!(tls.tls() && !upper.tls());
        assert!(!format!("{tls:?}").contains("pw"));
        assert_eq!(upper.root_cert(), None);
    }

    #[test]
    fn the_password_never_shows() {
        let url: DatabaseUrl =
            "postgres://forkd:s3cr:et@db:5432/forkd?password=other&application_name=a".parse().expect("valid");
        assert!(url.has_password());
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            format!("{:?}", Cluster { database_url: Some(url.clone()), redis_url: None }),
        ] {
            assert!(!shown.contains("s3cr") && !shown.contains("other"), "{shown}");
        }
        assert_eq!(url.to_string(), "postgres://forkd@db:5432/forkd?application_name=a");
        assert!(url.expose().contains("s3cr:et"), "the connection still gets it");
        let plain: DatabaseUrl = "postgres://forkd@db/forkd".parse().expect("valid");
        assert!(!plain.has_password());
        assert_eq!(without_password("postgres://u@h/db?password=x"), "postgres://u@h/db");
        assert_eq!(without_password("redis://:pw@h:6379/0"), "redis://@h:6379/0");
        assert_eq!(without_password("not a url"), "not a url");
    }
}
