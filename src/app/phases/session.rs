//! Who is asking: bearer tokens, cookies and the CSRF double submit (§5).
//!
//! Verifying an HS256 token is a few microseconds of HMAC, so it runs on
//! the event loop; anything touching the database or a password hash is a
//! pool job in the handlers.
//!
//! **A token stands for an account, not for a number.** Ids are never given
//! twice (the store's migration 3), and an access token carries, besides
//! `userId`, the account's token generation (`gen`, bumped by a password or
//! role change) and the instant its row was read (`iatMs`). A token is void
//! once its account is deleted, or its password or role changes, and two
//! checks see to it:
//!
//! - on the event loop, for every request with a token ([`optional`]): the
//!   shared table of recent revocations (`shm::revoked`), one load. The worker
//!   that deletes an account or changes its password or role records it there
//!   after the commit and before its answer ([`revoke`]), so from that answer
//!   on every worker of the host refuses the old tokens with 401;
//! - on the pool, in every handler's job that acts for the caller
//!   ([`confirm`]): the account's row, the truth. It catches what the table
//!   cannot know: a change made on another host (PostgreSQL), by the workers of
//!   another supervisor (a binary upgrade), or before this supervisor started.
//!
//! What the loop answers without the pool (the memo of users, the homepage,
//! the chat's upgrade) relies on the table alone; the memo only for tokens the
//! table covers (read since its birth, and since any foreign writer left).
//!
//! The per-worker cache of verified tokens ([`Verified`]) keeps only the
//! signature's verdict: the revocation check runs on every use.

use crate::app::Services;
use crate::auth::jwt::Claims;
use crate::auth::tokens::constant_time_eq;
use crate::config::Config;
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::Response;

use crate::app::App;

/// The verified caller.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// User id from the token.
    pub user_id: i64,
    /// Role from the token.
    pub admin: bool,
    /// The account's token generation the token was issued under.
    pub gen: i64,
    /// When the account was read for the token (ms since the epoch).
    pub read_ms: u64,
}

impl From<&Claims> for Caller {
    fn from(c: &Claims) -> Caller {
        Caller { user_id: c.user_id, admin: c.role == "admin", gen: c.gen, read_ms: c.iat_ms }
    }
}

/// Require a valid bearer token: 401 `token required` / `invalid token`.
pub fn require(app: &App, req: &Request<'_>) -> Result<Caller, Error> {
    optional(app, req)?.ok_or(Error::Unauthorized("token required"))
}

/// Access tokens already verified by this worker: token → (caller, `exp`,
/// last use).
///
/// Verifying an HS256 token (base64, JSON, HMAC) costs several microseconds;
/// a client sends the same token with every request until it expires. The
/// signature's answer for a given token string never changes under one
/// signing secret (a reload starts new workers with an empty map), so
/// remembering it is exact, not an approximation: `exp` and the revocations
/// are still checked on every use. Failures are not kept.
///
/// Bounded in count ([`VERIFIED_MAX`]: emptied when full) and in time: every
/// [`VERIFIED_IDLE`] seconds, on a miss, tokens unused for that long or
/// expired are dropped. Without the sweep a worker kept every token it ever
/// saw until the map filled: with one login a second (each client moving to
/// its new token) that grew a worker's heap by ~0.3 KiB a second for over an
/// hour. A client that pauses longer than [`VERIFIED_IDLE`] pays one
/// verification when it comes back.
#[derive(Default)]
pub struct Verified {
    map: std::collections::HashMap<Box<str>, Entry, std::hash::BuildHasherDefault<SignatureHash>>,
    /// When (unix seconds) the next miss sweeps the map.
    next_sweep: u64,
}

/// Hashes a token by its last eight bytes, which are part of its HMAC-SHA256
/// signature, instead of SipHash over all of it (~200 bytes, a fifth of the
/// loop's work on an authenticated request). Only tokens that verified are
/// kept, and nobody without the signing key can choose a signature, so keys
/// that collide cannot be made on purpose: the flooding SipHash guards against
/// is out of reach.
#[derive(Default)]
pub struct SignatureHash(u64);

impl std::hash::Hasher for SignatureHash {
    fn write(&mut self, bytes: &[u8]) {
        let tail = &bytes[bytes.len().saturating_sub(8)..];
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        self.0 = (self.0 ^ u64::from_le_bytes(word)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        // Every input bit reaches the low bits the table indexes with.
        let x = self.0 ^ (self.0 >> 33);
        let x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^ (x >> 33)
    }
}

#[derive(Clone, Copy)]
struct Entry {
    caller: Caller,
    exp: u64,
    used: u64,
}

/// Entries [`Verified`] holds before it starts over.
const VERIFIED_MAX: usize = 4096;
/// Seconds a remembered token may go unused before a sweep drops it.
const VERIFIED_IDLE: u64 = 60;

impl Verified {
    /// The caller of `token` if it was verified before and has not expired.
    fn get(&mut self, token: &str, now: u64) -> Option<Caller> {
        let e = self.map.get_mut(token).filter(|e| e.exp > now)?;
        e.used = now;
        Some(e.caller)
    }

    /// Remember a freshly verified token; sweeps first when a sweep is due.
    fn insert(&mut self, token: &str, caller: Caller, exp: u64, now: u64) {
        if now >= self.next_sweep {
            self.next_sweep = now + VERIFIED_IDLE;
            self.map.retain(|_, e| e.exp > now && e.used + VERIFIED_IDLE > now);
            if self.map.capacity() > 64 && self.map.len() < self.map.capacity() / 4 {
                self.map.shrink_to_fit();
            }
        }
        if self.map.len() >= VERIFIED_MAX {
            self.map.clear();
        }
        self.map.insert(token.into(), Entry { caller, exp, used: now });
    }

    /// Tokens held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// A valid bearer token if one is sent; a bad one is still 401, and so is
/// one whose account was revoked since it was read (as far as this host's
/// table knows; [`confirm`] checks the store).
pub fn optional(app: &App, req: &Request<'_>) -> Result<Option<Caller>, Error> {
    let Some(value) = req.header("authorization") else { return Ok(None) };
    let token = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .and_then(|t| std::str::from_utf8(t).ok())
        .ok_or(Error::Unauthorized("invalid token"))?;
    let now = crate::auth::jwt::now_unix();
    let remembered = app.verified.borrow_mut().get(token, now);
    let caller = match remembered {
        Some(caller) => caller,
        None => {
            let claims = app.svc.jwt.verify(token)?;
            let caller = Caller::from(&claims);
            app.verified.borrow_mut().insert(token, caller, claims.exp, now);
            caller
        }
    };
    standing(app.svc, caller).map(Some)
}

/// The caller of an access token given elsewhere than in `Authorization`
/// (the chat's `?token=`), with the same checks as [`optional`]; and its
/// claims.
pub fn from_token(app: &App, token: &str) -> Result<(Caller, Claims), Error> {
    let claims = app.svc.jwt.verify(token)?;
    let caller = standing(app.svc, Caller::from(&claims))?;
    Ok((caller, claims))
}

/// `caller`, unless the table of recent revocations voids its token.
fn standing(svc: &Services, caller: Caller) -> Result<Caller, Error> {
    if svc.region.revoked.revoked(caller.user_id, caller.read_ms) {
        return Err(Error::Unauthorized("invalid token"));
    }
    Ok(caller)
}

/// Whether the table of recent revocations has seen every revocation that
/// could concern `caller`'s token, so that the loop may answer for it alone
/// (the memo of users). The memo's own gate (no foreign writer since the
/// token was read) is the caller's to add.
pub fn covered(svc: &Services, caller: &Caller) -> bool {
    svc.region.revoked.covers(caller.read_ms)
}

/// The store's word on `caller` (in a pool job, before acting for it): its
/// account still exists and has the token's generation, else 401 `invalid
/// token`. One indexed read by id.
pub fn confirm(svc: &Services, caller: &Caller) -> Result<(), Error> {
    match svc.store.token_gen(caller.user_id)? {
        Some(gen) if gen == caller.gen => Ok(()),
        _ => Err(Error::Unauthorized("invalid token")),
    }
}

/// Record that user `id`'s tokens read until now are void: after the
/// deletion, or the password or role change, committed, and before the
/// answer goes out (pool jobs).
pub fn revoke(svc: &Services, id: i64) {
    svc.region.revoked.revoke(id, crate::auth::jwt::now_ms(), ttl_ms(svc));
}

/// This worker's access-token lifetime in ms.
pub fn ttl_ms(svc: &Services) -> u64 {
    u64::try_from(svc.config.auth.access_ttl.as_millis()).unwrap_or(u64::MAX)
}

/// The value of cookie `name`.
pub fn cookie<'a>(req: &Request<'a>, name: &str) -> Option<&'a str> {
    req.headers
        .get_all("cookie")
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The CSRF double submit: `X-CSRF-Token` must equal the `csrf_token` cookie.
pub fn check_csrf(req: &Request<'_>) -> Result<(), Error> {
    let header = req.header("x-csrf-token").unwrap_or(b"");
    let cookie = cookie(req, "csrf_token").unwrap_or("");
    if header.is_empty() || cookie.is_empty() || !constant_time_eq(header, cookie.as_bytes()) {
        return Err(Error::Forbidden("CSRF token missing or invalid"));
    }
    Ok(())
}

/// Set the refresh and CSRF cookies (login, refresh).
pub fn set_cookies(r: &mut Response, config: &Config, refresh: &str, csrf: &str) {
    let secure = if config.auth.cookie_secure { "; Secure" } else { "" };
    let age = config.auth.refresh_ttl.as_secs();
    r.header(
        "Set-Cookie",
        format!("refresh_token={refresh}; HttpOnly{secure}; SameSite=Strict; Path=/api/v1/auth; Max-Age={age}"),
    );
    r.header("Set-Cookie", format!("csrf_token={csrf}{secure}; SameSite=Strict; Path=/; Max-Age={age}"));
}

/// Clear both cookies (same Path, `Max-Age=0`).
pub fn clear_cookies(r: &mut Response, config: &Config) {
    let secure = if config.auth.cookie_secure { "; Secure" } else { "" };
    r.header("Set-Cookie", format!("refresh_token=; HttpOnly{secure}; SameSite=Strict; Path=/api/v1/auth; Max-Age=0"));
    r.header("Set-Cookie", format!("csrf_token={secure}; SameSite=Strict; Path=/; Max-Age=0"));
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Caller = Caller { user_id: 7, admin: false, gen: 0, read_ms: 0 };

    #[test]
    fn a_remembered_token_answers_until_it_expires() {
        let mut v = Verified::default();
        v.insert("t", ME, 1_000, 100);
        assert_eq!(v.get("t", 999).map(|c| c.user_id), Some(7));
        assert!(v.get("t", 1_000).is_none(), "expired at exp");
        assert!(v.get("other", 100).is_none());
    }

    #[test]
    fn tokens_nobody_uses_any_more_are_swept() {
        // One new token a second, each used once (a client that logs in every second):
        // the map holds about a minute of them, not every token ever seen.
        let mut v = Verified::default();
        for i in 0..3_600u64 {
            let now = 1_000 + i;
            v.insert(&format!("token-{i}"), ME, now + 900, now);
            assert!(v.get(&format!("token-{i}"), now).is_some());
        }
        assert!(v.len() <= 2 * VERIFIED_IDLE as usize, "{} tokens held", v.len());
        assert!(v.map.capacity() <= 4 * 2 * VERIFIED_IDLE as usize, "capacity {}", v.map.capacity());
    }

    #[test]
    fn a_token_in_use_survives_the_sweeps() {
        let mut v = Verified::default();
        v.insert("busy", ME, 100_000, 1_000);
        for i in 1..1_000u64 {
            let now = 1_000 + i;
            assert!(v.get("busy", now).is_some(), "second {i}");
            v.insert(&format!("other-{i}"), ME, now + 900, now);
        }
    }

    #[test]
    fn tokens_with_the_same_signature_tail_are_still_told_apart() {
        let mut v = Verified::default();
        v.insert("head-a.payload.SIGNATURE", ME, 10_000, 0);
        v.insert("head-b.payload.SIGNATURE", Caller { user_id: 8, admin: true, ..ME }, 10_000, 0);
        assert_eq!(v.get("head-a.payload.SIGNATURE", 1).map(|c| c.user_id), Some(7));
        assert_eq!(v.get("head-b.payload.SIGNATURE", 1).map(|c| c.user_id), Some(8));
        assert!(v.get("head-c.payload.SIGNATURE", 1).is_none());
    }

    #[test]
    fn signature_tails_spread_over_the_low_bits() {
        use std::hash::BuildHasher;
        let b = std::hash::BuildHasherDefault::<SignatureHash>::default();
        let buckets: std::collections::BTreeSet<u64> =
            (0..256).map(|i| b.hash_one(format!("x.y.sig{i:05}")) & 0xff).collect();
        assert!(buckets.len() > 128, "{} of 256 low-byte buckets used", buckets.len());
    }

    #[test]
    fn the_map_starts_over_when_full() {
        let mut v = Verified::default();
        for i in 0..VERIFIED_MAX + 1 {
            v.insert(&format!("token-{i}"), ME, 10_000, 0);
        }
        assert_eq!(v.len(), 1);
    }
}
