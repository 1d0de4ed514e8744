//! TLS as a client towards the engines of several hosts (PostgreSQL with `sslmode=require`,
//! Redis with `rediss://`): the rustls configuration with the roots a server's certificate
//! must chain to, from one PEM file named in the URL or from the system. The server's name
//! is always checked; there is no way to turn verification off.
//!
//! It reads the roots file and nothing more; it must not touch sockets.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// A client configuration (TLS 1.2 and 1.3 with ring, no client certificate) trusting the
/// certificates of the PEM file `ca_file`, or the system's roots (`SSL_CERT_FILE` too, the
/// OpenSSL convention) without one. The error names the file and says what is wrong.
pub fn config(ca_file: Option<&str>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| format!("{path}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("{path}: {e}"))?;
                roots.add(cert).map_err(|e| format!("{path}: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!("{path}: no certificate in it"));
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if roots.is_empty() {
                return Err("no trusted root certificates found on this system (name a file of them)".into());
            }
        }
    }
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roots_file_must_hold_certificates() {
        let dir = tempfile::tempdir().expect("temp dir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no PEM here\n").expect("write");
        let empty = empty.to_str().expect("utf-8");
        assert!(config(Some(empty)).expect_err("no certificate").contains("no certificate"));
        let missing = dir.path().join("missing.pem");
        let missing = missing.to_str().expect("utf-8");
        assert!(config(Some(missing)).expect_err("missing").contains("missing.pem"));
    }
}
