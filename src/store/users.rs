//! Users: the `users` table behind typed calls (create, get, look up by e-mail, list with
//! filters/sort/paging, update, delete).
//!
//! E-mail is unique case-insensitively (the column is `COLLATE NOCASE UNIQUE`) and stored as
//! given. The password hash leaves this file only through [`Sqlite::user_by_email`] (login) and
//! [`Sqlite::password_hash`] (a password change); [`User`] never carries it. Each user has a
//! token generation (`token_gen`), bumped in the same statement that changes their password
//! or role: what access tokens and refresh-token families are checked against. No validation of lengths or formats happens here (that is the
//! handlers' job) and nothing here knows about HTTP.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, Value, ValueRef};
use rusqlite::{params, params_from_iter, OptionalExtension, Row, ToSql, TransactionBehavior};

use super::sqlite::Sqlite;
pub use super::Page;
use super::{Paging, StoreError};

/// The columns of [`User`], in the order [`user_from_row`] reads them.
macro_rules! user_cols {
    () => {
        "id, name, email, age, role, created_at, updated_at, token_gen"
    };
}

/// A user's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// An ordinary account.
    User,
    /// May manage every user and post, and assign roles.
    Admin,
}

impl Role {
    /// The stored and wire form: `"user"` or `"admin"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Admin => "admin",
        }
    }

    /// Parse the wire form exactly (lowercase); anything else is `None`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

impl ToSql for Role {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for Role {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Role> {
        let s = value.as_str()?;
        Role::parse(s).ok_or_else(|| FromSqlError::Other(format!("unknown role {s:?}").into()))
    }
}

/// A user as the API shows it: never the password hash.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// Row id.
    pub id: i64,
    /// Display name.
    pub name: String,
    /// E-mail as given at creation or last change (unique case-insensitively).
    pub email: String,
    /// Age in years, if known.
    pub age: Option<i64>,
    /// Role.
    pub role: Role,
    /// Creation time, RFC 3339 UTC with milliseconds (`2026-11-22T10:00:00.123Z`).
    pub created_at: String,
    /// Last change, same format.
    pub updated_at: String,
    /// The account's token generation: bumped when its password or role changes, so that
    /// tokens issued before no longer match. Never shown.
    #[serde(skip)]
    pub token_gen: i64,
}

/// A [`User`] whose text borrows from elsewhere (a database row: [`Sqlite::with_user`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UserRef<'a> {
    /// Row id.
    pub id: i64,
    /// Display name.
    pub name: &'a str,
    /// E-mail.
    pub email: &'a str,
    /// Age in years, if known.
    pub age: Option<i64>,
    /// Role.
    pub role: Role,
    /// Creation time.
    pub created_at: &'a str,
    /// Last change.
    pub updated_at: &'a str,
}

impl User {
    /// This user, borrowed.
    pub fn borrowed(&self) -> UserRef<'_> {
        UserRef {
            id: self.id,
            name: &self.name,
            email: &self.email,
            age: self.age,
            role: self.role,
            created_at: &self.created_at,
            updated_at: &self.updated_at,
        }
    }
}

/// The fields of a user to create (already validated; the password already hashed).
pub struct NewUser<'a> {
    /// Display name.
    pub name: &'a str,
    /// E-mail; a case-insensitive duplicate fails with `Duplicate("email")`.
    pub email: &'a str,
    /// The password's hash (argon2id PHC string).
    pub password_hash: &'a str,
    /// Age in years, if given.
    pub age: Option<i64>,
    /// Role.
    pub role: Role,
}

/// A partial update: `None` leaves a field as it is.
#[derive(Default)]
pub struct UserChanges {
    /// New name.
    pub name: Option<String>,
    /// New e-mail; a case-insensitive duplicate of another user's fails with `Duplicate("email")`.
    pub email: Option<String>,
    /// New age: `Some(None)` sets it to null.
    pub age: Option<Option<i64>>,
    /// New role.
    pub role: Option<Role>,
    /// New password hash (argon2id PHC string).
    pub password_hash: Option<String>,
}

/// What [`Sqlite::update_user`] did.
#[derive(Debug, PartialEq)]
pub struct Updated {
    /// The user as changed.
    pub user: User,
    /// The password or the role changed: the token generation moved on, and every token
    /// issued before is void.
    pub revoked: bool,
}

/// A column users can be sorted by; the only way a sort reaches SQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserSort {
    /// `id`
    Id,
    /// `name`
    Name,
    /// `email` (case-insensitive, like the column)
    Email,
    /// `age` (nulls first when ascending)
    Age,
    /// `createdAt`
    CreatedAt,
}

impl UserSort {
    /// Parse an API sort key (`id`, `name`, `email`, `age`, `createdAt`), without a `-` prefix.
    pub fn parse(s: &str) -> Option<UserSort> {
        match s {
            "id" => Some(UserSort::Id),
            "name" => Some(UserSort::Name),
            "email" => Some(UserSort::Email),
            "age" => Some(UserSort::Age),
            "createdAt" => Some(UserSort::CreatedAt),
            _ => None,
        }
    }

    fn column(self) -> &'static str {
        match self {
            UserSort::Id => "id",
            UserSort::Name => "name",
            UserSort::Email => "email",
            UserSort::Age => "age",
            UserSort::CreatedAt => "created_at",
        }
    }
}

/// Filters, sort and page for [`Sqlite::list_users`].
pub struct UserQuery {
    /// Only users with this role.
    pub role: Option<Role>,
    /// Only users whose name contains this text, case-insensitively (ASCII); `%` and `_` are
    /// literal.
    pub q: Option<String>,
    /// Sort keys, each with "descending"; empty means id ascending. Id is always the final
    /// tie-breaker; a repeated key counts once (its first occurrence).
    pub sort: Vec<(UserSort, bool)>,
    /// Page number from 1 (0 is treated as 1).
    pub page: u32,
    /// Page size, clamped to 1..=100.
    pub limit: u32,
}

impl Sqlite {
    /// Create a user; `Duplicate("email")` if the e-mail is taken in any letter case.
    pub fn create_user(&self, u: &NewUser<'_>) -> Result<User, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!(
            "INSERT INTO users (name, email, password_hash, age, role, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ",
            now_sql!(),
            ", ",
            now_sql!(),
            ") RETURNING ",
            user_cols!()
        ))?;
        Ok(stmt.query_row(params![u.name, u.email, u.password_hash, u.age, u.role], user_from_row)?)
    }

    /// The user with this id, if any.
    pub fn get_user(&self, id: i64) -> Result<Option<User>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!("SELECT ", user_cols!(), " FROM users WHERE id = ?1"))?;
        Ok(stmt.query_row([id], user_from_row).optional()?)
    }

    /// The user with this id, if any, lent to `f` straight from the row: its text fields
    /// borrow SQLite's buffers, nothing is copied. `f` runs while the connection is held:
    /// it must only look at the user (render it), not call the store.
    pub fn with_user<R>(&self, id: i64, f: impl FnOnce(UserRef<'_>) -> R) -> Result<Option<R>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(concat!("SELECT ", user_cols!(), " FROM users WHERE id = ?1"))?;
        let mut rows = stmt.query([id])?;
        let Some(row) = rows.next()? else { return Ok(None) };
        let user = UserRef {
            id: row.get(0)?,
            name: text(row, 1)?,
            email: text(row, 2)?,
            age: row.get(3)?,
            role: row.get(4)?,
            created_at: text(row, 5)?,
            updated_at: text(row, 6)?,
        };
        Ok(Some(f(user)))
    }

    /// The user with this e-mail (any letter case) and their password hash, for login.
    pub fn user_by_email(&self, email: &str) -> Result<Option<(User, String)>, StoreError> {
        let conn = self.conn()?;
        let mut stmt =
            conn.prepare_cached(concat!("SELECT ", user_cols!(), ", password_hash FROM users WHERE email = ?1"))?;
        Ok(stmt.query_row([email], |row| Ok((user_from_row(row)?, row.get(8)?))).optional()?)
    }

    /// The password hash of user `id`, if there is such a user (a password change checks the
    /// current one).
    pub fn password_hash(&self, id: i64) -> Result<Option<String>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached("SELECT password_hash FROM users WHERE id = ?1")?;
        Ok(stmt.query_row([id], |row| row.get(0)).optional()?)
    }

    /// The token generation of user `id`; `None` when there is no such user (deleted: ids are
    /// never given again, so a token for a missing id is void).
    pub fn token_gen(&self, id: i64) -> Result<Option<i64>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached("SELECT token_gen FROM users WHERE id = ?1")?;
        Ok(stmt.query_row([id], |row| row.get(0)).optional()?)
    }

    /// One page of users matching the filters, in the requested order. The count and the page
    /// come from one snapshot.
    pub fn list_users(&self, q: &UserQuery) -> Result<Page<User>, StoreError> {
        let paging = Paging::new(q.page, q.limit);
        let mut filters: Vec<&str> = Vec::new();
        let mut args: Vec<Value> = Vec::new();
        if let Some(role) = q.role {
            filters.push("role = ?");
            args.push(Value::Text(role.as_str().to_owned()));
        }
        if let Some(text) = &q.q {
            filters.push(r"name LIKE ? ESCAPE '\'");
            args.push(Value::Text(format!("%{}%", escape_like(text))));
        }
        let where_sql = if filters.is_empty() { String::new() } else { format!(" WHERE {}", filters.join(" AND ")) };

        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let total: i64 = tx
            .prepare_cached(&format!("SELECT COUNT(*) FROM users{where_sql}"))?
            .query_row(params_from_iter(&args), |r| r.get(0))?;
        let sql =
            format!("SELECT {} FROM users{where_sql} ORDER BY {} LIMIT ? OFFSET ?", user_cols!(), order_by(&q.sort));
        args.push(Value::Integer(i64::from(paging.limit)));
        args.push(Value::Integer(paging.offset()));
        let items = tx
            .prepare_cached(&sql)?
            .query_map(params_from_iter(&args), user_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(paging.finish(items, total))
    }

    /// Apply `c` to the user and bump `updated_at`; `None` if there is no such user. A new
    /// password, or a role other than the current one, bumps the token generation in the
    /// same statement (the right-hand sides see the row as it was).
    pub fn update_user(&self, id: i64, c: &UserChanges) -> Result<Option<Updated>, StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let before: Option<i64> =
            tx.prepare_cached("SELECT token_gen FROM users WHERE id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
        let Some(before) = before else { return Ok(None) };
        let user = tx
            .prepare_cached(concat!(
                "UPDATE users SET name = COALESCE(?1, name), email = COALESCE(?2, email), ",
                "age = CASE WHEN ?3 THEN ?4 ELSE age END, role = COALESCE(?5, role), ",
                "password_hash = COALESCE(?7, password_hash), ",
                "token_gen = token_gen + (COALESCE(?5, role) <> role OR ?7 IS NOT NULL), updated_at = ",
                now_sql!(),
                " WHERE id = ?6 RETURNING ",
                user_cols!()
            ))?
            .query_row(
                params![c.name, c.email, c.age.is_some(), c.age.flatten(), c.role, id, c.password_hash],
                user_from_row,
            )?;
        tx.commit()?;
        Ok(Some(Updated { revoked: user.token_gen != before, user }))
    }

    /// Delete the user, what they own and their refresh tokens; `false` if there was no such user.
    pub fn delete_user(&self, id: i64) -> Result<bool, StoreError> {
        let conn = self.conn()?;
        let deleted = conn.prepare_cached("DELETE FROM users WHERE id = ?1")?.execute([id])?;
        Ok(deleted > 0)
    }
}

/// Text column `i` of `row`, borrowed.
fn text<'r>(row: &'r Row<'_>, i: usize) -> rusqlite::Result<&'r str> {
    let value = row.get_ref(i)?;
    value.as_str().map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, value.data_type(), Box::new(e)))
}

/// Map a row selected with `user_cols!()` (columns 0..=7).
fn user_from_row(row: &Row<'_>) -> rusqlite::Result<User> {
    Ok(User {
        id: row.get(0)?,
        name: row.get(1)?,
        email: row.get(2)?,
        age: row.get(3)?,
        role: row.get(4)?,
        created_at: row.get(5)?,
        updated_at: row.get(6)?,
        token_gen: row.get(7)?,
    })
}

/// Make `text` match literally inside a `LIKE … ESCAPE '\'` pattern.
pub(super) fn escape_like(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if matches!(ch, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// `ORDER BY` terms from whitelisted columns: each key once, then `id` as the tie-breaker.
fn order_by(sort: &[(UserSort, bool)]) -> String {
    let mut seen: Vec<UserSort> = Vec::with_capacity(sort.len() + 1);
    let mut terms: Vec<String> = Vec::with_capacity(sort.len() + 1);
    for &(key, descending) in sort {
        if !seen.contains(&key) {
            seen.push(key);
            terms.push(format!("{} {}", key.column(), if descending { "DESC" } else { "ASC" }));
        }
    }
    if !seen.contains(&UserSort::Id) {
        terms.push("id ASC".to_owned());
    }
    terms.join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::sqlite::testutil;
    use super::super::Rotation;
    use super::*;
    use crate::resources::value::Cell;

    fn new_user<'a>(name: &'a str, email: &'a str, age: Option<i64>, role: Role) -> NewUser<'a> {
        NewUser { name, email, password_hash: "$argon2id$fake", age, role }
    }

    fn query(sort: Vec<(UserSort, bool)>, page: u32, limit: u32) -> UserQuery {
        UserQuery { role: None, q: None, sort, page, limit }
    }

    fn names(page: &Page<User>) -> Vec<&str> {
        page.items.iter().map(|u| u.name.as_str()).collect()
    }

    #[test]
    fn create_get_and_duplicate_email() {
        let (_dir, store) = testutil::store(1);
        let alice = store.create_user(&new_user("Alice", "Alice@Example.com", Some(30), Role::Admin)).expect("create");
        assert_eq!((alice.email.as_str(), alice.age, alice.role), ("Alice@Example.com", Some(30), Role::Admin));
        assert_eq!(alice.created_at, alice.updated_at);
        assert_eq!(alice.created_at.len(), "2026-11-22T10:00:00.123Z".len(), "{}", alice.created_at);
        assert!(alice.created_at.ends_with('Z') && alice.created_at.contains('T'));

        assert_eq!(store.get_user(alice.id).expect("get"), Some(alice.clone()));
        let lent = store.with_user(alice.id, |u| u == alice.borrowed()).expect("with_user");
        assert_eq!(lent, Some(true), "with_user lends what get_user returns");
        assert_eq!(store.with_user(alice.id + 1, |_| ()).expect("with_user"), None);
        assert_eq!(store.get_user(alice.id + 1).expect("get"), None);

        let dup = store.create_user(&new_user("Other", "alice@EXAMPLE.COM", None, Role::User));
        assert!(matches!(dup, Err(StoreError::Duplicate("email"))), "{dup:?}");

        let (found, hash) = store.user_by_email("ALICE@example.com").expect("by email").expect("found");
        assert_eq!((found, hash.as_str()), (alice, "$argon2id$fake"));
        assert!(store.user_by_email("nobody@example.com").expect("by email").is_none());

        let json = serde_json::to_value(store.get_user(1).expect("get").expect("some")).expect("json");
        assert_eq!(json["role"], "admin");
        assert!(json.get("createdAt").is_some() && json.get("passwordHash").is_none());
    }

    #[test]
    fn list_filters_are_literal() {
        let (_dir, store) = testutil::store(1);
        let names = [
            ("100% pure", Role::User),
            ("1000 pure", Role::User),
            ("snake_case", Role::Admin),
            ("snakeXcase", Role::User),
            ("'; DROP TABLE users; --", Role::User),
            ("back\\slash", Role::User),
        ];
        for (i, (name, role)) in names.into_iter().enumerate() {
            store.create_user(&new_user(name, &format!("u{i}@x.io"), None, role)).expect("create");
        }
        let search = |q: &str, role: Option<Role>| {
            let page = store
                .list_users(&UserQuery { role, q: Some(q.to_owned()), sort: vec![], page: 1, limit: 20 })
                .expect("list");
            page.items.into_iter().map(|u| u.name).collect::<Vec<_>>()
        };
        assert_eq!(search("0%", None), ["100% pure"]);
        assert_eq!(search("E_C", None), ["snake_case"], "case-insensitive, `_` literal");
        assert_eq!(search("'; drop table users; --", None), ["'; DROP TABLE users; --"]);
        assert_eq!(search("\\", None), ["back\\slash"]);
        assert_eq!(search("snake", Some(Role::Admin)), ["snake_case"]);
        assert_eq!(search("", Some(Role::Admin)), ["snake_case"]);
        assert_eq!(store.list_users(&query(vec![], 1, 100)).expect("table still there").total, 6);
    }

    #[test]
    fn list_sorts_by_several_keys() {
        let (_dir, store) = testutil::store(1);
        for (name, age) in [("b", Some(30)), ("a", Some(30)), ("c", None), ("d", Some(20)), ("a", Some(20))] {
            let email = format!("{name}{age:?}@x.io");
            store.create_user(&new_user(name, &email, age, Role::User)).expect("create");
        }
        let sorted = |sort| store.list_users(&query(sort, 1, 20)).expect("list");
        assert_eq!(names(&sorted(vec![])), ["b", "a", "c", "d", "a"], "id ascending by default");
        let by_age_desc_name = sorted(vec![(UserSort::Age, true), (UserSort::Name, false)]);
        assert_eq!(names(&by_age_desc_name), ["a", "b", "a", "d", "c"], "nulls last when descending");
        let by_name_desc = sorted(vec![(UserSort::Name, true)]);
        let ids: Vec<i64> = by_name_desc.items.iter().map(|u| u.id).collect();
        assert_eq!(ids, [4, 3, 1, 2, 5], "ties broken by id ascending");
        let by_id_desc = sorted(vec![(UserSort::Id, true), (UserSort::Name, false)]);
        assert_eq!(by_id_desc.items.first().map(|u| u.id), Some(5));
        assert_eq!(UserSort::parse("createdAt"), Some(UserSort::CreatedAt));
        assert_eq!(UserSort::parse("created_at"), None);
        assert_eq!(sorted(vec![(UserSort::CreatedAt, false), (UserSort::Email, true)]).items.len(), 5);
    }

    #[test]
    fn list_paging_edges() {
        let (_dir, store) = testutil::store(1);
        let empty = store.list_users(&query(vec![], 1, 20)).expect("list");
        assert_eq!((empty.total, empty.total_pages, empty.items.len()), (0, 0, 0));
        for i in 0..21 {
            store.create_user(&new_user("u", &format!("u{i}@x.io"), None, Role::User)).expect("create");
        }
        let first = store.list_users(&query(vec![], 1, 20)).expect("list");
        assert_eq!((first.total, first.total_pages, first.items.len(), first.page_size), (21, 2, 20, 20));
        let second = store.list_users(&query(vec![], 2, 20)).expect("list");
        assert_eq!((second.items.len(), second.items[0].id), (1, 21));
        let past = store.list_users(&query(vec![], 3, 20)).expect("list");
        assert_eq!((past.page, past.total, past.items.len()), (3, 21, 0));
    }

    #[test]
    fn update_user_fields() {
        let (_dir, store) = testutil::store(1);
        let a = store.create_user(&new_user("A", "a@x.io", Some(40), Role::User)).expect("create");
        store.create_user(&new_user("B", "b@x.io", None, Role::User)).expect("create");

        let nothing = UserChanges::default();
        let same = store.update_user(a.id, &nothing).expect("update").expect("exists");
        assert_eq!((same.user.name.as_str(), same.user.age, same.revoked), ("A", Some(40), false));
        assert!(same.user.updated_at >= a.updated_at);

        let changes = UserChanges { name: Some("Ann".into()), age: Some(None), role: Some(Role::Admin), ..nothing };
        let ann = store.update_user(a.id, &changes).expect("update").expect("exists");
        let ann = (ann.revoked, ann.user);
        assert_eq!(
            (ann.1.name.as_str(), ann.1.email.as_str(), ann.1.age, ann.1.role, ann.0),
            ("Ann", "a@x.io", None, Role::Admin, true)
        );
        assert_eq!((ann.1.created_at.as_str(), ann.1.token_gen), (a.created_at.as_str(), a.token_gen + 1));

        let own_email_recased = UserChanges { email: Some("A@X.IO".into()), ..Default::default() };
        let recased = store.update_user(a.id, &own_email_recased).expect("own e-mail").expect("exists");
        assert_eq!((recased.user.email.as_str(), recased.revoked), ("A@X.IO", false));

        let taken = UserChanges { email: Some("B@x.io".into()), ..Default::default() };
        assert!(matches!(store.update_user(a.id, &taken), Err(StoreError::Duplicate("email"))));
        assert_eq!(store.update_user(999, &UserChanges::default()).expect("update"), None);
    }

    #[test]
    fn delete_cascades_posts_and_tokens() {
        let (_dir, store) = testutil::store(1);
        let a = store.create_user(&new_user("A", "a@x.io", None, Role::User)).expect("create");
        let posts = crate::store::records::testing::posts();
        let viewer = crate::store::records::Viewer { user_id: a.id, admin: false };
        let cells = vec![Cell::Text("t".into()), Cell::Text("b".into())];
        let (post, _) = store.record_create(posts, viewer, a.id, Some(a.id), cells).expect("store").expect("post");
        store.insert_refresh("h1", "fam", a.id, 0, i64::MAX).expect("token");
        assert!(store.delete_user(a.id).expect("delete"));
        assert!(!store.delete_user(a.id).expect("delete again"));
        assert_eq!(store.record_get(posts, post.id).expect("get"), None, "posts go with their user");
        assert_eq!(store.rotate_refresh("h1", "h2", 0, 10).expect("rotate"), Rotation::Invalid);
        let conn = store.conn().expect("conn");
        let left: i64 = conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM refresh_tokens) + (SELECT COUNT(*) FROM token_families)",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(left, 0);
    }
}
