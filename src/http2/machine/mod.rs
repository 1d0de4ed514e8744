//! The server side of one HTTP/2 connection as a state machine of forkd's own: bytes in,
//! [`Event`]s and bytes out, on [`wire`](super::wire) frames, [`hpack`](super::hpack) header
//! blocks and [`flow`](super::flow) windows.
//!
//! [`Machine::recv`] reads every complete frame of the input it is given and appends what
//! the frames call for (SETTINGS and PING acknowledgements, WINDOW_UPDATEs, resets, a
//! GOAWAY) to one output buffer; the response side ([`Machine::respond`],
//! [`Machine::send_data`], [`Machine::reset`], [`Machine::release`]) appends its frames to
//! the same buffer. Events borrow from the input and from the connection's reused field
//! list, so a request costs no allocation once the buffers have grown.
//!
//! What it enforces (RFC 9113): the client preface then SETTINGS first; stream ids (odd,
//! increasing; frames on idle streams are connection errors); stream states (DATA or
//! HEADERS after the peer's END_STREAM is `STREAM_CLOSED`; trailers must end the stream);
//! HEADERS + CONTINUATION reassembly with no other frame in between, bounded in frames and
//! bytes (the CONTINUATION flood, CVE-2024-27316); SETTINGS_MAX_CONCURRENT_STREAMS
//! (`REFUSED_STREAM`); both flow-control windows (overflow is `FLOW_CONTROL_ERROR`); the
//! header list limit (a bare 431, as h2 answers); malformed heads (`PROTOCOL_ERROR` on the
//! stream, and past [`Limits::max_local_error_resets`] of them `ENHANCE_YOUR_CALM`); streams
//! reset by the peer before they were answered, many in one read (rapid reset,
//! CVE-2023-44487); runs of empty DATA frames. PRIORITY frames are read and ignored (RFC
//! 9113 §5.3.2). How much input is read per turn and control-frame floods stay with
//! `super::meter`, which decides how many leading input bytes reach [`Machine::recv`].
//!
//! It must not touch sockets, clocks, routes or HTTP semantics beyond RFC 9113's framing
//! rules: the caller turns events into exchanges and answers through the methods above.

mod fields;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

#[cfg(test)]
pub(crate) use fields::TEST_GET;
pub(crate) use fields::{every, is_token, HOST, PATH};
pub use fields::{Fields, Text};

use super::flow::{RecvWindow, SendWindow};
use super::hpack::{Decoder, Encoder, HpackError, Part};
use super::wire::{self, setting, Frame, FrameError, Reason, MAX_WINDOW, MIN_MAX_FRAME};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The opaque data of the PING that a graceful shutdown sends with its first GOAWAY.
const SHUTDOWN_PING: [u8; 8] = *b"forkd-gs";

/// The protocol's initial window (RFC 9113 §6.9.2).
const DEFAULT_WINDOW: u32 = 65_535;

/// The HPACK dynamic table forkd fills in the peer's decoder, at most.
const ENCODER_TABLE: usize = 4096;

/// What the connection allows its peer.
#[derive(Clone, Debug)]
pub struct Limits {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window.
    pub initial_window_size: u32,
    /// The connection's receive window (raised from 65,535 by a WINDOW_UPDATE at start).
    pub connection_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a larger list is answered with a bare 431.
    pub max_header_list_size: u32,
    /// Streams the peer may reset before they were answered within one [`Machine::recv`];
    /// more end the connection with `ENHANCE_YOUR_CALM`.
    pub max_pending_resets: usize,
    /// Streams we may reset for the peer's errors over the connection's life; more end it
    /// with `ENHANCE_YOUR_CALM`.
    pub max_local_error_resets: usize,
    /// Reset streams remembered, so that frames still in flight for them are ignored.
    pub max_recent_resets: usize,
    /// Empty DATA frames without END_STREAM in a row (no request or data in between)
    /// before the connection ends with `ENHANCE_YOUR_CALM`.
    pub max_empty_data: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_concurrent_streams: 128,
            initial_window_size: DEFAULT_WINDOW,
            connection_window_size: 16 * DEFAULT_WINDOW,
            max_frame_size: MIN_MAX_FRAME as u32,
            max_header_list_size: 32 * 1024,
            max_pending_resets: 20,
            max_local_error_resets: 1024,
            max_recent_resets: 50,
            max_empty_data: 100,
        }
    }
}

/// What the peer's frames did.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A new stream carries a request; its fields stay valid until the next event.
    Request {
        /// The stream.
        stream: u32,
        /// Its head, checked against RFC 9113 §8.3.
        head: &'a Fields,
        /// END_STREAM: no body follows.
        end_stream: bool,
    },
    /// Request body bytes, counted against the receive windows until [`Machine::release`];
    /// `data` is empty on a bare END_STREAM or on trailers (which are dropped).
    Data {
        /// The stream.
        stream: u32,
        /// The bytes, padding removed.
        data: &'a [u8],
        /// The body ends here.
        end: bool,
    },
    /// The stream is gone: the peer reset it, or we did for its error (the RST_STREAM is in
    /// the output). Unreleased bytes went back to the connection window.
    Reset {
        /// The stream.
        stream: u32,
        /// Why.
        reason: Reason,
    },
    /// The peer widened a send window (`stream` 0: the connection's): blocked streams may
    /// have room.
    Window {
        /// The stream, or 0.
        stream: u32,
    },
    /// The peer sent GOAWAY: it opens no more streams.
    GoAway {
        /// Its error code.
        reason: Reason,
    },
}

/// A connection error: the GOAWAY carrying `reason` is in the output, and the machine reads
/// no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnError {
    /// The GOAWAY's code.
    pub reason: Reason,
    /// What broke.
    pub message: &'static str,
}

/// Why a response-side call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// No such stream: never opened, reset, or finished.
    UnknownStream,
    /// The call does not fit the stream's state.
    State(&'static str),
    /// More DATA than [`Machine::writable`] allows.
    Window,
}

/// Where the connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before the client preface.
    Preface,
    /// The preface arrived; the peer's first frame must be SETTINGS.
    Settings,
    /// Frames flow.
    Open,
    /// A GOAWAY was written or the peer broke the protocol: input is ignored.
    Closed,
}

/// Graceful shutdown (RFC 9113 §6.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shutdown {
    None,
    /// GOAWAY(2^31 - 1) and a PING are out; the PING's answer sends the final GOAWAY.
    Pinged,
    /// The final GOAWAY named this last stream: higher ones are ignored.
    Final(u32),
}

/// One open stream.
#[derive(Debug)]
struct Stream {
    id: u32,
    recv: RecvWindow,
    send: SendWindow,
    /// The peer may still send (no END_STREAM yet).
    recv_open: bool,
    /// We may still send (no END_STREAM yet).
    send_open: bool,
    /// The final response head went out.
    responded: bool,
    /// Received bytes not yet released.
    unreleased: usize,
}

/// A header block waiting for CONTINUATION frames.
#[derive(Clone, Copy, Debug)]
struct Continuing {
    stream: u32,
    end_stream: bool,
    frames: u32,
}

/// One server connection's HTTP/2 state (see the module doc).
#[derive(Debug)]
pub struct Machine {
    limits: Limits,
    phase: Phase,
    shutdown: Shutdown,
    decoder: Decoder,
    encoder: Encoder,
    fields: Fields,
    /// A header block being reassembled from CONTINUATIONs, and the encoder's scratch.
    block: Vec<u8>,
    continuing: Option<Continuing>,
    /// Open streams, ascending by id.
    streams: VecDeque<Stream>,
    /// The highest stream id the peer opened (or tried to).
    highest: u32,
    recent_resets: VecDeque<u32>,
    conn_recv: RecvWindow,
    conn_send: SendWindow,
    peer_initial_window: u32,
    peer_max_frame: usize,
    local_error_resets: usize,
    pending_resets: usize,
    empty_data: u32,
}

impl Machine {
    /// A connection whose preface has not arrived; [`Machine::start`] writes our side's.
    pub fn new(limits: Limits) -> Machine {
        let conn_recv = RecvWindow::new(limits.connection_window_size.max(DEFAULT_WINDOW));
        Machine {
            decoder: Decoder::new(4096),
            encoder: Encoder::new(ENCODER_TABLE),
            fields: Fields::default(),
            block: Vec::new(),
            continuing: None,
            streams: VecDeque::new(),
            highest: 0,
            recent_resets: VecDeque::new(),
            conn_recv,
            conn_send: SendWindow::new(DEFAULT_WINDOW),
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame: MIN_MAX_FRAME,
            local_error_resets: 0,
            pending_resets: 0,
            empty_data: 0,
            phase: Phase::Preface,
            shutdown: Shutdown::None,
            limits,
        }
    }

    /// Appends our SETTINGS to `out`: the server's preface, sent before anything else. The
    /// WINDOW_UPDATE that raises the connection's receive window follows the acknowledgement
    /// of the peer's first SETTINGS.
    pub fn start(&mut self, out: &mut Vec<u8>) {
        let l = &self.limits;
        let mut pairs = vec![
            (setting::MAX_CONCURRENT_STREAMS, l.max_concurrent_streams),
            (setting::INITIAL_WINDOW_SIZE, l.initial_window_size.min(MAX_WINDOW)),
            (setting::MAX_HEADER_LIST_SIZE, l.max_header_list_size),
            (setting::ENABLE_CONNECT_PROTOCOL, 1),
        ];
        if l.max_frame_size as usize > MIN_MAX_FRAME {
            pairs.push((setting::MAX_FRAME_SIZE, l.max_frame_size.min(wire::MAX_MAX_FRAME as u32)));
        }
        wire::put_settings(out, &pairs);
    }

    /// Reads every complete frame at the front of `input`, appending what they call for to
    /// `out` and handing what happened to `on`; returns the bytes consumed (a partial frame
    /// stays for the next call). After a connection error the GOAWAY is in `out`; after
    /// that, and after [`Machine::abort`], input is consumed and ignored.
    pub fn recv(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<usize, ConnError> {
        if self.phase == Phase::Closed {
            return Ok(input.len());
        }
        let mut used = 0;
        if self.phase == Phase::Preface {
            let n = input.len().min(PREFACE.len());
            if input[..n] != PREFACE[..n] {
                // No GOAWAY: the peer does not speak HTTP/2 at all.
                self.phase = Phase::Closed;
                return Err(ConnError { reason: Reason::PROTOCOL_ERROR, message: "not the HTTP/2 preface" });
            }
            if n < PREFACE.len() {
                return Ok(0);
            }
            used = n;
            self.phase = Phase::Settings;
        }
        self.pending_resets = 0;
        while self.phase != Phase::Closed {
            let parsed = wire::parse(&input[used..], self.limits.max_frame_size as usize);
            let (frame, n) = match parsed {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(FrameError(reason)) => return Err(self.fail(out, reason, "a malformed frame")),
            };
            used += n;
            if let Err(e) = self.frame(frame, out, on) {
                return Err(self.fail(out, e.reason, e.message));
            }
        }
        Ok(if self.phase == Phase::Closed { input.len() } else { used })
    }

    /// Open streams.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// No stream is open and no header block is half-read: a final GOAWAY cuts nothing.
    pub fn is_quiet(&self) -> bool {
        self.streams.is_empty() && self.continuing.is_none()
    }

    /// The connection is over for input (a GOAWAY was written, or the preface was wrong).
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// A graceful shutdown sent its final GOAWAY and every stream finished.
    pub fn is_drained(&self) -> bool {
        matches!(self.shutdown, Shutdown::Final(_)) && self.streams.is_empty()
    }

    /// The peer's preface and first SETTINGS arrived, and the connection is not closed.
    pub fn is_established(&self) -> bool {
        self.phase == Phase::Open
    }

    /// What the peer's connection window lets us send now.
    pub fn conn_window(&self) -> usize {
        self.conn_send.available()
    }

    /// What `stream`'s own window lets it send now: 0 before its final response head, after
    /// its end, or when it is unknown.
    pub fn stream_window(&self, stream: u32) -> usize {
        match self.streams.binary_search_by_key(&stream, |s| s.id) {
            Ok(i) if self.streams[i].responded && self.streams[i].send_open => self.streams[i].send.available(),
            _ => 0,
        }
    }

    /// The highest stream id the peer opened.
    pub fn last_stream(&self) -> u32 {
        self.highest
    }

    /// Sends the response head (`status` ≥ 200) or an interim one (1xx, never with
    /// `end_stream`). `fields` are lowercase names without connection-specific fields, each
    /// marked sensitive (a never-indexed literal) or not, and fixed runs
    /// ([`Encoder::encode_parts`]).
    pub fn respond<'f>(
        &mut self,
        stream: u32,
        status: u16,
        fields: impl IntoIterator<Item = Part<'f>>,
        end_stream: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), SendError> {
        let i = self.find(stream)?;
        let s = &self.streams[i];
        if s.responded {
            return Err(SendError::State("response already sent"));
        }
        let interim = status < 200;
        if interim && end_stream {
            return Err(SendError::State("an interim response cannot end the stream"));
        }
        self.block.clear();
        self.encoder.encode_parts(&mut self.block, Some(status), fields);
        wire::put_headers(out, stream, &self.block, end_stream, self.peer_max_frame);
        let s = &mut self.streams[i];
        s.responded = !interim;
        if end_stream {
            s.send_open = false;
            self.retire(i, out);
        }
        Ok(())
    }

    /// Sends trailers, ending the response.
    pub fn trailers<'f>(
        &mut self,
        stream: u32,
        fields: impl IntoIterator<Item = (&'f [u8], &'f [u8])>,
        out: &mut Vec<u8>,
    ) -> Result<(), SendError> {
        let i = self.sendable(stream)?;
        self.block.clear();
        self.encoder.encode(&mut self.block, None, fields);
        wire::put_headers(out, stream, &self.block, true, self.peer_max_frame);
        self.streams[i].send_open = false;
        self.retire(i, out);
        Ok(())
    }

    /// How many DATA bytes `stream` may send now: the smaller of its and the connection's
    /// send windows; 0 before the response head, after its end, or for an unknown stream.
    pub fn writable(&self, stream: u32) -> usize {
        self.stream_window(stream).min(self.conn_send.available())
    }

    /// Sends `data` (at most [`Machine::writable`]) as DATA frames no larger than the peer
    /// allows; `end` ends the response (an empty `data` with `end` is a bare END_STREAM).
    pub fn send_data(&mut self, stream: u32, data: &[u8], end: bool, out: &mut Vec<u8>) -> Result<(), SendError> {
        let i = self.sendable(stream)?;
        if data.len() > self.writable(stream) {
            return Err(SendError::Window);
        }
        let s = &mut self.streams[i];
        s.send.spend(data.len());
        self.conn_send.spend(data.len());
        let mut chunks = data.chunks(self.peer_max_frame).peekable();
        if chunks.peek().is_none() {
            wire::put_data(out, stream, &[], end);
        }
        while let Some(chunk) = chunks.next() {
            wire::put_data(out, stream, chunk, end && chunks.peek().is_none());
        }
        if end {
            s.send_open = false;
            self.retire(i, out);
        }
        Ok(())
    }

    /// Hands `n` received bytes of `stream` back to the peer's windows (they were consumed);
    /// WINDOW_UPDATEs go out once half a window is owed. Bytes of a stream that is gone
    /// were returned when it went, and are ignored.
    pub fn release(&mut self, stream: u32, n: usize, out: &mut Vec<u8>) {
        let Ok(i) = self.streams.binary_search_by_key(&stream, |s| s.id) else { return };
        let s = &mut self.streams[i];
        let n = n.min(s.unreleased);
        s.unreleased -= n;
        if s.recv_open {
            if let Some(inc) = s.recv.release(n) {
                wire::put_window_update(out, stream, inc);
            }
        }
        self.release_conn(n, out);
    }

    /// Resets `stream` with `reason`; it is gone at once, and frames still in flight for it
    /// are ignored.
    pub fn reset(&mut self, stream: u32, reason: Reason, out: &mut Vec<u8>) -> Result<(), SendError> {
        let i = self.find(stream)?;
        wire::put_rst_stream(out, stream, reason);
        self.drop_stream(i, out);
        Ok(())
    }

    /// Starts a graceful shutdown (RFC 9113 §6.8): GOAWAY naming the largest stream id and
    /// a PING now; when the PING is answered, the GOAWAY naming the last stream opened. Open
    /// streams may finish; [`Machine::is_drained`] says when all have.
    pub fn graceful_shutdown(&mut self, out: &mut Vec<u8>) {
        if self.phase == Phase::Closed || self.shutdown != Shutdown::None {
            return;
        }
        wire::put_goaway(out, MAX_WINDOW, Reason::NO_ERROR, b"");
        wire::put_ping(out, SHUTDOWN_PING);
        self.shutdown = Shutdown::Pinged;
    }

    /// Ends the connection now: GOAWAY with `reason` and the last stream opened; streams are
    /// dropped and input is ignored from here on.
    pub fn abort(&mut self, reason: Reason, out: &mut Vec<u8>) {
        if self.phase == Phase::Closed {
            return;
        }
        wire::put_goaway(out, self.highest, reason, b"");
        self.phase = Phase::Closed;
        self.streams.clear();
    }

    /// A connection error: GOAWAY, then nothing more is read.
    fn fail(&mut self, out: &mut Vec<u8>, reason: Reason, message: &'static str) -> ConnError {
        self.abort(reason, out);
        ConnError { reason, message }
    }

    fn find(&self, stream: u32) -> Result<usize, SendError> {
        self.streams.binary_search_by_key(&stream, |s| s.id).map_err(|_| SendError::UnknownStream)
    }

    /// The stream, if its response head went out and it has not ended.
    fn sendable(&self, stream: u32) -> Result<usize, SendError> {
        let i = self.find(stream)?;
        match &self.streams[i] {
            s if !s.responded => Err(SendError::State("body before the response head")),
            s if !s.send_open => Err(SendError::State("body after the end of the response")),
            _ => Ok(i),
        }
    }

    /// Forgets stream `i` once both sides ended. A response that ended before the request
    /// body resets the rest of it with NO_ERROR (RFC 9113 §8.1).
    fn retire(&mut self, i: usize, out: &mut Vec<u8>) {
        let s = &self.streams[i];
        if s.send_open {
            return;
        }
        if s.recv_open {
            wire::put_rst_stream(out, s.id, Reason::NO_ERROR);
        }
        self.drop_stream(i, out);
    }

    /// Removes stream `i`, giving its unreleased bytes back to the connection window and
    /// remembering it (frames in flight for it are then ignored).
    fn drop_stream(&mut self, i: usize, out: &mut Vec<u8>) {
        let Some(s) = self.streams.remove(i) else { return };
        self.release_conn(s.unreleased, out);
        if s.recv_open {
            self.remember_reset(s.id);
        }
    }

    fn remember_reset(&mut self, id: u32) {
        if self.recent_resets.len() >= self.limits.max_recent_resets {
            self.recent_resets.pop_front();
        }
        self.recent_resets.push_back(id);
    }

    fn release_conn(&mut self, n: usize, out: &mut Vec<u8>) {
        if let Some(inc) = self.conn_recv.release(n) {
            wire::put_window_update(out, 0, inc);
        }
    }

    /// A stream error on stream `i` (or a stream not open, `None`): RST_STREAM, counted
    /// against [`Limits::max_local_error_resets`].
    fn stream_error(
        &mut self,
        stream: u32,
        reason: Reason,
        out: &mut Vec<u8>,
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ConnError> {
        wire::put_rst_stream(out, stream, reason);
        if let Ok(i) = self.streams.binary_search_by_key(&stream, |s| s.id) {
            self.drop_stream(i, out);
            on(Event::Reset { stream, reason });
        } else {
            self.remember_reset(stream);
        }
        self.local_error_resets += 1;
        if self.local_error_resets > self.limits.max_local_error_resets {
            return Err(calm("too many streams reset for errors"));
        }
        Ok(())
    }

    fn frame(&mut self, frame: Frame<'_>, out: &mut Vec<u8>, on: &mut impl FnMut(Event<'_>)) -> Result<(), ConnError> {
        if let Some(c) = self.continuing {
            return match frame {
                Frame::Continuation { stream, end_headers, block } if stream == c.stream => {
                    self.continuation(c, end_headers, block, out, on)
                }
                _ => Err(protocol("a frame inside a header block")),
            };
        }
        if self.phase == Phase::Settings && !matches!(frame, Frame::Settings(_)) {
            return Err(protocol("the first frame is not SETTINGS"));
        }
        match frame {
            Frame::Data { stream, end_stream, data, flow_len } => {
                self.data(stream, end_stream, data, flow_len, out, on)
            }
            Frame::Headers { stream, end_stream, end_headers, block } => {
                if stream % 2 == 0 {
                    return Err(protocol("HEADERS on an even stream"));
                }
                if end_headers {
                    return self.header_block(stream, end_stream, block, out, on);
                }
                self.block.clear();
                self.block.extend_from_slice(block);
                self.continuing = Some(Continuing { stream, end_stream, frames: 0 });
                Ok(())
            }
            Frame::Continuation { .. } => Err(protocol("CONTINUATION without HEADERS")),
            Frame::Priority { .. } | Frame::SettingsAck | Frame::Unknown => Ok(()),
            Frame::RstStream { stream, reason } => {
                if stream > self.highest {
                    return Err(protocol("RST_STREAM on an idle stream"));
                }
                let Ok(i) = self.streams.binary_search_by_key(&stream, |s| s.id) else { return Ok(()) };
                let answered = self.streams[i].responded;
                let s = self.streams.remove(i);
                self.release_conn(s.map_or(0, |s| s.unreleased), out);
                on(Event::Reset { stream, reason });
                if !answered {
                    self.pending_resets += 1;
                    if self.pending_resets > self.limits.max_pending_resets {
                        return Err(calm("streams reset before they were answered"));
                    }
                }
                Ok(())
            }
            Frame::Settings(settings) => {
                for (id, value) in settings.iter() {
                    match id {
                        setting::HEADER_TABLE_SIZE => self.encoder.set_peer_table_size(value as usize),
                        setting::INITIAL_WINDOW_SIZE => {
                            for s in &mut self.streams {
                                s.send.resize(self.peer_initial_window, value).map_err(|reason| ConnError {
                                    reason,
                                    message: "SETTINGS_INITIAL_WINDOW_SIZE overflows a window",
                                })?;
                            }
                            if value > self.peer_initial_window {
                                on(Event::Window { stream: 0 });
                            }
                            self.peer_initial_window = value;
                        }
                        setting::MAX_FRAME_SIZE => self.peer_max_frame = value as usize,
                        _ => {}
                    }
                }
                wire::put_settings_ack(out);
                if self.phase == Phase::Settings {
                    self.phase = Phase::Open;
                    let raise = self.conn_recv.open().saturating_sub(DEFAULT_WINDOW);
                    if raise > 0 {
                        wire::put_window_update(out, 0, raise);
                    }
                }
                Ok(())
            }
            Frame::Ping { ack: false, data } => {
                wire::put_ping_ack(out, data);
                Ok(())
            }
            Frame::Ping { ack: true, data } => {
                if data == SHUTDOWN_PING && self.shutdown == Shutdown::Pinged {
                    wire::put_goaway(out, self.highest, Reason::NO_ERROR, b"");
                    self.shutdown = Shutdown::Final(self.highest);
                }
                Ok(())
            }
            Frame::GoAway { reason, .. } => {
                on(Event::GoAway { reason });
                Ok(())
            }
            Frame::WindowUpdate { stream: 0, increment } => {
                self.conn_send.grant(increment).map_err(|reason| ConnError { reason, message: "WINDOW_UPDATE" })?;
                on(Event::Window { stream: 0 });
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => {
                if stream > self.highest {
                    return Err(protocol("WINDOW_UPDATE on an idle stream"));
                }
                let Ok(i) = self.streams.binary_search_by_key(&stream, |s| s.id) else { return Ok(()) };
                match self.streams[i].send.grant(increment) {
                    Ok(()) => {
                        on(Event::Window { stream });
                        Ok(())
                    }
                    Err(reason) => self.stream_error(stream, reason, out, on),
                }
            }
        }
    }

    fn data(
        &mut self,
        stream: u32,
        end_stream: bool,
        data: &[u8],
        flow_len: usize,
        out: &mut Vec<u8>,
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ConnError> {
        if stream > self.highest {
            return Err(protocol("DATA on an idle stream"));
        }
        self.conn_recv.receive(flow_len).map_err(|reason| ConnError { reason, message: "DATA past the window" })?;
        if data.is_empty() && !end_stream {
            self.empty_data += 1;
            if self.empty_data > self.limits.max_empty_data {
                return Err(calm("a run of empty DATA frames"));
            }
        } else {
            self.empty_data = 0;
        }
        let open = self.streams.binary_search_by_key(&stream, |s| s.id).ok().filter(|&i| self.streams[i].recv_open);
        let Some(i) = open else {
            // Not ours to deliver: its bytes go straight back to the connection window.
            self.release_conn(flow_len, out);
            if self.recent_resets.contains(&stream) {
                return Ok(());
            }
            return self.stream_error(stream, Reason::STREAM_CLOSED, out, on);
        };
        let s = &mut self.streams[i];
        if let Err(reason) = s.recv.receive(flow_len) {
            self.release_conn(flow_len, out);
            return self.stream_error(stream, reason, out, on);
        }
        // Padding is consumed on arrival; the data waits for the caller's release.
        let padding = flow_len - data.len();
        s.unreleased += data.len();
        if let Some(inc) = s.recv.release(padding).filter(|_| !end_stream) {
            wire::put_window_update(out, stream, inc);
        }
        s.recv_open = !end_stream;
        self.release_conn(padding, out);
        on(Event::Data { stream, data, end: end_stream });
        Ok(())
    }

    fn continuation(
        &mut self,
        mut c: Continuing,
        end_headers: bool,
        block: &[u8],
        out: &mut Vec<u8>,
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ConnError> {
        c.frames += 1;
        let max_list = self.limits.max_header_list_size as usize;
        // Huffman codes may take up to 30 bits for an octet: a block 4× the list limit
        // decodes past it whatever it holds.
        if c.frames > max_frames(max_list) || self.block.len() + block.len() > 4 * max_list.max(MIN_MAX_FRAME) {
            return Err(calm("a header block of too many CONTINUATION frames"));
        }
        self.block.extend_from_slice(block);
        if !end_headers {
            self.continuing = Some(c);
            return Ok(());
        }
        self.continuing = None;
        let block = std::mem::take(&mut self.block);
        let done = self.header_block(c.stream, c.end_stream, &block, out, on);
        self.block = block;
        done
    }

    fn header_block(
        &mut self,
        stream: u32,
        end_stream: bool,
        block: &[u8],
        out: &mut Vec<u8>,
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ConnError> {
        self.fields.clear();
        let max_list = self.limits.max_header_list_size as usize;
        let fields = &mut self.fields;
        let decoded = self.decoder.decode(block, max_list, |n, v| fields.push(n, v));
        let too_large = match decoded {
            Ok(()) => false,
            Err(HpackError::ListTooLarge) => true,
            Err(_) => return Err(ConnError { reason: Reason::COMPRESSION_ERROR, message: "HPACK" }),
        };
        if stream <= self.highest {
            return self.more_headers(stream, end_stream, out, on);
        }
        self.highest = stream;
        if let Shutdown::Final(last) = self.shutdown {
            if stream > last {
                return Ok(());
            }
        }
        if too_large {
            // A bare 431 on the stream itself; a body on its way is cut off.
            self.block.clear();
            self.encoder.encode(&mut self.block, Some(431), []);
            wire::put_headers(out, stream, &self.block, true, self.peer_max_frame);
            if !end_stream {
                return self.stream_error(stream, Reason::PROTOCOL_ERROR, out, on);
            }
            return Ok(());
        }
        if self.fields.malformed().is_some() {
            return self.stream_error(stream, Reason::PROTOCOL_ERROR, out, on);
        }
        if self.streams.len() >= self.limits.max_concurrent_streams as usize {
            wire::put_rst_stream(out, stream, Reason::REFUSED_STREAM);
            self.remember_reset(stream);
            return Ok(());
        }
        self.streams.push_back(Stream {
            id: stream,
            recv: RecvWindow::new(self.limits.initial_window_size),
            send: SendWindow::new(self.peer_initial_window),
            recv_open: !end_stream,
            send_open: true,
            responded: false,
            unreleased: 0,
        });
        self.empty_data = 0;
        on(Event::Request { stream, head: &self.fields, end_stream });
        Ok(())
    }

    /// A header block on a stream opened before: trailers on an open one, else an error.
    fn more_headers(
        &mut self,
        stream: u32,
        end_stream: bool,
        out: &mut Vec<u8>,
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ConnError> {
        let open = self.streams.binary_search_by_key(&stream, |s| s.id).ok();
        match open {
            Some(i) if self.streams[i].recv_open => {
                if !end_stream {
                    return self.stream_error(stream, Reason::PROTOCOL_ERROR, out, on);
                }
                self.streams[i].recv_open = false;
                on(Event::Data { stream, data: &[], end: true });
                Ok(())
            }
            Some(_) => self.stream_error(stream, Reason::STREAM_CLOSED, out, on),
            None if self.recent_resets.contains(&stream) => Ok(()),
            None => Err(ConnError { reason: Reason::STREAM_CLOSED, message: "HEADERS on a closed stream" }),
        }
    }
}

/// CONTINUATION frames one header block may take: enough for a list at the limit in
/// frames of the smallest maximum size, and never fewer than 8.
fn max_frames(max_list: usize) -> u32 {
    u32::try_from(4 * max_list / MIN_MAX_FRAME + 8).unwrap_or(u32::MAX)
}

fn protocol(message: &'static str) -> ConnError {
    ConnError { reason: Reason::PROTOCOL_ERROR, message }
}

fn calm(message: &'static str) -> ConnError {
    ConnError { reason: Reason::ENHANCE_YOUR_CALM, message }
}
