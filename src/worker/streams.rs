//! An HTTP/1.1 exchange's body after its head, which the exchange engine runs
//! ([`super::conn::H1::ex`]), and the driving of its connection meanwhile.
//!
//! After a handler answers with a producer, a file or a WebSocket, the codec
//! writes the head and steps aside (`Detached`); the engine adopts the exchange
//! and this file runs it on the connection: it starts the body, drives the
//! connection meanwhile (read, flush, back pressure, EOF; a WebSocket's frames
//! read in place from its input), runs its timers (heartbeats, pings, ticks)
//! and carries out what became of the connection (`h1_sink.rs`'s `Fate`):
//! keep-alive, a close once flushed, or at once. It is also the HTTP/1.1 end
//! of what `mux.rs` routes to an exchange: the engine call runs on the
//! connection's sink (a pool result or an upstream's answer is written by the
//! codec, `Sink::respond`; a bus event or relayed bytes are queued on the
//! exchange), and the wake that follows carries out its `Fate`; a WebSocket
//! frame is written straight to the socket. Body bytes go through the codec (`Http1::data`, `end_body`),
//! which frames them; this file never writes HTTP framing. Who receives bus
//! messages (the SSE and room registries) is `fanout.rs`'s.

use std::time::Instant;

use super::bufs::Bufs;
use super::conn::{Conn, ConnState, H1};
use super::h1_sink::{Answered, Current, Fate, H1Sink};
use super::{Glue, Worker, READ_AHEAD};
use crate::app::{Producer, WebSocket};
use crate::exchange::pool::ExchangeId;
use crate::exchange::Download;
use crate::exchange::{engine_cx, Cx, Exchanges, Host, Produce, Stage};
use crate::exchange::{Ws, WS_PING_EVERY};
use crate::http::reply::FileRange;
use crate::http2::Heads;

/// An event stream or WebSocket with nothing buffered holds no buffer. Both
/// live long and are idle most of the time; a kept buffer has the capacity of
/// the connection's largest burst so far, so 2 500 of them crept up ~0.7 MB
/// over a 30-minute soak (nginx likewise frees an idle connection's buffers).
/// Downloads keep theirs: the output is a recycled slice buffer.
/// They go back to the worker's free list ([`Bufs`]).
fn shed_buffers(c: &mut Conn, bufs: &mut Bufs) {
    let ConnState::Http1(h) = &c.state else { return };
    if matches!(produce(h), Some(Produce::Events(_) | Produce::Ws(_))) {
        bufs.shed(&mut c.io.inbuf, &mut c.io.out);
    }
}

/// What the body the engine runs for `h` is produced by, if it runs one.
fn produce(h: &H1) -> Option<&Produce> {
    h.ex.list.first()?.produce.as_ref()
}

/// The engine runs an event stream on `h`.
fn events(h: &H1) -> bool {
    matches!(produce(h), Some(Produce::Events(_)))
}

impl Worker {
    /// Connection `idx` got a streamed reply (an event stream, a ticker); its head is in the
    /// output already. The engine runs its producer.
    pub(super) fn start_producer(&mut self, idx: usize, p: Producer, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        // An event stream's end closes its connection: its client reconnects.
        h.closes = matches!(p, Producer::Events { .. });
        let started = self.on_h1_engine(idx, |ex, _, cx| {
            let i = ex.adopt(Current, Answered, Stage::Streaming, None, now);
            ex.start_producer(i, p, cx, now);
        });
        if started {
            // A ticker's first tick is due now.
            self.stream_timer(idx, now);
        }
    }

    /// Connection `idx` got a file reply; its head is in the output already. Plain HTTP/1.1
    /// with a sized body goes to the socket as it is, so the kernel moves it from the page
    /// cache (TLS encrypts in user space; chunked or `HEAD` framing is not pass-through).
    pub(super) fn start_download(&mut self, idx: usize, f: FileRange) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let FileRange { file, offset, len } = f;
        let direct = c.io.tls.is_none() && len > 0 && h.codec.passthrough(len) == len;
        let body = Produce::Download(Download::new(file, offset, len, direct));
        h.ex.adopt(Current, Answered, Stage::Streaming, Some(body), Instant::now());
        self.drive_stream(idx);
    }

    /// Run `f` on the engine's exchange of HTTP/1.1 connection `idx`, writing through the
    /// connection's [`H1Sink`]; then carry out what the engine asked for and what became of
    /// the connection: more to send (next turn, or at the writable edge), the body's end (the
    /// codec writes it and serves what was pipelined meanwhile, or closes: after an event
    /// stream, once flushed), a body abandoned (no end; it closes once flushed) or cut (it
    /// closes now), an answer the codec wrote (it serves what was pipelined meanwhile).
    /// Returns whether the body goes on.
    pub(super) fn on_h1_engine(
        &mut self,
        idx: usize,
        f: impl FnOnce(&mut Exchanges<Current, Answered>, &mut H1Sink<'_>, &mut Cx<'_, Glue<'_>>),
    ) -> bool {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return false };
        let ConnState::Http1(h) = &mut c.state else { return false };
        let now = Instant::now();
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        // Never used: the codec wrote the head of an adopted exchange.
        let mut heads = Heads::default();
        // What a routed engine call made of the connection first.
        let fate = std::mem::replace(&mut h.fate, Fate::Open);
        let mut sink = H1Sink::new(&mut h.codec, &mut c.io, &mut self.bufs, fate, now);
        f(&mut h.ex, &mut sink, &mut engine_cx!(self, &mut glue, &mut heads));
        let (fate, again) = (sink.fate, sink.again);
        let open = fate == Fate::Open && !h.ex.is_empty();
        let effects = std::mem::take(&mut h.ex.effects);
        let generation = c.generation;
        self.carry_out(effects);
        let Some(Some(c)) = self.conns.get_mut(idx).filter(|c| c.as_ref().is_some_and(|c| c.generation == generation))
        else {
            return false;
        };
        let ConnState::Http1(h) = &mut c.state else { return false };
        match fate {
            Fate::Open => {
                if again {
                    self.drained.push((idx, generation));
                }
                self.arm(idx);
            }
            Fate::Ended if !h.closes => {
                h.codec.end_body(&mut c.io.out, &self.env, now);
                self.drive(idx);
            }
            Fate::Ended | Fate::Abandoned => {
                if fate == Fate::Ended {
                    h.codec.end_body(&mut c.io.out, &self.env, now);
                }
                h.aborted = true;
                h.closing = true;
                self.flush_conn(idx);
            }
            Fate::Cut => self.close(idx),
            Fate::Answered => self.drive(idx),
        }
        open
    }

    /// Connection `idx` switched to WebSocket; the codec's `101` is in the output already.
    /// The engine holds the WebSocket; its frames are read in place from the connection's
    /// input and its replies written straight into the output (no HTTP framing after a 101).
    pub(super) fn start_websocket(&mut self, idx: usize, w: WebSocket, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let max_message = Glue::new(&self.app, self.config, self.record, self.metrics).websocket_opened();
        let (ws, greeted) = Ws::open(&self.app, w, max_message, &mut c.io.out, now);
        h.ex.adopt(Current, Answered, Stage::Streaming, Some(Produce::websocket(ws)), now);
        // Its end closes the connection.
        h.closes = true;
        if !greeted {
            self.abort_stream(idx);
            return;
        }
        self.drive_stream(idx);
    }

    /// Move bytes for a detached connection: notice EOF, flush, close when done.
    pub(super) fn drive_stream(&mut self, idx: usize) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let mut close = false;
        let mut panicked = false;
        let mut todo = Vec::new();
        // Edge-triggered: keep reading until the socket is empty, in slices of
        // READ_AHEAD, unless our own output backs up (then whatever drains it resumes).
        // The engine runs the body.
        let engine = !h.ex.is_empty();
        let download = matches!(produce(h), Some(Produce::Download(_)));
        let events = events(h);
        // A response that ends returns to HTTP/1.1: input meanwhile is a pipelined request.
        let ends = engine && !events;
        // A WebSocket's messages make replies: above the watermark it reads nothing more
        // until the peer has taken some.
        let ws = matches!(produce(h), Some(Produce::Ws(_)));
        c.paused = false;
        loop {
            let mut more = false;
            let held = ws && c.io.out.len() - c.io.out_pos > super::HIGH_WATERMARK;
            // During a download, input is a pipelined request: keep it, bounded.
            let input_full = ends && c.io.inbuf.len() >= READ_AHEAD;
            if !c.io.eof && !input_full && !held {
                let cap = c.io.inbuf.len() + READ_AHEAD;
                match c.io.fill(&mut self.scratch, cap) {
                    // It stopped at `cap` only if it filled it: the socket may hold more.
                    Ok(eof) => {
                        c.io.eof = eof;
                        more = !eof && c.io.inbuf.len() >= cap;
                    }
                    Err(_) => close = true,
                }
            }
            if h.aborted || events {
                // An event stream's client has nothing to say; an aborted one is only flushed.
                c.io.inbuf.clear();
            } else if let Some((w, _, _)) = h.ex.ws_of(Current) {
                let mut closed = false;
                match w.read(&self.app, &c.io.inbuf, &mut c.io.out, &mut todo, &mut closed) {
                    Ok(used) => {
                        c.io.inbuf.drain(..used);
                    }
                    Err(()) => panicked = true,
                }
                h.closing |= closed;
            }
            if close || panicked || c.io.eof || h.closing {
                break;
            }
            if c.io.flush().is_err() {
                close = true;
                break;
            }
            // Input may be left in the socket, and no new edge will announce it: go round
            // while the output is below the watermark. Above it the flush met WouldBlock;
            // the writable edge, or a flush elsewhere (`flush_conn`), resumes reading.
            let stopped = more || held;
            if stopped && c.io.out.len() - c.io.out_pos > super::HIGH_WATERMARK {
                c.paused = true;
                break;
            }
            if !stopped {
                break;
            }
        }
        if panicked && !close {
            // What the messages before the panicking one asked for still happens.
            let generation = c.generation;
            for t in todo {
                self.ws_todo(ExchangeId::H1 { conn: idx, gen: generation }, t);
            }
            self.abort_stream(idx);
            return;
        }
        if c.io.flush().is_err() {
            close = true;
        }
        let pending = c.io.flushed(now);
        let ConnState::Http1(h) = &mut c.state else { return };
        // A WebSocket peer that half-closed sends nothing more: the replies already
        // queued go out (bounded by the send timeout), then the connection closes.
        if c.io.eof && ws {
            h.closing = true;
        }
        // A download ends on a write error or the send timeout, not on the peer's
        // half-close: the request was complete when it started.
        if close || (c.io.eof && !download && !ws) || (h.closing && !pending) {
            self.close(idx);
            return;
        }
        let relay = h.calling();
        let generation = c.generation;
        shed_buffers(c, &mut self.bufs);
        self.arm(idx);
        let id = ExchangeId::H1 { conn: idx, gen: generation };
        if engine {
            self.wake(id);
        }
        if relay {
            self.relay_resume(id);
        }
        for t in todo {
            self.ws_todo(id, t);
        }
    }

    /// Flush a detached connection's output (no reading: safe while delivering; a
    /// connection paused by its output is queued to resume once it drains).
    pub(super) fn flush_conn(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        if c.io.flush().is_err() {
            self.close(idx);
            return;
        }
        let pending = c.io.flushed(Instant::now());
        if matches!(&c.state, ConnState::Http1(h) if h.closing) && !pending {
            self.close(idx);
            return;
        }
        // Its reading (or its relay's upstream) waited for this output to drain: resume
        // it after this turn's events, not here (the caller may be delivering to many).
        if c.paused && c.io.out.len() - c.io.out_pos <= super::HIGH_WATERMARK {
            c.paused = false;
            self.drained.push((idx, c.generation));
        }
        shed_buffers(c, &mut self.bufs);
        self.arm(idx);
    }

    /// A detached connection's timer fired.
    pub(super) fn stream_timer(&mut self, idx: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let backed_up = c.io.backlog() > super::HIGH_WATERMARK;
        match h.ex.ws_of(Current) {
            // Above the watermark its input is not read, so its pong may be waiting
            // unread: the send timeout judges that peer instead.
            Some((w, _, _)) if w.next_ping <= now && backed_up => {
                w.next_ping = now + WS_PING_EVERY;
            }
            Some((w, _, _)) if w.next_ping <= now => {
                let alive = w.heartbeat(now, false, &mut c.io.out);
                if !alive {
                    // Its close (1001) goes out, then the connection closes.
                    h.closing = true;
                    self.flush_conn(idx);
                    return;
                }
            }
            _ => {}
        }
        // Heartbeats and ticks that are due.
        if h.ex.is_empty() || self.on_h1_engine(idx, |ex, _, cx| ex.tick(&*cx.host, now)) {
            self.drive_stream(idx);
        }
    }

    /// The app code of the WebSocket on connection `idx` panicked: it closes with 1011 once
    /// flushed, and leaves its rooms now.
    pub(super) fn abort_stream(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        if let Some((w, _, _)) = h.ex.ws_of(Current) {
            w.conn.close(1011, "internal error", &mut c.io.out);
        }
        h.ex.close_all(&mut self.sse);
        let effects = std::mem::take(&mut h.ex.effects);
        h.aborted = true;
        h.closing = true;
        self.carry_out(effects);
        self.flush_conn(idx);
    }

    /// Write `bytes` to the plain HTTP/1.1 connection `idx`, which has no
    /// output queued, straight from the caller's buffer; queue only what
    /// its socket does not take now (then flush as usual). Through TLS they
    /// are queued and flushed.
    pub(super) fn write_direct(&mut self, idx: usize, bytes: &[u8]) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let mut pos = 0;
        if c.io.tls.is_none() && c.io.out.is_empty() {
            if crate::net::write_some(&mut c.io.sock, bytes, &mut pos).is_err() {
                self.close(idx);
                return;
            }
            if pos == bytes.len() {
                return;
            }
        }
        self.bufs.fill(&mut c.io.out);
        c.io.out.extend_from_slice(&bytes[pos..]);
        self.flush_conn(idx);
    }

    /// Graceful stop: end every stream (SSE: the last chunk; the client reconnects elsewhere).
    /// WebSockets: close 1001 (going away).
    pub(super) fn end_streams(&mut self) {
        for idx in 0..self.conns.len() {
            let Some(Some(c)) = self.conns.get_mut(idx) else { continue };
            match &mut c.state {
                ConnState::Http2(sess) => {
                    sess.parts().0.end_event_streams(&mut self.sse);
                    self.sse_count_changed();
                }
                // A download, ticker or relay in flight finishes (the drain deadline bounds it).
                ConnState::Http1(h) if !h.ex.is_empty() => {
                    let goes_on = self.on_h1_engine(idx, |ex, sink, cx| {
                        ex.end_event_streams(cx.sse);
                        ex.service(sink, cx);
                    });
                    if goes_on {
                        self.flush_conn(idx);
                    }
                }
                ConnState::Http1(_) | ConnState::ProxyHeader(_) | ConnState::Lingering(_) => {}
            }
        }
    }
}
