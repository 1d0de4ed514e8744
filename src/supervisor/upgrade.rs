//! SIGUSR2: start a new supervisor from the binary on disk, handing it the slot sockets
//! (`LISTEN_FDS`), the generated secrets and the list of this supervisor's workers, then wait
//! on a pipe for it to report that it serves; only then does this supervisor drain and exit.
//!
//! It owns the upgrade's progress (`Upgrade`) and the hand-over pipes; it never signals the
//! workers itself (draining is `graceful_stop`).

use super::*;
/// A binary upgrade in progress: the new supervisor and the pipe it reports on.
pub(super) struct Upgrade {
    pub(super) pid: i32,
    pub(super) pipe: std::fs::File,
    pub(super) started: Instant,
}

/// How long an upgrade waits for the new supervisor to serve before giving up on it.
pub(super) const UPGRADE_TIMEOUT: Duration = Duration::from_secs(60);

/// A pipe whose read end holds `secret` and then end of file (the write end is
/// closed). Small enough for the pipe's buffer, so the write never blocks.
pub(super) fn secret_pipe(secret: &[u8]) -> io::Result<std::os::fd::OwnedFd> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    std::io::Write::write_all(&mut std::fs::File::from(write), secret)?;
    Ok(read)
}

/// The list of workers handed to the new supervisor: one `slot pid` line each.
pub(super) fn worker_list(workers: impl Iterator<Item = (usize, i32)>) -> String {
    workers.map(|(slot, pid)| format!("{slot} {pid}\n")).collect()
}

/// Whether what the new supervisor wrote on its pipe (empty: the pipe closed) says it serves.
pub(super) fn reported_ready(report: &[u8]) -> bool {
    report.starts_with(b"READY")
}

impl Supervisor {
    /// SIGUSR2: start a new supervisor from the binary on disk, handing it the
    /// slot sockets (`LISTEN_FDS`) and a pipe; once it reports that it serves,
    /// drain and exit. Both accept from the same sockets meanwhile, so no
    /// queued connection is lost. If the new one fails, this one stays.
    pub(super) fn begin_upgrade(&mut self) {
        if let Some(u) = &self.upgrade {
            log::warn!("SIGUSR2: an upgrade is already waiting for supervisor {}", u.pid);
            return;
        }
        let (read, write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK) {
            Ok(p) => p,
            Err(e) => {
                log::error!("SIGUSR2: upgrade impossible: pipe: {e}");
                return;
            }
        };
        let mut fds: Vec<(std::os::fd::RawFd, &str)> =
            self.slots.iter().map(|s| (s.listener.as_raw_fd(), listen::LISTEN_FD_NAME)).collect();
        fds.extend(self.slots.iter().filter_map(|s| s.tls.as_ref()).map(|l| (l.as_raw_fd(), listen::TLS_FD_NAME)));
        // In slot order: the new supervisor keeps each at its index in the steering group.
        fds.extend(self.slots.iter().filter_map(|s| s.udp.as_ref()).map(|u| (u.as_raw_fd(), listen::UDP_FD_NAME)));
        fds.push((write.as_raw_fd(), listen::UPGRADE_FD_NAME));
        // In development the generated signing secret goes along (in a pipe,
        // not the environment), so that tokens issued so far stay valid.
        let secret = match keeps_generated_secret(&self.config).then(|| secret_pipe(&self.secret)).transpose() {
            Ok(pipe) => pipe,
            Err(e) => {
                log::warn!("SIGUSR2: cannot hand over the development signing secret ({e}); tokens will not survive");
                None
            }
        };
        if let Some(pipe) = &secret {
            fds.push((pipe.as_raw_fd(), listen::SECRET_FD_NAME));
        }
        // The session-ticket secret goes along too: sessions resume across the upgrade.
        let tls_secret = match self.tls_key.is_some().then(|| secret_pipe(&self.tls_secret)).transpose() {
            Ok(pipe) => pipe,
            Err(e) => {
                log::warn!("SIGUSR2: cannot hand over the session-ticket secret ({e}); sessions will not resume");
                None
            }
        };
        if let Some(pipe) = &tls_secret {
            fds.push((pipe.as_raw_fd(), listen::TLS_SECRET_FD_NAME));
        }
        // The new workers need our workers' pids: HTTP/3 siblings of each slot (they leave
        // the UDP sockets to ours until they drained), and writers their memo of users does
        // not see (`app::usermemo`). Without the list the upgrade does not start.
        let list = worker_list(self.table.iter().map(|p| (p.slot, p.pid)));
        let workers = match secret_pipe(list.as_bytes()) {
            Ok(pipe) => Some(pipe),
            Err(e) => {
                log::error!("SIGUSR2: upgrade impossible: cannot hand over the list of workers: {e}");
                return;
            }
        };
        if let Some(pipe) = &workers {
            fds.push((pipe.as_raw_fd(), listen::WORKERS_FD_NAME));
        }
        match sys::fork() {
            Ok(Forked::Parent(pid)) => {
                drop(write);
                let pipe = std::fs::File::from(read);
                if let Err(e) = self.poll.registry().register(
                    &mut mio::unix::SourceFd(&pipe.as_raw_fd()),
                    UPGRADE,
                    Interest::READABLE,
                ) {
                    log::error!("SIGUSR2: cannot watch the new supervisor: {e}");
                }
                log::info!("SIGUSR2: started a new supervisor {pid} from {}", self.exe.display());
                self.upgrade = Some(Upgrade { pid, pipe, started: Instant::now() });
            }
            Ok(Forked::Child) => {
                self.signals.uninstall();
                let _ = sys::unblock_signals();
                let e = sys::exec_with_fds(&self.exe, &self.args, &fds);
                log::error!("SIGUSR2: cannot execute {}: {e}", self.exe.display());
                std::process::exit(1);
            }
            Err(e) => log::error!("SIGUSR2: upgrade impossible: fork: {e}"),
        }
    }

    /// The new supervisor of an upgrade reported (or its pipe closed).
    pub(super) fn on_upgrade_pipe(&mut self) {
        let Some(u) = self.upgrade.as_mut() else { return };
        let mut buf = [0u8; 64];
        let n = match std::io::Read::read(&mut u.pipe, &mut buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Ok(n) => n,
            Err(_) => 0,
        };
        let Some(u) = self.upgrade.take() else { return };
        let _ = self.poll.registry().deregister(&mut mio::unix::SourceFd(&u.pipe.as_raw_fd()));
        if !reported_ready(&buf[..n]) {
            log::error!("SIGUSR2: the new supervisor {} exited before serving; this one stays", u.pid);
            return;
        }
        log::info!("SIGUSR2: the new supervisor {} serves; draining this one", u.pid);
        // systemd follows the new main process (allowed from the current main).
        self.notifier.send(&format!("MAINPID={}\nREADY=1\nSTATUS=upgraded", u.pid));
        self.graceful_stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_list_is_one_slot_and_pid_per_line() {
        assert_eq!(worker_list([(0, 101), (1, 102), (0, 103)].into_iter()), "0 101\n1 102\n0 103\n");
        assert_eq!(worker_list(std::iter::empty()), "");
    }

    #[test]
    fn only_a_ready_report_completes_an_upgrade() {
        assert!(reported_ready(b"READY"));
        assert!(reported_ready(b"READY=1\n"));
        assert!(!reported_ready(b""));
        assert!(!reported_ready(b"READ"));
        assert!(!reported_ready(b"FAILED"));
    }

    #[test]
    fn a_secret_pipe_holds_the_secret_then_end_of_file() {
        let read = secret_pipe(b"s3cret").unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(read), &mut got).unwrap();
        assert_eq!(got, b"s3cret");
    }
}
