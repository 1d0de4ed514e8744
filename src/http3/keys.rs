//! The QUIC keys every worker shares, derived from the one secret the supervisor makes before
//! it forks (the secret `crate::tls` derives its ticket keys from), and the connection IDs
//! that say which worker slot owns a connection.
//!
//! From the secret, by HKDF-SHA256 with a label each: the connection-ID key, the
//! stateless-reset key, the Retry-token key and the session-ticket secret. Any worker can so
//! check a CID another worker issued, send the stateless reset that connection's peer expects,
//! accept a Retry token another worker minted, and resume a session another worker ticketed.
//!
//! A connection ID ([`CID_LEN`] bytes) is `slot (2, big-endian) ‖ generation (1) ‖ random (5)
//! ‖ tag (4)`, the tag a truncated HMAC-SHA256 of the first 8 bytes under the CID key. The
//! generation tells a slot's successive workers apart: while an old worker drains beside its
//! replacement, the one reading the slot's socket forwards the other's packets by it (see
//! `http3/handover.rs`; `Server::set_sibling` where no hand-over took place). The slot is in
//! the clear on purpose: a `SO_ATTACH_REUSEPORT_EBPF` program (or a worker forwarding a stray
//! packet) reads it without a key, as nginx's `quic_bpf` reads its worker cookie. It tells an
//! observer which worker serves a connection, not which connection a packet belongs to: the
//! other 10 bytes are random or keyed. The tag lets any worker drop short-header packets with
//! forged CIDs before it looks further, and answer a forkd CID of an unknown connection with a
//! stateless reset. This module must not touch sockets or quinn connections.

use std::sync::Arc;

use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};

use crate::tls::SECRET_LEN;

/// Length of the connection IDs forkd issues.
pub const CID_LEN: usize = 12;
/// Bytes of the CID before its tag (slot and random).
const BODY_LEN: usize = 8;

/// The keys derived from the pre-fork secret.
pub struct QuicKeys {
    cid: hmac::Key,
    reset: hmac::Key,
    token: hkdf::Prk,
    tickets: [u8; SECRET_LEN],
}

impl std::fmt::Debug for QuicKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QuicKeys(<secret>)")
    }
}

/// `len` bytes of output keying material for `label`.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// 32 bytes expanded from `prk` for `label`.
fn expand(prk: &hkdf::Prk, label: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // Expanding 32 bytes from SHA-256 cannot fail (the limit is 255 * 32).
    if let Ok(okm) = prk.expand(&[label], Len(32)) {
        let _ = okm.fill(&mut out);
    }
    out
}

impl QuicKeys {
    /// Every QUIC key, from the shared `secret`.
    pub fn derive(secret: &[u8; SECRET_LEN]) -> QuicKeys {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"forkd quic").extract(secret);
        QuicKeys {
            cid: hmac::Key::new(hmac::HMAC_SHA256, &expand(&prk, b"connection id")),
            reset: hmac::Key::new(hmac::HMAC_SHA256, &expand(&prk, b"stateless reset")),
            token: hkdf::Salt::new(hkdf::HKDF_SHA256, b"forkd quic retry token").extract(&expand(&prk, b"retry token")),
            tickets: expand(&prk, b"session tickets"),
        }
    }

    /// The stateless-reset key (quinn's `EndpointConfig::reset_key`).
    pub fn reset_key(&self) -> Arc<hmac::Key> {
        Arc::new(self.reset.clone())
    }

    /// The Retry and address-validation token key (quinn's `ServerConfig::token_key`).
    pub fn token_key(&self) -> Arc<hkdf::Prk> {
        Arc::new(self.token.clone())
    }

    /// The secret QUIC session tickets are sealed under (its own, apart from TLS over TCP's).
    pub fn ticket_secret(&self) -> [u8; SECRET_LEN] {
        self.tickets
    }

    /// A connection-ID generator for worker slot `slot` (generation 0).
    pub fn cids(&self, slot: u16) -> SlotCids {
        self.worker_cids(slot, 0)
    }

    /// A connection-ID generator for the worker of slot `slot` whose CIDs carry `generation`.
    pub fn worker_cids(&self, slot: u16, generation: u8) -> SlotCids {
        SlotCids { slot, generation, key: self.cid.clone(), rng: SystemRandom::new() }
    }
}

/// The slot a forkd connection ID names, read without a key (what steering reads); `None`
/// when `cid` is not [`CID_LEN`] bytes. Use [`SlotCids::owner`] to trust it.
pub fn slot_of(cid: &[u8]) -> Option<u16> {
    (cid.len() == CID_LEN).then(|| u16::from_be_bytes([cid[0], cid[1]]))
}

/// The generation of the worker that issued a forkd connection ID (untrusted, like
/// [`slot_of`]).
pub fn generation_of(cid: &[u8]) -> Option<u8> {
    (cid.len() == CID_LEN).then(|| cid[2])
}

/// The destination connection ID of a QUIC packet if it may be one forkd issued: the
/// [`CID_LEN`] bytes after a short header's first byte, or a long header's DCID when it is
/// [`CID_LEN`] bytes long. `None` for anything else (a client's first Initial usually).
pub fn packet_cid(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    if first & 0x80 == 0 {
        return datagram.get(1..1 + CID_LEN);
    }
    (usize::from(*datagram.get(5)?) == CID_LEN).then(|| datagram.get(6..6 + CID_LEN)).flatten()
}

/// Issues and checks the connection IDs of one worker slot. Also quinn's
/// `ConnectionIdGenerator` (see `setup.rs`).
#[derive(Clone)]
pub struct SlotCids {
    slot: u16,
    generation: u8,
    key: hmac::Key,
    rng: SystemRandom,
}

impl std::fmt::Debug for SlotCids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlotCids(slot {})", self.slot)
    }
}

impl SlotCids {
    /// The tag of a CID body.
    fn tag(&self, body: &[u8]) -> [u8; CID_LEN - BODY_LEN] {
        let mac = hmac::sign(&self.key, body);
        let mut tag = [0u8; CID_LEN - BODY_LEN];
        tag.copy_from_slice(&mac.as_ref()[..CID_LEN - BODY_LEN]);
        tag
    }

    /// A fresh connection ID of this slot.
    pub fn generate(&self) -> [u8; CID_LEN] {
        let mut cid = [0u8; CID_LEN];
        cid[..2].copy_from_slice(&self.slot.to_be_bytes());
        cid[2] = self.generation;
        if self.rng.fill(&mut cid[3..BODY_LEN]).is_err() {
            // getrandom does not fail on Linux once seeded; keep the CID unique anyway.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            cid[3..BODY_LEN].copy_from_slice(&nanos.to_be_bytes()[11..16]);
        }
        let tag = self.tag(&cid[..BODY_LEN]);
        cid[BODY_LEN..].copy_from_slice(&tag);
        cid
    }

    /// The slot that issued `cid`, if any forkd worker with these keys did.
    pub fn owner(&self, cid: &[u8]) -> Option<u16> {
        let slot = slot_of(cid)?;
        let tag = self.tag(&cid[..BODY_LEN]);
        // Compared without an early exit.
        let diff = tag.iter().zip(&cid[BODY_LEN..]).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        (diff == 0).then_some(slot)
    }
}

impl quinn_proto::ConnectionIdGenerator for SlotCids {
    fn generate_cid(&mut self) -> quinn_proto::ConnectionId {
        quinn_proto::ConnectionId::new(&self.generate())
    }

    fn validate(&self, cid: &quinn_proto::ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        self.owner(cid).map(|_| ()).ok_or(quinn_proto::InvalidCid)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_worker_checks_any_workers_cids() {
        let (a, b) = (QuicKeys::derive(&[1; SECRET_LEN]), QuicKeys::derive(&[1; SECRET_LEN]));
        let cids = a.cids(3);
        let cid = cids.generate();
        assert_eq!((slot_of(&cid), b.cids(0).owner(&cid)), (Some(3), Some(3)));
        assert_ne!(cids.generate(), cid, "random part");
        let other = QuicKeys::derive(&[2; SECRET_LEN]);
        assert_eq!(other.cids(3).owner(&cid), None, "another secret's keys refuse it");
        for i in 0..CID_LEN {
            let mut bad = cid;
            bad[i] ^= 0x40;
            assert_eq!(b.cids(3).owner(&bad), None, "byte {i} flipped");
        }
        assert_eq!(slot_of(&cid[..8]), None);
        assert_eq!(b.cids(0).owner(&[0; 20]), None);
    }

    #[test]
    fn generations_and_packet_cids() {
        let k = QuicKeys::derive(&[1; SECRET_LEN]);
        let cid = k.worker_cids(2, 0xa5).generate();
        assert_eq!((slot_of(&cid), generation_of(&cid), k.cids(0).owner(&cid)), (Some(2), Some(0xa5), Some(2)));
        let mut short = vec![0x41];
        short.extend_from_slice(&cid);
        short.extend_from_slice(&[0; 20]);
        assert_eq!(packet_cid(&short), Some(&cid[..]));
        let mut long = vec![0xc0, 0, 0, 0, 1, CID_LEN as u8];
        long.extend_from_slice(&cid);
        long.extend_from_slice(&[8; 30]);
        assert_eq!(packet_cid(&long), Some(&cid[..]));
        long[5] = 8;
        assert_eq!(packet_cid(&long), None, "a client's 8-byte CID");
        assert_eq!(packet_cid(&short[..5]), None);
        assert_eq!(packet_cid(&[]), None);
    }

    #[test]
    fn keys_differ_by_label_and_secret() {
        let k = QuicKeys::derive(&[7; SECRET_LEN]);
        let same = QuicKeys::derive(&[7; SECRET_LEN]);
        assert_eq!(k.ticket_secret(), same.ticket_secret());
        assert_ne!(k.ticket_secret(), [7; SECRET_LEN]);
        assert_ne!(k.ticket_secret(), QuicKeys::derive(&[8; SECRET_LEN]).ticket_secret());
        let sign = |key: &hmac::Key| hmac::sign(key, b"x").as_ref().to_vec();
        assert_eq!(sign(&k.reset_key()), sign(&same.reset_key()));
        assert_ne!(sign(&k.reset_key()), sign(&k.cid));
    }
}
