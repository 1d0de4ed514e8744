//! The certificate resolver of a TLS listener while an ACME CA checks TLS-ALPN-01 (RFC 8737
//! §3): a ClientHello whose ALPN offers only `acme-tls/1` gets the challenge certificate of
//! its SNI name (none for another name: the handshake fails); every other ClientHello gets the
//! listener's certificate.
//!
//! It decides from the ClientHello alone; it must not touch sockets or files.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The listener's certificate and the challenge certificates by DNS name (lower case).
#[derive(Debug)]
pub(super) struct WithChallenges {
    key: Arc<CertifiedKey>,
    challenges: HashMap<String, Arc<CertifiedKey>>,
}

impl WithChallenges {
    pub(super) fn new(key: Arc<CertifiedKey>, challenges: HashMap<String, Arc<CertifiedKey>>) -> Self {
        Self { key, challenges }
    }

    /// The certificate for a ClientHello offering `alpn` for `sni`.
    fn pick<'a>(&self, alpn: Option<impl Iterator<Item = &'a [u8]>>, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let mut offered = alpn.into_iter().flatten();
        let only_acme = offered.next() == Some(crate::acme::ALPN_PROTOCOL) && offered.next().is_none();
        if !only_acme {
            return Some(Arc::clone(&self.key));
        }
        let name = sni?.trim_end_matches('.').to_ascii_lowercase();
        self.challenges.get(&name).cloned()
    }
}

impl ResolvesServerCert for WithChallenges {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name().map(str::to_string);
        self.pick(hello.alpn(), sni.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Arc<CertifiedKey> {
        crate::acme::certs::placeholder(&[name.to_string()]).expect("certificate")
    }

    #[test]
    fn only_an_acme_tls_hello_gets_the_challenge_certificate() {
        let (main, challenge) = (key("main.example"), key("a.example"));
        let r =
            WithChallenges::new(Arc::clone(&main), HashMap::from([("a.example".to_string(), Arc::clone(&challenge))]));
        let acme: &[&[u8]] = &[b"acme-tls/1"];
        let got = r.pick(Some(acme.iter().copied()), Some("A.example")).expect("challenge");
        assert!(Arc::ptr_eq(&got, &challenge));
        assert!(r.pick(Some(acme.iter().copied()), Some("b.example")).is_none(), "no challenge for that name");
        assert!(r.pick(Some(acme.iter().copied()), None).is_none(), "no SNI");
        let mixed: &[&[u8]] = &[b"h2", b"acme-tls/1"];
        assert!(Arc::ptr_eq(&r.pick(Some(mixed.iter().copied()), Some("a.example")).expect("main"), &main));
        let none: Option<std::slice::Iter<'_, &[u8]>> = None;
        assert!(Arc::ptr_eq(&r.pick(none.map(|i| i.copied()), Some("a.example")).expect("main"), &main));
    }
}
