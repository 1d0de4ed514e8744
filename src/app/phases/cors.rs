//! The origin check and CORS (CONTRACT §5, §6).
//!
//! An unsafe method with an `Origin` that is neither `public_origin` nor in
//! `cors.origins` is refused (403): a browser on another site cannot make
//! this service act for a user. So is one with more than one `Origin` line
//! (RFC 6454 allows one), whatever they say: judging only the first would
//! let a second, foreign one through to anything that reads another. Allow-listed origins get the CORS headers on
//! every response and a 204 to their preflights; any other origin gets none.

use crate::config::Config;
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;

const ALLOW_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
const ALLOW_HEADERS: &str = "Authorization, Content-Type, X-CSRF-Token, X-Request-Id, Last-Event-ID";

/// What the request's `Origin` lines say.
enum Origin<'a> {
    /// No `Origin` line (not a browser, or a same-origin GET).
    Absent,
    /// Exactly one line.
    One(&'a [u8]),
    /// More than one line: refused, whatever they hold.
    Several,
}

fn origin<'a>(req: &Request<'a>) -> Origin<'a> {
    let mut lines = req.headers.get_all("origin");
    match (lines.next(), lines.next()) {
        (None, _) => Origin::Absent,
        (Some(v), None) => Origin::One(v),
        (Some(_), Some(_)) => Origin::Several,
    }
}

/// Whether `o` may act here: `public_origin` or an allow-listed origin.
fn trusted(config: &Config, o: &[u8]) -> bool {
    o.eq_ignore_ascii_case(config.public_origin.as_bytes()) || listed(config, o)
}

fn listed(config: &Config, o: &[u8]) -> bool {
    config.cors.origins.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(o))
}

/// The request's `Origin` when it is allow-listed for CORS (one line only).
pub fn allowed_origin<'a>(config: &Config, req: &Request<'a>) -> Option<&'a str> {
    match origin(req) {
        Origin::One(o) if listed(config, o) => std::str::from_utf8(o).ok(),
        _ => None,
    }
}

/// Refuse an unsafe method from a foreign origin or with several `Origin` lines.
pub fn check_origin(config: &Config, req: &Request<'_>) -> Result<(), Error> {
    if req.method.is_safe() {
        return Ok(());
    }
    check_origin_always(config, req)
}

/// Refuse a foreign `Origin`, or several `Origin` lines, whatever the method
/// (WebSocket upgrades are GETs that a browser on any site could otherwise
/// open with the user's cookies).
pub fn check_origin_always(config: &Config, req: &Request<'_>) -> Result<(), Error> {
    match origin(req) {
        Origin::Absent => Ok(()),
        Origin::One(o) if trusted(config, o) => Ok(()),
        Origin::One(_) => Err(Error::Forbidden("origin not allowed")),
        Origin::Several => Err(Error::Forbidden("more than one Origin")),
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
    Some(crate::app::Reply::full(r))
}

/// Add the CORS response headers for an allow-listed `origin`.
pub fn decorate(r: &mut Response, origin: &str) {
    r.header("Access-Control-Allow-Origin", crate::http::response::Value::display(origin))
        .header("Access-Control-Allow-Credentials", "true")
        .header("Vary", "Origin");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(method: Method, origins: &[&str]) -> Result<(), u16> {
        let config = crate::config::load(None, &[]).expect("the defaults are valid");
        let headers: Vec<httparse::Header<'_>> =
            origins.iter().map(|o| httparse::Header { name: "Origin", value: o.as_bytes() }).collect();
        let req = Request {
            method,
            path: "/api/v1/users",
            query: "",
            http10: false,
            headers: crate::http::fields::Fields::new(&headers),
            body: b"",
            request_id: "t",
            peer: std::net::IpAddr::from([127, 0, 0, 1]),
            secure: false,
        };
        check_origin(&config, &req).map_err(|e| e.status())
    }

    #[test]
    fn one_trusted_origin_line_or_none() {
        let own = "http://127.0.0.1:8080";
        assert_eq!(check(Method::Post, &[]), Ok(()));
        assert_eq!(check(Method::Post, &[own]), Ok(()));
        assert_eq!(check(Method::Post, &["http://evil.example"]), Err(403));
        assert_eq!(check(Method::Post, &[own, "http://evil.example"]), Err(403));
        assert_eq!(check(Method::Delete, &[own, own]), Err(403));
        assert_eq!(check(Method::Get, &[own, "http://evil.example"]), Ok(()), "safe methods are not checked");
    }
}
