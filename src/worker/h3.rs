//! HTTP/3 in the worker: one [`Session`] of exchanges per QUIC connection of the slot's
//! endpoint (`quic.rs`: the UDP socket, datagrams in and out, the hand-over between workers),
//! beside (not inside) the TCP connection slab.
//!
//! Each turn, the connections the endpoint fed (or that completions, timers or the drain
//! touched) run ([`Exchanges::run`]): their events become exchanges of the one service ([`Glue`], the same
//! phases, handlers and rate limits as HTTP/1.1 and HTTP/2), and what quinn has to send goes
//! out; while the socket refuses datagrams, no connection is polled for more. quinn's timers
//! and the exchanges' own deadlines (body timeout, SSE heartbeats, tickers) make one deadline
//! the loop waits for.
//!
//! An exchange is keyed by `ExchangeId::H3`: `conn` = the connection's handle, `stream` =
//! the QUIC stream id, with a per-session generation: pool completions, bus events and
//! upstream waits find it as they find an HTTP/2 stream. The exchanges are the engine's
//! (`crate::exchange`: dispatch, answers, producers); [`H3Conn`] is their `Source` (what the
//! connection reports, as the engine's inputs, with HTTP/3's checks of a head) and their
//! `Sink` (`crate::exchange::h3_sink`).
//! A request head late past `header_timeout_ms` on its stream, or a body past
//! `body_timeout_ms`, is answered 408 on that stream; a connection with no request stream
//! for `keepalive_timeout_ms` is sent GOAWAY and closed (`http3::conn`).
//!
//! Graceful stop: GOAWAY on every connection,
//! open streams finish, event streams end. This file must not look at routes, read or write
//! the socket, or write HTTP/3 frames (that is `crate::http3`).

use crate::http3::idmap::{IdMap, IdSet};
use std::io;
use std::net::IpAddr;
use std::time::Instant;

use mio::Registry;
use quinn_proto::{ConnectionHandle, StreamId, VarInt};

use super::quic::{Endpoint, WorkerH3};
use super::{Glue, Worker};
use crate::config::Config;
use crate::exchange::{engine_cx, Exchanges};
use crate::http::service::Protocol;
use crate::http2::Heads;
use crate::http3::conn::H3Conn;
use crate::http3::head::RequestHead;
use crate::http3::server::Server;

/// Sessions (connections) at which new clients must prove their address (Retry) first, as
/// a share of `limits.max_connections`.
const UNDER_LOAD_SHARE: usize = 2;

/// One QUIC connection's exchanges.
type Session = Exchanges<StreamId, RequestHead>;

/// The worker's HTTP/3 side.
pub(super) struct H3 {
    /// The slot's socket and the QUIC endpoint on it.
    endpoint: Endpoint,
    sessions: IdMap<ConnectionHandle, Session>,
    next_generation: u32,
    /// Connections to run and flush at the end of this turn.
    touched: IdSet<ConnectionHandle>,
    heads: Heads,
    /// The earliest quinn timer or exchange deadline.
    deadline: Option<Instant>,
    /// The worker drains: GOAWAY sent on every connection, new ones too.
    draining: bool,
    max_connections: usize,
}

impl H3 {
    /// The worker's HTTP/3 side over the slot's socket, registered with `registry`.
    pub(super) fn new(args: WorkerH3, config: &Config, registry: &Registry) -> io::Result<H3> {
        Ok(H3 {
            endpoint: Endpoint::new(args, config, registry)?,
            sessions: IdMap::default(),
            next_generation: 1,
            touched: IdSet::default(),
            heads: Heads::new(),
            deadline: None,
            draining: false,
            max_connections: config.limits.max_connections,
        })
    }

    /// Whether the loop must run HTTP/3 again this turn (more to read, connections touched).
    pub(super) fn busy(&self) -> bool {
        self.endpoint.unread() || (!self.touched.is_empty() && self.endpoint.sent_all())
    }

    /// The earliest deadline of the HTTP/3 side.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// No connection is left (the drained worker may exit).
    pub(super) fn is_empty(&self) -> bool {
        self.endpoint.server.is_empty()
    }

    /// Its open QUIC connections.
    pub(super) fn connections(&self) -> usize {
        self.endpoint.server.len()
    }

    /// Reads what waits for the endpoint (see [`Endpoint::receive`]); each connection a
    /// datagram went to runs this turn, a new one while draining is sent GOAWAY first.
    fn receive(&mut self, now: Instant, readable: bool, registry: &Registry) {
        let (sessions, touched, draining) = (&self.sessions, &mut self.touched, self.draining);
        self.endpoint.receive(now, readable, registry, &mut |server: &mut Server, ch| {
            if draining && !sessions.contains_key(&ch) {
                if let Some(conn) = server.conn(ch) {
                    conn.go_away(now);
                }
            }
            touched.insert(ch);
        });
    }
}

/// The QUIC connection and stream of the parts of an `ExchangeId::H3`. Every such id is made
/// from a [`StreamId`] (`Key::id`), so `stream` is a valid varint; were it not, the largest
/// varint names no open stream and the lookup finds nothing.
fn quic_of(conn: usize, stream: u64) -> (ConnectionHandle, StreamId) {
    (ConnectionHandle(conn), StreamId::from(VarInt::from_u64(stream).unwrap_or(VarInt::MAX)))
}

impl Worker {
    /// The HTTP/3 side's turn: read (when `readable`), send what waited for the socket, fire
    /// due timers, run every connection that has something to do and send its datagrams.
    pub(super) fn h3_turn(&mut self, readable: bool) {
        let Some(mut h3) = self.h3.take() else { return };
        let now = Instant::now();
        h3.endpoint.check_siblings(now, self.poll.registry());
        h3.receive(now, readable, self.poll.registry());
        let writable = h3.endpoint.send_backlog();
        if h3.deadline.is_some_and(|t| t <= now) {
            for ch in h3.endpoint.server.handle_timeouts(now) {
                h3.touched.insert(ch);
            }
            let glue = Glue::new(&self.app, self.config, self.record, self.metrics);
            for (ch, sess) in &mut h3.sessions {
                if sess.deadline().is_some_and(|t| t <= now) {
                    sess.tick(&glue, now);
                    h3.touched.insert(*ch);
                }
            }
        }
        let live = self.live + h3.endpoint.server.len();
        self.record.connections.store(live as u64, std::sync::atomic::Ordering::Relaxed);
        h3.endpoint.server.set_under_load(live >= h3.max_connections / UNDER_LOAD_SHARE);
        if writable {
            let mut effects = Vec::new();
            let touched: Vec<ConnectionHandle> = h3.touched.drain().collect();
            let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
            let mut full = false;
            for ch in touched {
                if full {
                    h3.touched.insert(ch);
                    continue;
                }
                let server = &mut h3.endpoint.server;
                if server.conn(ch).is_some() && !h3.sessions.contains_key(&ch) {
                    let generation = h3.next_generation;
                    h3.next_generation = h3.next_generation.wrapping_add(1);
                    let peer = server.conn(ch).map_or(IpAddr::from([0, 0, 0, 0]), |c| c.quic().remote_address().ip());
                    let session = Session::new(ch.0, generation, peer, Protocol::Http3, Some("TLSv1.3"), false, now);
                    h3.sessions.insert(ch, session);
                }
                if let (Some(conn), Some(sess)) = (server.conn(ch), h3.sessions.get_mut(&ch)) {
                    let mut cx = engine_cx!(self, &mut glue, &mut h3.heads);
                    // Request bodies late past their deadline: 408.
                    sess.expire(conn, &mut cx, now);
                    sess.run(conn, &mut cx, now);
                    effects.append(&mut sess.effects);
                }
                if !h3.endpoint.flush(now, ch) {
                    full = true;
                    h3.touched.insert(ch);
                }
                if h3.endpoint.server.conn(ch).is_none() {
                    if let Some(mut sess) = h3.sessions.remove(&ch) {
                        sess.close_all(&mut self.sse);
                        effects.append(&mut sess.effects);
                    }
                }
            }
            let relays = h3.sessions.values().flat_map(|s| s.relays_ready()).collect();
            self.h3 = Some(h3);
            self.carry_out(effects);
            self.resume_relays(relays);
            self.sse_count_changed();
            let Some(h3) = self.h3.as_mut() else { return };
            h3.refresh_deadline();
            return;
        }
        h3.refresh_deadline();
        self.h3 = Some(h3);
    }

    /// The inbox is readable: its messages are taken this turn.
    pub(super) fn h3_inbox_ready(&mut self) {
        if let Some(h3) = self.h3.as_mut() {
            h3.endpoint.inbox_ready();
        }
        self.h3_turn(false);
    }

    /// Graceful stop: GOAWAY on every connection; event streams end; open streams finish.
    pub(super) fn h3_drain(&mut self) {
        let Some(h3) = self.h3.as_mut() else { return };
        let now = Instant::now();
        h3.draining = true;
        // While we read the slot's socket (no successor said hello: a graceful stop, or a
        // successor that cannot forward and waits for us to exit), another worker's packets
        // are dropped, not reset, and new clients' first packets left to others. With a
        // successor, only our own packets reach us (forwarded); this matters again if it dies
        // and we read once more.
        h3.endpoint.server.set_sibling(true, true);
        h3.endpoint.server.go_away(now);
        for (ch, sess) in &mut h3.sessions {
            sess.end_event_streams(&mut self.sse);
            h3.touched.insert(*ch);
        }
        for ch in h3.endpoint.server.handles() {
            h3.touched.insert(ch);
        }
        self.sse_count_changed();
    }
}

impl H3 {
    /// The session, connection, head builder and stream of HTTP/3 exchange `conn`/`stream`
    /// of generation `generation`, while open; the connection runs at the end of the turn.
    pub(super) fn parts(
        &mut self,
        conn: usize,
        stream: u64,
        generation: u32,
    ) -> Option<(&mut Session, &mut H3Conn, &mut Heads, StreamId)> {
        let (ch, stream) = quic_of(conn, stream);
        let sess = self.sessions.get_mut(&ch).filter(|s| s.gen() == generation)?;
        let conn = self.endpoint.server.conn(ch)?;
        self.touched.insert(ch);
        Some((sess, conn, &mut self.heads, stream))
    }

    /// Connection `conn` has something to do: it runs at the end of this turn.
    pub(super) fn touch(&mut self, conn: usize) {
        self.touched.insert(ConnectionHandle(conn));
    }

    /// Recomputes the earliest deadline: quinn's timers, request bodies, producers.
    fn refresh_deadline(&mut self) {
        let quic = self.endpoint.server.next_timeout();
        let exchanges = self.sessions.values().filter_map(Session::deadline).min();
        self.deadline = [quic, exchanges, self.endpoint.next_check()].into_iter().flatten().min();
    }
}
