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
    /// Create (`true`) or drop an index on a field: (field, unique).
    Index(String, bool, bool),
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
                    Action::Index(f.name.clone(), true, true),
                ));
            } else if !f.unique && o.unique {
                steps.push(step(
                    format!("{fat}: no longer unique (index dropped)"),
                    false,
                    Action::Index(f.name.clone(), true, false),
                ));
            }
            let (idx, oidx) = (f.sort || f.filter, o.sort || o.filter);
            if idx != oidx {
                steps.push(step(
                    format!(
                        "{fat}: {} (index {})",
                        if idx { "now sorted or filtered" } else { "no longer sorted or filtered" },
                        if idx { "created" } else { "dropped" }
                    ),
                    false,
                    Action::Index(f.name.clone(), false, idx),
                ));
            }
        }
        if steps.len() == before {
            steps.push(step(format!("{at}: rules or limits relaxed (recorded)"), false, Action::Record));
        }
    }
    for o in &old {
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
        Action::Index(f, unique, true) => vec![plain(index(name, f, *unique))],
        Action::Index(f, unique, false) => {
            vec![plain(format!("DROP INDEX IF EXISTS {}", index_name(name, f, *unique)))]
        }
    }
}

fn index_name(table: &str, field: &str, unique: bool) -> String {
    ident(&format!("{table}_{field}_{}", if unique { "key" } else { "idx" }))
}

fn index(table: &str, field: &str, unique: bool) -> String {
    let (u, cols) = if unique { ("UNIQUE ", ident(field)) } else { ("", format!("{}, id", ident(field))) };
    format!("CREATE {u}INDEX IF NOT EXISTS {} ON {} ({cols})", index_name(table, field, unique), ident(table))
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
    v.push((
        format!("CREATE INDEX IF NOT EXISTS {} ON {t} (owner_id, id)", ident(&format!("{}_owner_idx", r.name))),
        None,
    ));
    if r.nested() {
        v.push((
            format!("CREATE INDEX IF NOT EXISTS {} ON {t} (parent_id, id)", ident(&format!("{}_parent_idx", r.name))),
            None,
        ));
    }
    for f in &r.fields {
        if f.unique {
            v.push((index(&r.name, &f.name, true), None));
        }
        if f.sort || f.filter {
            v.push((index(&r.name, &f.name, false), None));
        }
    }
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
    if f.unique {
        v.push((index(table, &f.name, true), None));
    }
    if f.sort || f.filter {
        v.push((index(table, &f.name, false), None));
    }
    v
}

fn drop_column(table: &str, field: &str) -> Vec<Statement> {
    vec![
        (format!("DROP INDEX IF EXISTS {}", index_name(table, field, true)), None),
        (format!("DROP INDEX IF EXISTS {}", index_name(table, field, false)), None),
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
