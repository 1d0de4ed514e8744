//! API versioning (CONTRACT §5): `/api/v1/…` is version 1; `/api/…` takes
//! the version from `?version=N` or `Accept: application/vnd.forkd+json;
//! version=N` (default 1). Any version but 1 is 400. The declared resources are versioned
//! resources too.

use crate::error::Error;
use crate::http::request::Request;
use crate::resources::Registry;

/// The built-in versioned resources reachable without `/v1`.
const RESOURCES: &[&str] = &["users", "auth", "notifications"];

/// Reject an unsupported version on an unversioned resource path (a built-in one or one of
/// `declared`).
pub fn check(req: &Request<'_>, declared: &Registry) -> Result<(), Error> {
    let Some(rest) = req.path.strip_prefix("/api/") else { return Ok(()) };
    let first = rest.split('/').next().unwrap_or("");
    if !RESOURCES.contains(&first) && declared.get(first).is_none() {
        return Ok(());
    }
    if let Some(v) = req.query_param("version") {
        if v != "1" {
            return Err(Error::bad_request("unsupported API version"));
        }
    }
    if let Some(accept) = req.header("accept") {
        for media in accept.split(|&c| c == b',') {
            let mut parts = media.split(|&c| c == b';').map(<[u8]>::trim_ascii);
            if !parts.next().is_some_and(|m| m.eq_ignore_ascii_case(b"application/vnd.forkd+json")) {
                continue;
            }
            for p in parts {
                if let Some(v) = p.strip_prefix(b"version=") {
                    if v != b"1" {
                        return Err(Error::bad_request("unsupported API version"));
                    }
                }
            }
        }
    }
    Ok(())
}
