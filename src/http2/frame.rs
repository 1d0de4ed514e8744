//! The few facts of HTTP/2's wire format (RFC 9113 §3.4, §4.1, §6) that the
//! frame-header walkers beside h2 need ([`super::meter`], [`super::unfinished`]):
//! they read frame headers to count and time frames, never to parse them.
//! Everything else about frames is h2's.

/// The client connection preface's length (RFC 9113 §3.4).
pub(super) const PREFACE_LEN: usize = 24;
/// A frame header's length: 24-bit length, type, flags, stream id (RFC 9113 §4.1).
pub(super) const HEADER_LEN: usize = 9;
/// Frame types (RFC 9113 §6).
pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PUSH_PROMISE: u8 = 0x5;
pub(super) const CONTINUATION: u8 = 0x9;
/// HEADERS, PUSH_PROMISE and CONTINUATION flag: the header block ends here.
pub(super) const END_HEADERS: u8 = 0x4;
/// SETTINGS flag: an acknowledgement (empty).
pub(super) const ACK: u8 = 0x1;

/// The payload length a frame header announces (its first three bytes; `head` holds at
/// least those).
pub(super) fn payload_len(head: &[u8]) -> usize {
    usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2])
}

/// Walks the frame headers of a byte stream handed over in pieces of any size: it keeps
/// a partial header and the count of payload bytes still to come, nothing else.
#[derive(Debug, Default)]
pub(super) struct Walker {
    head: [u8; HEADER_LEN],
    got: usize,
    left: usize,
}

impl Walker {
    /// The stream's next bytes (after any preface); `on_header(type, flags)` for each frame
    /// header completed in them, in order.
    pub(super) fn feed(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(u8, u8)) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                self.left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER_LEN - self.got).min(bytes.len());
            self.head[self.got..self.got + n].copy_from_slice(&bytes[..n]);
            self.got += n;
            bytes = &bytes[n..];
            if self.got == HEADER_LEN {
                self.got = 0;
                self.left = payload_len(&self.head);
                on_header(self.head[3], self.head[4]);
            }
        }
    }

    /// Part of a frame header came, not all of it.
    pub(super) fn mid_header(&self) -> bool {
        self.got > 0
    }

    /// Payload bytes of the current frame still to come.
    pub(super) fn payload_left(&self) -> usize {
        self.left
    }
}

/// Wire bytes for the socket-free tests of this module's neighbours.
#[cfg(test)]
pub(super) mod testing {
    /// The client connection preface.
    pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A frame's bytes.
    pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_found_however_the_bytes_are_split() {
        // A PING (8 bytes), an empty SETTINGS ACK, a DATA frame of 3 bytes.
        let mut wire = vec![0, 0, 8, 0x6, 0, 0, 0, 0, 0];
        wire.extend([7u8; 8]);
        wire.extend([0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0]);
        wire.extend([0, 0, 3, DATA, 0, 0, 0, 0, 1, 9, 9, 9]);
        for split in 1..wire.len() {
            let mut w = Walker::default();
            let mut seen = Vec::new();
            for piece in wire.chunks(split) {
                w.feed(piece, |ty, flags| seen.push((ty, flags)));
            }
            assert_eq!(seen, [(0x6, 0), (SETTINGS, ACK), (DATA, 0)], "split every {split} bytes");
            assert!(!w.mid_header() && w.payload_left() == 0, "split every {split}: between frames");
        }
        let mut w = Walker::default();
        w.feed(&wire[..12], |_, _| {});
        assert_eq!(w.payload_left(), 5, "inside the PING's payload");
        w.feed(&wire[12..20], |_, _| {});
        assert!(w.mid_header(), "three bytes of the next header");
    }
}
