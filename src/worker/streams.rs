//! Detached connections (server-sent event streams, WebSockets) and the bus.
//!
//! After a handler answers with a stream or an upgrade, the connection's
//! head is written by the HTTP layer and the connection lands here. This
//! file keeps the per-worker registries (SSE subscribers, WebSocket rooms),
//! delivers bus messages to them, runs their timers (SSE heartbeats,
//! WebSocket pings) and ends them on shutdown. What the bytes mean comes
//! from the app (`App::sse_*`) and the protocol codecs; this file only moves
//! them, with back pressure: a subscriber whose unsent output passes
//! [`MAX_BACKLOG`] is dropped rather than buffered without bound.

use std::sync::Arc;
use std::time::Instant;

use super::{flush, read_into, Detach, Worker, READ_AHEAD};
use crate::bus::{self, Topic};
use crate::http::response::{end_chunks, write_chunk};

use super::pool::Work;

/// Unsent bytes one subscriber may accumulate before it is dropped.
pub const MAX_BACKLOG: usize = 1 << 20;

/// What a detached connection is.
pub enum Stream {
    /// An `/api/events` stream.
    Sse(Sse),
}

/// State of one SSE stream.
pub struct Sse {
    /// A `Last-Event-ID` replay is running on the pool.
    replaying: bool,
    /// The last notification id sent (live events at or below it are skipped).
    last_id: i64,
    /// Live events that arrived during the replay.
    held: Vec<(i64, Arc<[u8]>)>,
    /// When the next heartbeat is due.
    next_beat: Instant,
}

impl Stream {
    /// The stream's own next deadline.
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            Stream::Sse(s) => Some(s.next_beat),
        }
    }
}

/// WebSocket rooms of this worker.
#[derive(Default)]
pub struct Rooms {}

impl Worker {
    /// A handler detached connection `idx`; its head is in the output already.
    pub(super) fn start_stream(&mut self, idx: usize, d: Detach, now: Instant) {
        let preamble = self.app.sse_preamble();
        let every = self.app.sse_heartbeat_every();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        match d {
            Detach::Sse { last_event_id } => {
                write_chunk(&mut c.out, &preamble);
                c.stream = Some(Stream::Sse(Sse {
                    replaying: last_event_id.is_some(),
                    last_id: last_event_id.unwrap_or(0),
                    held: Vec::new(),
                    next_beat: now + every,
                }));
                let generation = c.generation;
                self.sse.insert(idx);
                self.svc.stats.sse.store(self.sse.len(), std::sync::atomic::Ordering::Relaxed);
                if let Some(after) = last_event_id {
                    self.pool.submit(idx, generation, Work::Replay(self.app.sse_replay(after)));
                }
            }
            Detach::WebSocket { .. } => {
                c.closing = true;
            }
        }
        self.drive_stream(idx);
    }

    /// Move bytes for a detached connection: notice EOF, flush, close when done.
    pub(super) fn drive_stream(&mut self, idx: usize) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let mut close = false;
        if !c.eof {
            match read_into(&mut c.sock, &mut c.inbuf, &mut self.scratch, READ_AHEAD) {
                Ok(eof) => c.eof = eof,
                Err(_) => close = true,
            }
        }
        if let Some(Stream::Sse(_)) = c.stream {
            c.inbuf.clear(); // a stream's client has nothing to say
        }
        if flush(&mut c.sock, &mut c.out, &mut c.out_pos).is_err() {
            close = true;
        }
        let pending = c.out.len() > c.out_pos;
        c.send_deadline = if pending { c.send_deadline.or(Some(now + super::SEND_TIMEOUT)) } else { None };
        if close || c.eof || (c.closing && !pending) {
            self.close(idx);
            return;
        }
        self.arm(idx);
    }

    /// A detached connection's timer fired.
    pub(super) fn stream_timer(&mut self, idx: usize, now: Instant) {
        let beat = self.app.sse_heartbeat();
        let every = self.app.sse_heartbeat_every();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        match &mut c.stream {
            Some(Stream::Sse(s)) if s.next_beat <= now => {
                write_chunk(&mut c.out, &beat);
                s.next_beat = now + every;
            }
            _ => {}
        }
        self.drive_stream(idx);
    }

    /// A `Last-Event-ID` replay finished: send it, then what arrived meanwhile.
    pub(super) fn replayed(&mut self, idx: usize, bytes: Vec<u8>, last: i64) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let Some(Stream::Sse(s)) = &mut c.stream else { return };
        write_chunk(&mut c.out, &bytes);
        s.last_id = s.last_id.max(last);
        s.replaying = false;
        for (id, chunk) in s.held.drain(..) {
            if id > s.last_id {
                c.out.extend_from_slice(&chunk);
                s.last_id = id;
            }
        }
        self.drive_stream(idx);
    }

    /// A detached connection closed: drop it from every registry at once.
    pub(super) fn forget_stream(&mut self, idx: usize, s: Stream) {
        match s {
            Stream::Sse(_) => {
                self.sse.remove(&idx);
                self.svc.stats.sse.store(self.sse.len(), std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Publish on the bus: local subscribers now, the other workers through the supervisor.
    pub(super) fn publish(&mut self, topic: Topic, payload: &[u8]) {
        self.bus_seq += 1;
        self.bus.send(bus::encode(topic, std::process::id(), self.bus_seq, payload));
        self.deliver(topic, payload);
    }

    /// The bus socket is readable or writable.
    pub(super) fn on_bus(&mut self) {
        self.bus.flush();
        loop {
            let n = match self.bus.recv(&mut self.scratch) {
                Ok(Some(n)) => n,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("bus: {e}");
                    return;
                }
            };
            let Some(msg) = bus::decode(&self.scratch[..n]) else { continue };
            let (topic, payload) = (msg.topic, msg.payload.to_vec());
            self.deliver(topic, &payload);
        }
    }

    /// Hand a bus message to this worker's subscribers.
    fn deliver(&mut self, topic: Topic, payload: &[u8]) {
        match topic {
            Topic::Notification => {
                let Some((id, event)) = self.app.sse_notification(payload) else { return };
                let mut chunk = Vec::with_capacity(event.len() + 16);
                write_chunk(&mut chunk, &event);
                let chunk: Arc<[u8]> = chunk.into();
                let subscribers: Vec<usize> = self.sse.iter().copied().collect();
                for idx in subscribers {
                    let Some(Some(c)) = self.conns.get_mut(idx) else { continue };
                    let Some(Stream::Sse(s)) = &mut c.stream else { continue };
                    if s.replaying {
                        s.held.push((id, chunk.clone()));
                        continue;
                    }
                    if id <= s.last_id {
                        continue;
                    }
                    if c.out.len() - c.out_pos > MAX_BACKLOG {
                        log::warn!("SSE subscriber is not reading; dropping it");
                        self.close(idx);
                        continue;
                    }
                    s.last_id = id;
                    c.out.extend_from_slice(&chunk);
                    self.drive_stream(idx);
                }
            }
            Topic::Room => {}
        }
    }

    /// Graceful stop: end every stream (SSE: the last chunk; the client reconnects elsewhere).
    pub(super) fn end_streams(&mut self) {
        let subscribers: Vec<usize> = self.sse.iter().copied().collect();
        for idx in subscribers {
            if let Some(Some(c)) = self.conns.get_mut(idx) {
                end_chunks(&mut c.out);
                c.closing = true;
            }
            self.drive_stream(idx);
        }
    }
}
