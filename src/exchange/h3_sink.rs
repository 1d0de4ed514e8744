//! HTTP/3's sink: how the exchange engine writes an HTTP/3 exchange through [`H3Conn`], and
//! reads what its peer did ([`Source`]: the connection's events as [`Input`]s, with HTTP/3's
//! checks of a request head: a request in 0-RTT that is not replay-safe is answered 425, a
//! body past the limit 413, a CONNECT 400, none reaching a handler).
//!
//! Heads and DATA go into the connection's per-stream queue; quinn sends the queues in their
//! priority order itself. Produced bytes go in while [`H3Conn::may_send`] allows, in pieces of
//! at most [`SLICE`]; a file body reads its next slice on the pool only once quinn took all of
//! the last one ([`FileBody`]: its size follows how the stream did), and the disk is ordered
//! too ([`Sink::pump`]): a less urgent download reads only while no more urgent one waits
//! for it. A reset is `H3_REQUEST_CANCELLED` or `H3_INTERNAL_ERROR`.
//!
//! It is socket-free (the worker's endpoint sends the datagrams); it lives beside the
//! engine, not beside the codec in `http3/`: it works over the engine's exchanges, their
//! producers and the worker's pool, which `http3/` must not know. This file must not touch a
//! socket, write HTTP/3 frames itself or know a route.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use quinn_proto::{StreamId, VarInt};

use super::pool::{ExchangeId, Pool, Work};
use super::{Exchange, FileBody, Gone, Head, Input, Key, Opening, Produce, Reset, Sink, Source, SLICE};
use crate::error::Error;
use crate::http::reply::FileRange;
use crate::http::service::Env;
use crate::http2::{Priority, ResponseFields};
use crate::http3::conn::{Event, H3Conn};
use crate::http3::head::RequestHead;

impl Key for StreamId {
    fn id(self, conn: usize, gen: u32) -> ExchangeId {
        ExchangeId::H3 { conn, stream: VarInt::from(self).into_inner(), gen }
    }
}

impl Head for RequestHead {
    fn method(&self) -> &str {
        RequestHead::method(self)
    }

    fn path(&self) -> &str {
        RequestHead::path(self)
    }

    fn authority(&self) -> Option<&str> {
        RequestHead::authority(self)
    }

    fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        // Field names are checked lower-case tokens (ASCII).
        RequestHead::fields(self).map(|(n, v)| (std::str::from_utf8(n).unwrap_or(""), v))
    }
}

impl Source for H3Conn {
    type Head = RequestHead;

    fn next_input(&mut self, env: &Env) -> Option<Input<StreamId, RequestHead>> {
        loop {
            return Some(match self.poll_event()? {
                Event::Request { stream, head } => opening(self, stream, head, env),
                Event::TooLarge { stream } => Input::Refused { stream, error: Error::HeaderTooLarge },
                Event::HeadTimeout { stream } => Input::Refused { stream, error: Error::RequestTimeout },
                Event::Data { stream, data } => Input::Data { stream, bytes: data, end: false },
                Event::End { stream } => Input::Data { stream, bytes: Bytes::new(), end: true },
                Event::Aborted { stream } => Input::Reset(stream),
                Event::Writable { .. } => continue,
                Event::Closed => Input::Closed,
            });
        }
    }
}

/// The engine's input for a request head on `stream`: what HTTP/3 finds wrong with it.
fn opening(conn: &mut H3Conn, stream: StreamId, head: RequestHead, env: &Env) -> Input<StreamId, RequestHead> {
    let priority = Priority::from_fields(RequestHead::fields(&head).filter(|(n, _)| *n == b"priority").map(|(_, v)| v));
    // RFC 9218 urgency 0 (most urgent) .. 7; quinn sends higher priorities first.
    conn.set_priority(stream, 7 - i32::from(priority.urgency.min(7)));
    let refused = if head.early && !head.safe_for_early_data() {
        // RFC 8470: not replay-safe; the client sends it again after the handshake.
        Some(Error::TooEarly)
    } else if head.content_length.is_some_and(|n| n > env.max_body) {
        Some(Error::PayloadTooLarge)
    } else if head.method() == "CONNECT" {
        // No extended CONNECT (WebSocket) over HTTP/3, as a plain CONNECT over HTTP/2.
        Some(Error::bad_request("CONNECT is not supported"))
    } else {
        None
    };
    // The end of the stream is an event of its own: a body may always follow.
    let opening = Opening { stream, head, priority, body_follows: true, tunnel: false };
    Input::Request { opening, refused, complete: false }
}

impl Sink for H3Conn {
    type Stream = StreamId;

    fn informational(&mut self, stream: StreamId, fields: &ResponseFields) -> Result<(), Gone> {
        self.send_head_fields(stream, 103, fields).map_err(|_| Gone)
    }

    fn send_head(
        &mut self,
        stream: StreamId,
        status: http::StatusCode,
        fields: &ResponseFields,
        end: bool,
    ) -> Result<(), Gone> {
        self.send_head_fields(stream, status.as_u16(), fields).map_err(|_| Gone)?;
        if end {
            self.finish(stream).map_err(|_| Gone)?;
        }
        Ok(())
    }

    /// The head and a small body in one chunk (`H3Conn::send_response`).
    fn send_head_data(
        &mut self,
        stream: StreamId,
        status: http::StatusCode,
        fields: &ResponseFields,
        body: Bytes,
        end: bool,
    ) -> Result<(), Gone> {
        self.send_response(stream, status.as_u16(), fields, body).map_err(|_| Gone)?;
        if end {
            self.finish(stream).map_err(|_| Gone)?;
        }
        Ok(())
    }

    fn send_data(&mut self, stream: StreamId, data: Bytes, end: bool) -> Result<(), Gone> {
        if !data.is_empty() {
            H3Conn::send_data(self, stream, data).map_err(|_| Gone)?;
        }
        if end {
            self.finish(stream).map_err(|_| Gone)?;
        }
        Ok(())
    }

    fn reset(&mut self, stream: StreamId, why: Reset) {
        let code = match why {
            Reset::Cancel => crate::http3::Code::RequestCancelled,
            Reset::Internal => crate::http3::Code::InternalError,
        };
        H3Conn::reset(self, Instant::now(), stream, code);
    }

    /// QUIC's stream windows are quinn's: what arrived is already consumed.
    fn release(&mut self, _stream: StreamId, _n: usize) {}

    fn file_body(f: FileRange) -> Produce {
        Produce::Slices(FileBody::new(f.file, f.offset, f.len))
    }

    /// A download's read slice goes into the stream's queue (its next read is asked for by
    /// [`Sink::pump`]); produced bytes go in while the stream may send.
    fn feed<H>(&mut self, ex: &mut Exchange<StreamId, H>, _pool: &Pool, _id: ExchangeId) -> bool {
        let mut gone = false;
        if let Some(Produce::Slices(d)) = &mut ex.produce {
            if let Some(bytes) = d.take() {
                gone = H3Conn::send_data(self, ex.stream, Bytes::from(bytes)).is_err();
                d.taken(self.queued(ex.stream) == 0);
            }
            if d.done() {
                ex.done = true;
            }
        }
        while !gone && !ex.unsent.is_empty() && self.may_send(ex.stream) {
            let n = ex.unsent.len().min(SLICE);
            let chunk = if n == ex.unsent.len() {
                Bytes::from(std::mem::take(&mut ex.unsent))
            } else {
                let c = Bytes::copy_from_slice(&ex.unsent[..n]);
                ex.unsent.drain(..n);
                c
            };
            gone = H3Conn::send_data(self, ex.stream, chunk).is_err();
        }
        gone
    }

    /// quinn sends the streams' queues in their priority order itself; this pass orders the
    /// disk. A file body asks for its next slice once quinn took all of the last one, and
    /// only while no more urgent download of the connection waits for the disk (a read on
    /// the pool, or one to ask for): a less urgent stream reads while the urgent ones are
    /// held by their windows or done, as the network would have it (RFC 9218 §10).
    fn pump<H>(&mut self, exchanges: &mut [Exchange<StreamId, H>], pool: &Pool, conn: usize, gen: u32) -> bool {
        let hungry = |sink: &H3Conn, ex: &Exchange<StreamId, H>| match &ex.produce {
            Some(Produce::Slices(d)) => {
                d.reading() || (d.unread() && sink.queued(ex.stream) == 0 && sink.may_send(ex.stream))
            }
            _ => false,
        };
        let Some(urgency) = exchanges.iter().filter(|ex| hungry(self, ex)).map(|ex| ex.priority.urgency).min() else {
            return false;
        };
        for ex in exchanges.iter_mut().filter(|ex| ex.priority.urgency == urgency) {
            if let Some(Produce::Slices(d)) = &mut ex.produce {
                if self.queued(ex.stream) == 0 && self.may_send(ex.stream) {
                    if let Some((at, len, buf)) = d.next_read() {
                        pool.submit(ex.stream.id(conn, gen), Work::Read(Arc::clone(d.file()), at, len, buf));
                    }
                }
            }
        }
        false
    }
}
