//! The listening sockets: one per worker slot, all bound to the same address
//! with `SO_REUSEPORT`, created and kept by the supervisor.
//!
//! Because the supervisor holds each slot's socket for the life of the slot,
//! a worker that dies does not close it: connections the kernel queued for
//! that slot wait for the replacement instead of being reset.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Accept-queue length requested (the kernel caps it at `somaxconn`).
const BACKLOG: i32 = 1024;

/// Bind a non-blocking `SO_REUSEPORT` listener on `addr`.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}
