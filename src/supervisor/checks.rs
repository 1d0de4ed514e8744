//! The periodic checks of the loop: workers over the memory ceiling (replaced, new one
//! first), memory replacements in progress, heartbeats and drain deadlines, readiness, and
//! systemd's watchdog.
//!
//! The decisions (over the ceiling, a stalled loop) are plain functions, tested below; the
//! checks only signal, spawn through `spawn` or drain through the loop's `drain`.

use super::*;
impl Supervisor {
    /// Replace workers over `worker_max_rss_mb`: the new one first, then the old one drains.
    pub(super) fn check_memory(&mut self) {
        let now = Instant::now();
        if now < self.next_memory_check {
            return;
        }
        self.next_memory_check = now + self.config.supervisor.memory_check;
        let ceiling = self.config.supervisor.worker_max_rss_mb * 1024 * 1024;
        // Only workers that serve and are not already being replaced (a
        // replacement still starting is not measured yet).
        let over: Vec<(i32, usize, u64)> = self
            .table
            .iter()
            .filter(|p| p.role == Role::Serving && self.region.procs[p.record].state() == WorkerState::Serving)
            .filter(|p| !self.handovers.iter().any(|h| h.old == p.pid || h.new == p.pid))
            .filter_map(|p| sys::rss_bytes(p.pid).ok().filter(|r| *r > ceiling).map(|r| (p.pid, p.slot, r)))
            .collect();
        for (pid, slot, rss) in over {
            log::warn!("worker {pid} uses {} MiB (> {} MiB): replacing it", rss >> 20, ceiling >> 20);
            match self.spawn(slot) {
                Ok(new) => self.handovers.push(Handover { old: pid, new, since: Instant::now() }),
                Err(e) => log::error!("cannot start a replacement for worker {pid}: {e}"),
            }
        }
    }

    /// Drain each replaced worker once its replacement serves; keep it if
    /// the replacement dies or does not start in time.
    pub(super) fn step_handovers(&mut self) {
        let mut i = 0;
        while i < self.handovers.len() {
            let h = &self.handovers[i];
            let (old, new, since) = (h.old, h.new, h.since);
            let state = self.table.iter().find(|p| p.pid == new).map(|p| self.region.procs[p.record].state());
            let old_alive = self.table.iter().any(|p| p.pid == old);
            let done = match handover_step(state, old_alive, since.elapsed()) {
                Step::DrainOld => {
                    if old_alive {
                        self.drain(old);
                    }
                    true
                }
                Step::NewExited => {
                    log::error!("the replacement {new} of worker {old} exited before serving; {old} stays");
                    true
                }
                Step::NewTooSlow => {
                    log::error!("the replacement {new} of worker {old} did not start serving; {old} stays");
                    self.drain(new);
                    true
                }
                Step::Wait => false,
                Step::OldGone => true,
            };
            if done {
                self.handovers.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Kill workers whose loop has not turned for `worker_timeout`, and
    /// draining workers past their deadline.
    pub(super) fn check_heartbeats(&mut self) {
        let now = Instant::now();
        if now < self.next_heartbeat_check {
            return;
        }
        self.next_heartbeat_check = now + HEARTBEAT_CHECK;
        let now_ms = sys::monotonic_ms();
        let limit = self.config.supervisor.worker_timeout.as_millis() as u64;
        for p in self.table.iter() {
            let rec = &self.region.procs[p.record];
            let beat = rec.heartbeat_ms.load(std::sync::atomic::Ordering::Relaxed);
            if stalled(now_ms, beat, limit, rec.state() == WorkerState::Starting) {
                log::error!("worker {} has not turned its loop for {} ms: killing it", p.pid, now_ms - beat);
                sys::kill(p.pid, Signal::SIGKILL);
            } else if p.kill_at.is_some_and(|t| t <= now) {
                log::warn!("worker {} is still draining past the shutdown timeout: killing it", p.pid);
                sys::kill(p.pid, Signal::SIGKILL);
            }
        }
    }

    pub(super) fn check_ready(&mut self) {
        if self.ready {
            return;
        }
        let all = (0..self.slots.len())
            .all(|s| self.table.serving(s).any(|p| self.region.procs[p.record].state() == WorkerState::Serving));
        if all {
            self.ready = true;
            let addr = self.slots.first().and_then(|s| s.listener.local_addr().ok()).unwrap_or(self.config.listen);
            log::info!(
                "ready: {} worker(s) listening on {addr}, supervisor pid {}: open {}",
                self.slots.len(),
                std::process::id(),
                listen::url(addr)
            );
            if let Some(tls) = self.slots.first().and_then(|s| s.tls.as_ref()).and_then(|l| l.local_addr().ok()) {
                log::info!("ready: TLS (HTTPS) on {tls}");
            }
            if let Some(udp) = self.slots.first().and_then(|s| s.udp.as_ref()).and_then(|u| u.local_addr().ok()) {
                log::info!("ready: HTTP/3 UDP socket(s) bound on {udp}");
            }
            if let Some(mut pipe) = self.upgraded_from.take() {
                // This supervisor is now the one to signal; then the old one may exit.
                if let Some(path) = &self.config.pid_file {
                    if let Err(e) = pidfile::write(path, std::process::id()) {
                        log::error!("pid_file {}: {e}", path.display());
                    }
                }
                // The old supervisor drains once it reads this (and tells systemd our pid).
                if let Err(e) = std::io::Write::write_all(&mut pipe, b"READY\n") {
                    log::warn!("upgrade: cannot tell the old supervisor we serve: {e}");
                }
            }
            self.notifier.send(&format!(
                "READY=1\nSTATUS=serving with {} workers\nMAINPID={}",
                self.slots.len(),
                std::process::id()
            ));
        }
    }

    pub(super) fn watchdog(&mut self) {
        if let (Some(at), Some(every)) = (self.next_watchdog, self.notifier.watchdog_every) {
            if Instant::now() >= at {
                self.notifier.send("WATCHDOG=1");
                self.next_watchdog = Some(Instant::now() + every);
            }
        }
    }
}

/// What a memory replacement does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The new worker serves: the old one drains.
    DrainOld,
    /// The new worker exited before serving: the old one stays.
    NewExited,
    /// The new worker did not serve within [`RELOAD_START_TIMEOUT`]: it drains, the old stays.
    NewTooSlow,
    /// The old worker is gone on its own: nothing is left to hand over.
    OldGone,
    /// The new worker is still starting.
    Wait,
}

/// The next step of a replacement whose new worker is in `state` (`None`: exited) after
/// `waited` since it was forked.
pub(super) fn handover_step(state: Option<WorkerState>, old_alive: bool, waited: Duration) -> Step {
    match state {
        Some(WorkerState::Serving) => Step::DrainOld,
        None => Step::NewExited,
        Some(_) if waited > RELOAD_START_TIMEOUT => Step::NewTooSlow,
        Some(_) if !old_alive => Step::OldGone,
        Some(_) => Step::Wait,
    }
}

/// A worker whose last heartbeat (`beat`, monotonic ms) is older than `limit_ms` at `now_ms`
/// has a stuck loop; one still starting gets [`STARTUP_GRACE_MS`] more.
pub(super) fn stalled(now_ms: u64, beat: u64, limit_ms: u64, starting: bool) -> bool {
    let limit = if starting { limit_ms.saturating_add(STARTUP_GRACE_MS) } else { limit_ms };
    now_ms.saturating_sub(beat) > limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_drains_the_old_worker_only_once_the_new_one_serves() {
        let soon = Duration::from_millis(10);
        assert_eq!(handover_step(Some(WorkerState::Serving), true, soon), Step::DrainOld);
        assert_eq!(handover_step(Some(WorkerState::Starting), true, soon), Step::Wait);
        assert_eq!(handover_step(None, true, soon), Step::NewExited);
        assert_eq!(handover_step(Some(WorkerState::Starting), false, soon), Step::OldGone);
        let late = RELOAD_START_TIMEOUT + Duration::from_millis(1);
        assert_eq!(handover_step(Some(WorkerState::Starting), true, late), Step::NewTooSlow);
    }

    #[test]
    fn a_loop_is_stalled_past_its_limit_and_a_starting_one_gets_grace() {
        assert!(!stalled(1_000, 1_000, 500, false));
        assert!(!stalled(1_500, 1_000, 500, false));
        assert!(stalled(1_501, 1_000, 500, false));
        assert!(!stalled(1_501, 1_000, 500, true));
        assert!(stalled(1_501 + STARTUP_GRACE_MS, 1_000, 500, true));
        // A heartbeat stamped after `now` (read in the other order) is not a stall.
        assert!(!stalled(1_000, 2_000, 0, false));
    }
}
