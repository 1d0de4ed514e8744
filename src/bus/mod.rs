//! The message bus between workers (DESIGN "The bus").
//!
//! Topology: worker → supervisor → every other worker, over one non-blocking
//! `SOCK_SEQPACKET` socketpair per worker process (one message = one
//! datagram; the kernel keeps message boundaries and order). The publisher
//! delivers to its own local subscribers directly; the supervisor forwards to
//! the rest. Each message carries the publishing worker's pid and a
//! per-publisher sequence number, so order per publisher holds and gaps are
//! visible.
//!
//! Nobody blocks: every [`Endpoint`] keeps a bounded outbound queue for a
//! peer that is not reading; when it is full, new messages for that peer are
//! dropped and counted (a stalled or dead worker cannot stall the others;
//! SSE clients recover what they missed through `Last-Event-ID` replay). A
//! replaced worker gets a fresh socketpair and simply starts receiving.
//!
//! This module owns the wire format and the endpoint, and [`rooms`] the room messages and
//! one worker's table of room members; the supervisor and the worker own the sockets'
//! registration in their polls.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use socket2::{Domain, Socket, Type};

pub mod rooms;

/// The largest message (header included).
pub const MAX_MESSAGE: usize = 128 * 1024;
/// Messages queued for one slow peer before new ones are dropped.
pub const MAX_QUEUE: usize = 4096;
const HEADER: usize = 16;
const MAGIC: u8 = 0xB5;

/// What a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// A stored notification (JSON of `store::Notification`) for `/api/events`.
    Notification,
    /// WebSocket room traffic ([`rooms::RoomMessage`], JSON).
    Room,
    /// A stored change of a declared resource's record ([`ChangeEvent`], binary) for the
    /// `/api/events` streams that may read the record.
    Change,
    /// A write into the shared upstream cache ([`CacheEntry`], binary), for
    /// the other hosts only: local workers share the same cache and ignore it,
    /// and the supervisor does not forward it to them.
    Cache,
}

impl Topic {
    fn code(self) -> u8 {
        match self {
            Topic::Notification => 1,
            Topic::Room => 2,
            Topic::Cache => 3,
            Topic::Change => 4,
        }
    }

    fn from_code(c: u8) -> Option<Topic> {
        match c {
            1 => Some(Topic::Notification),
            2 => Some(Topic::Room),
            3 => Some(Topic::Cache),
            4 => Some(Topic::Change),
            _ => None,
        }
    }
}

/// A decoded message, borrowing its payload.
#[derive(Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// The publishing worker's pid.
    pub origin: u32,
    /// The publisher's sequence number (1, 2, …).
    pub seq: u64,
    /// The topic.
    pub topic: Topic,
    /// The payload (JSON).
    pub payload: &'a [u8],
}

/// Encode a message.
pub fn encode(topic: Topic, origin: u32, seq: u64, payload: &[u8]) -> Arc<[u8]> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.extend_from_slice(&[MAGIC, topic.code(), 0, 0]);
    v.extend_from_slice(&origin.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(payload);
    v.into()
}

/// Decode a message; `None` for anything malformed.
pub fn decode(buf: &[u8]) -> Option<Message<'_>> {
    if buf.len() < HEADER || buf[0] != MAGIC {
        return None;
    }
    Some(Message {
        topic: Topic::from_code(buf[1])?,
        origin: u32::from_le_bytes(buf[4..8].try_into().ok()?),
        seq: u64::from_le_bytes(buf[8..16].try_into().ok()?),
        payload: &buf[HEADER..],
    })
}

/// The payload of a [`Topic::Cache`] message: one shared-cache entry.
///
/// Wire: `expires_wall_ms` (u64 LE), key length (u32 LE), the key, the value.
/// The expiry is wall-clock milliseconds since the Unix epoch, the only clock
/// two hosts have in common (each cache runs on its own monotonic clock), so
/// the entry lives as long on every host as their wall clocks agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEntry<'a> {
    /// The cache key.
    pub key: &'a [u8],
    /// The cached value.
    pub value: &'a [u8],
    /// When it stops being served, wall-clock ms since the Unix epoch.
    pub expires_wall_ms: u64,
}

const CACHE_HEADER: usize = 12;

/// Wall-clock milliseconds since the Unix epoch (0 before it): the clock of
/// [`CacheEntry::expires_wall_ms`].
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl CacheEntry<'_> {
    /// Whether key and value fit one shared-cache slot (others are not shared, so not sent).
    fn fits(key: &[u8], value: &[u8]) -> bool {
        !key.is_empty() && key.len() + value.len() <= crate::shm::cache::ENTRY_BYTES
    }

    /// The payload, or `None` when the entry could not be stored in a shared-cache slot.
    pub fn encode(&self) -> Option<Vec<u8>> {
        if !Self::fits(self.key, self.value) {
            return None;
        }
        let mut v = Vec::with_capacity(CACHE_HEADER + self.key.len() + self.value.len());
        v.extend_from_slice(&self.expires_wall_ms.to_le_bytes());
        v.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        v.extend_from_slice(self.key);
        v.extend_from_slice(self.value);
        Some(v)
    }

    /// Decode a payload; `None` for anything malformed or larger than a slot holds.
    pub fn decode(payload: &[u8]) -> Option<CacheEntry<'_>> {
        let expires_wall_ms = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
        let key_len = u32::from_le_bytes(payload.get(8..CACHE_HEADER)?.try_into().ok()?) as usize;
        let rest = &payload[CACHE_HEADER..];
        if key_len > rest.len() {
            return None;
        }
        let (key, value) = rest.split_at(key_len);
        Self::fits(key, value).then_some(CacheEntry { key, value, expires_wall_ms })
    }
}

/// The payload of a [`Topic::Change`] message: one stored change event.
///
/// Wire: event id (i64 LE), the record owner's user id (i64 LE), the resource name's length
/// (u8), the name, then the event's data (the JSON the stream shows). The resource travels
/// by name, not by registry index, so hosts whose declarations list resources in another
/// order (a rolling reload) still agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeEvent<'a> {
    /// The event id (the notifications' sequence).
    pub id: i64,
    /// The changed record's owner: who may read it under an `owner` rule.
    pub owner_id: i64,
    /// The resource's name.
    pub resource: &'a str,
    /// The event's data: `{"resource","action","id","record"}`.
    pub data: &'a [u8],
}

const CHANGE_HEADER: usize = 17;

impl ChangeEvent<'_> {
    /// The payload (`None` for a resource name over 255 bytes, which no declaration has).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let name_len = u8::try_from(self.resource.len()).ok()?;
        let mut v = Vec::with_capacity(CHANGE_HEADER + self.resource.len() + self.data.len());
        v.extend_from_slice(&self.id.to_le_bytes());
        v.extend_from_slice(&self.owner_id.to_le_bytes());
        v.push(name_len);
        v.extend_from_slice(self.resource.as_bytes());
        v.extend_from_slice(self.data);
        Some(v)
    }

    /// Decode a payload; `None` for anything malformed.
    pub fn decode(payload: &[u8]) -> Option<ChangeEvent<'_>> {
        let id = i64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
        let owner_id = i64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
        let name_len = usize::from(*payload.get(16)?);
        let resource = std::str::from_utf8(payload.get(CHANGE_HEADER..CHANGE_HEADER + name_len)?).ok()?;
        let data = &payload[CHANGE_HEADER + name_len..];
        Some(ChangeEvent { id, owner_id, resource, data })
    }
}

/// A connected pair of non-blocking `SOCK_SEQPACKET` sockets.
pub fn pair() -> io::Result<(Socket, Socket)> {
    let (a, b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None)?;
    for s in [&a, &b] {
        s.set_nonblocking(true)?;
        // Room for bursts; the kernel caps it at wmem_max.
        let _ = s.set_send_buffer_size(1 << 20);
        let _ = s.set_recv_buffer_size(1 << 20);
    }
    Ok((a, b))
}

/// One end of a bus socket with its outbound queue.
pub struct Endpoint {
    sock: Socket,
    queue: VecDeque<Arc<[u8]>>,
    /// Messages dropped because the peer did not keep up.
    pub dropped: u64,
}

impl Endpoint {
    /// Wrap a socket from [`pair`].
    pub fn new(sock: Socket) -> Endpoint {
        Endpoint { sock, queue: VecDeque::new(), dropped: 0 }
    }

    /// The descriptor, for poll registration.
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Send `msg` now, or queue it; drop it when the queue is full.
    pub fn send(&mut self, msg: Arc<[u8]>) {
        if self.queue.is_empty() {
            match (&self.sock).write(&msg) {
                Ok(_) => return,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    log::debug!("bus send: {e}");
                    self.dropped += 1;
                    return;
                }
            }
        }
        if self.queue.len() >= MAX_QUEUE {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                log::warn!("bus: peer is not keeping up; {} message(s) dropped so far", self.dropped);
            }
            return;
        }
        self.queue.push_back(msg);
    }

    /// Send what is queued until the socket is full (call on writable).
    pub fn flush(&mut self) {
        while let Some(msg) = self.queue.front() {
            match (&self.sock).write(msg) {
                Ok(_) => {
                    self.queue.pop_front();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.dropped += self.queue.len() as u64;
                    self.queue.clear();
                    return;
                }
            }
        }
    }

    /// Receive one datagram into `buf`: `Ok(Some(n))`, `Ok(None)` when none is
    /// waiting, `Err` when the peer is gone (EOF is reported as an error).
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match (&self.sock).read(buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_garbage() {
        let m = encode(Topic::Room, 42, 7, b"{\"a\":1}");
        assert_eq!(decode(&m), Some(Message { origin: 42, seq: 7, topic: Topic::Room, payload: b"{\"a\":1}" }));
        assert_eq!(decode(b"short"), None);
        let mut bad = m.to_vec();
        bad[1] = 99;
        assert_eq!(decode(&bad), None);
    }

    #[test]
    fn cache_entries_round_trip_and_hostile_ones_are_rejected() {
        let e = CacheEntry { key: b"user:7", value: b"{\"name\":\"x\"}", expires_wall_ms: 1_700_000_000_123 };
        let p = e.encode().expect("fits");
        assert_eq!(CacheEntry::decode(&p), Some(e));
        let m = encode(Topic::Cache, 1, 2, &p);
        let d = decode(&m).expect("a message");
        assert_eq!((d.topic, CacheEntry::decode(d.payload)), (Topic::Cache, CacheEntry::decode(&p)));
        // An empty value is an entry; an empty key is not.
        let empty = CacheEntry { key: b"k", value: b"", expires_wall_ms: 1 };
        assert_eq!(CacheEntry::decode(&empty.encode().expect("fits")), Some(empty));
        assert_eq!(CacheEntry { key: b"", value: b"v", expires_wall_ms: 1 }.encode(), None);
        // Truncated headers, and a key length past the end (or near u32::MAX).
        for n in 0..CACHE_HEADER {
            assert_eq!(CacheEntry::decode(&p[..n]), None, "{n} bytes");
        }
        let mut long = p.clone();
        long[8..12].copy_from_slice(&(p.len() as u32).to_le_bytes());
        assert_eq!(CacheEntry::decode(&long), None);
        long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(CacheEntry::decode(&long), None);
        let mut zero = p.clone();
        zero[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(CacheEntry::decode(&zero), None, "an empty key");
        // Larger than one shared-cache slot: not encoded, and refused when received.
        let big = vec![b'x'; crate::shm::cache::ENTRY_BYTES];
        assert_eq!(CacheEntry { key: b"k", value: &big, expires_wall_ms: 1 }.encode(), None);
        let fits = vec![b'x'; crate::shm::cache::ENTRY_BYTES - 1];
        let mut over = CacheEntry { key: b"k", value: &fits, expires_wall_ms: 1 }.encode().expect("exactly a slot");
        assert!(over.len() < MAX_MESSAGE - HEADER);
        over.push(b'x');
        assert_eq!(CacheEntry::decode(&over), None);
    }

    #[test]
    fn change_events_round_trip_and_truncated_ones_are_rejected() {
        let e = ChangeEvent { id: 41, owner_id: -3, resource: "notes", data: b"{\"resource\":\"notes\"}" };
        let p = e.encode().expect("a short name");
        assert_eq!(ChangeEvent::decode(&p), Some(e));
        let m = encode(Topic::Change, 9, 1, &p);
        let d = decode(&m).expect("a message");
        assert_eq!((d.topic, ChangeEvent::decode(d.payload)), (Topic::Change, Some(e)));
        for n in 0..CHANGE_HEADER + e.resource.len() {
            assert_eq!(ChangeEvent::decode(&p[..n]), None, "{n} bytes");
        }
        let mut bad_name = p.clone();
        bad_name[CHANGE_HEADER] = 0xFF;
        assert_eq!(ChangeEvent::decode(&bad_name), None, "a name that is not UTF-8");
        let long = "x".repeat(256);
        assert_eq!(ChangeEvent { resource: &long, ..e }.encode(), None);
    }

    #[test]
    fn datagrams_keep_boundaries_and_order_and_a_full_peer_drops_instead_of_blocking() {
        let (a, b) = pair().expect("pair");
        let (mut a, mut b) = (Endpoint::new(a), Endpoint::new(b));
        for i in 0..3u64 {
            a.send(encode(Topic::Notification, 1, i, &vec![b'x'; 100 * (i as usize + 1)]));
        }
        let mut buf = vec![0; MAX_MESSAGE];
        for i in 0..3u64 {
            let n = b.recv(&mut buf).expect("recv").expect("a message");
            let m = decode(&buf[..n]).expect("decode");
            assert_eq!((m.seq, m.payload.len()), (i, 100 * (i as usize + 1)));
        }
        assert_eq!(b.recv(&mut buf).expect("recv"), None);
        // Nobody reads b: a's sends fill the socket, then the queue, then drop.
        let big = encode(Topic::Room, 1, 0, &vec![0; 60_000]);
        for _ in 0..(MAX_QUEUE + 200) {
            a.send(big.clone());
        }
        assert!(a.dropped > 0, "a full queue must drop, not block");
    }
}
