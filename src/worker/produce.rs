//! The body producers a multiplexed exchange (an HTTP/2 or an HTTP/3 stream) runs after its
//! head, written once for both codecs: an `/api/events` subscription ([`Events`]: preamble,
//! `Last-Event-ID` replay on the pool, live bus events held while the replay runs,
//! heartbeats) and a timer-driven ticker ([`Ticking`], the chat echo). Each writes into the
//! exchange's unsent bytes; the codec's glue moves those into its stream as flow control
//! allows, and ends the stream when a producer says so (`false`).
//!
//! It must not touch a socket, a codec or the exchange table: the glue in `h2.rs` / `h3.rs`
//! registers the subscription and submits the replay job this returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fanout::Subscribers;
use super::panics::guard;
use super::pool::{ExchangeId, Pool, Work, REPLAY_PANICKED};
use crate::app::App;
use crate::http::service::HIGH_WATERMARK;
use crate::resources::audience::Audience;

/// How long a ticker whose stream is backed up waits before it is asked again.
const TICK_BACKOFF: Duration = Duration::from_millis(50);

/// An `/api/events` subscription on a stream.
pub(super) struct Events {
    /// A `Last-Event-ID` replay runs on the pool.
    replaying: bool,
    /// The last notification id sent.
    last_id: i64,
    /// Live events that arrived during the replay.
    held: Vec<(i64, Arc<[u8]>)>,
    next_beat: Instant,
}

impl Events {
    /// The stream `id` of `audience` subscribes: the preamble goes into `out`, the
    /// subscription into `sse`, the replay after `last_event_id` (if any) to the pool. `None`:
    /// app code panicked; end the stream.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
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
        let events = Events {
            replaying: replay.is_some(),
            last_id: last_event_id.unwrap_or(0),
            held: Vec::new(),
            next_beat: now + every,
        };
        if let Some(job) = replay {
            pool.submit(id, Work::Replay(job));
        }
        Some(events)
    }

    /// When the next heartbeat is due.
    pub(super) fn next(&self) -> Instant {
        self.next_beat
    }

    /// A heartbeat into `out` if one is due; `false`: app code panicked, end the stream.
    pub(super) fn beat(&mut self, app: &App, now: Instant, out: &mut Vec<u8>) -> bool {
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
    pub(super) fn replayed(&mut self, bytes: &[u8], last: i64, out: &mut Vec<u8>) -> bool {
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

    /// A live event from the bus: held while the replay runs, else sent unless already sent.
    pub(super) fn live(&mut self, id: i64, event: &Arc<[u8]>, out: &mut Vec<u8>) {
        if self.replaying {
            self.held.push((id, event.clone()));
        } else if id > self.last_id {
            self.last_id = id;
            out.extend_from_slice(event);
        }
    }
}

/// A ticker-driven stream (events from a timer).
pub(super) struct Ticking {
    ticker: Box<dyn crate::app::Ticker>,
    next: Instant,
}

impl Ticking {
    /// A ticker asked first at `now`.
    pub(super) fn new(ticker: Box<dyn crate::app::Ticker>, now: Instant) -> Ticking {
        Ticking { ticker, next: now }
    }

    /// When the ticker is asked next.
    pub(super) fn next(&self) -> Instant {
        self.next
    }

    /// Ask the ticker if it is due, unless `out` is backed up past the watermark (then again
    /// after a short pause). `false`: the ticker is done or panicked, end the stream.
    pub(super) fn tick(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        if self.next > now {
            return true;
        }
        if out.len() > HIGH_WATERMARK {
            self.next = now + TICK_BACKOFF;
            return true;
        }
        match guard("stream ticker", || self.ticker.tick(out)) {
            Ok(Some(delay)) => {
                self.next = now + delay;
                true
            }
            Ok(None) | Err(_) => false,
        }
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
        assert!(t.tick(now, &mut full));
        assert_eq!(full.len(), HIGH_WATERMARK + 1, "not asked while backed up");
        assert_eq!(t.next(), now + TICK_BACKOFF);
        let mut out = Vec::new();
        assert!(t.tick(t.next(), &mut out));
        assert_eq!(out, b"a");
        assert!(t.tick(now, &mut out), "not due yet");
        assert!(!t.tick(t.next(), &mut out), "done after its second event");
        assert_eq!(out, b"ab");
    }
}
