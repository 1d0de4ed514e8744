//! Non-blocking socket reads and writes shared by the worker's client connections and its
//! upstream connections: read until `WouldBlock`, the end or a cap; write until done or
//! `WouldBlock`. No buffering policy, no protocol: callers own their buffers.

use std::io::{self, Read, Write};

use mio::net::TcpStream;

/// Read plain bytes until `WouldBlock`, EOF or `cap` bytes buffered. `Ok(true)` on EOF.
pub fn read_plain(sock: &mut TcpStream, inbuf: &mut Vec<u8>, scratch: &mut [u8], cap: usize) -> io::Result<bool> {
    read_plain_batch(sock, inbuf, scratch, cap, false)
}

/// [`read_plain`]; with `short_drains`, a read that fills less than `scratch` ends it too.
///
/// A short read from a TCP socket took everything queued at that moment, so the read that
/// would follow only says `WouldBlock`: one system call per batch saved (nginx does the
/// same). Only for a socket whose edge-triggered readiness just fired without the peer's
/// end or an error: anything that arrives after the short read raises a new edge. An end
/// already queued behind the data raises none, so a caller that may have one pending (a
/// read-closed event, or no event at all) reads on until `WouldBlock`.
pub fn read_plain_batch(
    sock: &mut TcpStream,
    inbuf: &mut Vec<u8>,
    scratch: &mut [u8],
    cap: usize,
    short_drains: bool,
) -> io::Result<bool> {
    loop {
        if inbuf.len() >= cap {
            return Ok(false);
        }
        match sock.read(scratch) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                inbuf.extend_from_slice(&scratch[..n]);
                if short_drains && n < scratch.len() {
                    return Ok(false);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Write from `buf[*pos..]` until done or `WouldBlock`.
pub fn write_some(sock: &mut TcpStream, buf: &[u8], pos: &mut usize) -> io::Result<()> {
    while *pos < buf.len() {
        match sock.write(&buf[*pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use mio::{Events, Interest, Poll, Token};

    use super::*;

    /// A connected pair: the client end (blocking) and the accepted end as a mio stream,
    /// registered for readable edges on `poll`.
    fn pair(poll: &Poll) -> (std::net::TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("nonblocking");
        let mut server = TcpStream::from_std(server);
        poll.registry().register(&mut server, Token(0), Interest::READABLE).expect("register");
        (client, server)
    }

    /// Waits (bounded) for a readable edge; whether it says the peer's end is there.
    fn edge(poll: &mut Poll, want_closed: bool) -> bool {
        let mut events = Events::with_capacity(4);
        for _ in 0..100 {
            poll.poll(&mut events, Some(Duration::from_millis(50))).expect("poll");
            if let Some(ev) = events.iter().find(|e| e.is_readable()) {
                if ev.is_read_closed() || !want_closed {
                    return ev.is_read_closed();
                }
            }
        }
        panic!("no readable edge");
    }

    #[test]
    fn a_short_read_ends_the_batch_and_leaves_a_queued_end_unread() {
        let mut poll = Poll::new().expect("poll");
        let (mut client, mut server) = pair(&poll);
        let mut scratch = [0u8; 64];
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
        edge(&mut poll, false);
        let mut inbuf = Vec::new();
        assert!(!read_plain_batch(&mut server, &mut inbuf, &mut scratch, usize::MAX, true).expect("read"));
        assert_eq!(inbuf, b"GET / HTTP/1.1\r\n\r\n");
        // Data and the end queued together: a short read takes the data only; reading on
        // to `WouldBlock` (what a read-closed edge asks for) finds the end.
        client.write_all(b"x").expect("write");
        client.shutdown(std::net::Shutdown::Write).expect("shutdown");
        assert!(edge(&mut poll, true), "the edge says the peer's end is there");
        inbuf.clear();
        assert!(!read_plain_batch(&mut server, &mut inbuf, &mut scratch, usize::MAX, true).expect("read"));
        assert_eq!(inbuf, b"x");
        assert!(read_plain(&mut server, &mut inbuf, &mut scratch, usize::MAX).expect("read"), "the end");
        // A read that fills the scratch buffer goes on (to the short one after it).
        let (mut client, mut server) = pair(&poll);
        client.write_all(&[b'a'; 100]).expect("write");
        edge(&mut poll, false);
        let mut inbuf = Vec::new();
        assert!(!read_plain_batch(&mut server, &mut inbuf, &mut scratch, usize::MAX, true).expect("read"));
        assert_eq!(inbuf.len(), 100);
    }
}
