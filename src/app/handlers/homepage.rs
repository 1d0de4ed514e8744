//! `GET /api/homepage` (CONTRACT §6): one response built from three upstream
//! answers fetched in parallel on the worker's loop.
//!
//! Each part (user, orders, recommendations) is looked up in the worker's
//! LRU, then in the cache shared by all workers; what is still missing is
//! asked of its upstream (or of the built-in demo when none is configured).
//! Answers are normalised once, when they arrive (`user` → `{name, avatar}`,
//! orders → `[{id, status, total}]`, recommendations → at most 10), and
//! cached in that form, so a hit only concatenates three JSON fragments.
//! Failures: the user part decides the status (502, or 504 on a timeout);
//! the others degrade to `[]` and are listed in `data.degraded`.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::{json, Value};

use crate::app::cache::Lru;
use crate::app::router::Router;
use crate::app::{session, App, Assembled, Call, Ctx, Fetched, Handler, Reply, Services};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::{Body, Response};
use crate::upstream::wire::{ClientError, Endpoint, Outbound};

/// Largest upstream answer accepted.
pub const MAX_ANSWER: u64 = 1 << 20;
/// Recommendations kept.
const MAX_RECOMMENDATIONS: usize = 10;

/// Register the route.
pub fn routes(r: &mut Router<Handler>) {
    r.add(Method::Get, "/api/homepage", homepage).add(Method::Get, "/api/v1/homepage", homepage);
}

/// One of the three upstream parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    User,
    Orders,
    Recommendations,
}

const PARTS: [Part; 3] = [Part::User, Part::Orders, Part::Recommendations];

impl Part {
    /// Field name in the response (and in `degraded`).
    fn field(self) -> &'static str {
        match self {
            Part::User => "user",
            Part::Orders => "recentOrders",
            Part::Recommendations => "recommendations",
        }
    }

    /// Upstream path for `uid`.
    fn path(self, uid: i64) -> String {
        match self {
            Part::User => format!("/users/{uid}"),
            Part::Orders => format!("/users/{uid}/orders"),
            Part::Recommendations => format!("/users/{uid}/recommendations"),
        }
    }

    fn cache_key(self, uid: i64) -> String {
        format!("{}:{uid}", self.field())
    }
}

/// The worker's first-level cache, shared by the handler and its continuations.
pub type Shared = Rc<RefCell<Lru>>;

fn homepage(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let uid = caller.user_id;
    let svc = app.svc;
    let now = crate::sys::monotonic_ms();
    // The whole response body, cached until its first part expires: a hit is one lookup.
    let whole = format!("homepage:{uid}");
    if let Some((body, _)) = app.homepage_cache.borrow_mut().get(&whole, now) {
        let mut r = Response::new(200);
        r.body = Body::Bytes(body.to_vec());
        return Ok(Reply::full(r));
    }
    let mut parts: [Option<Rc<[u8]>>; 3] = [None, None, None];
    // The earliest expiry among the parts: how long the assembled body may be reused.
    let mut fresh_until = u64::MAX;
    let mut requests = Vec::new();
    let mut slots = Vec::new();
    let mut scratch = Vec::new();
    for (i, part) in PARTS.into_iter().enumerate() {
        let key = part.cache_key(uid);
        if let Some((v, expires)) = app.homepage_cache.borrow_mut().get(&key, now) {
            parts[i] = Some(v);
            fresh_until = fresh_until.min(expires);
            continue;
        }
        if let Some(expires) = svc.shared_cache.get(key.as_bytes(), now, &mut scratch) {
            let v: Rc<[u8]> = Rc::from(&scratch[..]);
            app.homepage_cache.borrow_mut().put(&key, Rc::clone(&v), expires);
            parts[i] = Some(v);
            fresh_until = fresh_until.min(expires);
            continue;
        }
        match endpoint(app, part) {
            // The built-in demo answers at once, and is cached like any upstream.
            None => {
                let v = normalize(part, 200, &demo(part, uid))?;
                let expires = now + svc.config.upstreams.cache_ttl.as_millis() as u64;
                share(svc, &key, &v, expires, now);
                let v: Rc<[u8]> = Rc::from(v);
                app.homepage_cache.borrow_mut().put(&key, Rc::clone(&v), expires);
                parts[i] = Some(v);
                fresh_until = fresh_until.min(expires);
            }
            Some(ep) => {
                requests.push(Outbound {
                    endpoint: ep,
                    method: "GET",
                    path: part.path(uid),
                    headers: vec![("Accept", "application/json".into()), ("x-request-id", req.request_id.into())],
                    body: Vec::new(),
                    max_body: MAX_ANSWER,
                    timeout: svc.config.upstreams.timeout,
                    total_deadline: true,
                    coalesce: true,
                });
                slots.push(i);
            }
        }
    }
    if requests.is_empty() {
        let r = assemble(&parts, &[])?;
        app.homepage_cache.borrow_mut().put(&whole, Rc::from(r.body.as_bytes()), fresh_until);
        return Ok(Reply::full(r));
    }
    let cache = Rc::clone(&app.homepage_cache);
    let debug = svc.config.debug.routes;
    let ttl_ms = svc.config.upstreams.cache_ttl.as_millis() as u64;
    let finish = move |results: Vec<Fetched>| -> Result<Response, Error> {
        let mut degraded = Vec::new();
        let now = crate::sys::monotonic_ms();
        for (slot, result) in slots.into_iter().zip(results) {
            let part = PARTS[slot];
            match answer(part, result) {
                Ok(v) => {
                    let key = part.cache_key(uid);
                    let expires = now + ttl_ms;
                    // Best effort: an answer too big for a shared slot stays per worker.
                    share(svc, &key, &v, expires, now);
                    let v: Rc<[u8]> = Rc::from(v);
                    cache.borrow_mut().put(&key, Rc::clone(&v), expires);
                    parts[slot] = Some(v);
                    fresh_until = fresh_until.min(expires);
                }
                Err(e) if part == Part::User => return Err(e),
                Err(e) => {
                    log::warn!("homepage: {} degraded: {e:?}", part.field());
                    degraded.push(part.field());
                }
            }
        }
        if debug {
            crate::app::debug::homepage(parts[0].as_deref());
        }
        let r = assemble(&parts, &degraded)?;
        if degraded.is_empty() {
            cache.borrow_mut().put(&whole, Rc::from(r.body.as_bytes()), fresh_until);
        }
        Ok(r)
    };
    Ok(Reply::call(Call { requests, finish: Box::new(move |results| finish(results).map(Assembled::Now)) }))
}

/// Store a normalised answer in the shared cache until `expires` (monotonic
/// ms) and, with `cluster.redis_url`, publish the write on the bus so that
/// every other host's supervisor stores it in its own shared cache (the
/// supervisor does not hand it to this host's workers, which share the cache
/// already). Without Redis nothing is published. Never blocks: the message
/// goes to the loop's outbound bus queue.
fn share(svc: &Services, key: &str, value: &[u8], expires: u64, now: u64) {
    svc.shared_cache.put(key.as_bytes(), value, expires, now);
    if svc.config.cluster.redis_url.is_none() {
        return;
    }
    let expires_wall_ms = crate::bus::wall_ms().saturating_add(expires.saturating_sub(now));
    // None: larger than a shared slot, so not shared here either.
    if let Some(payload) = (crate::bus::CacheEntry { key: key.as_bytes(), value, expires_wall_ms }).encode() {
        let _ = svc.publish.send((crate::bus::Topic::Cache, payload));
    }
}

fn endpoint(app: &App, part: Part) -> Option<std::sync::Arc<Endpoint>> {
    let e = app.svc.endpoints;
    match part {
        Part::User => e.users.clone(),
        Part::Orders => e.orders.clone(),
        Part::Recommendations => e.recommendations.clone(),
    }
}

/// An upstream result → the normalised fragment, or the client-facing error.
fn answer(part: Part, result: Fetched) -> Result<Vec<u8>, Error> {
    match result {
        Ok((status, body)) => normalize(part, status, &body),
        Err(ClientError::Timeout) => Err(Error::UpstreamTimeout),
        Err(e) => Err(Error::UpstreamUnavailable(format!("{} upstream: {e}", part.field()).into())),
    }
}

/// Check and trim one upstream answer to what the response shows.
fn normalize(part: Part, status: u16, body: &[u8]) -> Result<Vec<u8>, Error> {
    let fail = |why: &str| Error::UpstreamUnavailable(format!("{} upstream: {why}", part.field()).into());
    if !(200..300).contains(&status) {
        return Err(fail(&format!("answered {status}")));
    }
    let v: Value = serde_json::from_slice(body).map_err(|_| fail("invalid JSON"))?;
    let out = match part {
        Part::User => {
            let Value::Object(o) = v else { return Err(fail("not a JSON object")) };
            json!({"name": o.get("name").cloned().unwrap_or(Value::Null), "avatar": o.get("avatar").cloned().unwrap_or(Value::Null)})
        }
        Part::Orders => Value::Array(
            list(v)
                .ok_or_else(|| fail("not a JSON array"))?
                .into_iter()
                .filter_map(|o| match o {
                    Value::Object(o) => Some(json!({
                        "id": o.get("id").cloned().unwrap_or(Value::Null),
                        "status": o.get("status").cloned().unwrap_or(Value::Null),
                        "total": o.get("totalAmount").cloned().unwrap_or(Value::Null),
                    })),
                    _ => None,
                })
                .collect(),
        ),
        Part::Recommendations => {
            let mut items = list(v).ok_or_else(|| fail("not a JSON array"))?;
            items.truncate(MAX_RECOMMENDATIONS);
            Value::Array(items)
        }
    };
    serde_json::to_vec(&out).map_err(|e| Error::Internal(e.to_string()))
}

/// A JSON array, or the `items` array of an object.
fn list(v: Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) => Some(a),
        Value::Object(mut o) => match o.remove("items") {
            Some(Value::Array(a)) => Some(a),
            _ => None,
        },
        _ => None,
    }
}

/// The envelope from the three fragments, written without re-serialising them.
fn assemble(parts: &[Option<Rc<[u8]>>; 3], degraded: &[&str]) -> Result<Response, Error> {
    let fragment = |i: usize, empty: &'static [u8]| -> &[u8] { parts[i].as_deref().unwrap_or(empty) };
    let user = fragment(0, b"null");
    let (orders, recs) = (fragment(1, b"[]"), fragment(2, b"[]"));
    let mut body = Vec::with_capacity(user.len() + orders.len() + recs.len() + 128);
    body.extend_from_slice(b"{\"code\":200,\"message\":\"OK\",\"data\":{\"user\":");
    body.extend_from_slice(user);
    body.extend_from_slice(b",\"recentOrders\":");
    body.extend_from_slice(orders);
    body.extend_from_slice(b",\"recommendations\":");
    body.extend_from_slice(recs);
    if !degraded.is_empty() {
        body.extend_from_slice(b",\"degraded\":");
        body.extend_from_slice(&serde_json::to_vec(degraded).map_err(|e| Error::Internal(e.to_string()))?);
    }
    body.extend_from_slice(b"}}");
    let mut r = Response::new(200);
    r.body = Body::Bytes(body);
    Ok(r)
}

/// What the built-in demo upstreams answer (upstream format, normalised like any answer).
fn demo(part: Part, uid: i64) -> Vec<u8> {
    let v = match part {
        Part::User => json!({"id": uid, "name": format!("Demo user {uid}"), "avatar": "/favicon.ico", "plan": "free"}),
        Part::Orders => json!({"items": [
            {"id": format!("ord-{uid}-3"), "status": "processing", "totalAmount": 19.9, "currency": "EUR"},
            {"id": format!("ord-{uid}-2"), "status": "shipped", "totalAmount": 54.0, "currency": "EUR"},
            {"id": format!("ord-{uid}-1"), "status": "delivered", "totalAmount": 7.5, "currency": "EUR"},
        ]}),
        Part::Recommendations => Value::Array(
            (1..=12)
                .map(|i| json!({"id": format!("p{i}"), "name": format!("Product {i}"), "score": 1.0 - i as f64 / 20.0}))
                .collect(),
        ),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(part: Part, body: &str) -> Result<Value, Error> {
        normalize(part, 200, body.as_bytes()).map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn user_keeps_name_and_avatar_only() {
        assert_eq!(
            norm(Part::User, r#"{"name":"A","avatar":"x","secret":1}"#).unwrap(),
            json!({"name":"A","avatar":"x"})
        );
        assert_eq!(norm(Part::User, r#"{"name":"A"}"#).unwrap(), json!({"name":"A","avatar":null}));
        assert!(norm(Part::User, "[1]").is_err());
        assert!(norm(Part::User, "{").is_err());
        assert!(normalize(Part::User, 500, b"{}").is_err());
    }

    #[test]
    fn orders_map_total_amount_and_accept_items() {
        let want = json!([{"id":1,"status":"s","total":9.5}]);
        assert_eq!(norm(Part::Orders, r#"[{"id":1,"status":"s","totalAmount":9.5,"x":0}]"#).unwrap(), want);
        assert_eq!(norm(Part::Orders, r#"{"items":[{"id":1,"status":"s","totalAmount":9.5}]}"#).unwrap(), want);
        assert!(norm(Part::Orders, r#"{"orders":[]}"#).is_err());
    }

    #[test]
    fn recommendations_are_cut_to_ten() {
        let many: Vec<i32> = (0..25).collect();
        let v = norm(Part::Recommendations, &serde_json::to_string(&many).unwrap()).unwrap();
        assert_eq!(v, json!((0..10).collect::<Vec<i32>>()));
    }

    #[test]
    fn assembly_is_valid_json_with_degraded_only_when_needed() {
        let p = |s: &str| Some(Rc::<[u8]>::from(s.as_bytes()));
        let r = assemble(&[p(r#"{"name":"A","avatar":null}"#), p("[]"), p("[1]")], &[]).unwrap();
        let v: Value = serde_json::from_slice(r.body.as_bytes()).unwrap();
        assert_eq!(v["data"]["recommendations"], json!([1]));
        assert!(v["data"].get("degraded").is_none());
        let r = assemble(&[p("{}"), None, None], &["recentOrders", "recommendations"]).unwrap();
        let v: Value = serde_json::from_slice(r.body.as_bytes()).unwrap();
        assert_eq!(v["data"]["degraded"], json!(["recentOrders", "recommendations"]));
        assert_eq!((v["code"].as_i64(), v["data"]["recentOrders"].clone()), (Some(200), json!([])));
    }

    #[test]
    fn demo_answers_normalise() {
        for part in PARTS {
            assert!(normalize(part, 200, &demo(part, 7)).is_ok(), "{part:?}");
        }
        let recs = norm(Part::Recommendations, std::str::from_utf8(&demo(Part::Recommendations, 7)).unwrap()).unwrap();
        assert_eq!(recs.as_array().map(Vec::len), Some(10));
    }
}
