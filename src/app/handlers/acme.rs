//! `GET /.well-known/acme-challenge/{token}` (RFC 8555 §8.3), routed only with `[tls.acme]`:
//! the key authorization of a pending HTTP-01 challenge as `text/plain`; any other token 404.
//! The answers come from the worker's [`crate::acme::Challenges`], handed over at fork; this
//! file only reads them and must not change or log them.

use crate::app::{App, Ctx, Reply};
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::{Body, Response};

/// The key authorization for the token, or 404.
pub fn http01(app: &App, _: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let token = ctx.params.get(0).ok_or(Error::NotFound)?;
    let answer = app.svc.acme.http.get(token).ok_or(Error::NotFound)?;
    let mut r = Response::new(200);
    r.content_type = "text/plain";
    r.body = Body::Bytes(answer.clone().into_bytes());
    Ok(Reply::full(r))
}
