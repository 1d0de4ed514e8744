//! A worker's HTTP/3 inbox: a non-blocking `AF_UNIX` datagram socket bound to the abstract
//! name `\0forkd-h3-<udp port>-<pid>`, through which the workers of one slot hand the slot's
//! UDP socket over (`http3/handover.rs` decides who reads it; this file only moves bytes).
//!
//! Messages, the first byte their kind (a new kind is a new byte; a message of an unknown
//! kind is ignored):
//! - `H` hello (successor → predecessor): "stop reading the slot's socket";
//! - `A` ack (predecessor → the hello's sender): one byte, the predecessor's CID generation;
//! - `P` packet (successor → predecessor): the peer's address (`4` ‖ IPv4 (4) ‖ port (2), or
//!   `6` ‖ IPv6 (16) ‖ port (2) ‖ scope id (4), big-endian), then one UDP datagram.
//!
//! Abstract names are listed in `/proc/net/unix` and any process may send to one: the socket
//! has `SO_PASSCRED`, and a message is taken only when the kernel's `SCM_CREDENTIALS` say its
//! sender runs as our effective uid. A packet goes out in one `sendmsg` of two slices (its
//! address header on the stack and the datagram where it was received): no copy and no
//! allocation per packet. The name goes with the process: nothing to clean up. It must not
//! know about QUIC, connections or the poll (the caller registers [`Inbox::source`]).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, UnixCredentials,
};

/// Kind byte of a hello.
const HELLO: u8 = b'H';
/// Kind byte of an ack.
const ACK: u8 = b'A';
/// Kind byte of a forwarded packet.
const PACKET: u8 = b'P';
/// The longest packet header: kind, family, IPv6 address, port, scope id.
pub const MAX_HEADER: usize = 1 + 1 + 16 + 2 + 4;

/// A message between two workers' inboxes.
#[derive(Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// The sender is our successor on the slot: stop reading its socket.
    Hello,
    /// The sender (a predecessor) stopped reading; its connection IDs carry this generation.
    Ack(u8),
    /// A datagram of one of our connections, from `peer`, read by the successor.
    Packet(SocketAddr, &'a [u8]),
}

/// A message taken from the inbox.
#[derive(Debug)]
pub struct Received<'a> {
    /// The sender's pid (from the kernel's credentials).
    pub pid: i32,
    /// The sender's address (where an ack goes), when it is bound.
    pub from: Option<UnixAddr>,
    /// What it says.
    pub msg: Msg<'a>,
}

/// The abstract address of the inbox of worker `pid` serving HTTP/3 on UDP port `port`.
pub fn address(port: u16, pid: i32) -> io::Result<UnixAddr> {
    UnixAddr::new_abstract(format!("forkd-h3-{port}-{pid}").as_bytes()).map_err(io::Error::from)
}

/// The header of a packet from `peer` into `out`; returns its length.
pub fn packet_header(peer: SocketAddr, out: &mut [u8; MAX_HEADER]) -> usize {
    out[0] = PACKET;
    match peer {
        SocketAddr::V4(a) => {
            out[1] = 4;
            out[2..6].copy_from_slice(&a.ip().octets());
            out[6..8].copy_from_slice(&a.port().to_be_bytes());
            8
        }
        SocketAddr::V6(a) => {
            out[1] = 6;
            out[2..18].copy_from_slice(&a.ip().octets());
            out[18..20].copy_from_slice(&a.port().to_be_bytes());
            out[20..24].copy_from_slice(&a.scope_id().to_be_bytes());
            24
        }
    }
}

/// What the bytes of one message say; `None` for a short, long or unknown one.
pub fn decode(data: &[u8]) -> Option<Msg<'_>> {
    match *data.first()? {
        HELLO if data.len() == 1 => Some(Msg::Hello),
        ACK if data.len() == 2 => Some(Msg::Ack(data[1])),
        PACKET => {
            let (peer, rest) = match *data.get(1)? {
                4 => {
                    let ip: [u8; 4] = data.get(2..6)?.try_into().ok()?;
                    let port = u16::from_be_bytes(data.get(6..8)?.try_into().ok()?);
                    (SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port)), &data[8..])
                }
                6 => {
                    let ip: [u8; 16] = data.get(2..18)?.try_into().ok()?;
                    let port = u16::from_be_bytes(data.get(18..20)?.try_into().ok()?);
                    let scope = u32::from_be_bytes(data.get(20..24)?.try_into().ok()?);
                    (SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope)), &data[24..])
                }
                _ => return None,
            };
            (!rest.is_empty()).then_some(Msg::Packet(peer, rest))
        }
        _ => None,
    }
}

/// The message in `data` if its sender may send it: credentials present, with our uid `own`
/// (`creds`: the sender's pid and uid).
pub fn accept(data: &[u8], creds: Option<(i32, u32)>, own: u32) -> Option<(i32, Msg<'_>)> {
    let (pid, uid) = creds?;
    if uid != own || pid <= 0 {
        return None;
    }
    Some((pid, decode(data)?))
}

/// One worker's inbox.
#[derive(Debug)]
pub struct Inbox {
    sock: mio::net::UnixDatagram,
    uid: u32,
    /// Room for the credentials of one message.
    cmsg: Vec<u8>,
}

impl Inbox {
    /// Binds this process's inbox for UDP port `port`.
    pub fn open(port: u16) -> io::Result<Inbox> {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        // Before the name exists, so that every message it gets carries credentials.
        socket::setsockopt(&fd, sockopt::PassCred, &true)?;
        socket::bind(fd.as_raw_fd(), &address(port, std::process::id() as i32)?)?;
        let sock = mio::net::UnixDatagram::from_std(std::os::unix::net::UnixDatagram::from(fd));
        Ok(Inbox { sock, uid: nix::unistd::geteuid().as_raw(), cmsg: nix::cmsg_space!(UnixCredentials) })
    }

    /// What to register with the poll (readable: messages wait).
    pub fn source(&mut self) -> &mut mio::net::UnixDatagram {
        &mut self.sock
    }

    /// Sends the bytes of `parts` as one message to `to`, without blocking: `WouldBlock` when
    /// its queue is full, `ConnectionRefused` / `NotFound` when no inbox has that name.
    fn send(&self, to: &UnixAddr, parts: &[IoSlice<'_>]) -> io::Result<()> {
        loop {
            match socket::sendmsg(self.sock.as_raw_fd(), parts, &[], MsgFlags::MSG_DONTWAIT, Some(to)) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Says hello to the inbox `to`.
    pub fn hello(&self, to: &UnixAddr) -> io::Result<()> {
        self.send(to, &[IoSlice::new(&[HELLO])])
    }

    /// Acks a hello from `to`, with our CID generation.
    pub fn ack(&self, to: &UnixAddr, generation: u8) -> io::Result<()> {
        self.send(to, &[IoSlice::new(&[ACK, generation])])
    }

    /// Forwards `datagram`, received from `peer`, to the inbox `to`.
    pub fn forward(&self, to: &UnixAddr, peer: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        let mut head = [0u8; MAX_HEADER];
        let n = packet_header(peer, &mut head);
        self.send(to, &[IoSlice::new(&head[..n]), IoSlice::new(datagram)])
    }

    /// Takes one message into `buf`: `Ok(None)` when one was read and ignored (malformed,
    /// truncated, without credentials or from another uid), `WouldBlock` when none waits.
    pub fn recv<'b>(&mut self, buf: &'b mut [u8]) -> io::Result<Option<Received<'b>>> {
        let (n, creds, from) = loop {
            let mut iov = [IoSliceMut::new(&mut *buf)];
            match socket::recvmsg::<UnixAddr>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut self.cmsg),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
            ) {
                Ok(msg) => {
                    let mut creds = None;
                    if let Ok(cmsgs) = msg.cmsgs() {
                        for c in cmsgs {
                            if let ControlMessageOwned::ScmCredentials(c) = c {
                                creds = Some((c.pid(), c.uid()));
                            }
                        }
                    }
                    // With MSG_TRUNC the length is the message's, also when it did not fit.
                    let n = if msg.flags.contains(MsgFlags::MSG_TRUNC) { usize::MAX } else { msg.bytes };
                    break (n, creds, msg.address);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        if n > buf.len() {
            return Ok(None);
        }
        Ok(accept(&buf[..n], creds, self.uid).map(|(pid, msg)| Received { pid, from, msg }))
    }
}

/// Whether `e` says no inbox has the name sent to (its process exited, or it has none).
pub fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED) | Some(libc::ENOENT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        assert_eq!(decode(b"H"), Some(Msg::Hello));
        assert_eq!(decode(&[ACK, 0xa5]), Some(Msg::Ack(0xa5)));
        let peers: [SocketAddr; 3] = [
            "127.0.0.1:4433".parse().unwrap(),
            "[2001:db8::7]:65535".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 9, 0, 3)),
        ];
        for peer in peers {
            let mut head = [0u8; MAX_HEADER];
            let n = packet_header(peer, &mut head);
            let mut msg = head[..n].to_vec();
            msg.extend_from_slice(b"\x40quic");
            assert_eq!(decode(&msg), Some(Msg::Packet(peer, b"\x40quic")), "{peer}");
        }
    }

    #[test]
    fn hostile_messages_are_ignored() {
        let mut v4 = [0u8; MAX_HEADER];
        let n = packet_header("10.0.0.1:1".parse().unwrap(), &mut v4);
        let mut v6 = [0u8; MAX_HEADER];
        let n6 = packet_header("[::1]:1".parse().unwrap(), &mut v6);
        let bad: Vec<&[u8]> = vec![
            b"",
            b"X",
            b"HH",
            b"A",
            b"A12",
            b"P",
            b"P\x05\x01\x02\x03\x04\x00\x01x",
            &v4[..n],      // no datagram
            &v4[..n - 1],  // short address
            &v6[..n6 - 1], // short scope id
            &v6[..n6],
        ];
        for b in bad {
            assert_eq!(decode(b), None, "{b:?}");
            assert_eq!(accept(b, Some((7, 1000)), 1000), None);
        }
        assert_eq!(accept(b"H", Some((7, 1000)), 1000), Some((7, Msg::Hello)));
        assert_eq!(accept(b"H", Some((7, 0)), 1000), None, "another uid");
        assert_eq!(accept(b"H", None, 1000), None, "no credentials");
        assert_eq!(accept(b"H", Some((0, 1000)), 1000), None, "no pid");
    }

    #[test]
    fn two_inboxes_talk_with_credentials() {
        // Ports no test server uses (the names are per process and port).
        let me = std::process::id() as i32;
        let mut a = Inbox::open(1).expect("inbox a");
        let err = Inbox::open(1).expect_err("one inbox per name");
        assert_eq!(err.raw_os_error(), Some(libc::EADDRINUSE));
        let mut b = Inbox::open(2).expect("inbox b");
        let (to_a, to_b) = (address(1, me).unwrap(), address(2, me).unwrap());
        let mut buf = vec![0u8; 2048];
        assert_eq!(b.recv(&mut buf).expect_err("empty").kind(), io::ErrorKind::WouldBlock);
        b.hello(&to_a).unwrap_or_else(|e| panic!("hello: {e}"));
        let got = a.recv(&mut buf).expect("a message").expect("accepted");
        assert_eq!((got.pid, got.msg), (me, Msg::Hello));
        assert_eq!(got.from.as_ref().and_then(UnixAddr::as_abstract), to_b.as_abstract(), "the sender's name");
        a.ack(&to_b, 9).expect("ack");
        let peer: SocketAddr = "[::1]:443".parse().unwrap();
        a.forward(&to_b, peer, &[0x41; 1200]).expect("forward");
        assert_eq!(b.recv(&mut buf).expect("ack").expect("accepted").msg, Msg::Ack(9));
        let p = b.recv(&mut buf).expect("packet").expect("accepted");
        assert_eq!(p.msg, Msg::Packet(peer, &[0x41; 1200][..]));
        // Too long for the buffer: read and ignored, not cut.
        a.forward(&to_b, peer, &[0x41; 4000]).expect("forward");
        assert!(b.recv(&mut buf).expect("read").is_none());
        // Hostile bytes from a raw socket of the same uid: ignored.
        use std::os::linux::net::SocketAddrExt;
        let raw = std::os::unix::net::UnixDatagram::unbound().expect("socket");
        let sa = std::os::unix::net::SocketAddr::from_abstract_name(format!("forkd-h3-2-{me}")).expect("name");
        raw.send_to_addr(b"Z", &sa).expect("send");
        raw.send_to_addr(b"", &sa).expect("send");
        assert!(b.recv(&mut buf).expect("read").is_none());
        assert!(b.recv(&mut buf).expect("read").is_none());
        drop(a);
        assert!(is_gone(&b.hello(&to_a).expect_err("a is gone")));
    }
}
