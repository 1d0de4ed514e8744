//! The anti-amplification limit (RFC 9000 §8.1): until a client's address is validated, a
//! server sends it at most three times the bytes it received from it, so a spoofed source
//! address cannot turn the server into an amplifier against a third party.
//!
//! quinn-proto keeps this count too, but lets a new datagram start while any of the budget is
//! left and then fills it to the path's MTU, so a handshake may end up to one datagram over
//! the limit (with 0-RTT answers, or when the client's datagrams are not whole multiples of a
//! datagram). [`Budget`] is the
//! stricter count kept beside it: a datagram is built only when a whole one of the largest
//! size fits. The address is validated as quinn validates it: by a Retry token, or by a
//! packet the client could only protect with keys from our handshake (a Handshake or 1-RTT
//! packet quinn opened: a datagram of only such packets, [`keyed_only`], after which quinn
//! counted frames), or at the latest by the end of the handshake. Initial packets (keys
//! anyone can derive from the packet) and 0-RTT ones (keys a client brings from its own
//! earlier session, whatever source address it writes) prove nothing. This file must not
//! know sockets or clocks.

use quinn_proto::FrameStats;

use super::varint;

/// Bytes received from and sent to an unvalidated client address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    received: u64,
    sent: u64,
}

/// The factor of RFC 9000 §8.1.
const FACTOR: u64 = 3;

impl Budget {
    /// A datagram of `len` bytes arrived from the client's address.
    pub fn received(&mut self, len: usize) {
        self.received = self.received.saturating_add(len as u64);
    }

    /// Datagrams of `len` bytes in all went to the client's address.
    pub fn sent(&mut self, len: usize) {
        self.sent = self.sent.saturating_add(len as u64);
    }

    /// How many datagrams of at most `size` bytes may go now (0: wait for the client).
    pub fn datagrams(&self, size: u16) -> usize {
        let left = (FACTOR * self.received).saturating_sub(self.sent);
        usize::try_from(left / u64::from(size.max(1))).unwrap_or(usize::MAX)
    }
}

/// The QUIC version whose long-header types are read here (version 2 numbers them otherwise).
const VERSION_1: [u8; 4] = [0, 0, 0, 1];
/// The long-header type of a Handshake packet (RFC 9000 §17.2.4).
const HANDSHAKE: u8 = 2;

/// Whether every packet of `datagram` is a Handshake packet (QUIC v1) or a short-header one:
/// packets only a client that received our handshake can protect.
pub fn keyed_only(datagram: &[u8]) -> bool {
    let mut rest = datagram;
    while let Some(&first) = rest.first() {
        if first & 0x80 == 0 {
            // A short header runs to the end of the datagram.
            return true;
        }
        if (first >> 4) & 0x03 != HANDSHAKE || rest.get(1..5) != Some(&VERSION_1[..]) {
            return false;
        }
        let Some(next) = after_long_header_packet(rest) else { return false };
        rest = next;
    }
    !datagram.is_empty()
}

/// What follows the long-header packet (not an Initial: no token) at the start of `packet`.
fn after_long_header_packet(packet: &[u8]) -> Option<&[u8]> {
    let dcid = usize::from(*packet.get(5)?);
    let scid_at = 6 + dcid;
    let scid = usize::from(*packet.get(scid_at)?);
    let length_at = scid_at + 1 + scid;
    let (len, used) = varint::decode(packet.get(length_at..)?)?;
    let end = (length_at + used).checked_add(usize::try_from(len).ok()?)?;
    packet.get(end..)
}

/// Frames quinn has opened so far (of the kinds a client sends during and after the
/// handshake): when it grows on a [`keyed_only`] datagram, that datagram proved the address.
pub fn opened_frames(stats: &FrameStats) -> u64 {
    [
        stats.acks,
        stats.crypto,
        stats.ping,
        stats.connection_close,
        stats.stream,
        stats.max_data,
        stats.max_stream_data,
        stats.reset_stream,
        stats.stop_sending,
        stats.new_connection_id,
        stats.retire_connection_id,
        stats.path_challenge,
        stats.path_response,
    ]
    .iter()
    .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long-header packet of type `ty` with a payload of `len` bytes.
    fn long(ty: u8, len: usize) -> Vec<u8> {
        let mut p = vec![0xc0 | (ty << 4), 0, 0, 0, 1, 4, 1, 2, 3, 4, 2, 9, 9];
        varint::encode(len as u64, &mut p);
        p.resize(p.len() + len, 0xaa);
        p
    }

    #[test]
    fn only_handshake_and_short_header_packets_prove_the_address() {
        let handshake = long(HANDSHAKE, 100);
        let short = [&[0x40u8][..], &[7; 30]].concat();
        assert!(keyed_only(&handshake));
        assert!(keyed_only(&[handshake.clone(), handshake.clone()].concat()), "coalesced");
        assert!(keyed_only(&[handshake.clone(), short.clone()].concat()), "then 1-RTT");
        assert!(keyed_only(&short));
        // Initial (0) and 0-RTT (1) packets, alone or coalesced, prove nothing.
        assert!(!keyed_only(&long(0, 100)));
        assert!(!keyed_only(&[handshake.clone(), long(1, 50)].concat()));
        let mut v2 = handshake.clone();
        v2[4] = 2;
        assert!(!keyed_only(&v2), "another version's types mean other things");
        assert!(!keyed_only(&handshake[..handshake.len() - 1]), "a packet longer than the datagram");
        assert!(!keyed_only(&[]));
    }

    #[test]
    fn never_more_than_three_times_what_arrived() {
        let mut b = Budget::default();
        assert_eq!(b.datagrams(1200), 0, "nothing received: nothing to send");
        b.received(1200);
        assert_eq!(b.datagrams(1200), 3);
        b.sent(1200 + 1200 + 1100);
        assert_eq!(b.datagrams(1200), 0, "100 bytes left: no whole datagram fits");
        b.received(1200);
        assert_eq!(b.datagrams(1200), 3, "a retransmitted Initial makes room again");
        b.sent(3 * 1200);
        assert_eq!(b.datagrams(1200), 0);
        assert!(b.sent <= FACTOR * b.received);
    }
}
