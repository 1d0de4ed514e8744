//! The handlers of every declared resource's routes: list, create, get, replace, patch and
//! delete, for whichever resource the route is mounted for (`routes::Mount`). What needs no
//! record (the token, the body, the query, the rules a caller alone decides) is settled on the
//! event loop; the rest runs on the pool (`Ctx::later`), after `session::confirm`, with the
//! checks that need the current record inside the store's transaction (its guard).
//!
//! A record is rendered straight into the response body (`Record::write_json`): no JSON tree
//! on the way, and the ETag is hashed from those same bytes.

use std::io::Write as _;

use crate::app::handlers::{events, health};
use crate::app::session::{self, Caller};
use crate::app::usermemo::{self, Fill};
use crate::app::users::if_match;
use crate::app::{path_id, validate, App, Ctx, Reply, Services};
use crate::error::{Error, FieldError};
use crate::http::request::Request;
use crate::http::response::{self, Body, Response};
use crate::resources::record::Record;
use crate::resources::Resource;
use crate::store::records::{Change, Refused, Scope};
use crate::store::Page;

use super::routes::{Mount, Place};
use super::{access, body, query};

/// `GET /<name>` (every record the caller may read) and `GET /<parent>/{id}/<name>`.
pub fn list(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let Mount { res, place } = app.mount(ctx)?;
    let caller = access::reader(app, req, res)?;
    let parent_id = if place == Place::Children { Some(path_id(ctx)?) } else { None };
    let mut q = query::parse(res, req.query)?;
    access::narrow(res, caller.as_ref(), &mut q)?;
    q.parent = parent_id;
    let svc = app.svc;
    Ok(ctx.later(move || {
        confirm(svc, caller.as_ref())?;
        if let Some(pid) = parent_id {
            parent(svc, res, caller.as_ref(), pid)?;
        }
        let page = svc.store.record_list(scope(svc, res), &q)?;
        let mut r = Response::new(200);
        r.body = Body::Bytes(page_envelope(res, &page));
        Ok(r)
    }))
}

/// `POST /<name>` (top level) and `POST /<parent>/{id}/<name>`: 201 with `Location`.
pub fn create(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let Mount { res, place } = app.mount(ctx)?;
    let caller = session::require(app, req)?;
    let parent_id = if place == Place::Children { Some(path_id(ctx)?) } else { None };
    access::may_create(res, &caller, parent_id)?;
    let cells = body::create(res, validate::json_object(req)?)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        // A child of a user belongs to that user; anything else to its creator.
        let mut owner_id = caller.user_id;
        if let Some(pid) = parent_id {
            match parent(svc, res, Some(&caller), pid)? {
                Some(parent) => access::may_create_under(res, &caller, &parent)?,
                None => owner_id = pid,
            }
        }
        let created = svc.store.record_create(scope(svc, res), access::viewer(&caller), owner_id, parent_id, cells)?;
        let (rec, change) = match created {
            Ok(done) => done,
            Err(Refused::Guard(never)) => match never {},
            Err(Refused::Ref(field)) => return Err(bad_ref(field)),
            Err(Refused::Parent) => return Err(Error::NotFound),
        };
        publish(svc, change.as_ref());
        let mut r = Response::new(201);
        r.body = Body::Bytes(rec.envelope(res, 201));
        r.header("Location", format!("/api/v1/{}/{}", res.name, rec.id));
        Ok(r)
    }))
}

/// `GET /<name>/{id}`: 200 with a strong `ETag`; `If-None-Match` → 304.
pub fn get(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let Mount { res, .. } = app.mount(ctx)?;
    let caller = access::reader(app, req, res)?;
    let id = path_id(ctx)?;
    let svc = app.svc;
    let key = memo_key(svc, res, id);
    let inm = req.header("if-none-match");
    let mut memo = app.user_memo.borrow_mut();
    // Answered here only when the loop can vouch for the caller alone (no store check).
    let vouched = match &caller {
        Some(c) => session::covered(svc, c) && memo.settled_by(c.read_ms),
        None => memo.open(),
    };
    if let Some((tag, body, owner)) = memo.get(key, &svc.region.users).filter(|_| vouched) {
        if !access::may_read_owned(res, caller.as_ref(), owner) {
            return Err(Error::NotFound);
        }
        let mut r = Response::new(200);
        if inm.is_some_and(|v| health::etag_matches(v, tag.as_bytes())) {
            r.status = 304;
        } else {
            r.body = Body::Bytes(body.to_vec());
        }
        r.header("ETag", tag.clone());
        return Ok(Reply::full(r));
    }
    let fills = memo.open().then(|| svc.user_fills.clone());
    drop(memo);
    let if_none_match = inm.map(<[u8]>::to_vec);
    Ok(ctx.later(move || {
        confirm(svc, caller.as_ref())?;
        // Read before the row: a write committed after it leaves the memo's entry stale.
        let (epoch, all) = (svc.region.users.get(key), svc.region.users.get(usermemo::ALL));
        let rec = svc.store.record_get(scope(svc, res), id)?.ok_or(Error::NotFound)?;
        let (body, tag) = rendered(res, &rec);
        if let Some(fills) = &fills {
            let fill =
                Fill { id: key, epoch, owner: rec.owner_id, all: Some(all), tag: tag.clone(), body: body[..].into() };
            let _ = fills.send(fill);
        }
        if !access::may_read(res, caller.as_ref(), &rec) {
            return Err(Error::NotFound);
        }
        let mut r = Response::new(200);
        if if_none_match.is_some_and(|v| health::etag_matches(&v, tag.as_str().as_bytes())) {
            r.status = 304;
        } else {
            r.body = Body::Bytes(body);
        }
        r.header("ETag", tag);
        Ok(r)
    }))
}

/// The memo key of record `id` of `res` (see `usermemo`).
fn memo_key(svc: &Services, res: &Resource, id: i64) -> i64 {
    let index = svc.config.resources.list.iter().position(|r| std::ptr::eq(r, res)).unwrap_or(0);
    usermemo::record_key(index, id)
}

/// After a write of record `id` of `res` committed, before its answer: the memos of it are
/// stale, and after a delete that takes children with it, those of every record.
fn written(svc: &Services, res: &Resource, id: i64, deleted: bool) {
    svc.region.users.bump(memo_key(svc, res, id));
    if deleted && svc.config.resources.children(&res.name).next().is_some() {
        svc.region.users.bump(usermemo::ALL);
    }
}

/// `PUT /<name>/{id}`: every field replaced.
pub fn replace(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let res = app.mount(ctx)?.res;
    let cells = body::replace(res, validate::json_object(req)?)?;
    update(app, req, ctx, res, move |_| cells)
}

/// `PATCH /<name>/{id}`: the fields given changed.
pub fn patch(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let res = app.mount(ctx)?.res;
    let patch = body::patch(res, validate::json_object(req)?)?;
    update(app, req, ctx, res, move |current| body::merge(&current.cells, patch))
}

/// `DELETE /<name>/{id}`: 204; its children go with it.
pub fn delete(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let res = app.mount(ctx)?.res;
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    let wanted = header_text(req, "if-match");
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let deleted = svc.store.record_delete(scope(svc, res), id, |current| {
            access::may_write(res, res.delete, &caller, current)?;
            precondition(res, wanted.as_deref(), current)
        })?;
        if matches!(deleted, Ok(Some(_))) {
            written(svc, res, id, true);
        }
        let (_, change) = deleted.map_err(refused)?.ok_or(Error::NotFound)?;
        publish(svc, change.as_ref());
        Ok(Response::new(204))
    }))
}

/// A PUT or PATCH: `cells` makes the new cells from the current record, in the store's
/// transaction, after the rules, `If-Match` and before the state machines.
fn update(
    app: &App,
    req: &Request<'_>,
    ctx: &Ctx<'_>,
    res: &'static Resource,
    cells: impl FnOnce(&Record) -> Vec<crate::resources::value::Cell> + Send + 'static,
) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    let wanted = header_text(req, "if-match");
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let updated = svc.store.record_update(scope(svc, res), access::viewer(&caller), id, |current| {
            access::may_write(res, res.update, &caller, current)?;
            precondition(res, wanted.as_deref(), current)?;
            let next = cells(current);
            body::transitions(res, &current.cells, &next)?;
            Ok::<_, Error>(next)
        })?;
        if matches!(updated, Ok(Some(_))) {
            written(svc, res, id, false);
        }
        let (rec, change) = updated.map_err(refused)?.ok_or(Error::NotFound)?;
        publish(svc, change.as_ref());
        let (body, tag) = rendered(res, &rec);
        let mut r = Response::new(200);
        r.body = Body::Bytes(body);
        r.header("ETag", tag);
        Ok(r)
    }))
}

/// `If-Match` against the current record: 412 when stale.
fn precondition(res: &Resource, wanted: Option<&str>, current: &Record) -> Result<(), Error> {
    match wanted {
        Some(w) if !if_match(w, &current.etag(res)) => Err(Error::PreconditionFailed),
        _ => Ok(()),
    }
}

/// The parent record `pid` of a nested resource's request, which must exist and be readable
/// by `caller` (else 404): `Some` for a parent resource's record, `None` for a user.
fn parent(svc: &Services, res: &Resource, caller: Option<&Caller>, pid: i64) -> Result<Option<Record>, Error> {
    let parent = res.parent.as_deref().unwrap_or("users");
    if parent == "users" {
        svc.store.token_gen(pid)?.ok_or(Error::NotFound)?;
        return Ok(None);
    }
    let registry = &svc.config.resources;
    let pres = registry.get(parent).ok_or_else(|| Error::Internal(format!("no resource {parent}")))?;
    let rec = svc.store.record_get(Scope { registry, res: pres }, pid)?;
    rec.filter(|r| access::may_read(pres, caller, r)).map(Some).ok_or(Error::NotFound)
}

/// What the store refused, as the client's error.
fn refused(r: Refused<Error>) -> Error {
    match r {
        Refused::Guard(e) => e,
        Refused::Ref(field) => bad_ref(field),
        Refused::Parent => Error::NotFound,
    }
}

/// A `ref` field naming no record the caller may read.
fn bad_ref(field: &str) -> Error {
    Error::Validation(vec![FieldError::new(field, "no such record")])
}

/// The store's answer to a caller that may be anonymous (public reads).
fn confirm(svc: &Services, caller: Option<&Caller>) -> Result<(), Error> {
    caller.map_or(Ok(()), |c| session::confirm(svc, c))
}

fn publish(svc: &Services, change: Option<&Change>) {
    if let Some(change) = change {
        events::publish_change(svc, change);
    }
}

fn scope(svc: &'static Services, res: &'static Resource) -> Scope {
    Scope { registry: &svc.config.resources, res }
}

fn header_text(req: &Request<'_>, name: &str) -> Option<String> {
    req.header(name).and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned)
}

/// The 200 envelope of `rec` and its strong ETag (`Record::etag`), hashed from the record's
/// bytes as they are written into the envelope.
fn rendered(res: &Resource, rec: &Record) -> (Vec<u8>, response::Value) {
    let mut out = Vec::with_capacity(192 + rec.cells.len() * 24);
    out.extend_from_slice(b"{\"code\":200,\"data\":");
    let start = out.len();
    rec.write_json(res, &mut out);
    let h =
        out[start..].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    out.extend_from_slice(b",\"message\":\"OK\"}");
    (out, response::Value::display(format_args!("\"{h:016x}\"")))
}

/// The envelope of a list page: `{"code":200,"data":{"items":[…],"total","page","pageSize",
/// "totalPages"},"message":"OK"}`.
fn page_envelope(res: &Resource, page: &Page<Record>) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + page.items.len() * 192);
    out.extend_from_slice(b"{\"code\":200,\"data\":{\"items\":[");
    for (i, rec) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        rec.write_json(res, &mut out);
    }
    let _ = write!(
        out,
        "],\"total\":{},\"page\":{},\"pageSize\":{},\"totalPages\":{}}},\"message\":\"OK\"}}",
        page.total, page.page, page.page_size, page.total_pages
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::value::Cell;

    fn post() -> Record {
        Record {
            id: 9,
            owner_id: 2,
            parent_id: Some(2),
            cells: vec![Cell::Text("Hi \"you\"".into()), Cell::Text("é\n".into())],
            created_at: "2026-01-01T00:00:00.000Z".into(),
            updated_at: "2026-01-02T00:00:00.000Z".into(),
        }
    }

    #[test]
    fn one_record_renders_as_its_envelope_with_the_records_etag() {
        let res = crate::resources::builtin::posts();
        let rec = post();
        let (body, tag) = rendered(&res, &rec);
        assert_eq!(body, rec.envelope(&res, 200));
        assert_eq!(tag.as_str(), rec.etag(&res));
    }

    #[test]
    fn a_page_is_envelope_b_with_records_as_written() {
        let res = crate::resources::builtin::posts();
        let page = Page { items: vec![post(), post()], total: 7, page: 2, page_size: 2, total_pages: 4 };
        let v: serde_json::Value = serde_json::from_slice(&page_envelope(&res, &page)).expect("json");
        let one: serde_json::Value = serde_json::from_slice(&post().to_json(&res)).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"code": 200, "message": "OK",
                "data": {"items": [one.clone(), one], "total": 7, "page": 2, "pageSize": 2, "totalPages": 4}})
        );
    }
}
