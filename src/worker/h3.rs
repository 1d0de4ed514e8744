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
//! upstream waits find it as they find an HTTP/2 stream. The exchanges are the engine's
//! (`engine.rs`: dispatch, answers, producers), written through [`H3Conn`] as their `Sink`:
//! response bodies go into the connection's per-stream queue while [`H3Conn::may_send`]
//! allows; a download reads
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

use super::engine::{self, engine_cx, Cx, Exchange, Exchanges, Gone, Key, Opening, Produce, Reset, Sink};
use super::h3_file::FileBody;
use super::pool::{ExchangeId, Pool, Work};
use super::produce::SLICE;
use super::token::Tok;
use super::{Glue, Worker};
use crate::config::Config;
use crate::error::Error;
use crate::http::reply::FileRange;
use crate::http::response::{Delimit, RequestMeta};
use crate::http::service::Protocol;
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

/// One QUIC connection's exchanges.
type Session = Exchanges<StreamId, Box<RequestHead>>;

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

impl Key for StreamId {
    fn id(self, conn: usize, gen: u32) -> ExchangeId {
        ExchangeId::H3 { conn, stream: VarInt::from(self).into_inner(), gen }
    }
}

/// The QUIC connection and stream of the parts of an [`ExchangeId::H3`]. Every such id is made
/// from a [`StreamId`] ([`Key::id`]), so `stream` is a valid varint; were it not, the largest
/// varint names no open stream and the lookup finds nothing.
fn quic_of(conn: usize, stream: u64) -> (ConnectionHandle, StreamId) {
    (ConnectionHandle(conn), StreamId::from(VarInt::from_u64(stream).unwrap_or(VarInt::MAX)))
}

impl engine::Head for Box<RequestHead> {
    fn method(&self) -> &str {
        RequestHead::method(self)
    }

    fn path(&self) -> &str {
        RequestHead::path(self)
    }

    fn authority(&self) -> Option<&str> {
        RequestHead::authority(self)
    }

    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        // Field names are checked lower-case tokens (ASCII).
        RequestHead::fields(self).map(|(n, v)| (std::str::from_utf8(n).unwrap_or(""), v))
    }
}

impl Sink for H3Conn {
    type Stream = StreamId;

    fn informational(&mut self, stream: StreamId, fields: http::HeaderMap) -> Result<(), Gone> {
        self.send_head(stream, 103, fields.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))).map_err(|_| Gone)
    }

    fn send_head(
        &mut self,
        stream: StreamId,
        status: http::StatusCode,
        fields: http::HeaderMap,
        end: bool,
    ) -> Result<(), Gone> {
        H3Conn::send_head(
            self,
            stream,
            status.as_u16(),
            fields.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        )
        .map_err(|_| Gone)?;
        if end {
            self.finish(stream).map_err(|_| Gone)?;
        }
        Ok(())
    }

    fn send_data(&mut self, stream: StreamId, data: Bytes, end: bool) -> Result<(), Gone> {
        if !data.is_empty() {
            H3Conn::send_data(self, stream, data).map_err(|_| Gone)?;
        }
        if end {
            self.finish(stream).map_err(|_| Gone)?;
        }
        Ok(())
    }

    fn reset(&mut self, stream: StreamId, why: Reset) {
        let code = match why {
            Reset::Cancel => crate::http3::Code::RequestCancelled,
            Reset::Internal => crate::http3::Code::InternalError,
        };
        H3Conn::reset(self, Instant::now(), stream, code);
    }

    /// QUIC's stream windows are quinn's: what arrived is already consumed.
    fn release(&mut self, _stream: StreamId, _n: usize) {}

    fn file_body(f: FileRange) -> Produce {
        Produce::Slices(FileBody::new(f.file, f.offset, f.len))
    }

    /// A download's read slice goes into the stream's queue, and the next is read once
    /// quinn took all of it (its size follows how it did); produced bytes go in while the
    /// stream may send.
    fn feed<H>(&mut self, ex: &mut Exchange<StreamId, H>, pool: &Pool, id: ExchangeId) -> bool {
        let mut gone = false;
        if let Some(Produce::Slices(d)) = &mut ex.produce {
            if let Some(bytes) = d.take() {
                gone = H3Conn::send_data(self, ex.stream, Bytes::from(bytes)).is_err();
                d.taken(self.queued(ex.stream) == 0);
            }
            if !gone && self.queued(ex.stream) == 0 && self.may_send(ex.stream) {
                if let Some((at, len, buf)) = d.next_read() {
                    pool.submit(id, Work::Read(Arc::clone(d.file()), at, len, buf));
                }
            }
            if d.done() {
                ex.done = true;
            }
        }
        while !gone && !ex.unsent.is_empty() && self.may_send(ex.stream) {
            let n = ex.unsent.len().min(SLICE);
            let chunk = if n == ex.unsent.len() {
                Bytes::from(std::mem::take(&mut ex.unsent))
            } else {
                let c = Bytes::copy_from_slice(&ex.unsent[..n]);
                ex.unsent.drain(..n);
                c
            };
            gone = H3Conn::send_data(self, ex.stream, chunk).is_err();
        }
        gone
    }

    /// quinn sends the streams' queues in their priority order itself.
    fn pump<H>(&mut self, _: &mut [Exchange<StreamId, H>], _: &Pool, _: usize, _: u32) -> bool {
        false
    }
}

/// Writes a whole error response on `stream`, which has no exchange (its head was too large
/// or late).
fn send_whole(conn: &mut H3Conn, cx: &mut Cx<'_, Glue<'_>>, stream: StreamId, e: Error) {
    let mut resp = e.into_response(cx.env.development);
    let meta = RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"" };
    if let Ok(h) = cx.heads.build(&mut resp, &meta, &mut cx.env.common) {
        let _ = engine::send_head(conn, stream, h, false);
    }
}

/// Session `sess` of connection `conn`: handles what `conn` reported and services the
/// streamed bodies.
fn run_session(sess: &mut Session, conn: &mut H3Conn, cx: &mut Cx<'_, Glue<'_>>, now: Instant) {
    while let Some(event) = conn.poll_event() {
        match event {
            Event::Request { stream, head } => on_request(sess, conn, stream, head, cx, now),
            Event::TooLarge { stream } => send_whole(conn, cx, stream, Error::HeaderTooLarge),
            Event::HeadTimeout { stream } => send_whole(conn, cx, stream, Error::RequestTimeout),
            Event::Data { stream, data } => sess.data(stream, &data, false, conn, cx, now),
            Event::End { stream } => sess.data(stream, &[], true, conn, cx, now),
            Event::Aborted { stream } => {
                sess.cancel(stream, cx.sse);
            }
            Event::Writable { .. } => {}
            Event::Closed => sess.close_all(cx.sse),
        }
    }
    sess.service(conn, cx);
}

fn on_request(
    sess: &mut Session,
    conn: &mut H3Conn,
    stream: StreamId,
    head: Box<RequestHead>,
    cx: &mut Cx<'_, Glue<'_>>,
    now: Instant,
) {
    let priority = Priority::from_fields(head.fields().filter(|(n, _)| *n == b"priority").map(|(_, v)| v));
    // RFC 9218 urgency 0 (most urgent) .. 7; quinn sends higher priorities first.
    conn.set_priority(stream, 7 - i32::from(priority.urgency.min(7)));
    let early = head.early && !head.safe_for_early_data();
    let declared = head.content_length;
    let connect = head.method() == "CONNECT";
    // The end of the stream is an event of its own: a body may always follow.
    let opening = Opening { stream, head, priority, body_follows: true, tunnel: false };
    let i = sess.open(opening, &mut cx.env.common, cx.env.body_timeout, now);
    if early {
        // RFC 8470: not replay-safe; the client sends it again after the handshake.
        return sess.fail(i, Error::TooEarly, conn, cx, now);
    }
    if declared.is_some_and(|n| n > cx.env.max_body) {
        return sess.fail(i, Error::PayloadTooLarge, conn, cx, now);
    }
    if connect {
        // No extended CONNECT (WebSocket) over HTTP/3, as a plain CONNECT over HTTP/2.
        sess.fail(i, Error::bad_request("CONNECT is not supported"), conn, cx, now);
    }
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
            let glue = Glue::new(&self.app, self.config, self.record, self.metrics);
            for (ch, sess) in &mut h3.sessions {
                if sess.deadline().is_some_and(|t| t <= now) {
                    sess.tick(&glue, now);
                    h3.touched.insert(*ch);
                }
            }
        }
        let live = self.live + h3.server.len();
        self.record.connections.store(live as u64, std::sync::atomic::Ordering::Relaxed);
        h3.server.set_under_load(live >= h3.max_connections / UNDER_LOAD_SHARE);
        if writable {
            let mut effects = Vec::new();
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
                    h3.sessions
                        .insert(ch, Session::new(ch.0, generation, peer, Protocol::Http3, Some("TLSv1.3"), false, now));
                }
                if let (Some(conn), Some(sess)) = (h3.server.conn(ch), h3.sessions.get_mut(&ch)) {
                    let mut cx = engine_cx!(self, &mut glue, &mut h3.heads);
                    // Request bodies late past their deadline: 408.
                    sess.expire(conn, &mut cx, now);
                    run_session(sess, conn, &mut cx, now);
                    effects.append(&mut sess.effects);
                }
                if !h3.flush(now, ch) {
                    full = true;
                    h3.touched.insert(ch);
                }
                if h3.server.conn(ch).is_none() {
                    if let Some(mut sess) = h3.sessions.remove(&ch) {
                        sess.close_all(&mut self.sse);
                        effects.append(&mut sess.effects);
                    }
                }
            }
            let relays = h3.sessions.values().flat_map(|s| s.relays_ready()).collect();
            self.h3 = Some(h3);
            self.carry_out(effects);
            self.resume_relays(relays);
            self.sse_count_changed();
            let Some(h3) = self.h3.as_mut() else { return };
            h3.refresh_deadline();
            return;
        }
        h3.refresh_deadline();
        self.h3 = Some(h3);
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
            sess.end_event_streams(&mut self.sse);
            h3.touched.insert(*ch);
        }
        for ch in h3.server.handles() {
            h3.touched.insert(ch);
        }
        self.sse_count_changed();
    }
}

impl H3 {
    /// The session, connection, head builder and stream of HTTP/3 exchange `conn`/`stream`
    /// of generation `generation`, while open; the connection runs at the end of the turn.
    pub(super) fn parts(
        &mut self,
        conn: usize,
        stream: u64,
        generation: u32,
    ) -> Option<(&mut Session, &mut H3Conn, &mut Heads, StreamId)> {
        let (ch, stream) = quic_of(conn, stream);
        let sess = self.sessions.get_mut(&ch).filter(|s| s.gen() == generation)?;
        let conn = self.server.conn(ch)?;
        self.touched.insert(ch);
        Some((sess, conn, &mut self.heads, stream))
    }

    /// Connection `conn` has something to do: it runs at the end of this turn.
    pub(super) fn touch(&mut self, conn: usize) {
        self.touched.insert(ConnectionHandle(conn));
    }

    /// Recomputes the earliest deadline: quinn's timers, request bodies, producers.
    fn refresh_deadline(&mut self) {
        let quic = self.server.next_timeout();
        let exchanges = self.sessions.values().filter_map(Session::deadline).min();
        self.deadline = [quic, exchanges, self.handover.next_check()].into_iter().flatten().min();
    }
}
