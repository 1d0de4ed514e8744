//! The supervisor's side of automatic certificates (`[tls.acme]`): the certificate the TLS
//! listener starts with (the one stored under `data_dir/acme` while valid, else a self-signed
//! placeholder), the thread the ACME loop (`crate::acme::service`) runs on, and the hand-over
//! of what it publishes: the supervisor takes the new certificate or challenge answers into
//! its own state and replaces the workers one slot at a time, as a HUP does, so every new
//! worker is forked with them and no connection is dropped. The thread waits until that
//! replacement is complete.
//!
//! Fork safety: the thread shares only [`Shared`] with the loop, and a worker is forked with
//! the supervisor's own copies (`tls_key`, `challenges`), never with that mutex; the thread
//! starts once the first workers serve. It owns no socket of the slots and never forks.

use std::path::PathBuf;
use std::sync::{Condvar, Mutex};

use super::*;
use crate::acme::{AcmeError, Challenges, Publish, Published};

/// Poll token of the ACME thread's waker (below the upgrade pipe's and Redis' tokens).
pub(super) const ACME: Token = Token(usize::MAX - 3);
/// Longest the ACME thread waits for the workers to take what it published.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(300);

/// What the ACME thread and the supervisor's loop share.
struct Shared {
    state: Mutex<State>,
    applied: Condvar,
    waker: mio::Waker,
}

#[derive(Default)]
struct State {
    /// Published by the thread, not yet taken by the loop.
    next: Option<Published>,
    /// How many values were published.
    requested: u64,
    /// Up to which of them every worker serves.
    applied: u64,
}

/// The thread's end: [`Publish`] hands a value to the loop and waits for the workers.
struct Handle(Arc<Shared>);

impl Publish for Handle {
    fn publish(&self, p: Published) -> Result<(), AcmeError> {
        fn lost<T>(_: T) -> AcmeError {
            AcmeError::Local("the supervisor's ACME state is poisoned".into())
        }
        let mut state = self.0.state.lock().map_err(lost)?;
        state.next = Some(p);
        state.requested += 1;
        let want = state.requested;
        self.0.waker.wake().map_err(|e| AcmeError::Local(format!("cannot wake the supervisor: {e}")))?;
        let (state, timeout) =
            self.0.applied.wait_timeout_while(state, PUBLISH_TIMEOUT, |s| s.applied < want).map_err(lost)?;
        if timeout.timed_out() && state.applied < want {
            return Err(AcmeError::Local("the workers were not replaced within 300 s".into()));
        }
        Ok(())
    }
}

/// What the ACME thread starts with: `[tls.acme]`, the directory of its files, and the
/// validity of the certificate stored there (`None`: none yet).
type ThreadStart = (crate::config::Acme, PathBuf, Option<(i64, i64)>);

/// The supervisor's end.
pub(super) struct Link {
    shared: Arc<Shared>,
    /// What the thread starts with, until it is started.
    start: Option<ThreadStart>,
    /// The publication a worker replacement in progress applies.
    applying: Option<u64>,
    /// The challenge answers workers are forked with.
    pub(super) challenges: Arc<Challenges>,
}

/// The certificate to start with under `config`'s `[tls.acme]`, and the link to the ACME
/// thread (`None` without ACME).
pub(super) fn start(config: &Config, registry: &mio::Registry) -> io::Result<Option<(Arc<CertifiedKey>, Link)>> {
    let Some(acme) = &config.tls.acme else { return Ok(None) };
    let dir = crate::acme::store::dir(&config.data_dir);
    let names = acme.domains.join(", ");
    let stored = match crate::acme::store::current(&dir, &acme.domains, crate::acme::now()) {
        Ok(stored) => stored,
        Err(e) => {
            log::warn!("tls.acme: the stored certificate cannot be used ({e}); ordering a new one");
            None
        }
    };
    let (key, validity) = match stored {
        Some(s) => {
            log::info!(
                "tls.acme: serving the certificate for {names} from {} (renewal in {})",
                dir.display(),
                crate::acme::service::span(crate::acme::service::until_renewal(s.validity, crate::acme::now()))
            );
            (s.key, Some(s.validity))
        }
        None => {
            log::info!(
                "tls.acme: no certificate for {names} yet: the TLS listener serves a self-signed placeholder until the CA issues one"
            );
            let key = crate::acme::certs::placeholder(&acme.domains)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("tls.acme: {e}")))?;
            (key, None)
        }
    };
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        applied: Condvar::new(),
        waker: mio::Waker::new(registry, ACME)?,
    });
    let link = Link { shared, start: Some((acme.clone(), dir, validity)), applying: None, challenges: Arc::default() };
    Ok(Some((key, link)))
}

impl Supervisor {
    /// Start the ACME thread once the workers serve; take what it published and replace the
    /// workers with it; tell it when they all serve it.
    pub(super) fn step_acme(&mut self) {
        let Some(link) = self.acme.as_mut() else { return };
        if self.stopping.is_some() {
            return;
        }
        if self.ready {
            if let Some((config, dir, validity)) = link.start.take() {
                let handle = Handle(Arc::clone(&link.shared));
                let spawned = std::thread::Builder::new()
                    .name("forkd-acme".into())
                    .spawn(move || crate::acme::service::run(config, dir, validity, &handle));
                if let Err(e) = spawned {
                    log::error!("tls.acme: cannot start the ACME thread: {e}; no certificate will be obtained");
                }
            }
        }
        if let (Some(want), None) = (link.applying, &self.reload) {
            if let Ok(mut state) = link.shared.state.lock() {
                state.applied = want;
                link.shared.applied.notify_all();
            }
            link.applying = None;
        }
        let taken = match link.shared.state.lock() {
            Ok(mut state) => state.next.take().map(|p| (p, state.requested)),
            Err(_) => None,
        };
        let Some((published, generation)) = taken else { return };
        let what = match (&published.key, published.challenges.http.len() + published.challenges.tls_alpn.len()) {
            (Some(_), _) => "a new certificate",
            (None, 0) => "challenge answers withdrawn",
            (None, _) => "challenge answers",
        };
        if let Some(key) = published.key {
            self.tls_key = Some(key);
        }
        link.challenges = published.challenges;
        link.applying = Some(generation);
        let n = self.slots.len();
        match self.reload.as_mut() {
            // A replacement under way starts over, so every worker gets the new state.
            Some(r) => r.pending = (0..n).collect(),
            None => self.reload = Some(Reload { pending: (0..n).collect(), current: None, label: "tls.acme" }),
        }
        log::info!("tls.acme: {what}: replacing {n} worker(s) one by one");
    }
}
