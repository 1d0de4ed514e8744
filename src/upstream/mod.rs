//! The outbound HTTP/1.1 client (to the configured upstreams): [`wire`] is its protocol half
//! (endpoints resolved before fork, the request bytes, an incremental response reader;
//! testable from byte slices), [`conn`] its socket half (connections, the idle pools per
//! endpoint, the in-flight table for coalescing, one non-blocking I/O pass).
//!
//! The worker's `upstream` glue drives it from the event loop and delivers results to the
//! exchanges waiting for them; the app decides what an answer means. Nothing here knows a
//! route, a codec or the loop's tokens.

pub mod conn;
pub mod wire;
