//! The state machine driven from byte slices: a client's frames in, events and the
//! server's frames out.

use super::*;
use crate::http2::hpack::{Decoder, Encoder};
use crate::http2::wire::flag::{END_HEADERS, END_STREAM, PADDED};
use crate::http2::wire::kind::{
    CONTINUATION, DATA, GOAWAY, HEADERS, PING, PRIORITY, RST_STREAM, SETTINGS, WINDOW_UPDATE,
};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

fn u32_payload(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// A header block for a request, from a client-side encoder.
fn block(enc: &mut Encoder, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    enc.encode(&mut out, None, fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    out
}

const GET: [(&str, &str); 4] = [(":method", "GET"), (":scheme", "https"), (":authority", "a.test"), (":path", "/")];
const POST: [(&str, &str); 4] = [(":method", "POST"), (":scheme", "https"), (":authority", "a.test"), (":path", "/up")];

/// One server frame read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Out {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Out {
    fn code(&self) -> u32 {
        let at = if self.kind == GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().expect("a code"))
    }
}

/// A client talking to one [`Machine`].
struct Client {
    m: Machine,
    enc: Encoder,
    /// Server bytes not yet read back.
    out: Vec<u8>,
    /// Events, as text.
    events: Vec<String>,
    error: Option<ConnError>,
}

impl Client {
    fn with(limits: Limits) -> Client {
        let mut m = Machine::new(limits);
        let mut out = Vec::new();
        m.start(&mut out);
        let mut c = Client { m, enc: Encoder::new(4096), out, events: Vec::new(), error: None };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        c.send(&hello);
        let frames: Vec<_> = c.frames().iter().map(|f| (f.kind, f.flags)).collect();
        let raised = c.m.limits.connection_window_size > DEFAULT_WINDOW;
        let want: &[(u8, u8)] =
            if raised { &[(SETTINGS, 0), (SETTINGS, 1), (WINDOW_UPDATE, 0)] } else { &[(SETTINGS, 0), (SETTINGS, 1)] };
        assert_eq!(frames, want);
        c
    }

    fn new() -> Client {
        Client::with(Limits::default())
    }

    /// Feeds `bytes`, all of which must be consumed.
    fn send(&mut self, bytes: &[u8]) {
        let events = &mut self.events;
        let used = self.m.recv(bytes, &mut self.out, &mut |e| events.push(text(&e)));
        match used {
            Ok(n) => assert_eq!(n, bytes.len(), "all consumed"),
            Err(e) => self.error = Some(e),
        }
    }

    fn request(&mut self, stream: u32, fields: &[(&str, &str)], end: bool) {
        let b = block(&mut self.enc, fields);
        self.send(&frame(HEADERS, END_HEADERS | if end { END_STREAM } else { 0 }, stream, &b));
    }

    fn take_events(&mut self) -> Vec<String> {
        std::mem::take(&mut self.events)
    }

    /// The server's frames since the last call.
    fn frames(&mut self) -> Vec<Out> {
        let mut rest = &self.out[..];
        let mut frames = Vec::new();
        while rest.len() >= 9 {
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let stream = u32::from_be_bytes(rest[5..9].try_into().expect("4 bytes"));
            frames.push(Out { kind: rest[3], flags: rest[4], stream, payload: rest[9..9 + len].to_vec() });
            rest = &rest[9 + len..];
        }
        self.out.clear();
        frames
    }

    fn goaway(&mut self) -> Option<u32> {
        self.frames().iter().find(|f| f.kind == GOAWAY).map(Out::code)
    }
}

fn text(e: &Event<'_>) -> String {
    match e {
        Event::Request { stream, head, end_stream } => format!(
            "request {stream} {} {}{}",
            String::from_utf8_lossy(head.method().unwrap_or_default()),
            String::from_utf8_lossy(head.path().unwrap_or_default()),
            if *end_stream { " end" } else { "" }
        ),
        Event::Data { stream, data, end } => {
            format!("data {stream} {}{}", String::from_utf8_lossy(data), if *end { " end" } else { "" })
        }
        Event::Reset { stream, reason } => format!("reset {stream} {}", reason.0),
        Event::Window { stream } => format!("window {stream}"),
        Event::GoAway { reason } => format!("goaway {}", reason.0),
    }
}

fn decode(dec: &mut Decoder, block: &[u8]) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    dec.decode(block, 1 << 20, |n, v| {
        fields.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
    })
    .expect("a valid block");
    fields
}

/// Fields (name, value, sensitive) as the parts of a head.
fn parts<'a>(list: &'a [(&'a [u8], &'a [u8], bool)]) -> impl Iterator<Item = Part<'a>> {
    list.iter().map(|&(n, v, s)| Part::Field(n, v, s))
}

fn strs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
}

#[test]
fn our_settings_say_what_was_configured() {
    let limits = Limits { max_frame_size: 32_768, ..Limits::default() };
    let mut m = Machine::new(limits);
    let mut out = Vec::new();
    m.start(&mut out);
    let Some((Frame::Settings(s), n)) = wire::parse(&out, MIN_MAX_FRAME).expect("ok") else { panic!("SETTINGS first") };
    assert_eq!(s.iter().collect::<Vec<_>>(), [(3, 128), (4, 65_535), (6, 32_768), (8, 1), (5, 32_768)]);
    assert_eq!(n, out.len(), "nothing else before the peer's preface");
    out.clear();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    assert_eq!(m.recv(&hello, &mut out, &mut |_| {}), Ok(hello.len()));
    let (ack, n) = wire::parse(&out, MIN_MAX_FRAME).expect("ok").expect("a frame");
    assert_eq!(ack, Frame::SettingsAck);
    let update = wire::parse(&out[n..], MIN_MAX_FRAME).expect("ok").map(|f| f.0);
    assert_eq!(update, Some(Frame::WindowUpdate { stream: 0, increment: 15 * 65_535 }));
}

#[test]
fn a_get_is_answered_with_an_indexed_head() {
    let mut c = Client::new();
    c.request(1, &GET, true);
    assert_eq!(c.take_events(), ["request 1 GET / end"]);
    let head: [(&[u8], &[u8], bool); 2] =
        [(b"content-type", b"application/json", false), (b"x-request-id", b"abc", true)];
    c.m.respond(1, 200, parts(&head), false, &mut c.out).expect("respond");
    assert_eq!(c.m.writable(1), 65_535);
    c.m.send_data(1, b"{}", true, &mut c.out).expect("data");
    assert_eq!(c.m.open_streams(), 0, "both sides ended");
    let frames = c.frames();
    assert_eq!(
        frames.iter().map(|f| (f.kind, f.flags, f.stream)).collect::<Vec<_>>(),
        [(HEADERS, END_HEADERS, 1), (DATA, END_STREAM, 1)]
    );
    let mut dec = Decoder::new(4096);
    let first = frames[0].payload.len();
    let fields = decode(&mut dec, &frames[0].payload);
    assert_eq!(strs(&fields), [(":status", "200"), ("content-type", "application/json"), ("x-request-id", "abc")]);
    assert_eq!(frames[1].payload, b"{}");

    // The second response's content-type is one byte: the table has it.
    c.request(3, &GET, true);
    c.m.respond(3, 200, parts(&head), true, &mut c.out).expect("respond");
    let frames = c.frames();
    assert!(frames[0].payload.len() + 12 <= first, "{:?}", frames[0].payload);
    assert_eq!(strs(&decode(&mut dec, &frames[0].payload))[1], ("content-type", "application/json"));
}

#[test]
fn a_garbage_preface_ends_without_a_goaway() {
    let mut m = Machine::new(Limits::default());
    let mut out = Vec::new();
    assert_eq!(m.recv(b"PRI * HTTP/2", &mut out, &mut |_| {}), Ok(0), "a prefix waits");
    let err = m.recv(b"GET / HTTP/1.1\r\n\r\n", &mut out, &mut |_| {}).expect_err("not HTTP/2");
    assert_eq!(err.reason, Reason::PROTOCOL_ERROR);
    assert!(out.is_empty());
    assert!(m.is_closed());
}

#[test]
fn the_first_frame_must_be_settings() {
    let mut m = Machine::new(Limits::default());
    let mut out = Vec::new();
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(PING, 0, 0, &[0; 8]));
    let err = m.recv(&bytes, &mut out, &mut |_| {}).expect_err("PING first");
    assert_eq!(err.reason, Reason::PROTOCOL_ERROR);
    assert_eq!(
        wire::parse(&out, MIN_MAX_FRAME).expect("ok").map(|f| f.0),
        Some(Frame::GoAway { last_stream: 0, reason: Reason::PROTOCOL_ERROR, debug: b"" })
    );
}

#[test]
fn a_partial_frame_waits_for_the_rest() {
    let mut c = Client::new();
    let b = block(&mut c.enc, &GET);
    let bytes = frame(HEADERS, END_HEADERS | END_STREAM, 1, &b);
    let events = &mut c.events;
    assert_eq!(c.m.recv(&bytes[..5], &mut c.out, &mut |e| events.push(text(&e))), Ok(0));
    assert_eq!(c.m.recv(&bytes[..12], &mut c.out, &mut |e| events.push(text(&e))), Ok(0));
    assert!(c.events.is_empty());
    c.send(&bytes);
    assert_eq!(c.take_events(), ["request 1 GET / end"]);
}

#[test]
fn ping_is_answered_and_priority_ignored() {
    let mut c = Client::new();
    let mut bytes = frame(PING, 0, 0, b"12345678");
    bytes.extend(frame(PRIORITY, 0, 3, &[0, 0, 0, 1, 16]));
    bytes.extend(frame(PING, 1, 0, b"whatever"));
    c.send(&bytes);
    let frames = c.frames();
    assert_eq!(frames, [Out { kind: PING, flags: 1, stream: 0, payload: b"12345678".to_vec() }]);
    assert!(c.error.is_none());
}

#[test]
fn a_body_arrives_and_its_window_comes_back_on_release() {
    let mut c = Client::new();
    c.request(1, &POST, false);
    let mut padded = vec![10u8];
    padded.extend(b"hello");
    padded.extend([0u8; 10]);
    c.send(&frame(DATA, PADDED, 1, &padded));
    c.send(&frame(DATA, 0, 1, &[b'x'; 15_000]));
    c.send(&frame(DATA, 0, 1, &[b'x'; 15_000]));
    let events = c.take_events();
    assert_eq!(events[..2], ["request 1 POST /up".to_string(), "data 1 hello".to_string()]);
    assert!(c.frames().is_empty(), "under half a window owed: no WINDOW_UPDATE yet");
    c.m.release(1, 5, &mut c.out);
    c.m.release(1, 30_000, &mut c.out);
    let frames = c.frames();
    // Stream: 11 of padding + 30 005 released = 30 016 < 32 767; the connection's target is
    // larger still.
    assert!(frames.is_empty(), "{frames:?}");
    c.send(&frame(DATA, 0, 1, &[b'y'; 3000]));
    c.m.release(1, 3000, &mut c.out);
    let frames = c.frames();
    assert_eq!(frames.len(), 1);
    assert_eq!((frames[0].kind, frames[0].stream, frames[0].code()), (WINDOW_UPDATE, 1, 33_016));
    c.send(&frame(DATA, END_STREAM, 1, b""));
    assert_eq!(c.take_events().last().map(String::as_str), Some("data 1  end"));
    c.m.release(1, 1, &mut c.out);
    assert!(c.frames().is_empty(), "no stream WINDOW_UPDATE after the end");
}

#[test]
fn data_past_the_stream_window_resets_the_stream() {
    let mut c = Client::new();
    c.request(1, &POST, false);
    let chunk = [0u8; 16_384];
    for _ in 0..3 {
        c.send(&frame(DATA, 0, 1, &chunk));
    }
    c.send(&frame(DATA, 0, 1, &chunk[1..]));
    c.take_events();
    c.send(&frame(DATA, 0, 1, b"x"));
    assert_eq!(c.take_events(), [format!("reset 1 {}", Reason::FLOW_CONTROL_ERROR.0)]);
    let frames = c.frames();
    assert_eq!((frames[0].kind, frames[0].code()), (RST_STREAM, Reason::FLOW_CONTROL_ERROR.0));
    assert!(c.error.is_none(), "a stream error only");
    // Frames still in flight for it are ignored.
    c.send(&frame(DATA, END_STREAM, 1, b"late"));
    assert!(c.take_events().is_empty());
    assert!(c.frames().iter().all(|f| f.kind != RST_STREAM));
}

#[test]
fn data_past_the_connection_window_ends_the_connection() {
    let limits = Limits { connection_window_size: 65_535, initial_window_size: 1 << 20, ..Limits::default() };
    let mut c = Client::with(limits);
    c.request(1, &POST, false);
    for _ in 0..4 {
        c.send(&frame(DATA, 0, 1, &[0u8; 16_384]));
    }
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::FLOW_CONTROL_ERROR));
    assert_eq!(c.goaway(), Some(Reason::FLOW_CONTROL_ERROR.0));
}

#[test]
fn sending_follows_both_windows() {
    let mut c = Client::new();
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 100]));
    c.request(1, &GET, true);
    c.request(3, &GET, true);
    c.m.respond(1, 200, [], false, &mut c.out).expect("respond");
    c.m.respond(3, 200, [], false, &mut c.out).expect("respond");
    assert_eq!(c.m.writable(1), 100);
    assert_eq!(c.m.send_data(1, &[0; 101], false, &mut c.out), Err(SendError::Window));
    c.m.send_data(1, &[0; 100], false, &mut c.out).expect("within");
    assert_eq!(c.m.writable(1), 0);
    c.take_events();
    c.send(&frame(WINDOW_UPDATE, 0, 1, &u32_payload(70_000)));
    assert_eq!(c.take_events(), ["window 1"]);
    assert_eq!(c.m.writable(1), 65_435, "the connection's window binds now");
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 50]));
    assert_eq!(c.m.writable(3), 50, "a lower initial window shrinks open streams");
    // Past 2^31 - 1 on the connection is a connection error.
    c.send(&frame(WINDOW_UPDATE, 0, 0, &u32_payload(MAX_WINDOW)));
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::FLOW_CONTROL_ERROR));
}

#[test]
fn a_stream_window_overflow_resets_only_the_stream() {
    let mut c = Client::new();
    c.request(1, &GET, true);
    c.m.respond(1, 200, [], false, &mut c.out).expect("respond");
    c.frames();
    c.take_events();
    c.send(&frame(WINDOW_UPDATE, 0, 1, &u32_payload(MAX_WINDOW)));
    assert_eq!(c.take_events(), [format!("reset 1 {}", Reason::FLOW_CONTROL_ERROR.0)]);
    assert!(c.error.is_none());
    assert_eq!(c.m.send_data(1, b"x", true, &mut c.out), Err(SendError::UnknownStream));
}

#[test]
fn large_bodies_go_out_in_frames_the_peer_accepts() {
    let mut c = Client::new();
    c.send(&frame(WINDOW_UPDATE, 0, 0, &u32_payload(100_000)));
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]));
    c.request(1, &GET, true);
    c.m.respond(1, 200, [], false, &mut c.out).expect("respond");
    c.frames();
    c.m.send_data(1, &[7; 40_000], true, &mut c.out).expect("data");
    let sizes: Vec<_> = c.frames().iter().map(|f| (f.payload.len(), f.flags)).collect();
    assert_eq!(sizes, [(16_384, 0), (16_384, 0), (7_232, END_STREAM)]);
}

#[test]
fn the_stream_past_the_concurrency_limit_is_refused() {
    let limits = Limits { max_concurrent_streams: 2, ..Limits::default() };
    let mut c = Client::with(limits);
    for id in [1, 3, 5] {
        c.request(id, &GET, true);
    }
    assert_eq!(c.take_events(), ["request 1 GET / end", "request 3 GET / end"]);
    let frames = c.frames();
    assert_eq!((frames[0].kind, frames[0].stream, frames[0].code()), (RST_STREAM, 5, Reason::REFUSED_STREAM.0));
    c.m.respond(1, 204, [], true, &mut c.out).expect("respond");
    c.request(7, &GET, true);
    assert_eq!(c.take_events(), ["request 7 GET / end"]);
}

#[test]
fn continuations_are_joined() {
    let mut c = Client::new();
    let b = block(&mut c.enc, &GET);
    let (a, rest) = b.split_at(3);
    let mut bytes = frame(HEADERS, END_STREAM, 1, a);
    bytes.extend(frame(CONTINUATION, 0, 1, &rest[..1]));
    bytes.extend(frame(CONTINUATION, END_HEADERS, 1, &rest[1..]));
    c.send(&bytes);
    assert_eq!(c.take_events(), ["request 1 GET / end"]);
}

#[test]
fn a_frame_inside_a_header_block_is_a_protocol_error() {
    let mut c = Client::new();
    let b = block(&mut c.enc, &GET);
    let mut bytes = frame(HEADERS, END_STREAM, 1, &b[..2]);
    bytes.extend(frame(PING, 0, 0, &[0; 8]));
    c.send(&bytes);
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::PROTOCOL_ERROR));
    assert_eq!(c.goaway(), Some(Reason::PROTOCOL_ERROR.0));
}

/// CVE-2024-27316: endless empty CONTINUATIONs end the connection early.
#[test]
fn a_continuation_flood_ends_with_enhance_your_calm() {
    let mut c = Client::new();
    let b = block(&mut c.enc, &GET);
    c.send(&frame(HEADERS, END_STREAM, 1, &b));
    let mut sent = 0;
    while c.error.is_none() && sent < 10_000 {
        c.send(&frame(CONTINUATION, 0, 1, &[]));
        sent += 1;
    }
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::ENHANCE_YOUR_CALM));
    assert!(sent < 100, "{sent} frames");
    assert!(c.take_events().is_empty());
    assert_eq!(c.goaway(), Some(Reason::ENHANCE_YOUR_CALM.0));
}

#[test]
fn trailers_end_the_body_and_must_end_the_stream() {
    let mut c = Client::new();
    c.request(1, &POST, false);
    c.send(&frame(DATA, 0, 1, b"abc"));
    c.request(1, &[("x-checksum", "1")], true);
    assert_eq!(c.take_events(), ["request 1 POST /up", "data 1 abc", "data 1  end"]);
    c.request(3, &POST, false);
    c.request(3, &[("x-checksum", "1")], false);
    assert_eq!(c.take_events(), ["request 3 POST /up".to_string(), format!("reset 3 {}", Reason::PROTOCOL_ERROR.0)]);
}

#[test]
fn stream_state_errors() {
    // DATA after END_STREAM: STREAM_CLOSED on the stream.
    let mut c = Client::new();
    c.request(1, &GET, true);
    c.send(&frame(DATA, 0, 1, b"x"));
    assert_eq!(c.take_events(), ["request 1 GET / end".to_string(), format!("reset 1 {}", Reason::STREAM_CLOSED.0)]);
    assert!(c.error.is_none());

    // Frames on a stream never opened: a connection error.
    for bytes in
        [frame(DATA, 0, 9, b"x"), frame(WINDOW_UPDATE, 0, 9, &u32_payload(1)), frame(RST_STREAM, 0, 9, &[0; 4])]
    {
        let mut c = Client::new();
        c.send(&bytes);
        assert_eq!(c.error.map(|e| e.reason), Some(Reason::PROTOCOL_ERROR), "{bytes:?}");
    }

    // HEADERS on an even stream, or on a stream that finished long ago.
    let mut c = Client::new();
    c.request(2, &GET, true);
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::PROTOCOL_ERROR));
    let mut c = Client::new();
    c.request(1, &GET, true);
    c.m.respond(1, 204, [], true, &mut c.out).expect("respond");
    c.request(1, &GET, true);
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::STREAM_CLOSED));
}

#[test]
fn an_oversized_header_list_gets_a_bare_431() {
    let limits = Limits { max_header_list_size: 1024, ..Limits::default() };
    let mut c = Client::with(limits);
    let big = "a".repeat(2000);
    let fields = [GET.to_vec(), vec![("x-big", big.as_str())]].concat();
    c.request(1, &fields, true);
    assert!(c.take_events().is_empty());
    let frames = c.frames();
    assert_eq!(frames.iter().map(|f| (f.kind, f.flags)).collect::<Vec<_>>(), [(HEADERS, END_STREAM | END_HEADERS)]);
    let mut dec = Decoder::new(4096);
    assert_eq!(strs(&decode(&mut dec, &frames[0].payload)), [(":status", "431")]);

    let fields = [POST.to_vec(), vec![("x-big", big.as_str())]].concat();
    c.request(3, &fields, false);
    c.send(&frame(DATA, END_STREAM, 3, b"body"));
    let frames = c.frames();
    let on_3: Vec<_> = frames.iter().map(|f| (f.kind, f.stream)).collect();
    assert_eq!(on_3, [(HEADERS, 3), (RST_STREAM, 3)]);
    assert_eq!(frames[1].code(), Reason::PROTOCOL_ERROR.0);
    assert!(c.take_events().is_empty(), "the late body is ignored");
    c.request(5, &GET, true);
    assert_eq!(c.take_events(), ["request 5 GET / end"], "the connection survives");
}

#[test]
fn a_flood_of_malformed_requests_ends_with_enhance_your_calm() {
    let limits = Limits { max_local_error_resets: 100, ..Limits::default() };
    let mut c = Client::with(limits);
    let mut resets = 0;
    for i in 0..1000u32 {
        c.request(1 + 2 * i, &[(":method", "GET")], true);
        resets += c.frames().iter().filter(|f| f.kind == RST_STREAM && f.code() == Reason::PROTOCOL_ERROR.0).count();
        if c.error.is_some() {
            break;
        }
    }
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(resets, 101);
    assert!(c.take_events().is_empty());
}

/// CVE-2023-44487: many streams opened and reset in one read end the connection; one pair
/// per read does not (the caller bounds that).
#[test]
fn rapid_reset_in_one_read_ends_with_enhance_your_calm() {
    let mut c = Client::new();
    let mut flood = Vec::new();
    for i in 0..100u32 {
        let id = 1 + 2 * i;
        flood.extend(frame(HEADERS, END_HEADERS | END_STREAM, id, &block(&mut c.enc, &GET)));
        flood.extend(frame(RST_STREAM, 0, id, &u32_payload(Reason::CANCEL.0)));
    }
    c.send(&flood);
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(c.goaway(), Some(Reason::ENHANCE_YOUR_CALM.0));

    let mut c = Client::new();
    for i in 0..100u32 {
        let id = 1 + 2 * i;
        c.request(id, &GET, true);
        c.send(&frame(RST_STREAM, 0, id, &u32_payload(Reason::CANCEL.0)));
    }
    assert!(c.error.is_none());
    assert_eq!(c.m.open_streams(), 0);
    assert_eq!(c.take_events().len(), 200);
}

#[test]
fn a_run_of_empty_data_frames_is_cut_off() {
    let mut c = Client::new();
    c.request(1, &POST, false);
    for _ in 0..200 {
        c.send(&frame(DATA, 0, 1, &[]));
        if c.error.is_some() {
            break;
        }
    }
    assert_eq!(c.error.map(|e| e.reason), Some(Reason::ENHANCE_YOUR_CALM));
}

#[test]
fn a_response_ending_before_the_body_resets_it_and_returns_its_window() {
    let limits = Limits { connection_window_size: 65_535, ..Limits::default() };
    let mut c = Client::with(limits);
    c.request(1, &POST, false);
    c.send(&frame(DATA, 0, 1, &[0; 16_384]));
    c.send(&frame(DATA, 0, 1, &[0; 16_384]));
    c.frames();
    c.m.respond(1, 413, [], true, &mut c.out).expect("respond");
    let frames = c.frames();
    let seen: Vec<_> = frames.iter().map(|f| (f.kind, f.stream)).collect();
    assert_eq!(seen, [(HEADERS, 1), (RST_STREAM, 1), (WINDOW_UPDATE, 0)]);
    assert_eq!(frames[1].code(), Reason::NO_ERROR.0);
    assert_eq!(frames[2].code(), 32_768, "the unreleased bytes came back");
    c.m.release(1, 32_768, &mut c.out);
    assert!(c.frames().is_empty(), "a late release is ignored");
}

#[test]
fn graceful_shutdown_goes_in_two_steps() {
    let mut c = Client::new();
    c.request(1, &GET, true);
    c.m.graceful_shutdown(&mut c.out);
    let frames = c.frames();
    assert_eq!(frames.iter().map(|f| f.kind).collect::<Vec<_>>(), [GOAWAY, PING]);
    assert_eq!(u32::from_be_bytes(frames[0].payload[..4].try_into().expect("4")), MAX_WINDOW);
    c.request(3, &GET, true);
    c.send(&frame(PING, 1, 0, &frames[1].payload));
    let frames = c.frames();
    assert_eq!(frames.len(), 1);
    assert_eq!((frames[0].kind, u32::from_be_bytes(frames[0].payload[..4].try_into().expect("4"))), (GOAWAY, 3));
    c.request(5, &GET, true);
    assert_eq!(c.take_events(), ["request 1 GET / end", "request 3 GET / end"], "5 is past the last stream");
    assert!(!c.m.is_drained());
    c.m.respond(1, 204, [], true, &mut c.out).expect("respond");
    c.m.respond(3, 204, [], true, &mut c.out).expect("respond");
    assert!(c.m.is_drained());
}

#[test]
fn abort_writes_one_goaway_and_ignores_the_rest() {
    let mut c = Client::new();
    c.request(1, &GET, true);
    c.m.abort(Reason::NO_ERROR, &mut c.out);
    c.request(3, &GET, true);
    assert_eq!(c.take_events(), ["request 1 GET / end"]);
    let frames = c.frames();
    assert_eq!(frames.len(), 1);
    assert_eq!((frames[0].kind, frames[0].code()), (GOAWAY, 0));
    assert!(c.m.is_closed());
    assert_eq!(c.m.respond(1, 200, [], true, &mut c.out), Err(SendError::UnknownStream));
}

#[test]
fn interim_responses_precede_the_final_one() {
    let mut c = Client::new();
    c.request(1, &GET, true);
    let link: [(&[u8], &[u8], bool); 1] = [(b"link", b"</a.css>; rel=preload", false)];
    c.m.respond(1, 103, parts(&link), false, &mut c.out).expect("103");
    assert_eq!(
        c.m.respond(1, 100, [], true, &mut c.out),
        Err(SendError::State("an interim response cannot end the stream"))
    );
    assert_eq!(c.m.writable(1), 0, "no body before the final head");
    c.m.respond(1, 200, [], true, &mut c.out).expect("200");
    let mut dec = Decoder::new(4096);
    let heads: Vec<_> = c.frames().iter().map(|f| decode(&mut dec, &f.payload)[0].1.clone()).collect();
    assert_eq!(heads, ["103", "200"]);
}

#[test]
fn an_extended_connect_tunnel_carries_bytes_both_ways() {
    let mut c = Client::new();
    let ws = [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/ws")];
    c.request(1, &ws, false);
    c.m.respond(1, 200, [], false, &mut c.out).expect("200");
    c.send(&frame(DATA, 0, 1, b"ping"));
    c.m.send_data(1, b"pong", false, &mut c.out).expect("data");
    assert_eq!(c.take_events(), ["request 1 CONNECT /ws", "data 1 ping"]);
    let frames = c.frames();
    assert_eq!(frames.last().map(|f| f.payload.as_slice()), Some(&b"pong"[..]));
}

#[test]
fn the_peers_table_size_is_honoured() {
    let mut c = Client::new();
    c.send(&frame(SETTINGS, 0, 0, &[0, 1, 0, 0, 0, 0]));
    c.frames();
    c.request(1, &GET, true);
    let head: [(&[u8], &[u8], bool); 1] = [(b"server", b"forkd", false)];
    c.m.respond(1, 200, parts(&head), true, &mut c.out).expect("respond");
    let frames = c.frames();
    let mut dec = Decoder::new(0);
    assert_eq!(strs(&decode(&mut dec, &frames[0].payload)), [(":status", "200"), ("server", "forkd")]);
    assert_eq!(dec.table_size(), 0);
}

#[test]
fn the_peers_goaway_is_reported() {
    let mut c = Client::new();
    let mut payload = u32_payload(0).to_vec();
    payload.extend(u32_payload(Reason::NO_ERROR.0));
    c.send(&frame(GOAWAY, 0, 0, &payload));
    assert_eq!(c.take_events(), ["goaway 0"]);
}
