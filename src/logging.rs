//! Log set-up (env_logger) and the access-log line.
//!
//! `log_format = "text"` writes `time LEVEL target: message`;
//! `log_format = "json"` writes one JSON object per line. The access line
//! (target `access`, level info) carries method, path (with secret query
//! values such as `token` written `REDACTED`), status, body bytes, duration,
//! request id and worker pid. `RUST_LOG` filters as usual (default `info`).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::LogFormat;
use crate::http::conn::Finished;

static JSON: AtomicBool = AtomicBool::new(false);

/// Query keys whose values never reach a log.
const SECRET_KEYS: &[&str] =
    &["token", "access_token", "refresh_token", "password", "secret", "api_key", "apikey", "code"];

/// Initialise the global logger (once, in the supervisor before forking).
pub fn init(format: LogFormat) {
    let json = matches!(format, LogFormat::Json);
    JSON.store(json, Ordering::Relaxed);
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    b.format(move |buf, rec| {
        let ts = buf.timestamp_millis();
        if json {
            let level = rec.level().as_str();
            if rec.target() == "access" {
                writeln!(buf, "{{\"ts\":\"{ts}\",\"level\":\"{level}\",\"target\":\"access\",{}}}", rec.args())
            } else {
                let msg = serde_json::to_string(&rec.args().to_string()).unwrap_or_default();
                let target = serde_json::to_string(rec.target()).unwrap_or_default();
                writeln!(
                    buf,
                    "{{\"ts\":\"{ts}\",\"level\":\"{level}\",\"target\":{target},\"pid\":{},\"msg\":{msg}}}",
                    std::process::id()
                )
            }
        } else {
            writeln!(buf, "{ts} {:<5} {}: {}", rec.level(), rec.target(), rec.args())
        }
    });
    // A dependency that logs what its peers send would let any client write
    // to the log: rustls warns once per ClientHello that names an IP address
    // in SNI (wrk and OpenSSL clients do), 257 lines in one load test. Their
    // records below error are dropped unless `RUST_LOG` names the crate.
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    for krate in QUIET_CRATES {
        if !asked.contains(krate) {
            b.filter_module(krate, log::LevelFilter::Error);
        }
    }
    let _ = b.try_init();
}

/// Crates whose warnings a client can cause (see [`init`]).
const QUIET_CRATES: &[&str] = &["rustls"];

/// Write the access-log line for one exchange.
pub fn access(done: &Finished<'_>) {
    if !log::log_enabled!(target: "access", log::Level::Info) {
        return;
    }
    let raw = String::from_utf8_lossy(done.target);
    let target = redact(&raw);
    let rid = String::from_utf8_lossy(done.request_id);
    let ms = done.elapsed.as_secs_f64() * 1000.0;
    let pid = std::process::id();
    if JSON.load(Ordering::Relaxed) {
        let path = serde_json::to_string(&target).unwrap_or_default();
        let rid = serde_json::to_string(&rid).unwrap_or_default();
        log::info!(target: "access",
            "\"method\":\"{}\",\"path\":{path},\"status\":{},\"bytes\":{},\"durationMs\":{ms:.3},\"requestId\":{rid},\"pid\":{pid}",
            done.method, done.status, done.bytes);
    } else {
        log::info!(target: "access", "{} {} {} {}B {ms:.3}ms id={rid} pid={pid}", done.method, target, done.status, done.bytes);
    }
}

/// Replace the values of secret query parameters with `REDACTED`.
pub fn redact(target: &str) -> std::borrow::Cow<'_, str> {
    let Some((path, query)) = target.split_once('?') else { return target.into() };
    let secret = |k: &str| SECRET_KEYS.iter().any(|s| s.eq_ignore_ascii_case(k));
    if !query.split('&').any(|p| secret(p.split_once('=').map_or(p, |kv| kv.0))) {
        return target.into();
    }
    let parts: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if secret(k) => format!("{k}=REDACTED"),
            _ => p.to_string(),
        })
        .collect();
    format!("{path}?{}", parts.join("&")).into()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_secret_values_only() {
        assert_eq!(redact("/ws?token=abc&room=1"), "/ws?token=REDACTED&room=1");
        assert_eq!(redact("/x?a=1"), "/x?a=1");
        assert_eq!(redact("/x?TOKEN=s"), "/x?TOKEN=REDACTED");
        assert_eq!(redact("/x"), "/x");
    }
}
