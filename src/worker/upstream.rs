//! Upstream calls from the event loop: which exchange waits for which upstream connection.
//!
//! The client itself is `crate::upstream` (the wire format, the connections and their
//! pools, one I/O pass); this file registers its sockets with the loop (tokens
//! [`Tok::Upstream`]), keeps their deadlines, pools and coalesces them, and runs a *gather*
//! (`Upstream::Call`: requests in parallel, one response built from all results). The other
//! way an exchange waits on an upstream, a *relay* (`Upstream::Relay`: one upstream stream
//! forwarded as it arrives), is `relay.rs`'s. Cancellation: when the client exchange ends,
//! every upstream socket it owns is closed at once, so the upstream sees the connection go.
//! What the answers mean lives in the app.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Interest;

use super::exchange::CallState;
use super::mux::call_of;
use super::panics::guard;
use super::pool::{ExchangeId, Work};
use super::token::Tok;
use super::Worker;
use crate::app::{Assembled, Fetched};
use crate::http::reply::Upstream;
use crate::upstream::conn::{connect_from, tls_session, up_io, Owner, Step, UpConn};
use crate::upstream::wire::{write_request, ClientError, Endpoint, Outbound, ResponseReader, ENDPOINTS};

/// An idle pooled connection is closed after this long. Below the 5 s that
/// Node.js servers keep idle connections, so a reused connection is rarely
/// one the upstream is closing at that moment.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Idle connections kept per endpoint.
const MAX_IDLE: usize = 32;

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
                    if let Some(ui) = self.join_inflight(owner, &req) {
                        self.set_up(owner, Some(ui));
                        continue;
                    }
                    match self.up_start(owner, &req) {
                        Ok(ui) => {
                            self.set_up(owner, Some(ui));
                            if req.coalesce && req.idempotent() {
                                let key = (req.endpoint.id, req.path.clone());
                                if let Some(Some(u)) = self.up.conns.get_mut(ui) {
                                    u.inflight = Some(key.clone());
                                }
                                self.up.inflight.insert(key, ui);
                            }
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
        match call {
            CallState::Gather { ups, .. } => ups.into_iter().flatten().for_each(|ui| self.leave(ui, id)),
            CallState::Relay { up, .. } => up.into_iter().for_each(|ui| self.up_close(ui)),
        }
    }

    /// Exchange `id` no longer waits on upstream connection `ui`.
    fn leave(&mut self, ui: usize, id: ExchangeId) {
        let Some(Some(u)) = self.up.conns.get_mut(ui) else { return };
        u.followers.retain(|f| f.id != id);
        if u.owner.is_some_and(|o| o.id == id) {
            match u.followers.pop() {
                Some(next) => u.owner = Some(next),
                None => self.up_close(ui),
            }
        }
    }

    /// Join an identical coalescible request already in flight; its connection.
    fn join_inflight(&mut self, owner: Owner, req: &Outbound) -> Option<usize> {
        if !req.coalesce || !req.idempotent() {
            return None;
        }
        let ui = *self.up.inflight.get(&(req.endpoint.id, req.path.clone()))?;
        let u = self.up.conns.get_mut(ui)?.as_mut()?;
        // Only a request still waiting for its answer can be joined.
        u.owner?;
        u.followers.push(owner);
        Some(ui)
    }

    /// Record which upstream connection an owner's request runs on.
    fn set_up(&mut self, owner: Owner, ui: Option<usize>) {
        let Some(call) = call_of(&mut self.conns, &mut self.h3, owner.id) else { return };
        match call {
            Some(CallState::Gather { ups, .. }) => {
                if let Some(s) = ups.get_mut(owner.slot) {
                    *s = ui;
                }
            }
            Some(CallState::Relay { up, .. }) => *up = ui,
            None => {}
        }
    }

    /// Send `req` on a pooled connection or a new one; returns its index.
    pub(super) fn up_start(&mut self, owner: Owner, req: &Outbound) -> Result<usize, ClientError> {
        let now = Instant::now();
        let id = req.endpoint.id.min(ENDPOINTS - 1);
        let reuse = if req.idempotent() { self.take_idle(id) } else { None };
        let ui = match reuse {
            Some(ui) => ui,
            None => self.up_open(&req.endpoint, 0)?,
        };
        let Some(Some(u)) = self.up.conns.get_mut(ui) else { return Err(ClientError::Closed) };
        u.reused = reuse.is_some();
        u.owner = Some(owner);
        u.out.clear();
        u.out_pos = 0;
        write_request(req, &mut u.out);
        u.reader = ResponseReader::new(req.max_body, req.method == "HEAD");
        u.body.clear();
        u.inbuf.clear();
        u.timeout = req.timeout;
        u.total = req.total_deadline;
        u.idempotent = req.idempotent();
        u.max_body = req.max_body;
        u.received = false;
        u.paused = false;
        u.deadline = Some(now + req.timeout);
        Ok(ui)
    }

    /// A live idle connection to endpoint `id`, if the pool has one.
    fn take_idle(&mut self, id: usize) -> Option<usize> {
        while let Some(ui) = self.up.idle[id].pop() {
            if let Some(Some(u)) = self.up.conns.get(ui) {
                if u.owner.is_none() && !u.eof {
                    return Some(ui);
                }
            }
        }
        None
    }

    /// Open a non-blocking connection to `endpoint`, starting at address `from`.
    fn up_open(&mut self, endpoint: &Arc<Endpoint>, from: usize) -> Result<usize, ClientError> {
        let (sock, addr) = connect_from(endpoint, from)?;
        let tls = tls_session(endpoint)?;
        let ui = self.up.free.pop().unwrap_or_else(|| {
            self.up.conns.push(None);
            self.up.conns.len() - 1
        });
        let mut sock = sock;
        if let Err(e) =
            self.poll.registry().register(&mut sock, Tok::Upstream(ui).into(), Interest::READABLE | Interest::WRITABLE)
        {
            self.up.free.push(ui);
            return Err(ClientError::Connect(e.to_string()));
        }
        self.up.next_generation = self.up.next_generation.wrapping_add(1);
        self.up.conns[ui] = Some(UpConn {
            sock,
            tls,
            endpoint: Arc::clone(endpoint),
            addr,
            connected: false,
            out: Vec::new(),
            out_pos: 0,
            inbuf: Vec::new(),
            reader: ResponseReader::new(0, false),
            body: Vec::new(),
            owner: None,
            followers: Vec::new(),
            inflight: None,
            generation: self.up.next_generation,
            timer_at: None,
            deadline: None,
            timeout: Duration::ZERO,
            total: true,
            idempotent: false,
            max_body: 0,
            reused: false,
            received: false,
            eof: false,
            paused: false,
            more: false,
        });
        Ok(ui)
    }

    /// Close an upstream connection (the peer sees FIN).
    pub(super) fn up_close(&mut self, ui: usize) {
        if let Some(mut u) = self.up.conns.get_mut(ui).and_then(Option::take) {
            if let Some(key) = u.inflight.take() {
                self.up.inflight.remove(&key);
            }
            let _ = self.poll.registry().deregister(&mut u.sock);
            self.up.free.push(ui);
        }
    }

    /// Readiness on an upstream socket.
    pub(super) fn up_event(&mut self, ui: usize) {
        self.up_ready(ui);
    }

    /// Do what can be done on an upstream connection and hand the results on,
    /// until the socket is drained or the relay's client makes it pause.
    pub(super) fn up_ready(&mut self, ui: usize) {
        loop {
            self.up_pass(ui);
            match self.up.conns.get(ui) {
                Some(Some(u)) if u.more && !u.paused && u.owner.is_some() => continue,
                _ => return,
            }
        }
    }

    /// One I/O pass on an upstream connection, its result handed on.
    fn up_pass(&mut self, ui: usize) {
        let Some(Some(u)) = self.up.conns.get_mut(ui) else { return };
        let Some(owner) = u.owner else {
            // Idle in the pool: anything (data, EOF, error) means it is unusable.
            let mut probe = [0u8; 1];
            match io::Read::read(&mut u.sock, &mut probe) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                _ => self.up_close(ui),
            }
            return;
        };
        let step = up_io(u, &mut self.scratch);
        let step = match step {
            // A pooled connection that died before answering: try once more, fresh.
            Step::Failed(ClientError::Closed | ClientError::Connect(_)) if u.reused && !u.received && u.idempotent => {
                let endpoint = Arc::clone(&u.endpoint);
                let (out, reader_max, timeout, total) = (std::mem::take(&mut u.out), u.max_body, u.timeout, u.total);
                let deadline = u.deadline;
                let followers = std::mem::take(&mut u.followers);
                let inflight = u.inflight.take();
                self.up_close(ui);
                match self.up_open(&endpoint, 0) {
                    Ok(nu) => {
                        if let Some(Some(n)) = self.up.conns.get_mut(nu) {
                            n.owner = Some(owner);
                            n.followers = followers.clone();
                            n.inflight = inflight.clone();
                            n.out = out;
                            n.reader = ResponseReader::new(reader_max, false);
                            n.timeout = timeout;
                            n.total = total;
                            n.idempotent = true;
                            n.max_body = reader_max;
                            n.deadline = deadline;
                        }
                        if let Some(key) = inflight {
                            self.up.inflight.insert(key, nu);
                        }
                        for o in std::iter::once(owner).chain(followers) {
                            self.reown(o, ui, nu);
                        }
                        self.up_ready(nu);
                        return;
                    }
                    Err(e) => {
                        if let Some(key) = inflight {
                            self.up.inflight.remove(&key);
                        }
                        for f in followers {
                            self.reown(f, ui, usize::MAX);
                            self.fetched(f, Err(e.clone()));
                        }
                        self.reown(owner, ui, usize::MAX);
                        self.deliver_step(owner, None, Step::Failed(e));
                        return;
                    }
                }
            }
            // The address refused: try the next one the name resolved to.
            Step::Failed(ClientError::Connect(e)) if !u.connected && u.addr + 1 < u.endpoint.addrs.len() => {
                let (endpoint, next) = (Arc::clone(&u.endpoint), u.addr + 1);
                log::debug!("upstream {}: {e}; trying the next address", endpoint.url);
                match connect_from(&endpoint, next).and_then(|c| tls_session(&endpoint).map(|t| (c, t))) {
                    Ok(((mut sock, addr), tls)) => {
                        let _ = self.poll.registry().deregister(&mut u.sock);
                        if let Err(e) = self.poll.registry().register(
                            &mut sock,
                            Tok::Upstream(ui).into(),
                            Interest::READABLE | Interest::WRITABLE,
                        ) {
                            Step::Failed(ClientError::Connect(e.to_string()))
                        } else {
                            u.sock = sock;
                            u.tls = tls;
                            u.addr = addr;
                            u.out_pos = 0;
                            return;
                        }
                    }
                    Err(e) => Step::Failed(e),
                }
            }
            s => s,
        };
        self.deliver_step(owner, Some(ui), step);
    }

    /// The owner's bookkeeping moves from upstream `old` to `new` (`usize::MAX`: none).
    fn reown(&mut self, owner: Owner, old: usize, new: usize) {
        let Some(call) = call_of(&mut self.conns, &mut self.h3, owner.id) else { return };
        let new = (new != usize::MAX).then_some(new);
        match call {
            Some(CallState::Gather { ups, .. }) => {
                if let Some(slot) = ups.get_mut(owner.slot).filter(|s| **s == Some(old)) {
                    *slot = new;
                }
            }
            Some(CallState::Relay { up, .. }) if *up == Some(old) => *up = new,
            _ => {}
        }
    }

    /// Route the outcome of an I/O pass to the waiting client request.
    fn deliver_step(&mut self, owner: Owner, ui: Option<usize>, step: Step) {
        let relay = match call_of(&mut self.conns, &mut self.h3, owner.id) {
            Some(call) => matches!(call, Some(CallState::Relay { .. })),
            None => {
                // That client is gone: the next one that joined takes its place, if any.
                if let Some(ui) = ui {
                    let next = self.up.conns.get_mut(ui).and_then(Option::as_mut).and_then(|u| {
                        let next = u.followers.pop();
                        if next.is_some() {
                            u.owner = next;
                        }
                        next
                    });
                    match next {
                        Some(next) => self.deliver_step(next, Some(ui), step),
                        None => self.up_close(ui),
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
                    self.up_arm(ui);
                }
            }
            Step::Done => {
                let Some(ui) = ui else { return };
                let Some(Some(u)) = self.up.conns.get_mut(ui) else { return };
                let status = u.reader.head().map_or(0, |h| h.status);
                let body = std::mem::take(&mut u.body);
                let followers = std::mem::take(&mut u.followers);
                if let Some(key) = u.inflight.take() {
                    self.up.inflight.remove(&key);
                }
                self.up_release(ui);
                for f in followers {
                    self.fetched(f, Ok((status, body.clone())));
                }
                self.fetched(owner, Ok((status, body)));
            }
            Step::Failed(e) => {
                let mut followers = Vec::new();
                if let Some(ui) = ui {
                    if let Some(Some(u)) = self.up.conns.get_mut(ui) {
                        log::warn!("upstream {}: {e}", u.endpoint.url);
                        followers = std::mem::take(&mut u.followers);
                    }
                    self.up_close(ui);
                }
                for f in followers {
                    self.fetched(f, Err(e.clone()));
                }
                self.fetched(owner, Err(e));
            }
        }
    }

    /// A finished exchange: back to the idle pool when the connection can carry another.
    pub(super) fn up_release(&mut self, ui: usize) {
        let Some(Some(u)) = self.up.conns.get_mut(ui) else { return };
        // Only connections that carried idempotent requests are pooled: only
        // those requests may take one (a dead pooled connection is retried).
        let reusable = u.idempotent
            && u.reader.is_done()
            && u.reader.head().is_some_and(|h| h.keep_alive)
            && u.inbuf.is_empty()
            && !u.eof
            // The last read stopped at its cap: unread bytes (or the upstream's
            // FIN) may follow, which no new edge would report while it idles.
            && !u.more
            && self.up.idle[u.endpoint.id.min(ENDPOINTS - 1)].len() < MAX_IDLE;
        if !reusable {
            self.up_close(ui);
            return;
        }
        u.owner = None;
        u.paused = false;
        u.out.clear();
        u.out_pos = 0;
        u.body = Vec::new();
        u.deadline = Some(Instant::now() + IDLE_TIMEOUT);
        let id = u.endpoint.id.min(ENDPOINTS - 1);
        self.up.idle[id].push(ui);
        self.up_arm(ui);
    }

    /// One gathered result arrived.
    fn fetched(&mut self, owner: Owner, result: Fetched) {
        let Some(Some(CallState::Gather { ups, results, waiting, .. })) =
            call_of(&mut self.conns, &mut self.h3, owner.id)
        else {
            return;
        };
        let Some(slot) = results.get_mut(owner.slot) else { return };
        if slot.is_some() {
            return;
        }
        *slot = Some(result);
        ups[owner.slot] = None;
        *waiting -= 1;
        if *waiting == 0 {
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

    /// Queue an upstream connection's deadline.
    pub(super) fn up_arm(&mut self, ui: usize) {
        let Some(Some(u)) = self.up.conns.get_mut(ui) else { return };
        if let Some(at) = u.deadline {
            if u.timer_at.is_none_or(|t| at < t) {
                u.timer_at = Some(at);
                self.timers.push(at, Tok::Upstream(ui), u.generation);
            }
        }
    }

    /// An upstream connection's timer fired.
    pub(super) fn up_timer(&mut self, ui: usize, at: Instant, generation: u32, now: Instant) {
        let Some(Some(u)) = self.up.conns.get_mut(ui) else { return };
        if u.generation != generation || u.timer_at != Some(at) {
            return;
        }
        u.timer_at = None;
        match u.deadline {
            Some(d) if d <= now => match u.owner {
                None => self.up_close(ui),
                Some(owner) => {
                    u.deadline = None;
                    self.deliver_step(owner, Some(ui), Step::Failed(ClientError::Timeout));
                }
            },
            _ => self.up_arm(ui),
        }
    }
}
