//! Notifications: stored first (so a reconnecting SSE client can replay what it
//! missed with `Last-Event-ID`), then published on the bus by the caller.

use rusqlite::{params, Row};

use super::sqlite::Sqlite;
use super::StoreError;

/// A notification as streams and the API show it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// Row id: also the SSE event id.
    pub id: i64,
    /// Title.
    pub title: String,
    /// Body (may be empty).
    pub body: String,
    /// Creation time, RFC 3339 UTC with milliseconds.
    pub created_at: String,
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<Notification> {
    Ok(Notification { id: r.get(0)?, title: r.get(1)?, body: r.get(2)?, created_at: r.get(3)? })
}

impl Sqlite {
    /// Store a notification.
    pub fn create_notification(&self, title: &str, body: &str) -> Result<Notification, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!(
            "INSERT INTO notifications (title, body, created_at) VALUES (?1, ?2, ",
            now_sql!(),
            ") RETURNING id, title, body, created_at"
        ))?;
        Ok(stmt.query_row(params![title, body], from_row)?)
    }

    /// Up to `limit` notifications with an id above `after`, oldest first.
    pub fn notifications_after(&self, after: i64, limit: usize) -> Result<Vec<Notification>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(
            "SELECT id, title, body, created_at FROM (SELECT * FROM notifications WHERE id > ?1 ORDER BY id DESC LIMIT ?2) ORDER BY id",
        )?;
        let rows = stmt.query_map(params![after, limit as i64], from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_and_replayed_in_order_up_to_the_limit() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("n.db");
        Sqlite::migrate(&path).expect("migrate");
        let s = Sqlite::open(&path, 1).expect("open");
        let ids: Vec<i64> = (0..5).map(|i| s.create_notification(&format!("t{i}"), "b").expect("create").id).collect();
        let after: Vec<i64> = s.notifications_after(ids[1], 100).expect("after").iter().map(|n| n.id).collect();
        assert_eq!(after, ids[2..]);
        // The limit keeps the NEWEST ones (what a client most needs), still oldest first.
        let last2: Vec<i64> = s.notifications_after(0, 2).expect("after").iter().map(|n| n.id).collect();
        assert_eq!(last2, ids[3..]);
    }
}
