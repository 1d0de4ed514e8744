//! The record calls on SQLite: each write in one `BEGIN IMMEDIATE` transaction with its
//! checks (parent, refs, the caller's guard) and its change event, so a refused or failed
//! write stores nothing. SQL comes from [`super::sql`].

use rusqlite::types::Value;
use rusqlite::{params_from_iter, OptionalExtension, Row, TransactionBehavior};

use super::sql::{self, Dialect};
use super::{refs, Change, Guarded, ListQuery, Refused, Scope, Viewer};
use crate::resources::record::{change_json, Action, Record};
use crate::resources::value::Cell;
use crate::resources::{Kind, Resource};
use crate::store::sqlite::Sqlite;
use crate::store::{Page, Paging, StoreError};

const D: Dialect = Dialect::Sqlite;

/// Store a change event in the notifications' id sequence: resource, action, record id, owner,
/// data (placeholders 1–5).
const INSERT_CHANGE: &str = concat!(
    "INSERT INTO notifications (title, body, created_at, kind, resource, action, record_id, owner_id, data) ",
    "VALUES ('', '', ",
    now_sql!(),
    ", 'change', ?1, ?2, ?3, ?4, ?5) RETURNING id"
);

/// A cell as an SQLite value.
pub(crate) fn value(c: &Cell) -> Value {
    match c {
        Cell::Null => Value::Null,
        Cell::Int(n) => Value::Integer(*n),
        Cell::Num(n) => Value::Real(*n),
        Cell::Bool(b) => Value::Integer(i64::from(*b)),
        Cell::Text(s) => Value::Text(s.clone()),
    }
}

/// The record in a row selected with `sql::columns(res)`.
fn record(res: &Resource, row: &Row<'_>) -> rusqlite::Result<Record> {
    let mut at = 2;
    let parent_id = if res.nested() {
        at += 1;
        row.get::<_, Option<i64>>(2)?
    } else {
        None
    };
    let mut cells = Vec::with_capacity(res.fields.len());
    for f in &res.fields {
        cells.push(match f.kind {
            Kind::Integer | Kind::Ref => row.get::<_, Option<i64>>(at)?.map_or(Cell::Null, Cell::Int),
            Kind::Number => row.get::<_, Option<f64>>(at)?.map_or(Cell::Null, Cell::Num),
            Kind::Boolean => row.get::<_, Option<i64>>(at)?.map_or(Cell::Null, |b| Cell::Bool(b != 0)),
            _ => row.get::<_, Option<String>>(at)?.map_or(Cell::Null, Cell::Text),
        });
        at += 1;
    }
    Ok(Record {
        id: row.get(0)?,
        owner_id: row.get(1)?,
        parent_id,
        cells,
        created_at: row.get(at)?,
        updated_at: row.get(at + 1)?,
    })
}

/// A unique index's failure as `Duplicate(field)`; other errors as the store's.
fn write_error(res: &'static Resource, e: rusqlite::Error) -> StoreError {
    if let rusqlite::Error::SqliteFailure(err, Some(msg)) = &e {
        if err.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE {
            // "UNIQUE constraint failed: articles.slug"
            let columns = msg.rsplit(": ").next().unwrap_or_default();
            let named = |f: &&crate::resources::Field| {
                columns.split(", ").any(|c| c.split_once('.') == Some((res.name.as_str(), f.name.as_str())))
            };
            if let Some(f) = res.fields.iter().find(named) {
                return StoreError::Duplicate(f.name.as_str());
            }
        }
    }
    StoreError::from(e)
}

type Tx<'c> = rusqlite::Transaction<'c>;

/// The first `ref` of `cells` that names no record `viewer` may read.
fn bad_ref(tx: &Tx<'_>, scope: Scope, viewer: Viewer, cells: &[Cell]) -> Result<Option<&'static str>, StoreError> {
    for (field, id, check) in refs(scope, viewer, cells) {
        let Some((table, owner)) = check else { return Ok(Some(field)) };
        let sql = sql::exists(D, table, owner.is_some());
        let found = match owner {
            Some(o) => tx.prepare_cached(&sql)?.query_row([id, o], |_| Ok(())).optional()?,
            None => tx.prepare_cached(&sql)?.query_row([id], |_| Ok(())).optional()?,
        };
        if found.is_none() {
            return Ok(Some(field));
        }
    }
    Ok(None)
}

/// Store the change event of `action` on `rec` when the resource has events.
fn change(tx: &Tx<'_>, res: &Resource, action: Action, rec: &Record) -> Result<Option<Change>, StoreError> {
    if !res.events {
        return Ok(None);
    }
    let shown = (action != Action::Delete).then_some(rec);
    let data = change_json(res, action, rec.id, shown);
    let text = String::from_utf8_lossy(&data).into_owned();
    let id: i64 = tx
        .prepare_cached(INSERT_CHANGE)?
        .query_row(rusqlite::params![res.name, action.as_str(), rec.id, rec.owner_id, text], |r| r.get(0))?;
    Ok(Some(Change { id, resource: res.name.clone(), action, record_id: rec.id, owner_id: rec.owner_id, data }))
}

impl Sqlite {
    /// See `Store::record_create`.
    pub(crate) fn record_create(
        &self,
        scope: Scope,
        viewer: Viewer,
        owner_id: i64,
        parent_id: Option<i64>,
        cells: Vec<Cell>,
    ) -> Guarded<(Record, Option<Change>), std::convert::Infallible> {
        let res = scope.res;
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let (Some(parent), Some(pid)) = (res.parent.as_deref(), parent_id) {
            let found = tx.prepare_cached(&sql::exists(D, parent, false))?.query_row([pid], |_| Ok(())).optional()?;
            if found.is_none() {
                return Ok(Err(Refused::Parent));
            }
        }
        if let Some(field) = bad_ref(&tx, scope, viewer, &cells)? {
            return Ok(Err(Refused::Ref(field)));
        }
        let mut args: Vec<Value> = vec![Value::Integer(owner_id)];
        if res.nested() {
            args.push(parent_id.map_or(Value::Null, Value::Integer));
        }
        args.extend(cells.iter().map(value));
        let rec = tx
            .prepare_cached(&sql::insert(D, res))?
            .query_row(params_from_iter(&args), |r| record(res, r))
            .map_err(|e| write_error(res, e))?;
        let ch = change(&tx, res, Action::Create, &rec)?;
        tx.commit()?;
        Ok(Ok((rec, ch)))
    }

    /// See `Store::record_get`.
    pub(crate) fn record_get(&self, scope: Scope, id: i64) -> Result<Option<Record>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(&sql::get(D, scope.res, false))?;
        Ok(stmt.query_row([id], |r| record(scope.res, r)).optional()?)
    }

    /// See `Store::record_list`.
    pub(crate) fn record_list(&self, scope: Scope, q: &ListQuery) -> Result<Page<Record>, StoreError> {
        let res = scope.res;
        let paging = Paging::new(q.page, q.limit);
        let (where_sql, n) = sql::list_where(D, res, q);
        let mut args: Vec<Value> = Vec::new();
        args.extend(q.owner.map(Value::Integer));
        args.extend(q.parent.map(Value::Integer));
        args.extend(q.filters.iter().map(|f| value(&f.value)));
        if let Some(text) = &q.q {
            let pattern = sql::contains_pattern(text);
            args.extend(sql::searched(res).map(|_| Value::Text(pattern.clone())));
        }
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let table = sql::ident(&res.name);
        let total: i64 = tx
            .prepare_cached(&format!("SELECT COUNT(*) FROM {table}{where_sql}"))?
            .query_row(params_from_iter(&args), |r| r.get(0))?;
        let sql = format!(
            "SELECT {} FROM {table}{where_sql} ORDER BY {} LIMIT {} OFFSET {}",
            sql::columns(res),
            sql::order_by(&q.sort),
            D.ph(n + 1),
            D.ph(n + 2)
        );
        args.push(Value::Integer(i64::from(paging.limit)));
        args.push(Value::Integer(paging.offset()));
        let items = tx
            .prepare_cached(&sql)?
            .query_map(params_from_iter(&args), |r| record(res, r))?
            .collect::<Result<_, _>>()?;
        tx.commit()?;
        Ok(paging.finish(items, total))
    }

    /// See `Store::record_update`.
    pub(crate) fn record_update<E>(
        &self,
        scope: Scope,
        viewer: Viewer,
        id: i64,
        guard: impl FnOnce(&Record) -> Result<Vec<Cell>, E>,
    ) -> Guarded<Option<(Record, Option<Change>)>, E> {
        let res = scope.res;
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let Some(current) =
            tx.prepare_cached(&sql::get(D, res, true))?.query_row([id], |r| record(res, r)).optional()?
        else {
            return Ok(Ok(None));
        };
        let cells = match guard(&current) {
            Ok(c) => c,
            Err(e) => return Ok(Err(Refused::Guard(e))),
        };
        if let Some(field) = bad_ref(&tx, scope, viewer, &cells)? {
            return Ok(Err(Refused::Ref(field)));
        }
        let mut args: Vec<Value> = cells.iter().map(value).collect();
        args.push(Value::Integer(id));
        let rec = tx
            .prepare_cached(&sql::update(D, res))?
            .query_row(params_from_iter(&args), |r| record(res, r))
            .map_err(|e| write_error(res, e))?;
        let ch = change(&tx, res, Action::Update, &rec)?;
        tx.commit()?;
        Ok(Ok(Some((rec, ch))))
    }

    /// See `Store::record_delete`.
    pub(crate) fn record_delete<E>(
        &self,
        scope: Scope,
        id: i64,
        guard: impl FnOnce(&Record) -> Result<(), E>,
    ) -> Guarded<Option<(Record, Option<Change>)>, E> {
        let res = scope.res;
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let Some(current) =
            tx.prepare_cached(&sql::get(D, res, true))?.query_row([id], |r| record(res, r)).optional()?
        else {
            return Ok(Ok(None));
        };
        if let Err(e) = guard(&current) {
            return Ok(Err(Refused::Guard(e)));
        }
        tx.prepare_cached(&sql::delete(D, res))?.execute([id])?;
        let ch = change(&tx, res, Action::Delete, &current)?;
        tx.commit()?;
        Ok(Ok(Some((current, ch))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Field;

    #[test]
    fn a_unique_violation_names_exactly_its_field() {
        let mut res = crate::resources::builtin::posts();
        res.name = "notes".into();
        for name in ["slug", "slugLong"] {
            let mut f = Field::new(name, Kind::String);
            f.unique = true;
            res.fields.push(f);
        }
        let res: &'static Resource = Box::leak(Box::new(res));
        let failure = |msg: &str| {
            let code = rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE);
            rusqlite::Error::SqliteFailure(code, Some(msg.into()))
        };
        let e = write_error(res, failure("UNIQUE constraint failed: notes.slugLong"));
        assert!(matches!(e, StoreError::Duplicate("slugLong")), "{e:?}");
        let e = write_error(res, failure("UNIQUE constraint failed: notes.slug"));
        assert!(matches!(e, StoreError::Duplicate("slug")), "{e:?}");
        let e = write_error(res, failure("UNIQUE constraint failed: other.slug"));
        assert!(matches!(e, StoreError::Sql(_)), "{e:?}");
    }
}
