//! Redis for cross-host state (`cluster.redis_url`): the RESP2 codec
//! ([`resp`]), a non-blocking connection driven by a mio poll ([`conn`]), and
//! the URL they connect to ([`RedisTarget`], [`parse_url`]).
//!
//! `rediss://` is Redis over TLS (rustls with ring, driven by hand over the
//! same non-blocking socket): the server's certificate is verified for the
//! URL's host against the system's roots or, with `?ssl_ca_certs=/path.pem`
//! (redis-py's name for it), against that file's certificates only.
//!
//! No thread, no blocking call: a connection is a state machine the owner's
//! poll loop drives (connect, AUTH and SELECT from the URL, pipelined
//! commands with a bounded queue, PING health, reconnect with back-off). The
//! supervisor owns the connections (see `supervisor::redis`); a worker never
//! talks to Redis. This module knows nothing of rate limits or the bus.

pub mod conn;
pub mod resp;

use std::fmt;

/// Where Redis is and how to log in:
/// `redis[s]://[user[:password]@]host[:port][/db][?ssl_ca_certs=/path.pem]`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// `rediss://`: TLS, the certificate verified.
    pub tls: bool,
    /// `ssl_ca_certs`: the roots the certificate must chain to (`None`: the system's).
    pub ca_file: Option<String>,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port (6379 by default).
    pub port: u16,
    /// ACL user name (`AUTH user password`), if any.
    pub user: Option<String>,
    /// Password (`AUTH password`), if any.
    pub password: Option<String>,
    /// Database number (`SELECT`); also part of the pub/sub channel name,
    /// since pub/sub ignores databases.
    pub db: u32,
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        write!(f, "{self}")
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        let auth = match (&self.user, &self.password) {
            (Some(u), _) => format!("{u}:***@"),
            (None, Some(_)) => ":***@".to_owned(),
            (None, None) => String::new(),
        };
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://{auth}{host}:{}/{}", self.port, self.db)
    }
}

/// Why a `cluster.redis_url` is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    /// Neither `redis://` nor `rediss://`.
    Scheme,
    /// `ssl_ca_certs` that is not an absolute path, or without `rediss://`.
    CaFile,
    /// No host.
    NoHost,
    /// A port that is not 1..=65535.
    Port,
    /// A database that is not a number.
    Db,
    /// A `%` not followed by two hex digits, or a user/password not UTF-8.
    Escape,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UrlError::Scheme => "must start with redis:// or rediss:// (TLS)",
            UrlError::CaFile => "has an ssl_ca_certs that is not an absolute path, or without rediss://",
            UrlError::NoHost => "has no host",
            UrlError::Port => "has a port that is not 1-65535",
            UrlError::Db => "has a database that is not a number (redis://host:6379/0)",
            UrlError::Escape => "has a bad %-escape in the user or password",
        })
    }
}

impl std::error::Error for UrlError {}

/// How to reach `target` over TLS (`rediss://`): its `ssl_ca_certs` roots or the system's;
/// `Ok(None)` for `redis://`. Reads the roots file; the error says what is wrong with it.
pub fn tls_to(target: &RedisTarget) -> Result<Option<conn::TlsTo>, String> {
    if !target.tls {
        return Ok(None);
    }
    let config = crate::tls::client::config(target.ca_file.as_deref()).map_err(|e| match &target.ca_file {
        Some(_) => format!("ssl_ca_certs {e}"),
        None => format!("rediss://: {e}"),
    })?;
    let name = rustls::pki_types::ServerName::try_from(target.host.clone())
        .map_err(|e| format!("{}: not a name a certificate can carry: {e}", target.host))?;
    Ok(Some(conn::TlsTo { config: std::sync::Arc::new(config), name }))
}

/// Parse `cluster.redis_url`; the empty string means "no Redis" (`Ok(None)`).
pub fn parse_url(url: &str) -> Result<Option<RedisTarget>, UrlError> {
    let url = url.trim();
    if url.is_empty() {
        return Ok(None);
    }
    let (tls, rest) = match (url.strip_prefix("redis://"), url.strip_prefix("rediss://")) {
        (Some(rest), _) => (false, rest),
        (None, Some(rest)) => (true, rest),
        (None, None) => return Err(UrlError::Scheme),
    };
    let rest = rest.split('#').next().unwrap_or("");
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut ca_file = None;
    for param in query.split('&') {
        if let Some(path) = param.strip_prefix("ssl_ca_certs=") {
            let path = unescape(path).map_err(|_| UrlError::CaFile)?;
            if !tls || !path.starts_with('/') {
                return Err(UrlError::CaFile);
            }
            ca_file = Some(path);
        }
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let db = if path.is_empty() { 0 } else { path.parse::<u32>().map_err(|_| UrlError::Db)? };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (u, p) = match info.find(':') {
                Some(i) => (&info[..i], Some(&info[i + 1..])),
                None => (info, None),
            };
            let u = if u.is_empty() { None } else { Some(unescape(u)?) };
            (u, p.map(unescape).transpose()?)
        }
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let end = v6.find(']').ok_or(UrlError::NoHost)?;
        let port = v6[end + 1..].strip_prefix(':');
        (&v6[..end], port)
    } else {
        match hostport.rfind(':') {
            Some(i) => (&hostport[..i], Some(&hostport[i + 1..])),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = match port {
        None | Some("") => 6379,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or(UrlError::Port)?,
    };
    Ok(Some(RedisTarget { tls, ca_file, host: host.to_owned(), port, user, password, db }))
}

fn unescape(s: &str) -> Result<String, UrlError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).ok_or(UrlError::Escape)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| UrlError::Escape)?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::Escape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, port: u16, user: Option<&str>, password: Option<&str>, db: u32) -> RedisTarget {
        RedisTarget {
            tls: false,
            ca_file: None,
            host: host.into(),
            port,
            user: user.map(Into::into),
            password: password.map(Into::into),
            db,
        }
    }

    #[test]
    fn urls_parse_with_defaults() {
        assert_eq!(parse_url(""), Ok(None));
        assert_eq!(parse_url("  "), Ok(None));
        assert_eq!(parse_url("redis://localhost"), Ok(Some(target("localhost", 6379, None, None, 0))));
        assert_eq!(parse_url("redis://127.0.0.1:6380/3"), Ok(Some(target("127.0.0.1", 6380, None, None, 3))));
        assert_eq!(parse_url("redis://:s3cret@h/"), Ok(Some(target("h", 6379, None, Some("s3cret"), 0))));
        assert_eq!(
            parse_url("redis://app:p%40ss%3Aw@[::1]:7000/15?x=1"),
            Ok(Some(target("::1", 7000, Some("app"), Some("p@ss:w"), 15)))
        );
        assert_eq!(parse_url("redis://[::1]"), Ok(Some(target("::1", 6379, None, None, 0))));
        let tls = RedisTarget { tls: true, ..target("cache", 6380, None, Some("pw"), 1) };
        assert_eq!(parse_url("rediss://:pw@cache:6380/1"), Ok(Some(tls.clone())));
        assert_eq!(
            parse_url("rediss://:pw@cache:6380/1?ssl_ca_certs=%2Fetc%2Fforkd%2Fca.pem"),
            Ok(Some(RedisTarget { ca_file: Some("/etc/forkd/ca.pem".into()), ..tls.clone() }))
        );
        assert_eq!(tls.to_string(), "rediss://:***@cache:6380/1");
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        assert_eq!(parse_url("redisss://h"), Err(UrlError::Scheme));
        assert_eq!(parse_url("http://h"), Err(UrlError::Scheme));
        assert_eq!(parse_url("redis://h?ssl_ca_certs=/etc/ca.pem"), Err(UrlError::CaFile), "no TLS to verify");
        assert_eq!(parse_url("rediss://h?ssl_ca_certs=ca.pem"), Err(UrlError::CaFile));
        assert_eq!(parse_url("redis://"), Err(UrlError::NoHost));
        assert_eq!(parse_url("redis://:pw@:6379"), Err(UrlError::NoHost));
        assert_eq!(parse_url("redis://h:0"), Err(UrlError::Port));
        assert_eq!(parse_url("redis://h:70000"), Err(UrlError::Port));
        assert_eq!(parse_url("redis://h/x"), Err(UrlError::Db));
        assert_eq!(parse_url("redis://u:%zz@h"), Err(UrlError::Escape));
        assert_eq!(parse_url("redis://u:%4@h"), Err(UrlError::Escape));
    }

    #[test]
    fn the_password_is_never_shown() {
        let t = target("h", 1, Some("u"), Some("hunter2"), 2);
        assert_eq!(t.to_string(), "redis://u:***@h:1/2");
        assert!(!format!("{t:?}").contains("hunter2"));
    }
}
