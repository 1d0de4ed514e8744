//! What produces a streamed body after its head ([`Produce`]), written once for every
//! protocol: an `/api/events` subscription ([`Events`]: preamble, `Last-Event-ID`
//! replay on the pool, live bus events held while the replay runs, heartbeats) and a
//! timer-driven ticker ([`Ticking`], the chat echo); the worker's registry of event-stream
//! subscribers they join ([`Subscribers`]) and the backlog past which a stream's client is
//! given up ([`MAX_BACKLOG`]). File bodies ([`super::download`], [`super::file`]) and
//! WebSockets ([`super::websocket`], carried by a stream as a [`Tunnel`]) have files of
//! their own.
//!
//! A producer writes into its exchange's unsent bytes; the codec's sink moves them into its
//! stream as it may send (an HTTP/1.1 connection frames them, one chunk per piece it takes).
//! The caller ends the exchange when a producer says so.
//!
//! It must not touch a socket, a codec's framing or the exchange table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::download::Download;
use super::file::FileBody;
use super::panics::guard;
use super::pool::{ExchangeId, Pool, Work, REPLAY_PANICKED};
use super::websocket::Ws;
use crate::app::App;
use crate::http::service::HIGH_WATERMARK;
use crate::resources::audience::Audience;

/// What produces a streamed body after its head.
pub(crate) enum Produce {
    /// An `/api/events` subscription.
    Events(Events),
    /// Events from a timer (the chat echo).
    Ticker(Ticking),
    /// A WebSocket over an extended CONNECT (RFC 8441): its frames are the stream's DATA
    /// both ways.
    Ws(Box<Tunnel>),
    /// A byte range of a file, read ahead as the stream's window allows.
    Download(Download),
    /// A byte range of a file, one slice at a time once the stream took the last.
    Slices(FileBody),
}

/// A WebSocket carried by a stream.
pub(crate) struct Tunnel {
    pub(crate) ws: Ws,
    /// Received bytes not yet read as frames: the start of a frame, or, while the stream's
    /// output is backed up, whole frames waiting.
    pub(crate) input: Vec<u8>,
    /// Bytes of `input` not yet released to the peer's flow control: while the output is
    /// backed up nothing is, so the peer's stream window closes and its frames wait on its
    /// side (back pressure, as an HTTP/1.1 WebSocket stops reading its socket).
    pub(crate) unreleased: usize,
    /// The peer ended its side of the stream.
    pub(crate) peer_ended: bool,
}

impl Produce {
    /// A WebSocket whose frames the codec reads itself (HTTP/1.1 reads them in place from
    /// the connection's input).
    pub(crate) fn websocket(ws: Ws) -> Produce {
        Produce::Ws(Box::new(Tunnel { ws, input: Vec::new(), unreleased: 0, peer_ended: false }))
    }

    /// When the producer next has something to do by itself.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self {
            Produce::Events(e) => Some(e.next()),
            Produce::Ticker(t) => Some(t.next()),
            Produce::Ws(t) => Some(t.ws.next_ping),
            Produce::Download(_) | Produce::Slices(_) => None,
        }
    }
}

/// How long a ticker whose stream is backed up waits before it is asked again.
const TICK_BACKOFF: Duration = Duration::from_millis(50);

/// This worker's event streams, by exchange, with who each is for (the filter of every
/// change event).
pub(crate) type Subscribers = HashMap<ExchangeId, Audience>;

/// Unsent bytes one subscriber may accumulate before it is dropped.
pub const MAX_BACKLOG: usize = 1 << 20;

/// An `/api/events` subscription on an exchange.
pub(crate) struct Events {
    /// A `Last-Event-ID` replay runs on the pool.
    replaying: bool,
    /// The last notification id sent.
    last_id: i64,
    /// Live events that arrived during the replay.
    held: Vec<(i64, Arc<[u8]>)>,
    next_beat: Instant,
}

impl Events {
    /// A subscriber that has seen every event up to `last_event_id` (then a replay of what
    /// follows it runs on the pool), or none; heartbeat due at `next_beat`.
    pub(crate) fn new(last_event_id: Option<i64>, next_beat: Instant) -> Events {
        Events { replaying: last_event_id.is_some(), last_id: last_event_id.unwrap_or(0), held: Vec::new(), next_beat }
    }

    /// The exchange `id` of `audience` subscribes: the preamble goes into `out`, the
    /// subscription into `sse`, the replay after `last_event_id` (if any) to the pool. `None`:
    /// app code panicked; end the stream.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        app: &App,
        last_event_id: Option<i64>,
        audience: Audience,
        id: ExchangeId,
        sse: &mut Subscribers,
        pool: &Pool,
        out: &mut Vec<u8>,
        now: Instant,
    ) -> Option<Events> {
        let start = guard("SSE stream start", || {
            (app.sse_preamble(), app.sse_heartbeat_every(), last_event_id.map(|after| app.sse_replay(after, &audience)))
        });
        let (preamble, every, replay) = start.ok()?;
        out.extend_from_slice(&preamble);
        sse.insert(id, audience);
        let events = Events::new(last_event_id, now + every);
        if let Some(job) = replay {
            pool.submit(id, Work::Replay(job));
        }
        Some(events)
    }

    /// When the next heartbeat is due.
    pub(crate) fn next(&self) -> Instant {
        self.next_beat
    }

    /// A heartbeat into `out` if one is due; `false`: app code panicked, end the stream.
    pub(crate) fn beat(&mut self, app: &App, now: Instant, out: &mut Vec<u8>) -> bool {
        if self.next_beat > now {
            return true;
        }
        match guard("SSE heartbeat", || (app.sse_heartbeat(), app.sse_heartbeat_every())) {
            Ok((beat, every)) => {
                out.extend_from_slice(&beat);
                self.next_beat = now + every;
                true
            }
            Err(_) => false,
        }
    }

    /// The replay's result: its events, then the live ones held meanwhile that it did not
    /// cover. `false`: the replay panicked, end the stream.
    pub(crate) fn replayed(&mut self, bytes: &[u8], last: i64, out: &mut Vec<u8>) -> bool {
        if last == REPLAY_PANICKED {
            return false;
        }
        out.extend_from_slice(bytes);
        self.last_id = self.last_id.max(last);
        self.replaying = false;
        for (id, event) in self.held.drain(..) {
            if id > self.last_id {
                out.extend_from_slice(&event);
                self.last_id = id;
            }
        }
        true
    }

    /// A live event `id` from the bus: whether to send it now. During a replay it is held
    /// (sent after the replay, unless the replay covered it); an event at or below the last
    /// one sent is a duplicate (another worker's copy, or one the replay sent).
    pub(crate) fn admit(&mut self, id: i64, event: &Arc<[u8]>) -> bool {
        if self.replaying {
            self.held.push((id, Arc::clone(event)));
            return false;
        }
        if id <= self.last_id {
            return false;
        }
        self.last_id = id;
        true
    }

    /// A live event from the bus, sent into `out` if [`Events::admit`] lets it through.
    pub(crate) fn live(&mut self, id: i64, event: &Arc<[u8]>, out: &mut Vec<u8>) {
        if self.admit(id, event) {
            out.extend_from_slice(event);
        }
    }
}

/// A ticker-driven stream (events from a timer).
pub(crate) struct Ticking {
    ticker: Box<dyn crate::app::Ticker>,
    next: Instant,
}

impl Ticking {
    /// A ticker asked first at `now`.
    pub(crate) fn new(ticker: Box<dyn crate::app::Ticker>, now: Instant) -> Ticking {
        Ticking { ticker, next: now }
    }

    /// When the ticker is asked next.
    pub(crate) fn next(&self) -> Instant {
        self.next
    }

    /// Ask the ticker for its event into `out` if it is due, unless the exchange's unsent
    /// output (`backlog` bytes) is past the watermark (then again after a short pause).
    pub(crate) fn tick(&mut self, now: Instant, backlog: usize, out: &mut Vec<u8>) -> Tick {
        if self.next > now {
            return Tick::Idle;
        }
        if backlog > HIGH_WATERMARK {
            self.next = now + TICK_BACKOFF;
            return Tick::Idle;
        }
        match guard("stream ticker", || self.ticker.tick(out)) {
            Ok(Some(delay)) => {
                self.next = now + delay;
                Tick::More
            }
            Ok(None) => Tick::Last,
            Err(_) => Tick::Panicked,
        }
    }
}

/// What one [`Ticking::tick`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Not due, or held back while the exchange is backed up: nothing written.
    Idle,
    /// The ticker wrote an event and runs on.
    More,
    /// The ticker wrote its last event: the body ends.
    Last,
    /// App code panicked: the body is cut short.
    Panicked,
}

impl Tick {
    /// Whether the ticker runs on.
    pub(crate) fn goes_on(self) -> bool {
        matches!(self, Tick::Idle | Tick::More)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends "a", "b", then ends.
    struct Two(u8);
    impl crate::app::Ticker for Two {
        fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration> {
            self.0 += 1;
            out.push(b'a' + self.0 - 1);
            (self.0 < 2).then_some(Duration::from_millis(10))
        }
    }

    fn events(replaying: bool, last_id: i64) -> Events {
        Events { replaying, last_id, held: Vec::new(), next_beat: Instant::now() + Duration::from_secs(60) }
    }

    fn event(s: &str) -> Arc<[u8]> {
        Arc::from(s.as_bytes())
    }

    #[test]
    fn live_events_are_sent_once_in_order() {
        let mut s = Events::new(None, Instant::now());
        assert!(s.admit(1, &event("a")));
        assert!(s.admit(3, &event("c")));
        assert!(!s.admit(3, &event("c")), "a duplicate (another worker's copy) is skipped");
        assert!(!s.admit(2, &event("b")), "an older id than the last sent is skipped");
    }

    #[test]
    fn events_during_a_replay_are_held_and_sent_after_it_unless_it_covered_them() {
        let mut s = Events::new(Some(10), Instant::now());
        for (id, text) in [(12, "twelve"), (15, "fifteen"), (11, "eleven")] {
            assert!(!s.admit(id, &event(text)), "held while the replay runs");
        }
        // The replay sent 11..=12 (the store had them).
        let mut out = Vec::new();
        assert!(s.replayed(b"[11][12]", 12, &mut out));
        assert_eq!(out, b"[11][12]fifteen", "the replay, then only what it did not cover");
        assert!(!s.admit(15, &event("fifteen")), "sent already");
        assert!(s.admit(16, &event("sixteen")), "live again after the replay");
    }

    #[test]
    fn a_replay_that_found_nothing_keeps_the_last_event_id() {
        let mut s = Events::new(Some(7), Instant::now());
        assert!(!s.admit(5, &event("old")));
        let mut out = Vec::new();
        assert!(s.replayed(b"", 0, &mut out));
        assert!(out.is_empty(), "an event at or below Last-Event-ID is not sent again");
        assert!(!s.admit(7, &event("seven")));
        assert!(s.admit(8, &event("eight")));
    }

    #[test]
    fn a_panicking_ticker_is_told_apart_from_one_that_ended() {
        struct Boom;
        impl crate::app::Ticker for Boom {
            fn tick(&mut self, _: &mut Vec<u8>) -> Option<Duration> {
                panic!("ticker bug")
            }
        }
        let now = Instant::now();
        let mut out = Vec::new();
        assert_eq!(Ticking::new(Box::new(Boom), now).tick(now, 0, &mut out), Tick::Panicked);
        assert!(!Tick::Panicked.goes_on() && !Tick::Last.goes_on() && Tick::Idle.goes_on() && Tick::More.goes_on());
    }

    #[test]
    fn live_events_wait_for_the_replay_and_none_is_sent_twice() {
        let mut e = events(true, 3);
        let mut out = Vec::new();
        e.live(5, &Arc::from(&b"[5]"[..]), &mut out);
        e.live(7, &Arc::from(&b"[7]"[..]), &mut out);
        assert!(out.is_empty(), "held while the replay runs");
        assert!(e.replayed(b"[4][5]", 5, &mut out));
        assert_eq!(out, b"[4][5][7]", "the replay, then what it did not cover");
        e.live(7, &Arc::from(&b"[7]"[..]), &mut out);
        e.live(8, &Arc::from(&b"[8]"[..]), &mut out);
        assert_eq!(out, b"[4][5][7][8]");
        assert!(!events(true, 0).replayed(b"", REPLAY_PANICKED, &mut out), "a panicked replay ends the stream");
    }

    #[test]
    fn a_ticker_runs_until_done_and_waits_while_the_stream_is_backed_up() {
        let now = Instant::now();
        let mut t = Ticking::new(Box::new(Two(0)), now);
        let mut full = vec![0; HIGH_WATERMARK + 1];
        assert_eq!(t.tick(now, full.len(), &mut full), Tick::Idle);
        assert_eq!(full.len(), HIGH_WATERMARK + 1, "not asked while backed up");
        assert_eq!(t.next(), now + TICK_BACKOFF);
        let mut out = Vec::new();
        assert_eq!(t.tick(t.next(), out.len(), &mut out), Tick::More);
        assert_eq!(out, b"a");
        assert_eq!(t.tick(now, out.len(), &mut out), Tick::Idle, "not due yet");
        assert_eq!(t.tick(t.next(), out.len(), &mut out), Tick::Last, "done after its second event");
        assert_eq!(out, b"ab");
    }
}
