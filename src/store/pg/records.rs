//! Refresh tokens and notifications on PostgreSQL: the calls of `store/tokens.rs` and
//! `store/notifications.rs` in PostgreSQL's dialect.
//!
//! Token rotation reads the token and its family `FOR UPDATE`: two hosts rotating the same
//! token at once are serialised on those rows, and the second sees the first's `spent_at`
//! (READ COMMITTED re-reads a locked row once it is released), so exactly one rotates and
//! the other revokes the family, as SQLite's `BEGIN IMMEDIATE` guarantees on one host.
//! Notification ids come from a sequence, taken under a transaction-scoped advisory lock
//! ("notif" in ASCII): ids are committed in the order they are drawn, so a replay
//! `WHERE id > last` can never pass over a row that commits later with a smaller id (two
//! hosts inserting at once would otherwise commit 8 after 9 while an SSE reader already
//! resumed from 9). SQLite's single writer gives that order for free.

use tokio_postgres::Row;

use super::super::notifications::{logged_parts, LOGGED_COLUMNS};
use super::super::{Logged, Notification, Rotation};
use super::{pg_now, Fail, Pg};
use crate::store::StoreError;

/// The advisory lock that orders notification inserts ("notif" in ASCII; the migration
/// lock is "forkd"), written as a literal in [`INSERT_NOTIFICATION`]; the test checks both.
#[cfg(test)]
pub(crate) const NOTIFY_LOCK_KEY: i64 = 0x6e_6f74_6966;

/// Insert a notification with the lock held: the row source is the lock call, so the id
/// default (`nextval`) is drawn only once the lock is granted, and the lock, being
/// transaction-scoped, is released by the commit.
pub(crate) const INSERT_NOTIFICATION: &str = concat!(
    "INSERT INTO notifications (title, body, created_at) SELECT $1::text, $2::text, ",
    pg_now!(),
    " FROM (SELECT pg_advisory_xact_lock(474316302694)) AS serial RETURNING id, title, body, created_at"
);

impl Pg {
    /// See `Store::insert_refresh`.
    pub(crate) fn insert_refresh(
        &self,
        hash: &str,
        family: &str,
        user_id: i64,
        gen: i64,
        expires_at_unix: i64,
    ) -> Result<(), StoreError> {
        self.call(|s| {
            s.begin("")?;
            s.execute(
                "INSERT INTO token_families (family, user_id, gen) VALUES ($1, $2, $3) ON CONFLICT (family) DO NOTHING",
                &[&family, &user_id, &gen],
            )?;
            s.execute(
                "INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES ($1, $2, $3, $4)",
                &[&hash, &family, &user_id, &expires_at_unix],
            )?;
            s.commit()
        })
    }

    /// See `Store::rotate_refresh`.
    pub(crate) fn rotate_refresh(
        &self,
        old_hash: &str,
        new_hash: &str,
        now_unix: i64,
        new_expires_unix: i64,
    ) -> Result<Rotation, StoreError> {
        let outcome = self.call(|s| {
            s.begin("")?;
            // The user's row is locked too: a password or role change waits for this rotation,
            // or this rotation for it, never both reading the old generation.
            let found = s.query_opt(
                "SELECT t.family, t.user_id, t.expires_at, t.spent_at IS NOT NULL, f.revoked, f.gen, u.token_gen \
                 FROM refresh_tokens t JOIN token_families f ON f.family = t.family \
                 JOIN users u ON u.id = t.user_id WHERE t.hash = $1 FOR UPDATE",
                &[&old_hash],
            )?;
            // Returning without COMMIT rolls back (nothing was written).
            let Some(row) = found else { return Ok(Rotation::Invalid) };
            let (family, user_id, expires_at, spent, revoked): (String, i64, i64, bool, bool) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?, row.try_get(4)?);
            let (family_gen, gen): (i64, i64) = (row.try_get(5)?, row.try_get(6)?);
            if revoked {
                return Ok(Rotation::Invalid);
            }
            if family_gen != gen {
                s.execute("UPDATE token_families SET revoked = true WHERE family = $1", &[&family])?;
                s.commit()?;
                return Ok(Rotation::Invalid);
            }
            if spent {
                s.execute("UPDATE token_families SET revoked = true WHERE family = $1", &[&family])?;
                s.commit()?;
                return Ok(Rotation::Reused);
            }
            if expires_at <= now_unix {
                return Ok(Rotation::Invalid);
            }
            s.execute("UPDATE refresh_tokens SET spent_at = $1 WHERE hash = $2", &[&now_unix, &old_hash])?;
            s.execute(
                "INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES ($1, $2, $3, $4)",
                &[&new_hash, &family, &user_id, &new_expires_unix],
            )?;
            s.commit()?;
            Ok(Rotation::Rotated { user_id, gen })
        })?;
        if outcome == Rotation::Reused {
            log::warn!("store: refresh token re-used; family revoked");
        }
        Ok(outcome)
    }

    /// See `Store::revoke_family`: one statement (a known token always has its family).
    pub(crate) fn revoke_family(&self, hash: &str) -> Result<bool, StoreError> {
        self.call(|s| {
            let sql = "UPDATE token_families SET revoked = true \
                       WHERE family = (SELECT family FROM refresh_tokens WHERE hash = $1)";
            Ok(s.execute(sql, &[&hash])? > 0)
        })
    }

    /// See `Store::purge_expired_families`.
    pub(crate) fn purge_expired_families(&self, now_unix: i64) -> Result<usize, StoreError> {
        self.call(|s| {
            let n = s.execute(
                "DELETE FROM token_families WHERE family IN \
                 (SELECT family FROM refresh_tokens GROUP BY family HAVING max(expires_at) <= $1)",
                &[&now_unix],
            )?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    /// See `Store::create_notification`: one statement, so one transaction, that takes
    /// the notification lock before `nextval` and keeps it until it commits.
    pub(crate) fn create_notification(&self, title: &str, body: &str) -> Result<Notification, StoreError> {
        self.call(|s| notification_from_row(&s.query_one(INSERT_NOTIFICATION, &[&title, &body])?))
    }

    /// See `Store::notifications_after`.
    pub(crate) fn notifications_after(&self, after: i64, limit: usize) -> Result<Vec<Notification>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|s| {
            let sql = "SELECT id, title, body, created_at FROM (SELECT * FROM notifications \
                       WHERE id > $1 AND kind = 'notification' ORDER BY id DESC LIMIT $2) newest ORDER BY id";
            s.query(sql, &[&after, &limit])?.iter().map(notification_from_row).collect()
        })
    }

    /// See `Store::events_after`.
    pub(crate) fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Logged>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|s| {
            let sql = format!(
                "SELECT {LOGGED_COLUMNS} FROM \
                 (SELECT * FROM notifications WHERE id > $1 ORDER BY id DESC LIMIT $2) newest ORDER BY id"
            );
            let mut out = Vec::new();
            for row in s.query(sql.as_str(), &[&after, &limit])? {
                let parts = (
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                    row.try_get(5)?,
                    row.try_get(6)?,
                    row.try_get(7)?,
                    row.try_get(8)?,
                    row.try_get(9)?,
                );
                out.extend(logged_parts(parts));
            }
            Ok(out)
        })
    }
}

fn notification_from_row(row: &Row) -> Result<Notification, Fail> {
    Ok(Notification { id: row.try_get(0)?, title: row.try_get(1)?, body: row.try_get(2)?, created_at: row.try_get(3)? })
}
