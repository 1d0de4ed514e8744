//! HTTP/2 connections in the worker: the loop's side of [`crate::http2::H2Conn`].
//!
//! A connection is HTTP/2 when a plain one opens with the client preface
//! (prior knowledge, h2c) or a TLS one negotiated `h2` by ALPN. Its
//! [`H2Session`] owns the codec behind an [`H2Sink`] (`crate::exchange::h2_sink`: how the
//! engine reads the codec's events as inputs and writes through it, and the RFC 9218
//! scheduler) and the engine's [`Exchanges`], one per open stream (`crate::exchange`:
//! dispatch, answers, producers). This module moves bytes between the connection's
//! transport and the codec, runs the engine's turn ([`Exchanges::run`]) over them, and
//! decides how the connection ends (GOAWAY, the keep-alive and header timers, the drain).
//! It never looks at a route and never writes HTTP/2 frames itself.

use std::time::{Duration, Instant};

use super::{Glue, Worker, READ_AHEAD};
use crate::exchange::h2_sink::H2Sink;
use crate::exchange::{engine_cx, Cx, Exchanges};
use crate::http::service::{Env, Protocol, HIGH_WATERMARK};
use crate::http2::{H2Settings, Heads, Reason, RequestHead, StreamId};

/// After the two-step GOAWAY of a connection that reached its keep-alive
/// timeout with a response still queued in h2, the peer gets this long to
/// take it before the connection is cut.
const GOAWAY_GRACE: Duration = Duration::from_secs(2);

/// A draining connection that is busy gets this long (at most half its
/// time to the cut) to fall quiet and be closed with one final GOAWAY;
/// past it, the two-step GOAWAY tells its client to stop while its open
/// streams finish.
const QUIET_WAIT: Duration = Duration::from_secs(2);

/// Event-handling rounds per drive before the connection yields to the others.
const MAX_ROUNDS: usize = 32;

/// How long a draining connection's open streams may run after its GOAWAY:
/// most of the worker's shutdown timeout, so the abort (`GOAWAY`, then the
/// close) goes out before the worker exits and cuts every socket.
pub(super) fn cut_after(shutdown_timeout: Duration) -> Duration {
    shutdown_timeout - shutdown_timeout / 10
}

/// How an HTTP/2 connection ends, from the server's side.
///
/// A GOAWAY is best the last frame of a connection, sent when no stream is
/// open: its `last_stream_id` is then exact (h2 reads no frame after it, so
/// a request racing it is never processed and its client may retry it), and
/// no frame follows that a client could refuse (Python's `h2` takes any
/// frame after a GOAWAY, even the answer to an open stream, as a protocol
/// error). The connection then closes with a lingering close, so a request
/// in flight does not turn our close into a reset that destroys the GOAWAY
/// before the client reads it. nginx ends idle HTTP/2 connections the same
/// way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Serving: the keep-alive timer closes the connection once it has had
    /// no stream for `keepalive_timeout`.
    No,
    /// The worker drains: the final GOAWAY goes out the moment no stream is
    /// open; a connection still busy at `by` gets the two-step GOAWAY.
    WhenQuiet {
        /// When waiting for a quiet moment ends.
        by: Instant,
    },
    /// A GOAWAY went out with streams open (RFC 9113 §6.8's two steps:
    /// the largest id and a PING, then the last stream processed): they
    /// finish, and the cut ends the rest.
    GoingAway,
}

/// One HTTP/2 connection's state: the codec, its exchanges, how it ends.
pub(super) struct H2Session {
    out: H2Sink,
    ex: Exchanges<StreamId, RequestHead>,
    /// How the connection is being ended.
    ending: Ending,
    /// The connection is cut at this deadline if still open.
    cut_at: Option<Instant>,
    /// What the peer started sending and has not finished (the preface, a frame, a header
    /// block), timed as a head; `None` once the connection is ended for it.
    unfinished: Option<crate::http2::Unfinished>,
    /// The peer's EOF was handed to the codec.
    eof_fed: bool,
    /// Builds the HTTP/2 response heads.
    heads: Heads,
}

impl H2Session {
    /// The session of connection `conn` (generation `gen`); its preface (or part of it) may
    /// already be buffered.
    pub(super) fn new(
        settings: H2Settings,
        conn: usize,
        gen: u32,
        peer: std::net::IpAddr,
        tls: Option<&'static str>,
        now: Instant,
    ) -> H2Session {
        H2Session {
            out: H2Sink::new(settings, peer),
            ex: Exchanges::new(conn, gen, peer, Protocol::Http2, tls, true, now),
            ending: Ending::No,
            cut_at: None,
            unfinished: Some(crate::http2::Unfinished::new(now)),
            eof_fed: false,
            heads: Heads::new(),
        }
    }

    /// Its exchanges, the sink they write through, and the head builder.
    pub(super) fn parts(&mut self) -> (&mut Exchanges<StreamId, RequestHead>, &mut H2Sink, &mut Heads) {
        (&mut self.ex, &mut self.out, &mut self.heads)
    }

    /// The earliest deadline: a stream's body timeout or producer, the idle timeout, the end
    /// of a drain's wait for a quiet moment, the cut, the header timeout of what the peer
    /// left unfinished.
    pub(super) fn deadline(&self, env: &Env) -> Option<Instant> {
        let idle = self.ex.idle_since.map(|t| t + env.keepalive_timeout);
        let head = self.head_since().map(|t| t + env.header_timeout);
        let quiet_by = match self.ending {
            Ending::WhenQuiet { by } => Some(by),
            Ending::No | Ending::GoingAway => None,
        };
        [idle, head, self.ex.deadline(), quiet_by, self.cut_at].into_iter().flatten().min()
    }

    /// Since when the peer has owed the rest of a head (or of the preface, or of a frame).
    fn head_since(&self) -> Option<Instant> {
        self.unfinished.as_ref().and_then(crate::http2::Unfinished::since)
    }

    /// Drain the connection (the worker stops): the final GOAWAY as soon as no stream is
    /// open (at the next drive), else the two-step GOAWAY after [`QUIET_WAIT`] (at most half
    /// the time left); cut at `cut_at`.
    pub(super) fn shut_down(&mut self, cut_at: Instant) {
        let now = Instant::now();
        if self.ending == Ending::No {
            let by = now + QUIET_WAIT.min(cut_at.saturating_duration_since(now) / 2);
            self.ending = Ending::WhenQuiet { by };
        }
        self.cut_at = Some(self.cut_at.map_or(cut_at, |t| t.min(cut_at)));
    }

    /// Nothing is open on the connection (see [`H2Conn::is_quiet`]).
    fn quiet(&self) -> bool {
        self.ex.is_empty() && self.out.conn.is_quiet()
    }

    /// The last frame: GOAWAY(last stream processed, `NO_ERROR`), then the close
    /// ([`Ending`]). Only when [`H2Session::quiet`].
    fn final_goaway(&mut self) {
        self.out.conn.abort(Reason::NO_ERROR);
    }

    /// The two-step GOAWAY (open streams finish), cut at `cut_at` at the latest.
    fn go_away(&mut self, cut_at: Instant) {
        self.out.conn.graceful_shutdown();
        self.ending = Ending::GoingAway;
        self.cut_at = Some(self.cut_at.map_or(cut_at, |t| t.min(cut_at)));
    }

    /// The connection's timer fired (its exchanges' timers are the engine's): the end of a
    /// connection whose head is late, the cut at its deadline, the two-step GOAWAY when a
    /// drain found no quiet moment in time, the final GOAWAY when idle ([`Ending`]).
    pub(super) fn on_timer(&mut self, env: &Env, now: Instant) {
        if self.head_since().is_some_and(|t| t + env.header_timeout <= now) {
            // The preface, a header block or a frame not finished within the header
            // timeout. A stream whose header block is incomplete cannot be answered
            // (its fields are unknown, and nothing but its CONTINUATION may follow), so
            // the connection ends: GOAWAY(PROTOCOL_ERROR), then the close, as nginx does.
            log::debug!("HTTP/2: head not finished within the header timeout; closing");
            self.unfinished = None;
            self.out.conn.abort(Reason::PROTOCOL_ERROR);
        }
        if self.cut_at.is_some_and(|t| t <= now) {
            self.cut_at = None;
            self.out.conn.abort(Reason::NO_ERROR);
        } else if matches!(self.ending, Ending::WhenQuiet { by } if by <= now) && !self.quiet() {
            // Still busy: tell the client to stop; its open streams finish.
            let cut_at = self.cut_at.unwrap_or(now + GOAWAY_GRACE);
            self.go_away(cut_at);
        } else if self.ex.idle_since.is_some_and(|t| t + env.keepalive_timeout <= now) {
            self.ex.idle_since = None;
            if self.quiet() {
                self.final_goaway();
            } else {
                // No exchange, but the codec still holds a response the client has
                // not taken (its window is closed): it gets a little longer.
                self.go_away(now + GOAWAY_GRACE);
            }
        }
    }

    /// Drive the codec and answer what it reports, until it goes quiet (or [`MAX_ROUNDS`]).
    /// Returns whether events are left for the next drive.
    fn step(&mut self, cx: &mut Cx<'_, Glue<'_>>, now: Instant) -> bool {
        for _ in 0..MAX_ROUNDS {
            self.out.advance();
            let quiet = !self.out.has_events();
            if !self.ex.run(&mut self.out, cx, now) && quiet {
                if matches!(self.ending, Ending::WhenQuiet { .. }) && self.quiet() {
                    // Draining, and nothing is open: the final GOAWAY.
                    self.final_goaway();
                    continue;
                }
                return false;
            }
        }
        self.out.advance();
        self.out.has_events()
    }
}

impl Worker {
    /// Make connection `idx` HTTP/2; its buffered input is the start of the preface.
    pub(super) fn start_h2(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let settings = self.h2.clone().unwrap_or_else(|| H2Settings::new(self.env.max_head));
        let now = Instant::now();
        let mut sess = H2Session::new(settings, idx, c.generation, c.peer, c.io.tls_version(), now);
        if self.env.draining {
            sess.shut_down(now + cut_after(self.config.shutdown_timeout));
        }
        c.become_h2(sess);
        self.drive_h2(idx);
    }

    /// [`Worker::drive`] for an HTTP/2 connection: read, run the codec and the
    /// exchanges, write, until nothing more can happen without an event.
    pub(super) fn drive_h2(&mut self, idx: usize) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut close = false;
        let mut end = false;
        let mut again = false;
        if let Some((sess, _)) = c.h2_parts() {
            sess.out.conn.begin_turn(now);
        }
        // The last read stopped at its cap: the socket may hold more.
        let mut full = false;
        for _ in 0..MAX_ROUNDS {
            let Some((sess, io)) = c.h2_parts() else { return };
            full = false;
            let conn = &mut sess.out.conn;
            let backlog = io.out.len() - io.out_pos;
            if !io.eof && conn.input_len() < READ_AHEAD && backlog <= HIGH_WATERMARK {
                match io.fill(&mut self.scratch, READ_AHEAD) {
                    Ok(eof) => io.eof = eof,
                    Err(_) => {
                        close = true;
                        break;
                    }
                }
                full = io.inbuf.len() >= READ_AHEAD;
            }
            // Also what was read before the connection turned out to be HTTP/2.
            if !io.inbuf.is_empty() {
                if let Some(u) = &mut sess.unfinished {
                    u.feed(&io.inbuf, now);
                }
                conn.feed(&io.inbuf);
                io.inbuf.clear();
            }
            if io.eof && !sess.eof_fed {
                sess.eof_fed = true;
                conn.feed_eof();
            }
            // Lent to the engine for the step (a move of a few words; its arena stays).
            let mut heads = std::mem::take(&mut sess.heads);
            again = sess.step(&mut engine_cx!(self, &mut glue, &mut heads), now);
            sess.heads = heads;
            let conn = &mut sess.out.conn;
            let before = io.out.len();
            if io.out.len() - io.out_pos <= HIGH_WATERMARK {
                conn.drain_output(&mut io.out);
            }
            let produced = io.out.len() > before;
            if io.flush().is_err() {
                close = true;
                break;
            }
            let pending = io.flushed(now);
            if sess.out.closed && conn.output_len() == 0 {
                end = !pending;
                break;
            }
            if io.eof && sess.ex.is_empty() && conn.output_len() == 0 && !pending {
                close = true;
                break;
            }
            // The turn's frames are read: the rest of the input (and of the
            // socket) waits for the next turn, after the other connections.
            if conn.throttled() {
                again = true;
                break;
            }
            // Go on while the socket had more to read, or while the socket
            // took everything and h2 has output (or may make more, now that
            // there is room). A drive that only flushed an older backlog
            // (the socket's writable edge) leaves h2's output queued: no
            // event would come for it, and the connection would stall until
            // some unrelated one.
            let queued = conn.output_len() > 0;
            if !(full || (!pending && (produced || queued))) {
                break;
            }
        }
        // Out of rounds with input left in the socket: after the other connections'
        // turn, come back for it (and for a FIN behind it, which raises no new edge).
        again |= full;
        let generation = c.generation;
        let (effects, relays) = match c.h2_parts() {
            Some((sess, _)) => (std::mem::take(&mut sess.ex.effects), sess.ex.relays_ready().collect()),
            None => Default::default(),
        };
        self.carry_out(effects);
        self.resume_relays(relays);
        if close {
            self.close(idx);
            return;
        }
        if end {
            self.end(idx);
            return;
        }
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        if c.generation != generation {
            return;
        }
        if again {
            self.drained.push((idx, generation));
        }
        self.arm(idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http2::sniff::PREFACE;

    #[test]
    fn a_session_owes_its_preface_then_a_stalled_header_block_within_the_header_timeout() {
        let env = Env::testing();
        let now = Instant::now();
        let mut sess = H2Session::new(H2Settings::default(), 0, 0, std::net::Ipv4Addr::LOCALHOST.into(), None, now);
        assert_eq!(sess.deadline(&env), Some(now + env.header_timeout), "the preface is owed");
        let fed = now + Duration::from_millis(100);
        sess.unfinished.as_mut().expect("watched").feed(PREFACE, fed);
        assert_eq!(sess.deadline(&env), Some(now + env.keepalive_timeout), "then the session idles");
        // HEADERS on stream 1 without END_HEADERS: the head is owed from its first byte.
        let headers = [0, 0, 1, 0x1, 0x1, 0, 0, 0, 1, 0x82];
        sess.unfinished.as_mut().expect("watched").feed(&headers, fed);
        assert_eq!(sess.deadline(&env), Some(fed + env.header_timeout));
    }
}
