//! What one HTTP/2 connection's peer may make us do: frames per turn, and
//! when its control frames are a flood.
//!
//! The [`Meter`] walks the 9-byte frame headers of the input before the
//! connection state machine reads it, and of the bytes the connection
//! writes, and decides how much of the input may be read now:
//! - **Work per turn.** Each frame costs a unit, a SETTINGS that carries
//!   `INITIAL_WINDOW_SIZE` one more per open stream (every stream's
//!   window is updated for it). A turn (one drive of the connection by the
//!   event loop, [`Meter::begin_turn`]) admits frames until its
//!   `frames_per_turn` units are spent; the rest waits for the next turn, so
//!   one connection's input never holds the loop for long, however cheap
//!   its bytes.
//! - **Control-frame floods.** PING, SETTINGS, WINDOW_UPDATE, PRIORITY,
//!   RST_STREAM, GOAWAY, PUSH_PROMISE and unknown types add their cost to a
//!   level (a leaky bucket); what a client legitimately sends them for pays
//!   the level back: each accepted request, each DATA frame we send (the
//!   WINDOW_UPDATEs that answer it) and the passing of time. A level above
//!   `max_control_burst` is a flood: nothing more is admitted, and the
//!   connection ends it with `GOAWAY(ENHANCE_YOUR_CALM)`, as nginx's
//!   "http2 flood detected" and h2o's per-connection counters do.
//!   DATA, HEADERS and CONTINUATION are the state machine's to judge (its
//!   empty-DATA budget, the header-list limit, rapid reset).
//!
//! Frames are admitted whole: a frame's header decides, its payload follows
//! as it arrives. A SETTINGS frame's payload (at most [`SETTINGS_SCAN`]
//! bytes) is waited for, so that its cost is known before it is read. It
//! must not buffer, copy or change a byte: it only says how many of the
//! input's leading bytes may be read.

use std::time::Instant;

use super::frame::{payload_len, Walker, ACK, CONTINUATION, DATA, HEADERS, HEADER_LEN, PREFACE_LEN, SETTINGS};

/// SETTINGS_INITIAL_WINDOW_SIZE's identifier.
const INITIAL_WINDOW_SIZE: u16 = 0x4;
/// The largest SETTINGS payload read for its identifiers before it is
/// admitted (a valid one under the default frame size has at most 2,730
/// settings); a longer one is charged as if it changed the window.
pub const SETTINGS_SCAN: usize = 16_384;

/// What one accepted request pays back of the control-frame level.
const REQUEST_CREDIT: u32 = 20;
/// What one DATA frame we send pays back: the stream's and the connection's
/// WINDOW_UPDATE that may answer it.
const DATA_CREDIT: u32 = 2;
/// What each second pays back (a peer may always send this many control
/// frames per second).
const CREDIT_PER_SECOND: u32 = 100;

/// The meter of one connection (see the module doc).
#[derive(Debug)]
pub struct Meter {
    /// Leading input bytes h2 may read.
    admitted: usize,
    /// Bytes of the last admitted frame (at first: of the preface) not
    /// received yet; admitted as they arrive.
    owed: usize,
    /// Units per turn, and what is left of this turn's.
    per_turn: u32,
    turn_left: u32,
    /// This turn's units ran out with a frame waiting.
    throttled: bool,
    /// Control-frame units not paid back, and the most allowed.
    level: u32,
    max_level: u32,
    flooded: bool,
    /// Streams open now (what a window-changing SETTINGS costs).
    open_streams: u32,
    /// When time last paid the level back.
    refilled: Option<Instant>,
    /// The frames h2 writes.
    out: Walker,
}

impl Meter {
    /// A meter for a server connection whose preface has not arrived: each
    /// turn admits `per_turn` units; a control-frame level above `max_level`
    /// is a flood.
    pub fn new(per_turn: u32, max_level: u32) -> Meter {
        Meter {
            admitted: 0,
            owed: PREFACE_LEN,
            per_turn: per_turn.max(1),
            turn_left: per_turn.max(1),
            throttled: false,
            level: 0,
            max_level,
            flooded: false,
            open_streams: 0,
            refilled: None,
            out: Walker::default(),
        }
    }

    /// A new turn: its units are whole again, and the time since the last
    /// turn pays the level back.
    pub fn begin_turn(&mut self, now: Instant) {
        self.turn_left = self.per_turn;
        self.throttled = false;
        let Some(since) = self.refilled else {
            self.refilled = Some(now);
            return;
        };
        let ms = now.saturating_duration_since(since).as_millis();
        let paid = ms.saturating_mul(u128::from(CREDIT_PER_SECOND)) / 1000;
        if paid > 0 {
            self.level = self.level.saturating_sub(u32::try_from(paid).unwrap_or(u32::MAX));
            self.refilled = Some(now);
        }
    }

    /// How many streams are open (a window-changing SETTINGS costs one unit
    /// per stream).
    pub fn set_open_streams(&mut self, n: usize) {
        self.open_streams = u32::try_from(n).unwrap_or(u32::MAX);
    }

    /// A request was accepted: it pays back some control frames.
    pub fn credit_request(&mut self) {
        self.level = self.level.saturating_sub(REQUEST_CREDIT);
    }

    /// The control frames are a flood: nothing more is admitted.
    pub fn flooded(&self) -> bool {
        self.flooded
    }

    /// This turn's units ran out with input waiting: drive the connection
    /// again next turn.
    pub fn throttled(&self) -> bool {
        self.throttled
    }

    /// How many of `input`'s leading bytes h2 may read now (`input` is
    /// everything received and not yet read; `eof`: nothing more will come,
    /// so a frame cut short is handed over as it is, for h2 to refuse).
    pub fn admit(&mut self, input: &[u8], eof: bool) -> usize {
        while !self.flooded {
            let rest = input.get(self.admitted..).unwrap_or_default();
            if self.owed > 0 {
                let n = self.owed.min(rest.len());
                self.admitted += n;
                self.owed -= n;
                if self.owed > 0 {
                    break;
                }
                continue;
            }
            if rest.is_empty() {
                break;
            }
            let Some(cost) = self.cost(rest) else {
                if eof {
                    self.admitted = input.len();
                }
                break;
            };
            if self.turn_left == 0 {
                self.throttled = true;
                break;
            }
            self.turn_left = self.turn_left.saturating_sub(cost);
            if !matches!(rest[3], DATA | HEADERS | CONTINUATION) {
                self.level = self.level.saturating_add(cost);
                if self.level > self.max_level {
                    self.flooded = true;
                    break;
                }
            }
            self.owed = HEADER_LEN + payload_len(rest);
        }
        self.admitted
    }

    /// h2 read `n` admitted bytes.
    pub fn consumed(&mut self, n: usize) {
        self.admitted = self.admitted.saturating_sub(n);
    }

    /// h2 wrote `out`: each DATA frame in it pays back [`DATA_CREDIT`].
    pub fn wrote(&mut self, out: &[u8]) {
        let level = &mut self.level;
        self.out.feed(out, |ty, _| {
            if ty == DATA {
                *level = level.saturating_sub(DATA_CREDIT);
            }
        });
    }

    /// The units the frame at the start of `rest` costs, once enough of it
    /// is there to tell (`None`: wait for more bytes).
    fn cost(&self, rest: &[u8]) -> Option<u32> {
        let head = rest.get(..HEADER_LEN)?;
        if head[3] != SETTINGS || head[4] & ACK != 0 {
            return Some(1);
        }
        let len = payload_len(head);
        let window = if len > SETTINGS_SCAN {
            true
        } else {
            let payload = rest.get(HEADER_LEN..HEADER_LEN + len)?;
            payload.chunks_exact(6).any(|s| u16::from_be_bytes([s[0], s[1]]) == INITIAL_WINDOW_SIZE)
        };
        Some(if window { 1 + self.open_streams } else { 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http2::frame::testing::{frame, PREFACE};
    use std::time::Duration;

    fn ping() -> Vec<u8> {
        frame(0x6, 0, 0, b"12345678")
    }

    fn window_settings(size: u32) -> Vec<u8> {
        let mut p = INITIAL_WINDOW_SIZE.to_be_bytes().to_vec();
        p.extend_from_slice(&size.to_be_bytes());
        frame(SETTINGS, 0, 0, &p)
    }

    /// Admit everything the meter allows, as h2 would read it; returns the bytes read.
    fn read_all(m: &mut Meter, input: &mut Vec<u8>, eof: bool) -> usize {
        let n = m.admit(input, eof);
        input.drain(..n);
        m.consumed(n);
        n
    }

    #[test]
    fn the_preface_and_whole_frames_pass_and_a_cut_header_waits() {
        let mut m = Meter::new(1024, 1000);
        let mut input = PREFACE[..10].to_vec();
        assert_eq!(read_all(&mut m, &mut input, false), 10, "the preface passes as it comes");
        input.extend_from_slice(&PREFACE[10..]);
        let f = ping();
        input.extend_from_slice(&f[..5]);
        assert_eq!(read_all(&mut m, &mut input, false), 14, "the rest of the preface; half a header waits");
        input.extend_from_slice(&f[5..12]);
        assert_eq!(read_all(&mut m, &mut input, false), 12, "a whole header admits its frame, as far as it came");
        input.extend_from_slice(&f[12..]);
        assert_eq!(read_all(&mut m, &mut input, false), 5, "the payload follows as it comes");
        input.extend_from_slice(&f[..4]);
        assert_eq!(read_all(&mut m, &mut input, true), 4, "at EOF a cut header goes to h2 to refuse");
    }

    #[test]
    fn a_turn_admits_its_units_then_the_next_turn_goes_on() {
        let mut m = Meter::new(3, 1000);
        let mut input = PREFACE.to_vec();
        for _ in 0..5 {
            input.extend(frame(DATA, 0, 1, b"abc"));
        }
        assert_eq!(read_all(&mut m, &mut input, false), 24 + 3 * 12);
        assert!(m.throttled(), "two frames wait for the next turn");
        assert_eq!(read_all(&mut m, &mut input, true), 0, "not even at EOF");
        m.begin_turn(Instant::now());
        assert!(!m.throttled());
        assert_eq!(read_all(&mut m, &mut input, false), 2 * 12);
        assert!(!m.throttled() && input.is_empty());
    }

    #[test]
    fn a_control_frame_flood_trips_and_nothing_more_passes() {
        let mut m = Meter::new(u32::MAX, 100);
        let mut input = PREFACE.to_vec();
        for _ in 0..150 {
            input.extend(ping());
        }
        let n = read_all(&mut m, &mut input, false);
        assert_eq!(n, 24 + 100 * 17, "the hundredth frame is the last admitted");
        assert!(m.flooded());
        m.begin_turn(Instant::now());
        assert_eq!(read_all(&mut m, &mut input, false), 0);
    }

    #[test]
    fn data_headers_and_continuation_are_not_control_frames() {
        let mut m = Meter::new(u32::MAX, 10);
        let mut input = PREFACE.to_vec();
        for _ in 0..100 {
            input.extend(frame(DATA, 0, 1, b""));
            input.extend(frame(HEADERS, 0, 3, b"x"));
            input.extend(frame(CONTINUATION, 0, 3, b"y"));
        }
        let len = input.len();
        assert_eq!(read_all(&mut m, &mut input, false), len);
        assert!(!m.flooded());
    }

    #[test]
    fn requests_data_sent_and_time_pay_the_level_back() {
        let mut m = Meter::new(u32::MAX, 100);
        let mut input = PREFACE.to_vec();
        for _ in 0..100 {
            input.extend(ping());
        }
        read_all(&mut m, &mut input, false);
        assert!(!m.flooded(), "exactly at the limit");
        // One request pays for REQUEST_CREDIT more frames.
        m.credit_request();
        for _ in 0..REQUEST_CREDIT {
            input.extend(ping());
        }
        read_all(&mut m, &mut input, false);
        assert!(!m.flooded());
        // Five DATA frames sent, the header of one split across writes: ten WINDOW_UPDATEs.
        let mut out = frame(0x4, ACK, 0, b"");
        for _ in 0..5 {
            out.extend(frame(DATA, 0, 1, &[7; 40]));
        }
        m.wrote(&out[..12]);
        m.wrote(&out[12..]);
        for _ in 0..5 * DATA_CREDIT {
            input.extend(frame(0x8, 0, 1, &1u32.to_be_bytes()));
        }
        read_all(&mut m, &mut input, false);
        assert!(!m.flooded());
        // Time: a second pays for CREDIT_PER_SECOND.
        let t = Instant::now();
        m.begin_turn(t);
        m.begin_turn(t + Duration::from_secs(1));
        for _ in 0..CREDIT_PER_SECOND {
            input.extend(ping());
        }
        read_all(&mut m, &mut input, false);
        assert!(!m.flooded());
        input.extend(ping());
        read_all(&mut m, &mut input, false);
        assert!(m.flooded(), "one more is over");
    }

    #[test]
    fn a_window_changing_settings_costs_a_unit_per_open_stream() {
        let mut m = Meter::new(u32::MAX, 1000);
        m.set_open_streams(128);
        let mut input = PREFACE.to_vec();
        let toggle = window_settings(1);
        // Its payload is waited for: its cost depends on it.
        input.extend_from_slice(&toggle[..12]);
        assert_eq!(read_all(&mut m, &mut input, false), 24);
        input.extend_from_slice(&toggle[12..]);
        assert_eq!(read_all(&mut m, &mut input, false), toggle.len());
        assert_eq!(m.level, 129);
        // Other settings, and acknowledgements, cost one.
        input.extend(frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]));
        input.extend(frame(SETTINGS, ACK, 0, b""));
        read_all(&mut m, &mut input, false);
        assert_eq!(m.level, 131);
        for _ in 0..6 {
            input.extend(window_settings(65_535));
        }
        read_all(&mut m, &mut input, false);
        assert!(!m.flooded(), "seven toggles: {}", m.level);
        input.extend(window_settings(1));
        read_all(&mut m, &mut input, false);
        assert!(m.flooded(), "the eighth toggle of 128 streams: {}", m.level);
        // Too long to scan: charged as a window change.
        let mut m = Meter::new(u32::MAX, 1000);
        m.set_open_streams(10);
        let mut input = PREFACE.to_vec();
        input.extend(frame(SETTINGS, 0, 0, &vec![0; SETTINGS_SCAN + 6]));
        read_all(&mut m, &mut input, false);
        assert_eq!(m.level, 11);
    }

    #[test]
    fn a_costly_frame_still_passes_in_a_fresh_turn() {
        let mut m = Meter::new(4, 10_000);
        m.set_open_streams(128);
        let mut input = PREFACE.to_vec();
        input.extend(window_settings(1));
        input.extend(ping());
        let toggle = window_settings(1).len();
        assert_eq!(read_all(&mut m, &mut input, false), 24 + toggle, "more than a turn's units, alone");
        assert!(m.throttled());
        m.begin_turn(Instant::now());
        assert_eq!(read_all(&mut m, &mut input, false), 17);
    }
}
