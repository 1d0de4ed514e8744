//! Routes and handlers: what the service answers, independent of transport.
//!
//! [`App::handle`] is the one entry point. A request passes fixed phases
//! (nginx-style): who the client is behind trusted proxies (`crate::http::client`) → https
//! redirect → CORS preflight → rate limit → origin check for unsafe methods → API
//! version → route → handler; then the response is decorated (CORS headers)
//! whether it is ready now, an error, or produced later by a pool [`Job`].
//! Handlers never see sockets, polls or tokens; the event loop never sees a
//! route. Handler errors are [`Error`]s rendered by the one mapping in
//! `crate::error`.

mod cache;
pub mod fixed;
pub mod handlers;
pub mod phases;
pub mod resources;
pub mod router;
pub mod usermemo;
pub mod validate;

// The handlers and phases by their short names, for the routing table below and for each
// other (`crate::app::session`, `crate::app::debug`); outside `app/` they are reached
// through `handlers::`/`phases::`.
use handlers::{
    acme, assets, auth, chat, csp_report, debug, download, events, health, homepage, metrics, openapi, pages, redirect,
    users, ws,
};
use phases::{compress, cors, https, ratelimit, session, version};

use crate::auth::{jwt::Jwt, password::Passwords};
use crate::config::Config;
use crate::error::Error;
use std::net::IpAddr;

use crate::http::client::{self, Client};
use crate::http::reply::Upstream;
use crate::http::request::{Method, Request};
use crate::http::response::Response;
use crate::store::Store;
use crate::upstream::wire::Endpoints;

use router::{Match, Params, Router};

pub use crate::http::reply::{
    Assembled, Body, Call, Fetched, Job, Producer, Relay, RelaySink, Reply, Ticker, WebSocket,
};
pub use handlers::ws::Action as WsAction;

/// A message for the bus, from a pool job to the event loop.
pub type Publish = (crate::bus::Topic, Vec<u8>);

/// Per-worker services handlers use; lives as long as the worker.
pub struct Services {
    /// The validated configuration.
    pub config: &'static Config,
    /// The database (used only from pool jobs).
    pub store: &'static Store,
    /// Access-token signer/verifier.
    pub jwt: Jwt,
    /// Password hashing (only ever run on `cpu`).
    pub passwords: Passwords,
    /// The low-priority lane for CPU-heavy work (password hashing).
    pub cpu: crate::cpu::CpuLane,
    /// Messages to publish on the bus (jobs send; the loop publishes).
    pub publish: crossbeam_channel::Sender<Publish>,
    /// This worker's shared-memory record.
    pub record: &'static crate::shm::ProcRecord,
    /// The whole shared region (read by `/metrics`).
    pub region: &'static crate::shm::Region,
    /// Live counters of this worker's streams (read by `/_debug/streams`).
    pub stats: &'static Stats,
    /// The shared rate-limit table.
    pub rate: &'static crate::shm::ratelimit::RateTable,
    /// The upstreams, resolved before fork.
    pub endpoints: &'static Endpoints,
    /// The upstream-answer cache shared by every worker.
    pub shared_cache: &'static crate::shm::cache::SharedCache,
    /// Rendered users for the loop's memo (`usermemo`; jobs send, the loop takes).
    pub user_fills: crossbeam_channel::Sender<usermemo::Fill>,
    /// The ACME challenge answers this worker was forked with (HTTP-01 is answered here).
    pub acme: std::sync::Arc<crate::acme::Challenges>,
}

/// Live counters of one worker's detached connections.
#[derive(Default)]
pub struct Stats {
    /// Open SSE streams.
    pub sse: std::sync::atomic::AtomicUsize,
    /// Open WebSocket clients.
    pub ws: std::sync::atomic::AtomicUsize,
    /// Room memberships (a client in two rooms counts twice).
    pub members: std::sync::atomic::AtomicUsize,
}

/// What a handler can see besides the request.
pub struct Ctx<'a> {
    /// The worker is draining.
    pub draining: bool,
    /// The client as `[proxy] trusted` lets forkd believe it: what "the client's address"
    /// means to a handler (never `Request::peer`, which may be a proxy).
    pub client: Client,
    /// Path parameters of the matched route.
    pub params: Params<'a>,
    /// The request's decoration, for a response made later ([`Ctx::later`]).
    decor: Decor<'a>,
    config: &'static Config,
    /// [`Ctx::later`] made a job that decorates its own response.
    decorated: &'a std::cell::Cell<bool>,
    /// The matched route pattern's index (what [`App::mount`] looks up).
    route: usize,
}

impl Ctx<'_> {
    /// The response comes from `work`, run on the pool. Its error is rendered
    /// and the request's decoration (CORS, `RateLimit-*`) applied on the pool
    /// too, inside the same box: one allocation per job, not one for the work
    /// and another for wrapping it. The handler returns the [`Reply`] it gets
    /// (after this call, a job made otherwise would not be decorated).
    pub fn later<F>(&self, work: F) -> Reply
    where
        F: FnOnce() -> Result<Response, Error> + Send + 'static,
    {
        let config = self.config;
        let decor = self.decor.to_owned(config);
        self.decorated.set(true);
        Reply::later(Box::new(move || {
            let r = work().unwrap_or_else(|e| render(e, config.is_development()));
            Ok(decor.finish(r, config))
        }))
    }
}

type Handler = fn(&App, &Request<'_>, &Ctx<'_>) -> Result<Reply, Error>;

/// The application: the route table and what handlers precompute at start.
pub struct App {
    router: Router<Handler>,
    /// The declared resource each resource route answers for, by pattern index.
    mounts: resources::routes::Mounts,
    svc: &'static Services,
    /// The bodies fixed for the configuration's life, with their compressed forms.
    fixed: &'static fixed::Fixed,
    /// This worker's cache of upstream answers (the first level).
    homepage_cache: homepage::Shared,
    /// Access tokens this worker verified, until they expire (see `session`).
    verified: std::cell::RefCell<session::Verified>,
    /// Users rendered by the pool and unchanged since (see `usermemo`).
    user_memo: std::cell::RefCell<usermemo::UserMemo>,
    /// The `/metrics` label of each route slot (`other`, then the patterns).
    route_labels: Vec<&'static str>,
    /// `Alt-Svc` for responses over TLS when HTTP/3 is on (`h3=":port"; ma=...`).
    alt_svc: Option<&'static str>,
}

/// The `Alt-Svc` value announcing HTTP/3 on `config`'s UDP port; `None` when HTTP/3 is off.
pub fn alt_svc_value(config: &Config) -> Option<String> {
    let addr = config.http3.listen?;
    Some(format!("h3=\":{}\"; ma={}", addr.port(), config.http3.alt_svc_max_age))
}

impl App {
    /// Build the routes.
    pub fn new(svc: &'static Services, user_memo: usermemo::UserMemo, fixed: &'static fixed::Fixed) -> App {
        let config = svc.config;
        let router = routes(config);
        let mounts = resources::routes::mounts(&router, &config.resources);
        let route_labels = metrics::route_labels(&router);
        if router.patterns().count() >= crate::shm::metrics::ROUTES {
            log::warn!("more route patterns than metrics slots: the last ones count as `other`");
        }
        pages::prepare();
        let homepage_cache = std::rc::Rc::new(std::cell::RefCell::new(cache::Lru::new(
            config.upstreams.cache_entries,
            cache::MAX_BYTES,
        )));
        // Leaked once per worker, like the client configuration.
        let alt_svc = alt_svc_value(config).map(|v| &*Box::leak(v.into_boxed_str()));
        App {
            router,
            mounts,
            svc,
            fixed,
            homepage_cache,
            verified: Default::default(),
            user_memo: std::cell::RefCell::new(user_memo),
            route_labels,
            alt_svc,
        }
    }

    /// The services this app runs on.
    pub fn services(&self) -> &'static Services {
        self.svc
    }

    /// Run one request through the phases; errors are rendered here, so the
    /// decoration (CORS) applies to them too. `route` gets the request's
    /// `/metrics` route slot (`shm::metrics::ROUTE_OTHER` when no pattern
    /// matched) before any handler runs, so it is known even if one panics.
    pub fn handle(&self, req: &Request<'_>, draining: bool, route: &mut u16, who: &mut Option<IpAddr>) -> Reply {
        // Routed first, so that every answer (preflight, 429, 403) is
        // labelled with the path's pattern in `/metrics`.
        let found = self.router.find(req.method, req.path);
        *route = match found {
            Match::Found(_, _, i) | Match::MethodNotAllowed(_, i) => metrics::route_slot(i),
            Match::NotFound => crate::shm::metrics::ROUTE_OTHER,
        };
        let config = self.svc.config;
        let client = client::decide(req.peer, req.secure, &req.headers, &config.proxy.trusted);
        *who = Some(client.addr);
        if let Some(r) = https::redirect(config, req, client.secure) {
            return Reply::full(r);
        }
        let dev = config.is_development();
        // HTTP/3 is announced on forkd's own UDP port: only to a client that reached this
        // TLS listener itself, never through a proxy that terminated TLS.
        let alt_svc = if req.secure { self.alt_svc } else { None };
        let mut decor =
            Decor { cors: cors::allowed_origin(config, req), rate: None, alt_svc, path: req.path, fields: req.headers };
        let decorated = std::cell::Cell::new(false);
        let reply = match cors::preflight(decor.cors, req) {
            Some(r) => Ok(r),
            None => match ratelimit::check(config, self.svc.rate, req, client.addr) {
                Ok(rate) => {
                    decor.rate = rate;
                    let params = Params::default();
                    self.route(
                        req,
                        found,
                        Ctx { draining, client, params, decor, config, decorated: &decorated, route: 0 },
                    )
                }
                Err(e) => {
                    if let Error::TooManyRequests { decision, .. } = &e {
                        decor.rate = *decision;
                    }
                    Err(e)
                }
            },
        };
        let Reply { head, body } = match reply {
            Ok(reply) => reply,
            Err(e) => return Reply::full(decor.apply(render(e, dev), config)),
        };
        match body {
            Body::Full => {
                let head = decor.apply(head, config);
                if !compress::worth_a_look(&head, config) {
                    return Reply::full(head);
                }
                let plan = compress::Plan::new(config, req.path, req.headers);
                match plan.on_loop(head, config, &self.fixed.forms) {
                    compress::OnLoop::Send(r) => Reply::full(r),
                    // Compressed on the pool: the loop never compresses per request.
                    compress::OnLoop::ToPool(r) => Reply::later(Box::new(move || Ok(plan.finish(r, config)))),
                }
            }
            // A WebSocket's head is not sent: it carries the fields for a refusal of the
            // handshake, which the codec checks.
            Body::Producer(_) | Body::File(_) | Body::WebSocket(_) => Reply { head: decor.apply(head, config), body },
            // Made by `Ctx::later`: it decorates its own response.
            Body::Job(job) if decorated.get() => Reply::later(job),
            Body::Job(job) => {
                let decor = decor.to_owned(config);
                Reply::later(Box::new(move || {
                    let r = job().unwrap_or_else(|e| render(e, dev));
                    Ok(decor.finish(r, config))
                }))
            }
            Body::Upstream(Upstream::Call(call)) => {
                let decor = decor.to_owned(config);
                let finish = call.finish;
                Reply::call(Call {
                    requests: call.requests,
                    finish: Box::new(move |results| {
                        let r = match finish(results) {
                            Ok(Assembled::Now(r)) => r,
                            Ok(Assembled::Later(job)) => {
                                return Ok(Assembled::Later(Box::new(move || {
                                    let r = job().unwrap_or_else(|e| render(e, dev));
                                    Ok(decor.finish(r, config))
                                })))
                            }
                            Err(e) => render(e, dev),
                        };
                        Ok(decor.assembled(r, config))
                    }),
                })
            }
            Body::Upstream(Upstream::Relay(relay)) => Reply::relay(Relay {
                request: relay.request,
                sink: Box::new(Decorated { inner: relay.sink, decor: decor.to_owned(config), config }),
            }),
        }
    }

    /// What a new SSE stream starts with.
    pub fn sse_preamble(&self) -> Vec<u8> {
        events::preamble(self)
    }

    /// A heartbeat event.
    pub fn sse_heartbeat(&self) -> Vec<u8> {
        events::heartbeat()
    }

    /// The SSE event for a notification from the bus, with its id.
    pub fn sse_notification(&self, payload: &[u8]) -> Option<(i64, Vec<u8>)> {
        events::notification_event(payload, self.svc.config.debug.routes)
    }

    /// Pool work replaying the events after `after` that `audience` may see.
    pub fn sse_replay(
        &self,
        after: i64,
        audience: &crate::resources::audience::Audience,
    ) -> Box<dyn FnOnce() -> (Vec<u8>, i64) + Send> {
        events::replay(self, after, audience.clone())
    }

    /// The SSE event for a change from the bus: its id, its resource's index in the registry,
    /// the record's owner, and the rendered event.
    pub fn sse_change(&self, payload: &[u8]) -> Option<events::LiveChange> {
        events::change_event(&self.svc.config.resources, payload)
    }

    /// What WebSocket `ws` says first, if anything.
    pub fn ws_greeting(&self, ws: &WebSocket) -> Option<String> {
        ws::greeting(ws)
    }

    /// What message `m` on WebSocket `ws` asks for (an echo, a reply, room work).
    pub fn ws_message(&self, ws: &WebSocket, m: &crate::proto::Message) -> WsAction {
        ws::on_message(ws, m, self.svc.config.debug.routes)
    }

    /// The error message a WebSocket's join beyond `max` rooms gets.
    pub fn ws_too_many_rooms(&self, max: usize) -> String {
        ws::too_many_rooms(max)
    }

    /// The SSE heartbeat interval.
    pub fn sse_heartbeat_every(&self) -> std::time::Duration {
        self.svc.config.sse.heartbeat
    }

    /// The declared resource the matched route answers for (404 on a built-in route).
    fn mount(&self, ctx: &Ctx<'_>) -> Result<resources::routes::Mount, Error> {
        self.mounts.get(ctx.route).ok_or(Error::NotFound)
    }

    /// Route to the handler; `ctx` comes with empty path parameters, filled here.
    fn route<'r>(&self, req: &Request<'r>, found: Match<'_, 'r, Handler>, ctx: Ctx<'r>) -> Result<Reply, Error> {
        cors::check_origin(self.svc.config, req)?;
        version::check(req, &self.svc.config.resources)?;
        match found {
            Match::Found(h, params, route) => h(self, req, &Ctx { params, route, ..ctx }),
            Match::MethodNotAllowed(allow, _) if req.method == Method::Options => {
                let mut r = Response::new(204);
                r.header("Allow", allow);
                Ok(Reply::full(r))
            }
            Match::MethodNotAllowed(allow, _) => Err(Error::MethodNotAllowed(allow)),
            Match::NotFound => Err(Error::NotFound),
        }
    }
}

/// The route table for `config`: every route the service answers.
fn routes(config: &Config) -> Router<Handler> {
    let mut router: Router<Handler> = Router::default();
    router
        .add(Method::Get, "/health", health::health)
        .add(Method::Get, "/health/ready", health::ready)
        .add(Method::Get, "/api/config", health::client_config)
        .add(Method::Get, "/api/events", events::events)
        .add(Method::Get, "/api/openapi.json", openapi::openapi)
        .add(Method::Get, "/api/docs", openapi::docs);
    router
        .add(Method::Get, "/", pages::index)
        .add(Method::Get, "/favicon.ico", pages::favicon)
        .add(Method::Get, "/static/{name}", pages::static_file)
        .add(Method::Get, "/redirect", redirect::redirect)
        .add(Method::Post, "/csp-report", csp_report::report);
    if config.tls.acme.is_some() {
        router.add(Method::Get, "/.well-known/acme-challenge/{token}", acme::http01);
    }
    // Versioned resources answer under /api/v1 and, version negotiated, under /api.
    for base in ["/api/v1", "/api"] {
        users::routes(&mut router, base);
        resources::routes::add(&mut router, &config.resources, base);
        auth::routes(&mut router, base);
        events::routes(&mut router, base);
    }
    ws::routes(&mut router, config.websocket.echo);
    download::routes(&mut router);
    homepage::routes(&mut router);
    chat::routes(&mut router);
    metrics::routes(&mut router);
    if config.debug.routes {
        debug::routes(&mut router);
    }
    router
}

/// A relay whose responses (head or error) get the request's decoration.
struct Decorated {
    inner: Box<dyn RelaySink>,
    decor: OwnedDecor,
    config: &'static Config,
}

impl RelaySink for Decorated {
    fn head(&mut self, status: u16, content_type: Option<&str>) -> Result<(), Error> {
        self.inner.head(status, content_type)
    }
    fn body(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        self.inner.body(bytes, out)
    }
    fn ended(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        self.inner.ended(out)
    }
    fn response(&mut self) -> Response {
        self.decor.apply(self.inner.response(), self.config)
    }
    fn failed(&mut self, error: &Error, out: &mut Vec<u8>) {
        self.inner.failed(error, out)
    }
    fn error(&mut self, e: Error) -> Response {
        self.decor.apply(render(e, self.config.is_development()), self.config)
    }
}

/// Headers every response of a request gets, whenever it is produced: the
/// allow-listed `Origin` (borrowed from the request), the rate-limit decision,
/// and over TLS with HTTP/3 on, `Alt-Svc` (RFC 7838) naming the UDP port. The
/// request's path and fields are kept for the compression phase of a response
/// made later (read only then: the hot path never negotiates).
#[derive(Clone, Copy)]
struct Decor<'r> {
    cors: Option<&'r str>,
    rate: Option<crate::shm::ratelimit::Decision>,
    alt_svc: Option<&'static str>,
    path: &'r str,
    fields: crate::http::fields::Fields<'r>,
}

impl Decor<'_> {
    fn apply(&self, r: Response, config: &Config) -> Response {
        decorate(r, self.cors, self.rate.as_ref(), self.alt_svc, config)
    }

    /// The decoration for a response made after the request is gone (a job,
    /// upstream results): the origin copied, only when there is one, and what
    /// the request allows the response's body to be compressed with.
    fn to_owned(self, config: &Config) -> OwnedDecor {
        OwnedDecor {
            cors: self.cors.map(str::to_owned),
            rate: self.rate,
            alt_svc: self.alt_svc,
            compress: compress::Plan::new(config, self.path, self.fields),
        }
    }
}

fn decorate(
    mut r: Response,
    cors: Option<&str>,
    rate: Option<&crate::shm::ratelimit::Decision>,
    alt_svc: Option<&'static str>,
    config: &Config,
) -> Response {
    if let Some(origin) = cors {
        cors::decorate(&mut r, origin);
    }
    if let Some(d) = rate {
        ratelimit::decorate(&mut r, config, d);
    }
    if let Some(v) = alt_svc {
        r.header("Alt-Svc", v);
    }
    r
}

/// [`Decor`] that outlives the request.
struct OwnedDecor {
    cors: Option<String>,
    rate: Option<crate::shm::ratelimit::Decision>,
    alt_svc: Option<&'static str>,
    compress: compress::Plan,
}

impl OwnedDecor {
    fn apply(&self, r: Response, config: &Config) -> Response {
        decorate(r, self.cors.as_deref(), self.rate.as_ref(), self.alt_svc, config)
    }

    /// A pool job's response: decorated, then compressed (on the pool) as the request allows.
    fn finish(&self, r: Response, config: &Config) -> Response {
        self.compress.finish(self.apply(r, config), config)
    }

    /// A response assembled on the loop from upstream results: decorated, and sent at once
    /// unless its body is to be compressed, which a pool job does, as for a cached answer.
    fn assembled(self, r: Response, config: &'static Config) -> Assembled {
        let r = self.apply(r, config);
        if !compress::worth_a_look(&r, config) {
            return Assembled::Now(r);
        }
        // No fixed body comes from upstream results: nothing precompressed to choose from.
        match self.compress.on_loop(r, config, compress::Precompressed::NONE) {
            compress::OnLoop::Send(r) => Assembled::Now(r),
            compress::OnLoop::ToPool(r) => Assembled::Later(Box::new(move || Ok(self.compress.finish(r, config)))),
        }
    }
}

/// Render an error (logging the detail of internal ones).
pub fn render(e: Error, development: bool) -> Response {
    if let Error::Internal(detail) = &e {
        log::error!("internal error: {detail}");
    }
    e.into_response(development)
}

/// A success envelope with an extra header, e.g. `Location` or `ETag`.
fn envelope_with(status: u16, data: &impl serde::Serialize, header: Option<(&'static str, String)>) -> Response {
    let mut r = Response::envelope(status, data);
    if let Some((k, v)) = header {
        r.header(k, v);
    }
    r
}

/// Parse a numeric path id; anything else is 404 (no such resource).
fn path_id(ctx: &Ctx<'_>) -> Result<i64, Error> {
    ctx.params.get(0).and_then(|s| s.parse::<i64>().ok()).filter(|v| *v > 0).ok_or(Error::NotFound)
}
