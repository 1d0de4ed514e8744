//! Refresh tokens: storage, one-time rotation with re-use detection, and revocation by family.
//!
//! Tokens are stored only as the hashes the caller passes (hex SHA-256); the raw token never
//! reaches this file. Every token belongs to a family (one login); spending a token twice means
//! it leaked, so the whole family is revoked. A family also keeps the token generation its
//! user had at login: once the user's password or role changes (the generation moves on) the
//! family never rotates again. Minting, hashing and cookie handling belong to `auth/`;
//! nothing here knows about HTTP.

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::sqlite::Sqlite;
use super::StoreError;

/// The outcome of [`Sqlite::rotate_refresh`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotation {
    /// The old token is now spent and the new one is live, in the same family.
    Rotated {
        /// Whose token it was.
        user_id: i64,
        /// The user's token generation, read in the same transaction: the one the new access
        /// token is issued under.
        gen: i64,
    },
    /// The old token had already been spent: its whole family is now revoked.
    Reused,
    /// Unknown, expired, its family revoked, or its user's password or role changed since the
    /// login (the family is then revoked).
    Invalid,
}

impl Sqlite {
    /// Store a live token (by hash) in `family`, creating the family if it is new with the
    /// token generation `gen` (the user's, as read at login).
    pub fn insert_refresh(
        &self,
        hash: &str,
        family: &str,
        user_id: i64,
        gen: i64,
        expires_at_unix: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "INSERT INTO token_families (family, user_id, gen) VALUES (?1, ?2, ?3) ON CONFLICT (family) DO NOTHING",
        )?
        .execute(params![family, user_id, gen])?;
        tx.prepare_cached("INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![hash, family, user_id, expires_at_unix])?;
        tx.commit()?;
        Ok(())
    }

    /// Spend `old_hash` and store `new_hash` in its family, all in one `BEGIN IMMEDIATE`
    /// transaction, so two concurrent refreshes with the same token cannot both succeed.
    ///
    /// In order: unknown (its user deleted included) → `Invalid`; family revoked → `Invalid`;
    /// the family's generation is not the user's → revoke it, `Invalid`; already spent →
    /// revoke the family, `Reused`; expired (`expires_at <= now_unix`) → `Invalid`; else
    /// `Rotated`.
    pub fn rotate_refresh(
        &self,
        old_hash: &str,
        new_hash: &str,
        now_unix: i64,
        new_expires_unix: i64,
    ) -> Result<Rotation, StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found = tx
            .prepare_cached(
                "SELECT t.family, t.user_id, t.expires_at, t.spent_at IS NOT NULL, f.revoked, f.gen, u.token_gen \
                 FROM refresh_tokens t JOIN token_families f ON f.family = t.family \
                 JOIN users u ON u.id = t.user_id WHERE t.hash = ?1",
            )?
            .query_row([old_hash], |r| {
                let row: (String, i64, i64, bool, bool) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
                Ok((row, r.get::<_, i64>(5)?, r.get::<_, i64>(6)?))
            })
            .optional()?;
        let Some(((family, user_id, expires_at, spent, revoked), family_gen, gen)) = found else {
            return Ok(Rotation::Invalid);
        };
        if revoked {
            return Ok(Rotation::Invalid);
        }
        if family_gen != gen {
            revoke(&tx, &family)?;
            tx.commit()?;
            return Ok(Rotation::Invalid);
        }
        if spent {
            revoke(&tx, &family)?;
            tx.commit()?;
            log::warn!("store: refresh token re-used; family revoked for user {user_id}");
            return Ok(Rotation::Reused);
        }
        if expires_at <= now_unix {
            return Ok(Rotation::Invalid);
        }
        tx.prepare_cached("UPDATE refresh_tokens SET spent_at = ?1 WHERE hash = ?2")?
            .execute(params![now_unix, old_hash])?;
        tx.prepare_cached("INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![new_hash, family, user_id, new_expires_unix])?;
        tx.commit()?;
        Ok(Rotation::Rotated { user_id, gen })
    }

    /// Revoke the family `hash` belongs to (logout); returns whether the token was known.
    pub fn revoke_family(&self, hash: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let family: Option<String> = tx
            .prepare_cached("SELECT family FROM refresh_tokens WHERE hash = ?1")?
            .query_row([hash], |r| r.get(0))
            .optional()?;
        let Some(family) = family else { return Ok(false) };
        revoke(&tx, &family)?;
        tx.commit()?;
        Ok(true)
    }
}

impl Sqlite {
    /// Delete every token family whose newest token expired at or before
    /// `now_unix`, with its tokens (`ON DELETE CASCADE`); returns how many
    /// families went. Without it each login left rows behind for ever.
    ///
    /// A family with one live token is kept whole: its spent, expired tokens
    /// still reveal a replay (and revoke the family, see
    /// [`Sqlite::rotate_refresh`]) while a thief could race its owner.
    pub fn purge_expired_families(&self, now_unix: i64) -> Result<usize, StoreError> {
        let conn = self.conn()?;
        let n = conn
            .prepare_cached(
                "DELETE FROM token_families WHERE family IN \
                 (SELECT family FROM refresh_tokens GROUP BY family HAVING max(expires_at) <= ?1)",
            )?
            .execute([now_unix])?;
        Ok(n)
    }
}

/// Mark a family revoked: none of its tokens rotates again.
fn revoke(conn: &rusqlite::Connection, family: &str) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE token_families SET revoked = 1 WHERE family = ?1")?.execute([family])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::sqlite::testutil;
    use super::super::{NewUser, Role};
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn setup() -> (tempfile::TempDir, Sqlite, i64) {
        let (dir, store) = testutil::store(1);
        let new = NewUser { name: "u", email: "u@x.io", password_hash: "h", age: None, role: Role::User };
        let id = store.create_user(&new).expect("user").id;
        (dir, store, id)
    }

    #[test]
    fn rotate_then_reuse_revokes_the_family() {
        let (_dir, store, uid) = setup();
        store.insert_refresh("h1", "fam", uid, 0, NOW + 100).expect("insert");
        assert_eq!(
            store.rotate_refresh("h1", "h2", NOW, NOW + 200).expect("rotate"),
            Rotation::Rotated { user_id: uid, gen: 0 }
        );
        assert_eq!(store.rotate_refresh("h1", "h3", NOW, NOW + 200).expect("reuse"), Rotation::Reused);
        assert_eq!(store.rotate_refresh("h2", "h4", NOW, NOW + 200).expect("new one"), Rotation::Invalid);
        assert_eq!(store.rotate_refresh("h1", "h5", NOW, NOW + 200).expect("again"), Rotation::Invalid);
        // Other families of the same user are untouched.
        store.insert_refresh("g1", "other", uid, 0, NOW + 100).expect("insert");
        assert_eq!(
            store.rotate_refresh("g1", "g2", NOW, NOW + 200).expect("rotate"),
            Rotation::Rotated { user_id: uid, gen: 0 }
        );
    }

    #[test]
    fn unknown_and_expired_are_invalid() {
        let (_dir, store, uid) = setup();
        assert_eq!(store.rotate_refresh("nope", "h2", NOW, NOW + 200).expect("rotate"), Rotation::Invalid);
        store.insert_refresh("h1", "fam", uid, 0, NOW).expect("insert");
        assert_eq!(store.rotate_refresh("h1", "h2", NOW, NOW + 200).expect("expired"), Rotation::Invalid);
        assert_eq!(store.rotate_refresh("h2", "h3", NOW, NOW + 200).expect("not minted"), Rotation::Invalid);
        assert!(matches!(store.insert_refresh("h1", "fam", uid, 0, NOW), Err(StoreError::Duplicate("hash"))));
    }

    #[test]
    fn purging_deletes_dead_families_and_keeps_live_ones_whole() {
        let (_dir, store, uid) = setup();
        // Dead: its only token expired; also a revoked family whose tokens all expired.
        store.insert_refresh("d1", "dead", uid, 0, NOW - 1).expect("insert");
        store.insert_refresh("r1", "revoked", uid, 0, NOW).expect("insert");
        assert!(store.revoke_family("r1").expect("revoke"));
        // Live: rotated once; the spent first token has expired, the new one has not.
        store.insert_refresh("l1", "live", uid, 0, NOW + 10).expect("insert");
        assert_eq!(
            store.rotate_refresh("l1", "l2", NOW, NOW + 200).expect("rotate"),
            Rotation::Rotated { user_id: uid, gen: 0 }
        );
        assert_eq!(store.purge_expired_families(NOW + 100).expect("purge"), 2);
        assert_eq!(store.purge_expired_families(NOW + 100).expect("again"), 0);
        // The dead tokens are gone (unknown now); the live family still catches a replay.
        assert!(!store.revoke_family("d1").expect("gone"));
        assert!(!store.revoke_family("r1").expect("gone"));
        assert_eq!(store.rotate_refresh("l1", "l3", NOW + 100, NOW + 300).expect("replay"), Rotation::Reused);
    }

    #[test]
    fn a_password_or_role_change_voids_the_families_of_earlier_logins() {
        let (_dir, store, uid) = setup();
        store.insert_refresh("h1", "fam", uid, 0, NOW + 100).expect("insert");
        let password = super::super::UserChanges { password_hash: Some("h2".into()), ..Default::default() };
        assert!(store.update_user(uid, &password).expect("update").expect("exists").revoked);
        assert_eq!(store.rotate_refresh("h1", "h2", NOW, NOW + 200).expect("rotate"), Rotation::Invalid);
        assert_eq!(store.rotate_refresh("h1", "h3", NOW, NOW + 200).expect("again"), Rotation::Invalid, "revoked");
        // A login after the change (its family made with the new generation) refreshes.
        store.insert_refresh("g1", "after", uid, 1, NOW + 100).expect("insert");
        assert_eq!(
            store.rotate_refresh("g1", "g2", NOW, NOW + 200).expect("rotate"),
            Rotation::Rotated { user_id: uid, gen: 1 }
        );
    }

    #[test]
    fn revoke_family_on_logout() {
        let (_dir, store, uid) = setup();
        store.insert_refresh("h1", "fam", uid, 0, NOW + 100).expect("insert");
        assert_eq!(
            store.rotate_refresh("h1", "h2", NOW, NOW + 200).expect("rotate"),
            Rotation::Rotated { user_id: uid, gen: 0 }
        );
        assert!(store.revoke_family("h1").expect("revoke via a spent token"));
        assert!(!store.revoke_family("unknown").expect("revoke"));
        assert_eq!(store.rotate_refresh("h2", "h3", NOW, NOW + 200).expect("rotate"), Rotation::Invalid);
    }
}
