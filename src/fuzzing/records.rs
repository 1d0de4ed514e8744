//! The `records` fuzz target: a random declaration (the first bytes pick each field's type,
//! `required`, bounds and enum states) times a random JSON body (the rest). The record
//! validator must never panic; a body it accepts holds values each field's check accepts
//! again unchanged; a body built to be valid for the declaration is accepted; and what is
//! accepted is stored and read back from SQLite unchanged.
//!
//! The store is one SQLite file in the system's temporary directory, made on first use, with one table
//! holding a column for each type at each field position: every random declaration maps onto
//! it, so no table is created per input.

use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::app::resources::body;
use crate::resources::record::Record;
use crate::resources::value::{check, Cell};
use crate::resources::{Create, Field, Kind, Read, Registry, Resource, SortKey, Write};
use crate::store::records::{Scope, Viewer};
use crate::store::{NewUser, Role, Store};

/// Fields a random declaration has at most.
const MAX_FIELDS: usize = 6;

/// The storage side: the store, the registry with the wide table, and the one user.
struct Wide {
    store: Store,
    registry: &'static Registry,
    user: i64,
}

/// The column of the wide table holding field position `at` of type `kind`.
fn column(kind: Kind, at: usize) -> String {
    format!("{}{at}", kind.name())
}

fn wide() -> Option<&'static Wide> {
    static WIDE: OnceLock<Option<Wide>> = OnceLock::new();
    WIDE.get_or_init(|| {
        // One file per process, left for the OS's temporary-file clean-up (a fuzzer ends by
        // being killed, so nothing would run a clean-up of ours).
        let dir = std::env::temp_dir().join(format!("forkd-fuzz-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        let path = dir.join("fuzz.db");
        let mut fields = Vec::new();
        for at in 0..MAX_FIELDS {
            for (kind, _) in Kind::ALL {
                let mut f = Field::new(&column(kind, at), kind);
                if kind == Kind::Enum {
                    f.values = vec!["a".into(), "b".into(), "c".into()];
                }
                if kind == Kind::Ref {
                    f.refers = Some("users".into());
                }
                fields.push(f);
            }
        }
        let res = Resource {
            name: "wide".into(),
            parent: None,
            read: Read::SignedIn,
            create: Create::SignedIn,
            update: Write::Owner,
            delete: Write::Owner,
            events: false,
            default_sort: vec![SortKey { key: "id".into(), desc: false }],
            fields,
        };
        let registry: &'static Registry = Box::leak(Box::new(Registry { list: vec![res], declared: Vec::new() }));
        Store::migrate(&path).ok()?;
        Store::migrate_resources(&path, registry, crate::store::schema::Mode::All).ok()?;
        let store = Store::open(&path, 1).ok()?;
        let new = NewUser { name: "fuzz", email: "fuzz@example.com", password_hash: "x", age: None, role: Role::User };
        let user = store.create_user(&new).ok()?.id;
        Some(Wide { store, registry, user })
    })
    .as_ref()
}

/// A declaration from the first bytes of `data`; the rest is the body.
fn declaration(data: &[u8]) -> (Resource, &[u8]) {
    let n = data.first().map_or(1, |b| usize::from(b % MAX_FIELDS as u8) + 1);
    let mut at = 1;
    let mut fields = Vec::new();
    for i in 0..n {
        let b = |k: usize| data.get(at + k).copied().unwrap_or(0);
        let kind = Kind::ALL[usize::from(b(0)) % Kind::ALL.len()].0;
        let mut f = Field::new(&format!("f{i}"), kind);
        f.required = b(1) & 1 == 1;
        if kind.has_bounds() && b(1) & 2 == 2 {
            let low = f64::from(b(2) % 8);
            f.min = Some(low);
            f.max = Some(low + f64::from(b(3) % 16));
        }
        if kind == Kind::Enum {
            f.values = vec!["a".into(), "b".into(), "c".into()];
            if b(1) & 4 == 4 {
                f.transitions = vec![("a".into(), vec!["b".into()]), ("b".into(), vec!["c".into()])];
            }
        }
        if kind == Kind::Ref {
            f.refers = Some("users".into());
        }
        if b(1) & 8 == 8 && kind != Kind::Ref {
            f.default = Some(valid(&f, 0));
        }
        fields.push(f);
        at += 4;
    }
    let res = Resource {
        name: "items".into(),
        parent: None,
        read: Read::SignedIn,
        create: Create::SignedIn,
        update: Write::Owner,
        delete: Write::Owner,
        events: false,
        default_sort: vec![SortKey { key: "id".into(), desc: false }],
        fields,
    };
    (res, data.get(at..).unwrap_or(&[]))
}

/// A value `f` accepts (`user`: the id a ref names).
fn valid(f: &Field, user: i64) -> Value {
    let low = f.min.unwrap_or(0.0);
    match f.kind {
        Kind::String | Kind::Text => json!("a".repeat(low as usize)),
        Kind::Integer => json!(low as i64),
        Kind::Number => json!(low),
        Kind::Boolean => json!(true),
        Kind::Enum => json!("a"),
        Kind::Datetime => json!("2026-01-31T12:00:00+01:00"),
        Kind::Email => json!("a@example.com"),
        Kind::Url => json!("https://example.com/x"),
        Kind::Ref => json!(user),
    }
}

/// The fuzz target (see the module doc).
pub fn records(data: &[u8]) {
    let Some(wide) = wide() else { return };
    let (res, rest) = declaration(data);
    // A body built to be valid is accepted.
    let good: Map<String, Value> = res.fields.iter().map(|f| (f.name.clone(), valid(f, wide.user))).collect();
    let cells = body::create(&res, good).unwrap_or_else(|e| panic!("a valid body refused: {e:?} for {res:?}"));
    round_trip(wide, &res, &cells);
    // A random body: no panic; what is accepted re-checks unchanged and round-trips.
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(rest) else { return };
    let Ok(cells) = body::create(&res, map.clone()) else { return };
    for (f, c) in res.fields.iter().zip(&cells) {
        assert!(map.keys().all(|k| res.field(k).is_some()), "an unknown key accepted: {map:?}");
        if let Cell::Null = c {
            assert!(!f.required, "null accepted for required {}", f.name);
            continue;
        }
        assert_eq!(check(f, &c.to_json()).as_ref(), Ok(c), "{} does not re-check unchanged", f.name);
    }
    round_trip(wide, &res, &cells);
}

/// Store `cells` of `res` in the wide table and read them back: the same values.
fn round_trip(wide: &Wide, res: &Resource, cells: &[Cell]) {
    let Some(table) = wide.registry.list.first() else { return };
    let mut stored: Vec<Cell> = vec![Cell::Null; table.fields.len()];
    for (i, (f, c)) in res.fields.iter().zip(cells).enumerate() {
        if let Some(at) = table.fields.iter().position(|w| w.name == column(f.kind, i)) {
            stored[at] = c.clone();
        }
    }
    let scope = Scope { registry: wide.registry, res: table };
    let viewer = Viewer { user_id: wide.user, admin: false };
    let created = match wide.store.record_create(scope, viewer, wide.user, None, stored.clone()) {
        Ok(Ok((rec, _))) => rec,
        Ok(Err(refused)) => panic!("the store refused a valid record: {refused:?}"),
        Err(e) => panic!("store: {e}"),
    };
    let read: Option<Record> = wide.store.record_get(scope, created.id).unwrap_or_else(|e| panic!("store: {e}"));
    let read = read.unwrap_or_else(|| panic!("record {} not found", created.id));
    assert_eq!(read.cells, stored, "read back as stored");
    assert_eq!(created.cells, stored, "returned as stored");
    let _ = wide.store.record_delete(scope, created.id, |_| Ok::<(), ()>(()));
}
