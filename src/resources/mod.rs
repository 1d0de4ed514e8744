//! Declared resources: the `[[resources]]` of the configuration as validated data, the one
//! registry every other layer reads (the router its routes, the validator its rules, the
//! store its tables, the OpenAPI document its schemas, the event streams their filter).
//!
//! - [`parse`] turns the TOML array into [`Resource`]s, reporting every bad declaration as one
//!   line naming resource and field (it runs in the supervisor, before any fork);
//! - [`value`] is the one check of a JSON value against a [`Field`] (used for request bodies,
//!   query filters and declared defaults alike) and the typed [`value::Cell`] it yields;
//! - [`builtin`] holds the built-in `posts` declaration;
//! - [`audience`] decides which event streams a change may go to, by the same `read` rule.
//!
//! Nothing here touches HTTP, SQL or sockets. Names that reach SQL (resource and field names)
//! are checked here against strict patterns, and the store quotes them besides.

pub mod audience;
pub mod builtin;
pub mod parse;
pub mod record;
pub mod value;

use std::fmt;

use crate::store::records::Viewer;

/// Who may list and get records (`read`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Read {
    /// Anyone, without a token.
    Public,
    /// Any signed-in user.
    SignedIn,
    /// The record's owner (and admins): others get 404, lists hold only one's own.
    Owner,
    /// Admins only.
    Admin,
}

impl Read {
    /// Whether `viewer` (`None`: no token) may read a record owned by `owner_id` under this
    /// rule. The one rule: the resource routes and the event streams both ask it.
    pub fn allows(self, viewer: Option<&Viewer>, owner_id: i64) -> bool {
        match self {
            Read::Public => true,
            Read::SignedIn => viewer.is_some(),
            Read::Owner => viewer.is_some_and(|v| v.admin || v.user_id == owner_id),
            Read::Admin => viewer.is_some_and(|v| v.admin),
        }
    }
}

/// Who may create records (`create`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Create {
    /// Any signed-in user.
    SignedIn,
    /// Only the owner of the parent record (nested resources only), or an admin.
    Owner,
    /// Admins only.
    Admin,
}

/// Who may update or delete a record (`update`, `delete`); an admin always may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Write {
    /// The record's owner (or an admin).
    Owner,
    /// Admins only.
    Admin,
}

/// A field's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// One line of text, no control characters; `min`/`max` count characters.
    String,
    /// Text, newlines and tabs allowed; `min`/`max` count characters.
    Text,
    /// A JSON integer (i64); `min`/`max` bound the value.
    Integer,
    /// Any JSON number (f64); `min`/`max` bound the value.
    Number,
    /// `true` or `false`.
    Boolean,
    /// One of `values`; `transitions` may restrict changes.
    Enum,
    /// An RFC 3339 timestamp, stored and returned in UTC (`Z`).
    Datetime,
    /// An e-mail address (the users' rule).
    Email,
    /// An absolute `http` or `https` URL of at most 2048 characters.
    Url,
    /// The id of an existing record of resource `ref` that the caller may read.
    Ref,
}

impl Kind {
    /// Every type, with its name in the file.
    pub const ALL: [(Kind, &'static str); 10] = [
        (Kind::String, "string"),
        (Kind::Text, "text"),
        (Kind::Integer, "integer"),
        (Kind::Number, "number"),
        (Kind::Boolean, "boolean"),
        (Kind::Enum, "enum"),
        (Kind::Datetime, "datetime"),
        (Kind::Email, "email"),
        (Kind::Url, "url"),
        (Kind::Ref, "ref"),
    ];

    /// The name in the file (`"string"`, …).
    pub fn name(self) -> &'static str {
        Kind::ALL.iter().find(|(k, _)| *k == self).map_or("string", |(_, n)| n)
    }

    /// Whether values are stored as text (else as an integer, a real or a boolean).
    pub fn is_text(self) -> bool {
        matches!(self, Kind::String | Kind::Text | Kind::Enum | Kind::Datetime | Kind::Email | Kind::Url)
    }

    /// Whether `min`/`max` apply (characters for text kinds, the value for numbers).
    pub fn has_bounds(self) -> bool {
        matches!(self, Kind::String | Kind::Text | Kind::Integer | Kind::Number)
    }

    /// Whether `.gte`/`.lte` filters apply.
    pub fn has_range_filter(self) -> bool {
        matches!(self, Kind::Integer | Kind::Number | Kind::Datetime)
    }

    /// Whether `search` applies (matched by `?q=`).
    pub fn searchable(self) -> bool {
        matches!(self, Kind::String | Kind::Text | Kind::Email | Kind::Url)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One declared field (`[resources.fields.<name>]`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Field {
    /// The key in JSON and the column name: `^[a-z][a-zA-Z0-9]{0,39}$`, not reserved.
    pub name: String,
    /// The type.
    pub kind: Kind,
    /// `false`: may be absent or null.
    pub required: bool,
    /// Lower bound: characters for string/text, the value for integer/number.
    pub min: Option<f64>,
    /// Upper bound, as `min`.
    pub max: Option<f64>,
    /// A duplicate value is refused (409 naming the field), by a unique index.
    pub unique: bool,
    /// May appear in `?sort=` (indexed).
    pub sort: bool,
    /// May appear as a query filter (indexed).
    pub filter: bool,
    /// Matched by `?q=` (case-insensitive contains).
    pub search: bool,
    /// Used on create (and on PUT) when the field is absent; already checked against the field.
    pub default: Option<serde_json::Value>,
    /// Enum: the allowed values, in declaration order.
    pub values: Vec<String>,
    /// Enum: from a state, the states a change may go to. Empty: any change is allowed.
    pub transitions: Vec<(String, Vec<String>)>,
    /// Ref: the resource whose record id this field holds (`"users"` or a declared resource).
    pub refers: Option<String>,
}

impl Field {
    /// A field of `kind` named `name` with every option at its default.
    pub fn new(name: &str, kind: Kind) -> Field {
        Field {
            name: name.to_string(),
            kind,
            required: false,
            min: None,
            max: None,
            unique: false,
            sort: false,
            filter: false,
            search: false,
            default: None,
            values: Vec::new(),
            transitions: Vec::new(),
            refers: None,
        }
    }

    /// Whether the database keeps an index on this field (filtered, sorted or unique).
    pub fn indexed(&self) -> bool {
        self.sort || self.filter || self.unique
    }

    /// Enum with transitions: the states a record in `from` may change to (`None`: any).
    pub fn next_states(&self, from: &str) -> Option<&[String]> {
        if self.transitions.is_empty() {
            return None;
        }
        Some(self.transitions.iter().find(|(s, _)| s == from).map_or(&[][..], |(_, to)| to.as_slice()))
    }

    /// Enum with transitions: whether a new record may start in `state` (no transition leads
    /// into it, or it is the default).
    pub fn may_start_in(&self, state: &str) -> bool {
        self.transitions.is_empty()
            || self.default.as_ref().and_then(|d| d.as_str()) == Some(state)
            || !self.transitions.iter().any(|(_, to)| to.iter().any(|t| t == state))
    }
}

/// A sort key: a field's name or `id`, `createdAt`, `updatedAt`; `desc` for a leading `-`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SortKey {
    /// The field or server-managed key.
    pub key: String,
    /// Descending.
    pub desc: bool,
}

/// One declared resource (`[[resources]]`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Resource {
    /// The collection, as in paths and the table name: `^[a-z][a-z0-9_]{0,39}$`, not reserved.
    pub name: String,
    /// `None`: top level; `Some("users")` or another resource: nested under its records.
    pub parent: Option<String>,
    /// Who may list and get records.
    pub read: Read,
    /// Who may create records.
    pub create: Create,
    /// Who may change a record.
    pub update: Write,
    /// Who may delete a record.
    pub delete: Write,
    /// Changes are pushed on `/api/events`.
    pub events: bool,
    /// The order of a list without `?sort=` (ties always broken by `id`); default `id`.
    pub default_sort: Vec<SortKey>,
    /// The fields, in declaration order.
    pub fields: Vec<Field>,
}

impl Resource {
    /// The field named `name`.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Whether records are nested under a parent's records.
    pub fn nested(&self) -> bool {
        self.parent.is_some()
    }
}

/// The server-managed keys of every record, in the order a record shows them after `id`.
pub const MANAGED: &[&str] = &["id", "ownerId", "parentId", "createdAt", "updatedAt"];

/// Keys a field may not be named: the managed keys, the list parameters, and the names a
/// JavaScript object treats specially.
pub const RESERVED_FIELDS: &[&str] = &[
    "id",
    "ownerId",
    "parentId",
    "userId",
    "createdAt",
    "updatedAt",
    "page",
    "limit",
    "sort",
    "q",
    "version",
    "token",
    "resources",
    "constructor",
    "prototype",
];

/// Names a resource may not take: the built-in path words and the store's own tables.
pub const RESERVED_NAMES: &[&str] = &[
    "users",
    "auth",
    "notifications",
    "events",
    "config",
    "chat",
    "health",
    "download",
    "redirect",
    "ws",
    "static",
    "openapi",
    "openapi_json",
    "homepage",
    "metrics",
    "api",
    "v1",
    "docs",
    "favicon",
    "token_families",
    "refresh_tokens",
    "forkd_schema",
    "forkd_resources",
    "sqlite_sequence",
    "sqlite_master",
];

/// The declared resources of one configuration: the built-in ones (unless redeclared) and the
/// operator's, in order, validated together.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registry {
    /// Every resource: the built-in `posts` first (unless the file declares its own), then
    /// the file's in declaration order.
    pub list: Vec<Resource>,
    /// The names of the resources the configuration file declared (the rest are built in).
    pub declared: Vec<String>,
}

impl Registry {
    /// The resource named `name`.
    pub fn get(&self, name: &str) -> Option<&Resource> {
        self.list.iter().find(|r| r.name == name)
    }

    /// The resources nested directly under `name` (`"users"` or a resource).
    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Resource> + 'a {
        self.list.iter().filter(move |r| r.parent.as_deref() == Some(name))
    }

    /// Every resource in an order where each comes after its parent and the resources it
    /// refers to (the order tables are created in); declarations are acyclic in parents,
    /// and a `ref` cycle is broken at the declaration order.
    pub fn in_dependency_order(&self) -> Vec<&Resource> {
        let mut out: Vec<&Resource> = Vec::with_capacity(self.list.len());
        let mut left: Vec<&Resource> = self.list.iter().collect();
        while !left.is_empty() {
            let before = left.len();
            left.retain(|r| {
                let ready = r.parent.as_deref().is_none_or(|p| p == "users" || out.iter().any(|o| o.name == p));
                if ready {
                    out.push(r);
                }
                !ready
            });
            if left.len() == before {
                out.append(&mut left);
            }
        }
        out
    }
}
