//! HTTP/3's sink: how the exchange engine writes an HTTP/3 exchange through [`H3Conn`].
//!
//! Heads and DATA go into the connection's per-stream queue; quinn sends the queues in their
//! priority order itself, so there is no scheduler here ([`Sink::pump`] does nothing).
//! Produced bytes go in while [`H3Conn::may_send`] allows, in pieces of at most [`SLICE`]; a
//! file body reads its next slice on the pool only once quinn took all of the last one
//! ([`FileBody`]: its size follows how the stream did). A reset is `H3_REQUEST_CANCELLED` or
//! `H3_INTERNAL_ERROR`.
//!
//! It is socket-free (the worker's endpoint sends the datagrams); it lives beside the
//! engine, not beside the codec in `http3/`: it works over the engine's exchanges, their
//! producers and the worker's pool, which `http3/` must not know. This file must not touch a
//! socket, write HTTP/3 frames itself or know a route.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use quinn_proto::StreamId;

use super::pool::{ExchangeId, Pool, Work};
use super::{Exchange, FileBody, Gone, Produce, Reset, Sink, SLICE};
use crate::http::reply::FileRange;
use crate::http2::ResponseFields;
use crate::http3::conn::H3Conn;

impl Sink for H3Conn {
    type Stream = StreamId;

    fn informational(&mut self, stream: StreamId, fields: &ResponseFields) -> Result<(), Gone> {
        self.send_head(stream, 103, fields.iter().map(|(n, v, _)| (n, v))).map_err(|_| Gone)
    }

    fn send_head(
        &mut self,
        stream: StreamId,
        status: http::StatusCode,
        fields: &ResponseFields,
        end: bool,
    ) -> Result<(), Gone> {
        H3Conn::send_head(self, stream, status.as_u16(), fields.iter().map(|(n, v, _)| (n, v))).map_err(|_| Gone)?;
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

    /// A download's read slice goes into the stream's queue, and the next is read once
    /// quinn took all of it (its size follows how it did); produced bytes go in while the
    /// stream may send.
    fn feed<H>(&mut self, ex: &mut Exchange<StreamId, H>, pool: &Pool, id: ExchangeId) -> bool {
        let mut gone = false;
        if let Some(Produce::Slices(d)) = &mut ex.produce {
            if let Some(bytes) = d.take() {
                gone = H3Conn::send_data(self, ex.stream, Bytes::from(bytes)).is_err();
                d.taken(self.queued(ex.stream) == 0);
            }
            if !gone && self.queued(ex.stream) == 0 && self.may_send(ex.stream) {
                if let Some((at, len, buf)) = d.next_read() {
                    pool.submit(id, Work::Read(Arc::clone(d.file()), at, len, buf));
                }
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

    /// quinn sends the streams' queues in their priority order itself.
    fn pump<H>(&mut self, _: &mut [Exchange<StreamId, H>], _: &Pool, _: usize, _: u32) -> bool {
        false
    }
}
