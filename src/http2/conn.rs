//! One HTTP/2 connection: bytes in, events out, responses in, bytes out.
//!
//! [`H2Conn::advance`] drives h2 (handshake, frame reading and writing) and
//! reports what happened as [`Event`]s: new requests, request body bytes,
//! streams reset by the peer, streams whose send window reopened, and the
//! end of the connection. The caller answers with [`H2Conn::respond`],
//! [`H2Conn::send_data`] and friends, then calls `advance` again so h2
//! writes the frames. Nothing here blocks or sleeps.
//!
//! Work per turn: the caller starts each drive of the connection with
//! [`H2Conn::begin_turn`]; h2 then reads at most
//! [`H2Settings::frames_per_turn`] units of input (a meter walks the frame
//! headers before h2 sees them), and [`H2Conn::throttled`] says when input
//! waits for the next turn. Control frames beyond what requests, DATA sent
//! and time pay for ([`H2Settings::max_control_burst`]) end the connection
//! with `GOAWAY(ENHANCE_YOUR_CALM)`, reported as [`Event::Closed`].
//!
//! Flow control, both ways:
//! - Receiving: request body bytes count against the stream's and the
//!   connection's receive windows until the caller hands them back with
//!   [`H2Conn::release`]; a consumer that stops releasing stops the client
//!   after one window (65,535 bytes per stream; the connection's window is
//!   [`H2Settings::connection_window_size`], so one held stream leaves the
//!   others room).
//! - Sending: [`H2Conn::writable`] says how much the stream may send now
//!   (its share of the peer's windows, and 0 while the connection output is
//!   above its watermark). A producer asked only for that much never makes
//!   h2 buffer more; when it gets 0, [`Event::Writable`] tells when to ask
//!   again.
//!
//! Stream lifetime: a stream is tracked from its [`Event::Request`] until
//! both its request body has ended and its response has ended (or until a
//! reset, either side). A response that ends before the request body does
//! drops the body: h2 then sends `RST_STREAM(NO_ERROR)` after the response,
//! as RFC 9113 §8.1 allows.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use h2::ext::Protocol;
use h2::server::{self, Connection, Handshake, SendResponse};
use h2::{Reason, RecvStream, SendStream};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri};

use super::head::HOP_BY_HOP;
use super::io::Io;
use super::meter::Meter;

/// The id of one stream on one connection (odd, client-initiated). The
/// worker keys its exchanges by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

/// The connection's settings and h2's protocol-abuse defences.
#[derive(Clone, Debug)]
pub struct H2Settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams the client may have open at
    /// once; more are refused with `REFUSED_STREAM`.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: the per-stream receive window.
    pub initial_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE: the largest frame payload accepted
    /// (RFC 9113 §6.5.2: 16,384 to 16,777,215).
    pub max_frame_size: u32,
    /// The connection's receive window (raised from the protocol's 65,535
    /// by a WINDOW_UPDATE after the preface): what all streams together may
    /// have received and not released. Several streams' windows, so one
    /// stream whose consumer holds its bytes back does not stall the
    /// others' uploads.
    pub connection_window_size: u32,
    /// The largest header list accepted (the server's
    /// `limits.max_header_bytes`, RFC 9113 §6.5.2 size); the caller answers
    /// a larger one with 431 ([`super::request::check`]). h2 is given twice
    /// this, as SETTINGS_MAX_HEADER_LIST_SIZE and as its own limit, so that
    /// a list just over it reaches the caller, whose 431 carries the JSON
    /// error and the usual fields (h2's own 431 is a bare `:status`); h2
    /// answers that bare 431 beyond twice, ends the connection beyond eight
    /// times, and derives from it how many CONTINUATION frames one header
    /// block may take (h2 ≥ 0.4.4), so a CONTINUATION flood ends the
    /// connection.
    pub max_header_list_size: u32,
    /// Streams the peer reset before they were accepted, queued at once;
    /// beyond this the connection ends with `GOAWAY(ENHANCE_YOUR_CALM)`
    /// (the HTTP/2 rapid-reset attack, CVE-2023-44487).
    pub max_pending_accept_reset_streams: usize,
    /// Streams we had to reset because of the peer's protocol errors;
    /// beyond this the connection ends with `GOAWAY(ENHANCE_YOUR_CALM)`
    /// (the same attack, provoking resets instead of sending them).
    pub max_local_error_reset_streams: usize,
    /// Locally reset streams whose state is remembered (to ignore frames
    /// still in flight for them); the oldest is forgotten beyond this.
    pub max_concurrent_reset_streams: usize,
    /// How long a locally reset stream's state is remembered.
    pub reset_stream_duration: Duration,
    /// Response bytes h2 may buffer per stream beyond what it has written;
    /// also the most [`H2Conn::writable`] ever offers at once.
    pub max_send_buffer_size: usize,
    /// The connection's output buffer: at or above this many bytes h2 stops
    /// writing and [`H2Conn::writable`] is 0 until the caller drains it.
    pub output_high_watermark: usize,
    /// Work units of peer input h2 reads per turn ([`H2Conn::begin_turn`]):
    /// a frame is one, a SETTINGS that changes INITIAL_WINDOW_SIZE one more
    /// per open stream. The rest waits for the next turn, so one
    /// connection's frames never hold up the worker's other connections.
    pub frames_per_turn: u32,
    /// Control frames (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, RST_STREAM,
    /// unknown types; a window-changing SETTINGS counts once per open
    /// stream) the peer may send beyond what its requests, the DATA we send
    /// and the time elapsed pay for; beyond this the connection ends with
    /// `GOAWAY(ENHANCE_YOUR_CALM)` (PING, SETTINGS and WINDOW_UPDATE floods,
    /// and SETTINGS that make h2 revisit every stream).
    pub max_control_burst: u32,
}

impl H2Settings {
    /// The server's settings, with `max_header_bytes` (the server's
    /// `limits.max_header_bytes`) as SETTINGS_MAX_HEADER_LIST_SIZE.
    pub fn new(max_header_bytes: usize) -> H2Settings {
        H2Settings {
            max_concurrent_streams: 128,
            initial_window_size: 65_535,
            max_frame_size: 16_384,
            // Sixteen streams' windows: what a connection may hold unreleased.
            connection_window_size: 16 * 65_535,
            max_header_list_size: u32::try_from(max_header_bytes).unwrap_or(u32::MAX),
            // h2's and hyper's default: a browser cancelling a few streams
            // in one burst stays well below it.
            max_pending_accept_reset_streams: 20,
            // h2's default.
            max_local_error_reset_streams: 1024,
            // h2's defaults: 50 remembered, for 1 s.
            max_concurrent_reset_streams: 50,
            reset_stream_duration: Duration::from_secs(1),
            // One window's worth (h2's default is ~400 KB): with 128 streams
            // at most 8 MiB of response data is buffered per connection.
            max_send_buffer_size: 64 * 1024,
            output_high_watermark: crate::http::service::HIGH_WATERMARK,
            // A few hundred microseconds of h2's work per turn.
            frames_per_turn: 1024,
            // Far above what browsers, curl and h2 clients send (a handful of
            // SETTINGS, PING and WINDOW_UPDATE frames per many requests); a
            // flood of 9-byte frames ends within ~90 KB.
            max_control_burst: 10_000,
        }
    }
}

impl Default for H2Settings {
    /// [`H2Settings::new`] with a 16 KiB header list limit (the server's
    /// default `limits.max_header_bytes`).
    fn default() -> H2Settings {
        H2Settings::new(16 * 1024)
    }
}

/// A request's head, as received: h2's own parts, not copied (the URI and
/// the field values share the decoded header block).
#[derive(Debug)]
pub struct RequestHead {
    /// `:method`.
    pub method: Method,
    /// `:scheme`, `:authority` and `:path` as h2 validated them (read
    /// them with [`RequestHead::scheme`], [`RequestHead::authority`],
    /// [`RequestHead::path`]).
    pub uri: Uri,
    /// `:protocol` of an extended CONNECT (RFC 8441), e.g. `websocket`.
    pub protocol: Option<Protocol>,
    /// The regular header fields, names lowercase; iterating yields
    /// repeated names together, each name's values in the order received.
    pub headers: HeaderMap,
    /// The request has no body (END_STREAM on its HEADERS).
    pub end_stream: bool,
}

impl RequestHead {
    /// `:scheme`. Absent on a plain CONNECT, and when the request has no
    /// `:authority` (an `http::Uri` cannot hold a scheme without an
    /// authority, so h2 drops it).
    pub fn scheme(&self) -> Option<&str> {
        self.uri.scheme_str()
    }

    /// `:authority`.
    pub fn authority(&self) -> Option<&str> {
        self.uri.authority().map(|a| a.as_str())
    }

    /// `:path` with the query (empty on a plain CONNECT).
    pub fn path(&self) -> &str {
        self.uri.path_and_query().map_or("", |p| p.as_str())
    }

    /// `:protocol`, e.g. `websocket`.
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_ref().map(Protocol::as_str)
    }
}

/// What [`H2Conn::advance`] found.
// `Request` is the large variant, and the common one: boxing its head would
// cost an allocation per request, while events only pass through a vector
// the session reuses.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Event {
    /// A new stream carries a request.
    Request {
        /// The stream.
        stream: StreamId,
        /// Its head.
        head: RequestHead,
    },
    /// Request body bytes (or, after an extended CONNECT, tunnel bytes).
    /// They count against the receive windows until [`H2Conn::release`].
    Data {
        /// The stream.
        stream: StreamId,
        /// The bytes (empty on a bare end of stream).
        bytes: Bytes,
        /// The body ended with these bytes. Trailers are ignored.
        end: bool,
    },
    /// A stream that [`H2Conn::writable`] found blocked may send again.
    Writable {
        /// The stream.
        stream: StreamId,
    },
    /// The peer reset the stream (or it failed): it is gone, with anything
    /// still queued for it.
    Reset {
        /// The stream.
        stream: StreamId,
        /// The reset's reason.
        reason: Reason,
    },
    /// The connection is over: after the peer's EOF or a completed graceful
    /// shutdown (`error: None`), or a protocol error, either side's GOAWAY,
    /// or an I/O error. Every stream is gone. Drain the output (it may hold
    /// a GOAWAY), then close the socket.
    Closed {
        /// Why, unless it ended cleanly.
        error: Option<H2Error>,
    },
}

/// Why an [`H2Conn`] operation failed.
#[derive(Debug)]
pub enum H2Error {
    /// No such stream: never seen, reset, or already finished.
    UnknownStream(StreamId),
    /// The call does not fit the stream's state (a second response, body
    /// bytes before the response head or after its end, early hints after
    /// the response).
    State(StreamId, &'static str),
    /// A status, header name or header value the caller gave is invalid.
    InvalidHead(&'static str),
    /// h2 reported an error.
    Codec {
        /// The HTTP/2 error code, when there is one.
        reason: Option<Reason>,
        /// It came from a GOAWAY.
        go_away: bool,
        /// The peer sent it (its GOAWAY or RST_STREAM).
        remote: bool,
        /// h2's description.
        message: String,
    },
}

impl From<h2::Error> for H2Error {
    fn from(e: h2::Error) -> H2Error {
        H2Error::Codec { reason: e.reason(), go_away: e.is_go_away(), remote: e.is_remote(), message: e.to_string() }
    }
}

impl std::fmt::Display for H2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            H2Error::UnknownStream(id) => write!(f, "no stream {}", id.0),
            H2Error::State(id, what) => write!(f, "stream {}: {what}", id.0),
            H2Error::InvalidHead(what) => write!(f, "invalid response head: {what}"),
            H2Error::Codec { message, .. } => write!(f, "HTTP/2: {message}"),
        }
    }
}

impl std::error::Error for H2Error {}

/// Where the connection is.
enum State {
    /// Waiting for the client preface; our SETTINGS may still be queued.
    Handshake(Pin<Box<Handshake<Io, Bytes>>>),
    /// Frames flow.
    Open(Box<Connection<Io, Bytes>>),
    /// [`H2Conn::abort`] during the handshake: the next advance reports
    /// [`Event::Closed`].
    Aborted,
    /// Over; [`Event::Closed`] was reported.
    Closed,
}

/// One open stream's handles.
struct Stream {
    id: StreamId,
    /// The request body (kept after its end, so a late `release` still
    /// finds it and h2 returns the connection window when it is dropped).
    recv: RecvStream,
    /// The request body ended (reported, or END_STREAM on the head).
    recv_ended: bool,
    /// Until the response head is sent.
    respond: Option<SendResponse<Bytes>>,
    /// After the response head, while the body may still be sent.
    send: Option<SendStream<Bytes>>,
    /// The response ended (END_STREAM queued).
    send_ended: bool,
    /// [`H2Conn::writable`] returned 0: report [`Event::Writable`] once it
    /// would not.
    blocked: bool,
}

impl Stream {
    fn finished(&self) -> bool {
        self.send_ended
    }
}

/// The largest flow-control window (RFC 9113 §6.9.1).
const MAX_WINDOW_SIZE: u32 = (1 << 31) - 1;
/// SETTINGS_MAX_FRAME_SIZE's range (RFC 9113 §6.5.2; h2 panics outside it).
const MIN_MAX_FRAME_SIZE: u32 = 1 << 14;
const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;

/// The server side of one HTTP/2 connection, socket-free.
pub struct H2Conn {
    io: Io,
    state: State,
    /// Open streams, ascending by id (≤ MAX_CONCURRENT_STREAMS of them). A
    /// deque: streams mostly finish oldest first, and removing the front of
    /// a `Vec` moved every later stream (with 128 open, a few KiB of memmove
    /// per response).
    streams: VecDeque<Stream>,
    settings: H2Settings,
    /// [`H2Conn::graceful_shutdown`] was asked before the handshake ended.
    shutdown_asked: bool,
    /// The peer's control frames were a flood: the connection ends with
    /// `GOAWAY(ENHANCE_YOUR_CALM)`.
    flooded: bool,
}

impl H2Conn {
    /// A connection whose client preface has not arrived yet. Our SETTINGS
    /// are written on the first [`H2Conn::advance`].
    pub fn new(settings: H2Settings) -> H2Conn {
        let meter = Meter::new(settings.frames_per_turn, settings.max_control_burst);
        let io = Io::metered(settings.output_high_watermark, meter);
        let mut builder = server::Builder::new();
        builder
            // The SETTINGS frame: MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE
            // (RFC 9113 §6.5.2: at most 2^31 - 1), MAX_HEADER_LIST_SIZE (see
            // `H2Settings::max_header_list_size`), ENABLE_CONNECT_PROTOCOL = 1
            // (RFC 8441: WebSocket over h2).
            .max_concurrent_streams(settings.max_concurrent_streams)
            .initial_window_size(settings.initial_window_size.min(MAX_WINDOW_SIZE))
            .initial_connection_window_size(settings.connection_window_size.min(MAX_WINDOW_SIZE))
            .max_header_list_size(settings.max_header_list_size.saturating_mul(2))
            .enable_connect_protocol()
            // Defences. MAX_HEADER_LIST_SIZE above also bounds a header
            // block's CONTINUATION frames (h2 >= 0.4.4: a CONTINUATION flood
            // is ENHANCE_YOUR_CALM); h2's default data-frame budget ends a
            // flood of tiny DATA frames the same way.
            // Rapid reset (CVE-2023-44487), streams reset before accepted:
            .max_pending_accept_reset_streams(settings.max_pending_accept_reset_streams)
            // Rapid reset provoked: streams we must reset for protocol errors.
            .max_local_error_reset_streams(Some(settings.max_local_error_reset_streams))
            // Memory for locally reset streams: how many, how long.
            .max_concurrent_reset_streams(settings.max_concurrent_reset_streams)
            .reset_stream_duration(settings.reset_stream_duration)
            // Response bytes buffered per stream (h2 asserts <= u32::MAX).
            .max_send_buffer_size(settings.max_send_buffer_size.min(u32::MAX as usize));
        if settings.max_frame_size > MIN_MAX_FRAME_SIZE {
            // Announced only when above the protocol's default.
            builder.max_frame_size(settings.max_frame_size.min(MAX_MAX_FRAME_SIZE));
        }
        let handshake = builder.handshake(io.clone());
        H2Conn {
            io,
            state: State::Handshake(Box::pin(handshake)),
            streams: VecDeque::new(),
            settings,
            shutdown_asked: false,
            flooded: false,
        }
    }

    /// The settings this connection was made with.
    pub fn settings(&self) -> &H2Settings {
        &self.settings
    }

    /// Append bytes received from the peer (call [`H2Conn::advance`] next).
    /// Once the connection is closed they are dropped.
    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.is_closed() {
            self.io.feed(bytes);
        }
    }

    /// The peer closed its side.
    pub fn feed_eof(&mut self) {
        self.io.feed_eof();
    }

    /// Received bytes not yet consumed. h2 stops reading while its output is
    /// full, so a caller stops reading the socket while this is large.
    pub fn input_len(&self) -> usize {
        self.io.input_len()
    }

    /// Bytes waiting for the socket.
    pub fn output_len(&self) -> usize {
        self.io.output_len()
    }

    /// Move the pending output to the end of `out`.
    pub fn drain_output(&mut self, out: &mut Vec<u8>) {
        self.io.drain_output(out);
    }

    /// Write pending output to `w` until empty or `WouldBlock`; returns the
    /// bytes written. Call [`H2Conn::advance`] after draining: h2 may have
    /// been waiting for room.
    pub fn write_output<W: std::io::Write>(&mut self, w: &mut W) -> std::io::Result<usize> {
        self.io.write_output(w)
    }

    /// The connection is over ([`Event::Closed`] was reported).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Open streams (accepted, not yet finished or reset).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Start a turn: h2 may read [`H2Settings::frames_per_turn`] units of
    /// input until the next call. Call once per drive of the connection by
    /// the event loop, before its first [`H2Conn::advance`].
    pub fn begin_turn(&mut self, now: std::time::Instant) {
        self.io.with_meter(|m| m.begin_turn(now));
    }

    /// This turn's units are spent and input waits: call
    /// [`H2Conn::begin_turn`] and [`H2Conn::advance`] again on a later turn
    /// (no readiness event will come for bytes already received).
    pub fn throttled(&self) -> bool {
        !self.is_closed() && self.io.with_meter(|m| m.throttled()).unwrap_or(false)
    }

    /// The connection is open and carries nothing: no stream is tracked
    /// here, and h2 has no stream either (none received and not yet
    /// accepted, none with frames still queued). A GOAWAY now
    /// ([`H2Conn::abort`] with `NO_ERROR`) is the last frame: nothing is
    /// in flight that it could cut or that could follow it.
    pub fn is_quiet(&self) -> bool {
        match &self.state {
            State::Open(conn) => self.streams.is_empty() && !conn.has_streams(),
            State::Handshake(_) | State::Aborted | State::Closed => false,
        }
    }

    /// Drive h2 and append what happened to `events`: call after every
    /// readiness event (input fed, output drained, a response or body bytes
    /// given, a timer). Never blocks.
    pub fn advance(&mut self, events: &mut Vec<Event>) {
        if let State::Aborted = self.state {
            return self.close(None, events);
        }
        if let State::Handshake(hs) = &mut self.state {
            match hs.as_mut().poll(&mut noop_cx()) {
                Poll::Pending => return,
                Poll::Ready(Ok(mut conn)) => {
                    if self.shutdown_asked {
                        conn.graceful_shutdown();
                    }
                    self.state = State::Open(Box::new(conn));
                }
                Poll::Ready(Err(e)) => return self.close(Some(e.into()), events),
            }
        }
        let open = self.streams.len();
        self.io.with_meter(|m| m.set_open_streams(open));
        if !self.accept(events) {
            return;
        }
        self.poll_streams(events);
        // Flush what polling the streams queued (WINDOW_UPDATEs, resets) and
        // take anything that arrived meanwhile.
        if !self.accept(events) {
            return;
        }
        self.poll_streams(events);
        if !self.flooded && self.io.with_meter(|m| m.flooded()).unwrap_or(false) {
            self.flooded = true;
            self.abort(Reason::ENHANCE_YOUR_CALM);
            // Queue the GOAWAY; the close follows once it is written.
            self.accept(events);
        }
    }

    /// Poll the connection and accept new streams; false once it closed.
    fn accept(&mut self, events: &mut Vec<Event>) -> bool {
        let State::Open(conn) = &mut self.state else {
            return false;
        };
        loop {
            match conn.poll_accept(&mut noop_cx()) {
                Poll::Pending => return true,
                Poll::Ready(None) => {
                    self.close(None, events);
                    return false;
                }
                Poll::Ready(Some(Err(e))) => {
                    self.close(Some(e.into()), events);
                    return false;
                }
                Poll::Ready(Some(Ok((request, respond)))) => {
                    let id = StreamId(respond.stream_id().as_u32());
                    let (mut parts, recv) = request.into_parts();
                    let end_stream = recv.is_end_stream();
                    let head = RequestHead {
                        protocol: parts.extensions.remove::<Protocol>(),
                        method: parts.method,
                        uri: parts.uri,
                        headers: parts.headers,
                        end_stream,
                    };
                    // Client stream ids only grow, so this is the end; the
                    // search keeps the order even if that ever changed.
                    let at = self.streams.partition_point(|s| s.id < id);
                    self.streams.insert(
                        at,
                        Stream {
                            id,
                            recv,
                            recv_ended: end_stream,
                            respond: Some(respond),
                            send: None,
                            send_ended: false,
                            blocked: false,
                        },
                    );
                    self.io.with_meter(Meter::credit_request);
                    events.push(Event::Request { stream: id, head });
                }
            }
        }
    }

    /// Request body bytes, resets, reopened send windows.
    fn poll_streams(&mut self, events: &mut Vec<Event>) {
        let below = self.io.output_len() < self.settings.output_high_watermark;
        let mut cx = noop_cx();
        let mut i = 0;
        while i < self.streams.len() {
            let s = &mut self.streams[i];
            let mut reset = None;
            while !s.recv_ended {
                match s.recv.poll_data(&mut cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => {
                        s.recv_ended = true;
                        events.push(Event::Data { stream: s.id, bytes: Bytes::new(), end: true });
                    }
                    Poll::Ready(Some(Ok(bytes))) => {
                        s.recv_ended = s.recv.is_end_stream();
                        events.push(Event::Data { stream: s.id, bytes, end: s.recv_ended });
                    }
                    Poll::Ready(Some(Err(e))) => {
                        reset = Some(e.reason().unwrap_or(Reason::INTERNAL_ERROR));
                        break;
                    }
                }
            }
            if reset.is_none() {
                let polled = if let Some(respond) = &mut s.respond {
                    respond.poll_reset(&mut cx)
                } else if let (Some(send), false) = (&mut s.send, s.send_ended) {
                    send.poll_reset(&mut cx)
                } else {
                    Poll::Pending
                };
                if let Poll::Ready(r) = polled {
                    reset = Some(r.unwrap_or(Reason::INTERNAL_ERROR));
                }
            }
            if let Some(reason) = reset {
                events.push(Event::Reset { stream: s.id, reason });
                self.streams.remove(i);
                continue;
            }
            if s.blocked && below {
                if let Some(send) = &s.send {
                    if send.capacity() > 0 {
                        s.blocked = false;
                        events.push(Event::Writable { stream: s.id });
                    }
                }
            }
            i += 1;
        }
    }

    fn close(&mut self, error: Option<H2Error>, events: &mut Vec<Event>) {
        let error = error.or_else(|| {
            self.flooded.then(|| H2Error::Codec {
                reason: Some(Reason::ENHANCE_YOUR_CALM),
                go_away: true,
                remote: false,
                message: "control-frame flood".to_string(),
            })
        });
        self.state = State::Closed;
        self.streams.clear();
        events.push(Event::Closed { error });
    }

    fn find(&mut self, stream: StreamId) -> Result<usize, H2Error> {
        self.streams.binary_search_by_key(&stream, |s| s.id).map_err(|_| H2Error::UnknownStream(stream))
    }

    /// Drop the stream once its response has ended.
    fn retire(&mut self, i: usize) {
        if self.streams[i].finished() {
            self.streams.remove(i);
        }
    }

    /// Send an interim `103 Early Hints` with `headers` (typically `link`);
    /// only before [`H2Conn::respond`].
    pub fn early_hints<N, V>(&mut self, stream: StreamId, headers: &[(N, V)]) -> Result<(), H2Error>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let response = response_head(103, headers)?;
        self.early_hints_with(stream, response.into_parts().0.headers)
    }

    /// [`H2Conn::early_hints`] with the fields already in a map (no
    /// connection-specific fields in it: h2 refuses those).
    pub fn early_hints_with(&mut self, stream: StreamId, fields: HeaderMap) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::EARLY_HINTS;
        *response.headers_mut() = fields;
        let Some(respond) = &mut self.streams[i].respond else {
            return Err(H2Error::State(stream, "early hints after the response"));
        };
        respond.send_informational(response)?;
        Ok(())
    }

    /// Send the response head. Connection-specific fields (`connection`,
    /// `keep-alive`, `transfer-encoding`, …) are dropped: HTTP/2 forbids
    /// them. With `end_stream` there is no body; otherwise send it with
    /// [`H2Conn::send_data`], asking [`H2Conn::writable`] first. A `200` to
    /// an extended CONNECT without `end_stream` opens the tunnel.
    pub fn respond<N, V>(
        &mut self,
        stream: StreamId,
        status: u16,
        headers: &[(N, V)],
        end_stream: bool,
    ) -> Result<(), H2Error>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let response = response_head(status, headers)?;
        let (parts, ()) = response.into_parts();
        self.respond_with(stream, parts.status, parts.headers, end_stream)
    }

    /// [`H2Conn::respond`] with the head already built (no
    /// connection-specific fields in `fields`: h2 refuses those).
    pub fn respond_with(
        &mut self,
        stream: StreamId,
        status: StatusCode,
        fields: HeaderMap,
        end_stream: bool,
    ) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.headers_mut() = fields;
        if response.status().is_informational() {
            return Err(H2Error::InvalidHead("1xx status as the final response"));
        }
        let s = &mut self.streams[i];
        let Some(mut respond) = s.respond.take() else {
            return Err(H2Error::State(stream, "response already sent"));
        };
        match respond.send_response(response, end_stream) {
            Ok(send) => {
                s.send = Some(send);
                s.send_ended = end_stream;
                self.retire(i);
                Ok(())
            }
            Err(e) => {
                s.respond = Some(respond);
                Err(e.into())
            }
        }
    }

    /// How many body bytes `stream` may send now: its share of the peer's
    /// flow-control windows, capped by `max_send_buffer_size`, and 0 while
    /// the connection output is at its watermark. 0 also marks the stream
    /// blocked: [`Event::Writable`] reports when it may send again. Unknown
    /// or finished streams get 0 (and no event).
    ///
    /// Asking reserves window for the stream until the next
    /// [`H2Conn::send_data`]: ask when there are bytes to send.
    pub fn writable(&mut self, stream: StreamId) -> usize {
        let below = self.io.output_len() < self.settings.output_high_watermark;
        let want = self.settings.max_send_buffer_size;
        let Ok(i) = self.find(stream) else {
            return 0;
        };
        let s = &mut self.streams[i];
        let Some(send) = &mut s.send else {
            return 0;
        };
        if s.send_ended {
            return 0;
        }
        // Ask for a full buffer's worth beyond what is already queued; h2
        // assigns what the windows allow now, the rest as they open.
        send.reserve_capacity(want);
        let n = if below { send.capacity() } else { 0 };
        s.blocked = n == 0;
        n
    }

    /// Give back the window [`H2Conn::writable`] reserved for `stream`
    /// without sending: the stream stops competing for the connection
    /// window (h2 hands the connection window to waiting streams in the
    /// order they asked, not by priority), so a scheduler lets only the
    /// stream it wants served next keep asking. No [`Event::Writable`]
    /// follows for it. Unknown or finished streams are ignored.
    pub fn unreserve(&mut self, stream: StreamId) {
        let Ok(i) = self.find(stream) else {
            return;
        };
        let s = &mut self.streams[i];
        if let (Some(send), false) = (&mut s.send, s.send_ended) {
            send.reserve_capacity(0);
            s.blocked = false;
        }
    }

    /// Queue body bytes (at most what [`H2Conn::writable`] said, or h2
    /// buffers the rest without bound); `end` ends the response.
    pub fn send_data(&mut self, stream: StreamId, data: Bytes, end: bool) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        let s = &mut self.streams[i];
        let Some(send) = &mut s.send else {
            return Err(H2Error::State(stream, "body before the response head"));
        };
        if s.send_ended {
            return Err(H2Error::State(stream, "body after the end of the response"));
        }
        send.send_data(data, end)?;
        if end {
            s.send_ended = true;
            self.retire(i);
        } else {
            // Hand back whatever of the reservation these bytes did not use:
            // a producer that goes quiet (an idle SSE stream) must not sit
            // on connection window other streams could use. The next
            // `writable` reserves again.
            send.reserve_capacity(0);
        }
        Ok(())
    }

    /// Hand `n` request body bytes back to the peer's flow control (they
    /// were consumed): h2 sends WINDOW_UPDATEs on the next advance. Bytes of
    /// a stream that is gone are ignored.
    pub fn release(&mut self, stream: StreamId, n: usize) -> Result<(), H2Error> {
        let Ok(i) = self.find(stream) else {
            return Ok(());
        };
        if n > 0 {
            self.streams[i].recv.flow_control().release_capacity(n)?;
        }
        Ok(())
    }

    /// Reset the stream with `reason` (`CANCEL` to abandon a response,
    /// `INTERNAL_ERROR` after a failure mid-body). It is gone at once.
    pub fn reset(&mut self, stream: StreamId, reason: Reason) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        let Some(s) = self.streams.remove(i) else {
            return Err(H2Error::UnknownStream(stream));
        };
        if let Some(mut respond) = s.respond {
            respond.send_reset(reason);
        } else if let Some(mut send) = s.send {
            send.send_reset(reason);
        }
        Ok(())
    }

    /// Start a graceful shutdown the way RFC 9113 §6.8 suggests: GOAWAY
    /// with the largest stream id and a PING now, the GOAWAY naming the
    /// last stream processed once the PING is answered; open streams may
    /// finish, then [`Event::Closed`] with no error. Keep calling
    /// [`H2Conn::advance`]. Frames follow the first GOAWAY, which some
    /// clients refuse (Python's `h2` takes any frame after a GOAWAY as a
    /// protocol error): when [`H2Conn::is_quiet`], a single final GOAWAY
    /// ([`H2Conn::abort`] with `NO_ERROR`) is the better close.
    pub fn graceful_shutdown(&mut self) {
        match &mut self.state {
            State::Open(conn) => conn.graceful_shutdown(),
            State::Handshake(_) => self.shutdown_asked = true,
            State::Aborted | State::Closed => {}
        }
    }

    /// End the connection now: GOAWAY with `reason` and the last stream
    /// processed, open streams are dropped. h2 reads no frame after it, so a
    /// stream above that id is never processed: a client may safely retry
    /// it. [`Event::Closed`] follows on the next advance (before the
    /// handshake ended: without a GOAWAY).
    pub fn abort(&mut self, reason: Reason) {
        match &mut self.state {
            State::Open(conn) => conn.abrupt_shutdown(reason),
            State::Handshake(_) => self.state = State::Aborted,
            State::Aborted | State::Closed => {}
        }
    }
}

/// A polling context whose waker does nothing: the caller re-polls on every
/// readiness event, so h2 never needs to wake anyone.
fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// A response head with `status` and `headers`, hop-by-hop fields dropped.
fn response_head<N, V>(status: u16, headers: &[(N, V)]) -> Result<Response<()>, H2Error>
where
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(status).map_err(|_| H2Error::InvalidHead("status"))?;
    let map = response.headers_mut();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_ref()).map_err(|_| H2Error::InvalidHead("header name"))?;
        if HOP_BY_HOP.contains(&name.as_str()) || (name == http::header::TE && value.as_ref() != b"trailers") {
            continue;
        }
        let value = HeaderValue::from_bytes(value.as_ref()).map_err(|_| H2Error::InvalidHead("header value"))?;
        map.append(name, value);
    }
    Ok(response)
}
