//! Several hosts sharing one Redis (`cluster.redis_url`, CONTRACT §12): two forkd services
//! (separate supervisors, data directories and ports) behave as one for the rate limit and
//! login failures (one count over both), WebSocket rooms and live notifications; with Redis
//! gone they keep serving (limits per host, counted in `/metrics`) and when it returns the
//! cross-host state resumes without a restart.
//!
//! The shared tests need `TEST_REDIS_URL` (`.ci/run` starts one with
//! `bin/redis-test-server`; not a `FORKD_*` name, which forkd would refuse as an unknown
//! key when a test passes its environment on) and skip with a message without it; each uses its own database
//! number (pub/sub channels carry it too), so they stay independent. The outage test starts
//! its own `redis-server` (skipped when there is none on `PATH`).

use std::collections::HashMap;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::upstream::{Behaviour, Upstream};
use crate::util::*;

/// How often the supervisor sends the rate table's new hits to Redis while hits come
/// (`supervisor::redis::FLUSH_EVERY`).
const FLUSH: Duration = Duration::from_millis(5);
/// How often a host asks again for the totals of keys it counted but no longer hits
/// (`supervisor::redis::REFRESH_EVERY`): the longest a host can go on a stale view.
const REFRESH: Duration = Duration::from_millis(20);
/// `cluster.redis_url` as an environment override (the configuration's `FORKD_SECTION__KEY`).
const URL_VAR: &str = "FORKD_CLUSTER__REDIS_URL";

/// `TEST_REDIS_URL` with database `db`, emptied (counts of an earlier run in the same
/// window would count here too), or `None` (and a message) when unset.
fn shared_redis(db: u32, test: &str) -> Option<String> {
    match std::env::var("TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let url = url.trim_end_matches('/');
            redis_command(url, &[&["SELECT", &db.to_string()], &["FLUSHDB"]]);
            Some(format!("{url}/{db}"))
        }
        _ => {
            eprintln!("SKIPPED redis::{test}: TEST_REDIS_URL is not set (start one with bin/redis-test-server)");
            None
        }
    }
}

/// Sends `commands` to the Redis at `url` (`redis://host:port`, no password) and waits for
/// as many replies (a test's own minimal client: one line each is enough here).
fn redis_command(url: &str, commands: &[&[&str]]) {
    use std::io::{BufRead, BufReader, Write};
    let addr = url.trim_start_matches("redis://").split('/').next().unwrap_or_default().to_owned();
    let mut c = TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect to Redis at {addr}: {e}"));
    c.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut out = Vec::new();
    for args in commands {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in *args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    }
    c.write_all(&out).expect("write to Redis");
    let mut r = BufReader::new(c);
    for args in commands {
        let mut line = String::new();
        r.read_line(&mut line).expect("read from Redis");
        assert!(line.starts_with('+'), "Redis answered {line:?} to {args:?}");
    }
}

/// A forkd with 2 workers using Redis at `url`, the shared signing secret, and `rate_limit`
/// lines; waits until its supervisor is connected to Redis.
fn host(url: &str, rate_limit: &str) -> Server {
    let s = Server::builder()
        .fast_argon2()
        .jwt_secret(TEST_JWT_SECRET)
        .workers(2)
        .set("rate_limit", rate_limit)
        .env(URL_VAR, url)
        .start();
    s.wait_log_line(Duration::from_secs(10), |l| l.contains("redis: connected"));
    s
}

fn two_hosts(url: &str, rate_limit: &str) -> (Server, Server) {
    (host(url, rate_limit), host(url, rate_limit))
}

/// The value of the unlabelled metric `name` in `GET /metrics`.
fn metric(s: &Server, name: &str) -> Option<u64> {
    let text = s.get("/metrics").body_str();
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn rate_limit_max_holds_over_the_sum_of_both_hosts() {
    let Some(url) = shared_redis(1, "rate_limit_max_holds_over_the_sum_of_both_hosts") else { return };
    const MAX: usize = 60;
    // One request every PACE, alternating hosts: each host sees r = 1 / (2 × PACE).
    const PACE: Duration = Duration::from_millis(2);
    let (a, b) = two_hosts(&url, &format!("enabled = true\nmax = {MAX}\nwindow_secs = 900"));
    let mut allowed = [0usize; 2];
    let mut refused = [0usize; 2];
    // Whether a host's `RateLimit-Remaining` ever counted the other host's requests.
    let mut saw_other = [false; 2];
    for i in 0..3 * MAX {
        let h = i % 2;
        let s = if h == 0 { &a } else { &b };
        let r = s.get("/api/v1/none");
        ensure!(s, r.status < 500, "request {i}: {r:?}");
        if r.status == 429 {
            refused[h] += 1;
        } else {
            allowed[h] += 1;
            let remaining = r.header("ratelimit-remaining").and_then(|v| v.parse::<usize>().ok()).unwrap_or(MAX);
            saw_other[h] |= remaining < MAX - allowed[h];
        }
        // Pacing keeps the client's rate known (the bound depends on it); not a readiness wait.
        thread::sleep(PACE);
    }
    // The stated bound: hosts × r × (the longest a host goes on a stale view of the other:
    // the first flush after an idle spell, 20 ms, plus a round trip; 40 ms with slack for a
    // loaded machine). Alone, each host would admit MAX (2 × MAX in all).
    let per_host_rate = 1.0 / (2.0 * PACE.as_secs_f64());
    let bound = (2.0 * per_host_rate * 0.040).ceil() as usize;
    let total: usize = allowed.iter().sum();
    eprintln!(
        "rate limit over two hosts: {total} allowed of {} (max {MAX}, overshoot {} <= bound {bound}), \
         allowed {allowed:?}, refused {refused:?}",
        3 * MAX,
        total.saturating_sub(MAX)
    );
    ensure!(a, total >= MAX, "at least max must pass: {allowed:?}");
    ensure!(a, total <= MAX + bound, "{total} allowed over both hosts: more than max {MAX} + overshoot bound {bound}");
    ensure!(a, refused[0] > 0 && refused[1] > 0, "both hosts refuse once the sum is reached: {refused:?}");
    ensure!(a, saw_other == [true, true], "RateLimit-Remaining counts the other host's requests: {saw_other:?}");
}

#[test]
fn login_failures_are_counted_over_both_hosts() {
    let Some(url) = shared_redis(2, "login_failures_are_counted_over_both_hosts") else { return };
    let (a, b) = two_hosts(&url, "enabled = true\nmax = 100000\nwindow_secs = 900\nlogin_max_failures = 4");
    let email = unique_email("victim");
    let login = |s: &Server| {
        let body = serde_json::to_vec(&json!({"email": email, "password": "wrong-password"})).unwrap();
        s.call_t("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT)
    };
    for (i, s) in [&a, &b, &a, &b].into_iter().enumerate() {
        let r = login(s);
        ensure_eq!(s, r.status, 401, "failure {} of 4: {r:?}", i + 1);
        // The refresh interval (plus a flush) is the longest a host goes without hearing of
        // the other's failures: the stated bound, not a readiness that could be polled.
        thread::sleep(2 * REFRESH + 2 * FLUSH);
    }
    for (name, s) in [("A", &a), ("B", &b)] {
        let r = login(s);
        ensure_eq!(s, r.status, 429, "a 5th attempt on host {name} after 2 failures on each: {r:?}");
    }
}

/// Reads chat messages on `ws` until `want` messages with content starting `prefix` came;
/// returns their contents by sender (the content's next 2 bytes: user ids are per host,
/// since each host has its own store).
fn collect(s: &Server, ws: &mut Ws, prefix: &str, want: usize, who: &str) -> HashMap<String, Vec<String>> {
    let mut got: HashMap<String, Vec<String>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    while n < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = ws.recv_json(left.max(Duration::from_millis(1))).unwrap_or_else(|e| {
            panic!("{who}: after {n} of {want} messages: {e}; so far {got:?}\nlog:\n{}", s.log_tail())
        });
        let Some(content) = m["content"].as_str().filter(|c| c.starts_with(prefix)) else { continue };
        let sender = content.get(prefix.len()..prefix.len() + 2).unwrap_or("").to_owned();
        got.entry(sender).or_default().push(content.to_owned());
        n += 1;
    }
    got
}

#[test]
fn a_room_spans_hosts_every_member_gets_every_message_once_in_order() {
    let Some(url) = shared_redis(3, "a_room_spans_hosts_every_member_gets_every_message_once_in_order") else {
        return;
    };
    let (a, b) = two_hosts(&url, "enabled = false");
    let (_, ta) = a.user("Ann");
    let (_, tb) = b.user("Bob");
    let (_, ta2) = a.user("Ada");
    let (_, tb2) = b.user("Bea");
    let room = "everywhere";
    let mut members = Vec::new();
    for (s, token) in [(&a, &ta), (&b, &tb), (&a, &ta2), (&b, &tb2)] {
        let (mut ws, hello) = s.ws_chat(token);
        let me = hello["userId"].as_i64().expect("userId");
        ws.send_json(&json!({"type": "join", "roomId": room}));
        // Joined once its own chat comes back (the join was applied before it).
        let marker = format!("join-{me}");
        ws.send_json(&json!({"type": "chat", "roomId": room, "content": marker}));
        collect(s, &mut ws, &marker, 1, "own join marker");
        members.push((s, ws));
    }
    // A member on one host hears a member on the other once the bus is through Redis.
    let probe = "probe";
    members[1].1.send_json(&json!({"type": "chat", "roomId": room, "content": probe}));
    for (k, (s, ws)) in members.iter_mut().enumerate() {
        collect(s, ws, probe, 1, &format!("member {k}: the probe from a member on B"));
    }
    const N: usize = 40;
    for i in 0..N {
        members[0].1.send_json(&json!({"type": "chat", "roomId": room, "content": format!("m-a-{i:03}")}));
        members[1].1.send_json(&json!({"type": "chat", "roomId": room, "content": format!("m-b-{i:03}")}));
    }
    let want_a: Vec<String> = (0..N).map(|i| format!("m-a-{i:03}")).collect();
    let want_b: Vec<String> = (0..N).map(|i| format!("m-b-{i:03}")).collect();
    for (k, (s, ws)) in members.iter_mut().enumerate() {
        let got = collect(s, ws, "m-", 2 * N, &format!("member {k}"));
        ensure_eq!(s, got.get("a-"), Some(&want_a), "member {k}: Ann's messages (host A), once each, in order");
        ensure_eq!(s, got.get("b-"), Some(&want_b), "member {k}: Bob's messages (host B), once each, in order");
        // Nothing more: a duplicate would show here.
        let extra = ws.recv_json(Duration::from_millis(300));
        ensure!(s, extra.is_err(), "member {k}: a message after the last one: {extra:?}");
    }
}

#[test]
fn a_notification_posted_on_one_host_reaches_a_stream_on_the_other() {
    let Some(url) = shared_redis(4, "a_notification_posted_on_one_host_reaches_a_stream_on_the_other") else {
        return;
    };
    let (a, b) = two_hosts(&url, "enabled = false");
    let (_, admin) = a.admin();
    let mut streams: Vec<SseStream> = (0..4).map(|_| b.sse_connected(&[])).collect();
    let n = a.notify(&admin, "Across", "hosts");
    for (i, st) in streams.iter_mut().enumerate() {
        let ev = st
            .next_non_heartbeat(IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("stream {i} on B: {e}\nlog:\n{}", b.log_tail()));
        ensure_eq!(b, ev.event(), Some("notification"), "stream {i}: {ev:?}");
        let d: Value = serde_json::from_str(&ev.data()).expect("JSON data");
        ensure_eq!(b, d, n.clone(), "stream {i} on B: the notification posted on A");
    }
}

/// A `redis-server` this test owns, on `port` (not daemonized: stopped by its pid).
struct PrivateRedis {
    child: Child,
    _dir: tempfile_dir::Dir,
}

/// A directory of its own for the private server.
mod tempfile_dir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl PrivateRedis {
    fn start(port: u16) -> Option<PrivateRedis> {
        let dir = std::env::temp_dir().join(format!("forkd-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let r = PrivateRedis { child, _dir: tempfile_dir::Dir(dir) };
        let up = eventually(Duration::from_secs(5), || TcpStream::connect(("127.0.0.1", port)).is_ok());
        up.then_some(r)
    }

    fn stop(mut self) {
        kill_pid(self.child.id() as i32, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill_pid(self.child.id() as i32, nix::sys::signal::Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

#[test]
fn redis_gone_under_load_limits_per_host_then_cross_host_state_resumes() {
    let port = free_port();
    let Some(redis) = PrivateRedis::start(port) else {
        eprintln!("SKIPPED redis::redis_gone_under_load…: no redis-server on PATH (bin/redis-test-server installs it)");
        return;
    };
    const MAX: usize = 3;
    let url = format!("redis://127.0.0.1:{port}/0");
    let (a, b) =
        two_hosts(&url, &format!("enabled = true\nmax = 100000\nwindow_secs = 900\nlogin_max_failures = {MAX}"));
    let (_, admin) = a.admin();
    // Load on both hosts all along: never a 5xx, never a hang.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = [a.addr(), b.addr()]
        .into_iter()
        .map(|addr| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut worst = Duration::ZERO;
                let mut statuses: HashMap<u16, usize> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let r = get(addr, "/health");
                    worst = worst.max(t.elapsed());
                    *statuses.entry(r.status).or_default() += 1;
                }
                (worst, statuses)
            })
        })
        .collect();
    redis.stop();
    for (name, s) in [("A", &a), ("B", &b)] {
        let down = eventually(Duration::from_secs(10), || metric(s, "forkd_redis_up") == Some(0));
        ensure!(s, down, "host {name}: forkd_redis_up must go to 0");
        ensure!(s, metric(s, "forkd_redis_fallbacks_total") >= Some(1), "host {name}: a fallback is counted");
    }
    // Each host limits on its own count now: MAX failed logins each, 2 × MAX in all.
    let email = unique_email("outage");
    let body = serde_json::to_vec(&json!({"email": email, "password": "wrong-password"})).unwrap();
    for (name, s) in [("A", &a), ("B", &b)] {
        let statuses: Vec<u16> = (0..MAX + 2)
            .map(|_| {
                s.call_t("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT)
                    .status
            })
            .collect();
        let passed = statuses.iter().filter(|s| **s == 401).count();
        ensure_eq!(s, passed, MAX, "host {name} alone while Redis is down: {statuses:?}");
    }
    let warned = a.logs().matches("redis: unreachable").count();
    ensure_eq!(a, warned, 1, "the outage is logged once");
    // Redis comes back on the same address: both reconnect by themselves.
    let _redis = PrivateRedis::start(port).expect("redis-server restarts");
    for (name, s) in [("A", &a), ("B", &b)] {
        let up = eventually(Duration::from_secs(10), || metric(s, "forkd_redis_up") == Some(1));
        ensure!(s, up, "host {name}: forkd_redis_up must come back to 1");
    }
    let mut st = b.sse_connected(&[]);
    let n = a.notify(&admin, "After", "the outage");
    let ev = st.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("stream on B: {e}\nlog:\n{}", b.log_tail()));
    let d: Value = serde_json::from_str(&ev.data()).expect("JSON data");
    ensure_eq!(b, d, n, "cross-host delivery resumed without a restart");
    stop.store(true, Ordering::Relaxed);
    for (name, h) in ["A", "B"].into_iter().zip(load) {
        let (worst, statuses) = h.join().expect("load thread");
        eprintln!("load on host {name}: {statuses:?}, slowest {worst:?}");
        ensure!(a, statuses.keys().all(|s| *s < 500), "host {name}: a 5xx under the outage: {statuses:?}");
        ensure!(a, worst < Duration::from_secs(2), "host {name}: a request took {worst:?}");
    }
}

/// The shared upstream cache spans hosts: what host A fetched from an upstream, host B
/// serves from its own cache without asking the upstream again.
#[test]
fn an_upstream_answer_cached_on_one_host_is_served_by_the_other() {
    let Some(url) = shared_redis(9, "an_upstream_answer_cached_on_one_host_is_served_by_the_other") else {
        return;
    };
    // One fake upstream for the three parts (users, orders, recommendations).
    let up = Upstream::start(|r| {
        let id = r.path.strip_prefix("/users/").and_then(|p| p.split('/').next()).unwrap_or("0").to_owned();
        if r.path.ends_with("/orders") || r.path.ends_with("/recommendations") {
            Behaviour::json(200, &json!([{"id": format!("x-{id}"), "status": "shipped", "totalAmount": 1.5}]))
        } else {
            Behaviour::json(200, &json!({"id": id, "name": format!("User {id}"), "avatar": "a.png"}))
        }
    });
    let lines = format!("users = \"{u}\"\norders = \"{u}\"\nrecommendations = \"{u}\"", u = up.url());
    let start = || {
        let s = Server::api_builder()
            .workers(2)
            .set("upstreams", &lines)
            .env(URL_VAR, &url)
            // Each entry stored from another host is logged at debug: the readiness signal.
            .env("RUST_LOG", "info,forkd::supervisor::redis=debug")
            .start();
        s.wait_log_line(Duration::from_secs(10), |l| l.contains("redis: connected"));
        s
    };
    let (a, b) = (start(), start());
    // Tokens are checked by signature only: A's token is good on B (same signing secret).
    let (u, token) = a.user("Ann");
    let id = u["id"].as_i64().expect("an id");
    let first = a.api("GET", "/api/homepage", Some(&token), None);
    let on_a = a.expect_data(&first, 200, "GET /api/homepage on A");
    ensure_eq!(a, up.total(), 3, "A asks each upstream once: {:?}", up.requests());
    // Replication is asynchronous (A's worker → A's supervisor → Redis → B's supervisor):
    // wait, bounded, until B logged all three parts stored.
    let keys = [format!("user:{id} "), format!("recentOrders:{id} "), format!("recommendations:{id} ")];
    let replicated = eventually(Duration::from_secs(10), || {
        let logs = b.logs();
        keys.iter().all(|k| logs.lines().any(|l| l.contains("shared-cache entry") && l.contains(k.as_str())))
    });
    // Several requests, new connections each, so both of B's workers answer.
    for i in 0..6 {
        let r = b.api("GET", "/api/homepage", Some(&token), None);
        let on_b = b.expect_data(&r, 200, &format!("GET /api/homepage on B (request {i})"));
        ensure_eq!(b, on_b, on_a, "B serves the same homepage as A");
    }
    ensure_eq!(
        b,
        up.total(),
        3,
        "B must serve A's cached answers without asking the upstream (replicated: {replicated}): {:?}",
        up.requests()
    );
    ensure!(b, replicated, "B stores the three parts A fetched");
}

#[test]
fn the_config_file_key_is_read_and_a_reload_that_changes_it_is_refused() {
    let Some(url) = shared_redis(6, "the_config_file_key_is_read_and_a_reload_that_changes_it_is_refused") else {
        return;
    };
    let s = Server::builder()
        .jwt_secret(TEST_JWT_SECRET)
        .workers(1)
        .set("cluster", &format!("redis_url = \"{url}\""))
        .start();
    s.wait_log_line(Duration::from_secs(10), |l| l.contains("redis: connected"));
    let before = s.workers();
    let other = format!("{}/7", url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base));
    let text = s.config_text.replace(&url, &other);
    assert_ne!(text, s.config_text, "the URL is in the file");
    std::fs::write(s.config_path(), text).expect("write config");
    s.signal(nix::sys::signal::Signal::SIGHUP);
    let line = s.wait_log_line(Duration::from_secs(10), |l| l.contains("reload refused"));
    assert!(line.contains("cluster.redis_url"), "{line}");
    assert_eq!(s.workers(), before, "the workers stay");
}

/// A private `redis-server` speaking TLS only, its certificate signed by `pki`'s CA; `None`
/// when this redis-server cannot (built without TLS) or is missing.
fn tls_redis(port: u16, dir: &std::path::Path, pki: &crate::tls::Pki) -> Option<Child> {
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write a PEM file");
        path
    };
    let (cert, key, ca) =
        (file("server.pem", &pki.cert_pem), file("server.key", &pki.key_pem), file("ca.pem", &pki.ca_pem));
    let mut child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", "0", "--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&ca)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let up = eventually(Duration::from_secs(5), || {
        matches!(child.try_wait(), Ok(None)) && TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    if !up {
        kill_pid(child.id() as i32, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
        return None;
    }
    Some(child)
}

#[test]
fn over_tls_the_limit_holds_over_both_hosts_and_a_server_another_ca_signed_is_refused() {
    let dir = tempfile::Builder::new().prefix("forkd-rediss-").tempdir().expect("temp dir");
    let pki = crate::tls::Pki::new();
    let port = free_port();
    let Some(mut redis) = tls_redis(port, dir.path(), &pki) else {
        eprintln!("SKIPPED redis::over_tls: no redis-server with TLS on PATH");
        return;
    };
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            kill_pid(self.0.id() as i32, nix::sys::signal::Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut redis);
    let url = format!("rediss://127.0.0.1:{port}/0?ssl_ca_certs={}", dir.path().join("ca.pem").display());
    const MAX: usize = 10;
    let (a, b) = two_hosts(&url, &format!("enabled = true\nmax = {MAX}\nwindow_secs = 900"));
    ensure!(a, metric(&a, "forkd_redis_up") == Some(1), "A is connected over TLS");
    // The counts go through the TLS connection: alone, each host would admit MAX.
    let mut allowed = 0;
    for i in 0..4 * MAX {
        let s = if i % 2 == 0 { &a } else { &b };
        let r = s.get("/api/v1/none");
        ensure!(s, r.status < 500, "request {i}: {r:?}");
        allowed += usize::from(r.status != 429);
        thread::sleep(Duration::from_millis(2));
    }
    ensure!(a, (MAX..2 * MAX).contains(&allowed), "{allowed} allowed over both hosts (max {MAX} each alone)");
    drop((a, b));

    // Roots of another CA: the host serves (limits its own) and says why Redis is down.
    let other = crate::tls::Pki::new();
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, &other.ca_pem).expect("write");
    let url = format!("rediss://127.0.0.1:{port}/0?ssl_ca_certs={}", other_ca.display());
    let c = Server::builder().fast_argon2().jwt_secret(TEST_JWT_SECRET).workers(1).env(URL_VAR, &url).start();
    let line = c.wait_log_line(Duration::from_secs(10), |l| l.contains("TLS"));
    ensure!(c, line.to_lowercase().contains("certificate"), "the log says why: {line}");
    ensure!(c, metric(&c, "forkd_redis_up") == Some(0), "not connected to a server it cannot verify");
    ensure!(c, c.get("/health").status == 200, "and it serves");
}
