//! What a codec's read path reports, in the engine's terms ([`Input`]), the one place that
//! applies it to a session's exchanges ([`Exchanges::input`]), and a multiplexed session's
//! turn ([`Exchanges::run`]).
//!
//! Every multiplexed codec is a [`Source`]: it turns its own events (HTTP/2's, HTTP/3's)
//! into [`Input`]s: a request head with what the codec found wrong with it, body bytes, a
//! reset, the end of the connection, a head it could not make an exchange of. What the
//! engine does with each is written here once, whatever the protocol. The HTTP/1.1 codec
//! answers its own requests and has no input here. This module must not touch a socket or
//! write protocol framing.

use std::time::Instant;

use bytes::Bytes;

use super::{send_head, Cx, Exchanges, Head, Host, Key, Opening, Sink};
use crate::error::Error;
use crate::http::response::{Delimit, RequestMeta};
use crate::http::service::Env;

/// One thing a codec's peer did, for the exchanges of its session.
pub(crate) enum Input<K, H> {
    /// A request head: a new exchange, answered at once with `refused` (what the codec found
    /// wrong with the head), else dispatched when the request is `complete` (else its body
    /// follows as [`Input::Data`]).
    Request { opening: Opening<K, H>, refused: Option<Error>, complete: bool },
    /// Request body bytes on `stream` (`end`: the last).
    Data { stream: K, bytes: Bytes, end: bool },
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
    #[inline]
    pub(crate) fn input<S, V>(&mut self, input: Input<K, H>, sink: &mut S, cx: &mut Cx<'_, V>, now: Instant) -> bool
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
            Input::Data { stream, bytes, end } => self.data(stream, &bytes, end, sink, cx, now),
            Input::Reset(stream) => return self.cancel(stream, cx.sse),
            Input::Closed => self.close_all(cx.sse),
            Input::Refused { stream, error } => send_whole(sink, cx, stream, error),
        }
        false
    }

    /// A session's turn: apply every input `codec` has, then move the streamed bodies
    /// ([`Exchanges::service`]). Returns whether anything was queued.
    pub(crate) fn run<S, V>(&mut self, codec: &mut S, cx: &mut Cx<'_, V>, now: Instant) -> bool
    where
        S: Source<Stream = K, Head = H>,
        V: Host,
    {
        while let Some(input) = codec.next_input(cx.env) {
            if self.input(input, codec, cx, now) {
                codec.peer_reset();
            }
        }
        self.service(codec, cx)
    }
}

/// A multiplexed codec's read side, as the engine reads it: what its peer did, one
/// [`Input`] at a time, with what the codec finds wrong with a request head.
pub(crate) trait Source: Sink {
    /// The codec's request head.
    type Head: Head;
    /// What the peer did next, of what the codec has read (`None`: nothing more for now).
    /// `env` holds the limits a head is checked against.
    fn next_input(&mut self, env: &Env) -> Option<Input<Self::Stream, Self::Head>>;
    /// The peer reset an exchange before its end (a reset flood is the codec's to judge).
    fn peer_reset(&mut self) {}
}

/// Writes a whole error response on `stream`, which has no exchange.
fn send_whole<S: Sink, V>(sink: &mut S, cx: &mut Cx<'_, V>, stream: S::Stream, e: Error) {
    let mut resp = e.into_response(cx.env.development);
    let meta = RequestMeta { delimit: Delimit::Length, head: false, http10: false, keep_alive: true, request_id: b"" };
    if let Ok(h) = cx.heads.build(&mut resp, &meta, &mut cx.env.common) {
        let _ = send_head(sink, stream, h, false);
    }
}
