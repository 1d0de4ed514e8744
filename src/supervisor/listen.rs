//! The listening sockets: one per worker slot, all bound to the same address
//! with `SO_REUSEPORT`, created and kept by the supervisor. Where an eBPF
//! program may be loaded (root or `CAP_BPF`), the plain and TLS groups give
//! new connections to the slots in turn ([`spread_in_turn`]); elsewhere the
//! kernel's hash of addresses and ports places them.
//!
//! HTTP/3's UDP slot sockets are bound the same way, in slot order, and carry
//! a classic BPF program ([`steering_program`]) that sends each QUIC packet to
//! the slot its connection ID names.
//!
//! Because the supervisor holds each slot's socket for the life of the slot,
//! a worker that dies does not close it: connections the kernel queued for
//! that slot wait for the replacement instead of being reset.
//!
//! Sockets can also arrive ready-made through `LISTEN_FDS`: from systemd
//! (socket activation, `systemd/forkd.socket`; `ListenDatagram=` for HTTP/3's
//! UDP) or from the previous supervisor during a binary upgrade (`SIGUSR2`),
//! TCP and UDP slot sockets alike, which also hands over a
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
/// by the supervisor like the TCP ones and read by the slot's worker.
pub fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// A value the steering program returns for "no slot": out of range of any group, so the
/// kernel falls back to its hash of the addresses and ports.
const NO_SLOT: u32 = u32::MAX;

/// The classic BPF program that steers a QUIC packet to the socket of the slot its
/// destination connection ID names (`crate::http3::keys`: `slot (2, big-endian) ‖ …`, 12
/// bytes). The kernel runs it on the UDP payload and uses what it returns as an index into
/// the port's `SO_REUSEPORT` group (sockets in the order they were bound); an index past the
/// group's end makes it fall back to its hash.
///
/// - short header (first bit 0): the two bytes after the first one (the DCID's start; its
///   length is not on the wire, only the server knows it);
/// - long header (first bit 1) whose DCID length (byte 5) is 12: the two bytes at offset 6;
///   any other length (a client's first Initial, with a DCID it chose) falls back;
/// - a datagram too short to hold those bytes falls back too (a cBPF load past the end would
///   end the program with 0, i.e. slot 0).
pub fn steering_program() -> [libc::sock_filter; 13] {
    const fn op(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
        libc::sock_filter { code: code as u16, jt, jf, k }
    }
    use libc::{
        BPF_A, BPF_ABS, BPF_B, BPF_H, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_LEN, BPF_RET, BPF_W,
    };
    let cid_len = crate::http3::keys::CID_LEN as u32;
    [
        /* 0 */ op(BPF_LD | BPF_W | BPF_LEN, 0, 0, 0),
        /* 1 */ op(BPF_JMP | BPF_JGE | BPF_K, 0, 10, 3), // < 3 bytes: fall back (12)
        /* 2 */ op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
        /* 3 */ op(BPF_JMP | BPF_JSET | BPF_K, 2, 0, 0x80), // long header: 6
        /* 4 */ op(BPF_LD | BPF_H | BPF_ABS, 0, 0, 1),
        /* 5 */ op(BPF_RET | BPF_A, 0, 0, 0),
        /* 6 */ op(BPF_LD | BPF_W | BPF_LEN, 0, 0, 0),
        /* 7 */ op(BPF_JMP | BPF_JGE | BPF_K, 0, 4, 8), // < 8 bytes: fall back (12)
        /* 8 */ op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 5),
        /* 9 */ op(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, cid_len), // another length: fall back (12)
        /* 10 */ op(BPF_LD | BPF_H | BPF_ABS, 0, 0, 6),
        /* 11 */ op(BPF_RET | BPF_A, 0, 0, 0),
        /* 12 */ op(BPF_RET | BPF_K, 0, 0, NO_SLOT),
    ]
}

/// Attach [`steering_program`] to the `SO_REUSEPORT` group of `socket` (any socket of the
/// group: the program is the group's, and sockets bound later inherit it). Call once every
/// slot socket is bound, bound in slot order: the kernel numbers a group's sockets in the
/// order of their `bind`, so group index = slot. Fails on kernels before 4.5.
pub fn attach_steering(socket: &UdpSocket) -> io::Result<()> {
    crate::sys::reuseport::attach_classic(socket, &steering_program())
}

/// Give each new connection on `first`'s `SO_REUSEPORT` group to the next of its `n` slot
/// sockets in turn, instead of by the kernel's hash of addresses and ports (which can put
/// 60 of 100 connections opened together on one of two workers, whose clients then wait
/// longer). Call once the `n` slot sockets are bound. Fails where loading an eBPF program
/// is not allowed (no `CAP_BPF`) or the kernel is older than 5.12; the hash then decides
/// (any program attached before is taken off).
pub fn spread_in_turn(first: &TcpListener, n: usize) -> io::Result<()> {
    let n = u32::try_from(n).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many slots"))?;
    crate::sys::reuseport::attach_round_robin(first, n).inspect_err(|_| {
        // A program left from before, counting another number of slots, would starve a
        // slot added since: without a new one, the hash decides.
        let _ = crate::sys::reuseport::detach(first);
    })
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
/// `LISTEN_FDNAMES` name of an HTTP/3 UDP slot socket handed over by an upgrade. A datagram
/// socket is taken for HTTP/3 whatever its name (systemd names every socket of a unit alike).
pub const UDP_FD_NAME: &str = "forkd-quic";
/// `LISTEN_FDNAMES` name of a pipe holding the secret the session-ticket keys derive from,
/// handed over by an upgrade so that sessions resume across it.
pub const TLS_SECRET_FD_NAME: &str = "forkd-tls-secret";
/// `LISTEN_FDNAMES` name of a pipe listing the old supervisor's workers (`slot pid` lines),
/// handed over by an upgrade that has HTTP/3: they read the slots' UDP sockets until they
/// have drained, so the new workers of each slot leave those sockets alone until then.
pub const WORKERS_FD_NAME: &str = "forkd-workers";
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
    /// HTTP/3 UDP sockets, bound, in slot order (non-blocking).
    pub udp: Vec<UdpSocket>,
    /// During a binary upgrade with HTTP/3: the old supervisor's workers, `(slot, pid)`.
    pub old_workers: Vec<(usize, i32)>,
}

/// `slot pid` lines (what [`WORKERS_FD_NAME`] carries); anything else is skipped.
pub fn parse_workers(bytes: &[u8]) -> Vec<(usize, i32)> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| {
            let (slot, pid) = l.split_once(' ')?;
            Some((slot.parse().ok()?, pid.parse().ok().filter(|&p: &i32| p > 0)?))
        })
        .collect()
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
        if name == WORKERS_FD_NAME {
            out.old_workers = read_pipe(fd, "list of the old workers").map(|b| parse_workers(&b)).unwrap_or_default();
            continue;
        }
        let l = crate::sys::listener_from_fd(fd);
        if socket2::SockRef::from(&l).r#type().ok() == Some(Type::DGRAM) {
            let udp = UdpSocket::from(std::os::fd::OwnedFd::from(l));
            let bound = udp.local_addr().is_ok_and(|a| a.port() != 0);
            if !bound || udp.set_nonblocking(true).is_err() {
                log::warn!("LISTEN_FDS: descriptor {fd} ({name:?}) is an unbound datagram socket; ignored");
                continue;
            }
            out.udp.push(udp);
            continue;
        }
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

/// [`another`] for an HTTP/3 UDP socket: a new `SO_REUSEPORT` socket on `first`'s address,
/// else a second handle on `first` (a socket from systemd without `ReusePort=yes`: the slots
/// then share it, and steering has a group of one).
pub fn another_udp(first: &UdpSocket) -> io::Result<UdpSocket> {
    bind_udp(first.local_addr()?).or_else(|_| first.try_clone())
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

    /// `n` slot sockets on one loopback port, bound in slot order as the supervisor binds
    /// them, the steering program attached.
    fn steered_group(n: usize) -> Vec<UdpSocket> {
        let first = bind_udp("127.0.0.1:0".parse().expect("literal")).expect("bind");
        let addr = first.local_addr().expect("addr");
        let mut group = vec![first];
        for _ in 1..n {
            group.push(bind_udp(addr).expect("bind another"));
        }
        attach_steering(&group[0]).expect("SO_ATTACH_REUSEPORT_CBPF");
        group
    }

    /// Send `payload` to the group's port and say which socket (index in `group`) got it.
    fn arrives_at(group: &[UdpSocket], payload: &[u8]) -> usize {
        arrives_from(group, &UdpSocket::bind("127.0.0.1:0").expect("client"), payload)
    }

    /// [`arrives_at`] from `client`.
    fn arrives_from(group: &[UdpSocket], client: &UdpSocket, payload: &[u8]) -> usize {
        let to = group[0].local_addr().expect("addr");
        client.send_to(payload, to).expect("send");
        let mut poll = mio::Poll::new().expect("poll");
        let fds: Vec<std::os::fd::RawFd> = group.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        for (i, fd) in fds.iter().enumerate() {
            poll.registry()
                .register(&mut mio::unix::SourceFd(fd), mio::Token(i), mio::Interest::READABLE)
                .expect("register");
        }
        let mut events = mio::Events::with_capacity(8);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "the datagram arrived at no socket");
            poll.poll(&mut events, Some(left)).expect("poll");
            for e in &events {
                let i = e.token().0;
                let mut buf = [0u8; 128];
                if let Ok((n, from)) = group[i].recv_from(&mut buf) {
                    assert_eq!((&buf[..n], from), (payload, client.local_addr().expect("addr")));
                    return i;
                }
            }
        }
    }

    /// A short-header packet whose DCID starts with `slot`.
    fn short(slot: u16) -> Vec<u8> {
        let mut p = vec![0x40];
        p.extend_from_slice(&slot.to_be_bytes());
        p.extend_from_slice(&[0xab; 30]);
        p
    }

    /// A long-header (Handshake) packet with a DCID of `dcid_len` bytes starting with `slot`.
    fn long(slot: u16, dcid_len: u8) -> Vec<u8> {
        let mut p = vec![0xe0, 0, 0, 0, 1, dcid_len];
        let mut dcid = vec![0x5a; usize::from(dcid_len)];
        dcid[..2].copy_from_slice(&slot.to_be_bytes());
        p.extend_from_slice(&dcid);
        p.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8]);
        p.extend_from_slice(&[0xcd; 40]);
        p
    }

    #[test]
    fn packets_reach_the_slot_their_connection_id_names() {
        let n = 4;
        let group = steered_group(n);
        for slot in 0..n {
            let s = slot as u16;
            assert_eq!(arrives_at(&group, &short(s)), slot, "short header, slot {slot}");
            assert_eq!(arrives_at(&group, &long(s, 12)), slot, "long header, slot {slot}");
        }
        // The same again in reverse order: steering, not a round robin.
        for slot in (0..n).rev() {
            assert_eq!(arrives_at(&group, &short(slot as u16)), slot);
        }
    }

    #[test]
    fn anything_else_falls_back_to_the_kernels_hash() {
        let group = steered_group(3);
        // A client's first Initial (its own 8-byte DCID), a slot past the group, runts.
        for p in [long(1, 8), long(2, 20), short(3), short(0xffff), vec![0x40, 0], vec![0xc0; 7], vec![]] {
            assert!(arrives_at(&group, &p) < 3, "{p:?}");
        }
        // One 4-tuple keeps its socket (the hash): every packet of a first flight meets the
        // same worker.
        let client = UdpSocket::bind("127.0.0.1:0").expect("client");
        let at = arrives_from(&group, &client, &long(7, 8));
        for _ in 0..5 {
            assert_eq!(arrives_from(&group, &client, &long(7, 8)), at);
        }
    }

    #[test]
    fn sockets_bound_later_inherit_the_program_and_a_closed_one_is_replaced_by_the_last() {
        let mut group = steered_group(2);
        let addr = group[0].local_addr().expect("addr");
        group.push(bind_udp(addr).expect("a third slot (SIGTTIN)"));
        assert_eq!(arrives_at(&group, &short(2)), 2, "the program applies to a socket bound after it");
        // The kernel moves the group's last socket into a closed one's place: which is why
        // the supervisor only ever closes the last slot's socket (SIGTTOU, smaller reload).
        let gone = group.remove(1);
        drop(gone);
        assert_eq!(arrives_at(&group, &short(1)), 1, "index 1 is now the old slot 2's socket");
        assert!(arrives_at(&group, &short(2)) < 2, "index 2 is out of range: fallback");
    }

    #[test]
    fn the_old_workers_list_keeps_well_formed_lines_only() {
        assert_eq!(parse_workers(b"0 4242\n1 4243\n"), vec![(0, 4242), (1, 4243)]);
        let hostile = b"0 0\n1 -5\nx 7\n2\n3 99999999999\n\xff\xfe 1\n4 17 extra\n5 18";
        assert_eq!(parse_workers(hostile), vec![(5, 18)]);
        assert!(parse_workers(b"").is_empty());
    }

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

    /// Where each of `count` connections to `group` (opened together, then accepted) landed.
    fn connections_per_socket(group: &[TcpListener], count: usize) -> Vec<usize> {
        let addr = group[0].local_addr().expect("addr");
        let clients: Vec<std::net::TcpStream> =
            (0..count).map(|_| std::net::TcpStream::connect(addr).expect("connect")).collect();
        let mut per = vec![0; group.len()];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while per.iter().sum::<usize>() < count {
            assert!(std::time::Instant::now() < deadline, "accepted {per:?} of {count}");
            for (i, l) in group.iter().enumerate() {
                while l.accept().is_ok() {
                    per[i] += 1;
                }
            }
            std::thread::yield_now();
        }
        drop(clients);
        per
    }

    /// Loading eBPF needs `CAP_BPF`; the tests run as root in CI, where it must work.
    fn may_load_bpf() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")))
            .unwrap_or(false)
    }

    #[test]
    fn connections_opened_together_are_spread_in_turn() {
        let first = bind("127.0.0.1:0".parse().expect("literal")).expect("bind");
        let addr = first.local_addr().expect("addr");
        let group = vec![first, bind(addr).expect("bind"), bind(addr).expect("bind")];
        match spread_in_turn(&group[0], group.len()) {
            Ok(()) => assert_eq!(connections_per_socket(&group, 30), [10, 10, 10]),
            Err(e) => assert!(!may_load_bpf(), "as root the program must load: {e}"),
        }
    }

    #[test]
    fn a_group_whose_program_is_taken_off_goes_back_to_the_hash() {
        let first = bind("127.0.0.1:0".parse().expect("literal")).expect("bind");
        let addr = first.local_addr().expect("addr");
        let group = vec![first, bind(addr).expect("bind")];
        // Every connection to the second socket: a program that returns 1, then none.
        let all_to_one = [libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: 1 }];
        crate::sys::reuseport::attach_classic(&group[0], &all_to_one).expect("attach");
        assert_eq!(connections_per_socket(&group, 8), [0, 8]);
        crate::sys::reuseport::detach(&group[0]).expect("detach");
        let per = connections_per_socket(&group, 40);
        assert!(per[0] > 0 && per[1] > 0, "the hash gives both some of 40: {per:?}");
    }
}
