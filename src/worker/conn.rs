//! One client connection: its transport (socket, TLS session, buffers,
//! output progress, send deadline) and its protocol state, [`ConnState`].
//!
//! The protocol state is one enum, so a connection is exactly one of:
//! HTTP/1.1 ([`H1`]: the codec and what the exchange in progress needs from
//! the loop), HTTP/2 (the session with all its exchanges), or lingering
//! (our side shut, the peer's input discarded until its FIN). What used to
//! sit side by side (an HTTP/1.1 codec, an optional HTTP/2 session, a
//! detached stream, an upstream wait, a linger deadline) could pair up in
//! ways that mean nothing (an HTTP/2 session with an HTTP/1.1 event stream);
//! now they cannot.
//!
//! Event streams, WebSockets, downloads, relays and tickers over HTTP/1.1
//! are sub-states of [`H1`] ([`H1::stream`]), not variants of their own:
//! they keep the codec (a download, relay or ticker returns the connection
//! to keep-alive, its pipelined requests waiting in the read buffer; an
//! event stream's body is framed by the codec until its last chunk), and
//! every one of them is driven the same way (read, flush, back pressure).
//!
//! HTTP/3 will not be a variant here: it runs over the slot's UDP socket,
//! one socket for every peer, so an HTTP/3 connection has no `TcpStream`,
//! no byte stream to read or flush, and no TLS session of its own. It will
//! be its own slab (like the upstream connections), keyed by connection id
//! and driven by datagrams; only its exchanges (`ExchangeId`) meet the rest
//! of the worker.
//!
//! This file owns the connection's bytes and their way to and from the
//! socket ([`read_into`], [`flush`]); it must not know a route or a
//! protocol's framing.

use std::io::{self, Read, Write};
use std::time::Instant;

use mio::net::TcpStream;

use super::h2::{self, H2Session};
use super::pool::{ExchangeId, Work};
use super::streams::Stream;
use super::upstream::CallState;
use super::{Glue, Worker, LINGER, READ_AHEAD, SEND_TIMEOUT};
use crate::app::Body;
use crate::http::service::{Env, HIGH_WATERMARK};
use crate::http1::codec::{Http1, Phase, Progress};
use crate::net::{read_plain, read_plain_batch, write_some};

/// A client connection: transport plus protocol state.
pub(super) struct Conn {
    pub(super) sock: TcpStream,
    /// The client's address.
    pub(super) peer: std::net::IpAddr,
    /// The TLS session of a connection accepted on `tls.listen`; `None`: plain bytes. All of
    /// the connection's input and output goes through it ([`read_into`], [`flush`]).
    pub(super) tls: Option<Box<rustls::ServerConnection>>,
    pub(super) inbuf: Vec<u8>,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    pub(super) generation: u32,
    pub(super) eof: bool,
    pub(super) timer_at: Option<Instant>,
    pub(super) send_deadline: Option<Instant>,
    /// Its reading (or its relay's upstream) stopped because the output passed the
    /// high-watermark: input may be waiting that no new edge will announce, so the
    /// flush that drains the output resumes it.
    pub(super) paused: bool,
    /// The protocol the connection speaks, and where it is in it.
    pub(super) state: ConnState,
}

/// What a connection speaks. Every connection starts as [`ConnState::Http1`]
/// with [`H1::sniff`] set; its first bytes (or the TLS handshake's ALPN) may
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
    /// HTTP/1.1 (also while the protocol is not decided yet).
    Http1(H1),
    /// HTTP/2: the session and every exchange (stream) on it.
    Http2(Box<H2Session>),
    /// Our side is shut: input is read and discarded until the peer's FIN or
    /// this deadline (a lingering close, RFC 9112 §9.6). Nothing is sent.
    Lingering(Instant),
}

impl ConnState {
    /// When the protocol state next needs the loop (the connection's timer): the
    /// codec's header, body or keep-alive deadline; a stream's heartbeat, ping or
    /// tick; the HTTP/2 session's; the end of a lingering close.
    pub(super) fn deadline(&self, env: &Env) -> Option<Instant> {
        match self {
            ConnState::Http1(H1 { stream: Some(s), .. }) => s.deadline(),
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
    /// The body of the exchange in progress once it left request processing
    /// (an event stream, a WebSocket, a download, a relay, a ticker); the
    /// codec is `Detached` meanwhile.
    pub(super) stream: Option<Stream>,
    /// Upstream requests the exchange in progress waits on (or relays).
    pub(super) call: Option<CallState>,
    /// Close as soon as the output is flushed (a stream ended the connection).
    pub(super) closing: bool,
}

impl H1 {
    /// A fresh connection's state: `codec` waits for the first head, the protocol undecided.
    pub(super) fn new(codec: Http1) -> H1 {
        H1 { codec, sniff: true, stream: None, call: None, closing: false }
    }
}

impl Conn {
    /// Output not yet on the wire: queued bytes, or TLS records rustls still holds.
    pub(super) fn pending_out(&self) -> bool {
        pending(&self.out, self.out_pos, &self.tls)
    }

    /// Queued output bytes not yet written to the socket (or to rustls).
    pub(super) fn backlog(&self) -> usize {
        self.out.len() - self.out_pos
    }
}

/// [`Conn::pending_out`] from the connection's fields, for a caller that holds its state
/// borrowed.
pub(super) fn pending(out: &[u8], out_pos: usize, tls: &Option<Box<rustls::ServerConnection>>) -> bool {
    out.len() > out_pos || tls.as_ref().is_some_and(|t| t.wants_write())
}

/// Read until `WouldBlock`, EOF or `cap` bytes buffered (plaintext, through the TLS session
/// when there is one). `Ok(true)` on EOF.
pub(super) fn read_into(
    sock: &mut TcpStream,
    tls: &mut Option<Box<rustls::ServerConnection>>,
    inbuf: &mut Vec<u8>,
    scratch: &mut [u8],
    cap: usize,
) -> io::Result<bool> {
    match tls {
        None => read_plain(sock, inbuf, scratch, cap),
        Some(tls) => read_tls(sock, tls, inbuf, scratch, cap),
    }
}

/// [`read_into`] through TLS: the plaintext rustls already decrypted first, then records
/// from the socket. A TLS error (a failed handshake, a bad record) sends rustls' alert if
/// the socket takes it and fails the connection; it is logged at debug level only, since
/// any client (a scanner, a plain-HTTP request on the HTTPS port) can cause one.
fn read_tls(
    sock: &mut TcpStream,
    tls: &mut rustls::ServerConnection,
    inbuf: &mut Vec<u8>,
    scratch: &mut [u8],
    cap: usize,
) -> io::Result<bool> {
    loop {
        loop {
            if inbuf.len() >= cap {
                return Ok(false);
            }
            match tls.reader().read(scratch) {
                // The peer's close_notify.
                Ok(0) => return Ok(true),
                Ok(n) => inbuf.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // The TCP end without close_notify: the end all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(true),
                Err(e) => return Err(e),
            }
        }
        match tls.read_tls(sock) {
            Ok(_) => {
                if let Err(e) = tls.process_new_packets() {
                    log::debug!("TLS: {e}");
                    let _ = tls.write_tls(sock);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Write queued output until done or `WouldBlock`, through the TLS session when there is
/// one (then records rustls holds may remain: [`Conn::pending_out`]).
pub(super) fn flush(
    sock: &mut TcpStream,
    tls: &mut Option<Box<rustls::ServerConnection>>,
    out: &mut Vec<u8>,
    pos: &mut usize,
) -> io::Result<()> {
    match tls {
        None => flush_plain(sock, out, pos),
        Some(tls) => flush_tls(sock, tls, out, pos),
    }
}

/// [`flush`] through TLS: plaintext into rustls (up to its buffer limit; during the handshake
/// it waits there), records out to the socket, until both are done or the socket is full.
fn flush_tls(
    sock: &mut TcpStream,
    tls: &mut rustls::ServerConnection,
    out: &mut Vec<u8>,
    pos: &mut usize,
) -> io::Result<()> {
    loop {
        while *pos < out.len() {
            match tls.writer().write(&out[*pos..])? {
                0 => break,
                n => *pos += n,
            }
        }
        if !tls.wants_write() {
            break;
        }
        while tls.wants_write() {
            match tls.write_tls(sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if *pos >= out.len() {
            break;
        }
    }
    if *pos >= out.len() {
        out.clear();
        *pos = 0;
        if out.capacity() > 4 * HIGH_WATERMARK {
            out.shrink_to(HIGH_WATERMARK);
        }
    }
    Ok(())
}

/// Write queued plain output until done or `WouldBlock`.
fn flush_plain(sock: &mut TcpStream, out: &mut Vec<u8>, pos: &mut usize) -> io::Result<()> {
    write_some(sock, out, pos)?;
    if *pos < out.len() {
        return Ok(());
    }
    out.clear();
    *pos = 0;
    if out.capacity() > 4 * HIGH_WATERMARK {
        out.shrink_to(HIGH_WATERMARK);
    }
    Ok(())
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
            let hold = phase == Phase::Waiting || c.out.len() - c.out_pos > HIGH_WATERMARK;
            if !c.eof && phase != Phase::Closing && !(hold && c.inbuf.len() >= READ_AHEAD) {
                self.bufs.fill(&mut c.inbuf);
                // Until the sniff decides, at most what HTTP/2 would read ahead: a fast
                // client's flood behind the preface stays in its socket.
                let cap = if hold || h.sniff { READ_AHEAD } else { usize::MAX };
                let read = match c.tls {
                    None => read_plain_batch(&mut c.sock, &mut c.inbuf, &mut self.scratch, cap, self.edge),
                    Some(_) => read_into(&mut c.sock, &mut c.tls, &mut c.inbuf, &mut self.scratch, cap),
                };
                match read {
                    Ok(eof) => c.eof = eof,
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
                let alpn = c.tls.as_ref().map(|t| if t.is_handshaking() { None } else { Some(t.alpn_protocol()) });
                match h2::sniff(&c.inbuf, alpn.map(|a| a.map(|p| p.unwrap_or(b"")))) {
                    h2::Sniff::H1 => h.sniff = false,
                    h2::Sniff::H2 => {
                        self.start_h2(idx);
                        return;
                    }
                    h2::Sniff::Wait if c.eof => {
                        close = true;
                        break;
                    }
                    h2::Sniff::Wait if c.tls.is_none() && !c.inbuf.is_empty() => {
                        // A prefix of the preface: wait for the rest. Not yet HTTP/2,
                        // so the wait is part of an HTTP/1.1 head: its timer, its 408.
                        h.codec.head_started(&self.env, now);
                        if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
                            close = true;
                        }
                        break;
                    }
                    h2::Sniff::Wait => {}
                }
            }
            self.bufs.fill(&mut c.out);
            let progress = h.codec.advance(&mut c.inbuf, &mut c.out, &mut glue, &mut self.env, now);
            match flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos) {
                Ok(()) => {}
                Err(_) => {
                    close = true;
                    break;
                }
            }
            if h.sniff && c.tls.as_ref().is_some_and(|t| !t.is_handshaking()) {
                // The handshake finished in this flush: decide by ALPN now.
                continue;
            }
            let pending_out = pending(&c.out, c.out_pos, &c.tls);
            c.send_deadline = if pending_out { c.send_deadline.or(Some(now + SEND_TIMEOUT)) } else { None };
            match progress {
                Progress::Close => {
                    end = !pending_out;
                    break;
                }
                Progress::Paused if !pending_out => continue,
                Progress::Detached => break,
                Progress::NeedInput if c.eof => {
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
                self.pool.submit(ExchangeId::H1 { conn: idx, gen: c.generation }, Work::Request(job));
                None
            }
            other => other,
        };
        // The client left while its request waits (on upstreams, which are cancelled, or on
        // a pool job, which runs to its end and whose answer is dropped): close now, not
        // when the answer comes.
        if c.eof && (h.call.is_some() || h.codec.phase() == Phase::Waiting) {
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
        if h.stream.is_none() {
            // Between requests, or waiting on a job or upstreams: hold no empty buffer.
            self.bufs.shed(&mut c.inbuf, &mut c.out);
        }
        match body {
            None | Some(Body::Full | Body::Job(_)) => {}
            Some(Body::Upstream(up)) => {
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
        if let Some(tls) = c.tls.as_mut().filter(|t| !c.eof && !t.is_handshaking()) {
            // TLS ends with close_notify before the FIN (best effort: it is one small record).
            tls.send_close_notify();
            while tls.wants_write() {
                if !matches!(tls.write_tls(&mut c.sock), Ok(n) if n > 0) {
                    break;
                }
            }
        }
        if c.eof || c.sock.shutdown(std::net::Shutdown::Write).is_err() {
            self.close(idx);
            return;
        }
        let state = std::mem::replace(&mut c.state, ConnState::Lingering(Instant::now() + LINGER));
        c.tls = None;
        self.bufs.give(std::mem::take(&mut c.inbuf));
        self.bufs.give(std::mem::take(&mut c.out));
        c.out_pos = 0;
        c.send_deadline = None;
        let generation = c.generation;
        self.release(idx, generation, state);
        self.linger(idx);
    }

    /// Discard a lingering connection's input; close at its FIN or an error.
    pub(super) fn linger(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        loop {
            match c.sock.read(&mut self.scratch) {
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
        let fresh = ConnState::Http1(H1::new(Http1::new(PEER, false, &env, now)));
        assert_eq!(fresh.deadline(&env), Some(now + env.header_timeout), "a new connection owes a head");
        let mut relaying = H1::new(Http1::new(PEER, false, &env, now));
        relaying.stream = Some(Stream::Relay);
        assert_eq!(ConnState::Http1(relaying).deadline(&env), None, "a relay's upstream has the timer, not the codec");
        let until = now + Duration::from_secs(2);
        assert_eq!(ConnState::Lingering(until).deadline(&env), Some(until));
        let h2 = ConnState::Http2(Box::new(H2Session::new(crate::http2::H2Settings::default(), PEER, false, now)));
        assert_eq!(h2.deadline(&env), Some(now + env.header_timeout), "a new session owes its preface");
    }
}
