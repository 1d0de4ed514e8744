//! HTTP/2 connections in the worker: the loop's side of [`H2Conn`].
//!
//! A connection is HTTP/2 when a plain one opens with the client preface
//! (prior knowledge, h2c) or a TLS one negotiated `h2` by ALPN. Its
//! [`H2Session`] owns the codec behind an [`H2Sink`] and the engine's
//! [`Exchanges`], one per open stream (`exchange/`: dispatch, answers,
//! producers). This module moves bytes between the connection's transport
//! and the codec, turns the codec's events into engine calls, and decides
//! how the connection ends (GOAWAY, the keep-alive and header timers, the
//! drain). Streamed bodies go out in the order of their requests'
//! `priority` (RFC 9218, [`Scheduler`]): each pass offers the most urgent
//! ready streams a [`QUANTUM`] of DATA and lets less urgent ones wait while
//! those can go on. It never looks at a route and never writes HTTP/2
//! frames itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::exchange::Download;
use super::exchange::SLICE;
use super::exchange::{self, engine_cx, Cx, Exchange, Exchanges, Gone, Key, Opening, Produce, Reset, Sink};
use super::pool::{ExchangeId, Pool, Work};
use super::{Glue, Worker, READ_AHEAD};
use crate::error::Error;
use crate::http::reply::FileRange;
use crate::http::service::{Env, Protocol, HIGH_WATERMARK};
use crate::http2::request::{self, Fault};
use crate::http2::{
    Event, H2Conn, H2Error, H2Settings, Heads, Priority, Reason, RequestHead, ResponseFields, Scheduler, Sent, StreamId,
};

/// After the two-step GOAWAY of a connection that reached its keep-alive
/// timeout with a response still queued in h2, the peer gets this long to
/// take it before the connection is cut.
const GOAWAY_GRACE: Duration = Duration::from_secs(2);

/// A draining connection that is busy gets this long (at most half its
/// time to the cut) to fall quiet and be closed with one final GOAWAY;
/// past it, the two-step GOAWAY tells its client to stop while its open
/// streams finish.
const QUIET_WAIT: Duration = Duration::from_secs(2);

/// Streams the peer may reset before we answered them, per connection; one
/// more ends the connection with `GOAWAY(ENHANCE_YOUR_CALM)`. h2 catches a
/// burst of resets; this catches the slow kind (one HEADERS + RST_STREAM per
/// read), which h2 never sees as a burst.
const MAX_PEER_RESETS: u32 = 200;

/// Event-handling rounds per drive before the connection yields to the others.
const MAX_ROUNDS: usize = 32;

/// The least a download whose stream has any room reads ahead (a page): a
/// tiny window does not make a pool job per few bytes.
const READ_FLOOR: usize = 4 * 1024;
/// Body bytes a download must have sent before it reads ahead beyond its
/// window: more than any initial window, so its client has shown, by its
/// WINDOW_UPDATEs, that it reads.
const PROVEN: u64 = 256 * 1024;
/// Body bytes handed to h2 per stream per scheduling pass (one default-size
/// DATA frame): h2 interleaves whatever it holds round-robin, so what it holds
/// stays small and a more urgent stream that turns up is not queued behind
/// a less urgent one's buffered tail.
const QUANTUM: usize = 16 * 1024;

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

/// The write side of an HTTP/2 connection: the codec, and who of the streams with DATA
/// ready sends next (RFC 9218).
pub(super) struct H2Sink {
    conn: H2Conn,
    scheduler: Scheduler,
    /// Scratch: the streams with DATA ready, for the scheduler.
    ready: Vec<(StreamId, Priority)>,
}

impl Key for StreamId {
    fn id(self, conn: usize, gen: u32) -> ExchangeId {
        ExchangeId::H2 { conn, stream: self.0, gen }
    }
}

impl exchange::Head for RequestHead {
    #[inline]
    fn method(&self) -> &str {
        RequestHead::method(self)
    }

    #[inline]
    fn path(&self) -> &str {
        RequestHead::path(self)
    }

    #[inline]
    fn authority(&self) -> Option<&str> {
        RequestHead::authority(self)
    }

    #[inline]
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        RequestHead::fields(self)
    }

    #[inline]
    fn field(&self, name: &str) -> Option<&[u8]> {
        RequestHead::field(self, name)
    }
}

impl Sink for H2Sink {
    type Stream = StreamId;

    fn informational(&mut self, stream: StreamId, fields: &ResponseFields) -> Result<(), Gone> {
        self.conn.early_hints_with(stream, fields).map_err(|_| Gone)
    }

    fn send_head(
        &mut self,
        stream: StreamId,
        status: http::StatusCode,
        fields: &ResponseFields,
        end: bool,
    ) -> Result<(), Gone> {
        self.conn.respond_with(stream, status, fields, end).map_err(|_| Gone)
    }

    fn send_data(&mut self, stream: StreamId, data: Bytes, end: bool) -> Result<(), Gone> {
        self.conn.send_data(stream, data, end).map_err(|_| Gone)
    }

    fn reset(&mut self, stream: StreamId, why: Reset) {
        let reason = match why {
            Reset::Cancel => Reason::CANCEL,
            Reset::Internal => Reason::INTERNAL_ERROR,
        };
        let _ = self.conn.reset(stream, reason);
    }

    fn release(&mut self, stream: StreamId, n: usize) {
        let _ = self.conn.release(stream, n);
    }

    fn file_body(f: FileRange) -> Produce {
        Produce::Download(Download::new(f.file, f.offset, f.len, false))
    }

    /// Read slices, in order, into the unsent bytes; the next reads are asked for when the
    /// stream is offered a turn ([`Sink::pump`]).
    fn feed<H>(&mut self, ex: &mut Exchange<StreamId, H>, _pool: &Pool, _id: ExchangeId) -> bool {
        if let Some(Produce::Download(d)) = &mut ex.produce {
            while ex.unsent.len() < SLICE {
                let Some(bytes) = d.take_next() else { break };
                if ex.unsent.is_empty() {
                    ex.unsent = bytes;
                } else {
                    ex.unsent.extend_from_slice(&bytes);
                }
            }
            if d.done() {
                ex.done = true;
            }
        }
        false
    }

    /// One scheduling pass (RFC 9218): DATA for the streams with unsent bytes, the most
    /// urgent first, at most [`QUANTUM`] each, and disk reads for downloads as far as their
    /// windows allow.
    fn pump<H>(&mut self, exchanges: &mut [Exchange<StreamId, H>], pool: &Pool, conn_idx: usize, gen: u32) -> bool {
        // No room in the output: every stream would be blocked.
        if self.conn.output_len() >= self.conn.settings().output_high_watermark {
            return false;
        }
        self.ready.clear();
        self.ready.extend(
            exchanges
                .iter()
                .filter(|e| e.streaming() && (!e.unsent.is_empty() || reading(e) || unread(e)))
                .map(|e| (e.stream, e.priority)),
        );
        if self.ready.is_empty() {
            return false;
        }
        let mut queued = false;
        let conn = &mut self.conn;
        let pass = self.scheduler.pass(&self.ready, |stream| {
            let Some(ex) = exchanges.iter_mut().find(|e| e.stream == stream) else { return Sent::Nothing };
            // What the stream may send before this turn's bytes: its window, up to h2's
            // buffer (nothing of it is queued in h2 while the output has room).
            let room = if unread(ex) { conn.writable(ex.stream) } else { 0 };
            let sent = send_quantum(conn, ex);
            if ex.gone {
                queued = true;
                return Sent::All;
            }
            queued |= sent > 0;
            if unread(ex) {
                read_ahead(ex, room, pool, ex.stream.id(conn_idx, gen));
            }
            if ex.unsent.is_empty() {
                if reading(ex) {
                    Sent::Pending
                } else if unread(ex) {
                    // Its window is closed: nothing was read for it.
                    Sent::Nothing
                } else {
                    Sent::All
                }
            } else if sent >= QUANTUM {
                Sent::Quantum
            } else if sent > 0 {
                Sent::Short
            } else {
                Sent::Nothing
            }
        });
        // Only the most urgent blocked stream keeps asking h2 for window: h2 gives window
        // the peer opens to the streams that asked, first come first served, whatever
        // their priority.
        for stream in pass.release {
            self.conn.unreserve(stream);
        }
        if let Some(stream) = pass.keeper {
            self.conn.writable(stream);
        }
        queued
    }
}

/// A download whose next bytes are being read from disk (or are read, not yet moved into
/// `unsent`): more comes without the peer's help.
fn reading<H>(ex: &Exchange<StreamId, H>) -> bool {
    matches!(&ex.produce, Some(Produce::Download(d)) if d.reading())
}

/// A download with bytes still to read: they are read once its stream's window has room.
fn unread<H>(ex: &Exchange<StreamId, H>) -> bool {
    matches!(&ex.produce, Some(Produce::Download(d)) if d.unread())
}

/// Ask the pool for a download's next bytes, as many as the stream may send now (`room`,
/// what [`H2Conn::writable`] said before its turn) less those already held or asked for, at
/// least [`READ_FLOOR`] once it has any room. A stream that has sent [`PROVEN`] bytes and
/// whose window is open beyond h2's buffer reads two [`SLICE`]s more, so that the disk keeps
/// ahead of a fast client. A stream whose window is closed reads nothing; one that stalls
/// early holds at most what its window let it read.
fn read_ahead<H>(ex: &mut Exchange<StreamId, H>, room: usize, pool: &Pool, id: ExchangeId) {
    let Some(Produce::Download(d)) = &mut ex.produce else { return };
    if room == 0 {
        return;
    }
    let want = if room >= SLICE && ex.body_sent >= PROVEN { room + 2 * SLICE } else { room.max(READ_FLOOR) };
    let mut held = ex.unsent.len().saturating_add(usize::try_from(d.ahead()).unwrap_or(usize::MAX));
    // Whole slices while something is held: fewer, larger reads.
    while held < want && (held == 0 || want - held >= SLICE) {
        let Some((at, len, buf)) = d.next_read(want - held) else { break };
        held += len;
        pool.submit(id, Work::Read(Arc::clone(d.file()), at, len, buf));
    }
}

/// Move a download's next slice, if it is read, into `unsent`; whether one was.
fn refill<H>(ex: &mut Exchange<StreamId, H>) -> bool {
    let Some(Produce::Download(d)) = &mut ex.produce else { return false };
    let Some(bytes) = d.take_next() else { return false };
    if d.done() {
        ex.done = true;
    }
    if ex.unsent.is_empty() {
        ex.unsent = bytes;
    } else {
        ex.unsent.extend_from_slice(&bytes);
    }
    !ex.unsent.is_empty()
}

/// Hand h2 up to [`QUANTUM`] of exchange `ex`'s unsent bytes, as its stream's window
/// allows, taking its download's read slices as needed. Returns the bytes handed over;
/// `ex.gone` once its body ended or its stream failed.
fn send_quantum<H>(conn: &mut H2Conn, ex: &mut Exchange<StreamId, H>) -> usize {
    let mut sent = 0;
    while sent < QUANTUM {
        if ex.unsent.is_empty() && !refill(ex) {
            break;
        }
        let n = conn.writable(ex.stream).min(QUANTUM - sent);
        if n == 0 {
            break;
        }
        let chunk = if n >= ex.unsent.len() {
            Bytes::from(std::mem::take(&mut ex.unsent))
        } else {
            let c = Bytes::copy_from_slice(&ex.unsent[..n]);
            ex.unsent.drain(..n);
            c
        };
        let end = ex.done && ex.unsent.is_empty();
        sent += chunk.len();
        ex.body_sent += chunk.len() as u64;
        if conn.send_data(ex.stream, chunk, end).is_err() || end {
            ex.gone = true;
            break;
        }
    }
    sent
}

/// One HTTP/2 connection's state: the codec, its exchanges, how it ends.
pub(super) struct H2Session {
    out: H2Sink,
    events: Vec<Event>,
    ex: Exchanges<StreamId, RequestHead>,
    peer: std::net::IpAddr,
    /// How the connection is being ended.
    ending: Ending,
    /// The connection is cut at this deadline if still open.
    cut_at: Option<Instant>,
    /// What the peer started sending and has not finished (the preface, a frame, a header
    /// block), timed as a head; `None` once the connection is ended for it.
    unfinished: Option<crate::http2::Unfinished>,
    /// Streams the peer reset before their answer.
    peer_resets: u32,
    /// [`Event::Closed`] came: flush the output, then close.
    closed: bool,
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
            out: H2Sink { conn: H2Conn::new(settings), scheduler: Scheduler::new(), ready: Vec::new() },
            events: Vec::new(),
            ex: Exchanges::new(conn, gen, peer, Protocol::Http2, tls, true, now),
            peer,
            ending: Ending::No,
            cut_at: None,
            unfinished: Some(crate::http2::Unfinished::new(now)),
            peer_resets: 0,
            closed: false,
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

    /// Drive the codec and answer what it reports, until it goes quiet (or [`MAX_ROUNDS`]).
    /// Returns whether events are left for the next drive.
    fn step(&mut self, cx: &mut Cx<'_, Glue<'_>>, now: Instant) -> bool {
        for _ in 0..MAX_ROUNDS {
            self.out.conn.advance(&mut self.events);
            let quiet = self.events.is_empty();
            // Drained in place and put back: its allocation serves every round.
            let mut events = std::mem::take(&mut self.events);
            for event in events.drain(..) {
                self.on_event(event, cx, now);
            }
            self.events = events;
            if !self.ex.service(&mut self.out, cx) && quiet {
                if matches!(self.ending, Ending::WhenQuiet { .. }) && self.quiet() {
                    // Draining, and nothing is open: the final GOAWAY.
                    self.final_goaway();
                    continue;
                }
                return false;
            }
        }
        self.out.conn.advance(&mut self.events);
        !self.events.is_empty()
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx<'_, Glue<'_>>, now: Instant) {
        match event {
            Event::Request { stream, head } => self.on_request(stream, head, cx, now),
            Event::Data { stream, bytes, end } => self.ex.data(stream, &bytes, end, &mut self.out, cx, now),
            Event::Writable { .. } => {}
            Event::Reset { stream, .. } => {
                if self.ex.cancel(stream, cx.sse) {
                    self.peer_resets += 1;
                    if self.peer_resets > MAX_PEER_RESETS {
                        log::debug!("HTTP/2: too many streams reset by the peer");
                        self.out.conn.abort(Reason::ENHANCE_YOUR_CALM);
                    }
                }
            }
            Event::Closed { error } => {
                match error {
                    Some(H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), remote: false, .. }) => {
                        log::info!("HTTP/2 flood from {}: GOAWAY(ENHANCE_YOUR_CALM)", self.peer);
                    }
                    Some(e) => log::debug!("HTTP/2 connection ended: {e}"),
                    None => {}
                }
                self.closed = true;
                self.ex.close_all(cx.sse);
            }
        }
    }

    fn on_request(&mut self, stream: StreamId, head: RequestHead, cx: &mut Cx<'_, Glue<'_>>, now: Instant) {
        // RFC 8441: the stream is the tunnel; the request is complete with its head.
        let tunnel = head.method() == "CONNECT" && head.protocol() == Some("websocket");
        let declared =
            head.field("content-length").and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        let priority = Priority::from_fields(head.field_all("priority"));
        let end_stream = head.end_stream;
        let refused = match request::check(&head, self.out.conn.settings().max_header_list_size as usize) {
            Err(Fault::TooLarge) => Some(Error::HeaderTooLarge),
            Err(Fault::Malformed(why)) => Some(Error::bad_request(why)),
            Ok(()) if declared.is_some_and(|n| n > cx.env.max_body) => Some(Error::PayloadTooLarge),
            Ok(()) => None,
        };
        let opening = Opening { stream, head, priority, body_follows: !end_stream, tunnel };
        self.ex.request(opening, refused, end_stream || tunnel, &mut self.out, cx, now);
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
            if sess.closed && conn.output_len() == 0 {
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

    /// The HTTP/2 connection's timer fired: 408 on streams whose body is
    /// late, the final GOAWAY when idle ([`Ending`]), the two-step GOAWAY
    /// when a drain found no quiet moment in time, the cut at its deadline,
    /// the end of a connection whose head is late.
    pub(super) fn h2_timer(&mut self, idx: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let Some((sess, _)) = c.h2_parts() else { return };
        if sess.head_since().is_some_and(|t| t + self.env.header_timeout <= now) {
            // The preface, a header block or a frame not finished within the header
            // timeout. A stream whose header block is incomplete cannot be answered
            // (its fields are unknown, and nothing but its CONTINUATION may follow), so
            // the connection ends: GOAWAY(PROTOCOL_ERROR), then the close, as nginx does.
            log::debug!("HTTP/2: head not finished within the header timeout; closing");
            sess.unfinished = None;
            sess.out.conn.abort(Reason::PROTOCOL_ERROR);
        }
        if sess.cut_at.is_some_and(|t| t <= now) {
            sess.cut_at = None;
            sess.out.conn.abort(Reason::NO_ERROR);
        } else if matches!(sess.ending, Ending::WhenQuiet { by } if by <= now) && !sess.quiet() {
            // Still busy: tell the client to stop; its open streams finish.
            let cut_at = sess.cut_at.unwrap_or(now + GOAWAY_GRACE);
            sess.go_away(cut_at);
        } else if sess.ex.idle_since.is_some_and(|t| t + self.env.keepalive_timeout <= now) {
            sess.ex.idle_since = None;
            if sess.quiet() {
                sess.final_goaway();
            } else {
                // No exchange, but h2 still holds a response the client has
                // not taken (its window is closed): it gets a little longer.
                sess.go_away(now + GOAWAY_GRACE);
            }
        }
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        sess.ex.tick(&glue, now);
        let (ex, out, heads) = sess.parts();
        let mut cx = engine_cx!(self, &mut glue, heads);
        ex.expire(out, &mut cx, now);
        self.drive_h2(idx);
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

    #[test]
    fn a_head_for_an_unknown_stream_is_refused() {
        let mut sink =
            H2Sink { conn: H2Conn::new(H2Settings::default()), scheduler: Scheduler::new(), ready: Vec::new() };
        let fields = ResponseFields::default();
        assert!(sink.send_head(StreamId(1), http::StatusCode::OK, &fields, true).is_err());
    }
}
