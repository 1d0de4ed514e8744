//! What a codec's read path reports, in the engine's terms ([`Input`]), and the one place
//! that applies it to a session's exchanges ([`Exchanges::input`]).
//!
//! Every multiplexed codec turns its own events (HTTP/2's, HTTP/3's) into [`Input`]s: a
//! request head with what the codec found wrong with it, body bytes, a reset, the end of the
//! connection, a head it could not make an exchange of. What the engine does with each is
//! written here once, whatever the protocol. The HTTP/1.1 codec answers its own requests and
//! has no input here. This module must not touch a socket or write protocol framing.

use std::time::Instant;

use super::{send_head, Cx, Exchanges, Head, Host, Key, Opening, Sink};
use crate::error::Error;
use crate::http::response::{Delimit, RequestMeta};

/// One thing a codec's peer did, for the exchanges of its session.
pub(crate) enum Input<'a, K, H> {
    /// A request head: a new exchange, answered at once with `refused` (what the codec found
    /// wrong with the head), else dispatched when the request is `complete` (else its body
    /// follows as [`Input::Data`]).
    Request { opening: Opening<K, H>, refused: Option<Error>, complete: bool },
    /// Request body bytes on `stream` (`end`: the last).
    Data { stream: K, bytes: &'a [u8], end: bool },
    /// The peer reset `stream` (or gave up on it).
    Reset(K),
    /// The connection closed: every exchange goes.
    Closed,
    /// A head the codec could not make an exchange of (too large, late): `error` is written
    /// whole on `stream`, which has no exchange.
    Refused { stream: K, error: Error },
}

impl<K: Key, H: Head> Exchanges<K, H> {
    /// Apply what the peer did. Returns whether it was a reset of an open exchange (one the
    /// peer gave up on before its end).
    pub(crate) fn input<S, V>(&mut self, input: Input<'_, K, H>, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant) -> bool
    where
        S: Sink<Stream = K>,
        V: Host,
    {
        match input {
            Input::Request { opening, refused, complete } => {
                let i = self.open(opening, &mut cx.env.common, cx.env.body_timeout, now);
                match refused {
                    Some(e) => self.fail(i, e, sink, cx, now),
                    None if complete => self.dispatch(i, sink, cx, now),
                    None => {}
                }
            }
            Input::Data { stream, bytes, end } => self.data(stream, bytes, end, sink, cx, now),
            Input::Reset(stream) => return self.cancel(stream, cx.sse),
            Input::Closed => self.close_all(cx.sse),
            Input::Refused { stream, error } => send_whole(sink, cx, stream, error),
        }
        false
    }
}

/// Writes a whole error response on `stream`, which has no exchange.
fn send_whole<S: Sink, V>(sink: &mut S, cx: &mut Cx<'_, V>, stream: S::Stream, e: Error) {
    let mut resp = e.into_response(cx.env.development);
    let meta = RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"" };
    if let Ok(h) = cx.heads.build(&mut resp, &meta, &mut cx.env.common) {
        let _ = send_head(sink, stream, h, false);
    }
}
