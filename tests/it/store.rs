//! The data store from the outside (CONTRACT §1 `user create`, §6 `/health/ready`, §9 TERM):
//! the bootstrap CLI, readiness, and durability of acknowledged writes across a graceful
//! stop and a restart on the same data directory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::util::*;

protocols!(user_create_prints_the_user_and_works_while_the_server_runs);
fn user_create_prints_the_user_and_works_while_the_server_runs(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("boot");
    let u = s.create_user(&email, "Boot Admin", "admin", "boot-password-1");
    ensure_eq!(
        s,
        (u["email"].as_str(), u["name"].as_str(), u["role"].as_str()),
        (Some(email.as_str()), Some("Boot Admin"), Some("admin")),
        "printed user"
    );
    ensure!(s, user_shape_problems(&u).is_empty(), "printed user shape {:?}: {u}", user_shape_problems(&u));
    ensure!(s, !leaks_secret(&u.to_string(), "boot-password-1"), "the printed user leaks a secret: {u}");
    // The password is stdin less ONE trailing newline.
    let (t, _, _) = s.login(&email, "boot-password-1");
    let me = s.expect_data(&s.api("GET", "/api/v1/auth/me", Some(&t), None), 200, "/auth/me as the CLI admin");
    ensure_eq!(s, me["id"], u["id"], "the CLI user is the server's user");

    // Default role user, --age, and a password that ends in spaces (kept: only the newline goes).
    let e2 = unique_email("cli-user");
    let out = s.user_create_cli(
        &["--email", &e2, "--name", "Cli User", "--age", "30", "--password-stdin"],
        b"spaced-pass  \n",
    );
    ensure!(s, out.code() == Some(0), "user create without --role: {out:?}");
    let u2: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not a JSON object ({e}): {out:?}"));
    ensure_eq!(s, (u2["role"].as_str(), u2["age"].as_i64()), (Some("user"), Some(30)), "default role and --age: {u2}");
    s.login(&e2, "spaced-pass  ");
    let g =
        s.expect_data(&s.api("GET", &format!("/api/v1/users/{}", u2["id"]), Some(&t), None), 200, "GET the CLI user");
    ensure_eq!(s, g, u2, "GET returns what the CLI printed");
}

protocols!(user_create_with_a_duplicate_email_exits_nonzero);
fn user_create_with_a_duplicate_email_exits_nonzero(p: Proto) {
    let s = Server::start_api().on(p);
    let email = unique_email("twice");
    s.create_user(&email, "Once", "admin", "twice-password-1");
    let out = s.user_create_cli(
        &["--email", &email, "--name", "Twice", "--role", "user", "--password-stdin"],
        b"twice-password-2\n",
    );
    ensure!(s, out.code().is_some_and(|c| c != 0), "a duplicate e-mail must exit non-zero: {out:?}");
    let (t, _, _) = s.login(&email, "twice-password-1");
    ensure_eq!(s, s.user_total(&t, ""), 1, "only the first user exists");
    let r = s.api(
        "POST",
        "/api/v1/users",
        None,
        Some(&json!({"name": "Web", "email": email.to_uppercase(), "password": "web-password-1"})),
    );
    s.expect_err(&r, 409, "CONFLICT", "sign-up with the CLI user's e-mail");
}

protocols!(user_create_with_bad_input_exits_2_and_creates_nothing);
fn user_create_with_bad_input_exits_2_and_creates_nothing(p: Proto) {
    let s = Server::start_api().on(p);
    let admin_email = unique_email("adm");
    s.create_user(&admin_email, "Admin", "admin", "admin-password-1");
    let (t, _, _) = s.login(&admin_email, "admin-password-1");
    let cases: [(&[&str], &[u8], &str); 4] = [
        (&["--email", "nope", "--name", "Bad", "--password-stdin"], b"good-password-1\n", "--email nope"),
        (
            &["--email", "ok1@x.io", "--name", "Bad", "--role", "root", "--password-stdin"],
            b"good-password-1\n",
            "--role root",
        ),
        (&["--email", "ok2@x.io", "--name", "Bad", "--password-stdin"], b"short\n", "a 5-character password"),
        (
            &["--email", "ok3@x.io", "--name", "Bad", "--age", "151", "--password-stdin"],
            b"good-password-1\n",
            "--age 151",
        ),
    ];
    for (args, stdin, what) in cases {
        let out = s.user_create_cli(args, stdin);
        ensure_eq!(s, out.code(), Some(2), "user create with {what}: {out:?}");
        ensure!(s, !out.stderr.trim().is_empty(), "user create with {what} must say why on stderr: {out:?}");
    }
    ensure_eq!(s, s.user_total(&t, ""), 1, "bad input creates nobody");
}

protocols!(health_ready_is_200_when_the_database_answers);
fn health_ready_is_200_when_the_database_answers(p: Proto) {
    let s = Server::start_api().on(p);
    let r = s.get("/health/ready");
    ensure_eq!(s, r.status, 200, "GET /health/ready: {r:?}");
    // And the database really answers: a write and a read.
    let (u, t) = s.user("Ready");
    s.expect_data(&s.api("GET", &format!("/api/v1/users/{}", u["id"]), Some(&t), None), 200, "read back");
    let r = s.get("/health/ready");
    ensure_eq!(s, r.status, 200, "GET /health/ready after writes: {r:?}");
}

#[test]
fn sign_ups_acknowledged_before_sigterm_survive_a_restart() {
    let keep = tempfile::Builder::new().prefix("forkd-durable-").tempdir().unwrap();
    let data = keep.path().join("data");
    let mut s = Server::api_builder().workers(2).data_dir(&data).start();
    s.wait_workers(2, Duration::from_secs(10));
    let admin_email = unique_email("dur-admin");
    s.create_user(&admin_email, "Durable Admin", "admin", "admin-password-1");

    let addr = s.addr();
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let other = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let termed = Arc::new(AtomicBool::new(false));
    let client = {
        let (acked, other, stop, termed) = (acked.clone(), other.clone(), stop.clone(), termed.clone());
        thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let email = format!("durable-{i}@x.io");
                let body = serde_json::to_vec(
                    &json!({"name": format!("Durable {i}"), "email": email, "password": "user-password-1"}),
                )
                .unwrap();
                let res = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).and_then(|st| {
                    let mut c = Conn::from_stream(st, None);
                    c.set_timeout(Duration::from_secs(20));
                    c.try_write(&request("POST", "/api/v1/users", &[("Content-Type", "application/json")], &body))?;
                    c.try_read_response(false)
                });
                match res {
                    Ok(r) if r.status == 201 => acked.lock().unwrap().push(email),
                    Ok(r) => other.lock().unwrap().push(format!("{email}: {}", r.status)),
                    Err(e) => {
                        other.lock().unwrap().push(format!("{email}: {e}"));
                        if termed.load(Ordering::SeqCst) && e.kind() == std::io::ErrorKind::ConnectionRefused {
                            break; // the listener is gone
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        })
    };
    // SIGTERM ~300 ms into the run, and not before 5 sign-ups were acknowledged (a loaded
    // machine may need longer for them), so the check below is meaningful.
    let t0 = std::time::Instant::now();
    let started = eventually(Duration::from_secs(30), || {
        acked.lock().unwrap().len() >= 5 && t0.elapsed() >= Duration::from_millis(300)
    });
    ensure!(s, started, "fewer than 5 sign-ups acknowledged in 30 s; other outcomes: {:?}", other.lock().unwrap());
    let at_term = acked.lock().unwrap().len();
    termed.store(true, Ordering::SeqCst);
    s.signal(Signal::SIGTERM);
    let st = s.wait_exit(Duration::from_secs(30));
    stop.store(true, Ordering::SeqCst);
    client.join().unwrap();
    let log1 = s.log_tail();
    ensure!(s, st.is_some_and(|st| st.success()), "the supervisor must exit 0 after TERM, got {st:?}");
    let acked = acked.lock().unwrap().clone();
    let other = other.lock().unwrap().clone();
    eprintln!(
        "durability: {} sign-ups acknowledged ({} by SIGTERM), {} other outcomes: {:?}",
        acked.len(),
        at_term,
        other.len(),
        &other[..other.len().min(10)]
    );
    ensure!(s, acked.len() >= 5, "too few acknowledged sign-ups ({}) for a meaningful check", acked.len());

    let s2 = Server::api_builder().data_dir(&data).start();
    let (t, _, _) = s2.login(&admin_email, "admin-password-1");
    let stored: std::collections::BTreeSet<String> =
        s2.all_users(&t).iter().filter_map(|u| u["email"].as_str().map(str::to_ascii_lowercase)).collect();
    let missing: Vec<&String> = acked.iter().filter(|e| !stored.contains(&e.to_ascii_lowercase())).collect();
    ensure!(
        s2,
        missing.is_empty(),
        "{} of {} acknowledged (201) sign-ups are missing after the restart: {missing:?}\n--- first server's log (tail) ---\n{log1}",
        missing.len(),
        acked.len()
    );
    for e in acked.iter().take(3) {
        s2.login(e, "user-password-1");
    }
}

protocols!(expired_refresh_token_families_are_deleted_when_a_worker_starts);
fn expired_refresh_token_families_are_deleted_when_a_worker_starts(p: Proto) {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut s = Server::api_builder().data_dir(&data).start().on(p);
    s.user("Keeper");
    s.signal(Signal::SIGTERM);
    ensure!(s, s.wait_exit(Duration::from_secs(30)).is_some_and(|st| st.success()), "the first server must stop");
    // Rows a long-running server would have collected: one family dead for a day, one live.
    let db = rusqlite::Connection::open(data.join("forkd.db")).expect("open the database");
    let uid: i64 = db.query_row("SELECT id FROM users LIMIT 1", [], |r| r.get(0)).expect("a user");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    for (family, expires) in [("dead-family", now - 86_400), ("live-family", now + 86_400)] {
        db.execute("INSERT INTO token_families (family, user_id) VALUES (?1, ?2)", rusqlite::params![family, uid])
            .expect("family");
        db.execute(
            "INSERT INTO refresh_tokens (hash, family, user_id, expires_at) VALUES (?1, ?1, ?2, ?3)",
            rusqlite::params![family, uid, expires],
        )
        .expect("token");
    }
    let count = |family: &str| -> i64 {
        db.query_row("SELECT count(*) FROM refresh_tokens WHERE family = ?1", [family], |r| r.get(0)).expect("count")
    };
    assert_eq!((count("dead-family"), count("live-family")), (1, 1));
    let s2 = Server::api_builder().data_dir(&data).start().on(p);
    let purged = eventually(Duration::from_secs(10), || count("dead-family") == 0);
    ensure!(s2, purged, "the expired family is still there 10 s after the start");
    ensure_eq!(s2, count("live-family"), 1, "the live family is kept");
    let families: i64 = db
        .query_row("SELECT count(*) FROM token_families WHERE family = 'dead-family'", [], |r| r.get(0))
        .expect("count");
    ensure_eq!(s2, families, 0, "the family row goes with its tokens");
    ensure!(
        s2,
        s2.logs().contains("deleted 1 expired refresh-token family"),
        "the purge is logged:\n{}",
        s2.log_tail()
    );
}

/// Only a worker's pool threads use the store, so it opens no more database connections than
/// `io.threads`, whatever `db.pool_size` allows: each one holds a page cache and prepared
/// statements for nothing.
#[test]
fn a_worker_opens_no_more_connections_than_pool_threads() {
    let s = ServerBuilder::default().set("db", "pool_size = 10").set("io", "threads = 2").start();
    let workers = s.wait_workers(1, Duration::from_secs(10));
    let w = workers[0];
    let fds = std::fs::read_dir(format!("/proc/{w}/fd")).unwrap_or_else(|e| panic!("/proc/{w}/fd: {e}"));
    let db = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .count();
    ensure_eq!(s, db, 2, "database files open in the worker (io.threads = 2, db.pool_size = 10)");
}
