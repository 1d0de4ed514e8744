//! HTTP/3 (RFC 9114) over QUIC (RFC 9000/9001), socket-free: quinn-proto's sans-I/O state
//! machines under this module's own HTTP/3 frames and QPACK. Everything here is built and
//! tested from bytes and in-memory datagrams; the worker drives it (`worker/h3.rs`).
//!
//! What it owns, bottom up:
//! - `varint.rs`, `frame.rs`: QUIC varints; HTTP/3 frames, read incrementally with DATA never
//!   buffered and HEADERS bounded by length before a byte is kept; reserved and unknown types
//!   skipped, HTTP/2's types and a client's PUSH_PROMISE refused.
//! - `qpack/`: RFC 9204: the static table and Huffman; our decoder with the RFC 9114 size
//!   limit and a dynamic table capacity of 0 (RFC 9204 §2.1 makes it conformant); the encoder,
//!   and the encoder side of the client's dynamic table when its SETTINGS allow one (fixed
//!   response fields inserted once, referenced once acknowledged: no stream ever blocks).
//! - `head.rs`: request heads checked once (pseudo-headers, order, connection-specific
//!   fields, `content-length`), response heads written as HEADERS frames, and which response
//!   fields are worth a dynamic-table entry.
//! - `stream.rs`: what a stream's bytes mean, without quinn: a request stream's frames (head,
//!   body, trailers, end, `content-length`), the client's control and QPACK streams (its
//!   decoder stream's instructions to the encoder), the per-stream output queue.
//! - `conn.rs`: [`conn::H3Conn`], one connection over a `quinn_proto::Connection`: reads and
//!   writes its streams, response frames out through a per-stream queue that pauses its
//!   producer at a watermark (back pressure per exchange), GOAWAY, the error mapping.
//! - `amplification.rs`: the 3× limit before a client's address is validated, kept exactly
//!   (quinn lets one datagram pass it).
//! - `server.rs`: [`server::Server`], one worker's quinn `Endpoint` and its connections:
//!   datagrams in, datagrams out, timers; Retry under load; stateless resets.
//! - `idmap.rs`: the maps keyed by stream IDs and connection handles, hashed with one
//!   multiplication (a peer cannot choose colliding keys: it opens streams in order).
//! - `keys.rs`, `setup.rs`: the connection-ID, stateless-reset, Retry-token and ticket keys
//!   derived from the supervisor's pre-fork secret; connection IDs that carry the worker slot;
//!   quinn's endpoint and server configuration (TLS 1.3 from the `[tls]` pair, ALPN `h3`).
//!
//! It must not touch sockets, the poll or handlers. The worker owns one [`server::Server`]
//! over its slot's UDP socket (bound by the supervisor with `SO_REUSEPORT` and kept across
//! worker restarts, like the TCP slots): it feeds datagrams and timer ticks in, sends what
//! comes out, and turns [`conn::Event`]s into exchanges of the one service, answering through
//! `send_head` / `send_data` / `finish`.
//!
//! Why our own frames and QPACK rather than the async `h3` crate, and the kernel rules the
//! packet routing relies on: `docs/architecture.md`, "HTTP/3".

mod amplification;
pub mod conn;
pub mod error;
pub mod frame;
pub mod handover;
pub mod head;
pub mod idmap;
pub mod keys;
pub mod qpack;
pub mod server;
pub mod setup;
mod stream;
pub mod varint;

pub use error::{Code, H3Error};

#[cfg(test)]
mod tests;
