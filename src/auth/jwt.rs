//! Access tokens: HS256 JSON Web Tokens, issued and verified with `jsonwebtoken`.
//!
//! Pure computation: no I/O, no HTTP, no sockets. The verifier pins the algorithm to HS256
//! (`none`, HS384/HS512 and every asymmetric algorithm are rejected), checks the signature,
//! `exp` and `nbf` with zero leeway, `iss` and `aud`, and treats a token lacking `exp`, `iss` or
//! `aud`, or whose header carries a `crit` parameter, as invalid (RFC 7515 §4.1.11: `crit`
//! lists extensions the recipient must understand, and this verifier understands none). Every
//! failure is the same [`AuthError::Invalid`], so callers cannot leak why.
//!
//! A token names an account, not only an id: besides `userId` it carries the account's token
//! generation (`gen`) and the instant the account was read for it (`iatMs`), both required (a
//! token without them, as issued before they existed, is invalid). Whether they are still
//! the account's is not this file's business: `app::session` checks them against the
//! workers' table of revocations and the store.
//!
//! The signing key never appears in a log line or in `Debug` output, and neither do tokens.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

use super::tokens::{random_bytes, to_hex};
use super::AuthError;

/// The claims of an access token.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Claims {
    /// The user's id.
    #[serde(rename = "userId")]
    pub user_id: i64,
    /// The user's role at issue time (`user` or `admin`).
    pub role: String,
    /// Issuer (`auth.issuer`).
    pub iss: String,
    /// Audience (`auth.audience`).
    pub aud: String,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Expires at, seconds since the Unix epoch.
    pub exp: u64,
    /// Token id: 16 random bytes, lower-case hex.
    pub jti: String,
    /// The account's token generation when the token was issued (`users.token_gen`): bumped
    /// by a password or role change, which voids every token carrying an older one.
    pub gen: i64,
    /// When the account was read for this token, in milliseconds since the Unix epoch (`iat`
    /// is its second): what the table of recent revocations compares with.
    #[serde(rename = "iatMs")]
    pub iat_ms: u64,
    /// Not before, seconds since the Unix epoch: never issued here, refused
    /// while in the future when a token carries it (a number, or invalid:
    /// `null` included).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present_number")]
    pub nbf: Option<u64>,
    /// The user's display name at issue time (chat messages carry it, so no
    /// lookup is needed per message). Absent from tokens issued without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An optional claim that, when present, must be a number (`null` is not).
fn present_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    <u64 as serde::Deserialize>::deserialize(d).map(Some)
}

/// Whom an access token is for: the account as the store had it when it was read.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// The user's id.
    pub user_id: i64,
    /// Their role (`user` or `admin`).
    pub role: &'a str,
    /// Their display name.
    pub name: &'a str,
    /// Their token generation (`users.token_gen`).
    pub gen: i64,
}

/// An HS256 access-token issuer and verifier bound to one secret, issuer, audience and lifetime.
#[derive(Clone)]
pub struct Jwt {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    issuer: String,
    audience: String,
    ttl: Duration,
}

impl fmt::Debug for Jwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jwt")
            .field("algorithm", &"HS256")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Seconds since the Unix epoch by the wall clock (0 if the clock is before 1970).
pub(crate) fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Milliseconds since the Unix epoch by the wall clock (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Jwt {
    /// A signer/verifier with HMAC key `secret` (see [`super::secret::resolve`] for its length
    /// rules), `iss = issuer`, `aud = audience`, and tokens living `ttl` (whole seconds).
    pub fn new(secret: &[u8], issuer: &str, audience: &str, ttl: Duration) -> Jwt {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.algorithms = vec![Algorithm::HS256];
        validation.leeway = 0;
        validation.reject_tokens_expiring_in_less_than = 0;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        Jwt {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
            ttl,
        }
    }

    /// A token for `who`, whose account was read at `read_at_ms` (ms since the epoch, taken
    /// before the read); returns (token, expires_in_secs). jti = 16 random bytes hex.
    ///
    /// `iat` is `read_at_ms`'s second and `exp = iat + ttl` (whole seconds), so no token
    /// outlives the account state it was made from by more than its lifetime. Fails with
    /// [`AuthError::Hash`] only if the encoder fails, which does not happen for these claims.
    pub fn issue(&self, who: &Subject<'_>, read_at_ms: u64) -> Result<(String, u64), AuthError> {
        let expires_in = self.ttl.as_secs();
        let iat = read_at_ms / 1000;
        let claims = Claims {
            user_id: who.user_id,
            role: who.role.to_owned(),
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            iat,
            exp: iat.saturating_add(expires_in),
            jti: to_hex(&random_bytes::<16>()),
            gen: who.gen,
            iat_ms: read_at_ms,
            nbf: None,
            name: Some(who.name.to_owned()),
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|e| AuthError::Hash(format!("jwt signing: {e}")))?;
        Ok((token, expires_in))
    }

    /// Verify: algorithm pinned to HS256 (`none`, HS384/HS512, RS256/ES256… all rejected), no
    /// `crit` header parameter, signature, `exp` and `nbf` with ZERO leeway, `iss`, `aud`; `exp`,
    /// `iss`, `aud` required (a token lacking any is Invalid). Any failure → AuthError::Invalid.
    ///
    /// "Now" is the wall clock. A token is valid strictly before its `exp` second (RFC 7519
    /// §4.1.4): `exp == now` is already expired; and from its `nbf` second on (§4.1.5).
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        if has_crit(token) {
            return Err(AuthError::Invalid);
        }
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation).map_err(|_| AuthError::Invalid)?;
        let now = now_unix();
        // jsonwebtoken accepts `exp == now` even with zero leeway; RFC 7519 says "before".
        if data.claims.exp <= now || data.claims.nbf.is_some_and(|nbf| nbf > now) {
            return Err(AuthError::Invalid);
        }
        Ok(data.claims)
    }
}

/// Whether the token's header names a `crit` parameter (any value, even an
/// empty list: RFC 7515 §4.1.11 forbids that form too). `jsonwebtoken`'s
/// `Header` has no such field and would drop it silently. A header that is
/// not base64url JSON is left to `jsonwebtoken` to refuse.
fn has_crit(token: &str) -> bool {
    let header = token.split('.').next().unwrap_or_default();
    URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes).ok())
        .is_some_and(|h| h.contains_key("crit"))
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use jsonwebtoken::errors::ErrorKind;
    use serde_json::{json, Value};

    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test-secret";
    const TTL: u64 = 900;

    fn jwt() -> Jwt {
        Jwt::new(SECRET, "forkd", "forkd-api", Duration::from_secs(TTL))
    }

    fn good_claims(now: u64) -> Value {
        json!({
            "userId": 7, "role": "user", "iss": "forkd", "aud": "forkd-api",
            "iat": now, "exp": now + TTL, "jti": "00112233445566778899aabbccddeeff",
            "gen": 0, "iatMs": now * 1000,
        })
    }

    fn who<'a>(user_id: i64, role: &'a str, name: &'a str) -> Subject<'a> {
        Subject { user_id, role, name, gen: 0 }
    }

    /// Sign arbitrary claims with `alg` and the test secret.
    fn sign(alg: Algorithm, claims: &Value) -> String {
        jsonwebtoken::encode(&Header::new(alg), claims, &EncodingKey::from_secret(SECRET)).expect("encode")
    }

    fn b64(value: &Value) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).expect("json"))
    }

    #[test]
    fn round_trip() {
        let jwt = jwt();
        let now = now_unix();
        let subject = Subject { user_id: 42, role: "admin", name: "Zoë", gen: 5 };
        let (token, expires_in) = jwt.issue(&subject, now * 1000 + 789).expect("issue");
        assert_eq!(expires_in, TTL);
        assert_eq!(token.split('.').count(), 3);
        let claims = jwt.verify(&token).expect("verify");
        assert_eq!((claims.user_id, claims.role.as_str()), (42, "admin"));
        assert_eq!(claims.name.as_deref(), Some("Zoë"));
        assert_eq!((claims.iss.as_str(), claims.aud.as_str()), ("forkd", "forkd-api"));
        assert_eq!((claims.iat, claims.exp), (now, now + TTL));
        assert_eq!((claims.gen, claims.iat_ms), (5, now * 1000 + 789), "the account's generation, read when");
        assert_eq!(claims.jti.len(), 32);
        assert!(claims.jti.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));

        // The header says HS256/JWT, the payload uses the contract's claim names.
        let mut parts = token.split('.');
        let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap_or("")).expect("b64"))
            .expect("header json");
        assert_eq!(header["alg"], "HS256");
        assert_eq!(header["typ"], "JWT");
        let payload: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap_or("")).expect("b64"))
            .expect("payload json");
        assert_eq!((&payload["userId"], &payload["name"]), (&json!(42), &json!("Zoë")));
        assert_eq!((&payload["gen"], &payload["iatMs"]), (&json!(5), &json!(now * 1000 + 789)));
        for key in ["role", "iss", "aud", "iat", "exp", "jti"] {
            assert!(payload.get(key).is_some(), "{key}");
        }

        let (other, _) = jwt.issue(&who(42, "admin", "N"), now * 1000).expect("issue");
        assert_ne!(jwt.verify(&other).map(|c| c.jti), Ok(claims.jti), "jti is random");
    }

    #[test]
    fn hand_signed_good_token_verifies() {
        let token = sign(Algorithm::HS256, &good_claims(now_unix()));
        assert_eq!(jwt().verify(&token).map(|c| (c.user_id, c.name)), Ok((7, None)), "a token without a name");
    }

    #[test]
    fn a_name_that_is_not_a_string_is_invalid() {
        for bad in [json!(7), json!(["a"]), json!({"a": 1})] {
            let mut claims = good_claims(now_unix());
            claims["name"] = bad.clone();
            assert_eq!(jwt().verify(&sign(Algorithm::HS256, &claims)), Err(AuthError::Invalid), "{bad}");
        }
    }

    #[test]
    fn other_secret_rejected() {
        let (token, _) = jwt().issue(&who(1, "user", "N"), now_ms()).expect("issue");
        let other = Jwt::new(b"another-secret-another-secret-another", "forkd", "forkd-api", Duration::from_secs(TTL));
        assert_eq!(other.verify(&token), Err(AuthError::Invalid));
    }

    #[test]
    fn tampered_signature() {
        let jwt = jwt();
        let (token, _) = jwt.issue(&who(1, "user", "N"), now_ms()).expect("issue");
        let (head, sig) = token.rsplit_once('.').expect("three parts");
        for i in [0, sig.len() / 2, sig.len() - 2] {
            let mut bytes = sig.as_bytes().to_vec();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let forged = format!("{head}.{}", String::from_utf8(bytes).expect("ascii"));
            assert_eq!(jwt.verify(&forged), Err(AuthError::Invalid), "flip at {i}");
        }
        assert_eq!(jwt.verify(&format!("{head}.")), Err(AuthError::Invalid), "empty signature");
    }

    #[test]
    fn tampered_payload() {
        let jwt = jwt();
        let (token, _) = jwt.issue(&who(1, "user", "N"), now_ms()).expect("issue");
        let parts: Vec<&str> = token.split('.').collect();
        let mut payload: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("b64")).expect("payload json");
        payload["role"] = json!("admin");
        let forged = format!("{}.{}.{}", parts[0], b64(&payload), parts[2]);
        assert_ne!(forged, token);
        assert_eq!(jwt.verify(&forged), Err(AuthError::Invalid));
    }

    #[test]
    fn alg_none_rejected() {
        let jwt = jwt();
        let claims = good_claims(now_unix());
        for header in [
            json!({"alg": "none", "typ": "JWT"}),
            json!({"alg": "None", "typ": "JWT"}),
            json!({"alg": "NONE", "typ": "JWT"}),
            json!({"typ": "JWT"}),
        ] {
            let forged = format!("{}.{}.", b64(&header), b64(&claims));
            assert_eq!(jwt.verify(&forged), Err(AuthError::Invalid), "{header}");
        }
        // Even with the genuine HS256 signature of the same header+payload bytes appended.
        let genuine = sign(Algorithm::HS256, &claims);
        let sig = genuine.rsplit_once('.').map(|(_, s)| s).unwrap_or_default();
        let forged = format!("{}.{}.{sig}", b64(&json!({"alg": "none", "typ": "JWT"})), b64(&claims));
        assert_eq!(jwt.verify(&forged), Err(AuthError::Invalid));
    }

    #[test]
    fn other_hmac_algorithms_rejected() {
        let jwt = jwt();
        let claims = good_claims(now_unix());
        for alg in [Algorithm::HS384, Algorithm::HS512] {
            let token = sign(alg, &claims);
            assert_eq!(jwt.verify(&token), Err(AuthError::Invalid), "{alg:?}");
        }
    }

    #[test]
    fn asymmetric_headers_rejected() {
        let jwt = jwt();
        let claims = good_claims(now_unix());
        let genuine = sign(Algorithm::HS256, &claims);
        let hs_sig = genuine.rsplit_once('.').map(|(_, s)| s).unwrap_or_default().to_owned();
        for alg in ["RS256", "RS512", "PS256", "ES256", "ES384", "EdDSA"] {
            let header = b64(&json!({"alg": alg, "typ": "JWT"}));
            // Any signature: garbage, and the HMAC of the forged message (key-confusion attempt).
            let message = format!("{header}.{}", b64(&claims));
            let confused =
                jsonwebtoken::crypto::sign(message.as_bytes(), &EncodingKey::from_secret(SECRET), Algorithm::HS256)
                    .expect("hmac");
            for sig in ["c2lnbmF0dXJl", hs_sig.as_str(), confused.as_str()] {
                assert_eq!(jwt.verify(&format!("{message}.{sig}")), Err(AuthError::Invalid), "{alg}");
            }
        }
    }

    #[test]
    fn expired_by_one_second() {
        let jwt = jwt();
        let now = now_unix();
        let (token, _) = jwt.issue(&who(1, "user", "N"), (now - TTL - 1) * 1000).expect("issue");
        assert_eq!(jwt.verify(&token), Err(AuthError::Invalid));
        // Long expired too.
        let (token, _) = jwt.issue(&who(1, "user", "N"), 1_000_000).expect("issue");
        assert_eq!(jwt.verify(&token), Err(AuthError::Invalid));
    }

    #[test]
    fn expiring_now_is_expired() {
        let jwt = jwt();
        // exp == now (or already past, if the clock ticked in between): no leeway at all.
        let (token, _) = jwt.issue(&who(1, "user", "N"), (now_unix() - TTL) * 1000).expect("issue");
        assert_eq!(jwt.verify(&token), Err(AuthError::Invalid));
    }

    /// `b64(header).b64(claims).HS256-signature` with the right secret.
    fn sign_with_header(header: &Value, claims: &Value) -> String {
        let input = format!("{}.{}", b64(header), b64(claims));
        let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &EncodingKey::from_secret(SECRET), Algorithm::HS256)
            .expect("hmac");
        format!("{input}.{sig}")
    }

    #[test]
    fn a_crit_header_parameter_is_invalid() {
        let jwt = jwt();
        let claims = good_claims(now_unix());
        let plain = sign_with_header(&json!({"alg": "HS256", "typ": "JWT"}), &claims);
        assert_eq!(jwt.verify(&plain).map(|c| c.user_id), Ok(7), "control: the same token without crit");
        for crit in [json!(["exp"]), json!(["b64"]), json!([]), json!("x"), json!(null), json!({})] {
            let header = json!({"alg": "HS256", "typ": "JWT", "crit": crit, "b64": true});
            assert_eq!(jwt.verify(&sign_with_header(&header, &claims)), Err(AuthError::Invalid), "crit: {crit}");
        }
    }

    #[test]
    fn nbf_in_the_future_is_invalid_without_leeway() {
        let jwt = jwt();
        let now = now_unix();
        let hs = json!({"alg": "HS256", "typ": "JWT"});
        for (nbf, ok) in
            [(json!(now - 100), true), (json!(now), true), (json!(now + 2), false), (json!(now + 3600), false)]
        {
            let mut claims = good_claims(now);
            claims["nbf"] = nbf.clone();
            let got = jwt.verify(&sign_with_header(&hs, &claims));
            assert_eq!(got.is_ok(), ok, "nbf {nbf} (now {now}): {got:?}");
        }
        for bad in [json!("0"), json!(-1), json!(null), json!([0])] {
            let mut claims = good_claims(now);
            claims["nbf"] = bad.clone();
            assert_eq!(jwt.verify(&sign_with_header(&hs, &claims)), Err(AuthError::Invalid), "nbf {bad}");
        }
        // What this service issues carries no nbf.
        let (token, _) = jwt.issue(&who(1, "user", "N"), now * 1000).expect("issue");
        assert_eq!(jwt.verify(&token).map(|c| c.nbf), Ok(None));
    }

    #[test]
    fn wrong_issuer_or_audience() {
        let now = now_unix();
        let other_iss = Jwt::new(SECRET, "someone-else", "forkd-api", Duration::from_secs(TTL));
        let other_aud = Jwt::new(SECRET, "forkd", "other-api", Duration::from_secs(TTL));
        let (token, _) = other_iss.issue(&who(1, "user", "N"), now * 1000).expect("issue");
        assert_eq!(jwt().verify(&token), Err(AuthError::Invalid), "wrong iss");
        let (token, _) = other_aud.issue(&who(1, "user", "N"), now * 1000).expect("issue");
        assert_eq!(jwt().verify(&token), Err(AuthError::Invalid), "wrong aud");

        // Arrays are not accepted either, even if they contain the right value.
        let mut claims = good_claims(now);
        claims["aud"] = json!(["forkd-api", "other"]);
        assert_eq!(jwt().verify(&sign(Algorithm::HS256, &claims)), Err(AuthError::Invalid), "aud array");
        let mut claims = good_claims(now);
        claims["iss"] = json!(["forkd"]);
        assert_eq!(jwt().verify(&sign(Algorithm::HS256, &claims)), Err(AuthError::Invalid), "iss array");
    }

    #[test]
    fn missing_required_claims() {
        let jwt = jwt();
        for missing in ["exp", "iss", "aud"] {
            let mut claims = good_claims(now_unix());
            claims.as_object_mut().map(|o| o.remove(missing));
            let token = sign(Algorithm::HS256, &claims);
            assert_eq!(jwt.verify(&token), Err(AuthError::Invalid), "missing {missing}");
            // The Validation itself (not only the Claims struct) demands the claim.
            let err = jsonwebtoken::decode::<Value>(&token, &jwt.decoding, &jwt.validation).expect_err("rejected");
            assert_eq!(err.kind(), &ErrorKind::MissingRequiredClaim(missing.to_owned()), "missing {missing}");
        }
    }

    /// Tokens issued before the account binding existed carry neither claim: refused (their
    /// clients refresh, and the refresh checks the account).
    #[test]
    fn a_token_without_the_account_binding_is_invalid() {
        let jwt = jwt();
        for missing in ["gen", "iatMs"] {
            let mut claims = good_claims(now_unix());
            claims.as_object_mut().map(|o| o.remove(missing));
            assert_eq!(jwt.verify(&sign(Algorithm::HS256, &claims)), Err(AuthError::Invalid), "without {missing}");
        }
        let mut claims = good_claims(now_unix());
        claims.as_object_mut().map(|o| (o.remove("gen"), o.remove("iatMs")));
        assert_eq!(jwt.verify(&sign(Algorithm::HS256, &claims)), Err(AuthError::Invalid), "a token of the old shape");
    }

    #[test]
    fn wrong_claim_types() {
        let jwt = jwt();
        for (key, value) in [
            ("exp", json!("9999999999")),
            ("userId", json!("7")),
            ("role", json!(1)),
            ("gen", json!("0")),
            ("gen", json!(null)),
            ("gen", json!(1.5)),
            ("iatMs", json!(-1)),
            ("iatMs", json!("1")),
        ] {
            let mut claims = good_claims(now_unix());
            claims[key] = value;
            assert_eq!(jwt.verify(&sign(Algorithm::HS256, &claims)), Err(AuthError::Invalid), "{key}");
        }
    }

    #[test]
    fn garbage() {
        let jwt = jwt();
        let dots = ".".repeat(10_240);
        let long = "a".repeat(10_240);
        for garbage in [
            "",
            ".",
            "..",
            "a.b",
            "a.b.c",
            "a.b.c.d",
            "Bearer x.y.z",
            "eyJhbGciOiJIUzI1NiJ9",
            "eyJhbGciOiJIUzI1NiJ9..",
            "\u{0}.\u{0}.\u{0}",
            "ünïcødé.ünïcødé.ünïcødé",
            dots.as_str(),
            long.as_str(),
        ] {
            assert_eq!(jwt.verify(garbage), Err(AuthError::Invalid), "{:?}", &garbage[..garbage.len().min(20)]);
        }
    }

    #[test]
    fn debug_hides_secret() {
        let debug = format!("{:?}", jwt());
        assert!(debug.contains("forkd-api"), "{debug}");
        assert!(!debug.contains("0123456789abcdef"), "{debug}");
        assert!(!debug.to_lowercase().contains("key"), "{debug}");
    }
}
