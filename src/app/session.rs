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

/// Access tokens already verified by this worker: token → (caller, `exp`).
///
/// Verifying an HS256 token (base64, JSON, HMAC) costs several microseconds;
/// a client sends the same token with every request until it expires. The
/// answer for a given token string never changes under one signing secret
/// (a reload starts new workers with an empty map), so remembering it is
/// exact, not an approximation: `exp` is still checked on every use. Bounded:
/// emptied when it reaches [`VERIFIED_MAX`] entries. Failures are not kept.
#[derive(Default)]
pub struct Verified(std::collections::HashMap<Box<str>, (Caller, u64)>);

/// Entries [`Verified`] holds before it starts over.
const VERIFIED_MAX: usize = 4096;

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
    let now = crate::auth::jwt::now_unix();
    if let Some(&(caller, exp)) = app.verified.borrow().0.get(token) {
        if exp > now {
            return Ok(Some(caller));
        }
    }
    let claims = app.svc.jwt.verify(token)?;
    let exp = claims.exp;
    let caller = Caller::from(claims);
    let mut verified = app.verified.borrow_mut();
    if verified.0.len() >= VERIFIED_MAX {
        verified.0.clear();
    }
    verified.0.insert(token.into(), (caller, exp));
    Ok(Some(caller))
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
