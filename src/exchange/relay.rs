//! What a relay's sink makes of its upstream (`Upstream::Relay`: one upstream stream
//! forwarded to the client as it arrives): [`feed`] hands the sink the upstream's head once
//! and its body as it comes, asks it how the stream ends, and takes the client's response
//! head with the first events. The sink is app code: it runs behind the panic boundary, and
//! a panic is a value ([`Panicked`]) the caller answers with.
//!
//! The upstream connections and the relay's place in the loop (reading, pausing while the
//! client is behind, resuming) are the caller's; this file must not touch a socket, an
//! upstream connection or an exchange table.

use super::panics::{guard, Panicked};
use crate::error::Error;
use crate::http::reply::RelaySink;
use crate::http::response::Response;
use crate::upstream::conn::{client_error, Step};
use crate::upstream::wire::Head;

/// What a relay's sink made of one pass on its upstream connection ([`feed`]).
pub(crate) struct Fed {
    /// Events for the client, in order.
    pub(crate) events: Vec<u8>,
    /// `Ok(true)`: the relay is complete; `Ok(false)`: more follows; `Err`: it failed.
    pub(crate) outcome: Result<bool, Error>,
    /// The client's response head, to send before these events: with a relay's first
    /// events only.
    pub(crate) head: Option<Response>,
}

/// Pass what an upstream connection read (`up`: its head, and its body so far, which is
/// taken) and how its pass ended (`step`) to a relay's `sink`. `head_seen` (the sink has
/// the upstream's head) and `started` (the client's head is out) are the relay's; the sink
/// sees the upstream's head once, and its response goes out with the first events. App code
/// that panics is the [`Panicked`] returned, and the relay's state says how far it got.
pub(crate) fn feed(
    sink: &mut dyn RelaySink,
    head_seen: &mut bool,
    started: &mut bool,
    up: Option<(Option<&Head>, &mut Vec<u8>)>,
    step: Step,
) -> Result<Fed, Panicked> {
    let mut events = Vec::new();
    let mut outcome: Result<bool, Error> = Ok(false);
    if let Some((head, body)) = up {
        if !*head_seen {
            if let Some(h) = head {
                *head_seen = true;
                outcome = guard("relay sink head", || sink.head(h.status, h.content_type.as_deref()))?.map(|()| false);
            }
        }
        if outcome.is_ok() && !body.is_empty() {
            outcome = guard("relay sink body", || sink.body(body, &mut events))?;
            body.clear();
        }
    }
    let outcome = match (outcome, step) {
        (Err(e), _) => Err(e),
        (Ok(true), _) => Ok(true),
        (Ok(false), Step::Failed(e)) => Err(client_error(&e)),
        (Ok(false), Step::Done) => sink.ended(&mut events).map(|()| true),
        (Ok(false), Step::Pending) => Ok(false),
    };
    let mut head = None;
    if !events.is_empty() && !*started {
        head = Some(guard("relay sink response", || sink.response())?);
        *started = true;
    }
    Ok(Fed { events, outcome, head })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::wire::ClientError;

    /// A sink that frames each body piece as `<piece>;`, is complete after a piece ending in
    /// `.`, refuses a 5xx head and panics on a body when `boom`.
    #[derive(Default)]
    struct Probe {
        heads: Vec<u16>,
        ended: bool,
        boom: bool,
    }

    impl RelaySink for Probe {
        fn head(&mut self, status: u16, _: Option<&str>) -> Result<(), Error> {
            self.heads.push(status);
            if status >= 500 {
                return Err(Error::UpstreamUnavailable("refused".into()));
            }
            Ok(())
        }

        fn body(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
            assert!(!self.boom, "sink boom");
            out.extend_from_slice(bytes);
            out.push(b';');
            Ok(bytes.ends_with(b"."))
        }

        fn ended(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
            self.ended = true;
            out.extend_from_slice(b"end;");
            Ok(())
        }

        fn response(&mut self) -> Response {
            Response::new(200)
        }

        fn failed(&mut self, _: &Error, out: &mut Vec<u8>) {
            out.extend_from_slice(b"failed;");
        }
    }

    fn head(status: u16) -> Head {
        Head { status, keep_alive: true, content_type: Some("text/event-stream".into()) }
    }

    /// A relay's sink and state, fed passes.
    #[derive(Default)]
    struct Relay {
        sink: Probe,
        head_seen: bool,
        started: bool,
    }

    impl Relay {
        fn feed(&mut self, up: Option<(Option<&Head>, &mut Vec<u8>)>, step: Step) -> Fed {
            match feed(&mut self.sink, &mut self.head_seen, &mut self.started, up, step) {
                Ok(fed) => fed,
                Err(p) => panic!("the sink panicked: {p:?}"),
            }
        }
    }

    #[test]
    fn the_sink_sees_the_head_once_and_the_clients_head_goes_with_the_first_events() {
        let mut relay = Relay::default();
        let h = head(200);
        let mut body = Vec::new();
        let fed = relay.feed(Some((Some(&h), &mut body)), Step::Pending);
        assert!(fed.events.is_empty() && fed.head.is_none(), "no events yet: no client head");
        assert!(relay.head_seen && !relay.started);
        body.extend_from_slice(b"a");
        let fed = relay.feed(Some((Some(&h), &mut body)), Step::Pending);
        assert_eq!(fed.events, b"a;");
        assert!(fed.head.is_some_and(|r| r.status == 200));
        assert!(matches!(fed.outcome, Ok(false)));
        assert!(body.is_empty(), "the body handed on is taken");
        body.extend_from_slice(b"b.");
        let fed = relay.feed(Some((Some(&h), &mut body)), Step::Pending);
        assert_eq!(fed.events, b"b.;");
        assert!(fed.head.is_none(), "the client's head went out once");
        assert!(matches!(fed.outcome, Ok(true)), "the sink said the stream is complete");
        assert_eq!(relay.sink.heads, [200]);
    }

    #[test]
    fn a_clean_upstream_end_asks_the_sink_how_the_stream_ends() {
        let mut relay = Relay::default();
        let fed = relay.feed(Some((Some(&head(200)), &mut b"x".to_vec())), Step::Done);
        assert!(relay.sink.ended);
        assert_eq!(fed.events, b"x;end;");
        assert!(matches!(fed.outcome, Ok(true)));
        assert!(fed.head.is_some());
    }

    #[test]
    fn an_upstream_failure_fails_the_relay_with_the_clients_error() {
        let mut relay = Relay::default();
        let fed = relay.feed(None, Step::Failed(ClientError::Timeout));
        assert!(matches!(fed.outcome, Err(Error::UpstreamTimeout)));
        assert!(fed.events.is_empty() && fed.head.is_none() && !relay.started);
    }

    #[test]
    fn a_head_the_sink_refuses_fails_the_relay_before_any_body() {
        let mut relay = Relay::default();
        let mut body = b"x".to_vec();
        let fed = relay.feed(Some((Some(&head(502)), &mut body)), Step::Done);
        assert!(matches!(fed.outcome, Err(Error::UpstreamUnavailable(_))));
        assert_eq!(body, b"x", "the body never reached the sink");
        assert!(!relay.sink.ended, "nor did its end");
    }

    #[test]
    fn a_sink_that_panics_is_a_value_and_the_clients_head_not_started() {
        let mut relay = Relay { sink: Probe { boom: true, ..Probe::default() }, ..Relay::default() };
        let up = Some((Some(&head(200)), &mut b"x".to_vec()));
        let Err(p) = feed(&mut relay.sink, &mut relay.head_seen, &mut relay.started, up, Step::Pending) else {
            panic!("the panic was not caught");
        };
        assert_eq!(p.what, "relay sink body");
        assert!(relay.head_seen && !relay.started);
    }
}
