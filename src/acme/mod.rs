//! Automatic certificates (`[tls.acme]`, RFC 8555): forkd obtains and renews the TLS
//! listener's certificate from an ACME CA, answering HTTP-01 on the plain listener or
//! TLS-ALPN-01 (RFC 8737) on the TLS listener.
//!
//! The pieces, socket-free first: `jws.rs` (account key, JWS, thumbprint, key
//! authorization), `msg.rs` (the documents and [`AcmeError`]), `certs.rs` (CSR, challenge and
//! placeholder certificates, validity), `store.rs` (the files under `data_dir/acme`); then the
//! blocking `https.rs` and `client.rs`, and `service.rs`, the loop that orders, renews at two
//! thirds of the lifetime and retries with back-off.
//!
//! The loop runs on a thread of the supervisor, never on a worker's loop. What workers must
//! serve reaches them as a [`Published`] value through [`Publish`]: the supervisor replaces
//! its workers one slot at a time, as a HUP does, and the new ones are forked with it (no
//! connection is dropped). This module must not touch workers, polls or the supervisor's
//! state itself.

pub mod certs;
pub mod client;
pub mod https;
pub mod jws;
pub mod msg;
pub mod service;
pub mod store;

use std::collections::HashMap;
use std::sync::Arc;

use rustls::sign::CertifiedKey;

pub use msg::AcmeError;

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737 §6.2).
pub const ALPN_PROTOCOL: &[u8] = b"acme-tls/1";

/// The path prefix of HTTP-01 answers (RFC 8555 §8.3).
pub const HTTP_PREFIX: &str = "/.well-known/acme-challenge/";

/// The challenge answers the workers serve while a CA checks them.
#[derive(Default, Debug)]
pub struct Challenges {
    /// HTTP-01: token → key authorization.
    pub http: HashMap<String, String>,
    /// TLS-ALPN-01: DNS name → its challenge certificate.
    pub tls_alpn: HashMap<String, Arc<CertifiedKey>>,
}

/// What the workers are to serve: the certificate (`None`: keep the current one) and the
/// challenge answers (empty outside an order).
pub struct Published {
    /// The TLS listener's new certificate, if any.
    pub key: Option<Arc<CertifiedKey>>,
    /// The challenge answers.
    pub challenges: Arc<Challenges>,
}

/// How the ACME loop hands [`Published`] values to the workers.
pub trait Publish {
    /// Hand `p` over; returns once every worker serves it (or an error after a bound).
    fn publish(&self, p: Published) -> Result<(), AcmeError>;
}

/// The current time in Unix seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}
