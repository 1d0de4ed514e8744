//! The socket half of the outbound HTTP/1.1 client: one upstream connection ([`UpConn`]:
//! its socket, optional TLS session, request bytes and incremental response reader), a
//! non-blocking connect from a given address on ([`connect_from`]), and one I/O pass
//! ([`up_io`]: connect check, write, read, parse).
//!
//! It moves bytes and reports what a pass left ([`Step`]); it does not know who waits for the
//! answer beyond the [`Owner`] it carries, nor what the answer means: [`super::pool`] keeps
//! the connections, the worker routes results to exchanges, the app decides what they mean.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::wire::{ClientError, Endpoint, ResponseReader};
use crate::error::Error;
use crate::http::exchange::ExchangeId;
use crate::net::{read_plain, write_some};

/// Bytes read from an upstream per pass, before its consumer runs again.
pub const READ_SLICE: usize = 64 * 1024;

/// Who is waiting for an upstream connection's response: an exchange (an
/// HTTP/1.1 connection, or one HTTP/2 stream) and its request's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub(crate) id: ExchangeId,
    pub(crate) slot: usize,
}

/// One upstream connection.
pub struct UpConn {
    pub(crate) sock: TcpStream,
    /// TLS session for `https://` endpoints (the request and response pass through it).
    pub(crate) tls: Option<Box<rustls::ClientConnection>>,
    pub(crate) endpoint: Arc<Endpoint>,
    /// Index of the address being tried in `endpoint.addrs`.
    pub(crate) addr: usize,
    pub(crate) connected: bool,
    /// The request bytes (kept until the response is complete, for a retry).
    pub(crate) out: Vec<u8>,
    pub(crate) out_pos: usize,
    pub(crate) inbuf: Vec<u8>,
    pub(crate) reader: ResponseReader,
    pub(crate) body: Vec<u8>,
    pub(crate) owner: Option<Owner>,
    /// Requests of other clients that joined this one (same coalescible `GET`).
    pub(crate) followers: Vec<Owner>,
    /// Its key in the in-flight table, while others may join.
    pub(crate) inflight: Option<(usize, String)>,
    pub(crate) generation: u32,
    pub(crate) timer_at: Option<Instant>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) timeout: Duration,
    pub(crate) total: bool,
    pub(crate) idempotent: bool,
    pub(crate) max_body: u64,
    /// Taken from the idle pool (it may have died while idle).
    pub(crate) reused: bool,
    /// Some response bytes arrived.
    pub(crate) received: bool,
    /// The peer closed its side.
    pub(crate) eof: bool,
    /// Reading stopped because the client is slow (relay back pressure).
    pub(crate) paused: bool,
    /// The last read stopped at its cap: the socket may hold more (edge-triggered).
    pub(crate) more: bool,
}

/// What one I/O pass on an upstream connection left.
pub enum Step {
    /// More to come.
    Pending,
    /// The response is complete.
    Done,
    /// The exchange failed.
    Failed(ClientError),
}

/// The client-facing error for a failed upstream exchange.
pub fn client_error(e: &ClientError) -> Error {
    match e {
        ClientError::Timeout => Error::UpstreamTimeout,
        other => Error::UpstreamUnavailable(other.to_string().into()),
    }
}

/// Connect (non-blocking) to the first address from `from` that does not fail at once.
pub fn connect_from(endpoint: &Endpoint, from: usize) -> Result<(TcpStream, usize), ClientError> {
    let mut last = String::from("no address");
    for (i, addr) in endpoint.addrs.iter().enumerate().skip(from) {
        match TcpStream::connect(*addr) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok((s, i));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(ClientError::Connect(last))
}

/// Connect-check, write, read and parse what the socket allows now.
pub fn up_io(u: &mut UpConn, scratch: &mut [u8]) -> Step {
    let now = Instant::now();
    if !u.connected {
        match u.sock.take_error() {
            Ok(Some(e)) | Err(e) => return Step::Failed(ClientError::Connect(e.to_string())),
            Ok(None) => {}
        }
        match u.sock.peer_addr() {
            Ok(_) => u.connected = true,
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return Step::Pending,
            Err(e) => return Step::Failed(ClientError::Connect(e.to_string())),
        }
    }
    if let Err(e) = transmit(u) {
        return Step::Failed(if u.received { ClientError::Closed } else { closed_or(e) });
    }
    if u.paused || u.reader.is_done() {
        return if u.reader.is_done() { Step::Done } else { Step::Pending };
    }
    let before = u.inbuf.len();
    let cap = before + READ_SLICE;
    u.more = false;
    match receive(u, scratch, cap) {
        Ok(eof) => {
            u.eof |= eof;
            u.more = !eof && u.inbuf.len() >= cap;
        }
        Err(e) => return Step::Failed(e),
    }
    // Reading may have produced TLS records to send (handshake, key updates).
    if u.tls.as_ref().is_some_and(|t| t.wants_write()) {
        if let Err(e) = transmit(u) {
            return Step::Failed(closed_or(e));
        }
    }
    if u.inbuf.len() > before {
        u.received = true;
        if !u.total {
            u.deadline = Some(now + u.timeout);
        }
    }
    match u.reader.feed(&u.inbuf, &mut u.body) {
        Ok(n) => {
            u.inbuf.drain(..n);
        }
        Err(e) => return Step::Failed(e),
    }
    if u.reader.is_done() {
        return Step::Done;
    }
    if u.eof {
        return match u.reader.eof() {
            Ok(()) => Step::Done,
            Err(e) => Step::Failed(e),
        };
    }
    Step::Pending
}

/// A TLS session for `endpoint` if it is `https://`.
pub fn tls_session(endpoint: &Endpoint) -> Result<Option<Box<rustls::ClientConnection>>, ClientError> {
    let Some(tls) = &endpoint.tls else { return Ok(None) };
    rustls::ClientConnection::new(Arc::clone(&tls.config), tls.name.clone())
        .map(|c| Some(Box::new(c)))
        .map_err(|e| ClientError::Connect(format!("TLS: {e}")))
}

/// Send what is queued: the request bytes, through TLS when there is a session
/// (rustls buffers them until the handshake is done), until done or `WouldBlock`.
fn transmit(u: &mut UpConn) -> io::Result<()> {
    let Some(tls) = u.tls.as_mut() else { return write_some(&mut u.sock, &u.out, &mut u.out_pos) };
    loop {
        while u.out_pos < u.out.len() {
            match io::Write::write(&mut tls.writer(), &u.out[u.out_pos..])? {
                0 => break, // rustls' buffer is full until records go out
                n => u.out_pos += n,
            }
        }
        if !tls.wants_write() {
            return Ok(());
        }
        while tls.wants_write() {
            match tls.write_tls(&mut u.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Read what has arrived into `inbuf` (plaintext after TLS), until
/// `WouldBlock`, the end of the stream, or `cap` bytes buffered. `Ok(true)` at
/// the end (a TCP close, with or without TLS `close_notify`).
fn receive(u: &mut UpConn, scratch: &mut [u8], cap: usize) -> Result<bool, ClientError> {
    let Some(tls) = u.tls.as_mut() else {
        return read_plain(&mut u.sock, &mut u.inbuf, scratch, cap).map_err(closed_or);
    };
    loop {
        // Plaintext rustls already decrypted comes first.
        loop {
            if u.inbuf.len() >= cap {
                return Ok(false);
            }
            match io::Read::read(&mut tls.reader(), scratch) {
                Ok(0) => return Ok(true),
                Ok(n) => u.inbuf.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(true),
                Err(e) => return Err(closed_or(e)),
            }
        }
        match tls.read_tls(&mut u.sock) {
            Ok(_) => {
                // `Ok(0)` is the TCP end: rustls records it, and the reader above reports it.
                tls.process_new_packets().map_err(|e| ClientError::Connect(format!("TLS: {e}")))?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(closed_or(e)),
        }
    }
}

/// A connection-level I/O error as the client sees it.
fn closed_or(e: io::Error) -> ClientError {
    match e.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof => {
            ClientError::Closed
        }
        _ => ClientError::Connect(e.to_string()),
    }
}
