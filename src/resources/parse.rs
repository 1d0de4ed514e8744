//! `[[resources]]` as written → validated [`Resource`]s. Every problem is one line naming the
//! resource and the field (`resources.articles.fields.title: min 5 is above max 3`), and every
//! problem in the file is reported in one run, as for the other keys.
//!
//! This file must not read files or the environment; it only interprets a TOML value.

use toml::{Table, Value};

use super::{builtin, value, Create, Field, Kind, Read, Registry, Resource, SortKey, Write};
use super::{RESERVED_FIELDS, RESERVED_NAMES};

/// The keys of a `[[resources]]` table.
const RESOURCE_KEYS: &[&str] =
    &["name", "parent", "read", "create", "update", "delete", "events", "default_sort", "fields"];

/// The keys of a `[resources.fields.<name>]` table.
const FIELD_KEYS: &[&str] = &[
    "type",
    "required",
    "min",
    "max",
    "unique",
    "sort",
    "filter",
    "search",
    "default",
    "values",
    "transitions",
    "ref",
];

/// The registry of `value` (the `resources` key of the file; `None`: not there), with the
/// built-in `posts` first unless the file declares its own. Problems go to `errors`.
pub fn registry(value: Option<&Value>, errors: &mut Vec<String>) -> Registry {
    let mut list = Vec::new();
    let mut declared = Vec::new();
    match value {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let Some(table) = item.as_table() else {
                    errors.push(format!("resources[{i}]: must be a table ([[resources]])"));
                    continue;
                };
                if let Some(r) = resource(i, table, errors) {
                    if declared.contains(&r.name) {
                        errors.push(format!("resources.{}: declared twice", r.name));
                        continue;
                    }
                    declared.push(r.name.clone());
                    list.push(r);
                }
            }
        }
        Some(_) => errors.push("resources: must be an array of tables ([[resources]])".into()),
    }
    let mut all: Vec<Resource> = builtin::resources().into_iter().filter(|b| !declared.contains(&b.name)).collect();
    all.extend(list);
    let registry = Registry { list: all, declared };
    cross_checks(&registry, errors);
    registry
}

/// Whether `s` matches `^[a-z][a-z0-9_]{0,39}$` (a resource name).
pub fn resource_name_ok(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=40).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// Whether `s` matches `^[a-z][a-zA-Z0-9]{0,39}$` (a field name).
pub fn field_name_ok(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=40).contains(&b.len()) && b[0].is_ascii_lowercase() && b.iter().all(u8::is_ascii_alphanumeric)
}

fn resource(i: usize, t: &Table, errors: &mut Vec<String>) -> Option<Resource> {
    let name = match t.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            errors.push(format!("resources[{i}].name = {}: must be a string", show(v)));
            return None;
        }
        None => {
            errors.push(format!("resources[{i}]: name is missing"));
            return None;
        }
    };
    let at = if resource_name_ok(&name) { format!("resources.{name}") } else { format!("resources[{i}]") };
    if !resource_name_ok(&name) {
        errors.push(format!("{at}.name = {name:?}: must match ^[a-z][a-z0-9_]{{0,39}}$ (a lower-case plural noun)"));
    } else if RESERVED_NAMES.contains(&name.as_str()) {
        errors.push(format!("{at}: {name:?} is reserved (a built-in path or table); choose another name"));
    }
    for key in t.keys().filter(|k| !RESOURCE_KEYS.contains(&k.as_str())) {
        errors.push(format!("{at}: unknown key {}; known keys: {}", key.escape_debug(), RESOURCE_KEYS.join(", ")));
    }
    let parent = match text(t, "parent", &at, errors).as_deref() {
        None | Some("") => None,
        Some(p) => Some(p.to_string()),
    };
    let read = rule(t, "read", &at, Read::SignedIn, &["public", "signed_in", "owner", "admin"], errors, |s| {
        Some(match s {
            "public" => Read::Public,
            "signed_in" => Read::SignedIn,
            "owner" => Read::Owner,
            "admin" => Read::Admin,
            _ => return None,
        })
    });
    let create = rule(t, "create", &at, Create::SignedIn, &["signed_in", "owner", "admin"], errors, |s| {
        Some(match s {
            "signed_in" => Create::SignedIn,
            "owner" => Create::Owner,
            "admin" => Create::Admin,
            _ => return None,
        })
    });
    let write = |key: &str, errors: &mut Vec<String>| {
        rule(t, key, &at, Write::Owner, &["owner", "admin"], errors, |s| match s {
            "owner" => Some(Write::Owner),
            "admin" => Some(Write::Admin),
            _ => None,
        })
    };
    let update = write("update", errors);
    let delete = write("delete", errors);
    let events = match t.get("events") {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(v) => {
            errors.push(format!("{at}.events = {}: must be true or false", show(v)));
            true
        }
    };
    if create == Create::Owner && parent.is_none() {
        errors.push(format!(
            "{at}.create = \"owner\": only a nested resource (with a parent) has an owner to create under"
        ));
    }
    let mut fields = Vec::new();
    match t.get("fields") {
        None => {}
        Some(Value::Table(ft)) => {
            for (fname, fv) in ft {
                let fat = format!("{at}.fields.{}", fname.escape_debug());
                let Some(ftable) = fv.as_table() else {
                    errors.push(format!("{fat}: must be a table ([{at}.fields.{fname}])"));
                    continue;
                };
                if let Some(f) = field(fname, ftable, &fat, errors) {
                    fields.push(f);
                }
            }
        }
        Some(v) => errors.push(format!("{at}.fields = {}: must be a table of fields", show(v))),
    }
    let mut r = Resource {
        name,
        parent,
        read,
        create,
        update,
        delete,
        events,
        default_sort: vec![SortKey { key: "id".into(), desc: false }],
        fields,
    };
    if let Some(s) = text(t, "default_sort", &at, errors) {
        match sort_keys(&r, &s) {
            Ok(keys) => r.default_sort = keys,
            Err(e) => errors.push(format!("{at}.default_sort = {s:?}: {e}")),
        }
    }
    Some(r)
}

/// `spec` (`"-createdAt,title"`) as sort keys of `r`: its `sort` fields and `id`, `createdAt`,
/// `updatedAt`, each at most once, optionally prefixed `-`. The error names the bad part.
pub fn sort_keys(r: &Resource, spec: &str) -> Result<Vec<SortKey>, String> {
    let mut keys: Vec<SortKey> = Vec::new();
    for part in spec.split(',') {
        let (desc, key) = match part.strip_prefix('-') {
            Some(k) => (true, k),
            None => (false, part),
        };
        let known = matches!(key, "id" | "createdAt" | "updatedAt") || r.field(key).is_some_and(|f| f.sort);
        if !known {
            return Err(format!("unknown sort field '{key}'"));
        }
        if keys.iter().any(|k| k.key == key) {
            return Err(format!("sort field '{key}' given twice"));
        }
        keys.push(SortKey { key: key.to_string(), desc });
    }
    Ok(keys)
}

fn field(name: &str, t: &Table, at: &str, errors: &mut Vec<String>) -> Option<Field> {
    let before = errors.len();
    if !field_name_ok(name) {
        errors.push(format!("{at}: a field name must match ^[a-z][a-zA-Z0-9]{{0,39}}$ (camelCase)"));
    } else if RESERVED_FIELDS.contains(&name) {
        errors.push(format!("{at}: {name:?} is reserved (a server-managed key or a list parameter)"));
    }
    for key in t.keys().filter(|k| !FIELD_KEYS.contains(&k.as_str())) {
        errors.push(format!("{at}: unknown key {}; known keys: {}", key.escape_debug(), FIELD_KEYS.join(", ")));
    }
    let kind = match t.get("type") {
        None => {
            errors.push(format!("{at}.type is missing; one of {}", kinds()));
            return None;
        }
        Some(Value::String(s)) => match Kind::ALL.iter().find(|(_, n)| n == s) {
            Some((k, _)) => *k,
            None => {
                errors.push(format!("{at}.type = {s:?}: unknown type; one of {}", kinds()));
                return None;
            }
        },
        Some(v) => {
            errors.push(format!("{at}.type = {}: must be a string, one of {}", show(v), kinds()));
            return None;
        }
    };
    let mut f = Field::new(name, kind);
    let flag = |key: &str, errors: &mut Vec<String>| match t.get(key) {
        None => false,
        Some(Value::Boolean(b)) => *b,
        Some(v) => {
            errors.push(format!("{at}.{key} = {}: must be true or false", show(v)));
            false
        }
    };
    f.required = flag("required", errors);
    f.unique = flag("unique", errors);
    f.sort = flag("sort", errors);
    f.filter = flag("filter", errors);
    f.search = flag("search", errors);
    for (key, slot) in [("min", &mut f.min), ("max", &mut f.max)] {
        let Some(v) = t.get(key) else { continue };
        let n = match v {
            Value::Integer(n) => *n as f64,
            Value::Float(x) if x.is_finite() => *x,
            _ => {
                errors.push(format!("{at}.{key} = {}: must be a number", show(v)));
                continue;
            }
        };
        if !kind.has_bounds() {
            errors.push(format!("{at}.{key}: a {kind} field has no {key} (only string, text, integer, number)"));
            continue;
        }
        if matches!(kind, Kind::String | Kind::Text | Kind::Integer) && n.fract() != 0.0 {
            errors.push(format!("{at}.{key} = {}: must be a whole number for a {kind} field", show(v)));
            continue;
        }
        if matches!(kind, Kind::String | Kind::Text) && n < 0.0 {
            errors.push(format!("{at}.{key} = {}: a length cannot be negative", show(v)));
            continue;
        }
        *slot = Some(n);
    }
    if let (Some(a), Some(b)) = (f.min, f.max) {
        if a > b {
            errors.push(format!("{at}: min {} is above max {}", value::show(a), value::show(b)));
        }
    }
    if f.search && !kind.searchable() {
        errors.push(format!("{at}.search: a {kind} field cannot be searched (only string, text, email, url)"));
    }
    match t.get("values") {
        None => {}
        Some(Value::Array(items)) if kind == Kind::Enum => {
            for v in items {
                match v.as_str() {
                    Some(s) if !s.is_empty() && !s.chars().any(char::is_control) => {
                        if f.values.iter().any(|x| x == s) {
                            errors.push(format!("{at}.values: {s:?} listed twice"));
                        }
                        f.values.push(s.to_string());
                    }
                    _ => errors.push(format!("{at}.values: {} must be a non-empty string", show(v))),
                }
            }
        }
        Some(Value::Array(items)) if items.is_empty() => {}
        Some(v) => errors.push(format!("{at}.values = {}: only an enum field has values", show(v))),
    }
    if kind == Kind::Enum && f.values.is_empty() && !t.contains_key("values") {
        errors.push(format!("{at}: an enum field needs values = [\"...\", ...]"));
    } else if kind == Kind::Enum && f.values.is_empty() {
        errors.push(format!("{at}.values: an enum field needs at least one value"));
    }
    match t.get("transitions") {
        None => {}
        Some(Value::Table(tt)) if kind == Kind::Enum => {
            for (from, to) in tt {
                if !f.values.contains(from) {
                    errors.push(format!("{at}.transitions: {from:?} is not one of the values"));
                }
                let mut next = Vec::new();
                match to {
                    Value::Array(items) => {
                        for v in items {
                            match v.as_str() {
                                Some(s) if f.values.iter().any(|x| x == s) => next.push(s.to_string()),
                                _ => errors
                                    .push(format!("{at}.transitions.{from}: {} is not one of the values", show(v))),
                            }
                        }
                    }
                    v => errors.push(format!("{at}.transitions.{from} = {}: must be an array of values", show(v))),
                }
                f.transitions.push((from.clone(), next));
            }
        }
        Some(Value::Table(tt)) if tt.is_empty() => {}
        Some(v) => errors.push(format!("{at}.transitions = {}: only an enum field has transitions", show(v))),
    }
    match t.get("ref") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if kind == Kind::Ref => f.refers = Some(s.clone()),
        Some(v) => errors.push(format!("{at}.ref = {}: only a ref field refers to a resource", show(v))),
    }
    if kind == Kind::Ref && f.refers.is_none() {
        errors.push(format!("{at}: a ref field needs ref = \"<resource>\""));
    }
    if let Some(v) = t.get("default") {
        match toml_to_json(v) {
            Some(json) => match value::check(&f, &json) {
                Ok(cell) if kind != Kind::Ref => f.default = Some(cell.to_json()),
                Ok(_) => errors.push(format!("{at}.default: a ref field has no default")),
                Err(e) => errors.push(format!("{at}.default = {}: {e}", show(v))),
            },
            None => errors.push(format!("{at}.default = {}: not a JSON value", show(v))),
        }
    }
    if kind == Kind::Enum
        && !f.transitions.is_empty()
        && f.default.is_none()
        && !f.values.iter().any(|v| f.may_start_in(v))
    {
        errors.push(format!(
            "{at}.transitions: every value is reached by a transition, so no record could start; give a default"
        ));
    }
    (errors.len() == before).then_some(f)
}

/// Checks across resources: parents exist and form no cycle, refs name a resource, `create =
/// "owner"` has an owner to go by.
fn cross_checks(reg: &Registry, errors: &mut Vec<String>) {
    let known = |n: &str| n == "users" || reg.get(n).is_some();
    for r in &reg.list {
        if let Some(p) = &r.parent {
            if !known(p) {
                errors.push(format!("resources.{}.parent = {p:?}: no such resource (users or a declared one)", r.name));
            } else if p == &r.name {
                errors.push(format!("resources.{}.parent: a resource cannot be its own parent", r.name));
            }
        }
        for f in &r.fields {
            if let Some(to) = &f.refers {
                if !known(to) {
                    errors.push(format!(
                        "resources.{}.fields.{}.ref = {to:?}: no such resource (users or a declared one)",
                        r.name, f.name
                    ));
                }
            }
        }
    }
    // A cycle of parents: follow each chain for at most as many steps as there are resources.
    for r in &reg.list {
        let mut at = r;
        for _ in 0..=reg.list.len() {
            let Some(next) = at.parent.as_deref().and_then(|p| reg.get(p)) else { break };
            if next.name == r.name {
                errors.push(format!("resources.{}.parent: a cycle of parents through {:?}", r.name, at.name));
                break;
            }
            at = next;
        }
    }
}

fn kinds() -> String {
    Kind::ALL.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
}

fn text(t: &Table, key: &str, at: &str, errors: &mut Vec<String>) -> Option<String> {
    match t.get(key) {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            errors.push(format!("{at}.{key} = {}: must be a string", show(v)));
            None
        }
    }
}

fn rule<T: Copy>(
    t: &Table,
    key: &str,
    at: &str,
    default: T,
    names: &[&str],
    errors: &mut Vec<String>,
    parse: impl Fn(&str) -> Option<T>,
) -> T {
    match text(t, key, at, errors) {
        None => default,
        Some(s) => parse(&s).unwrap_or_else(|| {
            errors.push(format!("{at}.{key} = {s:?}: must be one of {}", names.join(", ")));
            default
        }),
    }
}

/// A TOML value as JSON (a datetime becomes its RFC 3339 text).
fn toml_to_json(v: &Value) -> Option<serde_json::Value> {
    Some(match v {
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Integer(n) => serde_json::Value::from(*n),
        Value::Float(x) => serde_json::Number::from_f64(*x).map(serde_json::Value::Number)?,
        Value::Boolean(b) => serde_json::Value::Bool(*b),
        Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        Value::Array(_) | Value::Table(_) => return None,
    })
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Table(_) => "a table".into(),
        other => other.to_string().replace('\n', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Registry, Vec<String>) {
        let table: Table = text.parse().expect("toml");
        let mut errors = Vec::new();
        let reg = registry(table.get("resources"), &mut errors);
        (reg, errors)
    }

    #[test]
    fn a_full_declaration_parses() {
        let (reg, errors) = parse(
            r#"
            [[resources]]
            name = "articles"
            read = "public"
            default_sort = "-createdAt"
            [resources.fields.title]
            type = "string"
            required = true
            min = 1
            max = 200
            sort = true
            search = true
            [resources.fields.status]
            type = "enum"
            values = ["draft", "published", "archived"]
            default = "draft"
            transitions = { draft = ["published"], published = ["archived"] }
            filter = true
            [[resources]]
            name = "comments"
            parent = "articles"
            create = "signed_in"
            [resources.fields.text]
            type = "text"
            max = 2000
            [resources.fields.author]
            type = "ref"
            ref = "users"
            "#,
        );
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(reg.list.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["posts", "articles", "comments"]);
        let a = reg.get("articles").expect("articles");
        assert_eq!(a.read, Read::Public);
        assert_eq!(a.default_sort, vec![SortKey { key: "createdAt".into(), desc: true }]);
        let status = a.field("status").expect("status");
        assert_eq!(status.default, Some(serde_json::json!("draft")));
        assert_eq!(status.next_states("draft"), Some(&["published".to_string()][..]));
        assert_eq!(status.next_states("archived"), Some(&[][..]));
        assert!(status.may_start_in("draft") && !status.may_start_in("published"));
        assert_eq!(reg.get("comments").and_then(|c| c.parent.as_deref()), Some("articles"));
    }

    #[test]
    fn every_bad_declaration_is_one_line_naming_resource_and_field() {
        let (_, errors) = parse(
            r#"
            [[resources]]
            name = "Bad Name"
            [[resources]]
            name = "users"
            [[resources]]
            name = "items"
            parent = "nowhere"
            read = "everyone"
            create = "owner"
            colour = 1
            [resources.fields.a]
            type = "strin"
            [resources.fields.b]
            type = "string"
            min = 5
            max = 3
            [resources.fields.c]
            type = "enum"
            values = ["x"]
            transitions = { x = ["y"] }
            [resources.fields.d]
            type = "ref"
            ref = "ghosts"
            [resources.fields.id]
            type = "integer"
            [resources.fields.e]
            type = "boolean"
            default = "yes"
            [[resources]]
            name = "tops"
            create = "owner"
            [[resources]]
            name = "loops"
            parent = "loops2"
            [[resources]]
            name = "loops2"
            parent = "loops"
            "#,
        );
        let want = [
            "resources[0].name = \"Bad Name\"",
            "resources.users: \"users\" is reserved",
            "resources.items: unknown key colour",
            "resources.items.read = \"everyone\"",
            "resources.items.fields.a.type = \"strin\": unknown type",
            "resources.items.fields.b: min 5 is above max 3",
            "resources.items.fields.c.transitions.x: \"y\" is not one of the values",
            "resources.items.fields.id: \"id\" is reserved",
            "resources.items.fields.e.default = \"yes\": must be true or false",
            "resources.items.parent = \"nowhere\": no such resource",
            "resources.items.fields.d.ref = \"ghosts\": no such resource",
            "resources.loops.parent: a cycle of parents",
            "resources.tops.create = \"owner\": only a nested resource",
        ];
        for w in want {
            assert!(errors.iter().any(|e| e.starts_with(w)), "no line starting {w:?} in {errors:#?}");
        }
        assert!(errors.iter().all(|e| !e.contains('\n')), "{errors:#?}");
    }

    #[test]
    fn a_file_that_declares_posts_replaces_the_built_in_one() {
        let (reg, errors) = parse("[[resources]]\nname = \"posts\"\nread = \"public\"\n");
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(reg.list.len(), 1);
        assert_eq!(reg.list[0].read, Read::Public);
        assert_eq!(reg.declared, ["posts"]);
        let (reg, _) = parse("");
        assert_eq!(reg.list, builtin::resources());
        assert!(reg.declared.is_empty());
    }

    #[test]
    fn default_sort_names_sort_fields_only() {
        let (_, errors) = parse(
            "[[resources]]\nname = \"a\"\ndefault_sort = \"-title\"\n[resources.fields.title]\ntype = \"string\"\n",
        );
        assert!(errors.iter().any(|e| e.contains("unknown sort field 'title'")), "{errors:?}");
    }
}
