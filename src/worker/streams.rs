//! Detached connections (server-sent event streams, WebSockets) and the bus.
//!
//! After a handler answers with a producer, a file or a WebSocket, the
//! connection's head is written by the HTTP codec and the connection lands
//! here. Body bytes go back through the codec (`Http1::data`, `end_body`),
//! which frames them; this file never writes HTTP framing. This
//! file keeps the per-worker registries (SSE subscribers, WebSocket rooms),
//! delivers bus messages to them, runs their timers (SSE heartbeats,
//! WebSocket pings) and ends them on shutdown. What the bytes mean comes
//! from the app (`App::sse_*`) and the protocol codecs; this file only moves
//! them, with back pressure: a subscriber whose unsent output passes
//! [`MAX_BACKLOG`] is dropped rather than buffered without bound.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{flush, read_into, Conn, ConnState, H1};
use super::panics::guard;
use super::pool::{ExchangeId, REPLAY_PANICKED};
use super::{Worker, READ_AHEAD};
use crate::app::handlers::ws::{self, Action};
use crate::app::{Producer, WebSocket};
use crate::bus::{self, Topic};
use crate::http::reply::FileRange;
use crate::proto::ws::{Event, Message, WsConn};

use super::pool::Work;

/// Unsent bytes one subscriber may accumulate before it is dropped.
pub const MAX_BACKLOG: usize = 1 << 20;
/// How often an idle WebSocket is pinged; a peer that has not answered the
/// previous ping by the next one is dropped.
pub(super) const WS_PING_EVERY: Duration = Duration::from_secs(30);

/// What a detached connection is.
pub enum Stream {
    /// An `/api/events` stream.
    Sse(Sse),
    /// A WebSocket (`/ws` or `/ws/echo`).
    Ws(Box<Ws>),
    /// A file body being sent.
    Download(Download),
    /// An upstream stream relayed (its state is the connection's `call`).
    Relay,
    /// A chunked stream produced on a timer.
    Ticker(Ticking),
    /// A stream whose app code panicked: its end is queued, the connection
    /// closes once the output is flushed, and nothing more is read or produced.
    Aborted,
}

/// A timer-driven stream: the app's producer and when it is due next.
pub struct Ticking {
    ticker: Box<dyn crate::app::Ticker>,
    next: Instant,
}

/// While a client is this far behind, a timer-driven stream waits.
const TICK_BACKOFF: Duration = Duration::from_millis(50);

/// State of one download: the pool reads the next slices only while the
/// client keeps up (back pressure: a slow reader pauses the disk; a download
/// holds at most `READS_AHEAD` slices, 128 KiB, counting the one being written).
pub struct Download {
    file: Arc<std::fs::File>,
    /// Next byte to append to the output.
    sent: u64,
    /// Next byte to ask the pool for.
    next_read: u64,
    /// One past the last byte to send.
    end: u64,
    /// Reads on the pool.
    in_flight: usize,
    /// Slices read and not yet in the output (they may complete out of order).
    ready: Vec<(u64, Vec<u8>)>,
    /// A written slice's buffer, for the next read.
    spare: Option<Vec<u8>>,
    /// Sent with `sendfile(2)`, page cache to socket, no slices (see [`Worker::send_direct`]).
    direct: bool,
    /// With `direct`: the file is advised to the kernel (`WILLNEED`) up to here.
    advised: u64,
}

/// Bytes read from disk per pool job: the contract's 64 KiB chunks.
const SLICE: u64 = 64 * 1024;
/// A direct download asks the kernel to read ahead this much of the file at a time, on the
/// pool (`posix_fadvise(WILLNEED)`), half a window before `sendfile` gets there, so the
/// loop's `sendfile` finds the pages in the page cache rather than waiting for the disk.
const ADVISE_WINDOW: u64 = 4 << 20;
/// Bytes one connection sends with `sendfile` per loop turn before the others get theirs
/// (it goes on at the next turn).
const DIRECT_TURN: u64 = 4 << 20;
/// Reads kept in flight per download, so the disk read of the next slice
/// overlaps the socket write of this one. Measured on a 1 GiB loopback
/// download: one 64 KiB read at a time gave 0.73-0.76 GB/s, one 128 KiB read
/// 0.92-1.32 GB/s.
const READS_AHEAD: usize = 2;

/// State of one WebSocket.
pub struct Ws {
    pub(super) conn: WsConn,
    /// The authenticated user; `None` on the echo endpoint.
    pub(super) user_id: Option<i64>,
    /// That user's display name, when the token carried one.
    pub(super) name: Option<String>,
    /// Rooms this client is in.
    pub(super) rooms: Vec<String>,
    pub(super) next_ping: Instant,
    pub(super) awaiting_pong: bool,
}

impl Ws {
    /// A WebSocket of `user_id` (`None`: the echo endpoint), pinged from `now`.
    pub(super) fn new(conn: WsConn, user_id: Option<i64>, name: Option<String>, now: Instant) -> Ws {
        Ws { conn, user_id, name, rooms: Vec::new(), next_ping: now + WS_PING_EVERY, awaiting_pong: false }
    }

    /// Read `input` (complete messages only; returns the bytes used): control
    /// frames are answered into `out`, echo messages echoed, chat messages
    /// turned into replies (into `out`) and [`Todo`]s. `Err` if app code
    /// panicked (what came before it stands). `closed`: the peer's close arrived.
    pub(super) fn read(
        &mut self,
        app: &crate::app::App,
        input: &[u8],
        out: &mut Vec<u8>,
        todo: &mut Vec<Todo>,
        closed: &mut bool,
    ) -> Result<usize, ()> {
        let mut events = Vec::new();
        let mut at = 0;
        while at < input.len() {
            let used = self.conn.read(&input[at..], out, &mut events);
            at += used;
            for ev in events.drain(..) {
                let m = match ev {
                    Event::Closed { .. } => {
                        *closed = true;
                        continue;
                    }
                    Event::Message(m) => m,
                };
                let action = match (self.user_id, m) {
                    (None, Message::Text(t)) => {
                        self.conn.send_text(&t, out);
                        continue;
                    }
                    (None, Message::Binary(b)) => {
                        self.conn.send_binary(&b, out);
                        continue;
                    }
                    (Some(_), Message::Binary(_)) => guard("WebSocket message", || {
                        Action::Reply(ws::error_message("binary messages are not supported"))
                    }),
                    (Some(uid), Message::Text(t)) => {
                        guard("WebSocket message", || app.ws_text(uid, self.name.as_deref(), &t))
                    }
                };
                let uid = self.user_id;
                match action {
                    Ok(Action::Reply(r)) => self.conn.send_text(&r, out),
                    Ok(Action::Join(room)) => todo.push(Todo::Join(room)),
                    Ok(Action::Leave(room)) => todo.push(Todo::Leave(room)),
                    Ok(Action::Room { room, message, skip_sender }) => {
                        todo.push(Todo::Join(room.clone()));
                        todo.push(Todo::Room { room, message, skip_user: uid.filter(|_| skip_sender) });
                    }
                    Err(_) => return Err(()),
                }
            }
            if used == 0 {
                break;
            }
        }
        if self.conn.take_pong() {
            self.awaiting_pong = false;
        }
        Ok(at)
    }
}

/// The WebSocket state and output buffer of exchange `id` (an HTTP/1.1
/// connection's, or an HTTP/2 stream's), and its unsent output's length.
fn ws_of(conns: &mut [Option<Conn>], id: ExchangeId) -> Option<(&mut Ws, &mut Vec<u8>, usize)> {
    let c = conns.get_mut(id.conn)?.as_mut()?;
    if c.generation != id.generation {
        return None;
    }
    let backlog = c.backlog();
    match &mut c.state {
        ConnState::Http1(H1 { stream: Some(Stream::Ws(w)), .. }) if id.stream == 0 => Some((w, &mut c.out, backlog)),
        ConnState::Http2(sess) if id.stream != 0 => sess.ws_of(id.stream),
        _ => None,
    }
}

/// Work a WebSocket message asks for, done once the connection is released.
pub(super) enum Todo {
    Join(String),
    Leave(String),
    Room { room: String, message: String, skip_user: Option<i64> },
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
            Stream::Ws(w) => Some(w.next_ping),
            Stream::Download(_) | Stream::Relay | Stream::Aborted => None,
            Stream::Ticker(t) => Some(t.next),
        }
    }
}

/// WebSocket rooms of this worker: room → member connections (slab indexes).
#[derive(Default)]
pub struct Rooms {
    members: HashMap<String, Vec<ExchangeId>>,
}

impl Rooms {
    fn join(&mut self, room: &str, id: ExchangeId) -> bool {
        let list = self.members.entry(room.to_owned()).or_default();
        if list.contains(&id) {
            return false;
        }
        list.push(id);
        true
    }

    pub(super) fn leave(&mut self, room: &str, id: ExchangeId) -> bool {
        let Some(list) = self.members.get_mut(room) else { return false };
        let Some(pos) = list.iter().position(|&m| m == id) else { return false };
        list.swap_remove(pos);
        if list.is_empty() {
            self.members.remove(room);
            // Give the table's memory back once most of its rooms are gone.
            if self.members.capacity() > 64 && self.members.len() * 4 < self.members.capacity() {
                self.members.shrink_to(self.members.len() * 2);
            }
        }
        true
    }
}

/// An event stream or WebSocket with nothing buffered holds no buffer. Both
/// live long and are idle most of the time; a kept buffer has the capacity of
/// the connection's largest burst so far, so 2 500 of them crept up ~0.7 MB
/// over a 30-minute soak (nginx likewise frees an idle connection's buffers).
/// Downloads keep theirs: the output is a recycled slice buffer.
fn shed_buffers(c: &mut Conn) {
    if matches!(c.state, ConnState::Http1(H1 { stream: Some(Stream::Sse(_) | Stream::Ws(_)), .. })) {
        // `flush` clears the output once all of it is written.
        if c.out.is_empty() && c.out.capacity() > 0 {
            c.out = Vec::new();
        }
        if c.inbuf.is_empty() && c.inbuf.capacity() > 0 {
            c.inbuf = Vec::new();
        }
    }
}

impl Worker {
    /// Connection `idx` got a streamed reply; its head is in the output already.
    pub(super) fn start_producer(&mut self, idx: usize, p: Producer, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        match p {
            Producer::Events { last_event_id } => {
                let app = &self.app;
                let start = guard("SSE stream start", || {
                    (app.sse_preamble(), app.sse_heartbeat_every(), last_event_id.map(|after| app.sse_replay(after)))
                });
                let Ok((preamble, every, replay)) = start else {
                    // The head went out: end the body at once.
                    h.stream =
                        Some(Stream::Sse(Sse { replaying: false, last_id: 0, held: Vec::new(), next_beat: now }));
                    self.abort_stream(idx);
                    return;
                };
                h.codec.data(&mut c.out, &preamble);
                h.stream = Some(Stream::Sse(Sse {
                    replaying: last_event_id.is_some(),
                    last_id: last_event_id.unwrap_or(0),
                    held: Vec::new(),
                    next_beat: now + every,
                }));
                let generation = c.generation;
                self.sse.insert(ExchangeId::h1(idx, generation));
                self.svc.stats.sse.store(self.sse.len(), std::sync::atomic::Ordering::Relaxed);
                self.metrics.set_sse_streams(self.sse.len());
                if let Some(job) = replay {
                    self.pool.submit(ExchangeId::h1(idx, generation), Work::Replay(job));
                }
            }
            Producer::Ticker(ticker) => {
                h.stream = Some(Stream::Ticker(Ticking { ticker, next: now }));
                self.stream_timer(idx, now);
                return;
            }
        }
        self.drive_stream(idx);
    }

    /// Connection `idx` got a file reply; its head is in the output already.
    pub(super) fn start_download(&mut self, idx: usize, f: FileRange) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let FileRange { file, offset, len } = f;
        let end = offset.saturating_add(len);
        // Plain HTTP/1.1 with a sized body: the bytes go to the socket as they are, so the
        // kernel can move them from the page cache (TLS encrypts in user space; chunked or
        // HEAD framing is not pass-through).
        let direct = c.tls.is_none() && len > 0 && h.codec.passthrough(len) == len;
        let d = Download {
            file,
            sent: offset,
            next_read: offset,
            end,
            in_flight: 0,
            ready: Vec::new(),
            spare: None,
            direct,
            advised: offset,
        };
        h.stream = Some(Stream::Download(d));
        self.drive_stream(idx);
    }

    /// Connection `idx` switched to WebSocket; the codec's `101` is in the output already.
    pub(super) fn start_websocket(&mut self, idx: usize, w: WebSocket, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let WebSocket { user_id, name, .. } = w;
        let mut conn = WsConn::new(self.config.websocket.max_message_bytes);
        let hello = user_id.map(|uid| guard("WebSocket greeting", || ws::connected(uid)));
        let panicked = matches!(hello, Some(Err(_)));
        if let Some(Ok(hello)) = hello {
            conn.send_text(&hello, &mut c.out);
        }
        h.stream = Some(Stream::Ws(Box::new(Ws::new(conn, user_id, name, now))));
        let ws = self.svc.stats.ws.fetch_add(1, Relaxed) + 1;
        self.metrics.set_websocket_clients(ws);
        if panicked {
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
        let download = matches!(h.stream, Some(Stream::Download(_)));
        // A response that ends returns to HTTP/1.1: input meanwhile is a pipelined request.
        let ends = download || matches!(h.stream, Some(Stream::Relay | Stream::Ticker(_)));
        // A WebSocket's messages make replies: above the watermark it reads nothing more
        // until the peer has taken some.
        let ws = matches!(h.stream, Some(Stream::Ws(_)));
        c.paused = false;
        loop {
            let mut more = false;
            let held = ws && c.out.len() - c.out_pos > super::HIGH_WATERMARK;
            // During a download, input is a pipelined request: keep it, bounded.
            let input_full = ends && c.inbuf.len() >= READ_AHEAD;
            if !c.eof && !input_full && !held {
                let cap = c.inbuf.len() + READ_AHEAD;
                match read_into(&mut c.sock, &mut c.tls, &mut c.inbuf, &mut self.scratch, cap) {
                    // It stopped at `cap` only if it filled it: the socket may hold more.
                    Ok(eof) => {
                        c.eof = eof;
                        more = !eof && c.inbuf.len() >= cap;
                    }
                    Err(_) => close = true,
                }
            }
            match &mut h.stream {
                // A stream's client has nothing to say; an aborted one is only being flushed.
                Some(Stream::Sse(_) | Stream::Aborted) => c.inbuf.clear(),
                Some(Stream::Download(_) | Stream::Relay | Stream::Ticker(_)) => {}
                Some(Stream::Ws(w)) => {
                    let mut closed = false;
                    match w.read(&self.app, &c.inbuf, &mut c.out, &mut todo, &mut closed) {
                        Ok(used) => {
                            c.inbuf.drain(..used);
                        }
                        Err(()) => panicked = true,
                    }
                    h.closing |= closed;
                }
                None => {}
            }
            if close || panicked || c.eof || h.closing {
                break;
            }
            if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
                close = true;
                break;
            }
            // Input may be left in the socket, and no new edge will announce it: go round
            // while the output is below the watermark. Above it the flush met WouldBlock;
            // the writable edge, or a flush elsewhere (`flush_conn`), resumes reading.
            let stopped = more || held;
            if stopped && c.out.len() - c.out_pos > super::HIGH_WATERMARK {
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
                self.ws_todo(ExchangeId::h1(idx, generation), t);
            }
            self.abort_stream(idx);
            return;
        }
        if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
            close = true;
        }
        let pending = c.pending_out();
        c.send_deadline = if pending { c.send_deadline.or(Some(now + super::SEND_TIMEOUT)) } else { None };
        let ConnState::Http1(h) = &mut c.state else { return };
        // A WebSocket peer that half-closed sends nothing more: the replies already
        // queued go out (bounded by the send timeout), then the connection closes.
        if c.eof && ws {
            h.closing = true;
        }
        // A download ends on a write error or the send timeout, not on the peer's
        // half-close: the request was complete when it started.
        if close || (c.eof && !download && !ws) || (h.closing && !pending) {
            self.close(idx);
            return;
        }
        let relay = matches!(h.stream, Some(Stream::Relay));
        let generation = c.generation;
        shed_buffers(c);
        self.arm(idx);
        if download {
            self.feed(idx);
        }
        if relay {
            self.relay_resume(ExchangeId::h1(idx, generation));
        }
        for t in todo {
            self.ws_todo(ExchangeId::h1(idx, generation), t);
        }
    }

    /// What a WebSocket message of exchange `id` asked for: join, leave, publish to a room.
    pub(super) fn ws_todo(&mut self, id: ExchangeId, t: Todo) {
        match t {
            Todo::Join(room) => {
                let max = self.config.websocket.max_rooms_per_connection;
                let Some((w, out, _)) = ws_of(&mut self.conns, id) else { return };
                if w.rooms.contains(&room) {
                    return;
                }
                if w.rooms.len() >= max {
                    w.conn.send_text(&ws::too_many_rooms(max), out);
                    self.ws_flush(id);
                    return;
                }
                if self.rooms.join(&room, id) {
                    w.rooms.push(room);
                    self.svc.stats.members.fetch_add(1, Relaxed);
                }
            }
            Todo::Leave(room) => {
                let Some((w, _, _)) = ws_of(&mut self.conns, id) else { return };
                if self.rooms.leave(&room, id) {
                    w.rooms.retain(|r| *r != room);
                    self.svc.stats.members.fetch_sub(1, Relaxed);
                }
            }
            Todo::Room { room, message, skip_user } => {
                // Sending joins first; a join refused (over the cap) sends nothing.
                let member = ws_of(&mut self.conns, id).is_some_and(|(w, _, _)| w.rooms.contains(&room));
                if !member {
                    return;
                }
                let payload = serde_json::json!({"room": room, "skipUser": skip_user, "message": message});
                let payload = serde_json::to_vec(&payload).unwrap_or_default();
                self.publish(Topic::Room, &payload);
            }
        }
    }

    /// Output was queued for WebSocket exchange `id`: send it.
    fn ws_flush(&mut self, id: ExchangeId) {
        if id.stream == 0 {
            self.flush_conn(id.conn);
        } else {
            self.drained.push((id.conn, id.generation));
        }
    }

    /// Deliver a room message to this worker's members of the room.
    fn deliver_room(&mut self, payload: &[u8]) {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) else { return };
        let (Some(room), Some(message)) = (v["room"].as_str(), v["message"].as_str()) else { return };
        let skip = v["skipUser"].as_i64();
        let members = self.rooms.members.get(room).cloned().unwrap_or_default();
        for id in members {
            let Some((w, out, backlog)) = ws_of(&mut self.conns, id) else { continue };
            if skip.is_some() && w.user_id == skip {
                continue;
            }
            if backlog > MAX_BACKLOG {
                log::warn!("WebSocket member is not reading; dropping it");
                if id.stream == 0 {
                    self.close(id.conn);
                } else {
                    self.h2_drop_exchange(id);
                }
                continue;
            }
            w.conn.send_text(message, out);
            self.ws_flush(id);
        }
    }

    /// Flush a detached connection's output (no reading: safe while delivering; a
    /// connection paused by its output is queued to resume once it drains).
    pub(super) fn flush_conn(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
            self.close(idx);
            return;
        }
        let pending = c.pending_out();
        c.send_deadline = if pending { c.send_deadline.or(Some(Instant::now() + super::SEND_TIMEOUT)) } else { None };
        if matches!(&c.state, ConnState::Http1(h) if h.closing) && !pending {
            self.close(idx);
            return;
        }
        // Its reading (or its relay's upstream) waited for this output to drain: resume
        // it after this turn's events, not here (the caller may be delivering to many).
        if c.paused && c.out.len() - c.out_pos <= super::HIGH_WATERMARK {
            c.paused = false;
            self.drained.push((idx, c.generation));
        }
        shed_buffers(c);
        self.arm(idx);
    }

    /// A detached connection's timer fired.
    pub(super) fn stream_timer(&mut self, idx: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let app = &self.app;
        match &mut h.stream {
            Some(Stream::Sse(s)) if s.next_beat <= now => {
                match guard("SSE heartbeat", || (app.sse_heartbeat(), app.sse_heartbeat_every())) {
                    Ok((beat, every)) => {
                        h.codec.data(&mut c.out, &beat);
                        s.next_beat = now + every;
                    }
                    Err(_) => {
                        self.abort_stream(idx);
                        return;
                    }
                }
            }
            // Above the watermark its input is not read, so its pong may be waiting
            // unread: the send timeout judges that peer instead.
            Some(Stream::Ws(w)) if w.next_ping <= now && c.out.len() - c.out_pos > super::HIGH_WATERMARK => {
                w.next_ping = now + WS_PING_EVERY;
            }
            Some(Stream::Ws(w)) if w.next_ping <= now => {
                if w.awaiting_pong {
                    log::debug!("WebSocket peer stopped answering pings; dropping it");
                    self.close(idx);
                    return;
                }
                w.conn.ping(b"", &mut c.out);
                w.awaiting_pong = true;
                w.next_ping = now + WS_PING_EVERY;
            }
            Some(Stream::Ticker(t)) if t.next <= now => {
                if c.out.len() - c.out_pos > super::HIGH_WATERMARK {
                    t.next = now + TICK_BACKOFF;
                } else {
                    let mut event = Vec::new();
                    let Ok(next) = guard("stream ticker", || t.ticker.tick(&mut event)) else {
                        self.abort_stream(idx);
                        return;
                    };
                    h.codec.data(&mut c.out, &event);
                    match next {
                        Some(delay) => t.next = now + delay,
                        None => {
                            self.stream_done(idx);
                            return;
                        }
                    }
                }
            }
            _ => {}
        }
        self.drive_stream(idx);
    }

    /// Ask the pool for the next slices of a download while the client keeps up:
    /// at most `READS_AHEAD` buffers per download, counting the one being written.
    fn pump(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let Some(Stream::Download(d)) = &mut h.stream else { return };
        let writing = usize::from(c.out.len() > c.out_pos);
        while d.next_read < d.end && writing + d.ready.len() + d.in_flight < READS_AHEAD {
            let len = (d.end - d.next_read).min(SLICE) as usize;
            let buf = d.spare.take().unwrap_or_else(|| Vec::with_capacity(SLICE as usize));
            self.pool.submit(ExchangeId::h1(idx, c.generation), Work::Read(Arc::clone(&d.file), d.next_read, len, buf));
            d.next_read += len as u64;
            d.in_flight += 1;
        }
    }

    /// Whenever the output is fully written, the next slice in order becomes
    /// the output buffer (no copy); then more is asked for.
    fn feed(&mut self, idx: usize) {
        if self.send_direct(idx) {
            return;
        }
        loop {
            let Some(Some(c)) = self.conns.get_mut(idx) else { return };
            let ConnState::Http1(h) = &mut c.state else { return };
            let Some(Stream::Download(d)) = &mut h.stream else { return };
            if c.out.len() > c.out_pos {
                break;
            }
            let Some(pos) = d.ready.iter().position(|(o, _)| *o == d.sent) else { break };
            let (_, bytes) = d.ready.swap_remove(pos);
            d.sent += bytes.len() as u64;
            // All of the output is written: the slice becomes the output (no copy).
            c.out.clear();
            c.out_pos = 0;
            let mut spare = h.codec.data_owned(&mut c.out, bytes);
            if spare.capacity() >= SLICE as usize && spare.capacity() <= 2 * SLICE as usize {
                spare.clear();
                d.spare = Some(spare);
            }
            if d.sent >= d.end {
                h.stream = None;
                // Back to HTTP/1.1: flush, then serve what was pipelined meanwhile.
                if !h.codec.end_body(&mut c.out, &self.env, Instant::now()) {
                    h.closing = true;
                }
                self.drive(idx);
                return;
            }
            if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
                self.close(idx);
                return;
            }
            if c.pending_out() {
                c.send_deadline = c.send_deadline.or(Some(Instant::now() + super::SEND_TIMEOUT));
                self.arm(idx);
            }
        }
        self.pump(idx);
    }

    /// A direct download: once the head is written, `sendfile(2)` moves what the socket
    /// accepts now straight from the page cache (no user-space buffer, so a slow reader costs
    /// only its socket buffer), at most [`DIRECT_TURN`] per turn; `WouldBlock` waits for the
    /// writable edge under the send timeout. The pool advises the kernel to read ahead.
    /// Returns `false` when the download is not direct (the slice path runs instead).
    fn send_direct(&mut self, idx: usize) -> bool {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return true };
        let pending = c.pending_out();
        let ConnState::Http1(h) = &mut c.state else { return true };
        let Some(Stream::Download(d)) = &mut h.stream else { return true };
        if !d.direct {
            return false;
        }
        if pending {
            // The head is still going out: its writable edge comes back here.
            return true;
        }
        let turn_end = d.sent.saturating_add(DIRECT_TURN).min(d.end);
        while d.sent < turn_end {
            if d.advised < d.end && d.advised < d.sent.saturating_add(ADVISE_WINDOW / 2) {
                let (file, from) = (Arc::clone(&d.file), d.advised);
                let len = (d.end - from).min(ADVISE_WINDOW);
                d.advised += len;
                self.pool.chore(Box::new(move || advise(&file, from, len)));
            }
            let want = h.codec.passthrough(turn_end - d.sent);
            let Ok(mut off) = i64::try_from(d.sent) else { break };
            match nix::sys::sendfile::sendfile64(&c.sock, &*d.file, Some(&mut off), want as usize) {
                Ok(0) => {
                    // The file shrank: the promised length cannot be sent.
                    log::warn!("download: the file ended early; closing the connection");
                    self.close(idx);
                    return true;
                }
                Ok(n) => {
                    d.sent += n as u64;
                    h.codec.passed(n as u64);
                }
                Err(nix::errno::Errno::EAGAIN) => {
                    c.send_deadline = c.send_deadline.or(Some(Instant::now() + super::SEND_TIMEOUT));
                    self.arm(idx);
                    return true;
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => {
                    self.close(idx);
                    return true;
                }
            }
        }
        c.send_deadline = None;
        if d.sent < d.end {
            // The turn's share is sent and the socket takes more: the rest next turn.
            self.drained.push((idx, c.generation));
            return true;
        }
        h.stream = None;
        // Back to HTTP/1.1: flush, then serve what was pipelined meanwhile.
        if !h.codec.end_body(&mut c.out, &self.env, Instant::now()) {
            h.closing = true;
        }
        self.drive(idx);
        true
    }

    /// A slice of a download arrived from the pool (slices may complete out of order).
    pub(super) fn chunk_arrived(&mut self, idx: usize, offset: u64, bytes: Vec<u8>) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let Some(Stream::Download(d)) = &mut h.stream else { return };
        d.in_flight = d.in_flight.saturating_sub(1);
        if bytes.is_empty() {
            // The file shrank or failed: the promised length cannot be sent.
            log::warn!("download read failed; closing the connection");
            self.close(idx);
            return;
        }
        d.ready.push((offset, bytes));
        self.drive_stream(idx);
    }

    /// A `Last-Event-ID` replay finished: send it, then what arrived meanwhile.
    pub(super) fn replayed(&mut self, idx: usize, bytes: Vec<u8>, last: i64) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let Some(Stream::Sse(s)) = &mut h.stream else { return };
        if last == REPLAY_PANICKED {
            self.abort_stream(idx);
            return;
        }
        h.codec.data(&mut c.out, &bytes);
        s.last_id = s.last_id.max(last);
        s.replaying = false;
        for (id, event) in s.held.drain(..) {
            if id > s.last_id {
                h.codec.data(&mut c.out, &event);
                s.last_id = id;
            }
        }
        self.drive_stream(idx);
    }

    /// A detached connection closed: drop it from every registry at once.
    pub(super) fn forget_stream(&mut self, idx: usize, generation: u32, s: Stream) {
        match s {
            Stream::Sse(_) => {
                self.sse.remove(&ExchangeId::h1(idx, generation));
                self.svc.stats.sse.store(self.sse.len(), std::sync::atomic::Ordering::Relaxed);
                self.metrics.set_sse_streams(self.sse.len());
            }
            Stream::Download(_) | Stream::Relay | Stream::Ticker(_) | Stream::Aborted => {}
            Stream::Ws(w) => {
                for room in &w.rooms {
                    if self.rooms.leave(room, ExchangeId::h1(idx, generation)) {
                        self.svc.stats.members.fetch_sub(1, Relaxed);
                    }
                }
                let ws = self.svc.stats.ws.fetch_sub(1, Relaxed).saturating_sub(1);
                self.metrics.set_websocket_clients(ws);
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
                let app = &self.app;
                let Ok(rendered) = guard("SSE notification", || app.sse_notification(payload)) else {
                    // The event is rendered once for every subscriber: none of them can
                    // have it. Their streams end (cleanly); each client reconnects with
                    // `Last-Event-ID` and gets it from the store's replay.
                    let subscribers: Vec<ExchangeId> = self.sse.iter().copied().collect();
                    for id in subscribers {
                        if id.stream != 0 {
                            self.h2_abort_exchange(id);
                        } else {
                            self.abort_stream(id.conn);
                        }
                    }
                    return;
                };
                let Some((id, event)) = rendered else { return };
                // Rendered once; each subscriber's codec frames it.
                let event: Arc<[u8]> = event.into();
                let subscribers: Vec<ExchangeId> = self.sse.iter().copied().collect();
                for sub in subscribers {
                    if sub.stream != 0 {
                        self.h2_event(sub, id, &event);
                        continue;
                    }
                    let idx = sub.conn;
                    let Some(Some(c)) = self.conns.get_mut(idx) else { continue };
                    let ConnState::Http1(h) = &mut c.state else { continue };
                    let Some(Stream::Sse(s)) = &mut h.stream else { continue };
                    if s.replaying {
                        s.held.push((id, event.clone()));
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
                    h.codec.data(&mut c.out, &event);
                    self.flush_conn(idx);
                }
            }
            Topic::Room => self.deliver_room(payload),
        }
    }

    /// App code behind detached connection `idx` panicked: end that exchange
    /// only. SSE: the last chunk (the client reconnects); WebSocket: close
    /// 1011; a finite stream (ticker, relay): no last chunk, so the client
    /// sees the response cut short. Then the connection closes once flushed;
    /// its registries and upstream calls are dropped now.
    pub(super) fn abort_stream(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let mut old = h.stream.replace(Stream::Aborted);
        match &mut old {
            Some(Stream::Sse(_)) => {
                h.codec.end_body(&mut c.out, &self.env, Instant::now());
            }
            Some(Stream::Ws(w)) => w.conn.close(1011, "internal error", &mut c.out),
            _ => {}
        }
        h.closing = true;
        let call = h.call.take();
        let generation = c.generation;
        if let Some(s) = old {
            self.forget_stream(idx, generation, s);
        }
        if let Some(call) = call {
            self.cancel_call(ExchangeId::h1(idx, generation), call);
        }
        self.flush_conn(idx);
    }

    /// Graceful stop: end every stream (SSE: the last chunk; the client reconnects elsewhere).
    /// WebSockets: close 1001 (going away).
    pub(super) fn end_streams(&mut self) {
        for idx in 0..self.conns.len() {
            let Some(Some(c)) = self.conns.get_mut(idx) else { continue };
            let h = match &mut c.state {
                ConnState::Http2(sess) => {
                    let ended = sess.end_event_streams();
                    for stream in ended {
                        self.sse.remove(&ExchangeId { conn: idx, stream, generation: c.generation });
                    }
                    self.sse_count_changed();
                    continue;
                }
                ConnState::Http1(h) => h,
                ConnState::Lingering(_) => continue,
            };
            match &mut h.stream {
                Some(Stream::Sse(_)) => {
                    h.codec.end_body(&mut c.out, &self.env, Instant::now());
                }
                Some(Stream::Ws(w)) => w.conn.close(1001, "server shutting down", &mut c.out),
                // A download in flight finishes (the drain deadline bounds it).
                Some(Stream::Download(_) | Stream::Relay | Stream::Ticker(_) | Stream::Aborted) | None => continue,
            }
            h.closing = true;
            self.flush_conn(idx);
        }
    }
}

/// Ask the kernel to read `len` bytes of `file` from `from` into the page cache (on the pool:
/// the call may wait for the device queue). Advice only: a failure changes nothing but speed.
fn advise(file: &std::fs::File, from: u64, len: u64) {
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else { return };
    let _ = nix::fcntl::posix_fadvise(
        std::os::fd::AsRawFd::as_raw_fd(file),
        from,
        len,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
    );
}
