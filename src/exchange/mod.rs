//! The exchange engine: the life of one request/response exchange, written once for every
//! protocol.
//!
//! A codec's session owns an [`Exchanges`] (its open exchanges, keyed by stream) and a
//! [`Sink`] (its connection's write side). The codec turns what its peer sent into
//! [`Input`]s — a head, body bytes, a reset, the connection's end — applied in one place
//! ([`Exchanges::input`]), and the worker hands over what the rest of the loop produced:
//! a pool result ([`Exchanges::completed`]), a bus event ([`Exchanges::event`]), an upstream's
//! answer or relayed bytes. The engine runs the one dispatch (the request to the app through
//! [`Host`]), answers through the sink, starts the body's [`Produce`]r (event stream,
//! ticker, download, WebSocket, relay), keeps each producer under back pressure (nothing is
//! produced into an exchange whose unsent bytes are past the watermark) and ends or cancels
//! the exchange. It never branches on the protocol: what differs between the codecs (how a
//! head and DATA are framed, flow control, how a download reads ahead) is the sink's. The
//! HTTP/1.1 codec parses, dispatches and answers its requests itself; the engine adopts an
//! exchange whose body follows its head or waits on upstreams ([`Exchanges::adopt`]).
//!
//! What the engine needs done outside the session (upstream requests to start or cancel,
//! rooms a WebSocket joins or leaves) it returns as [`Effect`] values for the worker to
//! carry out after the session's turn.
//!
//! It sits between the codecs and the app, apart from the worker's loop: it touches no
//! socket, poll token or connection table, so it is tested without a loop, and the
//! dependency runs one way (`crate::worker` drives it; it never names the worker).
//!
//! Beside it, socket-free too: `input.rs` (what a codec's read path reports, applied in
//! one place), `sink.rs` (what a codec implements; HTTP/2's sink and scheduler in
//! `h2_sink.rs`, HTTP/3's in `h3_sink.rs`; HTTP/1.1's writes its socket and is the
//! worker's), `produce.rs` (the producers), `download.rs` and `file.rs` (file bodies),
//! `websocket.rs` (one WebSocket), `relay.rs` (what a relay's sink makes of its upstream),
//! `pool.rs` (the thread pool the engine's jobs run on),
//! `panics.rs` (the one door into app code) and `glue.rs` (the [`Service`] and [`Host`]
//! every codec and the engine reach the app through: the handlers behind that door, the
//! request counts, the access log). What an exchange waiting on upstreams
//! holds is `crate::upstream::call`'s.
//!
//! This module must not touch a socket, a poll token, a connection table or a route, and
//! must not write protocol framing.

mod download;
mod file;
mod glue;
pub(crate) mod h2_sink;
mod h3_sink;
mod input;
pub(crate) mod panics;
pub(crate) mod pool;
mod produce;
pub(crate) mod relay;
mod sink;
#[cfg(test)]
mod tests;
mod websocket;

pub(crate) use crate::upstream::call::CallState;
pub(crate) use download::Download;
pub(crate) use file::FileBody;
pub(crate) use glue::Glue;
pub(crate) use input::{Input, Source};
pub(crate) use produce::{Events, Produce, Subscribers, Tick, Ticking, Tunnel, MAX_BACKLOG};
pub(crate) use sink::{send_head, Gone, Head, Key, Reset, Sink};
pub(crate) use websocket::{Todo, Ws, WS_PING_EVERY};

/// The unit a body moves in, on every protocol: one disk read of a file body, and the most of
/// a producer's unsent bytes an exchange takes in (or queues) at a time.
pub(crate) const SLICE: usize = 64 * 1024;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::app::{App, Body, Producer, WebSocket};
use crate::error::Error;
use crate::http::headers::{valid_request_id, Common};
use crate::http::reply::refusal;
use crate::http::request::{Method, Request};
use crate::http::response::{Delimit, RequestMeta, Response};
use crate::http::service::{Env, Finished, Protocol, Service, HIGH_WATERMARK};
use crate::http::target::{split_target, valid_host};
use crate::http2::{Heads, Priority};
use crate::proto::handshake;
use pool::{Completion, ExchangeId, Pool, Work};

/// What the engine asks of the service behind it.
pub(crate) trait Host: Service {
    /// The app (what event streams and WebSockets produce).
    fn app(&self) -> &App;
    /// A WebSocket opened: it is counted. Returns its largest message.
    fn websocket_opened(&mut self) -> usize;
}

/// What an exchange needs done outside its session, for the worker to carry out.
pub(crate) enum Effect {
    /// Start the upstream requests of an exchange (the worker owns the upstream sockets).
    Start(ExchangeId, crate::http::reply::Upstream),
    /// Cancel the upstream wait of an exchange that went away.
    Cancel(ExchangeId, CallState),
    /// A WebSocket went away: out of its rooms, uncounted.
    Left(ExchangeId, Vec<String>),
    /// What a WebSocket message asked for (rooms).
    Todo(ExchangeId, Todo),
}

/// What the engine borrows from the worker while it runs.
pub(crate) struct Cx<'a, V> {
    pub(crate) host: &'a mut V,
    pub(crate) env: &'a mut Env,
    pub(crate) pool: &'a Pool,
    /// The worker's event-stream subscribers.
    pub(crate) sse: &'a mut Subscribers,
    /// Builds the response heads.
    pub(crate) heads: &'a mut Heads,
}

/// The engine's [`Cx`] from the worker's fields, one by one (so a session
/// borrowed from `conns` or `h3` can live beside it).
macro_rules! engine_cx {
    ($w:ident, $host:expr, $heads:expr) => {
        $crate::exchange::Cx { host: $host, env: &mut $w.env, pool: &$w.pool, sse: &mut $w.sse, heads: $heads }
    };
}
pub(crate) use engine_cx;

/// Where an exchange is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The request body is arriving.
    Receiving,
    /// A pool job or upstreams are working on the answer.
    Waiting,
    /// The head went out; the body follows from `produce` / `unsent`.
    Streaming,
}

/// The id answered in `x-request-id`: the client's own when it is valid, else a fresh UUID.
pub(crate) enum RequestId {
    /// A fresh UUID v4.
    Fresh([u8; 36]),
    /// The client's `x-request-id` (checked by `valid_request_id`: ASCII).
    Given(Box<[u8]>),
}

impl RequestId {
    /// The client's id `given` if it is valid, else a fresh UUID from `common`.
    fn of(given: Option<&[u8]>, common: &mut Common) -> RequestId {
        match given {
            Some(v) if valid_request_id(v) => RequestId::Given(v.into()),
            _ => {
                let mut u = [0u8; 36];
                common.uuid(&mut u);
                RequestId::Fresh(u)
            }
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Given(v) => v,
            RequestId::Fresh(u) => u,
        }
    }

    /// Both kinds are ASCII, so the fallback never shows.
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

/// One request/response exchange: one stream.
pub(crate) struct Exchange<K, H> {
    pub(crate) stream: K,
    method: Method,
    /// The head as the codec received it, kept whole.
    pub(crate) head: H,
    /// The request body so far.
    body: Vec<u8>,
    pub(crate) stage: Stage,
    started: Instant,
    /// The whole body within `limits.body_timeout_ms` of the head.
    pub(crate) deadline: Option<Instant>,
    request_id: RequestId,
    label: u16,
    /// The client the service decided on (behind trusted proxies, not always the peer).
    client: Option<IpAddr>,
    pub(crate) produce: Option<Produce>,
    /// Body bytes produced and not yet taken by the stream.
    pub(crate) unsent: Vec<u8>,
    /// The body is complete once `unsent` is sent.
    pub(crate) done: bool,
    /// The upstream requests this exchange waits on, or its relay.
    pub(crate) call: Option<CallState>,
    /// An extended CONNECT for `websocket` (RFC 8441): the stream is the tunnel.
    tunnel: bool,
    /// Its `priority` (RFC 9218): the order its body goes out in.
    pub(crate) priority: Priority,
    /// Its body ended, or its stream failed, while sending: removed after the pass.
    pub(crate) gone: bool,
    /// Body bytes handed to the stream so far.
    pub(crate) body_sent: u64,
    /// Its producer's app code failed: once what it made is sent, the body is abandoned
    /// ([`Sink::abandon`]).
    failed: bool,
}

impl<K, H: Head> Exchange<K, H> {
    /// `:path` with the query, for the handler and the access log (`/` for a plain CONNECT).
    #[inline]
    fn target(&self) -> &str {
        match self.head.path() {
            "" => "/",
            path => path,
        }
    }
}

impl<K, H> Exchange<K, H> {
    /// Streaming, with bytes to send or a download still reading.
    pub(crate) fn streaming(&self) -> bool {
        self.stage == Stage::Streaming
    }

    /// The end of the body: the producer stops, what it made still goes out.
    fn end_body(&mut self) {
        self.produce = None;
        self.done = true;
    }
}

/// How a request is opened ([`Exchanges::open`]).
pub(crate) struct Opening<K, H> {
    pub(crate) stream: K,
    pub(crate) head: H,
    /// Its `priority` field.
    pub(crate) priority: Priority,
    /// A body follows the head (its deadline runs).
    pub(crate) body_follows: bool,
    /// An extended CONNECT for `websocket`: complete with its head.
    pub(crate) tunnel: bool,
}

/// One connection's open exchanges.
pub(crate) struct Exchanges<K, H> {
    /// Few; searched linearly.
    pub(crate) list: Vec<Exchange<K, H>>,
    conn: usize,
    gen: u32,
    peer: IpAddr,
    secure: bool,
    /// What the access log names the connection's protocol and TLS version.
    protocol: Protocol,
    tls: Option<&'static str>,
    /// Errors this session answers itself carry `Alt-Svc` (HTTP/2 over TLS).
    announce: bool,
    /// Since when the connection has had no exchange (the keep-alive timer).
    pub(crate) idle_since: Option<Instant>,
    /// What the worker must do after this turn.
    pub(crate) effects: Vec<Effect>,
}

impl<K: Key, H: Head> Exchanges<K, H> {
    /// No exchange yet on connection `conn` of generation `gen`, from `peer`, speaking
    /// `protocol` over TLS `tls` (`None`: plain TCP).
    pub(crate) fn new(
        conn: usize,
        gen: u32,
        peer: IpAddr,
        protocol: Protocol,
        tls: Option<&'static str>,
        announce: bool,
        now: Instant,
    ) -> Self {
        let secure = tls.is_some();
        let idle_since = Some(now);
        Exchanges {
            list: Vec::new(),
            conn,
            gen,
            peer,
            secure,
            protocol,
            tls,
            announce,
            idle_since,
            effects: Vec::new(),
        }
    }

    /// The generation of the connection (in every id of its exchanges).
    pub(crate) fn gen(&self) -> u32 {
        self.gen
    }

    /// The worker-wide id of the exchange on `stream`.
    pub(crate) fn id(&self, stream: K) -> ExchangeId {
        stream.id(self.conn, self.gen)
    }

    /// The index of the exchange on `stream`.
    pub(crate) fn find(&self, stream: K) -> Option<usize> {
        self.list.iter().position(|e| e.stream == stream)
    }

    /// No exchange is open.
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The earliest deadline of a request body or a producer.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let producers = self.list.iter().filter_map(|e| e.produce.as_ref()?.deadline());
        self.list.iter().filter_map(|e| e.deadline).chain(producers).min()
    }

    /// A new exchange for a request head; its index. The codec then fails it (a malformed
    /// head) or dispatches it once complete.
    pub(crate) fn open(
        &mut self,
        o: Opening<K, H>,
        common: &mut Common,
        body_timeout: std::time::Duration,
        now: Instant,
    ) -> usize {
        let request_id = RequestId::of(o.head.field("x-request-id"), common);
        self.list.push(Exchange {
            stream: o.stream,
            method: Method::parse(o.head.method()),
            head: o.head,
            body: Vec::new(),
            stage: Stage::Receiving,
            started: now,
            deadline: (o.body_follows && !o.tunnel).then(|| now + body_timeout),
            request_id,
            label: 0,
            client: None,
            produce: None,
            unsent: Vec::new(),
            done: false,
            call: None,
            tunnel: o.tunnel,
            priority: o.priority,
            gone: false,
            body_sent: 0,
            failed: false,
        });
        self.idle_since = None;
        self.list.len() - 1
    }

    /// Take on an exchange its codec answers (HTTP/1.1: the codec writes and logs the head)
    /// at `stage`: waiting on upstreams, or past its head with its body from `produce`. Its
    /// index.
    pub(crate) fn adopt(&mut self, stream: K, head: H, stage: Stage, produce: Option<Produce>, now: Instant) -> usize {
        let done = match &produce {
            Some(Produce::Download(d)) => d.done(),
            _ => false,
        };
        self.list.push(Exchange {
            stream,
            method: Method::Get,
            head,
            body: Vec::new(),
            stage,
            started: now,
            deadline: None,
            request_id: RequestId::Fresh([b'-'; 36]),
            label: 0,
            client: None,
            produce,
            unsent: Vec::new(),
            done,
            call: None,
            tunnel: false,
            priority: Priority::default(),
            gone: false,
            body_sent: 0,
            failed: false,
        });
        self.idle_since = None;
        self.list.len() - 1
    }

    /// Request body bytes for the exchange on `stream` (`end`: the last). A WebSocket's are
    /// its frames. Bytes for no exchange are released and dropped.
    pub(crate) fn data<S, V>(
        &mut self,
        stream: K,
        bytes: &[u8],
        end: bool,
        sink: &mut S,
        cx: &mut Cx<'_, V>,
        now: Instant,
    ) where
        S: Sink<Stream = K>,
        V: Host,
    {
        let Some(i) = self.find(stream) else {
            sink.release(stream, bytes.len());
            return;
        };
        let ex = &mut self.list[i];
        if let Some(Produce::Ws(t)) = &mut ex.produce {
            // Released once read (`ws_input`), not while the output is backed up.
            t.input.extend_from_slice(bytes);
            t.unreleased += bytes.len();
            t.peer_ended |= end;
            self.ws_input(i, sink, cx);
            return;
        }
        // Consumed at once (buffered here, bounded by the body limit).
        sink.release(stream, bytes.len());
        if ex.stage != Stage::Receiving {
            return;
        }
        if (ex.body.len() + bytes.len()) as u64 > cx.env.max_body {
            return self.fail(i, Error::PayloadTooLarge, sink, cx, now);
        }
        ex.body.extend_from_slice(bytes);
        if end {
            self.dispatch(i, sink, cx, now);
        }
    }

    /// The request of exchange `i` is complete: hand it to the app.
    pub(crate) fn dispatch<S, V>(&mut self, i: usize, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant)
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        let (peer, secure) = (self.peer, self.secure);
        let ex = &mut self.list[i];
        ex.deadline = None;
        let reply = {
            // The handlers' view of the fields, on the stack unless there are many.
            let mut stack = [httparse::EMPTY_HEADER; STACK_FIELDS];
            let heap: Vec<httparse::Header<'_>>;
            let n = handler_fields(&ex.head).count();
            let headers: &[httparse::Header<'_>] = if n <= STACK_FIELDS {
                for (slot, field) in stack.iter_mut().zip(handler_fields(&ex.head)) {
                    *slot = field;
                }
                &stack[..n]
            } else {
                heap = handler_fields(&ex.head).collect();
                &heap
            };
            let mut hosts = headers.iter().filter(|h| h.name == "host");
            match (hosts.next(), hosts.next()) {
                (Some(host), None) if valid_host(host.value) => {
                    let (path, query) = split_target(ex.target());
                    let req = Request {
                        method: if ex.tunnel { Method::Get } else { ex.method },
                        path,
                        query,
                        http10: false,
                        headers: crate::http::fields::Fields::new(headers),
                        body: &ex.body,
                        request_id: ex.request_id.as_str(),
                        peer,
                        secure,
                    };
                    Ok(cx.host.call(&req))
                }
                _ => Err(Error::bad_request("missing or repeated Host")),
            }
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return self.fail(i, e, sink, cx, now),
        };
        let ex = &mut self.list[i];
        ex.label = cx.host.label();
        ex.client = cx.host.client();
        if ex.tunnel && !matches!(reply.body, Body::WebSocket(_)) {
            // An extended CONNECT to a route that is not a WebSocket: the route's error
            // stands; what a GET would have got is not for a CONNECT (a 2xx would open a
            // tunnel), and nothing of it runs.
            if matches!(reply.body, Body::Full) && reply.head.status >= 400 {
                self.answer(i, reply.head, Delimit::Length, sink, cx);
            } else {
                self.fail(i, Error::bad_request("not a WebSocket endpoint"), sink, cx, now);
            }
            return;
        }
        ex.body = Vec::new();
        match reply.body {
            Body::Full => {
                self.answer(i, reply.head, Delimit::Length, sink, cx);
            }
            Body::Job(job) => {
                ex.stage = Stage::Waiting;
                cx.pool.submit(ex.stream.id(self.conn, self.gen), Work::Request(job));
            }
            Body::Producer(p) => {
                if self.answer(i, reply.head, Delimit::Chunked, sink, cx) {
                    self.start_producer(i, p, cx, now);
                }
            }
            Body::File(f) => {
                if self.answer(i, reply.head, Delimit::Sized(f.len), sink, cx) {
                    let ex = &mut self.list[i];
                    ex.done = f.len == 0;
                    ex.produce = Some(S::file_body(f));
                }
            }
            Body::Upstream(up) => {
                ex.stage = Stage::Waiting;
                let id = ex.stream.id(self.conn, self.gen);
                self.effects.push(Effect::Start(id, up));
            }
            // The handler let the client in; the extended CONNECT is the handshake, checked
            // after it, so a refused token or `Origin` is answered before a bad handshake.
            Body::WebSocket(ws) if ex.tunnel => match handshake::extended_connect(ex.head.fields()) {
                Ok(()) => self.start_websocket(i, ws, sink, cx, now),
                Err(e) => {
                    self.answer(i, refusal(reply.head, e, cx.env.development), Delimit::Length, sink, cx);
                }
            },
            // Only an extended CONNECT opens a WebSocket on a multiplexed connection.
            Body::WebSocket(_) => {
                self.fail(i, Error::bad_request("WebSocket needs an extended CONNECT"), sink, cx, now)
            }
        }
    }

    /// Answer exchange `i` with an error response (its stream ends).
    pub(crate) fn fail<S, V>(&mut self, i: usize, e: Error, sink: &mut S, cx: &mut Cx<'_, V>, _now: Instant)
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        self.list[i].label = 0;
        self.list[i].client = None;
        let mut resp = e.into_response(cx.env.development);
        if self.announce {
            cx.env.announce(&mut resp, self.secure);
        }
        self.answer(i, resp, Delimit::Length, sink, cx);
    }

    /// Send `resp` on exchange `i`'s stream and log it (through the codec's own
    /// [`Sink::respond`] when it writes its heads). With `Delimit::Length` (or for `HEAD`)
    /// the response is whole and the exchange is forgotten; otherwise its body follows
    /// (returns `true`).
    pub(crate) fn answer<S, V>(
        &mut self,
        i: usize,
        mut resp: Response,
        delimit: Delimit,
        sink: &mut S,
        cx: &mut Cx<'_, V>,
    ) -> bool
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        if S::ANSWERS {
            // The codec wrote the head and logged the exchange.
            let follows = sink.respond(self.list[i].stream, resp, delimit, &mut *cx.host, cx.env);
            if follows {
                self.list[i].stage = Stage::Streaming;
            } else {
                self.remove(i, cx.sse);
            }
            return follows;
        }
        let ex = &self.list[i];
        let head_only = ex.method == Method::Head;
        let follows = !head_only && delimit != Delimit::Length;
        let meta = RequestMeta {
            delimit,
            head: head_only,
            http10: false,
            keep_alive: true,
            request_id: ex.request_id.as_bytes(),
        };
        let (bytes, sent) = match cx.heads.build(&mut resp, &meta, &mut cx.env.common) {
            Ok(head) => (head.body.len(), send_head(sink, ex.stream, head, follows).is_ok()),
            Err(_) => (0, false),
        };
        cx.host.finished(&Finished {
            method: if ex.method == Method::Other { "OTHER" } else { ex.method.as_str() },
            target: ex.target().as_bytes(),
            status: resp.status,
            bytes,
            elapsed: ex.started.elapsed(),
            request_id: ex.request_id.as_bytes(),
            label: ex.label,
            client: ex.client,
            protocol: self.protocol,
            tls: self.tls,
            user_agent: ex.head.field("user-agent"),
            referer: ex.head.field("referer"),
        });
        if !sent {
            sink.reset(ex.stream, Reset::Internal);
        }
        if follows && sent {
            self.list[i].stage = Stage::Streaming;
            true
        } else {
            self.remove(i, cx.sse);
            false
        }
    }

    /// Exchange `i`'s head went out; its body comes from `p`.
    pub(crate) fn start_producer<V: Host>(&mut self, i: usize, p: Producer, cx: &mut Cx<'_, V>, now: Instant) {
        let id = self.id(self.list[i].stream);
        let ex = &mut self.list[i];
        match p {
            Producer::Events { last_event_id, audience } => {
                match Events::start(cx.host.app(), last_event_id, audience, id, cx.sse, cx.pool, &mut ex.unsent, now) {
                    Some(e) => ex.produce = Some(Produce::Events(e)),
                    None => ex.done = true,
                }
            }
            Producer::Ticker(ticker) => ex.produce = Some(Produce::Ticker(Ticking::new(ticker, now))),
        }
    }

    /// Exchange `i` (an extended CONNECT) was accepted as a WebSocket: 200, then WebSocket
    /// frames in the stream's DATA.
    fn start_websocket<S, V>(&mut self, i: usize, w: WebSocket, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant)
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        if !self.answer(i, Response::new(200), Delimit::Upgrade, sink, cx) {
            return;
        }
        let max_message = cx.host.websocket_opened();
        let ex = &mut self.list[i];
        let (ws, greeted) = Ws::open(cx.host.app(), w, max_message, &mut ex.unsent, now);
        ex.done = !greeted;
        ex.produce = Some(Produce::Ws(Box::new(Tunnel { ws, input: Vec::new(), unreleased: 0, peer_ended: false })));
    }

    /// Read WebSocket exchange `i`'s received frames and release their bytes to the peer's
    /// flow control, unless its output is backed up (more than `HIGH_WATERMARK` unsent): then
    /// they wait, unreleased, so the peer's stream window closes once it has sent one
    /// window's worth, and are read when the output drains ([`Exchanges::service`]).
    /// Returns whether it read.
    fn ws_input<S, V>(&mut self, i: usize, sink: &mut S, cx: &mut Cx<'_, V>) -> bool
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        let id = self.id(self.list[i].stream);
        let ex = &mut self.list[i];
        let Some(Produce::Ws(t)) = &mut ex.produce else { return false };
        if ex.done {
            // Closing: what still comes is dropped, and its window given back.
            t.input.clear();
            sink.release(ex.stream, std::mem::take(&mut t.unreleased));
            return false;
        }
        if ex.unsent.len() > HIGH_WATERMARK || (t.unreleased == 0 && !t.peer_ended) {
            return false;
        }
        let mut todo = Vec::new();
        let mut closed = false;
        match t.ws.read(cx.host.app(), &t.input, &mut ex.unsent, &mut todo, &mut closed) {
            Ok(used) => {
                t.input.drain(..used);
            }
            Err(()) => {
                t.ws.conn.close(1011, "internal error", &mut ex.unsent);
                closed = true;
            }
        }
        // What is left is the start of a frame (at most a message's worth): released too,
        // or a frame larger than the window could never complete.
        sink.release(ex.stream, std::mem::take(&mut t.unreleased));
        self.effects.extend(todo.into_iter().map(|t| Effect::Todo(id, t)));
        // The peer's close (or its end of the stream) ends ours.
        if closed || t.peer_ended || t.ws.conn.is_closing() {
            ex.done = true;
        }
        true
    }

    /// Forget exchange `i`: its subscription goes; its upstream wait and its WebSocket's
    /// rooms become effects.
    pub(crate) fn remove(&mut self, i: usize, sse: &mut Subscribers) {
        let ex = self.list.swap_remove(i);
        let id = ex.stream.id(self.conn, self.gen);
        match ex.produce {
            Some(Produce::Events(_)) => {
                sse.remove(&id);
            }
            Some(Produce::Ws(t)) => self.effects.push(Effect::Left(id, t.ws.rooms)),
            _ => {}
        }
        if let Some(call) = ex.call {
            self.effects.push(Effect::Cancel(id, call));
        }
        if self.list.is_empty() {
            self.idle_since = Some(Instant::now());
        }
    }

    /// The peer reset `stream` (or gave up on it): its exchange goes. Whether there was one.
    pub(crate) fn cancel(&mut self, stream: K, sse: &mut Subscribers) -> bool {
        match self.find(stream) {
            Some(i) => {
                self.remove(i, sse);
                true
            }
            None => false,
        }
    }

    /// The connection closed: every exchange goes.
    pub(crate) fn close_all(&mut self, sse: &mut Subscribers) {
        while !self.list.is_empty() {
            self.remove(0, sse);
        }
    }

    /// Reset the exchange on `stream` and forget it.
    pub(crate) fn drop_stream<S: Sink<Stream = K>>(
        &mut self,
        stream: K,
        why: Reset,
        sink: &mut S,
        sse: &mut Subscribers,
    ) {
        sink.reset(stream, why);
        self.cancel(stream, sse);
    }

    /// Move streaming exchanges' bytes toward their streams, read what a backed-up
    /// WebSocket left waiting, end finished bodies, reset streams whose client stopped
    /// reading. Returns whether anything was queued.
    pub(crate) fn service<S, V>(&mut self, sink: &mut S, cx: &mut Cx<'_, V>) -> bool
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        let mut queued = false;
        let mut i = 0;
        while i < self.list.len() {
            if !self.list[i].streaming() {
                i += 1;
                continue;
            }
            // A WebSocket whose output drained reads what waited.
            queued |= self.ws_input(i, sink, cx);
            let id = self.id(self.list[i].stream);
            let ex = &mut self.list[i];
            if sink.feed(ex, cx.pool, id) {
                self.remove(i, cx.sse);
                continue;
            }
            if ex.unsent.len() > MAX_BACKLOG {
                log::warn!("event stream is not reading; resetting it");
                sink.reset(ex.stream, Reset::Cancel);
                self.remove(i, cx.sse);
                continue;
            }
            if ex.done && ex.unsent.is_empty() {
                // Nothing was left to carry the end: an empty DATA frame ends it.
                if ex.failed {
                    sink.abandon(ex.stream);
                } else {
                    let _ = sink.send_data(ex.stream, Bytes::new(), true);
                }
                queued = true;
                self.remove(i, cx.sse);
                continue;
            }
            i += 1;
        }
        queued |= sink.pump(&mut self.list, cx.pool, self.conn, self.gen);
        let mut i = 0;
        while i < self.list.len() {
            if self.list[i].gone {
                self.remove(i, cx.sse);
            } else {
                i += 1;
            }
        }
        queued
    }

    /// Heartbeats, tickers and WebSocket pings that are due.
    pub(crate) fn tick(&mut self, host: &impl Host, now: Instant) {
        for ex in &mut self.list {
            let go = match &mut ex.produce {
                Some(Produce::Events(e)) => e.beat(host.app(), now, &mut ex.unsent),
                Some(Produce::Ticker(t)) => match t.tick(now, ex.unsent.len(), &mut ex.unsent) {
                    Tick::Panicked => {
                        ex.failed = true;
                        false
                    }
                    tick => tick.goes_on(),
                },
                Some(Produce::Ws(t)) if t.ws.next_ping <= now => {
                    let backed_up = ex.unsent.len() > HIGH_WATERMARK;
                    if t.ws.awaiting_pong {
                        // Its close goes out first: what the peer did not read is dropped.
                        ex.unsent.clear();
                    }
                    ex.done |= !t.ws.heartbeat(now, backed_up, &mut ex.unsent);
                    true
                }
                _ => true,
            };
            if !go {
                ex.end_body();
            }
        }
    }

    /// Request bodies late past their deadline: 408.
    pub(crate) fn expire<S, V>(&mut self, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant)
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        while let Some(i) = self.list.iter().position(|e| e.deadline.is_some_and(|t| t <= now)) {
            self.fail(i, Error::RequestTimeout, sink, cx, now);
        }
    }

    /// A pool result for the exchange on `stream`: its answer, a replay or a download slice.
    pub(crate) fn completed<S, V>(&mut self, stream: K, result: Completion, sink: &mut S, cx: &mut Cx<'_, V>)
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.list[i];
        let read = match (result, &mut ex.produce) {
            (Completion::Response(result), _) => {
                // Only a panic makes a job fail (the app renders its own errors); the guard logged it.
                let resp = result.unwrap_or_else(|e| e.into_response(cx.env.development));
                self.answer(i, resp, Delimit::Length, sink, cx);
                return;
            }
            (Completion::Replay(bytes, last), Some(Produce::Events(e))) => {
                let go = e.replayed(&bytes, last, &mut ex.unsent);
                if !go {
                    ex.end_body();
                }
                return;
            }
            (Completion::Chunk(offset, bytes), Some(Produce::Download(d))) => d.arrived(offset, bytes),
            (Completion::Chunk(offset, bytes), Some(Produce::Slices(d))) => d.arrived(offset, bytes),
            _ => return,
        };
        if !read {
            // The file shrank or failed: the promised length cannot be sent.
            log::warn!("download read failed; resetting the stream");
            let stream = self.list[i].stream;
            self.drop_stream(stream, Reset::Internal, sink, cx.sse);
        }
    }

    /// A bus event for the subscription of the exchange on `stream`.
    pub(crate) fn event(&mut self, stream: K, id: i64, event: &Arc<[u8]>) {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.list[i];
        if let Some(Produce::Events(e)) = &mut ex.produce {
            e.live(id, event, &mut ex.unsent);
        }
    }

    /// App code behind the body of the exchange on `stream` failed: a body already begun
    /// ends with what was sent; an exchange not yet answered is reset.
    pub(crate) fn abort<S: Sink<Stream = K>>(&mut self, stream: K, sink: &mut S, sse: &mut Subscribers) {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.list[i];
        ex.call = None;
        ex.end_body();
        if ex.stage != Stage::Streaming {
            self.drop_stream(stream, Reset::Internal, sink, sse);
        }
    }

    /// Relayed bytes for the exchange on `stream`: queued on it.
    pub(crate) fn relay_data(&mut self, stream: K, bytes: &[u8]) -> bool {
        let Some(i) = self.find(stream) else { return false };
        self.list[i].unsent.extend_from_slice(bytes);
        true
    }

    /// Whether the exchange on `stream` is behind its client (its relay pauses).
    pub(crate) fn relay_slow(&self, stream: K) -> bool {
        self.find(stream).is_some_and(|i| self.list[i].unsent.len() > HIGH_WATERMARK)
    }

    /// The relay of the exchange on `stream` ended: its body ends once sent.
    pub(crate) fn relay_done(&mut self, stream: K) {
        if let Some(i) = self.find(stream) {
            self.list[i].call = None;
            self.list[i].done = true;
        }
    }

    /// Relayed exchanges whose client caught up (their upstream may read again).
    pub(crate) fn relays_ready(&self) -> impl Iterator<Item = ExchangeId> + '_ {
        self.list
            .iter()
            .filter(|e| matches!(e.call, Some(CallState::Relay { .. })) && e.unsent.len() <= HIGH_WATERMARK)
            .map(|e| e.stream.id(self.conn, self.gen))
    }

    /// The upstream wait of the exchange on `stream`, while it is open.
    pub(crate) fn call_slot(&mut self, stream: K) -> Option<&mut Option<CallState>> {
        let i = self.find(stream)?;
        Some(&mut self.list[i].call)
    }

    /// The WebSocket of the exchange on `stream`, its output, and that output's length.
    pub(crate) fn ws_of(&mut self, stream: K) -> Option<(&mut Ws, &mut Vec<u8>, usize)> {
        let i = self.find(stream)?;
        let ex = &mut self.list[i];
        let backlog = ex.unsent.len();
        match &mut ex.produce {
            Some(Produce::Ws(t)) => Some((&mut t.ws, &mut ex.unsent, backlog)),
            _ => None,
        }
    }

    /// Graceful stop: event streams end (their clients reconnect elsewhere); WebSockets
    /// close with 1001 (going away). Returns the ended event streams' ids.
    pub(crate) fn end_event_streams(&mut self, sse: &mut Subscribers) {
        for ex in &mut self.list {
            match &mut ex.produce {
                Some(Produce::Events(_)) => {
                    sse.remove(&ex.stream.id(self.conn, self.gen));
                    ex.end_body();
                }
                Some(Produce::Ws(t)) => {
                    t.ws.conn.close(1001, "server shutting down", &mut ex.unsent);
                    ex.done = true;
                }
                _ => {}
            }
        }
    }
}

/// Request fields handed to the handlers from the stack ([`Exchanges::dispatch`]); a
/// request with more takes one allocation for them.
const STACK_FIELDS: usize = 32;

/// A request's fields as the handlers see them, the same `httparse::Header`s as over
/// HTTP/1.1: `:authority` plays the role of `Host` (a `host` field is then dropped; without
/// it the `host` field counts).
fn handler_fields<H: Head>(head: &H) -> impl Iterator<Item = httparse::Header<'_>> {
    let authority = head.authority();
    let host = authority.map(|a| httparse::Header { name: "host", value: a.as_bytes() });
    let fields = head
        .fields()
        .filter(move |(name, _)| authority.is_none() || *name != "host")
        .map(|(name, value)| httparse::Header { name, value });
    host.into_iter().chain(fields)
}
