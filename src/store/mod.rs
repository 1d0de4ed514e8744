//! The data store: a typed API (`Store::create_user`, `Store::record_list`,
//! `Store::rotate_refresh`, …) over one of two backends, so no SQL ever appears outside this
//! module and handlers do not know which backend serves them:
//!
//! - SQLite in WAL mode, one file under `data_dir` ([`sqlite`]; the resource files
//!   [`users`], [`tokens`], [`notifications`] and [`records`] hold its calls and the shared types);
//! - PostgreSQL when `cluster.database_url` is set ([`pg`]), shared by every host.
//!
//! [`Store`] is an enum of the two, and each call is one `match`: a handler's call costs a
//! branch, never a virtual call or an allocation, and each backend keeps its SQL dialect in
//! its own files. Both run the same numbered migrations and keep the same semantics
//! (case-insensitive unique e-mail, token families and replay revocation, ids that are never
//! given twice, a token generation per user, RFC 3339 timestamps with milliseconds, the same
//! [`StoreError`]s); `conformance.rs` runs one set of scenarios against both.
//!
//! Rules for everything under `store/`:
//! - Calls block (on SQLite's busy timeout, on PostgreSQL with a deadline, or on the pool).
//!   They run only on a worker's thread pool, never on the event loop; nothing here touches
//!   HTTP, sockets or mio.
//! - Every value reaches SQL through a placeholder; the only SQL built at run time is
//!   assembled from fixed fragments chosen by enums (filters, sort columns).
//! - Connections are process-local: the supervisor calls [`Store::migrate`] (which closes its
//!   connection) before fork; each worker calls [`Store::open`] after fork. A connection never
//!   crosses a `fork`.

/// SQL for "now" as RFC 3339 UTC with milliseconds (`2026-11-22T10:00:00.123Z`). SQLite keeps
/// `'now'` constant within one statement, so two uses in a statement agree.
macro_rules! now_sql {
    () => {
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    };
}

#[cfg(test)]
mod conformance;
pub mod error;
pub mod files;
pub mod migrations;
pub mod notifications;
pub mod pg;
pub mod records;
pub mod schema;
pub(crate) mod sqlite;
pub mod tokens;
pub mod users;

use std::fmt;
use std::path::Path;

pub use error::StoreError;
pub use notifications::{Logged, Notification};
pub use tokens::Rotation;
pub use users::{NewUser, Role, Updated, User, UserChanges, UserQuery, UserRef, UserSort};

use crate::config::{Config, DatabaseUrl};

/// The largest page a list call returns, whatever the caller asks for.
pub const MAX_LIMIT: u32 = 100;

/// Where the data lives: what [`Store::migrate`] and [`Store::open`] take.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// An SQLite file (created by `migrate` when missing).
    Sqlite(&'a Path),
    /// A PostgreSQL database (`cluster.database_url`).
    Postgres(&'a DatabaseUrl),
}

impl<'a> Target<'a> {
    /// The configured backend: PostgreSQL when `cluster.database_url` is set, else the SQLite
    /// file `db.path`.
    pub fn of(config: &'a Config) -> Target<'a> {
        match &config.cluster.database_url {
            Some(url) => Target::Postgres(url),
            None => Target::Sqlite(&config.db.path),
        }
    }
}

impl fmt::Display for Target<'_> {
    /// The file's path, or the URL without its password: safe for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Sqlite(path) => write!(f, "{}", path.display()),
            Target::Postgres(url) => write!(f, "{url}"),
        }
    }
}

impl<'a> From<&'a Path> for Target<'a> {
    fn from(path: &'a Path) -> Target<'a> {
        Target::Sqlite(path)
    }
}

impl<'a> From<&'a std::path::PathBuf> for Target<'a> {
    fn from(path: &'a std::path::PathBuf) -> Target<'a> {
        Target::Sqlite(path)
    }
}

impl<'a> From<&'a Config> for Target<'a> {
    fn from(config: &'a Config) -> Target<'a> {
        Target::of(config)
    }
}

/// The store a worker (or `forkd user create`) uses: `Sync`, shared by the pool's threads.
pub struct Store(Backend);

enum Backend {
    Sqlite(sqlite::Sqlite),
    // Boxed: its settings and pool are larger than the SQLite pool, and a store is made
    // once per process.
    Postgres(Box<pg::Pg>),
}

/// `$body` with `$s` bound to whichever backend this store is.
macro_rules! dispatch {
    ($store:expr, $s:ident => $body:expr) => {
        match &$store.0 {
            Backend::Sqlite($s) => $body,
            Backend::Postgres($s) => $body,
        }
    };
}

impl Store {
    /// Bring the database to this binary's schema: create the SQLite file (and its directory)
    /// if needed, or, on PostgreSQL, take an advisory lock so that hosts starting together
    /// apply each migration once. A no-op when up to date; closes its connection on return.
    ///
    /// Called once by the supervisor before fork (and on `SIGHUP`), and by `forkd user create`.
    pub fn migrate<'a>(target: impl Into<Target<'a>>) -> Result<(), StoreError> {
        match target.into() {
            Target::Sqlite(path) => sqlite::Sqlite::migrate(path),
            Target::Postgres(url) => pg::Pg::migrate(url),
        }
    }

    /// The declared resources' tables against `registry` (`store::schema`): the plan, applied
    /// as `mode` allows. Called by the supervisor after [`Store::migrate`] (before fork and on
    /// `SIGHUP`, additive only), by `check-config` and by `forkd migrate`.
    pub fn migrate_resources<'a>(
        target: impl Into<Target<'a>>,
        registry: &crate::resources::Registry,
        mode: schema::Mode,
    ) -> Result<schema::Plan, StoreError> {
        match target.into() {
            Target::Sqlite(path) => sqlite::Sqlite::migrate_resources(path, registry, mode),
            Target::Postgres(url) => pg::Pg::migrate_resources(url, registry, mode),
        }
    }

    /// A pool of `pool_size` connections (at least one). SQLite opens them now and checks the
    /// schema; PostgreSQL opens each on first use and again after a failure, so a worker
    /// starts (and serves what needs no store) while the database is away.
    ///
    /// Called in each worker after fork.
    pub fn open<'a>(target: impl Into<Target<'a>>, pool_size: usize) -> Result<Store, StoreError> {
        Ok(Store(match target.into() {
            Target::Sqlite(path) => Backend::Sqlite(sqlite::Sqlite::open(path, pool_size)?),
            Target::Postgres(url) => Backend::Postgres(Box::new(pg::Pg::open(url, pool_size)?)),
        }))
    }

    /// Whether every writer of this database is on this host (SQLite), so that the shared
    /// memory's change counters see every write; not on PostgreSQL.
    pub fn single_host(&self) -> bool {
        matches!(self.0, Backend::Sqlite(_))
    }

    /// Cheap readiness probe (`SELECT 1` on a pooled connection).
    pub fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping())
    }

    /// Close every connection (SQLite checkpoints its WAL first). Later calls fail with
    /// `Unavailable`. Idempotent.
    pub fn close(&self) {
        dispatch!(self, s => s.close())
    }

    /// Create a user; `Duplicate("email")` if the e-mail is taken in any letter case.
    pub fn create_user(&self, u: &NewUser<'_>) -> Result<User, StoreError> {
        dispatch!(self, s => s.create_user(u))
    }

    /// The user with this id, if any.
    pub fn get_user(&self, id: i64) -> Result<Option<User>, StoreError> {
        dispatch!(self, s => s.get_user(id))
    }

    /// The user with this id, if any, lent to `f` (without copying where the backend allows).
    /// `f` runs while a connection is held: it must only look at the user, not call the store.
    pub fn with_user<R>(&self, id: i64, f: impl FnOnce(UserRef<'_>) -> R) -> Result<Option<R>, StoreError> {
        dispatch!(self, s => s.with_user(id, f))
    }

    /// The user with this e-mail (any letter case) and their password hash, for login.
    pub fn user_by_email(&self, email: &str) -> Result<Option<(User, String)>, StoreError> {
        dispatch!(self, s => s.user_by_email(email))
    }

    /// The password hash of user `id`, if there is such a user.
    pub fn password_hash(&self, id: i64) -> Result<Option<String>, StoreError> {
        dispatch!(self, s => s.password_hash(id))
    }

    /// The token generation of user `id` ([`User::token_gen`]); `None` when there is no such
    /// user. Ids are never given twice, so `None` means the account is gone for good.
    pub fn token_gen(&self, id: i64) -> Result<Option<i64>, StoreError> {
        dispatch!(self, s => s.token_gen(id))
    }

    /// One page of users matching the filters, in the requested order; count and page from
    /// one snapshot.
    pub fn list_users(&self, q: &UserQuery) -> Result<Page<User>, StoreError> {
        dispatch!(self, s => s.list_users(q))
    }

    /// Apply `c` to the user and bump `updated_at`; `None` if there is no such user. A new
    /// password, or a role other than the current one, also bumps the user's token generation
    /// in the same transaction ([`Updated::revoked`]).
    pub fn update_user(&self, id: i64, c: &UserChanges) -> Result<Option<Updated>, StoreError> {
        dispatch!(self, s => s.update_user(id, c))
    }

    /// Delete the user, the records they own (posts among them, by the tables' cascades) and
    /// their refresh tokens; `false` if there was no such user.
    pub fn delete_user(&self, id: i64) -> Result<bool, StoreError> {
        dispatch!(self, s => s.delete_user(id))
    }

    /// Create a record of `scope.res` owned by `owner_id` (under `parent_id` when nested), in
    /// one transaction: every `ref` names a record `viewer` may read (else `Refused::Ref`),
    /// the parent exists (else `Refused::Parent`), a `unique` field's duplicate is
    /// `StoreError::Duplicate(field)`, and, when the resource has `events`, the change event is
    /// stored in the same transaction and returned.
    pub fn record_create(
        &self,
        scope: records::Scope,
        viewer: records::Viewer,
        owner_id: i64,
        parent_id: Option<i64>,
        cells: Vec<crate::resources::value::Cell>,
    ) -> records::Guarded<(crate::resources::record::Record, Option<records::Change>), std::convert::Infallible> {
        dispatch!(self, s => s.record_create(scope, viewer, owner_id, parent_id, cells))
    }

    /// The record `id` of `scope.res`, if any.
    pub fn record_get(
        &self,
        scope: records::Scope,
        id: i64,
    ) -> Result<Option<crate::resources::record::Record>, StoreError> {
        dispatch!(self, s => s.record_get(scope, id))
    }

    /// One page of `scope.res`'s records matching `q`, count and page from one snapshot.
    pub fn record_list(
        &self,
        scope: records::Scope,
        q: &records::ListQuery,
    ) -> Result<Page<crate::resources::record::Record>, StoreError> {
        dispatch!(self, s => s.record_list(scope, q))
    }

    /// Change record `id` in one transaction: read it (locked), ask `guard` for its new cells
    /// (every field, in declaration order; the guard checks access, `If-Match`, transitions
    /// and merges a patch), check refs as `record_create`, write, bump `updated_at`, store the
    /// change event. `Ok(Ok(None))`: no such record.
    pub fn record_update<E>(
        &self,
        scope: records::Scope,
        viewer: records::Viewer,
        id: i64,
        guard: impl FnOnce(&crate::resources::record::Record) -> Result<Vec<crate::resources::value::Cell>, E>,
    ) -> records::Guarded<Option<(crate::resources::record::Record, Option<records::Change>)>, E> {
        dispatch!(self, s => s.record_update(scope, viewer, id, guard))
    }

    /// Delete record `id` (and, through the database's cascades, its children) in one
    /// transaction after `guard` agreed, storing the change event. `Ok(Ok(None))`: no such
    /// record.
    pub fn record_delete<E>(
        &self,
        scope: records::Scope,
        id: i64,
        guard: impl FnOnce(&crate::resources::record::Record) -> Result<(), E>,
    ) -> records::Guarded<Option<(crate::resources::record::Record, Option<records::Change>)>, E> {
        dispatch!(self, s => s.record_delete(scope, id, guard))
    }

    /// Store a live refresh token (by hash) in `family`, creating the family if it is new,
    /// bound to token generation `gen` (the user's as read at login).
    pub fn insert_refresh(
        &self,
        hash: &str,
        family: &str,
        user_id: i64,
        gen: i64,
        expires_at_unix: i64,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.insert_refresh(hash, family, user_id, gen, expires_at_unix))
    }

    /// Spend `old_hash` and store `new_hash` in its family, atomically: unknown, revoked,
    /// expired, or of a generation the user has left → `Invalid`; already spent → the family
    /// is revoked, `Reused`; else `Rotated` with the user's current generation.
    pub fn rotate_refresh(
        &self,
        old_hash: &str,
        new_hash: &str,
        now_unix: i64,
        new_expires_unix: i64,
    ) -> Result<Rotation, StoreError> {
        dispatch!(self, s => s.rotate_refresh(old_hash, new_hash, now_unix, new_expires_unix))
    }

    /// Revoke the family `hash` belongs to (logout); returns whether the token was known.
    pub fn revoke_family(&self, hash: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.revoke_family(hash))
    }

    /// Delete every token family whose newest token expired at or before `now_unix`.
    pub fn purge_expired_families(&self, now_unix: i64) -> Result<usize, StoreError> {
        dispatch!(self, s => s.purge_expired_families(now_unix))
    }

    /// Store a notification; its id is above every id stored before it.
    pub fn create_notification(&self, title: &str, body: &str) -> Result<Notification, StoreError> {
        dispatch!(self, s => s.create_notification(title, body))
    }

    /// Up to `limit` notifications with an id above `after` (the newest ones), oldest first.
    pub fn notifications_after(&self, after: i64, limit: usize) -> Result<Vec<Notification>, StoreError> {
        dispatch!(self, s => s.notifications_after(after, limit))
    }

    /// Up to `limit` entries of the event log (notifications and change events, one id
    /// sequence) with an id above `after` (the newest ones), oldest first.
    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Logged>, StoreError> {
        dispatch!(self, s => s.events_after(after, limit))
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        dispatch!(self, s => s.fmt(f))
    }
}

/// One page of a list, as the API returns it (`{items, total, page, pageSize, totalPages}`).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    /// The rows of this page; empty past the last page.
    pub items: Vec<T>,
    /// Rows matching the filters, over all pages.
    pub total: u64,
    /// This page's number, from 1.
    pub page: u32,
    /// The page size used (the caller's limit, clamped to 1..=[`MAX_LIMIT`]).
    pub page_size: u32,
    /// `ceil(total / page_size)`; 0 when `total` is 0.
    pub total_pages: u32,
}

/// A page request normalised for SQL: `page >= 1`, `limit` in `1..=MAX_LIMIT`.
#[derive(Clone, Copy)]
struct Paging {
    page: u32,
    limit: u32,
}

impl Paging {
    fn new(page: u32, limit: u32) -> Paging {
        Paging { page: page.max(1), limit: limit.clamp(1, MAX_LIMIT) }
    }

    /// Rows to skip (fits easily in `i64`: at most `u32::MAX * 100`).
    fn offset(self) -> i64 {
        i64::from(self.page - 1) * i64::from(self.limit)
    }

    fn finish<T>(self, items: Vec<T>, total: i64) -> Page<T> {
        let total = u64::try_from(total).unwrap_or(0);
        let total_pages = u32::try_from(total.div_ceil(u64::from(self.limit))).unwrap_or(u32::MAX);
        Page { items, total, page: self.page, page_size: self.limit, total_pages }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_math() {
        let p = Paging::new(0, 0);
        assert_eq!((p.page, p.limit, p.offset()), (1, 1, 0));
        assert_eq!(Paging::new(3, 500).limit, MAX_LIMIT);
        let page = Paging::new(1, 20).finish(Vec::<()>::new(), 0);
        assert_eq!((page.total, page.total_pages), (0, 0));
        assert_eq!(Paging::new(1, 20).finish(vec![()], 21).total_pages, 2);
        assert_eq!(Paging::new(1, 20).finish(vec![()], 20).total_pages, 1);
        let json = serde_json::to_value(Paging::new(2, 5).finish(vec![1], 6)).expect("json");
        assert_eq!(json, serde_json::json!({"items": [1], "total": 6, "page": 2, "pageSize": 5, "totalPages": 2}));
    }
}
