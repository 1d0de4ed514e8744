//! The tables of declared resources: what the registry needs of the database, compared with
//! what was applied (the `forkd_resources` table: each resource's declaration as last
//! migrated, as JSON), as a [`Plan`] of steps, each additive or destructive and each one line
//! naming resource and field. Additive steps apply at start and on `SIGHUP`; destructive ones
//! only through `forkd migrate --apply`. Both dialects, one transaction per run (PostgreSQL
//! under the migration lock, so several hosts agree on what was applied).
//!
//! [`plan`] is pure: the backends read the recorded declarations, call it, and run the SQL
//! of the steps it returns. Identifiers come only from validated declarations, quoted.

use std::fmt;

use crate::resources::value::Cell;
use crate::resources::{Field, Kind, Registry, Resource};
use crate::store::records::sql::{column_type, ident, Dialect};

/// How far a schema run goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Only plan (`check-config`, `forkd migrate`).
    Plan,
    /// Apply when nothing is destructive (start, `SIGHUP`); else apply nothing.
    Additive,
    /// Apply every step (`forkd migrate --apply`).
    All,
}

impl Plan {
    /// Whether `mode` applies this plan.
    pub fn applies_in(&self, mode: Mode) -> bool {
        match mode {
            Mode::Plan => false,
            Mode::Additive => self.destructive().next().is_none(),
            Mode::All => true,
        }
    }
}

/// One change the database needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// One line naming resource and field, and what applying it does.
    pub line: String,
    /// Loses data or may refuse existing rows: applied only with `--apply`.
    pub destructive: bool,
    /// The resource whose declaration it records.
    pub resource: String,
    action: Action,
}

#[derive(Clone, Debug, PartialEq)]
enum Action {
    /// Create the table and its indexes.
    Create,
    /// Drop the table.
    Drop,
    /// Add the column (filling its default).
    AddColumn(Field),
    /// Drop the column and its indexes.
    DropColumn(String),
    /// Drop and add the column.
    Rebuild(Field),
    /// Drop these indexes (before columns change).
    DropIndexes(Vec<String>),
    /// Create these indexes (after columns change).
    CreateIndexes(Vec<Index>),
    /// Drop and create the table (a new parent).
    Recreate,
    /// Only the recorded declaration changes.
    Record,
}

/// What a schema run found, and what it applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// Whether the steps were applied (`false`: only planned, or refused).
    pub applied: bool,
}

impl Plan {
    /// The destructive steps.
    pub fn destructive(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.destructive)
    }

    /// Whether nothing is to be done.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.steps {
            writeln!(f, "{}", s.line)?;
        }
        Ok(())
    }
}

/// The steps from the recorded declarations (`(name, JSON)`) to `registry`. A recorded
/// declaration that does not parse is an error (a newer binary's).
pub fn plan(recorded: &[(String, String)], registry: &Registry) -> Result<Plan, String> {
    let mut old: Vec<Resource> = Vec::new();
    for (name, json) in recorded {
        old.push(serde_json::from_str(json).map_err(|e| format!("forkd_resources: the declaration of {name:?}: {e}"))?);
    }
    let mut steps = Vec::new();
    for r in registry.in_dependency_order() {
        let at = format!("resources.{}", r.name);
        let step = |line: String, destructive: bool, action: Action| Step {
            line,
            destructive,
            resource: r.name.clone(),
            action,
        };
        let Some(was) = old.iter().find(|o| o.name == r.name) else {
            steps.push(step(format!("{at}: new resource (table created)"), false, Action::Create));
            continue;
        };
        if was == r {
            continue;
        }
        if was.parent != r.parent {
            steps.push(step(
                format!(
                    "{at}.parent: {:?} → {:?} (destructive: the table is dropped and created again, its records lost)",
                    was.parent.as_deref().unwrap_or(""),
                    r.parent.as_deref().unwrap_or("")
                ),
                true,
                Action::Recreate,
            ));
            continue;
        }
        let before = steps.len();
        for f in &was.fields {
            if r.field(&f.name).is_none() {
                steps.push(step(
                    format!("{at}.fields.{}: removed (destructive: the column and its values are dropped)", f.name),
                    true,
                    Action::DropColumn(f.name.clone()),
                ));
            }
        }
        for f in &r.fields {
            let fat = format!("{at}.fields.{}", f.name);
            let Some(o) = was.field(&f.name) else {
                if f.required && f.default.is_none() {
                    steps.push(step(
                        format!("{fat}: new required field without a default (destructive: existing records get null)"),
                        true,
                        Action::AddColumn(f.clone()),
                    ));
                } else {
                    steps.push(step(format!("{fat}: new field (column added)"), false, Action::AddColumn(f.clone())));
                }
                continue;
            };
            if o.kind != f.kind || o.refers != f.refers {
                steps.push(step(
                    format!(
                        "{fat}: retyped {} → {} (destructive: the column is rebuilt, its values dropped)",
                        shown_kind(o),
                        shown_kind(f)
                    ),
                    true,
                    Action::Rebuild(f.clone()),
                ));
                continue;
            }
            let narrowed = f.min.is_some_and(|m| o.min.is_none_or(|om| m > om))
                || f.max.is_some_and(|m| o.max.is_none_or(|om| m < om));
            if narrowed {
                steps.push(step(
                    format!("{fat}: limits narrowed (destructive: existing values outside them are kept as they are)"),
                    true,
                    Action::Record,
                ));
            }
            if let Some(v) = o.values.iter().find(|v| !f.values.contains(v)) {
                steps.push(step(
                    format!("{fat}: enum value {v:?} removed (destructive: records holding it keep it)"),
                    true,
                    Action::Record,
                ));
            }
            if f.required && !o.required {
                steps.push(step(
                    format!("{fat}: now required (destructive: existing nulls are kept)"),
                    true,
                    Action::Record,
                ));
            }
            if f.unique && !o.unique {
                steps.push(step(
                    format!("{fat}: now unique (destructive: fails if two records share a value)"),
                    true,
                    Action::Record,
                ));
            }
        }
        let (old_idx, new_idx) = (indexes(was), indexes(r));
        // A rebuilt column loses its indexes with it: they are made again.
        let rebuilt: Vec<String> = steps[before..]
            .iter()
            .filter_map(|s| match &s.action {
                Action::Rebuild(f) => Some(ident(&f.name)),
                _ => None,
            })
            .collect();
        let touches = |i: &Index| rebuilt.iter().any(|c| i.columns.contains(c.as_str()));
        let gone: Vec<String> =
            old_idx.iter().filter(|i| !new_idx.contains(i) || touches(i)).map(|i| i.name.clone()).collect();
        let made: Vec<Index> = new_idx.iter().filter(|i| !old_idx.contains(i) || touches(i)).cloned().collect();
        if !gone.is_empty() {
            steps.insert(
                before,
                step(format!("{at}: indexes dropped: {}", gone.join(", ")), false, Action::DropIndexes(gone)),
            );
        }
        if !made.is_empty() {
            let names: Vec<&str> = made.iter().map(|i| i.name.as_str()).collect();
            steps.push(step(
                format!("{at}: indexes created: {}", names.join(", ")),
                false,
                Action::CreateIndexes(made),
            ));
        }
        if steps.len() == before {
            steps.push(step(format!("{at}: rules or limits relaxed (recorded)"), false, Action::Record));
        }
    }
    // Removed tables go children first: PostgreSQL drops no table another one refers to.
    let recorded = Registry { list: old, declared: Vec::new() };
    for o in recorded.in_dependency_order().into_iter().rev() {
        if registry.get(&o.name).is_none() {
            steps.push(Step {
                line: format!("resources.{}: removed (destructive: the table and its records are dropped)", o.name),
                destructive: true,
                resource: o.name.clone(),
                action: Action::Drop,
            });
        }
    }
    Ok(Plan { steps, applied: false })
}

fn shown_kind(f: &Field) -> String {
    match &f.refers {
        Some(to) => format!("ref({to})"),
        None => f.kind.name().to_string(),
    }
}

/// One statement with at most one parameter (a default filled into existing rows, with the
/// kind of its column).
pub(crate) type Statement = (String, Option<(Kind, Cell)>);

/// The statements of `step` in dialect `d` (`registry`: the declarations being applied).
pub(crate) fn statements(d: Dialect, step: &Step, registry: &Registry) -> Vec<Statement> {
    let name = &step.resource;
    let t = ident(name);
    let plain = |s: String| (s, None);
    match &step.action {
        Action::Record => Vec::new(),
        Action::Drop => vec![plain(format!("DROP TABLE IF EXISTS {t}"))],
        Action::Create => registry.get(name).map_or_else(Vec::new, |r| create(d, r)),
        Action::Recreate => {
            let mut v = vec![plain(format!("DROP TABLE IF EXISTS {t}"))];
            v.extend(registry.get(name).map_or_else(Vec::new, |r| create(d, r)));
            v
        }
        Action::AddColumn(f) => add_column(d, name, f),
        Action::DropColumn(f) => drop_column(name, f),
        Action::Rebuild(f) => {
            let mut v = drop_column(name, f.name.as_str());
            v.extend(add_column(d, name, f));
            v
        }
        Action::DropIndexes(names) => {
            names.iter().map(|n| plain(format!("DROP INDEX IF EXISTS {}", ident(n)))).collect()
        }
        Action::CreateIndexes(list) => list.iter().map(|x| plain(x.sql(name))).collect(),
    }
}

/// An index of a resource's table.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Index {
    /// `<table>_<field>_key` (unique), `<table>_<fields>_idx`.
    name: String,
    /// The columns, quoted, comma-separated.
    columns: String,
    unique: bool,
}

impl Index {
    fn sql(&self, table: &str) -> String {
        let u = if self.unique { "UNIQUE " } else { "" };
        format!("CREATE {u}INDEX IF NOT EXISTS {} ON {} ({})", ident(&self.name), ident(table), self.columns)
    }
}

/// Every index a resource's table has: owner and parent (with `id`, for their lists), a
/// unique index per unique field, `(field, id)` per sorted or filtered field, and
/// `(filter, sort, id)` per pair of a filtered field and a sorted one, so that a filtered,
/// sorted page walks one index and stops after the page, whatever the table's size.
pub(crate) fn indexes(r: &Resource) -> Vec<Index> {
    let t = &r.name;
    let idx = |name: String, columns: String, unique: bool| Index { name, columns, unique };
    let mut v = vec![idx(format!("{t}_owner_idx"), "owner_id, id".into(), false)];
    if r.nested() {
        v.push(idx(format!("{t}_parent_idx"), "parent_id, id".into(), false));
    }
    for f in &r.fields {
        if f.unique {
            v.push(idx(format!("{t}_{}_key", f.name), ident(&f.name), true));
        }
        if f.sort || f.filter {
            v.push(idx(format!("{t}_{}_idx", f.name), format!("{}, id", ident(&f.name)), false));
        }
    }
    for f in r.fields.iter().filter(|f| f.filter) {
        for s in r.fields.iter().filter(|s| s.sort && s.name != f.name) {
            v.push(idx(
                format!("{t}_{}_{}_idx", f.name, s.name),
                format!("{}, {}, id", ident(&f.name), ident(&s.name)),
                false,
            ));
        }
    }
    v
}

fn create(d: Dialect, r: &Resource) -> Vec<Statement> {
    let (id, int) = match d {
        Dialect::Sqlite => ("id INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER"),
        Dialect::Pg => ("id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "BIGINT"),
    };
    let t = ident(&r.name);
    let mut cols = vec![id.to_string(), format!("owner_id {int} NOT NULL REFERENCES users (id) ON DELETE CASCADE")];
    if let Some(p) = &r.parent {
        cols.push(format!("parent_id {int} NOT NULL REFERENCES {} (id) ON DELETE CASCADE", ident(p)));
    }
    for f in &r.fields {
        cols.push(format!("{} {}", ident(&f.name), column_type(d, f.kind)));
    }
    cols.push("created_at TEXT NOT NULL".into());
    cols.push("updated_at TEXT NOT NULL".into());
    let mut v: Vec<Statement> = vec![(format!("CREATE TABLE IF NOT EXISTS {t} ({})", cols.join(", ")), None)];
    v.extend(indexes(r).iter().map(|x| (x.sql(&r.name), None)));
    v
}

fn add_column(d: Dialect, table: &str, f: &Field) -> Vec<Statement> {
    let t = ident(table);
    let mut v = vec![(format!("ALTER TABLE {t} ADD COLUMN {} {}", ident(&f.name), column_type(d, f.kind)), None)];
    if let Some(def) = &f.default {
        if let Ok(cell) = crate::resources::value::check(f, def) {
            let ph = d.ph(1);
            v.push((format!("UPDATE {t} SET {} = {ph}", ident(&f.name)), Some((f.kind, cell))));
        }
    }
    v
}

fn drop_column(table: &str, field: &str) -> Vec<Statement> {
    vec![
        (format!("DROP INDEX IF EXISTS {}", ident(&format!("{table}_{field}_key"))), None),
        (format!("DROP INDEX IF EXISTS {}", ident(&format!("{table}_{field}_idx"))), None),
        (format!("ALTER TABLE {} DROP COLUMN {}", ident(table), ident(field)), None),
    ]
}

/// The upsert of a resource's applied declaration (placeholders: name, JSON).
pub(crate) fn record_sql(d: Dialect) -> String {
    format!(
        "INSERT INTO forkd_resources (name, declaration, applied_at) VALUES ({}, {}, {}) \
         ON CONFLICT (name) DO UPDATE SET declaration = excluded.declaration, applied_at = excluded.applied_at",
        d.ph(1),
        d.ph(2),
        d.now()
    )
}

/// The JSON recorded for `r`.
pub(crate) fn declaration(r: &Resource) -> String {
    serde_json::to_string(r).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::parse;

    fn reg(toml: &str) -> Registry {
        let table: toml::Table = toml.parse().expect("toml");
        let mut errors = Vec::new();
        let r = parse::registry(table.get("resources"), &mut errors);
        assert_eq!(errors, Vec::<String>::new());
        r
    }

    fn recorded(r: &Registry) -> Vec<(String, String)> {
        r.list.iter().map(|x| (x.name.clone(), declaration(x))).collect()
    }

    const BASE: &str = r#"
        [[resources]]
        name = "articles"
        [resources.fields.title]
        type = "string"
        max = 100
        [resources.fields.status]
        type = "enum"
        values = ["a", "b"]
    "#;

    #[test]
    fn additive_and_destructive_changes_are_told_apart() {
        let base = reg(BASE);
        assert!(plan(&recorded(&base), &base).expect("plan").is_empty());
        let fresh = plan(&[], &base).expect("plan");
        assert_eq!(
            fresh.steps.iter().map(|s| s.line.as_str()).collect::<Vec<_>>(),
            ["resources.posts: new resource (table created)", "resources.articles: new resource (table created)"]
        );
        let added = reg(&format!("{BASE}\n[resources.fields.note]\ntype = \"text\"\nmax = 10\n"));
        let p = plan(&recorded(&base), &added).expect("plan");
        assert_eq!(p.destructive().count(), 0, "{p}");
        assert!(p.steps[0].line.starts_with("resources.articles.fields.note: new field"));
        let relaxed = reg(&BASE.replace("max = 100", "max = 200").replace(r#"["a", "b"]"#, r#"["a", "b", "c"]"#));
        let p = plan(&recorded(&base), &relaxed).expect("plan");
        assert_eq!((p.steps.len(), p.destructive().count()), (1, 0), "{p}");
        let narrowed = reg(&BASE
            .replace("max = 100", "max = 50")
            .replace("\"enum\"", "\"string\"")
            .replace(r#"values = ["a", "b"]"#, ""));
        let p = plan(&recorded(&base), &narrowed).expect("plan");
        let lines: Vec<&str> = p.destructive().map(|s| s.line.as_str()).collect();
        assert_eq!(lines, [
            "resources.articles.fields.title: limits narrowed (destructive: existing values outside them are kept as they are)",
            "resources.articles.fields.status: retyped enum → string (destructive: the column is rebuilt, its values dropped)"
        ]);
        let removed = reg("");
        let p = plan(&recorded(&base), &removed).expect("plan");
        assert_eq!(
            p.destructive().map(|s| s.line.as_str()).collect::<Vec<_>>(),
            ["resources.articles: removed (destructive: the table and its records are dropped)"]
        );
    }

    #[test]
    fn a_new_table_has_its_indexes() {
        let r = reg(r#"
            [[resources]]
            name = "items"
            parent = "users"
            [resources.fields.slug]
            type = "string"
            unique = true
            [resources.fields.n]
            type = "integer"
            sort = true
        "#);
        let items = r.get("items").expect("items");
        let sqls: Vec<String> = create(Dialect::Pg, items).into_iter().map(|(s, _)| s).collect();
        assert!(sqls[0].starts_with(r#"CREATE TABLE IF NOT EXISTS "items" (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, owner_id BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE, parent_id BIGINT NOT NULL REFERENCES "users" (id)"#), "{}", sqls[0]);
        assert!(
            sqls.iter().any(|s| s == r#"CREATE UNIQUE INDEX IF NOT EXISTS "items_slug_key" ON "items" ("slug")"#),
            "{sqls:?}"
        );
        assert!(
            sqls.iter().any(|s| s == r#"CREATE INDEX IF NOT EXISTS "items_n_idx" ON "items" ("n", id)"#),
            "{sqls:?}"
        );
    }
}
