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

use super::h2::H2Session;
use super::streams::Stream;
use super::upstream::CallState;
use crate::http::service::HIGH_WATERMARK;
use crate::http1::codec::Http1;
use crate::net::{read_plain, write_some};

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
pub(super) enum ConnState {
    /// HTTP/1.1 (also while the protocol is not decided yet).
    Http1(H1),
    /// HTTP/2: the session and every exchange (stream) on it.
    Http2(Box<H2Session>),
    /// Our side is shut: input is read and discarded until the peer's FIN or
    /// this deadline (a lingering close, RFC 9112 §9.6). Nothing is sent.
    Lingering(Instant),
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
