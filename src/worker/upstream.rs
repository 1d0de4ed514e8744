//! Upstream calls from the event loop: which exchange waits for which upstream connection.
//!
//! The connections, their idle pools, the coalescing of identical requests, their
//! deadlines and retries are one value, [`Upstreams`](crate::upstream::pool::Upstreams).
//! This file is its seat in the loop: it registers its sockets (tokens [`Tok::Upstream`])
//! and queues its deadlines in the worker's timers ([`UpLoop`]), starts a handler's calls,
//! and delivers what a connection's pass produced to the exchange waiting for it. A
//! *gather* (`Upstream::Call`: requests in parallel, one response built from all results)
//! is finished here; a *relay* (`Upstream::Relay`: one upstream stream forwarded as it
//! arrives) is `relay.rs`'s. Cancellation: when the client exchange ends, every upstream
//! socket it owns is closed at once, so the upstream sees the connection go. What the
//! answers mean lives in the app.

use std::io;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Interest, Registry};

use super::conn::Conn;
use super::h3::H3;
use super::mux::call_of;
use super::timers::Timers;
use super::token::Tok;
use super::Worker;
use crate::app::{Assembled, Fetched};
use crate::exchange::panics::guard;
use crate::exchange::pool::{ExchangeId, Work};
use crate::exchange::CallState;
use crate::http::reply::Upstream;
use crate::upstream::conn::{Owner, Step};
use crate::upstream::pool::{Pass, Registrar};
use crate::upstream::wire::ClientError;

/// The loop's side of [`Registrar`]: the poll's registry and the worker's timers.
pub(super) struct UpLoop<'a> {
    pub(super) registry: &'a Registry,
    pub(super) timers: &'a mut Timers,
}

impl Registrar for UpLoop<'_> {
    fn register(&mut self, sock: &mut TcpStream, ui: usize) -> io::Result<()> {
        self.registry.register(sock, Tok::Upstream(ui).into(), Interest::READABLE | Interest::WRITABLE)
    }

    fn deregister(&mut self, sock: &mut TcpStream) {
        let _ = self.registry.deregister(sock);
    }

    fn arm(&mut self, ui: usize, at: Instant, generation: u32) {
        self.timers.push(at, Tok::Upstream(ui), generation);
    }
}

/// The worker `$w`'s [`UpLoop`], borrowing only its poll and timers.
macro_rules! up_loop {
    ($w:ident) => {
        &mut super::upstream::UpLoop { registry: $w.poll.registry(), timers: &mut $w.timers }
    };
}
pub(super) use up_loop;

/// The request of `owner` moved from upstream connection `old` to `new` (`None`: to none).
fn reown(conns: &mut [Option<Conn>], h3: &mut Option<Box<H3>>, owner: Owner, old: usize, new: Option<usize>) {
    if let Some(Some(call)) = call_of(conns, h3, owner.id) {
        call.reown(owner.slot, old, new);
    }
}

impl Worker {
    /// A handler asked for upstreams: start them (the client waits in `Waiting`).
    pub(super) fn start_call(&mut self, id: ExchangeId, pending: Upstream) {
        let Some(call_slot) = call_of(&mut self.conns, &mut self.h3, id) else { return };
        match pending {
            Upstream::Call(call) => {
                let n = call.requests.len();
                *call_slot = Some(CallState::Gather {
                    ups: vec![None; n],
                    results: (0..n).map(|_| None).collect(),
                    waiting: n,
                    finish: call.finish,
                });
                if n == 0 {
                    self.gathered(id);
                    return;
                }
                for (slot, req) in call.requests.into_iter().enumerate() {
                    let owner = Owner { id, slot };
                    if let Some(ui) = self.up.join(owner, &req) {
                        self.set_up(owner, Some(ui));
                        continue;
                    }
                    match self.up.start(owner, &req, up_loop!(self)) {
                        Ok(ui) => {
                            self.set_up(owner, Some(ui));
                            self.up.share(ui, &req);
                            self.up_ready(ui);
                        }
                        Err(e) => self.fetched(owner, Err(e)),
                    }
                }
            }
            Upstream::Relay(relay) => {
                *call_slot = Some(CallState::Relay { up: None, sink: relay.sink, head_seen: false, started: false });
                self.start_relay(id, &relay.request);
            }
        }
    }

    /// Exchange `id` went away: drop every upstream exchange it owns (one
    /// that other clients joined goes on for them).
    pub(super) fn cancel_call(&mut self, id: ExchangeId, call: CallState) {
        self.up.cancel(id, call, up_loop!(self));
    }

    /// Record which upstream connection an owner's request runs on.
    fn set_up(&mut self, owner: Owner, ui: Option<usize>) {
        if let Some(Some(call)) = call_of(&mut self.conns, &mut self.h3, owner.id) {
            call.set_up(owner.slot, ui);
        }
    }

    /// Do what can be done on upstream connection `ui` (readiness, or a request just
    /// started) and hand the results on, until the socket is drained or the relay's client
    /// makes it pause.
    pub(super) fn up_ready(&mut self, ui: usize) {
        loop {
            match self.up.pass(ui, &mut self.scratch, up_loop!(self)) {
                Pass::Quiet => {}
                Pass::Step(owner, on, step) => self.deliver_step(owner, on, step),
                Pass::Moved { old, new } => {
                    for owner in self.up.waiting(new) {
                        reown(&mut self.conns, &mut self.h3, owner, old, Some(new));
                    }
                    self.up_ready(new);
                }
                Pass::Lost { old, owner, followers, error } => {
                    for f in followers {
                        reown(&mut self.conns, &mut self.h3, f, old, None);
                        self.fetched(f, Err(error.clone()));
                    }
                    reown(&mut self.conns, &mut self.h3, owner, old, None);
                    self.deliver_step(owner, None, Step::Failed(error));
                }
            }
            if !self.up.more(ui) {
                return;
            }
        }
    }

    /// Route the outcome of an I/O pass on connection `ui` to the waiting client request.
    fn deliver_step(&mut self, owner: Owner, ui: Option<usize>, step: Step) {
        let relay = match call_of(&mut self.conns, &mut self.h3, owner.id) {
            Some(call) => matches!(call, Some(CallState::Relay { .. })),
            None => {
                // That client is gone: the next one that joined takes its place, if any.
                if let Some(ui) = ui {
                    if let Some(next) = self.up.hand_over(ui, up_loop!(self)) {
                        self.deliver_step(next, Some(ui), step);
                    }
                }
                return;
            }
        };
        if relay {
            self.relay_step(owner, ui, step);
            return;
        }
        match step {
            Step::Pending => {
                if let Some(ui) = ui {
                    self.up.arm(ui, up_loop!(self));
                }
            }
            Step::Done => {
                let Some(ui) = ui else { return };
                let Some((followers, status, body)) = self.up.answered(ui, up_loop!(self)) else { return };
                for f in followers {
                    self.fetched(f, Ok((status, body.clone())));
                }
                self.fetched(owner, Ok((status, body)));
            }
            Step::Failed(e) => {
                let followers = match ui {
                    Some(ui) => self.up.failed(ui, &e, up_loop!(self)),
                    None => Vec::new(),
                };
                for f in followers {
                    self.fetched(f, Err(e.clone()));
                }
                self.fetched(owner, Err(e));
            }
        }
    }

    /// One gathered result arrived.
    fn fetched(&mut self, owner: Owner, result: Fetched) {
        let Some(Some(call)) = call_of(&mut self.conns, &mut self.h3, owner.id) else { return };
        if call.fetched(owner.slot, result) {
            self.gathered(owner.id);
        }
    }

    /// Every result of a gather is in: build the response and send it.
    fn gathered(&mut self, id: ExchangeId) {
        let Some(call) = call_of(&mut self.conns, &mut self.h3, id) else { return };
        let Some(CallState::Gather { results, finish, .. }) = call.take() else { return };
        let results: Vec<Fetched> = results.into_iter().map(|r| r.unwrap_or(Err(ClientError::Closed))).collect();
        let dev = self.env.development;
        let assembled = guard("response assembly", move || finish(results));
        let resp = match assembled {
            Ok(Ok(Assembled::Now(resp))) => resp,
            // Its body is compressed on the pool; the answer comes back as a job's does.
            Ok(Ok(Assembled::Later(job))) => return self.pool.submit(id, Work::Request(job)),
            Ok(Err(e)) => crate::app::render(e, dev),
            Err(p) => p.into_response(dev),
        };
        self.exchange_respond(id, resp, false);
    }

    /// An upstream connection's timer fired: a busy one past its deadline fails.
    pub(super) fn up_timer(&mut self, ui: usize, at: Instant, generation: u32, now: Instant) {
        if let Some(owner) = self.up.timer(ui, at, generation, now, up_loop!(self)) {
            self.deliver_step(owner, Some(ui), Step::Failed(ClientError::Timeout));
        }
    }
}
