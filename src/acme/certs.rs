//! The certificates and keys ACME needs made or read locally: the certificate key and its CSR
//! for finalize, the TLS-ALPN-01 challenge certificate (RFC 8737 §3), the self-signed
//! placeholder served until the first certificate arrives, and the validity period of a
//! certificate (to renew at two thirds of it).
//!
//! Pure: no sockets, no files.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::jws::alpn_digest;
use super::msg::AcmeError;

/// A new certificate key (ECDSA P-256) and a CSR for `domains` signed with it: `(csr DER,
/// key PEM)`. The subject is the first name as CN (when it fits CN's 64 bytes), nothing else:
/// a CA refuses a CSR naming anything its order does not.
pub fn csr(domains: &[String]) -> Result<(Vec<u8>, String), AcmeError> {
    let local = |e: rcgen::Error| AcmeError::Local(format!("cannot make the CSR: {e}"));
    let key = rcgen::KeyPair::generate().map_err(local)?;
    let mut params = rcgen::CertificateParams::new(domains.to_vec()).map_err(local)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(first) = domains.first().filter(|d| d.len() <= 64) {
        params.distinguished_name.push(rcgen::DnType::CommonName, first.as_str());
    }
    let csr = params.serialize_request(&key).map_err(local)?;
    Ok((csr.der().to_vec(), key.serialize_pem()))
}

/// The TLS-ALPN-01 certificate for `domain`: self-signed, that one name, and the critical
/// `acmeIdentifier` extension holding the SHA-256 of `key_authorization`.
pub fn challenge(domain: &str, key_authorization: &str) -> Result<Arc<CertifiedKey>, AcmeError> {
    let mut params = rcgen::CertificateParams::new(vec![domain.to_string()])
        .map_err(|e| AcmeError::Local(format!("cannot make the TLS-ALPN-01 certificate: {e}")))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(&alpn_digest(key_authorization))];
    self_signed(params)
}

/// The placeholder served on the TLS listener before the first certificate: self-signed for
/// `domains` (browsers warn; the CA's TLS-ALPN-01 check does not use it).
pub fn placeholder(domains: &[String]) -> Result<Arc<CertifiedKey>, AcmeError> {
    let mut params = rcgen::CertificateParams::new(domains.to_vec())
        .map_err(|e| AcmeError::Local(format!("cannot make the placeholder certificate: {e}")))?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "forkd placeholder (ACME certificate pending)");
    self_signed(params)
}

fn self_signed(params: rcgen::CertificateParams) -> Result<Arc<CertifiedKey>, AcmeError> {
    let local = |e: String| AcmeError::Local(format!("cannot make a certificate: {e}"));
    let key = rcgen::KeyPair::generate().map_err(|e| local(e.to_string()))?;
    let cert = params.self_signed(&key).map_err(|e| local(e.to_string()))?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = crate::tls::provider().key_provider.load_private_key(der).map_err(|e| local(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(vec![CertificateDer::from(cert.der().to_vec())], signing)))
}

/// When a certificate `(notBefore, notAfter)` (Unix seconds) is renewed: two thirds into it.
pub fn renew_at((not_before, not_after): (i64, i64)) -> i64 {
    not_before + (not_after - not_before).max(0) * 2 / 3
}

/// The validity of certificate `der` as Unix seconds `(notBefore, notAfter)`; `None` when it
/// is not a certificate.
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (cert, _) = tlv(der, 0x30)?;
    let (mut tbs, _) = tlv(cert, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        tbs = tlv(tbs, 0xa0)?.1; // [0] EXPLICIT version
    }
    let (_, rest) = tlv(tbs, 0x02)?; // serialNumber
    let (_, rest) = tlv(rest, 0x30)?; // signature
    let (_, rest) = tlv(rest, 0x30)?; // issuer
    let (validity, _) = tlv(rest, 0x30)?;
    let (nb, rest) = time(validity)?;
    let (na, _) = time(rest)?;
    Some((nb, na))
}

/// The content of the DER element of tag `tag` at the start of `der`, and what follows it.
fn tlv(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = der.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        n if n < 0x80 => (usize::from(n), rest),
        n @ 0x81..=0x84 => {
            let k = usize::from(n & 0x7f);
            let bytes = rest.get(..k)?;
            (bytes.iter().fold(0usize, |a, &b| (a << 8) | usize::from(b)), &rest[k..])
        }
        _ => return None,
    };
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// A UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) as Unix seconds.
fn time(der: &[u8]) -> Option<(i64, &[u8])> {
    let (text, rest, year) = match der.first()? {
        0x17 => {
            let (t, rest) = tlv(der, 0x17)?;
            let yy = num(t.get(..2)?)?;
            (t.get(2..)?, rest, if yy < 50 { 2000 + yy } else { 1900 + yy })
        }
        0x18 => {
            let (t, rest) = tlv(der, 0x18)?;
            (t.get(4..)?, rest, num(t.get(..4)?)?)
        }
        _ => return None,
    };
    if text.len() != 11 || text[10] != b'Z' {
        return None;
    }
    let f = |i: usize| num(&text[i..i + 2]);
    let (mo, d, h, mi, s) = (f(0)?, f(2)?, f(4)?, f(6)?, f(8)?);
    Some((days_from_civil(year, mo, d) * 86_400 + h * 3600 + mi * 60 + s, rest))
}

fn num(digits: &[u8]) -> Option<i64> {
    digits.iter().try_fold(0i64, |a, &b| b.is_ascii_digit().then(|| a * 10 + i64::from(b - b'0')))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_read_from_the_certificate() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["a.example".into()]).expect("params");
        params.not_before = rcgen::date_time_ymd(2026, 3, 1);
        params.not_after = rcgen::date_time_ymd(2026, 5, 30);
        let cert = params.self_signed(&key).expect("cert");
        // 2026-03-01 and 2026-05-30, 00:00 UTC (UTCTime).
        assert_eq!(validity(cert.der()), Some((1_772_323_200, 1_780_099_200)));
        let mut params = rcgen::CertificateParams::new(vec!["a.example".into()]).expect("params");
        params.not_after = rcgen::date_time_ymd(2051, 1, 1); // GeneralizedTime from 2050 on
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(validity(cert.der()).map(|v| v.1), Some(2_556_144_000));
        assert_eq!(validity(b"\x30\x03\x02\x01\x00"), None);
        assert_eq!(validity(b""), None);
    }

    #[test]
    fn renewal_is_two_thirds_into_the_lifetime() {
        // A 90-day certificate renews after 60 days.
        assert_eq!(renew_at((0, 90 * 86_400)), 60 * 86_400);
        assert_eq!(renew_at((1000, 1000)), 1000);
        assert_eq!(renew_at((1000, 10)), 1000);
    }

    #[test]
    fn the_challenge_certificate_carries_the_acme_identifier() {
        let key = challenge("a.example", "tok.thumb").expect("made");
        let der = key.cert[0].as_ref();
        // id-pe-acmeIdentifier 1.3.6.1.5.5.7.1.31, then critical TRUE, then OCTET STRING of
        // the DER OCTET STRING of the digest.
        let oid = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x1f];
        let at = der.windows(oid.len()).position(|w| w == oid).expect("acmeIdentifier present");
        let mut want = vec![0x01, 0x01, 0xff, 0x04, 0x22, 0x04, 0x20];
        want.extend_from_slice(&alpn_digest("tok.thumb"));
        assert_eq!(&der[at + oid.len()..at + oid.len() + want.len()], want.as_slice());
    }

    #[test]
    fn a_csr_and_a_placeholder_are_made_for_the_names() {
        let domains = vec!["a.example".to_string(), "b.example".to_string()];
        let (csr, key) = csr(&domains).expect("csr");
        assert_eq!(csr.first(), Some(&0x30));
        assert!(csr.windows(9).any(|w| w == b"b.example"));
        // No name but the order's: rcgen's default subject ("rcgen self signed cert") is gone.
        assert!(!csr.windows(5).any(|w| w == b"rcgen"), "a stray subject in the CSR");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
        let p = placeholder(&domains).expect("placeholder");
        assert!(p.cert[0].as_ref().windows(9).any(|w| w == b"a.example"));
    }
}
