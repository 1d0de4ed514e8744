//! Schema changes of declared resources: what the tables must become for a registry, decided
//! by comparing it with the declarations the database recorded (`forkd_resources`, one JSON
//! [`Resource`] per table), as a [`Plan`] of one-line [`Step`]s, each additive or destructive,
//! and the schema operations ([`Op`]) that carry it out.
//!
//! The comparison is a pure function ([`diff`]) so that every rule is tested without a
//! database; `sqlite.rs` and `pg/schema.rs` read the recorded declarations, apply the
//! operations and record the new declarations in one transaction. Additive steps (a new
//! resource, a new optional field or one with a default, a relaxed limit, new enum values,
//! new `sort`/`filter`/`search`, access rules) apply at start and on `SIGHUP`; a destructive
//! one (a resource or field removed, a field retyped, a new required field without default, a
//! narrowed limit, an enum value removed, `unique` added, a parent changed) only when the
//! operator asks (`forkd migrate --apply`). While one is refused nothing is applied, so the
//! database never holds half of a declaration.
//!
//! Nothing here runs SQL or decides about processes: callers (the supervisor, the command
//! line) decide what a refusal means for them.

pub(crate) mod ddl;
pub(crate) mod sqlite;

use std::fmt;

use crate::resources::value::{self, Cell};
use crate::resources::{Field, Kind, Registry, Resource};

/// What became of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Only planned (`Store::plan_resources`).
    Planned,
    /// Applied and recorded.
    Applied,
    /// Destructive and not allowed: nothing of the plan was applied.
    Refused,
    /// Additive, but not applied because a destructive step was refused.
    Held,
}

/// One change a declaration makes to the schema, shown as one line naming resource and field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The resource.
    pub resource: String,
    /// The field, when the change is a field's.
    pub field: Option<String>,
    /// What changes (`"retyped string → integer"`).
    pub what: String,
    /// What applying it does to the stored data (`"the column is rebuilt, its values dropped"`).
    pub effect: String,
    /// Refused unless the operator applies destructive changes.
    pub destructive: bool,
    /// What became of it.
    pub state: State,
}

impl fmt::Display for Step {
    /// `resources.articles.fields.title: retyped string → integer (destructive: the column is
    /// rebuilt, its values dropped)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resources.{}", self.resource)?;
        if let Some(field) = &self.field {
            write!(f, ".fields.{field}")?;
        }
        write!(f, ": {}", self.what)?;
        match (self.destructive, self.effect.is_empty()) {
            (true, _) => write!(f, " (destructive: {})", self.effect),
            (false, false) => write!(f, " ({})", self.effect),
            (false, true) => Ok(()),
        }
    }
}

/// The schema changes a registry needs, in the order they apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every change, additive and destructive.
    pub steps: Vec<Step>,
}

impl Plan {
    /// No change at all.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The destructive steps.
    pub fn destructive(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.destructive)
    }

    /// The steps refused by the last `migrate_resources` (empty after a plan or a full apply).
    pub fn refused(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.state == State::Refused)
    }

    /// Mark every step: applied, or (when `refuse`) refused or held back.
    pub(crate) fn settle(&mut self, refuse: bool) {
        for s in &mut self.steps {
            s.state = match (refuse, s.destructive) {
                (false, _) => State::Applied,
                (true, true) => State::Refused,
                (true, false) => State::Held,
            };
        }
    }
}

/// An index of a resource's table: the name, the quoted column list, unique or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Index {
    /// `<table>_owner_id`, `<table>_parent_id`, `<table>_<field>_idx`, `<table>_<field>_key`
    /// (resource names have no field's capitals and field names no underscore, so two
    /// indexes never share a name; the `_key` one is how a unique violation names its field).
    pub(crate) name: String,
    /// The field it serves (`None`: owner or parent).
    pub(crate) field: Option<String>,
    /// The columns, quoted, comma-separated.
    pub(crate) columns: String,
    /// A unique index.
    pub(crate) unique: bool,
}

/// Every index the table of `res` has: owner and parent lists, each `sort`/`filter` field
/// with `id` (a page in its order, or filtered by it, walks the index), each `unique` field.
pub(crate) fn indexes(res: &Resource) -> Vec<Index> {
    let t = &res.name;
    let mut out =
        vec![Index { name: format!("{t}_owner_id"), field: None, columns: "owner_id, id".into(), unique: false }];
    if res.nested() {
        out.push(Index { name: format!("{t}_parent_id"), field: None, columns: "parent_id, id".into(), unique: false });
    }
    for f in &res.fields {
        if f.sort || f.filter {
            let (name, columns) = (format!("{t}_{}_idx", f.name), format!("\"{}\", id", f.name));
            out.push(Index { name, field: Some(f.name.clone()), columns, unique: false });
        }
        if f.unique {
            let (name, columns) = (format!("{t}_{}_key", f.name), format!("\"{}\"", f.name));
            out.push(Index { name, field: Some(f.name.clone()), columns, unique: true });
        }
    }
    out
}

/// One schema operation; `ddl.rs` writes it in either dialect.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    /// The table of a resource, with its indexes.
    CreateTable(Resource),
    /// A table, with its records (and, by the cascades, its children's).
    DropTable(String),
    /// A column for a field, null in every existing row.
    AddColumn(String, Field),
    /// Every existing row's value of a new column (its default).
    Fill(String, Field, Cell),
    /// A field's column, with its values.
    DropColumn(String, String),
    /// An index of a table.
    CreateIndex(String, Index),
    /// An index.
    DropIndex(Index),
}

/// What applying a plan does: the operations in order, the declarations to record, the
/// recorded names to forget.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Work {
    pub(crate) ops: Vec<Op>,
    pub(crate) record: Vec<Resource>,
    pub(crate) forget: Vec<String>,
}

/// The declarations a database without `forkd_resources` (or without a file yet) will record
/// once migrated: the built-in `posts` as its schema migration created it.
pub(crate) fn baseline() -> Result<Vec<Resource>, String> {
    Ok(vec![decode("posts", super::migrations::POSTS_DECLARATION)?])
}

/// A recorded declaration read back.
pub(crate) fn decode(name: &str, json: &str) -> Result<Resource, String> {
    serde_json::from_str(json).map_err(|e| format!("forkd_resources: the recorded declaration of {name}: {e}"))
}

/// A declaration as `forkd_resources` records it.
pub(crate) fn encode(res: &Resource) -> String {
    // A `Resource` holds strings, numbers, booleans and JSON values only: it always serialises.
    serde_json::to_string(res).unwrap_or_default()
}

/// The plan from the `recorded` declarations to `registry`, and the work that applies it.
pub(crate) fn diff(recorded: &[Resource], registry: &Registry) -> (Plan, Work) {
    let mut d = Diff::default();
    let old = Registry { list: recorded.to_vec(), declared: Vec::new() };
    // Tables rebuilt: a changed parent, and (transitively) whatever is nested under one.
    let mut rebuilt: Vec<&str> = Vec::new();
    for r in registry.in_dependency_order() {
        let Some(o) = old.get(&r.name) else { continue };
        if o.parent != r.parent {
            d.step(&r.name, None, format!("parent {} → {}", parent_name(o), parent_name(r)), true, REBUILT);
            rebuilt.push(&r.name);
        } else if let Some(p) = r.parent.as_deref().filter(|p| rebuilt.contains(p)) {
            d.step(&r.name, None, format!("rebuilt with its parent {p}"), true, REBUILT);
            rebuilt.push(&r.name);
        }
    }
    // Drops first, children before parents.
    for o in old.in_dependency_order().into_iter().rev() {
        if registry.get(&o.name).is_none() {
            d.step(&o.name, None, "removed".into(), true, "the table is dropped with its records");
            d.work.ops.push(Op::DropTable(o.name.clone()));
            d.work.forget.push(o.name.clone());
        } else if rebuilt.contains(&o.name.as_str()) {
            d.work.ops.push(Op::DropTable(o.name.clone()));
        }
    }
    for r in &registry.list {
        match old.get(&r.name) {
            Some(o) if !rebuilt.contains(&r.name.as_str()) => d.resource(o, r),
            Some(_) => {}
            None => d.step(&r.name, None, "new resource".into(), false, "table created"),
        }
    }
    // Creates last, parents before children.
    for r in registry.in_dependency_order() {
        if old.get(&r.name).is_none() || rebuilt.contains(&r.name.as_str()) {
            d.work.ops.push(Op::CreateTable(r.clone()));
        }
    }
    for r in &registry.list {
        if old.get(&r.name) != Some(r) {
            d.work.record.push(r.clone());
        }
    }
    (d.plan, d.work)
}

/// What a rebuilt table's step says it does.
const REBUILT: &str = "the table is rebuilt, its records dropped";

fn parent_name(r: &Resource) -> &str {
    r.parent.as_deref().unwrap_or("(top level)")
}

/// A value as the declaration writes it (`signed_in`, `-id`, `"draft"`).
fn word(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

fn bound(b: Option<f64>) -> String {
    b.map_or_else(|| "none".into(), value::show)
}

#[derive(Default)]
struct Diff {
    plan: Plan,
    work: Work,
}

impl Diff {
    fn step(&mut self, resource: &str, field: Option<&str>, what: String, destructive: bool, effect: &str) {
        self.plan.steps.push(Step {
            resource: resource.into(),
            field: field.map(Into::into),
            what,
            effect: effect.into(),
            destructive,
            state: State::Planned,
        });
    }

    /// A resource kept (same parent): its rules, its fields, its indexes.
    fn resource(&mut self, o: &Resource, r: &Resource) {
        let name = r.name.as_str();
        let rules = [
            ("read", word(&o.read), word(&r.read)),
            ("create", word(&o.create), word(&r.create)),
            ("update", word(&o.update), word(&r.update)),
            ("delete", word(&o.delete), word(&r.delete)),
            ("events", o.events.to_string(), r.events.to_string()),
            ("default_sort", sort_text(o), sort_text(r)),
        ];
        for (key, was, now) in rules {
            if was != now {
                self.step(name, None, format!("{key} {was} → {now}"), false, "recorded");
            }
        }
        let mut rebuilt: Vec<&str> = Vec::new();
        let (mut drops, mut adds) = (Vec::new(), Vec::new());
        for f in &o.fields {
            if r.field(&f.name).is_none() {
                self.step(name, Some(&f.name), "removed".into(), true, "the column is dropped with its values");
                drops.push(Op::DropColumn(name.into(), f.name.clone()));
            }
        }
        for f in &r.fields {
            match o.field(&f.name) {
                None => {
                    let (destructive, effect) = match (f.required, default_cell(f)) {
                        (true, None) => (true, "existing records have no value for it"),
                        (_, Some(_)) => (false, "column added, existing records get the default"),
                        (false, None) => (false, "column added"),
                    };
                    let what = if f.required { "new required field" } else { "new field" };
                    let what = if destructive { format!("{what} without a default") } else { what.into() };
                    self.step(name, Some(&f.name), what, destructive, effect);
                    adds.push(f);
                }
                Some(was) if was.kind != f.kind || was.refers != f.refers => {
                    if was.kind == Kind::String && f.kind == Kind::Text {
                        self.step(name, Some(&f.name), "retyped string → text".into(), false, "recorded");
                        self.field(name, was, f);
                        continue;
                    }
                    let what = if was.kind == f.kind {
                        format!("ref target {} → {}", ref_name(was), ref_name(f))
                    } else {
                        format!("retyped {} → {}", was.kind, f.kind)
                    };
                    self.step(name, Some(&f.name), what, true, "the column is rebuilt, its values dropped");
                    drops.push(Op::DropColumn(name.into(), f.name.clone()));
                    adds.push(f);
                    rebuilt.push(&f.name);
                }
                Some(was) => self.field(name, was, f),
            }
        }
        if o.fields.iter().map(|f| &f.name).filter(|n| r.field(n).is_some()).ne(r
            .fields
            .iter()
            .map(|f| &f.name)
            .filter(|n| o.field(n).is_some()))
        {
            self.step(name, None, "fields reordered".into(), false, "recorded");
        }
        // Indexes of changed columns go first (SQLite drops no indexed column) and come back
        // last; the others change where the declaration changed them.
        let (was, now) = (indexes(o), indexes(r));
        let touched = |i: &Index| i.field.as_deref().is_some_and(|f| rebuilt.contains(&f) || r.field(f).is_none());
        for i in &was {
            if !now.contains(i) || touched(i) {
                self.work.ops.push(Op::DropIndex(i.clone()));
            }
        }
        self.work.ops.extend(drops);
        for f in adds {
            self.work.ops.push(Op::AddColumn(name.into(), f.clone()));
            if let Some(cell) = default_cell(f) {
                self.work.ops.push(Op::Fill(name.into(), f.clone(), cell));
            }
        }
        for i in now {
            let new_field = i.field.as_deref().is_some_and(|f| o.field(f).is_none());
            if !was.contains(&i) || new_field || i.field.as_deref().is_some_and(|f| rebuilt.contains(&f)) {
                self.work.ops.push(Op::CreateIndex(name.into(), i));
            }
        }
    }

    /// A field kept with its type: its limits, values and flags.
    fn field(&mut self, res: &str, was: &Field, f: &Field) {
        let name = Some(f.name.as_str());
        if was.required != f.required {
            match f.required {
                true => self.step(res, name, "now required".into(), true, "existing records may have no value"),
                false => self.step(res, name, "now optional".into(), false, "recorded"),
            }
        }
        for (key, a, b, relaxed) in [
            ("min", was.min, f.min, f.min.is_none() || was.min.zip(f.min).is_some_and(|(a, b)| b <= a)),
            ("max", was.max, f.max, f.max.is_none() || was.max.zip(f.max).is_some_and(|(a, b)| b >= a)),
        ] {
            if a != b {
                let what = format!("{key} {} → {}", bound(a), bound(b));
                match relaxed {
                    true => self.step(res, name, what, false, "relaxed, recorded"),
                    false => self.step(res, name, what, true, "existing values may lie outside it"),
                }
            }
        }
        let added: Vec<&str> = f.values.iter().filter(|v| !was.values.contains(v)).map(String::as_str).collect();
        let removed: Vec<&str> = was.values.iter().filter(|v| !f.values.contains(v)).map(String::as_str).collect();
        if !added.is_empty() {
            self.step(res, name, format!("values added: {}", added.join(", ")), false, "recorded");
        }
        if !removed.is_empty() {
            let what = format!("values removed: {}", removed.join(", "));
            self.step(res, name, what, true, "records may still hold them");
        }
        if was.transitions != f.transitions {
            self.step(res, name, "transitions changed".into(), false, "recorded");
        }
        match (was.unique, f.unique) {
            (false, true) => self.step(res, name, "now unique".into(), true, "fails while records share a value"),
            (true, false) => self.step(res, name, "no longer unique".into(), false, "index dropped"),
            _ => {}
        }
        for (key, a, b) in
            [("sort", was.sort, f.sort), ("filter", was.filter, f.filter), ("search", was.search, f.search)]
        {
            if a != b {
                let effect = match (key, b, (was.sort || was.filter) != (f.sort || f.filter)) {
                    (_, true, true) => "index created",
                    (_, false, true) => "index dropped",
                    _ => "recorded",
                };
                self.step(res, name, format!("{key} {a} → {b}"), false, effect);
            }
        }
        if was.default != f.default {
            let show = |d: &Option<serde_json::Value>| d.as_ref().map_or_else(|| "none".into(), |v| v.to_string());
            self.step(res, name, format!("default {} → {}", show(&was.default), show(&f.default)), false, "recorded");
        }
    }
}

fn sort_text(r: &Resource) -> String {
    let keys: Vec<String> =
        r.default_sort.iter().map(|k| format!("{}{}", if k.desc { "-" } else { "" }, k.key)).collect();
    keys.join(",")
}

fn ref_name(f: &Field) -> &str {
    f.refers.as_deref().unwrap_or("(none)")
}

/// A field's default in stored form (`None`: no default, or a null one).
fn default_cell(f: &Field) -> Option<Cell> {
    let d = f.default.as_ref()?;
    value::check(f, d).ok().filter(|c| *c != Cell::Null)
}

#[cfg(test)]
mod tests;
