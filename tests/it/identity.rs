//! Identity (issue 22, item 1): an id is never given twice, and a token stands for the
//! account it was issued for, not for a number. The exact reproduction (a deleted account's
//! token acting for the next sign-up), ids after deleting the newest rows (also on a database
//! an older binary left), and what voids a token at once: deletion, a new password, another
//! role, on every worker; after a restart; and across hosts sharing PostgreSQL.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

const PW: &str = "user-password-1";
const NEW_PW: &str = "another-password-2";

fn id_of(v: &Value) -> i64 {
    v["id"].as_i64().unwrap_or_else(|| panic!("no integer id in {v}"))
}

/// Asserts a 401 `invalid token`: the token no longer stands for an account.
fn expect_void(s: &Server, r: &Response, what: &str) {
    let v = s.expect_err(r, 401, "UNAUTHORIZED", what);
    ensure_eq!(s, v["message"].as_str(), Some("invalid token"), "{what}: 401 message in {r:?}");
}

fn refresh(s: &Server, token: &str) -> Response {
    s.api("POST", "/api/v1/auth/refresh", None, Some(&json!({"refreshToken": token})))
}

/// One request on a kept-alive connection (so on the worker that serves it).
fn on(c: &mut Conn, method: &str, path: &str, token: &str, body: Option<&Value>) -> Response {
    let auth = format!("Bearer {token}");
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default()).unwrap_or_default();
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    c.send(&request(method, path, &headers, &bytes));
    c.read_response()
}

protocols!(a_deleted_accounts_token_never_acts_for_the_next_sign_up);
/// Regression: SQLite gave the deleted Bob's id to Eve, the next sign-up, and Bob's unexpired
/// token then answered `/auth/me` as Eve, renamed her and posted as her.
fn a_deleted_accounts_token_never_acts_for_the_next_sign_up(p: Proto) {
    let s = Server::start_api().on(p);
    let bob_email = unique_email("bob");
    let bob_id = id_of(&s.signup("Bob", &bob_email, PW, None));
    let (bob_token, bob_refresh, _) = s.login(&bob_email, PW);
    s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&bob_token), None), 200, "Bob's token before");
    let r = s.api("DELETE", &format!("/api/v1/users/{bob_id}"), Some(&bob_token), None);
    ensure_eq!(s, r.status, 204, "Bob deletes himself: {r:?}");
    expect_void(&s, &s.api("GET", "/api/v1/auth/me", Some(&bob_token), None), "Bob's token after his deletion");

    let eve_email = unique_email("eve");
    let eve_id = id_of(&s.signup("Eve", &eve_email, PW, None));
    ensure!(s, eve_id > bob_id, "Eve got id {eve_id}: Bob's was {bob_id}, and an id is never given twice");
    let attempts = [
        ("GET", "/api/v1/auth/me".to_string(), None),
        ("PATCH", format!("/api/v1/users/{eve_id}"), Some(json!({"name": "pwned"}))),
        ("PATCH", format!("/api/v1/users/{bob_id}"), Some(json!({"name": "pwned"}))),
        ("POST", format!("/api/v1/users/{eve_id}/posts"), Some(json!({"title": "as Eve", "body": ""}))),
        ("POST", format!("/api/v1/users/{bob_id}/posts"), Some(json!({"title": "as Bob", "body": ""}))),
        ("GET", format!("/api/v1/users/{eve_id}"), None),
        ("GET", "/api/v1/users".to_string(), None),
    ];
    for (method, path, body) in &attempts {
        let r = s.api(method, path, Some(&bob_token), body.as_ref());
        expect_void(&s, &r, &format!("{method} {path} with the deleted Bob's token"));
    }
    expect_void(&s, &refresh(&s, &bob_refresh), "the deleted Bob's refresh token");

    let (eve_token, _, _) = s.login(&eve_email, PW);
    let me = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&eve_token), None), 200, "Eve's own token");
    ensure_eq!(s, (me["id"].as_i64(), me["name"].as_str()), (Some(eve_id), Some("Eve")), "Eve, untouched");
    let posts = s.api("GET", &format!("/api/v1/users/{eve_id}/posts"), Some(&eve_token), None);
    ensure_eq!(s, s.expect_data(&posts, 200, "Eve's posts")["total"].as_i64(), Some(0), "nobody posted as Eve");
}

#[test]
fn ids_are_never_given_again_after_the_newest_is_deleted() {
    let s = Server::start_api();
    let (a, a_token) = s.user("First");
    let (b, b_token) = s.user("Second");
    let r = s.api("DELETE", &format!("/api/v1/users/{}", id_of(&b)), Some(&b_token), None);
    ensure_eq!(s, r.status, 204, "delete the newest user: {r:?}");
    let (c, _) = s.user("Third");
    ensure!(s, id_of(&c) > id_of(&b), "user ids {} then {} after deleting {}", id_of(&a), id_of(&c), id_of(&b));

    let post = |title: &str| {
        let path = format!("/api/v1/users/{}/posts", id_of(&a));
        id_of(&s.expect_data(&s.api("POST", &path, Some(&a_token), Some(&json!({"title": title}))), 201, "post"))
    };
    let (p1, p2) = (post("one"), post("two"));
    let r = s.api("DELETE", &format!("/api/v1/posts/{p2}"), Some(&a_token), None);
    ensure_eq!(s, r.status, 204, "delete the newest post: {r:?}");
    let p3 = post("three");
    ensure!(s, p3 > p2 && p2 > p1, "post ids {p1}, {p2} (deleted), then {p3}");
}

/// The schema every release before this one made (migrations 1 and 2), as SQL.
const OLD_SCHEMA: &str = "
    CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE COLLATE NOCASE,
        password_hash TEXT NOT NULL, age INTEGER, role TEXT NOT NULL CHECK (role IN ('user', 'admin')),
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
    CREATE TABLE posts (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
        title TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
    CREATE INDEX posts_user_id ON posts (user_id, id);
    CREATE TABLE token_families (family TEXT PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE, revoked INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX token_families_user_id ON token_families (user_id);
    CREATE TABLE refresh_tokens (hash TEXT PRIMARY KEY,
        family TEXT NOT NULL REFERENCES token_families (family) ON DELETE CASCADE,
        user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE, expires_at INTEGER NOT NULL,
        spent_at INTEGER);
    CREATE INDEX refresh_tokens_family ON refresh_tokens (family);
    CREATE INDEX refresh_tokens_user_id ON refresh_tokens (user_id);
    CREATE TABLE notifications (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL,
        created_at TEXT NOT NULL);
    PRAGMA user_version = 2;
";

#[test]
fn a_database_of_the_old_schema_keeps_its_rows_and_never_gives_an_id_again() {
    let keep = tempfile::Builder::new().prefix("forkd-oldschema-").tempdir().expect("tempdir");
    let data = keep.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let hash = forkd::auth::Passwords::new(1024, 1).expect("argon2").hash(PW).expect("hash");
    let refresh_token = "a-refresh-token-issued-by-the-old-binary";
    {
        let db = rusqlite::Connection::open(data.join("forkd.db")).expect("open");
        db.execute_batch(OLD_SCHEMA).expect("old schema");
        for (id, email) in [(1, "one@old.io"), (2, "two@old.io"), (3, "three@old.io")] {
            db.execute(
                "INSERT INTO users (id, name, email, password_hash, role, created_at, updated_at) \
                 VALUES (?1, 'Old', ?2, ?3, 'user', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z')",
                rusqlite::params![id, email, hash],
            )
            .expect("user");
        }
        db.execute_batch(
            "INSERT INTO posts VALUES (1, 1, 'p1', '', 't', 't'), (2, 3, 'p2', '', 't', 't');
             INSERT INTO token_families (family, user_id) VALUES ('old-family', 3);",
        )
        .expect("posts, family");
        let stored = forkd::auth::tokens::hash_token(refresh_token);
        db.execute(
            "INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES (?1, 'old-family', 3, ?2)",
            rusqlite::params![stored, now_unix() + 3600],
        )
        .expect("refresh token");
    }

    let s = Server::api_builder().data_dir(&data).start();
    // A refresh token of the old binary still refreshes, into a token of the new shape.
    let d = s.expect_data(&refresh(&s, refresh_token), 200, "refresh with the old binary's token");
    let three = d["accessToken"].as_str().expect("accessToken").to_string();
    let me = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&three), None), 200, "/auth/me as user 3");
    ensure_eq!(s, (me["id"].as_i64(), me["email"].as_str()), (Some(3), Some("three@old.io")), "kept with its id");
    let (one, _, _) = s.login("one@old.io", PW);
    let p = s.expect_data(&s.api("GET", "/api/v1/posts/1", Some(&one), None), 200, "an old post");
    ensure_eq!(s, (p["userId"].as_i64(), p["title"].as_str()), (Some(1), Some("p1")), "the post, with its author");

    // The newest user (3) deletes itself: the next sign-up does not get 3 (the old tables did).
    let r = s.api("DELETE", "/api/v1/users/3", Some(&three), None);
    ensure_eq!(s, r.status, 204, "user 3 deletes itself: {r:?}");
    s.expect_err(&s.api("GET", "/api/v1/posts/2", Some(&one), None), 404, "NOT_FOUND", "its post went with it");
    let (four, four_token) = s.user("Four");
    ensure_eq!(s, id_of(&four), 4, "the first sign-up after the deleted newest user 3");
    let post = |title: &str| {
        let r = s.api("POST", "/api/v1/users/4/posts", Some(&four_token), Some(&json!({"title": title})));
        id_of(&s.expect_data(&r, 201, "post"))
    };
    ensure_eq!(s, post("three"), 3, "posts go on after the highest migrated id");
    let r = s.api("DELETE", "/api/v1/posts/3", Some(&four_token), None);
    ensure_eq!(s, r.status, 204, "delete the newest post: {r:?}");
    ensure_eq!(s, post("four"), 4, "and never give a deleted post's id again");
    // A token of the old shape (no account binding) is refused: its client refreshes.
    let mut old_claims = good_claims(1, "user");
    old_claims.as_object_mut().map(|c| (c.remove("gen"), c.remove("iatMs")));
    let old = jwt_sign(&json!({"alg": "HS256", "typ": "JWT"}), &old_claims, "HS256", TEST_JWT_SECRET.as_bytes());
    expect_void(&s, &s.api("GET", "/api/v1/auth/me", Some(&old), None), "a token without gen and iatMs");
}

#[test]
fn a_new_password_voids_the_old_tokens_at_once_on_every_worker() {
    let s = Server::api_builder().workers(2).start();
    let workers = s.wait_workers(2, Duration::from_secs(10));
    let email = unique_email("pw-change");
    let id = id_of(&s.signup("Changer", &email, PW, None));
    let (token, refresh_token, _) = s.login(&email, PW);
    let user = format!("/api/v1/users/{id}");
    // Another user's profile, unchanged by what follows: answered from each worker's memo,
    // without the pool, so only the event loop's own check can refuse it.
    let (other, _) = s.user("Other");
    let other = format!("/api/v1/users/{}", id_of(&other));
    // Each worker has verified the token and holds both users in its memo (the second GETs).
    let mut conns: Vec<(i32, Conn)> = workers.iter().map(|&pid| (pid, s.conn_on(pid))).collect();
    for (pid, c) in &mut conns {
        for path in ["/api/v1/auth/me", &user, &user, &other, &other] {
            let r = on(c, "GET", path, &token, None);
            ensure_eq!(s, r.status, 200, "GET {path} on worker {pid} before the change: {r:?}");
        }
    }

    // Refused changes revoke nothing.
    let r = s.api("PATCH", &user, Some(&token), Some(&json!({"password": NEW_PW})));
    let v = s.expect_err(&r, 403, "FORBIDDEN", "a new password without the current one");
    ensure!(s, v.to_string().contains("currentPassword"), "the error names currentPassword: {v}");
    let wrong = json!({"password": NEW_PW, "currentPassword": "not-the-password"});
    s.expect_err(&s.api("PATCH", &user, Some(&token), Some(&wrong)), 403, "FORBIDDEN", "a wrong current password");
    s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&token), None), 200, "the token after refused changes");

    let change = json!({"password": NEW_PW, "currentPassword": PW});
    s.expect_data(&s.api("PATCH", &user, Some(&token), Some(&change)), 200, "change the password");
    // At once: no retry, on both workers' kept-alive connections, the memo's path included.
    for (pid, c) in &mut conns {
        for path in ["/api/v1/auth/me", &user, &other, "/api/v1/users"] {
            expect_void(&s, &on(c, "GET", path, &token, None), &format!("GET {path} on worker {pid} right after"));
        }
        let r = on(c, "PATCH", &user, &token, Some(&json!({"name": "after"})));
        expect_void(&s, &r, &format!("PATCH {user} on worker {pid} right after"));
    }
    expect_void(&s, &refresh(&s, &refresh_token), "the refresh token of the login before the change");
    let r = s.api("POST", "/api/v1/auth/login", None, Some(&json!({"email": email, "password": PW})));
    s.expect_err(&r, 401, "UNAUTHORIZED", "the old password");
    let (fresh, _, _) = s.login(&email, NEW_PW);
    for &pid in &workers {
        let r = on(&mut s.conn_on(pid), "GET", &user, &fresh, None);
        ensure_eq!(s, r.status, 200, "a login after the change works on worker {pid}: {r:?}");
    }
}

#[test]
fn another_role_voids_the_old_tokens_and_their_refresh_tokens() {
    let s = Server::start_api();
    let (_, admin) = s.admin();
    let email = unique_email("role");
    let id = id_of(&s.signup("Promoted", &email, PW, None));
    let user = format!("/api/v1/users/{id}");
    let (token, refresh_token, _) = s.login(&email, PW);
    // The role it already has: nothing changes.
    s.expect_data(&s.api("PATCH", &user, Some(&admin), Some(&json!({"role": "user"}))), 200, "role user again");
    s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&token), None), 200, "the token after a same-role patch");

    s.expect_data(&s.api("PATCH", &user, Some(&admin), Some(&json!({"role": "admin"}))), 200, "promote");
    expect_void(&s, &s.api("GET", "/api/v1/auth/me", Some(&token), None), "the token from before the promotion");
    expect_void(&s, &refresh(&s, &refresh_token), "its refresh token");
    let (as_admin, _, _) = s.login(&email, PW);
    let (_, claims, _) = jwt_parts(&as_admin);
    ensure_eq!(s, claims["role"].as_str(), Some("admin"), "a new login carries the new role: {claims}");
    let note = json!({"title": "from a new admin", "body": ""});
    s.expect_data(&s.api("POST", "/api/v1/notifications", Some(&as_admin), Some(&note)), 201, "notify as admin");

    // Demoted: the admin token can no longer act as an admin, at once.
    s.expect_data(&s.api("PATCH", &user, Some(&admin), Some(&json!({"role": "user"}))), 200, "demote");
    expect_void(&s, &s.api("POST", "/api/v1/notifications", Some(&as_admin), Some(&note)), "notify once demoted");
    s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&admin), None), 200, "the other admin is untouched");
}

#[test]
fn a_revocation_before_a_restart_still_holds_after_it() {
    let keep = tempfile::Builder::new().prefix("forkd-restart-").tempdir().expect("tempdir");
    let data = keep.path().join("data");
    let mut s = Server::api_builder().data_dir(&data).start();
    let email = unique_email("restart");
    let id = id_of(&s.signup("Restarted", &email, PW, None));
    let (token, _, _) = s.login(&email, PW);
    let (_, reader) = s.user("Reader");
    let user = format!("/api/v1/users/{id}");
    let change = json!({"password": NEW_PW, "currentPassword": PW});
    s.expect_data(&s.api("PATCH", &user, Some(&token), Some(&change)), 200, "change the password");
    s.signal(nix::sys::signal::Signal::SIGTERM);
    ensure!(s, s.wait_exit(Duration::from_secs(30)).is_some_and(|st| st.success()), "a clean stop");

    // A new supervisor: its table of revocations is empty; the store still knows.
    let s = Server::api_builder().data_dir(&data).start();
    let mut c = s.conn();
    for _ in 0..2 {
        let r = on(&mut c, "GET", &user, &reader, None);
        ensure_eq!(s, r.status, 200, "another user reads it (the memo fills): {r:?}");
    }
    expect_void(&s, &on(&mut c, "GET", &user, &token, None), "GET the user (held in the memo) with the old token");
    expect_void(&s, &on(&mut c, "GET", "/api/v1/auth/me", &token, None), "/auth/me with the old token");
}

#[test]
fn a_change_on_one_host_voids_the_tokens_on_the_other() {
    let Some(base) = crate::cluster::test_server() else { return };
    let url = crate::cluster::fresh_database(&base, "identity");
    let (a, b) = (crate::cluster::host(&url, 1), crate::cluster::host(&url, 1));
    let (_, admin) = a.admin();
    let signup = |name: &str| {
        let email = unique_email(name);
        let id = id_of(&a.signup(name, &email, PW, None));
        let (token, refresh_token, _) = b.login(&email, PW);
        b.expect_data(&b.api("GET", "/api/v1/auth/me", Some(&token), None), 200, "B's token on B");
        (id, token, refresh_token)
    };
    let void_on_b = |token: &str, refresh_token: &str, id: i64, what: &str| {
        for (method, path, body) in [
            ("GET", "/api/v1/auth/me".to_string(), None),
            ("GET", format!("/api/v1/users/{id}"), None),
            ("PATCH", format!("/api/v1/users/{id}"), Some(json!({"name": "x"}))),
            ("POST", format!("/api/v1/users/{id}/posts"), Some(json!({"title": "x"}))),
        ] {
            expect_void(
                &b,
                &b.api(method, &path, Some(token), body.as_ref()),
                &format!("{method} {path} on B, {what}"),
            );
        }
        expect_void(&b, &refresh(&b, refresh_token), &format!("refresh on B, {what}"));
    };

    let (id, token, refresh_token) = signup("moved-password");
    let change = json!({"password": NEW_PW, "currentPassword": PW});
    a.expect_data(&a.api("PATCH", &format!("/api/v1/users/{id}"), Some(&token), Some(&change)), 200, "on A");
    void_on_b(&token, &refresh_token, id, "after a new password on A");

    let (id, token, refresh_token) = signup("moved-role");
    let promote = json!({"role": "admin"});
    a.expect_data(&a.api("PATCH", &format!("/api/v1/users/{id}"), Some(&admin), Some(&promote)), 200, "on A");
    void_on_b(&token, &refresh_token, id, "after another role on A");

    let (id, token, refresh_token) = signup("deleted");
    let r = a.api("DELETE", &format!("/api/v1/users/{id}"), Some(&token), None);
    ensure_eq!(a, r.status, 204, "delete on A: {r:?}");
    void_on_b(&token, &refresh_token, id, "after the deletion on A");
}
