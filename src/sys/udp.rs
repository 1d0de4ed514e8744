//! UDP segmentation offloads for QUIC, socket-level and HTTP/3-free: GSO (`UDP_SEGMENT`: one
//! `sendmsg` carries many datagrams of one size to one peer, the kernel or the NIC cuts them)
//! and GRO (`UDP_GRO`: one `recvmsg` returns several datagrams of one peer, glued, with their
//! size in a control message).
//!
//! It owns the probe of what the kernel offers (once per process), [`send_segments`] and
//! [`Receiver::recv`], each falling back to one datagram per system call where the offload is
//! missing or refused. It must not know about QUIC packets, connections or the poll: the
//! caller hands bytes already cut into segments of one size and splits what it receives by
//! the size reported.

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use nix::sys::socket::{self, sockopt, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrStorage};

/// The most segments one GSO `sendmsg` carries (the kernel's `UDP_MAX_SEGMENTS` was 64 before
/// Linux 6.6 and is 128 since; the lower one works on both).
pub const MAX_SEGMENTS: usize = 64;
/// The most bytes one GSO `sendmsg` carries (an IP datagram's 65 535 less IPv6 and UDP headers).
pub const MAX_GSO_BYTES: usize = 65_535 - 40 - 8;

/// What the kernel offers, probed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offload {
    /// `UDP_SEGMENT` (Linux 4.18).
    pub gso: bool,
    /// `UDP_GRO` (Linux 5.0).
    pub gro: bool,
}

/// Set when a GSO send failed in a way that says the path cannot segment (`EIO`: no checksum
/// offload on the device; `EINVAL`): later sends go one datagram at a time.
static GSO_REFUSED: AtomicBool = AtomicBool::new(false);

/// What the kernel offers, probed on a throw-away socket the first time it is asked.
pub fn offload() -> Offload {
    static PROBED: OnceLock<Offload> = OnceLock::new();
    *PROBED.get_or_init(|| {
        let Ok(probe) = UdpSocket::bind("127.0.0.1:0") else { return Offload { gso: false, gro: false } };
        Offload {
            gso: socket::setsockopt(&probe, sockopt::UdpGsoSegment, &1200).is_ok(),
            gro: socket::setsockopt(&probe, sockopt::UdpGroSegment, &true).is_ok(),
        }
    })
}

/// Whether [`send_segments`] uses GSO now (offered and not refused since).
pub fn gso_in_use() -> bool {
    offload().gso && !GSO_REFUSED.load(Ordering::Relaxed)
}

/// Send `buf` to `dst` as datagrams of `segment_size` bytes (the last may be shorter): with
/// GSO, batches of up to [`MAX_SEGMENTS`] and [`MAX_GSO_BYTES`] per system call; else one
/// datagram per call. Returns the bytes sent, a whole number of segments (fewer than
/// `buf.len()` when the socket's buffer filled: send the rest when it is writable again);
/// `WouldBlock` when nothing could be sent. `socket` is any UDP socket (std's or mio's).
pub fn send_segments<S: AsFd + AsRawFd>(
    socket: &S,
    dst: SocketAddr,
    buf: &[u8],
    segment_size: usize,
) -> io::Result<usize> {
    send_segments_with(socket, dst, buf, segment_size, gso_in_use())
}

fn send_segments_with<S: AsFd + AsRawFd>(
    socket: &S,
    dst: SocketAddr,
    buf: &[u8],
    segment_size: usize,
    gso: bool,
) -> io::Result<usize> {
    if segment_size == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "segment size 0"));
    }
    let batch = if gso && segment_size <= u16::MAX as usize {
        (MAX_GSO_BYTES / segment_size).clamp(1, MAX_SEGMENTS) * segment_size
    } else {
        segment_size
    };
    let to = SockaddrStorage::from(dst);
    let mut sent = 0;
    while sent < buf.len() {
        let chunk = &buf[sent..buf.len().min(sent + batch)];
        let result = if chunk.len() > segment_size {
            let size = segment_size as u16;
            let r = socket::sendmsg(
                socket.as_raw_fd(),
                &[IoSlice::new(chunk)],
                &[ControlMessage::UdpGsoSegments(&size)],
                MsgFlags::empty(),
                Some(&to),
            );
            match r {
                Err(nix::errno::Errno::EIO | nix::errno::Errno::EINVAL) => {
                    log::warn!("UDP GSO refused on the path to {dst}; sending one datagram per call");
                    GSO_REFUSED.store(true, Ordering::Relaxed);
                    return match send_segments_with(socket, dst, &buf[sent..], segment_size, false) {
                        Ok(n) => Ok(sent + n),
                        Err(e) if sent > 0 && e.kind() == io::ErrorKind::WouldBlock => Ok(sent),
                        Err(e) => Err(e),
                    };
                }
                r => r.map_err(io::Error::from),
            }
        } else {
            socket::sendto(socket.as_raw_fd(), chunk, &to, MsgFlags::empty()).map_err(io::Error::from)
        };
        match result {
            Ok(_) => sent += chunk.len(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if sent > 0 && e.kind() == io::ErrorKind::WouldBlock => return Ok(sent),
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// Turn GRO on for `socket`; false where the kernel lacks it (then every receive is one
/// datagram).
pub fn enable_gro<S: AsFd>(socket: &S) -> bool {
    offload().gro && socket::setsockopt(socket, sockopt::UdpGroSegment, &true).is_ok()
}

/// One receive: `len` bytes at the start of the buffer, from `from`, datagrams of
/// `segment_size` bytes each (the last may be shorter); `segment_size == len` for one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes received.
    pub len: usize,
    /// The peer.
    pub from: SocketAddr,
    /// The size of each datagram glued in the buffer.
    pub segment_size: usize,
}

/// Receives with GRO: holds the control-message buffer so that a receive allocates nothing.
pub struct Receiver {
    cmsg: Vec<u8>,
}

impl Default for Receiver {
    fn default() -> Receiver {
        Receiver::new()
    }
}

impl Receiver {
    /// A receiver with room for the GRO control message.
    pub fn new() -> Receiver {
        Receiver { cmsg: nix::cmsg_space!(i32) }
    }

    /// Receive into `buf` (64 KiB holds any GRO batch; a smaller buffer truncates it, which
    /// is reported as `InvalidData` with the batch lost). `WouldBlock` when nothing waits.
    pub fn recv<S: AsRawFd>(&mut self, socket: &S, buf: &mut [u8]) -> io::Result<Received> {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = loop {
            match socket::recvmsg::<SockaddrStorage>(
                socket.as_raw_fd(),
                &mut iov,
                Some(&mut self.cmsg),
                MsgFlags::MSG_DONTWAIT,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r.map_err(io::Error::from)?,
            }
        };
        if msg.flags.contains(MsgFlags::MSG_TRUNC) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "datagram larger than the buffer"));
        }
        let len = msg.bytes;
        let mut segment_size = len;
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::UdpGroSegments(size) = c {
                    segment_size = usize::try_from(size).unwrap_or(len).clamp(1, len.max(1));
                }
            }
        }
        let from = msg
            .address
            .and_then(|a| match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
                (Some(v4), _) => Some(SocketAddr::V4((*v4).into())),
                (_, Some(v6)) => Some(SocketAddr::V6((*v6).into())),
                _ => None,
            })
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no peer address"))?;
        Ok(Received { len, from, segment_size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn pair() -> (UdpSocket, UdpSocket) {
        let rx = UdpSocket::bind("127.0.0.1:0").expect("rx");
        let tx = UdpSocket::bind("127.0.0.1:0").expect("tx");
        rx.set_nonblocking(true).expect("nonblocking");
        (tx, rx)
    }

    /// `total` bytes whose every byte says its segment and offset.
    fn payload(total: usize, segment: usize) -> Vec<u8> {
        (0..total).map(|i| ((i / segment) * 31 + i % segment) as u8).collect()
    }

    /// Every datagram `rx` receives until `total` bytes came (at most 5 s), split by the
    /// segment size each receive reports; and how many receives that took.
    fn receive_all(rx: &UdpSocket, total: usize) -> (Vec<Vec<u8>>, usize) {
        let mut receiver = Receiver::new();
        let mut buf = vec![0u8; 65_536];
        let (mut datagrams, mut calls, mut got) = (Vec::new(), 0, 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < total {
            assert!(Instant::now() < deadline, "only {got} of {total} bytes arrived");
            match receiver.recv(rx, &mut buf) {
                Ok(r) => {
                    calls += 1;
                    got += r.len;
                    assert_eq!(r.from.ip(), std::net::Ipv4Addr::LOCALHOST);
                    datagrams.extend(buf[..r.len].chunks(r.segment_size).map(<[u8]>::to_vec));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(rx, deadline),
                Err(e) => panic!("recv: {e}"),
            }
        }
        (datagrams, calls)
    }

    /// Until `socket` is readable or `deadline`.
    fn wait_readable(socket: &UdpSocket, deadline: Instant) {
        let mut poll = mio::Poll::new().expect("poll");
        let fd = socket.as_raw_fd();
        poll.registry()
            .register(&mut mio::unix::SourceFd(&fd), mio::Token(0), mio::Interest::READABLE)
            .expect("register");
        let mut events = mio::Events::with_capacity(1);
        let _ = poll.poll(&mut events, Some(deadline.saturating_duration_since(Instant::now())));
    }

    fn expected(p: &[u8], segment: usize) -> Vec<Vec<u8>> {
        p.chunks(segment).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn the_kernel_here_has_both_offloads() {
        // Linux ≥ 5.0 (every supported distribution): both present; the probe is cached.
        assert_eq!(offload(), Offload { gso: true, gro: true });
        assert_eq!(offload(), offload());
    }

    #[test]
    fn segments_sent_with_gso_arrive_as_separate_datagrams_without_gro() {
        let (tx, rx) = pair();
        let p = payload(3 * 1200 + 500, 1200);
        assert_eq!(send_segments_with(&tx, rx.local_addr().expect("addr"), &p, 1200, true).expect("send"), p.len());
        let (datagrams, calls) = receive_all(&rx, p.len());
        assert_eq!(datagrams, expected(&p, 1200), "four datagrams, the last short");
        assert_eq!(calls, 4, "no GRO: one datagram per receive");
    }

    #[test]
    fn with_gro_one_receive_gets_the_batch_and_its_segment_size() {
        let (tx, rx) = pair();
        assert!(enable_gro(&rx));
        let p = payload(5 * 1000 + 10, 1000);
        assert_eq!(send_segments_with(&tx, rx.local_addr().expect("addr"), &p, 1000, true).expect("send"), p.len());
        let (datagrams, calls) = receive_all(&rx, p.len());
        assert_eq!(datagrams, expected(&p, 1000));
        assert_eq!(calls, 1, "the GSO batch stays whole to a GRO socket over loopback");
    }

    #[test]
    fn without_gso_the_same_bytes_go_one_datagram_per_call() {
        let (tx, rx) = pair();
        assert!(enable_gro(&rx));
        let p = payload(4 * 1350, 1350);
        assert_eq!(send_segments_with(&tx, rx.local_addr().expect("addr"), &p, 1350, false).expect("send"), p.len());
        let (datagrams, _) = receive_all(&rx, p.len());
        assert_eq!(datagrams, expected(&p, 1350));
    }

    #[test]
    fn large_sends_are_cut_into_batches_the_kernel_takes() {
        let (tx, rx) = pair();
        socket::setsockopt(&rx, sockopt::RcvBuf, &(4 << 20)).expect("SO_RCVBUF");
        // 150 segments of 1200: more than MAX_SEGMENTS and MAX_GSO_BYTES per call.
        let p = payload(150 * 1200, 1200);
        assert_eq!(send_segments(&tx, rx.local_addr().expect("addr"), &p, 1200).expect("send"), p.len());
        let (datagrams, _) = receive_all(&rx, p.len());
        assert_eq!(datagrams.len(), 150);
        assert_eq!(datagrams, expected(&p, 1200));
    }

    #[test]
    fn mio_sockets_send_and_receive_batches() {
        // The worker's socket is mio's: GSO out of it, GRO into one.
        let (std_tx, std_rx) = pair();
        let to = std_rx.local_addr().expect("addr");
        let (tx, rx) = (mio::net::UdpSocket::from_std(std_tx), mio::net::UdpSocket::from_std(std_rx));
        assert!(enable_gro(&rx));
        let p = payload(7 * 1200 + 3, 1200);
        assert_eq!(send_segments(&tx, to, &p, 1200).expect("send"), p.len());
        let (mut receiver, mut buf) = (Receiver::new(), vec![0u8; 65_536]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let got = loop {
            match receiver.recv(&rx, &mut buf) {
                Ok(r) => break r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "nothing arrived");
                    let fd = rx.as_raw_fd();
                    let mut poll = mio::Poll::new().expect("poll");
                    poll.registry()
                        .register(&mut mio::unix::SourceFd(&fd), mio::Token(0), mio::Interest::READABLE)
                        .expect("register");
                    let _ = poll.poll(&mut mio::Events::with_capacity(1), Some(Duration::from_millis(100)));
                }
                Err(e) => panic!("recv: {e}"),
            }
        };
        assert_eq!((got.len, got.segment_size), (p.len(), 1200), "one receive, the whole batch");
        assert_eq!(&buf[..got.len], &p[..]);
    }

    #[test]
    fn one_short_datagram_and_bad_sizes() {
        let (tx, rx) = pair();
        let to = rx.local_addr().expect("addr");
        assert_eq!(send_segments(&tx, to, b"hello", 1200).expect("send"), 5);
        let (datagrams, _) = receive_all(&rx, 5);
        assert_eq!(datagrams, vec![b"hello".to_vec()]);
        assert_eq!(send_segments(&tx, to, b"x", 0).map_err(|e| e.kind()), Err(io::ErrorKind::InvalidInput));
        let mut receiver = Receiver::new();
        let mut buf = [0u8; 16];
        assert_eq!(receiver.recv(&rx, &mut buf).map_err(|e| e.kind()), Err(io::ErrorKind::WouldBlock));
        tx.send_to(&[7u8; 40], to).expect("send");
        let (mut ok, deadline) = (false, Instant::now() + Duration::from_secs(5));
        while !ok && Instant::now() < deadline {
            match receiver.recv(&rx, &mut buf) {
                Err(e) if e.kind() == io::ErrorKind::InvalidData => ok = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(&rx, deadline),
                other => panic!("{other:?}"),
            }
        }
        assert!(ok, "a datagram larger than the buffer is reported");
    }
}
