//! `GET /api/events` (server-sent events) and `POST /api/v1/notifications`
//! (CONTRACT §5, §6).
//!
//! A notification is stored first, then published on the bus, so every
//! stream in every worker gets it live and a client that reconnects with
//! `Last-Event-ID` gets what it missed from the store. A change of a declared
//! resource's record (`events = true`) goes the same way as `event: change`,
//! but only to the streams whose caller may read that record: a stream knows
//! its user (a bearer token in `Authorization` or `?token=`) and the resources
//! it asked for (`?resources=`), its [`Audience`], and every live or replayed
//! change is checked against it. The streaming itself (heartbeats, fan-out,
//! back pressure) is the worker's; this file decides what a stream starts
//! with, what a replay contains and what a change event looks like.

use serde_json::{Map, Value};

use crate::app::router::Router;
use crate::app::session;
use crate::app::validate::{self, Fields};
use crate::app::{envelope_with, App, Ctx, Handler, Producer, Reply};
use crate::bus::{ChangeEvent, Topic};
use crate::error::{Error, FieldError};
use crate::http::request::{Method, Request};
use crate::http::response::Response;
use crate::http::sse;
use crate::resources::audience::{Audience, Selection};
use crate::resources::record::{change_json, Action, Record};
use crate::resources::Registry;
use crate::store::records::Viewer;
use crate::store::Logged;

/// Register `/api/events` and the notifications route under `base`.
pub fn routes(r: &mut Router<Handler>, base: &'static str) {
    let p = |s: &str| -> &'static str { Box::leak(format!("{base}{s}").into_boxed_str()) };
    r.add(Method::Post, p("/notifications"), create);
}

/// `GET /api/events`: the stream's head; the worker takes over from there.
pub fn events(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let last_event_id = req
        .header("last-event-id")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|v| *v >= 0);
    let audience = audience(app, req)?;
    let mut r = Response::new(200);
    r.content_type = "text/event-stream";
    r.cache_control = "no-cache";
    r.header("X-Accel-Buffering", "no");
    Ok(Reply::stream(r, Producer::Events { last_event_id, audience }))
}

/// Who a new stream is for: the caller of the bearer token in `Authorization`, else of
/// `?token=` (an `EventSource` cannot set headers), else nobody; a token that does not verify
/// is 401, as on every other route. `?resources=a,b` narrows it to those resources (400
/// naming `resources` for a name that is not a resource whose changes are pushed).
fn audience(app: &App, req: &Request<'_>) -> Result<Audience, Error> {
    let caller = match session::optional(app, req)? {
        Some(caller) => Some(caller),
        None => match req.query_param("token").and_then(validate::decode_query).filter(|t| !t.is_empty()) {
            Some(token) => Some(session::from_token(app, &token)?.0),
            None => None,
        },
    };
    let only = match req.query_param("resources") {
        None => Selection::All,
        Some(raw) => {
            let bad = |message: String| Error::BadParams(vec![FieldError { field: "resources".into(), message }]);
            let list = validate::decode_query(raw).ok_or_else(|| bad("is not a valid query value".into()))?;
            Selection::parse(&app.svc.config.resources, &list)
                .map_err(|name| bad(format!("names no resource whose changes are pushed: {name:?}")))?
        }
    };
    Ok(Audience { viewer: caller.map(|c| Viewer { user_id: c.user_id, admin: c.admin }), only })
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

/// A change event from the bus, rendered once for every stream of a worker.
#[derive(Debug, PartialEq, Eq)]
pub struct LiveChange {
    /// The event id.
    pub id: i64,
    /// The resource's index in the registry.
    pub resource: usize,
    /// The record's owner.
    pub owner_id: i64,
    /// The whole SSE event (`id`, `event: change`, `data`).
    pub event: Vec<u8>,
}

/// The event for a change published on the bus ([`ChangeEvent`]); `None` for a malformed
/// payload or a resource this configuration does not declare.
pub fn change_event(registry: &Registry, payload: &[u8]) -> Option<LiveChange> {
    let c = ChangeEvent::decode(payload)?;
    let resource = registry.list.iter().position(|r| r.name == c.resource)?;
    let mut event = Vec::with_capacity(c.data.len() + 48);
    sse::event(&mut event, Some(c.id), Some("change"), std::str::from_utf8(c.data).ok()?);
    Some(LiveChange { id: c.id, resource, owner_id: c.owner_id, event })
}

/// Pool work for a reconnecting stream: the events after `after` that `audience` may see,
/// notifications and changes in id order, and the last id looked at.
pub fn replay(app: &App, after: i64, audience: Audience) -> Box<dyn FnOnce() -> (Vec<u8>, i64) + Send> {
    let svc = app.svc;
    let debug = svc.config.debug.routes;
    Box::new(move || {
        let list = svc.store.events_after(after, svc.config.sse.replay_limit).unwrap_or_else(|e| {
            log::warn!("SSE replay failed: {e}");
            Vec::new()
        });
        let registry = &svc.config.resources;
        let mut out = Vec::new();
        let mut last = after;
        for logged in list {
            match logged {
                Logged::Notification(n) => {
                    if debug {
                        crate::app::debug::notification(&n.title, true);
                    }
                    let json = serde_json::to_string(&n).unwrap_or_default();
                    sse::event(&mut out, Some(n.id), Some("notification"), &json);
                    last = n.id;
                }
                Logged::Change(c) => {
                    last = c.id;
                    let Some(i) = registry.list.iter().position(|r| r.name == c.resource) else { continue };
                    if !audience.sees(registry, i, c.owner_id) {
                        continue;
                    }
                    let Ok(data) = std::str::from_utf8(&c.data) else { continue };
                    sse::event(&mut out, Some(c.id), Some("change"), data);
                }
            }
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

/// `POST /_debug/change` (debug routes only): publish a change event as the resource handlers
/// do after a commit, without storing it, so the fan-out's filter can be tested on its own.
/// Body: `{"eventId", "resource", "action", "recordId", "ownerId"}`.
pub fn debug_change(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let v: Value = serde_json::from_slice(req.body).map_err(|_| Error::bad_request("malformed JSON"))?;
    let int = |k: &str| v[k].as_i64().ok_or(Error::bad_request("eventId, recordId and ownerId are integers"));
    let (id, record_id, owner_id) = (int("eventId")?, int("recordId")?, int("ownerId")?);
    let registry = &app.svc.config.resources;
    let res = v["resource"].as_str().and_then(|n| registry.get(n)).ok_or(Error::bad_request("unknown resource"))?;
    let action = match v["action"].as_str() {
        Some("create") => Action::Create,
        Some("update") => Action::Update,
        Some("delete") => Action::Delete,
        _ => return Err(Error::bad_request("action is create, update or delete")),
    };
    let record = (action != Action::Delete).then(|| Record {
        id: record_id,
        owner_id,
        parent_id: None,
        cells: res.fields.iter().map(|_| crate::resources::value::Cell::Null).collect(),
        created_at: String::new(),
        updated_at: String::new(),
    });
    let data = change_json(res, action, record_id, record.as_ref());
    let change = crate::store::records::Change { id, resource: res.name.clone(), action, record_id, owner_id, data };
    let svc = app.svc;
    Ok(ctx.later(move || {
        publish_change(svc, &change);
        Ok(Response::new(204))
    }))
}

/// Push a stored change event to every `/api/events` stream, in every worker and on every host,
/// whose caller may read the record (called by the resource handlers after the commit; the
/// worker's fan-out checks each stream's [`Audience`]).
pub fn publish_change(svc: &crate::app::Services, change: &crate::store::records::Change) {
    let event =
        ChangeEvent { id: change.id, owner_id: change.owner_id, resource: &change.resource, data: &change.data };
    if let Some(payload) = event.encode() {
        let _ = svc.publish.send((Topic::Change, payload));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_from_the_bus_is_one_change_event_of_its_resource() {
        let mut notes = crate::resources::builtin::posts();
        notes.name = "notes".into();
        let registry = Registry { list: vec![crate::resources::builtin::posts(), notes], declared: Vec::new() };
        let data = change_json(&registry.list[1], Action::Delete, 12, None);
        let payload = ChangeEvent { id: 40, owner_id: 7, resource: "notes", data: &data }.encode().expect("encodes");
        let live = change_event(&registry, &payload).expect("a change");
        assert_eq!((live.id, live.resource, live.owner_id), (40, 1, 7));
        let want = b"id: 40\nevent: change\ndata: {\"resource\":\"notes\",\"action\":\"delete\",\"id\":12,\"record\":null}\n\n";
        assert_eq!(String::from_utf8_lossy(&live.event), String::from_utf8_lossy(want));
        let unknown = ChangeEvent { id: 41, owner_id: 7, resource: "gone", data: &data }.encode().expect("encodes");
        assert_eq!(change_event(&registry, &unknown), None, "a resource this configuration does not declare");
        assert_eq!(change_event(&registry, b"short"), None);
    }
}
