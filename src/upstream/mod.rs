//! The outbound HTTP/1.1 client (to the configured upstreams): [`wire`] is its protocol half
//! (endpoints resolved before fork, the request bytes, an incremental response reader;
//! testable from byte slices), [`conn`] its socket half (one connection, one non-blocking
//! I/O pass), [`pool`] the worker's connections as one value (the idle pools per endpoint,
//! the in-flight table for coalescing, deadlines, retries), [`call`] what an exchange waiting
//! on them holds.
//!
//! The worker's `upstream` glue registers the sockets with its event loop and delivers
//! results to the exchanges waiting for them; the app decides what an answer means. Nothing
//! here knows a route, a codec or the loop's tokens.

pub mod call;
pub mod conn;
pub mod pool;
pub mod wire;
