//! One TCP client connection: its transport ([`Transport`]) and its protocol state,
//! [`ConnState`], and the HTTP/1.1 side of driving it.
//!
//! The protocol state is one enum, so a connection is exactly one of: HTTP/1.1 ([`H1`]: the
//! codec and what the exchange in progress needs from the loop), HTTP/2 (the session with all
//! its exchanges), or lingering (our side shut, the peer's input discarded until its FIN).
//!
//! Event streams, WebSockets, downloads, relays and tickers over HTTP/1.1 are not variants of
//! their own: the exchange engine runs the body of the exchange in progress ([`H1::ex`],
//! driven in `streams.rs`) while the codec keeps the connection (a download, relay or ticker
//! returns it to keep-alive, its pipelined requests waiting in the read buffer; an event
//! stream's body is framed by the codec until its last chunk), and every one of them is
//! driven the same way (read, flush, back pressure).
//!
//! HTTP/3 is not a variant here: it runs over the slot's UDP socket, one socket for every
//! peer, so an HTTP/3 connection has no `TcpStream`, no byte stream and no TLS session of its
//! own; its sessions live in their own table (`h3.rs`) and only its exchanges
//! ([`ExchangeId`]) meet the rest of the worker.
//!
//! An HTTP/2 connection's session is `h2.rs`'s; it reaches its transport through
//! [`Conn::h2_parts`]. Bytes reach and leave the socket through [`Transport`]; this file must
//! not know a route.

use std::io::{self, Read};
use std::net::IpAddr;
use std::time::Instant;

use super::h1_sink::{Answered, Current, Fate};
use super::h2::H2Session;
use super::transport::Transport;
use super::{Glue, Worker, LINGER, READ_AHEAD};
use crate::app::Body;
use crate::exchange::pool::{ExchangeId, Work};
use crate::exchange::{Exchanges, Stage};
use crate::http::service::{Env, Protocol, HIGH_WATERMARK};
use crate::http1::codec::{Http1, Phase, Progress};
use crate::http2::sniff::{sniff, Sniff};

/// A client connection: transport plus protocol state.
pub(super) struct Conn {
    /// The socket, TLS session, buffers and send deadline.
    pub(super) io: Transport,
    /// The client's address.
    pub(super) peer: IpAddr,
    pub(super) generation: u32,
    pub(super) timer_at: Option<Instant>,
    /// Its reading (or its relay's upstream) stopped because the output passed the
    /// high-watermark: input may be waiting that no new edge will announce, so the
    /// flush that drains the output resumes it.
    pub(super) paused: bool,
    /// The protocol the connection speaks, and where it is in it.
    pub(super) state: ConnState,
}

/// What a connection speaks. Every connection starts as [`ConnState::Http1`]
/// with [`H1::sniff`] set (on a listener with `proxy_protocol`, after
/// [`ConnState::ProxyHeader`]); its first bytes (or the TLS handshake's ALPN) may
/// turn it into [`ConnState::Http2`]. Either ends in [`ConnState::Lingering`]
/// when its last response is sent, or is closed outright.
///
/// [`H1`] stays inline although it is much larger than the other variants:
/// nearly every connection is HTTP/1.1, and the state lives in the slab
/// entry it would otherwise take just as much room in (as it did before
/// this enum). Boxing it would cost an allocation per connection and a
/// pointer chase on every HTTP/1.1 request.
#[allow(clippy::large_enum_variant)]
pub(super) enum ConnState {
    /// Its PROXY protocol header is awaited until this deadline (the header timeout);
    /// nothing is read as TLS or HTTP before it (`proxy_header.rs`).
    ProxyHeader(Instant),
    /// HTTP/1.1 (also while the protocol is not decided yet).
    Http1(H1),
    /// HTTP/2: the session and every exchange (stream) on it.
    Http2(Box<H2Session>),
    /// Our side is shut: input is read and discarded until the peer's FIN or
    /// this deadline (a lingering close, RFC 9112 §9.6). Nothing is sent.
    Lingering(Instant),
}

impl ConnState {
    /// When the protocol state next needs the loop (the connection's timer): the PROXY
    /// header's deadline; the codec's header, body or keep-alive deadline; a stream's
    /// heartbeat, ping or tick; the HTTP/2 session's; the end of a lingering close.
    pub(super) fn deadline(&self, env: &Env) -> Option<Instant> {
        match self {
            ConnState::ProxyHeader(until) => Some(*until),
            ConnState::Http1(H1 { aborted: true, .. }) => None,
            ConnState::Http1(h) if h.detached() => h.ex.deadline(),
            ConnState::Http1(h) => h.codec.deadline().map(|d| d.0),
            ConnState::Http2(sess) => sess.deadline(env),
            ConnState::Lingering(until) => Some(*until),
        }
    }
}

/// An HTTP/1.1 connection: the codec, and what its one exchange in progress
/// needs from the loop.
pub(super) struct H1 {
    /// The socket-free HTTP/1.1 state machine.
    pub(super) codec: Http1,
    /// The protocol is not decided yet: the first bytes (or the TLS
    /// handshake's ALPN) may still make the connection HTTP/2.
    pub(super) sniff: bool,
    /// The exchange in progress once the engine has it (at most one): waiting on
    /// upstreams, or past its head with its body (an event stream, a WebSocket, a
    /// download, a relay, a ticker) while the codec is `Detached`.
    pub(super) ex: Exchanges<Current, Answered>,
    /// The body's app code failed: its end (if any) is queued, the connection closes once
    /// the output is flushed, and nothing more is read or produced.
    pub(super) aborted: bool,
    /// Close as soon as the output is flushed (a body ended the connection).
    pub(super) closing: bool,
    /// The end of the body the engine runs closes the connection (an event stream's: its
    /// client reconnects).
    pub(super) closes: bool,
    /// What an engine call routed to the exchange made of the connection, carried out
    /// when the exchange is woken (`mux.rs`).
    pub(super) fate: Fate,
}

impl H1 {
    /// A fresh state of connection `conn` (generation `gen`) from `peer`: `codec` waits for
    /// the first head, the protocol undecided.
    pub(super) fn new(codec: Http1, conn: usize, gen: u32, peer: IpAddr, now: Instant) -> H1 {
        let ex = Exchanges::new(conn, gen, peer, Protocol::Http11, None, false, now);
        H1 { codec, sniff: true, ex, aborted: false, closing: false, closes: false, fate: Fate::Open }
    }

    /// The state of connection `conn` (generation `gen`) from `peer` (over TLS when `secure`)
    /// about to read its first bytes as HTTP (`h2`: HTTP/2 is on, so they are sniffed for its
    /// preface).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fresh(conn: usize, gen: u32, peer: IpAddr, secure: bool, h2: bool, env: &Env, now: Instant) -> H1 {
        H1 { sniff: h2, ..H1::new(Http1::new(peer, secure, env, now), conn, gen, peer, now) }
    }

    /// The exchange in progress is past its head: its body runs outside the codec.
    pub(super) fn detached(&self) -> bool {
        self.aborted || self.ex.list.first().is_some_and(|e| e.streaming())
    }

    /// The exchange in progress waits on upstreams (or relays one).
    pub(super) fn calling(&self) -> bool {
        self.ex.list.first().is_some_and(|e| e.call.is_some())
    }
}

impl Conn {
    /// The connection speaks HTTP/2 from here on, through `sess`.
    pub(super) fn become_h2(&mut self, sess: H2Session) {
        self.state = ConnState::Http2(Box::new(sess));
    }

    /// An HTTP/2 connection's session and transport.
    pub(super) fn h2_parts(&mut self) -> Option<(&mut H2Session, &mut Transport)> {
        match &mut self.state {
            ConnState::Http2(sess) => Some((sess, &mut self.io)),
            _ => None,
        }
    }
}

impl Worker {
    /// [`Worker::drive`] for an HTTP/1.1 connection between streams: read, run the codec
    /// (which may find the HTTP/2 preface first), write; then start what the reply's body
    /// needs from the loop (a pool job, upstreams, a stream, a download, a WebSocket).
    pub(super) fn drive_h1(&mut self, idx: usize) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let ConnState::Http1(h) = &mut c.state else { return };
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut close = false;
        // The response ended the connection and is all sent: close it gracefully.
        let mut end = false;
        loop {
            let phase = h.codec.phase();
            let hold = phase == Phase::Waiting || c.io.out.len() - c.io.out_pos > HIGH_WATERMARK;
            if !c.io.eof && phase != Phase::Closing && !(hold && c.io.inbuf.len() >= READ_AHEAD) {
                self.bufs.fill(&mut c.io.inbuf);
                // Until the sniff decides, at most what HTTP/2 would read ahead: a fast
                // client's flood behind the preface stays in its socket.
                let cap = if hold || h.sniff { READ_AHEAD } else { usize::MAX };
                match c.io.fill_batch(&mut self.scratch, cap, self.edge) {
                    Ok(eof) => c.io.eof = eof,
                    Err(_) => {
                        close = true;
                        break;
                    }
                }
            }
            if h.sniff && phase == Phase::Closing {
                // The head timed out before the protocol was decided: HTTP/1.1 answered it.
                h.sniff = false;
            }
            if h.sniff {
                let alpn = c.io.tls.as_ref().map(|t| if t.is_handshaking() { None } else { Some(t.alpn_protocol()) });
                if alpn == Some(Some(Some(crate::acme::ALPN_PROTOCOL))) {
                    // A TLS-ALPN-01 check (RFC 8737 §3): the handshake was all of it.
                    close = true;
                    break;
                }
                match sniff(&c.io.inbuf, alpn.map(|a| a.map(|p| p.unwrap_or(b"")))) {
                    Sniff::H1 => h.sniff = false,
                    Sniff::H2 => {
                        self.start_h2(idx);
                        return;
                    }
                    Sniff::Wait if c.io.eof => {
                        close = true;
                        break;
                    }
                    Sniff::Wait if c.io.tls.is_none() && !c.io.inbuf.is_empty() => {
                        // A prefix of the preface: wait for the rest. Not yet HTTP/2,
                        // so the wait is part of an HTTP/1.1 head: its timer, its 408.
                        h.codec.head_started(&self.env, now);
                        if c.io.flush().is_err() {
                            close = true;
                        }
                        break;
                    }
                    Sniff::Wait => {}
                }
            }
            self.bufs.fill(&mut c.io.out);
            if c.io.tls.is_some() {
                h.codec.set_tls(c.io.tls_version());
            }
            let progress = h.codec.advance(&mut c.io.inbuf, &mut c.io.out, &mut glue, &mut self.env, now);
            match c.io.flush() {
                Ok(()) => {}
                Err(_) => {
                    close = true;
                    break;
                }
            }
            if h.sniff && c.io.tls.as_ref().is_some_and(|t| !t.is_handshaking()) {
                // The handshake finished in this flush: decide by ALPN now.
                continue;
            }
            let pending_out = c.io.flushed(now);
            match progress {
                Progress::Close => {
                    end = !pending_out;
                    break;
                }
                Progress::Paused if !pending_out => continue,
                Progress::Detached => break,
                Progress::NeedInput if c.io.eof => {
                    // The peer finished sending: nothing more can complete.
                    close = !pending_out;
                    break;
                }
                _ => break,
            }
        }
        // What the reply's body needs from the loop, if anything. The codec
        // decided already: `HEAD` got the head only, and no body comes here.
        let generation = c.generation;
        let body = match h.codec.take_body() {
            // A request that reached its handler runs to its end, whatever
            // becomes of the connection meanwhile (its answer is then dropped).
            Some(Body::Job(job)) => {
                // The engine holds the wait; the codec answers it (`Sink::respond`).
                h.ex.adopt(Current, Answered, Stage::Waiting, None, now);
                self.pool.submit(ExchangeId::H1 { conn: idx, gen: c.generation }, Work::Request(job));
                None
            }
            other => other,
        };
        // The client left while its request waits (on upstreams, which are cancelled, or on
        // a pool job, which runs to its end and whose answer is dropped): close now, not
        // when the answer comes.
        if c.io.eof && (h.calling() || h.codec.phase() == Phase::Waiting) {
            close = true;
        }
        if close {
            self.close(idx);
            return;
        }
        if end {
            self.end(idx);
            return;
        }
        if !h.detached() {
            // Between requests, or waiting on a job or upstreams: hold no empty buffer.
            self.bufs.shed(&mut c.io.inbuf, &mut c.io.out);
        }
        match body {
            None | Some(Body::Full | Body::Job(_)) => {}
            Some(Body::Upstream(up)) => {
                // The engine holds the wait; the codec answers it.
                h.ex.adopt(Current, Answered, Stage::Waiting, None, now);
                self.start_call(ExchangeId::H1 { conn: idx, gen: generation }, up);
                self.arm(idx);
                return;
            }
            Some(Body::Producer(p)) => {
                self.start_producer(idx, p, now);
                return;
            }
            Some(Body::File(f)) => {
                self.start_download(idx, f);
                return;
            }
            Some(Body::WebSocket(ws)) => {
                self.start_websocket(idx, ws, now);
                return;
            }
        }
        self.arm(idx);
    }

    /// Close a connection whose last response is sent, the way RFC 9112 §9.6
    /// asks: shut our sending side (the peer reads our FIN after the whole
    /// response), then read and discard what it still sends until its FIN or
    /// [`LINGER`]. Closing at once with unread input would reset the
    /// connection, and a reset can destroy the response before the client
    /// reads it (a 413 sent while the body is still arriving, a
    /// `Connection: close` answer to a pipelining client).
    pub(super) fn end(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        if let Some(tls) = c.io.tls.as_mut().filter(|t| !c.io.eof && !t.is_handshaking()) {
            // TLS ends with close_notify before the FIN (best effort: it is one small record).
            tls.send_close_notify();
            while tls.wants_write() {
                if !matches!(tls.write_tls(&mut c.io.sock), Ok(n) if n > 0) {
                    break;
                }
            }
        }
        if c.io.eof || c.io.sock.shutdown(std::net::Shutdown::Write).is_err() {
            self.close(idx);
            return;
        }
        let state = std::mem::replace(&mut c.state, ConnState::Lingering(Instant::now() + LINGER));
        c.io.tls = None;
        self.bufs.give(std::mem::take(&mut c.io.inbuf));
        self.bufs.give(std::mem::take(&mut c.io.out));
        c.io.out_pos = 0;
        c.io.send_deadline = None;
        self.release(state);
        self.linger(idx);
    }

    /// Discard a lingering connection's input; close at its FIN or an error.
    pub(super) fn linger(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        loop {
            match c.io.sock.read(&mut self.scratch) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.arm(idx);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        self.close(idx);
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::*;

    fn env() -> Env {
        Env::testing()
    }

    const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn each_state_answers_for_its_own_deadline() {
        let (env, now) = (env(), Instant::now());
        let fresh = ConnState::Http1(H1::new(Http1::new(PEER, false, &env, now), 0, 0, PEER, now));
        assert_eq!(fresh.deadline(&env), Some(now + env.header_timeout), "a new connection owes a head");
        let mut relaying = H1::new(Http1::new(PEER, false, &env, now), 0, 0, PEER, now);
        relaying.ex.adopt(Current, Answered, Stage::Streaming, None, now);
        assert_eq!(ConnState::Http1(relaying).deadline(&env), None, "a relay's upstream has the timer, not the codec");
        let until = now + Duration::from_secs(2);
        assert_eq!(ConnState::Lingering(until).deadline(&env), Some(until));
        assert_eq!(ConnState::ProxyHeader(until).deadline(&env), Some(until), "a PROXY header is owed by then");
        let h2 = ConnState::Http2(Box::new(H2Session::new(crate::http2::H2Settings::default(), 0, 0, PEER, None, now)));
        assert_eq!(h2.deadline(&env), Some(now + env.header_timeout), "a new session owes its preface");
    }
}
