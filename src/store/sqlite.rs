//! The SQLite backend: one database file in WAL mode, migrated by [`Sqlite::migrate`] and
//! used through a small blocking pool of connections ([`Sqlite::open`]). The resource files
//! (`users.rs`, `tokens.rs`, `notifications.rs`, `records/`) implement the calls on it.
//!
//! Connections are process-local: the supervisor migrates (and closes its connection) before
//! fork; each worker opens its pool after fork. A connection never crosses a `fork`. Nothing
//! here touches HTTP, sockets or mio.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use std::{fmt, fs};

use rusqlite::{Connection, OpenFlags};

use super::{migrations, StoreError};
#[cfg(test)]
use super::{NewUser, Role, UserQuery};

/// How long SQLite retries a locked database before a call fails with `Unavailable`.
const BUSY_TIMEOUT: Duration = Duration::from_millis(5000);
/// How long a call waits for a free pooled connection before failing with `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// `PRAGMA cache_size` of every connection: 128 KiB (written negative, in KiB).
const PAGE_CACHE_KIB: i64 = -128;
/// Prepared statements kept per connection (the fixed ones plus the list variants).
const STATEMENT_CACHE: usize = 64;

/// The SQLite backend: a process-local pool of connections; `Sync`, so the worker's pool threads share one.
///
/// Each call borrows a connection for its duration and gives it back; when all are in use the
/// call waits (at most 5 s). Dropping the store closes the connections; [`Sqlite::close`] also
/// checkpoints the WAL first.
pub(crate) struct Sqlite {
    pool: Mutex<Pool>,
    returned: Condvar,
    acquire_timeout: Duration,
}

struct Pool {
    /// Idle connections, taken from the front and given back at the end: every connection is
    /// used in turn, so all of them reach their working size (page cache, prepared statements)
    /// in the first seconds of load rather than one by one over minutes, when a burst first
    /// needs the deepest one. A worker's memory is then flat after its warm-up.
    idle: VecDeque<Connection>,
    size: usize,
    closed: bool,
}

impl Sqlite {
    /// Create the database file (and its parent directory) if needed, switch it to WAL and run
    /// every pending migration; a no-op on an up-to-date database.
    ///
    /// Called once by the supervisor before fork, and by `forkd user create`. Safe while other
    /// processes have the database open (it waits up to the busy timeout for their writes).
    /// The connection it uses is closed before it returns.
    pub fn migrate(path: &Path) -> Result<(), StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)
                .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", dir.display())))?;
        }
        let mut conn = open_connection(path, true)?;
        migrations::run(&mut conn)?;
        conn.close().map_err(|(_, e)| StoreError::from(e))
    }

    /// The declared resources' tables against `registry` (see `store::schema`): planned, and
    /// applied as `mode` allows, in one `BEGIN IMMEDIATE` transaction. A database file that
    /// does not exist yet is planned against an empty schema (and not created).
    pub fn migrate_resources(
        path: &Path,
        registry: &crate::resources::Registry,
        mode: super::schema::Mode,
    ) -> Result<super::schema::Plan, StoreError> {
        use super::records::sql::Dialect;
        use super::schema;
        if mode == schema::Mode::Plan && !path.exists() {
            return schema::plan(&[], registry).map_err(StoreError::Sql);
        }
        let mut conn = open_connection(path, false)?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let recorded: Vec<(String, String)> = tx
            .prepare("SELECT name, declaration FROM forkd_resources ORDER BY rowid")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut plan = schema::plan(&recorded, registry).map_err(StoreError::Sql)?;
        if plan.applies_in(mode) && !plan.is_empty() {
            for step in &plan.steps {
                for (sql, param) in schema::statements(Dialect::Sqlite, step, registry) {
                    match param {
                        Some((_, cell)) => tx.execute(&sql, [super::records::sqlite::value(&cell)])?,
                        None => tx.execute(&sql, [])?,
                    };
                }
                match registry.get(&step.resource) {
                    Some(r) => tx.execute(&schema::record_sql(Dialect::Sqlite), [&r.name, &schema::declaration(r)])?,
                    None => tx.execute("DELETE FROM forkd_resources WHERE name = ?1", [&step.resource])?,
                };
            }
            tx.commit()?;
            plan.applied = true;
        }
        Ok(plan)
    }

    /// Open `pool_size` connections (at least one) to an existing, migrated database. Each has
    /// WAL, `busy_timeout` 5000 ms, `foreign_keys` on and `synchronous = NORMAL`.
    ///
    /// Called in each worker after fork. Fails with `Unavailable` if the file is missing or its
    /// schema is not this binary's latest (run [`Sqlite::migrate`] first).
    pub fn open(path: &Path, pool_size: usize) -> Result<Sqlite, StoreError> {
        let first = open_connection(path, false)?;
        let (found, wanted) = (migrations::current_version(&first)?, migrations::latest_version());
        if found != wanted {
            return Err(StoreError::Unavailable(format!(
                "{}: schema version {found}, expected {wanted}; run the migrations first",
                path.display()
            )));
        }
        let size = pool_size.max(1);
        let mut idle = VecDeque::with_capacity(size);
        idle.push_back(first);
        for _ in 1..size {
            idle.push_back(open_connection(path, false)?);
        }
        Ok(Sqlite {
            pool: Mutex::new(Pool { idle, size, closed: false }),
            returned: Condvar::new(),
            acquire_timeout: ACQUIRE_TIMEOUT,
        })
    }

    /// Cheap readiness probe: borrow a connection and run `SELECT 1`.
    pub fn ping(&self) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.prepare_cached("SELECT 1")?.query_row([], |_| Ok(()))?;
        Ok(())
    }

    /// Checkpoint the WAL (`TRUNCATE`) and close every connection. Later calls fail with
    /// `Unavailable`; callers waiting for a connection are woken and fail too. Connections in
    /// use right now are closed when their call finishes. Idempotent.
    pub fn close(&self) {
        let idle = {
            let mut pool = self.lock();
            pool.closed = true;
            std::mem::take(&mut pool.idle)
        };
        self.returned.notify_all();
        if let Some(conn) = idle.front() {
            let checkpoint = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0));
            match checkpoint {
                Ok(0) => {}
                Ok(_) => log::debug!("store: WAL checkpoint incomplete (database busy)"),
                Err(e) => log::warn!("store: WAL checkpoint failed: {e}"),
            }
        }
        for conn in idle {
            if let Err((_, e)) = conn.close() {
                log::warn!("store: closing a connection failed: {e}");
            }
        }
    }

    /// Borrow a connection, waiting up to the acquire timeout when all are in use.
    pub(crate) fn conn(&self) -> Result<PooledConn<'_>, StoreError> {
        let pool = self.lock();
        let (mut pool, _) = self
            .returned
            .wait_timeout_while(pool, self.acquire_timeout, |p| !p.closed && p.idle.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        if pool.closed {
            return Err(StoreError::Unavailable("the store is closed".into()));
        }
        match pool.idle.pop_front() {
            Some(conn) => Ok(PooledConn { store: self, conn: Some(conn) }),
            None => Err(StoreError::Unavailable(format!(
                "all {} database connections busy for {:?}",
                pool.size, self.acquire_timeout
            ))),
        }
    }

    /// The pool state; a panic elsewhere while holding the lock cannot leave it inconsistent
    /// (every critical section is a push, a pop or a flag), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pool = self.lock();
        f.debug_struct("Sqlite")
            .field("size", &pool.size)
            .field("idle", &pool.idle.len())
            .field("closed", &pool.closed)
            .finish()
    }
}

/// A connection borrowed from the pool; goes back (or, once the store is closed, is closed)
/// when dropped.
pub(crate) struct PooledConn<'a> {
    store: &'a Sqlite,
    conn: Option<Connection>,
}

impl Deref for PooledConn<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("present until drop")
    }
}

impl DerefMut for PooledConn<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("present until drop")
    }
}

impl Drop for PooledConn<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let mut pool = self.store.lock();
        if pool.closed {
            drop(pool);
            drop(conn);
            return;
        }
        pool.idle.push_back(conn);
        drop(pool);
        self.store.returned.notify_one();
    }
}

/// Open one connection and apply the per-connection settings.
fn open_connection(path: &Path, create: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags).map_err(|e| match StoreError::from(e) {
        StoreError::Unavailable(why) => StoreError::Unavailable(format!("{}: {why}", path.display())),
        other => other,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Sql(format!("{}: journal_mode is {mode}, WAL unavailable", path.display())));
    }
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Each connection's page cache, in KiB (negative). SQLite's default is
    // 2 MiB per connection: with `db.pool_size` connections per worker that is
    // up to 20 MiB of private copies per worker, filled slowly as the database
    // grows (a soak showed workers creeping up for 20 minutes; 5 000 logins on
    // one worker: +1.5 MB at 512 KiB, +1.0 MB at 128 KiB, flat after ~2 000).
    // The file's pages stay in the kernel's page cache, shared by every
    // worker, so a smaller private cache costs a `pread` on a miss, not a disk
    // read; the hot interior pages of a lookup stay cached.
    conn.pragma_update(None, "cache_size", PAGE_CACHE_KIB)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

#[cfg(test)]
pub(crate) mod testutil {
    //! A migrated store in a fresh temporary directory.
    use super::*;

    /// The directory must outlive the store, so both are returned.
    pub(crate) fn store(pool_size: usize) -> (tempfile::TempDir, Sqlite) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db").join("forkd.db");
        Sqlite::migrate(&path).expect("migrate");
        let store = Sqlite::open(&path, pool_size).expect("open");
        (dir, store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::time::Instant;

    #[test]
    fn connections_are_used_in_turn() {
        // A TEMP table is private to its connection: creating one succeeds exactly once per
        // connection, so three creates in a row succeed only if three connections served them
        // (a last-in-first-out pool would hand the same one back and fail the second).
        let (_dir, store) = testutil::store(3);
        for round in 0..3 {
            let conn = store.conn().expect("conn");
            conn.execute_batch("CREATE TEMP TABLE mark (x)").unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let conn = store.conn().expect("conn");
        assert!(conn.execute_batch("CREATE TEMP TABLE mark (x)").is_err(), "the fourth call is back on the first");
    }

    #[test]
    fn migrate_twice_then_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested").join("forkd.db");
        Sqlite::migrate(&path).expect("first migrate creates dir and file");
        Sqlite::migrate(&path).expect("second migrate is a no-op");
        let store = Sqlite::open(&path, 2).expect("open");
        store.ping().expect("ping");
        // Migrating while another "process" holds connections is fine too.
        Sqlite::migrate(&path).expect("migrate while open");
        let conn = store.conn().expect("conn");
        assert_eq!(migrations::current_version(&conn).expect("version"), 4);
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("mode");
        assert_eq!(mode, "wal");
        let cache: i64 = conn.query_row("PRAGMA cache_size", [], |r| r.get(0)).expect("cache_size");
        assert_eq!(cache, PAGE_CACHE_KIB, "each pooled connection's private page cache is bounded");
    }

    #[test]
    fn open_without_migrate_fails_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.db");
        match Sqlite::open(&missing, 1) {
            Err(StoreError::Unavailable(msg)) => assert!(msg.contains("missing.db"), "{msg}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(!missing.exists(), "open must not create the file");

        let empty = dir.path().join("empty.db");
        drop(Connection::open(&empty).expect("create empty db"));
        match Sqlite::open(&empty, 1) {
            Err(StoreError::Unavailable(msg)) => {
                assert!(msg.contains("schema version 0, expected 4"), "{msg}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn close_makes_later_calls_unavailable() {
        let (_dir, store) = testutil::store(2);
        store.ping().expect("ping");
        store.close();
        store.close();
        assert!(matches!(store.ping(), Err(StoreError::Unavailable(_))));
    }

    #[test]
    fn two_threads_share_the_pool() {
        let (_dir, store) = testutil::store(2);
        let barrier = Barrier::new(2);
        std::thread::scope(|s| {
            for t in 0..2 {
                let (store, barrier) = (&store, &barrier);
                s.spawn(move || {
                    let held = store.conn().expect("conn");
                    barrier.wait(); // both connections are out at the same time
                    drop(held);
                    for i in 0..25 {
                        let email = format!("t{t}-{i}@example.com");
                        let new = NewUser { name: "n", email: &email, password_hash: "h", age: None, role: Role::User };
                        store.create_user(&new).expect("create");
                    }
                });
            }
        });
        let all = UserQuery { role: None, q: None, sort: vec![], page: 1, limit: 100 };
        assert_eq!(store.list_users(&all).expect("list").total, 50);
    }

    #[test]
    fn exhausted_pool_waits_then_times_out() {
        let (_dir, mut store) = testutil::store(1);
        store.acquire_timeout = Duration::from_millis(200);
        let held = store.conn().expect("conn");
        let start = Instant::now();
        assert!(matches!(store.ping(), Err(StoreError::Unavailable(_))));
        assert!(start.elapsed() >= Duration::from_millis(200));
        // A connection given back wakes a waiter.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| store.ping());
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
            waiter.join().expect("join").expect("ping after release");
        });
    }
}
