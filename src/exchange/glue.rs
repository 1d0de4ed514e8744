//! The bridge from a codec to the app: [`Glue`] is the [`Service`] every
//! connection (HTTP/1.1, HTTP/2 or HTTP/3) hands complete requests to, and the
//! engine's [`Host`]. It runs handlers behind the panic boundary
//! ([`panics`]), counts finished requests and open WebSockets in shared
//! memory and writes the access log. The reply goes to the codec whole; what
//! its body needs from the loop (a pool job, upstreams, a stream) the loop
//! takes from the codec afterwards. Whoever drives a codec makes one per call
//! from what the process holds (the app, the configuration, its shared-memory
//! record and metrics).
//!
//! It must not touch a socket, a poll token or framing.

use super::{panics, Host};
use crate::app::{App, Reply};
use crate::config::Config;
use crate::http::request::Request;
use crate::http::service::{Finished, Service};
use crate::shm::metrics::ProcMetrics;
use crate::shm::{ProcRecord, WorkerState};

/// The app, the configuration and this process's shared-memory record and metrics, as
/// one [`Service`] and [`Host`] (the module doc says what it does with them).
pub(crate) struct Glue<'g> {
    app: &'g App,
    config: &'g Config,
    record: &'static ProcRecord,
    metrics: &'static ProcMetrics,
    /// The `/metrics` route slot of the request [`Service::call`] answered last.
    route: u16,
    /// The client of that request, as the app decided it.
    client: Option<std::net::IpAddr>,
}

impl<'g> Glue<'g> {
    pub(crate) fn new(
        app: &'g App,
        config: &'g Config,
        record: &'static ProcRecord,
        metrics: &'static ProcMetrics,
    ) -> Self {
        Glue { app, config, record, metrics, route: crate::shm::metrics::ROUTE_OTHER, client: None }
    }
}

impl Service for Glue<'_> {
    fn call(&mut self, req: &Request<'_>) -> Reply {
        let draining = self.record.state() == WorkerState::Draining;
        let dev = self.config.is_development();
        let (app, route, client) = (self.app, &mut self.route, &mut self.client);
        *route = crate::shm::metrics::ROUTE_OTHER;
        *client = None;
        panics::guard("request handler", || app.handle(req, draining, route, client))
            .unwrap_or_else(|p| Reply::full(p.into_response(dev)))
    }

    fn label(&self) -> u16 {
        self.route
    }

    fn client(&self) -> Option<std::net::IpAddr> {
        self.client
    }

    fn finished(&mut self, done: &Finished<'_>) {
        // The worker is the only writer (the supervisor zeroes it before the worker
        // exists): a plain load and store, no locked read-modify-write per request.
        let requests = &self.record.requests;
        requests.store(requests.load(std::sync::atomic::Ordering::Relaxed) + 1, std::sync::atomic::Ordering::Relaxed);
        self.metrics.record(done.label, done.status, done.elapsed);
        crate::logging::access(done);
    }
}

impl Host for Glue<'_> {
    fn app(&self) -> &App {
        self.app
    }

    fn websocket_opened(&mut self) -> usize {
        let n = self.app.services().stats.ws.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        self.metrics.set_websocket_clients(n);
        self.config.websocket.max_message_bytes
    }
}
