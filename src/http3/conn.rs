//! One HTTP/3 connection over a `quinn_proto::Connection`: bytes of QUIC streams in, request
//! heads and body pieces out; response heads and body chunks in, stream writes out. No socket,
//! no clock of its own: the caller (the worker's loop, or a test) hands it quinn's
//! `ConnectionEvent`s and the time, sends what [`H3Conn::poll_transmit`] gives, and calls
//! [`H3Conn::handle_timeout`] at [`H3Conn::poll_timeout`].
//!
//! Per connection it owns: the server's control stream (SETTINGS first, GOAWAY later), the
//! client's control and QPACK streams (checked, RFC 9114 §6.2 and RFC 9204 §4.2), the encoder
//! side of the client's QPACK dynamic table (when the client's SETTINGS allow one: our encoder
//! stream, the fixed response fields inserted once and referenced once acknowledged, see
//! `qpack/encoder.rs`), and one [`Request`] state per request stream. Per request stream, the output is a queue of frames
//! that quinn takes as its flow control allows; a producer may add to it while
//! [`H3Conn::may_send`] says so, and gets [`Event::Writable`] when it may again. A stalled
//! stream never holds up another. A stream the client stops (`STOP_SENDING`) is reset at once
//! (RFC 9000 §3.5): quinn frees a stream, and gives the client its credit for a new one
//! (`MAX_STREAMS`), only once both directions are over.
//!
//! Its timers, beside quinn's: the handshake must complete within `header_timeout` of the
//! first packet (else the connection is closed), and a request head within `header_timeout`
//! of its stream's opening ([`Event::HeadTimeout`]); a connection with no request stream open
//! (and every response acknowledged) for `keepalive` after its handshake sends GOAWAY and
//! closes, whatever else (PINGs) the client sends. Before the client's address is validated, datagrams go out only while
//! whole ones fit in three times what arrived ([`Budget`], RFC 9000 §8.1).
//!
//! Errors are mapped in one place ([`H3Conn::fail`]): a stream error resets the stream (both
//! directions), a connection error closes the connection with its code. This file must not
//! touch sockets or handlers; what a request means is the caller's business.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quinn_proto::{
    Connection, ConnectionEvent, Dir, EndpointEvent, Event as QuicEvent, ReadError, StreamEvent, StreamId, Transmit,
    VarInt, WriteError,
};

use super::amplification::{opened_frames, Budget};
use super::error::{Code, H3Error};
use super::frame;
use super::head::{write_response_fields, write_response_head, RequestHead};
use super::idmap::IdMap;
use super::qpack::encoder::{TableEncoder, TABLE_BOUND};
use super::stream::{uni, Input, Outbox, PeerStreams, Phase, Request, UniNext};
use super::varint;
use crate::http2::ResponseFields;

pub use super::stream::WATERMARK;

/// What the connection tells its owner.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A request head, checked. The body (if any) follows as [`Event::Data`], then
    /// [`Event::End`].
    Request {
        /// The request's stream.
        stream: StreamId,
        /// Its head.
        head: RequestHead,
    },
    /// A request whose field section passed `SETTINGS_MAX_FIELD_SECTION_SIZE`: answer 431
    /// (its body is discarded).
    TooLarge {
        /// The request's stream.
        stream: StreamId,
    },
    /// A request head still incomplete `header_timeout` after its stream opened: answer 408
    /// (finishing the answer refuses the rest of its input).
    HeadTimeout {
        /// The request's stream.
        stream: StreamId,
    },
    /// A piece of a request body.
    Data {
        /// The request's stream.
        stream: StreamId,
        /// The bytes.
        data: Bytes,
    },
    /// The request body is complete.
    End {
        /// The request's stream.
        stream: StreamId,
    },
    /// The stream is gone (reset or stopped by the peer, or a stream error): drop its
    /// exchange; sending on it fails.
    Aborted {
        /// The request's stream.
        stream: StreamId,
    },
    /// The stream's queue fell below [`WATERMARK`]: its producer may send again.
    Writable {
        /// The request's stream.
        stream: StreamId,
    },
    /// The connection is closed (by the peer, a timeout, or a connection error): every
    /// exchange on it is over (no [`Event::Aborted`] follows for each). Keep polling transmits
    /// and timers until [`H3Conn::is_drained`], then drop it.
    Closed,
}

/// Sending on a stream that is gone (see [`Event::Aborted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamGone;

/// Settings of an [`H3Conn`].
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Largest decoded field section (`limits.max_header_bytes`): beyond it, 431.
    pub max_field_section: usize,
    /// A request head must be complete this long after its stream opened, and the handshake
    /// this long after the connection's first packet (`limits.header_timeout_ms`): else
    /// [`Event::HeadTimeout`], or the connection is closed.
    pub header_timeout: Duration,
    /// With no request stream for this long, GOAWAY and close (`limits.keepalive_timeout_ms`).
    pub keepalive: Duration,
}

/// One HTTP/3 connection (see the module doc).
#[derive(Debug)]
pub struct H3Conn {
    quic: Connection,
    limits: ConnLimits,
    control: Option<StreamId>,
    control_out: Outbox,
    /// Our QPACK encoder stream, open once the client's SETTINGS allow a dynamic table.
    encoder: Option<StreamId>,
    encoder_out: Outbox,
    /// The encoder side of the client's dynamic table (off until then).
    qpack: TableEncoder,
    peers: PeerStreams,
    requests: IdMap<StreamId, Request>,
    events: VecDeque<Event>,
    /// The highest request stream accepted.
    last_request: Option<StreamId>,
    /// Request streams whose head has not arrived, oldest first, with its deadline (an entry
    /// whose head arrived is dropped when it reaches the front).
    heads: VecDeque<(Instant, StreamId)>,
    /// The handshake must be over by then (`header_timeout` after the first packet).
    handshake_by: Instant,
    /// Since when no request stream is open after the handshake (`None`: one is, the
    /// handshake is not over, or GOAWAY was sent).
    idle_since: Option<Instant>,
    /// What the client's address may still be sent before it is validated (`None`: it is).
    unvalidated: Option<Budget>,
    /// The datagram being handled may validate the address (see `amplification.rs`): the
    /// frames quinn had opened before it.
    proof: Option<u64>,
    /// The GOAWAY sent: request streams from this ID on are refused.
    goaway: Option<u64>,
    /// After GOAWAY, no close before this: quinn drops stream data not yet sent when the
    /// connection closes, so a close right after the GOAWAY would lose it, and the client
    /// could not tell its requests in flight were not processed (RFC 9114 §5.2).
    close_after: Option<Instant>,
    closed: bool,
    /// What a request stream's input meant, kept between reads (no allocation per read).
    found: VecDeque<Input>,
    /// Where a frame head (and a small payload) is written before it is queued as one exact
    /// allocation.
    scratch: Vec<u8>,
}

/// DATA payloads up to this size are copied into their frame: one chunk, not two.
const SMALL_DATA: usize = 1024;

impl H3Conn {
    /// An HTTP/3 connection over a QUIC connection accepted at `now`; `validated`: the
    /// client's address is (a Retry token), so the anti-amplification limit does not apply.
    /// Hand it the length of the datagram that opened it ([`Self::received`]).
    pub fn new(quic: Connection, limits: ConnLimits, validated: bool, now: Instant) -> H3Conn {
        let mut conn = H3Conn {
            quic,
            limits,
            control: None,
            control_out: Outbox::default(),
            encoder: None,
            encoder_out: Outbox::default(),
            qpack: TableEncoder::default(),
            peers: PeerStreams::default(),
            requests: IdMap::default(),
            events: VecDeque::new(),
            last_request: None,
            heads: VecDeque::new(),
            handshake_by: now + limits.header_timeout,
            idle_since: None,
            unvalidated: (!validated).then(Budget::default),
            proof: None,
            goaway: None,
            close_after: None,
            closed: false,
            found: VecDeque::new(),
            scratch: Vec::new(),
        };
        conn.open_control();
        conn
    }

    /// The QUIC connection (statistics, addresses, `close`).
    pub fn quic(&self) -> &Connection {
        &self.quic
    }

    /// The peer's SETTINGS, once they arrived.
    pub fn peer_settings(&self) -> Option<frame::Settings> {
        self.peers.settings
    }

    /// A datagram of `len` bytes for this connection arrived from `from`, before its event is
    /// handled: it adds to what may be sent before the address is validated; `keyed`: it holds
    /// only packets protected with handshake keys (`amplification::keyed_only`), so if quinn
    /// opens any of them the address is validated.
    pub fn received(&mut self, from: std::net::SocketAddr, len: usize, keyed: bool) {
        let Some(budget) = &mut self.unvalidated else { return };
        if from == self.quic.remote_address() {
            budget.received(len);
            self.proof = keyed.then(|| opened_frames(&self.quic.stats().frame_rx));
        }
    }

    /// Hands quinn an event from the endpoint (a datagram for this connection), then
    /// processes what it caused.
    pub fn handle_event(&mut self, now: Instant, event: ConnectionEvent) {
        self.quic.handle_event(event);
        if let Some(before) = self.proof.take() {
            if opened_frames(&self.quic.stats().frame_rx) > before {
                self.unvalidated = None;
            }
        }
        self.process(now);
    }

    /// Hands quinn an event the endpoint answered one of ours with (new CIDs).
    pub fn quic_event(&mut self, event: ConnectionEvent) {
        self.quic.handle_event(event);
    }

    /// Runs quinn's timers due at `now`, then processes what they caused.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.quic.handle_timeout(now);
        self.process(now);
    }

    /// When [`Self::handle_timeout`] is next due.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let close = self.close_after.filter(|_| !self.closed && self.streams_over());
        let idle = self.idle_since.filter(|_| !self.closed).map(|t| t + self.limits.keepalive);
        let handshake = Some(self.handshake_by).filter(|_| !self.closed && self.quic.is_handshaking());
        [self.quic.poll_timeout(), close, self.next_head_deadline(), idle, handshake].into_iter().flatten().min()
    }

    /// The next datagram(s) to send (up to `max_datagrams` segments of one GSO batch), written
    /// into `buf`. Before the client's address is validated, only as many as fit whole in the
    /// anti-amplification budget (none: the rest waits for more from the client).
    pub fn poll_transmit(&mut self, now: Instant, max_datagrams: usize, buf: &mut Vec<u8>) -> Option<Transmit> {
        // A completed handshake validated the address (a closed connection never completed).
        if self.unvalidated.is_some() && !self.quic.is_handshaking() && !self.quic.is_closed() {
            self.unvalidated = None;
        }
        let Some(budget) = &mut self.unvalidated else { return self.quic.poll_transmit(now, max_datagrams, buf) };
        // quinn's datagrams during the handshake are at most the path's MTU (and an Initial
        // is padded to 1 200).
        let fit = budget.datagrams(self.quic.current_mtu().max(1200)).min(max_datagrams);
        if fit == 0 {
            return None;
        }
        let transmit = self.quic.poll_transmit(now, fit, buf)?;
        budget.sent(transmit.size);
        Some(transmit)
    }

    /// An event for the endpoint (new CIDs, drained), to hand to `Endpoint::handle_event`.
    pub fn poll_endpoint_event(&mut self) -> Option<EndpointEvent> {
        self.quic.poll_endpoint_events()
    }

    /// The next event for the owner.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether quinn is done with the connection (drop it; the endpoint has been told).
    pub fn is_drained(&self) -> bool {
        self.quic.is_drained()
    }

    /// Whether a producer may add to `stream`'s output now (its queue is below
    /// [`WATERMARK`]); when not, [`Event::Writable`] says when.
    pub fn may_send(&self, stream: StreamId) -> bool {
        self.requests.get(&stream).is_some_and(|r| r.outbox.open() && r.outbox.queued < WATERMARK)
    }

    /// Bytes waiting in `stream`'s queue.
    pub fn queued(&self, stream: StreamId) -> usize {
        self.requests.get(&stream).map_or(0, |r| r.outbox.queued)
    }

    /// Queues a response head (`:status` and `fields`; an informational status such as 103
    /// may precede the final one).
    pub fn send_head<'a>(
        &mut self,
        stream: StreamId,
        status: u16,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<(), StreamGone> {
        self.queue_head(stream, &[], |qpack, id, out| write_response_head(status, fields, qpack, id, out))
    }

    /// [`Self::send_head`] for a response's [`ResponseFields`]: the run of fields every
    /// response of its kind shares is encoded once per QPACK table state and copied after.
    pub fn send_head_fields(
        &mut self,
        stream: StreamId,
        status: u16,
        fields: &ResponseFields,
    ) -> Result<(), StreamGone> {
        self.send_response(stream, status, fields, Bytes::new())
    }

    /// [`Self::send_head_fields`] and then `body` as [`Self::send_data`] would send it; a
    /// small body goes in the same write as the head: one chunk for the whole response.
    pub fn send_response(
        &mut self,
        stream: StreamId,
        status: u16,
        fields: &ResponseFields,
        body: Bytes,
    ) -> Result<(), StreamGone> {
        let small = body.len() <= SMALL_DATA;
        let along = if small { &body[..] } else { &[] };
        self.queue_head(stream, along, |qpack, id, out| write_response_fields(status, fields, qpack, id, out))?;
        if !small {
            self.send_data(stream, body)?;
        }
        Ok(())
    }

    /// Writes the HEADERS frame `write` makes (given the QPACK encoder, the stream's QUIC ID
    /// and the buffer), followed by `body` as a DATA frame unless it is empty, and queues
    /// the encoder-stream instructions the head left.
    fn queue_head(
        &mut self,
        stream: StreamId,
        body: &[u8],
        write: impl FnOnce(&mut TableEncoder, u64, &mut Vec<u8>),
    ) -> Result<(), StreamGone> {
        if !self.requests.get(&stream).is_some_and(|r| r.outbox.open()) {
            return Err(StreamGone);
        }
        self.scratch.clear();
        write(&mut self.qpack, VarInt::from(stream).into_inner(), &mut self.scratch);
        if !body.is_empty() {
            frame::write_header(frame::ty::DATA, body.len() as u64, &mut self.scratch);
            self.scratch.extend_from_slice(body);
        }
        self.send_instructions();
        self.write_scratch(stream)
    }

    /// The encoder side of the client's QPACK dynamic table (for statistics and tests).
    pub fn qpack(&self) -> &TableEncoder {
        &self.qpack
    }

    /// Queues `data` as one DATA frame. Call while [`Self::may_send`]; the queue takes it
    /// anyway (a producer's last chunk may pass the watermark).
    pub fn send_data(&mut self, stream: StreamId, data: Bytes) -> Result<(), StreamGone> {
        if data.is_empty() {
            return Ok(());
        }
        self.scratch.clear();
        frame::write_header(frame::ty::DATA, data.len() as u64, &mut self.scratch);
        if data.len() <= SMALL_DATA {
            // One chunk, one allocation: a small payload is cheaper copied than queued apart.
            self.scratch.extend_from_slice(&data);
            return self.write_scratch(stream);
        }
        let head = Bytes::copy_from_slice(&self.scratch);
        self.queue_frame(stream, head, data)
    }

    /// Ends the response: FIN after the queue. A request body still arriving is refused with
    /// `STOP_SENDING H3_NO_ERROR` (RFC 9114 §4.1: a complete response may precede it).
    pub fn finish(&mut self, stream: StreamId) -> Result<(), StreamGone> {
        let r = self.requests.get_mut(&stream).filter(|r| !r.outbox.done).ok_or(StreamGone)?;
        r.outbox.fin = true;
        if r.phase != Phase::Done {
            r.phase = Phase::Done;
            let _ = self.quic.recv_stream(stream).stop(VarInt::from_u64(Code::NoError.value()).unwrap_or(VarInt::MAX));
        }
        self.flush(stream);
        Ok(())
    }

    /// Sets how early `stream`'s data goes out against the connection's other streams
    /// (higher first; quinn's send priority).
    pub fn set_priority(&mut self, stream: StreamId, priority: i32) {
        let _ = self.quic.send_stream(stream).set_priority(priority);
    }

    /// Abandons `stream` with `code` (both directions).
    pub fn reset(&mut self, now: Instant, stream: StreamId, code: Code) {
        self.fail(now, Some(stream), H3Error::stream(code, "reset by the server"));
    }

    /// Sends GOAWAY: requests already accepted finish, new ones are refused with
    /// `H3_REQUEST_REJECTED`, and the connection closes once no request is left.
    pub fn go_away(&mut self, now: Instant) {
        if self.goaway.is_some() || self.closed {
            return;
        }
        let next = self.last_request.map_or(0, |id| VarInt::from(id).into_inner() + 4);
        self.goaway = Some(next);
        // Three probe timeouts (RFC 9002 §6.2.1, with quinn's default 25 ms ACK delay): the
        // GOAWAY arrives, or is sent again, before the close.
        let pto = self.quic.rtt() + self.quic.rtt() / 2 + Duration::from_millis(25);
        self.close_after = Some(now + (pto * 3).min(Duration::from_secs(1)));
        let mut out = Vec::with_capacity(9);
        frame::write_goaway(next, &mut out);
        self.control_out.push(Bytes::from(out));
        self.flush_control();
        self.close_if_done(now);
    }

    /// Opens the server's control stream with its SETTINGS (once; retried on `Connected` if
    /// quinn cannot open it yet).
    fn open_control(&mut self) {
        if self.control.is_some() {
            return;
        }
        let Some(id) = self.quic.streams().open(Dir::Uni) else { return };
        self.control = Some(id);
        let mut out = Vec::with_capacity(32);
        varint::encode(uni::CONTROL, &mut out);
        frame::write_settings(
            &[
                (frame::setting::MAX_FIELD_SECTION_SIZE, self.limits.max_field_section as u64),
                (frame::setting::QPACK_MAX_TABLE_CAPACITY, 0),
                (frame::setting::QPACK_BLOCKED_STREAMS, 0),
            ],
            &mut out,
        );
        let mut queued = std::mem::take(&mut self.control_out.out);
        self.control_out.out.push_back(Bytes::from(out));
        self.control_out.out.append(&mut queued);
        self.control_out.queued = self.control_out.out.iter().map(Bytes::len).sum();
        self.flush_control();
    }

    /// Opens our QPACK encoder stream once the client's SETTINGS allow a dynamic table (RFC
    /// 9204 §4.2), with the Set Dynamic Table Capacity instruction first; retried on
    /// `Connected` if quinn cannot open it yet. A client that allows none never sees it.
    fn open_encoder(&mut self) {
        let Some(settings) = self.peers.settings else { return };
        if self.encoder.is_some() || !self.qpack.enable(settings.qpack_max_table_capacity, TABLE_BOUND) {
            return;
        }
        let Some(id) = self.quic.streams().open(Dir::Uni) else { return };
        self.encoder = Some(id);
        let mut out = Vec::with_capacity(16);
        varint::encode(uni::ENCODER, &mut out);
        self.qpack.take_instructions(&mut out);
        self.encoder_out.push(Bytes::from(out));
        flush_uni(&mut self.quic, self.encoder, &mut self.encoder_out);
    }

    /// Queues the encoder-stream instructions the last field section wrote (its insertions).
    fn send_instructions(&mut self) {
        if self.encoder.is_none() || !self.qpack.has_instructions() {
            return;
        }
        let mut out = Vec::new();
        self.qpack.take_instructions(&mut out);
        self.encoder_out.push(Bytes::from(out));
        flush_uni(&mut self.quic, self.encoder, &mut self.encoder_out);
    }

    /// Drains quinn's events into ours.
    fn process(&mut self, now: Instant) {
        while let Some(event) = self.quic.poll() {
            match event {
                QuicEvent::Connected => {
                    self.open_control();
                    self.open_encoder();
                }
                QuicEvent::ConnectionLost { .. } => self.lost(),
                QuicEvent::Stream(StreamEvent::Opened { dir }) => {
                    while let Some(id) = self.quic.streams().accept(dir) {
                        self.accept(now, id, dir);
                    }
                }
                QuicEvent::Stream(StreamEvent::Readable { id }) => self.read(now, id),
                QuicEvent::Stream(StreamEvent::Writable { id }) => {
                    if Some(id) == self.control {
                        self.flush_control();
                    } else if Some(id) == self.encoder {
                        flush_uni(&mut self.quic, self.encoder, &mut self.encoder_out);
                    } else {
                        self.flush(id);
                    }
                }
                QuicEvent::Stream(StreamEvent::Stopped { id, error_code }) => {
                    if Some(id) == self.control || Some(id) == self.encoder {
                        let why = "our control or QPACK encoder stream stopped";
                        self.fail(now, None, H3Error::conn(Code::ClosedCriticalStream, why));
                    } else {
                        self.stopped(now, id, error_code);
                    }
                }
                QuicEvent::Stream(StreamEvent::Finished { id }) => self.forget_if_done(now, id),
                QuicEvent::Stream(StreamEvent::Available { .. })
                | QuicEvent::HandshakeDataReady
                | QuicEvent::DatagramReceived
                | QuicEvent::DatagramsUnblocked => {}
            }
        }
        // quinn says `Writable` only for a stream whose write it refused outright; one that
        // took part of its queue (a window half open) hears nothing more, so every stream
        // with queued output is offered it again whenever the connection moved (an ACK or a
        // window update may have made room).
        let waiting: Vec<StreamId> = self
            .requests
            .iter()
            .filter(|(_, r)| !r.outbox.done && !r.outbox.out.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            self.flush(id);
        }
        self.flush_control();
        flush_uni(&mut self.quic, self.encoder, &mut self.encoder_out);
        if self.quic.is_closed() {
            self.lost();
        }
        self.expire_heads(now);
        self.watch_idle(now);
        self.close_if_done(now);
    }

    /// The client stopped `id` (it wants no more of the response): the stream is reset with
    /// the client's code, as RFC 9000 §3.5 requires (quinn frees it, and gives the client its
    /// credit back, only then), and the request's input is refused.
    fn stopped(&mut self, now: Instant, id: StreamId, error_code: VarInt) {
        let _ = self.quic.send_stream(id).reset(error_code);
        let Some(r) = self.requests.get_mut(&id) else { return };
        if r.phase != Phase::Done {
            let _ = self.quic.recv_stream(id).stop(code(Code::RequestCancelled));
        }
        r.abandon();
        self.events.push_back(Event::Aborted { stream: id });
        self.forget_if_done(now, id);
    }

    /// The earliest deadline of a request head still awaited (dropping those that arrived).
    fn next_head_deadline(&mut self) -> Option<Instant> {
        while let Some(&(deadline, id)) = self.heads.front() {
            if self.requests.get(&id).is_some_and(|r| r.phase == Phase::Head && r.outbox.open()) {
                return Some(deadline);
            }
            self.heads.pop_front();
        }
        None
    }

    /// Reports the request streams whose head is late ([`Event::HeadTimeout`], once each).
    fn expire_heads(&mut self, now: Instant) {
        while let Some(deadline) = self.next_head_deadline() {
            if deadline > now {
                break;
            }
            if let Some((_, stream)) = self.heads.pop_front() {
                self.events.push_back(Event::HeadTimeout { stream });
            }
        }
    }

    /// Closes a connection whose handshake is late; keeps `idle_since` (no request stream
    /// open, every response acknowledged: quinn has no send stream but our control stream)
    /// and sends GOAWAY once it is `keepalive` old.
    fn watch_idle(&mut self, now: Instant) {
        if self.closed || self.goaway.is_some() {
            self.idle_since = None;
            return;
        }
        if self.quic.is_handshaking() {
            if now >= self.handshake_by {
                log::debug!("HTTP/3 handshake not done within {:?}: closed", self.limits.header_timeout);
                self.quic.close(now, code(Code::NoError), Bytes::new());
                self.lost();
            }
            return;
        }
        if !self.streams_over() {
            self.idle_since = None;
            return;
        }
        let since = *self.idle_since.get_or_insert(now);
        if now >= since + self.limits.keepalive {
            log::debug!("HTTP/3 connection idle for {:?}: GOAWAY", self.limits.keepalive);
            self.idle_since = None;
            self.go_away(now);
        }
    }

    fn lost(&mut self) {
        if !self.closed {
            self.closed = true;
            self.requests.clear();
            self.events.push_back(Event::Closed);
        }
    }

    /// A stream the client opened.
    fn accept(&mut self, now: Instant, id: StreamId, dir: Dir) {
        if dir == Dir::Uni {
            self.peers.open(id);
            self.read(now, id);
            return;
        }
        let index = VarInt::from(id).into_inner();
        self.last_request = self.last_request.max(Some(id));
        if self.goaway.is_some_and(|limit| index >= limit) {
            let _ = self.quic.recv_stream(id).stop(code(Code::RequestRejected));
            let _ = self.quic.send_stream(id).reset(code(Code::RequestRejected));
            return;
        }
        self.requests.insert(id, Request::new(self.limits.max_field_section));
        self.heads.push_back((now + self.limits.header_timeout, id));
        self.idle_since = None;
        self.read(now, id);
    }

    /// Reads what `id` has and hands it to the stream's state.
    fn read(&mut self, now: Instant, id: StreamId) {
        let is_request = match self.requests.get(&id) {
            Some(r) => r.phase != Phase::Done,
            None if self.peers.has(id) => false,
            None => return,
        };
        // One chunk (the common case) is taken as quinn holds it; more are joined.
        let (mut input, mut joined, mut fin, mut reset) = (Bytes::new(), BytesMut::new(), false, false);
        if let Ok(mut chunks) = self.quic.recv_stream(id).read(true) {
            loop {
                match chunks.next(usize::MAX) {
                    Ok(Some(chunk)) if input.is_empty() && joined.is_empty() => input = chunk.bytes,
                    Ok(Some(chunk)) => {
                        if joined.is_empty() {
                            joined.extend_from_slice(&std::mem::take(&mut input));
                        }
                        joined.extend_from_slice(&chunk.bytes);
                    }
                    Ok(None) => {
                        fin = true;
                        break;
                    }
                    Err(ReadError::Blocked) => break,
                    Err(ReadError::Reset(_)) => {
                        reset = true;
                        break;
                    }
                }
            }
            let _ = chunks.finalize();
        }
        if !joined.is_empty() {
            input = joined.freeze();
        }
        let result = if is_request {
            self.on_request(now, id, input, fin, reset)
        } else {
            let next = self.peers.on_input(id, BytesMut::from(input), fin || reset, &mut self.qpack);
            self.open_encoder();
            match next {
                Ok(UniNext::Refuse) => {
                    let _ = self.quic.recv_stream(id).stop(code(Code::StreamCreationError));
                    Ok(())
                }
                Ok(UniNext::Read) => Ok(()),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = result {
            self.fail(now, Some(id), e);
        }
    }

    /// New bytes (and maybe the end) of request stream `id`: its state says what they mean,
    /// and each meaning becomes an [`Event`].
    fn on_request(&mut self, now: Instant, id: StreamId, input: Bytes, fin: bool, reset: bool) -> Result<(), H3Error> {
        let early = self.quic.is_handshaking();
        let Some(r) = self.requests.get_mut(&id) else { return Ok(()) };
        if reset {
            r.abandon();
            let _ = self.quic.send_stream(id).reset(code(Code::RequestCancelled));
            self.events.push_back(Event::Aborted { stream: id });
            self.forget_if_done(now, id);
            return Ok(());
        }
        let mut found = std::mem::take(&mut self.found);
        let result = r.on_input(input, fin, early, self.limits.max_field_section, &mut found);
        for input in found.drain(..) {
            self.events.push_back(match input {
                Input::Head(head) => Event::Request { stream: id, head },
                Input::TooLarge => Event::TooLarge { stream: id },
                Input::Data(data) => Event::Data { stream: id, data },
                Input::End => Event::End { stream: id },
            });
        }
        self.found = found;
        result?;
        if fin {
            self.forget_if_done(now, id);
        }
        Ok(())
    }

    /// Writes what `scratch` holds to `stream`: straight into quinn (which copies what it
    /// takes) while nothing is queued before it, and what quinn does not take (all of it,
    /// behind a queue) is queued as one copy.
    fn write_scratch(&mut self, stream: StreamId) -> Result<(), StreamGone> {
        let r = self.requests.get_mut(&stream).filter(|r| r.outbox.open()).ok_or(StreamGone)?;
        let mut taken = 0;
        if r.outbox.out.is_empty() {
            // An error leaves it all queued: the flush below meets it again and acts on it.
            taken = self.quic.send_stream(stream).write(&self.scratch).unwrap_or(0);
            if taken == self.scratch.len() {
                return Ok(());
            }
        }
        r.outbox.push(Bytes::copy_from_slice(&self.scratch[taken..]));
        self.flush(stream);
        Ok(())
    }

    /// Queues a frame head and its payload, kept as two chunks (no copy), and writes what
    /// flow control allows.
    fn queue_frame(&mut self, stream: StreamId, head: Bytes, payload: Bytes) -> Result<(), StreamGone> {
        let r = self.requests.get_mut(&stream).filter(|r| r.outbox.open()).ok_or(StreamGone)?;
        r.outbox.push(head);
        r.outbox.push(payload);
        self.flush(stream);
        Ok(())
    }

    /// Writes `stream`'s queue into quinn as far as flow control allows; FIN when finished.
    fn flush(&mut self, stream: StreamId) {
        let Some(r) = self.requests.get_mut(&stream) else { return };
        let ob = &mut r.outbox;
        if ob.done {
            return;
        }
        if !ob.out.is_empty() {
            match self.quic.send_stream(stream).write_chunks(ob.out.make_contiguous()) {
                Ok(written) => {
                    ob.out.drain(..written.chunks);
                    ob.queued -= written.bytes;
                }
                Err(WriteError::Blocked) => {}
                Err(WriteError::Stopped(error_code)) => {
                    // Its `Stopped` event may not have been seen yet: it resets the stream.
                    let _ = self.quic.send_stream(stream).reset(error_code);
                    *ob = Outbox { done: true, ..Outbox::default() };
                    self.events.push_back(Event::Aborted { stream });
                    return;
                }
                Err(WriteError::ClosedStream) => {
                    *ob = Outbox { done: true, ..Outbox::default() };
                    self.events.push_back(Event::Aborted { stream });
                    return;
                }
            }
        }
        if ob.out.is_empty() && ob.fin {
            if let Err(quinn_proto::FinishError::Stopped(error_code)) = self.quic.send_stream(stream).finish() {
                let _ = self.quic.send_stream(stream).reset(error_code);
            }
            ob.done = true;
        }
        if ob.paused && ob.queued < WATERMARK && !ob.done {
            ob.paused = false;
            self.events.push_back(Event::Writable { stream });
        }
    }

    /// Writes the control stream's queue.
    fn flush_control(&mut self) {
        flush_uni(&mut self.quic, self.control, &mut self.control_out);
    }

    /// Drops `id`'s state once both directions are over.
    fn forget_if_done(&mut self, now: Instant, id: StreamId) {
        if self.requests.get(&id).is_some_and(Request::is_done) {
            self.requests.remove(&id);
        }
        self.close_if_done(now);
    }

    /// No request stream is open and quinn holds no response data (its only send streams are
    /// our control and QPACK encoder streams).
    fn streams_over(&mut self) -> bool {
        let ours = usize::from(self.control.is_some()) + usize::from(self.encoder.is_some());
        self.requests.is_empty() && self.quic.streams().send_streams() <= ours
    }

    /// After GOAWAY, closes the connection once no request is left and every response is
    /// acknowledged (quinn drops what it has not sent when it closes).
    fn close_if_done(&mut self, now: Instant) {
        if self.goaway.is_some()
            && !self.closed
            && self.control_out.out.is_empty()
            && self.close_after.is_some_and(|t| now >= t)
            && self.streams_over()
        {
            self.quic.close(now, code(Code::NoError), Bytes::new());
        }
    }

    /// The one place an [`H3Error`] becomes wire action: a stream error resets `stream` both
    /// ways and tells the owner; a connection error closes the connection with its code.
    fn fail(&mut self, now: Instant, stream: Option<StreamId>, error: H3Error) {
        match (error, stream) {
            (H3Error::Stream { code: c, why }, Some(id)) if self.requests.contains_key(&id) => {
                log::debug!("HTTP/3 stream {id}: {why}");
                let _ = self.quic.recv_stream(id).stop(code(c));
                let _ = self.quic.send_stream(id).reset(code(c));
                self.requests.remove(&id);
                self.events.push_back(Event::Aborted { stream: id });
                self.close_if_done(now);
            }
            (error, _) => {
                log::debug!("{error}");
                self.quic.close(now, code(error.code()), Bytes::from_static(b""));
                self.lost();
            }
        }
    }
}

/// Writes the queue of one of our unidirectional streams (control, QPACK encoder) into quinn
/// as far as flow control allows.
fn flush_uni(quic: &mut Connection, id: Option<StreamId>, ob: &mut Outbox) {
    let Some(id) = id else { return };
    if ob.out.is_empty() {
        return;
    }
    if let Ok(written) = quic.send_stream(id).write_chunks(ob.out.make_contiguous()) {
        ob.out.drain(..written.chunks);
        ob.queued -= written.bytes;
    }
}

/// A code as quinn's `VarInt` (every HTTP/3 code fits).
fn code(c: Code) -> VarInt {
    VarInt::from_u64(c.value()).unwrap_or(VarInt::MAX)
}
