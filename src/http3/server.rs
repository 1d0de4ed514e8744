//! The server side of one worker's QUIC endpoint: quinn's `Endpoint` (which routes datagrams
//! to connections by CID) and the [`H3Conn`]s it accepted. Datagrams in, datagrams out,
//! timers; no socket. The worker's loop (`worker/h3.rs`) reads the slot's UDP socket into
//! [`Server::handle_datagram`], send what [`Server::poll_transmit`] and the returned
//! responses hold, and call [`Server::handle_timeouts`] at [`Server::next_timeout`].
//!
//! Address validation: while the owner says it is under load ([`Server::set_under_load`]), a
//! new connection whose address is not yet validated is answered with a Retry (its token
//! sealed with the shared key, so any worker accepts it). Until it is validated, a
//! connection sends at most three times what it received (each connection counts the
//! datagrams handed to it, `amplification.rs`). A packet for a connection this
//! endpoint does not know, whose CID forkd issued, is answered with a stateless reset (quinn
//! does it, with the shared reset key). This file must not touch sockets or handlers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use quinn_proto::{ConnectionHandle, DatagramEvent, EcnCodepoint, Endpoint, EndpointConfig, ServerConfig, Transmit};

use super::conn::{ConnLimits, H3Conn};
use super::idmap::IdMap;

/// A datagram for the socket: where to and what (`bytes[..transmit.size]`, in segments of
/// `transmit.segment_size` when GSO batches several).
#[derive(Debug)]
pub struct Outgoing {
    /// quinn's description of the datagram(s).
    pub transmit: Transmit,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One worker's QUIC endpoint and connections.
pub struct Server {
    endpoint: Endpoint,
    conns: IdMap<ConnectionHandle, H3Conn>,
    limits: ConnLimits,
    under_load: bool,
    /// This worker's slot and CID generation, and whether another worker of the slot reads
    /// the same socket (see [`Server::set_sibling`]).
    own: Option<(u16, u8)>,
    sibling: bool,
    /// Draining: a new client's first packets are left to the successor.
    refuse_new: bool,
    keys: Option<super::keys::SlotCids>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("connections", &self.conns.len()).field("under_load", &self.under_load).finish()
    }
}

impl Server {
    /// An endpoint with `endpoint` (this slot's CIDs, the shared reset key) serving with
    /// `server`.
    pub fn new(endpoint: Arc<EndpointConfig>, server: Arc<ServerConfig>, limits: ConnLimits) -> Server {
        Server {
            endpoint: Endpoint::new(endpoint, Some(server), false, None),
            conns: IdMap::default(),
            limits,
            under_load: false,
            own: None,
            sibling: false,
            refuse_new: false,
            keys: None,
        }
    }

    /// Names this endpoint's slot, CID generation and CID keys (`cids`), so that it can tell
    /// its own packets from a sibling's (see [`Server::set_sibling`]).
    pub fn set_identity(&mut self, slot: u16, generation: u8, cids: super::keys::SlotCids) {
        self.own = Some((slot, generation));
        self.keys = Some(cids);
    }

    /// `sibling`: another worker of this slot may read the same socket after us (a draining
    /// worker whose successor could not take the socket over by forwarding, see
    /// `http3/handover.rs`, and waits for it to exit). Then a packet for a connection of the
    /// slot's other generation is dropped, not answered with a stateless reset (it is not
    /// ours to end). `refuse_new`: a new client's first packets are dropped too (a draining
    /// worker leaves them to its successor). A worker that gets its packets forwarded sees
    /// only its own generation's, so neither applies to them.
    pub fn set_sibling(&mut self, sibling: bool, refuse_new: bool) {
        self.sibling = sibling;
        self.refuse_new = refuse_new;
    }

    /// Whether `data` is for the sibling worker (see [`Server::set_sibling`]).
    fn siblings(&self, data: &[u8]) -> bool {
        let (Some((slot, generation)), Some(keys)) = (self.own, &self.keys) else { return false };
        if !self.sibling {
            return false;
        }
        match super::keys::packet_cid(data) {
            Some(cid) if keys.owner(cid) == Some(slot) => super::keys::generation_of(cid) != Some(generation),
            Some(_) | None => self.refuse_new && data.first().is_some_and(|b| b & 0x80 != 0),
        }
    }

    /// Under load, new clients must prove their address with a Retry round trip first.
    pub fn set_under_load(&mut self, on: bool) {
        self.under_load = on;
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Connection `ch`.
    pub fn conn(&mut self, ch: ConnectionHandle) -> Option<&mut H3Conn> {
        self.conns.get_mut(&ch)
    }

    /// Every connection's handle.
    pub fn handles(&self) -> Vec<ConnectionHandle> {
        self.conns.keys().copied().collect()
    }

    /// One datagram from `remote` (to `local_ip`, when the socket reports it). Returns the
    /// connection it went to (whose events to poll), and pushes onto `out` what the endpoint
    /// answers by itself (Retry, stateless reset, version negotiation, refusal).
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        remote: SocketAddr,
        local_ip: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        data: BytesMut,
        out: &mut Vec<Outgoing>,
    ) -> Option<ConnectionHandle> {
        if self.siblings(&data) {
            return None;
        }
        let mut buf = Vec::new();
        let (len, keyed) = (data.len(), super::amplification::keyed_only(&data));
        let event = self.endpoint.handle(now, remote, local_ip, ecn, data, &mut buf)?;
        let ch = match event {
            DatagramEvent::ConnectionEvent(ch, event) => {
                let conn = self.conns.get_mut(&ch)?;
                conn.received(remote, len, keyed);
                conn.handle_event(now, event);
                ch
            }
            DatagramEvent::Response(transmit) => {
                out.push(Outgoing { transmit, bytes: buf });
                return None;
            }
            DatagramEvent::NewConnection(incoming) => {
                if self.under_load && !incoming.remote_address_validated() && incoming.may_retry() {
                    match self.endpoint.retry(incoming, &mut buf) {
                        Ok(transmit) => out.push(Outgoing { transmit, bytes: buf }),
                        Err(e) => self.endpoint.ignore(e.into_incoming()),
                    }
                    return None;
                }
                let validated = incoming.remote_address_validated();
                match self.endpoint.accept(incoming, now, &mut buf, None) {
                    Ok((ch, quic)) => {
                        let mut conn = H3Conn::new(quic, self.limits, validated, now);
                        conn.received(remote, len, false);
                        conn.handle_timeout(now);
                        self.conns.insert(ch, conn);
                        ch
                    }
                    Err(e) => {
                        log::debug!("QUIC connection refused: {}", e.cause);
                        if let Some(transmit) = e.response {
                            out.push(Outgoing { transmit, bytes: buf });
                        }
                        return None;
                    }
                }
            }
        };
        self.endpoint_events(ch);
        Some(ch)
    }

    /// Passes `ch`'s events for the endpoint (new CIDs, retired CIDs, drained) and their
    /// answers; forgets a drained connection.
    fn endpoint_events(&mut self, ch: ConnectionHandle) {
        let Some(conn) = self.conns.get_mut(&ch) else { return };
        while let Some(event) = conn.poll_endpoint_event() {
            if let Some(back) = self.endpoint.handle_event(ch, event) {
                conn.quic_event(back);
            }
        }
        if conn.is_drained() {
            self.conns.remove(&ch);
        }
    }

    /// The next datagram(s) of connection `ch`.
    pub fn poll_transmit(&mut self, now: Instant, ch: ConnectionHandle, max_datagrams: usize) -> Option<Outgoing> {
        let mut bytes = Vec::new();
        let transmit = self.conns.get_mut(&ch)?.poll_transmit(now, max_datagrams, &mut bytes)?;
        Some(Outgoing { transmit, bytes })
    }

    /// The earliest timer of any connection.
    pub fn next_timeout(&mut self) -> Option<Instant> {
        self.conns.values_mut().filter_map(H3Conn::poll_timeout).min()
    }

    /// Runs every timer due at `now`; returns the connections whose timers fired (to poll for
    /// events and transmits; a drained one is already forgotten).
    pub fn handle_timeouts(&mut self, now: Instant) -> Vec<ConnectionHandle> {
        let mut fired = Vec::new();
        for ch in self.handles() {
            let Some(conn) = self.conns.get_mut(&ch) else { continue };
            if conn.poll_timeout().is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
                fired.push(ch);
            }
            self.endpoint_events(ch);
        }
        fired
    }

    /// After the owner acted on connection `ch` (sent, finished, went away): pass its
    /// endpoint events on.
    pub fn after_send(&mut self, ch: ConnectionHandle) {
        self.endpoint_events(ch);
    }

    /// GOAWAY on every connection (graceful stop or replacement).
    pub fn go_away(&mut self, now: Instant) {
        for ch in self.handles() {
            if let Some(conn) = self.conns.get_mut(&ch) {
                conn.go_away(now);
            }
            self.endpoint_events(ch);
        }
    }
}
