//! One set of scenarios run against both backends, through [`Store`]: what the handlers rely
//! on must hold on SQLite and on PostgreSQL alike. The PostgreSQL half needs a server
//! (`TEST_DATABASE_URL`, see `bin/pg-test-server`) and is skipped, saying so, without.

use std::time::Duration;

use super::*;

/// The scenario `$f` as two tests: `$name::sqlite` and `$name::postgres`.
macro_rules! both {
    ($name:ident, $f:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn sqlite() {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("forkd.db");
                Store::migrate(&path).expect("migrate");
                let store = Store::open(&path, 2).expect("open");
                $f(&store);
            }

            #[test]
            fn postgres() {
                let Some(url) = pg::testutil::fresh_database(stringify!($name)) else { return };
                Store::migrate(Target::Postgres(&url)).expect("migrate");
                let store = Store::open(Target::Postgres(&url), 2).expect("open");
                $f(&store);
            }
        }
    };
}

use records::testing::{add_post, posts};

/// Delete post `id`; whether it existed.
fn delete_post(store: &Store, id: i64) -> bool {
    let deleted = store.record_delete(posts(), id, |_| Ok::<_, std::convert::Infallible>(())).expect("store");
    matches!(deleted, Ok(Some(_)))
}

fn new_user<'a>(name: &'a str, email: &'a str, age: Option<i64>, role: Role) -> NewUser<'a> {
    NewUser { name, email, password_hash: "$argon2id$fake", age, role }
}

fn query(sort: Vec<(UserSort, bool)>) -> UserQuery {
    UserQuery { role: None, q: None, sort, page: 1, limit: 20 }
}

const NOW: i64 = 1_800_000_000;

both!(users_and_emails, |store: &Store| {
    store.ping().expect("ping");
    let alice = store.create_user(&new_user("Alice", "Alice@Example.com", Some(30), Role::Admin)).expect("create");
    assert_eq!(alice.created_at, alice.updated_at);
    assert_eq!(alice.created_at.len(), "2026-11-22T10:00:00.123Z".len(), "{}", alice.created_at);
    assert!(alice.created_at.ends_with('Z') && alice.created_at.as_bytes()[10] == b'T', "{}", alice.created_at);
    assert_eq!(store.get_user(alice.id).expect("get"), Some(alice.clone()));
    assert_eq!(store.with_user(alice.id, |u| u == alice.borrowed()).expect("with_user"), Some(true));
    assert_eq!(store.with_user(alice.id + 100, |_| ()).expect("with_user"), None);
    let dup = store.create_user(&new_user("Other", "alice@EXAMPLE.COM", None, Role::User));
    assert!(matches!(dup, Err(StoreError::Duplicate("email"))), "{dup:?}");
    let (found, hash) = store.user_by_email("ALICE@example.com").expect("by email").expect("found");
    assert_eq!((found, hash.as_str()), (alice.clone(), "$argon2id$fake"));
    assert!(store.user_by_email("nobody@example.com").expect("by email").is_none());

    let bob = store.create_user(&new_user("Bob", "bob@x.io", None, Role::User)).expect("create");
    let taken = UserChanges { email: Some("BOB@X.IO".into()), ..Default::default() };
    assert!(matches!(store.update_user(alice.id, &taken), Err(StoreError::Duplicate("email"))));
    let recase = UserChanges { email: Some("ALICE@example.com".into()), age: Some(None), ..Default::default() };
    let changed = store.update_user(alice.id, &recase).expect("own e-mail re-cased").expect("exists").user;
    assert_eq!((changed.email.as_str(), changed.age, changed.name.as_str()), ("ALICE@example.com", None, "Alice"));
    assert!(changed.updated_at >= alice.updated_at && changed.created_at == alice.created_at);
    assert_eq!(store.update_user(9999, &UserChanges::default()).expect("update"), None);

    let post = add_post(store, bob.id, "t").expect("post");
    store.insert_refresh("h1", "fam", bob.id, 0, NOW + 100).expect("token");
    assert!(store.delete_user(bob.id).expect("delete"));
    assert!(!store.delete_user(bob.id).expect("delete again"));
    assert_eq!(store.record_get(posts(), post.id).expect("get"), None, "posts go with their author");
    assert_eq!(store.rotate_refresh("h1", "h2", NOW, NOW + 10).expect("rotate"), Rotation::Invalid);
});

both!(ids_are_never_given_twice, |store: &Store| {
    // SQLite: `AUTOINCREMENT` (migration 3). PostgreSQL: `BIGSERIAL` draws from a sequence,
    // which never hands a value out twice. Either way the newest row, deleted, keeps its id.
    let a = store.create_user(&new_user("a", "a@x.io", None, Role::User)).expect("user").id;
    let b = store.create_user(&new_user("b", "b@x.io", None, Role::User)).expect("user").id;
    let p1 = add_post(store, a, "t").expect("post").id;
    let p2 = add_post(store, a, "t").expect("post").id;
    assert!(delete_post(store, p2), "delete the newest post");
    assert!(store.delete_user(b).expect("delete the newest user"));
    let c = store.create_user(&new_user("c", "c@x.io", None, Role::User)).expect("user").id;
    assert!(c > b, "a new user got id {c}, the deleted newest one had {b}");
    let p3 = add_post(store, a, "t").expect("post").id;
    assert!(p3 > p2 && p2 > p1, "a new post got id {p3}, the deleted newest one had {p2}");
    assert!(store.delete_user(a).expect("delete a user with posts"));
    let d = store.create_user(&new_user("d", "d@x.io", None, Role::User)).expect("user").id;
    assert!(d > c);
    assert_eq!(add_post(store, d, "t").expect("post").id, p3 + 1, "posts deleted by the cascade too");
});

both!(token_generation_follows_password_and_role, |store: &Store| {
    let u = store.create_user(&new_user("u", "u@x.io", None, Role::User)).expect("user");
    assert_eq!((u.token_gen, store.token_gen(u.id).expect("gen")), (0, Some(0)));
    let change = |c: UserChanges| store.update_user(u.id, &c).expect("update").expect("exists");
    let name = change(UserChanges { name: Some("n".into()), email: Some("U@x.io".into()), ..Default::default() });
    assert_eq!((name.revoked, name.user.token_gen), (false, 0), "name and e-mail leave tokens alone");
    let same_role = change(UserChanges { role: Some(Role::User), ..Default::default() });
    assert_eq!((same_role.revoked, same_role.user.token_gen), (false, 0), "the role it already has");
    let promoted = change(UserChanges { role: Some(Role::Admin), ..Default::default() });
    assert_eq!((promoted.revoked, promoted.user.token_gen, promoted.user.role), (true, 1, Role::Admin));
    let password = change(UserChanges { password_hash: Some("$argon2id$new".into()), ..Default::default() });
    assert_eq!((password.revoked, password.user.token_gen), (true, 2));
    assert_eq!(store.password_hash(u.id).expect("hash").as_deref(), Some("$argon2id$new"));
    let (found, hash) = store.user_by_email("u@x.io").expect("by e-mail").expect("found");
    assert_eq!((found.token_gen, hash.as_str()), (2, "$argon2id$new"));
    assert_eq!(store.get_user(u.id).expect("get").map(|u| u.token_gen), Some(2));
    let both = change(UserChanges {
        role: Some(Role::User),
        password_hash: Some("$argon2id$newer".into()),
        ..Default::default()
    });
    assert_eq!((both.revoked, both.user.token_gen), (true, 3), "one change, one step");
    let json = serde_json::to_value(&both.user).expect("json");
    assert!(json.get("tokenGen").is_none() && json.get("token_gen").is_none(), "never shown: {json}");

    // A refresh-token family is bound to the generation of its login.
    store.insert_refresh("old", "before", u.id, 3, NOW + 100).expect("insert");
    store.insert_refresh("stale", "raced", u.id, 2, NOW + 100).expect("a login that read the old generation");
    change(UserChanges { password_hash: Some("$argon2id$newest".into()), ..Default::default() });
    assert_eq!(store.rotate_refresh("old", "x1", NOW, NOW + 200).expect("rotate"), Rotation::Invalid);
    assert_eq!(store.rotate_refresh("stale", "x2", NOW, NOW + 200).expect("rotate"), Rotation::Invalid);
    store.insert_refresh("new", "after", u.id, 4, NOW + 100).expect("insert");
    assert_eq!(
        store.rotate_refresh("new", "x3", NOW, NOW + 200).expect("rotate"),
        Rotation::Rotated { user_id: u.id, gen: 4 }
    );

    assert!(store.delete_user(u.id).expect("delete"));
    assert_eq!((store.token_gen(u.id).expect("gen"), store.password_hash(u.id).expect("hash")), (None, None));
    assert_eq!(store.rotate_refresh("x3", "x4", NOW, NOW + 200).expect("rotate"), Rotation::Invalid);
});

both!(list_filters_sorts_and_pages, |store: &Store| {
    let rows = [
        ("b", Some(30), Role::User),
        ("a", Some(30), Role::Admin),
        ("c", None, Role::User),
        ("B", Some(20), Role::User),
        ("100% snake_case", Some(20), Role::User),
        ("'; DROP TABLE users; --", None, Role::User),
    ];
    for (i, (name, age, role)) in rows.into_iter().enumerate() {
        store.create_user(&new_user(name, &format!("u{i}@x.io"), age, role)).expect("create");
    }
    let names = |page: Page<User>| page.items.into_iter().map(|u| u.name).collect::<Vec<_>>();
    let search =
        |q: &str, role| names(store.list_users(&UserQuery { role, q: Some(q.into()), ..query(vec![]) }).expect("list"));
    assert_eq!(search("0%", None), ["100% snake_case"]);
    assert_eq!(search("E_C", None), ["100% snake_case"], "case-insensitive, `_` literal");
    assert_eq!(search("x_c", None), Vec::<String>::new());
    assert_eq!(search("'; drop", None), ["'; DROP TABLE users; --"]);
    assert_eq!(search("", Some(Role::Admin)), ["a"]);
    let sorted = |sort| names(store.list_users(&query(sort)).expect("list"));
    assert_eq!(
        sorted(vec![(UserSort::Name, false)]),
        ["'; DROP TABLE users; --", "100% snake_case", "B", "a", "b", "c"],
        "byte order"
    );
    assert_eq!(
        sorted(vec![(UserSort::Age, false), (UserSort::Id, false)])[..2],
        ["c".to_string(), "'; DROP TABLE users; --".to_string()],
        "nulls first ascending"
    );
    assert_eq!(
        sorted(vec![(UserSort::Age, true)])[4..],
        ["c".to_string(), "'; DROP TABLE users; --".to_string()],
        "nulls last descending"
    );
    let by_email_desc = store.list_users(&query(vec![(UserSort::Email, true)])).expect("list");
    assert_eq!(by_email_desc.items.first().map(|u| u.email.as_str()), Some("u5@x.io"));
    let page = store.list_users(&UserQuery { page: 2, limit: 4, ..query(vec![]) }).expect("list");
    assert_eq!((page.total, page.total_pages, page.items.len(), page.items[0].id), (6, 2, 2, 5));
    let past = store.list_users(&UserQuery { page: 9, limit: 4, ..query(vec![]) }).expect("list");
    assert_eq!((past.total, past.items.len()), (6, 0));
});

both!(posts_newest_first, |store: &Store| {
    let a = store.create_user(&new_user("a", "a@x.io", None, Role::User)).expect("user").id;
    for i in 0..5 {
        add_post(store, a, &format!("a{i}")).expect("create");
    }
    let q = |parent| records::ListQuery {
        parent: Some(parent),
        sort: posts().res.default_sort.clone(),
        page: 1,
        limit: 2,
        ..Default::default()
    };
    let page = store.record_list(posts(), &q(a)).expect("list");
    let titles: Vec<Option<&str>> = page.items.iter().map(|p| p.cells[0].as_str()).collect();
    assert_eq!((titles, page.total, page.total_pages), (vec![Some("a4"), Some("a3")], 5, 3));
    assert!(delete_post(store, page.items[0].id));
    assert!(!delete_post(store, page.items[0].id), "delete again");
    assert!(matches!(add_post(store, 9999, "t"), Err(StoreError::Sql(_))), "unknown author");
    assert_eq!(store.record_list(posts(), &q(9999)).expect("list").total, 0);
});

both!(refresh_families, |store: &Store| {
    let uid = store.create_user(&new_user("u", "u@x.io", None, Role::User)).expect("user").id;
    store.insert_refresh("h1", "fam", uid, 0, NOW + 100).expect("insert");
    assert!(matches!(store.insert_refresh("h1", "fam", uid, 0, NOW), Err(StoreError::Duplicate("hash"))));
    assert_eq!(
        store.rotate_refresh("h1", "h2", NOW, NOW + 200).expect("rotate"),
        Rotation::Rotated { user_id: uid, gen: 0 }
    );
    assert_eq!(store.rotate_refresh("h1", "h3", NOW, NOW + 200).expect("reuse"), Rotation::Reused);
    assert_eq!(store.rotate_refresh("h2", "h4", NOW, NOW + 200).expect("revoked"), Rotation::Invalid);
    assert_eq!(store.rotate_refresh("nope", "h5", NOW, NOW + 200).expect("unknown"), Rotation::Invalid);
    store.insert_refresh("e1", "expired", uid, 0, NOW).expect("insert");
    assert_eq!(store.rotate_refresh("e1", "e2", NOW, NOW + 200).expect("expired"), Rotation::Invalid);
    store.insert_refresh("l1", "live", uid, 0, NOW + 10).expect("insert");
    assert_eq!(
        store.rotate_refresh("l1", "l2", NOW, NOW + 200).expect("rotate"),
        Rotation::Rotated { user_id: uid, gen: 0 }
    );
    assert!(store.revoke_family("g0").is_ok_and(|known| !known));
    store.insert_refresh("g1", "gone", uid, 0, NOW + 100).expect("insert");
    assert!(store.revoke_family("g1").expect("logout"));
    assert_eq!(store.rotate_refresh("g1", "g2", NOW, NOW + 200).expect("after logout"), Rotation::Invalid);
    // "expired" and "gone" have no token alive at NOW + 150; "fam" (h2) and "live" (l2) do,
    // and "live" keeps its spent l1.
    assert_eq!(store.purge_expired_families(NOW + 150).expect("purge"), 2);
    assert_eq!(store.purge_expired_families(NOW + 150).expect("again"), 0);
    assert_eq!(store.rotate_refresh("l1", "l3", NOW + 150, NOW + 300).expect("replay"), Rotation::Reused);
});

both!(one_of_two_concurrent_rotations_wins, |store: &Store| {
    let uid = store.create_user(&new_user("u", "u@x.io", None, Role::User)).expect("user").id;
    for round in 0..5 {
        let (old, family) = (format!("r{round}"), format!("f{round}"));
        store.insert_refresh(&old, &family, uid, 0, NOW + 100).expect("insert");
        let barrier = std::sync::Barrier::new(2);
        let outcomes: Vec<Rotation> = std::thread::scope(|s| {
            let spawn = |n: u8| {
                let (old, barrier) = (&old, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    store.rotate_refresh(old, &format!("{old}-{n}"), NOW, NOW + 200).expect("rotate")
                })
            };
            let (a, b) = (spawn(1), spawn(2));
            vec![a.join().expect("join"), b.join().expect("join")]
        });
        assert!(
            outcomes.contains(&Rotation::Rotated { user_id: uid, gen: 0 }) && outcomes.contains(&Rotation::Reused),
            "{outcomes:?}"
        );
    }
});

both!(notifications_replay_in_order, |store: &Store| {
    let ids: Vec<i64> = (0..5).map(|i| store.create_notification(&format!("t{i}"), "b").expect("create").id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let after: Vec<i64> = store.notifications_after(ids[1], 100).expect("after").iter().map(|n| n.id).collect();
    assert_eq!(after, ids[2..]);
    let newest: Vec<i64> = store.notifications_after(0, 2).expect("after").iter().map(|n| n.id).collect();
    assert_eq!(newest, ids[3..]);
});

both!(closed_store_is_unavailable, |store: &Store| {
    store.ping().expect("ping");
    store.close();
    store.close();
    assert!(matches!(store.ping(), Err(StoreError::Unavailable(_))));
});

#[test]
fn postgres_unmigrated_database_is_refused_then_served_after_migrate() {
    let Some(url) = pg::testutil::fresh_database("unmigrated") else { return };
    let store = Store::open(Target::Postgres(&url), 1).expect("open connects to nothing");
    match store.ping() {
        Err(StoreError::Unavailable(m)) => {
            let wanted = format!("schema version 0, expected {}", migrations::latest_version());
            assert!(m.contains(&wanted), "{m}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Two hosts migrating at once: the advisory lock makes one wait, both succeed.
    std::thread::scope(|s| {
        let a = s.spawn(|| Store::migrate(Target::Postgres(&url)));
        let b = s.spawn(|| Store::migrate(Target::Postgres(&url)));
        a.join().expect("join").expect("migrate a");
        b.join().expect("join").expect("migrate b");
    });
    store.ping().expect("served once migrated, without reopening");
}

#[test]
fn postgres_unreachable_fails_fast_as_unavailable() {
    // A port nothing listens on: refused at once, never a hang.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let url: crate::config::DatabaseUrl = format!("postgres://forkd@127.0.0.1:{port}/forkd").parse().expect("url");
    let start = std::time::Instant::now();
    assert!(matches!(Store::migrate(Target::Postgres(&url)), Err(StoreError::Unavailable(_))));
    let store = Store::open(Target::Postgres(&url), 2).expect("open is lazy");
    match store.ping() {
        Err(StoreError::Unavailable(m)) => assert!(m.contains(&format!("127.0.0.1:{port}")), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
}

#[test]
fn postgres_that_never_answers_is_bounded_by_the_connect_timeout_then_fails_at_once() {
    // A socket that completes the TCP handshake (the kernel's backlog) but never speaks:
    // what a paused server or a stuck proxy looks like to a new connection.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let url: crate::config::DatabaseUrl = format!("postgres://forkd@127.0.0.1:{port}/forkd").parse().expect("url");
    let store = Store::open(Target::Postgres(&url), 2).expect("open is lazy");
    let start = std::time::Instant::now();
    assert!(matches!(store.ping(), Err(StoreError::Unavailable(_))));
    let first = start.elapsed();
    assert!(first >= Duration::from_millis(1500) && first < Duration::from_secs(4), "{first:?}");
    // Right after, calls do not wait again: a pool thread is not held per request.
    let start = std::time::Instant::now();
    match store.ping() {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("next one in"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_millis(100), "{:?}", start.elapsed());
    drop(listener);
}

#[test]
fn postgres_notification_ids_commit_in_the_order_they_are_drawn() {
    use std::str::FromStr;
    assert!(pg::records::INSERT_NOTIFICATION.contains(&pg::records::NOTIFY_LOCK_KEY.to_string()));
    let Some(url) = pg::testutil::fresh_database("notify_order") else { return };
    Store::migrate(Target::Postgres(&url)).expect("migrate");
    let store = Store::open(Target::Postgres(&url), 2).expect("open");
    // Another host's insert: its id drawn, its transaction not yet committed.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let config = tokio_postgres::Config::from_str(url.expose()).expect("url parses");
    let client = rt.block_on(async {
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client.batch_execute("BEGIN").await.expect("begin");
        client
    });
    let first: i64 = rt
        .block_on(client.query_one(pg::records::INSERT_NOTIFICATION, &[&"first", &"b"]))
        .expect("insert in the open transaction")
        .get(0);
    std::thread::scope(|scope| {
        let second = scope.spawn(|| store.create_notification("second", "b"));
        // The second insert must wait for the first's lock (bounded readiness check, no sleep
        // standing in for it): without the lock it would commit a larger id at once while the
        // first, smaller one is still invisible, and a replay from the larger would skip it.
        let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                       AND objid = $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
        // A 64-bit advisory key shows in pg_locks as classid (high half) and objid (low half).
        let objid = u32::try_from(pg::records::NOTIFY_LOCK_KEY & 0xffff_ffff).expect("low half");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let n: i64 = rt.block_on(client.query_one(waiting, &[&objid])).expect("pg_locks").get(0);
            if n == 1 {
                break;
            }
            assert!(!second.is_finished(), "the second insert did not wait for the first to commit");
            assert!(std::time::Instant::now() < deadline, "the second insert never waited on the lock");
            std::thread::sleep(Duration::from_millis(10));
        }
        rt.block_on(client.batch_execute("COMMIT")).expect("commit");
        let second = second.join().expect("join").expect("second insert");
        assert!(second.id > first, "{} after {first}", second.id);
        let replay: Vec<i64> = store.notifications_after(0, 10).expect("replay").iter().map(|n| n.id).collect();
        assert_eq!(replay, vec![first, second.id]);
    });
}

#[test]
fn postgres_reads_from_many_threads_share_one_connection_and_survive_its_end() {
    use std::str::FromStr;
    let Some(url) = pg::testutil::fresh_database("shared_reads") else { return };
    Store::migrate(Target::Postgres(&url)).expect("migrate");
    let store = Store::open(Target::Postgres(&url), 4).expect("open");
    let user = store.create_user(&new_user("Shared", "shared@example.com", None, Role::User)).expect("create");
    // An observer on its own connection: how many sessions the store holds on this database.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let config = tokio_postgres::Config::from_str(url.expose()).expect("url parses");
    let client = rt.block_on(async {
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client
    });
    let sessions = |what: &str| -> i64 {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND application_name = 'forkd' AND {what}"
        );
        rt.block_on(client.query_one(&sql, &[])).expect("pg_stat_activity").get(0)
    };
    // The first read opens the shared connection (the create above leased one of its own).
    store.get_user(user.id).expect("read").expect("found");
    let before = sessions("true");
    // Four threads reading at once, 200 reads each: with a connection per call they would
    // hold four; sharing, they open none.
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    assert_eq!(store.get_user(user.id).expect("read").expect("found").id, user.id);
                }
            });
        }
    });
    assert_eq!(sessions("true"), before, "concurrent reads opened connections of their own");
    // The server ends every session of the store: reads fail at most once, then a fresh
    // shared connection serves them.
    let killed: i64 = rt
        .block_on(client.query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = 'forkd') t",
            &[],
        ))
        .expect("terminate")
        .get(0);
    assert!(killed >= 1, "no session to end");
    let mut failed = 0;
    for _ in 0..5 {
        match store.get_user(user.id) {
            Ok(found) => assert_eq!(found.expect("found").id, user.id),
            Err(StoreError::Unavailable(_)) => failed += 1,
            Err(other) => panic!("expected Unavailable or a row, got {other:?}"),
        }
    }
    assert!(failed <= 1, "{failed} of 5 reads failed after the connection ended");
    assert!(store.get_user(user.id).expect("read after recovery").is_some());
}

#[test]
fn postgres_over_tls_verifies_the_server_certificate() {
    use std::str::FromStr;
    let Some(url) = pg::testutil::fresh_database("tls") else { return };
    let Some(dir) = std::env::var("TEST_DATABASE_TLS_DIR").ok().filter(|v| !v.is_empty()) else {
        eprintln!("skipped: TEST_DATABASE_TLS_DIR not set (bin/pg-test-server sets it when openssl is there)");
        return;
    };
    let sep = if url.expose().contains('?') { '&' } else { '?' };
    let with = |ca: &str| -> crate::config::DatabaseUrl {
        format!("{}{sep}sslmode=verify-full&sslrootcert={dir}/{ca}", url.expose()).parse().expect("url")
    };
    let tls = with("ca.pem");
    Store::migrate(Target::Postgres(&tls)).expect("migrate over TLS");
    let store = Store::open(Target::Postgres(&tls), 2).expect("open");
    store.ping().expect("a read over TLS");
    store.create_user(&new_user("Tls", "tls@example.com", None, Role::User)).expect("a write over TLS");
    // The server says the store's sessions are encrypted.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let config = tokio_postgres::Config::from_str(url.expose()).expect("url parses");
    let encrypted: i64 = rt.block_on(async {
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        let sql = "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                   WHERE a.datname = current_database() AND a.application_name = 'forkd' AND s.ssl";
        client.query_one(sql, &[]).await.expect("pg_stat_ssl").get(0)
    });
    assert!(encrypted >= 1, "no TLS session of the store on the server");
    // A server whose certificate another CA signed is refused, at once, as unavailable.
    let wrong = Store::open(Target::Postgres(&with("other-ca.pem")), 1).expect("open is lazy");
    let start = std::time::Instant::now();
    match wrong.ping() {
        Err(StoreError::Unavailable(m)) => assert!(m.to_lowercase().contains("certificate"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    // A root file that is not there: the store does not open (the supervisor's start says why).
    match Store::open(Target::Postgres(&with("missing.pem")), 1) {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("missing.pem"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
