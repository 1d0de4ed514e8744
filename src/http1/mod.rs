//! HTTP/1.1: the codec of a plain or TLS connection that speaks HTTP/1.x.
//!
//! [`parse`] reads a request head (every smuggling rule in one function),
//! [`body`] decodes chunked request bodies, [`codec`] is the socket-free
//! per-connection state machine (bytes in, bytes out, one exchange at a
//! time), and [`writer`] renders responses and frames the bodies that
//! follow their heads (chunked, sized, the `101` of an upgrade, `HEAD`).
//! What HTTP/1.1 shares with the other codecs (requests, responses, the
//! service, the target and `Host` rules) lives in `crate::http`.
//!
//! Nothing here touches a socket, a poll or a route.

pub mod body;
pub mod codec;
pub mod parse;
pub mod writer;
