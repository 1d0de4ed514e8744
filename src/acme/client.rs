//! The ACME exchange (RFC 8555 §7): the directory, nonces (`Replay-Nonce`, one retry on
//! `badNonce`), the account (`jwk` for newAccount, `kid` after), orders, authorizations,
//! challenges, polling with `Retry-After` and a bound, finalize and the chain's download.
//!
//! Blocking, over a [`Transport`] (`https.rs` in service, a scripted CA in the tests below):
//! it runs on the supervisor's ACME thread only. It holds no files (that is `store.rs`) and
//! knows nothing of workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::https::{self, Response};
use super::jws::{b64, AccountKey, Signer};
use super::msg::{self, AcmeError, Directory, ProblemKind};

/// Longest a status is polled for.
const POLL_FOR: Duration = Duration::from_secs(300);
/// Longest single wait between polls, whatever `Retry-After` says.
const MAX_POLL_WAIT: u64 = 10;

/// How requests reach the CA.
pub trait Transport {
    /// One request: `method` on `url`, with a JOSE body when `body` is given.
    fn request(&self, method: &str, url: &str, body: Option<&[u8]>) -> Result<Response, AcmeError>;
}

/// The real transport: HTTPS trusting `0`'s roots.
pub struct Https(pub Arc<rustls::ClientConfig>);

impl Transport for Https {
    fn request(&self, method: &str, url: &str, body: Option<&[u8]>) -> Result<Response, AcmeError> {
        https::request(&self.0, method, url, body)
    }
}

/// An ACME client with one account key.
pub struct Client<N: Transport = Https> {
    net: N,
    dir: Directory,
    /// The account key.
    pub key: AccountKey,
    kid: Option<String>,
    nonce: Option<String>,
}

impl<N: Transport> Client<N> {
    /// Read the directory at `url`.
    pub fn new(net: N, url: &str, key: AccountKey) -> Result<Self, AcmeError> {
        let r = net.request("GET", url, None)?;
        if r.status != 200 {
            return Err(msg::problem(url, r.status, &r.body));
        }
        let dir = msg::parse(url, &r.body)?;
        Ok(Self { net, dir, key, kid: None, nonce: None })
    }

    /// A nonce: the last answer's, or a fresh one from newNonce.
    fn nonce(&mut self) -> Result<String, AcmeError> {
        if let Some(n) = self.nonce.take() {
            return Ok(n);
        }
        let url = self.dir.new_nonce.clone();
        let r = self.net.request("HEAD", &url, None)?;
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
            let r = self.net.request("POST", url, Some(&body))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// A scripted CA: each request gets the next answer; what was asked is kept.
    #[derive(Default)]
    struct Script {
        answers: RefCell<VecDeque<Response>>,
        asked: RefCell<Vec<(String, String, Option<serde_json::Value>)>>,
    }

    impl Transport for &Script {
        fn request(&self, method: &str, url: &str, body: Option<&[u8]>) -> Result<Response, AcmeError> {
            let header = body.map(|b| {
                let jws: serde_json::Value = serde_json::from_slice(b).expect("a JWS");
                let protected = jws["protected"].as_str().expect("protected").to_string();
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(protected).expect("base64url");
                serde_json::from_slice(&bytes).expect("header JSON")
            });
            self.asked.borrow_mut().push((method.to_string(), url.to_string(), header));
            self.answers.borrow_mut().pop_front().ok_or_else(|| AcmeError::Local(format!("unscripted {method} {url}")))
        }
    }

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        Response { status, headers, body: body.as_bytes().to_vec() }
    }

    const DIR: &str = r#"{"newNonce":"https://ca/nonce","newAccount":"https://ca/acct","newOrder":"https://ca/order"}"#;
    const BAD_NONCE: &str = r#"{"type":"urn:ietf:params:acme:error:badNonce","detail":"stale"}"#;
    const ORDER: &str = r#"{"status":"pending","authorizations":["https://ca/authz/1"],"finalize":"https://ca/fin/1"}"#;

    fn client(script: &Script) -> Client<&Script> {
        script.answers.borrow_mut().push_back(answer(200, &[], DIR));
        Client::new(script, "https://ca/dir", AccountKey::generate().expect("key")).expect("directory")
    }

    #[test]
    fn the_account_signs_with_its_key_then_with_its_url_and_a_bad_nonce_is_retried_once() {
        let script = Script::default();
        let mut c = client(&script);
        script.answers.borrow_mut().extend([
            answer(200, &[("replay-nonce", "n1")], ""),
            answer(201, &[("replay-nonce", "n2"), ("location", "https://ca/acct/7")], "{}"),
            answer(400, &[("replay-nonce", "n3")], BAD_NONCE),
            answer(201, &[("replay-nonce", "n4"), ("location", "https://ca/order/1")], ORDER),
        ]);
        c.account(Some("ops@a.example")).expect("account");
        let (url, order) = c.new_order(&["a.example".to_string()]).expect("order after one retry");
        assert_eq!((url.as_str(), order.authorizations.len()), ("https://ca/order/1", 1));
        let asked = script.asked.borrow();
        let calls: Vec<(&str, &str)> = asked.iter().map(|(m, u, _)| (m.as_str(), u.as_str())).collect();
        assert_eq!(
            calls,
            [
                ("GET", "https://ca/dir"),
                ("HEAD", "https://ca/nonce"),
                ("POST", "https://ca/acct"),
                ("POST", "https://ca/order"),
                ("POST", "https://ca/order"),
            ]
        );
        let header = |i: usize| asked[i].2.clone().expect("a signed request");
        assert_eq!(header(2)["nonce"], "n1");
        assert!(header(2).get("jwk").is_some() && header(2).get("kid").is_none(), "newAccount: jwk");
        assert_eq!(header(3)["kid"], "https://ca/acct/7");
        assert_eq!((header(3)["nonce"].as_str(), header(4)["nonce"].as_str()), (Some("n2"), Some("n3")));
    }

    #[test]
    fn a_second_bad_nonce_and_other_problems_are_errors() {
        let script = Script::default();
        let mut c = client(&script);
        script.answers.borrow_mut().extend([
            answer(200, &[("replay-nonce", "n1")], ""),
            answer(400, &[("replay-nonce", "n2")], BAD_NONCE),
            answer(400, &[("replay-nonce", "n3")], BAD_NONCE),
        ]);
        let e = c.account(None).expect_err("two bad nonces");
        assert!(matches!(e, AcmeError::Problem { kind: msg::ProblemKind::BadNonce, .. }), "{e}");
        script.answers.borrow_mut().push_back(answer(
            403,
            &[("replay-nonce", "n4")],
            r#"{"type":"urn:ietf:params:acme:error:unauthorized","detail":"no"}"#,
        ));
        let e = c.account(None).expect_err("refused");
        assert_eq!(e.to_string(), "https://ca/acct: 403 validation failed: no");
        // The nonce of the last answer is used: no HEAD in between.
        assert_eq!(script.asked.borrow().iter().filter(|(m, _, _)| m == "HEAD").count(), 1);
    }

    #[test]
    fn polling_ends_on_a_settled_status_and_a_download_must_be_pem() {
        let script = Script::default();
        let mut c = client(&script);
        script.answers.borrow_mut().extend([
            answer(200, &[("replay-nonce", "n1")], ""),
            answer(200, &[("replay-nonce", "n2")], ORDER),
            answer(200, &[("replay-nonce", "n3")], &ORDER.replace("pending", "ready")),
            answer(200, &[("replay-nonce", "n4")], "<html>"),
        ]);
        let polls = std::cell::Cell::new(0);
        c.poll::<msg::Order, ()>("https://ca/order/1", |o| {
            polls.set(polls.get() + 1);
            (o.status == "ready").then_some(Ok(()))
        })
        .expect("ready");
        assert_eq!(polls.get(), 2);
        let e = c.download("https://ca/cert/1").expect_err("not PEM");
        assert!(e.to_string().ends_with("not a PEM certificate chain"), "{e}");
        let asked = script.asked.borrow();
        assert_eq!(asked[2].2.as_ref().map(|h| h["url"].clone()), Some("https://ca/order/1".into()));
    }
}
