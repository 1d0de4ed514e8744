//! TLS for the HTTPS listener (`[tls]`) and, in `client.rs`, the client configuration towards
//! PostgreSQL and Redis. For the listener: the certificate and key read from PEM and checked
//! against each other, the rustls server configuration every worker builds from them, and the
//! session-ticket keys all workers share (`tickets.rs`).
//!
//! The supervisor loads the pair ([`load`]) at start, for `check-config` and again on HUP
//! (a bad pair refuses the reload; the workers keep the one they have). Each worker builds its
//! [`ServerConfig`] after fork ([`server_config`]) and drives one `rustls::ServerConnection`
//! per HTTPS connection from its event loop.
//!
//! Only rustls with the ring provider: TLS 1.3 and TLS 1.2 with forward-secret AEAD suites
//! (ECDHE with AES-GCM or ChaCha20-Poly1305), nothing else. This module reads the two files
//! and nothing more; it must not touch sockets.

pub mod client;
mod resolve;
mod tickets;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ServerConfig;
use rustls::sign::CertifiedKey;

pub use tickets::{SharedTicketer, SECRET_LEN};

/// ALPN protocols offered, in order of preference: HTTP/2 first, then HTTP/1.1. A client
/// offering no ALPN gets HTTP/1.1.
pub const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Largest certificate or key file read (a chain is a few KiB).
const MAX_PEM: u64 = 1 << 20;

/// Why a certificate and key cannot be used. Never holds key material.
#[derive(Debug)]
pub enum TlsError {
    /// A file cannot be read.
    Read {
        /// `tls.cert_file` or `tls.key_file`.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The certificate file holds no valid PEM certificate (or a malformed one).
    Certificate {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The key file holds no usable PEM private key.
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the key's bytes).
        why: String,
    },
    /// The private key is not the one of the certificate.
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// rustls refused the configuration.
    Config(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { key, path, error } => write!(f, "{key} {}: cannot read it: {error}", path.display()),
            Self::Certificate { path, why } => write!(f, "tls.cert_file {}: {why}", path.display()),
            Self::Key { path, why } => write!(f, "tls.key_file {}: {why}", path.display()),
            Self::Mismatch { cert, key } => write!(
                f,
                "tls.key_file {} is not the private key of the certificate in tls.cert_file {}",
                key.display(),
                cert.display()
            ),
            Self::Config(why) => write!(f, "TLS configuration: {why}"),
        }
    }
}

impl std::error::Error for TlsError {}

/// The crypto provider: ring, with its forward-secret AEAD suites for TLS 1.3 and 1.2 (every
/// suite rustls implements is one; listed here so that none is added by accident).
pub fn provider() -> CryptoProvider {
    use rustls::crypto::ring::cipher_suite as cs;
    CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    }
}

/// Read `cert_file` (a PEM chain, leaf first) and `key_file` (a PEM private key: PKCS#8,
/// SEC1 or PKCS#1) and check that the key is the certificate's.
pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let cert_pem = read("tls.cert_file", cert_file)?;
    let key_pem = read("tls.key_file", key_file)?;
    let bad_cert = |why: String| TlsError::Certificate { path: cert_file.to_path_buf(), why };
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_cert(format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(bad_cert("no certificate (-----BEGIN CERTIFICATE-----) in it".into()));
    }
    let bad_key = |why: &str| TlsError::Key { path: key_file.to_path_buf(), why: why.to_string() };
    // The PEM parser's messages may quote a line of the file: only its kind is reported.
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => bad_key("no private key (PKCS#8, SEC1 or PKCS#1 PEM) in it"),
        _ => bad_key("malformed PEM"),
    })?;
    let signing = provider().key_provider.load_private_key(key).map_err(|_| bad_key("not a usable private key"))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(_)) => {
            Err(TlsError::Mismatch { cert: cert_file.to_path_buf(), key: key_file.to_path_buf() })
        }
        Err(e) => Err(bad_cert(format!("not a valid certificate: {e}"))),
    }
}

/// A file's bytes, bounded.
fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_PEM), &mut bytes))
        .map_err(|error| TlsError::Read { key, path: path.to_path_buf(), error })?;
    Ok(bytes)
}

/// The server configuration of one worker: the certificate, ALPN ([`ALPN`], or only
/// `http/1.1` when `http2` is off), and session tickets from `tickets` (the same keys in every
/// worker, so any of them resumes any other's sessions). With `acme_challenges` (DNS name →
/// TLS-ALPN-01 certificate, while a CA checks them) ALPN also offers `acme-tls/1`, last, and a
/// ClientHello offering only that gets the challenge certificate of its SNI name.
pub fn server_config(
    key: Arc<CertifiedKey>,
    tickets: Arc<SharedTicketer>,
    http2: bool,
    acme_challenges: &std::collections::HashMap<String, Arc<CertifiedKey>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth();
    let mut config = match acme_challenges.is_empty() {
        true => builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(key))),
        false => builder.with_cert_resolver(Arc::new(resolve::WithChallenges::new(key, acme_challenges.clone()))),
    };
    config.alpn_protocols = ALPN.iter().filter(|p| http2 || **p != b"h2").map(|p| p.to_vec()).collect();
    if !acme_challenges.is_empty() {
        config.alpn_protocols.push(crate::acme::ALPN_PROTOCOL.to_vec());
    }
    config.ticketer = tickets;
    // Tickets carry the whole session: no per-worker session-id cache to miss in.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()]).expect("params").self_signed(&key);
        (cert.expect("cert").pem(), key.serialize_pem())
    }

    fn files(cert: &str, key: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&c, cert).expect("write");
        std::fs::write(&k, key).expect("write");
        (dir, c, k)
    }

    #[test]
    fn a_matching_pair_loads_and_makes_a_config() {
        let (cert, key) = pair();
        let (_dir, c, k) = files(&cert, &key);
        let certified = load(&c, &k).expect("loads");
        let tickets = Arc::new(SharedTicketer::new([7; SECRET_LEN]));
        let config =
            server_config(Arc::clone(&certified), Arc::clone(&tickets), true, &Default::default()).expect("config");
        assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(config.ticketer.enabled());
        let config = server_config(certified, tickets, false, &Default::default()).expect("config");
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let (cert, key) = pair();
        let (other_cert, other_key) = pair();
        let cases: [(&str, &str, &str); 6] = [
            (&cert, &other_key, "is not the private key of the certificate"),
            (&other_cert, &key, "is not the private key of the certificate"),
            ("", &key, "no certificate"),
            (&key, &key, "no certificate"),
            (&cert, &cert, "no private key"),
            (&cert, "-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n", "tls.key_file"),
        ];
        for (c, k, want) in cases {
            let (_dir, cp, kp) = files(c, k);
            let err = load(&cp, &kp).expect_err("refused").to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        let (_dir, c, _) = files(&cert, &key);
        let err = load(&c, Path::new("/nonexistent/key.pem")).expect_err("missing").to_string();
        assert!(err.starts_with("tls.key_file /nonexistent/key.pem: cannot read it"), "{err}");
        // A certificate whose body is not DER.
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let (_dir, c, k) = files(garbage, &key);
        let err = load(&c, &k).expect_err("garbage").to_string();
        assert!(err.starts_with("tls.cert_file"), "{err}");
    }

    #[test]
    fn errors_never_show_the_key() {
        let (cert, key) = pair();
        let (_dir, c, k) = files(&cert, &format!("{key}junk"));
        if let Err(e) = load(&c, &k) {
            let body: String = key.lines().nth(1).unwrap_or_default().to_string();
            assert!(!e.to_string().contains(&body), "{e}");
        }
    }
}
