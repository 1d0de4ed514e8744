//! `[cluster]`: the settings that let several hosts run as one service. `database_url` moves
//! the store to PostgreSQL; `redis_url` shares rate limits, login failures and the bus
//! between hosts (parsed by `redis::parse_url`, the one parser the supervisor also uses).
//!
//! The database URL may hold a password. It is kept in a [`DatabaseUrl`] whose `Debug` and
//! `Display` show the URL without it, so neither a log line, an error, `print-config` nor a
//! `{:?}` of the configuration ever prints it.
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
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL as configured, password included: for the connection only, never for output.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the URL carries a password (in its user info or a `password=` parameter).
    pub fn has_password(&self) -> bool {
        without_password(&self.0) != self.0
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&without_password(&self.0))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({:?})", without_password(&self.0))
    }
}

impl FromStr for DatabaseUrl {
    type Err = String;

    /// Accepts `postgres://` or `postgresql://` URLs that name at least one host and do not ask
    /// for TLS (`sslmode=require`: this build speaks plain TCP to PostgreSQL). The error says
    /// what is allowed and never repeats the password.
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
        let normal = format!("{}://{rest}", scheme.to_ascii_lowercase());
        let parsed = tokio_postgres::Config::from_str(&normal).map_err(|_| ALLOWED.to_string())?;
        if parsed.get_hosts().is_empty() {
            return Err(format!("{ALLOWED}: a host is required"));
        }
        if parsed.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err("a URL without sslmode=require: TLS to PostgreSQL is not supported by this build".into());
        }
        Ok(DatabaseUrl(normal))
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
        ] {
            assert!(ok.parse::<DatabaseUrl>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "mysql://u@h/db",
            "http://u@h/db",
            "postgres:///db",
            "postgres://u@h/db?sslmode=require",
            "postgres://u@h/db?nonsense=1",
            "postgres://u@h:notaport/db",
            "postgres://u@h/d b",
        ] {
            let err = bad.parse::<DatabaseUrl>().expect_err(bad);
            assert!(!err.contains("s3cret"), "{err}");
        }
        let upper: DatabaseUrl = "PostgreSQL://u@h/db".parse().expect("scheme in any case");
        assert_eq!(upper.expose(), "postgresql://u@h/db");
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
