//! The worker's side of the exchange engine for multiplexed connections: it finds the
//! session an [`ExchangeId::H2`] or [`ExchangeId::H3`] names, hands it what the rest of the
//! loop produced (a pool result, a bus event, an upstream's answer or relayed bytes), and
//! carries out the [`Effect`]s the engine returns (upstreams to start or cancel, rooms).
//!
//! Every operation here is one engine call for both protocols; only the lookup knows where
//! each protocol keeps its sessions. This file must not touch a socket or look at a route.

use std::sync::Arc;

use super::conn::ConnState;
use super::engine::{engine_cx, Effect};
use super::pool::{Completion, ExchangeId};
use super::{Glue, Worker};
use crate::http::response::{Delimit, Response};
use crate::http2::StreamId;

/// Run `$body` with the exchanges, sink, head builder and stream of multiplexed exchange
/// `$id`, if its session is still open; `None` otherwise (and for an HTTP/1.1 id).
macro_rules! on_session {
    ($w:ident, $id:expr, |$ex:ident, $sink:ident, $heads:ident, $stream:ident| $body:expr) => {
        match $id {
            ExchangeId::H2 { conn, stream, gen } => match $w.conns.get_mut(conn) {
                Some(Some(c)) if c.generation == gen => match &mut c.state {
                    ConnState::Http2(sess) => {
                        let ($ex, $sink, $heads) = sess.parts();
                        let $stream = StreamId(stream);
                        Some($body)
                    }
                    _ => None,
                },
                _ => None,
            },
            ExchangeId::H3 { conn, stream, gen } => match $w.h3.as_mut().and_then(|h3| h3.parts(conn, stream, gen)) {
                Some(($ex, $sink, $heads, $stream)) => Some($body),
                None => None,
            },
            ExchangeId::H1 { .. } => None,
        }
    };
}

impl Worker {
    /// A pool job of multiplexed exchange `id` finished.
    pub(super) fn exchange_completed(&mut self, id: ExchangeId, result: Completion) {
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        on_session!(self, id, |ex, sink, heads, stream| {
            ex.completed(stream, result, sink, &mut engine_cx!(self, &mut glue, heads))
        });
        self.wake(id);
    }

    /// A bus event (`event_id`, rendered `event`) for multiplexed event stream `id`.
    pub(super) fn exchange_event(&mut self, id: ExchangeId, event_id: i64, event: &Arc<[u8]>) {
        on_session!(self, id, |ex, _sink, _heads, stream| ex.event(stream, event_id, event));
        self.wake(id);
    }

    /// App code behind multiplexed exchange `id`'s body failed: its body ends with what was
    /// sent, or, not answered yet, its stream is reset.
    pub(super) fn exchange_abort(&mut self, id: ExchangeId) {
        on_session!(self, id, |ex, sink, _heads, stream| ex.abort(stream, sink, &mut self.sse));
        self.sse.remove(&id);
        self.sse_count_changed();
        self.wake(id);
    }

    /// Reset multiplexed exchange `id` and forget it (a WebSocket member that stopped
    /// reading, a relay cut short).
    pub(super) fn exchange_drop(&mut self, id: ExchangeId, why: super::engine::Reset) {
        on_session!(self, id, |ex, sink, _heads, stream| ex.drop_stream(stream, why, sink, &mut self.sse));
        self.wake(id);
    }

    /// Answer multiplexed exchange `id`, which waited on upstreams (`relayed`: its body
    /// follows as relayed events). Returns whether a body follows.
    pub(super) fn exchange_respond(&mut self, id: ExchangeId, resp: Response, relayed: bool) -> bool {
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let delimit = if relayed { Delimit::Chunked } else { Delimit::Length };
        let follows = on_session!(self, id, |ex, sink, heads, stream| match ex.find(stream) {
            Some(i) => ex.answer(i, resp, delimit, sink, &mut engine_cx!(self, &mut glue, heads)),
            None => false,
        });
        self.wake(id);
        follows.unwrap_or(false)
    }

    /// Relayed bytes for multiplexed exchange `id`: queued on it, sent as its stream allows.
    pub(super) fn exchange_relay_data(&mut self, id: ExchangeId, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if on_session!(self, id, |ex, _sink, _heads, stream| ex.relay_data(stream, bytes)) == Some(true) {
            self.wake(id);
        }
    }

    /// Whether multiplexed exchange `id` is behind its client (its relay pauses).
    pub(super) fn exchange_relay_slow(&mut self, id: ExchangeId) -> bool {
        on_session!(self, id, |ex, _sink, _heads, stream| ex.relay_slow(stream)).unwrap_or(false)
    }

    /// The relay of multiplexed exchange `id` ended: its body ends once sent.
    pub(super) fn exchange_relay_done(&mut self, id: ExchangeId) {
        on_session!(self, id, |ex, _sink, _heads, stream| ex.relay_done(stream));
        self.wake(id);
    }

    /// Multiplexed exchange `id` has more to do: its session runs at the end of this turn.
    pub(super) fn wake(&mut self, id: ExchangeId) {
        match id {
            ExchangeId::H1 { conn, .. } => self.flush_conn(conn),
            ExchangeId::H2 { conn, gen, .. } => self.drained.push((conn, gen)),
            ExchangeId::H3 { conn, .. } => {
                if let Some(h3) = self.h3.as_mut() {
                    h3.touch(conn);
                }
            }
        }
    }

    /// Carry out what the engine asked for.
    pub(super) fn carry_out(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Start(id, up) => {
                    self.start_call(id, up);
                    // What the upstreams answered at once (an error, a cached answer) goes out now.
                    self.wake(id);
                }
                Effect::Cancel(id, call) => self.cancel_call(id, call),
                Effect::Left(id, rooms) => {
                    for room in &rooms {
                        if self.rooms.leave(room, id) {
                            self.svc.stats.members.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    let n = self.svc.stats.ws.fetch_sub(1, std::sync::atomic::Ordering::Relaxed).saturating_sub(1);
                    self.metrics.set_websocket_clients(n);
                }
                Effect::Todo(id, t) => self.ws_todo(id, t),
            }
        }
        if self.svc.stats.sse.load(std::sync::atomic::Ordering::Relaxed) != self.sse.len() {
            self.sse_count_changed();
        }
    }

    /// Relays whose client caught up: their upstreams read again.
    pub(super) fn resume_relays(&mut self, ids: Vec<ExchangeId>) {
        for id in ids {
            self.relay_resume(id);
        }
    }

    /// Publish the number of event streams (metrics, `/api/stats`).
    pub(super) fn sse_count_changed(&mut self) {
        self.svc.stats.sse.store(self.sse.len(), std::sync::atomic::Ordering::Relaxed);
        self.metrics.set_sse_streams(self.sse.len());
    }
}
