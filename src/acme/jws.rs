//! The ACME account key and what is made from it: JSON Web Signatures (RFC 7515, flattened
//! JSON form, ES256 only), the key's JWK and thumbprint (RFC 7638) and the key authorization a
//! challenge answers with (RFC 8555 §8.1).
//!
//! Pure: bytes in, bytes out. It must not touch sockets or files (the key's PKCS#8 bytes are
//! stored by `store.rs`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};

/// base64url without padding, as every ACME and JOSE field is encoded.
pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Why an account key cannot be made or used.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyError(pub &'static str);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// A P-256 account key signing ES256 (the fixed `r || s` form JWS wants).
pub struct AccountKey {
    pair: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    rng: SystemRandom,
}

/// Who signs a request: the key itself (`jwk`, for newAccount) or the account's URL (`kid`).
pub enum Signer<'a> {
    /// The public key, embedded in the protected header.
    Jwk,
    /// The account URL the CA gave (`Location` of newAccount).
    Kid(&'a str),
}

impl AccountKey {
    /// A new random key.
    pub fn generate() -> Result<Self, KeyError> {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| KeyError("cannot generate a P-256 key"))?;
        Self::from_pkcs8(doc.as_ref())
    }

    /// The key of a PKCS#8 document (as [`AccountKey::pkcs8`] gave it).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, KeyError> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng)
            .map_err(|_| KeyError("not a PKCS#8 P-256 private key"))?;
        Ok(Self { pair, pkcs8: pkcs8.to_vec(), rng })
    }

    /// The PKCS#8 document, to store.
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    /// The public key as a JWK, members in the lexicographic order RFC 7638 hashes them in.
    pub fn jwk(&self) -> String {
        // Uncompressed point: 0x04, then x and y, 32 bytes each.
        let point = self.pair.public_key().as_ref();
        let (x, y) = point.get(1..).unwrap_or_default().split_at(point.len().saturating_sub(1) / 2);
        format!(r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#, b64(x), b64(y))
    }

    /// The JWK thumbprint (RFC 7638): base64url of the SHA-256 of [`AccountKey::jwk`].
    pub fn thumbprint(&self) -> String {
        b64(ring::digest::digest(&ring::digest::SHA256, self.jwk().as_bytes()).as_ref())
    }

    /// The key authorization of a challenge's `token`: `token.thumbprint`.
    pub fn key_authorization(&self, token: &str) -> String {
        format!("{token}.{}", self.thumbprint())
    }

    /// A flattened JWS of `payload` (`None`: the empty payload of a POST-as-GET) for `url`
    /// with `nonce`.
    pub fn sign(
        &self,
        signer: Signer<'_>,
        nonce: &str,
        url: &str,
        payload: Option<&[u8]>,
    ) -> Result<Vec<u8>, KeyError> {
        let who = match signer {
            Signer::Jwk => format!(r#""jwk":{}"#, self.jwk()),
            Signer::Kid(kid) => format!(r#""kid":{}"#, json_string(kid)),
        };
        let protected = format!(r#"{{"alg":"ES256",{who},"nonce":{},"url":{}}}"#, json_string(nonce), json_string(url));
        let protected = b64(protected.as_bytes());
        let payload = payload.map(b64).unwrap_or_default();
        let input = format!("{protected}.{payload}");
        let signature = self.pair.sign(&self.rng, input.as_bytes()).map_err(|_| KeyError("signing failed"))?;
        let jws =
            serde_json::json!({ "protected": protected, "payload": payload, "signature": b64(signature.as_ref()) });
        Ok(jws.to_string().into_bytes())
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The SHA-256 of a key authorization: the `acmeIdentifier` of a TLS-ALPN-01 certificate.
pub fn alpn_digest(key_authorization: &str) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, key_authorization.as_bytes()).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};

    fn unb64(s: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(s).expect("base64url")
    }

    #[test]
    fn base64url_has_no_padding_and_the_url_alphabet() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg");
        assert_eq!(b64(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn a_jws_carries_the_header_acme_wants_and_verifies() {
        let key = AccountKey::generate().expect("key");
        let jws = key.sign(Signer::Jwk, "n0nce", "https://ca/new-acct", Some(br#"{"a":1}"#)).expect("signs");
        let jws: serde_json::Value = serde_json::from_slice(&jws).expect("json");
        let protected: serde_json::Value =
            serde_json::from_slice(&unb64(jws["protected"].as_str().expect("protected"))).expect("header");
        assert_eq!(protected["alg"], "ES256");
        assert_eq!(protected["nonce"], "n0nce");
        assert_eq!(protected["url"], "https://ca/new-acct");
        assert_eq!(protected["jwk"]["kty"], "EC");
        assert_eq!(protected["jwk"]["crv"], "P-256");
        assert!(protected.get("kid").is_none());
        assert_eq!(unb64(jws["payload"].as_str().expect("payload")), br#"{"a":1}"#);
        let input = format!("{}.{}", jws["protected"].as_str().unwrap_or(""), jws["payload"].as_str().unwrap_or(""));
        let signature = unb64(jws["signature"].as_str().expect("signature"));
        assert_eq!(signature.len(), 64, "ES256 is r || s, 32 bytes each");
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key.pair.public_key().as_ref().to_vec());
        public.verify(input.as_bytes(), &signature).expect("the signature verifies");
    }

    #[test]
    fn post_as_get_has_an_empty_payload_and_a_kid() {
        let key = AccountKey::generate().expect("key");
        let jws = key.sign(Signer::Kid("https://ca/acct/1"), "n", "https://ca/order/1", None).expect("signs");
        let jws: serde_json::Value = serde_json::from_slice(&jws).expect("json");
        assert_eq!(jws["payload"], "");
        let protected: serde_json::Value =
            serde_json::from_slice(&unb64(jws["protected"].as_str().expect("protected"))).expect("header");
        assert_eq!(protected["kid"], "https://ca/acct/1");
        assert!(protected.get("jwk").is_none());
    }

    #[test]
    fn the_thumbprint_is_rfc_7638s() {
        // RFC 7638 §3.1: the required members in lexicographic order, no whitespace, hashed.
        let key = AccountKey::generate().expect("key");
        let jwk: serde_json::Value = serde_json::from_str(&key.jwk()).expect("json");
        let canonical = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            jwk["x"].as_str().unwrap_or(""),
            jwk["y"].as_str().unwrap_or("")
        );
        let want = b64(ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()).as_ref());
        assert_eq!(key.thumbprint(), want);
        assert_eq!(unb64(jwk["x"].as_str().expect("x")).len(), 32);
        assert_eq!(unb64(jwk["y"].as_str().expect("y")).len(), 32);
        assert_eq!(key.key_authorization("tok"), format!("tok.{want}"));
    }

    #[test]
    fn a_stored_key_comes_back_the_same_and_garbage_is_refused() {
        let key = AccountKey::generate().expect("key");
        let again = AccountKey::from_pkcs8(key.pkcs8()).expect("reloads");
        assert_eq!(again.thumbprint(), key.thumbprint());
        assert!(AccountKey::from_pkcs8(b"nope").is_err());
    }

    #[test]
    fn the_alpn_digest_is_the_sha256_of_the_key_authorization() {
        // SHA-256("abc"), FIPS 180-2's example.
        let d = alpn_digest("abc");
        assert_eq!(&d[..4], &[0xba, 0x78, 0x16, 0xbf]);
    }
}
