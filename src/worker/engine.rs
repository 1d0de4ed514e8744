//! The exchange engine: the life of one request/response exchange on a multiplexed
//! connection, written once for HTTP/2 and HTTP/3.
//!
//! A codec's session owns an [`Exchanges`] (its open exchanges, keyed by stream) and a
//! [`Sink`] (its connection's write side). The codec turns what its peer sent into calls
//! here — a head ([`Exchanges::open`]), body bytes ([`Exchanges::data`]), a reset
//! ([`Exchanges::cancel`]) — and the worker hands over what the rest of the loop produced:
//! a pool result ([`Exchanges::completed`]), a bus event ([`Exchanges::event`]), an upstream's
//! answer or relayed bytes. The engine runs the one dispatch (the request to the app through
//! [`Host`]), answers through the sink, starts the body's [`Produce`]r (event stream,
//! ticker, download, WebSocket, relay), keeps each producer under back pressure (nothing is
//! produced into an exchange whose unsent bytes are past the watermark) and ends or cancels
//! the exchange. It never branches on the protocol: what differs between the codecs (how a
//! head and DATA are framed, flow control, how a download reads ahead) is the sink's.
//!
//! What the engine needs done outside the session (upstream requests to start or cancel,
//! rooms a WebSocket joins or leaves) it returns as [`Effect`] values for the worker to
//! carry out after the session's turn.
//!
//! This file must not touch a socket, a connection table or a route, and must not write
//! protocol framing.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::StatusCode;

use super::call::CallState;
use super::download::Download;
use super::h3_file::FileBody;
use super::pool::{Completion, ExchangeId, Pool, Work};
use super::produce::{Events, Subscribers, Tick, Ticking, MAX_BACKLOG};
use super::websocket::{Todo, Ws};
use crate::app::{App, Body, Producer, WebSocket};
use crate::error::Error;
use crate::http::headers::{valid_request_id, Common};
use crate::http::reply::{refusal, FileRange};
use crate::http::request::{Method, Request};
use crate::http::response::{Delimit, RequestMeta, Response};
use crate::http::service::{Env, Finished, Protocol, Service, HIGH_WATERMARK};
use crate::http::target::{split_target, valid_host};
use crate::http2::{Heads, Priority, ResponseFields};
use crate::proto::handshake;

/// A request head as a codec received it.
pub(super) trait Head {
    /// `:method`.
    fn method(&self) -> &str;
    /// `:path` with the query (empty on a plain CONNECT).
    fn path(&self) -> &str;
    /// `:authority`.
    fn authority(&self) -> Option<&str>;
    /// The regular fields in order, names lower-case.
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])>;
    /// The first field named `name`.
    fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// A codec's stream id.
pub(super) trait Key: Copy + Eq {
    /// The worker-wide id of this stream's exchange on connection `conn` (generation `gen`).
    fn id(self, conn: usize, gen: u32) -> ExchangeId;
}

/// Why a stream is reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reset {
    /// The exchange is given up (its client stopped reading).
    Cancel,
    /// The server failed mid-response (a download's file shrank, app code failed).
    Internal,
}

/// The stream is gone (reset, or its connection closed): nothing more can be sent on it.
#[derive(Debug)]
pub(super) struct Gone;

/// A codec's write side, as the engine writes a response through it.
pub(super) trait Sink {
    /// The codec's stream id.
    type Stream: Key;
    /// A `103 Early Hints` head.
    fn informational(&mut self, stream: Self::Stream, fields: &ResponseFields) -> Result<(), Gone>;
    /// The response head; the stream ends with it when `end`.
    fn send_head(
        &mut self,
        stream: Self::Stream,
        status: StatusCode,
        fields: &ResponseFields,
        end: bool,
    ) -> Result<(), Gone>;
    /// Body bytes; the stream ends with them when `end`.
    fn send_data(&mut self, stream: Self::Stream, data: Bytes, end: bool) -> Result<(), Gone>;
    /// Reset the stream.
    fn reset(&mut self, stream: Self::Stream, why: Reset);
    /// The body's producer failed after the head (its app code panicked) and what it made is
    /// sent: end the stream as the codec ends such a body. An empty last frame unless the
    /// codec cuts it short.
    fn abandon(&mut self, stream: Self::Stream) {
        let _ = self.send_data(stream, Bytes::new(), true);
    }
    /// `n` received bytes are consumed: the peer may send as many more (flow control).
    fn release(&mut self, stream: Self::Stream, n: usize);
    /// The producer of a file body, reading ahead as this codec's flow control wants.
    fn file_body(f: FileRange) -> Produce;
    /// Move streaming exchange `ex`'s produced bytes toward its stream as the stream takes
    /// them (its download's read slices too). Returns whether the stream is gone.
    fn feed<H>(&mut self, ex: &mut Exchange<Self::Stream, H>, pool: &Pool, id: ExchangeId) -> bool;
    /// After every exchange was fed: what the codec sends across exchanges (priorities).
    /// Exchanges whose body ended or whose stream failed are marked `gone`. Returns whether
    /// anything was queued.
    fn pump<H>(&mut self, exchanges: &mut [Exchange<Self::Stream, H>], pool: &Pool, conn: usize, gen: u32) -> bool;
}

/// What the engine asks of the service behind it.
pub(super) trait Host: Service {
    /// The app (what event streams and WebSockets produce).
    fn app(&self) -> &App;
    /// A WebSocket opened: it is counted. Returns its largest message.
    fn websocket_opened(&mut self) -> usize;
}

/// What an exchange needs done outside its session, for the worker to carry out.
pub(super) enum Effect {
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
pub(super) struct Cx<'a, V> {
    pub(super) host: &'a mut V,
    pub(super) env: &'a mut Env,
    pub(super) pool: &'a Pool,
    /// The worker's event-stream subscribers.
    pub(super) sse: &'a mut Subscribers,
    /// Builds the response heads.
    pub(super) heads: &'a mut Heads,
}

/// The engine's [`Cx`] from the worker's fields, one by one (so a session
/// borrowed from `conns` or `h3` can live beside it).
macro_rules! engine_cx {
    ($w:ident, $host:expr, $heads:expr) => {
        $crate::worker::engine::Cx { host: $host, env: &mut $w.env, pool: &$w.pool, sse: &mut $w.sse, heads: $heads }
    };
}
pub(super) use engine_cx;

/// Where an exchange is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// The request body is arriving.
    Receiving,
    /// A pool job or upstreams are working on the answer.
    Waiting,
    /// The head went out; the body follows from `produce` / `unsent`.
    Streaming,
}

/// What produces a streamed body after its head.
pub(super) enum Produce {
    /// An `/api/events` subscription.
    Events(Events),
    /// Events from a timer (the chat echo).
    Ticker(Ticking),
    /// A WebSocket over an extended CONNECT (RFC 8441): its frames are the stream's DATA
    /// both ways.
    Ws(Box<Tunnel>),
    /// A byte range of a file, read ahead as the stream's window allows.
    Download(Download),
    /// A byte range of a file, one slice at a time once the stream took the last.
    Slices(FileBody),
}

/// A WebSocket carried by a stream.
pub(super) struct Tunnel {
    pub(super) ws: Ws,
    /// Received bytes not yet read as frames: the start of a frame, or, while the stream's
    /// output is backed up, whole frames waiting.
    input: Vec<u8>,
    /// Bytes of `input` not yet released to the peer's flow control: while the output is
    /// backed up nothing is, so the peer's stream window closes and its frames wait on its
    /// side (back pressure, as an HTTP/1.1 WebSocket stops reading its socket).
    unreleased: usize,
    /// The peer ended its side of the stream.
    peer_ended: bool,
}

impl Produce {
    /// A WebSocket whose frames the codec reads itself (HTTP/1.1 reads them in place from
    /// the connection's input).
    pub(super) fn websocket(ws: Ws) -> Produce {
        Produce::Ws(Box::new(Tunnel { ws, input: Vec::new(), unreleased: 0, peer_ended: false }))
    }

    /// When the producer next has something to do by itself.
    fn deadline(&self) -> Option<Instant> {
        match self {
            Produce::Events(e) => Some(e.next()),
            Produce::Ticker(t) => Some(t.next()),
            Produce::Ws(t) => Some(t.ws.next_ping),
            Produce::Download(_) | Produce::Slices(_) => None,
        }
    }
}

/// The id answered in `x-request-id`: the client's own when it is valid, else a fresh UUID.
pub(super) enum RequestId {
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

    pub(super) fn as_bytes(&self) -> &[u8] {
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
pub(super) struct Exchange<K, H> {
    pub(super) stream: K,
    method: Method,
    /// The head as the codec received it, kept whole.
    pub(super) head: H,
    /// The request body so far.
    body: Vec<u8>,
    pub(super) stage: Stage,
    started: Instant,
    /// The whole body within `limits.body_timeout_ms` of the head.
    pub(super) deadline: Option<Instant>,
    request_id: RequestId,
    label: u16,
    /// The client the service decided on (behind trusted proxies, not always the peer).
    client: Option<IpAddr>,
    pub(super) produce: Option<Produce>,
    /// Body bytes produced and not yet taken by the stream.
    pub(super) unsent: Vec<u8>,
    /// The body is complete once `unsent` is sent.
    pub(super) done: bool,
    /// The upstream requests this exchange waits on, or its relay.
    pub(super) call: Option<CallState>,
    /// An extended CONNECT for `websocket` (RFC 8441): the stream is the tunnel.
    tunnel: bool,
    /// Its `priority` (RFC 9218): the order its body goes out in.
    pub(super) priority: Priority,
    /// Its body ended, or its stream failed, while sending: removed after the pass.
    pub(super) gone: bool,
    /// Body bytes handed to the stream so far.
    pub(super) body_sent: u64,
    /// Its producer's app code failed: once what it made is sent, the body is abandoned
    /// ([`Sink::abandon`]).
    failed: bool,
}

impl<K, H: Head> Exchange<K, H> {
    /// `:path` with the query, for the handler and the access log (`/` for a plain CONNECT).
    fn target(&self) -> &str {
        match self.head.path() {
            "" => "/",
            path => path,
        }
    }
}

impl<K, H> Exchange<K, H> {
    /// Streaming, with bytes to send or a download still reading.
    pub(super) fn streaming(&self) -> bool {
        self.stage == Stage::Streaming
    }

    /// The end of the body: the producer stops, what it made still goes out.
    fn end_body(&mut self) {
        self.produce = None;
        self.done = true;
    }
}

/// How a request is opened ([`Exchanges::open`]).
pub(super) struct Opening<K, H> {
    pub(super) stream: K,
    pub(super) head: H,
    /// Its `priority` field.
    pub(super) priority: Priority,
    /// A body follows the head (its deadline runs).
    pub(super) body_follows: bool,
    /// An extended CONNECT for `websocket`: complete with its head.
    pub(super) tunnel: bool,
}

/// One connection's open exchanges.
pub(super) struct Exchanges<K, H> {
    /// Few; searched linearly.
    pub(super) list: Vec<Exchange<K, H>>,
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
    pub(super) idle_since: Option<Instant>,
    /// What the worker must do after this turn.
    pub(super) effects: Vec<Effect>,
}

impl<K: Key, H: Head> Exchanges<K, H> {
    /// No exchange yet on connection `conn` of generation `gen`, from `peer`, speaking
    /// `protocol` over TLS `tls` (`None`: plain TCP).
    pub(super) fn new(
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
    pub(super) fn gen(&self) -> u32 {
        self.gen
    }

    /// The worker-wide id of the exchange on `stream`.
    pub(super) fn id(&self, stream: K) -> ExchangeId {
        stream.id(self.conn, self.gen)
    }

    /// The index of the exchange on `stream`.
    pub(super) fn find(&self, stream: K) -> Option<usize> {
        self.list.iter().position(|e| e.stream == stream)
    }

    /// No exchange is open.
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The earliest deadline of a request body or a producer.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let producers = self.list.iter().filter_map(|e| e.produce.as_ref()?.deadline());
        self.list.iter().filter_map(|e| e.deadline).chain(producers).min()
    }

    /// A new exchange for a request head; its index. The codec then fails it (a malformed
    /// head) or dispatches it once complete.
    pub(super) fn open(
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
    pub(super) fn adopt(&mut self, stream: K, head: H, stage: Stage, produce: Option<Produce>, now: Instant) -> usize {
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
    pub(super) fn data<S, V>(
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
    pub(super) fn dispatch<S, V>(&mut self, i: usize, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant)
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
    pub(super) fn fail<S, V>(&mut self, i: usize, e: Error, sink: &mut S, cx: &mut Cx<'_, V>, _now: Instant)
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

    /// Send `resp` on exchange `i`'s stream and log it. With `Delimit::Length` (or for
    /// `HEAD`) the response is whole and the exchange is forgotten; otherwise its body
    /// follows (returns `true`).
    pub(super) fn answer<S, V>(
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
    pub(super) fn start_producer<V: Host>(&mut self, i: usize, p: Producer, cx: &mut Cx<'_, V>, now: Instant) {
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
    pub(super) fn remove(&mut self, i: usize, sse: &mut Subscribers) {
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
    pub(super) fn cancel(&mut self, stream: K, sse: &mut Subscribers) -> bool {
        match self.find(stream) {
            Some(i) => {
                self.remove(i, sse);
                true
            }
            None => false,
        }
    }

    /// The connection closed: every exchange goes.
    pub(super) fn close_all(&mut self, sse: &mut Subscribers) {
        while !self.list.is_empty() {
            self.remove(0, sse);
        }
    }

    /// Reset the exchange on `stream` and forget it.
    pub(super) fn drop_stream<S: Sink<Stream = K>>(
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
    pub(super) fn service<S, V>(&mut self, sink: &mut S, cx: &mut Cx<'_, V>) -> bool
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
    pub(super) fn tick(&mut self, host: &impl Host, now: Instant) {
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
    pub(super) fn expire<S, V>(&mut self, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant)
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        while let Some(i) = self.list.iter().position(|e| e.deadline.is_some_and(|t| t <= now)) {
            self.fail(i, Error::RequestTimeout, sink, cx, now);
        }
    }

    /// A pool result for the exchange on `stream`: its answer, a replay or a download slice.
    pub(super) fn completed<S, V>(&mut self, stream: K, result: Completion, sink: &mut S, cx: &mut Cx<'_, V>)
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
    pub(super) fn event(&mut self, stream: K, id: i64, event: &Arc<[u8]>) {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.list[i];
        if let Some(Produce::Events(e)) = &mut ex.produce {
            e.live(id, event, &mut ex.unsent);
        }
    }

    /// App code behind the body of the exchange on `stream` failed: a body already begun
    /// ends with what was sent; an exchange not yet answered is reset.
    pub(super) fn abort<S: Sink<Stream = K>>(&mut self, stream: K, sink: &mut S, sse: &mut Subscribers) {
        let Some(i) = self.find(stream) else { return };
        let ex = &mut self.list[i];
        ex.call = None;
        ex.end_body();
        if ex.stage != Stage::Streaming {
            self.drop_stream(stream, Reset::Internal, sink, sse);
        }
    }

    /// Relayed bytes for the exchange on `stream`: queued on it.
    pub(super) fn relay_data(&mut self, stream: K, bytes: &[u8]) -> bool {
        let Some(i) = self.find(stream) else { return false };
        self.list[i].unsent.extend_from_slice(bytes);
        true
    }

    /// Whether the exchange on `stream` is behind its client (its relay pauses).
    pub(super) fn relay_slow(&self, stream: K) -> bool {
        self.find(stream).is_some_and(|i| self.list[i].unsent.len() > HIGH_WATERMARK)
    }

    /// The relay of the exchange on `stream` ended: its body ends once sent.
    pub(super) fn relay_done(&mut self, stream: K) {
        if let Some(i) = self.find(stream) {
            self.list[i].call = None;
            self.list[i].done = true;
        }
    }

    /// Relayed exchanges whose client caught up (their upstream may read again).
    pub(super) fn relays_ready(&self) -> impl Iterator<Item = ExchangeId> + '_ {
        self.list
            .iter()
            .filter(|e| matches!(e.call, Some(CallState::Relay { .. })) && e.unsent.len() <= HIGH_WATERMARK)
            .map(|e| e.stream.id(self.conn, self.gen))
    }

    /// The upstream wait of the exchange on `stream`, while it is open.
    pub(super) fn call_slot(&mut self, stream: K) -> Option<&mut Option<CallState>> {
        let i = self.find(stream)?;
        Some(&mut self.list[i].call)
    }

    /// The WebSocket of the exchange on `stream`, its output, and that output's length.
    pub(super) fn ws_of(&mut self, stream: K) -> Option<(&mut Ws, &mut Vec<u8>, usize)> {
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
    pub(super) fn end_event_streams(&mut self, sse: &mut Subscribers) {
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

/// Send a built head on `stream`: its early hints, the head, and what of its body it holds
/// (`follows`: the body comes later, the stream stays open).
pub(super) fn send_head<S: Sink>(
    sink: &mut S,
    stream: S::Stream,
    head: crate::http2::Head,
    follows: bool,
) -> Result<(), Gone> {
    if let Some(hints) = head.hints {
        sink.informational(stream, &hints)?;
    }
    let end = head.body.is_empty() && !follows;
    sink.send_head(stream, head.status, &head.fields, end)?;
    if !head.body.is_empty() {
        sink.send_data(stream, head.body, !follows)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::reply::{Assembled, Call, Reply, Ticker, Upstream};
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    /// A stream id of the test sink.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct S(u32);

    impl Key for S {
        fn id(self, conn: usize, gen: u32) -> ExchangeId {
            ExchangeId::H2 { conn, stream: self.0, gen }
        }
    }

    /// A request head: method, path, fields (with `host`).
    struct TestHead(&'static str, &'static str);

    impl Head for TestHead {
        fn method(&self) -> &str {
            self.0
        }
        fn path(&self) -> &str {
            self.1
        }
        fn authority(&self) -> Option<&str> {
            Some("example.test")
        }
        fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
            std::iter::empty()
        }
    }

    /// What the engine wrote, in order.
    #[derive(Debug, PartialEq, Eq)]
    enum Wrote {
        Head(u32, u16, bool),
        Data(u32, usize, bool),
        Reset(u32, Reset),
        Abandoned(u32),
    }

    /// A sink that records what it is given and takes at most `room` body bytes per feed;
    /// with `cuts`, a failed body is cut short rather than ended.
    #[derive(Default)]
    struct TestSink {
        wrote: Vec<Wrote>,
        room: usize,
        cuts: bool,
    }

    impl Sink for TestSink {
        type Stream = S;
        fn informational(&mut self, _: S, _: &ResponseFields) -> Result<(), Gone> {
            Ok(())
        }
        fn send_head(&mut self, s: S, status: StatusCode, _: &ResponseFields, end: bool) -> Result<(), Gone> {
            self.wrote.push(Wrote::Head(s.0, status.as_u16(), end));
            Ok(())
        }
        fn send_data(&mut self, s: S, data: Bytes, end: bool) -> Result<(), Gone> {
            self.wrote.push(Wrote::Data(s.0, data.len(), end));
            Ok(())
        }
        fn reset(&mut self, s: S, why: Reset) {
            self.wrote.push(Wrote::Reset(s.0, why));
        }
        fn abandon(&mut self, s: S) {
            if self.cuts {
                self.wrote.push(Wrote::Abandoned(s.0));
            } else {
                let _ = self.send_data(s, Bytes::new(), true);
            }
        }
        fn release(&mut self, _: S, _: usize) {}
        fn file_body(f: FileRange) -> Produce {
            Produce::Download(Download::new(f.file, f.offset, f.len, false))
        }
        fn feed<H>(&mut self, ex: &mut Exchange<S, H>, _: &Pool, _: ExchangeId) -> bool {
            let n = ex.unsent.len().min(self.room);
            if n > 0 {
                ex.unsent.drain(..n);
                self.wrote.push(Wrote::Data(ex.stream.0, n, false));
            }
            false
        }
        fn pump<H>(&mut self, _: &mut [Exchange<S, H>], _: &Pool, _: usize, _: u32) -> bool {
            false
        }
    }

    /// A service answering every request with what `reply` makes.
    struct TestHost {
        reply: Box<dyn FnMut() -> Reply>,
        finished: Vec<u16>,
    }

    impl Service for TestHost {
        fn call(&mut self, _: &Request<'_>) -> Reply {
            (self.reply)()
        }
        fn finished(&mut self, done: &Finished<'_>) {
            self.finished.push(done.status);
        }
    }

    impl Host for TestHost {
        fn app(&self) -> &App {
            unreachable!("these tests run no event stream or WebSocket")
        }
        fn websocket_opened(&mut self) -> usize {
            1 << 20
        }
    }

    /// The engine's `Cx` from a bench's fields.
    macro_rules! bench_cx {
        ($b:ident) => {
            Cx { host: &mut $b.host, env: &mut $b.env, pool: &$b.pool, sse: &mut $b.sse, heads: &mut $b.heads }
        };
    }

    /// Everything an engine test drives: the exchanges, sink, host and what `Cx` borrows.
    struct Bench {
        ex: Exchanges<S, TestHead>,
        sink: TestSink,
        host: TestHost,
        env: Env,
        pool: Pool,
        sse: Subscribers,
        heads: Heads,
        _poll: mio::Poll,
    }

    impl Bench {
        fn new(reply: impl FnMut() -> Reply + 'static) -> Bench {
            let poll = mio::Poll::new().expect("poll");
            let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker"));
            Bench {
                ex: Exchanges::new(1, 7, IpAddr::from([127, 0, 0, 1]), Protocol::Http2, None, false, Instant::now()),
                sink: TestSink { wrote: Vec::new(), room: usize::MAX, cuts: false },
                host: TestHost { reply: Box::new(reply), finished: Vec::new() },
                env: Env::testing(),
                pool: Pool::new(1, waker).expect("pool"),
                sse: Subscribers::new(),
                heads: Heads::new(),
                _poll: poll,
            }
        }

        /// Open a complete request on `stream` and dispatch it.
        fn request(&mut self, stream: u32, method: &'static str) {
            let o = Opening {
                stream: S(stream),
                head: TestHead(method, "/x"),
                priority: Priority::default(),
                body_follows: false,
                tunnel: false,
            };
            let now = Instant::now();
            let i = self.ex.open(o, &mut self.env.common, self.env.body_timeout, now);
            let mut cx = bench_cx!(self);
            self.ex.dispatch(i, &mut self.sink, &mut cx, now);
        }

        fn service(&mut self) {
            let mut cx = Cx {
                host: &mut self.host,
                env: &mut self.env,
                pool: &self.pool,
                sse: &mut self.sse,
                heads: &mut self.heads,
            };
            self.ex.service(&mut self.sink, &mut cx);
        }
    }

    /// A ticker that counts its ticks, writes `size` bytes each, and panics when `boom`.
    struct Counting {
        ticks: Rc<Cell<usize>>,
        size: usize,
        boom: bool,
    }

    impl Ticker for Counting {
        fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration> {
            assert!(!self.boom, "ticker failure");
            self.ticks.set(self.ticks.get() + 1);
            out.resize(out.len() + self.size, b'x');
            Some(Duration::ZERO)
        }
    }

    fn ticker(ticks: &Rc<Cell<usize>>, size: usize, boom: bool) -> Reply {
        let t = Counting { ticks: Rc::clone(ticks), size, boom };
        Reply { head: Response::new(200), body: Body::Producer(Producer::Ticker(Box::new(t))) }
    }

    /// A bench whose every request gets a [`Counting`] ticker, and its tick count.
    fn ticker_bench(size: usize, boom: bool) -> (Rc<Cell<usize>>, Bench) {
        let ticks = Rc::new(Cell::new(0));
        let t = Rc::clone(&ticks);
        (ticks, Bench::new(move || ticker(&t, size, boom)))
    }

    fn file() -> Arc<std::fs::File> {
        Arc::new(std::fs::File::open("/dev/null").expect("/dev/null"))
    }

    #[test]
    fn a_job_that_completes_after_its_stream_was_reset_sends_nothing() {
        let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
        b.request(1, "GET");
        assert_eq!(b.ex.list[0].stage, Stage::Waiting);
        assert!(b.ex.cancel(S(1), &mut b.sse));
        let mut cx = bench_cx!(b);
        b.ex.completed(S(1), Completion::Response(Ok(Response::new(200))), &mut b.sink, &mut cx);
        assert!(b.sink.wrote.is_empty(), "nothing for a gone stream: {:?}", b.sink.wrote);
        assert!(b.ex.is_empty());
    }

    #[test]
    fn a_job_that_completes_is_answered_whole() {
        let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
        b.request(3, "GET");
        let mut cx = bench_cx!(b);
        b.ex.completed(S(3), Completion::Response(Ok(Response::static_json(b"{}"))), &mut b.sink, &mut cx);
        assert_eq!(b.sink.wrote, [Wrote::Head(3, 200, false), Wrote::Data(3, 2, true)]);
        assert_eq!(b.host.finished, [200]);
        assert!(b.ex.is_empty());
    }

    #[test]
    fn head_gets_no_body_whatever_the_body_kind() {
        let ticks = Rc::new(Cell::new(0));
        let t = Rc::clone(&ticks);
        let kinds: Vec<Box<dyn Fn() -> Reply>> = vec![
            Box::new(|| Reply::full(Response::static_json(b"{\"a\":1}"))),
            Box::new(|| Reply {
                head: Response::new(200),
                body: Body::File(FileRange { file: file(), offset: 0, len: 10 }),
            }),
            Box::new(move || ticker(&t, 5, false)),
        ];
        for kind in kinds {
            let mut b = Bench::new(kind);
            b.request(5, "HEAD");
            assert_eq!(b.sink.wrote, [Wrote::Head(5, 200, true)], "a HEAD answer is its head alone");
            assert!(b.ex.is_empty(), "and the exchange is over");
        }
        assert_eq!(ticks.get(), 0, "no producer runs for a HEAD");
    }

    #[test]
    fn a_ticker_is_held_back_while_its_stream_is_backed_up() {
        let (ticks, mut b) = ticker_bench(HIGH_WATERMARK + 1, false);
        b.sink.room = 0;
        b.request(1, "GET");
        assert_eq!(b.sink.wrote, [Wrote::Head(1, 200, false)]);
        let now = Instant::now();
        b.ex.tick(&b.host, now);
        assert_eq!(ticks.get(), 1);
        // The stream takes nothing: past the watermark, the ticker is not asked again.
        b.service();
        b.ex.tick(&b.host, now + Duration::from_secs(1));
        assert_eq!(ticks.get(), 1, "held back");
        // Once the stream took the bytes, it ticks again.
        b.sink.room = usize::MAX;
        b.service();
        b.ex.tick(&b.host, now + Duration::from_secs(2));
        assert_eq!(ticks.get(), 2, "goes on once drained");
    }

    #[test]
    fn a_ticker_that_panics_ends_its_body_and_its_exchange() {
        let (_, mut b) = ticker_bench(1, true);
        b.request(9, "GET");
        b.ex.tick(&b.host, Instant::now());
        assert!(b.ex.list[0].done, "the body ends");
        b.service();
        assert_eq!(b.sink.wrote.last(), Some(&Wrote::Data(9, 0, true)), "with an empty last frame");
        assert!(b.ex.is_empty());
    }

    #[test]
    fn a_relay_behind_its_client_pauses_until_its_bytes_drain() {
        let call = || Reply {
            head: Response::new(200),
            body: Body::Upstream(Upstream::Call(Call {
                requests: Vec::new(),
                finish: Box::new(|_| Ok(Assembled::Now(Response::new(200)))),
            })),
        };
        let mut b = Bench::new(call);
        b.request(1, "GET");
        assert!(matches!(b.ex.effects.as_slice(), [Effect::Start(ExchangeId::H2 { conn: 1, stream: 1, gen: 7 }, _)]));
        b.ex.effects.clear();
        let follows = {
            let mut cx = bench_cx!(b);
            b.ex.answer(0, Response::new(200), Delimit::Chunked, &mut b.sink, &mut cx)
        };
        assert!(follows);
        b.sink.room = 0;
        assert!(b.ex.relay_data(S(1), &vec![0; HIGH_WATERMARK + 1]));
        assert!(b.ex.relay_slow(S(1)));
        b.sink.room = usize::MAX;
        b.service();
        assert!(!b.ex.relay_slow(S(1)), "drained");
        b.ex.relay_done(S(1));
        b.service();
        assert!(b.ex.is_empty(), "the body ended once sent");
    }

    #[test]
    fn a_reset_exchange_hands_its_upstream_wait_back_to_be_cancelled() {
        let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
        b.request(1, "GET");
        let slot = b.ex.call_slot(S(1)).expect("open");
        *slot = Some(CallState::Gather {
            ups: Vec::new(),
            results: Vec::new(),
            waiting: 1,
            finish: Box::new(|_| Ok(Assembled::Now(Response::new(200)))),
        });
        b.ex.cancel(S(1), &mut b.sse);
        assert!(matches!(b.ex.effects.as_slice(), [Effect::Cancel(ExchangeId::H2 { stream: 1, .. }, _)]));
    }

    #[test]
    fn a_client_that_stops_reading_is_reset_past_the_backlog() {
        let (_, mut b) = ticker_bench(MAX_BACKLOG + 1, false);
        b.sink.room = 0;
        b.request(1, "GET");
        b.ex.tick(&b.host, Instant::now());
        b.service();
        assert_eq!(b.sink.wrote.last(), Some(&Wrote::Reset(1, Reset::Cancel)));
        assert!(b.ex.is_empty());
    }

    #[test]
    fn a_body_deadline_and_a_producer_deadline_both_count() {
        let (_, mut b) = ticker_bench(1, false);
        let now = Instant::now();
        let o = Opening {
            stream: S(1),
            head: TestHead("POST", "/x"),
            priority: Priority::default(),
            body_follows: true,
            tunnel: false,
        };
        b.ex.open(o, &mut b.env.common, b.env.body_timeout, now);
        assert_eq!(b.ex.deadline(), Some(now + b.env.body_timeout), "a body still arriving is timed");
        b.request(3, "GET");
        assert!(b.ex.deadline().is_some_and(|t| t <= now + Duration::from_millis(100)), "and so is a ticker");
    }

    #[test]
    fn a_body_past_the_limit_is_answered_413() {
        let mut b = Bench::new(|| Reply::full(Response::new(200)));
        let o = Opening {
            stream: S(1),
            head: TestHead("POST", "/x"),
            priority: Priority::default(),
            body_follows: true,
            tunnel: false,
        };
        let now = Instant::now();
        b.ex.open(o, &mut b.env.common, b.env.body_timeout, now);
        let limit = b.env.max_body as usize;
        let mut cx = bench_cx!(b);
        b.ex.data(S(1), &vec![0; limit + 1], false, &mut b.sink, &mut cx, now);
        assert!(matches!(b.sink.wrote.first(), Some(Wrote::Head(1, 413, _))));
        assert!(b.ex.is_empty());
    }

    #[test]
    fn a_ticker_that_panics_is_abandoned_where_the_codec_cuts_a_failed_body_short() {
        let (_, mut b) = ticker_bench(1, true);
        b.sink.cuts = true;
        b.request(9, "GET");
        b.ex.tick(&b.host, Instant::now());
        b.service();
        assert_eq!(b.sink.wrote.last(), Some(&Wrote::Abandoned(9)), "no clean end: {:?}", b.sink.wrote);
        assert!(b.ex.is_empty());
    }

    #[test]
    fn an_adopted_exchange_runs_its_body_and_ends_without_a_head() {
        let mut b = Bench::new(|| Reply::full(Response::new(200)));
        let now = Instant::now();
        let t = Counting { ticks: Rc::new(Cell::new(0)), size: 3, boom: false };
        let i = b.ex.adopt(S(1), TestHead("GET", "/x"), Stage::Streaming, None, now);
        let mut cx = bench_cx!(b);
        b.ex.start_producer(i, Producer::Ticker(Box::new(t)), &mut cx, now);
        b.ex.tick(&b.host, now);
        b.service();
        assert_eq!(b.sink.wrote, [Wrote::Data(1, 3, false)], "the codec wrote the head: the body only");
        let done = b.ex.adopt(
            S(3),
            TestHead("GET", "/f"),
            Stage::Streaming,
            Some(TestSink::file_body(FileRange { file: file(), offset: 0, len: 0 })),
            now,
        );
        assert!(b.ex.list[done].done, "an empty file body is complete at once");
        b.service();
        assert_eq!(b.sink.wrote.last(), Some(&Wrote::Data(3, 0, true)), "and ends");
        assert!(b.host.finished.is_empty(), "the codec logged those exchanges, not the engine");
    }

    #[test]
    fn an_adopted_wait_holds_its_upstreams_until_it_goes() {
        let mut b = Bench::new(|| Reply::full(Response::new(200)));
        b.ex.adopt(S(1), TestHead("GET", "/x"), Stage::Waiting, None, Instant::now());
        *b.ex.call_slot(S(1)).expect("open") = Some(CallState::Gather {
            ups: Vec::new(),
            results: Vec::new(),
            waiting: 1,
            finish: Box::new(|_| Ok(Assembled::Now(Response::new(200)))),
        });
        b.service();
        assert!(b.sink.wrote.is_empty() && !b.ex.is_empty(), "nothing streams while it waits");
        b.ex.close_all(&mut b.sse);
        assert!(matches!(b.ex.effects.as_slice(), [Effect::Cancel(ExchangeId::H2 { stream: 1, .. }, _)]));
    }
}
