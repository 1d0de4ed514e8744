//! What the bytes of one stream mean, without quinn or a clock: a request stream's frames
//! (head, body pieces, trailers, end) under RFC 9114 §4.1, the client's control and QPACK
//! streams under §6.2 and RFC 9204 §4.2 (its decoder stream's instructions go to the
//! connection's [`TableEncoder`]), and the output queue of a stream. `conn.rs` reads
//! and writes the QUIC streams and acts on what these return; every rule about which frame
//! may come where lives here.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};
use quinn_proto::StreamId;

use super::error::{Code, H3Error};
use super::frame::{self, Frame, FrameReader};
use super::head::RequestHead;
use super::idmap::IdMap;
use super::qpack::encoder::TableEncoder;
use super::qpack::{self, DecodeError, Fields};
use super::varint;

/// Queued output per stream at which its producer is paused.
pub const WATERMARK: usize = 64 * 1024;

/// Stream types of unidirectional streams (RFC 9114 §6.2, RFC 9204 §4.2).
pub(super) mod uni {
    pub const CONTROL: u64 = 0x00;
    pub const PUSH: u64 = 0x01;
    pub const ENCODER: u64 = 0x02;
    pub const DECODER: u64 = 0x03;
}

/// The output side of one stream: frames waiting for flow control.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub out: VecDeque<Bytes>,
    pub queued: usize,
    /// The owner finished: FIN once the queue is written.
    pub fin: bool,
    /// The producer was told to wait: tell it when the queue falls below the watermark.
    pub paused: bool,
    /// FIN written (or the stream reset): nothing more goes out.
    pub done: bool,
}

impl Outbox {
    /// Adds `bytes` (an empty chunk is not queued: quinn would count it as written).
    pub fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.queued += bytes.len();
            self.out.push_back(bytes);
        }
        if self.queued >= WATERMARK {
            self.paused = true;
        }
    }

    /// Whether more may be queued.
    pub fn open(&self) -> bool {
        !self.done && !self.fin
    }
}

/// Where a request stream's input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the HEADERS frame.
    Head,
    /// Reading DATA (or trailers).
    Body,
    /// After trailers: nothing more may come.
    Trailers,
    /// The input ended (FIN, stopped, or refused).
    Done,
}

/// What a request stream's input meant.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Input {
    /// The checked head.
    Head(RequestHead),
    /// A head over the field-section limit (answer 431; the body is dropped).
    TooLarge,
    /// A piece of the body.
    Data(Bytes),
    /// The body is complete.
    End,
}

/// One request stream.
#[derive(Debug)]
pub(super) struct Request {
    reader: FrameReader,
    input: BytesMut,
    pub phase: Phase,
    /// The head was too large: body bytes are dropped.
    discard: bool,
    body: u64,
    content_length: Option<u64>,
    pub outbox: Outbox,
}

impl Request {
    /// A request stream whose heads may decode to `max_field_section` bytes (a HEADERS frame
    /// over twice that is a connection error).
    pub fn new(max_field_section: usize) -> Request {
        Request {
            reader: FrameReader::new(2 * max_field_section + 1024),
            input: BytesMut::new(),
            phase: Phase::Head,
            discard: false,
            body: 0,
            content_length: None,
            outbox: Outbox::default(),
        }
    }

    /// Both directions are over: the state can go.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done && self.outbox.done
    }

    /// The stream was reset or stopped: nothing more in or out.
    pub fn abandon(&mut self) {
        self.phase = Phase::Done;
        self.outbox = Outbox { done: true, ..Outbox::default() };
    }

    /// New bytes of the stream (`fin`: and its end); `early`: they arrived before the handshake
    /// completed. Pushes what they mean onto `out`. Whole frames are read from `fresh` as it
    /// is (a body piece shares its buffer); only a frame cut short is copied, to wait for
    /// the rest.
    pub fn on_input(
        &mut self,
        fresh: Bytes,
        fin: bool,
        early: bool,
        max: usize,
        out: &mut VecDeque<Input>,
    ) -> Result<(), H3Error> {
        let mut input = if self.input.is_empty() {
            fresh
        } else {
            self.input.extend_from_slice(&fresh);
            self.input.split().freeze()
        };
        let result = self.frames(&mut input, early, max, out);
        if !input.is_empty() {
            // Taken back without a copy when nothing else shares its buffer.
            self.input = input.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        }
        result?;
        if fin {
            if !self.reader.at_boundary() || !self.input.is_empty() {
                return Err(H3Error::conn(Code::FrameError, "a request stream ended inside a frame"));
            }
            if self.phase == Phase::Head {
                return Err(H3Error::stream(Code::RequestIncomplete, "no HEADERS before the end"));
            }
            if self.content_length.is_some_and(|n| n != self.body) {
                return Err(H3Error::stream(Code::MessageError, "less body than content-length"));
            }
            self.phase = Phase::Done;
            if !self.discard {
                out.push_back(Input::End);
            }
        }
        Ok(())
    }

    /// Consumes the whole frames at the front of `input`.
    fn frames(&mut self, input: &mut Bytes, early: bool, max: usize, out: &mut VecDeque<Input>) -> Result<(), H3Error> {
        loop {
            let (drop, frame) = self.reader.next(input)?;
            input.advance(drop);
            match frame {
                None => return Ok(()),
                Some(Frame::Headers { len }) => {
                    self.on_headers(&input[..len], early, max, out)?;
                    input.advance(len);
                }
                Some(Frame::Data { len, .. }) => {
                    if self.phase != Phase::Body {
                        return Err(H3Error::conn(Code::FrameUnexpected, "DATA before HEADERS or after trailers"));
                    }
                    let data = input.split_to(len);
                    self.body += len as u64;
                    if self.content_length.is_some_and(|n| self.body > n) {
                        return Err(H3Error::stream(Code::MessageError, "more body than content-length"));
                    }
                    if !self.discard && !data.is_empty() {
                        out.push_back(Input::Data(data));
                    }
                }
                Some(_) => return Err(H3Error::conn(Code::FrameUnexpected, "a control frame on a request stream")),
            }
        }
    }

    /// A HEADERS payload: the head, or trailers (decoded, checked, dropped).
    fn on_headers(&mut self, block: &[u8], early: bool, max: usize, out: &mut VecDeque<Input>) -> Result<(), H3Error> {
        // Room for what a section usually decodes to (static entries and Huffman expand it):
        // its buffers are sized once rather than grown field by field.
        let mut fields = Fields::with_capacity(2 * block.len() + 64, 16);
        let decoded = match qpack::decode(block, max, &mut fields) {
            Err(DecodeError::Failed(why)) => return Err(H3Error::conn(Code::QpackDecompressionFailed, why)),
            Err(DecodeError::TooLarge) => false,
            Ok(()) => true,
        };
        match self.phase {
            Phase::Head => {
                self.phase = Phase::Body;
                if decoded {
                    let head = RequestHead::from_fields(fields, early)?;
                    self.content_length = head.content_length;
                    out.push_back(Input::Head(head));
                } else {
                    self.discard = true;
                    out.push_back(Input::TooLarge);
                }
                Ok(())
            }
            Phase::Body if fields.iter().any(|(n, _)| n.starts_with(b":")) => {
                Err(H3Error::stream(Code::MessageError, "a pseudo-header in trailers"))
            }
            Phase::Body => {
                self.phase = Phase::Trailers;
                Ok(())
            }
            Phase::Trailers | Phase::Done => Err(H3Error::conn(Code::FrameUnexpected, "HEADERS after trailers")),
        }
    }
}

/// A client's unidirectional stream.
#[derive(Debug)]
enum Uni {
    /// Its type has not arrived yet.
    Untyped(BytesMut),
    /// The control stream; `settings` once SETTINGS arrived.
    Control { reader: FrameReader, input: BytesMut, settings: bool },
    /// The QPACK encoder stream (only `Set Dynamic Table Capacity 0` is acceptable).
    Encoder(BytesMut),
    /// The QPACK decoder stream: its bytes not yet consumed (an instruction cut short).
    Decoder(BytesMut),
    /// An unknown type: read and dropped.
    Ignored,
}

/// The client's unidirectional streams and the SETTINGS they brought.
#[derive(Debug, Default)]
pub(super) struct PeerStreams {
    unis: IdMap<StreamId, Uni>,
    /// Which of control, encoder, decoder the client has opened.
    opened: [bool; 3],
    /// The client's SETTINGS, once they arrived.
    pub settings: Option<frame::Settings>,
}

/// What to do with a unidirectional stream after its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UniNext {
    /// Keep reading.
    Read,
    /// An unknown stream type: stop it with `H3_STREAM_CREATION_ERROR` (RFC 9114 §6.2).
    Refuse,
}

impl PeerStreams {
    /// The client opened `id`.
    pub fn open(&mut self, id: StreamId) {
        self.unis.insert(id, Uni::Untyped(BytesMut::new()));
    }

    /// Whether `id` is one of the client's unidirectional streams.
    pub fn has(&self, id: StreamId) -> bool {
        self.unis.contains_key(&id)
    }

    /// New bytes of `id` (`ended`: it finished or was reset); decoder-stream instructions go
    /// to `qpack`.
    pub fn on_input(
        &mut self,
        id: StreamId,
        mut input: BytesMut,
        ended: bool,
        qpack: &mut TableEncoder,
    ) -> Result<UniNext, H3Error> {
        let critical = H3Error::conn(Code::ClosedCriticalStream, "a control or QPACK stream ended");
        let Some(state) = self.unis.get_mut(&id) else { return Ok(UniNext::Read) };
        let mut next = UniNext::Read;
        if let Uni::Untyped(held) = state {
            if !held.is_empty() {
                held.extend_from_slice(&input);
                input = std::mem::take(held);
            }
            let Some((ty, used)) = varint::decode(&input) else {
                *state = Uni::Untyped(input);
                return Ok(UniNext::Read);
            };
            input.advance(used);
            let slot = match ty {
                uni::CONTROL => Some(0),
                uni::ENCODER => Some(1),
                uni::DECODER => Some(2),
                uni::PUSH => return Err(H3Error::conn(Code::StreamCreationError, "a push stream from a client")),
                _ => None,
            };
            *state = match slot {
                Some(i) if self.opened[i] => {
                    return Err(H3Error::conn(Code::StreamCreationError, "a second control or QPACK stream"));
                }
                Some(0) => Uni::Control { reader: FrameReader::new(0), input: BytesMut::new(), settings: false },
                Some(1) => Uni::Encoder(BytesMut::new()),
                Some(_) => Uni::Decoder(BytesMut::new()),
                None => {
                    next = UniNext::Refuse;
                    Uni::Ignored
                }
            };
            if let Some(i) = slot {
                self.opened[i] = true;
            }
        }
        match state {
            Uni::Untyped(_) | Uni::Ignored => return Ok(next),
            Uni::Decoder(buf) => {
                buf.extend_from_slice(&input);
                let used =
                    qpack.on_decoder_stream(buf).map_err(|e| H3Error::conn(Code::QpackDecoderStreamError, e.0))?;
                // What is left is one instruction cut short: at most a 10-byte integer.
                buf.advance(used);
            }
            Uni::Encoder(buf) => {
                buf.extend_from_slice(&input);
                encoder_instructions(buf)?;
            }
            Uni::Control { reader, input: buf, settings } => {
                buf.extend_from_slice(&input);
                loop {
                    let (drop, frame) = reader.next(buf)?;
                    buf.advance(drop);
                    let Some(frame) = frame else { break };
                    match (frame, *settings) {
                        (Frame::Settings(s), false) => {
                            *settings = true;
                            self.settings = Some(s);
                        }
                        (_, false) => {
                            return Err(H3Error::conn(
                                Code::MissingSettings,
                                "the control stream did not start with SETTINGS",
                            ))
                        }
                        (Frame::Goaway(_) | Frame::MaxPushId(_), true) => {}
                        (Frame::CancelPush(_), true) => {
                            return Err(H3Error::conn(Code::IdError, "CANCEL_PUSH for a push never promised"))
                        }
                        (_, true) => {
                            return Err(H3Error::conn(
                                Code::FrameUnexpected,
                                "a frame not allowed on the control stream",
                            ))
                        }
                    }
                }
            }
        }
        if ended {
            return Err(critical);
        }
        Ok(next)
    }
}

/// Consumes the complete instructions of a client's QPACK encoder stream: with a table
/// capacity of 0 only `Set Dynamic Table Capacity` (`001xxxxx`) to 0 is acceptable.
fn encoder_instructions(buf: &mut BytesMut) -> Result<(), H3Error> {
    while let Some(&first) = buf.first() {
        if first & 0xe0 != 0x20 {
            return Err(H3Error::conn(Code::QpackEncoderStreamError, "an insertion into a table of capacity 0"));
        }
        match qpack::integer(buf, 5) {
            Ok((0, used)) => buf.advance(used),
            Ok(_) => return Err(H3Error::conn(Code::QpackEncoderStreamError, "a table capacity above 0")),
            Err(_) if buf.len() < 10 => break,
            Err(_) => return Err(H3Error::conn(Code::QpackEncoderStreamError, "a bad capacity")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http3::qpack::Encoder;
    use quinn_proto::{Dir, Side};

    fn headers(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        Encoder.begin(&mut block);
        for (n, v) in fields {
            Encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
        }
        let mut out = Vec::new();
        frame::write_header(frame::ty::HEADERS, block.len() as u64, &mut out);
        out.extend_from_slice(&block);
        out
    }

    fn data(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame::write_header(frame::ty::DATA, bytes.len() as u64, &mut out);
        out.extend_from_slice(bytes);
        out
    }

    const POST: [(&str, &str); 4] =
        [(":method", "POST"), (":scheme", "https"), (":path", "/p"), ("content-length", "5")];

    /// Feeds `parts` one by one (the last with FIN); the inputs found, or the first error.
    fn run(parts: &[Vec<u8>]) -> Result<Vec<Input>, H3Error> {
        let (mut r, mut out) = (Request::new(1024), VecDeque::new());
        for (i, part) in parts.iter().enumerate() {
            r.on_input(Bytes::copy_from_slice(part), i + 1 == parts.len(), false, 1024, &mut out)?;
        }
        Ok(out.into_iter().collect())
    }

    fn code_of(parts: &[Vec<u8>]) -> (Code, bool) {
        let e = run(parts).expect_err("an error");
        (e.code(), e.is_connection())
    }

    #[test]
    fn a_request_with_a_body_and_trailers() {
        let found = run(&[headers(&POST), data(b"he"), data(b"llo"), headers(&[("x-sum", "1")])]).expect("valid");
        assert!(matches!(found[0], Input::Head(ref h) if h.method() == "POST"));
        assert_eq!(
            found[1..],
            [Input::Data(Bytes::from_static(b"he")), Input::Data(Bytes::from_static(b"llo")), Input::End]
        );
    }

    #[test]
    fn a_request_split_at_every_byte_means_the_same() {
        let whole = [headers(&POST), data(b"he"), data(b"llo"), headers(&[("x-sum", "1")])].concat();
        // Body pieces follow the cuts; joined, they are the same body.
        let meaning = |parts: &[Vec<u8>]| {
            let found = run(parts).expect("valid");
            let body: Vec<u8> = found
                .iter()
                .filter_map(|i| if let Input::Data(d) = i { Some(&d[..]) } else { None })
                .flatten()
                .copied()
                .collect();
            let rest: Vec<&Input> = found.iter().filter(|i| !matches!(i, Input::Data(_))).collect();
            (format!("{rest:?}"), body)
        };
        let want = meaning(std::slice::from_ref(&whole));
        assert_eq!(want.1, b"hello");
        for at in 0..=whole.len() {
            assert_eq!(meaning(&[whole[..at].to_vec(), whole[at..].to_vec()]), want, "cut at {at}");
        }
        let bytes: Vec<Vec<u8>> = whole.iter().map(|b| vec![*b]).collect();
        assert_eq!(meaning(&bytes), want, "one byte at a time");
    }

    #[test]
    fn request_stream_rules() {
        assert_eq!(code_of(&[data(b"x")]), (Code::FrameUnexpected, true), "DATA before HEADERS");
        assert_eq!(code_of(&[headers(&POST), data(b"123456")]), (Code::MessageError, false), "over content-length");
        assert_eq!(code_of(&[headers(&POST), data(b"1234")]), (Code::MessageError, false), "under content-length");
        assert_eq!(code_of(&[Vec::new()]), (Code::RequestIncomplete, false), "FIN with no head");
        let trailers_pseudo = headers(&[(":path", "/")]);
        assert_eq!(code_of(&[headers(&POST), data(b"hello"), trailers_pseudo]), (Code::MessageError, false));
        let t = headers(&[("x", "1")]);
        assert_eq!(code_of(&[headers(&POST), data(b"hello"), t.clone(), t]), (Code::FrameUnexpected, true));
        let mut cut = headers(&POST);
        cut.pop();
        assert_eq!(code_of(&[cut]), (Code::FrameError, true), "FIN inside a frame");
        let mut goaway = Vec::new();
        frame::write_goaway(0, &mut goaway);
        assert_eq!(code_of(&[headers(&POST), goaway]), (Code::FrameUnexpected, true));
        let mut bad_qpack = headers(&POST);
        bad_qpack[2] = 0x01; // Required Insert Count 1
        assert_eq!(code_of(&[bad_qpack]), (Code::QpackDecompressionFailed, true));
        // Over the field-section limit: 431, and the body is dropped.
        let big = "x".repeat(1100);
        let found = run(&[headers(&[(":method", "GET"), (":scheme", "https"), (":path", &big)]), data(b"dropped")]);
        assert_eq!(found, Ok(vec![Input::TooLarge]));
    }

    fn uni_id(i: u64) -> StreamId {
        StreamId::new(Side::Client, Dir::Uni, i)
    }

    /// Opens uni stream `i` and feeds it `bytes` (`ended`: then it ends).
    fn feed(peers: &mut PeerStreams, i: u64, bytes: &[u8], ended: bool) -> Result<UniNext, H3Error> {
        if !peers.has(uni_id(i)) {
            peers.open(uni_id(i));
        }
        peers.on_input(uni_id(i), BytesMut::from(bytes), ended, &mut TableEncoder::default())
    }

    #[test]
    fn client_unidirectional_streams() {
        let mut settings = vec![0x00];
        frame::write_settings(&[(frame::setting::MAX_FIELD_SECTION_SIZE, 100)], &mut settings);
        let mut peers = PeerStreams::default();
        // The type byte alone, then SETTINGS: fine; the QPACK streams with capacity 0: fine.
        assert_eq!(feed(&mut peers, 0, &settings[..1], false), Ok(UniNext::Read));
        assert_eq!(feed(&mut peers, 0, &settings[1..], false), Ok(UniNext::Read));
        assert_eq!(peers.settings.and_then(|s| s.max_field_section_size), Some(100));
        assert_eq!(feed(&mut peers, 1, &[0x02, 0x20], false), Ok(UniNext::Read));
        assert_eq!(feed(&mut peers, 2, &[0x03], false), Ok(UniNext::Read));
        assert_eq!(feed(&mut peers, 3, &[0x21, 1, 2, 3], false), Ok(UniNext::Refuse), "an unknown type is stopped");
        let err = |r: Result<UniNext, H3Error>| r.map_err(|e| e.code()).expect_err("an error");
        assert_eq!(err(feed(&mut peers, 4, &[0x00], false)), Code::StreamCreationError, "a second control stream");
        assert_eq!(err(feed(&mut peers, 5, &[0x01], false)), Code::StreamCreationError, "a push stream");
        assert_eq!(err(feed(&mut peers, 1, &[0x3f, 0x01], false)), Code::QpackEncoderStreamError, "capacity 64");
        assert_eq!(err(feed(&mut peers, 0, &[0x03, 0x01, 0x00], false)), Code::IdError, "CANCEL_PUSH");
        assert_eq!(err(feed(&mut peers, 2, &[], true)), Code::ClosedCriticalStream);
        let mut fresh = PeerStreams::default();
        assert_eq!(err(feed(&mut fresh, 0, &[0x00, 0x07, 0x01, 0x00], false)), Code::MissingSettings);
        let mut fresh = PeerStreams::default();
        assert_eq!(err(feed(&mut fresh, 1, &[0x02, 0x80], false)), Code::QpackEncoderStreamError, "an insertion");
        // The decoder stream: with nothing inserted, an Insert Count Increment or a Section
        // Acknowledgment is QPACK_DECODER_STREAM_ERROR; a Stream Cancellation is harmless.
        for bad in [&[0x03, 0x01][..], &[0x03, 0x00], &[0x03, 0x84]] {
            let mut fresh = PeerStreams::default();
            assert_eq!(err(feed(&mut fresh, 2, bad, false)), Code::QpackDecoderStreamError, "{bad:02x?}");
        }
        let mut fresh = PeerStreams::default();
        assert_eq!(feed(&mut fresh, 2, &[0x03, 0x44], false), Ok(UniNext::Read), "Stream Cancellation");
    }
}
