//! Notifications: stored first (so a reconnecting SSE client can replay what it
//! missed with `Last-Event-ID`), then published on the bus by the caller.
//!
//! The `notifications` table also holds the change events of declared resources
//! (`kind = 'change'`, written by the record calls in the same transaction as the
//! change), so both share one id sequence: [`Sqlite::events_after`] reads both, in
//! id order, for a replay; [`Sqlite::notifications_after`] only notifications.

use rusqlite::{params, Row};

use super::records::Change;
use super::sqlite::Sqlite;
use super::StoreError;
use crate::resources::record::Action;

/// One entry of the event log, as a `Last-Event-ID` replay reads it.
#[derive(Clone, Debug, PartialEq)]
pub enum Logged {
    /// A notification (`POST /api/v1/notifications`).
    Notification(Notification),
    /// A change of a declared resource's record.
    Change(Change),
}

impl Logged {
    /// The event id.
    pub fn id(&self) -> i64 {
        match self {
            Logged::Notification(n) => n.id,
            Logged::Change(c) => c.id,
        }
    }
}

/// The columns [`logged_parts`] reads, in order.
pub(crate) const LOGGED_COLUMNS: &str =
    "id, kind, title, body, created_at, resource, action, record_id, owner_id, data";

/// The raw columns of a log row: id, kind, title, body, created_at, resource, action,
/// record_id, owner_id, data.
pub(crate) type LoggedRow = (
    i64,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// One log row as a [`Logged`] (both backends read the same columns); `None` for a row of a
/// kind this binary does not know or a change row missing a column.
pub(crate) fn logged_parts(row: LoggedRow) -> Option<Logged> {
    let (id, kind, title, body, created_at, resource, action, record_id, owner_id, data) = row;
    match kind.as_str() {
        "notification" => Some(Logged::Notification(Notification {
            id,
            title: title.unwrap_or_default(),
            body: body.unwrap_or_default(),
            created_at: created_at.unwrap_or_default(),
        })),
        "change" => {
            let action = match action.as_deref()? {
                "create" => Action::Create,
                "update" => Action::Update,
                "delete" => Action::Delete,
                _ => return None,
            };
            Some(Logged::Change(Change {
                id,
                resource: resource?,
                action,
                record_id: record_id?,
                owner_id: owner_id?,
                data: data?.into_bytes(),
            }))
        }
        _ => None,
    }
}

fn logged_row(r: &Row<'_>) -> rusqlite::Result<LoggedRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?, r.get(9)?))
}

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

    /// Up to `limit` notifications (not change events) with an id above `after`, oldest first.
    pub fn notifications_after(&self, after: i64, limit: usize) -> Result<Vec<Notification>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(
            "SELECT id, title, body, created_at FROM (SELECT * FROM notifications \
             WHERE id > ?1 AND kind = 'notification' ORDER BY id DESC LIMIT ?2) ORDER BY id",
        )?;
        let rows = stmt.query_map(params![after, limit as i64], from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Up to `limit` log entries (notifications and change events) with an id above `after`,
    /// the newest ones, oldest first.
    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Logged>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {LOGGED_COLUMNS} FROM (SELECT * FROM notifications WHERE id > ?1 ORDER BY id DESC LIMIT ?2) ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![after, limit as i64], logged_row)?;
        let rows = rows.collect::<Result<Vec<_>, _>>()?;
        Ok(rows.into_iter().filter_map(logged_parts).collect())
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

    /// A change row as the record calls write it (title and body are not theirs).
    fn insert_change(s: &Sqlite, resource: &str, action: &str, owner: i64, data: &str) -> i64 {
        let conn = s.conn().expect("conn");
        conn.query_row(
            "INSERT INTO notifications (title, body, created_at, kind, resource, action, record_id, owner_id, data) \
             VALUES ('', '', 't', 'change', ?1, ?2, 7, ?3, ?4) RETURNING id",
            params![resource, action, owner, data],
            |r| r.get(0),
        )
        .expect("change row")
    }

    #[test]
    fn a_replay_reads_notifications_and_changes_in_one_sequence() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("n.db");
        Sqlite::migrate(&path).expect("migrate");
        let s = Sqlite::open(&path, 1).expect("open");
        let n1 = s.create_notification("one", "").expect("create").id;
        let c1 = insert_change(&s, "notes", "create", 4, "{\"resource\":\"notes\"}");
        let n2 = s.create_notification("two", "").expect("create").id;
        let c2 = insert_change(&s, "notes", "delete", 5, "{}");
        let ids: Vec<i64> = s.events_after(0, 100).expect("events").iter().map(Logged::id).collect();
        assert_eq!(ids, [n1, c1, n2, c2], "one id order");
        let after: Vec<Logged> = s.events_after(n2, 100).expect("events");
        assert_eq!(
            after,
            [Logged::Change(Change {
                id: c2,
                resource: "notes".into(),
                action: Action::Delete,
                record_id: 7,
                owner_id: 5,
                data: b"{}".to_vec()
            })]
        );
        let ids: Vec<i64> = s.events_after(0, 2).expect("events").iter().map(Logged::id).collect();
        assert_eq!(ids, [n2, c2], "the limit keeps the newest");
        let notes: Vec<i64> = s.notifications_after(0, 100).expect("after").iter().map(|n| n.id).collect();
        assert_eq!(notes, [n1, n2], "notifications only");
    }

    #[test]
    fn postgres_replays_notifications_and_changes_in_one_sequence() {
        use super::super::{Store, Target};
        use std::str::FromStr;
        let Some(url) = super::super::pg::testutil::fresh_database("events_after") else { return };
        Store::migrate(Target::Postgres(&url)).expect("migrate");
        let store = Store::open(Target::Postgres(&url), 2).expect("open");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let config = tokio_postgres::Config::from_str(url.expose()).expect("url parses");
        let client = rt.block_on(async {
            let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect");
            tokio::spawn(conn);
            client
        });
        let change = |action: &str, owner: i64| -> i64 {
            let sql = "INSERT INTO notifications (title, body, created_at, kind, resource, action, record_id, owner_id, data) \
                       VALUES ('', '', 't', 'change', 'notes', $1, 7, $2, '{}') RETURNING id";
            rt.block_on(client.query_one(sql, &[&action, &owner])).expect("change row").get(0)
        };
        let n1 = store.create_notification("one", "").expect("create").id;
        let c1 = change("create", 4);
        let n2 = store.create_notification("two", "").expect("create").id;
        let c2 = change("update", 5);
        let ids: Vec<i64> = store.events_after(0, 100).expect("events").iter().map(Logged::id).collect();
        assert_eq!(ids, [n1, c1, n2, c2], "one id order");
        let last = store.events_after(n2, 100).expect("events");
        let want = Change {
            id: c2,
            resource: "notes".into(),
            action: Action::Update,
            record_id: 7,
            owner_id: 5,
            data: b"{}".to_vec(),
        };
        assert_eq!(last, [Logged::Change(want)]);
        let ids: Vec<i64> = store.events_after(0, 2).expect("events").iter().map(Logged::id).collect();
        assert_eq!(ids, [n2, c2], "the limit keeps the newest");
        let notes: Vec<i64> = store.notifications_after(0, 100).expect("after").iter().map(|n| n.id).collect();
        assert_eq!(notes, [n1, n2], "notifications only");
    }
}
