//! Rate limiting (CONTRACT §8): one count per client address across all workers, the
//! `RateLimit-*` headers, 429 with `Retry-After`, window reset, `/health` and `/` exempt,
//! `/csp-report` counted, and the per-(address, e-mail) login failure limit across workers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::*;

/// A rate-limited server (the API defaults but with `[rate_limit]` on as given).
fn limited(workers: usize, rl: &str) -> Server {
    Server::builder().workers(workers).fast_argon2().jwt_secret(TEST_JWT_SECRET).set("rate_limit", rl).start()
}

/// GET `path` on a fresh connection, after `/_debug/pid` on the same connection: (pid, response).
fn get_with_pid(s: &Server, path: &str) -> (i32, Response) {
    let (mut c, pid) = s.conn_with_pid();
    (pid, c.get(path))
}

fn int_header(s: &Server, r: &Response, name: &str, what: &str) -> i64 {
    let v = r.header(name);
    ensure!(s, v.is_some(), "{what}: no {name} header in {r:?}");
    let n = v.unwrap().trim().parse::<i64>();
    ensure!(s, n.is_ok(), "{what}: {name} must be an integer of seconds/requests: {r:?}");
    n.unwrap()
}

fn assert_no_x_ratelimit(s: &Server, r: &Response, what: &str) {
    let x: Vec<&(String, String)> = r.headers.iter().filter(|(k, _)| k.starts_with("x-ratelimit")).collect();
    ensure!(s, x.is_empty(), "{what}: no X-RateLimit-* headers allowed, got {x:?}");
}

fn assert_429(s: &Server, r: &Response, what: &str) {
    s.expect_err(r, 429, "RATE_LIMITED", what);
    let ra = int_header(s, r, "retry-after", what);
    ensure!(s, ra >= 0, "{what}: Retry-After must be non-negative seconds: {r:?}");
    assert_no_x_ratelimit(s, r, what);
}

protocols!(one_count_across_two_workers_remaining_counts_down_then_429_everywhere);
fn one_count_across_two_workers_remaining_counts_down_then_429_everywhere(p: Proto) {
    let s = limited(2, "enabled = true\nmax = 100\nwindow_secs = 900").on(p);
    s.wait_workers(2, Duration::from_secs(10));
    let mut remaining: Vec<i64> = Vec::new();
    let mut by_pid: BTreeMap<i32, usize> = BTreeMap::new();
    for i in 0..100 {
        let (pid, r) = get_with_pid(&s, "/api/config");
        let what = format!("request {} of 100 to /api/config (worker {pid})", i + 1);
        ensure!(s, r.status == 200, "{what}: expected 200, got {r:?}");
        ensure_eq!(s, r.header("ratelimit-policy"), Some("100;w=900"), "{what}: RateLimit-Policy");
        ensure_eq!(s, r.header("ratelimit-limit"), Some("100"), "{what}: RateLimit-Limit");
        let reset = int_header(&s, &r, "ratelimit-reset", &what);
        ensure!(s, (0..=900).contains(&reset), "{what}: RateLimit-Reset {reset} must be within the window 0..=900");
        assert_no_x_ratelimit(&s, &r, &what);
        remaining.push(int_header(&s, &r, "ratelimit-remaining", &what));
        *by_pid.entry(pid).or_default() += 1;
    }
    ensure!(s, by_pid.len() == 2, "the 100 requests must have been served by both workers (test setup): {by_pid:?}");
    let set: BTreeSet<i64> = remaining.iter().copied().collect();
    let expected: BTreeSet<i64> = (0..=99).collect();
    ensure!(
        s,
        set == expected && remaining.len() == 100,
        "RateLimit-Remaining over 100 requests on both workers {by_pid:?} must be exactly 99..=0 without duplicates \
         (one shared count); got, in order: {remaining:?}"
    );
    // Served sequentially, so it also counts down in order.
    let sorted_desc: Vec<i64> = (0..=99).rev().collect();
    ensure_eq!(s, remaining, sorted_desc, "RateLimit-Remaining, in request order");

    // Over the limit: 429 whichever worker answers.
    let mut pids_429: BTreeSet<i32> = BTreeSet::new();
    let mut n = 0;
    while n < 10 || (pids_429.len() < 2 && n < 60) {
        let (pid, r) = get_with_pid(&s, "/api/config");
        assert_429(&s, &r, &format!("request {} over the limit (worker {pid})", n + 1));
        pids_429.insert(pid);
        n += 1;
    }
    ensure!(
        s,
        pids_429.len() == 2,
        "both workers must refuse once the shared count is spent; 429s came from {pids_429:?}"
    );
    // Other /api routes share the count.
    let r = s.call("GET", "/api/v1/users", &[], b"");
    assert_429(&s, &r, "GET /api/v1/users after the limit");
    // /health is never limited and carries no RateLimit headers.
    for _ in 0..5 {
        let r = s.get("/health");
        ensure!(s, r.status == 200, "/health must never be rate limited: {r:?}");
        let rl: Vec<_> = r.headers.iter().filter(|(k, _)| k.starts_with("ratelimit") || k == "retry-after").collect();
        ensure!(s, rl.is_empty(), "/health must carry no RateLimit headers: {r:?}");
    }
    // Neither is GET / (whatever it answers, it is not a 429 and carries no RateLimit headers).
    let r = s.get("/");
    ensure!(s, r.status != 429, "GET / must not be rate limited: {r:?}");
    ensure!(s, r.header("ratelimit-limit").is_none(), "GET / must carry no RateLimit headers: {r:?}");
}

protocols!(a_short_window_resets_the_count);
fn a_short_window_resets_the_count(p: Proto) {
    let s = limited(2, "enabled = true\nmax = 3\nwindow_secs = 1").on(p);
    // The window may start at any point of a second: spend it, see the 429, then wait for
    // the reset (bounded by the window and Retry-After).
    let mut got_429 = None;
    for i in 0..4 {
        let r = s.get("/api/config");
        if r.status == 429 {
            got_429 = Some(r);
            break;
        }
        ensure!(s, r.status == 200, "request {} (max 3, window 1 s): {r:?}", i + 1);
        ensure_eq!(s, r.header("ratelimit-policy"), Some("3;w=1"), "RateLimit-Policy");
        let reset = int_header(&s, &r, "ratelimit-reset", "RateLimit-Reset");
        ensure!(s, (0..=1).contains(&reset), "RateLimit-Reset {reset} must be within a 1 s window: {r:?}");
    }
    // With a 1 s window four quick requests normally exceed 3; if a window boundary fell
    // in between, keep going until a 429 (bounded).
    let start = Instant::now();
    while got_429.is_none() && start.elapsed() < Duration::from_secs(3) {
        let r = s.get("/api/config");
        if r.status == 429 {
            got_429 = Some(r);
        }
    }
    let r = got_429.unwrap_or_else(|| panic!("no 429 with max 3 per 1 s\nlog:\n{}", s.log_tail()));
    assert_429(&s, &r, "over max 3 in a 1 s window");
    let ra = int_header(&s, &r, "retry-after", "Retry-After");
    ensure!(s, ra <= 1, "Retry-After {ra} must not exceed the 1 s window: {r:?}");
    let t = Instant::now();
    let ok = eventually(Duration::from_millis(2500), || s.get("/api/config").status == 200);
    ensure!(s, ok, "the count must reset after the 1 s window (waited {:?})", t.elapsed());
}

protocols!(csp_report_is_counted_with_api_routes);
fn csp_report_is_counted_with_api_routes(p: Proto) {
    let s = limited(2, "enabled = true\nmax = 4\nwindow_secs = 900").on(p);
    let report = serde_json::to_vec(&json!({"csp-report": {
        "document-uri": "http://127.0.0.1:8080/", "violated-directive": "img-src",
        "blocked-uri": "http://evil.example/x.png", "original-policy": "default-src 'none'"}}))
    .unwrap();
    for i in 0..2 {
        let r = s.call("POST", "/csp-report", &[("Content-Type", "application/csp-report")], &report);
        ensure!(s, r.status == 204, "POST /csp-report #{} (max 4): expected 204, got {r:?}", i + 1);
        ensure_eq!(s, r.header("ratelimit-limit"), Some("4"), "RateLimit-Limit on /csp-report");
        ensure!(s, r.header("ratelimit-remaining").is_some(), "RateLimit-Remaining on /csp-report: {r:?}");
        let r = s.get("/api/config");
        ensure!(s, r.status == 200, "GET /api/config #{} (max 4): {r:?}", i + 1);
    }
    let r = s.get("/api/config");
    assert_429(&s, &r, "/api/config after 2 csp reports + 2 api calls (max 4)");
    let r = s.call("POST", "/csp-report", &[("Content-Type", "application/csp-report")], &report);
    assert_429(&s, &r, "/csp-report after the shared count is spent");
}

#[test]
fn login_failures_limit_per_email_across_workers() {
    let s = limited(2, "enabled = true\nmax = 1000\nwindow_secs = 900\nlogin_max_failures = 3");
    let workers = s.wait_workers(2, Duration::from_secs(10));
    let (a, b) = (workers[0], workers[1]);
    let email = unique_email("victim");
    s.create_user(&email, "Victim", "user", "right-password-1");
    let other = unique_email("bystander");
    s.create_user(&other, "Bystander", "user", "right-password-2");

    let login_on = |pid: i32, email: &str, pw: &str| -> Response {
        let mut c = s.conn_on(pid);
        c.set_timeout(SLOW_IO_TIMEOUT);
        let body = serde_json::to_vec(&json!({"email": email, "password": pw})).unwrap();
        c.send(&request("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body));
        c.read_response()
    };
    for i in 0..3 {
        let r = login_on(a, &email, "wrong-password");
        s.expect_err(&r, 401, "UNAUTHORIZED", &format!("wrong password #{} on worker A", i + 1));
    }
    // The 4th attempt, on the OTHER worker, with the right password: refused.
    let r = login_on(b, &email, "right-password-1");
    assert_429(&s, &r, "4th login attempt (right password) on worker B after 3 failures on worker A");
    let r = login_on(a, &email, "right-password-1");
    assert_429(&s, &r, "login (right password) on worker A after 3 failures");
    // Another e-mail from the same address is unaffected, on both workers.
    for pid in [a, b] {
        let r = login_on(pid, &other, "wrong-password");
        s.expect_err(&r, 401, "UNAUTHORIZED", &format!("other e-mail, wrong password, worker {pid}"));
    }
    let r = login_on(b, &other, "right-password-2");
    s.expect_data(&r, 200, "other e-mail from the same address, right password");
}

/// Regression: the login limiter only read the failure count before the argon2 job and
/// counted the failure when the job ended, so concurrent wrong passwords were all checked
/// (150 concurrent attempts for one address and e-mail: ~90 verified). Each attempt must take
/// its slot before the hash: at most `login_max_failures` passwords are checked, the rest
/// are 429, whatever the concurrency.
#[test]
fn concurrent_wrong_logins_check_at_most_login_max_failures_passwords() {
    const ATTEMPTS: usize = 60;
    const MAX_FAILURES: usize = 5;
    // The real argon2 parameters: each check takes long enough for the attempts to overlap.
    let s = Server::builder()
        .workers(2)
        .jwt_secret(TEST_JWT_SECRET)
        .set(
            "rate_limit",
            &format!("enabled = true\nmax = 100000\nwindow_secs = 900\nlogin_max_failures = {MAX_FAILURES}"),
        )
        .start();
    s.wait_workers(2, Duration::from_secs(10));
    let email = unique_email("raced");
    s.create_user(&email, "Raced", "user", "right-password-1");
    let body = serde_json::to_vec(&json!({"email": email, "password": "wrong-password"})).unwrap();
    let req = request("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body);

    // Connect everyone first, then send all at once.
    let conns: Vec<Conn> = (0..ATTEMPTS).map(|_| s.conn()).collect();
    let barrier = std::sync::Barrier::new(ATTEMPTS);
    let statuses: Vec<Result<u16, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = conns
            .into_iter()
            .map(|mut c| {
                let (barrier, req) = (&barrier, &req);
                sc.spawn(move || {
                    c.set_timeout(SLOW_IO_TIMEOUT);
                    barrier.wait();
                    c.try_write(req).map_err(|e| e.to_string())?;
                    c.try_read_response(false).map(|r| r.status).map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into()))).collect()
    });
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for st in &statuses {
        match st {
            Ok(code) => *by_status.entry(*code).or_default() += 1,
            Err(e) => panic!("a login attempt failed: {e}\nlog:\n{}", s.log_tail()),
        }
    }
    let n401 = by_status.get(&401).copied().unwrap_or(0);
    let n429 = by_status.get(&429).copied().unwrap_or(0);
    ensure!(
        s,
        (1..=MAX_FAILURES).contains(&n401),
        "{ATTEMPTS} concurrent wrong passwords: at most {MAX_FAILURES} may be checked (401), got {by_status:?}"
    );
    ensure_eq!(s, n401 + n429, ATTEMPTS, "every other attempt must be 429: {by_status:?}");
    // Still refused afterwards, even with the right password.
    let body = serde_json::to_vec(&json!({"email": email, "password": "right-password-1"})).unwrap();
    let r = s.call_t("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT);
    assert_429(&s, &r, "the right password after the failures are spent");
}

protocols!(a_right_password_after_failures_logs_in_and_gives_its_slot_back);
/// A right password takes a slot like any attempt and gives it back: failures before it
/// still count (they are not forgotten), the success itself does not.
fn a_right_password_after_failures_logs_in_and_gives_its_slot_back(p: Proto) {
    let s = limited(1, "enabled = true\nmax = 1000\nwindow_secs = 900\nlogin_max_failures = 3").on(p);
    let email = unique_email("typo");
    s.create_user(&email, "Typo", "user", "right-password-1");
    let login = |pw: &str| -> Response {
        let body = serde_json::to_vec(&json!({"email": email, "password": pw})).unwrap();
        s.call_t("POST", "/api/v1/auth/login", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT)
    };
    for i in 0..2 {
        s.expect_err(&login("wrong-password"), 401, "UNAUTHORIZED", &format!("wrong password #{}", i + 1));
    }
    s.expect_data(&login("right-password-1"), 200, "the right password after 2 failures (max 3)");
    s.expect_data(&login("right-password-1"), 200, "the right password again: successes use no slot");
    s.expect_err(&login("wrong-password"), 401, "UNAUTHORIZED", "the 3rd failure: still a slot left");
    assert_429(&s, &login("right-password-1"), "after 3 failures, even the right password");
}

/// The log lines that explain a rate-limit refusal to a developer.
fn explanations(s: &Server) -> Vec<String> {
    s.logs().lines().filter(|l| l.contains("rate limit: a client went over")).map(str::to_string).collect()
}

protocols!(in_development_the_first_refusal_logs_which_limit_and_how_to_change_it_once);
fn in_development_the_first_refusal_logs_which_limit_and_how_to_change_it_once(p: Proto) {
    let s = limited(1, "enabled = true\nmax = 2\nwindow_secs = 900").on(p);
    for i in 0..6 {
        let r = s.get("/api/config");
        let want = if i < 2 { 200 } else { 429 };
        ensure!(s, r.status == want, "request {}: expected {want}, got {r:?}", i + 1);
    }
    let lines = explanations(&s);
    ensure!(s, lines.len() == 1, "four refusals, one explanation (per worker), got {lines:?}");
    let line = &lines[0];
    for part in ["rate_limit.max = 2", "FORKD_RATE_LIMIT__MAX", "FORKD_RATE_LIMIT__ENABLED=false"] {
        ensure!(s, line.contains(part), "the explanation must name {part:?}: {line}");
    }
}

protocols!(in_production_a_refusal_is_not_explained_in_the_log);
fn in_production_a_refusal_is_not_explained_in_the_log(p: Proto) {
    let s = Server::builder()
        .top("environment = \"production\"")
        .jwt_secret(TEST_JWT_SECRET)
        .fast_argon2()
        .set("rate_limit", "enabled = true\nmax = 1\nwindow_secs = 900")
        .set("debug", "routes = false")
        .start()
        .on(p);
    assert_eq!(s.get("/api/config").status, 200);
    let r = s.get("/api/config");
    ensure!(s, r.status == 429, "over the limit: {r:?}");
    let lines = explanations(&s);
    ensure!(s, lines.is_empty(), "production logs no hint: {lines:?}");
}
