//! Log set-up (env_logger) and the access-log line.
//!
//! `log_format = "text"` writes `time LEVEL target: message`;
//! `log_format = "json"` writes one JSON object per line. The access line
//! (target `access`, level info) carries method, path (with secret query
//! values such as `token` written `REDACTED`), status, body bytes, duration,
//! request id, the client's address when the caller knows it (`client=` / `"client"`: the
//! one `crate::http::client` decided), the protocol (`HTTP/1.1`, `HTTP/2.0`, `HTTP/3.0`), the
//! TLS version (none over plain TCP), the `User-Agent` and `Referer` when the request had them
//! (cut at [`FIELD_MAX`] bytes; quoted and escaped, so no value can end the line or a field),
//! and worker pid. `RUST_LOG` filters as usual (default `info`).
//!
//! Access lines are not written one by one: [`access`] appends the line to a buffer of the
//! calling thread (the worker's loop), and the loop writes the buffer once per turn
//! ([`flush_access`]), one `write` for every request of the turn. Any other record written
//! on that thread takes the pending access lines with it, in front of itself, so the log
//! stays in order; the worker flushes on its way out, so nothing is lost on a stop.

use std::cell::RefCell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;
use crate::http::service::Finished;

static JSON: AtomicBool = AtomicBool::new(false);

/// Query keys whose values never reach a log.
const SECRET_KEYS: &[&str] =
    &["token", "access_token", "refresh_token", "password", "secret", "api_key", "apikey", "code"];

/// The most bytes of a `User-Agent` or `Referer` value an access line carries; the rest is
/// dropped.
pub const FIELD_MAX: usize = 512;

/// `value` cut at [`FIELD_MAX`] bytes.
pub fn capped(value: &[u8]) -> &[u8] {
    &value[..value.len().min(FIELD_MAX)]
}

/// Initialise the global logger (once, in the supervisor before forking).
pub fn init(format: LogFormat) {
    let json = matches!(format, LogFormat::Json);
    JSON.store(json, Ordering::Relaxed);
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    b.format(move |buf, rec| {
        // Access lines still pending on this thread go first, in the same write.
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            if !p.buf.is_empty() {
                let r = buf.write_all(&p.buf);
                p.buf.clear();
                r
            } else {
                Ok(())
            }
        })?;
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

/// A thread's access lines not yet written, and the formatted second of the last one.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// `(unix second, "YYYY-MM-DDTHH:MM:SS", process id)`: the timestamp is formatted, and
    /// the process id (a system call) read, once per second. Only workers write access
    /// lines, so no process inherits another's across `fork`.
    second: (u64, [u8; 19], u32),
}

thread_local! {
    static PENDING: RefCell<Pending> = RefCell::new(Pending::default());
}

/// Above this, the buffer is written at once rather than at the end of the turn.
const PENDING_MAX: usize = 64 * 1024;

/// Whether access lines are written (the `access` target at `info`): when not, nothing
/// an access line quotes needs keeping.
pub fn access_on() -> bool {
    log::log_enabled!(target: "access", log::Level::Info)
}

/// Queue the access-log line for one exchange (written by [`flush_access`], or by the next
/// other record of this thread, whichever comes first).
pub fn access(done: &Finished<'_>) {
    if !access_on() {
        return;
    }
    let full = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let Pending { buf, second } = &mut *p;
        write_access(buf, second, done, SystemTime::now(), JSON.load(Ordering::Relaxed));
        buf.len() >= PENDING_MAX
    });
    if full {
        flush_access();
    }
}

/// Write this thread's pending access lines to stderr in one call (the worker's loop, once
/// per turn and on its way out).
pub fn flush_access() {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if p.buf.is_empty() {
            return;
        }
        // As env_logger does: a log that cannot be written is not an error of the request.
        let _ = std::io::stderr().lock().write_all(&p.buf);
        p.buf.clear();
        if p.buf.capacity() > 4 * PENDING_MAX {
            p.buf.shrink_to(PENDING_MAX);
        }
    });
}

/// Append one access line, framed as env_logger frames a record (the same timestamp, level
/// and target), to `out`; after the request id: `done.client` (the decided client's address)
/// when known, the protocol, the TLS version over TLS, and the user agent and referer when
/// the request had them.
fn write_access(
    out: &mut Vec<u8>,
    second: &mut (u64, [u8; 19], u32),
    done: &Finished<'_>,
    now: SystemTime,
    json: bool,
) {
    let client = done.client;
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    if second.0 != secs || second.1[0] == 0 {
        *second = (secs, rfc3339_seconds(secs), std::process::id());
    }
    let ts = std::str::from_utf8(&second.1).unwrap_or("1970-01-01T00:00:00");
    let millis = since.subsec_millis();
    let raw = String::from_utf8_lossy(done.target);
    let target = redact(&raw);
    let rid = String::from_utf8_lossy(done.request_id);
    let ms = done.elapsed.as_secs_f64() * 1000.0;
    let pid = second.2;
    // Writing to a Vec cannot fail.
    if json {
        let _ = write!(
            out,
            "{{\"ts\":\"{ts}.{millis:03}Z\",\"level\":\"INFO\",\"target\":\"access\",\"method\":\"{}\",\"path\":",
            done.method
        );
        let _ = serde_json::to_writer(&mut *out, &*target);
        let _ =
            write!(out, ",\"status\":{},\"bytes\":{},\"durationMs\":{ms:.3},\"requestId\":", done.status, done.bytes);
        let _ = serde_json::to_writer(&mut *out, &*rid);
        if let Some(ip) = client {
            let _ = write!(out, ",\"client\":\"{ip}\"");
        }
        let _ = write!(out, ",\"protocol\":\"{}\"", done.protocol.as_str());
        if let Some(tls) = done.tls {
            let _ = write!(out, ",\"tls\":\"{tls}\"");
        }
        for (key, value) in [("userAgent", done.user_agent), ("referer", done.referer)] {
            if let Some(v) = value {
                let _ = write!(out, ",\"{key}\":");
                let _ = serde_json::to_writer(&mut *out, &*json_text(capped(v)));
            }
        }
        let _ = writeln!(out, ",\"pid\":{pid}}}");
    } else {
        let _ = write!(
            out,
            "{ts}.{millis:03}Z INFO  access: {} {} {} {}B {ms:.3}ms id={rid}",
            done.method, target, done.status, done.bytes
        );
        if let Some(ip) = client {
            let _ = write!(out, " client={ip}");
        }
        let _ = write!(out, " protocol={}", done.protocol.as_str());
        if let Some(tls) = done.tls {
            let _ = write!(out, " tls={tls}");
        }
        for (key, value) in [("ua", done.user_agent), ("referer", done.referer)] {
            if let Some(v) = value {
                let _ = write!(out, " {key}=");
                quote(out, capped(v));
            }
        }
        let _ = writeln!(out, " pid={pid}");
    }
}

/// `value` in double quotes as nginx escapes a log variable: `"` and `\` after a `\`, every
/// byte outside printable ASCII (control bytes, CR, LF, DEL, UTF-8) as `\xHH`. The result
/// is one field: it holds no unescaped quote, no line break and no byte a terminal acts on.
fn quote(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'"');
    for &b in value {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\x{b:02X}");
            }
        }
    }
    out.push(b'"');
}

/// `value` as text for a JSON string: as is when it is UTF-8 (cut before a character that
/// [`FIELD_MAX`] split), with U+FFFD for each invalid sequence otherwise.
fn json_text(value: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(value) {
        Ok(s) => s.into(),
        Err(e) if e.error_len().is_none() => String::from_utf8_lossy(&value[..e.valid_up_to()]),
        Err(_) => String::from_utf8_lossy(value),
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of a Unix second.
fn rfc3339_seconds(secs: u64) -> [u8; 19] {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let mut out = [0u8; 19];
    let mut w = &mut out[..];
    let _ = write!(w, "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    out
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
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
    use super::*;
    use crate::http::service::Protocol;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(&rfc3339_seconds(0), b"1970-01-01T00:00:00");
        // 2000-02-29 (a leap day of a century leap year) and the last second of 2026.
        assert_eq!(&rfc3339_seconds(951_782_400 + 3_661), b"2000-02-29T01:01:01");
        assert_eq!(&rfc3339_seconds(1_798_761_599), b"2026-12-31T23:59:59");
    }

    #[test]
    fn access_lines_are_framed_like_other_records_and_json_is_valid() {
        let done = Finished {
            method: "GET",
            target: b"/ws?token=abc&room=\"1\"",
            status: 101,
            bytes: 0,
            elapsed: Duration::from_micros(1500),
            request_id: b"id-\"7\"",
            label: 0,
            client: None,
            protocol: Protocol::Http11,
            tls: None,
            user_agent: None,
            referer: None,
        };
        let at = UNIX_EPOCH + Duration::from_millis(1_798_761_599_042);
        let (mut out, mut second) = (Vec::new(), (0, [0; 19], 0));
        write_access(&mut out, &mut second, &done, at, false);
        assert_eq!(
            String::from_utf8_lossy(&out),
            format!(
                "2026-12-31T23:59:59.042Z INFO  access: GET /ws?token=REDACTED&room=\"1\" 101 0B 1.500ms id=id-\"7\" protocol=HTTP/1.1 pid={}\n",
                std::process::id()
            )
        );
        out.clear();
        write_access(&mut out, &mut second, &done, at, true);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object");
        assert_eq!(v["ts"], "2026-12-31T23:59:59.042Z");
        assert_eq!(v["path"], "/ws?token=REDACTED&room=\"1\"");
        assert_eq!(v["requestId"], "id-\"7\"");
        assert_eq!(
            (v["status"].as_u64(), v["level"].as_str(), v["target"].as_str()),
            (Some(101), Some("INFO"), Some("access"))
        );
        assert!(out.ends_with(b"}\n"));
        assert_eq!(v.get("client"), None, "no client known: no key");
        assert_eq!(v["protocol"], "HTTP/1.1");
        assert_eq!((v.get("tls"), v.get("userAgent"), v.get("referer")), (None, None, None), "plain, no fields");
    }

    #[test]
    fn a_known_client_is_on_the_line_in_both_formats() {
        let done = Finished {
            method: "GET",
            target: b"/api/config",
            status: 200,
            bytes: 12,
            elapsed: Duration::from_millis(2),
            request_id: b"r1",
            label: 0,
            client: Some("2001:db8::17".parse().expect("literal")),
            protocol: Protocol::Http2,
            tls: Some("TLSv1.3"),
            user_agent: None,
            referer: None,
        };
        let at = UNIX_EPOCH + Duration::from_secs(1_798_761_599);
        let (mut out, mut second) = (Vec::new(), (0, [0; 19], 0));
        write_access(&mut out, &mut second, &done, at, false);
        let line = String::from_utf8_lossy(&out);
        let want = format!(" id=r1 client=2001:db8::17 protocol=HTTP/2.0 tls=TLSv1.3 pid={}\n", std::process::id());
        assert!(line.ends_with(&want), "{line}");
        out.clear();
        write_access(&mut out, &mut second, &done, at, true);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object");
        assert_eq!(v["client"], "2001:db8::17");
        assert_eq!((v["protocol"].as_str(), v["tls"].as_str()), (Some("HTTP/2.0"), Some("TLSv1.3")));
    }

    /// The access line of a request with `agent` and `referer`, in text or JSON.
    fn line_with(agent: &[u8], referer: &[u8], json: bool) -> Vec<u8> {
        let done = Finished {
            method: "GET",
            target: b"/",
            status: 200,
            bytes: 1,
            elapsed: Duration::from_millis(1),
            request_id: b"r2",
            label: 0,
            client: None,
            protocol: Protocol::Http3,
            tls: Some("TLSv1.3"),
            user_agent: Some(agent),
            referer: Some(referer),
        };
        let (mut out, mut second) = (Vec::new(), (0, [0; 19], 0));
        write_access(&mut out, &mut second, &done, UNIX_EPOCH, json);
        out
    }

    #[test]
    fn user_agent_and_referer_are_quoted_fields_in_text() {
        let out = line_with(b"curl/8.5.0", b"https://a.example/p?q=1", false);
        let line = String::from_utf8_lossy(&out);
        let want = format!(
            " id=r2 protocol=HTTP/3.0 tls=TLSv1.3 ua=\"curl/8.5.0\" referer=\"https://a.example/p?q=1\" pid={}\n",
            std::process::id()
        );
        assert!(line.ends_with(&want), "{line}");
    }

    #[test]
    fn a_hostile_user_agent_cannot_forge_a_line_or_a_field() {
        let hostile =
            b"x\" pid=1 status=500\r\n2026-01-01T00:00:00.000Z INFO  access: GET /admin 200\x1b[2J\x00\\\x7f\xc3\xa9";
        let out = line_with(hostile, b"\"", false);
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        assert!(out.ends_with(b"\n") && !out.contains(&b'\r') && out.iter().all(|b| *b >= 0x20 || *b == b'\n'));
        let line = String::from_utf8_lossy(&out);
        let want = r#" ua="x\" pid=1 status=500\x0D\x0A2026-01-01T00:00:00.000Z INFO  access: GET /admin 200\x1B[2J\x00\\\x7F\xC3\xA9" referer="\"" pid="#;
        assert!(line.contains(want), "{line}");
        // JSON: the same bytes are one string value each.
        let out = line_with(hostile, b"\"", true);
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object");
        let agent = v["userAgent"].as_str().unwrap_or_default();
        assert!(agent.starts_with("x\" pid=1 status=500\r\n2026") && agent.ends_with("\\\u{7f}é"), "{agent:?}");
        assert_eq!((v["referer"].as_str(), v["pid"].as_u64()), (Some("\""), Some(u64::from(std::process::id()))));
    }

    #[test]
    fn long_values_are_cut_at_the_cap() {
        let long = "é".repeat(FIELD_MAX); // 2 bytes each: the cap falls between characters
        let out = line_with(long.as_bytes(), &[b'r'; 2 * FIELD_MAX], true);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object");
        assert_eq!(v["userAgent"].as_str().map(str::len), Some(FIELD_MAX));
        assert_eq!(v["referer"].as_str().map(str::len), Some(FIELD_MAX));
        let mut odd = vec![b'a'];
        odd.extend_from_slice(long.as_bytes());
        let out = line_with(&odd, b"", true);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object");
        assert_eq!(v["userAgent"].as_str().map(str::len), Some(FIELD_MAX - 1), "a split character is dropped whole");
        let out = line_with(&[b'"'; 2 * FIELD_MAX], b"", false);
        let line = String::from_utf8_lossy(&out);
        assert!(line.contains(&format!(" ua=\"{}\" ", "\\\"".repeat(FIELD_MAX))), "{line}");
    }

    #[test]
    fn redacts_secret_values_only() {
        assert_eq!(redact("/ws?token=abc&room=1"), "/ws?token=REDACTED&room=1");
        assert_eq!(redact("/x?a=1"), "/x?a=1");
        assert_eq!(redact("/x?TOKEN=s"), "/x?TOKEN=REDACTED");
        assert_eq!(redact("/x"), "/x");
    }
}
