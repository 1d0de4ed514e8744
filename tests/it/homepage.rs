//! `GET /api/homepage` (CONTRACT §6): the bearer requirement, the three upstream calls made
//! in parallel and their mapping (`user`, `recentOrders` with `total` from `totalAmount`,
//! `recommendations` cut to 10, `{"items": …}` accepted), the users upstream failing (502 /
//! 504), orders or recommendations failing (`[]` and `degraded`), the per-worker and shared
//! caches (one upstream request per path and user within the TTL, failures not cached),
//! keep-alive towards the upstreams, cancellation when the client goes away, and the
//! built-in demo upstreams.
//!
//! Each test starts its own fake upstreams (`upstream.rs`) before its server. Most fakes
//! answer per user id (the id in the request path): a test creates users and scripts a
//! different failure for each, so one server covers several cases without the cache in the
//! way.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::upstream::*;
use crate::util::*;

/// Over the 1 MiB an upstream answer may have.
const OVERSIZED: usize = (1 << 20) + 4096;

// ---------------------------------------------------------------------------------------
// Fixture
// ---------------------------------------------------------------------------------------

/// The user id in `/users/{id}{suffix}`, when `path` has exactly that shape.
fn user_id_in(path: &str, suffix: &str) -> Option<i64> {
    path.strip_prefix("/users/")?.strip_suffix(suffix)?.parse().ok()
}

/// A fake upstream that answers `/users/{id}{suffix}` with `default(id)` unless a test
/// scripted something else for that id; any other path is a 404.
struct PerUser {
    up: Upstream,
    suffix: &'static str,
    scripted: Arc<Mutex<HashMap<i64, Behaviour>>>,
}

impl PerUser {
    fn start(suffix: &'static str, default: fn(i64) -> Behaviour) -> PerUser {
        let scripted: Arc<Mutex<HashMap<i64, Behaviour>>> = Arc::default();
        let sc = scripted.clone();
        let up = Upstream::start(move |r| match user_id_in(&r.path, suffix) {
            Some(id) if r.method == "GET" => sc.lock().unwrap().get(&id).cloned().unwrap_or_else(|| default(id)),
            _ => {
                Behaviour::json(404, &json!({"error": format!("fake upstream: no route for {} {}", r.method, r.path)}))
            }
        });
        PerUser { up, suffix, scripted }
    }

    /// From now on, answer user `id` with `b`.
    fn script(&self, id: i64, b: Behaviour) {
        self.scripted.lock().unwrap().insert(id, b);
    }

    /// Back to the default answer for user `id`.
    fn unscript(&self, id: i64) {
        self.scripted.lock().unwrap().remove(&id);
    }

    fn path(&self, id: i64) -> String {
        format!("/users/{id}{}", self.suffix)
    }

    /// Requests the upstream received for user `id`.
    fn count(&self, id: i64) -> usize {
        self.up.count(&self.path(id))
    }
}

/// What the fake users upstream says about user `id`: more than forkd passes on.
fn users_answer(id: i64) -> Value {
    json!({"id": id, "name": format!("User {id}"), "avatar": format!("https://img.example/{id}.png"),
           "email": format!("u{id}@private.example"), "internalScore": 42})
}

fn expected_user(id: i64) -> Value {
    json!({"name": format!("User {id}"), "avatar": format!("https://img.example/{id}.png")})
}

/// The fake orders of user `id` (extra fields that forkd drops).
fn orders_answer(id: i64) -> Value {
    json!([
        {"id": format!("ord-{id}-1"), "status": "shipped", "totalAmount": 12.5, "currency": "EUR", "lines": [{"sku": "a"}]},
        {"id": format!("ord-{id}-2"), "status": "pending", "totalAmount": 7.25, "createdAt": "2024-05-01T10:00:00Z"},
    ])
}

fn expected_orders(id: i64) -> Value {
    json!([
        {"id": format!("ord-{id}-1"), "status": "shipped", "total": 12.5},
        {"id": format!("ord-{id}-2"), "status": "pending", "total": 7.25},
    ])
}

/// Twelve recommendations for user `id` (forkd passes the first ten on unchanged).
fn recs_answer(id: i64) -> Value {
    Value::Array(
        (0..12)
            .map(|k| json!({"sku": format!("rec-{id}-{k}"), "title": format!("Item {k}"), "score": 0.5, "tags": ["x", k]}))
            .collect(),
    )
}

fn expected_recs(id: i64) -> Value {
    Value::Array(recs_answer(id).as_array().unwrap()[..10].to_vec())
}

/// A server with three per-user fake upstreams. `refused` names upstreams
/// (`"users"`, `"orders"`, `"recommendations"`) configured as a closed port instead.
struct Home {
    s: Server,
    users: PerUser,
    orders: PerUser,
    recs: PerUser,
}

impl Home {
    /// This server, spoken to over `p`.
    fn on(mut self, p: Proto) -> Home {
        self.s.set_proto(p);
        self
    }

    fn start(workers: usize, upstream_extra: &str, refused: &[&str]) -> Home {
        Home::start_with(workers, upstream_extra, refused, |b| b)
    }

    /// As [`Home::start`], with `tweak` applied to the server's builder.
    fn start_with(
        workers: usize,
        upstream_extra: &str,
        refused: &[&str],
        tweak: impl FnOnce(ServerBuilder) -> ServerBuilder,
    ) -> Home {
        let users = PerUser::start("", |id| Behaviour::json(200, &users_answer(id)));
        let orders = PerUser::start("/orders", |id| Behaviour::json(200, &orders_answer(id)));
        let recs = PerUser::start("/recommendations", |id| Behaviour::json(200, &recs_answer(id)));
        let url = |name: &str, up: &PerUser| if refused.contains(&name) { closed_url() } else { up.up.url() };
        let mut lines = format!(
            "users = \"{}\"\norders = \"{}\"\nrecommendations = \"{}\"",
            url("users", &users),
            url("orders", &orders),
            url("recommendations", &recs)
        );
        if !upstream_extra.is_empty() {
            lines.push('\n');
            lines.push_str(upstream_extra);
        }
        let mut b = Server::api_builder().workers(workers).set("upstreams", &lines);
        if workers > 1 {
            b = b.set("debug", "routes = true");
        }
        Home { s: tweak(b).start(), users, orders, recs }
    }

    /// A fresh user: (id, access token).
    fn user(&self, name: &str) -> (i64, String) {
        let (u, t) = self.s.user(name);
        (u["id"].as_i64().unwrap_or_else(|| panic!("no integer id in {u}")), t)
    }

    fn get(&self, token: &str) -> Response {
        self.s.api("GET", "/api/homepage", Some(token), None)
    }

    /// `GET /api/homepage` as `token`; asserts the 200 envelope; returns `data`.
    fn data(&self, token: &str, what: &str) -> Value {
        let r = self.get(token);
        self.s.expect_data(&r, 200, &format!("GET /api/homepage ({what})"))
    }

    /// All three fakes, for failure messages.
    fn describe(&self) -> String {
        format!(
            "users: {}orders: {}recommendations: {}",
            self.users.up.describe(),
            self.orders.up.describe(),
            self.recs.up.describe()
        )
    }

    /// Asserts `data` is the complete homepage of user `id`, nothing degraded.
    fn check_complete(&self, data: &Value, id: i64, what: &str) {
        let s = &self.s;
        ensure_eq!(
            s,
            data["user"],
            expected_user(id),
            "{what}: `user` is name and avatar of the users upstream, nothing more"
        );
        ensure_eq!(
            s,
            data["recentOrders"],
            expected_orders(id),
            "{what}: `recentOrders` as {{id, status, total = totalAmount}}"
        );
        ensure_eq!(s, data["recommendations"], expected_recs(id), "{what}: the first 10 recommendations, unchanged");
        ensure!(s, data.get("degraded").is_none(), "{what}: no `degraded` when nothing failed: {data}");
    }

    /// Asserts a 200 homepage of user `id` with exactly the lists in `failed` empty and
    /// named in `degraded`.
    fn check_degraded(&self, data: &Value, id: i64, failed: &[&str], what: &str) {
        let s = &self.s;
        ensure_eq!(s, data["user"], expected_user(id), "{what}: `user` still comes from the users upstream");
        for (field, good) in [("recentOrders", expected_orders(id)), ("recommendations", expected_recs(id))] {
            let want = if failed.contains(&field) { json!([]) } else { good };
            ensure_eq!(s, data[field], want, "{what}: `{field}`");
        }
        let got: Option<BTreeSet<&str>> =
            data["degraded"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect());
        let want: BTreeSet<&str> = failed.iter().copied().collect();
        ensure_eq!(
            s,
            got,
            Some(want),
            "{what}: `degraded` must be an array naming exactly the failed lists; data: {data}"
        );
        ensure_eq!(
            s,
            data["degraded"].as_array().map(Vec::len),
            Some(failed.len()),
            "{what}: `degraded` without duplicates: {data}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Authentication, mapping, parallelism
// ---------------------------------------------------------------------------------------

protocols!(homepage_requires_a_bearer_token);
fn homepage_requires_a_bearer_token(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let r = h.s.api("GET", "/api/homepage", None, None);
    let v = h.s.expect_err(&r, 401, "UNAUTHORIZED", "GET /api/homepage without a token");
    ensure_eq!(h.s, v["message"].as_str(), Some("token required"), "401 message without a credential");
    ensure!(
        h.s,
        r.header("www-authenticate").map(|v| v.starts_with("Bearer")).unwrap_or(false),
        "401 must carry WWW-Authenticate: Bearer: {r:?}"
    );
    let r = h.s.api("GET", "/api/homepage", Some("not.a.jwt"), None);
    h.s.expect_err(&r, 401, "UNAUTHORIZED", "GET /api/homepage with an invalid token");
    ensure_eq!(
        h.s,
        h.users.up.total() + h.orders.up.total() + h.recs.up.total(),
        0,
        "no upstream may be called without a valid token:\n{}",
        h.describe()
    );
}

protocols!(homepage_combines_the_three_upstream_answers);
fn homepage_combines_the_three_upstream_answers(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let (id, token) = h.user("Home Owner");
    let r = h.get(&token);
    let data = h.s.expect_data(&r, 200, "GET /api/homepage");
    h.check_complete(&data, id, "GET /api/homepage");
    ensure!(
        h.s,
        data["recentOrders"].as_array().unwrap().iter().all(|o| o.as_object().map(|m| m.len()) == Some(3)),
        "each order is exactly {{id, status, total}}: {data}"
    );
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        let reqs = up.up.requests();
        ensure_eq!(
            h.s,
            reqs.iter().map(|r| (r.method.as_str(), r.path.as_str())).collect::<Vec<_>>(),
            vec![("GET", up.path(id).as_str())],
            "the {name} upstream must see exactly one GET {} (the bearer's user id {id}):\n{}",
            up.path(id),
            h.describe()
        );
    }
}

protocols!(homepage_accepts_items_objects_and_a_missing_user_field);
fn homepage_accepts_items_objects_and_a_missing_user_field(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let (id, token) = h.user("Items User");
    h.users.script(id, Behaviour::json(200, &json!({"id": id, "name": "No Avatar"})));
    h.orders.script(id, Behaviour::json(200, &json!({"items": orders_answer(id), "total": 2})));
    h.recs.script(id, Behaviour::json(200, &json!({"items": recs_answer(id), "page": 1})));
    let data = h.data(&token, "orders and recommendations as {items}, user without avatar");
    ensure_eq!(h.s, data["user"], json!({"name": "No Avatar", "avatar": null}), "a missing avatar is null: {data}");
    ensure_eq!(h.s, data["recentOrders"], expected_orders(id), "orders from {{\"items\": [...]}}");
    ensure_eq!(h.s, data["recommendations"], expected_recs(id), "recommendations from {{\"items\": [...]}}, cut to 10");
    ensure!(h.s, data.get("degraded").is_none(), "nothing failed, so no `degraded`: {data}");

    // Fewer than 10 recommendations pass through as they are; an empty order list is fine.
    let (id2, token2) = h.user("Few Recs");
    h.orders.script(id2, Behaviour::json(200, &json!([])));
    h.recs.script(id2, Behaviour::json(200, &json!([{"sku": "only"}, {"sku": "two", "n": [1, 2]}])));
    let data = h.data(&token2, "3 recommendations, no orders");
    ensure_eq!(h.s, data["recentOrders"], json!([]), "an empty order list");
    ensure_eq!(
        h.s,
        data["recommendations"],
        json!([{"sku": "only"}, {"sku": "two", "n": [1, 2]}]),
        "two recommendations"
    );
    ensure!(h.s, data.get("degraded").is_none(), "empty lists from the upstream are not failures: {data}");
}

protocols!(homepage_calls_the_three_upstreams_in_parallel);
fn homepage_calls_the_three_upstreams_in_parallel(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let (id, token) = h.user("Parallel User");
    let d = Duration::from_millis(300);
    h.users.script(id, Behaviour::json(200, &users_answer(id)).after(d));
    h.orders.script(id, Behaviour::json(200, &orders_answer(id)).after(d));
    h.recs.script(id, Behaviour::json(200, &recs_answer(id)).after(d));
    let t = Instant::now();
    let r = h.get(&token);
    let took = t.elapsed();
    let data = h.s.expect_data(&r, 200, "GET /api/homepage with three 300 ms upstreams");
    h.check_complete(&data, id, "three 300 ms upstreams");
    ensure!(
        h.s,
        took >= Duration::from_millis(290) && took < Duration::from_millis(800),
        "three upstreams of 300 ms each, called in parallel, must answer in 300..800 ms; took {took:?}\n{}",
        h.describe()
    );
    let arrivals: Vec<Instant> =
        [&h.users, &h.orders, &h.recs].iter().filter_map(|u| u.up.requests().first().map(|r| r.at)).collect();
    ensure_eq!(h.s, arrivals.len(), 3, "each upstream is called once:\n{}", h.describe());
    let spread = *arrivals.iter().max().unwrap() - *arrivals.iter().min().unwrap();
    ensure!(
        h.s,
        spread < Duration::from_millis(200),
        "the three requests must be sent together, not one after another's answer; they arrived {spread:?} apart"
    );
}

// ---------------------------------------------------------------------------------------
// The users upstream failing: 502 / 504
// ---------------------------------------------------------------------------------------

protocols!(homepage_users_upstream_refused_gives_502);
fn homepage_users_upstream_refused_gives_502(p: Proto) {
    let h = Home::start(1, "", &["users"]).on(p);
    let (_, token) = h.user("Refused User");
    let r = h.get(&token);
    h.s.expect_err(&r, 502, "UPSTREAM_UNAVAILABLE", "GET /api/homepage with the users upstream refusing connections");
    h.s.assert_healthy();
}

protocols!(homepage_users_upstream_bad_answers_give_502);
fn homepage_users_upstream_bad_answers_give_502(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let cases: Vec<(&str, Behaviour)> = vec![
        ("status 500", Behaviour::json(500, &json!({"error": "boom"}))),
        ("status 404", Behaviour::json(404, &json!({"error": "no such user"}))),
        ("invalid JSON", Behaviour::text(200, "application/json", r#"{"name": "Half"#)),
        ("a JSON array instead of an object", Behaviour::json(200, &json!([{"name": "A"}]))),
        ("a JSON string instead of an object", Behaviour::json(200, &json!("User"))),
        ("a body over 1 MiB", Behaviour::padded_json_object(OVERSIZED)),
    ];
    for (what, b) in cases {
        let (id, token) = h.user("Bad Users Answer");
        h.users.script(id, b);
        let r = h.get(&token);
        h.s.expect_err(&r, 502, "UPSTREAM_UNAVAILABLE", &format!("users upstream answers {what}"));
        ensure_eq!(h.s, h.users.count(id), 1, "users upstream, {what}: one request for user {id}:\n{}", h.describe());
    }
    h.s.assert_healthy();
}

protocols!(homepage_users_upstream_timeout_gives_504);
fn homepage_users_upstream_timeout_gives_504(p: Proto) {
    let h = Home::start(1, "timeout_ms = 400", &[]).on(p);
    let (id, token) = h.user("Slow Users");
    h.users.script(id, Behaviour::Hang);
    let t = Instant::now();
    let r = h.get(&token);
    let took = t.elapsed();
    h.s.expect_err(&r, 504, "UPSTREAM_TIMEOUT", "users upstream never answers (timeout_ms = 400)");
    ensure!(
        h.s,
        took >= Duration::from_millis(350) && took < Duration::from_millis(2500),
        "the 504 must come after about timeout_ms = 400 ms; it came after {took:?}"
    );
    // A user answered in time just after works.
    let (id2, token2) = h.user("Fast Users");
    let data = h.data(&token2, "after a timed-out request");
    h.check_complete(&data, id2, "after a timed-out request");
}

// ---------------------------------------------------------------------------------------
// Orders / recommendations failing: 200, `[]`, `degraded`
// ---------------------------------------------------------------------------------------

/// The failures a list upstream can have (on a server with `timeout_ms = 400`).
fn list_failures() -> Vec<(&'static str, Behaviour)> {
    vec![
        ("status 500", Behaviour::json(500, &json!({"error": "boom"}))),
        ("invalid JSON", Behaviour::text(200, "application/json", "[{\"id\": ")),
        ("a JSON string instead of a list", Behaviour::json(200, &json!("nope"))),
        ("a body over 1 MiB", Behaviour::padded_json_array(OVERSIZED)),
        ("no answer within timeout_ms", Behaviour::Hang),
    ]
}

protocols!(homepage_orders_failures_degrade_to_an_empty_list);
fn homepage_orders_failures_degrade_to_an_empty_list(p: Proto) {
    let h = Home::start(1, "timeout_ms = 400", &[]).on(p);
    for (what, b) in list_failures() {
        let (id, token) = h.user("Orders Fail");
        h.orders.script(id, b);
        let t = Instant::now();
        let data = h.data(&token, &format!("orders upstream: {what}"));
        h.check_degraded(&data, id, &["recentOrders"], &format!("orders upstream: {what}"));
        ensure!(
            h.s,
            t.elapsed() < Duration::from_millis(2500),
            "orders upstream, {what}: answered after {:?}",
            t.elapsed()
        );
    }
    h.s.assert_healthy();
}

protocols!(homepage_recommendations_failures_degrade_to_an_empty_list);
fn homepage_recommendations_failures_degrade_to_an_empty_list(p: Proto) {
    let h = Home::start(1, "timeout_ms = 400", &[]).on(p);
    for (what, b) in list_failures() {
        let (id, token) = h.user("Recs Fail");
        h.recs.script(id, b);
        let data = h.data(&token, &format!("recommendations upstream: {what}"));
        h.check_degraded(&data, id, &["recommendations"], &format!("recommendations upstream: {what}"));
    }
    // Both failing at once.
    let (id, token) = h.user("Both Fail");
    h.orders.script(id, Behaviour::json(503, &json!({"error": "down"})));
    h.recs.script(id, Behaviour::Hang);
    let data = h.data(&token, "orders 503 and recommendations silent");
    h.check_degraded(&data, id, &["recentOrders", "recommendations"], "orders 503 and recommendations silent");
    h.s.assert_healthy();
}

protocols!(homepage_refused_lists_degrade_both);
fn homepage_refused_lists_degrade_both(p: Proto) {
    let h = Home::start(1, "", &["orders", "recommendations"]).on(p);
    let (id, token) = h.user("Refused Lists");
    let data = h.data(&token, "orders and recommendations upstreams refuse connections");
    h.check_degraded(&data, id, &["recentOrders", "recommendations"], "both list upstreams refused");
    h.s.assert_healthy();
}

// ---------------------------------------------------------------------------------------
// Caching
// ---------------------------------------------------------------------------------------

protocols!(homepage_caches_upstream_answers_per_user);
fn homepage_caches_upstream_answers_per_user(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let (a, ta) = h.user("Cached A");
    let (b, tb) = h.user("Cached B");
    for i in 0..5 {
        let data = h.data(&ta, &format!("user A, request {i}"));
        h.check_complete(&data, a, &format!("user A, request {i}"));
    }
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure_eq!(
            h.s,
            up.count(a),
            1,
            "5 homepages of one user within the TTL: one {name} request:\n{}",
            h.describe()
        );
    }
    let data = h.data(&tb, "user B");
    h.check_complete(&data, b, "user B (not user A's cached answers)");
    let data = h.data(&tb, "user B again");
    h.check_complete(&data, b, "user B again");
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure_eq!(h.s, up.count(b), 1, "the cache is per user: one {name} request for user B:\n{}", h.describe());
        ensure_eq!(h.s, up.up.total(), 2, "{name}: one request per user in all:\n{}", h.describe());
    }
}

protocols!(homepage_assembled_from_upstreams_is_compressed_like_a_cached_one);
/// The answer assembled from the upstreams' results (on the loop) is compressed on the pool,
/// as the cached answer that follows it is: the first `/api/homepage` is not sent as it is.
fn homepage_assembled_from_upstreams_is_compressed_like_a_cached_one(p: Proto) {
    let h = Home::start_with(1, "", &[], |b| b.set("compression", "min_bytes = 0")).on(p);
    let (id, token) = h.user("Compressed Home");
    let zstd = [("Accept-Encoding", "zstd")];
    let mut bodies = Vec::new();
    for round in ["from the upstreams", "from the cache"] {
        let r = h.s.api_h("GET", "/api/homepage", Some(&token), None, &zstd);
        ensure!(h.s, r.status == 200, "{round}: {r:?}");
        ensure_eq!(h.s, r.header("content-encoding"), Some("zstd"), "{round}: Content-Encoding");
        let vary = r.header_all("vary").join(",").to_ascii_lowercase();
        ensure!(h.s, vary.contains("accept-encoding"), "{round}: Vary in {:?}", r.headers);
        let body = zstd::stream::decode_all(&r.body[..]);
        ensure!(h.s, body.is_ok(), "{round}: the body is not zstd: {body:?}");
        let body = body.unwrap_or_default();
        let v: Value = serde_json::from_slice(&body).unwrap_or_default();
        h.check_complete(&v["data"], id, round);
        bodies.push(body);
        ensure_eq!(h.s, h.users.count(id), 1, "{round}: one users request in all:\n{}", h.describe());
    }
    ensure!(h.s, bodies[0] == bodies[1], "both decode to the same body");
    let plain = h.get(&token);
    ensure_eq!(h.s, plain.header("content-encoding"), None, "no Accept-Encoding: identity");
    ensure!(h.s, plain.body == bodies[0], "the identity body is what both decode to");
}

protocols!(homepage_cache_expires_after_the_ttl);
fn homepage_cache_expires_after_the_ttl(p: Proto) {
    let h = Home::start(1, "cache_ttl_secs = 1", &[]).on(p);
    let (id, token) = h.user("Short TTL");
    h.data(&token, "first request");
    ensure_eq!(h.s, h.users.count(id), 1, "first request: one users request");
    let refetched = eventually(Duration::from_millis(3500), || {
        h.data(&token, "polling until the 1 s TTL ends");
        h.users.count(id) >= 2
    });
    ensure!(
        h.s,
        refetched,
        "with cache_ttl_secs = 1 the users upstream must be asked again within 3.5 s:\n{}",
        h.describe()
    );
    for (name, up) in [("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure!(h.s, up.count(id) >= 2, "{name} answers expire too:\n{}", h.describe());
    }
}

protocols!(homepage_failed_upstream_answers_are_not_cached);
fn homepage_failed_upstream_answers_are_not_cached(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    // Users upstream failing, then well: the second homepage asks again.
    let (a, ta) = h.user("Fails Then Works");
    h.users.script(a, Behaviour::json(500, &json!({"error": "boom"})));
    let r = h.get(&ta);
    h.s.expect_err(&r, 502, "UPSTREAM_UNAVAILABLE", "users upstream 500");
    h.users.unscript(a);
    let data = h.data(&ta, "users upstream well again");
    h.check_complete(&data, a, "users upstream well again");
    ensure_eq!(h.s, h.users.count(a), 2, "a failed users answer is not cached: asked again:\n{}", h.describe());

    // Orders failing, then well: asked again, while the users answer stays cached.
    let (b, tb) = h.user("Orders Fail Then Work");
    h.orders.script(b, Behaviour::json(500, &json!({"error": "boom"})));
    let data = h.data(&tb, "orders upstream 500");
    h.check_degraded(&data, b, &["recentOrders"], "orders upstream 500");
    h.orders.unscript(b);
    let data = h.data(&tb, "orders upstream well again");
    h.check_complete(&data, b, "orders upstream well again");
    ensure_eq!(h.s, h.orders.count(b), 2, "a failed orders answer is not cached:\n{}", h.describe());
    ensure_eq!(h.s, h.users.count(b), 1, "the successful users answer is cached:\n{}", h.describe());
    ensure_eq!(h.s, h.recs.count(b), 1, "the successful recommendations answer is cached:\n{}", h.describe());
    let data = h.data(&tb, "third request");
    h.check_complete(&data, b, "third request");
    ensure_eq!(h.s, h.orders.count(b), 2, "once it succeeded, the orders answer is cached:\n{}", h.describe());
}

#[test]
fn homepage_cache_is_shared_by_all_workers() {
    let h = Home::start(2, "", &[]);
    h.s.wait_workers(2, Duration::from_secs(10));
    let (id, token) = h.user("Shared Cache");
    let auth = format!("Bearer {token}");
    let mut served_by = BTreeSet::new();
    let mut tries = 0;
    while served_by.len() < 2 && tries < 200 {
        tries += 1;
        let mut c = h.s.conn();
        let r = c.get("/_debug/pid");
        ensure_eq!(h.s, r.status, 200, "GET /_debug/pid: {r:?}");
        let pid = r.json()["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {r:?}"));
        c.send(&request("GET", "/api/homepage", &[("Authorization", &auth)], b""));
        let r = c.read_response();
        let data = h.s.expect_data(&r, 200, &format!("GET /api/homepage on worker {pid} (connection {tries})"));
        h.check_complete(&data, id, &format!("homepage served by worker {pid}"));
        served_by.insert(pid);
    }
    ensure_eq!(
        h.s,
        served_by.len(),
        2,
        "setup: both workers must serve a homepage within 200 connections; served by {served_by:?}"
    );
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure_eq!(
            h.s,
            up.count(id),
            1,
            "{tries} homepages served by both workers {served_by:?} within the TTL: the {name} upstream must be asked once (shared cache):\n{}",
            h.describe()
        );
    }
}

// ---------------------------------------------------------------------------------------
// Connections towards the upstreams
// ---------------------------------------------------------------------------------------

protocols!(homepage_reuses_keep_alive_connections_to_the_upstreams);
fn homepage_reuses_keep_alive_connections_to_the_upstreams(p: Proto) {
    let h = Home::start(1, "", &[]).on(p);
    let users: Vec<(i64, String)> = (0..3).map(|_| h.user("Keep Alive")).collect();
    for (id, token) in &users {
        let data = h.data(token, &format!("user {id}"));
        h.check_complete(&data, *id, &format!("user {id}"));
    }
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure_eq!(h.s, up.up.total(), 3, "{name}: three requests (three users, cache misses):\n{}", h.describe());
        ensure_eq!(
            h.s,
            up.up.connections(),
            1,
            "{name}: sequential homepages on one worker must reuse one keep-alive upstream connection:\n{}",
            h.describe()
        );
    }
}

#[test]
fn homepage_client_disconnect_cancels_the_upstream_requests() {
    let h = Home::start(1, "timeout_ms = 10000", &[]);
    let (id, token) = h.user("Goes Away");
    for up in [&h.users, &h.orders, &h.recs] {
        up.script(id, Behaviour::Hang);
    }
    let auth = format!("Bearer {token}");
    let mut c = h.s.conn();
    c.send(&request("GET", "/api/homepage", &[("Authorization", &auth)], b""));
    let all_asked =
        eventually(Duration::from_secs(3), || [&h.users, &h.orders, &h.recs].iter().all(|u| u.count(id) == 1));
    ensure!(h.s, all_asked, "setup: the three upstreams must be asked within 3 s:\n{}", h.describe());
    let _ = c.stream.shutdown(std::net::Shutdown::Both);
    drop(c);
    let t = Instant::now();
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        let conn_id = up.up.requests_to(&up.path(id))[0].conn_id;
        let closed = up.up.wait_peer_closed(conn_id, Duration::from_millis(2500).saturating_sub(t.elapsed()));
        ensure!(
            h.s,
            closed.is_some(),
            "the client went away: forkd must cancel the {name} request (close its connection) within ~2 s:\n{}",
            h.describe()
        );
    }
    // The worker is fine and serves the next user.
    h.s.assert_healthy();
    let (id2, token2) = h.user("Comes After");
    let data = h.data(&token2, "after a cancelled homepage");
    h.check_complete(&data, id2, "after a cancelled homepage");
}

// ---------------------------------------------------------------------------------------
// Built-in demo upstreams
// ---------------------------------------------------------------------------------------

protocols!(homepage_without_configured_upstreams_uses_the_builtin_demo);
fn homepage_without_configured_upstreams_uses_the_builtin_demo(p: Proto) {
    let s = Server::api_builder().start().on(p);
    let (_, token) = s.user("Demo User");
    let r = s.api("GET", "/api/homepage", Some(&token), None);
    let data = s.expect_data(&r, 200, "GET /api/homepage with the built-in demo upstreams");
    ensure!(s, data["user"]["name"].is_string(), "demo: `user.name` must be a string: {data}");
    ensure!(
        s,
        data["user"].as_object().map(|o| o.contains_key("avatar")).unwrap_or(false),
        "demo: `user.avatar` present: {data}"
    );
    let orders = data["recentOrders"].as_array();
    ensure!(s, orders.is_some(), "demo: `recentOrders` must be an array: {data}");
    for o in orders.unwrap() {
        ensure!(
            s,
            ["id", "status", "total"].iter().all(|k| o.get(*k).is_some()),
            "demo: every order has id, status and total: {o}"
        );
    }
    let recs = data["recommendations"].as_array();
    ensure!(s, recs.map(|r| r.len() <= 10).unwrap_or(false), "demo: `recommendations` an array of at most 10: {data}");
    ensure!(s, data.get("degraded").is_none(), "demo: nothing degraded: {data}");
    s.assert_healthy();
}

/// A chunked answer of `total` bytes: a JSON array of one order padded to size, sent in
/// pieces of 100 KiB.
fn chunked_padded_orders(total: usize) -> Behaviour {
    let Behaviour::Respond { body, .. } = Behaviour::padded_json_array(total) else { unreachable!() };
    let pieces = body.chunks(100 * 1024).map(|p| (Duration::ZERO, p.to_vec())).collect();
    Behaviour::Chunked {
        status: 200,
        headers: vec![("Content-Type".into(), "application/json".into())],
        pieces,
        then: After::Finish,
    }
}

protocols!(homepage_reads_large_upstream_answers_to_the_end);
fn homepage_reads_large_upstream_answers_to_the_end(p: Proto) {
    // Answers under the 1 MiB cap but far over one socket read: read to the end, on time.
    let h = Home::start(1, "timeout_ms = 2000", &[]).on(p);
    let big_order = json!([{"id": "big", "status": "x", "total": 1.5}]);
    for (what, b) in [
        ("900 KB with Content-Length", Behaviour::padded_json_array(900 * 1024)),
        ("900 KB chunked", chunked_padded_orders(900 * 1024)),
    ] {
        let (id, token) = h.user("Big Orders");
        h.orders.script(id, b);
        let t = Instant::now();
        let data = h.data(&token, what);
        ensure_eq!(
            h.s,
            data["recentOrders"],
            big_order,
            "orders upstream {what}: the whole answer is read\n{}",
            h.describe()
        );
        ensure!(h.s, data.get("degraded").is_none(), "orders upstream {what}: nothing degraded: {data}");
        ensure!(h.s, t.elapsed() < Duration::from_millis(1500), "orders upstream {what}: took {:?}", t.elapsed());
    }
    // Chunked and over the cap: refused while it arrives, not after the timeout.
    let (id, token) = h.user("Huge Orders");
    h.orders.script(id, chunked_padded_orders(OVERSIZED));
    let t = Instant::now();
    let data = h.data(&token, "orders upstream: chunked body over 1 MiB");
    h.check_degraded(&data, id, &["recentOrders"], "orders upstream: chunked body over 1 MiB");
    ensure!(h.s, t.elapsed() < Duration::from_millis(1500), "oversized chunked answer: took {:?}", t.elapsed());
    h.s.assert_healthy();
}

// ---------------------------------------------------------------------------------------
// HTTPS upstreams (the fakes behind TLS fronts)
// ---------------------------------------------------------------------------------------

/// What the TLS front of one upstream presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cert {
    /// A certificate for `localhost` from the CA forkd is given (`SSL_CERT_FILE`).
    Trusted,
    /// A certificate for `localhost` from a CA forkd does not know.
    Untrusted,
    /// A certificate from the known CA, but for `other.example` only.
    OtherName,
}

/// A [`Home`] whose three upstreams are `https://localhost:PORT`: each per-user fake sits
/// behind a [`TlsFront`]; forkd trusts the test CA through `SSL_CERT_FILE`.
struct HttpsHome {
    h: Home,
    users_tls: TlsFront,
    orders_tls: TlsFront,
    recs_tls: TlsFront,
    _ca: TestCa,
}

impl HttpsHome {
    /// `certs`: the users, orders and recommendations fronts, in that order.
    fn start(workers: usize, upstream_extra: &str, certs: [Cert; 3]) -> HttpsHome {
        let users = PerUser::start("", |id| Behaviour::json(200, &users_answer(id)));
        let orders = PerUser::start("/orders", |id| Behaviour::json(200, &orders_answer(id)));
        let recs = PerUser::start("/recommendations", |id| Behaviour::json(200, &recs_answer(id)));
        let ca = TestCa::new("forkd-it homepage CA");
        let front = |up: &PerUser, c: Cert| match c {
            Cert::Trusted => TlsFront::start_with_ca(&up.up.url(), &["localhost"], &ca),
            Cert::Untrusted => TlsFront::start_untrusted(&up.up.url(), &["localhost"]),
            Cert::OtherName => TlsFront::start_with_ca(&up.up.url(), &["other.example"], &ca),
        };
        let (users_tls, orders_tls, recs_tls) =
            (front(&users, certs[0]), front(&orders, certs[1]), front(&recs, certs[2]));
        let mut lines = format!(
            "users = \"{}\"\norders = \"{}\"\nrecommendations = \"{}\"",
            users_tls.url("localhost"),
            orders_tls.url("localhost"),
            recs_tls.url("localhost")
        );
        if !upstream_extra.is_empty() {
            lines.push('\n');
            lines.push_str(upstream_extra);
        }
        let ca_file = ca.pem_path().display().to_string();
        let s = Server::api_builder().workers(workers).set("upstreams", &lines).env("SSL_CERT_FILE", &ca_file).start();
        HttpsHome { h: Home { s, users, orders, recs }, users_tls, orders_tls, recs_tls, _ca: ca }
    }

    /// (name, backend fake, TLS front) of the three upstreams.
    fn each(&self) -> [(&'static str, &PerUser, &TlsFront); 3] {
        [
            ("users", &self.h.users, &self.users_tls),
            ("orders", &self.h.orders, &self.orders_tls),
            ("recommendations", &self.h.recs, &self.recs_tls),
        ]
    }

    /// The fronts' counters and the fakes' logs, for failure messages.
    fn describe(&self) -> String {
        let mut s = String::new();
        for (name, up, tls) in self.each() {
            s.push_str(&format!("{name}:\n  {}  {}", tls.describe(), up.up.describe()));
        }
        s
    }

    /// `GET /api/homepage` as `token`: asserts a 200 (failure message with the fronts'
    /// counters) and the envelope; returns `data`.
    fn data(&self, token: &str, what: &str) -> Value {
        let r = self.h.get(token);
        ensure!(
            self.h.s,
            r.status == 200,
            "GET /api/homepage ({what}): expected 200 through the TLS fronts, got {r:?}\n{}",
            self.describe()
        );
        self.h.s.expect_data(&r, 200, &format!("GET /api/homepage ({what})"))
    }
}

#[test]
fn homepage_over_https_upstreams() {
    let hh = HttpsHome::start(1, "timeout_ms = 5000", [Cert::Trusted; 3]);
    let (id, token) = hh.h.user("Https User");
    let data = hh.data(&token, "three https upstreams");
    hh.h.check_complete(&data, id, "three https upstreams");
    for (name, up, tls) in hh.each() {
        let reqs = up.up.requests();
        ensure_eq!(
            hh.h.s,
            reqs.iter().map(|r| (r.method.as_str(), r.path.as_str())).collect::<Vec<_>>(),
            vec![("GET", up.path(id).as_str())],
            "the {name} backend (behind its TLS front) must see exactly one GET {}:\n{}",
            up.path(id),
            hh.describe()
        );
        ensure!(
            hh.h.s,
            tls.handshakes() >= 1 && tls.failed_handshakes() == 0,
            "the {name} TLS front: at least one completed handshake and none failed:\n{}",
            hh.describe()
        );
    }
    hh.h.s.assert_healthy();
}

#[test]
fn homepage_https_keeps_upstream_connections_alive() {
    let hh = HttpsHome::start(1, "timeout_ms = 5000", [Cert::Trusted; 3]);
    let users: Vec<(i64, String)> = (0..3).map(|_| hh.h.user("Https Keep Alive")).collect();
    for (id, token) in &users {
        let data = hh.data(token, &format!("user {id}"));
        hh.h.check_complete(&data, *id, &format!("user {id} over https"));
    }
    for (name, up, tls) in hh.each() {
        ensure_eq!(hh.h.s, up.up.total(), 3, "{name}: three requests (three users, cache misses):\n{}", hh.describe());
        ensure_eq!(
            hh.h.s,
            (tls.accepted(), tls.handshakes(), tls.failed_handshakes()),
            (1, 1, 0),
            "{name}: sequential homepages on one worker must reuse one TLS connection \
             (expected (accepted, handshakes, failed) = (1, 1, 0)):\n{}",
            hh.describe()
        );
        ensure_eq!(hh.h.s, up.up.connections(), 1, "{name}: one backend connection:\n{}", hh.describe());
    }
}

/// The users upstream's certificate does not verify (`cert`): 502 at once, the backend is
/// never asked, the front counts a failed handshake.
fn https_users_upstream_refused(cert: Cert, what: &str) {
    let hh = HttpsHome::start(1, "timeout_ms = 5000", [cert, Cert::Trusted, Cert::Trusted]);
    let (_, token) = hh.h.user("Bad Cert Users");
    let t = Instant::now();
    let r = hh.h.get(&token);
    let took = t.elapsed();
    ensure!(
        hh.h.s,
        r.status == 502,
        "{what}: the users upstream's certificate does not verify: expected 502 UPSTREAM_UNAVAILABLE, got {r:?}\n{}",
        hh.describe()
    );
    hh.h.s.expect_err(&r, 502, "UPSTREAM_UNAVAILABLE", what);
    ensure!(
        hh.h.s,
        took < Duration::from_millis(2500),
        "{what}: refused like a closed port, not after timeout_ms = 5000; took {took:?}\n{}",
        hh.describe()
    );
    ensure!(
        hh.h.s,
        hh.users_tls.wait_failed_handshakes(1, Duration::from_secs(2)) && hh.users_tls.handshakes() == 0,
        "{what}: forkd must abort the handshake (the front counts a failed one, none completed):\n{}",
        hh.describe()
    );
    ensure_eq!(hh.h.s, hh.h.users.up.total(), 0, "{what}: nothing may reach the users backend:\n{}", hh.describe());
    hh.h.s.assert_healthy();
}

#[test]
fn homepage_https_with_an_untrusted_certificate_fails_like_a_refused_upstream() {
    https_users_upstream_refused(Cert::Untrusted, "users upstream with a certificate from an unknown CA");

    // The orders upstream untrusted: 200 with `recentOrders` degraded.
    let hh = HttpsHome::start(1, "timeout_ms = 5000", [Cert::Trusted, Cert::Untrusted, Cert::Trusted]);
    let (id, token) = hh.h.user("Untrusted Orders");
    let t = Instant::now();
    let data = hh.data(&token, "orders upstream with a certificate from an unknown CA");
    let took = t.elapsed();
    hh.h.check_degraded(&data, id, &["recentOrders"], "orders upstream with an untrusted certificate");
    ensure!(
        hh.h.s,
        took < Duration::from_millis(2500),
        "an untrusted orders upstream degrades at once, not after timeout_ms = 5000; took {took:?}\n{}",
        hh.describe()
    );
    ensure!(
        hh.h.s,
        hh.orders_tls.wait_failed_handshakes(1, Duration::from_secs(2)) && hh.orders_tls.handshakes() == 0,
        "the untrusted orders front: a failed handshake, none completed:\n{}",
        hh.describe()
    );
    ensure_eq!(hh.h.s, hh.h.orders.up.total(), 0, "nothing may reach the orders backend:\n{}", hh.describe());
    ensure_eq!(
        hh.h.s,
        (hh.h.users.count(id), hh.h.recs.count(id)),
        (1, 1),
        "the trusted users and recommendations upstreams are asked once each:\n{}",
        hh.describe()
    );
    hh.h.s.assert_healthy();
    // The worker still serves a complete homepage afterwards (the good fronts still work).
    let (id2, token2) = hh.h.user("After Untrusted");
    let data = hh.data(&token2, "after an untrusted upstream");
    hh.h.check_degraded(&data, id2, &["recentOrders"], "the orders upstream is still untrusted");
}

#[test]
fn homepage_https_name_mismatch_is_refused() {
    https_users_upstream_refused(
        Cert::OtherName,
        "users upstream https://localhost:PORT whose certificate (known CA) is for other.example only",
    );
}

#[test]
fn homepage_concurrent_cold_requests_share_one_upstream_call_per_path() {
    // One worker, a cold cache, slow upstreams and eight clients at once: the worker sends
    // each upstream request once and every client gets the full page.
    let h = Home::start(1, "", &[]);
    let (id, token) = h.user("Herd");
    let slow = Duration::from_millis(300);
    h.users.script(id, Behaviour::json(200, &users_answer(id)).after(slow));
    h.orders.script(id, Behaviour::json(200, &orders_answer(id)).after(slow));
    h.recs.script(id, Behaviour::json(200, &recs_answer(id)).after(slow));
    let auth = format!("Bearer {token}");
    let mut conns: Vec<Conn> = (0..8).map(|_| h.s.conn()).collect();
    for c in &mut conns {
        c.send(&request("GET", "/api/homepage", &[("Authorization", &auth)], b""));
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let r = c.read_response();
        let data = h.s.expect_data(&r, 200, &format!("concurrent homepage #{i}"));
        h.check_complete(&data, id, &format!("concurrent homepage #{i}"));
    }
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure_eq!(h.s, up.count(id), 1, "eight concurrent cold requests: one {name} request\n{}", h.describe());
    }
}

#[test]
fn homepage_a_joined_request_survives_the_first_client_leaving() {
    // B joins A's upstream calls; A goes away before they answer: the calls go on for B.
    let h = Home::start(1, "", &[]);
    let (id, token) = h.user("Joined");
    let slow = Duration::from_millis(600);
    h.users.script(id, Behaviour::json(200, &users_answer(id)).after(slow));
    h.orders.script(id, Behaviour::json(200, &orders_answer(id)).after(slow));
    h.recs.script(id, Behaviour::json(200, &recs_answer(id)).after(slow));
    let auth = format!("Bearer {token}");
    let mut a = h.s.conn();
    a.send(&request("GET", "/api/homepage", &[("Authorization", &auth)], b""));
    let asked = eventually(Duration::from_secs(3), || [&h.users, &h.orders, &h.recs].iter().all(|u| u.count(id) == 1));
    ensure!(h.s, asked, "setup: the three upstreams must be asked:\n{}", h.describe());
    let mut b = h.s.conn();
    b.send(&request("GET", "/api/homepage", &[("Authorization", &auth)], b""));
    // B is parsed and joined before A leaves: a request on a third connection proves the
    // worker's loop went past B's bytes (connections are served in turn).
    h.s.assert_healthy();
    let _ = a.stream.shutdown(std::net::Shutdown::Both);
    drop(a);
    let r = b.read_response();
    let data = h.s.expect_data(&r, 200, "the joined request after the first client left");
    h.check_complete(&data, id, "the joined request after the first client left");
    for (name, up) in [("users", &h.users), ("orders", &h.orders), ("recommendations", &h.recs)] {
        ensure_eq!(h.s, up.count(id), 1, "{name}: still one request\n{}", h.describe());
    }
}
