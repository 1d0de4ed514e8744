//! The slot's UDP socket and the QUIC endpoint on it ([`Endpoint`]): datagrams in (GRO where
//! the kernel has it: one receive brings several datagrams of one peer, split by their size
//! here) and out (quinn builds batches of up to [`GSO_BATCH`] datagrams of one size, each sent
//! with GSO in one system call, or one datagram per call where the kernel or the path lacks
//! it, `sys::udp`). A batch the socket refuses (`WouldBlock`; of one it took in part, the
//! segments not sent) is kept and sent first when the socket is writable.
//!
//! Hand-over: while a predecessor of the slot drains, one worker reads the socket
//! ([`Handover`], `http3/handover.rs`). A new worker says hello to its siblings' inboxes and reads
//! once they acked, sending each datagram of an acked predecessor's generation to that
//! predecessor's inbox; a worker told hello reads no more (its socket stays registered for
//! writing) and feeds the datagrams its inbox brings to the endpoint like those it read.
//!
//! This file moves datagrams; it must not know an exchange, a session or a route (that is
//! `h3.rs`), nor HTTP/3 frames (`crate::http3`).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::net::UdpSocket;
use mio::{Interest, Registry};
use nix::sys::socket::UnixAddr;
use quinn_proto::ConnectionHandle;

use super::token::Tok;
use crate::config::Config;
use crate::http3::conn::ConnLimits;
use crate::http3::handover::Handover;
use crate::http3::keys::QuicKeys;
use crate::http3::server::{Outgoing, Server};
use crate::http3::setup;
use crate::sys::inbox::{self, Inbox, Msg};

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
    /// (`http3/handover.rs`).
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

/// The slot's UDP socket, the QUIC endpoint on it, and the hand-over of the socket between
/// the slot's workers.
pub(super) struct Endpoint {
    socket: UdpSocket,
    /// The QUIC endpoint: its connections are the sessions' (`h3.rs`).
    pub(super) server: Server,
    /// Datagrams the socket refused (`WouldBlock`): sent first once it is writable.
    backlog: std::collections::VecDeque<Outgoing>,
    /// The read budget ran out with datagrams maybe left in the socket.
    more: bool,
    recv: Vec<u8>,
    /// Receives with GRO (or without, where the kernel lacks it).
    receiver: crate::sys::udp::Receiver,
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

impl Endpoint {
    /// The endpoint on the slot's socket, registered with `registry` once the hand-over
    /// allows.
    pub(super) fn new(args: WorkerH3, config: &Config, registry: &Registry) -> io::Result<Endpoint> {
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
        let mut endpoint = Endpoint {
            socket,
            server,
            backlog: Default::default(),
            more: true,
            recv: vec![0; RECV_BUF],
            receiver: crate::sys::udp::Receiver::new(),
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
        endpoint.settle(registry);
        Ok(endpoint)
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
    /// if read from the socket (`fed` is told each connection a datagram went to).
    pub(super) fn read_inbox(
        &mut self,
        now: Instant,
        registry: &Registry,
        fed: &mut impl FnMut(&mut Server, ConnectionHandle),
    ) {
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
                    self.feed(now, peer, datagram, &mut answers, fed);
                }
            }
        }
        self.recv = buf;
        self.inbox = Some(inbox);
        for out in answers {
            self.send(out);
        }
    }

    /// One datagram from `from` into the endpoint (read from the socket or forwarded); `fed`
    /// is told the connection it went to.
    fn feed(
        &mut self,
        now: Instant,
        from: std::net::SocketAddr,
        datagram: &[u8],
        answers: &mut Vec<Outgoing>,
        fed: &mut impl FnMut(&mut Server, ConnectionHandle),
    ) {
        let data = BytesMut::from(datagram);
        if let Some(ch) = self.server.handle_datagram(now, from, None, None, data, answers) {
            fed(&mut self.server, ch);
        }
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

    /// Reads datagrams into the endpoint until `WouldBlock` or the budget (in datagrams: a
    /// GRO receive counts as the datagrams it brought). A datagram of an acked predecessor's
    /// connection goes to that predecessor's inbox instead (and counts against the budget too).
    /// `fed` is told each connection a datagram went to.
    pub(super) fn read(&mut self, now: Instant, fed: &mut impl FnMut(&mut Server, ConnectionHandle)) {
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
                        self.feed(now, got.from, datagram, &mut answers, fed);
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
    pub(super) fn send_backlog(&mut self) -> bool {
        while let Some(out) = self.backlog.pop_front() {
            if let Err(out) = self.send_now(out) {
                self.backlog.push_front(out);
                return false;
            }
        }
        true
    }

    /// Sends what connection `ch` has to send; `false` when the socket is full.
    pub(super) fn flush(&mut self, now: Instant, ch: ConnectionHandle) -> bool {
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
    /// Hellos to the predecessors that are due again (a predecessor not yet acked, checked
    /// alive); the socket's registration follows the hand-over.
    pub(super) fn check_siblings(&mut self, now: Instant, registry: &Registry) {
        if self.handover.next_check().is_none_or(|t| t > now) {
            return;
        }
        for pid in self.handover.check(now, crate::sys::alive) {
            let said = match (&self.inbox, inbox::address(self.port, pid)) {
                (Some(inbox), Ok(to)) => inbox.hello(&to),
                (None, _) => Err(io::Error::from(io::ErrorKind::NotConnected)),
                (_, Err(e)) => Err(e),
            };
            if said.is_err() {
                self.handover.undelivered(pid);
            }
        }
        self.settle(registry);
    }

    /// Reads what waits (the inbox's messages, then the socket's datagrams, while this worker
    /// reads it; the socket when `readable` or left unread last turn); `fed` is told each
    /// connection a datagram went to.
    pub(super) fn receive(
        &mut self,
        now: Instant,
        readable: bool,
        registry: &Registry,
        fed: &mut impl FnMut(&mut Server, ConnectionHandle),
    ) {
        if self.inbox_more {
            self.read_inbox(now, registry, fed);
        }
        if !self.handover.reads() {
            self.more = false;
        } else if readable || self.more {
            self.read(now, fed);
        }
    }

    /// The inbox is readable: its messages are taken at the next [`Endpoint::receive`].
    pub(super) fn inbox_ready(&mut self) {
        self.inbox_more = true;
    }

    /// Datagrams (or inbox messages) may wait unread.
    pub(super) fn unread(&self) -> bool {
        self.more || self.inbox_more
    }

    /// Nothing waits for the socket to be writable.
    pub(super) fn sent_all(&self) -> bool {
        self.backlog.is_empty()
    }

    /// When the hand-over next checks on the predecessors.
    pub(super) fn next_check(&self) -> Option<Instant> {
        self.handover.next_check()
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
