//! The listening sockets: one per worker slot, all bound to the same address
//! with `SO_REUSEPORT`, created and kept by the supervisor.
//!
//! Because the supervisor holds each slot's socket for the life of the slot,
//! a worker that dies does not close it: connections the kernel queued for
//! that slot wait for the replacement instead of being reset.
//!
//! Sockets can also arrive ready-made through `LISTEN_FDS`: from systemd
//! (socket activation, `systemd/forkd.socket`) or from the previous
//! supervisor during a binary upgrade (`SIGUSR2`), which also hands over a
//! pipe named [`UPGRADE_FD_NAME`] to report readiness on and, in development,
//! one named [`SECRET_FD_NAME`] with the generated signing secret.

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};

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

/// Bind a non-blocking `SO_REUSEPORT` UDP socket on `addr`: one per slot for HTTP/3, kept
/// by the supervisor like the TCP ones (not yet read by the workers).
pub fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// [`ensure_free`] for a UDP address: a probe without `SO_REUSEPORT` cannot bind while any
/// socket is bound to it.
pub fn ensure_free_udp(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    probe.bind(&addr.into())
}

/// Fail with [`io::ErrorKind::AddrInUse`] when another socket already
/// listens on `addr` (another service, or another forkd).
///
/// `SO_REUSEPORT` lets any socket of the same user with the option join the
/// port's group: a second forkd would bind its listeners without an error
/// and take a share of the traffic. So, before binding its own, the
/// supervisor binds a probe socket without `SO_REUSEPORT`, which the kernel
/// refuses while anything listens on the address. (`SO_REUSEADDR` on the
/// probe lets connections of an earlier run in `TIME_WAIT` pass.) Port 0 is
/// always free. Not for sockets handed over by systemd or an upgrade: those
/// are meant to be shared.
pub fn ensure_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into())
}

/// `LISTEN_FDNAMES` name of the pipe on which a new supervisor tells the old
/// one, during a binary upgrade, that it serves.
pub const UPGRADE_FD_NAME: &str = "forkd-upgrade";
/// `LISTEN_FDNAMES` name of a listening socket handed over by an upgrade.
pub const LISTEN_FD_NAME: &str = "forkd";
/// `LISTEN_FDNAMES` name of a TLS listening socket (`tls.listen`), from an upgrade or from
/// systemd (`FileDescriptorName=forkd-tls` in `systemd/forkd-tls.socket`). Any other name is
/// a plain listener.
pub const TLS_FD_NAME: &str = "forkd-tls";
/// `LISTEN_FDNAMES` name of a pipe holding the secret the session-ticket keys derive from,
/// handed over by an upgrade so that sessions resume across it.
pub const TLS_SECRET_FD_NAME: &str = "forkd-tls-secret";
/// `LISTEN_FDNAMES` name of a pipe holding the development signing secret,
/// handed over by an upgrade so that tokens survive it. The secret travels in
/// a pipe, never in the environment (which `/proc/PID/environ` shows).
pub const SECRET_FD_NAME: &str = "forkd-secret";
/// The longest secret read from that pipe.
const SECRET_MAX: u64 = 4096;

/// What this process was handed at start.
#[derive(Default)]
pub struct Inherited {
    /// Listening sockets, in order (non-blocking).
    pub listeners: Vec<TcpListener>,
    /// During a binary upgrade: the pipe to the old supervisor.
    pub upgrade: Option<std::fs::File>,
    /// During a binary upgrade in development: the old supervisor's generated signing secret.
    pub secret: Option<Vec<u8>>,
    /// TLS listening sockets, in order (non-blocking).
    pub tls_listeners: Vec<TcpListener>,
    /// During a binary upgrade: the old supervisor's session-ticket secret.
    pub tls_secret: Option<Vec<u8>>,
}

/// The bytes of a handed-over pipe (at most [`SECRET_MAX`]); `what` names it in the warning.
fn read_pipe(fd: std::os::fd::RawFd, what: &str) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    match std::io::Read::read_to_end(&mut std::io::Read::take(crate::sys::file_from_fd(fd), SECRET_MAX), &mut bytes) {
        Ok(_) => Some(bytes),
        Err(e) => {
            log::warn!("LISTEN_FDS: cannot read the handed-over {what}: {e}");
            None
        }
    }
}

/// Take the descriptors passed through `LISTEN_FDS` (call once, at start).
pub fn inherited() -> Inherited {
    let mut out = Inherited::default();
    for (fd, name) in crate::sys::take_listen_fds() {
        if name == UPGRADE_FD_NAME {
            out.upgrade = Some(crate::sys::file_from_fd(fd));
            continue;
        }
        if name == SECRET_FD_NAME {
            out.secret = read_pipe(fd, "signing secret");
            continue;
        }
        if name == TLS_SECRET_FD_NAME {
            out.tls_secret = read_pipe(fd, "session-ticket secret");
            continue;
        }
        let l = crate::sys::listener_from_fd(fd);
        let listening = socket2::SockRef::from(&l).is_listener().unwrap_or(false);
        if !listening || l.set_nonblocking(true).is_err() {
            log::warn!("LISTEN_FDS: descriptor {fd} ({name:?}) is not a listening TCP socket; ignored");
            continue;
        }
        match name.as_str() {
            TLS_FD_NAME => out.tls_listeners.push(l),
            _ => out.listeners.push(l),
        }
    }
    out
}

/// Another socket on the address `first` listens on: a new `SO_REUSEPORT`
/// socket when the address allows it, else a second handle on `first` (the
/// slots then share its accept queue, e.g. a socket from systemd without
/// `ReusePort=yes`).
pub fn another(first: &TcpListener) -> io::Result<TcpListener> {
    let addr = first.local_addr()?;
    bind(addr).or_else(|_| first.try_clone())
}

/// The URL to open in a browser for a service listening on `addr`: a wildcard address
/// (`0.0.0.0`, `::`) becomes the loopback address of its family, which reaches it from the
/// same machine; an IPv6 host is bracketed. `http://127.0.0.1:8080/` for the default.
pub fn url(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => format!("http://127.0.0.1:{}/", a.port()),
        SocketAddr::V4(a) => format!("http://{a}/"),
        SocketAddr::V6(a) if a.ip().is_unspecified() => format!("http://[::1]:{}/", a.port()),
        SocketAddr::V6(a) => format!("http://[{}]:{}/", a.ip(), a.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_to_open_for_a_listen_address() {
        let url = |s: &str| url(s.parse().expect("literal"));
        assert_eq!(url("127.0.0.1:8080"), "http://127.0.0.1:8080/");
        assert_eq!(url("0.0.0.0:80"), "http://127.0.0.1:80/");
        assert_eq!(url("192.0.2.7:8443"), "http://192.0.2.7:8443/");
        assert_eq!(url("[::]:8080"), "http://[::1]:8080/");
        assert_eq!(url("[::1]:8080"), "http://[::1]:8080/");
        assert_eq!(url("[2001:db8::1]:9000"), "http://[2001:db8::1]:9000/");
        // A scope id would need %25 in a URL; it is left out, as browsers do not take one.
        assert_eq!(url("[fe80::1%2]:8080"), "http://[fe80::1]:8080/");
    }
}
