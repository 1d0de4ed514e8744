//! Who is asking: bearer tokens, cookies and the CSRF double submit (§5).
//!
//! Verifying an HS256 token is a few microseconds of HMAC, so it runs on
//! the event loop; anything touching the database or a password hash is a
//! pool job in the handlers.

use crate::auth::jwt::Claims;
use crate::auth::tokens::constant_time_eq;
use crate::config::Config;
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::Response;

use super::App;

/// The verified caller.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// User id from the token.
    pub user_id: i64,
    /// Role from the token.
    pub admin: bool,
}

impl From<Claims> for Caller {
    fn from(c: Claims) -> Caller {
        Caller { user_id: c.user_id, admin: c.role == "admin" }
    }
}

/// Require a valid bearer token: 401 `token required` / `invalid token`.
pub fn require(app: &App, req: &Request<'_>) -> Result<Caller, Error> {
    optional(app, req)?.ok_or(Error::Unauthorized("token required"))
}

/// A valid bearer token if one is sent; a bad one is still 401.
pub fn optional(app: &App, req: &Request<'_>) -> Result<Option<Caller>, Error> {
    let Some(value) = req.header("authorization") else { return Ok(None) };
    let token = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .and_then(|t| std::str::from_utf8(t).ok())
        .ok_or(Error::Unauthorized("invalid token"))?;
    Ok(Some(app.svc.jwt.verify(token)?.into()))
}

/// The value of cookie `name`.
pub fn cookie<'a>(req: &Request<'a>, name: &str) -> Option<&'a str> {
    req.headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
        .filter_map(|h| std::str::from_utf8(h.value).ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The CSRF double submit: `X-CSRF-Token` must equal the `csrf_token` cookie.
pub fn check_csrf(req: &Request<'_>) -> Result<(), Error> {
    let header = req.header("x-csrf-token").unwrap_or(b"");
    let cookie = cookie(req, "csrf_token").unwrap_or("");
    if header.is_empty() || cookie.is_empty() || !constant_time_eq(header, cookie.as_bytes()) {
        return Err(Error::Forbidden("CSRF token missing or invalid"));
    }
    Ok(())
}

/// Set the refresh and CSRF cookies (login, refresh).
pub fn set_cookies(r: &mut Response, config: &Config, refresh: &str, csrf: &str) {
    let secure = if config.auth.cookie_secure { "; Secure" } else { "" };
    let age = config.auth.refresh_ttl.as_secs();
    r.header(
        "Set-Cookie",
        format!("refresh_token={refresh}; HttpOnly{secure}; SameSite=Strict; Path=/api/v1/auth; Max-Age={age}"),
    );
    r.header("Set-Cookie", format!("csrf_token={csrf}{secure}; SameSite=Strict; Path=/; Max-Age={age}"));
}

/// Clear both cookies (same Path, `Max-Age=0`).
pub fn clear_cookies(r: &mut Response, config: &Config) {
    let secure = if config.auth.cookie_secure { "; Secure" } else { "" };
    r.header("Set-Cookie", format!("refresh_token=; HttpOnly{secure}; SameSite=Strict; Path=/api/v1/auth; Max-Age=0"));
    r.header("Set-Cookie", format!("csrf_token={secure}; SameSite=Strict; Path=/; Max-Age=0"));
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
