//! Routes and handlers: what the service answers, independent of transport.
//!
//! [`App::handle`] is the one entry point: it routes a [`Request`], runs the
//! handler and returns a [`Reply`] — a response now, or a [`Job`] for the
//! worker's thread pool. Handlers never see sockets, polls or tokens; the
//! event loop never sees a route. Errors go back as [`Error`] and are
//! rendered by the one mapping in `crate::error`.

mod debug;
mod health;
pub mod router;

use crate::config::Config;
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;

use router::{Match, Params, Router};

/// Work for the pool: runs off the event loop and produces the response.
pub type Job = Box<dyn FnOnce() -> Result<Response, Error> + Send>;

/// A handler's answer.
pub enum Reply {
    /// The response, now.
    Now(Response),
    /// Run this on the worker's pool; its result is the response.
    Later(Job),
}

/// What a handler can see besides the request.
pub struct Ctx<'a> {
    /// The validated configuration.
    pub config: &'a Config,
    /// The worker is draining.
    pub draining: bool,
    /// Path parameters of the matched route.
    pub params: Params<'a>,
}

type Handler = fn(&App, &Request<'_>, &Ctx<'_>) -> Result<Reply, Error>;

/// The application: the route table and what handlers precompute at start.
pub struct App {
    router: Router<Handler>,
    config_body: &'static [u8],
    config_etag: &'static str,
}

impl App {
    /// Build the routes for `config`.
    pub fn new(config: &Config) -> App {
        let mut router: Router<Handler> = Router::default();
        router.add(Method::Get, "/health", health::health).add(Method::Get, "/health/ready", health::ready).add(
            Method::Get,
            "/api/config",
            health::client_config,
        );
        if config.debug.routes {
            debug::routes(&mut router);
        }
        let (body, etag) = health::render_client_config(config);
        // Leaked once per worker: every answer then borrows them, allocation-free.
        let config_body: &'static [u8] = Box::leak(body.into_boxed_slice());
        let config_etag: &'static str = Box::leak(etag.into_boxed_str());
        App { router, config_body, config_etag }
    }

    /// Route and run one request.
    pub fn handle(&self, req: &Request<'_>, config: &Config, draining: bool) -> Result<Reply, Error> {
        match self.router.find(req.method, req.path) {
            Match::Found(h, params) => h(self, req, &Ctx { config, draining, params }),
            Match::MethodNotAllowed(allow) if req.method == Method::Options => {
                let mut r = Response::new(204);
                r.header("Allow", allow);
                Ok(Reply::Now(r))
            }
            Match::MethodNotAllowed(allow) => Err(Error::MethodNotAllowed(allow)),
            Match::NotFound => Err(Error::NotFound),
        }
    }
}
