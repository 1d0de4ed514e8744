//! The SQL of the record calls, built from a declaration for either dialect: column lists,
//! placeholders, `WHERE` and `ORDER BY` of a list. Identifiers come only from validated
//! declarations (resource names `^[a-z][a-z0-9_]*$`, field names `^[a-z][a-zA-Z0-9]*$`) and
//! are always double-quoted; every value is a placeholder. Nothing here runs SQL.

use std::fmt::Write as _;

use super::{ListQuery, Op};
use crate::resources::{Field, Kind, Resource, SortKey};

/// Which SQL dialect to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `?1` placeholders, `strftime` for now, booleans as 0/1.
    Sqlite,
    /// `$1` placeholders, `to_char(now() …)`, real booleans.
    Pg,
}

impl Dialect {
    /// Placeholder number `n` (from 1).
    pub(crate) fn ph(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Pg => format!("${n}"),
        }
    }

    /// "Now" as RFC 3339 UTC text with milliseconds.
    pub(crate) fn now(self) -> &'static str {
        match self {
            Dialect::Sqlite => now_sql!(),
            Dialect::Pg => crate::store::pg::pg_now!(),
        }
    }
}

/// `name` as a quoted identifier (names are validated: no quote can occur in one).
pub(crate) fn ident(name: &str) -> String {
    format!("\"{name}\"")
}

/// The columns a record is read from, in the order [`Record`](crate::resources::record::Record)
/// is built: `id, owner_id, [parent_id,] fields…, created_at, updated_at`.
pub(crate) fn columns(res: &Resource) -> String {
    let mut s = String::from("id, owner_id");
    if res.nested() {
        s.push_str(", parent_id");
    }
    for f in &res.fields {
        let _ = write!(s, ", {}", ident(&f.name));
    }
    s.push_str(", created_at, updated_at");
    s
}

/// `INSERT … RETURNING` of a record: placeholders owner, [parent,] the fields in order.
pub(crate) fn insert(d: Dialect, res: &Resource) -> String {
    let mut names = String::from("owner_id");
    let mut values = d.ph(1);
    let mut n = 1;
    if res.nested() {
        names.push_str(", parent_id");
        n += 1;
        let _ = write!(values, ", {}", d.ph(n));
    }
    for f in &res.fields {
        n += 1;
        let _ = write!(names, ", {}", ident(&f.name));
        let _ = write!(values, ", {}", d.ph(n));
    }
    format!(
        "INSERT INTO {} ({names}, created_at, updated_at) VALUES ({values}, {now}, {now}) RETURNING {}",
        ident(&res.name),
        columns(res),
        now = d.now()
    )
}

/// `SELECT` of one record by id (placeholder 1); `lock`: `FOR UPDATE` (PostgreSQL).
pub(crate) fn get(d: Dialect, res: &Resource, lock: bool) -> String {
    let lock = if lock && d == Dialect::Pg { " FOR UPDATE" } else { "" };
    format!("SELECT {} FROM {} WHERE id = {}{lock}", columns(res), ident(&res.name), d.ph(1))
}

/// `UPDATE … RETURNING` of every field (placeholders 1..=n) of record id (placeholder n+1).
pub(crate) fn update(d: Dialect, res: &Resource) -> String {
    let mut sets = String::new();
    for (i, f) in res.fields.iter().enumerate() {
        let _ = write!(sets, "{} = {}, ", ident(&f.name), d.ph(i + 1));
    }
    format!(
        "UPDATE {} SET {sets}updated_at = {} WHERE id = {} RETURNING {}",
        ident(&res.name),
        d.now(),
        d.ph(res.fields.len() + 1),
        columns(res)
    )
}

/// `DELETE` of record id (placeholder 1).
pub(crate) fn delete(d: Dialect, res: &Resource) -> String {
    format!("DELETE FROM {} WHERE id = {}", ident(&res.name), d.ph(1))
}

/// Whether a row of `table` (a resource or `users`) with id placeholder 1 exists, owned by
/// placeholder 2 when `owned`.
pub(crate) fn exists(d: Dialect, table: &str, owned: bool) -> String {
    let owner = if owned { format!(" AND owner_id = {}", d.ph(2)) } else { String::new() };
    format!("SELECT 1 FROM {} WHERE id = {}{owner}", ident(table), d.ph(1))
}

/// The `WHERE` clause of a list (empty or starting with ` WHERE`), numbering placeholders
/// from 1; the values to bind, in order, are produced by the caller from the same query in
/// the same order: owner, parent, each filter, then the `q` pattern once per search field.
pub(crate) fn list_where(d: Dialect, res: &Resource, q: &ListQuery) -> (String, usize) {
    let mut parts: Vec<String> = Vec::new();
    let mut n = 0;
    let mut next = || {
        n += 1;
        d.ph(n)
    };
    if q.owner.is_some() {
        parts.push(format!("owner_id = {}", next()));
    }
    if q.parent.is_some() {
        parts.push(format!("parent_id = {}", next()));
    }
    for f in &q.filters {
        let col = res.fields.get(f.field).map(|f| ident(&f.name)).unwrap_or_else(|| "id".into());
        let op = match f.op {
            Op::Eq => "=",
            Op::Gte => ">=",
            Op::Lte => "<=",
        };
        parts.push(format!("{col} {op} {}", next()));
    }
    if q.q.is_some() {
        let ors: Vec<String> =
            searched(res).map(|f| format!("lower({}) LIKE lower({}) ESCAPE '\\'", ident(&f.name), next())).collect();
        if !ors.is_empty() {
            parts.push(format!("({})", ors.join(" OR ")));
        }
    }
    let sql = if parts.is_empty() { String::new() } else { format!(" WHERE {}", parts.join(" AND ")) };
    (sql, n)
}

/// The fields `?q=` looks in.
pub(crate) fn searched(res: &Resource) -> impl Iterator<Item = &Field> {
    res.fields.iter().filter(|f| f.search && f.kind.searchable())
}

/// `ORDER BY` of a list: the keys, then `id` (in the last key's direction) unless a key.
pub(crate) fn order_by(sort: &[SortKey]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut has_id = false;
    for k in sort {
        let col = match k.key.as_str() {
            "id" => {
                has_id = true;
                "id".to_string()
            }
            "createdAt" => "created_at".into(),
            "updatedAt" => "updated_at".into(),
            name => ident(name),
        };
        parts.push(if k.desc { format!("{col} DESC") } else { col });
    }
    // The tie-break follows the last key's direction, so one index on (key, id) read in one
    // direction gives the whole order and a page stops after its rows.
    if !has_id {
        parts.push(if sort.last().is_some_and(|k| k.desc) { "id DESC".into() } else { "id".into() });
    }
    parts.join(", ")
}

/// A `LIKE` pattern for "contains `text`" with `%`, `_` and `\` escaped.
pub(crate) fn contains_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The SQL type of a field's column.
pub(crate) fn column_type(d: Dialect, kind: Kind) -> &'static str {
    match (d, kind) {
        (Dialect::Sqlite, Kind::Integer | Kind::Ref | Kind::Boolean) => "INTEGER",
        (Dialect::Sqlite, Kind::Number) => "REAL",
        (Dialect::Pg, Kind::Integer | Kind::Ref) => "BIGINT",
        (Dialect::Pg, Kind::Number) => "DOUBLE PRECISION",
        (Dialect::Pg, Kind::Boolean) => "BOOLEAN",
        _ => "TEXT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;
    use crate::store::records::Filter;

    #[test]
    fn the_statements_of_posts() {
        let posts = builtin::posts();
        assert_eq!(columns(&posts), r#"id, owner_id, parent_id, "title", "body", created_at, updated_at"#);
        assert!(insert(Dialect::Pg, &posts).starts_with(
            r#"INSERT INTO "posts" (owner_id, parent_id, "title", "body", created_at, updated_at) VALUES ($1, $2, $3, $4, "#
        ));
        assert!(update(Dialect::Sqlite, &posts).contains(r#"SET "title" = ?1, "body" = ?2, updated_at = "#));
        assert!(update(Dialect::Sqlite, &posts).contains("WHERE id = ?3 RETURNING"));
        let q = ListQuery {
            owner: Some(1),
            parent: Some(2),
            filters: vec![Filter { field: 0, op: Op::Gte, value: crate::resources::value::Cell::Int(1) }],
            ..ListQuery::default()
        };
        assert_eq!(
            list_where(Dialect::Pg, &posts, &q),
            (r#" WHERE owner_id = $1 AND parent_id = $2 AND "title" >= $3"#.into(), 3)
        );
        assert_eq!(order_by(&posts.default_sort), "id DESC");
        assert_eq!(
            order_by(&[SortKey { key: "createdAt".into(), desc: false }, SortKey { key: "title".into(), desc: true }]),
            r#"created_at, "title" DESC, id DESC"#
        );
        assert_eq!(contains_pattern("a%b_c\\"), "%a\\%b\\_c\\\\%");
    }
}
