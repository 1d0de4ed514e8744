//! The rate-limit phase (CONTRACT §8) and the login-failure limiter (§2
//! `login_max_failures`), both on the shared-memory table in
//! `crate::shm::ratelimit`, so a limit is counted once across all workers.
//!
//! `/api/*` and `/csp-report` count per client address; `/health` and pages
//! do not. Limited responses carry `RateLimit-Policy`, `RateLimit-Limit`,
//! `RateLimit-Remaining` and `RateLimit-Reset` (IETF draft names, no
//! `X-RateLimit-*`); a refused one is 429 with `Retry-After`.

use crate::config::Config;
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::shm::ratelimit::{Decision, RateTable};
use std::borrow::Cow;

/// Count this request if its route is limited; `Err(429)` when over.
pub fn check(config: &Config, table: &RateTable, req: &Request<'_>) -> Result<Option<Decision>, Error> {
    let rl = &config.rate_limit;
    if !rl.enabled || !(req.path.starts_with("/api/") || req.path == "/csp-report") {
        return Ok(None);
    }
    let key = match req.peer {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    let d = table.hit(&key, crate::sys::monotonic_ms(), rl.window.as_millis() as u64, rl.max);
    if d.allowed {
        Ok(Some(d))
    } else {
        Err(Error::TooManyRequests { retry_after: d.reset_secs, decision: Some(d) })
    }
}

/// Add the `RateLimit-*` headers.
pub fn decorate(r: &mut Response, config: &Config, d: &Decision) {
    let window = config.rate_limit.window.as_secs();
    // The policy of the general limiter is the same on every response: rendered once.
    static POLICY: std::sync::OnceLock<(u64, u64, &'static str)> = std::sync::OnceLock::new();
    let &(limit, w, text) =
        POLICY.get_or_init(|| (d.limit, window, Box::leak(format!("{};w={window}", d.limit).into_boxed_str())));
    let policy = if (limit, w) == (d.limit, window) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("{};w={window}", d.limit))
    };
    r.header("RateLimit-Policy", policy)
        .header("RateLimit-Limit", number(d.limit))
        .header("RateLimit-Remaining", number(d.remaining))
        .header("RateLimit-Reset", number(d.reset_secs));
}

/// Numbers below this are served from one static string of their decimal forms.
const SMALL_NUMBERS: u64 = 10_000;

/// `n` in decimal: a slice of a string built once (`"0123456789101112…9999"`)
/// for the small numbers every response carries, an allocation only beyond.
fn number(n: u64) -> Cow<'static, str> {
    static DIGITS: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    if n >= SMALL_NUMBERS {
        return Cow::Owned(n.to_string());
    }
    let all = DIGITS.get_or_init(|| {
        let s: String = (0..SMALL_NUMBERS).map(|i| i.to_string()).collect();
        Box::leak(s.into_boxed_str())
    });
    // Where `n` starts: the digits of every smaller number (1 digit below 10, 2 below 100, …).
    let (start, len) = match n {
        0..=9 => (n, 1),
        10..=99 => (10 + 2 * (n - 10), 2),
        100..=999 => (190 + 3 * (n - 100), 3),
        _ => (2890 + 4 * (n - 1000), 4),
    };
    all.get(start as usize..(start + len) as usize).map_or_else(|| Cow::Owned(n.to_string()), Cow::Borrowed)
}

fn login_key(req_peer: std::net::IpAddr, email: &str) -> Vec<u8> {
    let mut k = b"login\0".to_vec();
    k.extend_from_slice(req_peer.to_string().as_bytes());
    k.push(0);
    k.extend_from_slice(email.to_lowercase().as_bytes());
    k
}

/// Login failures per (address, e-mail): the limiter a login consults first,
/// feeds on failure and clears on success.
#[derive(Clone)]
pub struct LoginGuard {
    key: Vec<u8>,
    window_ms: u64,
    max: u64,
    enabled: bool,
}

impl LoginGuard {
    /// The guard for a login attempt by `peer` for `email`.
    pub fn new(config: &Config, peer: std::net::IpAddr, email: &str) -> LoginGuard {
        let rl = &config.rate_limit;
        LoginGuard {
            key: login_key(peer, email),
            window_ms: rl.window.as_millis() as u64,
            max: rl.login_max_failures,
            enabled: rl.enabled,
        }
    }

    /// 429 when this address has used up its failures for this e-mail.
    pub fn check(&self, table: &RateTable) -> Result<(), Error> {
        if !self.enabled {
            return Ok(());
        }
        let d = table.peek(&self.key, crate::sys::monotonic_ms(), self.window_ms, self.max);
        if d.allowed {
            Ok(())
        } else {
            Err(Error::TooManyRequests { retry_after: d.reset_secs, decision: None })
        }
    }

    /// Count a failure.
    pub fn failed(&self, table: &RateTable) {
        if self.enabled {
            table.hit(&self.key, crate::sys::monotonic_ms(), self.window_ms, self.max);
        }
    }

    /// Forget the failures after a success.
    pub fn succeeded(&self, table: &RateTable) {
        if self.enabled {
            table.reset(&self.key, self.window_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_their_decimal_forms() {
        for n in (0..12_000u64).chain([u64::MAX, 123_456]) {
            assert_eq!(number(n), n.to_string(), "{n}");
        }
        assert!(matches!(number(9_999), Cow::Borrowed(_)));
    }
}
