//! What a client exchange waiting on upstreams holds ([`CallState`]): the upstream
//! connections its requests run on (indices into [`super::pool::Upstreams`]), a gather's
//! results so far, or a relay's sink. Every protocol's exchange keeps one; the worker fills
//! it as the connections' passes arrive and hands it back here when the exchange ends.
//!
//! It holds state only: it must not touch a socket, the loop or an exchange table.

use crate::error::Error;
use crate::http::reply::{Assembled, Fetched, RelaySink};

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

impl CallState {
    /// Request `slot` now runs on upstream connection `ui` (`None`: on none).
    pub fn set_up(&mut self, slot: usize, ui: Option<usize>) {
        match self {
            CallState::Gather { ups, .. } => {
                if let Some(s) = ups.get_mut(slot) {
                    *s = ui;
                }
            }
            CallState::Relay { up, .. } => *up = ui,
        }
    }

    /// Request `slot` moved from upstream connection `old` to `new` (`None`: to none); a
    /// slot on another connection stays.
    pub fn reown(&mut self, slot: usize, old: usize, new: Option<usize>) {
        match self {
            CallState::Gather { ups, .. } => {
                if let Some(s) = ups.get_mut(slot).filter(|s| **s == Some(old)) {
                    *s = new;
                }
            }
            CallState::Relay { up, .. } if *up == Some(old) => *up = new,
            CallState::Relay { .. } => {}
        }
    }

    /// A gather's request `slot` answered `result` (a second answer is ignored); whether
    /// every result is now in.
    pub fn fetched(&mut self, slot: usize, result: Fetched) -> bool {
        let CallState::Gather { ups, results, waiting, .. } = self else { return false };
        let Some(r) = results.get_mut(slot) else { return false };
        if r.is_some() {
            return false;
        }
        *r = Some(result);
        if let Some(u) = ups.get_mut(slot) {
            *u = None;
        }
        *waiting -= 1;
        *waiting == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::wire::ClientError;

    fn gather(ups: Vec<Option<usize>>) -> CallState {
        let n = ups.len();
        CallState::Gather {
            ups,
            results: (0..n).map(|_| None).collect(),
            waiting: n,
            finish: Box::new(|_| Err(Error::UpstreamTimeout)),
        }
    }

    fn ups(call: &CallState) -> &[Option<usize>] {
        match call {
            CallState::Gather { ups, .. } => ups,
            CallState::Relay { .. } => &[],
        }
    }

    #[test]
    fn reown_moves_only_a_request_on_the_old_connection() {
        let mut call = gather(vec![Some(4), Some(5)]);
        call.reown(0, 4, Some(9));
        call.reown(1, 4, Some(9));
        assert_eq!(ups(&call), [Some(9), Some(5)], "slot 1 runs on 5, not on 4");
        call.reown(0, 9, None);
        assert_eq!(ups(&call), [None, Some(5)]);
        call.reown(7, 5, None);
        assert_eq!(ups(&call), [None, Some(5)], "no slot 7");
    }

    #[test]
    fn a_gather_is_complete_with_its_last_result_and_ignores_a_second_answer() {
        let mut call = gather(vec![None, None]);
        call.set_up(0, Some(3));
        call.set_up(1, Some(4));
        assert!(!call.fetched(1, Ok((200, b"b".to_vec()))));
        assert!(!call.fetched(1, Err(ClientError::Timeout)), "slot 1 already answered");
        assert_eq!(ups(&call), [Some(3), None], "an answered request runs on no connection");
        assert!(call.fetched(0, Err(ClientError::Closed)));
        let CallState::Gather { results, waiting, .. } = call else { panic!("a gather") };
        assert_eq!(waiting, 0);
        assert!(matches!(results[1], Some(Ok((200, _)))), "the first answer kept");
    }
}
