//! How a failed PostgreSQL call becomes a [`StoreError`], and whether it leaves its connection
//! usable. The mapping is the SQLite backend's: a unique violation on the e-mail or a token
//! hash is `Duplicate`; a database that cannot serve now (down, restarting, timed out, out of
//! resources, a deadlock) is `Unavailable` (503); anything else is `Sql` (500).
//!
//! The decision is [`classify`], a pure function of the SQLSTATE and constraint name, so it is
//! tested without a server.

use std::fmt;

use super::super::StoreError;

/// Why a statement (or connecting) failed.
#[derive(Debug)]
pub(crate) enum Fail {
    /// The client or the server reported an error.
    Db(tokio_postgres::Error),
    /// Opening a connection failed before the server said why (refused, reset, TLS: no TLS
    /// on the server, a certificate that does not verify).
    Connect(tokio_postgres::Error),
    /// The call's deadline passed with the statement still running.
    Deadline,
    /// The connection's runtime could not be built (out of file descriptors).
    Runtime(std::io::Error),
    /// A row did not hold what the schema promises.
    Mapping(String),
    /// A unique index of a declared resource refused a duplicate of this field.
    Unique(&'static str),
    /// The database's schema is not this binary's (run the migrations).
    NotMigrated {
        /// The database's version.
        found: u32,
        /// This binary's.
        wanted: u32,
    },
}

/// What a failure means for the caller and for the connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A unique field already holds the value.
    Duplicate(&'static str),
    /// The database cannot serve now; the connection is still good.
    Unavailable,
    /// The connection is gone or unusable: drop it (and try a new one next call).
    Broken,
    /// Anything else: a bug or a schema mismatch.
    Sql,
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail::Db(e)
    }
}

impl Fail {
    /// The unique constraint a server error names, if it is a unique violation.
    pub(crate) fn unique_constraint(&self) -> Option<&str> {
        match self {
            Fail::Db(e) if e.code().is_some_and(|c| c.code() == "23505") => {
                e.as_db_error().and_then(|d| d.constraint())
            }
            _ => None,
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Fail::Deadline | Fail::Runtime(_) | Fail::Connect(_) => Kind::Broken,
            Fail::Mapping(_) => Kind::Sql,
            Fail::Unique(field) => Kind::Duplicate(field),
            Fail::NotMigrated { .. } => Kind::Broken,
            Fail::Db(e) => match e.code() {
                Some(code) => classify(code.code(), e.as_db_error().and_then(|d| d.constraint())),
                // No SQLSTATE: the client's own failure. A closed connection or an I/O error
                // (which includes a refused or timed-out connect) is the connection's end;
                // anything else (a value that does not convert) is a bug.
                None if e.is_closed() || is_io(e) => Kind::Broken,
                None => Kind::Sql,
            },
        }
    }

    /// Whether the connection that produced this must be dropped.
    pub(crate) fn breaks_connection(&self) -> bool {
        self.kind() == Kind::Broken
    }

    /// The store's error for this failure; `target` (a URL without password) names the
    /// database in messages.
    pub(crate) fn into_store(self, target: &str) -> StoreError {
        match self.kind() {
            Kind::Duplicate(field) => StoreError::Duplicate(field),
            Kind::Unavailable | Kind::Broken => StoreError::Unavailable(format!("{target}: {self}")),
            Kind::Sql => StoreError::Sql(self.to_string()),
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // `Display` of the client's error shows only its kind ("db error"); the server's
            // message is in the `DbError`.
            Fail::Db(e) => match e.as_db_error() {
                Some(db) => write!(f, "{} ({})", db.message(), db.code().code()),
                None => match std::error::Error::source(e) {
                    Some(source) => write!(f, "{e}: {source}"),
                    None => write!(f, "{e}"),
                },
            },
            Fail::Connect(e) => match std::error::Error::source(e) {
                Some(source) => write!(f, "cannot connect: {e}: {source}"),
                None => write!(f, "cannot connect: {e}"),
            },
            Fail::Deadline => write!(f, "no answer within {:?}", super::CALL_DEADLINE),
            Fail::Runtime(e) => write!(f, "cannot start the client's runtime: {e}"),
            Fail::Mapping(why) => f.write_str(why),
            Fail::Unique(field) => write!(f, "duplicate value for unique field `{field}`"),
            Fail::NotMigrated { found, wanted } => {
                write!(f, "schema version {found}, expected {wanted}; run the migrations first")
            }
        }
    }
}

/// Whether the client's error came from the socket.
fn is_io(e: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// The meaning of a server error by its SQLSTATE and, for a unique violation, the index.
pub(crate) fn classify(sqlstate: &str, constraint: Option<&str>) -> Kind {
    match sqlstate {
        // unique_violation: the index names the field, as SQLite's message does.
        "23505" => match constraint {
            Some("users_email_key") => Kind::Duplicate("email"),
            Some("refresh_tokens_pkey") => Kind::Duplicate("hash"),
            _ => Kind::Sql,
        },
        // admin_shutdown, crash_shutdown, cannot_connect_now, idle_session_timeout: the
        // server ends (or refuses) this session.
        "57P01" | "57P02" | "57P03" | "57P05" => Kind::Broken,
        // query_canceled (statement_timeout), lock_not_available, serialization_failure,
        // deadlock_detected, the database is read-only (a standby after a failover).
        "57014" | "55P03" | "40001" | "40P01" | "25006" => Kind::Unavailable,
        // Class 08, connection exception: this connection is done.
        s if s.starts_with("08") => Kind::Broken,
        // Class 53, insufficient resources (too many connections, disk full, out of memory).
        s if s.starts_with("53") => Kind::Unavailable,
        _ => Kind::Sql,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_like_sqlite_errors() {
        assert_eq!(classify("23505", Some("users_email_key")), Kind::Duplicate("email"));
        assert_eq!(classify("23505", Some("refresh_tokens_pkey")), Kind::Duplicate("hash"));
        assert_eq!(classify("23505", Some("something_else")), Kind::Sql);
        assert_eq!(classify("23503", Some("posts_user_id_fkey")), Kind::Sql, "unknown author, as in SQLite");
        assert_eq!(classify("57P01", None), Kind::Broken, "server shutting down");
        assert_eq!(classify("08006", None), Kind::Broken);
        assert_eq!(classify("57014", None), Kind::Unavailable, "statement_timeout");
        assert_eq!(classify("53300", None), Kind::Unavailable, "too many connections");
        assert_eq!(classify("40P01", None), Kind::Unavailable);
        assert_eq!(classify("42P01", None), Kind::Sql, "undefined table: a bug or no migration");
    }

    #[test]
    fn failures_become_store_errors() {
        assert!(
            matches!(Fail::Deadline.into_store("postgres://h/db"), StoreError::Unavailable(m) if m.contains("postgres://h/db"))
        );
        assert!(Fail::Deadline.breaks_connection());
        assert!(matches!(Fail::Mapping("bad role".into()).into_store("x"), StoreError::Sql(_)));
        let io = std::io::Error::other("no fds");
        assert!(matches!(Fail::Runtime(io).into_store("x"), StoreError::Unavailable(_)));
    }
}
