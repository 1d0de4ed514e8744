//! [`H2Conn`] against a real h2 client (polled by hand over its own
//! in-memory [`Io`]) and against hand-written hostile frames: bytes are
//! shuttled between the two buffers in bounded loops, no socket, no thread.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use h2::client::{self, ResponseFuture, SendRequest};
use h2::RecvStream;
use http::{Method, Request, Response};

use super::frame::testing::{frame, PREFACE};
use super::wire::kind::{CONTINUATION, DATA, GOAWAY, HEADERS, PING, RST_STREAM, SETTINGS, WINDOW_UPDATE};
use super::*;

fn cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// One frame: type, flags, stream, payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The complete frames in `bytes` (a server's output from its first byte).
fn parse_frames(bytes: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        if rest.len() < 9 + len {
            break;
        }
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        frames.push(Frame { kind: rest[3], flags: rest[4], stream, payload: rest[9..9 + len].to_vec() });
        rest = &rest[9 + len..];
    }
    frames
}

/// The error code of a RST_STREAM or GOAWAY frame.
fn error_code(f: &Frame) -> u32 {
    let at = if f.kind == GOAWAY { 4 } else { 0 };
    u32::from_be_bytes([f.payload[at], f.payload[at + 1], f.payload[at + 2], f.payload[at + 3]])
}

/// The error code of a RST_STREAM or GOAWAY frame, 0 for other frames.
fn error_code_or_0(f: &Frame) -> u32 {
    if f.kind == RST_STREAM || f.kind == GOAWAY {
        error_code(f)
    } else {
        0
    }
}

/// A raw client's opening: preface, empty SETTINGS, ACK of the server's.
fn raw_opening() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(SETTINGS, 0x1, 0, &[]));
    out
}

/// HPACK for `GET https://<none>/`: three static-table indexes.
const GET_ROOT: [u8; 3] = [0x82, 0x87, 0x84];

/// A HEADERS frame for `GET /` with END_STREAM | END_HEADERS.
fn get_root(stream: u32) -> Vec<u8> {
    frame(HEADERS, 0x5, stream, &GET_ROOT)
}

/// A server driven by raw bytes: feed, advance, keep every output byte.
struct Raw {
    server: H2Conn,
    events: VecDeque<Event>,
    out: Vec<u8>,
    max_output: usize,
}

impl Raw {
    fn new(settings: H2Settings) -> Raw {
        Raw { server: H2Conn::new(settings), events: VecDeque::new(), out: Vec::new(), max_output: 0 }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.server.feed(bytes);
        self.step();
    }

    /// One turn, as the worker drives a connection once per readiness event.
    fn step(&mut self) {
        self.server.begin_turn(Instant::now());
        for _ in 0..8 {
            self.server.advance(&mut self.events);
            self.max_output = self.max_output.max(self.server.output_len());
            let before = self.out.len();
            self.server.drain_output(&mut self.out);
            if self.out.len() == before {
                break;
            }
        }
    }

    fn closed(&self) -> Option<&Option<H2Error>> {
        self.events.iter().find_map(|e| match e {
            Event::Closed { error } => Some(error),
            _ => None,
        })
    }
}

/// An h2 client and an [`H2Conn`], connected by shuttling buffers.
struct Pair {
    server: H2Conn,
    events: VecDeque<Event>,
    cio: Io,
    client: Pin<Box<client::Connection<Io, Bytes>>>,
    send: SendRequest<Bytes>,
    client_result: Option<Result<(), h2::Error>>,
    /// Every byte the server wrote, in order.
    s2c: Vec<u8>,
}

/// Move bytes both ways; the count moved.
fn shuttle(server: &mut H2Conn, cio: &Io, s2c: &mut Vec<u8>) -> usize {
    let mut buf = Vec::new();
    server.drain_output(&mut buf);
    cio.feed(&buf);
    s2c.extend_from_slice(&buf);
    let moved = buf.len();
    buf.clear();
    cio.drain_output(&mut buf);
    server.feed(&buf);
    moved + buf.len()
}

impl Pair {
    fn new() -> Pair {
        Pair::with(H2Settings::default(), client::Builder::new())
    }

    fn with(settings: H2Settings, builder: client::Builder) -> Pair {
        let mut server = H2Conn::new(settings);
        let mut events = VecDeque::new();
        let cio = Io::new(1 << 20);
        let mut s2c = Vec::new();
        let mut handshake = Box::pin(builder.handshake::<Io, Bytes>(cio.clone()));
        for _ in 0..20 {
            if let Poll::Ready(done) = handshake.as_mut().poll(&mut cx()) {
                let (send, client) = done.expect("client handshake");
                let mut pair = Pair { server, events, cio, client: Box::pin(client), send, client_result: None, s2c };
                pair.pump();
                return pair;
            }
            server.begin_turn(Instant::now());
            server.advance(&mut events);
            shuttle(&mut server, &cio, &mut s2c);
        }
        panic!("the handshake did not complete");
    }

    /// Poll both sides and move bytes until nothing moves (bounded).
    fn pump(&mut self) {
        for _ in 0..500 {
            self.server.begin_turn(Instant::now());
            self.server.advance(&mut self.events);
            if self.client_result.is_none() {
                if let Poll::Ready(r) = self.client.as_mut().poll(&mut cx()) {
                    self.client_result = Some(r);
                }
            }
            if shuttle(&mut self.server, &self.cio, &mut self.s2c) == 0 {
                return;
            }
        }
        panic!("the connection never went quiet");
    }

    fn request(&mut self, req: Request<()>, end: bool) -> (ResponseFuture, h2::SendStream<Bytes>) {
        self.send.send_request(req, end).expect("send_request")
    }

    /// Take the events so far.
    fn events(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }

    /// The one request among `events`.
    fn only_request(&mut self) -> (StreamId, RequestHead) {
        let mut requests: Vec<_> = self
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Request { stream, head } => Some((stream, head)),
                _ => None,
            })
            .collect();
        assert_eq!(requests.len(), 1, "one request expected");
        requests.remove(0)
    }
}

fn get(path: &str) -> Request<()> {
    Request::get(format!("https://example.test{path}")).body(()).expect("request")
}

/// Poll a response future once.
fn response(rf: &mut ResponseFuture) -> Option<Result<Response<RecvStream>, h2::Error>> {
    match Pin::new(rf).poll(&mut cx()) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

/// Read whatever body bytes are there; true once the body ended.
fn read_body(body: &mut RecvStream, into: &mut Vec<u8>, release: bool) -> bool {
    loop {
        match body.poll_data(&mut cx()) {
            Poll::Ready(Some(Ok(chunk))) => {
                into.extend_from_slice(&chunk);
                if release {
                    body.flow_control().release_capacity(chunk.len()).expect("release");
                }
            }
            Poll::Ready(Some(Err(e))) => panic!("body error: {e}"),
            Poll::Ready(None) => return true,
            Poll::Pending => return body.is_end_stream(),
        }
    }
}

#[test]
fn settings_frame_says_what_we_configured() {
    let mut raw = Raw::new(H2Settings::new(8192));
    raw.step();
    let frames = parse_frames(&raw.out);
    let settings = frames.first().expect("a first frame");
    assert_eq!((settings.kind, settings.flags, settings.stream), (SETTINGS, 0, 0));
    let mut values = Vec::new();
    for entry in settings.payload.chunks(6) {
        let id = u16::from_be_bytes([entry[0], entry[1]]);
        let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
        values.push((id, value));
    }
    // MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE
    // (twice the limit: a list just over it gets the caller's 431),
    // ENABLE_CONNECT_PROTOCOL.
    for want in [(0x3, 128), (0x4, 65_535), (0x6, 16_384), (0x8, 1)] {
        assert!(values.contains(&want), "setting {want:?} missing from {values:?}");
    }

    // And as the h2 client understood them.
    let pair = Pair::new();
    assert_eq!(pair.send.current_max_send_streams(), 128);
    assert!(pair.send.is_extended_connect_protocol_enabled());
    assert!(pair.events.is_empty());
}

#[test]
fn get_gets_a_response_with_headers_and_body() {
    let mut pair = Pair::new();
    let req = Request::get("https://example.test/hello?x=1").header("x-trace", "abc").body(()).expect("request");
    let (mut rf, _) = pair.request(req, true);
    pair.pump();
    let (stream, head) = pair.only_request();
    assert_eq!(stream, StreamId(1));
    assert_eq!(head.method(), "GET");
    assert_eq!(head.scheme(), Some("https"));
    assert_eq!(head.authority(), Some("example.test"));
    assert_eq!(head.path(), "/hello?x=1");
    assert_eq!(head.protocol(), None);
    assert!(head.end_stream);
    assert!(head.fields().any(|(n, v)| n == "x-trace" && v == b"abc"));

    let headers = [("content-type", "text/plain"), ("Connection", "keep-alive"), ("x-multi", "a"), ("x-multi", "b")];
    pair.server.respond(stream, 200, &headers, false).expect("respond");
    assert!(pair.server.respond(stream, 200, &headers, false).is_err(), "a second response");
    assert!(pair.server.writable(stream) > 0);
    pair.server.send_data(stream, Bytes::from_static(b"hello, h2"), true).expect("send_data");
    assert_eq!(pair.server.open_streams(), 0, "finished streams are dropped");
    pair.pump();

    let resp = response(&mut rf).expect("response ready").expect("response ok");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/plain");
    assert!(resp.headers().get("connection").is_none(), "hop-by-hop fields are dropped");
    assert_eq!(resp.headers().get_all("x-multi").iter().count(), 2);
    let mut body = Vec::new();
    assert!(read_body(&mut resp.into_body(), &mut body, true));
    assert_eq!(body, b"hello, h2");
}

#[test]
fn post_body_arrives_in_data_events() {
    let mut pair = Pair::new();
    let req = Request::post("https://example.test/upload").body(()).expect("request");
    let (mut rf, mut upload) = pair.request(req, false);
    pair.pump();
    let (stream, head) = pair.only_request();
    assert!(!head.end_stream);
    upload.send_data(Bytes::from_static(b"part one, "), false).expect("client data");
    pair.pump();
    upload.send_data(Bytes::from_static(b"part two"), true).expect("client data");
    pair.pump();
    let mut body = Vec::new();
    let mut ended = false;
    for e in pair.events() {
        match e {
            Event::Data { stream: s, bytes, end } => {
                assert_eq!(s, stream);
                assert!(!ended, "nothing after the end");
                body.extend_from_slice(&bytes);
                pair.server.release(stream, bytes.len()).expect("release");
                ended = end;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(ended);
    assert_eq!(body, b"part one, part two");
    pair.server.respond(stream, 204, &[] as &[(&str, &str)], true).expect("respond");
    pair.pump();
    assert_eq!(response(&mut rf).expect("ready").expect("ok").status(), 204);
}

#[test]
fn many_streams_interleave_on_one_connection() {
    let mut pair = Pair::new();
    let mut futures = Vec::new();
    for i in 0..40 {
        futures.push(pair.request(get(&format!("/item/{i}")), true).0);
    }
    pair.pump();
    let mut streams: Vec<(StreamId, String)> = pair
        .events()
        .into_iter()
        .map(|e| match e {
            Event::Request { stream, head } => (stream, head.path().to_owned()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(streams.len(), 40);
    // Answer in reverse order, each body in two halves, the halves of all
    // streams interleaved.
    streams.reverse();
    for (stream, _) in &streams {
        pair.server.respond(*stream, 200, &[("content-type", "text/plain")], false).expect("respond");
    }
    for (stream, path) in &streams {
        pair.server.send_data(*stream, Bytes::from(format!("{path} ")), false).expect("first half");
    }
    pair.pump();
    for (stream, _) in &streams {
        pair.server.send_data(*stream, Bytes::from_static(b"done"), true).expect("second half");
    }
    pair.pump();
    for (i, rf) in futures.iter_mut().enumerate() {
        let resp = response(rf).expect("ready").expect("ok");
        let mut body = Vec::new();
        assert!(read_body(&mut resp.into_body(), &mut body, true));
        assert_eq!(body, format!("/item/{i} done").as_bytes());
    }
    assert_eq!(pair.server.open_streams(), 0);
}

#[test]
fn flow_control_stalls_at_the_window_and_resumes_on_release() {
    const MIB: usize = 1 << 20;
    let body: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let mut pair = Pair::new();
    let (mut rf, _) = pair.request(get("/big"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.respond(stream, 200, &[("content-length", MIB.to_string())], false).expect("respond");
    let mut at = 0;
    // The client reads nothing: the server may send one window, no more.
    for _ in 0..50 {
        let n = pair.server.writable(stream).min(MIB - at);
        if n > 0 {
            pair.server.send_data(stream, Bytes::copy_from_slice(&body[at..at + n]), false).expect("send");
            at += n;
        }
        pair.pump();
    }
    assert_eq!(at, 65_535, "exactly the client's initial window was offered");
    assert_eq!(pair.server.writable(stream), 0);
    let sent = pair.s2c.len();
    pair.pump();
    pair.pump();
    assert_eq!(pair.s2c.len(), sent, "the server's output stopped growing");

    // The client consumes and releases: Writable events resume the body.
    let resp = response(&mut rf).expect("ready").expect("ok");
    let mut received = Vec::new();
    let mut recv = resp.into_body();
    let mut writable_events = 0;
    let mut done = false;
    for _ in 0..10_000 {
        done = read_body(&mut recv, &mut received, true);
        if done {
            break;
        }
        pair.pump();
        for e in pair.events() {
            match e {
                Event::Writable { stream: s } => {
                    assert_eq!(s, stream);
                    writable_events += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        loop {
            let n = pair.server.writable(stream).min(MIB - at);
            if n == 0 || at == MIB {
                break;
            }
            pair.server.send_data(stream, Bytes::copy_from_slice(&body[at..at + n]), at + n == MIB).expect("send");
            at += n;
        }
        pair.pump();
    }
    assert!(done, "the body completed");
    assert!(writable_events > 0);
    assert_eq!(received.len(), MIB);
    assert!(received == body);
}

#[test]
fn the_129th_concurrent_stream_is_refused() {
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    for i in 0..129 {
        bytes.extend(get_root(1 + 2 * i));
    }
    raw.send(&bytes);
    let requests = raw.events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
    assert_eq!(requests, 128);
    let frames = parse_frames(&raw.out);
    let refused: Vec<_> = frames.iter().filter(|f| f.kind == RST_STREAM).collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].stream, 257);
    assert_eq!(error_code(refused[0]), u32::from(Reason::REFUSED_STREAM));
    assert!(raw.closed().is_none(), "the connection lives on");
}

#[test]
fn a_header_list_just_over_the_limit_reaches_the_caller_for_its_431() {
    // h2 decodes up to twice the limit: the caller sees the request, and
    // `request::check` tells it to answer 431 (with its JSON error).
    let mut pair = Pair::with(H2Settings::new(1024), client::Builder::new());
    let req = Request::get("https://example.test/").header("x-big", "a".repeat(900)).body(()).expect("request");
    let (_rf, _) = pair.request(req, true);
    pair.pump();
    let (_, head) = pair.only_request();
    assert!(crate::http2::request::header_list_size(&head) > 1024);
    assert_eq!(crate::http2::request::check(&head, 1024), Err(crate::http2::request::Fault::TooLarge));
}

#[test]
fn an_oversized_header_list_is_refused() {
    let mut pair = Pair::with(H2Settings::new(1024), client::Builder::new());
    let req = Request::get("https://example.test/").header("x-big", "a".repeat(2000)).body(()).expect("request");
    let (mut rf, _) = pair.request(req, true);
    pair.pump();
    assert!(pair.events().is_empty(), "the request never reaches the caller");
    // h2 answers 431 on the stream itself: HEADERS with END_STREAM. The
    // request had ended, so nothing more is needed.
    let resp = response(&mut rf).expect("ready").expect("a response");
    assert_eq!(resp.status(), 431);
    let frames = parse_frames(&pair.s2c);
    let on_1: Vec<_> = frames.iter().filter(|f| f.stream == 1).map(|f| (f.kind, f.flags)).collect();
    assert_eq!(on_1, [(HEADERS, 0x5)]);

    // With a body on its way, the 431 is followed by RST_STREAM with
    // PROTOCOL_ERROR (h2's implicit reset; a comment in h2's recv.rs says
    // REFUSED_STREAM, the code in streams.rs sends PROTOCOL_ERROR).
    let req = Request::post("https://example.test/").header("x-big", "b".repeat(2000)).body(()).expect("request");
    let (mut rf, mut up) = pair.request(req, false);
    pair.pump();
    let _ = up.send_data(Bytes::from_static(b"body"), true);
    pair.pump();
    assert!(pair.events().is_empty());
    assert_eq!(response(&mut rf).expect("ready").expect("a response").status(), 431);
    let frames = parse_frames(&pair.s2c);
    let on_3: Vec<_> = frames.iter().filter(|f| f.stream == 3).map(|f| (f.kind, f.flags, error_code_or_0(f))).collect();
    assert_eq!(on_3, [(HEADERS, 0x5, 0), (RST_STREAM, 0, u32::from(Reason::PROTOCOL_ERROR))]);

    // The connection survives: the next request works.
    let (mut rf, _) = pair.request(get("/small"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.respond(stream, 200, &[] as &[(&str, &str)], true).expect("respond");
    pair.pump();
    assert_eq!(response(&mut rf).expect("ready").expect("ok").status(), 200);
}

#[test]
fn early_hints_precede_the_response() {
    let mut pair = Pair::new();
    let (mut rf, _) = pair.request(get("/page"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.early_hints(stream, &[("link", "</app.css>; rel=preload; as=style")]).expect("103");
    pair.pump();
    let hint = match rf.poll_informational(&mut cx()) {
        Poll::Ready(Some(Ok(hint))) => hint,
        other => panic!("no 103: {other:?}"),
    };
    assert_eq!(hint.status(), 103);
    assert_eq!(hint.headers()["link"], "</app.css>; rel=preload; as=style");
    pair.server.respond(stream, 200, &[] as &[(&str, &str)], true).expect("respond");
    pair.pump();
    assert_eq!(response(&mut rf).expect("ready").expect("ok").status(), 200);
    assert!(matches!(pair.server.early_hints(stream, &[("link", "x")]), Err(H2Error::UnknownStream(_))));
}

#[test]
fn extended_connect_carries_bytes_both_ways() {
    let mut pair = Pair::new();
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri("https://example.test/chat")
        .header("sec-websocket-version", "13")
        .extension(h2::ext::Protocol::from_static("websocket"))
        .body(())
        .expect("request");
    let (mut rf, mut up) = pair.request(req, false);
    pair.pump();
    let (stream, head) = pair.only_request();
    assert_eq!(head.method(), "CONNECT");
    assert_eq!(head.protocol(), Some("websocket"));
    assert_eq!(head.path(), "/chat");
    assert!(!head.end_stream);
    pair.server.respond(stream, 200, &[] as &[(&str, &str)], false).expect("respond");
    pair.pump();
    let resp = response(&mut rf).expect("ready").expect("ok");
    assert_eq!(resp.status(), 200);
    let mut down = resp.into_body();

    for round in 0..3 {
        let msg = format!("ping {round}");
        up.send_data(Bytes::from(msg.clone()), false).expect("client send");
        pair.pump();
        let got: Vec<u8> = pair
            .events()
            .into_iter()
            .flat_map(|e| match e {
                Event::Data { bytes, end: false, .. } => bytes.to_vec(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(got, msg.as_bytes());
        pair.server.release(stream, got.len()).expect("release");
        assert!(pair.server.writable(stream) > 0);
        pair.server.send_data(stream, Bytes::from(format!("pong {round}")), false).expect("server send");
        pair.pump();
        let mut back = Vec::new();
        assert!(!read_body(&mut down, &mut back, true));
        assert_eq!(back, format!("pong {round}").as_bytes());
    }
    // The client closes its side, then the server its own.
    up.send_data(Bytes::new(), true).expect("client end");
    pair.pump();
    assert!(matches!(pair.events()[..], [Event::Data { end: true, .. }]));
    pair.server.send_data(stream, Bytes::new(), true).expect("server end");
    pair.pump();
    let mut back = Vec::new();
    assert!(read_body(&mut down, &mut back, true));
    assert_eq!(pair.server.open_streams(), 0);
}

#[test]
fn graceful_shutdown_sends_goaway_and_lets_the_open_stream_finish() {
    let mut pair = Pair::new();
    let (mut rf, _) = pair.request(get("/slow"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.graceful_shutdown();
    pair.pump();
    let goaways: Vec<_> = parse_frames(&pair.s2c).into_iter().filter(|f| f.kind == GOAWAY).collect();
    assert!(!goaways.is_empty(), "a GOAWAY went out");
    assert!(goaways.iter().all(|f| error_code(f) == u32::from(Reason::NO_ERROR)));
    assert!(!pair.server.is_closed(), "the open stream holds the connection");

    pair.server.respond(stream, 200, &[] as &[(&str, &str)], false).expect("respond");
    pair.server.send_data(stream, Bytes::from_static(b"finished"), true).expect("send");
    pair.pump();
    let resp = response(&mut rf).expect("ready").expect("ok");
    let mut body = Vec::new();
    assert!(read_body(&mut resp.into_body(), &mut body, true));
    assert_eq!(body, b"finished");
    pair.pump();
    assert!(pair.server.is_closed());
    assert!(matches!(pair.events()[..], [Event::Closed { error: None }]));
    // The last GOAWAY names stream 1 as the last one processed.
    let last = parse_frames(&pair.s2c).into_iter().rfind(|f| f.kind == GOAWAY).expect("GOAWAY");
    assert_eq!(u32::from_be_bytes([last.payload[0], last.payload[1], last.payload[2], last.payload[3]]), 1);
}

#[test]
fn a_garbage_preface_closes_the_connection() {
    let mut raw = Raw::new(H2Settings::default());
    raw.send(b"GET / HTTP/1.1\r\nHost: example.test\r\n\r\n");
    let error = raw.closed().expect("closed").as_ref().expect("with an error");
    assert!(matches!(error, H2Error::Codec { .. }), "{error:?}");
    assert!(raw.server.is_closed());
    assert!(raw.out.len() < 256, "only our SETTINGS (and a GOAWAY): {}", raw.out.len());
    // Later bytes are ignored.
    raw.send(&[0; 1024]);
    assert_eq!(raw.events.len(), 1);
}

#[test]
fn a_truncated_frame_waits_then_ends_at_eof() {
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    let headers = get_root(1);
    bytes.extend_from_slice(&headers[..7]);
    raw.send(&bytes);
    assert!(raw.events.is_empty(), "half a frame header waits for the rest");
    raw.server.feed_eof();
    raw.step();
    assert!(raw.closed().is_some(), "EOF mid-frame ends the connection: {:?}", raw.events);
    assert!(raw.server.is_closed());

    // A frame header announcing more than the peer's max frame size.
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    bytes.extend_from_slice(&[0x01, 0x00, 0x00, HEADERS, 0x4, 0, 0, 0, 1]);
    raw.send(&bytes);
    let error = raw.closed().expect("closed").as_ref().expect("an error");
    assert!(matches!(error, H2Error::Codec { reason: Some(Reason::FRAME_SIZE_ERROR), .. }), "{error:?}");
    let goaway = parse_frames(&raw.out).into_iter().find(|f| f.kind == GOAWAY).expect("GOAWAY");
    assert_eq!(error_code(&goaway), u32::from(Reason::FRAME_SIZE_ERROR));
}

#[test]
fn a_rapid_reset_flood_ends_with_enhance_your_calm() {
    let mut raw = Raw::new(H2Settings::default());
    raw.send(&raw_opening());
    let mut flood = Vec::new();
    for i in 0..5000u32 {
        let id = 1 + 2 * i;
        flood.extend(get_root(id));
        flood.extend(frame(RST_STREAM, 0, id, &u32::from(Reason::CANCEL).to_be_bytes()));
    }
    for chunk in flood.chunks(16 * 1024) {
        raw.send(chunk);
        if raw.server.is_closed() {
            break;
        }
    }
    let error = raw.closed().expect("closed").as_ref().expect("an error");
    assert!(matches!(error, H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), .. }), "{error:?}");
    let goaway = parse_frames(&raw.out).into_iter().find(|f| f.kind == GOAWAY).expect("GOAWAY");
    assert_eq!(error_code(&goaway), u32::from(Reason::ENHANCE_YOUR_CALM));
    assert!(raw.max_output < 4096, "the output stayed small: {}", raw.max_output);
    assert!(raw.out.len() < 4096);
    assert!(raw.server.input_len() < 16 * 1024);
}

#[test]
fn a_slow_rapid_reset_cycle_is_bounded_per_batch_only() {
    // One HEADERS + RST_STREAM pair per read: each stream is accepted before
    // its reset arrives, so h2's pending-accept counter never fills. The
    // connection survives; what bounds it is the caller (one Request and one
    // Reset event per pair, no stream kept).
    let mut raw = Raw::new(H2Settings::default());
    raw.send(&raw_opening());
    let (mut requests, mut resets) = (0, 0);
    for i in 0..2000u32 {
        let id = 1 + 2 * i;
        raw.send(&get_root(id));
        raw.send(&frame(RST_STREAM, 0, id, &u32::from(Reason::CANCEL).to_be_bytes()));
        assert!(raw.server.open_streams() <= 1);
        requests += raw.events.iter().filter(|e| matches!(e, Event::Request { .. })).count();
        resets += raw.events.iter().filter(|e| matches!(e, Event::Reset { reason: Reason::CANCEL, .. })).count();
        raw.events.retain(|e| matches!(e, Event::Closed { .. }));
    }
    assert_eq!((requests, resets), (2000, 2000));
    assert!(raw.closed().is_none(), "h2 alone does not stop this pattern");
    assert!(raw.max_output < 4096, "no output piles up: {}", raw.max_output);
}

#[test]
fn a_small_data_frame_flood_is_cut_off() {
    // Empty DATA frames cost the server work and no window: h2 limits them.
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    bytes.extend(frame(HEADERS, 0x4, 1, &[0x83, 0x87, 0x84]));
    raw.send(&bytes);
    for _ in 0..100 {
        let mut flood = Vec::new();
        for _ in 0..100 {
            flood.extend(frame(DATA, 0, 1, &[]));
        }
        raw.send(&flood);
        if raw.server.is_closed() {
            break;
        }
    }
    let error = raw.closed().expect("closed").as_ref().expect("an error");
    assert!(matches!(error, H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), .. }), "{error:?}");
    assert!(raw.out.len() < 4096);
}

#[test]
fn writes_pause_at_the_output_watermark() {
    let settings = H2Settings { output_high_watermark: 4096, ..H2Settings::default() };
    let mut pair = Pair::with(settings, client::Builder::new());
    let (mut rf, _) = pair.request(get("/a"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.respond(stream, 200, &[] as &[(&str, &str)], false).expect("respond");
    let n = pair.server.writable(stream);
    assert!(n > 4096, "the window allows more than the watermark: {n}");
    pair.server.send_data(stream, Bytes::from(vec![7; n]), false).expect("send");
    // Not drained: h2 fills the output to the watermark and stops there.
    for _ in 0..5 {
        pair.server.advance(&mut pair.events);
    }
    assert_eq!(pair.server.output_len(), 4096);
    assert_eq!(pair.server.writable(stream), 0, "nothing more while the output is full");
    // Draining lets it go on, and the blocked stream hears of it.
    let mut writable = false;
    let mut body = Vec::new();
    let mut recv = None;
    for _ in 0..100 {
        pair.pump();
        writable |= pair.events().iter().any(|e| matches!(e, Event::Writable { stream: s } if *s == stream));
        if recv.is_none() {
            recv = response(&mut rf).map(|r| r.expect("ok").into_body());
        }
        if let Some(recv) = &mut recv {
            read_body(recv, &mut body, true);
        }
        if writable && body.len() == n {
            break;
        }
    }
    assert!(writable);
    assert_eq!(body.len(), n);
}

#[test]
fn reset_by_the_peer_is_reported() {
    let mut pair = Pair::new();
    let (_rf, mut up) = pair.request(Request::post("https://example.test/x").body(()).expect("req"), false);
    pair.pump();
    let (stream, _) = pair.only_request();
    up.send_reset(h2::Reason::CANCEL);
    pair.pump();
    let events = pair.events();
    assert!(matches!(events[..], [Event::Reset { stream: s, reason: Reason::CANCEL }] if s == stream), "{events:?}");
    assert_eq!(pair.server.open_streams(), 0);
    assert!(matches!(pair.server.respond(stream, 200, &[] as &[(&str, &str)], true), Err(H2Error::UnknownStream(_))));

    // Our own reset reaches the client.
    let (mut rf, _) = pair.request(get("/y"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.reset(stream, Reason::INTERNAL_ERROR).expect("reset");
    pair.pump();
    let err = response(&mut rf).expect("ready").expect_err("reset");
    assert_eq!(err.reason(), Some(h2::Reason::INTERNAL_ERROR));
}

#[test]
fn a_response_that_ends_before_the_request_body_resets_it_with_no_error() {
    let mut pair = Pair::new();
    let req = Request::post("https://example.test/upload").body(()).expect("request");
    let (mut rf, mut up) = pair.request(req, false);
    up.send_data(Bytes::from_static(b"first bytes"), false).expect("client data");
    pair.pump();
    let events = pair.events();
    let Some(Event::Request { stream, .. }) = events.first() else { panic!("{events:?}") };
    pair.server.respond(*stream, 413, &[("content-length", "0")], true).expect("respond");
    assert_eq!(pair.server.open_streams(), 0, "the body is no longer wanted");
    pair.pump();
    assert_eq!(response(&mut rf).expect("ready").expect("ok").status(), 413);
    let frames = parse_frames(&pair.s2c);
    let on_1: Vec<_> = frames.iter().filter(|f| f.stream == 1).map(|f| (f.kind, error_code_or_0(f))).collect();
    assert_eq!(on_1, [(HEADERS, 0), (RST_STREAM, u32::from(Reason::NO_ERROR))]);
    // More body bytes from the client are dropped quietly.
    let _ = up.send_data(Bytes::from_static(b"more"), true);
    pair.pump();
    assert!(pair.events().is_empty());
    assert!(!pair.server.is_closed());
}

#[test]
fn a_client_cancelling_a_get_before_the_response_is_reported() {
    let mut pair = Pair::new();
    let (rf, up) = pair.request(get("/slow"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    drop((rf, up));
    pair.pump();
    let events = pair.events();
    assert!(matches!(events[..], [Event::Reset { stream: s, reason: Reason::CANCEL }] if s == stream), "{events:?}");
    assert_eq!(pair.server.open_streams(), 0);
}

#[test]
fn the_peer_closing_ends_the_connection_cleanly() {
    // EOF with nothing open.
    let mut pair = Pair::new();
    pair.server.feed_eof();
    pair.pump();
    assert!(matches!(pair.events()[..], [Event::Closed { error: None }]));
    // Later input is dropped.
    pair.server.feed(&[0; 64]);
    assert_eq!(pair.server.input_len(), 0);

    // The client's GOAWAY, then EOF, with a stream still open.
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    bytes.extend(get_root(1));
    bytes.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]));
    raw.send(&bytes);
    assert!(raw.events.len() == 1 && matches!(raw.events[0], Event::Request { .. }), "{:?}", raw.events);
    raw.server.respond(StreamId(1), 200, &[] as &[(&str, &str)], true).expect("respond");
    raw.step();
    raw.server.feed_eof();
    raw.step();
    assert!(matches!(raw.closed(), Some(None)), "{:?}", raw.events);
    let frames = parse_frames(&raw.out);
    assert!(frames.iter().any(|f| f.kind == HEADERS && f.stream == 1), "the response went out");
}

#[test]
fn a_quiet_connection_ends_with_one_final_goaway_and_ignores_later_streams() {
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    bytes.extend(get_root(1));
    raw.send(&bytes);
    assert!(!raw.server.is_quiet(), "a stream is open");
    raw.server.respond(StreamId(1), 200, &[] as &[(&str, &str)], true).expect("respond");
    raw.step();
    assert!(raw.server.is_quiet(), "its answer went out");
    let before = parse_frames(&raw.out).len();
    raw.server.abort(Reason::NO_ERROR);
    // A request racing the GOAWAY: never processed.
    raw.send(&get_root(3));
    raw.step();
    assert!(matches!(raw.closed(), Some(None)), "{:?}", raw.events);
    assert_eq!(raw.events.iter().filter(|e| matches!(e, Event::Request { .. })).count(), 1, "{:?}", raw.events);
    // After the answer, exactly one frame: GOAWAY(last stream 1, NO_ERROR), no PING.
    let frames = parse_frames(&raw.out);
    let after: Vec<_> = frames[before..].iter().map(|f| (f.kind, f.payload.clone())).collect();
    assert_eq!(after, [(GOAWAY, vec![0, 0, 0, 1, 0, 0, 0, 0])]);
}

#[test]
fn graceful_shutdown_without_the_pings_answer() {
    // h2 follows its first GOAWAY with a PING, and sends the final GOAWAY
    // on the PONG. A client that never answers: show where that leaves us.
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    bytes.extend(get_root(1));
    raw.send(&bytes);
    raw.server.graceful_shutdown();
    raw.step();
    raw.server.respond(StreamId(1), 200, &[] as &[(&str, &str)], true).expect("respond");
    raw.step();
    let kinds: Vec<_> = parse_frames(&raw.out).iter().map(|f| (f.kind, f.stream)).collect();
    // SETTINGS, SETTINGS ACK, the connection window's WINDOW_UPDATE, GOAWAY,
    // PING, the response: then nothing.
    assert_eq!(kinds, [(SETTINGS, 0), (SETTINGS, 0), (WINDOW_UPDATE, 0), (GOAWAY, 0), (PING, 0), (HEADERS, 1)]);
    assert!(!raw.server.is_closed(), "the connection waits for the PONG");
    // So the caller's shutdown deadline ends it.
    raw.server.abort(Reason::NO_ERROR);
    raw.step();
    assert!(raw.server.is_closed());
    assert!(matches!(raw.closed(), Some(None)), "{:?}", raw.events);
    let last = parse_frames(&raw.out).into_iter().last().expect("a frame");
    assert_eq!((last.kind, error_code(&last)), (GOAWAY, 0));
}

#[test]
fn a_continuation_flood_ends_the_connection() {
    // HEADERS without END_HEADERS, then an endless run of tiny
    // CONTINUATION frames: h2 (>= 0.4.4) caps their number from
    // MAX_HEADER_LIST_SIZE and the frame size, and ends the connection.
    let mut raw = Raw::new(H2Settings::default());
    let mut bytes = raw_opening();
    bytes.extend(frame(HEADERS, 0x1, 1, &GET_ROOT));
    raw.send(&bytes);
    let mut sent = 0;
    for _ in 0..200 {
        let mut flood = Vec::new();
        for _ in 0..100 {
            flood.extend(frame(CONTINUATION, 0, 1, &[]));
        }
        sent += 100;
        raw.send(&flood);
        if raw.server.is_closed() {
            break;
        }
    }
    let error = raw.closed().expect("closed").as_ref().expect("an error");
    assert!(matches!(error, H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), .. }), "{error:?}");
    assert_eq!(sent, 100, "cut off within the first hundred frames");
    let goaway = parse_frames(&raw.out).into_iter().find(|f| f.kind == GOAWAY).expect("GOAWAY");
    assert_eq!(error_code(&goaway), u32::from(Reason::ENHANCE_YOUR_CALM));
    assert!(raw.events.iter().all(|e| !matches!(e, Event::Request { .. })));
}

#[test]
fn a_flood_of_malformed_requests_ends_with_enhance_your_calm() {
    // Each HEADERS lacks :scheme and :path: h2 resets each stream with
    // PROTOCOL_ERROR, and past `max_local_error_reset_streams` ends the
    // connection.
    let settings = H2Settings { max_local_error_reset_streams: 100, ..H2Settings::default() };
    let mut raw = Raw::new(settings);
    raw.send(&raw_opening());
    let mut resets = 0;
    for i in 0..1000u32 {
        raw.send(&frame(HEADERS, 0x5, 1 + 2 * i, &[0x82]));
        if raw.server.is_closed() {
            break;
        }
    }
    for f in parse_frames(&raw.out) {
        if f.kind == RST_STREAM {
            assert_eq!(error_code(&f), u32::from(Reason::PROTOCOL_ERROR));
            resets += 1;
        }
    }
    let error = raw.closed().expect("closed").as_ref().expect("an error");
    assert!(matches!(error, H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), .. }), "{error:?}");
    assert!((100..=101).contains(&resets), "{resets} resets");
    assert!(raw.events.iter().all(|e| !matches!(e, Event::Request { .. })));
}

#[test]
fn a_client_dropping_a_download_midway_is_reported() {
    let mut pair = Pair::new();
    let (mut rf, _) = pair.request(get("/download"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.respond(stream, 200, &[] as &[(&str, &str)], false).expect("respond");
    let n = pair.server.writable(stream).min(1000);
    pair.server.send_data(stream, Bytes::from(vec![1; n]), false).expect("send");
    pair.pump();
    let resp = response(&mut rf).expect("ready").expect("ok");
    drop((rf, resp));
    pair.pump();
    let events = pair.events();
    assert!(matches!(events[..], [Event::Reset { stream: s, reason: Reason::CANCEL }] if s == stream), "{events:?}");
    assert_eq!(pair.server.writable(stream), 0);
    assert!(matches!(pair.server.send_data(stream, Bytes::new(), true), Err(H2Error::UnknownStream(_))));
}

#[test]
fn unreleased_body_bytes_come_back_when_the_stream_is_done() {
    // Two 60,000-byte uploads, one after the other, neither released by the
    // caller: the connection window (65,535) only fits both if finishing
    // the first stream gives its bytes back.
    let mut pair = Pair::new();
    for round in 0..2 {
        let req = Request::post("https://example.test/up").body(()).expect("request");
        let (mut rf, mut up) = pair.request(req, false);
        up.reserve_capacity(60_000);
        let mut sent = 0;
        let mut received = 0;
        let mut stream = None;
        let mut ended = false;
        for _ in 0..100 {
            let n = up.capacity().min(60_000 - sent);
            if n > 0 {
                up.send_data(Bytes::from(vec![round; n]), sent + n == 60_000).expect("client send");
                sent += n;
            }
            pair.pump();
            for e in pair.events() {
                match e {
                    Event::Request { stream: s, .. } => stream = Some(s),
                    Event::Data { bytes, end, .. } => {
                        received += bytes.len();
                        ended |= end;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            if ended {
                break;
            }
        }
        assert!(ended, "round {round}: {received} of 60000 bytes arrived");
        assert_eq!(received, 60_000);
        let stream = stream.expect("a request");
        pair.server.respond(stream, 201, &[] as &[(&str, &str)], true).expect("respond");
        pair.pump();
        assert_eq!(response(&mut rf).expect("ready").expect("ok").status(), 201);
    }
}

#[test]
fn abort_before_the_preface_reports_closed() {
    let mut raw = Raw::new(H2Settings::default());
    raw.step();
    raw.server.abort(Reason::NO_ERROR);
    assert!(!raw.server.is_closed(), "reported on the next advance");
    raw.step();
    assert!(raw.events.len() == 1 && matches!(raw.events[0], Event::Closed { error: None }));
    raw.step();
    assert_eq!(raw.events.len(), 1, "reported once");
}

#[test]
fn one_stream_holding_its_window_leaves_the_connection_room_for_others() {
    let mut pair = Pair::new();
    let post = || Request::post("https://example.test/up").body(()).expect("request");
    let (_rf1, mut up1) = pair.request(post(), false);
    up1.send_data(Bytes::from(vec![1u8; 65_535]), false).expect("send");
    pair.pump();
    let (_rf2, mut up2) = pair.request(post(), false);
    up2.send_data(Bytes::from(vec![2u8; 65_535]), true).expect("send");
    // Stream 1's bytes are never released; stream 3's are, as they come.
    let (mut got1, mut got3, mut ended3) = (0, 0, false);
    for _ in 0..50 {
        pair.pump();
        for e in pair.events() {
            if let Event::Data { stream, bytes, end } = e {
                if stream == StreamId(1) {
                    got1 += bytes.len();
                } else {
                    got3 += bytes.len();
                    ended3 |= end;
                    pair.server.release(stream, bytes.len()).expect("release");
                }
            }
        }
    }
    assert_eq!(got1, 65_535, "stream 1's whole window arrived");
    assert!(ended3 && got3 == 65_535, "stream 3 got {got3} bytes past stream 1's held window");
}

#[test]
fn unreserve_hands_the_connection_window_to_the_stream_that_waits() {
    let mut pair = Pair::new();
    let (_rf1, _) = pair.request(get("/a"), true);
    let (_rf2, _) = pair.request(get("/b"), true);
    pair.pump();
    let streams: Vec<StreamId> = pair
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Request { stream, .. } => Some(stream),
            _ => None,
        })
        .collect();
    let [a, b] = streams[..] else { panic!("two requests expected: {streams:?}") };
    for s in [a, b] {
        pair.server.respond(s, 200, &[("content-type", "text/plain")], false).expect("respond");
    }
    // A asked first and holds the whole connection window; B waits behind it.
    assert_eq!(pair.server.writable(a), 65_535);
    assert_eq!(pair.server.writable(b), 0);
    // A gives it back unused: it goes to B.
    pair.server.unreserve(a);
    assert_eq!(pair.server.writable(b), 65_535);
    assert_eq!(pair.server.writable(a), 0);
}

/// The GOAWAY among `out`'s frames, if any, with its error code.
fn goaway_code(out: &[u8]) -> Option<u32> {
    parse_frames(out).into_iter().find(|f| f.kind == GOAWAY).map(|f| error_code(&f))
}

#[test]
fn a_ping_flood_ends_with_enhance_your_calm() {
    let mut raw = Raw::new(H2Settings::default());
    raw.send(&raw_opening());
    let ping = frame(PING, 0, 0, b"floodpng");
    let mut pings = 0;
    while !raw.server.is_closed() && pings < 100_000 {
        raw.send(&ping.repeat(500));
        pings += 500;
    }
    assert!(pings <= 12_000, "cut within the burst allowance: {pings} PINGs sent");
    let error = raw.closed().expect("closed").as_ref().expect("an error");
    assert!(matches!(error, H2Error::Codec { reason: Some(Reason::ENHANCE_YOUR_CALM), .. }), "{error:?}");
    assert_eq!(goaway_code(&raw.out), Some(u32::from(Reason::ENHANCE_YOUR_CALM)));
}

#[test]
fn floods_of_each_control_frame_type_end_with_enhance_your_calm() {
    let window_update = frame(WINDOW_UPDATE, 0, 0, &1u32.to_be_bytes());
    let priority = frame(0x2, 0, 1, &[0, 0, 0, 0, 15]);
    let unknown = frame(0xfa, 0, 0, b"what");
    let settings = frame(SETTINGS, 0, 0, &[]);
    for (what, f) in
        [("WINDOW_UPDATE", window_update), ("PRIORITY", priority), ("unknown", unknown), ("SETTINGS", settings)]
    {
        let mut raw = Raw::new(H2Settings::default());
        let mut opening = raw_opening();
        // An open stream: a POST whose body never ends.
        opening.extend(frame(HEADERS, 0x4, 1, &[0x83, 0x86, 0x84]));
        raw.send(&opening);
        let mut sent = 0;
        while !raw.server.is_closed() && sent < 100_000 {
            raw.send(&f.repeat(500));
            sent += 500;
        }
        assert!(sent <= 12_000, "{what}: cut within the burst allowance: {sent} frames sent");
        assert_eq!(goaway_code(&raw.out), Some(u32::from(Reason::ENHANCE_YOUR_CALM)), "{what}");
    }
}

#[test]
fn settings_toggling_the_window_of_128_streams_end_with_enhance_your_calm_early() {
    let mut raw = Raw::new(H2Settings::default());
    raw.send(&raw_opening());
    let mut heads = Vec::new();
    for i in 0..128 {
        heads.extend(get_root(1 + 2 * i));
    }
    raw.send(&heads);
    assert_eq!(raw.server.open_streams(), 128);
    let toggle = |size: u32| {
        let mut p = 4u16.to_be_bytes().to_vec();
        p.extend_from_slice(&size.to_be_bytes());
        frame(SETTINGS, 0, 0, &p)
    };
    let mut toggles = 0;
    while !raw.server.is_closed() && toggles < 10_000 {
        raw.send(&toggle(1 + 65_534 * (toggles % 2)));
        toggles += 1;
    }
    // Each one makes h2 revisit 128 streams: it counts as 129 control frames.
    assert!(toggles <= 100, "cut after {toggles} toggles");
    assert_eq!(goaway_code(&raw.out), Some(u32::from(Reason::ENHANCE_YOUR_CALM)));
}

#[test]
fn a_turn_reads_its_frames_and_leaves_the_rest_for_the_next() {
    let settings = H2Settings { frames_per_turn: 100, ..H2Settings::default() };
    let mut raw = Raw::new(settings);
    raw.send(&raw_opening());
    raw.out.clear();
    raw.server.feed(&frame(PING, 0, 0, b"turnturn").repeat(250));
    raw.step();
    let acks = |raw: &Raw| parse_frames(&raw.out).iter().filter(|f| f.kind == PING).count();
    assert_eq!(acks(&raw), 100, "one turn's frames");
    assert!(raw.server.throttled() && raw.server.input_len() > 0);
    raw.step();
    raw.step();
    assert_eq!(acks(&raw), 250);
    assert!(!raw.server.throttled());
}

#[test]
fn a_download_through_a_tiny_window_is_not_a_flood_of_window_updates() {
    // 256-byte stream windows: the client answers nearly every DATA frame
    // with a WINDOW_UPDATE, far more of them than the burst allowance.
    let mut builder = client::Builder::new();
    builder.initial_window_size(256);
    let mut pair = Pair::with(H2Settings::default(), builder);
    let (mut rf, _) = pair.request(get("/big"), true);
    pair.pump();
    let (stream, _) = pair.only_request();
    pair.server.respond(stream, 200, &[] as &[(&str, &str)], false).expect("respond");
    let total = 4 << 20;
    let (mut sent, mut body, mut recv) = (0, Vec::new(), None);
    for _ in 0..100_000 {
        if sent < total {
            let n = pair.server.writable(stream).min(total - sent);
            if n > 0 {
                sent += n;
                pair.server.send_data(stream, Bytes::from(vec![9; n]), sent == total).expect("send");
            }
        }
        pair.pump();
        if recv.is_none() {
            recv = response(&mut rf).map(|r| r.expect("ok").into_body());
        }
        if let Some(recv) = &mut recv {
            if read_body(recv, &mut body, true) {
                break;
            }
        }
    }
    assert_eq!(body.len(), total);
    // Each DATA frame (at most 256 bytes) was answered by a WINDOW_UPDATE.
    let data = parse_frames(&pair.s2c).iter().filter(|f| f.kind == DATA).count();
    assert!(data > 12_000, "{data} DATA frames");
    assert!(pair.server.open_streams() == 0 && !pair.server.is_closed(), "still open after {data} DATA frames");
}

/// The first response's `x-request-id` enters the client's HPACK table and later ones name
/// that entry; fillers evict it and the next id enters again. The h2 crate's decoder reads
/// every id as sent, so the encoder's table stays in step with a real peer's.
#[test]
fn request_ids_by_table_entry_decode_in_a_real_client() {
    let mut pair = Pair::new();
    let fill = "f".repeat(980);
    for i in 0..10 {
        let (mut rf, _) = pair.request(get("/"), true);
        pair.pump();
        let (stream, _) = pair.only_request();
        let id = format!("0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b{i:04}");
        let name = format!("x-fill-{i}");
        let mut fields = vec![("x-request-id", id.as_str())];
        if i % 2 == 1 {
            fields.push((name.as_str(), fill.as_str()));
        }
        pair.server.respond(stream, 200, &fields, true).expect("respond");
        pair.pump();
        let resp = response(&mut rf).expect("ready").expect("ok");
        assert_eq!(resp.headers()["x-request-id"], id.as_str(), "response {i}");
        if i % 2 == 1 {
            assert_eq!(resp.headers()[name.as_str()], fill.as_str(), "response {i}");
        }
    }
    let blocks: Vec<Vec<u8>> =
        parse_frames(&pair.s2c).into_iter().filter(|f| f.kind == HEADERS).map(|f| f.payload).collect();
    let openings: Vec<&[u8]> = blocks.iter().map(|b| &b[..2]).collect();
    // :status 200, then the id: inserted; by index; the fourth filler (response 7) evicted
    // it, so response 8 inserts it again.
    let inserted: &[u8] = &[0x88, 0x40];
    let indexed: &[u8] = &[0x88, 0x0f];
    let want = [inserted, indexed, indexed, indexed, indexed, indexed, indexed, indexed, inserted, indexed];
    assert_eq!(openings, want, "{openings:02x?}");
}
