//! Connection deadlines in one min-heap, lazily invalidated.
//!
//! Each connection remembers the one deadline it has in the heap. Moving a
//! deadline later costs nothing (the old entry fires, finds the connection's
//! real deadline later, and is re-queued); moving it earlier pushes a new
//! entry. Stale entries (closed connections, older generations) are dropped
//! when popped. So each connection has at most a couple of live entries and
//! a request costs no heap operation in the common case.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::token::Tok;

/// The heap of (deadline, whose: a client or an upstream connection, generation).
#[derive(Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Tok, u32)>>,
}

impl Timers {
    /// Queue a deadline.
    pub fn push(&mut self, at: Instant, token: Tok, generation: u32) {
        self.heap.push(Reverse((at, token, generation)));
    }

    /// The earliest queued deadline.
    pub fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Pop one entry due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, Tok, u32)> {
        match self.heap.peek() {
            Some(Reverse((at, _, _))) if *at <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }
}
