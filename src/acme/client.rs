//! The ACME exchange (RFC 8555 §7): the directory, nonces (`Replay-Nonce`, one retry on
//! `badNonce`), the account (`jwk` for newAccount, `kid` after), orders, authorizations,
//! challenges, polling with `Retry-After` and a bound, finalize and the chain's download.
//!
//! Blocking, over `https.rs`: it runs on the supervisor's ACME thread only. It holds no
//! files (that is `store.rs`) and knows nothing of workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::https::{self, Response};
use super::jws::{b64, AccountKey, Signer};
use super::msg::{self, AcmeError, Directory, ProblemKind};

/// Longest a status is polled for.
const POLL_FOR: Duration = Duration::from_secs(300);
/// Longest single wait between polls, whatever `Retry-After` says.
const MAX_POLL_WAIT: u64 = 10;

/// An ACME client with one account key.
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    dir: Directory,
    /// The account key.
    pub key: AccountKey,
    kid: Option<String>,
    nonce: Option<String>,
}

impl Client {
    /// Read the directory at `url`.
    pub fn new(tls: Arc<rustls::ClientConfig>, url: &str, key: AccountKey) -> Result<Self, AcmeError> {
        let r = https::request(&tls, "GET", url, None)?;
        if r.status != 200 {
            return Err(msg::problem(url, r.status, &r.body));
        }
        let dir = msg::parse(url, &r.body)?;
        Ok(Self { tls, dir, key, kid: None, nonce: None })
    }

    /// A nonce: the last answer's, or a fresh one from newNonce.
    fn nonce(&mut self) -> Result<String, AcmeError> {
        if let Some(n) = self.nonce.take() {
            return Ok(n);
        }
        let url = self.dir.new_nonce.clone();
        let r = https::request(&self.tls, "HEAD", &url, None)?;
        r.header("replay-nonce")
            .map(str::to_string)
            .ok_or_else(|| AcmeError::Protocol { url, why: "no Replay-Nonce".into() })
    }

    /// A signed POST of `payload` (`None`: POST-as-GET) to `url`; an error answer is its
    /// problem, after one retry with a fresh nonce on `badNonce`.
    fn post(&mut self, url: &str, payload: Option<&[u8]>) -> Result<Response, AcmeError> {
        let mut retried = false;
        loop {
            let nonce = self.nonce()?;
            let signer = match &self.kid {
                Some(kid) => Signer::Kid(kid),
                None => Signer::Jwk,
            };
            let body = self.key.sign(signer, &nonce, url, payload).map_err(|e| AcmeError::Local(e.to_string()))?;
            let r = https::request(&self.tls, "POST", url, Some(&body))?;
            self.nonce = r.header("replay-nonce").map(str::to_string);
            if r.status < 400 {
                return Ok(r);
            }
            match msg::problem(url, r.status, &r.body) {
                AcmeError::Problem { kind: ProblemKind::BadNonce, .. } if !retried => retried = true,
                e => return Err(e),
            }
        }
    }

    /// Create the account (or find the one of this key): terms agreed, `email` as contact.
    pub fn account(&mut self, email: Option<&str>) -> Result<(), AcmeError> {
        let contact: Vec<String> = email.map(|e| format!("mailto:{e}")).into_iter().collect();
        let payload = serde_json::json!({ "termsOfServiceAgreed": true, "contact": contact }).to_string();
        let url = self.dir.new_account.clone();
        let r = self.post(&url, Some(payload.as_bytes()))?;
        let kid = r.header("location").ok_or_else(|| AcmeError::Protocol { url, why: "no Location".into() })?;
        self.kid = Some(kid.to_string());
        Ok(())
    }

    /// Place an order for `domains`: its URL and the order.
    pub fn new_order(&mut self, domains: &[String]) -> Result<(String, msg::Order), AcmeError> {
        let ids: Vec<_> = domains.iter().map(|d| serde_json::json!({ "type": "dns", "value": d })).collect();
        let payload = serde_json::json!({ "identifiers": ids }).to_string();
        let url = self.dir.new_order.clone();
        let r = self.post(&url, Some(payload.as_bytes()))?;
        let at =
            r.header("location").ok_or_else(|| AcmeError::Protocol { url: url.clone(), why: "no Location".into() })?;
        Ok((at.to_string(), msg::parse(&url, &r.body)?))
    }

    /// The document at `url` (POST-as-GET) and how long its `Retry-After` asks to wait.
    pub fn get<T: serde::de::DeserializeOwned>(&mut self, url: &str) -> Result<(T, Duration), AcmeError> {
        let r = self.post(url, None)?;
        let wait = msg::retry_after(r.header("retry-after"), 1, MAX_POLL_WAIT);
        Ok((msg::parse(url, &r.body)?, wait))
    }

    /// Tell the CA to check the challenge at `url`.
    pub fn respond(&mut self, url: &str) -> Result<(), AcmeError> {
        self.post(url, Some(b"{}")).map(|_| ())
    }

    /// Poll the document at `url` until `settled` says it is (`Some(result)`), within
    /// [`POLL_FOR`].
    pub fn poll<T: serde::de::DeserializeOwned, R>(
        &mut self,
        url: &str,
        mut settled: impl FnMut(&T) -> Option<Result<R, AcmeError>>,
    ) -> Result<R, AcmeError> {
        let until = Instant::now() + POLL_FOR;
        loop {
            let (doc, wait) = self.get::<T>(url)?;
            if let Some(done) = settled(&doc) {
                return done;
            }
            if Instant::now() + wait > until {
                return Err(AcmeError::Timeout(url.to_string()));
            }
            std::thread::sleep(wait);
        }
    }

    /// Send the CSR to the order's `finalize` URL.
    pub fn finalize(&mut self, url: &str, csr_der: &[u8]) -> Result<(), AcmeError> {
        let payload = serde_json::json!({ "csr": b64(csr_der) }).to_string();
        self.post(url, Some(payload.as_bytes())).map(|_| ())
    }

    /// The certificate chain (PEM) at `url`.
    pub fn download(&mut self, url: &str) -> Result<Vec<u8>, AcmeError> {
        let r = self.post(url, None)?;
        if !r.body.starts_with(b"-----BEGIN CERTIFICATE-----") {
            return Err(AcmeError::Protocol { url: url.to_string(), why: "not a PEM certificate chain".into() });
        }
        Ok(r.body)
    }
}
