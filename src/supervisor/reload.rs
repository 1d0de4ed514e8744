//! SIGHUP: read the configuration again, validate it, bring the declared resources' tables
//! to it, and replace the workers one slot at a time so that each new worker serves before
//! the old one of its slot drains. An invalid configuration changes nothing.
//!
//! It owns the reload's progress (`Reload`) and the schema step; it does not fork (that is
//! `spawn`) and does not touch the slots' sockets.

use super::*;
/// A configuration reload in progress: slots still to replace, and the
/// replacement currently starting (slot, new pid, when it was forked).
pub(super) struct Reload {
    pub(super) pending: std::collections::VecDeque<usize>,
    pub(super) current: Option<(usize, i32, Instant)>,
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
        if new.listen != self.config.listen && !self.activated {
            log::error!(
                "SIGHUP: reload refused: `listen` changed ({} → {}); restart to change the address",
                self.config.listen,
                new.listen
            );
            return;
        }
        let tls_activated = self.activated && self.slots.first().is_some_and(|s| s.tls.is_some());
        if new.tls.listen != self.config.tls.listen && !tls_activated {
            let show = |a: Option<std::net::SocketAddr>| a.map_or_else(|| "none".to_string(), |a| a.to_string());
            log::error!(
                "SIGHUP: reload refused: `tls.listen` changed ({} → {}); restart to change it",
                show(self.config.tls.listen),
                show(new.tls.listen)
            );
            return;
        }
        if new.cluster.redis_url != self.config.cluster.redis_url {
            log::error!("SIGHUP: reload refused: `cluster.redis_url` changed; restart to change it");
            return;
        }
        if new.http3.listen != self.config.http3.listen {
            let show = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_string(), |a| a.to_string());
            log::error!(
                "SIGHUP: reload refused: the HTTP/3 address changed ({} → {}); restart to change it",
                show(self.config.http3.listen),
                show(new.http3.listen)
            );
            return;
        }
        // The certificate and key are read again; a bad pair keeps the old one serving.
        let tls_key = match load_tls(&new) {
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
        // A reload applies the configured count: TTIN/TTOU changes since the
        // start (or the last reload) are undone, and the log says so.
        if old_n != new_n {
            let why = match (new_n != configured, old_n != configured) {
                (true, false) => format!("`workers` changed from {configured} to {new_n} in the configuration"),
                (true, true) => format!(
                    "`workers` changed from {configured} to {new_n} in the configuration; TTIN/TTOU adjustments are reset"
                ),
                (false, _) => "the configured count; TTIN/TTOU adjustments are reset".to_owned(),
            };
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
        self.reload = Some(Reload { pending: (0..keep).collect(), current: None });
    }

    /// Advance a reload: start the next slot's new worker, and once it
    /// serves, drain the old ones of that slot.
    pub(super) fn step_reload(&mut self) {
        loop {
            let Some(current) = self.reload.as_ref().map(|r| r.current) else { return };
            match current {
                None => {
                    let Some(slot) = self.reload.as_mut().and_then(|r| r.pending.pop_front()) else {
                        self.reload = None;
                        log::info!("SIGHUP: reload complete: {} worker(s)", self.slots.len());
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
                        Err(e) => log::error!("SIGHUP: cannot start a new worker for slot {slot}: {e}"),
                    }
                    return;
                }
                Some((slot, pid, since)) => {
                    let state = self.table.iter().find(|p| p.pid == pid).map(|p| self.region.procs[p.record].state());
                    match state {
                        Some(WorkerState::Serving) => {
                            let old: Vec<i32> =
                                self.table.serving(slot).filter(|p| p.pid != pid).map(|p| p.pid).collect();
                            for o in old {
                                self.drain(o);
                            }
                        }
                        None => {
                            log::error!(
                                "SIGHUP: the new worker {pid} of slot {slot} exited before serving; the old one stays"
                            );
                        }
                        Some(_) if since.elapsed() > RELOAD_START_TIMEOUT => {
                            log::error!(
                                "SIGHUP: the new worker {pid} of slot {slot} did not start serving; the old one stays"
                            );
                            self.drain(pid);
                        }
                        Some(_) => return,
                    }
                    if let Some(r) = self.reload.as_mut() {
                        r.current = None;
                    }
                }
            }
        }
    }
}
