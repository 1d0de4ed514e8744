//! Protocols spoken around HTTP: after an upgrade, the WebSocket handshake
//! ([`handshake`]) and framing ([`ws`]); before it, the PROXY protocol header a TCP
//! balancer writes ([`proxy_protocol`]).
//!
//! Everything here is pure bytes-in/bytes-out: no sockets, no mio, no
//! threads, no timers. The event loop feeds bytes and flushes the output; the
//! application decides what messages mean.

pub mod handshake;
pub mod proxy_protocol;
pub mod ws;

pub use handshake::{accept_key, extended_connect, switching_protocols, HandshakeError};
pub use ws::{Event, Message, WsConn, WsError};
