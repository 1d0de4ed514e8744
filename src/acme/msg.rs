//! The ACME documents forkd reads (RFC 8555 §7.1: directory, order, authorization, challenge,
//! problem) and the one error type of the ACME client, [`AcmeError`], with the CA's problem
//! documents (`application/problem+json`) mapped to [`ProblemKind`] in one place.
//!
//! Pure parsing: it must not touch sockets or files.

use serde::Deserialize;

/// The directory: the URLs of the resources forkd uses.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Directory {
    /// Where a fresh nonce is fetched (HEAD).
    pub new_nonce: String,
    /// Where the account is created (or found, for the same key).
    pub new_account: String,
    /// Where an order is placed.
    pub new_order: String,
}

/// An order (RFC 8555 §7.1.3).
#[derive(Debug, Deserialize, PartialEq)]
pub struct Order {
    /// `pending`, `ready`, `processing`, `valid` or `invalid`.
    pub status: String,
    /// One authorization per identifier.
    #[serde(default)]
    pub authorizations: Vec<String>,
    /// Where the CSR goes once the order is `ready`.
    pub finalize: String,
    /// The certificate chain, once `valid`.
    pub certificate: Option<String>,
    /// Why it is `invalid`.
    pub error: Option<Problem>,
}

/// An authorization of one identifier (RFC 8555 §7.1.4).
#[derive(Debug, Deserialize, PartialEq)]
pub struct Authorization {
    /// `pending`, `valid`, `invalid`, `deactivated`, `expired` or `revoked`.
    pub status: String,
    /// The name it authorizes.
    pub identifier: Identifier,
    /// The ways it may be proved.
    #[serde(default)]
    pub challenges: Vec<Challenge>,
}

/// An identifier of an order or authorization.
#[derive(Debug, Deserialize, PartialEq)]
pub struct Identifier {
    /// `dns`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The name.
    pub value: String,
}

/// One challenge of an authorization (RFC 8555 §7.1.5).
#[derive(Debug, Deserialize, PartialEq)]
pub struct Challenge {
    /// `http-01`, `tls-alpn-01`, `dns-01`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Where the answer is posted.
    pub url: String,
    /// `pending`, `processing`, `valid` or `invalid`.
    pub status: String,
    /// The token the key authorization is made of.
    #[serde(default)]
    pub token: String,
    /// Why it is `invalid`.
    pub error: Option<Problem>,
}

/// A problem document (RFC 7807) as the CA sends it.
#[derive(Debug, Deserialize, PartialEq, Clone)]
pub struct Problem {
    /// `urn:ietf:params:acme:error:...`
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The CA's words.
    #[serde(default)]
    pub detail: String,
}

/// What a problem means to the client (RFC 8555 §6.7): the ones it acts on, then the rest.
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum ProblemKind {
    /// The nonce was refused: retry once with the fresh one the answer carries.
    BadNonce,
    /// Too many requests or orders: wait.
    RateLimited,
    /// The CA could not reach or check the challenge (connection, DNS, TLS, unauthorized).
    Validation,
    /// The CA will not issue for a name (policy, CAA, malformed name).
    Rejected,
    /// Anything else, by its type.
    Other(String),
}

impl Problem {
    /// The problem's meaning, from its `type`.
    pub fn kind(&self) -> ProblemKind {
        let name = self.kind.strip_prefix("urn:ietf:params:acme:error:").unwrap_or(&self.kind);
        match name {
            "badNonce" => ProblemKind::BadNonce,
            "rateLimited" => ProblemKind::RateLimited,
            "connection" | "dns" | "tls" | "unauthorized" | "incorrectResponse" => ProblemKind::Validation,
            "rejectedIdentifier" | "caa" | "unsupportedIdentifier" => ProblemKind::Rejected,
            other => ProblemKind::Other(other.to_string()),
        }
    }
}

/// Why obtaining a certificate failed. Never holds key material.
#[derive(Debug)]
pub enum AcmeError {
    /// No answer: resolve, connect, TLS, a deadline, or an answer over the size bound.
    Transport {
        /// The URL asked.
        url: String,
        /// What went wrong.
        why: String,
    },
    /// The CA answered with a problem document.
    Problem {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What it means.
        kind: ProblemKind,
        /// The CA's words.
        detail: String,
    },
    /// The CA answered something that is not the ACME document expected.
    Protocol {
        /// The URL asked.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The CA refused to validate a name or issue the certificate.
    Invalid {
        /// The name or the order.
        what: String,
        /// The CA's reason, when given.
        why: String,
    },
    /// A status did not change within the polling bound.
    Timeout(String),
    /// A file under `data_dir/acme` cannot be read or written.
    Store(String),
    /// Local trouble: a key or certificate cannot be made, the workers did not take the
    /// challenge in time.
    Local(String),
}

impl std::fmt::Display for AcmeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport { url, why } => write!(f, "{url}: {why}"),
            Self::Problem { url, status, kind, detail } => {
                let kind = match kind {
                    ProblemKind::BadNonce => "badNonce",
                    ProblemKind::RateLimited => "rate limited",
                    ProblemKind::Validation => "validation failed",
                    ProblemKind::Rejected => "name rejected",
                    ProblemKind::Other(name) => name,
                };
                write!(f, "{url}: {status} {kind}: {detail}")
            }
            Self::Protocol { url, why } => write!(f, "{url}: not an ACME answer: {why}"),
            Self::Invalid { what, why } => write!(f, "{what}: the CA refused: {why}"),
            Self::Timeout(what) => write!(f, "{what}: no final status within the polling bound"),
            Self::Store(why) | Self::Local(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for AcmeError {}

/// The problem an error answer carries, when its body is a problem document.
pub fn problem(url: &str, status: u16, body: &[u8]) -> AcmeError {
    match serde_json::from_slice::<Problem>(body) {
        Ok(p) if !p.kind.is_empty() => {
            AcmeError::Problem { url: url.to_string(), status, kind: p.kind(), detail: p.detail }
        }
        _ => AcmeError::Protocol { url: url.to_string(), why: format!("status {status} without a problem document") },
    }
}

/// `body` as the document `T`.
pub fn parse<T: serde::de::DeserializeOwned>(url: &str, body: &[u8]) -> Result<T, AcmeError> {
    serde_json::from_slice(body).map_err(|e| AcmeError::Protocol { url: url.to_string(), why: e.to_string() })
}

/// How long to wait before polling again: the answer's `Retry-After` in seconds (an HTTP
/// date is not used by ACME CAs in practice and counts as absent), within `1..=max` seconds.
pub fn retry_after(header: Option<&str>, default: u64, max: u64) -> std::time::Duration {
    let secs = header.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(default);
    std::time::Duration::from_secs(secs.clamp(1, max.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_documents_map_to_kinds() {
        let cases = [
            ("urn:ietf:params:acme:error:badNonce", ProblemKind::BadNonce),
            ("urn:ietf:params:acme:error:rateLimited", ProblemKind::RateLimited),
            ("urn:ietf:params:acme:error:connection", ProblemKind::Validation),
            ("urn:ietf:params:acme:error:unauthorized", ProblemKind::Validation),
            ("urn:ietf:params:acme:error:caa", ProblemKind::Rejected),
            ("urn:ietf:params:acme:error:malformed", ProblemKind::Other("malformed".into())),
        ];
        for (kind, want) in cases {
            let body = format!(r#"{{"type":"{kind}","detail":"d","status":400}}"#);
            match problem("https://ca/x", 400, body.as_bytes()) {
                AcmeError::Problem { kind, detail, status, .. } => {
                    assert_eq!((kind, detail.as_str(), status), (want, "d", 400));
                }
                other => panic!("{kind}: {other:?}"),
            }
        }
        let e = problem("https://ca/x", 500, b"<html>oops</html>");
        assert_eq!(e.to_string(), "https://ca/x: not an ACME answer: status 500 without a problem document");
        let e = problem("https://ca/x", 429, br#"{"type":"urn:ietf:params:acme:error:rateLimited","detail":"slow"}"#);
        assert_eq!(e.to_string(), "https://ca/x: 429 rate limited: slow");
    }

    #[test]
    fn documents_parse_and_a_wrong_shape_is_a_protocol_error() {
        let dir: Directory = parse(
            "u",
            br#"{"newNonce":"https://ca/nonce","newAccount":"https://ca/acct","newOrder":"https://ca/order","meta":{}}"#,
        )
        .expect("directory");
        assert_eq!(dir.new_order, "https://ca/order");
        let authz: Authorization = parse(
            "u",
            br#"{"status":"pending","identifier":{"type":"dns","value":"a.example"},"challenges":[
                {"type":"http-01","url":"https://ca/c/1","status":"pending","token":"t1"},
                {"type":"dns-01","url":"https://ca/c/2","status":"pending","token":"t2"}]}"#,
        )
        .expect("authorization");
        assert_eq!(authz.identifier.value, "a.example");
        assert_eq!(authz.challenges[0].kind, "http-01");
        let order: Order = parse(
            "u",
            br#"{"status":"invalid","finalize":"https://ca/f","error":{"type":"urn:ietf:params:acme:error:caa","detail":"no"}}"#,
        )
        .expect("order");
        assert_eq!(order.error.map(|p| p.kind()), Some(ProblemKind::Rejected));
        let e = parse::<Directory>("https://ca/dir", b"{}").expect_err("missing fields");
        assert!(e.to_string().starts_with("https://ca/dir: not an ACME answer: missing field"), "{e}");
    }

    #[test]
    fn retry_after_is_bounded() {
        use std::time::Duration;
        assert_eq!(retry_after(Some("3"), 1, 10), Duration::from_secs(3));
        assert_eq!(retry_after(Some("3600"), 1, 10), Duration::from_secs(10));
        assert_eq!(retry_after(Some("0"), 1, 10), Duration::from_secs(1));
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), 2, 10), Duration::from_secs(2));
        assert_eq!(retry_after(None, 2, 10), Duration::from_secs(2));
    }
}
