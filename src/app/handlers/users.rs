//! `/users` and `/users/{id}` (CONTRACT §5): sign-up, list with filter,
//! sort and paging, read with ETag, replace/patch (If-Match), delete.
//! Permission: self or admin for writes; `role` only by an admin.

use serde_json::{Map, Value};

use crate::app::health::fnv1a;
use crate::app::router::Router;
use crate::app::session::{self, Caller};
use crate::app::validate::{self, Fields, Presence};
use crate::app::{envelope_with, path_id, App, Ctx, Handler, Reply};
use crate::error::{Error, FieldError};
use crate::http::request::{Method, Request};
use crate::http::response::Response;
use crate::store::{NewUser, Role, User, UserChanges, UserQuery, UserSort};

/// Register the routes under `base`.
pub fn routes(r: &mut Router<Handler>, base: &'static str) {
    let p = |s: &str| -> &'static str { Box::leak(format!("{base}{s}").into_boxed_str()) };
    r.add(Method::Post, p("/users"), create)
        .add(Method::Get, p("/users"), list)
        .add(Method::Get, p("/users/{id}"), get)
        .add(Method::Put, p("/users/{id}"), replace)
        .add(Method::Patch, p("/users/{id}"), patch)
        .add(Method::Delete, p("/users/{id}"), delete);
}

/// The strong ETag of a user's representation.
pub fn etag(u: &User) -> String {
    format!("\"{:016x}\"", fnv1a(&serde_json::to_vec(u).unwrap_or_default()))
}

/// `If-Match` (strong comparison, RFC 9110 §13.1.1): `*` or an exact tag.
pub fn if_match(header: &str, etag: &str) -> bool {
    header.split(',').map(str::trim).any(|t| t == "*" || t == etag)
}

fn role_field(f: &mut Fields) -> Option<Role> {
    let raw = f.string("role", false, validate::any)?;
    let role = Role::parse(&raw);
    if role.is_none() {
        f.error("role", "must be user or admin");
    }
    role
}

/// Page and limit query parameters (shared with posts).
pub fn paging(req: &Request<'_>, errors: &mut Vec<FieldError>) -> (u32, u32) {
    let mut num = |key: &str, default: u32, min: u32, max: u32| match req.query_param(key) {
        None => default,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (min..=max).contains(&n) => n,
            _ => {
                errors.push(FieldError::new(key, format!("must be an integer from {min} to {max}")));
                default
            }
        },
    };
    (num("page", 1, 1, 1_000_000), num("limit", 20, 1, 100))
}

fn list_query(req: &Request<'_>) -> Result<UserQuery, Error> {
    let mut errors = Vec::new();
    let decoded = |key: &str, errors: &mut Vec<FieldError>| {
        let raw = req.query_param(key)?;
        let v = validate::decode_query(raw);
        if v.is_none() {
            errors.push(FieldError::new(key, "is not valid percent-encoded UTF-8"));
        }
        v
    };
    let role = decoded("role", &mut errors).and_then(|r| {
        let role = Role::parse(&r);
        if role.is_none() {
            errors.push(FieldError::new("role", "must be user or admin"));
        }
        role
    });
    let q = decoded("q", &mut errors);
    let mut sort = Vec::new();
    if let Some(s) = decoded("sort", &mut errors) {
        for part in s.split(',') {
            let (desc, name) = match part.strip_prefix('-') {
                Some(n) => (true, n),
                None => (false, part),
            };
            match UserSort::parse(name) {
                Some(f) => sort.push((f, desc)),
                None => errors.push(FieldError::new("sort", format!("unknown sort field '{name}'"))),
            }
        }
    }
    let (page, limit) = paging(req, &mut errors);
    if !errors.is_empty() {
        return Err(Error::BadParams(errors));
    }
    Ok(UserQuery { role, q, sort, page, limit })
}

/// A validated sign-up body (`POST /users`).
pub struct SignUp {
    /// Display name.
    pub name: String,
    /// E-mail address.
    pub email: String,
    /// The password in clear (hashed before it is stored).
    pub password: String,
    /// Age, if given.
    pub age: Option<i64>,
    /// Requested role (`user` when absent).
    pub role: Role,
}

/// The sign-up body, or 422 listing every problem.
pub fn sign_up(map: Map<String, Value>) -> Result<SignUp, Error> {
    let mut f = Fields::new(map, &["name", "email", "password", "age", "role"]);
    let name = f.string("name", true, validate::name);
    let email = f.string("email", true, validate::email);
    let password = f.string("password", true, validate::password);
    let age = f.int("age", 0, 150);
    let role = role_field(&mut f).unwrap_or(Role::User);
    f.finish()?;
    let (Some(name), Some(email), Some(password)) = (name, email, password) else {
        return Err(Error::bad_request("missing fields"));
    };
    let age = match age {
        Presence::Value(a) => Some(a),
        _ => None,
    };
    Ok(SignUp { name, email, password, age, role })
}

fn create(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::optional(app, req)?;
    let SignUp { name, email, password, age, role } = sign_up(validate::json_object(req)?)?;
    if role != Role::User && !caller.is_some_and(|c| c.admin) {
        return Err(Error::Forbidden("only an admin can assign a role"));
    }
    let svc = app.svc;
    Ok(Reply::later(Box::new(move || {
        let password_hash = svc
            .cpu
            .run(move || svc.passwords.hash(&password))
            .ok_or_else(|| Error::Internal("password hashing failed".into()))??;
        let user =
            svc.store.create_user(&NewUser { name: &name, email: &email, password_hash: &password_hash, age, role })?;
        Ok(envelope_with(201, &user, Some(("Location", format!("/api/v1/users/{}", user.id)))))
    })))
}

fn list(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    session::require(app, req)?;
    let query = list_query(req)?;
    let svc = app.svc;
    Ok(Reply::later(Box::new(move || Ok(Response::envelope(200, &svc.store.list_users(&query)?)))))
}

fn get(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    session::require(app, req)?;
    let id = path_id(ctx)?;
    let if_none_match = req.header("if-none-match").map(|v| v.to_vec());
    let svc = app.svc;
    Ok(Reply::later(Box::new(move || {
        let user = svc.store.get_user(id)?.ok_or(Error::NotFound)?;
        let tag = etag(&user);
        if if_none_match.is_some_and(|v| crate::app::health::etag_matches(&v, tag.as_bytes())) {
            let mut r = Response::new(304);
            r.header("ETag", tag);
            return Ok(r);
        }
        Ok(envelope_with(200, &user, Some(("ETag", tag))))
    })))
}

/// Who may write user `id`; the caller.
fn writer(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<(Caller, i64), Error> {
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    if caller.user_id != id && !caller.admin {
        return Err(Error::Forbidden("not allowed to change this user"));
    }
    Ok((caller, id))
}

/// A validated replace (`full`, PUT) or patch body, or 422 listing every problem.
pub fn user_changes(map: Map<String, Value>, full: bool) -> Result<UserChanges, Error> {
    let mut f = Fields::new(map, &["name", "email", "age", "role"]);
    let name = f.string("name", full, validate::name);
    let email = f.string("email", full, validate::email);
    let age = match f.int("age", 0, 150) {
        Presence::Value(a) => Some(Some(a)),
        Presence::Null => Some(None),
        Presence::Absent if full && !f.has("age") => Some(None),
        Presence::Absent => None,
    };
    let role = role_field(&mut f);
    f.finish()?;
    Ok(UserChanges { name, email, age, role })
}

fn changes(app: &App, req: &Request<'_>, ctx: &Ctx<'_>, full: bool) -> Result<Reply, Error> {
    let (caller, id) = writer(app, req, ctx)?;
    let changes = user_changes(validate::json_object(req)?, full)?;
    if changes.role.is_some() && !caller.admin {
        return Err(Error::Forbidden("only an admin can change a role"));
    }
    let wanted = req.header("if-match").and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned);
    let svc = app.svc;
    Ok(Reply::later(Box::new(move || {
        if let Some(wanted) = wanted {
            let current = svc.store.get_user(id)?.ok_or(Error::NotFound)?;
            if !if_match(&wanted, &etag(&current)) {
                return Err(Error::PreconditionFailed);
            }
        }
        let user = svc.store.update_user(id, &changes)?.ok_or(Error::NotFound)?;
        let tag = etag(&user);
        Ok(envelope_with(200, &user, Some(("ETag", tag))))
    })))
}

fn replace(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    changes(app, req, ctx, true)
}

fn patch(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    changes(app, req, ctx, false)
}

fn delete(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let (_, id) = writer(app, req, ctx)?;
    let svc = app.svc;
    Ok(Reply::later(Box::new(move || {
        if !svc.store.delete_user(id)? {
            return Err(Error::NotFound);
        }
        Ok(Response::new(204))
    })))
}
