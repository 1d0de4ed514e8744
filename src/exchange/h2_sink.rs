//! HTTP/2's sink: how the exchange engine writes an HTTP/2 connection's exchanges through
//! [`H2Conn`], and the scheduler that decides whose DATA goes next (RFC 9218); and its
//! [`Source`]: the codec's events as the engine's [`Input`]s, with HTTP/2's checks of a
//! request head and its count of streams the peer reset (a slow reset flood).
//!
//! Heads, DATA, resets and window releases go straight to the codec. Streamed bodies go out
//! in the order of their requests' `priority`: each pass ([`Sink::pump`]) offers the most
//! urgent ready streams a [`QUANTUM`] of DATA through the codec's [`Scheduler`] and lets less
//! urgent ones wait while those can go on; only the most urgent blocked stream keeps asking
//! the codec for window. A file body is read ahead on the pool as far as its stream's window
//! allows ([`read_ahead`]).
//!
//! It is socket-free (the worker's session moves the codec's bytes); it lives beside the
//! engine, not beside the codec in `http2/`: it works over the engine's exchanges, their
//! producers and the worker's pool, which `http2/` must not know. This file must not touch a
//! socket, write HTTP/2 frames itself or know a route.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;

use super::pool::{ExchangeId, Pool, Work};
use super::{Download, Exchange, Gone, Head, Input, Key, Opening, Produce, Reset, Sink, Source, SLICE};
use crate::error::Error;
use crate::http::reply::FileRange;
use crate::http::service::Env;
use crate::http2::request::{self, Fault};
use crate::http2::{
    Event, H2Conn, H2Error, H2Settings, Priority, Reason, RequestHead, ResponseFields, Scheduler, Sent, StreamId,
};

/// Streams the peer may reset before we answered them, per connection; one
/// more ends the connection with `GOAWAY(ENHANCE_YOUR_CALM)`. The codec catches a
/// burst of resets; this catches the slow kind (one HEADERS + RST_STREAM per
/// read), which it never sees as a burst.
const MAX_PEER_RESETS: u32 = 200;

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

/// Both sides of an HTTP/2 connection as the engine sees them: the codec, what it
/// reported and the engine has not read, and who of the streams with DATA ready sends next
/// (RFC 9218).
pub(crate) struct H2Sink {
    /// The codec.
    pub(crate) conn: H2Conn,
    scheduler: Scheduler,
    /// Scratch: the streams with DATA ready, for the scheduler.
    ready: Vec<(StreamId, Priority)>,
    /// What the codec reported, in order, not yet read as input.
    events: VecDeque<Event>,
    /// The client (named in the log of a flood).
    peer: IpAddr,
    /// Streams the peer reset before their answer.
    peer_resets: u32,
    /// [`Event::Closed`] came: the output is flushed, then the connection closes.
    pub(crate) closed: bool,
}

impl H2Sink {
    /// A sink over a new codec with `settings`, for a connection from `peer`.
    pub(crate) fn new(settings: H2Settings, peer: IpAddr) -> H2Sink {
        H2Sink {
            conn: H2Conn::new(settings),
            scheduler: Scheduler::new(),
            ready: Vec::new(),
            events: VecDeque::new(),
            peer,
            peer_resets: 0,
            closed: false,
        }
    }

    /// Run the codec over what it was fed ([`H2Conn::advance`]); its events wait to be read
    /// as input.
    #[inline]
    pub(crate) fn advance(&mut self) {
        self.conn.advance(&mut self.events);
    }

    /// Events are waiting to be read as input.
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }
}

impl Key for StreamId {
    #[inline]
    fn id(self, conn: usize, gen: u32) -> ExchangeId {
        ExchangeId::H2 { conn, stream: self.0, gen }
    }
}

impl Head for RequestHead {
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

impl Source for H2Sink {
    type Head = RequestHead;

    #[inline]
    fn next_input(&mut self, env: &Env) -> Option<Input<StreamId, RequestHead>> {
        loop {
            return Some(match self.events.pop_front()? {
                Event::Request { stream, head } => self.opening(stream, head, env),
                Event::Data { stream, bytes, end } => Input::Data { stream, bytes, end },
                Event::Writable { .. } => continue,
                Event::Reset { stream, .. } => Input::Reset(stream),
                Event::Closed { error } => {
                    match error {
                        Some(H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), remote: false, .. }) => {
                            log::info!("HTTP/2 flood from {}: GOAWAY(ENHANCE_YOUR_CALM)", self.peer);
                        }
                        Some(e) => log::debug!("HTTP/2 connection ended: {e}"),
                        None => {}
                    }
                    self.closed = true;
                    Input::Closed
                }
            });
        }
    }

    fn peer_reset(&mut self) {
        self.peer_resets += 1;
        if self.peer_resets > MAX_PEER_RESETS {
            log::debug!("HTTP/2: too many streams reset by the peer");
            self.conn.abort(Reason::ENHANCE_YOUR_CALM);
        }
    }
}

impl H2Sink {
    /// The engine's input for a request head on `stream`: what HTTP/2 finds wrong with it.
    #[inline]
    fn opening(&self, stream: StreamId, head: RequestHead, env: &Env) -> Input<StreamId, RequestHead> {
        // RFC 8441: the stream is the tunnel; the request is complete with its head.
        let tunnel = head.method() == "CONNECT" && head.protocol() == Some("websocket");
        let declared =
            head.field("content-length").and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        let priority = Priority::from_fields(head.field_all("priority"));
        let end_stream = head.end_stream;
        let refused = match request::check(&head, self.conn.settings().max_header_list_size as usize) {
            Err(Fault::TooLarge) => Some(Error::HeaderTooLarge),
            Err(Fault::Malformed(why)) => Some(Error::bad_request(why)),
            Ok(()) if declared.is_some_and(|n| n > env.max_body) => Some(Error::PayloadTooLarge),
            Ok(()) => None,
        };
        let opening = Opening { stream, head, priority, body_follows: !end_stream, tunnel };
        Input::Request { opening, refused, complete: end_stream || tunnel }
    }
}

impl Sink for H2Sink {
    type Stream = StreamId;

    #[inline]
    fn informational(&mut self, stream: StreamId, fields: &ResponseFields) -> Result<(), Gone> {
        self.conn.early_hints_with(stream, fields).map_err(|_| Gone)
    }

    #[inline]
    fn send_head(
        &mut self,
        stream: StreamId,
        status: http::StatusCode,
        fields: &ResponseFields,
        end: bool,
    ) -> Result<(), Gone> {
        self.conn.respond_with(stream, status, fields, end).map_err(|_| Gone)
    }

    #[inline]
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

    #[inline]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_for_an_unknown_stream_is_refused() {
        let mut sink = H2Sink::new(H2Settings::default(), std::net::Ipv4Addr::LOCALHOST.into());
        let fields = ResponseFields::default();
        assert!(sink.send_head(StreamId(1), http::StatusCode::OK, &fields, true).is_err());
    }
}
