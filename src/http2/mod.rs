//! HTTP/2, socket-free: the `h2` crate's server side driven by hand.
//!
//! This module owns HTTP/2 framing (through `h2`: HPACK, SETTINGS, the
//! stream state machine, the protocol-abuse defences), the bridge between
//! h2's flow control and the event loop's back pressure, and the
//! per-stream send/receive handles, keyed by [`StreamId`]. It must not touch
//! sockets, routes or application code: the worker moves bytes between the
//! socket (or TLS session) and [`H2Conn`]'s buffers, turns [`Event`]s into
//! exchanges and answers through [`H2Conn::respond`] and
//! [`H2Conn::send_data`].
//!
//! There is no async runtime: h2 is polled with a no-op waker from
//! [`H2Conn::advance`], which the caller calls after every readiness event
//! (input arrived, output drained, the application produced data, a timer).
//! h2 never needs to wake anyone, because the caller always polls again.
//! How much input h2 reads per turn, and when the peer's control frames are
//! a flood, is the `meter`'s to say.
//!
//! [`hpack`], [`wire`] and [`flow`] are the pieces of a socket-free HTTP/2 codec of forkd's
//! own (HPACK with its dynamic tables, frames from and to byte slices, window arithmetic),
//! unit-tested and fuzzed (`http2_frames`) on their own; `H2Conn` does not use them yet.

mod conn;
pub mod flow;
mod frame;
mod head;
pub mod hpack;
mod io;
pub mod machine;
mod meter;
pub mod priority;
pub mod request;
#[cfg(test)]
mod tests;
mod unfinished;
pub mod wire;

pub use conn::{Event, H2Conn, H2Error, H2Settings, RequestHead, StreamId};
pub use head::{Head, Heads};
pub use io::Io;
pub use priority::{Priority, Scheduler, Sent};
pub use unfinished::Unfinished;
pub use wire::Reason;
