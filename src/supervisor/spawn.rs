//! Forking a slot's worker, reaping exited ones and scheduling their replacement with a
//! back-off per slot, so that a worker that keeps failing at start-up does not spin.
//!
//! The decisions (the back-off, how a replacement's start is judged) are plain functions,
//! tested below; this file is the only one that calls `fork` and `waitpid`.

use super::*;
impl Supervisor {
    /// Fork a worker for `slot`; returns its pid.
    pub(super) fn spawn(&mut self, slot: usize) -> io::Result<i32> {
        let record = self.region.claim().ok_or_else(|| io::Error::other("process table full"))?;
        let fd = self.slots[slot].listener.as_raw_fd();
        let tls_fd = self.slots[slot].tls.as_ref().map(AsRawFd::as_raw_fd);
        let udp_fd = self.slots[slot].udp.as_ref().map(AsRawFd::as_raw_fd);
        // Workers of the slot still alive (replaced on reload or for memory, or the old
        // supervisor's after an upgrade) read the same UDP socket.
        let siblings: Vec<i32> = self
            .table
            .iter()
            .filter(|p| p.slot == slot)
            .map(|p| p.pid)
            .chain(self.old_workers.iter().filter(|&&(s, _)| s == slot).map(|&(_, pid)| pid))
            .collect();
        let parent = std::process::id() as i32;
        let challenges = self.acme.as_ref().map(|a| Arc::clone(&a.challenges)).unwrap_or_default();
        let (ours, theirs) = bus::pair()?;
        // What the supervisor freed since the last fork goes back first: a worker would
        // otherwise start sharing those pages and count them in its RSS.
        sys::trim_heap();
        match sys::fork()? {
            Forked::Parent(pid) => {
                drop(theirs);
                let ep = Endpoint::new(ours);
                let token = Token(record + 1);
                self.poll.registry().register(
                    &mut mio::unix::SourceFd(&ep.fd()),
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                self.bus.insert(record, ep);
                self.region.procs[record].pid.store(pid, std::sync::atomic::Ordering::Release);
                self.table.add(Proc { pid, slot, record, role: Role::Serving, started: Instant::now(), kill_at: None });
                log::info!("worker {pid} started for slot {slot}");
                Ok(pid)
            }
            Forked::Child => {
                self.signals.uninstall();
                let keep: Vec<std::os::fd::RawFd> =
                    [fd, theirs.as_raw_fd()].into_iter().chain(tls_fd).chain(udp_fd).collect();
                sys::close_inherited_fds(&keep);
                sys::title::set(&format!("forkd: worker {slot}"));
                if sys::die_with_parent(parent).is_err() {
                    std::process::exit(0);
                }
                // Built after fork: the worker's own session state (the ticket keys are shared).
                let tls = match (tls_fd, &self.tls_key) {
                    (Some(tls_fd), Some(key)) => {
                        let tickets = Arc::new(crate::tls::SharedTicketer::new(self.tls_secret));
                        let alpn = &challenges.tls_alpn;
                        match crate::tls::server_config(Arc::clone(key), tickets, self.config.http2.enabled, alpn) {
                            Ok(config) => {
                                Some(crate::worker::WorkerTls { listener: sys::listener_from_fd(tls_fd), config })
                            }
                            Err(e) => {
                                log::error!("worker {}: {e}", std::process::id());
                                std::process::exit(1);
                            }
                        }
                    }
                    _ => None,
                };
                let h3 = match (udp_fd, &self.tls_key) {
                    (Some(udp_fd), Some(key)) => Some(crate::worker::WorkerH3 {
                        // SAFETY: `udp_fd` is the slot's UDP socket, kept open across the fork
                        // (`keep`); the supervisor's object for it is never dropped in the
                        // child, so this is its only owner here.
                        socket: unsafe { <std::net::UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(udp_fd) },
                        slot: u16::try_from(slot).unwrap_or(u16::MAX),
                        key: Arc::clone(key),
                        secret: self.tls_secret,
                        siblings,
                    }),
                    _ => None,
                };
                let code = crate::worker::run(crate::worker::WorkerArgs {
                    config: &self.config,
                    listener: sys::listener_from_fd(fd),
                    tls,
                    record: &self.region.procs[record],
                    metrics: &self.region.metrics[record],
                    region: self.region,
                    secret: &self.secret,
                    bus: Endpoint::new(theirs),
                    h3,
                    rate: &self.region.rate,
                    endpoints: self.endpoints,
                    fixed: Arc::clone(&self.fixed),
                    shared_cache: self.shared_cache,
                    foreign_writers: self.old_workers.iter().map(|&(_, pid)| pid).collect(),
                    acme: challenges,
                });
                std::process::exit(code);
            }
        }
    }

    pub(super) fn respawn_due(&mut self) {
        if self.stopping.is_some() {
            return;
        }
        let now = Instant::now();
        for slot in 0..self.slots.len() {
            if self.slots[slot].respawn_at.is_some_and(|t| t <= now) {
                self.slots[slot].respawn_at = None;
                if let Err(e) = self.spawn(slot) {
                    log::error!("cannot start a worker for slot {slot}: {e}");
                    self.slots[slot].respawn_at = Some(now + Duration::from_secs(1));
                }
            }
        }
    }

    /// Collect exited workers; schedule a replacement for each that was serving.
    pub(super) fn reap(&mut self) {
        loop {
            let (pid, how) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid.as_raw(), format!("exit code {code}")),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid.as_raw(), format!("signal {sig}")),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            };
            let Some(p) = self.table.remove(pid) else { continue };
            if let Some(ep) = self.bus.remove(&p.record) {
                let _ = self.poll.registry().deregister(&mut mio::unix::SourceFd(&ep.fd()));
            }
            self.region.release(p.record);
            if p.role == Role::Draining || self.stopping.is_some() {
                log::info!("worker {pid} exited after draining ({how})");
                continue;
            }
            // Not asked to stop: `forkd_worker_restarts_total`.
            self.region.count_restart();
            if self.table.serving(p.slot).next().is_some() {
                // Another worker serves the slot (a reload's or a memory replacement's old one).
                log::warn!("worker {pid} of slot {} died ({how}); the slot is still served", p.slot);
                continue;
            }
            log::warn!("worker {pid} of slot {} died ({how}); replacing it", p.slot);
            if let Some(slot) = self.slots.get_mut(p.slot) {
                slot.fast_failures = fast_failures(slot.fast_failures, p.started.elapsed());
                let delay = respawn_delay(slot.fast_failures);
                if !delay.is_zero() {
                    log::warn!("slot {} keeps failing; next start in {delay:?}", p.slot);
                }
                slot.respawn_at = Some(Instant::now() + delay);
            }
        }
    }
}

/// A slot's count of fast failures after a worker that lived `lived` died: one more when it
/// died within [`FAST_FAILURE`] of its start, else the count starts over.
pub(super) fn fast_failures(before: u32, lived: Duration) -> u32 {
    if lived < FAST_FAILURE {
        before.saturating_add(1)
    } else {
        0
    }
}

/// How long to wait before starting a slot's next worker after `fast_failures` fast
/// failures in a row: at once after none, then 100 ms doubling up to [`MAX_BACKOFF`].
pub(super) fn respawn_delay(fast_failures: u32) -> Duration {
    match fast_failures {
        0 => Duration::ZERO,
        n => Duration::from_millis(100).saturating_mul(2u32.saturating_pow(n - 1)).min(MAX_BACKOFF),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_that_dies_young_counts_and_one_that_lived_resets() {
        assert_eq!(fast_failures(0, Duration::ZERO), 1);
        assert_eq!(fast_failures(3, FAST_FAILURE / 2), 4);
        assert_eq!(fast_failures(3, FAST_FAILURE), 0);
        assert_eq!(fast_failures(u32::MAX, Duration::ZERO), u32::MAX);
    }

    #[test]
    fn the_back_off_doubles_from_100_ms_up_to_its_ceiling() {
        assert_eq!(respawn_delay(0), Duration::ZERO);
        assert_eq!(respawn_delay(1), Duration::from_millis(100));
        assert_eq!(respawn_delay(2), Duration::from_millis(200));
        assert_eq!(respawn_delay(4), Duration::from_millis(800));
        assert_eq!(respawn_delay(40), MAX_BACKOFF);
        assert_eq!(respawn_delay(u32::MAX), MAX_BACKOFF);
    }
}
