//! Change events of declared resources on `/api/events` (`events = true`): a stream knows its
//! user (`Authorization: Bearer` or `?token=`; a bad token is 401), `?resources=` narrows it,
//! and a change reaches exactly the streams whose caller may read the record, on every worker
//! and across hosts (Redis). "Never" is bounded without sleeps: after the change, a public
//! change (or a notification) is published, and a stream that must not see the first one gets
//! the second one as its next event.
//!
//! Live changes here are published through `POST /_debug/change` (the call the resource
//! handlers make after a commit, without the store), and stored ones are written into the
//! store's `notifications` table as the record calls write them, so the fan-out's filter and
//! the replay's are tested on their own; one test makes real writes through the resource
//! routes (store, commit, bus) on two workers.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

/// An `owner`-read resource and a `public` one, both with events, and the built-in `posts`
/// (no events).
const RESOURCES: &str = r#"name = "notes"
read = "owner"
create = "signed_in"
update = "owner"
delete = "owner"
events = true
[resources.fields.title]
type = "string"
required = true
max = 200

[[resources]]
name = "news"
read = "public"
create = "signed_in"
update = "owner"
delete = "owner"
events = true
[resources.fields.title]
type = "string"
required = true"#;

fn server(workers: usize) -> Server {
    Server::api_builder().workers(workers).set("[resources]", RESOURCES).start()
}

/// A user's id and token.
fn user(s: &Server, name: &str) -> (i64, String) {
    let (u, t) = s.user(name);
    (u["id"].as_i64().unwrap_or_else(|| panic!("no id in {u}")), t)
}

/// Publishes change `event_id` of record `record` of `resource`, owned by `owner`.
fn change(s: &Server, event_id: i64, resource: &str, action: &str, record: i64, owner: i64) {
    let body =
        json!({"eventId": event_id, "resource": resource, "action": action, "recordId": record, "ownerId": owner});
    let r = s.call("POST", "/_debug/change", &[("Content-Type", "application/json")], body.to_string().as_bytes());
    ensure_eq!(s, r.status, 204, "POST /_debug/change {body}: {r:?}");
}

/// An event stream at `path` with `headers`, on worker `pid`: connections are opened until
/// one lands there; the preamble is read.
fn stream_on(s: &Server, pid: i32, path: &str, headers: &[(&str, &str)]) -> SseStream {
    for _ in 0..200 {
        let mut c = s.session();
        if c.get("/_debug/pid").json()["pid"] != pid {
            continue;
        }
        let opened = c.into_sse(path, headers);
        let mut st = opened.unwrap_or_else(|r| panic!("GET {path}: {r:?}\nlog:\n{}", s.log_tail()));
        st.expect_preamble().unwrap_or_else(|e| panic!("GET {path} preamble: {e}\nlog:\n{}", s.log_tail()));
        return st;
    }
    panic!("no connection landed on worker {pid} in 200 tries");
}

/// The next event that is not a heartbeat: `(event, id, data)`.
fn next(s: &Server, st: &mut SseStream, what: &str) -> (String, i64, Value) {
    let ev = st.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("{what}: {e}\nlog:\n{}", s.log_tail()));
    let id = ev.id().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{what}: no numeric id in {ev:?}"));
    (ev.event().unwrap_or_default().to_string(), id, ev.data_json())
}

/// Asserts the next event of `st` is change `id` of `resource` with `action` on `record`.
fn expect_change(s: &Server, st: &mut SseStream, id: i64, resource: &str, action: &str, record: i64, what: &str) {
    let (event, got, data) = next(s, st, what);
    ensure_eq!(s, (event.as_str(), got), ("change", id), "{what}: event and id ({data})");
    ensure_eq!(s, data["resource"], json!(resource), "{what}: resource in {data}");
    ensure_eq!(s, data["action"], json!(action), "{what}: action in {data}");
    ensure_eq!(s, data["id"], json!(record), "{what}: record id in {data}");
    if action == "delete" {
        ensure_eq!(s, data["record"], Value::Null, "{what}: a delete carries no record");
    } else {
        ensure_eq!(s, data["record"]["id"], json!(record), "{what}: the record in {data}");
    }
}

protocols!(an_owner_only_change_reaches_its_owner_and_admins_on_every_worker_and_nobody_else);
fn an_owner_only_change_reaches_its_owner_and_admins_on_every_worker_and_nobody_else(p: Proto) {
    let s = server(2).on(p);
    let pids = s.wait_workers(2, Duration::from_secs(10));
    let (alice, alice_token) = user(&s, "Alice");
    let (_, bob_token) = user(&s, "Bob");
    let (_, admin_token) = s.admin();
    let bearer = |t: &str| format!("Bearer {t}");
    let (alice_h, bob_h, admin_h) = (bearer(&alice_token), bearer(&bob_token), bearer(&admin_token));
    let by_query = format!("/api/events?token={alice_token}");
    // On each worker: Alice (header and ?token=), an admin; Bob and an anonymous stream.
    let mut may = Vec::new();
    let mut may_not = Vec::new();
    for &pid in &pids {
        may.push((format!("Alice on {pid}"), stream_on(&s, pid, "/api/events", &[("Authorization", &alice_h)])));
        may.push((format!("Alice by ?token= on {pid}"), stream_on(&s, pid, &by_query, &[])));
        may.push((format!("admin on {pid}"), stream_on(&s, pid, "/api/events", &[("Authorization", &admin_h)])));
        may_not.push((format!("Bob on {pid}"), stream_on(&s, pid, "/api/events", &[("Authorization", &bob_h)])));
        may_not.push((format!("anonymous on {pid}"), stream_on(&s, pid, "/api/events", &[])));
    }
    // One at a time: each `change` may be published by either worker, and a stream takes
    // events in id order (a later id that overtook an earlier one on the bus would hide it).
    let changes = [(1001, "notes", "create", 7), (1002, "notes", "update", 7), (1003, "notes", "delete", 7)];
    for (id, resource, action, record) in changes {
        change(&s, id, resource, action, record, alice);
        for (who, st) in &mut may {
            expect_change(&s, st, id, resource, action, record, who);
        }
    }
    change(&s, 1004, "news", "create", 8, alice);
    for (who, st) in &mut may {
        expect_change(&s, st, 1004, "news", "create", 8, who);
    }
    for (who, st) in &mut may_not {
        expect_change(&s, st, 1004, "news", "create", 8, &format!("{who}: the public change, none of Alice's notes"));
    }
}

protocols!(resources_narrows_a_stream_and_notifications_still_flow);
fn resources_narrows_a_stream_and_notifications_still_flow(p: Proto) {
    let s = server(1).on(p);
    let pid = s.wait_workers(1, Duration::from_secs(10))[0];
    let (alice, token) = user(&s, "Alice");
    let (_, admin) = s.admin();
    let auth = format!("Bearer {token}");
    let mut news = stream_on(&s, pid, "/api/events?resources=news", &[("Authorization", &auth)]);
    let mut both = stream_on(&s, pid, "/api/events?resources=news%2Cnotes", &[("Authorization", &auth)]);
    // Event ids are one sequence: the changes come after the notification.
    let n = s.notify(&admin, "Still here", "");
    let nid = n["id"].as_i64().expect("notification id");
    change(&s, nid + 1, "notes", "create", 1, alice);
    change(&s, nid + 2, "news", "create", 2, alice);
    for (who, st) in [("news,notes", &mut both), ("news", &mut news)] {
        let (event, id, data) = next(&s, st, who);
        ensure_eq!(s, (event.as_str(), id), ("notification", nid), "{who}: notifications flow ({data})");
    }
    expect_change(&s, &mut both, nid + 1, "notes", "create", 1, "news,notes");
    expect_change(&s, &mut both, nid + 2, "news", "create", 2, "news,notes");
    expect_change(&s, &mut news, nid + 2, "news", "create", 2, "news only: not the note");
}

protocols!(a_bad_token_or_resource_name_opens_no_stream_and_the_token_is_not_logged);
fn a_bad_token_or_resource_name_opens_no_stream_and_the_token_is_not_logged(p: Proto) {
    let s = server(1).on(p);
    let (_, token) = user(&s, "Alice");
    let forged = format!("{token}x");
    for (path, headers) in [
        ("/api/events".to_string(), vec![("Authorization", format!("Bearer {forged}"))]),
        (format!("/api/events?token={forged}"), vec![]),
        ("/api/events?token=not.a.jwt".to_string(), vec![]),
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = s.get_with(&path, &headers);
        ensure_eq!(s, r.status, 401, "{path} {headers:?}: {r:?}");
        ensure_eq!(s, r.json()["code"], json!("UNAUTHORIZED"), "{path}: {r:?}");
        ensure!(s, r.header("www-authenticate").is_some(), "{path}: WWW-Authenticate: {r:?}");
    }
    for list in ["nope", "news,nope", "posts"] {
        let path = format!("/api/events?resources={list}");
        let r = s.get_with(&path, &[("Authorization", &format!("Bearer {token}"))]);
        ensure_eq!(s, r.status, 400, "{path}: {r:?}");
        ensure_eq!(s, r.json()["errors"][0]["field"], json!("resources"), "{path}: names the parameter: {r:?}");
    }
    // A valid ?token= opens the stream, and its value stays out of the log.
    let mut st = s.sse(&[]);
    drop(st.expect_preamble());
    let path = format!("/api/events?token={token}");
    let mut st = s.sse_at(&path, &[]).unwrap_or_else(|r| panic!("{path}: {r:?}"));
    st.expect_preamble().unwrap_or_else(|e| panic!("{e}"));
    drop(st);
    s.wait_log_line(Duration::from_secs(5), |l| l.contains("/api/events?token=REDACTED"));
    ensure!(s, !s.logs().contains(&token), "the token reached the log");
    ensure!(s, !s.logs().contains(&forged), "the forged token reached the log");
}

/// Stores a change event as the record calls do (a `kind = 'change'` row of `notifications`,
/// in the notifications' id sequence), straight into the server's SQLite file; its id.
fn log_change(s: &Server, resource: &str, action: &str, record: i64, owner: i64) -> i64 {
    let db = rusqlite::Connection::open(s.dir().join("data").join("forkd.db")).expect("open the store");
    db.busy_timeout(IO_TIMEOUT).expect("busy timeout");
    let rec = if action == "delete" { Value::Null } else { json!({"id": record, "ownerId": owner, "title": "t"}) };
    let data = json!({"resource": resource, "action": action, "id": record, "record": rec}).to_string();
    db.query_row(
        "INSERT INTO notifications (title, body, created_at, kind, resource, action, record_id, owner_id, data) \
         VALUES ('', '', '2026-01-01T00:00:00.000Z', 'change', ?1, ?2, ?3, ?4, ?5) RETURNING id",
        rusqlite::params![resource, action, record, owner, data],
        |r| r.get(0),
    )
    .expect("insert a change row")
}

protocols!(last_event_id_replays_notifications_and_the_changes_each_stream_may_read_in_order);
fn last_event_id_replays_notifications_and_the_changes_each_stream_may_read_in_order(p: Proto) {
    let s = server(1).on(p);
    let pid = s.wait_workers(1, Duration::from_secs(10))[0];
    let (alice, alice_token) = user(&s, "Alice");
    let (bob, bob_token) = user(&s, "Bob");
    let (_, admin_token) = s.admin();
    let id = |n: Value| n["id"].as_i64().expect("notification id");
    let n1 = id(s.notify(&admin_token, "one", ""));
    let alice_note = log_change(&s, "notes", "create", 1, alice);
    let bob_note = log_change(&s, "notes", "create", 2, bob);
    let n2 = id(s.notify(&admin_token, "two", ""));
    let news = log_change(&s, "news", "update", 3, bob);
    let alice_gone = log_change(&s, "notes", "delete", 1, alice);
    let cases = [
        ("Alice", Some(&alice_token), "/api/events", "0", vec![n1, alice_note, n2, news, alice_gone]),
        ("Bob", Some(&bob_token), "/api/events", "0", vec![n1, bob_note, n2, news]),
        ("anonymous", None, "/api/events", "0", vec![n1, n2, news]),
        ("admin", Some(&admin_token), "/api/events", "0", vec![n1, alice_note, bob_note, n2, news, alice_gone]),
        ("Alice, news only", Some(&alice_token), "/api/events?resources=news", "0", vec![n1, n2, news]),
        ("Alice after her note", Some(&alice_token), "/api/events", "", vec![n2, news, alice_gone]),
    ];
    let after_note = alice_note.to_string();
    let mut streams = Vec::new();
    for (who, token, path, last, want) in cases {
        let auth = token.map(|t| format!("Bearer {t}"));
        let last = if last.is_empty() { after_note.as_str() } else { last };
        let mut headers = vec![("Last-Event-ID", last)];
        headers.extend(auth.iter().map(|v| ("Authorization", v.as_str())));
        streams.push((who, want, stream_on(&s, pid, path, &headers)));
    }
    // A live notification after the replay bounds each stream's list.
    let live = id(s.notify(&admin_token, "live", ""));
    for (who, want, st) in &mut streams {
        let mut got = Vec::new();
        loop {
            let (event, id, data) = next(&s, st, who);
            if id == live {
                break;
            }
            let kind = if [n1, n2].contains(&id) { "notification" } else { "change" };
            ensure_eq!(s, event.as_str(), kind, "{who}: event {id} ({data})");
            got.push(id);
        }
        ensure_eq!(s, &got, want, "{who}: the replay, in id order, then the live notification");
    }
}

/// Stores a change event in the PostgreSQL database at `url`, as the record calls do; its id.
fn log_change_pg(url: &str, resource: &str, record: i64, owner: i64) -> i64 {
    use std::str::FromStr;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let config = tokio_postgres::Config::from_str(url).expect("url parses");
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect to the test server");
        let driver = tokio::spawn(conn);
        let data =
            json!({"resource": resource, "action": "create", "id": record, "record": {"id": record}}).to_string();
        let sql =
            "INSERT INTO notifications (title, body, created_at, kind, resource, action, record_id, owner_id, data) \
                   VALUES ('', '', '2026-01-01T00:00:00.000Z', 'change', $1, 'create', $2, $3, $4) RETURNING id";
        let id: i64 = client.query_one(sql, &[&resource, &record, &owner, &data]).await.expect("a change row").get(0);
        drop(client);
        let _ = driver.await;
        id
    })
}

/// Two hosts on one PostgreSQL and one Redis: an owner-only change published on A reaches,
/// on B's two workers, only Alice's streams (Bob's and anonymous ones get the public change
/// after it as their next event); and stored changes replayed on B from the shared table are
/// filtered the same way.
#[test]
fn an_owner_only_change_on_one_host_reaches_only_its_readers_on_the_other_live_and_by_replay() {
    let Some(base) = crate::cluster::test_server() else { return };
    let Some(redis) = std::env::var("TEST_REDIS_URL").ok().filter(|v| !v.is_empty()) else {
        eprintln!("skipped: TEST_REDIS_URL not set (bin/redis-test-server starts one)");
        return;
    };
    let url = crate::cluster::fresh_database(&base, "changes");
    let cluster = format!("database_url = \"{url}\"\nredis_url = \"{}/21\"", redis.trim_end_matches('/'));
    let host = || {
        let s = Server::api_builder().workers(2).set("[resources]", RESOURCES).set("cluster", &cluster).start();
        s.wait_log_line(Duration::from_secs(10), |l| l.contains("redis: connected"));
        s
    };
    let (a, b) = (host(), host());
    let (alice, alice_token) = user(&a, "Alice");
    let (bob, bob_token) = user(&a, "Bob");
    let (_, admin) = a.admin();
    let people = [("Alice", Some(&alice_token)), ("Bob", Some(&bob_token)), ("anonymous", None)];
    let open = |pid: i32, who: &str, token: Option<&String>, last: Option<&str>| {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = auth.iter().map(|v| ("Authorization", v.as_str())).collect();
        headers.extend(last.map(|l| ("Last-Event-ID", l)));
        (format!("{who} on B's worker {pid}"), stream_on(&b, pid, "/api/events", &headers))
    };
    let pids = b.wait_workers(2, Duration::from_secs(10));
    let mut streams: Vec<_> = pids.iter().flat_map(|&pid| people.map(|(who, t)| open(pid, who, t, None))).collect();
    change(&a, 3001, "notes", "create", 5, alice);
    change(&a, 3002, "news", "create", 6, alice);
    for (who, st) in &mut streams {
        if who.starts_with("Alice") {
            expect_change(&b, st, 3001, "notes", "create", 5, who);
        }
        expect_change(&b, st, 3002, "news", "create", 6, who);
    }
    // Stored changes, replayed on B from the shared table; a live notification bounds each.
    let alices = log_change_pg(&url, "notes", 7, alice);
    let bobs = log_change_pg(&url, "notes", 8, bob);
    let news = log_change_pg(&url, "news", 9, bob);
    let mut streams: Vec<_> = people.map(|(who, t)| open(pids[0], who, t, Some("0"))).into_iter().collect();
    let live = a.notify(&admin, "after the replay", "")["id"].as_i64().expect("notification id");
    for ((who, st), want) in streams.iter_mut().zip([vec![alices, news], vec![bobs, news], vec![news]]) {
        let mut got = Vec::new();
        loop {
            let (event, id, data) = next(&b, st, who);
            if id == live {
                break;
            }
            ensure_eq!(b, event.as_str(), "change", "{who}: replayed event {id} ({data})");
            got.push(id);
        }
        ensure_eq!(b, got, want, "{who}: the stored changes it may read, then the live notification");
    }
}

protocols!(a_real_note_reaches_only_its_owner_and_admins_on_both_workers);
fn a_real_note_reaches_only_its_owner_and_admins_on_both_workers(p: Proto) {
    let s = server(2).on(p);
    let pids = s.wait_workers(2, Duration::from_secs(10));
    let (_, alice_token) = user(&s, "Alice");
    let (_, bob_token) = user(&s, "Bob");
    let (_, admin_token) = s.admin();
    let bearer = |t: &str| format!("Bearer {t}");
    let (alice_h, bob_h, admin_h) = (bearer(&alice_token), bearer(&bob_token), bearer(&admin_token));
    let mut may = Vec::new();
    let mut may_not = Vec::new();
    for &pid in &pids {
        may.push((format!("Alice on {pid}"), stream_on(&s, pid, "/api/events", &[("Authorization", &alice_h)])));
        may.push((format!("admin on {pid}"), stream_on(&s, pid, "/api/events", &[("Authorization", &admin_h)])));
        may_not.push((format!("Bob on {pid}"), stream_on(&s, pid, "/api/events", &[("Authorization", &bob_h)])));
        may_not.push((format!("anonymous on {pid}"), stream_on(&s, pid, "/api/events", &[])));
    }
    // A real write through the resource routes (store, commit, bus), not the debug route.
    let r = s.api("POST", "/api/v1/notes", Some(&alice_token), Some(&json!({"title": "secret"})));
    let note = s.expect_data(&r, 201, "Alice creates a note");
    for (who, st) in &mut may {
        let (event, _, data) = next(&s, st, who);
        ensure_eq!(s, event.as_str(), "change", "{who}: {data}");
        ensure_eq!(s, (&data["resource"], &data["action"]), (&json!("notes"), &json!("create")), "{who}: {data}");
        ensure_eq!(s, data["record"], note, "{who}: the record as created");
    }
    let r = s.api("POST", "/api/v1/news", Some(&bob_token), Some(&json!({"title": "public"})));
    let news = s.expect_data(&r, 201, "Bob posts news");
    for (who, st) in may.iter_mut().chain(may_not.iter_mut()) {
        let (event, _, data) = next(&s, st, who);
        ensure_eq!(
            s,
            (event.as_str(), &data["resource"]),
            ("change", &json!("news")),
            "{who}: next is the news, never the note ({data})"
        );
        ensure_eq!(s, data["record"], news, "{who}: the news as created");
    }
}
