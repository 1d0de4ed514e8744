//! HTTP/2, socket-free: forkd's own codec, driven from the worker's loop.
//!
//! This module owns HTTP/2 framing and the connection's state: [`hpack`]
//! (header compression with its dynamic tables), [`wire`] (frames from and
//! to byte slices), [`flow`] (window arithmetic), [`machine`] (the server
//! side's state machine over them: SETTINGS, streams, flow control, GOAWAY,
//! the protocol-abuse defences), and [`H2Conn`], which wraps the machine
//! with the loop's buffers, the per-turn `meter` and per-stream
//! response queues, keyed by [`StreamId`]; [`sniff`] tells an HTTP/2
//! connection from its first bytes. It must not touch sockets,
//! routes or application code: the worker moves bytes between the socket
//! (or TLS session) and [`H2Conn`]'s buffers, turns [`Event`]s into
//! exchanges and answers through [`H2Conn::respond`] and
//! [`H2Conn::send_data`].
//!
//! There is no async runtime and nothing to wake: the caller calls
//! [`H2Conn::advance`] after every readiness event (input arrived, output
//! drained, the application produced data, a timer). How much input is read
//! per turn, and when the peer's control frames are a flood, is the
//! `meter`'s to say. The `h2` crate is only a dev-dependency: its client
//! drives [`H2Conn`] in the tests, over [`Io`].

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
pub mod sniff;
#[cfg(test)]
mod tests;
mod unfinished;
pub mod wire;

pub use conn::{Event, H2Conn, H2Error, H2Settings, StreamId};
pub use head::{Head, Heads, ResponseFields};
pub use io::Io;
pub use priority::{Priority, Scheduler, Sent};
pub use request::RequestHead;
pub use unfinished::Unfinished;
pub use wire::Reason;
