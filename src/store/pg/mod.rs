//! The PostgreSQL backend (`cluster.database_url`): the same calls as the SQLite backend, on a
//! database every host shares. This file owns the pool, the connections and the deadline of a
//! call; `migrate.rs` the schema, `users.rs` and `records.rs` the SQL, `error.rs` the mapping
//! of PostgreSQL errors to [`StoreError`].
//!
//! **The client.** `tokio-postgres`, driven blocking: each pooled connection owns a small
//! current-thread tokio runtime (no threads of its own) and every statement is one
//! `block_on` on the calling pool thread. That is exactly what the blocking `postgres` crate
//! does inside; it is used directly here for one thing that crate lacks: a deadline. Each
//! store call gets [`CALL_DEADLINE`] for everything (waiting for a pooled connection,
//! connecting, every statement), and a statement still running then is abandoned and its
//! connection dropped. A paused server (SIGSTOP), a dead host behind a live route, a lock
//! held for ever: the call fails as `Unavailable` (503) in bounded time, never a hang. The
//! server-side `statement_timeout` (a little shorter) stops the work there too, and TCP
//! keepalive with `TCP_USER_TIMEOUT` notices a vanished peer on idle connections.
//!
//! **The pool.** `db.pool_size` connections per worker at most, opened on first use after
//! fork (so a worker starts, and `/health` answers, while the database is away) and used
//! from the worker's pool threads only, never the event loop. A connection whose call failed
//! at the connection level (closed, I/O error, deadline, server shutting down) is dropped
//! along with every idle one (they most likely died in the same outage), and the next call
//! opens a fresh one: the service recovers by itself when the database returns. Connecting
//! (TCP and the start-up exchange) is bounded by the connect timeout, 2 s; after a failed
//! attempt, calls fail at once for half a second rather than each holding a pool thread for
//! another timeout against an unreachable host. A connection
//! that sat idle for over a second answers an empty query before it is used, so one the
//! server closed meanwhile (a restart with no traffic) is replaced, not failed on. Statements
//! are prepared once per connection and cached by their text. Every value is a `$n`
//! parameter.
//!
//! **Reads share one connection.** A call that is one read statement outside a transaction
//! ([`Pg::read`]: a user or post by id, a user by e-mail, the notifications after an id) does
//! not lease a connection of its own: the pool threads running such calls use one shared
//! connection (one of the pool's slots) at the same time, each blocking on its runtime. One
//! of them drives the socket for all (tokio's current-thread runtime hands its driver to
//! whichever blocked thread is free), so their statements go out together and come back
//! together: pipelined, one `write` and one `read` for several requests on both sides,
//! which is where a loaded single-row read spends its time (the round trip's system calls and
//! wake-ups, not PostgreSQL's executor). Writes and transactions keep exclusive leases (a
//! statement of another call inside `BEGIN … COMMIT` would run in that transaction). While
//! the shared connection is being opened, or every slot is taken, a read leases one as any
//! call does; a read that fails at the connection level drops the shared connection like any
//! other, and the next read opens a fresh one.
//!
//! **TLS.** With `sslmode=require` (see `config::cluster`) every connection is TLS (rustls with
//! ring, through `tokio-postgres-rustls`), the server's certificate verified for the URL's
//! host against the system's roots or the `sslrootcert` file; a certificate that does not
//! verify fails the connection like an unreachable server. Without it, plain TCP.
//!
//! Nothing here touches HTTP, sockets of the event loop or mio.

mod error;
mod migrate;
pub(crate) mod records;
mod resources;
mod users;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::runtime::Runtime;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Connection, NoTls, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{migrations, StoreError};
use crate::config::DatabaseUrl;
pub(crate) use error::Fail;

/// Everything one store call may take: waiting for a connection, connecting, its statements.
pub const CALL_DEADLINE: Duration = Duration::from_secs(4);
/// Opening a connection (unless the URL sets `connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The server's own limit per statement, below the call's deadline so that it usually
/// answers (and keeps the connection) before the client gives up on it.
const STATEMENT_TIMEOUT_MS: u64 = 3000;
/// Prepared statements kept per connection: every fixed one, and the list variants (filters
/// and sort orders) in use.
const STATEMENT_CACHE: usize = 64;
/// After a failed connect, calls fail at once for this long before the next attempt.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// A pooled connection unused for this long is checked (one round trip) before use.
const IDLE_CHECK_AFTER: Duration = Duration::from_secs(1);
/// TCP keepalive on idle connections: first probe after this much silence.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Sent data unacknowledged this long fails the connection (Linux `TCP_USER_TIMEOUT`).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);
/// SQL for "now" as RFC 3339 UTC with milliseconds, the text SQLite's `now_sql!` writes.
/// `now()` is the transaction's start, so two uses in a statement agree.
macro_rules! pg_now {
    () => {
        r#"to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')"#
    };
}
pub(crate) use pg_now;

/// The PostgreSQL backend: connection settings and a lazily filled pool; `Sync`.
pub(crate) struct Pg {
    settings: Settings,
    /// The URL without its password, for messages.
    shown: String,
    pool: Mutex<Pool>,
    returned: Condvar,
    deadline: Duration,
    /// The connection reads share (see the module doc); it holds one of the pool's slots
    /// while it exists.
    shared: Mutex<SharedSlot>,
}

/// The shared read connection's state.
enum SharedSlot {
    /// None; the next read opens one (if a slot is free).
    Closed,
    /// A read is opening it; reads meanwhile lease a connection of their own.
    Opening,
    Open(Arc<Shared>),
}

/// The connection reads share: used by several pool threads at once.
struct Shared {
    link: Link,
    born: Instant,
    /// When its last read ended, in milliseconds after `born`.
    last_used_ms: AtomicU64,
}

impl Shared {
    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_used_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        self.born.elapsed().saturating_sub(Duration::from_millis(self.last_used_ms.load(Ordering::Relaxed)))
    }
}

struct Pool {
    idle: VecDeque<Conn>,
    /// Connections in existence (idle, lent, or being opened); at most `size`.
    open: usize,
    size: usize,
    closed: bool,
    /// After a failed connect, no new connection is tried before this: calls fail at once
    /// instead of each holding a pool thread for the connect timeout (an unreachable host).
    retry_at: Option<Instant>,
}

/// What runs statements on one connection: its runtime, the client, and its prepared
/// statements by SQL text. Usable from several threads at once (`&self`).
struct Link {
    rt: Runtime,
    client: Client,
    statements: Mutex<HashMap<String, Statement>>,
}

impl Link {
    fn new(rt: Runtime, client: Client) -> Link {
        Link { rt, client, statements: Mutex::new(HashMap::new()) }
    }

    /// Whether this connection still answers: an empty query, one round trip, before a
    /// connection that sat idle is used. The server may have closed it meanwhile (a restart,
    /// an idle timeout, a failover); finding that out here costs a request nothing.
    fn answers(&self, deadline: Instant) -> bool {
        block(&self.rt, deadline, self.client.batch_execute("")).is_ok()
    }

    /// The prepared statement for `sql` on this connection.
    fn statement(&self, sql: &str, deadline: Instant) -> Result<Statement, Fail> {
        let cached = |map: &mut HashMap<String, Statement>| map.get(sql).cloned();
        if let Some(stmt) = cached(&mut self.statements.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(stmt);
        }
        // Not held across the round trip: two threads may prepare the same text once each.
        let stmt = block(&self.rt, deadline, self.client.prepare(sql))?;
        let mut map = self.statements.lock().unwrap_or_else(PoisonError::into_inner);
        // The fixed statements fit easily; rare list variants beyond the bound are used once
        // and closed (dropping a `Statement` closes it on the server).
        if map.len() < STATEMENT_CACHE {
            map.entry(sql.to_owned()).or_insert_with(|| stmt.clone());
        }
        Ok(stmt)
    }
}

/// One pooled connection, lent to one call at a time.
struct Conn {
    link: Link,
    /// When its last call ended: a connection idle for longer is checked before use.
    last_used: Instant,
}

impl Conn {
    fn new(rt: Runtime, client: Client) -> Conn {
        Conn { link: Link::new(rt, client), last_used: Instant::now() }
    }
}

/// How to connect: the client's settings and, for `sslmode=require`, the TLS connector.
struct Settings {
    config: tokio_postgres::Config,
    tls: Option<MakeRustlsConnect>,
}

/// The TLS connector for `url`'s `sslmode=require`: roots from its `sslrootcert` file, or the
/// system's (see `tls::client`).
fn tls_connector(url: &DatabaseUrl) -> Result<MakeRustlsConnect, String> {
    let config = crate::tls::client::config(url.root_cert()).map_err(|e| match url.root_cert() {
        Some(_) => format!("sslrootcert {e}"),
        None => format!("sslmode=require: {e}"),
    })?;
    Ok(MakeRustlsConnect::new(config))
}

impl Pg {
    /// The settings of `url` with forkd's bounds added (connect timeout, keepalive,
    /// `TCP_USER_TIMEOUT`, `statement_timeout`, `application_name`) and its TLS connector;
    /// reads the `sslrootcert` file, connects to nothing.
    fn settings(url: &DatabaseUrl) -> Result<Settings, StoreError> {
        let mut config = tokio_postgres::Config::from_str(url.expose())
            .map_err(|_| StoreError::Unavailable(format!("{url}: not a valid PostgreSQL URL")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.keepalives(true).keepalives_idle(KEEPALIVE_IDLE).tcp_user_timeout(TCP_USER_TIMEOUT);
        let options = format!("-c statement_timeout={STATEMENT_TIMEOUT_MS}");
        let options = match config.get_options() {
            Some(own) if !own.is_empty() => format!("{own} {options}"),
            _ => options,
        };
        config.options(options);
        if config.get_application_name().is_none() {
            config.application_name("forkd");
        }
        let tls = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => {
                Some(tls_connector(url).map_err(|e| StoreError::Unavailable(format!("{url}: {e}")))?)
            }
            _ => None,
        };
        Ok(Settings { config, tls })
    }

    /// Apply the pending migrations (see `migrate.rs`); one connection, closed on return.
    pub(crate) fn migrate(url: &DatabaseUrl) -> Result<(), StoreError> {
        let settings = Self::settings(url)?;
        let deadline = Instant::now() + migrate::DEADLINE;
        let (rt, client) = connect(&settings, deadline).map_err(|e| e.into_store(&url.to_string()))?;
        let mut conn = Conn::new(rt, client);
        let mut session = Session { conn: &mut conn, deadline, in_tx: false };
        migrate::run(&mut session).map_err(|e| e.into_store(&url.to_string()))
    }

    /// The declared resources' tables against `registry` (see `store::schema`), planned and
    /// applied as `mode` allows in one transaction under the migration lock, so hosts
    /// starting together apply each change once and agree on what was applied.
    pub(crate) fn migrate_resources(
        url: &DatabaseUrl,
        registry: &crate::resources::Registry,
        mode: super::schema::Mode,
    ) -> Result<super::schema::Plan, StoreError> {
        use super::records::sql::Dialect;
        use super::schema;
        let settings = Self::settings(url)?;
        let deadline = Instant::now() + migrate::DEADLINE;
        let shown = url.to_string();
        let (rt, client) = connect(&settings, deadline).map_err(|e| e.into_store(&shown))?;
        let mut conn = Conn::new(rt, client);
        let mut s = Session { conn: &mut conn, deadline, in_tx: false };
        let run = |s: &mut Session<'_>| -> Result<Result<schema::Plan, String>, Fail> {
            s.begin("")?;
            s.batch(&format!("SELECT pg_advisory_xact_lock({})", migrate::LOCK_KEY))?;
            let recorded: Vec<(String, String)> = s
                .query("SELECT name, declaration FROM forkd_resources ORDER BY applied_at, name", &[])?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<_, Fail>>()?;
            let mut plan = match schema::plan(&recorded, registry) {
                Ok(p) => p,
                Err(e) => return Ok(Err(e)),
            };
            if plan.applies_in(mode) && !plan.is_empty() {
                for step in &plan.steps {
                    for (sql, param) in schema::statements(Dialect::Pg, step, registry) {
                        match param {
                            Some((kind, cell)) => {
                                let arg = resources::arg(kind, &cell);
                                s.execute(&sql, &[&*arg])?;
                            }
                            None => s.batch(&sql)?,
                        }
                    }
                    match registry.get(&step.resource) {
                        Some(r) => {
                            let json = schema::declaration(r);
                            s.execute(&schema::record_sql(Dialect::Pg), &[&r.name, &json])?;
                        }
                        None => {
                            s.execute("DELETE FROM forkd_resources WHERE name = $1", &[&step.resource])?;
                        }
                    }
                }
                plan.applied = true;
            }
            s.commit()?;
            Ok(Ok(plan))
        };
        match run(&mut s) {
            Ok(Ok(plan)) => Ok(plan),
            Ok(Err(e)) => Err(StoreError::Sql(e)),
            Err(f) => Err(f.into_store(&shown)),
        }
    }

    /// A pool of at most `pool_size` (at least one) connections, none opened yet.
    pub(crate) fn open(url: &DatabaseUrl, pool_size: usize) -> Result<Pg, StoreError> {
        let size = pool_size.max(1);
        Ok(Pg {
            settings: Self::settings(url)?,
            shown: url.to_string(),
            pool: Mutex::new(Pool {
                idle: VecDeque::with_capacity(size),
                open: 0,
                size,
                closed: false,
                retry_at: None,
            }),
            returned: Condvar::new(),
            deadline: CALL_DEADLINE,
            shared: Mutex::new(SharedSlot::Closed),
        })
    }

    /// `SELECT 1` on a pooled connection (opening one if needed).
    pub(crate) fn ping(&self) -> Result<(), StoreError> {
        self.call(|s| s.query_one("SELECT 1", &[]).map(drop))
    }

    /// Drop every idle connection; later calls fail with `Unavailable`, lent connections are
    /// dropped when their call ends. Idempotent.
    pub(crate) fn close(&self) {
        self.drop_shared(None);
        let idle = {
            let mut pool = self.lock();
            pool.closed = true;
            pool.open -= pool.idle.len();
            std::mem::take(&mut pool.idle)
        };
        self.returned.notify_all();
        drop(idle);
    }

    /// Run `f` on a pooled connection within the call's deadline. A transaction `f` left
    /// open is rolled back; a connection-level failure drops the connection (and the idle
    /// ones); every failure becomes a [`StoreError`].
    fn call<T>(&self, f: impl FnOnce(&mut Session<'_>) -> Result<T, Fail>) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.deadline;
        let mut lease = self.acquire(deadline)?;
        let conn = lease.conn.as_mut().expect("present until given back");
        let mut session = Session { conn, deadline, in_tx: false };
        let result = f(&mut session);
        let broken = match &result {
            Err(fail) => fail.breaks_connection(),
            Ok(_) => false,
        };
        let broken = broken || (session.in_tx && session.rollback().is_err());
        match result {
            Ok(v) if !broken => {
                lease.give_back();
                Ok(v)
            }
            Ok(_) => {
                self.drop_idle();
                Err(StoreError::Unavailable(format!("{}: the connection failed after the call", self.shown)))
            }
            Err(fail) => {
                if broken {
                    self.drop_idle();
                } else {
                    lease.give_back();
                }
                Err(fail.into_store(&self.shown))
            }
        }
    }

    /// Run `f`, one read statement outside a transaction, on the shared connection (see the
    /// module doc), or on a leased one while the shared one is not open.
    fn read<T>(&self, f: impl FnOnce(&Reader<'_>) -> Result<T, Fail>) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.deadline;
        let Some(shared) = self.shared_link(deadline)? else {
            return self.call(|s| f(&s.reader()));
        };
        let result = f(&Reader { link: &shared.link, deadline });
        shared.touch();
        match result {
            Ok(v) => Ok(v),
            Err(fail) => {
                if fail.breaks_connection() {
                    self.drop_shared(Some(&shared));
                    self.drop_idle();
                }
                Err(fail.into_store(&self.shown))
            }
        }
    }

    /// The shared connection, opened if none is and a pool slot is free; `None`: lease one.
    fn shared_link(&self, deadline: Instant) -> Result<Option<Arc<Shared>>, StoreError> {
        let mut slot = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            SharedSlot::Open(shared) => {
                let shared = Arc::clone(shared);
                drop(slot);
                if shared.idle_for() < IDLE_CHECK_AFTER || shared.link.answers(deadline) {
                    return Ok(Some(shared));
                }
                log::info!("store: the shared PostgreSQL connection no longer answers; opening another");
                self.drop_shared(Some(&shared));
                return Ok(None);
            }
            SharedSlot::Opening => return Ok(None),
            SharedSlot::Closed => {}
        }
        {
            let mut pool = self.lock();
            let waiting = pool.retry_at.is_some_and(|at| at > Instant::now());
            if pool.closed || waiting || pool.open >= pool.size {
                return Ok(None);
            }
            pool.open += 1;
        }
        *slot = SharedSlot::Opening;
        drop(slot);
        let opened = connect(&self.settings, deadline).and_then(|(rt, client)| {
            let mut conn = Conn::new(rt, client);
            migrate::check_version(&mut Session { conn: &mut conn, deadline, in_tx: false })?;
            Ok(conn.link)
        });
        let mut slot = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match opened {
            Ok(link) => {
                self.lock().retry_at = None;
                let shared = Arc::new(Shared { link, born: Instant::now(), last_used_ms: AtomicU64::new(0) });
                *slot = SharedSlot::Open(Arc::clone(&shared));
                Ok(Some(shared))
            }
            Err(fail) => {
                *slot = SharedSlot::Closed;
                drop(slot);
                {
                    let mut pool = self.lock();
                    pool.open -= 1;
                    if fail.breaks_connection() {
                        pool.retry_at = Some(Instant::now() + RETRY_AFTER);
                    }
                }
                self.returned.notify_one();
                Err(fail.into_store(&self.shown))
            }
        }
    }

    /// Stop handing out the shared connection (`which`, if it is still the open one; any,
    /// for `None`) and free its pool slot; reads still on it finish or fail on their own.
    fn drop_shared(&self, which: Option<&Arc<Shared>>) {
        let mut slot = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let SharedSlot::Open(open) = &*slot else { return };
        if which.is_some_and(|w| !Arc::ptr_eq(w, open)) {
            return;
        }
        *slot = SharedSlot::Closed;
        drop(slot);
        self.lock().open -= 1;
        self.returned.notify_one();
    }

    /// An idle connection, or a new one while fewer than `size` exist, or wait for one to
    /// come back, until `deadline`.
    fn acquire(&self, deadline: Instant) -> Result<Lease<'_>, StoreError> {
        let mut pool = self.lock();
        loop {
            if pool.closed {
                return Err(StoreError::Unavailable("the store is closed".into()));
            }
            if let Some(conn) = pool.idle.pop_front() {
                // A connection in steady use needs no check; one idle for a while may have
                // been closed by the server (restarted since): replace it rather than fail a
                // request on it.
                if conn.last_used.elapsed() < IDLE_CHECK_AFTER {
                    return Ok(Lease { pg: self, conn: Some(conn) });
                }
                drop(pool);
                if conn.link.answers(deadline) {
                    return Ok(Lease { pg: self, conn: Some(conn) });
                }
                log::info!("store: an idle PostgreSQL connection no longer answers; opening another");
                drop(Lease { pg: self, conn: Some(conn) }); // frees its slot
                pool = self.lock();
                continue;
            }
            if pool.open < pool.size {
                if let Some(wait) = pool.retry_at.and_then(|at| at.checked_duration_since(Instant::now())) {
                    return Err(StoreError::Unavailable(format!(
                        "{}: the last connection attempt failed; next one in {wait:?}",
                        self.shown
                    )));
                }
                pool.open += 1;
                drop(pool);
                // A lease without a connection gives the slot back if connecting fails.
                let mut lease = Lease { pg: self, conn: None };
                let (rt, client) = connect(&self.settings, deadline).map_err(|e| {
                    self.lock().retry_at = Some(Instant::now() + RETRY_AFTER);
                    e.into_store(&self.shown)
                })?;
                self.lock().retry_at = None;
                let mut conn = Conn::new(rt, client);
                let mut session = Session { conn: &mut conn, deadline, in_tx: false };
                migrate::check_version(&mut session).map_err(|e| e.into_store(&self.shown))?;
                lease.conn = Some(conn);
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "all {} database connections busy for {:?}",
                    pool.size, self.deadline
                )));
            }
            pool = self.returned.wait_timeout(pool, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Drop every idle connection: after one failed at the connection level, the others most
    /// likely did too, and each would fail one more request before being replaced.
    fn drop_idle(&self) {
        let idle = {
            let mut pool = self.lock();
            pool.open -= pool.idle.len();
            std::mem::take(&mut pool.idle)
        };
        if !idle.is_empty() {
            self.returned.notify_all();
        }
        drop(idle);
    }

    /// Every critical section is a push, a pop or a count: poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Pg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pool = self.lock();
        f.debug_struct("Pg")
            .field("url", &self.shown)
            .field("size", &pool.size)
            .field("open", &pool.open)
            .field("idle", &pool.idle.len())
            .field("closed", &pool.closed)
            .finish()
    }
}

/// A connection slot taken from the pool. Dropped without [`Lease::give_back`] (a failed
/// call, a failed connect, a panic in a caller's closure) it closes its connection, if any,
/// and frees the slot.
struct Lease<'a> {
    pg: &'a Pg,
    conn: Option<Conn>,
}

impl Lease<'_> {
    /// Put the connection back for the next call (or close it if the store is closed).
    fn give_back(mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        conn.last_used = Instant::now();
        let mut pool = self.pg.lock();
        if !pool.closed {
            pool.idle.push_back(conn);
            drop(pool);
            self.pg.returned.notify_one();
            std::mem::forget(self); // the slot stays taken, by the idle connection
            return;
        }
        drop(pool);
        drop(conn); // Drop frees the slot
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        drop(self.conn.take());
        let mut pool = self.pg.lock();
        pool.open -= 1;
        drop(pool);
        self.pg.returned.notify_one();
    }
}

/// Open one connection within `deadline`: its runtime, the handshake (TLS's too), and the
/// task that drives the socket (run whenever the connection's runtime is blocked on).
fn connect(settings: &Settings, deadline: Instant) -> Result<(Runtime, Client), Fail> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Fail::Runtime)?;
    // The client's connect_timeout covers the TCP connect only; this bounds the start-up
    // exchange too (a server that accepts and never answers).
    let limit = settings.config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT);
    let deadline = deadline.min(Instant::now() + limit);
    let client = match &settings.tls {
        None => start(&rt, deadline, settings.config.connect(NoTls))?,
        Some(tls) => start(&rt, deadline, settings.config.connect(tls.clone()))?,
    };
    Ok((rt, client))
}

/// The client of the connection `handshake` opens, its socket task spawned on `rt`.
fn start<S, T>(
    rt: &Runtime,
    deadline: Instant,
    handshake: impl Future<Output = Result<(Client, Connection<S, T>), tokio_postgres::Error>>,
) -> Result<Client, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = block(rt, deadline, handshake).map_err(|fail| match fail {
        // Without a SQLSTATE the server never answered: the connection's failure, not a bug.
        Fail::Db(e) if e.code().is_none() => Fail::Connect(e),
        other => other,
    })?;
    rt.spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("store: PostgreSQL connection ended: {e}");
        }
    });
    Ok(client)
}

/// `fut` run on `rt` until it finishes or `deadline` passes.
fn block<T>(
    rt: &Runtime,
    deadline: Instant,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Fail> {
    let left = deadline.saturating_duration_since(Instant::now());
    // The timer is made inside the runtime (it needs its time driver).
    match rt.block_on(async move { tokio::time::timeout(left, fut).await }) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Fail::Db(e)),
        Err(_) => Err(Fail::Deadline),
    }
}

/// One call's use of a connection: statements by SQL text (prepared once per connection),
/// each bounded by the call's deadline.
pub(crate) struct Session<'c> {
    conn: &'c mut Conn,
    deadline: Instant,
    /// A transaction is open (rolled back by the pool if the call does not end it).
    in_tx: bool,
}

/// Parameters of a statement.
pub(crate) type Params<'p> = [&'p (dyn ToSql + Sync)];

/// One read call's statements (see [`Pg::read`]), on the shared connection or a leased one.
pub(crate) struct Reader<'l> {
    link: &'l Link,
    deadline: Instant,
}

impl Reader<'_> {
    pub(crate) fn query(&self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, Fail> {
        let stmt = self.link.statement(sql, self.deadline)?;
        block(&self.link.rt, self.deadline, self.link.client.query(&stmt, params))
    }

    pub(crate) fn query_opt(&self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, Fail> {
        let stmt = self.link.statement(sql, self.deadline)?;
        block(&self.link.rt, self.deadline, self.link.client.query_opt(&stmt, params))
    }

    pub(crate) fn query_one(&self, sql: &str, params: &Params<'_>) -> Result<Row, Fail> {
        let stmt = self.link.statement(sql, self.deadline)?;
        block(&self.link.rt, self.deadline, self.link.client.query_one(&stmt, params))
    }

    fn execute(&self, sql: &str, params: &Params<'_>) -> Result<u64, Fail> {
        let stmt = self.link.statement(sql, self.deadline)?;
        block(&self.link.rt, self.deadline, self.link.client.execute(&stmt, params))
    }
}

impl Session<'_> {
    /// This call's statements, as a read's.
    fn reader(&self) -> Reader<'_> {
        Reader { link: &self.conn.link, deadline: self.deadline }
    }

    pub(crate) fn query(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, Fail> {
        self.reader().query(sql, params)
    }

    pub(crate) fn query_opt(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, Fail> {
        self.reader().query_opt(sql, params)
    }

    pub(crate) fn query_one(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, Fail> {
        self.reader().query_one(sql, params)
    }

    pub(crate) fn execute(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, Fail> {
        self.reader().execute(sql, params)
    }

    /// Statements without parameters, sent as one simple query (schema changes, locks).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), Fail> {
        block(&self.conn.link.rt, self.deadline, self.conn.link.client.batch_execute(sql))
    }

    /// `BEGIN` with `mode` (`""`, `"ISOLATION LEVEL REPEATABLE READ READ ONLY"`, …).
    pub(crate) fn begin(&mut self, mode: &str) -> Result<(), Fail> {
        self.in_tx = true;
        self.batch(&format!("BEGIN {mode}"))
    }

    pub(crate) fn commit(&mut self) -> Result<(), Fail> {
        self.batch("COMMIT")?;
        self.in_tx = false;
        Ok(())
    }

    /// End an open transaction without its changes; a second or so past the call's deadline
    /// at most, so a connection that can still talk is kept.
    fn rollback(&mut self) -> Result<(), Fail> {
        self.deadline = self.deadline.max(Instant::now() + Duration::from_secs(1));
        self.batch("ROLLBACK")?;
        self.in_tx = false;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod testutil;
