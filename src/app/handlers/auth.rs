//! `/auth/login`, `/auth/refresh`, `/auth/logout`, `/auth/me` (CONTRACT §5).
//!
//! Login verifies the password on the pool and answers "invalid credentials"
//! after the same argon2 work whether the e-mail exists or not. Refresh
//! tokens are random, stored only as hashes and rotated on every use; a
//! spent one presented again revokes its whole family.
//!
//! Every token is bound to the account as read from the store: an access
//! token carries its token generation and the instant it was read (taken
//! before the read, so that a change committed after it is seen as later);
//! a refresh-token family keeps the generation of its login and stops
//! rotating once the account's moves on (see `session`).

use serde_json::{Map, Value};

use crate::app::ratelimit::LoginGuard;
use crate::app::router::Router;
use crate::app::session;
use crate::app::validate::{self, Fields};
use crate::app::{App, Ctx, Handler, Reply};
use crate::auth::jwt::{now_ms, Subject};
use crate::auth::tokens;
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;
use crate::store::Rotation;

/// Register the routes under `base`.
pub fn routes(r: &mut Router<Handler>, base: &'static str) {
    let p = |s: &str| -> &'static str { Box::leak(format!("{base}{s}").into_boxed_str()) };
    r.add(Method::Post, p("/auth/login"), login)
        .add(Method::Post, p("/auth/refresh"), refresh)
        .add(Method::Post, p("/auth/logout"), logout)
        .add(Method::Get, p("/auth/me"), me);
}

/// A login body: (email, password), or 422 listing every problem.
pub fn credentials(map: Map<String, Value>) -> Result<(String, String), Error> {
    let mut f = Fields::new(map, &["email", "password"]);
    let email = f.string("email", true, validate::any);
    let password = f.string("password", true, validate::any);
    f.finish()?;
    let (Some(email), Some(password)) = (email, password) else { return Err(Error::bad_request("missing fields")) };
    Ok((email, password))
}

/// The `refreshToken` of a refresh or logout body, if there is one, or 422.
pub fn refresh_body(map: Map<String, Value>) -> Result<Option<String>, Error> {
    let mut f = Fields::new(map, &["refreshToken"]);
    let token = f.string("refreshToken", false, validate::any);
    f.finish()?;
    Ok(token)
}

fn login(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let (email, password) = credentials(validate::json_object(req)?)?;
    // The attempt's slot is taken before any password is checked (429 when none is left).
    let slot = LoginGuard::new(app.svc.config, ctx.client.addr, &email).take(app.svc.rate)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        let (read_at, row) = read_clear_of_revocations(
            || Ok(svc.store.user_by_email(&email)?),
            |row| row.as_ref().map(|(user, _)| user.id),
            |id, at| svc.region.revoked.revoked(id, at),
            now_ms,
        )?;
        let (user, hash) = match row {
            Some((user, hash)) => (Some(user), Some(hash)),
            None => (None, None),
        };
        // The same argon2 work whether the e-mail exists or not, on the CPU lane.
        let verified = svc
            .cpu
            .run(move || match hash {
                Some(h) => svc.passwords.verify(&password, &h),
                None => svc.passwords.verify_dummy(&password),
            })
            .ok_or_else(|| Error::Internal("password check failed".into()))?;
        let user = match user {
            Some(user) if verified => user,
            _ => {
                slot.failed();
                return Err(Error::Unauthorized("invalid credentials"));
            }
        };
        drop(slot); // a success gives its slot back
        let who = Subject { user_id: user.id, role: user.role.as_str(), name: &user.name, gen: user.token_gen };
        let (access, expires_in) = access_token(svc, &who, read_at)?;
        let (refresh, hash) = tokens::new_refresh_token();
        let expires = (session::now_unix() + svc.config.auth.refresh_ttl.as_secs()) as i64;
        svc.store.insert_refresh(&hash, &tokens::new_family(), user.id, user.token_gen, expires)?;
        Ok(token_response(svc, &access, expires_in, &refresh))
    }))
}

/// How many times [`read_clear_of_revocations`] reads again.
const REREADS: u32 = 3;

/// An account row read by `read`, and the instant (ms, `now`, taken before the read) that
/// its token will carry. The table of revocations voids the tokens of an account read at
/// or before the instant a change to it was recorded; a read in the same millisecond as
/// that record cannot be told from one before the change, so its token would be void the
/// moment it was made (a login right after an admin changed the role failed so). When
/// `revoked` says so for the account `id` names, the row is read again 1 ms later, when
/// the clock is past the record and the read sees the change (up to [`REREADS`] times; a
/// pool job, never the event loop).
fn read_clear_of_revocations<T>(
    mut read: impl FnMut() -> Result<T, Error>,
    id: impl Fn(&T) -> Option<i64>,
    revoked: impl Fn(i64, u64) -> bool,
    mut now: impl FnMut() -> u64,
) -> Result<(u64, T), Error> {
    let mut tries = 0;
    loop {
        let read_at = now();
        let row = read()?;
        match id(&row) {
            Some(id) if tries < REREADS && revoked(id, read_at) => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            _ => return Ok((read_at, row)),
        }
    }
}

/// An access token for `who`, whose row was read at `read_at` (ms).
fn access_token(svc: &crate::app::Services, who: &Subject<'_>, read_at: u64) -> Result<(String, u64), Error> {
    // Revocations are kept for as long as the longest token any worker issues lives.
    svc.region.revoked.note_ttl(session::ttl_ms(svc));
    Ok(svc.jwt.issue(who, read_at)?)
}

fn token_response(svc: &crate::app::Services, access: &str, expires_in: u64, refresh: &str) -> Response {
    let data = serde_json::json!({
        "accessToken": access, "tokenType": "Bearer", "expiresIn": expires_in, "refreshToken": refresh,
    });
    let mut r = Response::envelope(200, &data);
    session::set_cookies(&mut r, svc.config, refresh, &tokens::new_csrf_token());
    r
}

/// The refresh token of a request: from the JSON body, else from the cookie
/// (which then needs the CSRF double submit).
fn presented_token(req: &Request<'_>) -> Result<Option<String>, Error> {
    if !req.body.is_empty() {
        let token = refresh_body(validate::json_object(req)?)?;
        if token.is_some() {
            return Ok(token);
        }
    }
    match session::cookie(req, "refresh_token").filter(|t| !t.is_empty()) {
        Some(t) => {
            session::check_csrf(req)?;
            Ok(Some(t.to_owned()))
        }
        None => Ok(None),
    }
}

fn refresh(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let old = presented_token(req)?.ok_or(Error::Unauthorized("token required"))?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        let now = now_ms() / 1000;
        let (refresh, new_hash) = tokens::new_refresh_token();
        let expires = (now + svc.config.auth.refresh_ttl.as_secs()) as i64;
        match svc.store.rotate_refresh(&tokens::hash_token(&old), &new_hash, now as i64, expires)? {
            Rotation::Rotated { user_id, gen } => {
                // A change committed since the rotation moved the generation on: the token
                // would be void at once, so none is made.
                let (read_at, user) = read_clear_of_revocations(
                    || Ok(svc.store.get_user(user_id)?),
                    |_| Some(user_id),
                    |id, at| svc.region.revoked.revoked(id, at),
                    now_ms,
                )?;
                let user = user.filter(|u| u.token_gen == gen).ok_or(Error::Unauthorized("invalid token"))?;
                let who = Subject { user_id, role: user.role.as_str(), name: &user.name, gen };
                let (access, expires_in) = access_token(svc, &who, read_at)?;
                Ok(token_response(svc, &access, expires_in, &refresh))
            }
            Rotation::Reused => {
                log::warn!("refresh token re-used: family revoked");
                Err(Error::Unauthorized("invalid token"))
            }
            Rotation::Invalid => Err(Error::Unauthorized("invalid token")),
        }
    }))
}

fn logout(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let token = presented_token(req)?;
    let svc = app.svc;
    Ok(ctx.later(move || {
        if let Some(t) = token {
            svc.store.revoke_family(&tokens::hash_token(&t))?;
        }
        let mut r = Response::new(204);
        session::clear_cookies(&mut r, svc.config);
        Ok(r)
    }))
}

fn me(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let caller = session::require(app, req)?;
    let user_id = caller.user_id;
    let svc = app.svc;
    Ok(ctx.later(move || {
        session::confirm(svc, &caller)?;
        let rendered = svc.store.with_user(user_id, |user| {
            let mut r = Response::new(200);
            r.body = crate::http::response::Body::Bytes(crate::app::users::user_envelope(200, user));
            r
        })?;
        rendered.ok_or(Error::Unauthorized("invalid token"))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A `read` for [`read_clear_of_revocations`] that counts its calls in `reads` and
    /// returns the count as the row.
    fn counting(reads: &Cell<u32>) -> impl FnMut() -> Result<u32, Error> + '_ {
        move || {
            reads.set(reads.get() + 1);
            Ok(reads.get())
        }
    }

    /// An account changed at ms 100: a read at 100 is read again, one at 101 is not.
    #[test]
    fn a_read_in_the_millisecond_of_a_revocation_is_made_again() {
        let clock = Cell::new(100);
        let reads = Cell::new(0);
        let (at, row) = read_clear_of_revocations(
            counting(&reads),
            |_| Some(7),
            |id, at| id == 7 && at <= 100,
            || {
                let t = clock.get();
                clock.set(t + 1);
                t
            },
        )
        .expect("read");
        assert_eq!((at, row), (101, 2), "read again at 101, the second row kept");
        let (at, row) = read_clear_of_revocations(|| Ok(()), |_| Some(7), |_, at| at <= 100, || 101).expect("read");
        assert_eq!((at, row, reads.get()), (101, (), 2), "a read after the record is kept");
    }

    /// A revocation that keeps coming back (another account sharing its slot) does not
    /// hold the job: after [`REREADS`] reads again, the last row is used.
    #[test]
    fn reads_again_a_bounded_number_of_times() {
        let reads = Cell::new(0);
        let (_, row) = read_clear_of_revocations(counting(&reads), |_| Some(7), |_, _| true, || 5).expect("read");
        assert_eq!(row, REREADS + 1);
        // No account (an unknown e-mail): nothing to check, one read.
        let (_, none) = read_clear_of_revocations(|| Ok(None::<i64>), |r| *r, |_, _| true, || 5).expect("read");
        assert_eq!(none, None);
    }
}
