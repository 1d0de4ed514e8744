//! Users on PostgreSQL: the calls of `store/users.rs` in PostgreSQL's dialect.
//!
//! Differences from SQLite handled here so results match: the e-mail is compared and sorted
//! through `lower(email)` (the unique index is on it), text sorts use `COLLATE "C"` (SQLite's
//! byte order, whatever the database's locale), `age` sorts nulls first ascending and last
//! descending (SQLite's order, PostgreSQL's opposite), and the name filter is `ILIKE`.

use tokio_postgres::Row;

use super::super::users::escape_like;
use super::super::{NewUser, Page, Paging, Role, Updated, User, UserChanges, UserQuery, UserRef, UserSort};
use super::{pg_now, Fail, Params, Pg};
use crate::store::StoreError;

/// The columns of [`User`], in the order [`user_from_row`] reads them.
macro_rules! user_cols {
    () => {
        "id, name, email, age, role, created_at, updated_at, token_gen"
    };
}

impl Pg {
    /// See `Store::create_user`.
    pub(crate) fn create_user(&self, u: &NewUser<'_>) -> Result<User, StoreError> {
        self.call(|s| {
            let sql = concat!(
                "INSERT INTO users (name, email, password_hash, age, role, created_at, updated_at) ",
                "VALUES ($1, $2, $3, $4, $5, ",
                pg_now!(),
                ", ",
                pg_now!(),
                ") RETURNING ",
                user_cols!()
            );
            let row = s.query_one(sql, &[&u.name, &u.email, &u.password_hash, &u.age, &u.role.as_str()])?;
            user_from_row(&row)
        })
    }

    /// See `Store::get_user`.
    pub(crate) fn get_user(&self, id: i64) -> Result<Option<User>, StoreError> {
        self.read(|s| {
            let row = s.query_opt(concat!("SELECT ", user_cols!(), " FROM users WHERE id = $1"), &[&id])?;
            row.as_ref().map(user_from_row).transpose()
        })
    }

    /// See `Store::with_user`: the text fields borrow the row.
    pub(crate) fn with_user<R>(&self, id: i64, f: impl FnOnce(UserRef<'_>) -> R) -> Result<Option<R>, StoreError> {
        self.read(|s| {
            let Some(row) = s.query_opt(concat!("SELECT ", user_cols!(), " FROM users WHERE id = $1"), &[&id])? else {
                return Ok(None);
            };
            let user = UserRef {
                id: row.try_get(0)?,
                name: row.try_get(1)?,
                email: row.try_get(2)?,
                age: row.try_get(3)?,
                role: role(&row, 4)?,
                created_at: row.try_get(5)?,
                updated_at: row.try_get(6)?,
            };
            Ok(Some(f(user)))
        })
    }

    /// See `Store::user_by_email`.
    pub(crate) fn user_by_email(&self, email: &str) -> Result<Option<(User, String)>, StoreError> {
        self.read(|s| {
            let sql = concat!("SELECT ", user_cols!(), ", password_hash FROM users WHERE lower(email) = lower($1)");
            match s.query_opt(sql, &[&email])? {
                Some(row) => Ok(Some((user_from_row(&row)?, row.try_get(8)?))),
                None => Ok(None),
            }
        })
    }

    /// See `Store::password_hash`.
    pub(crate) fn password_hash(&self, id: i64) -> Result<Option<String>, StoreError> {
        self.read(|s| {
            let row = s.query_opt("SELECT password_hash FROM users WHERE id = $1", &[&id])?;
            row.map(|r| r.try_get(0)).transpose().map_err(Fail::from)
        })
    }

    /// See `Store::token_gen`: a read on the shared connection, as every request with an access
    /// token makes one (see `app::session`).
    pub(crate) fn token_gen(&self, id: i64) -> Result<Option<i64>, StoreError> {
        self.read(|s| {
            let row = s.query_opt("SELECT token_gen FROM users WHERE id = $1", &[&id])?;
            row.map(|r| r.try_get(0)).transpose().map_err(Fail::from)
        })
    }

    /// See `Store::list_users`: the count and the page in one read-only snapshot.
    pub(crate) fn list_users(&self, q: &UserQuery) -> Result<Page<User>, StoreError> {
        let paging = Paging::new(q.page, q.limit);
        let mut filters: Vec<String> = Vec::new();
        let mut texts: Vec<String> = Vec::new();
        if let Some(role) = q.role {
            texts.push(role.as_str().to_owned());
            filters.push(format!("role = ${}", texts.len()));
        }
        if let Some(text) = &q.q {
            texts.push(format!("%{}%", escape_like(text)));
            filters.push(format!(r"name ILIKE ${} ESCAPE '\'", texts.len()));
        }
        let where_sql = if filters.is_empty() { String::new() } else { format!(" WHERE {}", filters.join(" AND ")) };
        let count_sql = format!("SELECT count(*) FROM users{where_sql}");
        let n = texts.len();
        let page_sql = format!(
            "SELECT {} FROM users{where_sql} ORDER BY {} LIMIT ${} OFFSET ${}",
            user_cols!(),
            order_by(&q.sort),
            n + 1,
            n + 2
        );
        let (limit, offset) = (i64::from(paging.limit), paging.offset());
        self.call(|s| {
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                texts.iter().map(|t| t as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
            s.begin("ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
            let total: i64 = s.query_one(&count_sql, &params)?.try_get(0)?;
            params.push(&limit);
            params.push(&offset);
            let items = s.query(&page_sql, &params)?.iter().map(user_from_row).collect::<Result<Vec<_>, _>>()?;
            s.commit()?;
            Ok(paging.finish(items, total))
        })
    }

    /// See `Store::update_user`: the row locked, then changed, in one transaction; the token
    /// generation moves on in the `UPDATE` itself (its right-hand sides see the row as it was).
    pub(crate) fn update_user(&self, id: i64, c: &UserChanges) -> Result<Option<Updated>, StoreError> {
        self.call(|s| {
            s.begin("")?;
            // Returning without COMMIT rolls back (nothing was written).
            let Some(row) = s.query_opt("SELECT token_gen FROM users WHERE id = $1 FOR UPDATE", &[&id])? else {
                return Ok(None);
            };
            let before: i64 = row.try_get(0)?;
            let sql = concat!(
                "UPDATE users SET name = COALESCE($1, name), email = COALESCE($2, email), ",
                "age = CASE WHEN $3 THEN $4 ELSE age END, role = COALESCE($5, role), ",
                "password_hash = COALESCE($7, password_hash), ",
                "token_gen = token_gen + (COALESCE($5, role) <> role OR $7::text IS NOT NULL)::int, updated_at = ",
                pg_now!(),
                " WHERE id = $6 RETURNING ",
                user_cols!()
            );
            let role = c.role.map(Role::as_str);
            let params: &Params<'_> =
                &[&c.name, &c.email, &c.age.is_some(), &c.age.flatten(), &role, &id, &c.password_hash];
            let user = user_from_row(&s.query_one(sql, params)?)?;
            s.commit()?;
            Ok(Some(Updated { revoked: user.token_gen != before, user }))
        })
    }

    /// See `Store::delete_user`: what the user owns and their tokens go with it (`ON DELETE
    /// CASCADE`).
    pub(crate) fn delete_user(&self, id: i64) -> Result<bool, StoreError> {
        self.call(|s| Ok(s.execute("DELETE FROM users WHERE id = $1", &[&id])? > 0))
    }
}

/// Column `i` as a [`Role`].
fn role(row: &Row, i: usize) -> Result<Role, Fail> {
    let text: &str = row.try_get(i)?;
    Role::parse(text).ok_or_else(|| Fail::Mapping(format!("unknown role {text:?}")))
}

/// Map a row selected with `user_cols!()` (columns 0..=7).
fn user_from_row(row: &Row) -> Result<User, Fail> {
    Ok(User {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        email: row.try_get(2)?,
        age: row.try_get(3)?,
        role: role(row, 4)?,
        created_at: row.try_get(5)?,
        updated_at: row.try_get(6)?,
        token_gen: row.try_get(7)?,
    })
}

/// `ORDER BY` terms giving SQLite's order: each key once, then `id` as the tie-breaker.
fn order_by(sort: &[(UserSort, bool)]) -> String {
    let mut seen: Vec<UserSort> = Vec::with_capacity(sort.len() + 1);
    let mut terms: Vec<&str> = Vec::with_capacity(sort.len() + 1);
    for &(key, descending) in sort {
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        terms.push(match (key, descending) {
            (UserSort::Id, false) => "id ASC",
            (UserSort::Id, true) => "id DESC",
            (UserSort::Name, false) => r#"name COLLATE "C" ASC"#,
            (UserSort::Name, true) => r#"name COLLATE "C" DESC"#,
            (UserSort::Email, false) => r#"lower(email) COLLATE "C" ASC"#,
            (UserSort::Email, true) => r#"lower(email) COLLATE "C" DESC"#,
            (UserSort::Age, false) => "age ASC NULLS FIRST",
            (UserSort::Age, true) => "age DESC NULLS LAST",
            (UserSort::CreatedAt, false) => r#"created_at COLLATE "C" ASC"#,
            (UserSort::CreatedAt, true) => r#"created_at COLLATE "C" DESC"#,
        });
    }
    if !seen.contains(&UserSort::Id) {
        terms.push("id ASC");
    }
    terms.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_by_matches_sqlite_semantics() {
        assert_eq!(order_by(&[]), "id ASC");
        assert_eq!(
            order_by(&[(UserSort::Age, true), (UserSort::Name, false), (UserSort::Age, false)]),
            r#"age DESC NULLS LAST, name COLLATE "C" ASC, id ASC"#
        );
        assert_eq!(
            order_by(&[(UserSort::Email, false), (UserSort::Id, true)]),
            r#"lower(email) COLLATE "C" ASC, id DESC"#
        );
        assert_eq!(order_by(&[(UserSort::Age, false)]), "age ASC NULLS FIRST, id ASC");
    }
}
