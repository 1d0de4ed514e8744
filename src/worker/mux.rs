//! The router of exchanges: what the rest of the loop produced for an exchange (a pool
//! result, a bus event, an upstream's answer or relayed bytes, a WebSocket frame) goes to
//! the exchange its [`ExchangeId`] names, whatever its protocol, and the [`Effect`]s the
//! engine returns (upstreams to start or cancel, rooms) are carried out here.
//!
//! An HTTP/2 or HTTP/3 exchange is one engine call on its session; an HTTP/1.1 exchange is
//! the engine's exchange on its connection ([`super::conn::H1::ex`]), which its codec
//! answers and whose socket is written at once (`streams.rs`). Only this file and the
//! lookups beside it ([`call_of`], [`ws_of`]) know where each protocol keeps its exchanges;
//! callers never branch on the protocol. This file must not touch a socket or look at a
//! route.

use std::sync::Arc;

use super::conn::{Conn, ConnState};
use super::h1_sink::{Current, H1Sink};
use super::h3::H3;
use super::{Glue, Worker, HIGH_WATERMARK};
use crate::exchange::pool::{Completion, ExchangeId};
use crate::exchange::CallState;
use crate::exchange::Ws;
use crate::exchange::{engine_cx, Effect, Reset};
use crate::http::response::{Delimit, Response};
use crate::http2::{Heads, StreamId};

/// Run `$body` with the exchanges, sink, head builder and stream of exchange `$id`, if its
/// connection (its session) is still open; `None` otherwise. An HTTP/1.1 sink's outcome
/// waits on its connection (`H1::fate`) for the [`Worker::wake`] that follows.
macro_rules! on_session {
    ($w:ident, $id:expr, |$ex:ident, $sink:ident, $heads:ident, $stream:ident| $body:expr) => {
        match $id {
            ExchangeId::H1 { conn, gen } => match $w.conns.get_mut(conn) {
                Some(Some(c)) if c.generation == gen => match &mut c.state {
                    ConnState::Http1(h) => {
                        // Never used: the codec writes HTTP/1.1 heads.
                        let mut heads = Heads::default();
                        let $heads = &mut heads;
                        let now = std::time::Instant::now();
                        let mut sink = H1Sink::new(&mut h.codec, &mut c.io, &mut $w.bufs, h.fate, now);
                        let $sink = &mut sink;
                        let $ex = &mut h.ex;
                        let $stream = Current;
                        let out = $body;
                        h.fate = sink.fate;
                        Some(out)
                    }
                    _ => None,
                },
                _ => None,
            },
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
        }
    };
}

/// The upstream wait of exchange `id`, while the exchange is open: an HTTP/1.1
/// connection's `call`, an HTTP/2 or HTTP/3 stream's.
pub(super) fn call_of<'a>(
    conns: &'a mut [Option<Conn>],
    h3: &'a mut Option<Box<H3>>,
    id: ExchangeId,
) -> Option<&'a mut Option<CallState>> {
    match id {
        ExchangeId::H1 { conn, gen } => match &mut live(conns, conn, gen)?.state {
            ConnState::Http1(h) => h.ex.call_slot(Current),
            _ => None,
        },
        ExchangeId::H2 { conn, stream, gen } => match &mut live(conns, conn, gen)?.state {
            ConnState::Http2(sess) => sess.parts().0.call_slot(StreamId(stream)),
            _ => None,
        },
        ExchangeId::H3 { conn, stream, gen } => {
            let (sess, _, _, stream) = h3.as_mut()?.parts(conn, stream, gen)?;
            sess.call_slot(stream)
        }
    }
}

/// The WebSocket state and output of exchange `id` (an HTTP/1.1 connection's, or an
/// HTTP/2 stream's; HTTP/3 carries no WebSocket), and that output's unsent length.
pub(super) fn ws_of(conns: &mut [Option<Conn>], id: ExchangeId) -> Option<(&mut Ws, &mut Vec<u8>, usize)> {
    match id {
        ExchangeId::H1 { conn, gen } => {
            let c = live(conns, conn, gen)?;
            let backlog = c.io.backlog();
            match &mut c.state {
                ConnState::Http1(h) => Some((h.ex.ws_of(Current)?.0, &mut c.io.out, backlog)),
                _ => None,
            }
        }
        ExchangeId::H2 { conn, stream, gen } => match &mut live(conns, conn, gen)?.state {
            ConnState::Http2(sess) => sess.parts().0.ws_of(StreamId(stream)),
            _ => None,
        },
        ExchangeId::H3 { .. } => None,
    }
}

/// Connection `conn` of the slab, if it is still generation `gen`.
fn live(conns: &mut [Option<Conn>], conn: usize, gen: u32) -> Option<&mut Conn> {
    conns.get_mut(conn)?.as_mut().filter(|c| c.generation == gen)
}

impl Worker {
    /// A pool job of exchange `id` finished: its answer, a replay or a download slice.
    pub(super) fn exchange_completed(&mut self, id: ExchangeId, result: Completion) {
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        on_session!(self, id, |ex, sink, heads, stream| {
            ex.completed(stream, result, sink, &mut engine_cx!(self, &mut glue, heads))
        });
        self.wake(id);
    }

    /// A bus event (`event_id`, rendered `event`) for event stream `id`.
    pub(super) fn exchange_event(&mut self, id: ExchangeId, event_id: i64, event: &Arc<[u8]>) {
        on_session!(self, id, |ex, _sink, _heads, stream| ex.event(stream, event_id, event));
        self.wake(id);
    }

    /// App code behind exchange `id`'s body failed: its body ends with what was sent, or,
    /// not answered yet, its stream is reset.
    pub(super) fn exchange_abort(&mut self, id: ExchangeId) {
        on_session!(self, id, |ex, sink, _heads, stream| ex.abort(stream, sink, &mut self.sse));
        self.sse.remove(&id);
        self.sse_count_changed();
        self.wake(id);
    }

    /// Give up exchange `id`: a WebSocket member that stopped reading ([`Reset::Cancel`]:
    /// an HTTP/1.1 one loses its connection), a relay whose app code failed
    /// ([`Reset::Internal`]: an HTTP/1.1 body is cut short, its connection closed once
    /// flushed).
    pub(super) fn exchange_drop(&mut self, id: ExchangeId, why: Reset) {
        on_session!(self, id, |ex, sink, _heads, stream| ex.drop_stream(stream, why, sink, &mut self.sse));
        self.wake(id);
    }

    /// Answer exchange `id`, which waited on upstreams (`relayed`: its body follows as
    /// relayed events). Returns whether a body follows (not for `HEAD`, whose exchange ends
    /// with its head; its upstreams are then cancelled).
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

    /// Relayed bytes for exchange `id`: queued on it, sent as its stream allows.
    pub(super) fn exchange_relay_data(&mut self, id: ExchangeId, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if on_session!(self, id, |ex, _sink, _heads, stream| ex.relay_data(stream, bytes)) == Some(true) {
            self.wake(id);
        }
    }

    /// Whether exchange `id` is behind its client (its relay pauses); `None` once it is gone.
    /// An HTTP/1.1 connection is flushed first: only output still unsent after that counts,
    /// and the flush that drains it resumes the relay.
    pub(super) fn exchange_relay_slow(&mut self, id: ExchangeId) -> Option<bool> {
        if let ExchangeId::H1 { conn, gen } = id {
            live(&mut self.conns, conn, gen)?;
            self.flush_conn(conn);
            let c = live(&mut self.conns, conn, gen)?;
            let slow = c.io.backlog() > HIGH_WATERMARK;
            c.paused |= slow;
            return Some(slow);
        }
        on_session!(self, id, |ex, _sink, _heads, stream| ex.relay_slow(stream))
    }

    /// The relay of exchange `id` ended: its body ends once sent (HTTP/1.1: the connection
    /// returns to keep-alive).
    pub(super) fn exchange_relay_done(&mut self, id: ExchangeId) {
        on_session!(self, id, |ex, _sink, _heads, stream| ex.relay_done(stream));
        self.wake(id);
    }

    /// A WebSocket frame for exchange `id`: queued on it and sent. A plain HTTP/1.1
    /// connection with nothing queued gets it straight from `frame` (no copy).
    pub(super) fn exchange_frame(&mut self, id: ExchangeId, frame: &[u8]) {
        if let ExchangeId::H1 { conn, gen } = id {
            if live(&mut self.conns, conn, gen).is_some() {
                self.write_direct(conn, frame);
            }
            return;
        }
        if let Some((_, out, _)) = ws_of(&mut self.conns, id) {
            out.extend_from_slice(frame);
            self.wake(id);
        }
    }

    /// Exchange `id` has more to do: its session runs at the end of this turn (HTTP/1.1: its
    /// exchange runs, and its output is flushed, now).
    pub(super) fn wake(&mut self, id: ExchangeId) {
        match id {
            ExchangeId::H1 { conn, gen } => {
                if live(&mut self.conns, conn, gen).is_some()
                    && self.on_h1_engine(conn, |ex, sink, cx| _ = ex.service(sink, cx))
                {
                    self.flush_conn(conn);
                }
            }
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
                Effect::Left(id, rooms) => self.websocket_left(id, &rooms),
                Effect::Todo(id, t) => self.ws_todo(id, t),
            }
        }
        if self.svc.stats.sse.load(std::sync::atomic::Ordering::Relaxed) != self.sse.len() {
            self.sse_count_changed();
        }
    }

    /// WebSocket exchange `id` went away: out of its `rooms`, uncounted.
    pub(super) fn websocket_left(&mut self, id: ExchangeId, rooms: &[String]) {
        for room in rooms {
            if self.rooms.leave(room, id) {
                self.svc.stats.members.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let n = self.svc.stats.ws.fetch_sub(1, std::sync::atomic::Ordering::Relaxed).saturating_sub(1);
        self.metrics.set_websocket_clients(n);
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
