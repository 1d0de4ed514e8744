//! The record calls and the schema step on both backends, through [`Store`]: declared tables
//! created by `migrate_resources`, then every rule the resource handlers rely on. The
//! PostgreSQL half needs `TEST_DATABASE_URL` (see `bin/pg-test-server`) and is skipped
//! without.

use std::convert::Infallible;

use super::*;
use crate::resources::record::Record;
use crate::resources::{builtin, Create, Field, Kind, Read, Write};
use crate::store::schema::Mode;
use crate::store::{pg, Logged, NewUser, Role, Store, Target};

/// The scenario `$f(target, store, registry)` as `$name::sqlite` and `$name::postgres`, on a
/// fresh database migrated with [`registry`].
macro_rules! both {
    ($name:ident, $f:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn sqlite() {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("forkd.db");
                run(Target::Sqlite(&path), $f);
            }

            #[test]
            fn postgres() {
                let Some(url) = pg::testutil::fresh_database(stringify!($name)) else { return };
                run(Target::Postgres(&url), $f);
            }
        }
    };
}

fn run(target: Target<'_>, f: impl FnOnce(Target<'_>, &Store, &'static Registry)) {
    Store::migrate(target).expect("migrate");
    let reg = registry();
    let plan = Store::migrate_resources(target, reg, Mode::Additive).expect("migrate resources");
    assert!(plan.applied && plan.destructive().next().is_none(), "{plan:?}");
    let store = Store::open(target, 2).expect("open");
    f(target, &store, reg);
}

fn field(name: &str, kind: Kind, f: impl FnOnce(&mut Field)) -> Field {
    let mut field = Field::new(name, kind);
    f(&mut field);
    field
}

fn resource(name: &str, parent: Option<&str>, read: Read, fields: Vec<Field>) -> Resource {
    Resource {
        name: name.into(),
        parent: parent.map(Into::into),
        read,
        create: Create::SignedIn,
        update: Write::Owner,
        delete: Write::Owner,
        events: true,
        default_sort: vec![SortKey { key: "id".into(), desc: false }],
        fields,
    }
}

/// posts; `notes` (every type, a unique slug, a ref to users); `secrets` (owner-only);
/// `hidden` (admin-only); `items` under notes, referring to secrets and hidden.
fn registry() -> &'static Registry {
    let notes = resource(
        "notes",
        None,
        Read::SignedIn,
        vec![
            field("title", Kind::String, |f| (f.required, f.sort, f.filter, f.search) = (true, true, true, true)),
            field("body", Kind::Text, |f| f.search = true),
            field("slug", Kind::String, |f| f.unique = true),
            field("score", Kind::Integer, |f| (f.sort, f.filter) = (true, true)),
            field("ratio", Kind::Number, |f| f.filter = true),
            field("done", Kind::Boolean, |f| f.filter = true),
            field("author", Kind::Ref, |f| f.refers = Some("users".into())),
        ],
    );
    let secrets = resource("secrets", None, Read::Owner, vec![field("text", Kind::Text, |_| {})]);
    let hidden = resource("hidden", None, Read::Admin, vec![field("text", Kind::Text, |_| {})]);
    let items = resource(
        "items",
        Some("notes"),
        Read::SignedIn,
        vec![
            field("secret", Kind::Ref, |f| f.refers = Some("secrets".into())),
            field("hidden", Kind::Ref, |f| f.refers = Some("hidden".into())),
        ],
    );
    let list = vec![builtin::posts(), notes, secrets, hidden, items];
    Box::leak(Box::new(Registry { declared: list.iter().skip(1).map(|r| r.name.clone()).collect(), list }))
}

fn scope(reg: &'static Registry, name: &str) -> Scope {
    Scope { registry: reg, res: reg.get(name).expect("declared") }
}

fn user(store: &Store, email: &str, role: Role) -> Viewer {
    let u = store
        .create_user(&NewUser { name: "n", email, password_hash: "$argon2id$fake", age: None, role })
        .expect("user");
    Viewer { user_id: u.id, admin: role == Role::Admin }
}

fn text(s: &str) -> Cell {
    Cell::Text(s.into())
}

/// A note's cells: title, body, slug, score, ratio, done, author.
fn note(title: &str, slug: Option<&str>, score: i64, done: bool) -> Vec<Cell> {
    vec![
        text(title),
        Cell::Null,
        slug.map_or(Cell::Null, text),
        Cell::Int(score),
        Cell::Num(0.5),
        Cell::Bool(done),
        Cell::Null,
    ]
}

fn create(store: &Store, s: Scope, v: Viewer, parent: Option<i64>, cells: Vec<Cell>) -> Result<Record, String> {
    match store.record_create(s, v, v.user_id, parent, cells).expect("store") {
        Ok((rec, _)) => Ok(rec),
        Err(Refused::Ref(f)) => Err(format!("ref {f}")),
        Err(Refused::Parent) => Err("parent".into()),
        Err(Refused::Guard(e)) => match e {},
    }
}

fn list(store: &Store, s: Scope, q: ListQuery) -> (Vec<i64>, u64) {
    let page = store.record_list(s, &ListQuery { page: q.page.max(1), limit: q.limit.max(20), ..q }).expect("list");
    (page.items.iter().map(|r| r.id).collect(), page.total)
}

both!(create_get_update_delete_with_change_events, |_t: Target<'_>, store: &Store, reg: &'static Registry| {
    let notes = scope(reg, "notes");
    let a = user(store, "a@x.io", Role::User);
    let mut cells = note("first", Some("first"), 3, true);
    cells[1] = text("line one\nline two");
    cells[6] = Cell::Int(a.user_id);
    let (rec, change) = store.record_create(notes, a, a.user_id, None, cells.clone()).expect("store").expect("created");
    assert_eq!(
        (rec.owner_id, rec.parent_id, &rec.cells),
        (a.user_id, None, &cells),
        "every type reads back as written"
    );
    assert_eq!(rec.created_at, rec.updated_at);
    assert_eq!(store.record_get(notes, rec.id).expect("get"), Some(rec.clone()));
    let change = change.expect("notes have events");
    assert_eq!((change.action, change.record_id, change.owner_id), (Action::Create, rec.id, a.user_id));

    let mut next = cells.clone();
    next[0] = text("changed");
    let seen = std::cell::Cell::new(0);
    let (updated, upd_change) = store
        .record_update(notes, a, rec.id, |current| {
            seen.set(current.id);
            Ok::<_, Infallible>(next.clone())
        })
        .expect("store")
        .expect("allowed")
        .expect("exists");
    assert_eq!(seen.get(), rec.id, "the guard saw the stored record");
    assert_eq!((updated.cells[0].clone(), updated.created_at.clone()), (text("changed"), rec.created_at.clone()));
    assert!(updated.updated_at >= rec.updated_at);
    let refused = store.record_update(notes, a, rec.id, |_| Err::<Vec<Cell>, _>("no")).expect("store");
    assert!(matches!(refused, Err(Refused::Guard("no"))));
    assert_eq!(store.record_get(notes, rec.id).expect("get"), Some(updated.clone()), "a refused update stores nothing");
    let missing = store.record_update(notes, a, rec.id + 100, |_| Ok::<_, Infallible>(next.clone())).expect("store");
    assert!(matches!(missing, Ok(None)));

    assert!(matches!(store.record_delete(notes, rec.id, |_| Err("no")).expect("store"), Err(Refused::Guard("no"))));
    let (gone, del_change) =
        store.record_delete(notes, rec.id, |_| Ok::<_, Infallible>(())).expect("store").expect("ok").expect("existed");
    assert_eq!(gone, updated);
    assert_eq!(store.record_get(notes, rec.id).expect("get"), None);
    assert!(matches!(store.record_delete(notes, rec.id, |_| Ok::<_, Infallible>(())).expect("store"), Ok(None)));

    let changes = [change, upd_change.expect("update event"), del_change.expect("delete event")];
    let logged: Vec<Logged> = store.events_after(0, 10).expect("log");
    assert_eq!(logged, changes.iter().cloned().map(Logged::Change).collect::<Vec<_>>(), "stored in order, as returned");
    let data: serde_json::Value = serde_json::from_slice(&changes[2].data).expect("json");
    assert_eq!((data["action"].as_str(), data["record"].is_null()), (Some("delete"), true));

    let posts = scope(reg, "posts");
    let (_, none) = store
        .record_create(posts, a, a.user_id, Some(a.user_id), vec![text("t"), text("")])
        .expect("store")
        .expect("created");
    assert!(none.is_none(), "posts have no events");
});

both!(filters_sort_search_and_pages, |_t: Target<'_>, store: &Store, reg: &'static Registry| {
    let notes = scope(reg, "notes");
    let (a, b) = (user(store, "a@x.io", Role::User), user(store, "b@x.io", Role::User));
    let mut ids = Vec::new();
    for (i, (title, score)) in
        [("Alpha", 5), ("beta", 2), ("100% pure", 5), ("under_score", 1), ("back\\slash", 9)].iter().enumerate()
    {
        let owner = if i % 2 == 0 { a } else { b };
        ids.push(create(store, notes, owner, None, note(title, None, *score, i < 2)).expect("create").id);
    }
    let f = |field: usize, op: Op, value: Cell| Filter { field, op, value };
    assert_eq!(list(store, notes, ListQuery::default()), (ids.clone(), 5));
    assert_eq!(
        list(store, notes, ListQuery { owner: Some(b.user_id), ..Default::default() }),
        (vec![ids[1], ids[3]], 2)
    );
    let q = ListQuery { filters: vec![f(3, Op::Gte, Cell::Int(2)), f(3, Op::Lte, Cell::Int(5))], ..Default::default() };
    assert_eq!(list(store, notes, q), (vec![ids[0], ids[1], ids[2]], 3));
    let q = ListQuery { filters: vec![f(5, Op::Eq, Cell::Bool(true))], ..Default::default() };
    assert_eq!(list(store, notes, q).0, [ids[0], ids[1]]);
    let q = ListQuery { filters: vec![f(4, Op::Eq, Cell::Num(0.5)), f(0, Op::Eq, text("beta"))], ..Default::default() };
    assert_eq!(list(store, notes, q).0, [ids[1]]);
    let search = |s: &str| list(store, notes, ListQuery { q: Some(s.into()), ..Default::default() }).0;
    assert_eq!(search("ALPHA"), [ids[0]], "case-insensitive");
    assert_eq!(search("%"), [ids[2]], "% is literal");
    assert_eq!(search("_"), [ids[3]], "_ is literal");
    assert_eq!(search("\\"), [ids[4]], "\\ is literal");
    assert_eq!(search("zzz"), Vec::<i64>::new());
    let sort = |keys: &[(&str, bool)]| keys.iter().map(|(k, d)| SortKey { key: (*k).into(), desc: *d }).collect();
    let q = ListQuery { sort: sort(&[("score", true)]), ..Default::default() };
    assert_eq!(
        list(store, notes, q).0,
        [ids[4], ids[2], ids[0], ids[1], ids[3]],
        "ties by id, in the last key's direction"
    );
    let q = ListQuery { sort: sort(&[("id", true)]), ..Default::default() };
    assert_eq!(list(store, notes, q).0, [ids[4], ids[3], ids[2], ids[1], ids[0]]);
    let q = ListQuery { sort: sort(&[("createdAt", true), ("title", false)]), ..Default::default() };
    assert_eq!(list(store, notes, q).1, 5);
    let page = |n| {
        let q = ListQuery { sort: sort(&[("score", false)]), page: n, limit: 2, ..Default::default() };
        store.record_list(notes, &q).expect("page")
    };
    let (p1, p2, p3) = (page(1), page(2), page(3));
    assert_eq!((p1.total, p1.total_pages, p1.page_size), (5, 3, 2));
    let walked: Vec<i64> = [p1, p2, p3].iter().flat_map(|p| p.items.iter().map(|r| r.id)).collect();
    assert_eq!(walked, [ids[3], ids[1], ids[0], ids[2], ids[4]], "stable across pages");
});

both!(unique_fields_refuse_duplicates, |_t: Target<'_>, store: &Store, reg: &'static Registry| {
    let notes = scope(reg, "notes");
    let a = user(store, "a@x.io", Role::User);
    let first = create(store, notes, a, None, note("x", Some("same"), 1, false)).expect("first");
    let dup = store.record_create(notes, a, a.user_id, None, note("y", Some("same"), 1, false));
    assert!(matches!(dup, Err(StoreError::Duplicate("slug"))), "{dup:?}");
    create(store, notes, a, None, note("y", None, 1, false)).expect("null is no duplicate");
    let other = create(store, notes, a, None, note("z", None, 1, false)).expect("a second null");
    let clash = store.record_update(notes, a, other.id, |_| Ok::<_, Infallible>(note("z", Some("same"), 1, false)));
    assert!(matches!(clash, Err(StoreError::Duplicate("slug"))), "{clash:?}");
    assert_eq!(list(store, notes, ListQuery::default()).1, 3, "nothing stored by the refused writes");
    assert!(store.record_get(notes, first.id).expect("get").is_some());
    let dup_user =
        store.create_user(&NewUser { name: "n", email: "A@X.IO", password_hash: "h", age: None, role: Role::User });
    assert!(matches!(dup_user, Err(StoreError::Duplicate("email"))), "users keep their own mapping");
});

both!(refs_must_name_a_readable_record, |_t: Target<'_>, store: &Store, reg: &'static Registry| {
    let (notes, secrets, hidden, items) =
        (scope(reg, "notes"), scope(reg, "secrets"), scope(reg, "hidden"), scope(reg, "items"));
    let (a, b, admin) =
        (user(store, "a@x.io", Role::User), user(store, "b@x.io", Role::User), user(store, "c@x.io", Role::Admin));
    let mut cells = note("n", None, 1, false);
    cells[6] = Cell::Int(b.user_id);
    let n = create(store, notes, a, None, cells.clone()).expect("a ref to any user");
    cells[6] = Cell::Int(b.user_id + 1000);
    assert_eq!(create(store, notes, a, None, cells), Err("ref author".into()));
    let a_secret = create(store, secrets, a, None, vec![text("s")]).expect("secret").id;
    let h = create(store, hidden, admin, None, vec![text("h")]).expect("hidden").id;
    let item = |secret: Cell, hidden: Cell| vec![secret, hidden];
    create(store, items, a, Some(n.id), item(Cell::Int(a_secret), Cell::Null)).expect("one's own secret");
    assert_eq!(create(store, items, b, Some(n.id), item(Cell::Int(a_secret), Cell::Null)), Err("ref secret".into()));
    create(store, items, admin, Some(n.id), item(Cell::Int(a_secret), Cell::Int(h))).expect("an admin reads all");
    assert_eq!(create(store, items, a, Some(n.id), item(Cell::Null, Cell::Int(h))), Err("ref hidden".into()));
    assert_eq!(create(store, items, a, Some(n.id + 1000), item(Cell::Null, Cell::Null)), Err("parent".into()));
    let own = create(store, items, b, Some(n.id), item(Cell::Null, Cell::Null)).expect("item");
    let refused = store.record_update(items, b, own.id, |_| Ok::<_, Infallible>(item(Cell::Int(a_secret), Cell::Null)));
    assert!(matches!(refused, Ok(Err(Refused::Ref("secret")))), "{refused:?}");
    assert_eq!(list(store, items, ListQuery::default()).1, 3, "refused creates stored nothing");
});

both!(cascades_and_ids, |_t: Target<'_>, store: &Store, reg: &'static Registry| {
    let (notes, items, posts) = (scope(reg, "notes"), scope(reg, "items"), scope(reg, "posts"));
    let (a, b) = (user(store, "a@x.io", Role::User), user(store, "b@x.io", Role::User));
    let n1 = create(store, notes, a, None, note("1", None, 1, false)).expect("note").id;
    let n2 = create(store, notes, a, None, note("2", None, 1, false)).expect("note").id;
    let i1 = create(store, items, b, Some(n1), vec![Cell::Null, Cell::Null]).expect("item").id;
    let i2 = create(store, items, b, Some(n2), vec![Cell::Null, Cell::Null]).expect("item").id;
    store.record_delete(notes, n1, |_| Ok::<_, Infallible>(())).expect("store").expect("ok").expect("existed");
    assert_eq!(store.record_get(items, i1).expect("get"), None, "children go with their parent");
    assert!(store.record_get(items, i2).expect("get").is_some());
    let p = create(store, posts, b, Some(b.user_id), vec![text("t"), text("")]).expect("post").id;
    assert!(store.delete_user(b.user_id).expect("delete b"));
    assert_eq!(store.record_get(items, i2).expect("get"), None, "what a deleted user owns goes too");
    assert_eq!(store.record_get(posts, p).expect("get"), None, "posts too");
    assert!(store.record_get(notes, n2).expect("get").is_some(), "a's note stays");
    store.record_delete(notes, n2, |_| Ok::<_, Infallible>(())).expect("store").expect("ok").expect("existed");
    let n3 = create(store, notes, a, None, note("3", None, 1, false)).expect("note").id;
    assert!(n3 > n2, "the newest id, deleted, is not given again ({n3} after {n2})");
    let c = user(store, "c@x.io", Role::User);
    let i3 = create(store, items, c, Some(n3), vec![Cell::Null, Cell::Null]).expect("item").id;
    assert!(i3 > i2);
});

both!(schema_changes_apply_or_are_refused, |t: Target<'_>, store: &Store, reg: &'static Registry| {
    let notes = scope(reg, "notes");
    let a = user(store, "a@x.io", Role::User);
    let kept = create(store, notes, a, None, note("kept", None, 4, false)).expect("note");
    store.close();
    let plan = |r: &Registry, mode| Store::migrate_resources(t, r, mode).expect("schema");
    assert!(plan(reg, Mode::Plan).is_empty(), "applied and recorded");

    // Additive: a new field with a default, a new sorted field, a new resource.
    let mut next = reg.clone();
    let n = next.list.iter_mut().find(|r| r.name == "notes").expect("notes");
    n.fields.push(field("views", Kind::Integer, |f| (f.required, f.default) = (true, Some(serde_json::json!(7)))));
    n.fields.push(field("tag", Kind::String, |f| f.sort = true));
    next.list.push(resource("extras", Some("notes"), Read::Public, vec![field("x", Kind::Integer, |_| {})]));
    let next: &'static Registry = Box::leak(Box::new(next));
    let added = plan(next, Mode::Additive);
    assert!(added.applied && added.destructive().next().is_none(), "{added:?}");
    let store = Store::open(t, 2).expect("open");
    let got = store.record_get(scope(next, "notes"), kept.id).expect("get").expect("kept");
    assert_eq!(got.cells[7..], [Cell::Int(7), Cell::Null], "the default filled in");
    create(&store, scope(next, "extras"), a, Some(kept.id), vec![Cell::Int(1)]).expect("the new table works");
    store.close();
    assert!(plan(next, Mode::Plan).is_empty(), "a second plan agrees once applied");

    // Destructive: back to the first registry drops `views`, `tag` and `extras`: refused.
    let refused = plan(reg, Mode::Additive);
    assert!(!refused.applied);
    let mut lines: Vec<&str> = refused.destructive().map(|s| s.line.as_str()).collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[0].starts_with("resources.extras: removed (destructive"), "{lines:#?}");
    assert!(lines[1].starts_with("resources.notes.fields.tag: removed (destructive"), "{lines:#?}");
    assert!(lines[2].starts_with("resources.notes.fields.views: removed (destructive"), "{lines:#?}");
    assert!(plan(next, Mode::Plan).is_empty(), "nothing applied");
    assert!(plan(reg, Mode::All).applied);
    assert!(plan(reg, Mode::Plan).is_empty());
    let store = Store::open(t, 2).expect("open");
    let got = store.record_get(notes, kept.id).expect("get").expect("kept");
    assert_eq!(got.cells.len(), 7);
    assert_eq!(got.cells[0], text("kept"));
});

both!(a_parent_and_its_child_removed_together, |t: Target<'_>, store: &Store, reg: &'static Registry| {
    let (notes, items) = (scope(reg, "notes"), scope(reg, "items"));
    let a = user(store, "a@x.io", Role::User);
    let n = create(store, notes, a, None, note("n", None, 1, false)).expect("note");
    create(store, items, a, Some(n.id), vec![Cell::Null, Cell::Null]).expect("item");
    store.close();
    // A child recorded after its parent, whichever order the records are read in.
    let mut more = reg.clone();
    more.list.push(resource("zchildren", Some("notes"), Read::Public, vec![field("x", Kind::Integer, |_| {})]));
    assert!(Store::migrate_resources(t, &more, Mode::Additive).expect("added").applied);
    let mut fewer = reg.clone();
    fewer.list.retain(|r| r.name != "notes" && r.name != "items");
    let plan = Store::migrate_resources(t, &fewer, Mode::All).expect("the child's table goes first");
    assert!(plan.applied && plan.destructive().count() == 3, "{plan:?}");
    assert!(Store::migrate_resources(t, &fewer, Mode::Plan).expect("plan").is_empty());
});
