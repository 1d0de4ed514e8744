//! `/users` and `/users/{id}`: sign-up, list with filter, sort and paging,
//! read with ETag, replace/patch (If-Match), delete. Permission: self or
//! admin for writes; `role` only by an admin; a new `password` by its owner
//! (with `currentPassword`, guarded like a login) or by an admin.
//!
//! A deletion, a new password or another role voids the account's tokens:
//! the job records it in the workers' table of revocations after the commit
//! and before its answer (`session::revoke`). Every job acting for a caller
//! first asks the store whether the caller's token is still its account's
//! (`session::confirm`).

use std::io::Write;

use serde_json::{Map, Value};

#[cfg(test)]
use crate::app::health::fnv1a;
use crate::app::ratelimit::LoginGuard;
use crate::app::router::Router;
use crate::app::session::{self, Caller};
use crate::app::usermemo::Fill;
use crate::app::validate::{self, Fields, Presence};
use crate::app::{path_id, App, Ctx, Handler, Reply};
use crate::error::{Error, FieldError};
use crate::http::request::{Method, Request};
use crate::http::response::{self, Body, Response};
#[cfg(test)]
use crate::store::User;
use crate::store::{NewUser, Role, UserChanges, UserQuery, UserRef, UserSort};

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

/// The strong ETag of a user's representation: FNV-1a of the user's compact
/// JSON in field order (`{"id":…,"name":…,…}`, what `serde_json::to_vec`
/// makes of a [`User`]), hashed as it is written, without a buffer.
pub fn etag(u: UserRef<'_>) -> response::Value {
    let mut h = Fnv(FNV_OFFSET);
    write_user(&mut h, u, false);
    // 18 bytes: held in place, not allocated.
    response::Value::display(format_args!("\"{:016x}\"", h.0))
}

/// The FNV-1a offset basis (the hash of nothing), as in `health::fnv1a`.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// An `io::Write` that folds what is written into a 64-bit FNV-1a hash,
/// equal to `health::fnv1a` of the concatenated bytes.
struct Fnv(u64);

impl Write for Fnv {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = buf.iter().fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Write `u` as a compact JSON object: its fields in declaration order (as
/// `serde_json` serialises a [`User`]), or `sorted` by name (as a
/// `serde_json::Value` object holds them). Strings are escaped by `serde_json`;
/// keys and numbers are written as bytes (no formatting machinery). Writes
/// into a `Vec` or an [`Fnv`] cannot fail, so their results are not looked at.
fn write_user<W: Write>(w: &mut W, u: UserRef<'_>, sorted: bool) {
    fn key<W: Write>(w: &mut W, first: bool, name: &[u8]) {
        let _ = w.write_all(if first { b"{\"" } else { b",\"" });
        let _ = w.write_all(name);
        let _ = w.write_all(b"\":");
    }
    fn text<W: Write>(w: &mut W, name: &[u8], value: &str) {
        key(w, false, name);
        let _ = serde_json::to_writer(&mut *w, value);
    }
    let age = |w: &mut W, first: bool| {
        key(w, first, b"age");
        match u.age {
            Some(age) => int(w, age),
            None => {
                let _ = w.write_all(b"null");
            }
        }
    };
    let id = |w: &mut W, first: bool| {
        key(w, first, b"id");
        int(w, u.id);
    };
    let role = |w: &mut W| {
        key(w, false, b"role");
        let _ = w.write_all(if u.role == Role::Admin { b"\"admin\"" } else { b"\"user\"" });
    };
    if sorted {
        age(w, true);
        text(w, b"createdAt", u.created_at);
        text(w, b"email", u.email);
        id(w, false);
        text(w, b"name", u.name);
        role(w);
        text(w, b"updatedAt", u.updated_at);
    } else {
        id(w, true);
        text(w, b"name", u.name);
        text(w, b"email", u.email);
        age(w, false);
        role(w);
        text(w, b"createdAt", u.created_at);
        text(w, b"updatedAt", u.updated_at);
    }
    let _ = w.write_all(b"}");
}

/// `n` in decimal, as `serde_json` writes an integer.
fn int<W: Write>(w: &mut W, n: i64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut m = n.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if n < 0 {
        let _ = w.write_all(b"-");
    }
    let _ = w.write_all(&buf[at..]);
}

/// The envelope `{"code":status,"data":user,"message":"OK"|"Created"}` for
/// one user, written once into a buffer of the right size.
///
/// The bytes are exactly what [`Response::envelope`] makes of a [`User`]
/// (it goes through a `serde_json::Value` tree, whose objects sort their
/// keys): the envelope's keys and the user's fields in name order.
pub fn user_envelope(status: u16, u: UserRef<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(200 + u.name.len() + u.email.len());
    out.extend_from_slice(b"{\"code\":");
    int(&mut out, i64::from(status));
    out.extend_from_slice(b",\"data\":");
    write_user(&mut out, u, true);
    out.extend_from_slice(if status == 201 { b",\"message\":\"Created\"}" } else { b",\"message\":\"OK\"}" });
    out
}

/// A user's response: its envelope and an extra header (`ETag`, `Location`).
fn user_response(status: u16, u: UserRef<'_>, header: (&'static str, response::Value)) -> Response {
    let mut r = Response::new(status);
    r.body = Body::Bytes(user_envelope(status, u));
    r.header(header.0, header.1);
    r
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

fn create(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::optional(app, req)?;
    let SignUp { name, email, password, age, role } = sign_up(validate::json_object(req)?)?;
    if role != Role::User && !caller.is_some_and(|c| c.admin) {
        return Err(Error::Forbidden("only an admin can assign a role"));
    }
    let svc = app.svc;
    Ok(ctx.later(move || {
        if let Some(caller) = &caller {
            session::confirm(svc, caller)?;
        }
        let password_hash = svc
            .cpu
            .run(move || svc.passwords.hash(&password))
            .ok_or_else(|| Error::Internal("password hashing failed".into()))??;
        let user =
            svc.store.create_user(&NewUser { name: &name, email: &email, password_hash: &password_hash, age, role })?;
        Ok(user_response(201, user.borrowed(), ("Location", format!("/api/v1/users/{}", user.id).into())))
    }))
}

fn list(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let query = list_query(req)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        Ok(Response::envelope(200, &svc.store.list_users(&query)?))
    }))
}

fn get(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let id = path_id(ctx)?;
    let svc = app.svc;
    let inm = req.header("if-none-match");
    let mut memo = app.user_memo.borrow_mut();
    // Answered here only for a token the loop can vouch for alone (no store check).
    let vouched = session::covered(svc, &caller) && memo.settled_by(caller.read_ms);
    // Rendered before and unchanged since (see `usermemo`): answered here, no pool job.
    if let Some((tag, body, _)) = memo.get(id, &svc.region.users).filter(|_| vouched) {
        if inm.is_some_and(|v| crate::app::health::etag_matches(v, tag.as_bytes())) {
            let mut r = Response::new(304);
            r.header("ETag", tag.clone());
            return Ok(Reply::full(r));
        }
        let mut r = Response::new(200);
        r.body = Body::Bytes(body.to_vec());
        r.header("ETag", tag.clone());
        return Ok(Reply::full(r));
    }
    let fills = memo.open().then(|| svc.user_fills.clone());
    drop(memo);
    let if_none_match = inm.map(<[u8]>::to_vec);
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        // Read before the row: a write committed after it leaves the memo's entry stale.
        let epoch = svc.region.users.get(id);
        // Rendered straight from the row: no `User`, no copy of its text.
        let rendered = svc.store.with_user(id, |user| {
            let tag = etag(user);
            if if_none_match.is_some_and(|v| crate::app::health::etag_matches(&v, tag.as_bytes())) {
                let mut r = Response::new(304);
                r.header("ETag", tag);
                return r;
            }
            if let Some(fills) = &fills {
                let body = user_envelope(200, user);
                let _ = fills.send(Fill { id, epoch, owner: id, all: None, tag: tag.clone(), body: body[..].into() });
                let mut r = Response::new(200);
                r.body = Body::Bytes(body);
                r.header("ETag", tag);
                return r;
            }
            user_response(200, user, ("ETag", tag))
        })?;
        rendered.ok_or(Error::NotFound)
    }))
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

/// A validated replace (PUT) or patch body.
pub struct Edit {
    /// The fields to change; its `password_hash` is filled on the pool, from `password`.
    pub changes: UserChanges,
    /// A new password, in clear (8–128 characters).
    pub password: Option<String>,
    /// The current password, which changing one's own needs.
    pub current_password: Option<String>,
}

/// A validated replace (`full`, PUT) or patch body, or 422 listing every problem.
pub fn user_changes(map: Map<String, Value>, full: bool) -> Result<Edit, Error> {
    let mut f = Fields::new(map, &["name", "email", "age", "role", "password", "currentPassword"]);
    let name = f.string("name", full, validate::name);
    let email = f.string("email", full, validate::email);
    let age = match f.int("age", 0, 150) {
        Presence::Value(a) => Some(Some(a)),
        Presence::Null => Some(None),
        Presence::Absent if full && !f.has("age") => Some(None),
        Presence::Absent => None,
    };
    let role = role_field(&mut f);
    let password = f.string("password", false, validate::password);
    // Checked only with a new password; a client that always sends it is not refused.
    let current_password = f.string("currentPassword", false, validate::any);
    f.finish()?;
    Ok(Edit { changes: UserChanges { name, email, age, role, password_hash: None }, password, current_password })
}

fn changes(app: &App, req: &Request<'_>, ctx: &Ctx<'_>, full: bool) -> Result<Reply, Error> {
    let (caller, id) = writer(app, req, ctx)?;
    let Edit { mut changes, password, current_password } = user_changes(validate::json_object(req)?, full)?;
    if changes.role.is_some() && !caller.admin {
        return Err(Error::Forbidden("only an admin can change a role"));
    }
    // One's own password needs the current one, whose checks count as login attempts
    // (the account's, from this address): a stolen access token cannot guess it for long.
    let own_password = password.is_some() && caller.user_id == id;
    let guard = match (own_password, current_password) {
        (false, _) => None,
        // Who may make the change, not the body's shape (an admin's change of another user's
        // password is the same body): 403, as for a wrong current password.
        (true, None) => return Err(Error::Forbidden("currentPassword is required to change your own password")),
        (true, Some(current)) => {
            let slot = LoginGuard::new(app.svc.config, ctx.client.addr, &format!("#{id}")).take(app.svc.rate)?;
            Some((slot, current))
        }
    };
    let wanted = req.header("if-match").and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned);
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        if let Some(wanted) = wanted {
            let current = svc.store.get_user(id)?.ok_or(Error::NotFound)?;
            if !if_match(&wanted, &etag(current.borrowed())) {
                return Err(Error::PreconditionFailed);
            }
        }
        if let Some((slot, current)) = guard {
            let hash = svc.store.password_hash(id)?.ok_or(Error::NotFound)?;
            let right = svc
                .cpu
                .run(move || svc.passwords.verify(&current, &hash))
                .ok_or_else(|| Error::Internal("password check failed".into()))?;
            if !right {
                slot.failed();
                return Err(Error::Forbidden("current password is wrong"));
            }
        }
        if let Some(password) = password {
            let hash = svc
                .cpu
                .run(move || svc.passwords.hash(&password))
                .ok_or_else(|| Error::Internal("password hashing failed".into()))??;
            changes.password_hash = Some(hash);
        }
        let updated = svc.store.update_user(id, &changes);
        // After the commit, before the answer: memos of this user are stale from now on, and
        // so are its tokens if the password or the role changed.
        if matches!(&updated, Ok(Some(u)) if u.revoked) {
            session::revoke(svc, id);
        }
        svc.region.users.bump(id);
        let user = updated?.ok_or(Error::NotFound)?.user;
        let tag = etag(user.borrowed());
        Ok(user_response(200, user.borrowed(), ("ETag", tag)))
    }))
}

fn replace(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    changes(app, req, ctx, true)
}

fn patch(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    changes(app, req, ctx, false)
}

fn delete(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let (caller, id) = writer(app, req, ctx)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let deleted = svc.store.delete_user(id);
        // After the commit, before the answer: its tokens are void, its memos stale, and so
        // are the memos of every record (what it owned went with it).
        if matches!(deleted, Ok(true)) {
            session::revoke(svc, id);
        }
        svc.region.users.bump(id);
        svc.region.users.bump(crate::app::usermemo::ALL);
        if !deleted? {
            return Err(Error::NotFound);
        }
        Ok(Response::new(204))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, email: &str, age: Option<i64>, role: Role) -> User {
        User {
            id: 42,
            name: name.into(),
            email: email.into(),
            age,
            role,
            created_at: "2026-11-22T10:00:00.123Z".into(),
            updated_at: "2026-11-23T11:30:00.456Z".into(),
            token_gen: 3,
        }
    }

    /// What the envelope and the ETag were before they were written by hand:
    /// a `serde_json::Value` tree, and FNV-1a of `serde_json::to_vec`.
    fn old(status: u16, u: &User) -> (Vec<u8>, String) {
        let message = if status == 201 { "Created" } else { "OK" };
        let env = serde_json::json!({"code": status, "message": message, "data": u});
        let body = serde_json::to_vec(&env).expect("json");
        let tag = format!("\"{:016x}\"", fnv1a(&serde_json::to_vec(u).expect("json")));
        (body, tag)
    }

    #[test]
    fn the_envelope_and_etag_are_byte_for_byte_the_old_ones() {
        let users = [
            user("Alice", "alice@example.com", Some(30), Role::User),
            user("Bob", "bob@example.com", None, Role::Admin),
            user("Ünïcödé \"quoted\" \\ back\nline\ttab\u{1}", "x+y@example.com", Some(0), Role::User),
            user("", "e@x", Some(i64::MAX), Role::Admin),
            user("min", "m@x", Some(i64::MIN), Role::User),
            user("😀 </script>", "a@b", Some(-1), Role::User),
        ];
        for u in &users {
            for status in [200, 201] {
                let (body, tag) = old(status, u);
                assert_eq!(
                    String::from_utf8(user_envelope(status, u.borrowed())).expect("utf8"),
                    String::from_utf8(body).expect("utf8"),
                    "{u:?}"
                );
                assert_eq!(etag(u.borrowed()), tag, "{u:?}");
            }
        }
    }
}
