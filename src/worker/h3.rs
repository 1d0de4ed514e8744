//! HTTP/3 in the worker: the slot's UDP socket, the QUIC endpoint on it ([`Server`]) and one
//! [`Session`] of exchanges per QUIC connection, beside (not inside) the TCP connection slab.
//!
//! The loop reads datagrams until `WouldBlock` (at most [`READ_BUDGET`] per turn; the rest
//! on the next turn), with GRO where the kernel has it (one receive brings several datagrams
//! of one peer, split by their size here), hands them to the endpoint, turns each
//! connection's [`Event`]s into exchanges of the one service ([`Glue`], the same phases,
//! handlers and rate limits as HTTP/1.1 and HTTP/2), and sends what quinn has to send: quinn
//! builds batches of up to [`GSO_BATCH`] datagrams of one size, each goes out with GSO in one
//! system call (one datagram per call where the kernel or the path lacks it, `sys::udp`). A
//! batch the socket refuses (`WouldBlock`; of one it took in part, the segments not sent) is
//! kept and sent first when the socket is writable; until then no connection is polled for
//! more. quinn's timers and the exchanges' own deadlines (body timeout, SSE heartbeats,
//! tickers) make one deadline the loop waits for.
//!
//! An exchange is keyed by [`ExchangeId::H3`]: `conn` = the connection's handle, `stream` =
//! the QUIC stream id, with a per-session generation: pool completions, bus events and
//! upstream waits find it as they find an HTTP/2 stream. Response bodies go
//! into the connection's per-stream queue while [`H3Conn::may_send`] allows; a download reads
//! its next slice only once the stream (QUIC flow control) took the last one ([`FileBody`]).
//! A request head late past `header_timeout_ms` on its stream, or a body past
//! `body_timeout_ms`, is answered 408 on that stream; a connection with no request stream
//! for `keepalive_timeout_ms` is sent GOAWAY and closed (`http3::conn`).
//!
//! Hand-over: while a predecessor of the slot drains, one worker reads the socket
//! ([`Handover`], `h3_inbox.rs`). A new worker says hello to its siblings' inboxes and reads
//! once they acked, sending each datagram of an acked predecessor's generation to that
//! predecessor's inbox; a worker told hello reads no more (its socket stays registered for
//! writing) and feeds the datagrams its inbox brings to the endpoint like those it read.
//!
//! 0-RTT: a request that arrived in early data and is not GET, HEAD or OPTIONS is answered
//! 425 (`TOO_EARLY`) without reaching a handler. Graceful stop: GOAWAY on every connection,
//! open streams finish, event streams end. This file must not look at routes or write
//! HTTP/3 frames (that is `crate::http3`).

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mio::net::UdpSocket;
use mio::{Interest, Registry};
use quinn_proto::{ConnectionHandle, StreamId, VarInt};

use super::fanout::MAX_BACKLOG;
use super::h3_file::FileBody;

use super::call::CallState;
use super::pool::{Completion, ExchangeId, Pool, Work};
use super::produce::{Events, Ticking, SLICE};
use super::token::Tok;
use super::{Glue, Worker};
use crate::app::{Body, Producer};
use crate::config::Config;
use crate::error::Error;
use crate::http::headers::valid_request_id;
use crate::http::reply::{FileRange, Upstream};
use crate::http::request::{Method, Request};
use crate::http::response::{Delimit, RequestMeta, Response};
use crate::http::service::{Env, Finished, Service, HIGH_WATERMARK};
use crate::http2::{Heads, Priority};
use crate::http3::conn::{ConnLimits, Event, H3Conn};
use crate::http3::head::RequestHead;
use crate::http3::keys::QuicKeys;
use crate::http3::server::{Outgoing, Server};
use crate::http3::setup;
use crate::sys::inbox::{self, Inbox, Msg};
use nix::sys::socket::UnixAddr;

use super::h3_inbox::Handover;

/// What the supervisor hands a worker for HTTP/3: the slot's UDP socket and what the QUIC
/// configuration is built from after fork.
pub struct WorkerH3 {
    /// The slot's UDP socket (bound with `SO_REUSEPORT`, kept by the supervisor).
    pub socket: std::net::UdpSocket,
    /// The slot's index: it is in every connection ID this worker issues.
    pub slot: u16,
    /// The `[tls]` certificate and key.
    pub key: Arc<rustls::sign::CertifiedKey>,
    /// The pre-fork secret the QUIC keys derive from (shared by every worker).
    pub secret: [u8; crate::tls::SECRET_LEN],
    /// The pids of the slot's other workers still alive (a reload's or a memory replacement's
    /// old worker, about to drain; the old supervisor's after `SIGUSR2`): they are asked to
    /// leave the socket to this worker and take their packets from its forwards
    /// (`h3_inbox.rs`).
    pub siblings: Vec<i32>,
}

/// How long past `shutdown_timeout` a replacement waits at most for a predecessor that did
/// not ack its hello (the supervisor's kill grace and some slack).
const SIBLING_SLACK: Duration = Duration::from_secs(5);

/// Datagrams read per turn before the loop serves the rest of its events.
const READ_BUDGET: usize = 256;
/// The receive buffer: the largest UDP payload, or GRO batch.
const RECV_BUF: usize = 65_536;
/// Datagrams quinn puts in one transmit when GSO is in use: as many of the largest size
/// (1 500) as one GSO send carries.
const GSO_BATCH: usize = {
    let n = crate::sys::udp::MAX_GSO_BYTES / 1_500;
    if n < crate::sys::udp::MAX_SEGMENTS {
        n
    } else {
        crate::sys::udp::MAX_SEGMENTS
    }
};
/// Sessions (connections) at which new clients must prove their address (Retry) first, as
/// a share of `limits.max_connections`.
const UNDER_LOAD_SHARE: usize = 2;

/// What produces a streamed body after its head.
enum Produce {
    /// An `/api/events` subscription.
    Events(Events),
    /// Events from a timer.
    Ticker(Ticking),
    /// A byte range of a file, read on the pool slice by slice.
    Download(FileBody),
}

/// Where an exchange is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The request body is arriving.
    Receiving,
    /// A pool job or upstreams are working on the answer.
    Waiting,
    /// The head went out; the body follows from `produce` / `unsent`.
    Streaming,
}

/// One request stream.
struct Exchange {
    stream: StreamId,
    method: Method,
    head: Box<RequestHead>,
    body: Vec<u8>,
    stage: Stage,
    started: Instant,
    /// The whole body within `limits.body_timeout_ms` of the head.
    deadline: Option<Instant>,
    request_id: String,
    label: u16,
    produce: Option<Produce>,
    /// Body bytes produced and not yet in the stream's queue.
    unsent: Vec<u8>,
    /// The body is complete once `unsent` is queued.
    done: bool,
    /// The upstream requests this exchange waits on, or its relay.
    call: Option<CallState>,
}

impl Exchange {
    fn target(&self) -> &str {
        match self.head.path() {
            "" => "/",
            path => path,
        }
    }

    fn produce_deadline(&self) -> Option<Instant> {
        match &self.produce {
            Some(Produce::Events(e)) => Some(e.next()),
            Some(Produce::Ticker(t)) => Some(t.next()),
            _ => None,
        }
    }
}

/// One QUIC connection's exchanges.
struct Session {
    generation: u32,
    peer: IpAddr,
    exchanges: Vec<Exchange>,
}

impl Session {
    fn find(&self, stream: StreamId) -> Option<usize> {
        self.exchanges.iter().position(|e| e.stream == stream)
    }
}

/// The worker's HTTP/3 side.
pub(super) struct H3 {
    socket: UdpSocket,
    server: Server,
    sessions: HashMap<ConnectionHandle, Session>,
    next_generation: u32,
    /// Datagrams the socket refused (`WouldBlock`): sent first once it is writable.
    backlog: std::collections::VecDeque<Outgoing>,
    /// Connections to run and flush at the end of this turn.
    touched: HashSet<ConnectionHandle>,
    /// The read budget ran out with datagrams maybe left in the socket.
    more: bool,
    recv: Vec<u8>,
    /// Receives with GRO (or without, where the kernel lacks it).
    receiver: crate::sys::udp::Receiver,
    heads: Heads,
    /// The earliest quinn timer or exchange deadline.
    deadline: Option<Instant>,
    /// The worker drains: GOAWAY sent on every connection, new ones too.
    draining: bool,
    max_connections: usize,
    /// The slot (in every CID of this worker) and this worker's CID generation.
    slot: u16,
    generation: u8,
    /// What the endpoint is rebuilt from when the generation changes before the first
    /// connection (`settle`).
    keys: QuicKeys,
    server_config: Arc<quinn_proto::ServerConfig>,
    conn_limits: ConnLimits,
    /// The UDP port (in the inbox names of the slot's workers).
    port: u16,
    /// Hand-over messages to and from the slot's other workers (`None`: it could not be
    /// bound; siblings are then waited for until they are gone).
    inbox: Option<Inbox>,
    /// Messages may wait in the inbox.
    inbox_more: bool,
    /// Who reads the slot's socket: this worker, or its successor for it.
    handover: Handover,
    /// What the UDP socket is registered for (`None`: not yet, during the hello phase).
    interest: Option<Interest>,
    /// Forwarded datagrams dropped because a predecessor's inbox was full.
    dropped: u64,
}

impl H3 {
    /// The worker's HTTP/3 side over the slot's socket, registered with `registry`.
    pub(super) fn new(args: WorkerH3, config: &Config, registry: &Registry) -> io::Result<H3> {
        let keys = QuicKeys::derive(&args.secret);
        let limits = setup::Limits::from_config(config);
        // 0-RTT needs a session store (rustls accepts early data only on stateful resumption):
        // the one in shared memory the supervisor made before fork, so a session issued by any
        // worker resumes with 0-RTT on every other, and is taken once across all of them.
        let store = setup::early_data_store(config.http3.early_data);
        let server_config =
            setup::server_config(args.key, &keys, &limits, store).map_err(|e| io::Error::other(e.to_string()))?;
        // This worker's CIDs carry a generation its predecessor's (of the same slot) do not:
        // the low byte of the pid, which differs unless 256 processes were forked between them.
        // (Changed, before the first connection, where an acked predecessor has it: `settle`.)
        let generation = std::process::id() as u8;
        let conn_limits = ConnLimits {
            max_field_section: limits.max_field_section,
            header_timeout: config.limits.header_timeout,
            keepalive: config.limits.keepalive_timeout,
        };
        let server = build_server(&keys, args.slot, generation, &server_config, conn_limits);
        args.socket.set_nonblocking(true)?;
        if !crate::sys::udp::enable_gro(&args.socket) {
            log::debug!("UDP GRO not available: one datagram per receive");
        }
        let port = args.socket.local_addr()?.port();
        let socket = UdpSocket::from_std(args.socket);
        let now = Instant::now();
        // Two readers of one socket would each take the other's packets: predecessors are
        // asked to leave it to this worker (hello), and until each has (ack) or is gone, this
        // worker does not read it.
        let mut handover = Handover::new(&args.siblings, now, config.shutdown_timeout + SIBLING_SLACK);
        let mut inbox = match Inbox::open(port) {
            Ok(inbox) => Some(inbox),
            Err(e) => {
                log::warn!("HTTP/3: no inbox for the hand-over between workers: {e}");
                None
            }
        };
        match &mut inbox {
            Some(inbox) => {
                registry.register(inbox.source(), Tok::Inbox.into(), Interest::READABLE)?;
                for &pid in &args.siblings {
                    if let Err(e) = inbox::address(port, pid).and_then(|to| inbox.hello(&to)) {
                        log::debug!("HTTP/3: hello to worker {pid}: {e}");
                        handover.undelivered(pid);
                    }
                }
            }
            None => handover.without_inbox(now),
        }
        let mut h3 = H3 {
            socket,
            server,
            sessions: HashMap::new(),
            next_generation: 1,
            backlog: Default::default(),
            touched: HashSet::new(),
            more: true,
            recv: vec![0; RECV_BUF],
            receiver: crate::sys::udp::Receiver::new(),
            heads: Heads::new(),
            deadline: None,
            draining: false,
            max_connections: config.limits.max_connections,
            slot: args.slot,
            generation,
            keys,
            server_config,
            conn_limits,
            port,
            inbox,
            inbox_more: true,
            handover,
            interest: None,
            dropped: 0,
        };
        h3.settle(registry);
        Ok(h3)
    }

    /// After the hand-over state changed: at the end of the hello phase, the generation is
    /// chosen (the endpoint rebuilt if an acked predecessor has ours) and the socket
    /// registered; from then on it is registered for reading only while this worker reads
    /// it (writable always: the sends stay on it).
    fn settle(&mut self, registry: &Registry) {
        if !self.handover.started() {
            return;
        }
        if self.interest.is_none() {
            let generation = self.handover.pick(self.generation);
            if generation != self.generation && self.server.is_empty() {
                self.generation = generation;
                self.server = build_server(&self.keys, self.slot, generation, &self.server_config, self.conn_limits);
            }
        }
        let reads = self.handover.reads();
        let want = if reads { Interest::READABLE | Interest::WRITABLE } else { Interest::WRITABLE };
        if self.interest == Some(want) {
            return;
        }
        let done = match self.interest {
            None => registry.register(&mut self.socket, Tok::Udp.into(), want),
            Some(_) => registry.reregister(&mut self.socket, Tok::Udp.into(), want),
        };
        match done {
            Ok(()) => self.interest = Some(want),
            Err(e) => log::error!("HTTP/3: cannot register the UDP socket: {e}"),
        }
        if reads {
            // What queued while another worker read it (the edge may be gone).
            self.more = true;
            log::debug!(
                "worker {}: HTTP/3 reads the slot's socket (generation {})",
                std::process::id(),
                self.generation
            );
        } else {
            self.more = false;
            log::debug!(
                "worker {}: HTTP/3 left the slot's socket to {:?}",
                std::process::id(),
                self.handover.successor()
            );
        }
    }

    /// Takes the inbox's messages (at most [`READ_BUDGET`] this turn): hellos are acked
    /// (this worker stops reading), acks recorded, forwarded packets fed to the endpoint as
    /// if read from the socket.
    fn read_inbox(&mut self, now: Instant, registry: &Registry) {
        let Some(mut inbox) = self.inbox.take() else {
            self.inbox_more = false;
            return;
        };
        let mut buf = std::mem::take(&mut self.recv);
        let mut answers = Vec::new();
        let mut budget = READ_BUDGET;
        self.inbox_more = true;
        while budget > 0 {
            budget -= 1;
            let got = match inbox.recv(&mut buf) {
                Ok(Some(got)) => got,
                Ok(None) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.inbox_more = false;
                    break;
                }
                Err(e) => {
                    log::debug!("HTTP/3 inbox: {e}");
                    continue;
                }
            };
            match got.msg {
                Msg::Hello => {
                    // Only once the ack is out: a successor that got none waits for us to
                    // exit, and we keep reading meanwhile.
                    let Some(from) = got.from else { continue };
                    match inbox.ack(&from, self.generation) {
                        Ok(()) => {
                            log::debug!("HTTP/3: worker {} is our successor", got.pid);
                            self.handover.hello(now, got.pid);
                            self.settle(registry);
                        }
                        Err(e) => log::debug!("HTTP/3: ack to worker {}: {e}", got.pid),
                    }
                }
                Msg::Ack(generation) => {
                    let Ok(addr) = inbox::address(self.port, got.pid) else { continue };
                    if self.handover.acked(now, got.pid, generation, addr, self.generation) {
                        log::debug!("HTTP/3: worker {} (generation {generation}) acked", got.pid);
                        self.settle(registry);
                    }
                }
                Msg::Packet(peer, datagram) => {
                    self.feed(now, peer, datagram, &mut answers);
                }
            }
        }
        self.recv = buf;
        self.inbox = Some(inbox);
        for out in answers {
            self.send(out);
        }
    }

    /// One datagram from `from` into the endpoint (read from the socket or forwarded).
    fn feed(&mut self, now: Instant, from: std::net::SocketAddr, datagram: &[u8], answers: &mut Vec<Outgoing>) {
        let data = BytesMut::from(datagram);
        let Some(ch) = self.server.handle_datagram(now, from, None, None, data, answers) else { return };
        if self.draining && !self.sessions.contains_key(&ch) {
            if let Some(conn) = self.server.conn(ch) {
                conn.go_away(now);
            }
        }
        self.touched.insert(ch);
    }

    /// Sends `datagram` from `from` to the predecessor of `generation` at `to`; `false` when
    /// that predecessor is gone (the datagram is then this worker's to answer).
    fn forward(&mut self, to: &UnixAddr, generation: u8, from: std::net::SocketAddr, datagram: &[u8]) -> bool {
        let Some(inbox) = &self.inbox else { return false };
        match inbox.forward(to, from, datagram) {
            Ok(()) => true,
            Err(e) if inbox::is_gone(&e) => {
                log::debug!("HTTP/3: the worker of generation {generation} is gone; its packets are ours");
                self.handover.forget(generation);
                false
            }
            Err(e) => {
                // A full inbox (EAGAIN): dropped, the peer retransmits; never wait.
                self.dropped += 1;
                log::debug!("HTTP/3: forward to generation {generation}: {e} ({} dropped)", self.dropped);
                true
            }
        }
    }

    /// Whether the loop must run HTTP/3 again this turn (more to read, connections touched).
    pub(super) fn busy(&self) -> bool {
        self.more || self.inbox_more || (!self.touched.is_empty() && self.backlog.is_empty())
    }

    /// The earliest deadline of the HTTP/3 side.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// No connection is left (the drained worker may exit).
    pub(super) fn is_empty(&self) -> bool {
        self.server.is_empty()
    }

    /// Its open QUIC connections.
    pub(super) fn connections(&self) -> usize {
        self.server.len()
    }

    /// Reads datagrams into the endpoint until `WouldBlock` or the budget (in datagrams: a
    /// GRO receive counts as the datagrams it brought). A datagram of an acked predecessor's
    /// connection goes to that predecessor's inbox instead (and counts against the budget too).
    fn read(&mut self, now: Instant) {
        self.more = false;
        let mut budget = READ_BUDGET;
        let mut buf = std::mem::take(&mut self.recv);
        while budget > 0 {
            match self.receiver.recv(&self.socket, &mut buf) {
                Ok(got) => {
                    let mut answers = Vec::new();
                    for datagram in buf[..got.len].chunks(got.segment_size.max(1)) {
                        budget = budget.saturating_sub(1);
                        if let Some(f) = self.handover.route(datagram, self.slot) {
                            let (addr, generation) = (f.addr, f.generation);
                            if self.forward(&addr, generation, got.from, datagram) {
                                continue;
                            }
                        }
                        self.feed(now, got.from, datagram, &mut answers);
                    }
                    for out in answers {
                        self.send(out);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.recv = buf;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors of earlier sends (ECONNREFUSED), a truncated batch: nothing
                    // to do (each counts against the budget).
                    budget -= 1;
                    log::debug!("HTTP/3 recv: {e}");
                }
            }
        }
        self.recv = buf;
        self.more = true;
    }

    /// Sends one datagram, or keeps it (and the rest) for when the socket is writable.
    fn send(&mut self, out: Outgoing) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(out);
            return;
        }
        if let Err(out) = self.send_now(out) {
            self.backlog.push_back(out);
        }
    }

    /// Sends `out` (a batch of datagrams of `segment_size`, with GSO where it can); what the
    /// socket did not take comes back.
    fn send_now(&mut self, out: Outgoing) -> Result<(), Outgoing> {
        let size = out.transmit.size.min(out.bytes.len());
        let segment = out.transmit.segment_size.unwrap_or(size).max(1);
        let dst = out.transmit.destination;
        match crate::sys::udp::send_segments(&self.socket, dst, &out.bytes[..size], segment) {
            Ok(sent) if sent >= size => Ok(()),
            // The socket's buffer filled after `sent` bytes (whole segments): the rest waits.
            Ok(sent) => Err(Outgoing {
                transmit: quinn_proto::Transmit { size: size - sent, ..out.transmit },
                bytes: out.bytes[sent..size].to_vec(),
            }),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(out),
            Err(e) => {
                // ICMP errors of earlier sends, an address gone: QUIC's loss recovery copes.
                log::debug!("HTTP/3 send to {dst}: {e}");
                Ok(())
            }
        }
    }

    /// Sends the kept datagrams; whether all went.
    fn send_backlog(&mut self) -> bool {
        while let Some(out) = self.backlog.pop_front() {
            if let Err(out) = self.send_now(out) {
                self.backlog.push_front(out);
                return false;
            }
        }
        true
    }

    /// Sends what connection `ch` has to send; `false` when the socket is full.
    fn flush(&mut self, now: Instant, ch: ConnectionHandle) -> bool {
        loop {
            if !self.backlog.is_empty() {
                return false;
            }
            let batch = if crate::sys::udp::gso_in_use() { GSO_BATCH } else { 1 };
            let Some(out) = self.server.poll_transmit(now, ch, batch) else { break };
            self.send(out);
        }
        self.server.after_send(ch);
        true
    }
}

/// What a session needs from the worker while it handles events.
struct Cx<'a, 'g> {
    glue: &'a mut Glue<'g>,
    env: &'a mut Env,
    pool: &'a Pool,
    sse: &'a mut super::fanout::Subscribers,
    heads: &'a mut Heads,
    /// Upstream waits to start (the worker owns the upstream sockets).
    starts: &'a mut Vec<(ExchangeId, Upstream)>,
    /// Upstream waits of exchanges that went away, to cancel.
    cancelled: &'a mut Vec<(ExchangeId, CallState)>,
    ch: ConnectionHandle,
    generation: u32,
}

impl Cx<'_, '_> {
    fn id(&self, stream: StreamId) -> ExchangeId {
        exchange_id(self.ch, stream, self.generation)
    }
}

/// The endpoint of worker slot `slot` whose CIDs carry `generation`.
fn build_server(
    keys: &QuicKeys,
    slot: u16,
    generation: u8,
    config: &Arc<quinn_proto::ServerConfig>,
    limits: ConnLimits,
) -> Server {
    let mut server = Server::new(setup::worker_endpoint_config(keys, slot, generation), Arc::clone(config), limits);
    server.set_identity(slot, generation, keys.worker_cids(slot, generation));
    server
}

/// The id of the exchange on stream `stream` of session `ch` (generation `generation`).
fn exchange_id(ch: ConnectionHandle, stream: StreamId, generation: u32) -> ExchangeId {
    ExchangeId::H3 { conn: ch.0, stream: VarInt::from(stream).into_inner(), gen: generation }
}

/// The QUIC connection and stream of the parts of an [`ExchangeId::H3`]. Every such id is made
/// from a [`StreamId`] ([`exchange_id`]), so `stream` is a valid varint; were it not, the
/// largest varint names no open stream and the lookup finds nothing.
fn quic_of(conn: usize, stream: u64) -> (ConnectionHandle, StreamId) {
    (ConnectionHandle(conn), StreamId::from(VarInt::from_u64(stream).unwrap_or(VarInt::MAX)))
}

/// The id answered in `x-request-id`: the client's own when valid, else a fresh UUID.
fn request_id(head: &RequestHead, common: &mut crate::http::headers::Common) -> String {
    match head.fields().find(|(n, _)| *n == b"x-request-id") {
        Some((_, v)) if valid_request_id(v) => String::from_utf8_lossy(v).into_owned(),
        _ => {
            let mut u = [0u8; 36];
            common.uuid(&mut u);
            String::from_utf8_lossy(&u).into_owned()
        }
    }
}

/// Handler fields from the stack up to this many; more take an allocation.
const STACK_FIELDS: usize = 32;

/// The request's fields as the handlers see them (the same `httparse::Header`s as over
/// HTTP/1.1): `:authority` plays the role of `Host`.
fn handler_fields(head: &RequestHead) -> impl Iterator<Item = httparse::Header<'_>> {
    let authority = head.authority();
    let host = authority.map(|a| httparse::Header { name: "host", value: a.as_bytes() });
    let fields = head
        .fields()
        .filter(move |(n, _)| authority.is_none() || *n != b"host")
        // Field names are checked lower-case tokens (ASCII).
        .map(|(n, v)| httparse::Header { name: std::str::from_utf8(n).unwrap_or(""), value: v });
    host.into_iter().chain(fields)
}

/// Session `sess` of connection `conn`: handles what `conn` reported and services the
/// streamed bodies.
fn run_session(sess: &mut Session, conn: &mut H3Conn, cx: &mut Cx<'_, '_>, now: Instant) {
    while let Some(event) = conn.poll_event() {
        match event {
            Event::Request { stream, head } => on_request(sess, conn, stream, head, cx, now),
            Event::TooLarge { stream } => {
                let resp = Error::HeaderTooLarge.into_response(cx.env.development);
                send_whole(conn, cx, stream, resp, b"", false);
            }
            Event::HeadTimeout { stream } => {
                let resp = Error::RequestTimeout.into_response(cx.env.development);
                send_whole(conn, cx, stream, resp, b"", false);
            }
            Event::Data { stream, data } => {
                let Some(i) = sess.find(stream) else { continue };
                let ex = &mut sess.exchanges[i];
                if ex.stage != Stage::Receiving {
                    continue;
                }
                if (ex.body.len() + data.len()) as u64 > cx.env.max_body {
                    fail(sess, conn, i, Error::PayloadTooLarge, cx, now);
                    continue;
                }
                ex.body.extend_from_slice(&data);
            }
            Event::End { stream } => {
                if let Some(i) = sess.find(stream).filter(|&i| sess.exchanges[i].stage == Stage::Receiving) {
                    dispatch(sess, conn, i, cx, now);
                }
            }
            Event::Aborted { stream } => {
                if let Some(i) = sess.find(stream) {
                    remove(sess, i, cx);
                }
            }
            Event::Writable { .. } => {}
            Event::Closed => {
                while !sess.exchanges.is_empty() {
                    remove(sess, 0, cx);
                }
            }
        }
    }
    service(sess, conn, cx, now);
}

fn on_request(
    sess: &mut Session,
    conn: &mut H3Conn,
    stream: StreamId,
    head: Box<RequestHead>,
    cx: &mut Cx<'_, '_>,
    now: Instant,
) {
    let priority = Priority::from_fields(head.fields().filter(|(n, _)| *n == b"priority").map(|(_, v)| v));
    // RFC 9218 urgency 0 (most urgent) .. 7; quinn sends higher priorities first.
    conn.set_priority(stream, 7 - i32::from(priority.urgency.min(7)));
    let ex = Exchange {
        stream,
        method: Method::parse(head.method()),
        request_id: request_id(&head, &mut cx.env.common),
        head,
        body: Vec::new(),
        stage: Stage::Receiving,
        started: now,
        deadline: Some(now + cx.env.body_timeout),
        label: 0,
        produce: None,
        unsent: Vec::new(),
        done: false,
        call: None,
    };
    let early = ex.head.early && !ex.head.safe_for_early_data();
    let declared = ex.head.content_length;
    let connect = ex.head.method() == "CONNECT";
    sess.exchanges.push(ex);
    let i = sess.exchanges.len() - 1;
    if early {
        // RFC 8470: not replay-safe; the client sends it again after the handshake.
        return fail(sess, conn, i, Error::TooEarly, cx, now);
    }
    if declared.is_some_and(|n| n > cx.env.max_body) {
        return fail(sess, conn, i, Error::PayloadTooLarge, cx, now);
    }
    if connect {
        // No extended CONNECT (WebSocket) over HTTP/3, as a plain CONNECT over HTTP/2.
        fail(sess, conn, i, Error::bad_request("CONNECT is not supported"), cx, now);
    }
}

/// The request is complete: hand it to the app.
fn dispatch(sess: &mut Session, conn: &mut H3Conn, i: usize, cx: &mut Cx<'_, '_>, now: Instant) {
    let peer = sess.peer;
    let ex = &mut sess.exchanges[i];
    ex.deadline = None;
    let reply = {
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
            (Some(host), None) if crate::http::target::valid_host(host.value) => {
                let (path, query) = crate::http::target::split_target(ex.target());
                let req = Request {
                    method: ex.method,
                    path,
                    query,
                    http10: false,
                    headers,
                    body: &ex.body,
                    request_id: &ex.request_id,
                    peer,
                    secure: true,
                };
                Ok(cx.glue.call(&req))
            }
            _ => Err(Error::bad_request("missing or repeated Host")),
        }
    };
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return fail(sess, conn, i, e, cx, now),
    };
    let ex = &mut sess.exchanges[i];
    ex.label = cx.glue.label();
    ex.body = Vec::new();
    match reply.body {
        Body::Full => {
            answer(sess, conn, i, reply.head, Delimit::Length, cx);
        }
        Body::Job(job) => {
            ex.stage = Stage::Waiting;
            cx.pool.submit(cx.id(ex.stream), Work::Request(job));
        }
        Body::Producer(p) => {
            if answer(sess, conn, i, reply.head, Delimit::Chunked, cx) {
                start_producer(&mut sess.exchanges[i], p, cx, now);
            }
        }
        Body::File(f) => {
            let len = f.len;
            if answer(sess, conn, i, reply.head, Delimit::Sized(len), cx) {
                let FileRange { file, offset, len } = f;
                let ex = &mut sess.exchanges[i];
                ex.produce = Some(Produce::Download(FileBody::new(file, offset, len)));
                ex.done = len == 0;
            }
        }
        Body::Upstream(up) => {
            ex.stage = Stage::Waiting;
            let id = cx.id(ex.stream);
            cx.starts.push((id, up));
        }
        // A WebSocket needs an extended CONNECT, which HTTP/3 here does not offer.
        Body::WebSocket(_) => fail(sess, conn, i, Error::bad_request("WebSocket needs an extended CONNECT"), cx, now),
    }
}

/// Answers exchange `i` with an error response.
fn fail(sess: &mut Session, conn: &mut H3Conn, i: usize, e: Error, cx: &mut Cx<'_, '_>, _now: Instant) {
    sess.exchanges[i].label = 0;
    let resp = e.into_response(cx.env.development);
    answer(sess, conn, i, resp, Delimit::Length, cx);
}

/// Writes a whole response (head and body) on `stream` without an exchange.
fn send_whole(conn: &mut H3Conn, cx: &mut Cx<'_, '_>, stream: StreamId, mut resp: Response, rid: &[u8], head: bool) {
    let meta = RequestMeta { delimit: Delimit::Length, head, http10: false, keep_alive: true, request_id: rid };
    if let Ok(h) = cx.heads.build(&mut resp, &meta, &mut cx.env.common) {
        let _ = send_head(conn, stream, h, false);
    }
}

/// Queues a built head (its early hints first) and its body; FIN unless the body `follows`.
fn send_head(
    conn: &mut H3Conn,
    stream: StreamId,
    head: crate::http2::Head,
    follows: bool,
) -> Result<(), crate::http3::conn::StreamGone> {
    if let Some(hints) = &head.hints {
        conn.send_head(stream, 103, hints.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())))?;
    }
    conn.send_head(
        stream,
        head.status.as_u16(),
        head.fields.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
    )?;
    if !head.body.is_empty() {
        conn.send_data(stream, head.body)?;
    }
    if !follows {
        conn.finish(stream)?;
    }
    Ok(())
}

/// Sends `resp` on exchange `i`'s stream and logs it. Whole (or `HEAD`): the exchange is
/// forgotten; otherwise its body follows (returns `true`).
fn answer(
    sess: &mut Session,
    conn: &mut H3Conn,
    i: usize,
    mut resp: Response,
    delimit: Delimit,
    cx: &mut Cx<'_, '_>,
) -> bool {
    let ex = &sess.exchanges[i];
    let head_only = ex.method == Method::Head;
    let follows = !head_only && delimit != Delimit::Length;
    let meta =
        RequestMeta { delimit, head: head_only, http10: false, keep_alive: true, request_id: ex.request_id.as_bytes() };
    let (bytes, sent) = match cx.heads.build(&mut resp, &meta, &mut cx.env.common) {
        Ok(head) => (head.body.len(), send_head(conn, ex.stream, head, follows).is_ok()),
        Err(_) => (0, false),
    };
    cx.glue.finished(&Finished {
        method: if ex.method == Method::Other { "OTHER" } else { ex.method.as_str() },
        target: ex.target().as_bytes(),
        status: resp.status,
        bytes,
        elapsed: ex.started.elapsed(),
        request_id: ex.request_id.as_bytes(),
        label: ex.label,
    });
    if !sent {
        conn.reset(Instant::now(), ex.stream, crate::http3::Code::InternalError);
    }
    if follows && sent {
        sess.exchanges[i].stage = Stage::Streaming;
        true
    } else {
        remove(sess, i, cx);
        false
    }
}

/// Exchange `ex`'s head went out; its events come from `p`.
fn start_producer(ex: &mut Exchange, p: Producer, cx: &mut Cx<'_, '_>, now: Instant) {
    let id = cx.id(ex.stream);
    match p {
        Producer::Events { last_event_id, audience } => {
            match Events::start(cx.glue.app, last_event_id, audience, id, cx.sse, cx.pool, &mut ex.unsent, now) {
                Some(e) => ex.produce = Some(Produce::Events(e)),
                None => ex.done = true,
            }
        }
        Producer::Ticker(ticker) => ex.produce = Some(Produce::Ticker(Ticking::new(ticker, now))),
    }
}

/// Forgets exchange `i` (its subscription and upstream wait go too).
fn remove(sess: &mut Session, i: usize, cx: &mut Cx<'_, '_>) {
    let ex = sess.exchanges.swap_remove(i);
    let id = cx.id(ex.stream);
    if matches!(ex.produce, Some(Produce::Events(_))) {
        cx.sse.remove(&id);
    }
    if let Some(call) = ex.call {
        cx.cancelled.push((id, call));
    }
}

/// Moves streaming exchanges' bytes into their streams while the streams take them, asks the
/// pool for download slices as they do, ends finished bodies.
fn service(sess: &mut Session, conn: &mut H3Conn, cx: &mut Cx<'_, '_>, _now: Instant) {
    let mut i = 0;
    while i < sess.exchanges.len() {
        let id = cx.id(sess.exchanges[i].stream);
        let ex = &mut sess.exchanges[i];
        if ex.stage != Stage::Streaming {
            i += 1;
            continue;
        }
        let mut gone = false;
        if let Some(Produce::Download(d)) = &mut ex.produce {
            if let Some(bytes) = d.take() {
                gone = conn.send_data(ex.stream, Bytes::from(bytes)).is_err();
                d.taken(conn.queued(ex.stream) == 0);
            }
            // The next slice once quinn took all of this one (its size follows how it did).
            if !gone && conn.queued(ex.stream) == 0 && conn.may_send(ex.stream) {
                if let Some((at, len, buf)) = d.next_read() {
                    cx.pool.submit(id, Work::Read(Arc::clone(d.file()), at, len, buf));
                }
            }
            if d.done() {
                ex.done = true;
            }
        }
        while !gone && !ex.unsent.is_empty() && conn.may_send(ex.stream) {
            let n = ex.unsent.len().min(SLICE);
            let chunk = if n == ex.unsent.len() {
                Bytes::from(std::mem::take(&mut ex.unsent))
            } else {
                let c = Bytes::copy_from_slice(&ex.unsent[..n]);
                ex.unsent.drain(..n);
                c
            };
            gone = conn.send_data(ex.stream, chunk).is_err();
        }
        if !gone && ex.unsent.len() > MAX_BACKLOG {
            log::warn!("HTTP/3 event stream is not reading; resetting it");
            conn.reset(Instant::now(), ex.stream, crate::http3::Code::RequestCancelled);
            gone = true;
        }
        if !gone && ex.done && ex.unsent.is_empty() {
            let _ = conn.finish(ex.stream);
            gone = true;
        }
        if gone {
            remove(sess, i, cx);
        } else {
            i += 1;
        }
    }
}

/// Heartbeats and ticks that are due.
fn tick(sess: &mut Session, app: &crate::app::App, now: Instant) {
    for ex in &mut sess.exchanges {
        let go = match &mut ex.produce {
            Some(Produce::Events(e)) => e.beat(app, now, &mut ex.unsent),
            Some(Produce::Ticker(t)) => t.tick(now, ex.unsent.len(), &mut ex.unsent).goes_on(),
            _ => true,
        };
        if !go {
            ex.produce = None;
            ex.done = true;
        }
    }
}

/// Builds the [`Cx`] of session `$ch` from the worker's fields (beside the taken-out `H3`).
macro_rules! cx {
    ($w:ident, $h3:ident, $glue:expr, $starts:expr, $cancelled:expr, $ch:expr, $generation:expr) => {
        Cx {
            glue: $glue,
            env: &mut $w.env,
            pool: &$w.pool,
            sse: &mut $w.sse,
            heads: &mut $h3.heads,
            starts: $starts,
            cancelled: $cancelled,
            ch: $ch,
            generation: $generation,
        }
    };
}

impl Worker {
    /// The HTTP/3 side's turn: read (when `readable`), send what waited for the socket, fire
    /// due timers, run every connection that has something to do and send its datagrams.
    pub(super) fn h3_turn(&mut self, readable: bool) {
        let Some(mut h3) = self.h3.take() else { return };
        let now = Instant::now();
        if h3.handover.next_check().is_some_and(|t| t <= now) {
            for pid in h3.handover.check(now, crate::sys::alive) {
                let said = match (&h3.inbox, inbox::address(h3.port, pid)) {
                    (Some(inbox), Ok(to)) => inbox.hello(&to),
                    (None, _) => Err(io::Error::from(io::ErrorKind::NotConnected)),
                    (_, Err(e)) => Err(e),
                };
                if said.is_err() {
                    h3.handover.undelivered(pid);
                }
            }
            h3.settle(self.poll.registry());
        }
        if h3.inbox_more {
            h3.read_inbox(now, self.poll.registry());
        }
        if !h3.handover.reads() {
            h3.more = false;
        } else if readable || h3.more {
            h3.read(now);
        }
        let writable = h3.send_backlog();
        if h3.deadline.is_some_and(|t| t <= now) {
            for ch in h3.server.handle_timeouts(now) {
                h3.touched.insert(ch);
            }
            for (ch, sess) in &mut h3.sessions {
                if sess.exchanges.iter().any(|e| e.produce_deadline().is_some_and(|t| t <= now))
                    || sess.exchanges.iter().any(|e| e.deadline.is_some_and(|t| t <= now))
                {
                    tick(sess, &self.app, now);
                    h3.touched.insert(*ch);
                }
            }
        }
        let live = self.live + h3.server.len();
        self.record.connections.store(live as u64, std::sync::atomic::Ordering::Relaxed);
        h3.server.set_under_load(live >= h3.max_connections / UNDER_LOAD_SHARE);
        if writable {
            let mut starts = Vec::new();
            let mut cancelled = Vec::new();
            let touched: Vec<ConnectionHandle> = h3.touched.drain().collect();
            let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
            let mut full = false;
            for ch in touched {
                if full {
                    h3.touched.insert(ch);
                    continue;
                }
                if h3.server.conn(ch).is_some() && !h3.sessions.contains_key(&ch) {
                    let generation = h3.next_generation;
                    h3.next_generation = h3.next_generation.wrapping_add(1);
                    let peer =
                        h3.server.conn(ch).map_or(IpAddr::from([0, 0, 0, 0]), |c| c.quic().remote_address().ip());
                    h3.sessions.insert(ch, Session { generation, peer, exchanges: Vec::new() });
                }
                if let (Some(conn), Some(sess)) = (h3.server.conn(ch), h3.sessions.get_mut(&ch)) {
                    let generation = sess.generation;
                    let mut cx = cx!(self, h3, &mut glue, &mut starts, &mut cancelled, ch, generation);
                    // Request bodies late past their deadline: 408.
                    while let Some(i) = sess.exchanges.iter().position(|e| e.deadline.is_some_and(|t| t <= now)) {
                        fail(sess, conn, i, Error::RequestTimeout, &mut cx, now);
                    }
                    run_session(sess, conn, &mut cx, now);
                }
                if !h3.flush(now, ch) {
                    full = true;
                    h3.touched.insert(ch);
                }
                if h3.server.conn(ch).is_none() {
                    if let Some(mut sess) = h3.sessions.remove(&ch) {
                        let generation = sess.generation;
                        let mut cx = cx!(self, h3, &mut glue, &mut starts, &mut cancelled, ch, generation);
                        while !sess.exchanges.is_empty() {
                            remove(&mut sess, 0, &mut cx);
                        }
                    }
                }
            }
            self.h3 = Some(h3);
            for (id, call) in cancelled {
                self.cancel_call(id, call);
            }
            for (id, up) in starts {
                self.start_call(id, up);
            }
            for id in self.h3_relays_ready() {
                self.relay_resume(id);
            }
            self.sse_count_changed();
            let Some(h3) = self.h3.as_mut() else { return };
            h3.refresh_deadline();
            return;
        }
        h3.refresh_deadline();
        self.h3 = Some(h3);
    }

    /// A pool job of an HTTP/3 exchange finished.
    pub(super) fn h3_done(&mut self, conn: usize, stream: u64, generation: u32, result: Completion) {
        let Some(mut h3) = self.h3.take() else { return };
        let now = Instant::now();
        let (ch, stream) = quic_of(conn, stream);
        if let (Some(conn), Some(sess)) = (h3.server.conn(ch), h3.sessions.get_mut(&ch)) {
            if sess.generation == generation {
                if let Some(i) = sess.find(stream) {
                    let ex = &mut sess.exchanges[i];
                    match (result, &mut ex.produce) {
                        (Completion::Response(result), _) => {
                            let resp = result.unwrap_or_else(|e| e.into_response(self.env.development));
                            let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
                            let (mut s, mut c) = (Vec::new(), Vec::new());
                            let mut cx = cx!(self, h3, &mut glue, &mut s, &mut c, ch, generation);
                            answer(sess, conn, i, resp, Delimit::Length, &mut cx);
                        }
                        (Completion::Replay(bytes, last), Some(Produce::Events(e))) => {
                            let go = e.replayed(&bytes, last, &mut ex.unsent);
                            if !go {
                                ex.produce = None;
                                ex.done = true;
                            }
                        }
                        (Completion::Chunk(offset, bytes), Some(Produce::Download(d))) => {
                            let arrived = d.arrived(offset, bytes);
                            if !arrived {
                                log::warn!("download read failed; resetting the HTTP/3 stream");
                                ex.produce = None;
                                conn.reset(now, stream, crate::http3::Code::InternalError);
                                sess.exchanges.swap_remove(i);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        h3.touched.insert(ch);
        self.h3 = Some(h3);
    }

    /// A bus notification for an HTTP/3 event stream: queued on its exchange.
    pub(super) fn h3_event(&mut self, conn: usize, stream: u64, generation: u32, event_id: i64, event: &Arc<[u8]>) {
        let Some(h3) = self.h3.as_mut() else { return };
        let (ch, stream) = quic_of(conn, stream);
        let Some(sess) = h3.sessions.get_mut(&ch).filter(|s| s.generation == generation) else { return };
        let Some(i) = sess.find(stream) else { return };
        let ex = &mut sess.exchanges[i];
        let Some(Produce::Events(e)) = &mut ex.produce else { return };
        e.live(event_id, event, &mut ex.unsent);
        h3.touched.insert(ch);
    }

    /// App code behind an HTTP/3 event stream (or relay) failed: end that stream only.
    pub(super) fn h3_abort_exchange(&mut self, conn: usize, stream: u64, generation: u32) {
        self.sse.remove(&ExchangeId::H3 { conn, stream, gen: generation });
        let Some(h3) = self.h3.as_mut() else { return };
        let (ch, stream) = quic_of(conn, stream);
        let Some(sess) = h3.sessions.get_mut(&ch).filter(|s| s.generation == generation) else { return };
        if let Some(i) = sess.find(stream) {
            let ex = &mut sess.exchanges[i];
            ex.produce = None;
            ex.call = None;
            ex.done = true;
            if ex.stage != Stage::Streaming {
                sess.exchanges.swap_remove(i);
                if let Some(conn) = h3.server.conn(ch) {
                    conn.reset(Instant::now(), stream, crate::http3::Code::InternalError);
                }
            }
        }
        h3.touched.insert(ch);
        self.sse_count_changed();
    }

    /// Answers an HTTP/3 exchange that waited on upstreams (`relayed`: a relayed body follows).
    /// Returns whether a body follows.
    pub(super) fn h3_respond_waiting(
        &mut self,
        conn: usize,
        stream: u64,
        generation: u32,
        resp: Response,
        relayed: bool,
    ) -> bool {
        let Some(mut h3) = self.h3.take() else { return false };
        let (ch, stream) = quic_of(conn, stream);
        let mut follows = false;
        if let (Some(conn), Some(sess)) = (h3.server.conn(ch), h3.sessions.get_mut(&ch)) {
            if let Some(i) = sess.find(stream).filter(|_| sess.generation == generation) {
                let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
                let (mut s, mut c) = (Vec::new(), Vec::new());
                let mut cx = cx!(self, h3, &mut glue, &mut s, &mut c, ch, generation);
                let delimit = if relayed { Delimit::Chunked } else { Delimit::Length };
                follows = answer(sess, conn, i, resp, delimit, &mut cx);
            }
        }
        h3.touched.insert(ch);
        self.h3 = Some(h3);
        follows
    }

    /// Relayed events for an HTTP/3 exchange: queued on it.
    pub(super) fn h3_relay_data(&mut self, conn: usize, stream: u64, generation: u32, events: &[u8]) {
        let Some(h3) = self.h3.as_mut() else { return };
        let (ch, stream) = quic_of(conn, stream);
        let Some(sess) = h3.sessions.get_mut(&ch).filter(|s| s.generation == generation) else { return };
        if let Some(i) = sess.find(stream) {
            sess.exchanges[i].unsent.extend_from_slice(events);
            h3.touched.insert(ch);
        }
    }

    /// Whether the relay of an HTTP/3 exchange is behind its client.
    pub(super) fn h3_relay_slow(&mut self, conn: usize, stream: u64, generation: u32) -> bool {
        let Some(h3) = self.h3.as_mut() else { return false };
        let (ch, stream) = quic_of(conn, stream);
        let Some(sess) = h3.sessions.get_mut(&ch).filter(|s| s.generation == generation) else {
            return false;
        };
        sess.find(stream).is_some_and(|i| sess.exchanges[i].unsent.len() > HIGH_WATERMARK)
    }

    /// The relay of an HTTP/3 exchange ended: its body ends once sent.
    pub(super) fn h3_relay_done(&mut self, conn: usize, stream: u64, generation: u32) {
        let Some(h3) = self.h3.as_mut() else { return };
        let (ch, stream) = quic_of(conn, stream);
        let Some(sess) = h3.sessions.get_mut(&ch).filter(|s| s.generation == generation) else { return };
        if let Some(i) = sess.find(stream) {
            let ex = &mut sess.exchanges[i];
            ex.call = None;
            ex.done = true;
            h3.touched.insert(ch);
        }
    }

    /// HTTP/3 relays whose client caught up (their upstream may read again).
    pub(super) fn h3_relays_ready(&self) -> Vec<ExchangeId> {
        let Some(h3) = self.h3.as_ref() else { return Vec::new() };
        let mut out = Vec::new();
        for (ch, sess) in &h3.sessions {
            for ex in &sess.exchanges {
                if matches!(ex.call, Some(CallState::Relay { .. })) && ex.unsent.len() <= HIGH_WATERMARK {
                    out.push(exchange_id(*ch, ex.stream, sess.generation));
                }
            }
        }
        out
    }

    /// The inbox is readable: its messages are taken this turn.
    pub(super) fn h3_inbox_ready(&mut self) {
        if let Some(h3) = self.h3.as_mut() {
            h3.inbox_more = true;
        }
        self.h3_turn(false);
    }

    /// Graceful stop: GOAWAY on every connection; event streams end; open streams finish.
    pub(super) fn h3_drain(&mut self) {
        let Some(h3) = self.h3.as_mut() else { return };
        let now = Instant::now();
        h3.draining = true;
        // While we read the slot's socket (no successor said hello: a graceful stop, or a
        // successor that cannot forward and waits for us to exit), another worker's packets
        // are dropped, not reset, and new clients' first packets left to others. With a
        // successor, only our own packets reach us (forwarded); this matters again if it dies
        // and we read once more.
        h3.server.set_sibling(true, true);
        h3.server.go_away(now);
        for (ch, sess) in &mut h3.sessions {
            for ex in &mut sess.exchanges {
                if matches!(ex.produce, Some(Produce::Events(_))) {
                    self.sse.remove(&exchange_id(*ch, ex.stream, sess.generation));
                    ex.produce = None;
                    ex.done = true;
                }
            }
            h3.touched.insert(*ch);
        }
        for ch in h3.server.handles() {
            h3.touched.insert(ch);
        }
        self.sse_count_changed();
    }
}

impl H3 {
    /// The upstream wait of HTTP/3 exchange `id`, while it is open.
    pub(super) fn call_slot(&mut self, conn: usize, stream: u64, generation: u32) -> Option<&mut Option<CallState>> {
        let (ch, stream) = quic_of(conn, stream);
        let sess = self.sessions.get_mut(&ch).filter(|s| s.generation == generation)?;
        let i = sess.find(stream)?;
        Some(&mut sess.exchanges[i].call)
    }

    /// Recomputes the earliest deadline: quinn's timers, request bodies, producers.
    fn refresh_deadline(&mut self) {
        let quic = self.server.next_timeout();
        let exchanges = self
            .sessions
            .values()
            .flat_map(|s| s.exchanges.iter())
            .filter_map(|e| [e.deadline, e.produce_deadline()].into_iter().flatten().min())
            .min();
        self.deadline = [quic, exchanges, self.handover.next_check()].into_iter().flatten().min();
    }
}
