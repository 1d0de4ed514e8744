//! HTTP/3 (RFC 9114) over QUIC (RFC 9000/9001), socket-free: quinn-proto's sans-I/O state
//! machines under this module's own HTTP/3 frames and QPACK. Everything here is built and
//! tested from bytes and in-memory datagrams; the worker drives it (`worker/h3.rs`).
//!
//! What it owns, bottom up:
//! - `varint.rs`, `frame.rs`: QUIC varints; HTTP/3 frames, read incrementally with DATA never
//!   buffered and HEADERS bounded by length before a byte is kept; reserved and unknown types
//!   skipped, HTTP/2's types and a client's PUSH_PROMISE refused.
//! - `qpack/`: RFC 9204 with the static table and Huffman only (dynamic table capacity 0,
//!   which RFC 9204 §2.1 makes conformant): decoder with the RFC 9114 size limit, encoder.
//! - `head.rs`: request heads checked once (pseudo-headers, order, connection-specific
//!   fields, `content-length`), response heads written as HEADERS frames.
//! - `stream.rs`: what a stream's bytes mean, without quinn: a request stream's frames (head,
//!   body, trailers, end, `content-length`), the client's control and QPACK streams, the
//!   per-stream output queue.
//! - `conn.rs`: [`conn::H3Conn`], one connection over a `quinn_proto::Connection`: reads and
//!   writes its streams, response frames out through a per-stream queue that pauses its
//!   producer at a watermark (back pressure per exchange), GOAWAY, the error mapping.
//! - `server.rs`: [`server::Server`], one worker's quinn `Endpoint` and its connections:
//!   datagrams in, datagrams out, timers; Retry under load; stateless resets.
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
//! ## Our own frames and QPACK, not the `h3` crate
//!
//! `h3` (0.0.8) is an async library: its server is a set of futures over a poll-based
//! `quic::Connection` trait. Driving it from the mio loop would mean implementing that trait
//! over quinn-proto with wakers (behind a feature named
//! `i-implement-a-third-party-backend-and-opt-into-breaking-changes`), polling it with a no-op
//! waker as `http2/` polls `h2`, and adding `futures-util` and tokio's `sync`. What it would
//! bring is small: HTTP/3 has seven frame types, and QPACK without a dynamic table is the
//! static table plus HPACK's Huffman code, with no encoder/decoder stream state and no blocked
//! streams. Our codec is ~1,900 lines with its tests and tables, has no allocation per field (one buffer
//! per field section), and puts the per-stream output queue where the worker's back pressure
//! needs it (`may_send` / `Event::Writable`, as `http2/` bridges h2's capacity). Measured
//! (release build, this machine while shared, best of three, `qpack::tests::qpack_cost`): a
//! 12-field browser request head (263 bytes encoded) decodes and is checked in ~2.6 µs; a
//! 15-field response head (299 bytes) is encoded in ~1.4 µs. Huffman is decoded bit by bit;
//! a table-driven decoder is the step to take if that shows in profiles. The cost of the
//! choice: no dynamic table, so repeated fields (cookies, user agents) are not compressed
//! across requests; a peer's QPACK encoder may not use one either (we advertise capacity 0).
//!
//! ## Routing every packet to its worker (the plan for the wiring step)
//!
//! A connection ID is `slot ‖ random ‖ tag` (`keys.rs`). The supervisor will attach a
//! classic BPF program (`SO_ATTACH_REUSEPORT_CBPF`, no eBPF toolchain) to the UDP group that
//! returns the slot read from the destination CID (byte 1 of a short header; byte 6 of a long
//! header whose CID is 12 bytes) and the out-of-range index for anything else, which makes the
//! kernel fall back to its hash (a client's first Initial, whose CID it chose itself). So every
//! packet after the first flight, also after the client's address changes, reaches the
//! socket of the slot that owns the connection. Forwarding stray packets between workers is
//! not needed: when a worker is replaced its connections are closed with GOAWAY, and a packet
//! for a connection no one has is answered with a stateless reset by whichever worker gets it
//! (any worker checks any worker's CIDs and knows the reset key).

pub mod conn;
pub mod error;
pub mod frame;
pub mod head;
pub mod keys;
pub mod qpack;
pub mod server;
pub mod setup;
mod stream;
pub mod varint;

pub use error::{Code, H3Error};

#[cfg(test)]
mod tests;
