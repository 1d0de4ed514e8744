//! What the engine writes through and reads from: a codec's request [`Head`], its stream
//! [`Key`], and its write side, the [`Sink`] (`send_head`, `informational` for 103,
//! `send_data`, `reset`, flow control, and how streamed bodies reach the stream; or, for a
//! codec that writes its own heads, `respond`).
//!
//! Each codec implements these for its own streams (`h2_sink.rs`, `h3_sink.rs`, the
//! worker's `h1_sink.rs`); the engine calls only them and never branches on the protocol. This file must not touch a
//! socket or write protocol framing.

use bytes::Bytes;
use http::StatusCode;

use super::pool::{ExchangeId, Pool};
use super::{Exchange, Produce};
use crate::http::reply::FileRange;
use crate::http::response::{Delimit, Response};
use crate::http::service::{Env, Service};
use crate::http2::ResponseFields;

/// A request head as a codec received it.
pub(crate) trait Head {
    /// `:method`.
    fn method(&self) -> &str;
    /// `:path` with the query (empty on a plain CONNECT).
    fn path(&self) -> &str;
    /// `:authority`.
    fn authority(&self) -> Option<&str>;
    /// The regular fields in order, names lower-case.
    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])>;
    /// The first field named `name`.
    fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// A codec's stream id.
pub(crate) trait Key: Copy + Eq {
    /// The worker-wide id of this stream's exchange on connection `conn` (generation `gen`).
    fn id(self, conn: usize, gen: u32) -> ExchangeId;
}

/// Why a stream is reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reset {
    /// The exchange is given up (its client stopped reading).
    Cancel,
    /// The server failed mid-response (a download's file shrank, app code failed).
    Internal,
}

/// The stream is gone (reset, or its connection closed): nothing more can be sent on it.
#[derive(Debug)]
pub(crate) struct Gone;

/// A codec's write side, as the engine writes a response through it.
pub(crate) trait Sink {
    /// The codec's stream id.
    type Stream: Key;
    /// A `103 Early Hints` head.
    fn informational(&mut self, stream: Self::Stream, fields: &ResponseFields) -> Result<(), Gone>;
    /// The response head; the stream ends with it when `end`.
    fn send_head(
        &mut self,
        stream: Self::Stream,
        status: StatusCode,
        fields: &ResponseFields,
        end: bool,
    ) -> Result<(), Gone>;
    /// Body bytes; the stream ends with them when `end`.
    fn send_data(&mut self, stream: Self::Stream, data: Bytes, end: bool) -> Result<(), Gone>;
    /// The response head and the first of its body (not empty), the stream ending with them
    /// when `end`: [`Sink::send_head`] then [`Sink::send_data`], unless the codec writes the
    /// two at once.
    fn send_head_data(
        &mut self,
        stream: Self::Stream,
        status: StatusCode,
        fields: &ResponseFields,
        body: Bytes,
        end: bool,
    ) -> Result<(), Gone> {
        self.send_head(stream, status, fields, false)?;
        self.send_data(stream, body, end)
    }
    /// Reset the stream.
    fn reset(&mut self, stream: Self::Stream, why: Reset);
    /// The body's producer failed after the head (its app code panicked) and what it made is
    /// sent: end the stream as the codec ends such a body. An empty last frame unless the
    /// codec cuts it short.
    fn abandon(&mut self, stream: Self::Stream) {
        let _ = self.send_data(stream, Bytes::new(), true);
    }
    /// The codec writes (and logs) its own heads: the engine answers through
    /// [`Sink::respond`], not through heads it builds for [`Sink::send_head`].
    const ANSWERS: bool = false;
    /// Answer `stream` with `resp` (whole for `Delimit::Length`, else its head with the body
    /// to follow) as the codec does, logging the exchange through `svc`. Returns whether a
    /// body follows. Called only when [`Sink::ANSWERS`].
    fn respond(
        &mut self,
        _stream: Self::Stream,
        _resp: Response,
        _delimit: Delimit,
        _svc: &mut dyn Service,
        _env: &mut Env,
    ) -> bool {
        false
    }
    /// `n` received bytes are consumed: the peer may send as many more (flow control).
    fn release(&mut self, stream: Self::Stream, n: usize);
    /// The producer of a file body, reading ahead as this codec's flow control wants.
    fn file_body(f: FileRange) -> Produce;
    /// Move streaming exchange `ex`'s produced bytes toward its stream as the stream takes
    /// them (its download's read slices too). Returns whether the stream is gone.
    fn feed<H>(&mut self, ex: &mut Exchange<Self::Stream, H>, pool: &Pool, id: ExchangeId) -> bool;
    /// After every exchange was fed: what the codec sends across exchanges (priorities).
    /// Exchanges whose body ended or whose stream failed are marked `gone`. Returns whether
    /// anything was queued.
    fn pump<H>(&mut self, exchanges: &mut [Exchange<Self::Stream, H>], pool: &Pool, conn: usize, gen: u32) -> bool;
}

/// Send a built head on `stream`: its early hints, the head, and what of its body it holds
/// (`follows`: the body comes later, the stream stays open).
#[inline]
pub(crate) fn send_head<S: Sink>(
    sink: &mut S,
    stream: S::Stream,
    head: crate::http2::Head,
    follows: bool,
) -> Result<(), Gone> {
    if let Some(hints) = head.hints {
        sink.informational(stream, &hints)?;
    }
    if head.body.is_empty() {
        sink.send_head(stream, head.status, &head.fields, !follows)
    } else {
        sink.send_head_data(stream, head.status, &head.fields, head.body, !follows)
    }
}
