//! The ACME loop: with a valid certificate, sleep until two thirds of its lifetime; then
//! order a new one (publish the challenge answers, let the CA check them, finalize, store,
//! publish the certificate). A failure is a warning and a retry after a back-off doubling
//! from 1 minute to 1 hour; the loop never ends and never stops the service.
//!
//! Blocking; it runs on the supervisor's ACME thread. It hands what workers serve to
//! [`Publish`] and must not touch workers or the supervisor's state.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::client::{Client, Https};
use super::msg::{AcmeError, Authorization, Order};
use super::{certs, now, store, Challenges, Publish, Published};
use crate::config::{Acme, AcmeChallenge};

/// The first wait after a failure.
pub const MIN_BACKOFF: Duration = Duration::from_secs(60);
/// The longest wait after failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The longest single sleep (the wall clock is read again after it, so a suspended host
/// renews on time).
const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The wait after a failure that followed one of `previous` (doubling, bounded).
pub fn next_backoff(previous: Duration) -> Duration {
    (previous * 2).clamp(MIN_BACKOFF, MAX_BACKOFF)
}

/// `d` for a log line, in its largest whole unit: `90 s`, `59 min`, `23 h`, `60 days`.
pub fn span(d: Duration) -> String {
    match d.as_secs() {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s < 2 * 86_400 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86_400),
    }
}

/// How long to sleep at `now` before renewing a certificate of `validity` (zero: renew now).
pub fn until_renewal(validity: (i64, i64), now: i64) -> Duration {
    Duration::from_secs(u64::try_from(certs::renew_at(validity) - now).unwrap_or(0))
}

/// Run the loop forever: `config` from `[tls.acme]`, files in `dir`, the certificate
/// `current` has on disk (its validity), workers reached through `publish`.
pub fn run(config: Acme, dir: PathBuf, mut current: Option<(i64, i64)>, publish: &dyn Publish) {
    let names = config.domains.join(", ");
    let mut backoff = Duration::ZERO;
    loop {
        if let Some(validity) = current {
            let wait = until_renewal(validity, now());
            if !wait.is_zero() {
                std::thread::sleep(wait.min(MAX_SLEEP));
                continue;
            }
            log::info!("tls.acme: renewing the certificate for {names} (two thirds of its lifetime passed)");
        }
        let mut published = false;
        match obtain(&config, &dir, publish, &mut published) {
            Ok(stored) => {
                let validity = stored.validity;
                let done = publish.publish(Published { key: Some(stored.key), challenges: Arc::default() });
                match done {
                    Ok(()) => log::info!(
                        "tls.acme: new certificate for {names} serving; renewal in {}",
                        span(until_renewal(validity, now()))
                    ),
                    Err(e) => log::warn!("tls.acme: the new certificate is stored but not yet served: {e}"),
                }
                current = Some(validity);
                backoff = Duration::ZERO;
            }
            Err(e) => {
                if published {
                    let _ = publish.publish(Published { key: None, challenges: Arc::default() });
                }
                backoff = next_backoff(backoff);
                log::warn!("tls.acme: cannot obtain a certificate for {names}: {e}; next try in {}", span(backoff));
                std::thread::sleep(backoff);
            }
        }
    }
}

/// One order, start to stored certificate. `published` is set once challenge answers were
/// handed to the workers (the caller withdraws them on failure).
fn obtain(
    config: &Acme,
    dir: &std::path::Path,
    publish: &dyn Publish,
    published: &mut bool,
) -> Result<store::Stored, AcmeError> {
    let ca_file = config.ca_file.as_ref().map(|p| p.to_string_lossy().into_owned());
    let tls = crate::tls::client::config(ca_file.as_deref())
        .map_err(|e| AcmeError::Local(format!("tls.acme.ca_file: {e}")))?;
    let key = store::account_key(dir)?;
    let mut client = Client::new(Https(Arc::new(tls)), &config.directory, key)?;
    client.account(config.email.as_deref())?;
    let (order_url, order) = client.new_order(&config.domains)?;
    log::info!("tls.acme: ordered a certificate for {} ({order_url})", config.domains.join(", "));
    let mut challenges = Challenges::default();
    let mut pending = Vec::new();
    for url in &order.authorizations {
        let (authz, _) = client.get::<Authorization>(url)?;
        let name = authz.identifier.value.clone();
        match authz.status.as_str() {
            "valid" => continue,
            "pending" => {}
            other => return Err(AcmeError::Invalid { what: name, why: format!("authorization {other}") }),
        }
        let kind = config.challenge.name();
        let Some(ch) = authz.challenges.iter().find(|c| c.kind == kind) else {
            return Err(AcmeError::Invalid { what: name, why: format!("the CA offers no {kind} challenge") });
        };
        let answer = client.key.key_authorization(&ch.token);
        match config.challenge {
            AcmeChallenge::Http01 => {
                challenges.http.insert(ch.token.clone(), answer);
            }
            AcmeChallenge::TlsAlpn01 => {
                challenges.tls_alpn.insert(name.clone(), certs::challenge(&name, &answer)?);
            }
        }
        pending.push((url.clone(), ch.url.clone(), name));
    }
    if !pending.is_empty() {
        *published = true;
        publish.publish(Published { key: None, challenges: Arc::new(challenges) })?;
        for (_, challenge, _) in &pending {
            client.respond(challenge)?;
        }
        for (url, _, name) in &pending {
            client.poll::<Authorization, ()>(url, |a| match a.status.as_str() {
                "valid" => Some(Ok(())),
                "pending" | "processing" => None,
                other => {
                    let why = a
                        .challenges
                        .iter()
                        .find_map(|c| c.error.as_ref().map(|p| format!("{}: {}", p.kind, p.detail)))
                        .unwrap_or_else(|| format!("authorization {other}"));
                    Some(Err(AcmeError::Invalid { what: name.clone(), why }))
                }
            })?;
        }
    }
    let settle = |want: &'static str| {
        move |o: &Order| match o.status.as_str() {
            s if s == want => Some(Ok(())),
            "pending" | "ready" | "processing" => None,
            other => {
                let why =
                    o.error.as_ref().map_or_else(|| format!("order {other}"), |p| format!("{}: {}", p.kind, p.detail));
                Some(Err(AcmeError::Invalid { what: "the order".into(), why }))
            }
        }
    };
    client.poll::<Order, ()>(&order_url, settle("ready"))?;
    let (csr, cert_key) = certs::csr(&config.domains)?;
    client.finalize(&order.finalize, &csr)?;
    client.poll::<Order, ()>(&order_url, settle("valid"))?;
    let (order, _) = client.get::<Order>(&order_url)?;
    let Some(cert_url) = order.certificate else {
        return Err(AcmeError::Protocol { url: order_url, why: "a valid order without a certificate URL".into() });
    };
    let chain = client.download(&cert_url)?;
    store::save(dir, &chain, &cert_key, &config.domains)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_a_minute_to_an_hour() {
        let mut b = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..9 {
            b = next_backoff(b);
            seen.push(b.as_secs());
        }
        assert_eq!(seen, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
    }

    #[test]
    fn spans_read_in_their_largest_unit() {
        let s = Duration::from_secs;
        assert_eq!([span(s(9)), span(s(119)), span(s(120)), span(s(7199))], ["9 s", "119 s", "2 min", "119 min"]);
        assert_eq!([span(s(7200)), span(s(60 * 86_400))], ["2 h", "60 days"]);
    }

    #[test]
    fn renewal_waits_until_two_thirds_of_the_lifetime() {
        let day = 86_400;
        assert_eq!(until_renewal((0, 90 * day), 0), Duration::from_secs(60 * day as u64));
        assert_eq!(until_renewal((0, 90 * day), 59 * day), Duration::from_secs(day as u64));
        assert_eq!(until_renewal((0, 90 * day), 61 * day), Duration::ZERO);
    }
}
