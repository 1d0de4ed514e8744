//! Declared resources' schema on PostgreSQL: the plan of `store/schema` read against
//! `forkd_resources`, applied in one transaction under the migration lock, so two hosts
//! starting with the same declarations apply them once and agree on what is recorded. One
//! connection, closed on return; never on a request.

use super::resources::arg;
use super::{migrate, Fail, Pg, Session};
use crate::config::DatabaseUrl;
use crate::resources::{Registry, Resource};
use crate::store::records::sql::Dialect;
use crate::store::schema::{baseline, ddl, decode, diff, encode, Op, Plan};
use crate::store::StoreError;

impl Pg {
    /// See `Store::plan_resources`.
    pub(crate) fn plan_resources(url: &DatabaseUrl, registry: &Registry) -> Result<Plan, StoreError> {
        Pg::once(url, |s| Ok(diff(&recorded(s)?, registry).0))
    }

    /// See `Store::migrate_resources`.
    pub(crate) fn migrate_resources(
        url: &DatabaseUrl,
        registry: &Registry,
        destructive: bool,
    ) -> Result<Plan, StoreError> {
        let plan = Pg::once(url, |s| migrate::locked(s, |s| apply(s, registry, destructive)))?;
        if plan.refused().next().is_none() {
            for step in &plan.steps {
                log::info!("store: applied {step}");
            }
        }
        Ok(plan)
    }
}

fn apply(s: &mut Session<'_>, registry: &Registry, destructive: bool) -> Result<Plan, Fail> {
    s.begin("")?;
    let (mut plan, work) = diff(&recorded(s)?, registry);
    let refuse = !destructive && plan.destructive().next().is_some();
    plan.settle(refuse);
    if refuse || (work.ops.is_empty() && work.record.is_empty() && work.forget.is_empty()) {
        s.commit()?;
        return Ok(plan);
    }
    for op in &work.ops {
        for sql in ddl::statements(Dialect::Pg, op) {
            match op {
                Op::Fill(_, field, cell) => s.execute(&sql, &[&*arg(field.kind, cell)])?,
                _ => {
                    s.batch(&sql)?;
                    0
                }
            };
        }
    }
    for res in &work.record {
        s.execute(
            concat!(
                "INSERT INTO forkd_resources (name, declaration, applied_at) VALUES ($1, $2, ",
                super::pg_now!(),
                ") ON CONFLICT (name) DO UPDATE SET declaration = excluded.declaration, ",
                "applied_at = excluded.applied_at"
            ),
            &[&res.name, &encode(res)],
        )?;
    }
    for name in &work.forget {
        s.execute("DELETE FROM forkd_resources WHERE name = $1", &[name])?;
    }
    s.commit()?;
    Ok(plan)
}

/// The declarations `forkd_resources` holds (as the schema migrations will leave them while
/// the table is not there yet).
fn recorded(s: &mut Session<'_>) -> Result<Vec<Resource>, Fail> {
    let rows = match s.query("SELECT name, declaration FROM forkd_resources ORDER BY name", &[]) {
        Ok(rows) => rows,
        Err(Fail::Db(e)) if e.code().is_some_and(|c| c.code() == "42P01") => {
            return baseline().map_err(Fail::Mapping);
        }
        Err(e) => return Err(e),
    };
    rows.iter()
        .map(|r| {
            let (name, json): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            decode(&name, &json).map_err(Fail::Mapping)
        })
        .collect()
}
