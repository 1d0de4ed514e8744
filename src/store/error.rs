//! `StoreError`: the one error type of the store layer, and the translation of SQLite's
//! error codes into it.
//!
//! It says what went wrong in store terms (a duplicate field, a database that cannot be used
//! right now, anything else); it must not know about HTTP status codes — the mapping to the
//! wire lives in `crate::error`, in one place.

use std::fmt;

use rusqlite::ffi;

/// Why a store call failed.
#[derive(Debug)]
pub enum StoreError {
    /// A unique field already holds this value; the payload names the field (`"email"`).
    Duplicate(&'static str),
    /// The database cannot serve the call now: busy or locked past the busy timeout, cannot
    /// be opened, not migrated, the pool is exhausted or closed. Usually worth a 503.
    Unavailable(String),
    /// Any other SQLite or mapping failure (a bug or a corrupt database).
    Sql(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Duplicate(field) => write!(f, "duplicate value for unique field `{field}`"),
            StoreError::Unavailable(why) => write!(f, "database unavailable: {why}"),
            StoreError::Sql(why) => write!(f, "database error: {why}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        if let rusqlite::Error::SqliteFailure(err, msg) = &e {
            match err.code {
                ffi::ErrorCode::DatabaseBusy | ffi::ErrorCode::DatabaseLocked | ffi::ErrorCode::CannotOpen => {
                    return StoreError::Unavailable(e.to_string());
                }
                ffi::ErrorCode::ConstraintViolation
                    if matches!(
                        err.extended_code,
                        ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    ) =>
                {
                    // SQLite names the violated columns: "UNIQUE constraint failed: users.email".
                    let msg = msg.as_deref().unwrap_or_default();
                    if msg.contains("users.email") {
                        return StoreError::Duplicate("email");
                    }
                    if msg.contains("refresh_tokens.hash") {
                        return StoreError::Duplicate("hash");
                    }
                }
                _ => {}
            }
        }
        StoreError::Sql(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32, msg: &str) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(msg.to_owned()))
    }

    #[test]
    fn maps_sqlite_codes() {
        assert!(matches!(StoreError::from(failure(ffi::SQLITE_BUSY, "busy")), StoreError::Unavailable(_)));
        assert!(matches!(StoreError::from(failure(ffi::SQLITE_LOCKED, "locked")), StoreError::Unavailable(_)));
        assert!(matches!(StoreError::from(failure(ffi::SQLITE_CANTOPEN, "no")), StoreError::Unavailable(_)));
        let dup = failure(ffi::SQLITE_CONSTRAINT_UNIQUE, "UNIQUE constraint failed: users.email");
        assert!(matches!(StoreError::from(dup), StoreError::Duplicate("email")));
        let other = failure(ffi::SQLITE_CONSTRAINT_FOREIGNKEY, "FOREIGN KEY constraint failed");
        assert!(matches!(StoreError::from(other), StoreError::Sql(_)));
        assert!(matches!(StoreError::from(rusqlite::Error::QueryReturnedNoRows), StoreError::Sql(_)));
    }
}
