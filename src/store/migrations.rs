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

/// The built-in `posts` declaration as migration 4 records it in `forkd_resources`
/// (`crate::resources::builtin::posts`, serialised as {"name":"posts","parent":"users","read":"signed_in","create":"owner","update":"owner","delete":"owner","events":false,"default_sort":[{"key":"id","desc":true}],"fields":[{"name":"title","kind":"string","required":true,"min":1.0,"max":200.0,"unique":false,"sort":false,"filter":false,"search":false,"default":null,"values":[],"transitions":[],"refers":null},{"name":"body","kind":"text","required":false,"min":null,"max":10000.0,"unique":false,"sort":false,"filter":false,"search":false,"default":"","values":[],"transitions":[],"refers":null}]}ON).
macro_rules! posts_declaration {
    () => {
        r#"{"name":"posts","parent":"users","read":"signed_in","create":"owner","update":"owner","delete":"owner","events":false,"default_sort":[{"key":"id","desc":true}],"fields":[{"name":"title","kind":"string","required":true,"min":1.0,"max":200.0,"unique":false,"sort":false,"filter":false,"search":false,"default":null,"values":[],"transitions":[],"refers":null},{"name":"body","kind":"text","required":false,"min":null,"max":10000.0,"unique":false,"sort":false,"filter":false,"search":false,"default":"","values":[],"transitions":[],"refers":null}]}"#
    };
}

/// The part of migration 4 both dialects share, after `posts` has its `parent_id` column:
/// the column filled, the indexes of the new layout, `forkd_resources` and its first row,
/// up to the `applied_at` value (each dialect's "now").
macro_rules! migration_4_posts {
    () => {
        concat!(
            "
        UPDATE posts SET parent_id = owner_id;
        DROP INDEX posts_user_id;
        CREATE INDEX posts_owner_id ON posts (owner_id, id);
        CREATE INDEX posts_parent_id ON posts (parent_id, id);
        CREATE TABLE forkd_resources (
            name        TEXT PRIMARY KEY,
            declaration TEXT NOT NULL,
            applied_at  TEXT NOT NULL
        );
        INSERT INTO forkd_resources (name, declaration, applied_at) VALUES ('posts', '",
            posts_declaration!(),
            "', "
        )
    };
}

/// [`posts_declaration!`] as a constant.
#[cfg(test)]
pub(crate) const POSTS_DECLARATION: &str = posts_declaration!();

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
    // Ids are never given twice, and every account carries a token generation.
    //
    // SQLite: an `INTEGER PRIMARY KEY` without `AUTOINCREMENT` takes the highest id in use
    // plus one, so deleting the newest row hands its id to the next insert (a new account
    // inheriting a deleted one's id while tokens for that id are still valid). SQLite cannot
    // change a column, so each table with an integer id is rebuilt as SQLite prescribes
    // (sqlite.org/lang_altertable.html, "other kinds of schema changes"): a new table, the rows
    // copied with their ids, the old one dropped, the new one renamed, its indexes made again;
    // the runner turns foreign-key enforcement off around it (else dropping `users` would
    // cascade to every post and token) and checks the keys before it commits. Copying the ids
    // into an `AUTOINCREMENT` table sets its `sqlite_sequence` row to the highest id, and the
    // rename carries that row over. (An id deleted before this migration, above every id left,
    // can still be given once more: nothing recorded it.)
    //
    // PostgreSQL: `BIGSERIAL` draws from a sequence, which never goes back (a value drawn by a
    // transaction that rolls back is skipped, not reused), so its tables stay as they are.
    //
    // Both: `users.token_gen` is bumped when an account's password or role changes; an access
    // token carries the value it was issued under and a refresh-token family the value of its
    // login, and neither is accepted once they differ (see `app::session`).
    Migration {
        version: 3,
        sql: "
        CREATE TABLE users_new (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            name          TEXT NOT NULL,
            email         TEXT NOT NULL UNIQUE COLLATE NOCASE,
            password_hash TEXT NOT NULL,
            age           INTEGER,
            role          TEXT NOT NULL CHECK (role IN ('user', 'admin')),
            created_at    TEXT NOT NULL,
            updated_at    TEXT NOT NULL,
            token_gen     INTEGER NOT NULL DEFAULT 0
        );
        INSERT INTO users_new (id, name, email, password_hash, age, role, created_at, updated_at)
            SELECT id, name, email, password_hash, age, role, created_at, updated_at FROM users;
        DROP TABLE users;
        ALTER TABLE users_new RENAME TO users;

        CREATE TABLE posts_new (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id    INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        INSERT INTO posts_new (id, user_id, title, body, created_at, updated_at)
            SELECT id, user_id, title, body, created_at, updated_at FROM posts;
        DROP TABLE posts;
        ALTER TABLE posts_new RENAME TO posts;
        CREATE INDEX posts_user_id ON posts (user_id, id);

        CREATE TABLE notifications_new (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            title      TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        INSERT INTO notifications_new (id, title, body, created_at)
            SELECT id, title, body, created_at FROM notifications;
        DROP TABLE notifications;
        ALTER TABLE notifications_new RENAME TO notifications;

        ALTER TABLE token_families ADD COLUMN gen INTEGER NOT NULL DEFAULT 0;
        ",
        postgres: "
        ALTER TABLE users ADD COLUMN token_gen BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE token_families ADD COLUMN gen BIGINT NOT NULL DEFAULT 0;
        ",
    },
    Migration {
        version: 4,
        // Declared resources: notifications also hold change events (one id sequence, so
        // `Last-Event-ID` replays both); the posts table takes the layout of a declared
        // resource nested under users (`owner_id`, `parent_id`); `forkd_resources` records
        // the declaration each resource table was last migrated to.
        sql: concat!(
            "
        ALTER TABLE notifications ADD COLUMN kind TEXT NOT NULL DEFAULT 'notification';
        ALTER TABLE notifications ADD COLUMN resource TEXT;
        ALTER TABLE notifications ADD COLUMN action TEXT;
        ALTER TABLE notifications ADD COLUMN record_id INTEGER;
        ALTER TABLE notifications ADD COLUMN owner_id INTEGER;
        ALTER TABLE notifications ADD COLUMN data TEXT;
        ALTER TABLE posts RENAME COLUMN user_id TO owner_id;
        ALTER TABLE posts ADD COLUMN parent_id INTEGER REFERENCES users (id) ON DELETE CASCADE;
",
            migration_4_posts!(),
            now_sql!(),
            ");
        "
        ),
        postgres: concat!(
            "
        ALTER TABLE notifications
            ADD COLUMN kind TEXT NOT NULL DEFAULT 'notification',
            ADD COLUMN resource TEXT,
            ADD COLUMN action TEXT,
            ADD COLUMN record_id BIGINT,
            ADD COLUMN owner_id BIGINT,
            ADD COLUMN data TEXT;
        ALTER TABLE posts RENAME COLUMN user_id TO owner_id;
        ALTER TABLE posts ADD COLUMN parent_id BIGINT REFERENCES users (id) ON DELETE CASCADE;
",
            migration_4_posts!(),
            "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'));
        "
        ),
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
    run_until(conn, latest_version())
}

/// Apply the migrations up to version `last` (all of them in [`run`]; fewer in tests that
/// need a database as an older binary left it).
///
/// Foreign-key enforcement is off while migrations run (a rebuilt table is dropped while
/// others still refer to it, and SQLite ignores the setting inside a transaction, so it is
/// changed around them) and each migration checks every key before it commits: one that
/// would leave a dangling reference fails and changes nothing.
fn run_until(conn: &mut Connection, last: u32) -> Result<(), StoreError> {
    conn.pragma_update(None, "foreign_keys", false)?;
    let applied = apply(conn, last);
    let restored = conn.pragma_update(None, "foreign_keys", true);
    applied?;
    Ok(restored?)
}

fn apply(conn: &mut Connection, last: u32) -> Result<(), StoreError> {
    let latest = latest_version();
    for m in MIGRATIONS.iter().filter(|m| m.version <= last) {
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
        let dangling: i64 = tx.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |row| row.get(0))?;
        if dangling > 0 {
            return Err(StoreError::Sql(format!(
                "migration {} would leave {dangling} rows referring to missing rows",
                m.version
            )));
        }
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
        assert_eq!(latest_version(), 4);
    }

    /// The `CREATE` statement of `table`.
    fn schema_of(conn: &Connection, table: &str) -> String {
        conn.query_row("SELECT sql FROM sqlite_master WHERE name = ?1", [table], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{table}: {e}"))
    }

    #[test]
    fn in_memory_migrate_is_idempotent() {
        let mut conn = Connection::open_in_memory().expect("open");
        run(&mut conn).expect("first");
        run(&mut conn).expect("second");
        assert_eq!(current_version(&conn).expect("version"), latest_version());
        let tables: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(tables, 6, "users, posts, token_families, refresh_tokens, notifications, forkd_resources");
        for table in ["users", "posts", "notifications"] {
            assert!(schema_of(&conn, table).contains("AUTOINCREMENT"), "{table}: {}", schema_of(&conn, table));
        }
    }

    /// `INSERT … RETURNING id` of a user with this e-mail.
    fn add_user(conn: &Connection, email: &str) -> i64 {
        conn.query_row(
            "INSERT INTO users (name, email, password_hash, role, created_at, updated_at) \
             VALUES ('n', ?1, 'h', 'user', 't', 't') RETURNING id",
            [email],
            |r| r.get(0),
        )
        .expect("insert user")
    }

    fn add_post(conn: &Connection, user: i64) -> i64 {
        conn.query_row(
            "INSERT INTO posts (user_id, title, body, created_at, updated_at) VALUES (?1, 't', 'b', 't', 't') \
             RETURNING id",
            [user],
            |r| r.get(0),
        )
        .expect("insert post")
    }

    fn count(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    #[test]
    fn migration_4_gives_posts_the_layout_of_a_declared_resource() {
        let mut conn = Connection::open_in_memory().expect("open");
        run_until(&mut conn, 3).expect("version 3");
        let a = add_user(&conn, "a@x.io");
        let p = add_post(&conn, a);
        conn.execute("INSERT INTO notifications (title, body, created_at) VALUES ('n', '', 't')", []).expect("n");
        run(&mut conn).expect("version 4");
        assert_eq!(count(&conn, &format!("SELECT owner_id FROM posts WHERE id = {p}")), a);
        assert_eq!(count(&conn, &format!("SELECT parent_id FROM posts WHERE id = {p}")), a);
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM notifications WHERE kind = 'notification'"), 1);
        let recorded: String = conn
            .query_row("SELECT declaration FROM forkd_resources WHERE name = 'posts'", [], |r| r.get(0))
            .expect("posts recorded");
        assert_eq!(recorded, POSTS_DECLARATION);
        conn.execute("DELETE FROM users WHERE id = ?1", [a]).expect("delete the author");
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM posts"), 0, "posts still go with their user");
    }

    #[test]
    fn the_old_schema_gave_a_deleted_id_again_and_the_rebuilt_tables_never_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = Connection::open(dir.path().join("old.db")).expect("open");
        conn.pragma_update(None, "foreign_keys", true).expect("foreign keys");
        run_until(&mut conn, 2).expect("the schema of an older binary");

        // What the old tables do: the highest id, deleted, is the next insert's.
        let (a, b, c) = (add_user(&conn, "a@x.io"), add_user(&conn, "b@x.io"), add_user(&conn, "c@x.io"));
        conn.execute("DELETE FROM users WHERE id = ?1", [c]).expect("delete");
        assert_eq!(add_user(&conn, "c2@x.io"), c, "the bug: INTEGER PRIMARY KEY reuses the highest deleted id");
        let (pa, pb) = (add_post(&conn, a), add_post(&conn, b));
        conn.execute_batch(
            "INSERT INTO token_families (family, user_id) VALUES ('fam-b', 2);
             INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES ('h-b', 'fam-b', 2, 99);
             INSERT INTO notifications (title, body, created_at) VALUES ('n1', '', 't'), ('n2', '', 't');",
        )
        .expect("tokens and notifications");
        let before: Vec<(i64, String, String)> = conn
            .prepare("SELECT id, email, password_hash FROM users ORDER BY id")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
            .expect("users before");

        run_until(&mut conn, 3).expect("migrate an old database");
        assert_eq!(current_version(&conn).expect("version"), 3);
        let after: Vec<(i64, String, String)> = conn
            .prepare("SELECT id, email, password_hash FROM users ORDER BY id")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
            .expect("users after");
        assert_eq!(after, before, "every user kept, with its id");
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM posts"), 2);
        assert_eq!(count(&conn, "SELECT seq FROM sqlite_sequence WHERE name = 'users'"), c);
        assert_eq!(count(&conn, "SELECT seq FROM sqlite_sequence WHERE name = 'posts'"), pb);
        assert_eq!(count(&conn, "SELECT seq FROM sqlite_sequence WHERE name = 'notifications'"), 2);
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM sqlite_sequence WHERE name LIKE '%_new'"), 0);
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM users WHERE token_gen = 0"), 3);
        assert_eq!(count(&conn, "SELECT gen FROM token_families WHERE family = 'fam-b'"), 0);
        assert_eq!(count(&conn, "PRAGMA foreign_keys"), 1, "enforcement is back on");
        let index = schema_of(&conn, "posts_user_id");
        assert!(index.contains("posts (user_id, id)"), "{index}");
        assert!(schema_of(&conn, "posts").contains("REFERENCES users (id) ON DELETE CASCADE"));
        let dup = conn.execute(
            "INSERT INTO users (name, email, password_hash, role, created_at, updated_at) \
             VALUES ('n', 'A@X.IO', 'h', 'user', 't', 't')",
            [],
        );
        assert!(dup.is_err(), "the e-mail is still unique in any letter case");

        // Never again: the highest user and post deleted, the next ones get new ids.
        conn.execute("DELETE FROM users WHERE id = ?1", [c]).expect("delete the highest user");
        assert_eq!(add_user(&conn, "d@x.io"), c + 1);
        conn.execute("DELETE FROM posts WHERE id = ?1", [pb]).expect("delete the highest post");
        assert_eq!(add_post(&conn, a), pb + 1);
        // The keys still hold and still cascade.
        assert!(conn
            .execute(
                "INSERT INTO posts (user_id, title, body, created_at, updated_at) VALUES (999, 't', '', 't', 't')",
                []
            )
            .is_err());
        conn.execute("DELETE FROM users WHERE id = ?1", [b]).expect("delete b");
        assert_eq!(
            count(&conn, "SELECT COUNT(*) FROM refresh_tokens") + count(&conn, "SELECT COUNT(*) FROM token_families"),
            0
        );
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM posts WHERE user_id = 2"), 0);
        assert_eq!(count(&conn, &format!("SELECT COUNT(*) FROM posts WHERE id = {pa}")), 1);
    }
}
