//! `/health`, `/health/ready` and `/api/config` (CONTRACT §6).

use crate::app::{App, Ctx, Reply};
use crate::config::Config;
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::Response;

/// `GET /health`: cheap, touches nothing.
pub fn health(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::full(Response::static_json(b"{\"status\":\"ok\"}")))
}

/// `GET /health/ready`: 503 while draining or when the database does not answer.
pub fn ready(app: &App, _: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    if ctx.draining {
        return Err(Error::ServiceUnavailable("draining"));
    }
    let store = app.svc.store;
    Ok(ctx.later(move || {
        store.ping().map_err(|_| Error::ServiceUnavailable("database unavailable"))?;
        Ok(Response::static_json(b"{\"status\":\"ok\"}"))
    }))
}

/// `GET /api/config`: public client settings, cacheable, with a strong ETag.
pub fn client_config(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::full(app.fixed.client_config.answer(
        (app.svc.config, &app.fixed.forms),
        req,
        "application/json",
        "public, max-age=3600",
    )))
}

fn strip_weak(t: &[u8]) -> &[u8] {
    t.strip_prefix(b"W/").unwrap_or(t)
}

/// Whether an `If-None-Match` value matches `etag` (weak comparison, RFC 9110 §13.1.2), in
/// any content coding's form of it (`"abc-gzip"` matches `"abc"`).
pub fn etag_matches(header: &[u8], etag: &[u8]) -> bool {
    let want = strip_weak(etag);
    header.split(|&c| c == b',').map(|t| t.trim_ascii()).any(|t| {
        let t = strip_weak(t);
        t == b"*" || t == want || crate::app::phases::compress::is_coded_form(t, want)
    })
}

/// The `/api/config` body, rendered once per configuration (`app::fixed`).
pub fn render_client_config(c: &Config) -> Vec<u8> {
    let data = serde_json::json!({
        "environment": if c.is_development() { "development" } else { "production" },
        "version": env!("CARGO_PKG_VERSION"),
        "publicOrigin": c.public_origin,
        "apiBase": "/api/v1",
        "limits": { "jsonBodyBytes": c.limits.json_body_bytes },
        "sse": { "path": "/api/events", "retryMs": c.sse.retry.as_millis() as u64 },
        "websocket": { "path": "/ws", "maxMessageBytes": c.websocket.max_message_bytes },
        "auth": { "accessTtlSecs": c.auth.access_ttl.as_secs() },
    });
    serde_json::to_vec(&serde_json::json!({"code": 200, "message": "OK", "data": data})).unwrap_or_default()
}

/// 64-bit FNV-1a: a stable content hash for ETags (not a security boundary).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_lists_weak_and_star() {
        assert!(etag_matches(b"\"a\"", b"\"a\""));
        assert!(etag_matches(b"\"x\", W/\"a\"", b"\"a\""));
        assert!(etag_matches(b"*", b"\"a\""));
        assert!(!etag_matches(b"\"b\"", b"\"a\""));
    }
}
