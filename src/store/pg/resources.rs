//! The record calls on PostgreSQL: the SQL of `store/records/sql.rs` in `$n` dialect, each
//! write in one transaction that locks the record it changes (`FOR UPDATE`) and stores its
//! change event under the notifications' advisory lock (ids commit in order, see
//! `records.rs`). A unique index's violation names its field (`<table>_<field>_key`).

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{Fail, Pg, Session};
use crate::resources::record::{change_json, Action, Record};
use crate::resources::value::Cell;
use crate::resources::{Kind, Resource};
use crate::store::records::sql::{self, Dialect};
use crate::store::records::{refs, Change, Guarded, ListQuery, Refused, Scope, Viewer};
use crate::store::{Page, Paging, StoreError};

const D: Dialect = Dialect::Pg;

/// A change event in the notifications' id sequence, the id drawn under the lock.
const INSERT_CHANGE: &str = concat!(
    "INSERT INTO notifications (title, body, created_at, kind, resource, action, record_id, owner_id, data) ",
    "SELECT '', '', ",
    super::pg_now!(),
    ", 'change', $1::text, $2::text, $3::bigint, $4::bigint, $5::text ",
    "FROM (SELECT pg_advisory_xact_lock(474316302694)) AS serial RETURNING id"
);

pub(super) type Arg = Box<dyn ToSql + Sync + Send>;

/// A cell as a parameter of a column of `kind` (a null typed as the column).
pub(super) fn arg(kind: Kind, c: &Cell) -> Arg {
    match (c, kind) {
        (Cell::Int(n), _) => Box::new(*n),
        (Cell::Num(n), _) => Box::new(*n),
        (Cell::Bool(b), _) => Box::new(*b),
        (Cell::Text(s), _) => Box::new(s.clone()),
        (Cell::Null, Kind::Integer | Kind::Ref) => Box::new(None::<i64>),
        (Cell::Null, Kind::Number) => Box::new(None::<f64>),
        (Cell::Null, Kind::Boolean) => Box::new(None::<bool>),
        (Cell::Null, _) => Box::new(None::<String>),
    }
}

fn refs_of(args: &[Arg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| &**a as &(dyn ToSql + Sync)).collect()
}

/// The record in a row selected with `sql::columns(res)`.
fn record(res: &Resource, row: &Row) -> Result<Record, Fail> {
    let mut at = 2;
    let parent_id = if res.nested() {
        at += 1;
        row.try_get::<_, Option<i64>>(2)?
    } else {
        None
    };
    let mut cells = Vec::with_capacity(res.fields.len());
    for f in &res.fields {
        cells.push(match f.kind {
            Kind::Integer | Kind::Ref => row.try_get::<_, Option<i64>>(at)?.map_or(Cell::Null, Cell::Int),
            Kind::Number => row.try_get::<_, Option<f64>>(at)?.map_or(Cell::Null, Cell::Num),
            Kind::Boolean => row.try_get::<_, Option<bool>>(at)?.map_or(Cell::Null, Cell::Bool),
            _ => row.try_get::<_, Option<String>>(at)?.map_or(Cell::Null, Cell::Text),
        });
        at += 1;
    }
    Ok(Record {
        id: row.try_get(0)?,
        owner_id: row.try_get(1)?,
        parent_id,
        cells,
        created_at: row.try_get(at)?,
        updated_at: row.try_get(at + 1)?,
    })
}

/// A unique violation of one of `res`'s indexes as `Fail::Unique(field)`.
fn write_fail(res: &'static Resource, f: Fail) -> Fail {
    let name = f.unique_constraint().map(str::to_owned);
    match name.and_then(|c| res.fields.iter().find(|fl| c == format!("{}_{}_key", res.name, fl.name))) {
        Some(field) => Fail::Unique(field.name.as_str()),
        None => f,
    }
}

/// The first `ref` of `cells` that names no record `viewer` may read.
fn bad_ref(s: &mut Session<'_>, scope: Scope, viewer: Viewer, cells: &[Cell]) -> Result<Option<&'static str>, Fail> {
    for (field, id, check) in refs(scope, viewer, cells) {
        let Some((table, owner)) = check else { return Ok(Some(field)) };
        let found = match owner {
            Some(o) => s.query_opt(&sql::exists(D, table, true), &[&id, &o])?,
            None => s.query_opt(&sql::exists(D, table, false), &[&id])?,
        };
        if found.is_none() {
            return Ok(Some(field));
        }
    }
    Ok(None)
}

/// Store the change event of `action` on `rec` when the resource has events.
fn change(s: &mut Session<'_>, res: &Resource, action: Action, rec: &Record) -> Result<Option<Change>, Fail> {
    if !res.events {
        return Ok(None);
    }
    let data = change_json(res, action, rec.id, (action != Action::Delete).then_some(rec));
    let text = String::from_utf8_lossy(&data).into_owned();
    let row = s.query_one(INSERT_CHANGE, &[&res.name, &action.as_str(), &rec.id, &rec.owner_id, &text])?;
    Ok(Some(Change {
        id: row.try_get(0)?,
        resource: res.name.clone(),
        action,
        record_id: rec.id,
        owner_id: rec.owner_id,
        data,
    }))
}

impl Pg {
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
        self.call(|s| {
            s.begin("")?;
            if let (Some(parent), Some(pid)) = (res.parent.as_deref(), parent_id) {
                // Locked: a parent deleted meanwhile cannot take this child with it unseen.
                let sql = format!("SELECT 1 FROM {} WHERE id = $1 FOR SHARE", sql::ident(parent));
                if s.query_opt(&sql, &[&pid])?.is_none() {
                    return Ok(Err(Refused::Parent));
                }
            }
            if let Some(field) = bad_ref(s, scope, viewer, &cells)? {
                return Ok(Err(Refused::Ref(field)));
            }
            let mut args: Vec<Arg> = vec![Box::new(owner_id)];
            if res.nested() {
                args.push(Box::new(parent_id));
            }
            args.extend(res.fields.iter().zip(&cells).map(|(f, c)| arg(f.kind, c)));
            let row = s.query_one(&sql::insert(D, res), &refs_of(&args)).map_err(|f| write_fail(res, f))?;
            let rec = record(res, &row)?;
            let ch = change(s, res, Action::Create, &rec)?;
            s.commit()?;
            Ok(Ok((rec, ch)))
        })
    }

    /// See `Store::record_get`.
    pub(crate) fn record_get(&self, scope: Scope, id: i64) -> Result<Option<Record>, StoreError> {
        self.read(|s| s.query_opt(&sql::get(D, scope.res, false), &[&id])?.map(|r| record(scope.res, &r)).transpose())
    }

    /// See `Store::record_list`: the count and the page in one read-only snapshot.
    pub(crate) fn record_list(&self, scope: Scope, q: &ListQuery) -> Result<Page<Record>, StoreError> {
        let res = scope.res;
        let paging = Paging::new(q.page, q.limit);
        let (where_sql, n) = sql::list_where(D, res, q);
        let mut args: Vec<Arg> = Vec::new();
        args.extend(q.owner.map(|o| Box::new(o) as Arg));
        args.extend(q.parent.map(|p| Box::new(p) as Arg));
        for f in &q.filters {
            let kind = res.fields.get(f.field).map_or(Kind::Integer, |fl| fl.kind);
            args.push(arg(kind, &f.value));
        }
        if let Some(text) = &q.q {
            let pattern = sql::contains_pattern(text);
            args.extend(sql::searched(res).map(|_| Box::new(pattern.clone()) as Arg));
        }
        let table = sql::ident(&res.name);
        let count_sql = format!("SELECT count(*) FROM {table}{where_sql}");
        // The page size as a literal (a number from 1 to 100, not client text): a generic
        // plan that does not know it assumes a tenth of the rows and sorts them all, where
        // one that does walks the (filter, sort) index and stops after the page.
        let page_sql = format!(
            "SELECT {} FROM {table}{where_sql} ORDER BY {} LIMIT {} OFFSET {}",
            sql::columns(res),
            sql::order_by(&q.sort),
            paging.limit,
            D.ph(n + 1)
        );
        self.call(|s| {
            // Planned for the values at hand (in the same round trip as BEGIN): a generic plan
            // of the count, made once for any filter value, may pick a bitmap heap scan where
            // the value's statistics give an index-only one (ten times cheaper).
            s.begin("ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL plan_cache_mode = force_custom_plan")?;
            let total: i64 = s.query_one(&count_sql, &refs_of(&args))?.try_get(0)?;
            let mut page_args = refs_of(&args);
            let offset = paging.offset();
            page_args.push(&offset);
            let items =
                s.query(&page_sql, &page_args)?.iter().map(|r| record(res, r)).collect::<Result<Vec<_>, _>>()?;
            s.commit()?;
            Ok(paging.finish(items, total))
        })
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
        self.call(|s| {
            s.begin("")?;
            let Some(row) = s.query_opt(&sql::get(D, res, true), &[&id])? else { return Ok(Ok(None)) };
            let current = record(res, &row)?;
            let cells = match guard(&current) {
                Ok(c) => c,
                Err(e) => return Ok(Err(Refused::Guard(e))),
            };
            if let Some(field) = bad_ref(s, scope, viewer, &cells)? {
                return Ok(Err(Refused::Ref(field)));
            }
            let mut args: Vec<Arg> = res.fields.iter().zip(&cells).map(|(f, c)| arg(f.kind, c)).collect();
            args.push(Box::new(id));
            let row = s.query_one(&sql::update(D, res), &refs_of(&args)).map_err(|f| write_fail(res, f))?;
            let rec = record(res, &row)?;
            let ch = change(s, res, Action::Update, &rec)?;
            s.commit()?;
            Ok(Ok(Some((rec, ch))))
        })
    }

    /// See `Store::record_delete`.
    pub(crate) fn record_delete<E>(
        &self,
        scope: Scope,
        id: i64,
        guard: impl FnOnce(&Record) -> Result<(), E>,
    ) -> Guarded<Option<(Record, Option<Change>)>, E> {
        let res = scope.res;
        self.call(|s| {
            s.begin("")?;
            let Some(row) = s.query_opt(&sql::get(D, res, true), &[&id])? else { return Ok(Ok(None)) };
            let current = record(res, &row)?;
            if let Err(e) = guard(&current) {
                return Ok(Err(Refused::Guard(e)));
            }
            s.execute(&sql::delete(D, res), &[&id])?;
            let ch = change(s, res, Action::Delete, &current)?;
            s.commit()?;
            Ok(Ok(Some((current, ch))))
        })
    }
}
