//! `/users/{id}/posts` and `/posts/{id}`: a user's posts, paginated newest
//! first; created by their owner; changed or removed by the owner or an
//! admin. Every job first asks the store whether the caller's token is still
//! its account's (`session::confirm`).

use serde_json::{Map, Value};

use crate::app::router::Router;
use crate::app::session;
use crate::app::users::paging;
use crate::app::validate::{self, Fields};
use crate::app::{envelope_with, path_id, App, Ctx, Handler, Reply};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;

/// Register the routes under `base`.
pub fn routes(r: &mut Router<Handler>, base: &'static str) {
    let p = |s: &str| -> &'static str { Box::leak(format!("{base}{s}").into_boxed_str()) };
    r.add(Method::Get, p("/users/{id}/posts"), list)
        .add(Method::Post, p("/users/{id}/posts"), create)
        .add(Method::Get, p("/posts/{id}"), get)
        .add(Method::Patch, p("/posts/{id}"), patch)
        .add(Method::Delete, p("/posts/{id}"), delete);
}

/// A validated new post body: (title, body), or 422 listing every problem.
pub fn new_post(map: Map<String, Value>) -> Result<(String, String), Error> {
    let mut f = Fields::new(map, &["title", "body"]);
    let title = f.string("title", true, validate::title);
    let body = f.string("body", false, validate::post_body).unwrap_or_default();
    f.finish()?;
    let title = title.ok_or(Error::bad_request("missing title"))?;
    Ok((title, body))
}

/// A validated post patch body: (title, body), each `None` when absent, or
/// 422 listing every problem.
pub fn post_changes(map: Map<String, Value>) -> Result<(Option<String>, Option<String>), Error> {
    let mut f = Fields::new(map, &["title", "body"]);
    let title = f.string("title", false, validate::title);
    let body = f.string("body", false, validate::post_body);
    f.finish()?;
    Ok((title, body))
}

fn list(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let user_id = path_id(ctx)?;
    let mut errors = Vec::new();
    let (page, limit) = paging(req, &mut errors);
    if !errors.is_empty() {
        return Err(Error::BadParams(errors));
    }
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        svc.store.get_user(user_id)?.ok_or(Error::NotFound)?;
        Ok(Response::envelope(200, &svc.store.list_posts(user_id, page, limit)?))
    }))
}

fn create(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let user_id = path_id(ctx)?;
    if caller.user_id != user_id {
        return Err(Error::Forbidden("only the owner can post here"));
    }
    let (title, body) = new_post(validate::json_object(req)?)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let post = svc.store.create_post(user_id, &title, &body)?;
        Ok(envelope_with(201, &post, Some(("Location", format!("/api/v1/posts/{}", post.id)))))
    }))
}

fn get(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let post = svc.store.get_post(id)?.ok_or(Error::NotFound)?;
        Ok(Response::envelope(200, &post))
    }))
}

fn patch(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    let (title, body) = post_changes(validate::json_object(req)?)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let post = svc.store.get_post(id)?.ok_or(Error::NotFound)?;
        if post.user_id != caller.user_id && !caller.admin {
            return Err(Error::Forbidden("not allowed to change this post"));
        }
        let post = svc.store.update_post(id, title.as_deref(), body.as_deref())?.ok_or(Error::NotFound)?;
        Ok(Response::envelope(200, &post))
    }))
}

fn delete(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let post = svc.store.get_post(id)?.ok_or(Error::NotFound)?;
        if post.user_id != caller.user_id && !caller.admin {
            return Err(Error::Forbidden("not allowed to delete this post"));
        }
        svc.store.delete_post(id)?;
        Ok(Response::new(204))
    }))
}
