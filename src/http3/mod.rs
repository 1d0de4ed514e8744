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
//! - `amplification.rs`: the 3× limit before a client's address is validated, kept exactly
//!   (quinn lets one datagram pass it).
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
//! ## Routing every packet to its worker
//!
//! A connection ID is `slot ‖ random ‖ tag` (`keys.rs`). The supervisor binds one UDP socket
//! per slot, in slot order, and attaches a classic BPF program to the port's `SO_REUSEPORT`
//! group (`SO_ATTACH_REUSEPORT_CBPF`, no eBPF toolchain; `supervisor/listen.rs`,
//! `steering_program`). The kernel runs it on the UDP payload and takes its result as an
//! index into the group; it returns the slot read from the destination CID (bytes 1–2 of a
//! short header; bytes 6–7 of a long header whose CID length, byte 5, is 12) and
//! `u32::MAX` for anything else (a client's first Initial, with a CID it chose; runts),
//! which makes the kernel fall back to its hash of the 4-tuple. So every packet after the
//! first flight, also after the client's address changes, reaches the socket of the slot
//! that owns the connection. Tested over loopback (`listen.rs` tests): slot k's packets,
//! short and long headers, arrive at socket k; the rest arrive somewhere, one 4-tuple
//! always at the same socket.
//!
//! What the kernel (`net/core/sock_reuseport.c`) does that the design relies on:
//! - a group's sockets are numbered in the order they are bound; a socket bound later (a
//!   slot added by `SIGTTIN`) is appended and inherits the program;
//! - closing a socket moves the group's *last* socket into its place. The supervisor only
//!   ever closes the last slot's socket (`SIGTTOU`, a reload to fewer workers), so the
//!   others keep their index; a worker's death or replacement closes nothing (the
//!   supervisor holds the socket). Once workers hold their slot's socket too, a removed
//!   slot's socket leaves the group only when its draining worker exits: a slot added
//!   back before that (`SIGTTOU` then `SIGTTIN`) sits one index further until then, and
//!   its packets meet the draining worker meanwhile;
//! - `SIGUSR2` hands the same sockets (same open files) to the new supervisor in slot
//!   order: the group, its order and its program are untouched (the new supervisor attaches
//!   the same program again, which replaces it atomically). Under systemd, the unit's socket
//!   is slot 0 and the supervisor binds the others after it.
//!
//! Two workers of one slot (an old one draining beside its replacement: reload, memory
//! limit, `SIGUSR2`) would both read the slot's one socket and take each other's packets. So
//! one reads and forwards (`worker/h3_inbox.rs`, `sys/inbox.rs`): the replacement says hello
//! to each live predecessor's inbox (an abstract `AF_UNIX` datagram socket named by UDP port
//! and pid, same-uid senders only); a predecessor stops reading, acks with its CID generation
//! and from then on gets its packets from the replacement, which reads the socket and sends
//! each datagram whose CID names the slot and an acked generation to that inbox, serving
//! everything else (new clients included). The predecessor reads again if its successor
//! dies. A predecessor that does not ack (a stuck loop, a binary without inboxes) is waited
//! for as before: the replacement reads once it is gone, and meanwhile the draining worker
//! leaves new clients' first packets unanswered and drops, rather than resets, a packet of
//! another generation of its slot (`Server::set_sibling`).
//!
//! Why forwarding and not a socket per worker process (the CID naming a route the program
//! maps to a group index, the program rebuilt whenever a worker starts or ends): forwarding
//! changes neither the BPF program nor the socket group's order (whose kernel rules above are
//! subtle enough), and only draining connections pay for it, one copy through a local
//! socket per datagram they receive, for as long as they drain.

mod amplification;
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
