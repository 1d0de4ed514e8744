//! A worker process: one thread, one `mio::Poll`, plus a small thread pool.
//!
//! This file is the loop: it owns the slot's listening sockets, the slab of
//! client connections, the pool's waker, the bus socket and the signal pipe;
//! it polls, accepts, dispatches each event by its typed token
//! (`token::Tok`), fires the timers, stamps the heartbeat in shared memory
//! every turn, routes pool completions to their exchange, and drains
//! gracefully on SIGTERM. It never looks at a route: requests go to
//! [`App::handle`] through the [`Glue`] service.
//!
//! The rest, by seam:
//! * `conn.rs`: a TCP connection (`Conn`: a `Transport` + one `ConnState`) and the driving of
//!   HTTP/1.1; `transport.rs`: its socket, TLS session, buffers and send deadline;
//!   `proxy_header.rs`: the PROXY protocol header a listener may require before the rest.
//! * `crate::exchange`: the engine this loop drives (dispatch, answer, producers, back
//!   pressure, the HTTP/2 and HTTP/3 sinks, the thread pool, the panic boundary, the
//!   `Glue` service into app code), socket-free;
//!   `mux.rs`: routes what the loop produced for an `ExchangeId` (HTTP/1.1, HTTP/2 or
//!   HTTP/3) to its exchange and carries out the engine's effects.
//! * `h2.rs`: an HTTP/2 connection's session (its reading and ending).
//! * `h3.rs`: HTTP/3: the exchanges of each QUIC connection (a table of its own, not a
//!   `ConnState`); `quic.rs`: the slot's UDP socket and the QUIC endpoint on it;
//! * `streams.rs`: an HTTP/1.1 exchange's body after its head (event streams, tickers,
//!   WebSockets, relays) and its end of `mux.rs`'s routes; `h1_sink.rs`: how the engine
//!   writes an HTTP/1.1 exchange's body (file bodies: slices or `sendfile`).
//! * `fanout.rs`: SSE subscribers, WebSocket members and rooms, the bus.
//! * `upstream.rs`: the seat in the loop of the upstream connections
//!   (`crate::upstream::pool`) and which exchange waits on which of them (and gathers);
//!   `relay.rs`: an upstream stream relayed to its client.
//! * `timers.rs`: the deadline heap; `token.rs`: poll tokens;
//!   `bufs.rs`: the free list of connection buffers (idle ones hold none).

mod bufs;
mod conn;
mod fanout;
mod h1_sink;
mod h2;
mod h3;
mod mux;
mod proxy_header;
mod quic;
mod relay;
mod streams;
mod timers;
mod token;
mod transport;
mod upstream;

use crate::cpu::{CpuLane, Standing};
use std::io;
use std::net::TcpListener as StdListener;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Waker};

use crate::app::{App, Services};
use crate::auth::{jwt::Jwt, password::Passwords};
use crate::bus::Endpoint;
use crate::config::Config;
use crate::http::headers::Common;
use crate::http::service::{Env, HIGH_WATERMARK};
use crate::http2::H2Settings;
use crate::shm::metrics::ProcMetrics;
use crate::shm::{ProcRecord, Region, WorkerState};
use crate::store::Store;
use crate::sys::signals::SignalSet;
use crate::sys::trim::{self, Trim};

use crate::exchange::panics;
use crate::exchange::pool::{self, ExchangeId, Pool};
use crate::exchange::{self, engine_cx, Glue};
use conn::{Conn, ConnState, H1};
pub use quic::WorkerH3;
use timers::Timers;
use token::Tok;
use transport::Transport;

/// The loop turns at least this often, so the heartbeat stays fresh when idle.
const MAX_POLL_WAIT: Duration = Duration::from_millis(500);
/// How often a worker deletes the refresh-token families that expired (the
/// first time right after it starts). Every worker does it: the delete is
/// idempotent and cheap when there is nothing to delete.
const PURGE_EVERY: Duration = Duration::from_secs(3600);
/// While a request is pending or output is paused, stop reading past this much input.
const READ_AHEAD: usize = 64 * 1024;
/// A lingering close (RFC 9112 §9.6) reads and discards the peer's input for
/// at most this long after shutting our side, waiting for its FIN.
const LINGER: Duration = Duration::from_secs(2);

/// What a freshly forked worker gets from the supervisor.
pub struct WorkerArgs<'a> {
    /// The validated configuration.
    pub config: &'a Config,
    /// The slot's listening socket (inherited, non-blocking).
    pub listener: StdListener,
    /// The slot's TLS listening socket and this worker's TLS configuration, when TLS is on.
    pub tls: Option<WorkerTls>,
    /// This process's record in shared memory.
    pub record: &'static ProcRecord,
    /// This process's metrics block (same index as `record`).
    pub metrics: &'static ProcMetrics,
    /// The whole shared region (read by `/metrics`).
    pub region: &'static Region,
    /// The access-token signing secret (resolved once, before fork).
    pub secret: &'a [u8],
    /// This worker's end of the bus.
    pub bus: Endpoint,
    /// The slot's UDP socket and QUIC key material, when HTTP/3 is on.
    pub h3: Option<WorkerH3>,
    /// The shared rate-limit table.
    pub rate: &'static crate::shm::ratelimit::RateTable,
    /// The upstreams, resolved before fork.
    pub endpoints: &'static crate::upstream::wire::Endpoints,
    /// The bodies fixed for the configuration's life and their compressed forms, built
    /// before fork.
    pub fixed: Arc<crate::app::fixed::Fixed>,
    /// The upstream-answer cache shared by every worker.
    pub shared_cache: &'static crate::shm::cache::SharedCache,
    /// After `SIGUSR2`: the old supervisor's workers, which write to the same database
    /// without this region's change counters (see `app::usermemo`).
    pub foreign_writers: Vec<i32>,
    /// The ACME challenge answers to serve (empty outside an order of `[tls.acme]`).
    pub acme: Arc<crate::acme::Challenges>,
}

/// A worker's HTTPS listener: the slot's socket on `tls.listen` and the rustls configuration
/// (certificate, ALPN, the shared session-ticket keys) every connection on it uses.
pub struct WorkerTls {
    /// The slot's TLS listening socket (inherited, non-blocking).
    pub listener: StdListener,
    /// Built by the worker after fork.
    pub config: Arc<rustls::ServerConfig>,
}

/// The exit code of a worker that died of a panic (Rust's own for a panicking `main`).
const PANIC_EXIT: i32 = 101;

/// Run the worker until it has drained; returns the process exit code.
///
/// Never unwinds. This process is a fork of the supervisor: the frames that
/// called it hold the supervisor's objects, whose descriptors the child closed
/// right after the fork. A panic unwinding into them would close those
/// descriptors a second time (by then, maybe, ones this worker opened since);
/// so a panic that escapes the worker ends here, after the worker's own
/// objects were dropped, and the caller exits.
pub fn run(args: WorkerArgs<'_>) -> i32 {
    panics::install_hook();
    // Before any thread starts: big buffers are mappings of their own, returned when freed.
    crate::sys::fix_mmap_threshold(crate::sys::MMAP_THRESHOLD);
    let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Worker::new(args).and_then(|mut w| w.run())));
    // The last turn's access lines, whichever way the loop ended.
    crate::logging::flush_access();
    match worked {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            log::error!("worker {} failed: {e}", std::process::id());
            1
        }
        // The hook logged the panic's message and place.
        Err(_) => {
            log::error!("worker {} died of a panic", std::process::id());
            PANIC_EXIT
        }
    }
}

struct Worker {
    config: &'static Config,
    svc: &'static Services,
    record: &'static ProcRecord,
    metrics: &'static ProcMetrics,
    poll: Poll,
    listener: Option<TcpListener>,
    /// The TLS listener, when TLS is on.
    tls_listener: Option<TcpListener>,
    tls_config: Option<Arc<rustls::ServerConfig>>,
    accepting: bool,
    accept_retry: Option<Instant>,
    signals: SignalSet,
    pool: Pool,
    app: App,
    env: Env,
    /// `[http2]` as the settings every HTTP/2 connection announces; `None`: HTTP/2 is off
    /// (no connection is sniffed for the preface).
    h2: Option<H2Settings>,
    /// HTTP/3 on the slot's UDP socket, when on.
    h3: Option<Box<h3::H3>>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    live: usize,
    /// Most connections open at once since memory was last given back.
    peak: usize,
    /// When [`Worker::give_back_memory`] next trims the heap whatever the peak.
    next_trim: Instant,
    /// The earliest [`Worker::give_back_memory`] trims again because the
    /// worker's last connection closed.
    next_quiet_trim: Instant,
    /// When [`Worker::purge_tokens`] next runs.
    next_purge: Instant,
    next_generation: u32,
    timers: Timers,
    scratch: Vec<u8>,
    /// The connection being driven was woken by a readable edge with neither the peer's
    /// end nor an error: a short read drains its socket ([`crate::net::read_plain_batch`]).
    edge: bool,
    drain_deadline: Option<Instant>,
    bus: Endpoint,
    bus_seq: u64,
    published: crossbeam_channel::Receiver<crate::app::Publish>,
    /// Event-stream subscribers, by exchange (HTTP/1.1 connections, HTTP/2 and HTTP/3
    /// streams), with who each is for.
    sse: exchange::Subscribers,
    rooms: crate::bus::rooms::Rooms,
    up: crate::upstream::pool::Upstreams,
    /// Paused connections whose output drained outside their own `drive` (slab index,
    /// generation): driven again after the turn's events.
    drained: Vec<(usize, u32)>,
    /// Connection buffers not in use: an idle connection holds none.
    bufs: bufs::Bufs,
    /// The pool's results of one wake-up (kept: no vector per wake-up).
    done: Vec<pool::Done>,
    /// A room message's frame, encoded once per worker (kept between messages).
    room_frame: Vec<u8>,
    /// The members a room message goes to (kept between messages).
    room_members: Vec<ExchangeId>,
    /// The event streams an event goes to (kept between events).
    sse_targets: Vec<ExchangeId>,
}

impl Worker {
    fn new(args: WorkerArgs<'_>) -> io::Result<Worker> {
        // Per-process state, made after fork and kept for the process's life.
        let config: &'static Config = Box::leak(Box::new(args.config.clone()));
        // Only the pool's threads use the store, so more connections than threads would never
        // be borrowed at once: they would only hold memory.
        let store = Store::open(config, config.db.pool_size.min(config.io.threads))
            .map_err(|e| io::Error::other(format!("database: {e}")))?;
        // Hashing is pure CPU: no more lane threads than CPUs. Only lane
        // threads ever hold argon2 memory.
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let lane_threads = config.io.threads.min(cpus);
        let cpu = CpuLane::start("cpu", lane_threads, Standing::Idle, crate::auth::password::release_memory)?;
        // Compression runs below the loop too, but is never starved: a compressing load
        // costs compressed pages per second, not the loop's latency.
        crate::app::phases::compress::start_lane(CpuLane::start("compress", lane_threads, Standing::Nice(10), || {})?);
        // Instant (no hash is computed): the worker serves as soon as its loop runs.
        let passwords = Passwords::new(config.auth.argon2_memory_kib, config.auth.argon2_iterations)
            .map_err(|e| io::Error::other(format!("password hashing: {e}")))?;
        let jwt = Jwt::new(args.secret, &config.auth.issuer, &config.auth.audience, config.auth.access_ttl);
        let (publish, published) = crossbeam_channel::unbounded();
        // The memo of users trusts the shared change counters: they see every write on one
        // host's SQLite, not other hosts' (PostgreSQL), nor an old supervisor's workers.
        let (user_memo, user_fills) = crate::app::usermemo::UserMemo::new(store.single_host(), args.foreign_writers);
        let svc: &'static Services = Box::leak(Box::new(Services {
            config,
            store: Box::leak(Box::new(store)),
            jwt,
            passwords,
            cpu,
            publish,
            record: args.record,
            region: args.region,
            stats: Box::leak(Box::default()),
            rate: args.rate,
            endpoints: args.endpoints,
            shared_cache: args.shared_cache,
            user_fills,
            acme: args.acme,
        }));
        let poll = Poll::new()?;
        let mut signals = SignalSet::install(&[libc::SIGTERM])?;
        for sig in
            [libc::SIGINT, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGTTIN, libc::SIGTTOU, libc::SIGQUIT]
        {
            crate::sys::signals::ignore(sig)?;
        }
        poll.registry().register(signals.source(), Tok::Signals.into(), Interest::READABLE)?;
        // Handlers are in place: let signals that arrived since fork through.
        crate::sys::unblock_signals()?;
        let waker = Arc::new(Waker::new(poll.registry(), Tok::Waker.into())?);
        let pool = Pool::new(config.io.threads, waker)?;
        args.listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(args.listener);
        poll.registry().register(&mut listener, Tok::Listener.into(), Interest::READABLE)?;
        let (tls_listener, tls_config) = match args.tls {
            Some(tls) => {
                tls.listener.set_nonblocking(true)?;
                let mut l = TcpListener::from_std(tls.listener);
                poll.registry().register(&mut l, Tok::TlsListener.into(), Interest::READABLE)?;
                (Some(l), Some(tls.config))
            }
            None => (None, None),
        };
        poll.registry().register(
            &mut mio::unix::SourceFd(&args.bus.fd()),
            Tok::Bus.into(),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let h3 = match args.h3 {
            Some(a) => Some(Box::new(h3::H3::new(a, config, poll.registry())?)),
            None => None,
        };
        let env = Env {
            common: Common::new(config.csp_report_only),
            max_head: config.limits.max_header_bytes,
            max_body: config.limits.json_body_bytes as u64,
            header_timeout: config.limits.header_timeout,
            body_timeout: config.limits.body_timeout,
            keepalive_timeout: config.limits.keepalive_timeout,
            development: config.is_development(),
            draining: false,
            // Leaked once per worker, like the app's copy: every error borrows it.
            alt_svc: crate::app::alt_svc_value(config).map(|v| &*Box::leak(v.into_boxed_str())),
        };
        Ok(Worker {
            config,
            svc,
            record: args.record,
            metrics: args.metrics,
            poll,
            listener: Some(listener),
            tls_listener,
            tls_config,
            accepting: true,
            accept_retry: None,
            signals,
            pool,
            // Kept for the worker's life, like the services.
            app: App::new(svc, user_memo, Box::leak(Box::new(args.fixed))),
            env,
            h2: H2Settings::from_config(config),
            h3,
            conns: Vec::new(),
            free: Vec::new(),
            live: 0,
            peak: 0,
            next_trim: Instant::now() + trim::TRIM_EVERY,
            next_quiet_trim: Instant::now(),
            next_purge: Instant::now(),
            next_generation: 1,
            timers: Timers::default(),
            scratch: vec![0; crate::bus::MAX_MESSAGE],
            edge: false,
            drain_deadline: None,
            bus: args.bus,
            bus_seq: 0,
            published,
            sse: Default::default(),
            rooms: Default::default(),
            up: Default::default(),
            drained: Vec::new(),
            bufs: bufs::Bufs::default(),
            done: Vec::new(),
            room_frame: Vec::new(),
            room_members: Vec::new(),
            sse_targets: Vec::new(),
        })
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        self.record.set_state(WorkerState::Serving);
        log::debug!("worker {} serving", std::process::id());
        loop {
            let now = Instant::now();
            self.record.beat(crate::sys::monotonic_ms());
            self.env.common.tick(SystemTime::now());
            if let Some(deadline) = self.drain_deadline {
                if self.live == 0 && self.pool.active() == 0 && self.h3.as_ref().is_none_or(|h| h.is_empty()) {
                    self.svc.store.close();
                    return Ok(());
                }
                if now >= deadline {
                    log::warn!("worker {}: shutdown timeout, cutting {} connection(s)", std::process::id(), self.live);
                    return Ok(());
                }
            }
            let resume_now = (!self.drained.is_empty() || self.h3.as_ref().is_some_and(|h| h.busy())).then_some(now);
            let h3_at = self.h3.as_ref().and_then(|h| h.deadline());
            let wait = [self.timers.next(), self.accept_retry, self.drain_deadline, resume_now, h3_at]
                .into_iter()
                .flatten()
                .map(|t| t.saturating_duration_since(now))
                .fold(MAX_POLL_WAIT, Duration::min);
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            for event in events.iter() {
                match Tok::from(event.token()) {
                    Tok::Listener => self.accept_on(false),
                    Tok::TlsListener => self.accept_on(true),
                    Tok::Waker => self.completions(),
                    Tok::Bus => self.on_bus(),
                    Tok::Signals => self.signals.drain(),
                    Tok::Upstream(ui) => self.up_ready(ui),
                    Tok::Client(i) => {
                        self.edge = event.is_readable() && !event.is_read_closed() && !event.is_error();
                        self.drive(i);
                        self.edge = false;
                    }
                    Tok::Udp => self.h3_turn(true),
                    Tok::Inbox => self.h3_inbox_ready(),
                }
            }
            self.resume_drained();
            // Datagrams left unread, connections completions touched, timers due.
            if self.h3.as_ref().is_some_and(|h| h.busy() || h.deadline().is_some_and(|t| t <= Instant::now())) {
                self.h3_turn(false);
            }
            // What the loop's own handlers published this turn (a shared-cache write).
            self.publish_queued();
            // The turn's access lines, in one write.
            crate::logging::flush_access();
            // Counters are checked every turn, not only on a wake-up byte.
            self.on_signal();
            let now = Instant::now();
            self.expire(now);
            self.give_back_memory(now);
            self.purge_tokens(now);
        }
    }

    /// Every [`PURGE_EVERY`] (not while draining), delete the expired refresh-token
    /// families on the pool.
    fn purge_tokens(&mut self, now: Instant) {
        if now < self.next_purge || self.drain_deadline.is_some() {
            return;
        }
        self.next_purge = now + PURGE_EVERY;
        let store = self.svc.store;
        self.pool.chore(Box::new(move || {
            let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            match store.purge_expired_families(i64::try_from(unix).unwrap_or(i64::MAX)) {
                Ok(0) => {}
                Ok(n) => {
                    log::info!("store: deleted {n} expired refresh-token famil{}", if n == 1 { "y" } else { "ies" })
                }
                Err(e) => log::warn!("store: purging expired refresh tokens failed: {e}"),
            }
        }));
    }

    /// Give the allocator's free pages back to the kernel when
    /// [`trim::due`] says so: every [`trim::TRIM_EVERY`], at once when the
    /// last connection closes, and after a crowd of connections has gone
    /// (e.g. 10 000 SSE streams closed), when the slab also shrinks to its
    /// last live entry.
    fn give_back_memory(&mut self, now: Instant) {
        let state = trim::State {
            live: self.live,
            peak: self.peak,
            next_trim: self.next_trim,
            next_quiet_trim: self.next_quiet_trim,
        };
        let why = trim::due(state, now);
        match why {
            Trim::No => return,
            Trim::Periodic => {}
            Trim::Quiet => {
                self.peak = 0;
                self.next_quiet_trim = now + trim::QUIET_TRIM_GAP;
            }
            Trim::Crowd => {
                self.peak = self.live;
                while matches!(self.conns.last(), Some(None)) {
                    self.conns.pop();
                }
                let len = self.conns.len();
                self.free.retain(|&i| i < len);
                self.conns.shrink_to_fit();
                self.free.shrink_to_fit();
                self.sse.shrink_to_fit();
            }
        }
        self.next_trim = now + trim::TRIM_EVERY;
        crate::sys::trim_heap();
        log::trace!("worker {}: heap trimmed ({why:?}) in {:?}", std::process::id(), now.elapsed());
    }

    fn on_signal(&mut self) {
        if self.signals.take(libc::SIGTERM) > 0 && self.drain_deadline.is_none() {
            self.begin_drain();
        }
    }

    /// Stop accepting (taking what the kernel already queued), close idle
    /// connections, let the rest finish with `Connection: close`.
    fn begin_drain(&mut self) {
        log::info!("worker {} draining", std::process::id());
        self.record.set_state(WorkerState::Draining);
        self.env.draining = true;
        self.drain_deadline = Some(Instant::now() + self.config.shutdown_timeout);
        self.accept();
        for mut l in [self.listener.take(), self.tls_listener.take()].into_iter().flatten() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        self.end_streams();
        self.h3_drain();
        let now = Instant::now();
        for i in 0..self.conns.len() {
            if let Some(Some(c)) = self.conns.get_mut(i) {
                match &mut c.state {
                    // GOAWAY: open streams finish; the drain deadline cuts the rest.
                    ConnState::Http2(sess) => sess.shut_down(now + h2::cut_after(self.config.shutdown_timeout)),
                    ConnState::Http1(h) if !h.detached() => h.codec.drain(now),
                    ConnState::Http1(_) | ConnState::Lingering(_) => {}
                    // No request has started: nothing to finish.
                    ConnState::ProxyHeader(_) => {
                        self.close(i);
                        continue;
                    }
                }
            }
            self.drive(i);
        }
    }

    /// Accept what both listeners have queued.
    fn accept(&mut self) {
        self.accept_on(false);
        self.accept_on(true);
    }

    /// Accept what the plain (`tls` false) or the TLS listener has queued.
    fn accept_on(&mut self, tls: bool) {
        loop {
            if self.live >= self.config.limits.max_connections {
                self.pause_accepting(None);
                return;
            }
            let listener = if tls { self.tls_listener.as_ref() } else { self.listener.as_ref() };
            let Some(listener) = listener else { return };
            match listener.accept() {
                Ok((sock, peer)) => {
                    let Some(proxied) = self.proxy_admits(tls, peer.ip()) else { continue };
                    let _ = sock.set_nodelay(true);
                    let session = match (tls, &self.tls_config) {
                        (false, _) | (true, None) => None,
                        (true, Some(config)) => match rustls::ServerConnection::new(Arc::clone(config)) {
                            Ok(session) => Some(Box::new(session)),
                            Err(e) => {
                                log::warn!("TLS: cannot start a session: {e}");
                                continue;
                            }
                        },
                    };
                    self.add_conn(sock, peer.ip(), session, proxied);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED) | Some(libc::EPROTO)) => continue,
                Err(e) => {
                    // EMFILE/ENFILE/ENOBUFS: back off instead of spinning.
                    log::warn!("accept: {e}");
                    self.pause_accepting(Some(Instant::now() + Duration::from_millis(100)));
                    return;
                }
            }
        }
    }

    fn pause_accepting(&mut self, retry: Option<Instant>) {
        if self.accepting {
            for l in [self.listener.as_mut(), self.tls_listener.as_mut()].into_iter().flatten() {
                let _ = self.poll.registry().deregister(l);
            }
            self.accepting = false;
        }
        self.accept_retry = retry;
    }

    fn resume_accepting(&mut self) {
        if !self.accepting && self.live < self.config.limits.max_connections {
            let listeners = [(self.listener.as_mut(), Tok::Listener), (self.tls_listener.as_mut(), Tok::TlsListener)];
            for (l, token) in listeners {
                if let Some(l) = l {
                    if self.poll.registry().register(l, token.into(), Interest::READABLE).is_ok() {
                        self.accepting = true;
                        self.accept_retry = None;
                    }
                }
            }
        }
    }

    /// Serve an accepted socket from `peer` (`tls`: its session on the TLS listener;
    /// `proxied`: it starts with a PROXY protocol header).
    fn add_conn(
        &mut self,
        mut sock: TcpStream,
        peer: std::net::IpAddr,
        tls: Option<Box<rustls::ServerConnection>>,
        proxied: bool,
    ) {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if let Err(e) =
            self.poll.registry().register(&mut sock, Tok::Client(idx).into(), Interest::READABLE | Interest::WRITABLE)
        {
            log::warn!("register: {e}");
            self.free.push(idx);
            return;
        }
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let now = Instant::now();
        let secure = tls.is_some();
        self.conns[idx] = Some(Conn {
            io: Transport::new(sock, tls, Vec::new(), Vec::new()),
            peer,
            generation,
            timer_at: None,
            paused: false,
            state: if proxied {
                ConnState::ProxyHeader(now + self.env.header_timeout)
            } else {
                ConnState::Http1(H1::fresh(idx, generation, peer, secure, self.h2.is_some(), &self.env, now))
            },
        });
        self.live += 1;
        self.peak = self.peak.max(self.live);
        self.publish_connections();
        // The first bytes may already be there; read them now.
        self.drive(idx);
    }

    /// The worker's open connections in its shared record (`forkd_open_connections`): TCP
    /// connections and HTTP/3's QUIC connections alike.
    fn publish_connections(&self) {
        let quic = self.h3.as_ref().map_or(0, |h| h.connections());
        self.record.connections.store((self.live + quic) as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn close(&mut self, idx: usize) {
        if let Some(mut c) = self.conns.get_mut(idx).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut c.io.sock);
            self.bufs.give(c.io.inbuf);
            self.bufs.give(c.io.out);
            self.release(c.state);
            self.free.push(idx);
            self.live -= 1;
            self.publish_connections();
            if self.drain_deadline.is_none() {
                self.resume_accepting();
            }
        }
    }

    /// The protocol state of a connection is gone (the connection closed or lingers): its
    /// exchanges leave every registry and their upstream calls are cancelled.
    fn release(&mut self, state: ConnState) {
        match state {
            ConnState::Http1(mut h) => self.forget(&mut h.ex),
            ConnState::Http2(mut sess) => self.forget(sess.parts().0),
            ConnState::ProxyHeader(_) | ConnState::Lingering(_) => {}
        }
    }

    /// A connection's exchanges are gone: their subscriptions, upstream waits and
    /// WebSockets go.
    fn forget<K: exchange::Key, H: exchange::Head>(&mut self, ex: &mut exchange::Exchanges<K, H>) {
        if !ex.is_empty() {
            ex.close_all(&mut self.sse);
            self.carry_out(std::mem::take(&mut ex.effects));
        }
    }

    /// Publish what jobs and handlers queued on `svc.publish` (inlined: the loop calls it
    /// every turn).
    #[inline]
    fn publish_queued(&mut self) {
        while let Ok((topic, payload)) = self.published.try_recv() {
            self.publish(topic, &payload);
        }
    }

    fn completions(&mut self) {
        // Messages jobs published (a stored notification) go out first.
        self.publish_queued();
        // One vector for every wake-up: taken, filled, drained, put back.
        let mut done = std::mem::take(&mut self.done);
        done.extend(self.pool.completions());
        for d in done.drain(..) {
            self.exchange_completed(d.id, d.result);
        }
        self.done = done;
    }

    /// Read, process and write until nothing more can happen without an event.
    fn drive(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        match &c.state {
            ConnState::Http1(h) if h.detached() => self.drive_stream(idx),
            ConnState::Http1(_) => self.drive_h1(idx),
            ConnState::Http2(_) => self.drive_h2(idx),
            ConnState::Lingering(_) => self.linger(idx),
            ConnState::ProxyHeader(_) => self.drive_proxy_header(idx),
        }
    }

    /// Read again on connections paused by their output once it drained elsewhere
    /// (edge-triggered: the bytes already in their sockets raise no new event).
    fn resume_drained(&mut self) {
        for (idx, generation) in std::mem::take(&mut self.drained) {
            if matches!(self.conns.get(idx), Some(Some(c)) if c.generation == generation) {
                self.drive(idx);
            }
        }
    }

    /// Queue the connection's earliest deadline (protocol, send, stream).
    fn arm(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let want = [c.state.deadline(&self.env), c.io.send_deadline].into_iter().flatten().min();
        if let Some(at) = want {
            if c.timer_at.is_none_or(|t| at < t) {
                c.timer_at = Some(at);
                self.timers.push(at, Tok::Client(idx), c.generation);
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        if self.accept_retry.is_some_and(|t| t <= now) {
            self.accept_retry = None;
            self.resume_accepting();
            self.accept();
        }
        while let Some((at, tok, generation)) = self.timers.pop_due(now) {
            let idx = match tok {
                Tok::Client(idx) => idx,
                Tok::Upstream(ui) => {
                    self.up_timer(ui, at, generation, now);
                    continue;
                }
                _ => continue,
            };
            let Some(Some(c)) = self.conns.get_mut(idx) else { continue };
            if c.generation != generation || c.timer_at != Some(at) {
                continue;
            }
            c.timer_at = None;
            let lingered = matches!(c.state, ConnState::Lingering(until) if until <= now);
            if let ConnState::ProxyHeader(until) = c.state {
                if until <= now {
                    log::debug!("PROXY protocol from {}: no whole header in time: closed", c.peer);
                    self.metrics.count_proxy_refused();
                    self.close(idx);
                } else {
                    self.arm(idx);
                }
                continue;
            }
            if lingered || c.io.send_deadline.is_some_and(|t| t <= now) {
                self.close(idx);
                continue;
            }
            match &mut c.state {
                ConnState::Http1(h) if h.detached() => self.stream_timer(idx, now),
                ConnState::Http1(h) => {
                    let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
                    // `Close` (an idle keep-alive, or a 408 queued): `drive` flushes
                    // and ends the connection; otherwise the deadline moved later and
                    // `drive` re-arms it.
                    h.codec.on_timeout(&mut c.io.out, &mut glue, &mut self.env, now);
                    self.drive(idx);
                }
                ConnState::Http2(sess) => {
                    sess.on_timer(&self.env, now);
                    // Then its exchanges': heartbeats, tickers and pings due; 408 on late bodies.
                    let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
                    let (ex, out, heads) = sess.parts();
                    ex.tick(&glue, now);
                    ex.expire(out, &mut engine_cx!(self, &mut glue, heads), now);
                    self.drive_h2(idx);
                }
                ConnState::Lingering(_) => self.arm(idx),
                ConnState::ProxyHeader(_) => {}
            }
        }
    }
}
