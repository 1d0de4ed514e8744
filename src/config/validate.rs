//! Checks every value of a [`RawConfig`] and resolves it into a [`Config`]: ranges, addresses,
//! origins, URLs, durations, and the rules that tie keys together (production needs a signing
//! secret and refuses debug routes). Each failure is one line naming the dotted key, the bad
//! value (never a secret) and what is allowed; all of them are reported, not just the first.
//!
//! This file must not read files or the environment, and must not panic on any value.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::cluster::without_password;
use super::env::Sources;
use super::raw::RawConfig;
use super::{
    Acme, AcmeChallenge, Auth, Chat, Cluster, Compression, Config, Cors, Db, Debug, Download, Environment, Http2,
    Http3, Io, JwtSecret, Limits, LogFormat, Proxy, RateLimit, Redirect, Sse, Supervisor, Tls, Upstreams, WebSocket,
    SECRET_REQUIRED,
};

const MIB: i64 = 1 << 20;
const MAX: i64 = i64::MAX;
/// The longest duration a key takes (in seconds): far past any real use,
/// and small enough that adding it to a clock or a Unix time cannot overflow
/// (`refresh_ttl_secs = i64::MAX` made every refresh token expire at once).
const TEN_YEARS: i64 = 10 * 365 * 24 * 3600;
/// The most concurrent HTTP/2 streams a connection may be allowed: each may buffer a window
/// of response bytes, so 1000 bounds a connection's buffers to tens of MiB.
const MAX_H2_STREAMS: i64 = 1000;
const ORIGIN: &str = "an origin: http or https, host and optional port, no path (https://a.example)";

/// Resolves `raw`; returns the config (with placeholders where values were bad) and the
/// problems. The config is only meaningful when there are none.
pub(super) fn resolve(raw: &RawConfig, sources: &Sources) -> (Config, Vec<String>) {
    let mut c = Check { problems: Vec::new(), sources };
    let (l, a, u, s) = (&raw.limits, &raw.auth, &raw.upstreams, &raw.supervisor);
    let environment = c.choice(
        "environment",
        &raw.environment,
        &[("development", Environment::Development), ("production", Environment::Production)],
    );
    let listen = raw.listen.parse().unwrap_or_else(|_| {
        c.fail("listen", format!("{:?}", raw.listen), "an address ip:port (127.0.0.1:8080)");
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    });
    let workers = match c.range("workers", raw.workers, 0, 1024) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let secret = match (a.jwt_secret.as_str(), a.jwt_secret_file.as_str()) {
        ("", "") => JwtSecret::Generate,
        (secret, "") => {
            if secret.len() < 32 {
                c.fail("auth.jwt_secret", format!("<{} bytes>", secret.len()), "at least 32 bytes");
            }
            JwtSecret::Inline(secret.to_string())
        }
        ("", file) => JwtSecret::File(PathBuf::from(file)),
        _ => {
            c.problem("auth.jwt_secret and auth.jwt_secret_file are both set: use only one");
            JwtSecret::Generate
        }
    };
    let production = environment == Environment::Production;
    if production && a.jwt_secret.is_empty() && a.jwt_secret_file.is_empty() {
        c.problem(SECRET_REQUIRED);
    }
    if production && raw.debug.routes {
        c.problem("debug.routes = true is not allowed in production");
    }
    let tls = c.tls(raw, listen, &raw.public_origin);
    // A PROXY header is a claim only a trusted balancer may make: no trusted peer, no header.
    for (key, on) in [("proxy_protocol", raw.proxy_protocol), ("tls.proxy_protocol", raw.tls.proxy_protocol)] {
        if on && raw.proxy.trusted.is_empty() {
            c.problem(&format!("{key} = true needs proxy.trusted: the balancers allowed to send the header"));
        }
    }
    let http3 = c.http3(raw, tls.listen);
    let config = Config {
        environment,
        listen,
        proxy_protocol: raw.proxy_protocol,
        workers,
        public_origin: c.origin("public_origin", &raw.public_origin),
        data_dir: PathBuf::from(c.non_empty("data_dir", &raw.data_dir)),
        shutdown_timeout: c.ms("shutdown_timeout_ms", raw.shutdown_timeout_ms, 0, 3_600_000),
        log_format: c.choice("log_format", &raw.log_format, &[("text", LogFormat::Text), ("json", LogFormat::Json)]),
        csp_report_only: raw.csp_report_only,
        pid_file: c.pid_file("pid_file", &raw.pid_file),
        limits: Limits {
            json_body_bytes: c.range("limits.json_body_bytes", l.json_body_bytes, 1, 64 * MIB),
            max_header_bytes: c.range("limits.max_header_bytes", l.max_header_bytes, 1024, MIB),
            header_timeout: c.ms("limits.header_timeout_ms", l.header_timeout_ms, 100, 600_000),
            body_timeout: c.ms("limits.body_timeout_ms", l.body_timeout_ms, 100, 3_600_000),
            keepalive_timeout: c.ms("limits.keepalive_timeout_ms", l.keepalive_timeout_ms, 0, 3_600_000),
            max_connections: c.range("limits.max_connections", l.max_connections, 1, 1_000_000),
        },
        db: Db {
            path: PathBuf::from(&raw.data_dir).join(c.non_empty("db.file", &raw.db.file)),
            pool_size: c.range("db.pool_size", raw.db.pool_size, 1, 256),
        },
        io: Io { threads: c.range("io.threads", raw.io.threads, 1, 256) },
        auth: Auth {
            secret,
            issuer: c.non_empty("auth.issuer", &a.issuer),
            audience: c.non_empty("auth.audience", &a.audience),
            access_ttl: c.secs("auth.access_ttl_secs", a.access_ttl_secs, 1, TEN_YEARS),
            refresh_ttl: c.secs("auth.refresh_ttl_secs", a.refresh_ttl_secs, 1, TEN_YEARS),
            argon2_memory_kib: c.range("auth.argon2_memory_kib", a.argon2_memory_kib, 8, 4 * MIB),
            argon2_iterations: c.range("auth.argon2_iterations", a.argon2_iterations, 1, 100),
            cookie_secure: a.cookie_secure,
        },
        rate_limit: RateLimit {
            enabled: raw.rate_limit.enabled,
            max: c.range("rate_limit.max", raw.rate_limit.max, 1, MAX),
            window: c.secs("rate_limit.window_secs", raw.rate_limit.window_secs, 1, TEN_YEARS),
            login_max_failures: c.range("rate_limit.login_max_failures", raw.rate_limit.login_max_failures, 1, MAX),
        },
        cors: Cors { origins: c.each("cors.origins", &raw.cors.origins, Check::origin) },
        redirect: Redirect {
            allowed_hosts: c.each("redirect.allowed_hosts", &raw.redirect.allowed_hosts, Check::host),
        },
        sse: Sse {
            heartbeat: c.ms("sse.heartbeat_ms", raw.sse.heartbeat_ms, 100, TEN_YEARS * 1000),
            retry: c.ms("sse.retry_ms", raw.sse.retry_ms, 0, TEN_YEARS * 1000),
            replay_limit: c.range("sse.replay_limit", raw.sse.replay_limit, 0, 100_000),
        },
        download: Download { dir: PathBuf::from(c.non_empty("download.dir", &raw.download.dir)) },
        upstreams: Upstreams {
            users: c.base_url("upstreams.users", &u.users),
            orders: c.base_url("upstreams.orders", &u.orders),
            recommendations: c.base_url("upstreams.recommendations", &u.recommendations),
            timeout: c.ms("upstreams.timeout_ms", u.timeout_ms, 1, 600_000),
            cache_ttl: c.secs("upstreams.cache_ttl_secs", u.cache_ttl_secs, 0, TEN_YEARS),
            cache_entries: c.range("upstreams.cache_entries", u.cache_entries, 0, MAX),
        },
        chat: Chat {
            upstream: c.url("chat.upstream", &raw.chat.upstream),
            model: raw.chat.model.clone(),
            echo_delay: c.ms("chat.echo_delay_ms", raw.chat.echo_delay_ms, 0, 60_000),
        },
        websocket: WebSocket {
            echo: raw.websocket.echo,
            max_message_bytes: c.range("websocket.max_message_bytes", raw.websocket.max_message_bytes, 125, 64 * MIB),
            max_rooms_per_connection: c.range(
                "websocket.max_rooms_per_connection",
                raw.websocket.max_rooms_per_connection,
                1,
                10_000,
            ),
        },
        supervisor: Supervisor {
            worker_max_rss_mb: c.range("supervisor.worker_max_rss_mb", s.worker_max_rss_mb, 1, MIB),
            memory_check: c.ms("supervisor.memory_check_ms", s.memory_check_ms, 100, 3_600_000),
            worker_timeout: c.ms("supervisor.worker_timeout_ms", s.worker_timeout_ms, 100, 3_600_000),
        },
        tls,
        http2: Http2 {
            enabled: raw.http2.enabled,
            max_concurrent_streams: c.range(
                "http2.max_concurrent_streams",
                raw.http2.max_concurrent_streams,
                1,
                MAX_H2_STREAMS,
            ),
            initial_window_size: c.range("http2.initial_window_size", raw.http2.initial_window_size, 0, (1 << 31) - 1),
            max_frame_size: c.range("http2.max_frame_size", raw.http2.max_frame_size, 1 << 14, (1 << 24) - 1),
        },
        http3,
        compression: Compression {
            enabled: raw.compression.enabled,
            min_bytes: c.range("compression.min_bytes", raw.compression.min_bytes, 0, 64 * MIB),
            level: c.range("compression.level", raw.compression.level, 1, 9),
        },
        proxy: Proxy {
            trusted: c.each("proxy.trusted", &raw.proxy.trusted, Check::cidr).into_iter().flatten().collect(),
        },
        cluster: c.cluster(&raw.cluster),
        debug: Debug { routes: raw.debug.routes },
        resources: crate::resources::Registry::default(),
    };
    (config, c.problems)
}

/// Collects problems; each check returns the resolved value, or a placeholder after
/// recording a problem.
struct Check<'a> {
    problems: Vec<String>,
    sources: &'a Sources,
}

impl Check<'_> {
    fn problem(&mut self, line: &str) {
        self.problems.push(line.to_string());
    }

    /// `key = shown: must be allowed`, naming the variable when the value came from one.
    fn fail(&mut self, key: &str, shown: String, allowed: &str) {
        let base = key.split('[').next().unwrap_or(key);
        let from = self.sources.get(base).map(|var| format!(" (from {var})")).unwrap_or_default();
        self.problems.push(format!("{key} = {shown}: must be {allowed}{from}"));
    }

    /// `v` if within `lo..=hi` (and representable as `T`).
    fn range<T: TryFrom<i64> + Default>(&mut self, key: &str, v: i64, lo: i64, hi: i64) -> T {
        match T::try_from(v) {
            Ok(t) if (lo..=hi).contains(&v) => t,
            _ => {
                let allowed = match hi {
                    MAX => format!("at least {lo}"),
                    _ => format!("between {lo} and {hi}"),
                };
                self.fail(key, v.to_string(), &allowed);
                T::default()
            }
        }
    }

    fn ms(&mut self, key: &str, v: i64, lo: i64, hi: i64) -> Duration {
        Duration::from_millis(self.range(key, v, lo, hi))
    }

    fn secs(&mut self, key: &str, v: i64, lo: i64, hi: i64) -> Duration {
        Duration::from_secs(self.range(key, v, lo, hi))
    }

    /// The option named `v`; the first option if none is.
    fn choice<T: Copy>(&mut self, key: &str, v: &str, options: &[(&str, T)]) -> T {
        if let Some((_, t)) = options.iter().find(|(name, _)| *name == v) {
            return *t;
        }
        let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
        self.fail(key, format!("{v:?}"), &format!("one of {}", names.join(", ")));
        options[0].1
    }

    fn non_empty(&mut self, key: &str, v: &str) -> String {
        if v.trim().is_empty() {
            self.fail(key, format!("{v:?}"), "non-empty");
        }
        v.to_string()
    }

    /// Checks every item of a list with `check`, keyed `key[i]`.
    fn each<T>(&mut self, key: &str, items: &[String], check: fn(&mut Self, &str, &str) -> T) -> Vec<T> {
        let checked = items.iter().enumerate();
        checked.map(|(i, item)| check(self, &format!("{key}[{i}]"), item)).collect()
    }

    /// An origin, lower-cased.
    fn origin(&mut self, key: &str, v: &str) -> String {
        let lower = v.to_ascii_lowercase();
        if !is_origin(&lower) {
            self.fail(key, format!("{v:?}"), ORIGIN);
        }
        lower
    }

    /// A bare host name, lower-cased.
    fn host(&mut self, key: &str, v: &str) -> String {
        let lower = v.to_ascii_lowercase();
        if !is_host_name(&lower) {
            self.fail(key, format!("{v:?}"), "a bare host name (a.example: no scheme, port or path)");
        }
        lower
    }

    /// A network (`10.0.0.0/8`, `2001:db8::/32`) or one address; `None` after a problem.
    fn cidr(&mut self, key: &str, v: &str) -> Option<super::Cidr> {
        let cidr = v.trim().parse().ok();
        if cidr.is_none() {
            self.fail(key, format!("{v:?}"), "an address or a network addr/prefix (10.0.0.0/8, ::1/128)");
        }
        cidr
    }

    /// A path to a file, or `None` when empty: no NUL byte, and not a directory
    /// (a trailing `/`, `.` or `..`).
    fn pid_file(&mut self, key: &str, v: &str) -> Option<PathBuf> {
        if v.is_empty() {
            return None;
        }
        let path = PathBuf::from(v);
        if v.contains('\0') || v.ends_with('/') || path.file_name().is_none() {
            self.fail(key, format!("{v:?}"), "empty or the path of a file (/run/forkd/forkd.pid)");
        }
        Some(path)
    }

    /// `[cluster]`: a PostgreSQL URL checked by the client's parser; a Redis URL parsed as
    /// the supervisor will use it. A shown value never includes a password.
    fn cluster(&mut self, raw: &super::raw::Cluster) -> Cluster {
        let database_url = match raw.database_url.as_str() {
            "" => None,
            v => match v.parse::<super::DatabaseUrl>() {
                Ok(url) => Some(url),
                Err(allowed) => {
                    self.fail("cluster.database_url", format!("{:?}", without_password(v)), &allowed);
                    None
                }
            },
        };
        let redis_url = match crate::redis::parse_url(&raw.redis_url) {
            Ok(target) => target,
            Err(e) => {
                let allowed = format!("empty or a redis:// or rediss:// URL (redis://host:6379/0): it {e}");
                self.fail("cluster.redis_url", format!("{:?}", without_password(&raw.redis_url)), &allowed);
                None
            }
        };
        Cluster { database_url, redis_url }
    }

    /// `[tls]`: an address when `listen` is set, then both files, an https `public_origin` and
    /// an address other than the plain one's; `redirect_http` only with a TLS listener.
    fn tls(&mut self, raw: &RawConfig, plain: SocketAddr, public_origin: &str) -> Tls {
        let t = &raw.tls;
        let listen = (!t.listen.is_empty()).then(|| {
            t.listen.parse::<SocketAddr>().unwrap_or_else(|_| {
                self.fail("tls.listen", format!("{:?}", t.listen), "empty or an address ip:port (0.0.0.0:443)");
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
            })
        });
        let acme = self.acme(&t.acme);
        for (key, v) in [("tls.cert_file", &t.cert_file), ("tls.key_file", &t.key_file)] {
            if acme.is_some() && !v.trim().is_empty() {
                self.problem(&format!(
                    "{key} and tls.acme.directory are both set: with ACME the certificate is kept under data_dir/acme; remove {key}"
                ));
            }
        }
        if acme.is_some() && listen.is_none() {
            self.problem("tls.acme.directory is set but tls.listen is not: ACME needs the TLS listener");
        }
        if let Some(addr) = listen {
            for (key, v) in [("tls.cert_file", &t.cert_file), ("tls.key_file", &t.key_file)] {
                if v.trim().is_empty() && acme.is_none() {
                    self.problem(&format!("{key} is required when tls.listen is set (or set tls.acme.directory)"));
                }
            }
            if addr == plain && addr.port() != 0 {
                self.fail("tls.listen", format!("{:?}", t.listen), "an address other than `listen`");
            }
            if !public_origin.to_ascii_lowercase().starts_with("https://") {
                self.fail(
                    "public_origin",
                    format!("{public_origin:?}"),
                    "the https origin when tls.listen is set (https://a.example)",
                );
            }
        }
        if t.redirect_http && listen.is_none() {
            self.problem("tls.redirect_http = true needs tls.listen");
        }
        if t.proxy_protocol && listen.is_none() {
            self.problem("tls.proxy_protocol = true needs tls.listen");
        }
        Tls {
            listen,
            cert_file: PathBuf::from(&t.cert_file),
            key_file: PathBuf::from(&t.key_file),
            redirect_http: t.redirect_http,
            proxy_protocol: t.proxy_protocol,
            acme,
        }
    }

    /// `[tls.acme]`: off while `directory` is empty (then its other keys must be unset too);
    /// on, an https directory, at least one DNS name (no wildcard: that needs DNS-01), an
    /// address-like contact and a known challenge type.
    fn acme(&mut self, a: &super::raw::Acme) -> Option<Acme> {
        if a.directory.is_empty() {
            if !a.domains.is_empty() || !a.email.is_empty() || !a.ca_file.is_empty() {
                self.problem("tls.acme is configured but tls.acme.directory is empty: set the CA's directory URL");
            }
            return None;
        }
        let https = split_url(&a.directory).is_some_and(|(host, rest)| {
            a.directory.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://"))
                && is_authority(&host.to_ascii_lowercase())
                && (rest.is_empty() || rest.starts_with('/'))
                && !rest.contains(char::is_whitespace)
        });
        if !https {
            let allowed = "an https:// URL (https://acme-v02.api.letsencrypt.org/directory)";
            self.fail("tls.acme.directory", format!("{:?}", a.directory), allowed);
        }
        if a.domains.is_empty() {
            self.problem("tls.acme.domains is empty: name at least one DNS name the certificate is for");
        }
        let mut domains = Vec::new();
        for (i, d) in a.domains.iter().enumerate() {
            let key = format!("tls.acme.domains[{i}]");
            let lower = d.trim_end_matches('.').to_ascii_lowercase();
            if lower.starts_with("*.") {
                self.fail(&key, format!("{d:?}"), "a DNS name without a wildcard (wildcards need DNS-01)");
            } else if !is_dns_name(&lower) {
                self.fail(&key, format!("{d:?}"), "a DNS name (api.example.com)");
            } else if !domains.contains(&lower) {
                domains.push(lower);
            }
        }
        let email_ok = |e: &str| {
            e.split_once('@').is_some_and(|(user, host)| {
                !user.is_empty() && is_dns_name(&host.to_ascii_lowercase()) && !user.contains(['@', ',', ' ', '<', '>'])
            })
        };
        if !a.email.is_empty() && !email_ok(&a.email) {
            self.fail("tls.acme.email", format!("{:?}", a.email), "empty or an address (ops@example.com)");
        }
        let challenge = self.choice(
            "tls.acme.challenge",
            &a.challenge,
            &[("tls-alpn-01", AcmeChallenge::TlsAlpn01), ("http-01", AcmeChallenge::Http01)],
        );
        Some(Acme {
            directory: a.directory.clone(),
            email: (!a.email.is_empty()).then(|| a.email.clone()),
            domains,
            ca_file: (!a.ca_file.is_empty()).then(|| PathBuf::from(&a.ca_file)),
            challenge,
        })
    }

    /// `[http3]`: off unless `enabled`; on, it needs a TLS listener (its certificate is the
    /// one QUIC uses), and its UDP address is `http3.listen` or else `tls.listen`'s.
    fn http3(&mut self, raw: &RawConfig, tls: Option<SocketAddr>) -> Http3 {
        let h = &raw.http3;
        let listen = (!h.listen.is_empty()).then(|| {
            h.listen.parse::<SocketAddr>().unwrap_or_else(|_| {
                self.fail("http3.listen", format!("{:?}", h.listen), "empty or an address ip:port (0.0.0.0:443)");
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
            })
        });
        let max_age = self.range("http3.alt_svc_max_age", h.alt_svc_max_age, 0, TEN_YEARS);
        if h.enabled && tls.is_none() {
            self.problem("http3.enabled = true needs [tls] (tls.listen, tls.cert_file, tls.key_file)");
        }
        Http3 {
            listen: if h.enabled { listen.or(tls) } else { None },
            alt_svc_max_age: max_age,
            early_data: h.early_data,
        }
    }

    /// An http(s) URL, or `None` when empty.
    fn url(&mut self, key: &str, v: &str) -> Option<String> {
        let ok = match split_url(v) {
            Some((authority, rest)) => {
                is_authority(&authority.to_ascii_lowercase())
                    && (rest.is_empty() || rest.starts_with(['/', '?']))
                    && !rest.contains(char::is_whitespace)
            }
            None => false,
        };
        if !v.is_empty() && !ok {
            self.fail(key, format!("{v:?}"), "empty or an http:// or https:// URL");
        }
        (!v.is_empty()).then(|| v.to_string())
    }

    /// [`Check::url`], without trailing `/` (paths are appended to it).
    fn base_url(&mut self, key: &str, v: &str) -> Option<String> {
        self.url(key, v).map(|url| url.trim_end_matches('/').to_string())
    }
}

/// `scheme://authority rest` for http and https (scheme in any case): `(authority, rest)`,
/// where `rest` is the path, query and fragment, if any.
fn split_url(v: &str) -> Option<(&str, &str)> {
    let (scheme, after) = v.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    Some(after.split_at(after.find(['/', '?', '#']).unwrap_or(after.len())))
}

/// A DNS name: dot-separated labels of letters, digits and inner hyphens, each 1 to 63 bytes,
/// 253 bytes in all, not all digits (that is an address).
fn is_dns_name(v: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !v.is_empty() && v.len() <= 253 && v.split('.').all(label) && !v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// `scheme://host[:port]` with nothing after, in lower case: what a browser sends as `Origin`.
fn is_origin(v: &str) -> bool {
    matches!(split_url(v), Some((authority, "")) if is_authority(authority))
}

/// `host[:port]`, with the host a name, an IPv4 address or a bracketed IPv6 address.
fn is_authority(v: &str) -> bool {
    let (host, port) = match v.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) if ip.parse::<Ipv6Addr>().is_ok() => ("", port),
            _ => return false,
        },
        None => v.split_at(v.rfind(':').unwrap_or(v.len())),
    };
    let port_ok = match port.strip_prefix(':') {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()) && digits.parse::<u16>().is_ok_and(|p| p > 0),
        None => port.is_empty(),
    };
    port_ok && (v.starts_with('[') || is_host_name(host))
}

/// A DNS name (or IPv4 address) in lower case: dot-separated labels of letters, digits and
/// inner hyphens.
fn is_host_name(v: &str) -> bool {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    v.len() <= 253 && v.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toml::Value;

    /// The problems of the defaults with the integer at dotted `key` set to `v`.
    fn problems_with(key: &str, v: i64) -> Vec<String> {
        let mut table = super::super::raw::default_table();
        let (sections, last) = key.rsplit_once('.').map_or(("", key), |(s, l)| (s, l));
        let mut at = &mut table;
        for section in sections.split('.').filter(|s| !s.is_empty()) {
            at = at.get_mut(section).and_then(Value::as_table_mut).expect("section exists");
        }
        assert!(at.insert(last.to_string(), Value::Integer(v)).is_some(), "{key} exists");
        let raw: RawConfig = Value::Table(table).try_into().expect("deserializes");
        resolve(&raw, &Sources::new()).1
    }

    #[test]
    fn every_range_has_its_bounds() {
        let ranges = [
            ("workers", 0, 1024),
            ("shutdown_timeout_ms", 0, 3_600_000),
            ("limits.json_body_bytes", 1, 64 * MIB),
            ("limits.max_header_bytes", 1024, MIB),
            ("limits.header_timeout_ms", 100, 600_000),
            ("limits.body_timeout_ms", 100, 3_600_000),
            ("limits.keepalive_timeout_ms", 0, 3_600_000),
            ("limits.max_connections", 1, 1_000_000),
            ("db.pool_size", 1, 256),
            ("io.threads", 1, 256),
            ("auth.access_ttl_secs", 1, TEN_YEARS),
            ("auth.refresh_ttl_secs", 1, TEN_YEARS),
            ("auth.argon2_memory_kib", 8, 4 * MIB),
            ("auth.argon2_iterations", 1, 100),
            ("rate_limit.max", 1, MAX),
            ("rate_limit.window_secs", 1, TEN_YEARS),
            ("rate_limit.login_max_failures", 1, MAX),
            ("sse.heartbeat_ms", 100, TEN_YEARS * 1000),
            ("sse.retry_ms", 0, TEN_YEARS * 1000),
            ("sse.replay_limit", 0, 100_000),
            ("upstreams.timeout_ms", 1, 600_000),
            ("upstreams.cache_ttl_secs", 0, TEN_YEARS),
            ("upstreams.cache_entries", 0, MAX),
            ("chat.echo_delay_ms", 0, 60_000),
            ("websocket.max_message_bytes", 125, 64 * MIB),
            ("websocket.max_rooms_per_connection", 1, 10_000),
            ("supervisor.worker_max_rss_mb", 1, MIB),
            ("supervisor.memory_check_ms", 100, 3_600_000),
            ("supervisor.worker_timeout_ms", 100, 3_600_000),
            ("http2.max_concurrent_streams", 1, MAX_H2_STREAMS),
            ("http2.initial_window_size", 0, (1 << 31) - 1),
            ("http2.max_frame_size", 16_384, 16_777_215),
        ];
        for (key, lo, hi) in ranges {
            assert_eq!(problems_with(key, lo), Vec::<String>::new(), "{key} = {lo}");
            assert_eq!(problems_with(key, hi), Vec::<String>::new(), "{key} = {hi}");
            let below = problems_with(key, lo - 1);
            assert!(below.len() == 1 && below[0].starts_with(&format!("{key} = {}:", lo - 1)), "{below:?}");
            if hi != MAX {
                let above = problems_with(key, hi + 1);
                assert!(above.len() == 1 && above[0].starts_with(&format!("{key} = ")), "{above:?}");
            }
        }
    }

    #[test]
    fn origins_hosts_and_urls() {
        for ok in ["http://a.example", "https://A.Example:8443", "http://127.0.0.1:8080", "http://[::1]:80"] {
            assert!(is_origin(&ok.to_ascii_lowercase()), "{ok}");
        }
        for bad in [
            "*",
            "a.example",
            "https://a.example/",
            "https://a.example/x",
            "ftp://a.example",
            "https://",
            "https://a.example:0",
            "https://a.example:",
            "https://u@a.example",
            "http://[zz]:1",
            "https://a..example",
            "https://-a.example",
        ] {
            assert!(!is_origin(&bad.to_ascii_lowercase()), "{bad}");
        }
        assert!(is_host_name("cdn-1.a.example") && is_host_name("localhost"));
        assert!(!is_host_name("a.example:443") && !is_host_name("*.a.example") && !is_host_name(""));
        let sources = Sources::new();
        let mut c = Check { problems: Vec::new(), sources: &sources };
        assert_eq!(c.url("k", ""), None);
        assert_eq!(c.url("k", "https://api.example/v1/chat?x=1").as_deref(), Some("https://api.example/v1/chat?x=1"));
        assert_eq!(c.base_url("k", "http://u.example:9/").as_deref(), Some("http://u.example:9"));
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        c.url("k", "https://a.example bad");
        c.url("k", "http//a.example");
        assert_eq!(c.problems.len(), 2);
    }
}
