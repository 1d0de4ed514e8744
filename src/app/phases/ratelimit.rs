//! The rate-limit phase (CONTRACT §8) and the login-failure limiter (§2
//! `login_max_failures`), both on the shared-memory table in
//! `crate::shm::ratelimit`, so a limit is counted once across all workers.
//!
//! `/api/*` and `/csp-report` count per client address (behind a trusted proxy, the client it
//! names: `crate::http::client`); `/health` and pages
//! do not. Limited responses carry `RateLimit-Policy`, `RateLimit-Limit`,
//! `RateLimit-Remaining` and `RateLimit-Reset` (IETF draft names, no
//! `X-RateLimit-*`); a refused one is 429 with `Retry-After`.

use crate::config::Config;
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::{Inline, Response, Value};
use crate::shm::ratelimit::{Decision, RateTable, Slot};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

/// Count this request from `client` (the address `crate::http::client` decided) if its route
/// is limited; `Err(429)` when over.
pub fn check(config: &Config, table: &RateTable, req: &Request<'_>, client: IpAddr) -> Result<Option<Decision>, Error> {
    let rl = &config.rate_limit;
    if !rl.enabled || !(req.path.starts_with("/api/") || req.path == "/csp-report") {
        return Ok(None);
    }
    // The client's address bytes, on the stack (4 for IPv4, 16 for IPv6).
    let mut key = [0u8; 16];
    let key: &[u8] = match client {
        IpAddr::V4(a) => {
            key[..4].copy_from_slice(&a.octets());
            &key[..4]
        }
        IpAddr::V6(a) => {
            key = a.octets();
            &key
        }
    };
    let d = table.hit(key, crate::sys::monotonic_ms(), rl.window.as_millis() as u64, rl.max);
    if d.allowed {
        Ok(Some(d))
    } else {
        if config.is_development() {
            explain_once(&EXPLAINED_MAX, || {
                format!(
                    "rate limit: a client went over rate_limit.max = {} requests per {} s (429); \
                     in development raise it with FORKD_RATE_LIMIT__MAX=<n> or turn limiting off with \
                     FORKD_RATE_LIMIT__ENABLED=false (logged once per worker)",
                    rl.max,
                    rl.window.as_secs()
                )
            });
        }
        Err(Error::TooManyRequests { retry_after: d.reset_secs, decision: Some(d) })
    }
}

/// Whether this process already explained the request limit (development
/// only). Per process: every worker logs its own first refusal.
static EXPLAINED_MAX: AtomicBool = AtomicBool::new(false);
/// The same for the login-failure limit.
static EXPLAINED_LOGIN: AtomicBool = AtomicBool::new(false);

/// Log `line()` at warn level the first time only: a developer who hits a
/// limit learns which one and how to change it, without a line per 429.
fn explain_once(done: &AtomicBool, line: impl FnOnce() -> String) {
    if !done.swap(true, Ordering::Relaxed) {
        log::warn!("{}", line());
    }
}

/// Add the `RateLimit-*` headers: each value formatted in place, no allocation.
pub fn decorate(r: &mut Response, config: &Config, d: &Decision) {
    let window = config.rate_limit.window.as_secs();
    let mut policy = Inline::default();
    let policy = if policy.push_uint(d.limit) && policy.push(";w=") && policy.push_uint(window) {
        Value::Inline(policy)
    } else {
        Value::display(format_args!("{};w={window}", d.limit))
    };
    r.header("RateLimit-Policy", policy)
        .header("RateLimit-Limit", Value::uint(d.limit))
        .header("RateLimit-Remaining", Value::uint(d.remaining))
        .header("RateLimit-Reset", Value::uint(d.reset_secs));
}

fn login_key(client: IpAddr, email: &str) -> Vec<u8> {
    let mut k = b"login\0".to_vec();
    k.extend_from_slice(client.to_string().as_bytes());
    k.push(0);
    k.extend_from_slice(email.to_lowercase().as_bytes());
    k
}

/// Login attempts per (address, e-mail): every attempt takes a slot in the
/// shared table *before* its password is checked, so at most
/// `login_max_failures` passwords are ever checked per window, however many
/// attempts run at once, across all workers. A failure keeps its slot; a
/// success gives it back (failures before it still count: they are not
/// forgotten, or a correct login would buy a guesser a new budget).
#[derive(Clone)]
pub struct LoginGuard {
    key: Vec<u8>,
    window_ms: u64,
    max: u64,
    enabled: bool,
    development: bool,
}

impl LoginGuard {
    /// The guard for a login attempt by `client` (the decided address, `Ctx::client`) for
    /// `email`.
    pub fn new(config: &Config, client: IpAddr, email: &str) -> LoginGuard {
        let rl = &config.rate_limit;
        LoginGuard {
            key: login_key(client, email),
            window_ms: rl.window.as_millis() as u64,
            max: rl.login_max_failures,
            enabled: rl.enabled,
            development: config.is_development(),
        }
    }

    /// Take a slot for this attempt: 429 when this address has no attempt
    /// left for this e-mail in the current window.
    pub fn take(self, table: &'static RateTable) -> Result<LoginSlot, Error> {
        if !self.enabled {
            return Ok(LoginSlot { guard: self, table, slot: None });
        }
        match table.take(&self.key, crate::sys::monotonic_ms(), self.window_ms, self.max) {
            (_, Some(slot)) => Ok(LoginSlot { guard: self, table, slot: Some(slot) }),
            (d, None) => {
                if self.development {
                    explain_once(&EXPLAINED_LOGIN, || {
                        format!(
                            "rate limit: a client went over rate_limit.login_max_failures = {} failed logins \
                             per address and e-mail per {} s (429); in development raise it with \
                             FORKD_RATE_LIMIT__LOGIN_MAX_FAILURES=<n> or turn limiting off with \
                             FORKD_RATE_LIMIT__ENABLED=false (logged once per worker)",
                            self.max,
                            self.window_ms / 1000
                        )
                    });
                }
                Err(Error::TooManyRequests { retry_after: d.reset_secs, decision: None })
            }
        }
    }
}

/// The slot one login attempt holds. Dropped, it is given back (a success,
/// or an attempt that never got to check its password); [`LoginSlot::failed`]
/// keeps it for the rest of the window.
pub struct LoginSlot {
    guard: LoginGuard,
    table: &'static RateTable,
    slot: Option<Slot>,
}

impl LoginSlot {
    /// The password was wrong (or the e-mail unknown): the slot stays taken.
    pub fn failed(mut self) {
        self.slot = None;
    }
}

impl Drop for LoginSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.table.give_back(&self.guard.key, slot, self.guard.window_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_are_the_decimal_forms_held_in_place() {
        let config = crate::config::load(None, &[]).expect("the defaults are valid");
        let window = config.rate_limit.window.as_secs();
        for (limit, remaining, reset) in
            [(100, 99, 60), (u64::MAX, 123_456, 0), (1_000_000_000_000, 999_999_999_999, 59)]
        {
            let mut r = Response::new(200);
            decorate(&mut r, &config, &Decision { allowed: true, limit, remaining, reset_secs: reset });
            let got: Vec<(&str, &str)> = r.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let policy = format!("{limit};w={window}");
            let (limit, remaining, reset) = (limit.to_string(), remaining.to_string(), reset.to_string());
            let want = [
                ("RateLimit-Policy", policy.as_str()),
                ("RateLimit-Limit", limit.as_str()),
                ("RateLimit-Remaining", remaining.as_str()),
                ("RateLimit-Reset", reset.as_str()),
            ];
            assert_eq!(got, want);
            assert!(r.headers.iter().skip(1).all(|(_, v)| matches!(v, Value::Inline(_))), "{got:?}");
        }
    }
}
