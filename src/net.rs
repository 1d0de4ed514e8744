//! Non-blocking socket reads and writes shared by the worker's client connections and its
//! upstream connections: read until `WouldBlock`, the end or a cap; write until done or
//! `WouldBlock`. No buffering policy, no protocol: callers own their buffers.

use std::io::{self, Read, Write};

use mio::net::TcpStream;

/// Read plain bytes until `WouldBlock`, EOF or `cap` bytes buffered. `Ok(true)` on EOF.
pub fn read_plain(sock: &mut TcpStream, inbuf: &mut Vec<u8>, scratch: &mut [u8], cap: usize) -> io::Result<bool> {
    loop {
        if inbuf.len() >= cap {
            return Ok(false);
        }
        match sock.read(scratch) {
            Ok(0) => return Ok(true),
            Ok(n) => inbuf.extend_from_slice(&scratch[..n]),
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
