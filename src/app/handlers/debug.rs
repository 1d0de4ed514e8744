//! Test-only routes under `/_debug/` (config `[debug] routes = true`, refused
//! in production). They let the integration tests reach states that are
//! otherwise hard to provoke: a slow pool job, a stuck event loop, a panic,
//! memory growth, an echo of the request body.
//!
//! Also the debug hooks that panic inside app code the worker calls outside
//! a handler, for the tests of its panic boundary: a ticker
//! (`/_debug/panic/ticker`), a relay sink (a chat message whose content is
//! [`PANIC_RELAY_HEAD`] or [`PANIC_RELAY_BODY`]), a WebSocket message (type
//! [`PANIC_WS`]), SSE rendering (a notification titled [`PANIC_SSE`] or
//! [`PANIC_SSE_REPLAY`]) and the homepage assembly (a users upstream naming
//! the user [`PANIC_HOMEPAGE`]). The app calls them only after checking
//! `debug.routes`; with it off, those values are ordinary data. And one that
//! the boundary does not catch (`/_debug/panic/worker`): the worker dies.

use std::time::Duration;

use crate::app::router::Router;
use crate::app::{App, Ctx, Handler, Producer, RelaySink, Reply, Ticker};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::{Body, Response};

/// Chat message content: the relay sink panics when the upstream's head arrives.
pub const PANIC_RELAY_HEAD: &str = "__debug_panic_relay_head__";
/// Chat message content: the relay sink panics on the body after its first event went out.
pub const PANIC_RELAY_BODY: &str = "__debug_panic_relay_body__";
/// WebSocket message type (`{"type":"__debug_panic"}`): interpreting it panics.
pub const PANIC_WS: &str = "__debug_panic";
/// Notification title: rendering its live SSE event panics.
pub const PANIC_SSE: &str = "__debug_panic_sse__";
/// Notification title: rendering it in a `Last-Event-ID` replay panics.
pub const PANIC_SSE_REPLAY: &str = "__debug_panic_sse_replay__";
/// User name from the users upstream: assembling that user's homepage panics.
pub const PANIC_HOMEPAGE: &str = "__debug_panic_homepage__";

/// Register the debug routes.
pub fn routes(r: &mut Router<Handler>) {
    r.add(Method::Get, "/_debug/pid", pid)
        .add(Method::Get, "/_debug/sleep", sleep)
        .add(Method::Get, "/_debug/block", block)
        .add(Method::Get, "/_debug/panic", panic)
        .add(Method::Get, "/_debug/pool-panic", pool_panic)
        .add(Method::Get, "/_debug/panic/ticker", panic_ticker)
        .add(Method::Get, "/_debug/panic/worker", panic_worker)
        .add(Method::Get, "/_debug/alloc", alloc)
        .add(Method::Get, "/_debug/big", big)
        .add(Method::Post, "/_debug/echo", echo)
        .add(Method::Post, "/_debug/change", super::events::debug_change)
        .add(Method::Get, "/_debug/streams", streams);
    #[cfg(feature = "count-alloc")]
    r.add(Method::Get, "/_debug/allocations", allocations);
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
    Ok(Reply::full(json(serde_json::json!({"pid": std::process::id()}))))
}

fn sleep(_: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let ms = number(req, "ms", 600_000)?;
    Ok(ctx.later(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        Ok(json(serde_json::json!({"slept": ms})))
    }))
}

fn block(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let ms = number(req, "ms", 600_000)?;
    // Deliberately blocks the event loop: the watchdog test needs a stuck worker.
    std::thread::sleep(std::time::Duration::from_millis(ms));
    Ok(Reply::full(json(serde_json::json!({"blocked": ms}))))
}

fn panic(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    panic!("debug panic requested");
}

fn pool_panic(_: &App, _: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(ctx.later(|| panic!("debug pool panic requested")))
}

fn alloc(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mb = number(req, "mb", 4096)? as usize;
    let mut v = vec![0u8; mb << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    // Kept for the process's life. `black_box` makes the optimiser assume the
    // buffer is read, so a release build allocates and touches it too
    // (without it the unused buffer was removed and nothing grew).
    std::hint::black_box(std::hint::black_box(v).leak());
    Ok(Reply::full(json(serde_json::json!({"allocatedMb": mb}))))
}

fn big(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let kb = number(req, "kb", 1 << 20)? as usize;
    let mut r = Response::new(200);
    r.content_type = "text/plain";
    r.body = Body::Bytes(vec![b'x'; kb << 10]);
    Ok(Reply::full(r))
}

fn streams(app: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let s = app.svc.stats;
    Ok(Reply::full(json(serde_json::json!({
        "pid": std::process::id(),
        "sse": s.sse.load(Relaxed),
        "ws": s.ws.load(Relaxed),
        "members": s.members.load(Relaxed),
        "connections": app.svc.record.connections.load(Relaxed),
    }))))
}

/// `GET /_debug/allocations` (measurement builds only, cargo feature
/// `count-alloc`): this worker process's allocator calls so far (its pool
/// threads included). Reading them costs the same allocations every time, so
/// two reads in a row measure that cost and a caller subtracts it.
#[cfg(feature = "count-alloc")]
fn allocations(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let c = crate::sys::alloc_count::counts();
    let mut r = Response::new(200);
    r.body = Body::Bytes(
        format!(
            "{{\"pid\":{},\"allocs\":{},\"reallocs\":{},\"frees\":{},\"bytes\":{}}}",
            std::process::id(),
            c.allocs,
            c.reallocs,
            c.frees,
            c.bytes
        )
        .into_bytes(),
    );
    Ok(Reply::full(r))
}

fn echo(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mut r = Response::new(200);
    r.content_type = "application/octet-stream";
    r.body = Body::Bytes(req.body.to_vec());
    Ok(Reply::full(r))
}

/// `GET /_debug/panic/ticker`: a chunked event stream whose ticker sends one
/// event, then panics on its second tick.
fn panic_ticker(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mut r = Response::new(200);
    r.content_type = "text/event-stream";
    r.cache_control = "no-cache";
    Ok(Reply::stream(r, Producer::Ticker(Box::new(PanicTicker { ticks: 0 }))))
}

struct PanicTicker {
    ticks: u32,
}

impl Ticker for PanicTicker {
    fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration> {
        self.ticks += 1;
        if self.ticks >= 2 {
            panic!("debug panic in a ticker (tick {})", self.ticks);
        }
        crate::http::sse::event(out, None, None, "{\"tick\":1}");
        Some(Duration::from_millis(50))
    }
}

/// The chat relay's sink, wrapped to panic when a message's content asks for it.
pub fn relay_sink<'a>(sink: Box<dyn RelaySink>, mut contents: impl Iterator<Item = &'a str>) -> Box<dyn RelaySink> {
    match contents.find(|c| *c == PANIC_RELAY_HEAD || *c == PANIC_RELAY_BODY) {
        Some(c) => Box::new(PanicSink { inner: sink, in_head: c == PANIC_RELAY_HEAD, sent: false }),
        None => sink,
    }
}

struct PanicSink {
    inner: Box<dyn RelaySink>,
    /// Panic in `head`; else in `body`, once an event went out.
    in_head: bool,
    /// An event was produced.
    sent: bool,
}

impl RelaySink for PanicSink {
    fn head(&mut self, status: u16, content_type: Option<&str>) -> Result<(), Error> {
        if self.in_head {
            panic!("debug panic in a relay sink's head");
        }
        self.inner.head(status, content_type)
    }
    fn body(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        if self.sent {
            panic!("debug panic in a relay sink's body");
        }
        let before = out.len();
        let done = self.inner.body(bytes, out)?;
        self.sent |= out.len() > before;
        Ok(done)
    }
    fn response(&mut self) -> Response {
        self.inner.response()
    }
    fn failed(&mut self, error: &Error, out: &mut Vec<u8>) {
        self.inner.failed(error, out)
    }
    fn error(&mut self, e: Error) -> Response {
        self.inner.error(e)
    }
}

/// `GET /_debug/panic/worker`: a one-event stream whose ticker panics when it
/// is dropped. The worker drops app values outside its panic boundary, so this
/// panic is not caught: the worker dies of it, the way a bug in the worker's own
/// code would make it die (for the tests of how such a worker exits).
fn panic_worker(_: &App, _: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let mut r = Response::new(200);
    r.content_type = "text/event-stream";
    r.cache_control = "no-cache";
    Ok(Reply::stream(r, Producer::Ticker(Box::new(PanicOnDrop))))
}

struct PanicOnDrop;

impl Ticker for PanicOnDrop {
    fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration> {
        crate::http::sse::event(out, None, None, "{\"tick\":1}");
        None
    }
}

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("debug panic outside the panic boundary (a ticker dropped by the worker)");
        }
    }
}

/// A WebSocket message of type `kind` is being interpreted.
pub fn ws_message(kind: &str) {
    if kind == PANIC_WS {
        panic!("debug panic in a WebSocket message");
    }
}

/// A notification titled `title` is being rendered as an SSE event (`replay`:
/// in a `Last-Event-ID` replay, else live from the bus).
pub fn notification(title: &str, replay: bool) {
    match (title, replay) {
        (PANIC_SSE, false) => panic!("debug panic rendering a notification"),
        (PANIC_SSE_REPLAY, true) => panic!("debug panic replaying a notification"),
        _ => {}
    }
}

/// The homepage is being assembled with this `user` fragment (`{"name":…}`).
pub fn homepage(user: Option<&[u8]>) {
    let magic = format!("\"name\":\"{PANIC_HOMEPAGE}\"");
    if user.is_some_and(|u| u.windows(magic.len()).any(|w| w == magic.as_bytes())) {
        panic!("debug panic assembling a homepage");
    }
}
