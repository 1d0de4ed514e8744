//! The phases every request passes before its handler, in this order (nginx-style):
//! redirect to https (`https`), CORS preflight and origin check (`cors`), rate limit
//! (`ratelimit`), API version (`version`); `session` is the authentication phase a handler
//! asks for (who is calling: bearer token or cookie, and the CSRF check). A phase decides
//! from the request and shared state alone and knows no handler; `compress` runs after the
//! handler, on the response (the one phase that rewrites a body: into its content coding).

pub(crate) mod compress;
pub(crate) mod cors;
pub(crate) mod https;
pub(crate) mod ratelimit;
pub(crate) mod session;
pub(crate) mod version;
