//! The supervisor: binds the slots' sockets, forks the workers, keeps them
//! alive, and turns operator signals into actions. It never serves a request.
//!
//! Its cycle follows nginx's master: signal handlers only count (see
//! `sys::signals`); one loop wakes on a signal or a timer and handles, in a
//! fixed order: reap and respawn (with back-off per slot), fast stop,
//! graceful stop, reload, worker count, log reopen, memory and heartbeat
//! checks, readiness. The loop is the supervisor's one thread but for the
//! ACME thread (`acme.rs`, with `[tls.acme]` only), which shares nothing a
//! forked worker uses; per-process resources (poll, pool, database) are made
//! by each worker after fork.
//!
//! This file holds the state and the loop; the rest, by concern:
//! `acme.rs` (the ACME thread of `[tls.acme]` and the hand-over of what it obtains),
//! `start.rs` (bind or adopt the sockets, load secrets and certificate, map shared memory),
//! `spawn.rs` (fork a slot's worker, reap, the restart back-off),
//! `reload.rs` (SIGHUP and the schema step), `upgrade.rs` (SIGUSR2),
//! `checks.rs` (memory ceiling, heartbeats, readiness, watchdog),
//! `listen.rs` (the slots' sockets), `table.rs` (the process table),
//! `redis.rs` (the bus bridge across hosts), `dirs.rs`, `pidfile.rs`, `notify.rs`.

mod acme;
mod checks;
mod dirs;
mod listen;
mod notify;
mod pidfile;
mod redis;
mod reload;
mod spawn;
mod start;
mod table;
mod upgrade;

use reload::{schema_step, Reload, SchemaRefused};
use upgrade::{Upgrade, UPGRADE_TIMEOUT};

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use crate::bus::{self, Endpoint};
use crate::config::Config;
use crate::shm::{Region, WorkerState};
use crate::sys::signals::SignalSet;
use crate::sys::{self, Forked};
use rustls::sign::CertifiedKey;

use notify::Notifier;
use table::{Proc, Role, Table};

const SIGNALS: Token = Token(0);
/// How often heartbeats are checked at most.
const HEARTBEAT_CHECK: Duration = Duration::from_millis(250);
/// A worker that lived less than this before dying counts as a fast failure.
const FAST_FAILURE: Duration = Duration::from_secs(1);
/// The longest respawn back-off.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Extra time a worker still setting up (opening the database, computing its
/// dummy password hash) gets before the watchdog counts its silence.
const STARTUP_GRACE_MS: u64 = 30_000;
/// Extra time past `shutdown_timeout` before a draining worker is killed.
const KILL_GRACE: Duration = Duration::from_secs(2);

struct Slot {
    listener: TcpListener,
    /// The slot's socket on `tls.listen`, when TLS is on.
    tls: Option<TcpListener>,
    /// The slot's UDP socket on `http3.listen`, when HTTP/3 is on (bound and kept across the
    /// slot's workers, which serve HTTP/3 on it).
    udp: Option<UdpSocket>,
    fast_failures: u32,
    respawn_at: Option<Instant>,
}

/// Have the plain and TLS `SO_REUSEPORT` groups give new connections to the `slots` in
/// turn ([`listen::spread_in_turn`]); called whenever the number of slots changes (the
/// program counts them).
fn spread_in_turn(slots: &[Slot]) -> std::io::Result<()> {
    let first = slots.first();
    for group in [first.map(|s| &s.listener), first.and_then(|s| s.tls.as_ref())].into_iter().flatten() {
        listen::spread_in_turn(group, slots.len())?;
    }
    Ok(())
}

struct Supervisor {
    poll: Poll,
    /// Bus endpoints by the worker's shared-memory record index (token = index + 1).
    bus: std::collections::HashMap<usize, Endpoint>,
    bus_buf: Vec<u8>,
    config: Config,
    /// Where `config` came from, to read it again on SIGHUP.
    source: crate::config::Source,
    /// A SIGHUP reload replacing the workers one slot at a time.
    reload: Option<Reload>,
    /// A SIGUSR2 binary upgrade waiting for the new supervisor to serve.
    upgrade: Option<Upgrade>,
    /// Memory-ceiling replacements whose new worker is still starting.
    handovers: Vec<Handover>,
    /// This supervisor was itself started by an upgrade: tell the old one once serving.
    upgraded_from: Option<std::fs::File>,
    /// The old supervisor's workers after an upgrade, `(slot, pid)`: they still read the
    /// slots' UDP sockets while they drain, so a new worker of the slot waits for them.
    old_workers: Vec<(usize, i32)>,
    /// The binary and arguments this supervisor was started with (an upgrade runs them again).
    exe: std::path::PathBuf,
    args: Vec<std::ffi::OsString>,
    /// The sockets came from `LISTEN_FDS` (`listen` does not apply).
    activated: bool,
    secret: Vec<u8>,
    /// The TLS listener's certificate and key (`None`: no TLS listener).
    tls_key: Option<Arc<CertifiedKey>>,
    /// The ACME thread's link, with `[tls.acme]`.
    acme: Option<acme::Link>,
    /// What every worker's session-ticket keys derive from (made once, kept across reloads
    /// and handed over on upgrade).
    tls_secret: [u8; crate::tls::SECRET_LEN],
    region: &'static Region,
    endpoints: &'static crate::upstream::wire::Endpoints,
    /// The bodies fixed for `config`'s life and their compressed forms, for the next workers.
    fixed: Arc<crate::app::fixed::Fixed>,
    shared_cache: &'static crate::shm::cache::SharedCache,
    slots: Vec<Slot>,
    table: Table,
    signals: SignalSet,
    notifier: Notifier,
    stopping: Option<Instant>,
    ready: bool,
    next_memory_check: Instant,
    next_heartbeat_check: Instant,
    next_watchdog: Option<Instant>,
    /// The Redis bridge, with `cluster.redis_url` (see `redis`).
    redis: Option<redis::Bridge>,
}

/// A worker being replaced: `old` keeps serving its slot until `new` serves
/// (accepts from the same socket), then drains. Draining first would leave the
/// slot's accept queue unserved while the new worker starts (opens its
/// database, computes its dummy password hash): under load that took over
/// 2 s, the clients' timeout.
struct Handover {
    old: i32,
    new: i32,
    since: Instant,
}

/// Why the worker count changes: TTIN/TTOU (each step logged under the
/// signal's name), or a reload (one line for the whole change, in `begin_reload`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    Signal,
    Reload,
}

impl Cause {
    /// The prefix of this cause's log lines; `signal` is TTIN or TTOU.
    fn name(self, signal: i32) -> &'static str {
        match (self, signal) {
            (Cause::Reload, _) => "reload",
            (Cause::Signal, libc::SIGTTIN) => "SIGTTIN",
            (Cause::Signal, _) => "SIGTTOU",
        }
    }
}

/// How long a reload waits for one new worker to start serving.
const RELOAD_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Poll token of the upgrade pipe.
const UPGRADE: Token = Token(usize::MAX);

/// Whether `config` uses a generated (development) signing secret, which an
/// upgrade hands over instead of generating a new one.
fn keeps_generated_secret(config: &Config) -> bool {
    config.is_development() && config.auth.secret == crate::config::JwtSecret::Generate
}

/// The certificate and key of `config`'s TLS listener from its files; `None` without a TLS
/// listener or with `[tls.acme]` (whose certificate `acme.rs` keeps).
fn load_tls(config: &Config) -> Result<Option<Arc<CertifiedKey>>, crate::tls::TlsError> {
    match (config.tls.listen, &config.tls.acme) {
        (Some(_), None) => crate::tls::load(&config.tls.cert_file, &config.tls.key_file).map(Some),
        _ => Ok(None),
    }
}

/// Run the supervisor until the service stops; returns the exit code.
pub fn run(config: Config, source: crate::config::Source) -> i32 {
    // Before the start-up's threads (precompression): what they free goes back to the
    // kernel, so no worker forked after them inherits it.
    crate::sys::fix_mmap_threshold(crate::sys::MMAP_THRESHOLD);
    let run = Supervisor::start(config, source).and_then(|mut s| {
        let code = s.cycle();
        if let Some(path) = &s.config.pid_file {
            pidfile::remove_if_ours(path, std::process::id());
        }
        code
    });
    match run {
        Ok(code) => code,
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            log::error!("{e}");
            crate::cli::EXIT_USAGE
        }
        Err(e) => {
            log::error!("supervisor: {e}");
            1
        }
    }
}

impl Supervisor {
    fn cycle(&mut self) -> io::Result<i32> {
        self.poll.registry().register(self.signals.source(), SIGNALS, Interest::READABLE)?;
        let mut events = Events::with_capacity(64);
        loop {
            self.respawn_due();
            let wait = self.next_wake().saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    SIGNALS | acme::ACME => {}
                    UPGRADE => self.on_upgrade_pipe(),
                    t @ (redis::CMD | redis::SUB) => {
                        if let Some(r) = self.redis.as_mut() {
                            r.ready(self.poll.registry(), t);
                        }
                    }
                    t => self.on_bus(t.0 - 1),
                }
            }
            self.step_redis();
            self.signals.drain();
            self.reap();
            let stops =
                self.signals.take(libc::SIGTERM) + self.signals.take(libc::SIGINT) + self.signals.take(libc::SIGQUIT);
            if stops > 0 {
                if self.stopping.is_some() || stops > 1 {
                    self.fast_stop();
                    return Ok(0);
                }
                self.graceful_stop();
            }
            if let Some(deadline) = self.stopping {
                if self.table.is_empty() {
                    log::info!("all workers stopped; exiting");
                    return Ok(0);
                }
                if Instant::now() >= deadline {
                    log::warn!("shutdown timeout: killing remaining workers");
                    self.fast_stop();
                    return Ok(0);
                }
                continue;
            }
            if self.signals.take(libc::SIGHUP) > 0 {
                self.begin_reload();
            }
            for _ in 0..self.signals.take(libc::SIGTTIN) {
                self.add_slot(Cause::Signal);
            }
            for _ in 0..self.signals.take(libc::SIGTTOU) {
                self.remove_slot(Cause::Signal);
            }
            if self.signals.take(libc::SIGUSR1) > 0 {
                log::info!("SIGUSR1: logs go to stderr; nothing to reopen");
            }
            if self.signals.take(libc::SIGUSR2) > 0 {
                self.begin_upgrade();
            }
            if self.upgrade.as_ref().is_some_and(|u| u.started.elapsed() > UPGRADE_TIMEOUT) {
                if let Some(u) = self.upgrade.take() {
                    log::error!("SIGUSR2: the new supervisor {} did not start serving in time; stopping it", u.pid);
                    sys::kill(u.pid, Signal::SIGTERM);
                }
            }
            self.check_memory();
            self.step_handovers();
            self.check_heartbeats();
            self.check_ready();
            self.step_reload();
            self.step_acme();
            self.watchdog();
        }
    }

    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let mut t = now + Duration::from_secs(1);
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = t.min(x);
            }
        };
        consider(Some(self.next_memory_check));
        consider(Some(self.next_heartbeat_check));
        consider(self.next_watchdog);
        consider(self.stopping);
        consider(self.redis.as_ref().map(redis::Bridge::deadline));
        for s in &self.slots {
            consider(s.respawn_at);
        }
        for p in self.table.iter() {
            consider(p.kill_at);
        }
        if !self.ready || self.reload.is_some() || !self.handovers.is_empty() {
            consider(Some(now + Duration::from_millis(10)));
        }
        t
    }

    /// A worker's bus socket is readable or writable: forward what it
    /// published to every other worker, and flush what is queued for it.
    fn on_bus(&mut self, record: usize) {
        let Some(ep) = self.bus.get_mut(&record) else { return };
        ep.flush();
        loop {
            let n = match self.bus.get_mut(&record).map(|ep| ep.recv(&mut self.bus_buf)) {
                Some(Ok(Some(n))) => n,
                Some(Ok(None)) | None => return,
                Some(Err(_)) => return, // the worker is gone; reaping removes the endpoint
            };
            let Some(decoded) = bus::decode(&self.bus_buf[..n]) else {
                log::warn!("bus: malformed message from record {record}");
                continue;
            };
            let local = decoded.topic != bus::Topic::Cache; // the other workers share the cache already
            let msg: std::sync::Arc<[u8]> = self.bus_buf[..n].into();
            for (other, ep) in self.bus.iter_mut().filter(|_| local) {
                if *other != record {
                    ep.send(msg.clone());
                }
            }
            if let Some(r) = self.redis.as_mut() {
                r.publish(self.poll.registry(), &msg);
            }
        }
    }

    /// The Redis bridge's timers; what other hosts published goes to every
    /// local worker, except their shared-cache writes, stored here.
    fn step_redis(&mut self) {
        let Some(r) = self.redis.as_mut() else { return };
        r.tick(self.poll.registry());
        for msg in r.take_inbound() {
            if let Some(m) = bus::decode(&msg).filter(|m| m.topic == bus::Topic::Cache) {
                // Another host's shared-cache write: stored here, not sent to the workers.
                let ttl_max = self.config.upstreams.cache_ttl.as_millis() as u64;
                redis::store_cache_entry(
                    self.shared_cache,
                    m.payload,
                    ttl_max,
                    bus::wall_ms(),
                    crate::sys::monotonic_ms(),
                );
                continue;
            }
            for ep in self.bus.values_mut() {
                ep.send(msg.clone());
            }
        }
    }

    fn drain(&mut self, pid: i32) {
        let deadline = Instant::now() + self.config.shutdown_timeout + KILL_GRACE;
        if let Some(p) = self.table.iter_mut().find(|p| p.pid == pid) {
            p.role = Role::Draining;
            p.kill_at = Some(deadline);
        }
        sys::kill(pid, Signal::SIGTERM);
    }

    fn graceful_stop(&mut self) {
        log::info!("stopping: draining {} worker(s)", self.table.iter().count());
        self.notifier.send("STOPPING=1\nSTATUS=draining");
        self.stopping = Some(Instant::now() + self.config.shutdown_timeout + KILL_GRACE);
        let pids: Vec<i32> = self.table.iter().map(|p| p.pid).collect();
        for pid in pids {
            self.drain(pid);
        }
        // Close our copies of the listening sockets: once the workers have
        // taken what is queued, the port closes.
        self.slots.clear();
    }

    fn fast_stop(&mut self) {
        log::warn!("stopping now: killing {} worker(s)", self.table.iter().count());
        self.notifier.send("STOPPING=1");
        for p in self.table.iter() {
            sys::kill(p.pid, Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.table.is_empty() && Instant::now() < deadline {
            match waitpid(None, None) {
                Ok(WaitStatus::Exited(pid, _)) | Ok(WaitStatus::Signaled(pid, _, _)) => {
                    self.table.remove(pid.as_raw());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }

    /// One slot more (its worker starts on the next loop turn).
    fn add_slot(&mut self, cause: Cause) {
        let socket = match self.slots.first() {
            Some(first) => listen::another(&first.listener),
            None => listen::bind(self.config.listen),
        };
        let tls = match (self.slots.first().and_then(|s| s.tls.as_ref()), self.config.tls.listen) {
            (Some(first), _) => Some(listen::another(first)),
            (None, Some(addr)) => Some(listen::bind(addr)),
            (None, None) => None,
        };
        let udp = match (self.slots.first().and_then(|s| s.udp.as_ref()), self.config.http3.listen) {
            (Some(first), _) => Some(listen::another_udp(first)),
            (None, Some(addr)) => Some(listen::bind_udp(addr)),
            (None, None) => None,
        };
        let socket = socket.and_then(|l| Ok((l, tls.transpose()?, udp.transpose()?)));
        match socket {
            Ok((listener, tls, udp)) => {
                self.slots.push(Slot { listener, tls, udp, fast_failures: 0, respawn_at: Some(Instant::now()) });
                if let Err(e) = spread_in_turn(&self.slots) {
                    log::debug!("new connections by the kernel's hash: {e}");
                }
                if cause == Cause::Signal {
                    log::info!("SIGTTIN: {} worker(s)", self.slots.len());
                }
            }
            Err(e) => log::error!("{}: cannot open another socket: {e}", cause.name(libc::SIGTTIN)),
        }
    }

    /// One slot less: the last one's worker drains, its socket closes.
    fn remove_slot(&mut self, cause: Cause) {
        if self.slots.len() <= 1 {
            log::warn!("{}: keeping the last worker", cause.name(libc::SIGTTOU));
            return;
        }
        let slot = self.slots.len() - 1;
        let pids: Vec<i32> = self.table.serving(slot).map(|p| p.pid).collect();
        for pid in pids {
            self.drain(pid);
        }
        self.slots.pop();
        if let Err(e) = spread_in_turn(&self.slots) {
            log::debug!("new connections by the kernel's hash: {e}");
        }
        if cause == Cause::Signal {
            log::info!("SIGTTOU: {} worker(s)", self.slots.len());
        }
    }
}
