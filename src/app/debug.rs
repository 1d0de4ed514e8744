//! Test-only routes under `/_debug/` (config `[debug] routes = true`, refused
//! in production). They let the integration tests reach states that are
//! otherwise hard to provoke: a slow pool job, a stuck event loop, a panic,
//! memory growth, an echo of the request body.

use super::router::Router;
use super::{App, Ctx, Handler, Reply};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::{Body, Response};

/// Register the debug routes.
pub fn routes(r: &mut Router<Handler>) {
    r.add(Method::Get, "/_debug/pid", pid)
        .add(Method::Get, "/_debug/sleep", sleep)
        .add(Method::Get, "/_debug/block", block)
        .add(Method::Get, "/_debug/panic", panic)
        .add(Method::Get, "/_debug/pool-panic", pool_panic)
        .add(Method::Get, "/_debug/alloc", alloc)
        .add(Method::Get, "/_debug/big", big)
        .add(Method::Post, "/_debug/echo", echo)
        .add(Method::Get, "/_debug/streams", streams);
}

fn number(req: &Request<'_>, key: &str, max: u64) -> Result<u64, Error> {
    req.query_param(key)
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v <= max)
        .ok_or(Error::bad_request("bad numeric parameter"))
}

fn json(v: serde_json::Value) -> Response {
    let mut r = Response::new(200);
    r.body = Body::Bytes(serde_json::to_vec(&v).unwrap_or_default());
    r
}

fn pid(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::Now(json(serde_json::json!({"pid": std::process::id()}))))
}

fn sleep(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let ms = number(req, "ms", 600_000)?;
    Ok(Reply::Later(Box::new(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        Ok(json(serde_json::json!({"slept": ms})))
    })))
}

fn block(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let ms = number(req, "ms", 600_000)?;
    // Deliberately blocks the event loop: the watchdog test needs a stuck worker.
    std::thread::sleep(std::time::Duration::from_millis(ms));
    Ok(Reply::Now(json(serde_json::json!({"blocked": ms}))))
}

fn panic(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    panic!("debug panic requested");
}

fn pool_panic(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::Later(Box::new(|| panic!("debug pool panic requested"))))
}

fn alloc(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mb = number(req, "mb", 4096)? as usize;
    let mut v = vec![0u8; mb << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    std::mem::forget(v);
    Ok(Reply::Now(json(serde_json::json!({"allocatedMb": mb}))))
}

fn big(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let kb = number(req, "kb", 1 << 20)? as usize;
    let mut r = Response::new(200);
    r.content_type = "text/plain";
    r.body = Body::Bytes(vec![b'x'; kb << 10]);
    Ok(Reply::Now(r))
}

fn streams(app: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let s = app.svc.stats;
    Ok(Reply::Now(json(serde_json::json!({
        "pid": std::process::id(),
        "sse": s.sse.load(Relaxed),
        "ws": s.ws.load(Relaxed),
        "members": s.members.load(Relaxed),
        "connections": app.svc.record.connections.load(Relaxed),
    }))))
}

fn echo(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mut r = Response::new(200);
    r.content_type = "application/octet-stream";
    r.body = Body::Bytes(req.body.to_vec());
    Ok(Reply::Now(r))
}
