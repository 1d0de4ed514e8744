//! The one error type every layer returns, and the one place that maps it
//! to the contract's status codes and JSON envelope (CONTRACT §3).
//!
//! Protocol errors from the HTTP parser, routing errors and handler errors
//! all end up here; nothing else writes an error body. It must not log
//! (the caller logs with context) and must not know about sockets.

use std::borrow::Cow;

use crate::http::response::{Body, Response};

/// One bad field of a request body or query (the `errors` array of §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's name.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// Everything that can go wrong while answering a request.
#[derive(Debug)]
pub enum Error {
    /// 400: malformed request, bad parameter, unsupported version.
    BadRequest(Cow<'static, str>),
    /// 400 with per-field problems.
    BadParams(Vec<FieldError>),
    /// 401: no credential (`token required`), a bad one (`invalid token`) or
    /// failed login (`invalid credentials`); carries `WWW-Authenticate: Bearer`.
    Unauthorized(&'static str),
    /// 403: authenticated but not allowed; failed origin or CSRF check.
    Forbidden(&'static str),
    /// 404.
    NotFound,
    /// 409: e.g. a duplicate e-mail.
    Conflict(&'static str),
    /// 409 naming fields (a duplicate value of a unique field, a refused state transition).
    ConflictFields(Vec<FieldError>),
    /// 412: `If-Match` does not match.
    PreconditionFailed,
    /// 422: schema failure; every bad field listed.
    Validation(Vec<FieldError>),
    /// 426: a WebSocket upgrade with an unsupported version.
    UpgradeRequired,
    /// 429: over a rate limit; `Retry-After` seconds (and the limit's headers).
    TooManyRequests {
        /// Seconds until the window ends.
        retry_after: u64,
        /// The limit's state, for the `RateLimit-*` headers.
        decision: Option<crate::shm::ratelimit::Decision>,
    },
    /// 405; the value of the `Allow` header.
    MethodNotAllowed(&'static str),
    /// 408: the request head or body did not arrive in time.
    RequestTimeout,
    /// 413: the body is known to exceed its limit.
    PayloadTooLarge,
    /// 415: a body that is not of the expected media type; the message
    /// names the type(s) wanted (`Content-Type must be application/json`).
    UnsupportedMediaType(&'static str),
    /// 416: a `Range` outside the resource.
    RangeNotSatisfiable,
    /// 417: an `Expect` other than `100-continue`.
    ExpectationFailed,
    /// 431: the request head exceeds `limits.max_header_bytes`.
    HeaderTooLarge,
    /// 425: a request that is not safe to replay arrived in TLS 1.3 / QUIC early data
    /// (RFC 8470); the client retries it after the handshake.
    TooEarly,
    /// 503: draining or a dependency is down.
    ServiceUnavailable(&'static str),
    /// 502: an upstream refused, failed, or answered something unusable.
    UpstreamUnavailable(Cow<'static, str>),
    /// 504: an upstream did not answer within `upstreams.timeout_ms`.
    UpstreamTimeout,
    /// 500: a bug or an unexpected failure; the detail goes to the log and,
    /// in development only, into `stack`.
    Internal(String),
}

impl Error {
    /// A 400 with a fixed message.
    pub fn bad_request(msg: &'static str) -> Error {
        Error::BadRequest(Cow::Borrowed(msg))
    }

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            Error::BadRequest(_) | Error::BadParams(_) => 400,
            Error::Unauthorized(_) => 401,
            Error::Forbidden(_) => 403,
            Error::NotFound => 404,
            Error::Conflict(_) | Error::ConflictFields(_) => 409,
            Error::PreconditionFailed => 412,
            Error::Validation(_) => 422,
            Error::UpgradeRequired => 426,
            Error::TooManyRequests { .. } => 429,
            Error::MethodNotAllowed(_) => 405,
            Error::RequestTimeout => 408,
            Error::PayloadTooLarge => 413,
            Error::UnsupportedMediaType(_) => 415,
            Error::RangeNotSatisfiable => 416,
            Error::ExpectationFailed => 417,
            Error::HeaderTooLarge => 431,
            Error::TooEarly => 425,
            Error::ServiceUnavailable(_) => 503,
            Error::UpstreamUnavailable(_) => 502,
            Error::UpstreamTimeout => 504,
            Error::Internal(_) => 500,
        }
    }

    /// The contract's string code.
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadRequest(_) | Error::BadParams(_) => "BAD_REQUEST",
            Error::Unauthorized(_) => "UNAUTHORIZED",
            Error::Forbidden(_) => "FORBIDDEN",
            Error::NotFound => "NOT_FOUND",
            Error::Conflict(_) | Error::ConflictFields(_) => "CONFLICT",
            Error::PreconditionFailed => "PRECONDITION_FAILED",
            Error::Validation(_) => "VALIDATION_ERROR",
            Error::UpgradeRequired => "UPGRADE_REQUIRED",
            Error::TooManyRequests { .. } => "RATE_LIMITED",
            Error::MethodNotAllowed(_) => "METHOD_NOT_ALLOWED",
            Error::RequestTimeout => "REQUEST_TIMEOUT",
            Error::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Error::UnsupportedMediaType(_) => "UNSUPPORTED_MEDIA_TYPE",
            Error::RangeNotSatisfiable => "RANGE_NOT_SATISFIABLE",
            Error::ExpectationFailed => "EXPECTATION_FAILED",
            Error::HeaderTooLarge => "REQUEST_HEADER_FIELDS_TOO_LARGE",
            Error::TooEarly => "TOO_EARLY",
            Error::ServiceUnavailable(_) => "SERVICE_UNAVAILABLE",
            Error::UpstreamUnavailable(_) => "UPSTREAM_UNAVAILABLE",
            Error::UpstreamTimeout => "UPSTREAM_TIMEOUT",
            Error::Internal(_) => "INTERNAL_ERROR",
        }
    }

    fn message(&self) -> &str {
        match self {
            Error::BadRequest(m) => m,
            Error::BadParams(_) => "invalid query parameters",
            Error::Unauthorized(m) | Error::Forbidden(m) | Error::Conflict(m) | Error::UnsupportedMediaType(m) => m,
            Error::NotFound => "resource not found",
            Error::ConflictFields(_) => "conflict",
            Error::PreconditionFailed => "precondition failed",
            Error::Validation(_) => "validation failed",
            Error::UpgradeRequired => "WebSocket version 13 required",
            Error::TooManyRequests { .. } => "too many requests, try again later",
            Error::MethodNotAllowed(_) => "method not allowed",
            Error::RequestTimeout => "request timeout",
            Error::PayloadTooLarge => "payload too large",
            Error::RangeNotSatisfiable => "range not satisfiable",
            Error::ExpectationFailed => "expectation failed",
            Error::HeaderTooLarge => "request header fields too large",
            Error::TooEarly => "request sent in early data; retry after the handshake",
            Error::ServiceUnavailable(m) => m,
            Error::UpstreamUnavailable(m) => m,
            Error::UpstreamTimeout => "upstream timed out",
            Error::Internal(_) => "internal server error",
        }
    }

    /// Render the §3 error envelope. `stack` appears only when `development`.
    pub fn into_response(self, development: bool) -> Response {
        let mut body = serde_json::Map::new();
        body.insert("code".into(), self.code().into());
        body.insert("message".into(), self.message().into());
        if let Error::BadParams(errors) | Error::Validation(errors) | Error::ConflictFields(errors) = &self {
            let list = errors.iter().map(|e| serde_json::json!({"field": e.field, "message": e.message})).collect();
            body.insert("errors".into(), serde_json::Value::Array(list));
        }
        if let (Error::Internal(detail), true) = (&self, development) {
            body.insert("stack".into(), detail.as_str().into());
        }
        let bytes = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
        let mut resp = Response::new(self.status());
        resp.body = Body::Bytes(bytes);
        match self {
            Error::MethodNotAllowed(allow) => {
                resp.header("Allow", allow);
            }
            Error::Unauthorized(_) => {
                resp.header("WWW-Authenticate", "Bearer");
            }
            Error::UpgradeRequired => {
                resp.header("Sec-WebSocket-Version", "13");
            }
            Error::TooManyRequests { retry_after, .. } => {
                resp.header("Retry-After", retry_after.to_string());
            }
            _ => {}
        }
        resp
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Internal(d) => write!(f, "{}: {}", self.code(), d),
            _ => write!(f, "{}: {}", self.code(), self.message()),
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Error {
        use crate::store::StoreError;
        match e {
            StoreError::Duplicate("email") => Error::Conflict("email already registered"),
            StoreError::Duplicate(field) => Error::ConflictFields(vec![FieldError::new(field, "is already taken")]),
            StoreError::Unavailable(d) => {
                log::error!("database unavailable: {d}");
                Error::ServiceUnavailable("database unavailable")
            }
            StoreError::Sql(d) => Error::Internal(format!("database: {d}")),
        }
    }
}

impl From<crate::auth::AuthError> for Error {
    fn from(e: crate::auth::AuthError) -> Error {
        use crate::auth::AuthError;
        match e {
            AuthError::Invalid => Error::Unauthorized("invalid token"),
            AuthError::Hash(d) | AuthError::Secret(d) => Error::Internal(format!("auth: {d}")),
        }
    }
}

impl From<crate::proto::HandshakeError> for Error {
    /// A refused WebSocket handshake: 426 (with `Sec-WebSocket-Version: 13`) for the
    /// version, 400 naming what is wrong for the rest.
    fn from(e: crate::proto::HandshakeError) -> Error {
        match e {
            crate::proto::HandshakeError::Version => Error::UpgradeRequired,
            other => Error::bad_request(other.message()),
        }
    }
}

impl FieldError {
    /// A problem with `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(r: &Response) -> serde_json::Value {
        match &r.body {
            Body::Bytes(b) => serde_json::from_slice(b).expect("json"),
            _ => panic!("expected bytes"),
        }
    }

    #[test]
    fn envelope_has_code_and_message() {
        let r = Error::NotFound.into_response(false);
        assert_eq!(r.status, 404);
        assert_eq!(json(&r), serde_json::json!({"code": "NOT_FOUND", "message": "resource not found"}));
    }

    #[test]
    fn stack_only_in_development() {
        let dev = Error::Internal("boom at x.rs:1".into()).into_response(true);
        assert_eq!(json(&dev)["stack"], "boom at x.rs:1");
        let prod = Error::Internal("boom".into()).into_response(false);
        assert!(json(&prod).get("stack").is_none());
        assert_eq!(json(&prod)["message"], "internal server error");
    }

    #[test]
    fn method_not_allowed_carries_allow() {
        let r = Error::MethodNotAllowed("GET, HEAD").into_response(false);
        assert_eq!(r.status, 405);
        assert!(r.headers.iter().any(|(k, v)| *k == "Allow" && v == "GET, HEAD"));
    }
}
