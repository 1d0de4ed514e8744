//! The engine's tests: exchanges driven through a recording sink and a scripted host, no
//! socket, no codec.

use super::*;
use crate::http::reply::{Assembled, Call, FileRange, Reply, Ticker, Upstream};
use crate::http2::ResponseFields;
use http::StatusCode;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// A stream id of the test sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct S(u32);

impl Key for S {
    fn id(self, conn: usize, gen: u32) -> ExchangeId {
        ExchangeId::H2 { conn, stream: self.0, gen }
    }
}

/// A request head: method, path, fields (with `host`).
struct TestHead(&'static str, &'static str);

impl Head for TestHead {
    fn method(&self) -> &str {
        self.0
    }
    fn path(&self) -> &str {
        self.1
    }
    fn authority(&self) -> Option<&str> {
        Some("example.test")
    }
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        std::iter::empty()
    }
}

/// What the engine wrote, in order.
#[derive(Debug, PartialEq, Eq)]
enum Wrote {
    Head(u32, u16, bool),
    Data(u32, usize, bool),
    Reset(u32, Reset),
    Abandoned(u32),
}

/// A sink that records what it is given and takes at most `room` body bytes per feed;
/// with `cuts`, a failed body is cut short rather than ended. As a [`Source`], it reads
/// out `inputs` and counts the resets it is told of.
#[derive(Default)]
struct TestSink {
    wrote: Vec<Wrote>,
    room: usize,
    cuts: bool,
    inputs: std::collections::VecDeque<Input<S, TestHead>>,
    peer_resets: u32,
}

impl Source for TestSink {
    type Head = TestHead;
    fn next_input(&mut self, _: &Env) -> Option<Input<S, TestHead>> {
        self.inputs.pop_front()
    }
    fn peer_reset(&mut self) {
        self.peer_resets += 1;
    }
}

impl Sink for TestSink {
    type Stream = S;
    fn informational(&mut self, _: S, _: &ResponseFields) -> Result<(), Gone> {
        Ok(())
    }
    fn send_head(&mut self, s: S, status: StatusCode, _: &ResponseFields, end: bool) -> Result<(), Gone> {
        self.wrote.push(Wrote::Head(s.0, status.as_u16(), end));
        Ok(())
    }
    fn send_data(&mut self, s: S, data: Bytes, end: bool) -> Result<(), Gone> {
        self.wrote.push(Wrote::Data(s.0, data.len(), end));
        Ok(())
    }
    fn reset(&mut self, s: S, why: Reset) {
        self.wrote.push(Wrote::Reset(s.0, why));
    }
    fn abandon(&mut self, s: S) {
        if self.cuts {
            self.wrote.push(Wrote::Abandoned(s.0));
        } else {
            let _ = self.send_data(s, Bytes::new(), true);
        }
    }
    fn release(&mut self, _: S, _: usize) {}
    fn file_body(f: FileRange) -> Produce {
        Produce::Download(Download::new(f.file, f.offset, f.len, false))
    }
    fn feed<H>(&mut self, ex: &mut Exchange<S, H>, _: &Pool, _: ExchangeId) -> bool {
        let n = ex.unsent.len().min(self.room);
        if n > 0 {
            ex.unsent.drain(..n);
            self.wrote.push(Wrote::Data(ex.stream.0, n, false));
        }
        false
    }
    fn pump<H>(&mut self, _: &mut [Exchange<S, H>], _: &Pool, _: usize, _: u32) -> bool {
        false
    }
}

/// A service answering every request with what `reply` makes.
struct TestHost {
    reply: Box<dyn FnMut() -> Reply>,
    finished: Vec<u16>,
}

impl Service for TestHost {
    fn call(&mut self, _: &Request<'_>) -> Reply {
        (self.reply)()
    }
    fn finished(&mut self, done: &Finished<'_>) {
        self.finished.push(done.status);
    }
}

impl Host for TestHost {
    fn app(&self) -> &App {
        unreachable!("these tests run no event stream or WebSocket")
    }
    fn websocket_opened(&mut self) -> usize {
        1 << 20
    }
}

/// The engine's `Cx` from a bench's fields.
macro_rules! bench_cx {
    ($b:ident) => {
        Cx { host: &mut $b.host, env: &mut $b.env, pool: &$b.pool, sse: &mut $b.sse, heads: &mut $b.heads }
    };
}

/// Everything an engine test drives: the exchanges, sink, host and what `Cx` borrows.
struct Bench {
    ex: Exchanges<S, TestHead>,
    sink: TestSink,
    host: TestHost,
    env: Env,
    pool: Pool,
    sse: Subscribers,
    heads: Heads,
    _poll: mio::Poll,
}

impl Bench {
    fn new(reply: impl FnMut() -> Reply + 'static) -> Bench {
        let poll = mio::Poll::new().expect("poll");
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker"));
        Bench {
            ex: Exchanges::new(1, 7, IpAddr::from([127, 0, 0, 1]), Protocol::Http2, None, false, Instant::now()),
            sink: TestSink { room: usize::MAX, ..TestSink::default() },
            host: TestHost { reply: Box::new(reply), finished: Vec::new() },
            env: Env::testing(),
            pool: Pool::new(1, waker).expect("pool"),
            sse: Subscribers::new(),
            heads: Heads::new(),
            _poll: poll,
        }
    }

    /// Open a complete request on `stream` and dispatch it.
    fn request(&mut self, stream: u32, method: &'static str) {
        let o = opening(stream, method, false);
        let now = Instant::now();
        let i = self.ex.open(o, &mut self.env.common, self.env.body_timeout, now);
        let mut cx = bench_cx!(self);
        self.ex.dispatch(i, &mut self.sink, &mut cx, now);
    }

    fn service(&mut self) {
        let mut cx = Cx {
            host: &mut self.host,
            env: &mut self.env,
            pool: &self.pool,
            sse: &mut self.sse,
            heads: &mut self.heads,
        };
        self.ex.service(&mut self.sink, &mut cx);
    }
}

/// A ticker that counts its ticks, writes `size` bytes each, and panics when `boom`.
struct Counting {
    ticks: Rc<Cell<usize>>,
    size: usize,
    boom: bool,
}

impl Ticker for Counting {
    fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration> {
        assert!(!self.boom, "ticker failure");
        self.ticks.set(self.ticks.get() + 1);
        out.resize(out.len() + self.size, b'x');
        Some(Duration::ZERO)
    }
}

fn ticker(ticks: &Rc<Cell<usize>>, size: usize, boom: bool) -> Reply {
    let t = Counting { ticks: Rc::clone(ticks), size, boom };
    Reply { head: Response::new(200), body: Body::Producer(Producer::Ticker(Box::new(t))) }
}

/// A bench whose every request gets a [`Counting`] ticker, and its tick count.
fn ticker_bench(size: usize, boom: bool) -> (Rc<Cell<usize>>, Bench) {
    let ticks = Rc::new(Cell::new(0));
    let t = Rc::clone(&ticks);
    (ticks, Bench::new(move || ticker(&t, size, boom)))
}

fn file() -> Arc<std::fs::File> {
    Arc::new(std::fs::File::open("/dev/null").expect("/dev/null"))
}

#[test]
fn a_job_that_completes_after_its_stream_was_reset_sends_nothing() {
    let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
    b.request(1, "GET");
    assert_eq!(b.ex.list[0].stage, Stage::Waiting);
    assert!(b.ex.cancel(S(1), &mut b.sse));
    let mut cx = bench_cx!(b);
    b.ex.completed(S(1), Completion::Response(Ok(Response::new(200))), &mut b.sink, &mut cx);
    assert!(b.sink.wrote.is_empty(), "nothing for a gone stream: {:?}", b.sink.wrote);
    assert!(b.ex.is_empty());
}

#[test]
fn a_job_that_completes_is_answered_whole() {
    let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
    b.request(3, "GET");
    let mut cx = bench_cx!(b);
    b.ex.completed(S(3), Completion::Response(Ok(Response::static_json(b"{}"))), &mut b.sink, &mut cx);
    assert_eq!(b.sink.wrote, [Wrote::Head(3, 200, false), Wrote::Data(3, 2, true)]);
    assert_eq!(b.host.finished, [200]);
    assert!(b.ex.is_empty());
}

#[test]
fn head_gets_no_body_whatever_the_body_kind() {
    let ticks = Rc::new(Cell::new(0));
    let t = Rc::clone(&ticks);
    let kinds: Vec<Box<dyn Fn() -> Reply>> = vec![
        Box::new(|| Reply::full(Response::static_json(b"{\"a\":1}"))),
        Box::new(|| Reply {
            head: Response::new(200),
            body: Body::File(FileRange { file: file(), offset: 0, len: 10 }),
        }),
        Box::new(move || ticker(&t, 5, false)),
    ];
    for kind in kinds {
        let mut b = Bench::new(kind);
        b.request(5, "HEAD");
        assert_eq!(b.sink.wrote, [Wrote::Head(5, 200, true)], "a HEAD answer is its head alone");
        assert!(b.ex.is_empty(), "and the exchange is over");
    }
    assert_eq!(ticks.get(), 0, "no producer runs for a HEAD");
}

#[test]
fn a_ticker_is_held_back_while_its_stream_is_backed_up() {
    let (ticks, mut b) = ticker_bench(HIGH_WATERMARK + 1, false);
    b.sink.room = 0;
    b.request(1, "GET");
    assert_eq!(b.sink.wrote, [Wrote::Head(1, 200, false)]);
    let now = Instant::now();
    b.ex.tick(&b.host, now);
    assert_eq!(ticks.get(), 1);
    // The stream takes nothing: past the watermark, the ticker is not asked again.
    b.service();
    b.ex.tick(&b.host, now + Duration::from_secs(1));
    assert_eq!(ticks.get(), 1, "held back");
    // Once the stream took the bytes, it ticks again.
    b.sink.room = usize::MAX;
    b.service();
    b.ex.tick(&b.host, now + Duration::from_secs(2));
    assert_eq!(ticks.get(), 2, "goes on once drained");
}

#[test]
fn a_ticker_that_panics_ends_its_body_and_its_exchange() {
    let (_, mut b) = ticker_bench(1, true);
    b.request(9, "GET");
    b.ex.tick(&b.host, Instant::now());
    assert!(b.ex.list[0].done, "the body ends");
    b.service();
    assert_eq!(b.sink.wrote.last(), Some(&Wrote::Data(9, 0, true)), "with an empty last frame");
    assert!(b.ex.is_empty());
}

#[test]
fn a_relay_behind_its_client_pauses_until_its_bytes_drain() {
    let call = || Reply {
        head: Response::new(200),
        body: Body::Upstream(Upstream::Call(Call {
            requests: Vec::new(),
            finish: Box::new(|_| Ok(Assembled::Now(Response::new(200)))),
        })),
    };
    let mut b = Bench::new(call);
    b.request(1, "GET");
    assert!(matches!(b.ex.effects.as_slice(), [Effect::Start(ExchangeId::H2 { conn: 1, stream: 1, gen: 7 }, _)]));
    b.ex.effects.clear();
    let follows = {
        let mut cx = bench_cx!(b);
        b.ex.answer(0, Response::new(200), Delimit::Chunked, &mut b.sink, &mut cx)
    };
    assert!(follows);
    b.sink.room = 0;
    assert!(b.ex.relay_data(S(1), &vec![0; HIGH_WATERMARK + 1]));
    assert!(b.ex.relay_slow(S(1)));
    b.sink.room = usize::MAX;
    b.service();
    assert!(!b.ex.relay_slow(S(1)), "drained");
    b.ex.relay_done(S(1));
    b.service();
    assert!(b.ex.is_empty(), "the body ended once sent");
}

#[test]
fn a_reset_exchange_hands_its_upstream_wait_back_to_be_cancelled() {
    let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
    b.request(1, "GET");
    let slot = b.ex.call_slot(S(1)).expect("open");
    *slot = Some(CallState::Gather {
        ups: Vec::new(),
        results: Vec::new(),
        waiting: 1,
        finish: Box::new(|_| Ok(Assembled::Now(Response::new(200)))),
    });
    b.ex.cancel(S(1), &mut b.sse);
    assert!(matches!(b.ex.effects.as_slice(), [Effect::Cancel(ExchangeId::H2 { stream: 1, .. }, _)]));
}

#[test]
fn a_client_that_stops_reading_is_reset_past_the_backlog() {
    let (_, mut b) = ticker_bench(MAX_BACKLOG + 1, false);
    b.sink.room = 0;
    b.request(1, "GET");
    b.ex.tick(&b.host, Instant::now());
    b.service();
    assert_eq!(b.sink.wrote.last(), Some(&Wrote::Reset(1, Reset::Cancel)));
    assert!(b.ex.is_empty());
}

/// A request head for `/x` on `stream` (`body_follows`: its body is still to come).
fn opening(stream: u32, method: &'static str, body_follows: bool) -> Opening<S, TestHead> {
    Opening {
        stream: S(stream),
        head: TestHead(method, "/x"),
        priority: Priority::default(),
        body_follows,
        tunnel: false,
    }
}

#[test]
fn a_body_deadline_and_a_producer_deadline_both_count() {
    let (_, mut b) = ticker_bench(1, false);
    let now = Instant::now();
    let o = opening(1, "POST", true);
    b.ex.open(o, &mut b.env.common, b.env.body_timeout, now);
    assert_eq!(b.ex.deadline(), Some(now + b.env.body_timeout), "a body still arriving is timed");
    b.request(3, "GET");
    assert!(b.ex.deadline().is_some_and(|t| t <= now + Duration::from_millis(100)), "and so is a ticker");
}

#[test]
fn a_body_past_the_limit_is_answered_413() {
    let mut b = Bench::new(|| Reply::full(Response::new(200)));
    let o = opening(1, "POST", true);
    let now = Instant::now();
    b.ex.open(o, &mut b.env.common, b.env.body_timeout, now);
    let limit = b.env.max_body as usize;
    let mut cx = bench_cx!(b);
    b.ex.data(S(1), &vec![0; limit + 1], false, &mut b.sink, &mut cx, now);
    assert!(matches!(b.sink.wrote.first(), Some(Wrote::Head(1, 413, _))));
    assert!(b.ex.is_empty());
}

#[test]
fn a_ticker_that_panics_is_abandoned_where_the_codec_cuts_a_failed_body_short() {
    let (_, mut b) = ticker_bench(1, true);
    b.sink.cuts = true;
    b.request(9, "GET");
    b.ex.tick(&b.host, Instant::now());
    b.service();
    assert_eq!(b.sink.wrote.last(), Some(&Wrote::Abandoned(9)), "no clean end: {:?}", b.sink.wrote);
    assert!(b.ex.is_empty());
}

#[test]
fn an_adopted_exchange_runs_its_body_and_ends_without_a_head() {
    let mut b = Bench::new(|| Reply::full(Response::new(200)));
    let now = Instant::now();
    let t = Counting { ticks: Rc::new(Cell::new(0)), size: 3, boom: false };
    let i = b.ex.adopt(S(1), TestHead("GET", "/x"), Stage::Streaming, None, now);
    let mut cx = bench_cx!(b);
    b.ex.start_producer(i, Producer::Ticker(Box::new(t)), &mut cx, now);
    b.ex.tick(&b.host, now);
    b.service();
    assert_eq!(b.sink.wrote, [Wrote::Data(1, 3, false)], "the codec wrote the head: the body only");
    let done = b.ex.adopt(
        S(3),
        TestHead("GET", "/f"),
        Stage::Streaming,
        Some(TestSink::file_body(FileRange { file: file(), offset: 0, len: 0 })),
        now,
    );
    assert!(b.ex.list[done].done, "an empty file body is complete at once");
    b.service();
    assert_eq!(b.sink.wrote.last(), Some(&Wrote::Data(3, 0, true)), "and ends");
    assert!(b.host.finished.is_empty(), "the codec logged those exchanges, not the engine");
}

#[test]
fn an_adopted_wait_holds_its_upstreams_until_it_goes() {
    let mut b = Bench::new(|| Reply::full(Response::new(200)));
    b.ex.adopt(S(1), TestHead("GET", "/x"), Stage::Waiting, None, Instant::now());
    *b.ex.call_slot(S(1)).expect("open") = Some(CallState::Gather {
        ups: Vec::new(),
        results: Vec::new(),
        waiting: 1,
        finish: Box::new(|_| Ok(Assembled::Now(Response::new(200)))),
    });
    b.service();
    assert!(b.sink.wrote.is_empty() && !b.ex.is_empty(), "nothing streams while it waits");
    b.ex.close_all(&mut b.sse);
    assert!(matches!(b.ex.effects.as_slice(), [Effect::Cancel(ExchangeId::H2 { stream: 1, .. }, _)]));
}

/// A sink whose codec writes its own heads: it records what it was asked to answer, and
/// says a body follows when `follows` and the answer is not whole.
struct Answering {
    answered: Vec<(u16, Delimit)>,
    follows: bool,
}

impl Sink for Answering {
    type Stream = S;
    const ANSWERS: bool = true;
    fn respond(&mut self, _: S, resp: Response, delimit: Delimit, _: &mut dyn Service, _: &mut Env) -> bool {
        self.answered.push((resp.status, delimit));
        self.follows && delimit != Delimit::Length
    }
    fn informational(&mut self, _: S, _: &ResponseFields) -> Result<(), Gone> {
        unreachable!("the codec writes its heads")
    }
    fn send_head(&mut self, _: S, _: StatusCode, _: &ResponseFields, _: bool) -> Result<(), Gone> {
        unreachable!("the codec writes its heads")
    }
    fn send_data(&mut self, _: S, _: Bytes, _: bool) -> Result<(), Gone> {
        Ok(())
    }
    fn reset(&mut self, _: S, _: Reset) {}
    fn release(&mut self, _: S, _: usize) {}
    fn file_body(f: FileRange) -> Produce {
        Produce::Download(Download::new(f.file, f.offset, f.len, false))
    }
    fn feed<H>(&mut self, _: &mut Exchange<S, H>, _: &Pool, _: ExchangeId) -> bool {
        false
    }
    fn pump<H>(&mut self, _: &mut [Exchange<S, H>], _: &Pool, _: usize, _: u32) -> bool {
        false
    }
}

#[test]
fn a_codec_that_writes_its_own_heads_answers_an_adopted_exchange_and_logs_it_itself() {
    let mut b = Bench::new(|| unreachable!("an adopted exchange was dispatched by its codec"));
    let mut sink = Answering { answered: Vec::new(), follows: true };
    let now = Instant::now();
    b.ex.adopt(S(1), TestHead("GET", "/job"), Stage::Waiting, None, now);
    let mut cx = bench_cx!(b);
    b.ex.completed(S(1), Completion::Response(Ok(Response::new(201))), &mut sink, &mut cx);
    assert_eq!(sink.answered, [(201, Delimit::Length)], "the pool's answer, whole, through the codec");
    assert!(b.ex.is_empty(), "a whole answer ends the exchange");
    // Waiting on upstreams that relay: the head now, the body after it.
    let i = b.ex.adopt(S(1), TestHead("GET", "/relay"), Stage::Waiting, None, now);
    let mut cx = bench_cx!(b);
    assert!(b.ex.answer(i, Response::new(200), Delimit::Chunked, &mut sink, &mut cx));
    assert_eq!(sink.answered[1], (200, Delimit::Chunked));
    assert_eq!(b.ex.list[0].stage, Stage::Streaming, "the relayed body follows");
    assert!(b.host.finished.is_empty(), "the codec logs what it answers, not the engine");
}

#[test]
fn a_head_refused_before_it_had_an_exchange_is_answered_whole_and_opens_none() {
    let mut b = Bench::new(|| unreachable!("a refused head reaches no handler"));
    let (mut cx, now) = (bench_cx!(b), Instant::now());
    let reset = b.ex.input(Input::Refused { stream: S(5), error: Error::HeaderTooLarge }, &mut b.sink, &mut cx, now);
    assert!(!reset);
    assert!(matches!(b.sink.wrote[..], [Wrote::Head(5, 431, false), Wrote::Data(5, _, true)]), "{:?}", b.sink.wrote);
    assert!(b.ex.is_empty());
    assert!(b.host.finished.is_empty(), "nothing is logged for a stream with no exchange");
}

#[test]
fn a_reset_reports_whether_it_cancelled_an_open_exchange() {
    let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
    let (mut cx, now) = (bench_cx!(b), Instant::now());
    let request = Input::Request { opening: opening(1, "GET", false), refused: None, complete: true };
    assert!(!b.ex.input(request, &mut b.sink, &mut cx, now), "a request is no reset");
    assert_eq!(b.ex.list[0].stage, Stage::Waiting);
    assert!(b.ex.input(Input::Reset(S(1)), &mut b.sink, &mut cx, now), "its exchange was open");
    assert!(!b.ex.input(Input::Reset(S(1)), &mut b.sink, &mut cx, now), "no exchange is left to cancel");
    assert!(b.ex.is_empty());
    assert!(b.sink.wrote.is_empty(), "a reset stream is answered nothing: {:?}", b.sink.wrote);
}

#[test]
fn a_request_refused_by_its_codec_is_answered_with_the_refusal_not_dispatched() {
    let mut b = Bench::new(|| unreachable!("a refused request reaches no handler"));
    let (mut cx, now) = (bench_cx!(b), Instant::now());
    let refused = Some(Error::PayloadTooLarge);
    let request = Input::Request { opening: opening(3, "POST", true), refused, complete: false };
    b.ex.input(request, &mut b.sink, &mut cx, now);
    assert!(matches!(b.sink.wrote[..], [Wrote::Head(3, 413, false), Wrote::Data(3, _, true)]), "{:?}", b.sink.wrote);
    assert_eq!(b.host.finished, [413]);
    assert!(b.ex.is_empty());
}

#[test]
fn body_bytes_complete_a_request_then_the_closed_connection_takes_every_exchange() {
    let mut b = Bench::new(|| Reply::later(Box::new(|| Ok(Response::new(200)))));
    let (mut cx, now) = (bench_cx!(b), Instant::now());
    for stream in [1, 3] {
        let request = Input::Request { opening: opening(stream, "POST", true), refused: None, complete: false };
        b.ex.input(request, &mut b.sink, &mut cx, now);
    }
    b.ex.input(Input::Data { stream: S(1), bytes: Bytes::from_static(b"abc"), end: true }, &mut b.sink, &mut cx, now);
    let stages: Vec<Stage> = b.ex.list.iter().map(|e| e.stage).collect();
    assert_eq!(stages, [Stage::Waiting, Stage::Receiving], "the ended body is dispatched, the other still arrives");
    b.ex.input(Input::Closed, &mut b.sink, &mut cx, now);
    assert!(b.ex.is_empty());
    assert!(b.sink.wrote.is_empty(), "{:?}", b.sink.wrote);
}

#[test]
fn a_turn_applies_every_input_and_tells_the_codec_of_each_open_exchange_the_peer_reset() {
    let mut b = Bench::new(|| unreachable!("no request completes"));
    let (mut cx, now) = (bench_cx!(b), Instant::now());
    for stream in [1, 3] {
        let request = Input::Request { opening: opening(stream, "POST", true), refused: None, complete: false };
        b.sink.inputs.push_back(request);
    }
    b.sink.inputs.extend([Input::Reset(S(1)), Input::Reset(S(5))]);
    b.ex.run(&mut b.sink, &mut cx, now);
    assert!(b.sink.inputs.is_empty(), "every input is read");
    assert_eq!(
        b.sink.peer_resets, 1,
        "the reset of stream 1 counts; that of stream 5, which has no exchange, does not"
    );
    assert_eq!(b.ex.list.iter().map(|e| e.stream).collect::<Vec<_>>(), [S(3)]);
}
