//! Declared resources' schema on SQLite: plan against the recorded declarations, and apply a
//! plan in one `BEGIN IMMEDIATE` transaction together with the declarations it records, so
//! a process starting at the same time sees all of it or none. One connection, closed on
//! return; run by the supervisor before fork and by the command line, never on a request.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{baseline, ddl, decode, diff, encode, Op, Plan};
use crate::resources::{Registry, Resource};
use crate::store::records::sql::Dialect;
use crate::store::sqlite::open_connection;
use crate::store::StoreError;

/// What `registry` changes in the database at `path`; a file that does not exist yet is
/// planned as the schema migrations will leave it. Changes nothing.
pub(crate) fn plan(path: &Path, registry: &Registry) -> Result<Plan, StoreError> {
    let recorded = if path.exists() { recorded(&open_connection(path, false)?)? } else { baseline_or_err()? };
    Ok(diff(&recorded, registry).0)
}

/// Apply the plan to `registry` (run `Store::migrate` first): all of it, or, when it has a
/// destructive step and `destructive` is false, nothing (the steps say so).
pub(crate) fn migrate(path: &Path, registry: &Registry, destructive: bool) -> Result<Plan, StoreError> {
    let mut conn = open_connection(path, false)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (mut plan, work) = diff(&recorded(&tx)?, registry);
    let refuse = !destructive && plan.destructive().next().is_some();
    plan.settle(refuse);
    if refuse || (work.ops.is_empty() && work.record.is_empty() && work.forget.is_empty()) {
        return Ok(plan);
    }
    for op in &work.ops {
        for sql in ddl::statements(Dialect::Sqlite, op) {
            match op {
                Op::Fill(_, _, cell) => tx.execute(&sql, [crate::store::records::sqlite::value(cell)])?,
                _ => tx.execute(&sql, [])?,
            };
        }
    }
    for res in &work.record {
        tx.execute(
            concat!(
                "INSERT INTO forkd_resources (name, declaration, applied_at) VALUES (?1, ?2, ",
                now_sql!(),
                ") ON CONFLICT (name) DO UPDATE SET declaration = excluded.declaration, ",
                "applied_at = excluded.applied_at"
            ),
            params![res.name, encode(res)],
        )?;
    }
    for name in &work.forget {
        tx.execute("DELETE FROM forkd_resources WHERE name = ?1", [name])?;
    }
    tx.commit()?;
    for step in &plan.steps {
        log::info!("store: applied {step}");
    }
    Ok(plan)
}

/// The declarations `forkd_resources` holds (as migration 4 would leave them when the table
/// is not there yet).
fn recorded(conn: &Connection) -> Result<Vec<Resource>, StoreError> {
    let table: Option<i64> = conn
        .query_row("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'forkd_resources'", [], |r| r.get(0))
        .optional()?;
    if table.is_none() {
        return baseline_or_err();
    }
    let mut stmt = conn.prepare("SELECT name, declaration FROM forkd_resources ORDER BY name")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (name, json) = row?;
        out.push(decode(&name, &json).map_err(StoreError::Sql)?);
    }
    Ok(out)
}

fn baseline_or_err() -> Result<Vec<Resource>, StoreError> {
    baseline().map_err(StoreError::Sql)
}
