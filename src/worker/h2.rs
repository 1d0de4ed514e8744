//! HTTP/2 connections in the worker: the loop's side of [`H2Conn`].
//!
//! A connection is HTTP/2 when a plain one opens with the client preface
//! (prior knowledge, h2c) or a TLS one negotiated `h2` by ALPN. Its
//! [`H2Session`] owns the codec and one [`Exchange`] per open stream, keyed
//! by stream id: everything above the codec (pool completions through
//! [`ExchangeId`], per-stream body timeouts, the access log) is per exchange,
//! never per connection. Requests go through the same [`Glue`] and
//! `App::handle` as HTTP/1.1; answers are rendered by the same response
//! writer and handed to h2 as a head and DATA, without the HTTP/1.1
//! connection fields.
//!
//! This module moves bytes between the connection's socket buffers and the
//! codec and turns events into exchanges. It never looks at a route and
//! never writes HTTP/2 frames itself. Streamed bodies go out in the order of
//! their requests' `priority` (RFC 9218, [`Scheduler`]): each pass offers
//! the most urgent ready streams a [`QUANTUM`] of DATA and lets less urgent
//! ones wait while those can go on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::call::CallState;
use super::conn::ConnState;
use super::download::Download;
use super::fanout::MAX_BACKLOG;
use super::panics::guard;
use super::pool::{Completion, ExchangeId, Pool, Work};
use super::produce::{Events, Ticking, SLICE};
use super::websocket::{Todo, Ws, WS_PING_EVERY};
use super::{Glue, Worker, READ_AHEAD};
use crate::app::{Body, Producer, Services, WebSocket};
use crate::error::Error;
use crate::http::headers::valid_request_id;
use crate::http::reply::{FileRange, Upstream};
use crate::http::request::{Method, Request};
use crate::http::response::{Delimit, RequestMeta, Response};
use crate::http::service::{Env, Finished, Service, HIGH_WATERMARK};
use crate::http2::request::{self, Fault};
use crate::http2::{
    Event, H2Conn, H2Error, H2Settings, Head, Heads, Priority, Reason, RequestHead, Scheduler, Sent, StreamId,
};

/// Request fields looked up by name (constants: no name parsing per lookup).
const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
const PRIORITY: http::HeaderName = http::HeaderName::from_static("priority");
const SEC_WEBSOCKET_KEY: http::HeaderName = http::header::SEC_WEBSOCKET_KEY;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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

/// What the first bytes of a connection say it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sniff {
    /// HTTP/1.1.
    H1,
    /// HTTP/2.
    H2,
    /// Not known yet: more bytes (or the TLS handshake) are needed.
    Wait,
}

/// Classify a connection from its first plaintext bytes and, over TLS, the
/// protocol ALPN chose (`Some` once the handshake is done).
pub(super) fn sniff(first: &[u8], tls: Option<Option<&[u8]>>) -> Sniff {
    match tls {
        Some(None) => Sniff::Wait,
        Some(Some(alpn)) if alpn == b"h2" => Sniff::H2,
        Some(Some(_)) => Sniff::H1,
        None if first.len() >= PREFACE.len() => {
            if first.starts_with(PREFACE) {
                Sniff::H2
            } else {
                Sniff::H1
            }
        }
        None if PREFACE.starts_with(first) => Sniff::Wait,
        None => Sniff::H1,
    }
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

/// Where an exchange is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The request body is arriving.
    Receiving,
    /// The handler's job runs on the pool.
    Waiting,
}

/// What produces a streamed body after its head.
enum Produce {
    /// An `/api/events` subscription.
    Events(Events),
    /// Events from a timer (the chat echo).
    Ticker(Ticking),
    /// A WebSocket over an extended CONNECT (RFC 8441): its frames are the
    /// stream's DATA both ways.
    Ws {
        ws: Box<Ws>,
        /// Received bytes not yet read as frames: the start of a frame, or,
        /// while the stream's output is backed up, whole frames waiting.
        input: Vec<u8>,
        /// Bytes of `input` not yet handed back to the peer's flow control:
        /// while the output is backed up nothing is, so the peer's stream
        /// window closes and its frames wait on its side (back pressure, as
        /// an HTTP/1.1 WebSocket stops reading its socket).
        unreleased: usize,
        /// The peer ended its side of the stream.
        peer_ended: bool,
    },
    /// A byte range of a file, read on the pool slice by slice (the same
    /// bookkeeping as an HTTP/1.1 download; `sent` counts bytes moved into the
    /// stream's unsent bytes).
    Download(Download),
}

impl Produce {
    fn deadline(&self) -> Option<Instant> {
        match self {
            Produce::Events(e) => Some(e.next()),
            Produce::Ticker(t) => Some(t.next()),
            Produce::Ws { ws, .. } => Some(ws.next_ping),
            Produce::Download(_) => None,
        }
    }
}

/// The id answered in `x-request-id`: the client's own when it is valid,
/// else a fresh UUID; neither is a separate allocation.
enum RequestId {
    /// The client's `x-request-id` (checked by `valid_request_id`: ASCII).
    Given(http::HeaderValue),
    /// A fresh UUID v4.
    Fresh([u8; 36]),
}

impl RequestId {
    /// The client's `x-request-id` among `headers` if it is valid, else a
    /// fresh UUID from `common`.
    fn of(headers: &http::HeaderMap, common: &mut crate::http::headers::Common) -> RequestId {
        match headers.get(X_REQUEST_ID) {
            Some(v) if valid_request_id(v.as_bytes()) => RequestId::Given(v.clone()),
            _ => {
                let mut u = [0u8; 36];
                common.uuid(&mut u);
                RequestId::Fresh(u)
            }
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Given(v) => v.as_bytes(),
            RequestId::Fresh(u) => u,
        }
    }

    /// Both kinds are ASCII, so the fallback never shows.
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

/// One request/response exchange: one stream.
struct Exchange {
    stream: StreamId,
    method: Method,
    /// The head as h2 received it: `:path` (see [`Exchange::target`]),
    /// `:authority`, the fields. Kept whole, not copied field by field.
    head: RequestHead,
    /// The request body so far.
    body: Vec<u8>,
    stage: Stage,
    started: Instant,
    /// The whole body within `limits.body_timeout_ms` of the head.
    deadline: Option<Instant>,
    request_id: RequestId,
    label: u16,
    /// The response head is sent and its body follows from `produce`.
    streaming: bool,
    produce: Option<Produce>,
    /// Body bytes produced and not yet accepted by the stream's flow control.
    unsent: Vec<u8>,
    /// The body is complete once `unsent` is sent.
    done: bool,
    /// The upstream requests this exchange waits on, or its relay.
    call: Option<CallState>,
    /// An extended CONNECT for `websocket` (RFC 8441).
    connect_ws: bool,
    /// Its `priority` (RFC 9218): the order its DATA goes out in.
    priority: Priority,
    /// Its body ended, or its stream failed, while sending: it is removed
    /// after the scheduling pass.
    gone: bool,
    /// Body bytes handed to h2 so far.
    body_sent: u64,
}

impl Exchange {
    /// `:path` with the query, for the handler and the access log (`/` for
    /// a plain CONNECT, which has none).
    fn target(&self) -> &str {
        match self.head.path() {
            "" => "/",
            path => path,
        }
    }

    /// A download whose next bytes are being read from disk (or are read,
    /// not yet moved into `unsent`): more comes without the peer's help.
    fn reading(&self) -> bool {
        matches!(&self.produce, Some(Produce::Download(d)) if d.reading())
    }

    /// A download with bytes still to read: they are read once its stream's
    /// window has room for them.
    fn unread(&self) -> bool {
        matches!(&self.produce, Some(Produce::Download(d)) if d.unread())
    }

    /// Ask the pool for a download's next bytes, as many as the stream may
    /// send now (`room`, what [`H2Conn::writable`] said before its turn) less
    /// those already held or asked for, at least [`READ_FLOOR`] once it has
    /// any room. A stream that has sent [`PROVEN`] bytes and whose window is
    /// open beyond h2's buffer reads two [`SLICE`]s more, so that the disk
    /// keeps ahead of a fast client. A stream whose window is closed reads
    /// nothing; one that stalls early holds at most what its window let it
    /// read.
    fn read_ahead(&mut self, room: usize, pool: &Pool, id: ExchangeId) {
        let Some(Produce::Download(d)) = &mut self.produce else { return };
        if room == 0 {
            return;
        }
        let want = if room >= SLICE && self.body_sent >= PROVEN { room + 2 * SLICE } else { room.max(READ_FLOOR) };
        let mut held = self.unsent.len().saturating_add(usize::try_from(d.ahead()).unwrap_or(usize::MAX));
        // Whole slices while something is held: fewer, larger reads.
        while held < want && (held == 0 || want - held >= SLICE) {
            let Some((at, len, buf)) = d.next_read(want - held) else { break };
            held += len;
            pool.submit(id, Work::Read(Arc::clone(d.file()), at, len, buf));
        }
    }

    /// Move a download's next slice, if it is read, into `unsent`; whether
    /// one was.
    fn refill(&mut self) -> bool {
        let Some(Produce::Download(d)) = &mut self.produce else { return false };
        let Some(bytes) = d.take_next() else { return false };
        if d.done() {
            self.done = true;
        }
        if self.unsent.is_empty() {
            self.unsent = bytes;
        } else {
            self.unsent.extend_from_slice(&bytes);
        }
        !self.unsent.is_empty()
    }
}

/// One HTTP/2 connection's state: the codec and its exchanges.
pub(super) struct H2Session {
    conn: H2Conn,
    events: Vec<Event>,
    /// Open exchanges (few; searched linearly).
    exchanges: Vec<Exchange>,
    peer: std::net::IpAddr,
    secure: bool,
    /// Since when the connection has had no exchange (the keep-alive timer).
    idle_since: Option<Instant>,
    /// How the connection is being ended.
    ending: Ending,
    /// The connection is cut at this deadline if still open.
    cut_at: Option<Instant>,
    /// What the peer started sending and has not finished (the preface, a
    /// frame, a header block), timed as a head; `None` once the connection
    /// is ended for it.
    unfinished: Option<crate::http2::Unfinished>,
    /// Streams the peer reset before their answer.
    peer_resets: u32,
    /// [`Event::Closed`] came: flush the output, then close.
    closed: bool,
    /// The peer's EOF was handed to the codec.
    eof_fed: bool,
    /// Builds the HTTP/2 response heads.
    heads: Heads,
    /// Upstream waits the worker must start (it owns the upstream sockets).
    starts: Vec<(StreamId, Upstream)>,
    /// Upstream waits of exchanges that went away, for the worker to cancel.
    cancelled: Vec<(u32, CallState)>,
    /// What WebSocket messages asked the worker for (rooms), per stream.
    todo: Vec<(u32, Todo)>,
    /// WebSockets that went away, with the rooms they were in.
    left: Vec<(u32, Vec<String>)>,
    /// Who of the streams with DATA ready sends next (RFC 9218).
    scheduler: Scheduler,
    /// Scratch: the streams with DATA ready, for the scheduler.
    ready: Vec<(StreamId, Priority)>,
}

impl H2Session {
    /// A session whose preface (or part of it) may already be in `first`.
    pub(super) fn new(settings: H2Settings, peer: std::net::IpAddr, secure: bool, now: Instant) -> H2Session {
        H2Session {
            conn: H2Conn::new(settings),
            events: Vec::new(),
            exchanges: Vec::new(),
            peer,
            secure,
            idle_since: Some(now),
            ending: Ending::No,
            cut_at: None,
            unfinished: Some(crate::http2::Unfinished::new(now)),
            peer_resets: 0,
            closed: false,
            eof_fed: false,
            heads: Heads::new(),
            starts: Vec::new(),
            cancelled: Vec::new(),
            todo: Vec::new(),
            left: Vec::new(),
            scheduler: Scheduler::new(),
            ready: Vec::new(),
        }
    }

    /// The earliest deadline: a stream's body timeout, the idle timeout,
    /// the end of a drain's wait for a quiet moment, the cut, the header
    /// timeout of what the peer left unfinished.
    pub(super) fn deadline(&self, env: &Env) -> Option<Instant> {
        let idle = self.idle_since.map(|t| t + env.keepalive_timeout);
        let head = self.head_since().map(|t| t + env.header_timeout);
        let bodies = self.exchanges.iter().filter_map(|e| e.deadline).min();
        let producers = self.exchanges.iter().filter_map(|e| e.produce.as_ref()?.deadline()).min();
        let quiet_by = match self.ending {
            Ending::WhenQuiet { by } => Some(by),
            Ending::No | Ending::GoingAway => None,
        };
        [idle, head, bodies, producers, quiet_by, self.cut_at].into_iter().flatten().min()
    }

    /// Since when the peer has owed the rest of a head (or of the preface, or of a frame).
    fn head_since(&self) -> Option<Instant> {
        self.unfinished.as_ref().and_then(crate::http2::Unfinished::since)
    }

    /// Graceful stop: every event stream ends (as over HTTP/1.1, the client
    /// reconnects elsewhere). Returns their stream ids.
    pub(super) fn end_event_streams(&mut self) -> Vec<u32> {
        let mut ended = Vec::new();
        for ex in &mut self.exchanges {
            match &mut ex.produce {
                Some(Produce::Events(_)) => {
                    ex.produce = None;
                    ex.done = true;
                    ended.push(ex.stream.0);
                }
                // WebSockets: close 1001 (going away), then the stream ends.
                Some(Produce::Ws { ws, .. }) => {
                    ws.conn.close(1001, "server shutting down", &mut ex.unsent);
                    ex.done = true;
                }
                _ => {}
            }
        }
        ended
    }

    /// Stream ids of the event streams open on this connection.
    fn event_streams(&self) -> impl Iterator<Item = u32> + '_ {
        self.exchanges.iter().filter(|e| matches!(e.produce, Some(Produce::Events(_)))).map(|e| e.stream.0)
    }

    /// Drain the connection (the worker stops): the final GOAWAY as soon as
    /// no stream is open (at the next drive), else the two-step GOAWAY after
    /// [`QUIET_WAIT`] (at most half the time left); cut at `cut_at`.
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
        self.exchanges.is_empty() && self.conn.is_quiet()
    }

    /// The last frame: GOAWAY(last stream processed, `NO_ERROR`), then the
    /// close ([`Ending`]). Only when [`H2Session::quiet`].
    fn final_goaway(&mut self) {
        self.conn.abort(Reason::NO_ERROR);
    }

    /// The two-step GOAWAY (open streams finish), cut at `cut_at` at the latest.
    fn go_away(&mut self, cut_at: Instant) {
        self.conn.graceful_shutdown();
        self.ending = Ending::GoingAway;
        self.cut_at = Some(self.cut_at.map_or(cut_at, |t| t.min(cut_at)));
    }

    /// The WebSocket of exchange `stream`, its output, and that output's length.
    pub(super) fn ws_of(&mut self, stream: u32) -> Option<(&mut Ws, &mut Vec<u8>, usize)> {
        let i = self.find(StreamId(stream))?;
        let ex = &mut self.exchanges[i];
        let backlog = ex.unsent.len();
        match &mut ex.produce {
            Some(Produce::Ws { ws, .. }) => Some((ws, &mut ex.unsent, backlog)),
            _ => None,
        }
    }

    /// The upstream wait of exchange `stream`, while it is open.
    pub(super) fn call_slot(&mut self, stream: u32) -> Option<&mut Option<CallState>> {
        let i = self.find(StreamId(stream))?;
        Some(&mut self.exchanges[i].call)
    }

    fn find(&self, stream: StreamId) -> Option<usize> {
        self.exchanges.iter().position(|e| e.stream == stream)
    }

    fn remove(&mut self, i: usize, cx: &mut Cx<'_, '_>, now: Instant) {
        let ex = self.exchanges.swap_remove(i);
        if matches!(ex.produce, Some(Produce::Events(_))) {
            cx.sse.remove(&cx.id(ex.stream));
        }
        if let Some(call) = ex.call {
            self.cancelled.push((ex.stream.0, call));
        }
        if let Some(Produce::Ws { ws, .. }) = ex.produce {
            self.left.push((ex.stream.0, ws.rooms));
        }
        if self.exchanges.is_empty() {
            self.idle_since = Some(now);
        }
    }

    /// Drive the codec and answer what it reports, until it goes quiet (or
    /// [`MAX_ROUNDS`]). Returns whether events are left for the next drive.
    fn step(&mut self, cx: &mut Cx<'_, '_>, now: Instant) -> bool {
        for _ in 0..MAX_ROUNDS {
            self.conn.advance(&mut self.events);
            let quiet = self.events.is_empty();
            // Drained in place and put back: its allocation serves every round.
            let mut events = std::mem::take(&mut self.events);
            for event in events.drain(..) {
                self.on_event(event, cx, now);
            }
            self.events = events;
            if !self.service(cx, now) && quiet {
                if matches!(self.ending, Ending::WhenQuiet { .. }) && self.quiet() {
                    // Draining, and nothing is open: the final GOAWAY.
                    self.final_goaway();
                    continue;
                }
                return false;
            }
        }
        self.conn.advance(&mut self.events);
        !self.events.is_empty()
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx<'_, '_>, now: Instant) {
        match event {
            Event::Request { stream, head } => self.on_request(stream, head, cx, now),
            Event::Data { stream, bytes, end } => {
                let Some(i) = self.find(stream) else {
                    let _ = self.conn.release(stream, bytes.len());
                    return;
                };
                let ex = &mut self.exchanges[i];
                if let Some(Produce::Ws { input, unreleased, peer_ended, .. }) = &mut ex.produce {
                    // Released once read (`ws_input`), not while the output is backed up.
                    input.extend_from_slice(&bytes);
                    *unreleased += bytes.len();
                    *peer_ended |= end;
                    self.ws_input(i, cx);
                    return;
                }
                // Consumed at once (buffered here, bounded by the body limit).
                let _ = self.conn.release(stream, bytes.len());
                if ex.stage != Stage::Receiving {
                    return;
                }
                if (ex.body.len() + bytes.len()) as u64 > cx.env.max_body {
                    return self.fail(i, Error::PayloadTooLarge, cx, now);
                }
                ex.body.extend_from_slice(&bytes);
                if end {
                    self.dispatch(i, cx, now);
                }
            }
            Event::Writable { .. } => {}
            Event::Reset { stream, .. } => {
                if let Some(i) = self.find(stream) {
                    self.remove(i, cx, now);
                    self.peer_resets += 1;
                    if self.peer_resets > MAX_PEER_RESETS {
                        log::debug!("HTTP/2: too many streams reset by the peer");
                        self.conn.abort(Reason::ENHANCE_YOUR_CALM);
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
                while !self.exchanges.is_empty() {
                    self.remove(0, cx, now);
                }
            }
        }
    }

    fn on_request(&mut self, stream: StreamId, head: RequestHead, cx: &mut Cx<'_, '_>, now: Instant) {
        let request_id = RequestId::of(&head.headers, &mut cx.env.common);
        // RFC 8441: the stream is the tunnel; the request is complete with its head.
        let connect_ws = head.method == http::Method::CONNECT && head.protocol() == Some("websocket");
        let declared =
            head.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        let priority = Priority::from_fields(head.headers.get_all(PRIORITY).iter().map(|v| v.as_bytes()));
        let end_stream = head.end_stream;
        let ex = Exchange {
            stream,
            method: Method::parse(head.method.as_str()),
            head,
            body: Vec::new(),
            stage: Stage::Receiving,
            started: now,
            deadline: (!end_stream && !connect_ws).then(|| now + cx.env.body_timeout),
            request_id,
            label: 0,
            streaming: false,
            produce: None,
            unsent: Vec::new(),
            done: false,
            call: None,
            connect_ws,
            priority,
            gone: false,
            body_sent: 0,
        };
        let checked = request::check(&ex.head, self.conn.settings().max_header_list_size as usize);
        self.exchanges.push(ex);
        self.idle_since = None;
        let i = self.exchanges.len() - 1;
        match checked {
            Ok(()) => {}
            Err(Fault::TooLarge) => return self.fail(i, Error::HeaderTooLarge, cx, now),
            Err(Fault::Malformed(why)) => return self.fail(i, Error::bad_request(why), cx, now),
        }
        if declared.is_some_and(|n| n > cx.env.max_body) {
            return self.fail(i, Error::PayloadTooLarge, cx, now);
        }
        if end_stream || connect_ws {
            self.dispatch(i, cx, now);
        }
    }

    /// The request is complete: hand it to the app.
    fn dispatch(&mut self, i: usize, cx: &mut Cx<'_, '_>, now: Instant) {
        let ex = &mut self.exchanges[i];
        ex.deadline = None;
        let reply = {
            // The handlers' view of the fields, on the stack unless there are many.
            let mut stack = [httparse::EMPTY_HEADER; STACK_FIELDS];
            let heap: Vec<httparse::Header<'_>>;
            let n = handler_fields(ex).count();
            let headers: &[httparse::Header<'_>] = if n <= STACK_FIELDS {
                for (slot, field) in stack.iter_mut().zip(handler_fields(ex)) {
                    *slot = field;
                }
                &stack[..n]
            } else {
                heap = handler_fields(ex).collect();
                &heap
            };
            let mut hosts = headers.iter().filter(|h| h.name == "host");
            match (hosts.next(), hosts.next()) {
                (Some(host), None) if crate::http::target::valid_host(host.value) => {
                    let (path, query) = crate::http::target::split_target(ex.target());
                    let req = Request {
                        method: if ex.connect_ws { Method::Get } else { ex.method },
                        path,
                        query,
                        http10: false,
                        headers,
                        body: &ex.body,
                        request_id: ex.request_id.as_str(),
                        peer: self.peer,
                        secure: self.secure,
                    };
                    Ok(cx.glue.call(&req))
                }
                _ => Err(Error::bad_request("missing or repeated Host")),
            }
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return self.fail(i, e, cx, now),
        };
        let ex = &mut self.exchanges[i];
        ex.label = cx.glue.label();
        if ex.connect_ws && !matches!(reply.body, Body::WebSocket(_)) {
            // An extended CONNECT to a route that is not a WebSocket: the
            // route's error stands; what a GET would have got is not for a
            // CONNECT (a 2xx would open a tunnel), and nothing of it runs.
            if matches!(reply.body, Body::Full) && reply.head.status >= 400 {
                self.answer(i, reply.head, Delimit::Length, cx, now);
            } else {
                self.fail(i, Error::bad_request("not a WebSocket endpoint"), cx, now);
            }
            return;
        }
        ex.body = Vec::new();
        match reply.body {
            Body::Full => {
                self.answer(i, reply.head, Delimit::Length, cx, now);
            }
            Body::Job(job) => {
                ex.stage = Stage::Waiting;
                cx.pool.submit(cx.id(ex.stream), Work::Request(job));
            }
            Body::Producer(p) => {
                if self.answer(i, reply.head, Delimit::Chunked, cx, now) {
                    self.start_producer(i, p, cx, now);
                }
            }
            Body::File(f) => {
                let len = f.len;
                if self.answer(i, reply.head, Delimit::Sized(len), cx, now) {
                    let FileRange { file, offset, len } = f;
                    let ex = &mut self.exchanges[i];
                    ex.produce = Some(Produce::Download(Download::new(file, offset, len, false)));
                    ex.done = len == 0;
                }
            }
            Body::Upstream(up) => {
                ex.stage = Stage::Waiting;
                let stream = ex.stream;
                self.starts.push((stream, up));
            }
            Body::WebSocket(ws) if ex.connect_ws => self.start_websocket(i, ws, cx, now),
            // Only an extended CONNECT opens a WebSocket over HTTP/2.
            Body::WebSocket(_) => self.fail(i, Error::bad_request("WebSocket needs an extended CONNECT"), cx, now),
        }
    }

    /// Answer exchange `i` with an error response (its stream ends; h2
    /// resets the rest of a body still arriving with `NO_ERROR`).
    fn fail(&mut self, i: usize, e: Error, cx: &mut Cx<'_, '_>, now: Instant) {
        self.exchanges[i].label = 0;
        let mut resp = e.into_response(cx.env.development);
        cx.env.announce(&mut resp, self.secure);
        self.answer(i, resp, Delimit::Length, cx, now);
    }

    /// Send `resp` on exchange `i`'s stream and log it. With
    /// `Delimit::Length` (or for `HEAD`) the response is whole and the
    /// exchange is forgotten; otherwise its body follows (returns `true`).
    fn answer(&mut self, i: usize, mut resp: Response, delimit: Delimit, cx: &mut Cx<'_, '_>, now: Instant) -> bool {
        let ex = &self.exchanges[i];
        let head_only = ex.method == Method::Head;
        let follows = !head_only && delimit != Delimit::Length;
        let meta = RequestMeta {
            delimit,
            head: head_only,
            http10: false,
            keep_alive: true,
            request_id: ex.request_id.as_bytes(),
        };
        let (bytes, sent) = match self.heads.build(&mut resp, &meta, &mut cx.env.common) {
            Ok(head) => (head.body.len(), send_head(&mut self.conn, ex.stream, head, follows)),
            Err(e) => (0, Err(e)),
        };
        cx.glue.finished(&Finished {
            method: if ex.method == Method::Other { "OTHER" } else { ex.method.as_str() },
            target: ex.target().as_bytes(),
            status: resp.status,
            bytes,
            elapsed: ex.started.elapsed(),
            request_id: ex.request_id.as_bytes(),
            label: ex.label,
        });
        if follows && sent.is_ok() {
            let ex = &mut self.exchanges[i];
            ex.streaming = true;
            ex.stage = Stage::Waiting;
            true
        } else {
            self.remove(i, cx, now);
            false
        }
    }

    /// Exchange `i` (an extended CONNECT) was accepted as a WebSocket: 200,
    /// then WebSocket frames in the stream's DATA.
    fn start_websocket(&mut self, i: usize, w: WebSocket, cx: &mut Cx<'_, '_>, now: Instant) {
        if !self.answer(i, Response::new(200), Delimit::Upgrade, cx, now) {
            return;
        }
        let WebSocket { user_id, name, .. } = w;
        let ex = &mut self.exchanges[i];
        let mut conn = crate::proto::ws::WsConn::new(cx.svc.config.websocket.max_message_bytes);
        let hello = user_id.map(|uid| guard("WebSocket greeting", || crate::app::handlers::ws::connected(uid)));
        match hello {
            Some(Ok(hello)) => conn.send_text(&hello, &mut ex.unsent),
            Some(Err(_)) => {
                conn.close(1011, "internal error", &mut ex.unsent);
                ex.done = true;
            }
            None => {}
        }
        ex.produce = Some(Produce::Ws {
            ws: Box::new(Ws::new(conn, user_id, name, now)),
            input: Vec::new(),
            unreleased: 0,
            peer_ended: false,
        });
        let n = cx.svc.stats.ws.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        cx.glue.metrics.set_websocket_clients(n);
    }

    /// Read WebSocket exchange `i`'s received frames and hand their bytes
    /// back to the peer's flow control, unless its output is backed up (more
    /// than `HIGH_WATERMARK` unsent): then they wait, unreleased, so the
    /// peer's stream window closes once it has sent one window's worth, and
    /// are read when the output drains (`service`). Returns whether it read.
    fn ws_input(&mut self, i: usize, cx: &mut Cx<'_, '_>) -> bool {
        let ex = &mut self.exchanges[i];
        let Some(Produce::Ws { ws, input, unreleased, peer_ended }) = &mut ex.produce else { return false };
        if ex.done {
            // Closing: what still comes is dropped, and its window given back.
            input.clear();
            let _ = self.conn.release(ex.stream, std::mem::take(unreleased));
            return false;
        }
        if ex.unsent.len() > HIGH_WATERMARK || (*unreleased == 0 && !*peer_ended) {
            return false;
        }
        let mut todo = Vec::new();
        let mut closed = false;
        match ws.read(cx.glue.app, input, &mut ex.unsent, &mut todo, &mut closed) {
            Ok(used) => {
                input.drain(..used);
            }
            Err(()) => {
                ws.conn.close(1011, "internal error", &mut ex.unsent);
                closed = true;
            }
        }
        // What is left is the start of a frame (at most a message's worth):
        // released too, or a frame larger than the window could never complete.
        let _ = self.conn.release(ex.stream, std::mem::take(unreleased));
        self.todo.extend(todo.into_iter().map(|t| (ex.stream.0, t)));
        // The peer's close (or its end of the stream) ends ours.
        if closed || *peer_ended || ws.conn.is_closing() {
            ex.done = true;
        }
        true
    }

    /// Exchange `i`'s head went out; its events come from `p`.
    fn start_producer(&mut self, i: usize, p: Producer, cx: &mut Cx<'_, '_>, now: Instant) {
        let id = cx.id(self.exchanges[i].stream);
        let ex = &mut self.exchanges[i];
        match p {
            Producer::Events { last_event_id, audience } => {
                match Events::start(cx.glue.app, last_event_id, audience, id, cx.sse, cx.pool, &mut ex.unsent, now) {
                    Some(e) => ex.produce = Some(Produce::Events(e)),
                    None => ex.done = true,
                }
            }
            Producer::Ticker(ticker) => ex.produce = Some(Produce::Ticker(Ticking::new(ticker, now))),
        }
    }

    /// Move streaming exchanges' unsent bytes into their streams as flow
    /// control and priority allow, ask the pool for download slices while the
    /// stream keeps up, end finished bodies. Returns whether anything was queued.
    fn service(&mut self, cx: &mut Cx<'_, '_>, now: Instant) -> bool {
        let mut queued = false;
        let mut i = 0;
        while i < self.exchanges.len() {
            if !self.exchanges[i].streaming {
                i += 1;
                continue;
            }
            // A WebSocket whose output drained reads what waited.
            if self.ws_input(i, cx) {
                queued = true;
            }
            let ex = &mut self.exchanges[i];
            if let Some(Produce::Download(d)) = &mut ex.produce {
                // Slices read, in order, into the unsent bytes; the next reads
                // are asked for when the stream is offered a turn (`pump_data`).
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
            if ex.unsent.len() > MAX_BACKLOG {
                log::warn!("HTTP/2 event stream is not reading; resetting it");
                let _ = self.conn.reset(ex.stream, Reason::CANCEL);
                self.remove(i, cx, now);
                continue;
            }
            if ex.done && ex.unsent.is_empty() {
                // Nothing was left to carry the end: an empty DATA frame ends it.
                let _ = self.conn.send_data(ex.stream, Bytes::new(), true);
                queued = true;
                self.remove(i, cx, now);
                continue;
            }
            i += 1;
        }
        if self.pump_data(cx) {
            queued = true;
        }
        // Streams whose body ended (or whose stream failed) while sending.
        let mut i = 0;
        while i < self.exchanges.len() {
            if self.exchanges[i].gone {
                self.remove(i, cx, now);
            } else {
                i += 1;
            }
        }
        queued
    }

    /// One scheduling pass (RFC 9218): DATA for the streams with unsent
    /// bytes, the most urgent first, at most [`QUANTUM`] each, and disk reads
    /// for downloads as far as their windows allow. Streams that end or fail
    /// are marked `gone`. Returns whether anything was queued.
    fn pump_data(&mut self, cx: &Cx<'_, '_>) -> bool {
        // No room in the output: every stream would be blocked.
        if self.conn.output_len() >= self.conn.settings().output_high_watermark {
            return false;
        }
        self.ready.clear();
        self.ready.extend(
            self.exchanges
                .iter()
                .filter(|e| e.streaming && (!e.unsent.is_empty() || e.reading() || e.unread()))
                .map(|e| (e.stream, e.priority)),
        );
        if self.ready.is_empty() {
            return false;
        }
        let mut queued = false;
        let (conn, exchanges) = (&mut self.conn, &mut self.exchanges);
        let pass = self.scheduler.pass(&self.ready, |stream| {
            let Some(ex) = exchanges.iter_mut().find(|e| e.stream == stream) else { return Sent::Nothing };
            // What the stream may send before this turn's bytes: its window,
            // up to h2's buffer (nothing of it is queued in h2 while the output
            // has room).
            let room = if ex.unread() { conn.writable(ex.stream) } else { 0 };
            let sent = send_quantum(conn, ex);
            if ex.gone {
                queued = true;
                return Sent::All;
            }
            queued |= sent > 0;
            if ex.unread() {
                ex.read_ahead(room, cx.pool, cx.id(ex.stream));
            }
            if ex.unsent.is_empty() {
                if ex.reading() {
                    Sent::Pending
                } else if ex.unread() {
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
        // Only the most urgent blocked stream keeps asking h2 for window: h2
        // gives window the peer opens to the streams that asked, first come
        // first served, whatever their priority.
        for stream in pass.release {
            self.conn.unreserve(stream);
        }
        if let Some(stream) = pass.keeper {
            self.conn.writable(stream);
        }
        queued
    }

    /// A bus event for exchange `stream`'s subscription.
    fn event(&mut self, stream: StreamId, id: i64, event: &Arc<[u8]>) {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.exchanges[i];
        let Some(Produce::Events(e)) = &mut ex.produce else { return };
        e.live(id, event, &mut ex.unsent);
    }

    /// A pool result for exchange `stream`: a replay or a download slice.
    fn produced(&mut self, stream: StreamId, result: Completion) {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.exchanges[i];
        match (result, &mut ex.produce) {
            (Completion::Replay(bytes, last), Some(Produce::Events(e))) => {
                let go = e.replayed(&bytes, last, &mut ex.unsent);
                if !go {
                    ex.produce = None;
                    ex.done = true;
                }
            }
            (Completion::Chunk(offset, bytes), Some(Produce::Download(d))) => {
                if d.arrived(offset, bytes) {
                    return;
                }
                // The file shrank or failed: the promised length cannot be sent.
                log::warn!("download read failed; resetting the stream");
                ex.produce = None;
                let _ = self.conn.reset(stream, Reason::INTERNAL_ERROR);
                self.exchanges.swap_remove(i);
            }
            _ => {}
        }
    }

    /// Heartbeats and ticks that are due.
    fn tick(&mut self, app: &crate::app::App, now: Instant) {
        for ex in &mut self.exchanges {
            match &mut ex.produce {
                Some(Produce::Events(e)) => {
                    let go = e.beat(app, now, &mut ex.unsent);
                    if !go {
                        ex.produce = None;
                        ex.done = true;
                    }
                }
                Some(Produce::Ws { ws, .. }) if ws.next_ping <= now => {
                    ws.next_ping = now + WS_PING_EVERY;
                    if ws.awaiting_pong {
                        log::debug!("WebSocket peer stopped answering pings; dropping it");
                        ex.unsent.clear();
                        ws.conn.close(1001, "ping timeout", &mut ex.unsent);
                        ex.done = true;
                    } else if ex.unsent.len() <= HIGH_WATERMARK {
                        ws.conn.ping(b"", &mut ex.unsent);
                        ws.awaiting_pong = true;
                    }
                }
                Some(Produce::Ticker(t)) => {
                    let go = t.tick(now, ex.unsent.len(), &mut ex.unsent).goes_on();
                    if !go {
                        ex.produce = None;
                        ex.done = true;
                    }
                }
                _ => {}
            }
        }
    }
}

/// Hand h2 up to [`QUANTUM`] of exchange `ex`'s unsent bytes, as its
/// stream's window allows, taking its download's read slices as needed.
/// Returns the bytes handed over; `ex.gone` once its body ended or its
/// stream failed.
fn send_quantum(conn: &mut H2Conn, ex: &mut Exchange) -> usize {
    let mut sent = 0;
    while sent < QUANTUM {
        if ex.unsent.is_empty() && !ex.refill() {
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

/// Send a built head on `stream`: its early hints, the head, and its body
/// as DATA (`follows`: the body comes later, the stream stays open).
fn send_head(conn: &mut H2Conn, stream: StreamId, head: Head, follows: bool) -> Result<(), crate::http2::H2Error> {
    if let Some(hints) = head.hints {
        conn.early_hints_with(stream, hints)?;
    }
    let end = head.body.is_empty() && !follows;
    conn.respond_with(stream, head.status, head.fields, end)?;
    if !head.body.is_empty() {
        conn.send_data(stream, head.body, true)?;
    }
    Ok(())
}

/// Request fields handed to the handlers from the stack ([`H2Session::dispatch`]);
/// a request with more takes one allocation for them.
const STACK_FIELDS: usize = 32;

/// Exchange `ex`'s request fields as the handlers see them, the same
/// `httparse::Header`s as over HTTP/1.1: `:authority` plays the role of
/// `Host` (a `host` field is then dropped; without it the `host` field
/// counts), and an extended CONNECT gets the HTTP/1.1 WebSocket handshake's
/// fields, since that is what the handlers speak (its key is a placeholder
/// no one checks: RFC 8441 §5 has none).
fn handler_fields(ex: &Exchange) -> impl Iterator<Item = httparse::Header<'_>> {
    let authority = ex.head.authority();
    let host = authority.map(|a| httparse::Header { name: "host", value: a.as_bytes() });
    let fields = ex
        .head
        .headers
        .iter()
        .filter(move |(name, _)| authority.is_none() || *name != http::header::HOST)
        .map(|(name, value)| httparse::Header { name: name.as_str(), value: value.as_bytes() });
    let ws: &[httparse::Header<'static>] = if !ex.connect_ws {
        &[]
    } else if ex.head.headers.contains_key(SEC_WEBSOCKET_KEY) {
        &WS_FIELDS[..2]
    } else {
        &WS_FIELDS
    };
    host.into_iter().chain(fields).chain(ws.iter().copied())
}

/// What an extended CONNECT adds to become the HTTP/1.1 WebSocket handshake.
const WS_FIELDS: [httparse::Header<'static>; 3] = [
    httparse::Header { name: "upgrade", value: b"websocket" },
    httparse::Header { name: "connection", value: b"upgrade" },
    httparse::Header { name: "sec-websocket-key", value: b"AAAAAAAAAAAAAAAAAAAAAA==" },
];

/// The [`Cx`] of connection `conn`, built from the worker's fields one by one
/// (so a session borrowed from `conns` can live beside it).
macro_rules! cx {
    ($w:ident, $glue:expr, $conn:expr, $generation:expr) => {
        Cx {
            glue: $glue,
            svc: $w.svc,
            env: &mut $w.env,
            pool: &$w.pool,
            sse: &mut $w.sse,
            conn: $conn,
            generation: $generation,
        }
    };
}

/// What a session needs from the worker while it handles events.
struct Cx<'a, 'g> {
    glue: &'a mut Glue<'g>,
    svc: &'static Services,
    env: &'a mut Env,
    pool: &'a Pool,
    /// The worker's event-stream subscribers.
    sse: &'a mut super::fanout::Subscribers,
    conn: usize,
    generation: u32,
}

impl Cx<'_, '_> {
    fn id(&self, stream: StreamId) -> ExchangeId {
        ExchangeId::H2 { conn: self.conn, stream: stream.0, gen: self.generation }
    }
}

impl Worker {
    /// Make connection `idx` HTTP/2; its buffered input is the start of the preface.
    pub(super) fn start_h2(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let settings = self.h2.clone().unwrap_or_else(|| H2Settings::new(self.env.max_head));
        let mut sess = H2Session::new(settings, c.peer, c.io.tls.is_some(), Instant::now());
        if self.env.draining {
            sess.shut_down(Instant::now() + cut_after(self.config.shutdown_timeout));
        }
        c.state = ConnState::Http2(Box::new(sess));
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
        if let ConnState::Http2(sess) = &mut c.state {
            sess.conn.begin_turn(now);
        }
        // The last read stopped at its cap: the socket may hold more.
        let mut full = false;
        for _ in 0..MAX_ROUNDS {
            let ConnState::Http2(sess) = &mut c.state else { return };
            full = false;
            let backlog = c.io.out.len() - c.io.out_pos;
            if !c.io.eof && sess.conn.input_len() < READ_AHEAD && backlog <= HIGH_WATERMARK {
                match c.io.fill(&mut self.scratch, READ_AHEAD) {
                    Ok(eof) => c.io.eof = eof,
                    Err(_) => {
                        close = true;
                        break;
                    }
                }
                full = c.io.inbuf.len() >= READ_AHEAD;
            }
            // Also what was read before the connection turned out to be HTTP/2.
            if !c.io.inbuf.is_empty() {
                if let Some(u) = &mut sess.unfinished {
                    u.feed(&c.io.inbuf, now);
                }
                sess.conn.feed(&c.io.inbuf);
                c.io.inbuf.clear();
            }
            if c.io.eof && !sess.eof_fed {
                sess.eof_fed = true;
                sess.conn.feed_eof();
            }
            let mut cx = cx!(self, &mut glue, idx, c.generation);
            again = sess.step(&mut cx, now);
            let before = c.io.out.len();
            if c.io.out.len() - c.io.out_pos <= HIGH_WATERMARK {
                sess.conn.drain_output(&mut c.io.out);
            }
            let produced = c.io.out.len() > before;
            if c.io.flush().is_err() {
                close = true;
                break;
            }
            let pending = c.io.flushed(now);
            if sess.closed && sess.conn.output_len() == 0 {
                end = !pending;
                break;
            }
            if c.io.eof && sess.exchanges.is_empty() && sess.conn.output_len() == 0 && !pending {
                close = true;
                break;
            }
            // The turn's frames are read: the rest of the input (and of the
            // socket) waits for the next turn, after the other connections.
            if sess.conn.throttled() {
                again = true;
                break;
            }
            // Go on while the socket had more to read, or while the socket
            // took everything and h2 has output (or may make more, now that
            // there is room). A drive that only flushed an older backlog
            // (the socket's writable edge) leaves h2's output queued: no
            // event would come for it, and the connection would stall until
            // some unrelated one.
            let queued = sess.conn.output_len() > 0;
            if !(full || (!pending && (produced || queued))) {
                break;
            }
        }
        // Out of rounds with input left in the socket: after the other connections'
        // turn, come back for it (and for a FIN behind it, which raises no new edge).
        again |= full;
        let generation = c.generation;
        let (starts, cancelled, relays, todo, left) = match &mut c.state {
            ConnState::Http2(sess) => {
                let relays: Vec<u32> = sess
                    .exchanges
                    .iter()
                    .filter(|e| matches!(e.call, Some(CallState::Relay { .. })) && e.unsent.len() <= HIGH_WATERMARK)
                    .map(|e| e.stream.0)
                    .collect();
                (
                    std::mem::take(&mut sess.starts),
                    std::mem::take(&mut sess.cancelled),
                    relays,
                    std::mem::take(&mut sess.todo),
                    std::mem::take(&mut sess.left),
                )
            }
            _ => Default::default(),
        };
        for (stream, t) in todo {
            self.ws_todo(ExchangeId::H2 { conn: idx, stream, gen: generation }, t);
        }
        self.h2_left(idx, generation, left);
        for (stream, call) in cancelled {
            self.cancel_call(ExchangeId::H2 { conn: idx, stream, gen: generation }, call);
        }
        for stream in relays {
            self.relay_resume(ExchangeId::H2 { conn: idx, stream, gen: generation });
        }
        let started = !starts.is_empty();
        for (stream, up) in starts {
            self.start_call(ExchangeId::H2 { conn: idx, stream: stream.0, gen: generation }, up);
        }
        if started {
            // What the upstreams answered at once (an error, a cached answer) goes out now.
            self.drained.push((idx, generation));
        }
        if self.svc.stats.sse.load(std::sync::atomic::Ordering::Relaxed) != self.sse.len() {
            self.sse_count_changed();
        }
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

    /// A pool job of an HTTP/2 exchange finished.
    pub(super) fn h2_done(&mut self, conn: usize, stream: u32, generation: u32, result: Completion) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(conn) else { return };
        if c.generation != generation {
            return;
        }
        let ConnState::Http2(sess) = &mut c.state else { return };
        let stream = StreamId(stream);
        match result {
            Completion::Response(result) => {
                let Some(i) = sess.find(stream) else { return };
                // Only a panic makes a job fail (the app renders its own errors); the guard logged it.
                let resp = result.unwrap_or_else(|e| e.into_response(self.env.development));
                let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
                let mut cx = cx!(self, &mut glue, conn, generation);
                sess.answer(i, resp, Delimit::Length, &mut cx, now);
            }
            other => sess.produced(stream, other),
        }
        self.drive_h2(conn);
    }

    /// A bus notification (`event_id`, rendered `event`) for an HTTP/2 event
    /// stream: queued on its exchange; the connection is driven after this
    /// turn's events.
    pub(super) fn h2_event(&mut self, conn: usize, stream: u32, generation: u32, event_id: i64, event: &Arc<[u8]>) {
        let Some(Some(c)) = self.conns.get_mut(conn) else { return };
        if c.generation != generation {
            return;
        }
        let ConnState::Http2(sess) = &mut c.state else { return };
        sess.event(StreamId(stream), event_id, event);
        self.drained.push((conn, generation));
    }

    /// App code behind an HTTP/2 event stream panicked: end that stream only.
    pub(super) fn h2_abort_exchange(&mut self, conn: usize, stream: u32, generation: u32) {
        let Some(Some(c)) = self.conns.get_mut(conn) else { return };
        if c.generation != generation {
            return;
        }
        let ConnState::Http2(sess) = &mut c.state else { return };
        if let Some(i) = sess.find(StreamId(stream)) {
            let ex = &mut sess.exchanges[i];
            ex.produce = None;
            ex.done = true;
        }
        self.sse.remove(&ExchangeId::H2 { conn, stream, gen: generation });
        self.sse_count_changed();
        self.drained.push((conn, generation));
    }

    /// An HTTP/2 connection closed: its subscriptions and upstream waits go.
    pub(super) fn forget_h2(&mut self, idx: usize, generation: u32, mut sess: H2Session) {
        for stream in sess.event_streams() {
            self.sse.remove(&ExchangeId::H2 { conn: idx, stream, gen: generation });
        }
        self.sse_count_changed();
        let mut calls = std::mem::take(&mut sess.cancelled);
        calls.extend(sess.exchanges.iter_mut().filter_map(|e| Some((e.stream.0, e.call.take()?))));
        for (stream, call) in calls {
            self.cancel_call(ExchangeId::H2 { conn: idx, stream, gen: generation }, call);
        }
        let mut left = std::mem::take(&mut sess.left);
        for ex in sess.exchanges.drain(..) {
            if let Some(Produce::Ws { ws, .. }) = ex.produce {
                left.push((ex.stream.0, ws.rooms));
            }
        }
        self.h2_left(idx, generation, left);
    }

    /// WebSockets of connection `idx` that went away: out of their rooms, uncounted.
    fn h2_left(&mut self, idx: usize, generation: u32, left: Vec<(u32, Vec<String>)>) {
        for (stream, rooms) in left {
            let id = ExchangeId::H2 { conn: idx, stream, gen: generation };
            for room in &rooms {
                if self.rooms.leave(room, id) {
                    self.svc.stats.members.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let n = self.svc.stats.ws.fetch_sub(1, std::sync::atomic::Ordering::Relaxed).saturating_sub(1);
            self.metrics.set_websocket_clients(n);
        }
    }

    /// Drop the exchange on `stream` of HTTP/2 connection `conn` (a WebSocket member that stopped reading): its stream is reset.
    pub(super) fn h2_drop_exchange(&mut self, conn: usize, stream: u32, generation: u32) {
        let Some(sess) = self.h2_session(conn, generation) else { return };
        let _ = sess.conn.reset(StreamId(stream), Reason::CANCEL);
        if let Some(i) = sess.find(StreamId(stream)) {
            let ex = sess.exchanges.swap_remove(i);
            if sess.exchanges.is_empty() {
                sess.idle_since = Some(Instant::now());
            }
            if let Some(Produce::Ws { ws, .. }) = ex.produce {
                sess.left.push((stream, ws.rooms));
            }
        }
        self.drained.push((conn, generation));
    }

    /// The session of connection `conn`, if it is still the one of generation `generation`.
    fn h2_session(&mut self, conn: usize, generation: u32) -> Option<&mut H2Session> {
        let c = self.conns.get_mut(conn)?.as_mut()?;
        if c.generation != generation {
            return None;
        }
        match &mut c.state {
            ConnState::Http2(sess) => Some(sess),
            _ => None,
        }
    }

    /// Answer an HTTP/2 exchange that waited on upstreams (`relayed`: its
    /// body follows as relayed events). Returns whether a body follows.
    pub(super) fn h2_respond_waiting(
        &mut self,
        conn: usize,
        stream: u32,
        generation: u32,
        resp: Response,
        relayed: bool,
    ) -> bool {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(conn) else { return false };
        if c.generation != generation {
            return false;
        }
        let ConnState::Http2(sess) = &mut c.state else { return false };
        let Some(i) = sess.find(StreamId(stream)) else { return false };
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut cx = cx!(self, &mut glue, conn, generation);
        let delimit = if relayed { Delimit::Chunked } else { Delimit::Length };
        let follows = sess.answer(i, resp, delimit, &mut cx, now);
        self.drained.push((conn, generation));
        follows
    }

    /// Relayed events for an HTTP/2 exchange: queued on it, sent as its
    /// window allows (the connection is driven after this turn's events).
    pub(super) fn h2_relay_data(&mut self, conn: usize, stream: u32, generation: u32, events: &[u8]) {
        if events.is_empty() {
            return;
        }
        let Some(sess) = self.h2_session(conn, generation) else { return };
        if let Some(i) = sess.find(StreamId(stream)) {
            sess.exchanges[i].unsent.extend_from_slice(events);
            self.drained.push((conn, generation));
        }
    }

    /// The relay of an HTTP/2 exchange is behind its client: its upstream
    /// pauses until the stream's unsent bytes drain.
    pub(super) fn h2_relay_slow(&mut self, conn: usize, stream: u32, generation: u32) -> bool {
        let Some(sess) = self.h2_session(conn, generation) else { return false };
        sess.find(StreamId(stream)).is_some_and(|i| sess.exchanges[i].unsent.len() > HIGH_WATERMARK)
    }

    /// The relay of an HTTP/2 exchange ended: its body ends once sent.
    pub(super) fn h2_relay_done(&mut self, conn: usize, stream: u32, generation: u32) {
        let Some(sess) = self.h2_session(conn, generation) else { return };
        if let Some(i) = sess.find(StreamId(stream)) {
            let ex = &mut sess.exchanges[i];
            ex.call = None;
            ex.done = true;
        }
        self.drained.push((conn, generation));
    }

    /// The relay of an HTTP/2 exchange failed in app code after its head:
    /// the stream is reset (the client sees it cut short), its upstream closed.
    pub(super) fn h2_relay_abort(&mut self, conn: usize, stream: u32, generation: u32) {
        let now = Instant::now();
        let Some(sess) = self.h2_session(conn, generation) else { return };
        if let Some(i) = sess.find(StreamId(stream)) {
            let ex = sess.exchanges.swap_remove(i);
            let _ = sess.conn.reset(StreamId(stream), Reason::INTERNAL_ERROR);
            if sess.exchanges.is_empty() {
                sess.idle_since = Some(now);
            }
            if let Some(call) = ex.call {
                self.cancel_call(ExchangeId::H2 { conn, stream, gen: generation }, call);
            }
        }
        self.drained.push((conn, generation));
    }

    /// Publish the number of event streams (metrics, `/api/stats`).
    pub(super) fn sse_count_changed(&mut self) {
        self.svc.stats.sse.store(self.sse.len(), std::sync::atomic::Ordering::Relaxed);
        self.metrics.set_sse_streams(self.sse.len());
    }

    /// The HTTP/2 connection's timer fired: 408 on streams whose body is
    /// late, the final GOAWAY when idle ([`Ending`]), the two-step GOAWAY
    /// when a drain found no quiet moment in time, the cut at its deadline,
    /// the end of a connection whose head is late.
    pub(super) fn h2_timer(&mut self, idx: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http2(sess) = &mut c.state else { return };
        if sess.head_since().is_some_and(|t| t + self.env.header_timeout <= now) {
            // The preface, a header block or a frame not finished within the header
            // timeout. A stream whose header block is incomplete cannot be answered
            // (its fields are unknown, and nothing but its CONTINUATION may follow), so
            // the connection ends: GOAWAY(PROTOCOL_ERROR), then the close, as nginx does.
            log::debug!("HTTP/2: head not finished within the header timeout; closing");
            sess.unfinished = None;
            sess.conn.abort(Reason::PROTOCOL_ERROR);
        }
        if sess.cut_at.is_some_and(|t| t <= now) {
            sess.cut_at = None;
            sess.conn.abort(Reason::NO_ERROR);
        } else if matches!(sess.ending, Ending::WhenQuiet { by } if by <= now) && !sess.quiet() {
            // Still busy: tell the client to stop; its open streams finish.
            let cut_at = sess.cut_at.unwrap_or(now + GOAWAY_GRACE);
            sess.go_away(cut_at);
        } else if sess.idle_since.is_some_and(|t| t + self.env.keepalive_timeout <= now) {
            sess.idle_since = None;
            if sess.quiet() {
                sess.final_goaway();
            } else {
                // No exchange, but h2 still holds a response the client has
                // not taken (its window is closed): it gets a little longer.
                sess.go_away(now + GOAWAY_GRACE);
            }
        }
        sess.tick(&self.app, now);
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut cx = cx!(self, &mut glue, idx, c.generation);
        while let Some(i) = sess.exchanges.iter().position(|e| e.deadline.is_some_and(|t| t <= now)) {
            sess.fail(i, Error::RequestTimeout, &mut cx, now);
        }
        self.drive_h2(idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_makes_a_connection_http2() {
        assert_eq!(sniff(PREFACE, None), Sniff::H2);
        assert_eq!(sniff(&PREFACE[..10], None), Sniff::Wait);
        assert_eq!(sniff(b"", None), Sniff::Wait);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n", None), Sniff::H1);
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", None), Sniff::H1);
        assert_eq!(sniff(b"", Some(None)), Sniff::Wait);
        assert_eq!(sniff(b"", Some(Some(b"h2"))), Sniff::H2);
        assert_eq!(sniff(PREFACE, Some(Some(b"http/1.1"))), Sniff::H1);
    }

    #[test]
    fn a_session_owes_its_preface_then_a_stalled_header_block_within_the_header_timeout() {
        let env = Env::testing();
        let now = Instant::now();
        let mut sess = H2Session::new(H2Settings::default(), std::net::Ipv4Addr::LOCALHOST.into(), false, now);
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
        let mut conn = H2Conn::new(H2Settings::default());
        let meta =
            RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"r" };
        let mut resp = Response::static_json(b"{}");
        let head = Heads::new().build(&mut resp, &meta, &mut crate::http::headers::Common::new(false)).expect("builds");
        assert!(matches!(send_head(&mut conn, StreamId(1), head, false), Err(crate::http2::H2Error::UnknownStream(_))));
    }
}
