//! One HTTP/2 connection: bytes in, events out, responses in, bytes out.
//!
//! [`H2Conn`] wraps the connection state machine ([`super::machine`]) with
//! what the event loop needs: an input buffer fed from the socket, one
//! output buffer drained to it, the [`Meter`] that decides how much input is
//! read per turn, per-stream response queues, and the conversion of request
//! heads into [`RequestHead`]s. [`H2Conn::advance`] reads the admitted input and
//! reports what happened as [`Event`]s: new requests, request body bytes,
//! streams reset by the peer, streams whose send window reopened, and the
//! end of the connection. The caller answers with [`H2Conn::respond`],
//! [`H2Conn::send_data`] and friends. Nothing here blocks or sleeps.
//!
//! Work per turn: the caller starts each drive of the connection with
//! [`H2Conn::begin_turn`]; at most [`H2Settings::frames_per_turn`] units of
//! input are read per turn (a meter walks the frame headers first), and
//! [`H2Conn::throttled`] says when input waits for the next turn. Control
//! frames beyond what requests, DATA sent and time pay for
//! ([`H2Settings::max_control_burst`]) end the connection with
//! `GOAWAY(ENHANCE_YOUR_CALM)`, reported as [`Event::Closed`].
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
//!   above its watermark) and reserves that much of the connection window
//!   for it until its next [`H2Conn::send_data`] or [`H2Conn::unreserve`].
//!   A producer asked only for that much never makes the connection queue
//!   more; when it gets 0, [`Event::Writable`] tells when to ask again.
//!
//! Stream lifetime: a stream is tracked from its [`Event::Request`] until
//! its response has ended and been written (or until a reset, either side).
//! A response that ends before the request body does drops the body:
//! `RST_STREAM(NO_ERROR)` follows the response, as RFC 9113 §8.1 allows.

use std::collections::VecDeque;
use std::io::Write;

use bytes::{Buf, Bytes};
use http::StatusCode;

use super::head::ResponseFields;
use super::machine::{self, Limits, Machine};
use super::meter::Meter;
use super::request::RequestHead;
use super::wire::{Reason, HEADER_LEN};

/// The id of one stream on one connection (odd, client-initiated). The
/// worker keys its exchanges by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

/// The connection's settings and its protocol-abuse defences.
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
    /// a larger one with 431 ([`super::request::check`]). The connection
    /// advertises twice this as SETTINGS_MAX_HEADER_LIST_SIZE and decodes up
    /// to it, so that a list just over the limit reaches the caller, whose
    /// 431 carries the JSON error and the usual fields; beyond twice the
    /// connection answers a bare `:status: 431` itself. It also bounds how
    /// many CONTINUATION frames one header block may take, so a
    /// CONTINUATION flood ends the connection.
    pub max_header_list_size: u32,
    /// Streams the peer reset before they were accepted, queued at once;
    /// beyond this the connection ends with `GOAWAY(ENHANCE_YOUR_CALM)`
    /// (the HTTP/2 rapid-reset attack, CVE-2023-44487).
    pub max_pending_accept_reset_streams: usize,
    /// Streams we had to reset because of the peer's protocol errors;
    /// beyond this the connection ends with `GOAWAY(ENHANCE_YOUR_CALM)`
    /// (the same attack, provoking resets instead of sending them).
    pub max_local_error_reset_streams: usize,
    /// Locally reset streams whose ids are remembered (to ignore frames
    /// still in flight for them); the oldest is forgotten beyond this.
    pub max_concurrent_reset_streams: usize,
    /// The most [`H2Conn::writable`] ever offers a stream at once (bytes it
    /// may queue beyond what is written).
    pub max_send_buffer_size: usize,
    /// The connection's output buffer: response DATA stops at this many
    /// bytes and [`H2Conn::writable`] is 0 until the caller drains it.
    pub output_high_watermark: usize,
    /// Work units of peer input read per turn ([`H2Conn::begin_turn`]):
    /// a frame is one, a SETTINGS that changes INITIAL_WINDOW_SIZE one more
    /// per open stream. The rest waits for the next turn, so one
    /// connection's frames never hold up the worker's other connections.
    pub frames_per_turn: u32,
    /// Control frames (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, RST_STREAM,
    /// unknown types; a window-changing SETTINGS counts once per open
    /// stream) the peer may send beyond what its requests, the DATA we send
    /// and the time elapsed pay for; beyond this the connection ends with
    /// `GOAWAY(ENHANCE_YOUR_CALM)` (PING, SETTINGS and WINDOW_UPDATE floods,
    /// and SETTINGS that make the connection revisit every stream).
    pub max_control_burst: u32,
}

impl H2Settings {
    /// The settings `[http2]` asks for, or `None` when it is off.
    pub fn from_config(config: &crate::config::Config) -> Option<H2Settings> {
        let h = &config.http2;
        h.enabled.then(|| {
            let base = H2Settings::new(config.limits.max_header_bytes);
            H2Settings {
                max_concurrent_streams: h.max_concurrent_streams,
                initial_window_size: h.initial_window_size,
                max_frame_size: h.max_frame_size,
                // Never less than one stream's window, so one upload is not throttled below it.
                connection_window_size: base.connection_window_size.max(h.initial_window_size),
                ..base
            }
        })
    }

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
            // in one read stays well below it.
            max_pending_accept_reset_streams: 20,
            // h2's default.
            max_local_error_reset_streams: 1024,
            max_concurrent_reset_streams: 50,
            // One window's worth: with 128 streams at most 8 MiB of response
            // data is queued per connection.
            max_send_buffer_size: 64 * 1024,
            output_high_watermark: crate::http::service::HIGH_WATERMARK,
            // A few hundred microseconds of work per turn.
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

/// What [`H2Conn::advance`] found.
// `Request` is the large variant, and the common one: boxing its head would
// cost an allocation per request, while events only pass through a queue
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
    /// The connection is over: after the peer's EOF, its GOAWAY once no
    /// stream is left, or a completed graceful shutdown (`error: None`), or
    /// a protocol error, an error GOAWAY either side. Every stream is gone.
    /// Drain the output (it may hold a GOAWAY), then close the socket.
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
    /// The connection failed.
    Codec {
        /// The HTTP/2 error code, when there is one.
        reason: Option<Reason>,
        /// It came with a GOAWAY.
        go_away: bool,
        /// The peer sent it (its GOAWAY).
        remote: bool,
        /// What happened.
        message: &'static str,
    },
}

impl std::fmt::Display for H2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            H2Error::UnknownStream(id) => write!(f, "no stream {}", id.0),
            H2Error::State(id, what) => write!(f, "stream {}: {what}", id.0),
            H2Error::InvalidHead(what) => write!(f, "invalid response head: {what}"),
            H2Error::Codec { message, reason, .. } => match reason {
                Some(r) => write!(f, "HTTP/2: {message} ({r:?})"),
                None => write!(f, "HTTP/2: {message}"),
            },
        }
    }
}

impl std::error::Error for H2Error {}

/// Where the connection is.
enum State {
    /// Nothing written yet: our SETTINGS go out on the first advance.
    New,
    /// Frames flow.
    Open,
    /// Over but not yet reported: the next advance reports [`Event::Closed`]
    /// with this error.
    Closing(Option<H2Error>),
    /// Over; [`Event::Closed`] was reported.
    Closed,
}

/// One open stream's response side.
struct Stream {
    id: StreamId,
    /// The request body ended (reported, or END_STREAM on the head).
    recv_ended: bool,
    /// The final response head went out.
    responded: bool,
    /// The response ended (END_STREAM queued).
    send_ended: bool,
    /// [`H2Conn::writable`] returned 0: report [`Event::Writable`] once it
    /// would not.
    blocked: bool,
    /// Connection window [`H2Conn::writable`] promised this stream.
    reserved: usize,
    /// Body bytes given and not yet written (beyond the windows or the
    /// output watermark), oldest first.
    queue: VecDeque<Bytes>,
    queued: usize,
}

/// The server side of one HTTP/2 connection, socket-free.
pub struct H2Conn {
    machine: Machine,
    state: State,
    settings: H2Settings,
    meter: Meter,
    /// Received bytes; those before `read` were consumed.
    input: Vec<u8>,
    read: usize,
    eof: bool,
    output: Vec<u8>,
    /// Output bytes the meter has seen.
    metered: usize,
    /// Open streams, ascending by id (≤ MAX_CONCURRENT_STREAMS of them). A
    /// deque: streams mostly finish oldest first.
    streams: VecDeque<Stream>,
    /// Connection window promised to streams by [`H2Conn::writable`].
    reserved: usize,
    /// [`H2Conn::graceful_shutdown`] was asked before our SETTINGS went out.
    shutdown_asked: bool,
    /// The peer's GOAWAY (NO_ERROR) arrived: the connection ends once no
    /// stream is left.
    peer_goaway: bool,
    /// Streams whose head [`RequestHead::new`] refused, to reset.
    refused: Vec<u32>,
}

impl H2Conn {
    /// A connection whose client preface has not arrived yet. Our SETTINGS
    /// are written on the first [`H2Conn::advance`].
    pub fn new(settings: H2Settings) -> H2Conn {
        let limits = Limits {
            max_concurrent_streams: settings.max_concurrent_streams,
            initial_window_size: settings.initial_window_size,
            connection_window_size: settings.connection_window_size,
            max_frame_size: settings.max_frame_size,
            max_header_list_size: settings.max_header_list_size.saturating_mul(2),
            max_pending_resets: settings.max_pending_accept_reset_streams,
            max_local_error_resets: settings.max_local_error_reset_streams,
            max_recent_resets: settings.max_concurrent_reset_streams,
            ..Limits::default()
        };
        H2Conn {
            machine: Machine::new(limits),
            state: State::New,
            meter: Meter::new(settings.frames_per_turn, settings.max_control_burst),
            settings,
            input: Vec::new(),
            read: 0,
            eof: false,
            output: Vec::new(),
            metered: 0,
            streams: VecDeque::new(),
            reserved: 0,
            shutdown_asked: false,
            peer_goaway: false,
            refused: Vec::new(),
        }
    }

    /// The settings this connection was made with.
    pub fn settings(&self) -> &H2Settings {
        &self.settings
    }

    /// Append bytes received from the peer (call [`H2Conn::advance`] next).
    /// Once the connection is closed they are dropped.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.is_closed() {
            return;
        }
        if self.read > 0 && self.read == self.input.len() {
            self.input.clear();
            self.read = 0;
        }
        self.input.extend_from_slice(bytes);
    }

    /// The peer closed its side.
    pub fn feed_eof(&mut self) {
        self.eof = true;
    }

    /// Received bytes not yet consumed. Input is read only as the meter
    /// admits it, so a caller stops reading the socket while this is large.
    pub fn input_len(&self) -> usize {
        self.input.len() - self.read
    }

    /// Bytes waiting for the socket.
    pub fn output_len(&self) -> usize {
        self.output.len()
    }

    /// Move the pending output to the end of `out`.
    pub fn drain_output(&mut self, out: &mut Vec<u8>) {
        self.meter_output();
        if out.is_empty() {
            std::mem::swap(out, &mut self.output);
        } else {
            out.extend_from_slice(&self.output);
            self.output.clear();
        }
        self.metered = 0;
    }

    /// Write pending output to `w` until empty or `WouldBlock`; returns the
    /// bytes written. Call [`H2Conn::advance`] after draining: queued
    /// response data may have been waiting for room.
    pub fn write_output<W: Write>(&mut self, w: &mut W) -> std::io::Result<usize> {
        self.meter_output();
        let mut written = 0;
        while written < self.output.len() {
            match w.write(&self.output[written..]) {
                Ok(0) => break,
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.consume_output(written);
                    return Err(e);
                }
            }
        }
        self.consume_output(written);
        Ok(written)
    }

    fn consume_output(&mut self, n: usize) {
        self.output.drain(..n);
        self.metered = self.output.len();
    }

    /// Let the meter see what was written since it last looked (each DATA
    /// frame pays back part of the control-frame level).
    fn meter_output(&mut self) {
        if self.metered < self.output.len() {
            self.meter.wrote(&self.output[self.metered..]);
            self.metered = self.output.len();
        }
    }

    /// The connection is over ([`Event::Closed`] was reported).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Open streams (accepted, not yet finished or reset).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Start a turn: [`H2Settings::frames_per_turn`] units of input may be
    /// read until the next call. Call once per drive of the connection by
    /// the event loop, before its first [`H2Conn::advance`].
    pub fn begin_turn(&mut self, now: std::time::Instant) {
        self.meter.begin_turn(now);
    }

    /// This turn's units are spent and input waits: call
    /// [`H2Conn::begin_turn`] and [`H2Conn::advance`] again on a later turn
    /// (no readiness event will come for bytes already received).
    pub fn throttled(&self) -> bool {
        !self.is_closed() && self.meter.throttled()
    }

    /// The connection is open and carries nothing: no stream is open, no
    /// header block is half-read and no input waits. A GOAWAY now ([`H2Conn::abort`] with
    /// `NO_ERROR`) is the last frame: nothing is in flight that it could cut
    /// or that could follow it.
    pub fn is_quiet(&self) -> bool {
        matches!(self.state, State::Open)
            && self.machine.is_established()
            && self.streams.is_empty()
            && self.input_len() == 0
            && self.machine.is_quiet()
    }

    /// Read the admitted input and append what happened to `events`: call
    /// after every readiness event (input fed, output drained, a response or
    /// body bytes given, a timer). Never blocks.
    pub fn advance(&mut self, events: &mut VecDeque<Event>) {
        match std::mem::replace(&mut self.state, State::Open) {
            State::New => {
                self.machine.start(&mut self.output);
                if self.shutdown_asked {
                    self.machine.graceful_shutdown(&mut self.output);
                }
            }
            State::Open => {}
            State::Closing(error) => return self.close(error, events),
            State::Closed => {
                self.state = State::Closed;
                return;
            }
        }
        self.meter.set_open_streams(self.streams.len());
        let admitted = self.meter.admit(&self.input[self.read..], self.eof);
        let result = {
            let H2Conn { machine, streams, meter, output, refused, peer_goaway, input, read, .. } = self;
            let input = &input[*read..*read + admitted];
            let mut on = |e: machine::Event<'_>| match e {
                machine::Event::Request { stream, head, end_stream } => match RequestHead::new(head, end_stream) {
                    Some(head) => {
                        streams.push_back(Stream {
                            id: StreamId(stream),
                            recv_ended: end_stream,
                            responded: false,
                            send_ended: false,
                            blocked: false,
                            reserved: 0,
                            queue: VecDeque::new(),
                            queued: 0,
                        });
                        meter.credit_request();
                        events.push_back(Event::Request { stream: StreamId(stream), head });
                    }
                    None => refused.push(stream),
                },
                machine::Event::Data { stream, data, end } => {
                    if let Ok(i) = streams.binary_search_by_key(&StreamId(stream), |s| s.id) {
                        streams[i].recv_ended |= end;
                        let bytes = Bytes::copy_from_slice(data);
                        events.push_back(Event::Data { stream: StreamId(stream), bytes, end });
                    }
                }
                machine::Event::Reset { stream, reason } => {
                    if let Ok(i) = streams.binary_search_by_key(&StreamId(stream), |s| s.id) {
                        streams.remove(i);
                        events.push_back(Event::Reset { stream: StreamId(stream), reason });
                    }
                }
                machine::Event::Window { .. } => {}
                machine::Event::GoAway { reason } => {
                    if reason == Reason::NO_ERROR {
                        *peer_goaway = true;
                    }
                }
            };
            machine.recv(input, output, &mut on)
        };
        // Streams dropped by resets hold no reservation any more.
        self.reserved = self.streams.iter().map(|s| s.reserved).sum();
        for stream in std::mem::take(&mut self.refused) {
            let _ = self.machine.reset(stream, Reason::PROTOCOL_ERROR, &mut self.output);
        }
        match result {
            Ok(n) => {
                self.read += n;
                self.meter.consumed(n);
            }
            Err(e) => {
                let error = H2Error::Codec { reason: Some(e.reason), go_away: true, remote: false, message: e.message };
                return self.close(Some(error), events);
            }
        }
        if self.read == self.input.len() {
            self.input.clear();
            self.read = 0;
        }
        self.flush(events);
        if self.meter.flooded() {
            self.machine.abort(Reason::ENHANCE_YOUR_CALM, &mut self.output);
            let error = H2Error::Codec {
                reason: Some(Reason::ENHANCE_YOUR_CALM),
                go_away: true,
                remote: false,
                message: "control-frame flood",
            };
            return self.close(Some(error), events);
        }
        if self.eof && !self.meter.throttled() {
            // Everything received was read: what is left is a frame cut short.
            let error = (self.input_len() > 0).then_some(H2Error::Codec {
                reason: None,
                go_away: false,
                remote: false,
                message: "EOF inside a frame",
            });
            return self.close(error, events);
        }
        if self.machine.is_drained() || (self.peer_goaway && self.streams.is_empty()) {
            self.close(None, events);
        }
    }

    /// Write what the streams queued as far as windows and the output
    /// watermark allow; report blocked streams that may send again.
    fn flush(&mut self, events: &mut VecDeque<Event>) {
        let mut i = 0;
        while i < self.streams.len() {
            self.flush_stream(i);
            if self.retire(i) {
                continue;
            }
            let s = &self.streams[i];
            if s.blocked && self.output.len() < self.settings.output_high_watermark {
                let id = s.id;
                if self.room(i) > 0 {
                    self.streams[i].blocked = false;
                    events.push_back(Event::Writable { stream: id });
                }
            }
            i += 1;
        }
    }

    /// Write stream `i`'s queue as far as its windows and the output
    /// watermark allow.
    fn flush_stream(&mut self, i: usize) {
        let watermark = self.settings.output_high_watermark;
        let s = &mut self.streams[i];
        let id = s.id.0;
        loop {
            let last = s.queue.len() == 1 && s.send_ended;
            let Some(front) = s.queue.front_mut() else { break };
            let room = watermark.saturating_sub(self.output.len() + HEADER_LEN);
            let n = front.len().min(self.machine.writable(id)).min(room);
            if n == 0 && !front.is_empty() {
                break;
            }
            let end = last && n == front.len();
            if self.machine.send_data(id, &front[..n], end, &mut self.output).is_err() {
                break;
            }
            front.advance(n);
            s.queued -= n;
            if front.is_empty() {
                s.queue.pop_front();
            }
        }
    }

    /// Drop stream `i` once its response ended and went out; true if it did.
    fn retire(&mut self, i: usize) -> bool {
        let s = &self.streams[i];
        if !(s.send_ended && s.queue.is_empty()) {
            return false;
        }
        self.reserved -= s.reserved.min(self.reserved);
        self.streams.remove(i);
        true
    }

    fn close(&mut self, error: Option<H2Error>, events: &mut VecDeque<Event>) {
        self.state = State::Closed;
        self.streams.clear();
        self.reserved = 0;
        self.input = Vec::new();
        self.read = 0;
        events.push_back(Event::Closed { error });
    }

    fn find(&self, stream: StreamId) -> Result<usize, H2Error> {
        self.streams.binary_search_by_key(&stream, |s| s.id).map_err(|_| H2Error::UnknownStream(stream))
    }

    /// What stream `i` may send now: its window and the connection's less
    /// what other streams were promised, less what it already queued.
    fn room(&self, i: usize) -> usize {
        let s = &self.streams[i];
        let others = self.reserved - s.reserved.min(self.reserved);
        let conn = self.machine.conn_window().saturating_sub(others);
        let stream = self.machine.stream_window(s.id.0);
        conn.min(stream).saturating_sub(s.queued).min(self.settings.max_send_buffer_size)
    }

    /// Send an interim `103 Early Hints` with `headers` (typically `link`);
    /// only before [`H2Conn::respond`].
    pub fn early_hints<N, V>(&mut self, stream: StreamId, headers: &[(N, V)]) -> Result<(), H2Error>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        self.early_hints_with(stream, &ResponseFields::from_pairs(headers)?)
    }

    /// [`H2Conn::early_hints`] with the fields already listed (no
    /// connection-specific fields among them).
    pub fn early_hints_with(&mut self, stream: StreamId, fields: &ResponseFields) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        if self.streams[i].responded {
            return Err(H2Error::State(stream, "early hints after the response"));
        }
        self.machine.respond(stream.0, 103, fields.parts(), false, &mut self.output).map_err(|e| send_error(stream, e))
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
        let status = StatusCode::from_u16(status).map_err(|_| H2Error::InvalidHead("status"))?;
        self.respond_with(stream, status, &ResponseFields::from_pairs(headers)?, end_stream)
    }

    /// [`H2Conn::respond`] with the head already built (no
    /// connection-specific fields in `fields`).
    pub fn respond_with(
        &mut self,
        stream: StreamId,
        status: StatusCode,
        fields: &ResponseFields,
        end_stream: bool,
    ) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        if status.is_informational() {
            return Err(H2Error::InvalidHead("1xx status as the final response"));
        }
        if self.streams[i].responded {
            return Err(H2Error::State(stream, "response already sent"));
        }
        self.machine
            .respond(stream.0, status.as_u16(), fields.parts(), end_stream, &mut self.output)
            .map_err(|e| send_error(stream, e))?;
        let s = &mut self.streams[i];
        s.responded = true;
        s.send_ended = end_stream;
        self.retire(i);
        Ok(())
    }

    /// How many body bytes `stream` may send now: its share of the peer's
    /// flow-control windows, capped by `max_send_buffer_size`, and 0 while
    /// the connection output is at its watermark. 0 also marks the stream
    /// blocked: [`Event::Writable`] reports when it may send again. Unknown
    /// or finished streams get 0 (and no event).
    ///
    /// Asking reserves that much of the connection window for the stream
    /// until its next [`H2Conn::send_data`]: ask when there are bytes to
    /// send.
    pub fn writable(&mut self, stream: StreamId) -> usize {
        let below = self.output.len() < self.settings.output_high_watermark;
        let Ok(i) = self.find(stream) else {
            return 0;
        };
        let s = &self.streams[i];
        if !s.responded || s.send_ended {
            return 0;
        }
        let n = if below { self.room(i) } else { 0 };
        let s = &mut self.streams[i];
        self.reserved = self.reserved - s.reserved.min(self.reserved) + n;
        s.reserved = n;
        s.blocked = n == 0;
        n
    }

    /// Give back the window [`H2Conn::writable`] reserved for `stream`
    /// without sending: the stream stops competing for the connection
    /// window, so a scheduler lets only the stream it wants served next keep
    /// asking. No [`Event::Writable`] follows for it. Unknown or finished
    /// streams are ignored.
    pub fn unreserve(&mut self, stream: StreamId) {
        let Ok(i) = self.find(stream) else {
            return;
        };
        let s = &mut self.streams[i];
        self.reserved -= s.reserved.min(self.reserved);
        s.reserved = 0;
        s.blocked = false;
    }

    /// Queue body bytes (at most what [`H2Conn::writable`] said, or the rest
    /// waits in the stream's queue for the windows); `end` ends the
    /// response.
    pub fn send_data(&mut self, stream: StreamId, data: Bytes, end: bool) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        let s = &mut self.streams[i];
        if !s.responded {
            return Err(H2Error::State(stream, "body before the response head"));
        }
        if s.send_ended {
            return Err(H2Error::State(stream, "body after the end of the response"));
        }
        self.reserved -= s.reserved.min(self.reserved);
        s.reserved = 0;
        if !data.is_empty() || end {
            s.queued += data.len();
            s.queue.push_back(data);
        }
        s.send_ended = end;
        self.flush_stream(i);
        self.retire(i);
        Ok(())
    }

    /// Hand `n` request body bytes back to the peer's flow control (they
    /// were consumed): WINDOW_UPDATEs go out once half a window is owed.
    /// Bytes of a stream that is gone are ignored.
    pub fn release(&mut self, stream: StreamId, n: usize) -> Result<(), H2Error> {
        if n > 0 {
            self.machine.release(stream.0, n, &mut self.output);
        }
        Ok(())
    }

    /// Reset the stream with `reason` (`CANCEL` to abandon a response,
    /// `INTERNAL_ERROR` after a failure mid-body). It is gone at once.
    pub fn reset(&mut self, stream: StreamId, reason: Reason) -> Result<(), H2Error> {
        let i = self.find(stream)?;
        if let Some(s) = self.streams.remove(i) {
            self.reserved -= s.reserved.min(self.reserved);
        }
        self.machine.reset(stream.0, reason, &mut self.output).map_err(|e| send_error(stream, e))
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
        match self.state {
            State::Open => self.machine.graceful_shutdown(&mut self.output),
            State::New => self.shutdown_asked = true,
            State::Closing(_) | State::Closed => {}
        }
    }

    /// End the connection now: GOAWAY with `reason` and the last stream
    /// processed, open streams are dropped. No frame is read after it, so a
    /// stream above that id is never processed: a client may safely retry
    /// it. [`Event::Closed`] follows on the next advance (before our
    /// SETTINGS went out: without a GOAWAY).
    pub fn abort(&mut self, reason: Reason) {
        match self.state {
            State::Open => {
                self.machine.abort(reason, &mut self.output);
                let error = (reason != Reason::NO_ERROR).then_some(H2Error::Codec {
                    reason: Some(reason),
                    go_away: true,
                    remote: false,
                    message: "closed by the server",
                });
                self.state = State::Closing(error);
            }
            State::New => self.state = State::Closing(None),
            State::Closing(_) | State::Closed => {}
        }
    }
}

fn send_error(stream: StreamId, e: machine::SendError) -> H2Error {
    match e {
        machine::SendError::UnknownStream => H2Error::UnknownStream(stream),
        machine::SendError::State(what) => H2Error::State(stream, what),
        machine::SendError::Window => H2Error::State(stream, "data past the window"),
    }
}
