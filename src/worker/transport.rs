//! A TCP client connection's transport: the socket, the TLS session when there is one, the
//! read and write buffers, and the send deadline. HTTP/1.1 and HTTP/2 connections read and
//! write through it alike ([`Transport::fill`], [`Transport::flush`]).
//!
//! It owns bytes and their way to and from the socket; it must not know a protocol's framing
//! or a route, and it never registers the socket with the poll (the loop does).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use crate::http::service::HIGH_WATERMARK;
use crate::net::{read_plain, read_plain_batch, write_some};

/// A connection whose output makes no progress this long is dropped (nginx `send_timeout`).
pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// The socket of one client connection and the bytes on their way through it.
pub(super) struct Transport {
    pub(super) sock: TcpStream,
    /// The TLS session of a connection accepted on `tls.listen`; `None`: plain bytes. All of
    /// the connection's input and output goes through it.
    pub(super) tls: Option<Box<rustls::ServerConnection>>,
    /// Input read (decrypted) and not yet consumed by the protocol.
    pub(super) inbuf: Vec<u8>,
    /// Output queued for the socket; `out[out_pos..]` is not written yet.
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    /// The peer finished sending (FIN or TLS close_notify).
    pub(super) eof: bool,
    /// Output has been waiting since before this deadline; past it the connection closes.
    pub(super) send_deadline: Option<Instant>,
}

impl Transport {
    /// The transport of a freshly accepted socket, with the loop's buffers.
    pub(super) fn new(
        sock: TcpStream,
        tls: Option<Box<rustls::ServerConnection>>,
        inbuf: Vec<u8>,
        out: Vec<u8>,
    ) -> Transport {
        Transport { sock, tls, inbuf, out, out_pos: 0, eof: false, send_deadline: None }
    }

    /// The TLS version, named as nginx's `$ssl_protocol` names it (`TLSv1.3`, `TLSv1.2`), once
    /// the handshake agreed on one; `None` on a plain connection.
    pub(super) fn tls_version(&self) -> Option<&'static str> {
        match self.tls.as_ref()?.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => Some("TLSv1.3"),
            rustls::ProtocolVersion::TLSv1_2 => Some("TLSv1.2"),
            _ => Some("TLS"),
        }
    }

    /// Output not yet on the wire: queued bytes, or TLS records rustls still holds.
    pub(super) fn pending_out(&self) -> bool {
        self.out.len() > self.out_pos || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Queued output bytes not yet written to the socket (or to rustls).
    pub(super) fn backlog(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Read until `WouldBlock`, EOF or `cap` bytes buffered (plaintext, through the TLS
    /// session when there is one). `Ok(true)` on EOF.
    pub(super) fn fill(&mut self, scratch: &mut [u8], cap: usize) -> io::Result<bool> {
        match &mut self.tls {
            None => read_plain(&mut self.sock, &mut self.inbuf, scratch, cap),
            Some(tls) => read_tls(&mut self.sock, tls, &mut self.inbuf, scratch, cap),
        }
    }

    /// [`Transport::fill`], where a plain socket is read in one batch (`edge`: the poll is
    /// edge-triggered, so a short read means the socket is drained).
    pub(super) fn fill_batch(&mut self, scratch: &mut [u8], cap: usize, edge: bool) -> io::Result<bool> {
        match &mut self.tls {
            None => read_plain_batch(&mut self.sock, &mut self.inbuf, scratch, cap, edge),
            Some(tls) => read_tls(&mut self.sock, tls, &mut self.inbuf, scratch, cap),
        }
    }

    /// Write queued output until done or `WouldBlock`, through the TLS session when there is
    /// one (then records rustls holds may remain: [`Transport::pending_out`]).
    pub(super) fn flush(&mut self) -> io::Result<()> {
        match &mut self.tls {
            None => flush_plain(&mut self.sock, &mut self.out, &mut self.out_pos),
            Some(tls) => flush_tls(&mut self.sock, tls, &mut self.out, &mut self.out_pos),
        }
    }

    /// After a flush: output still pending keeps (or starts, [`SEND_TIMEOUT`] from `now`) the
    /// send deadline; none pending clears it. Returns whether output is pending.
    pub(super) fn flushed(&mut self, now: Instant) -> bool {
        let pending = self.pending_out();
        if pending {
            self.output_waits(now);
        } else {
            self.send_deadline = None;
        }
        pending
    }

    /// Output waits for the socket: the send deadline starts unless it runs already.
    pub(super) fn output_waits(&mut self, now: Instant) {
        self.send_deadline = self.send_deadline.or(Some(now + SEND_TIMEOUT));
    }
}

/// [`Transport::fill`] through TLS: the plaintext rustls already decrypted first, then records
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

/// [`Transport::flush`] through TLS: plaintext into rustls (up to its buffer limit; during the
/// handshake it waits there), records out to the socket, until both are done or the socket
/// is full.
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
