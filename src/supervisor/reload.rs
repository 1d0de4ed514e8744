//! SIGHUP: read the configuration again, validate it, bring the declared resources' tables
//! to it, and replace the workers one slot at a time so that each new worker serves before
//! the old one of its slot drains. An invalid configuration changes nothing.
//!
//! It owns the reload's progress (`Reload`) and the schema step; it does not fork (that is
//! `spawn`) and does not touch the slots' sockets.

use super::*;
/// A configuration reload in progress: slots still to replace, the
/// replacement currently starting (slot, new pid, when it was forked), and
/// what its log lines start with (`SIGHUP`, or `tls.acme` for a new
/// certificate or challenge answers).
pub(super) struct Reload {
    pub(super) pending: std::collections::VecDeque<usize>,
    pub(super) current: Option<(usize, i32, Instant)>,
    pub(super) label: &'static str,
}

/// Why the declared resources' tables could not be brought to a configuration.
pub(super) enum SchemaRefused {
    /// Destructive changes, one line each: they wait for `forkd migrate --apply`.
    Destructive(String),
    /// The database failed.
    Failed(String),
}

/// Apply the additive schema changes `config`'s declared resources need; refuse (and apply
/// nothing) when any change is destructive.
pub(super) fn schema_step(config: &Config) -> Result<(), SchemaRefused> {
    use crate::store::schema::Mode;
    let target = crate::store::Target::of(config);
    let plan = crate::store::Store::migrate_resources(target, &config.resources, Mode::Additive)
        .map_err(|e| SchemaRefused::Failed(e.to_string()))?;
    if !plan.applied && plan.destructive().next().is_some() {
        let lines: Vec<&str> = plan.destructive().map(|s| s.line.as_str()).collect();
        return Err(SchemaRefused::Destructive(lines.join("\n")));
    }
    for step in &plan.steps {
        log::info!("schema: {}", step.line);
    }
    Ok(())
}

/// The settings a reload cannot change (their sockets or connection live as long as the
/// supervisor), as the sentence refusing the reload; `None` when none changed. `activated`:
/// the plain sockets were handed in by the service manager; `tls_activated`: the TLS ones too
/// (a handed-in socket's address is not ours to change either way).
pub(super) fn restart_only_change(old: &Config, new: &Config, activated: bool, tls_activated: bool) -> Option<String> {
    if new.listen != old.listen && !activated {
        return Some(format!("`listen` changed ({} → {}); restart to change the address", old.listen, new.listen));
    }
    if new.tls.listen != old.tls.listen && !tls_activated {
        let show = |a: Option<SocketAddr>| a.map_or_else(|| "none".to_string(), |a| a.to_string());
        return Some(format!(
            "`tls.listen` changed ({} → {}); restart to change it",
            show(old.tls.listen),
            show(new.tls.listen)
        ));
    }
    if new.tls.acme != old.tls.acme {
        return Some("`tls.acme` changed; restart to change it".to_owned());
    }
    if new.cluster.redis_url != old.cluster.redis_url {
        return Some("`cluster.redis_url` changed; restart to change it".to_owned());
    }
    if new.http3.listen != old.http3.listen {
        let show = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_string(), |a| a.to_string());
        return Some(format!(
            "the HTTP/3 address changed ({} → {}); restart to change it",
            show(old.http3.listen),
            show(new.http3.listen)
        ));
    }
    None
}

/// Why a reload changes the worker count from `old_n` (running) to `new_n` (the reloaded
/// configuration), given `configured` (the count of the configuration before the reload):
/// a reload applies the configured count, so TTIN/TTOU changes are undone. `None`: no change.
pub(super) fn workers_change(old_n: usize, new_n: usize, configured: usize) -> Option<String> {
    if old_n == new_n {
        return None;
    }
    Some(match (new_n != configured, old_n != configured) {
        (true, false) => format!("`workers` changed from {configured} to {new_n} in the configuration"),
        (true, true) => format!(
            "`workers` changed from {configured} to {new_n} in the configuration; TTIN/TTOU adjustments are reset"
        ),
        (false, _) => "the configured count; TTIN/TTOU adjustments are reset".to_owned(),
    })
}

/// Where a slot's replacement worker stands during a reload.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Replacement {
    /// It serves: the slot's old workers drain.
    Serving,
    /// It exited before serving: the old one stays.
    Exited,
    /// It did not serve within [`RELOAD_START_TIMEOUT`]: it drains, the old one stays.
    TimedOut,
    /// Still starting: wait.
    Starting,
}

/// The replacement's standing from its record's `state` (`None`: it is gone) and the time
/// since it was forked.
pub(super) fn replacement(state: Option<WorkerState>, elapsed: Duration) -> Replacement {
    match state {
        Some(WorkerState::Serving) => Replacement::Serving,
        None => Replacement::Exited,
        Some(_) if elapsed > RELOAD_START_TIMEOUT => Replacement::TimedOut,
        Some(_) => Replacement::Starting,
    }
}

impl Supervisor {
    /// SIGHUP: read the configuration again; if it is valid, apply it and
    /// replace the workers one slot at a time (the new worker serves before
    /// the old one drains, on the same slot socket, so no request fails).
    /// An invalid configuration changes nothing.
    pub(super) fn begin_reload(&mut self) {
        let new = match self.source.load() {
            Ok(c) => c,
            Err(errors) => {
                for p in errors.problems {
                    log::error!("SIGHUP: reload refused: config: {p}");
                }
                return;
            }
        };
        let tls_activated = self.activated && self.slots.first().is_some_and(|s| s.tls.is_some());
        if let Some(why) = restart_only_change(&self.config, &new, self.activated, tls_activated) {
            log::error!("SIGHUP: reload refused: {why}");
            return;
        }
        // The certificate and key are read again; a bad pair keeps the old one serving. With
        // `[tls.acme]` the ACME thread's certificate stays.
        let tls_key = match load_tls(&new) {
            Ok(_) if new.tls.acme.is_some() => self.tls_key.clone(),
            Ok(k) => k,
            Err(e) => {
                log::error!("SIGHUP: reload refused: {e}");
                return;
            }
        };
        let secret = match (&new.auth.secret, &self.config.auth.secret) {
            // A generated (development) secret is kept, so tokens survive the reload.
            (crate::config::JwtSecret::Generate, crate::config::JwtSecret::Generate) => Ok(self.secret.clone()),
            _ => crate::auth::secret::resolve(&new.auth, new.is_development()).map_err(|e| e.to_string()),
        };
        let secret = match secret {
            Ok(s) => s,
            Err(e) => {
                log::error!("SIGHUP: reload refused: signing secret: {e}");
                return;
            }
        };
        let endpoints = match crate::upstream::wire::Endpoints::resolve(&new) {
            Ok(e) => e,
            Err(e) => {
                log::error!("SIGHUP: reload refused: upstream: {e}");
                return;
            }
        };
        let target = crate::store::Target::of(&new);
        if let Err(e) = crate::store::Store::migrate(target) {
            log::error!("SIGHUP: reload refused: database {target}: {e}");
            return;
        }
        match schema_step(&new) {
            Ok(()) => {}
            Err(SchemaRefused::Destructive(lines)) => {
                for line in lines.lines() {
                    log::error!(
                        "SIGHUP: reload refused: destructive schema change (run `forkd migrate --apply`): {line}"
                    );
                }
                return;
            }
            Err(SchemaRefused::Failed(why)) => {
                log::error!("SIGHUP: reload refused: database {target}: declared resources: {why}");
                return;
            }
        }
        if new.download.dir != self.config.download.dir {
            dirs::prepare_download_dir(&new.download.dir);
        }
        sys::trim_heap();
        if new.upstreams.cache_entries != self.config.upstreams.cache_entries {
            log::warn!("SIGHUP: upstreams.cache_entries applies to the workers' caches; the shared cache keeps its size until a restart");
        }
        self.notifier.send("RELOADING=1\nSTATUS=reloading the configuration");
        if new.pid_file != self.config.pid_file {
            let pid = std::process::id();
            if let Some(path) = &new.pid_file {
                if let Err(e) = pidfile::write(path, pid) {
                    log::error!("SIGHUP: pid_file {}: {e}", path.display());
                }
            }
            if let Some(old) = &self.config.pid_file {
                pidfile::remove_if_ours(old, pid);
            }
        }
        let (old_n, new_n, configured) = (self.slots.len(), new.workers, self.config.workers);
        if let Some(r) = self.redis.as_mut() {
            r.set_window(new.rate_limit.window.as_millis() as u64);
        }
        self.config = new;
        self.secret = secret;
        self.tls_key = tls_key;
        // Leaked: workers forked earlier still refer to the old set (a few hundred bytes per reload).
        self.endpoints = Box::leak(Box::new(endpoints));
        // Workers forked before hold their own copy of the old set.
        self.fixed = Arc::new(crate::app::fixed::Fixed::build(&self.config, Some(&self.fixed)));
        // A reload applies the configured count: TTIN/TTOU changes since the
        // start (or the last reload) are undone, and the log says so.
        if let Some(why) = workers_change(old_n, new_n, configured) {
            log::info!("reload: workers {old_n} -> {new_n} ({why})");
        }
        for _ in old_n..new_n {
            self.add_slot(Cause::Reload);
        }
        for _ in new_n..old_n {
            self.remove_slot(Cause::Reload);
        }
        let keep = old_n.min(new_n);
        log::info!("SIGHUP: configuration reloaded; replacing {keep} worker(s) one by one");
        self.reload = Some(Reload { pending: (0..keep).collect(), current: None, label: "SIGHUP" });
    }

    /// Advance a reload: start the next slot's new worker, and once it
    /// serves, drain the old ones of that slot.
    pub(super) fn step_reload(&mut self) {
        loop {
            let Some((current, label)) = self.reload.as_ref().map(|r| (r.current, r.label)) else { return };
            match current {
                None => {
                    let Some(slot) = self.reload.as_mut().and_then(|r| r.pending.pop_front()) else {
                        self.reload = None;
                        log::info!("{label}: reload complete: {} worker(s)", self.slots.len());
                        self.notifier.send(&format!("READY=1\nSTATUS=serving with {} workers", self.slots.len()));
                        return;
                    };
                    if slot >= self.slots.len() {
                        continue;
                    }
                    match self.spawn(slot) {
                        Ok(pid) => {
                            if let Some(r) = self.reload.as_mut() {
                                r.current = Some((slot, pid, Instant::now()));
                            }
                        }
                        Err(e) => log::error!("{label}: cannot start a new worker for slot {slot}: {e}"),
                    }
                    return;
                }
                Some((slot, pid, since)) => {
                    let state = self.table.iter().find(|p| p.pid == pid).map(|p| self.region.procs[p.record].state());
                    match replacement(state, since.elapsed()) {
                        Replacement::Serving => {
                            let old: Vec<i32> =
                                self.table.serving(slot).filter(|p| p.pid != pid).map(|p| p.pid).collect();
                            for o in old {
                                self.drain(o);
                            }
                        }
                        Replacement::Exited => {
                            log::error!(
                                "{label}: the new worker {pid} of slot {slot} exited before serving; the old one stays"
                            );
                        }
                        Replacement::TimedOut => {
                            log::error!(
                                "{label}: the new worker {pid} of slot {slot} did not start serving; the old one stays"
                            );
                            self.drain(pid);
                        }
                        Replacement::Starting => return,
                    }
                    if let Some(r) = self.reload.as_mut() {
                        r.current = None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_unchanged_configuration_needs_no_restart() {
        let c = Config::default();
        assert_eq!(restart_only_change(&c, &c.clone(), false, false), None);
    }

    #[test]
    fn a_new_listen_address_is_refused_unless_activated() {
        let old = Config::default();
        let mut new = old.clone();
        new.listen = addr("127.0.0.1:1");
        let why = restart_only_change(&old, &new, false, false).unwrap();
        assert!(why.starts_with("`listen` changed ("), "{why}");
        assert!(why.ends_with("127.0.0.1:1); restart to change the address"), "{why}");
        assert_eq!(restart_only_change(&old, &new, true, false), None);
    }

    #[test]
    fn a_new_tls_address_is_refused_unless_its_sockets_were_handed_in() {
        let old = Config::default();
        let mut new = old.clone();
        new.tls.listen = Some(addr("127.0.0.1:2"));
        let why = restart_only_change(&old, &new, true, false).unwrap();
        assert!(why.contains("`tls.listen` changed ("), "{why}");
        assert!(why.contains("→ 127.0.0.1:2)"), "{why}");
        assert_eq!(restart_only_change(&old, &new, true, true), None);
    }

    #[test]
    fn a_new_acme_setting_needs_a_restart() {
        let old = Config::default();
        let mut new = old.clone();
        new.tls.acme = Some(crate::config::Acme {
            directory: "https://ca.example/dir".into(),
            email: None,
            domains: vec!["a.example".into()],
            ca_file: None,
            challenge: crate::config::AcmeChallenge::Http01,
        });
        let why = restart_only_change(&old, &new, true, true);
        assert_eq!(why.as_deref(), Some("`tls.acme` changed; restart to change it"));
    }

    #[test]
    fn redis_and_the_http3_address_always_need_a_restart() {
        let old = Config::default();
        let new = crate::config::from_toml("t", "[cluster]\nredis_url = \"redis://127.0.0.1:3/\"\n", &[]).unwrap();
        let why = restart_only_change(&old, &new, true, true).unwrap();
        assert_eq!(why, "`cluster.redis_url` changed; restart to change it");
        let mut new = old.clone();
        new.http3.listen = Some(addr("127.0.0.1:4"));
        let why = restart_only_change(&old, &new, true, true).unwrap();
        assert!(why.starts_with("the HTTP/3 address changed ("), "{why}");
        assert!(why.contains("→ 127.0.0.1:4)"), "{why}");
    }

    #[test]
    fn the_worker_count_change_says_what_it_undoes() {
        assert_eq!(workers_change(4, 4, 4), None);
        assert_eq!(workers_change(4, 6, 4).unwrap(), "`workers` changed from 4 to 6 in the configuration");
        assert_eq!(
            workers_change(5, 6, 4).unwrap(),
            "`workers` changed from 4 to 6 in the configuration; TTIN/TTOU adjustments are reset"
        );
        assert_eq!(workers_change(5, 4, 4).unwrap(), "the configured count; TTIN/TTOU adjustments are reset");
    }

    #[test]
    fn a_replacement_is_waited_for_until_it_serves_exits_or_times_out() {
        let short = Duration::from_millis(10);
        let long = RELOAD_START_TIMEOUT + Duration::from_millis(1);
        assert_eq!(replacement(Some(WorkerState::Serving), long), Replacement::Serving);
        assert_eq!(replacement(None, short), Replacement::Exited);
        assert_eq!(replacement(Some(WorkerState::Starting), short), Replacement::Starting);
        assert_eq!(replacement(Some(WorkerState::Starting), RELOAD_START_TIMEOUT), Replacement::Starting);
        assert_eq!(replacement(Some(WorkerState::Starting), long), Replacement::TimedOut);
        assert_eq!(replacement(Some(WorkerState::Draining), long), Replacement::TimedOut);
    }
}
