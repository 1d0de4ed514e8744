//! Several hosts as one service over PostgreSQL (`[cluster] database_url`): two forkd
//! services (separate supervisors, data dirs and ports) on one database see the same users
//! and refresh-token families; `forkd user create` writes there; and a PostgreSQL that goes
//! away makes store requests fail fast with 503 while the workers live on, then everything
//! works again without a restart when it returns.
//!
//! Needs a PostgreSQL server: `TEST_DATABASE_URL` (see `bin/pg-test-server`, which
//! `.ci/run` starts); without it each test says it is skipped and passes. Each test makes
//! its own database; the fault test starts (and stops) a private server of its own.

use std::path::PathBuf;
use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::*;

const PW: &str = "cluster-password-1";
/// A store call's deadline is 4 s; a request that needs the store answers within this.
const FAIL_BOUND: Duration = Duration::from_secs(6);

/// The test server's URL, or `None` after saying the test is skipped.
pub(crate) fn test_server() -> Option<String> {
    let url = std::env::var("TEST_DATABASE_URL").ok().filter(|v| !v.is_empty());
    if url.is_none() {
        eprintln!("skipped: TEST_DATABASE_URL not set (bin/pg-test-server starts one)");
    }
    url
}

/// Run `sql` (no parameters) on the server at `url`.
fn run_sql(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let config = tokio_postgres::Config::from_str(url).expect("url parses");
        let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect to the test server");
        let driver = tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        drop(client);
        let _ = driver.await;
    });
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    format!("{scheme}://{authority}/{name}")
}

/// A new, empty database on the test server; its URL.
pub(crate) fn fresh_database(base: &str, tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!("forkd_it_{tag}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    run_sql(base, &format!("CREATE DATABASE {name}"));
    with_database(base, &name)
}

/// An API server (one worker unless `workers`) whose store is the database at `url`.
pub(crate) fn host(url: &str, workers: usize) -> Server {
    Server::api_builder().workers(workers).set("cluster", &format!("database_url = \"{url}\"")).start()
}

#[test]
fn two_hosts_share_users_and_refresh_token_families() {
    let Some(base) = test_server() else { return };
    let url = fresh_database(&base, "hosts");
    // Started together: both supervisors migrate at once (the advisory lock serialises them).
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| host(&url, 1));
        let b = s.spawn(|| host(&url, 1));
        (a.join().expect("start A"), b.join().expect("start B"))
    });

    // A user signed up through A logs in through B, and B's token works on A.
    let email = unique_email("cluster");
    let user = a.signup("Across", &email, PW, None);
    let (access_b, r1, _) = b.login(&email.to_uppercase(), PW);
    let me = a.expect_data(&a.api("GET", "/api/v1/auth/me", Some(&access_b), None), 200, "B's token on A");
    ensure_eq!(a, me["id"], user["id"], "the same user on both hosts");
    let path = format!("/api/v1/users/{}", user["id"]);
    b.expect_data(&b.api("GET", &path, Some(&access_b), None), 200, "GET the user on B");
    // The e-mail is unique across hosts, in any letter case.
    let dup = json!({"name": "Dup", "email": email.to_uppercase(), "password": PW});
    let r = b.api("POST", "/api/v1/users", None, Some(&dup));
    b.expect_err(&r, 409, "CONFLICT", "the same e-mail signed up on B");

    // Refresh rotated on A, then on B; replaying the spent one revokes the family everywhere.
    let refresh =
        |s: &Server, token: &str| s.api("POST", "/api/v1/auth/refresh", None, Some(&json!({"refreshToken": token})));
    let d = a.expect_data(&refresh(&a, &r1), 200, "refresh r1 on A");
    let r2 = d["refreshToken"].as_str().expect("refreshToken").to_string();
    let d = b.expect_data(&refresh(&b, &r2), 200, "refresh r2 (minted by A) on B");
    let r3 = d["refreshToken"].as_str().expect("refreshToken").to_string();
    a.expect_err(&refresh(&a, &r2), 401, "UNAUTHORIZED", "replay of r2 on A");
    b.expect_err(&refresh(&b, &r3), 401, "UNAUTHORIZED", "r3 on B after the replay on A revoked its family");

    // `forkd user create` with A's config writes to PostgreSQL: B logs the new admin in.
    let admin_email = unique_email("cli-admin");
    let created = a.create_user(&admin_email, "Cli Admin", "admin", PW);
    let (admin_token, _, _) = b.login(&admin_email, PW);
    let all = b.expect_data(&b.api("GET", "/api/v1/users?limit=100", Some(&admin_token), None), 200, "list on B");
    ensure_eq!(b, all["total"].as_i64(), Some(2), "both users, whichever host made them: {all}");
    ensure_eq!(b, all["items"][1]["id"], created["id"], "the CLI's user in B's list");
    // Nothing was written to either host's SQLite file.
    for s in [&a, &b] {
        ensure!(s, !s.dir().join("data").join("forkd.db").exists(), "no SQLite file with [cluster] database_url");
    }
}

/// A PostgreSQL server of this test's own, started and stopped with `bin/pg-test-server`.
struct PrivateServer {
    dir: tempfile::TempDir,
    url: String,
}

impl PrivateServer {
    fn script() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bin").join("pg-test-server")
    }

    fn run(args: &[&str]) -> String {
        let out = Command::new(Self::script()).args(args).output().expect("run bin/pg-test-server");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "bin/pg-test-server {args:?}: {}\n{stderr}", out.status);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn start() -> PrivateServer {
        let dir = tempfile::Builder::new().prefix("forkd-pg-private-").tempdir().expect("tempdir");
        let out = Self::run(&["start", dir.path().to_str().expect("utf-8 path")]);
        let url = out
            .lines()
            .find_map(|l| l.strip_prefix("export TEST_DATABASE_URL="))
            .unwrap_or_else(|| panic!("no URL in {out:?}"))
            .to_string();
        PrivateServer { dir, url }
    }

    fn stop(&self) {
        Self::run(&["stop", self.dir.path().to_str().expect("utf-8 path")]);
    }

    fn restart(&self) {
        Self::run(&["start", self.dir.path().to_str().expect("utf-8 path")]);
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = Command::new(Self::script()).args(["stop", self.dir.path().to_str().unwrap_or("")]).output();
    }
}

#[test]
fn postgres_going_away_is_503_fast_and_comes_back_without_a_restart() {
    if test_server().is_none() {
        return;
    }
    let pg = PrivateServer::start();
    let s = host(&pg.url, 2);
    let workers = s.wait_workers(2, Duration::from_secs(10));
    let (user, token) = s.user("Faulty");
    let path = format!("/api/v1/users/{}", user["id"]);
    s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET before the outage");
    // Every pooled connection of both workers in use at least once.
    for _ in 0..20 {
        s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET before the outage");
    }

    // A restart while the pools sit idle: the connections the server closed are noticed
    // (without a round trip) and replaced, so not one request fails after it. Idle means
    // past the pool's 1 s check threshold; only time can show that.
    let idle_since = Instant::now();
    pg.stop();
    pg.restart();
    if let Some(left) = Duration::from_millis(1200).checked_sub(idle_since.elapsed()) {
        std::thread::sleep(left);
    }
    for round in 0..10 {
        s.expect_data(&s.api("GET", &path, Some(&token), None), 200, &format!("GET #{round} after an idle restart"));
    }

    pg.stop();
    for round in 0..3 {
        let start = Instant::now();
        let r = s.api("GET", &path, Some(&token), None);
        let took = start.elapsed();
        s.expect_err(&r, 503, "SERVICE_UNAVAILABLE", &format!("GET #{round} with PostgreSQL down"));
        ensure!(s, took < FAIL_BOUND, "GET #{round} with PostgreSQL down took {took:?}");
        let start = Instant::now();
        let r = s.get("/health/ready");
        ensure!(s, r.status == 503 && start.elapsed() < FAIL_BOUND, "/health/ready with PostgreSQL down: {r:?}");
    }
    ensure_eq!(s, s.get("/health").status, 200, "/health needs no database");
    let login = json!({"email": "nobody@x.io", "password": PW});
    let r = s.api("POST", "/api/v1/auth/login", None, Some(&login));
    s.expect_err(&r, 503, "SERVICE_UNAVAILABLE", "login with PostgreSQL down");

    pg.restart();
    // Each worker's pool notices on its own (a worker whose last connect failed waits up to
    // 0.5 s before the next): back means 20 requests in a row answered, over both workers.
    let back =
        eventually(Duration::from_secs(20), || (0..20).all(|_| s.api("GET", &path, Some(&token), None).status == 200));
    ensure!(s, back, "GET never succeeded 20 times in a row after PostgreSQL came back");
    // Once back, it stays back: every worker's pool reconnected.
    for _ in 0..20 {
        s.expect_data(&s.api("GET", &path, Some(&token), None), 200, "GET after the outage");
    }
    ensure_eq!(s, s.get("/health/ready").status, 200, "/health/ready after the outage");
    let (mut now, mut before) = (s.workers(), workers);
    now.sort_unstable();
    before.sort_unstable();
    ensure_eq!(s, now, before, "no worker died or was replaced");
}

/// The postmaster of the server kept in `dir` and its children (the backends): every process
/// of that server, found by parent pid, never by name.
fn server_processes(dir: &std::path::Path) -> Vec<i32> {
    let pid_file = std::fs::read_to_string(dir.join("data").join("postmaster.pid")).expect("postmaster.pid");
    let postmaster: i32 = pid_file.lines().next().and_then(|l| l.trim().parse().ok()).expect("a pid");
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid …`: the fields after the last `)`.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_paused_postgres_is_503_within_the_deadline_not_a_hang() {
    use nix::sys::signal::Signal;
    if test_server().is_none() {
        return;
    }
    let pg = PrivateServer::start();
    let s = host(&pg.url, 1);
    let (user, token) = s.user("Paused");
    let path = format!("/api/v1/users/{}", user["id"]);
    let auth = format!("Bearer {token}");
    let get = || s.call_t("GET", &path, &[("Authorization", &auth)], b"", Duration::from_secs(15));
    s.expect_data(&get(), 200, "GET before the pause");

    // SIGSTOP: the kernel still accepts and acknowledges, the server never answers.
    let paused = server_processes(pg.dir.path());
    for &pid in &paused {
        kill_pid(pid, Signal::SIGSTOP);
    }
    let results: Vec<(u16, Duration)> = (0..2)
        .map(|_| {
            let start = Instant::now();
            let r = get();
            (r.status, start.elapsed())
        })
        .collect();
    for &pid in &paused {
        kill_pid(pid, Signal::SIGCONT);
    }
    for (i, (status, took)) in results.iter().enumerate() {
        ensure!(s, *status == 503 && *took < FAIL_BOUND, "GET #{i} with PostgreSQL paused: {status} after {took:?}");
    }
    let back = eventually(Duration::from_secs(20), || get().status == 200);
    ensure!(s, back, "GET never succeeded again after PostgreSQL resumed");
    ensure_eq!(s, s.workers().len(), 1, "the worker lives on");
}

/// PostgreSQL and Redis together, as the two halves of one service: a notification posted on
/// A reaches a live stream on B (the Redis bus), and a client that comes back to B with the
/// `Last-Event-ID` of the last one it saw gets what it missed, in order, from the shared
/// table (the catch-up path when cross-host delivery was paused).
#[test]
fn with_redis_too_notifications_reach_the_other_host_live_and_by_replay() {
    let Some(base) = test_server() else { return };
    let Some(redis) = std::env::var("TEST_REDIS_URL").ok().filter(|v| !v.is_empty()) else {
        eprintln!("skipped: TEST_REDIS_URL not set (bin/redis-test-server starts one)");
        return;
    };
    let url = fresh_database(&base, "bus");
    let cluster = format!("database_url = \"{url}\"\nredis_url = \"{}/8\"", redis.trim_end_matches('/'));
    let start = || Server::api_builder().workers(2).set("cluster", &cluster).start();
    let (a, b) = (start(), start());
    for s in [&a, &b] {
        s.wait_log_line(Duration::from_secs(10), |l| l.contains("redis: connected"));
    }
    let (_, admin) = a.admin();
    let mut live = b.sse_connected(&[]);
    let first = a.notify(&admin, "First", "live on B");
    let ev = live.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("live on B: {e}\n{}", b.log_tail()));
    ensure_eq!(b, ev.data_json(), first.clone(), "the notification posted on A, live on B");
    let seen = ev.id().expect("an id").to_string();
    drop(live);
    let missed: Vec<_> = (0..3).map(|i| a.notify(&admin, &format!("Missed {i}"), "while away")).collect();
    let mut back = b.sse_connected(&[("Last-Event-ID", &seen)]);
    for (i, want) in missed.iter().enumerate() {
        let ev =
            back.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("replay #{i} on B: {e}\n{}", b.log_tail()));
        ensure_eq!(b, ev.data_json(), want.clone(), "replay #{i} on B after Last-Event-ID {seen}");
    }
}

/// `url` over TLS (`sslmode=verify-full`, roots from `ca` in the test server's TLS directory),
/// or `None` after saying the test is skipped (the test server has no TLS without openssl).
fn tls_url(url: &str, ca: &str) -> Option<String> {
    let dir = std::env::var("TEST_DATABASE_TLS_DIR").ok().filter(|v| !v.is_empty());
    if dir.is_none() {
        eprintln!("skipped: TEST_DATABASE_TLS_DIR not set (bin/pg-test-server sets it when openssl is there)");
    }
    Some(format!("{url}?sslmode=verify-full&sslrootcert={}/{ca}", dir?))
}

#[test]
fn the_store_over_tls_serves_and_a_server_another_ca_signed_is_refused() {
    let Some(base) = test_server() else { return };
    let url = fresh_database(&base, "tls");
    let Some(tls) = tls_url(&url, "ca.pem") else { return };
    let a = host(&tls, 1);
    let email = unique_email("tls");
    let user = a.signup("Over TLS", &email, PW, None);
    let (access, _, _) = a.login(&email, PW);
    let path = format!("/api/v1/users/{}", user["id"]);
    a.expect_data(&a.api("GET", &path, Some(&access), None), 200, "a read over TLS");
    drop(a);

    // The same database behind a certificate the configured roots do not vouch for: the
    // supervisor cannot migrate, exits (not a signal, not a hang) and says why.
    let wrong = tls_url(&url, "other-ca.pem").expect("the directory is set");
    let d = tempfile::Builder::new().prefix("forkd-pg-tls-").tempdir().expect("temp dir");
    let cfg = d.path().join("forkd.toml");
    let listen = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &cfg,
        render_config(&listen, &d.path().join("data"), &format!("[cluster]\ndatabase_url = \"{wrong}\"\n")),
    )
    .expect("write config");
    let out = run_forkd(d.path(), &["serve", "--config", cfg.to_str().expect("utf-8")], &[]);
    assert_ne!(out.code(), Some(0), "started against an unverified server: {out:?}");
    assert!(out.status.code().is_some(), "must exit, not die by a signal: {out:?}");
    assert!(out.stderr.to_lowercase().contains("certificate"), "the refusal must say why: {out:?}");
}
