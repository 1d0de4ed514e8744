//! What a client exchange waiting on upstreams holds ([`CallState`]): a gather's results so
//! far, or a relay's sink. Every protocol's exchange keeps one; `upstream.rs` fills it.
//!
//! It holds state only: it must not touch a socket, the loop or an exchange table.

use crate::app::{Assembled, Fetched, RelaySink};
use crate::error::Error;

/// A client request waiting on upstreams.
pub enum CallState {
    /// Parallel requests; the response is built when every result is in.
    Gather {
        /// Upstream connection per request while it runs.
        ups: Vec<Option<usize>>,
        /// Results as they arrive.
        results: Vec<Option<Fetched>>,
        /// Results still missing.
        waiting: usize,
        /// Builds the response.
        finish: Box<dyn FnOnce(Vec<Fetched>) -> Result<Assembled, Error>>,
    },
    /// One upstream stream relayed as it arrives.
    Relay {
        /// The upstream connection while it runs.
        up: Option<usize>,
        /// The app's side of the relay.
        sink: Box<dyn RelaySink>,
        /// The upstream's head has been passed to the sink.
        head_seen: bool,
        /// The client's head has been sent (failures become an error event).
        started: bool,
    },
}
