//! Protocols spoken after an HTTP upgrade: the WebSocket handshake
//! ([`handshake`]) and framing ([`ws`]).
//!
//! Everything here is pure bytes-in/bytes-out: no sockets, no mio, no
//! threads, no timers. The event loop feeds bytes and flushes the output; the
//! application decides what messages mean.

pub mod handshake;
pub mod ws;

pub use handshake::{accept_key, extended_connect, switching_protocols, HandshakeError};
pub use ws::{Event, Message, WsConn, WsError};
