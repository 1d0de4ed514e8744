//! The origin check and CORS (CONTRACT §5, §6).
//!
//! An unsafe method with an `Origin` that is neither `public_origin` nor in
//! `cors.origins` is refused (403): a browser on another site cannot make
//! this service act for a user. Allow-listed origins get the CORS headers on
//! every response and a 204 to their preflights; any other origin gets none.

use crate::config::Config;
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;

const ALLOW_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
const ALLOW_HEADERS: &str = "Authorization, Content-Type, X-CSRF-Token, X-Request-Id, Last-Event-ID";

fn origin<'a>(req: &Request<'a>) -> Option<&'a str> {
    req.header("origin").and_then(|o| std::str::from_utf8(o).ok())
}

/// The request's `Origin` when it is allow-listed for CORS.
pub fn allowed_origin<'a>(config: &Config, req: &Request<'a>) -> Option<&'a str> {
    origin(req).filter(|o| config.cors.origins.iter().any(|a| a.eq_ignore_ascii_case(o)))
}

/// Refuse an unsafe method from a foreign origin.
pub fn check_origin(config: &Config, req: &Request<'_>) -> Result<(), Error> {
    if req.method.is_safe() {
        return Ok(());
    }
    match origin(req) {
        None => Ok(()),
        Some(o) if o.eq_ignore_ascii_case(&config.public_origin) || allowed_origin(config, req).is_some() => Ok(()),
        Some(_) => Err(Error::Forbidden("origin not allowed")),
    }
}

/// Refuse a foreign `Origin` whatever the method (WebSocket upgrades are GETs
/// that a browser on any site could otherwise open with the user's cookies).
pub fn check_origin_always(config: &Config, req: &Request<'_>) -> Result<(), Error> {
    match origin(req) {
        Some(o) if !o.eq_ignore_ascii_case(&config.public_origin) && allowed_origin(config, req).is_none() => {
            Err(Error::Forbidden("origin not allowed"))
        }
        _ => Ok(()),
    }
}

/// Answer a CORS preflight from an allow-listed origin.
pub fn preflight(allowed: Option<&str>, req: &Request<'_>) -> Option<crate::app::Reply> {
    if req.method != Method::Options || allowed.is_none() || req.header("access-control-request-method").is_none() {
        return None;
    }
    let mut r = Response::new(204);
    r.header("Access-Control-Allow-Methods", ALLOW_METHODS)
        .header("Access-Control-Allow-Headers", ALLOW_HEADERS)
        .header("Access-Control-Max-Age", "600");
    Some(crate::app::Reply::Now(r))
}

/// Add the CORS response headers for an allow-listed `origin`.
pub fn decorate(r: &mut Response, origin: &str) {
    r.header("Access-Control-Allow-Origin", origin.to_owned())
        .header("Access-Control-Allow-Credentials", "true")
        .header("Vary", "Origin");
}
