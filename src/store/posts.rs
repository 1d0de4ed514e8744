//! Posts: the `posts` table behind typed calls (create, get, list a user's posts newest first,
//! update, delete).
//!
//! Ownership and permission checks are the handlers' job; this file only stores and fetches.
//! A post goes away with its author (`ON DELETE CASCADE`). Nothing here knows about HTTP.

use rusqlite::{params, OptionalExtension, Row};

use super::sqlite::Sqlite;
use super::{Page, Paging, StoreError};

/// The columns of [`Post`], in the order [`post_from_row`] reads them.
macro_rules! post_cols {
    () => {
        "id, owner_id, title, body, created_at, updated_at"
    };
}

/// A post as the API shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Post {
    /// Row id.
    pub id: i64,
    /// The author's user id.
    pub user_id: i64,
    /// Title.
    pub title: String,
    /// Body (may be empty).
    pub body: String,
    /// Creation time, RFC 3339 UTC with milliseconds.
    pub created_at: String,
    /// Last change, same format.
    pub updated_at: String,
}

impl Sqlite {
    /// Create a post by `user_id`. The user must exist (else a foreign-key `Sql` error).
    pub fn create_post(&self, user_id: i64, title: &str, body: &str) -> Result<Post, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!(
            "INSERT INTO posts (owner_id, parent_id, title, body, created_at, updated_at) VALUES (?1, ?1, ?2, ?3, ",
            now_sql!(),
            ", ",
            now_sql!(),
            ") RETURNING ",
            post_cols!()
        ))?;
        Ok(stmt.query_row(params![user_id, title, body], post_from_row)?)
    }

    /// The post with this id, if any.
    pub fn get_post(&self, id: i64) -> Result<Option<Post>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!("SELECT ", post_cols!(), " FROM posts WHERE id = ?1"))?;
        Ok(stmt.query_row([id], post_from_row).optional()?)
    }

    /// One page of `user_id`'s posts, newest (highest id) first. An unknown user simply has
    /// no posts; checking that the user exists is the caller's business.
    pub fn list_posts(&self, user_id: i64, page: u32, limit: u32) -> Result<Page<Post>, StoreError> {
        let paging = Paging::new(page, limit);
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let total: i64 =
            tx.prepare_cached("SELECT COUNT(*) FROM posts WHERE owner_id = ?1")?.query_row([user_id], |r| r.get(0))?;
        let items = tx
            .prepare_cached(concat!(
                "SELECT ",
                post_cols!(),
                " FROM posts WHERE owner_id = ?1 ORDER BY id DESC LIMIT ?2 OFFSET ?3"
            ))?
            .query_map(params![user_id, paging.limit, paging.offset()], post_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(paging.finish(items, total))
    }

    /// Change the title and/or body (`None` keeps it) and bump `updated_at`; `None` if there
    /// is no such post.
    pub fn update_post(&self, id: i64, title: Option<&str>, body: Option<&str>) -> Result<Option<Post>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!(
            "UPDATE posts SET title = COALESCE(?1, title), body = COALESCE(?2, body), updated_at = ",
            now_sql!(),
            " WHERE id = ?3 RETURNING ",
            post_cols!()
        ))?;
        Ok(stmt.query_row(params![title, body, id], post_from_row).optional()?)
    }

    /// Delete the post; `false` if there was no such post.
    pub fn delete_post(&self, id: i64) -> Result<bool, StoreError> {
        let conn = self.conn()?;
        let deleted = conn.prepare_cached("DELETE FROM posts WHERE id = ?1")?.execute([id])?;
        Ok(deleted > 0)
    }
}

/// Map a row selected with `post_cols!()` (columns 0..=5).
fn post_from_row(row: &Row<'_>) -> rusqlite::Result<Post> {
    Ok(Post {
        id: row.get(0)?,
        user_id: row.get(1)?,
        title: row.get(2)?,
        body: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::sqlite::testutil;
    use super::super::{NewUser, Role};
    use super::*;

    fn user(store: &Sqlite, email: &str) -> i64 {
        let new = NewUser { name: "u", email, password_hash: "h", age: None, role: Role::User };
        store.create_user(&new).expect("create user").id
    }

    #[test]
    fn post_lifecycle() {
        let (_dir, store) = testutil::store(1);
        let a = user(&store, "a@x.io");
        let post = store.create_post(a, "Hello", "").expect("create");
        assert_eq!((post.user_id, post.title.as_str(), post.body.as_str()), (a, "Hello", ""));
        assert_eq!(store.get_post(post.id).expect("get"), Some(post.clone()));

        let edited = store.update_post(post.id, None, Some("body")).expect("update").expect("exists");
        assert_eq!((edited.title.as_str(), edited.body.as_str()), ("Hello", "body"));
        assert_eq!(edited.created_at, post.created_at);
        assert_eq!(store.update_post(999, Some("x"), None).expect("update"), None);

        assert!(store.delete_post(post.id).expect("delete"));
        assert!(!store.delete_post(post.id).expect("delete again"));
        assert!(matches!(store.create_post(999, "t", "b"), Err(StoreError::Sql(_))), "unknown author");
    }

    #[test]
    fn list_posts_newest_first_per_user() {
        let (_dir, store) = testutil::store(1);
        let (a, b) = (user(&store, "a@x.io"), user(&store, "b@x.io"));
        for i in 0..5 {
            store.create_post(a, &format!("a{i}"), "").expect("create");
        }
        store.create_post(b, "b0", "").expect("create");
        let page = store.list_posts(a, 1, 2).expect("list");
        let titles: Vec<&str> = page.items.iter().map(|p| p.title.as_str()).collect();
        assert_eq!((titles, page.total, page.total_pages), (vec!["a4", "a3"], 5, 3));
        let last = store.list_posts(a, 3, 2).expect("list");
        assert_eq!(last.items.iter().map(|p| p.title.as_str()).collect::<Vec<_>>(), ["a0"]);
        assert!(store.list_posts(a, 4, 2).expect("list").items.is_empty());
        assert_eq!(store.list_posts(999, 1, 20).expect("list").total, 0);
    }
}
