//! What the peer has started sending and not finished: the client preface,
//! a frame header, a frame other than DATA, or a header block (HEADERS or
//! PUSH_PROMISE and the CONTINUATION frames up to END_HEADERS). While any
//! of these is owed the connection cannot move on: h2 holds the partial
//! bytes, and no other frame may come between a header block's frames
//! (RFC 9113 §6.10). [`Unfinished::since`] says since when, so the caller
//! can time it out as the head it is (nginx arms its header timeout on
//! the same condition).
//!
//! It walks the 9-byte frame headers of the bytes the caller hands to h2,
//! in the same order, and keeps no payload. A partial DATA frame is not
//! counted: it is a request body, which the body timeout watches per
//! stream. It does not check the frames (h2 does), so a peer that breaks
//! the framing is h2's to end, not this walker's to judge.

use std::time::Instant;

use super::frame::{Walker, CONTINUATION, DATA, END_HEADERS, HEADERS, PREFACE_LEN, PUSH_PROMISE};

/// The frame-header walker of one connection's input.
#[derive(Debug)]
pub struct Unfinished {
    /// Preface bytes still to come (only counted: h2 checks them).
    preface: usize,
    /// The frames after it.
    frames: Walker,
    /// The current frame is DATA.
    data: bool,
    /// A header block started and its END_HEADERS has not come.
    block: bool,
    /// Since when something has been owed.
    since: Option<Instant>,
}

impl Unfinished {
    /// A connection whose preface is owed from `now` (it comes first in what
    /// [`Unfinished::feed`] sees).
    pub fn new(now: Instant) -> Unfinished {
        Unfinished { preface: PREFACE_LEN, frames: Walker::default(), data: false, block: false, since: Some(now) }
    }

    /// The peer's next bytes, as they are handed to h2, received at `now`.
    pub fn feed(&mut self, mut bytes: &[u8], now: Instant) {
        let n = self.preface.min(bytes.len());
        self.preface -= n;
        bytes = &bytes[n..];
        let (data, block) = (&mut self.data, &mut self.block);
        self.frames.feed(bytes, |ty, flags| {
            *data = ty == DATA;
            if matches!(ty, HEADERS | PUSH_PROMISE | CONTINUATION) {
                *block = flags & END_HEADERS == 0;
            }
        });
        let owed = self.preface > 0
            || self.frames.mid_header()
            || self.block
            || (self.frames.payload_left() > 0 && !self.data);
        self.since = if owed { self.since.or(Some(now)) } else { None };
    }

    /// Since when the peer has owed the rest of something it started (the
    /// first byte of it, however slowly the rest trickles in); `None` when
    /// it is between frames or inside a DATA frame.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http2::frame::testing::{frame, PREFACE};
    use crate::http2::frame::HEADER_LEN;

    /// Whether something is owed after each byte of `input`, fed one byte at a time.
    fn owed_after_each_byte(input: &[u8]) -> Vec<bool> {
        let now = Instant::now();
        let mut u = Unfinished::new(now);
        input
            .iter()
            .map(|b| {
                u.feed(std::slice::from_ref(b), now);
                u.since().is_some()
            })
            .collect()
    }

    #[test]
    fn the_preface_is_owed_from_the_start_until_its_last_byte() {
        let now = Instant::now();
        let mut u = Unfinished::new(now);
        assert_eq!(u.since(), Some(now));
        u.feed(&PREFACE[..10], now + Duration::from_secs(1));
        assert_eq!(u.since(), Some(now), "a trickle does not restart the clock");
        u.feed(&PREFACE[10..], now + Duration::from_secs(2));
        assert_eq!(u.since(), None);
    }

    #[test]
    fn a_header_block_is_owed_until_end_headers() {
        let now = Instant::now();
        let mut u = Unfinished::new(now);
        u.feed(PREFACE, now);
        u.feed(&frame(0x4, 0, 0, &[]), now);
        assert_eq!(u.since(), None, "a whole SETTINGS frame owes nothing");
        let t = now + Duration::from_secs(1);
        u.feed(&frame(HEADERS, 0x1, 1, b"abc"), t);
        assert_eq!(u.since(), Some(t), "HEADERS without END_HEADERS");
        u.feed(&frame(CONTINUATION, 0, 1, b"def"), t + Duration::from_secs(1));
        assert_eq!(u.since(), Some(t), "a CONTINUATION without END_HEADERS does not restart it");
        u.feed(&frame(CONTINUATION, END_HEADERS, 1, b"ghi"), t + Duration::from_secs(2));
        assert_eq!(u.since(), None);
        u.feed(&frame(HEADERS, END_HEADERS, 3, b"abc"), t);
        assert_eq!(u.since(), None, "a whole header block in one frame");
    }

    #[test]
    fn a_partial_frame_is_owed_unless_it_is_data() {
        let mut input = PREFACE.to_vec();
        let ping = frame(0x6, 0, 0, &[0; 8]);
        let data = frame(DATA, 0, 1, &[0; 8]);
        input.extend_from_slice(&ping);
        input.extend_from_slice(&data);
        let owed = owed_after_each_byte(&input);
        let (preface, rest) = owed.split_at(PREFACE.len());
        let (ping_owed, data_owed) = rest.split_at(ping.len());
        assert!(preface[..PREFACE.len() - 1].iter().all(|o| *o) && !preface[PREFACE.len() - 1]);
        assert!(ping_owed[..ping.len() - 1].iter().all(|o| *o) && !ping_owed[ping.len() - 1], "{ping_owed:?}");
        // DATA: its frame header is owed, its payload is a body.
        assert!(data_owed[..HEADER_LEN - 1].iter().all(|o| *o), "{data_owed:?}");
        assert!(data_owed[HEADER_LEN - 1..].iter().all(|o| !*o), "{data_owed:?}");
    }

    #[test]
    fn any_split_of_the_input_gives_the_same_answer() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[0; 6]));
        input.extend(frame(HEADERS, 0, 1, &[7; 40]));
        input.extend(frame(CONTINUATION, 0, 1, &[7; 300]));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[7; 5]));
        input.extend(frame(DATA, 0, 1, &[1; 70_000]));
        let now = Instant::now();
        for cut in [1, 9, 23, 24, 25, 33, 40, 100, 400, 1000, 70_000] {
            let mut whole = Unfinished::new(now);
            whole.feed(&input, now);
            let mut split = Unfinished::new(now);
            for part in input.chunks(cut) {
                split.feed(part, now);
            }
            assert_eq!(split.since(), whole.since(), "input cut every {cut} bytes");
            assert_eq!(whole.since(), None, "it all ends with a whole DATA frame");
        }
        let mut open = Unfinished::new(now);
        open.feed(&input[..input.len() - (HEADER_LEN + 70_000) - (HEADER_LEN + 5)], now);
        assert_eq!(open.since(), Some(now), "without the CONTINUATION that ends the block");
    }
}
