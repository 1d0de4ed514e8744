//! The document's part for declared resources (the built-in `posts` among them): for each
//! resource of the registry, its schemas and its operations, generated from the declaration
//! so that the document states what the engine enforces.
//!
//! Schemas, named after the resource (lower case, so they never meet a built-in schema's
//! name): `<name>` the record as served, `<name>Input` the body of a `POST` (an enum with
//! `transitions` offers only the states a record may start in), `<name>Replace` the body of a
//! `PUT`, `<name>Patch` the body of a `PATCH` (nothing required), `<name>Page` a list's
//! `data`. A field's limits are the ones [`crate::resources::value::check`] applies.
//!
//! Operations, named `<name>.<verb>` (a dot, which no built-in operation id has): `list`,
//! `create`, `get`, `replace`, `patch`, `delete`, and for a nested resource `listIn` (the
//! records under one parent record) with `create` under the parent's path. Security follows
//! `read` (`public`: a token is optional) and the write rules; each operation's description
//! states who may call it.
//!
//! This file must not decide anything about access or values itself: it describes the
//! declaration's rules as the handlers apply them.

use serde_json::{json, Map, Value};

use super::components::{page, time, EMAIL_LOCAL_LENGTH, EMAIL_PATTERN};
use super::paths::{
    by_id, etag, header_param, json_body, location, ok, query, schema, Auth, Content, Op, Paths, NO_STORE,
};
use crate::config::Config;
use crate::resources::value::{show, MAX_URL};
use crate::resources::{Create, Field, Kind, Read, Registry, Resource, Write};

/// A string without control characters (a `string` field's one line).
const ONE_LINE: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// A string whose only control characters are tabs and newlines (a `text` field).
const TEXT: &str = "^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$";

/// What a `url` field accepts: `http` or `https` in any case, `://`, an optional user part,
/// a host of letters, digits, `.-_[]:` (not starting with `:`), then no white space or
/// control characters.
const URL: &str = concat!(
    "^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#\\s\\u0000-\\u001f\\u007f-\\u009f]*@)?",
    "[A-Za-z0-9.\\-\\[\\]_][A-Za-z0-9.\\-:\\[\\]_]*",
    "(?:[/?#][^\\s\\u0000-\\u001f\\u007f-\\u009f]*)?$"
);

/// What a `datetime` field accepts (with `format: date-time` for the calendar): RFC 3339
/// with `T`, `t` or a space, up to nine fraction digits, `Z` or an `±hh:mm` offset.
const DATETIME: &str = concat!(
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]{1,9})?",
    "(?:[Zz]|[+-][0-9]{2}:[0-9]{2})$"
);

/// The last day with a negative offset: in UTC it may fall in the year 10000, which is refused.
const PAST_9999: &str = "^9999-12-31[Tt ].*-[0-9]{2}:[0-9]{2}$";

/// Which body a schema describes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Body {
    /// `POST`: required fields without a default must be there; enum states a record may start in.
    Create,
    /// `PUT`: as `POST`, but any enum value (its transitions are checked against the record).
    Replace,
    /// `PATCH`: any subset.
    Patch,
}

/// The schemas of every resource of `registry`, into `m`.
pub fn schemas(registry: &Registry, m: &mut Map<String, Value>) {
    for r in &registry.list {
        m.insert(r.name.clone(), record(r));
        m.insert(format!("{}Input", r.name), body(r, Body::Create));
        m.insert(format!("{}Replace", r.name), body(r, Body::Replace));
        m.insert(format!("{}Patch", r.name), body(r, Body::Patch));
        m.insert(format!("{}Page", r.name), page(&r.name));
    }
}

/// One tag per resource: `(name, description)`, in registry order.
pub fn tags(registry: &Registry) -> Vec<(String, String)> {
    registry
        .list
        .iter()
        .map(|r| {
            let place = match r.parent.as_deref() {
                None => "top level".to_owned(),
                Some(p) => format!("nested under `{p}`"),
            };
            let origin = if registry.declared.contains(&r.name) { "Declared" } else { "Built in" };
            (r.name.clone(), format!("{origin} resource `{}`, {place}", r.name))
        })
        .collect()
}

/// OpenAPI links from a response whose `data.id` is a record of `parent` (`"users"` or a
/// resource) to the list and create operations of its children, added to `links`.
pub fn child_links(config: &Config, parent: &str, links: &mut Value) {
    let Some(map) = links.as_object_mut() else { return };
    for c in config.resources.children(parent) {
        map.insert(format!("{}.listIn", c.name), by_id(&format!("{}.listIn", c.name)));
        map.insert(format!("{}.create", c.name), by_id(&format!("{}.create", c.name)));
    }
}

/// The operations of every resource.
pub fn paths(p: &mut Paths<'_>) {
    let config = p.config;
    for r in &config.resources.list {
        resource(p, config, r);
    }
}

fn resource(p: &mut Paths<'_>, config: &Config, r: &Resource) {
    let name = r.name.as_str();
    let op = |verb: &str, summary: String, description: String| {
        Op::new(format!("{name}.{verb}"), name.to_owned(), summary, description)
    };
    let read_auth = if r.read == Read::Public { Auth::Optional } else { Auth::Bearer };
    let page_ok = || ok(200, "A page of records", Content::Envelope(schema(&format!("{name}Page"))), NO_STORE);
    let record_ok = |status: u16, what: &'static str| ok(status, what, Content::Envelope(schema(name)), NO_STORE);
    let mut record_links = json!({
        "get": by_id(&format!("{name}.get")), "replace": by_id(&format!("{name}.replace")),
        "patch": by_id(&format!("{name}.patch")), "delete": by_id(&format!("{name}.delete")),
    });
    child_links(config, name, &mut record_links);
    let list_errors: &[u16] = if r.read == Read::Admin { &[403, 503] } else { &[503] };

    // The list of every record the caller may read.
    let everything = if r.nested() { " of every parent" } else { "" };
    let mut list = op(
        "list",
        format!("List {name}"),
        format!("Every record{everything} the caller may read. {}{}", read_rule(r), list_rules(r)),
    )
    .auth(read_auth)
    .ok(page_ok())
    .errors(list_errors);
    for param in list_params(r) {
        list = list.param(param);
    }
    p.versioned("GET", &format!("/{name}"), &list);

    let create = op("create", format!("Create a record of {name}"), format!("{} {}", create_rule(r), BODY_RULES))
        .auth(Auth::Bearer)
        .body(json_body(&format!("{name}Input"), true))
        .ok(record_ok(201, "Created").header("Location", location()).links(record_links))
        .errors(&[409, 503]);
    match r.parent.as_deref() {
        None => p.versioned("POST", &format!("/{name}"), &create),
        Some(parent) => {
            let under = format!("/{parent}/{{id}}/{name}");
            let mut list_in = op(
                "listIn",
                format!("List the {name} of one {parent} record"),
                format!(
                    "The records under the parent record `id` that the caller may read; 404 when that record \
                     does not exist or the caller may not read it. {}{}",
                    read_rule(r),
                    list_rules(r)
                ),
            )
            .auth(read_auth)
            .ok(page_ok())
            .errors(list_errors)
            .errors(&[404]);
            for param in list_params(r) {
                list_in = list_in.param(param);
            }
            p.versioned("GET", &under, &list_in);
            p.versioned("POST", &under, &create.errors(&[404]));
        }
    }

    let item = format!("/{name}/{{id}}");
    p.versioned(
        "GET",
        &item,
        &op("get", format!("Read a record of {name}"), read_rule(r).to_owned())
            .auth(read_auth)
            .param(header_param("If-None-Match", "An `ETag` from an earlier answer: 304 when it still matches"))
            .ok(record_ok(200, "The record").header("ETag", etag()))
            .ok(ok(304, "Not modified", Content::Empty, NO_STORE).header("ETag", etag()))
            .errors(&[404, 503]),
    );
    let if_match = || header_param("If-Match", "The record's current `ETag` (or `*`): 412 when it does not match");
    let write = write_rule(r.update, r);
    p.versioned(
        "PUT",
        &item,
        &op(
            "replace",
            format!("Replace a record of {name}"),
            format!(
                "{write} Every field is replaced: an absent optional field becomes its default, or null. {BODY_RULES}"
            ),
        )
        .auth(Auth::Bearer)
        .param(if_match())
        .body(json_body(&format!("{name}Replace"), true))
        .ok(record_ok(200, "The record").header("ETag", etag()))
        .errors(&[404, 409, 412, 503]),
    );
    p.versioned(
        "PATCH",
        &item,
        &op(
            "patch",
            format!("Change fields of a record of {name}"),
            format!("{write} Only the fields given change. {BODY_RULES}"),
        )
        .auth(Auth::Bearer)
        .param(if_match())
        .body(json_body(&format!("{name}Patch"), true))
        .ok(record_ok(200, "The record").header("ETag", etag()))
        .errors(&[404, 409, 412, 503]),
    );
    let children: Vec<&str> = config.resources.children(name).map(|c| c.name.as_str()).collect();
    let cascade = if children.is_empty() {
        String::new()
    } else {
        format!(" Its records of {} go with it.", children.join(", "))
    };
    p.versioned(
        "DELETE",
        &item,
        &op("delete", format!("Delete a record of {name}"), format!("{}{cascade}", write_rule(r.delete, r)))
            .auth(Auth::Bearer)
            .param(if_match())
            .ok(ok(204, "Deleted", Content::Empty, NO_STORE))
            .errors(&[404, 412, 503]),
    );
}

const BODY_RULES: &str = "Unknown keys, the server-managed ones (`id`, `ownerId`, `parentId`, `userId`, \
`createdAt`, `updatedAt`) and `__proto__`, `constructor`, `prototype` are 422, as is every value the schema \
refuses and a `ref` naming no record the caller may read; each bad field is one `errors` entry and nothing is \
stored. A `unique` field's taken value is 409, and so is a change of an enum's state that its transitions do \
not allow (`errors` names the field and the allowed states).";

fn read_rule(r: &Resource) -> &'static str {
    match r.read {
        Read::Public => "Anyone may read, without a token (a token sent must be valid, else 401).",
        Read::SignedIn => "Any signed-in user may read.",
        Read::Owner => {
            "Only a record's owner may read it (an admin reads every record): another's record is 404, and a \
             list holds only the caller's own."
        }
        Read::Admin => "Only admins may read: a record is 404 to anyone else, a list 403.",
    }
}

fn create_rule(r: &Resource) -> String {
    let who = match r.create {
        Create::SignedIn => "Any signed-in user may create.",
        Create::Owner => "Only the owner of the parent record (or an admin) may create; anyone else gets 403.",
        Create::Admin => "Only admins may create; anyone else gets 403.",
    };
    let owner = if r.parent.as_deref() == Some("users") {
        "The record's `ownerId` is the user of the path."
    } else {
        "The record's `ownerId` is the caller."
    };
    let parent =
        if r.nested() { " 404 when the parent record does not exist or the caller may not read it." } else { "" };
    format!("{who} {owner}{parent} `Location` names the new record.")
}

fn write_rule(rule: Write, r: &Resource) -> String {
    let who = match rule {
        Write::Owner => "The record's owner or an admin",
        Write::Admin => "Admins only",
    };
    let unreadable = if r.read == Read::Public { "" } else { "; 404 when the caller may not read the record" };
    format!("{who} (else 403{unreadable}).")
}

fn list_rules(r: &Resource) -> String {
    let order: Vec<String> =
        r.default_sort.iter().map(|k| format!("{}{}", if k.desc { "-" } else { "" }, k.key)).collect();
    format!(
        " Without `sort` the order is `{}`; ties are broken by `id`, so pages are stable. Any other query \
         parameter, or a bad value, is 400 naming it in `errors`.",
        order.join(",")
    )
}

/// The query parameters of a list: paging, `sort`, the filters and `q`.
fn list_params(r: &Resource) -> Vec<Value> {
    let mut out = vec![
        query("page", "Page number", json!({"type": "integer", "minimum": 1, "maximum": 1_000_000, "default": 1})),
        query("limit", "Page size", json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20})),
    ];
    let mut keys: Vec<&str> = vec!["id", "createdAt", "updatedAt"];
    keys.extend(r.fields.iter().filter(|f| f.sort).map(|f| f.name.as_str()));
    let one = format!("({})", keys.join("|"));
    // A key may appear once: the look-ahead refuses a key that comes again.
    let pattern = format!("^(?!(?:.*,)?-?{one},(?:.*,)?-?\\1(?:,|$))-?{one}(?:,-?{one})*$");
    out.push(query(
        "sort",
        &format!("Comma list of {}, each at most once and optionally `-` (descending)", quoted(&keys)),
        json!({"type": "string", "pattern": pattern}),
    ));
    for f in r.fields.iter().filter(|f| f.filter) {
        out.push(query(
            &f.name,
            &format!("Only records whose `{}` is this value", f.name),
            value(f, Body::Patch, false),
        ));
        if f.kind.has_range_filter() {
            let bound = value(f, Body::Patch, false);
            out.push(query(
                &format!("{}.gte", f.name),
                &format!("Only records whose `{}` is at least this", f.name),
                bound.clone(),
            ));
            out.push(query(
                &format!("{}.lte", f.name),
                &format!("Only records whose `{}` is at most this", f.name),
                bound,
            ));
        }
    }
    let searched: Vec<&str> = r.fields.iter().filter(|f| f.search).map(|f| f.name.as_str()).collect();
    if !searched.is_empty() {
        out.push(query(
            "q",
            &format!("Only records where {} contains this text (any letter case)", alternatives(&searched)),
            json!({"type": "string"}),
        ));
    }
    out
}

fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

fn alternatives(names: &[&str]) -> String {
    match names {
        [one] => format!("`{one}`"),
        _ => format!("one of {}", quoted(names)),
    }
}

/// A record as served: the managed keys, then every field (null when optional and unset).
fn record(r: &Resource) -> Value {
    let id = json!({"type": "integer", "minimum": 1});
    let mut props = Map::new();
    let mut required = vec!["id", "ownerId"];
    props.insert("id".into(), id.clone());
    props.insert("ownerId".into(), json!({"type": "integer", "minimum": 1, "description": "The user who owns it"}));
    if let Some(parent) = r.parent.as_deref() {
        props.insert(
            "parentId".into(),
            json!({"type": "integer", "minimum": 1, "description": format!("The {parent} record it belongs to")}),
        );
        required.push("parentId");
        if parent == "users" {
            props.insert(
                "userId".into(),
                json!({"type": "integer", "minimum": 1, "description": "The user it belongs to (= `parentId`)"}),
            );
            required.push("userId");
        }
    }
    for f in &r.fields {
        let ty = match f.kind {
            Kind::Integer | Kind::Ref => "integer",
            Kind::Number => "number",
            Kind::Boolean => "boolean",
            _ => "string",
        };
        let schema = if f.required { json!({"type": ty}) } else { json!({"type": [ty, "null"]}) };
        props.insert(f.name.clone(), schema);
        required.push(&f.name);
    }
    props.insert("createdAt".into(), time());
    props.insert("updatedAt".into(), time());
    required.extend(["createdAt", "updatedAt"]);
    json!({"type": "object", "additionalProperties": false, "required": required, "properties": props})
}

/// A request body.
fn body(r: &Resource, which: Body) -> Value {
    let mut props = Map::new();
    let mut required = Vec::new();
    for f in &r.fields {
        props.insert(f.name.clone(), value(f, which, !f.required));
        if which != Body::Patch && f.required && f.default.is_none() {
            required.push(f.name.as_str());
        }
    }
    json!({"type": "object", "additionalProperties": false, "required": required, "properties": props})
}

/// What a field accepts; `nullable`: `null` too (optional fields). Used for bodies and, not
/// nullable, for query filters.
fn value(f: &Field, which: Body, nullable: bool) -> Value {
    let mut s = Map::new();
    let mut notes: Vec<String> = Vec::new();
    let bound = |n: f64| -> Value {
        if n.fract() == 0.0 && n.abs() < 9e15 {
            json!(n as i64)
        } else {
            json!(n)
        }
    };
    let ty = match f.kind {
        Kind::String | Kind::Text => {
            if let Some(n) = f.min {
                s.insert("minLength".into(), bound(n));
            }
            if let Some(n) = f.max {
                s.insert("maxLength".into(), bound(n));
            }
            let (pattern, note) = if f.kind == Kind::String {
                (ONE_LINE, "One line, no control characters")
            } else {
                (TEXT, "Text: newlines and tabs allowed, no other control characters")
            };
            s.insert("pattern".into(), pattern.into());
            notes.push(note.into());
            "string"
        }
        Kind::Integer | Kind::Number | Kind::Ref => {
            if let Some(n) = f.min {
                s.insert("minimum".into(), bound(n));
            }
            if let Some(n) = f.max {
                s.insert("maximum".into(), bound(n));
            }
            if f.kind == Kind::Ref {
                s.insert("minimum".into(), json!(1));
                notes.push(format!(
                    "The id of a record of `{}` the caller may read (422 otherwise)",
                    f.refers.as_deref().unwrap_or_default()
                ));
            }
            if f.kind == Kind::Number {
                "number"
            } else {
                "integer"
            }
        }
        Kind::Boolean => "boolean",
        Kind::Enum => {
            let values: Vec<&String> = if which == Body::Create {
                f.values.iter().filter(|v| f.may_start_in(v)).collect()
            } else {
                f.values.iter().collect()
            };
            s.insert("enum".into(), json!(values));
            if !f.transitions.is_empty() {
                let moves: Vec<String> = f
                    .transitions
                    .iter()
                    .map(|(from, to)| {
                        let to = if to.is_empty() { "nothing".to_owned() } else { to.join(", ") };
                        format!("{from} → {to}")
                    })
                    .collect();
                notes.push(format!(
                    "Changes follow the transitions ({}; a change to another state is 409); a new record starts \
                     in a state no transition leads into, or the default",
                    moves.join("; ")
                ));
            }
            "string"
        }
        Kind::Datetime => {
            s.insert("format".into(), "date-time".into());
            s.insert("pattern".into(), DATETIME.into());
            s.insert("not".into(), json!({"type": "string", "pattern": PAST_9999}));
            notes.push("RFC 3339; stored and returned in UTC with milliseconds".into());
            "string"
        }
        Kind::Email => {
            s.insert("format".into(), "email".into());
            s.insert("maxLength".into(), json!(254));
            s.insert("allOf".into(), json!([{"pattern": EMAIL_PATTERN}, {"pattern": EMAIL_LOCAL_LENGTH}]));
            notes.push("An e-mail address of at most 254 characters, at most 64 before the `@`".into());
            "string"
        }
        Kind::Url => {
            // No `format: uri`: the check takes IRIs too (`https://x.io/ª`), which `uri` refuses.
            s.insert("maxLength".into(), json!(MAX_URL));
            s.insert("pattern".into(), URL.into());
            notes.push(format!("An absolute http or https URL of at most {MAX_URL} characters"));
            "string"
        }
    };
    s.insert("type".into(), if nullable { json!([ty, "null"]) } else { json!(ty) });
    if let (Kind::Enum, true) = (f.kind, nullable) {
        // `enum` restricts `type`: null must be listed to be allowed.
        if let Some(Value::Array(values)) = s.get_mut("enum") {
            values.push(Value::Null);
        }
    }
    if let Some(d) = &f.default {
        s.insert("default".into(), d.clone());
    }
    if f.unique {
        notes.push("Unique: a value another record has is 409".into());
    }
    if matches!(f.kind, Kind::String | Kind::Text | Kind::Integer | Kind::Number) {
        match (f.min, f.max) {
            (None, None) => {}
            (a, b) => notes.push(format!(
                "{} {}",
                if f.kind.is_text() { "Characters:" } else { "Value:" },
                match (a, b) {
                    (Some(a), Some(b)) => format!("{} to {}", show(a), show(b)),
                    (Some(a), None) => format!("at least {}", show(a)),
                    (None, Some(b)) => format!("at most {}", show(b)),
                    (None, None) => String::new(),
                }
            )),
        }
    }
    if !notes.is_empty() {
        s.insert("description".into(), notes.join(". ").into());
    }
    Value::Object(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::parse;

    fn registry(toml_text: &str) -> Registry {
        let table: toml::Table = toml_text.parse().expect("toml");
        let mut errors = Vec::new();
        let reg = parse::registry(table.get("resources"), &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        reg
    }

    const ARTICLES: &str = r#"
[[resources]]
name = "articles"
read = "public"
[resources.fields.title]
type = "string"
required = true
min = 1
max = 120
sort = true
search = true
[resources.fields.status]
type = "enum"
values = ["draft", "published", "archived"]
default = "draft"
filter = true
transitions = { draft = ["published"], published = ["archived"] }
[resources.fields.score]
type = "number"
min = 0
max = 5.5
filter = true
[resources.fields.slug]
type = "string"
required = true
unique = true
max = 80
"#;

    #[test]
    fn a_body_schema_states_each_fields_limits_and_required_list() {
        let reg = registry(ARTICLES);
        let r = reg.get("articles").expect("declared");
        let input = body(r, Body::Create);
        let mut required: Vec<&str> =
            input["required"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
        required.sort_unstable();
        assert_eq!(required, ["slug", "title"], "required without a default");
        assert_eq!(input["additionalProperties"], false);
        let title = &input["properties"]["title"];
        assert_eq!((title["minLength"].as_i64(), title["maxLength"].as_i64()), (Some(1), Some(120)));
        assert_eq!(title["type"], "string");
        assert_eq!(input["properties"]["score"]["type"], json!(["number", "null"]));
        assert_eq!(input["properties"]["score"]["maximum"], json!(5.5));
        // A new record starts in `draft` only (the others are reached by transitions).
        assert_eq!(input["properties"]["status"]["enum"], json!(["draft", null]));
        assert_eq!(
            body(r, Body::Replace)["properties"]["status"]["enum"],
            json!(["draft", "published", "archived", null])
        );
        assert_eq!(body(r, Body::Patch)["required"], json!([]));
    }

    #[test]
    fn list_parameters_follow_the_declared_sort_filter_and_search_fields() {
        let reg = registry(ARTICLES);
        let params = list_params(reg.get("articles").expect("declared"));
        let mut names: Vec<&str> = params.iter().filter_map(|p| p["name"].as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["limit", "page", "q", "score", "score.gte", "score.lte", "sort", "status"]);
        let sort = params[2]["schema"]["pattern"].as_str().expect("pattern");
        assert!(sort.contains("(id|createdAt|updatedAt|title)"), "{sort}");
        let status = params.iter().find(|p| p["name"] == "status").expect("status filter");
        assert_eq!(status["schema"]["enum"], json!(["draft", "published", "archived"]), "a filter is never null");
    }
}
