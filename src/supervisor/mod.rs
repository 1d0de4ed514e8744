//! The supervisor: binds the slots' sockets, forks the workers, keeps them
//! alive, and turns operator signals into actions. It never serves a request.
//!
//! Its cycle follows nginx's master: signal handlers only count (see
//! `sys::signals`); one loop wakes on a signal or a timer and handles, in a
//! fixed order: reap and respawn (with back-off per slot), fast stop,
//! graceful stop, reload, worker count, log reopen, memory and heartbeat
//! checks, readiness. The supervisor stays single-threaded so that `fork`
//! is safe; per-process resources (poll, pool, database) are made by each
//! worker after fork.

mod dirs;
mod listen;
mod notify;
mod pidfile;
mod redis;
mod table;

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
    /// What every worker's session-ticket keys derive from (made once, kept across reloads
    /// and handed over on upgrade).
    tls_secret: [u8; crate::tls::SECRET_LEN],
    region: &'static Region,
    endpoints: &'static crate::upstream::wire::Endpoints,
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

/// A configuration reload in progress: slots still to replace, and the
/// replacement currently starting (slot, new pid, when it was forked).
struct Reload {
    pending: std::collections::VecDeque<usize>,
    current: Option<(usize, i32, Instant)>,
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

/// A binary upgrade in progress: the new supervisor and the pipe it reports on.
struct Upgrade {
    pid: i32,
    pipe: std::fs::File,
    started: Instant,
}

/// How long an upgrade waits for the new supervisor to serve before giving up on it.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll token of the upgrade pipe.
const UPGRADE: Token = Token(usize::MAX);

/// Whether `config` uses a generated (development) signing secret, which an
/// upgrade hands over instead of generating a new one.
fn keeps_generated_secret(config: &Config) -> bool {
    config.is_development() && config.auth.secret == crate::config::JwtSecret::Generate
}

/// A pipe whose read end holds `secret` and then end of file (the write end is
/// closed). Small enough for the pipe's buffer, so the write never blocks.
fn secret_pipe(secret: &[u8]) -> io::Result<std::os::fd::OwnedFd> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    std::io::Write::write_all(&mut std::fs::File::from(write), secret)?;
    Ok(read)
}

/// Why the supervisor cannot listen on `addr`; an address in use is a
/// start-up refusal (exit 2), like a bad configuration.
fn listen_error(addr: std::net::SocketAddr, e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::AddrInUse {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot listen on {addr}: address already in use (another process, perhaps another forkd, listens on it)"),
        );
    }
    io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
}

/// The UDP address of the HTTP/3 sockets, when HTTP/3 is on: `http3.listen`, whose default
/// is `tls.listen`; when that has port 0, the port the TLS sockets got (one port for both).
fn udp_address(config: &Config, slots: &[Slot]) -> Option<SocketAddr> {
    let addr = config.http3.listen?;
    let tls_port = slots.first().and_then(|s| s.tls.as_ref()).and_then(|l| l.local_addr().ok()).map(|a| a.port());
    match tls_port {
        Some(port) if addr.port() == 0 && Some(addr) == config.tls.listen => Some(SocketAddr::new(addr.ip(), port)),
        _ => Some(addr),
    }
}

/// The certificate and key of `config`'s TLS listener; `None` without one.
fn load_tls(config: &Config) -> Result<Option<Arc<CertifiedKey>>, crate::tls::TlsError> {
    match config.tls.listen {
        Some(_) => crate::tls::load(&config.tls.cert_file, &config.tls.key_file).map(Some),
        None => Ok(None),
    }
}

/// Run the supervisor until the service stops; returns the exit code.
pub fn run(config: Config, source: crate::config::Source) -> i32 {
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

/// Why the declared resources' tables could not be brought to a configuration.
enum SchemaRefused {
    /// Destructive changes, one line each: they wait for `forkd migrate --apply`.
    Destructive(String),
    /// The database failed.
    Failed(String),
}

/// Apply the additive schema changes `config`'s declared resources need; refuse (and apply
/// nothing) when any change is destructive.
fn schema_step(config: &Config) -> Result<(), SchemaRefused> {
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
    fn start(config: Config, source: crate::config::Source) -> io::Result<Supervisor> {
        // First, before anything opens a descriptor: what systemd or an upgrading
        // supervisor handed over from fd 3.
        let mut inherited = listen::inherited();
        // A port another process (another forkd included) listens on is
        // refused before anything else starts: SO_REUSEPORT would share it.
        if inherited.listeners.is_empty() {
            listen::ensure_free(config.listen).map_err(|e| listen_error(config.listen, e))?;
        }
        if let (Some(addr), true) = (config.tls.listen, inherited.tls_listeners.is_empty()) {
            listen::ensure_free(addr).map_err(|e| listen_error(addr, e))?;
        }
        // Handed-over UDP sockets are meant to be shared. During an upgrade from a binary that
        // did not hand them over, the old supervisor still holds its own.
        if let (Some(addr), None, true) = (config.http3.listen, &inherited.upgrade, inherited.udp.is_empty()) {
            listen::ensure_free_udp(addr).map_err(|e| listen_error(addr, e))?;
        }
        // Shared by every worker: resolved (or, in development, generated) once, before fork.
        // A development secret generated by the supervisor this one upgrades is
        // kept, as a reload keeps it: tokens survive USR2 too.
        let secret = match inherited.secret.take() {
            Some(s) if keeps_generated_secret(&config) && s.len() >= crate::auth::secret::MIN_SECRET_LEN => {
                log::info!("signing secret: the development secret of the previous supervisor is kept");
                s
            }
            _ => crate::auth::secret::resolve(&config.auth, config.is_development())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("signing secret: {e}")))?,
        };
        // The certificate and key, checked against each other: a bad pair is refused at start.
        let tls_key = load_tls(&config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // Kept across an upgrade, like the development signing secret: sessions resume across it.
        let tls_secret = match inherited.tls_secret.take().map(<[u8; crate::tls::SECRET_LEN]>::try_from) {
            Some(Ok(s)) => s,
            _ => rand::random(),
        };
        let target = crate::store::Target::of(&config);
        crate::store::Store::migrate(target).map_err(|e| io::Error::other(format!("database {target}: {e}")))?;
        schema_step(&config).map_err(|e| match e {
            SchemaRefused::Destructive(lines) => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "declared resources: destructive schema changes refused (run `forkd migrate --apply`):\n{lines}"
                ),
            ),
            SchemaRefused::Failed(why) => io::Error::other(format!("database {target}: declared resources: {why}")),
        })?;
        dirs::prepare_download_dir(&config.download.dir);
        // SQLite's caches are freed with its connection; give the pages back so
        // the supervisor (and every worker forked from it) starts small.
        sys::trim_heap();
        let region = Region::create()?;
        let redis_target = config.cluster.redis_url.clone();
        match &redis_target {
            // Every host places a key alike and counts the same windows (see `redis`).
            Some(_) => {
                region.rate.init(redis::shared_seed(&secret));
                region.rate.enable_sync(redis::clock_offset_ms());
            }
            None => region.rate.init(rand::random()),
        }
        // Upstream names are resolved here, once: a worker's loop never calls the resolver.
        let endpoints = crate::upstream::wire::Endpoints::resolve(&config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("upstream: {e}")))?;
        let endpoints: &'static crate::upstream::wire::Endpoints = Box::leak(Box::new(endpoints));
        let shared_cache = crate::shm::cache::SharedCache::create(config.upstreams.cache_entries, rand::random())?;
        // HTTP/3 0-RTT: the TLS sessions every worker resumes from (and takes once).
        if config.http3.listen.is_some() && config.http3.early_data {
            let sessions = crate::shm::sessions::SharedSessions::create(crate::shm::sessions::ENTRIES, rand::random())?;
            crate::shm::sessions::install(sessions);
        }
        // Captured now: after an upgrade replaced the file, /proc/self/exe names the old one.
        let exe = std::env::current_exe()?;
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        // Arguments read: their memory may now hold the title `ps` shows.
        sys::title::init();
        sys::title::set("forkd: supervisor");
        let activated = !inherited.listeners.is_empty();
        let mut slots: Vec<Slot> = Vec::new();
        let slot =
            |listener| Slot { listener, tls: None, udp: None, fast_failures: 0, respawn_at: Some(Instant::now()) };
        // Every handed-over socket becomes a slot (a queue nobody accepts from would strand connections).
        for listener in inherited.listeners {
            slots.push(slot(listener));
        }
        let mut handed_tls = inherited.tls_listeners;
        if config.tls.listen.is_none() && !handed_tls.is_empty() {
            log::warn!("{} TLS socket(s) handed over but tls.listen is not set: closed", handed_tls.len());
            handed_tls.clear();
        }
        if let Some(first) = slots.first() {
            log::info!(
                "{} listening socket(s) handed over (LISTEN_FDS) on {}; `listen` does not apply",
                slots.len(),
                first.listener.local_addr().map(|a| a.to_string()).unwrap_or_default()
            );
        }
        let mut handed_udp = std::mem::take(&mut inherited.udp);
        if config.http3.listen.is_none() && !handed_udp.is_empty() {
            log::info!("{} UDP socket(s) handed over but HTTP/3 is off: closed", handed_udp.len());
            handed_udp.clear();
        }
        while slots.len() < config.workers.max(handed_tls.len()).max(handed_udp.len()) {
            let listener = match slots.first() {
                Some(first) => listen::another(&first.listener),
                None => listen::bind(config.listen),
            }
            .map_err(|e| listen_error(config.listen, e))?;
            slots.push(slot(listener));
        }
        if let Some(addr) = config.tls.listen {
            let mut handed = handed_tls.into_iter();
            for i in 0..slots.len() {
                let tls = match (handed.next(), slots.first().and_then(|s| s.tls.as_ref())) {
                    (Some(l), _) => Ok(l),
                    (None, Some(first)) => listen::another(first),
                    (None, None) => listen::bind(addr),
                }
                .map_err(|e| listen_error(addr, e))?;
                slots[i].tls = Some(tls);
            }
        }
        if let Some(addr) = udp_address(&config, &slots) {
            if let Some(first) = handed_udp.first() {
                log::info!(
                    "{} HTTP/3 UDP socket(s) handed over (LISTEN_FDS) on {}; `http3.listen` does not apply",
                    handed_udp.len(),
                    first.local_addr().map(|a| a.to_string()).unwrap_or_default()
                );
            }
            let mut handed = handed_udp.into_iter();
            for i in 0..slots.len() {
                let udp = match (handed.next(), slots.first().and_then(|s| s.udp.as_ref())) {
                    (Some(u), _) => Ok(u),
                    (None, Some(first)) => listen::another_udp(first),
                    (None, None) => listen::bind_udp(addr),
                }
                .map_err(|e| listen_error(addr, e))?;
                slots[i].udp = Some(udp);
            }
            // Bound in slot order: group index = slot, what the program returns.
            if let Some(first) = slots.first().and_then(|s| s.udp.as_ref()) {
                if let Err(e) = listen::attach_steering(first) {
                    log::warn!("HTTP/3: cannot steer packets by connection ID (SO_ATTACH_REUSEPORT_CBPF: {e}); the kernel's hash decides");
                }
            }
        }
        // Once the address is ours (a second instance must not overwrite the
        // first one's file). After an upgrade, once this one serves (`check_ready`).
        if let (Some(path), None) = (&config.pid_file, &inherited.upgrade) {
            pidfile::write(path, std::process::id()).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("pid_file {}: {e}", path.display()))
            })?;
        }
        let signals = SignalSet::install(&[
            libc::SIGCHLD,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGHUP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ])?;
        let notifier = Notifier::from_env();
        let now = Instant::now();
        log::info!(
            "forkd {} starting: supervisor pid {}, {} worker(s) on {} ({:?})",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            config.workers,
            config.listen,
            config.environment
        );
        let poll = Poll::new()?;
        let window_ms = config.rate_limit.window.as_millis() as u64;
        let redis = redis_target
            .map(|t| redis::Bridge::new(t, &region.rate, region, window_ms))
            .transpose()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("cluster.redis_url: {e}")))?;
        // Start-up ran most of the code this process will ever run (config,
        // migrations, TLS roots); its loop needs a few pages of it.
        sys::drop_code_pages();
        Ok(Supervisor {
            poll,
            bus: std::collections::HashMap::new(),
            bus_buf: vec![0; bus::MAX_MESSAGE],
            next_memory_check: now + config.supervisor.memory_check,
            next_heartbeat_check: now + HEARTBEAT_CHECK,
            next_watchdog: notifier.watchdog_every.map(|_| now),
            config,
            source,
            reload: None,
            upgrade: None,
            handovers: Vec::new(),
            old_workers: std::mem::take(&mut inherited.old_workers),
            upgraded_from: inherited.upgrade,
            exe,
            args,
            activated,
            secret,
            tls_key,
            tls_secret,
            region,
            endpoints,
            shared_cache,
            slots,
            table: Table::default(),
            signals,
            notifier,
            stopping: None,
            ready: false,
            redis,
        })
    }

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
                    SIGNALS => {}
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
            self.watchdog();
        }
    }

    /// SIGHUP: read the configuration again; if it is valid, apply it and
    /// replace the workers one slot at a time (the new worker serves before
    /// the old one drains, on the same slot socket, so no request fails).
    /// An invalid configuration changes nothing.
    fn begin_reload(&mut self) {
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

    /// SIGUSR2: start a new supervisor from the binary on disk, handing it the
    /// slot sockets (`LISTEN_FDS`) and a pipe; once it reports that it serves,
    /// drain and exit. Both accept from the same sockets meanwhile, so no
    /// queued connection is lost. If the new one fails, this one stays.
    fn begin_upgrade(&mut self) {
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
        let list: String = self.table.iter().map(|p| format!("{} {}\n", p.slot, p.pid)).collect();
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
    fn on_upgrade_pipe(&mut self) {
        let Some(u) = self.upgrade.as_mut() else { return };
        let mut buf = [0u8; 64];
        let n = match std::io::Read::read(&mut u.pipe, &mut buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Ok(n) => n,
            Err(_) => 0,
        };
        let Some(u) = self.upgrade.take() else { return };
        let _ = self.poll.registry().deregister(&mut mio::unix::SourceFd(&u.pipe.as_raw_fd()));
        if n == 0 || !buf[..n].starts_with(b"READY") {
            log::error!("SIGUSR2: the new supervisor {} exited before serving; this one stays", u.pid);
            return;
        }
        log::info!("SIGUSR2: the new supervisor {} serves; draining this one", u.pid);
        // systemd follows the new main process (allowed from the current main).
        self.notifier.send(&format!("MAINPID={}\nREADY=1\nSTATUS=upgraded", u.pid));
        self.graceful_stop();
    }

    /// Advance a reload: start the next slot's new worker, and once it
    /// serves, drain the old ones of that slot.
    fn step_reload(&mut self) {
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

    /// Fork a worker for `slot`; returns its pid.
    fn spawn(&mut self, slot: usize) -> io::Result<i32> {
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
        let (ours, theirs) = bus::pair()?;
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
                        match crate::tls::server_config(Arc::clone(key), tickets, self.config.http2.enabled) {
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
                    shared_cache: self.shared_cache,
                    foreign_writers: self.old_workers.iter().map(|&(_, pid)| pid).collect(),
                });
                std::process::exit(code);
            }
        }
    }

    fn respawn_due(&mut self) {
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
    fn reap(&mut self) {
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
                if p.started.elapsed() < FAST_FAILURE {
                    slot.fast_failures += 1;
                } else {
                    slot.fast_failures = 0;
                }
                let delay = match slot.fast_failures {
                    0 => Duration::ZERO,
                    n => (Duration::from_millis(100) * 2u32.saturating_pow(n - 1)).min(MAX_BACKOFF),
                };
                if !delay.is_zero() {
                    log::warn!("slot {} keeps failing; next start in {delay:?}", p.slot);
                }
                slot.respawn_at = Some(Instant::now() + delay);
            }
        }
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
        if cause == Cause::Signal {
            log::info!("SIGTTOU: {} worker(s)", self.slots.len());
        }
    }

    /// Replace workers over `worker_max_rss_mb`: the new one first, then the old one drains.
    fn check_memory(&mut self) {
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
    fn step_handovers(&mut self) {
        let mut i = 0;
        while i < self.handovers.len() {
            let h = &self.handovers[i];
            let (old, new, since) = (h.old, h.new, h.since);
            let state = self.table.iter().find(|p| p.pid == new).map(|p| self.region.procs[p.record].state());
            let old_alive = self.table.iter().any(|p| p.pid == old);
            let done = match state {
                Some(WorkerState::Serving) => {
                    if old_alive {
                        self.drain(old);
                    }
                    true
                }
                None => {
                    log::error!("the replacement {new} of worker {old} exited before serving; {old} stays");
                    true
                }
                Some(_) if since.elapsed() > RELOAD_START_TIMEOUT => {
                    log::error!("the replacement {new} of worker {old} did not start serving; {old} stays");
                    self.drain(new);
                    true
                }
                Some(_) => !old_alive,
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
    fn check_heartbeats(&mut self) {
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
            let limit = if rec.state() == WorkerState::Starting { limit + STARTUP_GRACE_MS } else { limit };
            if now_ms.saturating_sub(beat) > limit {
                log::error!("worker {} has not turned its loop for {} ms: killing it", p.pid, now_ms - beat);
                sys::kill(p.pid, Signal::SIGKILL);
            } else if p.kill_at.is_some_and(|t| t <= now) {
                log::warn!("worker {} is still draining past the shutdown timeout: killing it", p.pid);
                sys::kill(p.pid, Signal::SIGKILL);
            }
        }
    }

    fn check_ready(&mut self) {
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

    fn watchdog(&mut self) {
        if let (Some(at), Some(every)) = (self.next_watchdog, self.notifier.watchdog_every) {
            if Instant::now() >= at {
                self.notifier.send("WATCHDOG=1");
                self.next_watchdog = Some(Instant::now() + every);
            }
        }
    }
}
