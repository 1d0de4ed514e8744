//! The database schema as an ordered list of versioned migrations, each in both dialects
//! (SQLite and PostgreSQL, side by side so they cannot drift apart), and the code that applies
//! the pending SQLite ones (`pg/migrate.rs` applies the PostgreSQL ones).
//!
//! In SQLite the applied version is `PRAGMA user_version`. Each migration runs in its own
//! `BEGIN IMMEDIATE` transaction that re-reads the version first, so two processes migrating
//! at once (or a migration while workers hold the database open) apply each step exactly once.
//! A migration, once released, is never edited: change the schema by appending a new one.
//! Nothing here is called from a request; it runs in the supervisor before fork and in
//! `forkd user create`.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// One schema step: the version it brings the database to, and its SQL in each dialect.
pub(crate) struct Migration {
    /// 1, 2, 3, …
    pub(crate) version: u32,
    /// SQLite.
    sql: &'static str,
    /// PostgreSQL: the same tables, columns and constraints. Ids are `BIGSERIAL` (increasing),
    /// the e-mail is unique through an index on `lower(email)`, timestamps are the same
    /// RFC 3339 text as in SQLite.
    pub(crate) postgres: &'static str,
}

/// Every migration, in order; versions are 1, 2, 3, … with no gaps.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: "
        CREATE TABLE users (
            id            INTEGER PRIMARY KEY,
            name          TEXT NOT NULL,
            email         TEXT NOT NULL UNIQUE COLLATE NOCASE,
            password_hash TEXT NOT NULL,
            age           INTEGER,
            role          TEXT NOT NULL CHECK (role IN ('user', 'admin')),
            created_at    TEXT NOT NULL,
            updated_at    TEXT NOT NULL
        );
        CREATE TABLE posts (
            id         INTEGER PRIMARY KEY,
            user_id    INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX posts_user_id ON posts (user_id, id);
        CREATE TABLE token_families (
            family  TEXT PRIMARY KEY,
            user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            revoked INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX token_families_user_id ON token_families (user_id);
        CREATE TABLE refresh_tokens (
            hash       TEXT PRIMARY KEY,
            family     TEXT NOT NULL REFERENCES token_families (family) ON DELETE CASCADE,
            user_id    INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            expires_at INTEGER NOT NULL,
            spent_at   INTEGER
        );
        CREATE INDEX refresh_tokens_family ON refresh_tokens (family);
        CREATE INDEX refresh_tokens_user_id ON refresh_tokens (user_id);
        ",
        postgres: "
        CREATE TABLE users (
            id            BIGSERIAL PRIMARY KEY,
            name          TEXT NOT NULL,
            email         TEXT NOT NULL,
            password_hash TEXT NOT NULL,
            age           BIGINT,
            role          TEXT NOT NULL CHECK (role IN ('user', 'admin')),
            created_at    TEXT NOT NULL,
            updated_at    TEXT NOT NULL
        );
        CREATE UNIQUE INDEX users_email_key ON users (lower(email));
        CREATE TABLE posts (
            id         BIGSERIAL PRIMARY KEY,
            user_id    BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX posts_user_id ON posts (user_id, id);
        CREATE TABLE token_families (
            family  TEXT PRIMARY KEY,
            user_id BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            revoked BOOLEAN NOT NULL DEFAULT false
        );
        CREATE INDEX token_families_user_id ON token_families (user_id);
        CREATE TABLE refresh_tokens (
            hash       TEXT PRIMARY KEY,
            family     TEXT NOT NULL REFERENCES token_families (family) ON DELETE CASCADE,
            user_id    BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            expires_at BIGINT NOT NULL,
            spent_at   BIGINT
        );
        CREATE INDEX refresh_tokens_family ON refresh_tokens (family);
        CREATE INDEX refresh_tokens_user_id ON refresh_tokens (user_id);
        ",
    },
    Migration {
        version: 2,
        sql: "
        CREATE TABLE notifications (
            id         INTEGER PRIMARY KEY,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        ",
        postgres: "
        CREATE TABLE notifications (
            id         BIGSERIAL PRIMARY KEY,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        ",
    },
];

/// The schema version this binary expects (the last migration's).
pub(crate) fn latest_version() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The database's applied schema version.
pub(crate) fn current_version(conn: &Connection) -> Result<u32, StoreError> {
    Ok(conn.query_row("PRAGMA user_version", [], |row| row.get(0))?)
}

/// Apply every migration newer than the database's version; a no-op when up to date.
///
/// Fails if the database is newer than this binary (a downgrade), rather than running old
/// code against a schema it does not know.
pub(crate) fn run(conn: &mut Connection) -> Result<(), StoreError> {
    let latest = latest_version();
    for m in MIGRATIONS {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version = current_version(&tx)?;
        if version > latest {
            return Err(StoreError::Sql(format!(
                "database schema version {version} is newer than this binary's ({latest})"
            )));
        }
        if version >= m.version {
            continue; // dropping `tx` rolls back an empty transaction
        }
        tx.execute_batch(m.sql)?;
        tx.pragma_update(None, "user_version", m.version)?;
        tx.commit()?;
        log::info!("store: applied migration {}", m.version);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dense_and_ordered() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1, "migration #{i} has version {}", m.version);
        }
        assert_eq!(latest_version(), 2);
    }

    #[test]
    fn in_memory_migrate_is_idempotent() {
        let mut conn = Connection::open_in_memory().expect("open");
        run(&mut conn).expect("first");
        run(&mut conn).expect("second");
        assert_eq!(current_version(&conn).expect("version"), latest_version());
        let tables: i64 =
            conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0)).expect("count");
        assert_eq!(tables, 5, "users, posts, token_families, refresh_tokens, notifications");
    }
}
