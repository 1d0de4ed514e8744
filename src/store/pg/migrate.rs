//! The PostgreSQL schema: the migrations of `store/migrations.rs` (their PostgreSQL text),
//! applied once however many hosts start at the same time, and the version check each new
//! connection makes.
//!
//! The applied version is the one row of `forkd_schema`. [`run`] holds a session-level
//! advisory lock for its whole run, so a second host starting together waits, then finds
//! the schema current; each migration commits with its version in one transaction. Like the
//! SQLite runner, it refuses a database newer than this binary. Nothing here runs on a
//! request: the supervisor calls it before fork, `forkd user create` before its insert.

use std::time::Duration;

use super::{migrations, Fail, Session};

/// How long a migration run may take, waiting for another host's lock included.
pub(super) const DEADLINE: Duration = Duration::from_secs(60);
/// The advisory lock key every forkd migrating this database takes ("forkd" in ASCII).
pub(super) const LOCK_KEY: i64 = 0x66_6f72_6b64;

/// Apply every pending migration under the advisory lock.
pub(super) fn run(s: &mut Session<'_>) -> Result<(), Fail> {
    s.batch(&format!("SELECT pg_advisory_lock({LOCK_KEY})"))?;
    let result = apply_pending(s);
    // Closing the connection releases the lock too; unlocking is only tidiness.
    let unlocked = s.batch(&format!("SELECT pg_advisory_unlock({LOCK_KEY})"));
    result.and(unlocked)
}

fn apply_pending(s: &mut Session<'_>) -> Result<(), Fail> {
    s.batch(
        "CREATE TABLE IF NOT EXISTS forkd_schema (version INTEGER NOT NULL); \
         INSERT INTO forkd_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM forkd_schema)",
    )?;
    let latest = migrations::latest_version();
    for m in migrations::MIGRATIONS {
        let found = version(s)?;
        if found > latest {
            return Err(Fail::Mapping(format!(
                "database schema version {found} is newer than this binary's ({latest})"
            )));
        }
        if found >= m.version {
            continue;
        }
        s.begin("")?;
        s.batch(m.postgres)?;
        s.execute("UPDATE forkd_schema SET version = $1", &[&(m.version as i32)])?;
        s.commit()?;
        log::info!("store: applied PostgreSQL migration {}", m.version);
    }
    Ok(())
}

/// The applied schema version (0 before the first migration).
fn version(s: &mut Session<'_>) -> Result<u32, Fail> {
    let row = s.query_one("SELECT version FROM forkd_schema", &[])?;
    let v: i32 = row.try_get(0)?;
    u32::try_from(v).map_err(|_| Fail::Mapping(format!("schema version {v}")))
}

/// A new connection's check that the schema is this binary's: a worker never runs its SQL
/// against a database that was not migrated (or was migrated by a newer binary).
pub(super) fn check_version(s: &mut Session<'_>) -> Result<(), Fail> {
    let row = s.query_opt("SELECT version FROM forkd_schema", &[]);
    let found = match row {
        Ok(Some(row)) => u32::try_from(row.try_get::<_, i32>(0)?).unwrap_or(0),
        Ok(None) => 0,
        // `forkd_schema` missing: not migrated.
        Err(Fail::Db(e)) if e.code().is_some_and(|c| c.code() == "42P01") => 0,
        Err(e) => return Err(e),
    };
    let wanted = migrations::latest_version();
    if found != wanted {
        return Err(Fail::NotMigrated { found, wanted });
    }
    Ok(())
}
