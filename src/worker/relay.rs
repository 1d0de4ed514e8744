//! Relays: an exchange answered by one upstream stream forwarded as it arrives
//! (`Upstream::Relay`). The app's relay sink turns the upstream's head and body into the
//! client's response and events; the first events send the client's head, the rest follow
//! as its body, and the upstream is read only while the client keeps up (paused while the
//! exchange is behind its client, resumed by its drain). A relay that fails before its head
//! is answered with the sink's error response, after it with the sink's failure event and
//! the end of the body; app code that panics is answered 500, or cuts the body short.
//!
//! The upstream connections are `crate::upstream::pool`'s, seated in the loop by
//! `upstream.rs`; the exchange is reached through `mux.rs`. This file must not touch a
//! socket or frame a body.

use super::mux::call_of;
use super::upstream::up_loop;
use super::Worker;
use crate::app::RelaySink;
use crate::error::Error;
use crate::exchange::panics::{guard, Panicked};
use crate::exchange::pool::ExchangeId;
use crate::exchange::CallState;
use crate::exchange::Reset;
use crate::http::response::Response;
use crate::upstream::conn::{client_error, Owner, Step};
use crate::upstream::wire::{Head, Outbound};

/// What a relay's sink made of one pass on its upstream connection ([`feed`]).
struct Fed {
    /// Events for the client, in order.
    events: Vec<u8>,
    /// `Ok(true)`: the relay is complete; `Ok(false)`: more follows; `Err`: it failed.
    outcome: Result<bool, Error>,
    /// The client's response head, to send before these events: with a relay's first
    /// events only.
    head: Option<Response>,
}

/// Pass what an upstream connection read (`up`: its head, and its body so far, which is
/// taken) and how its pass ended (`step`) to a relay's `sink`. `head_seen` (the sink has
/// the upstream's head) and `started` (the client's head is out) are the relay's; the sink
/// sees the upstream's head once, and its response goes out with the first events. App code
/// that panics is the [`Panicked`] returned, and the relay's state says how far it got.
fn feed(
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

impl Worker {
    /// Start exchange `id`'s relay of `request` (its call slot holds the relay's state).
    pub(super) fn start_relay(&mut self, id: ExchangeId, request: &Outbound) {
        let owner = Owner { id, slot: 0 };
        match self.up.start(owner, request, up_loop!(self)) {
            Ok(ui) => {
                if let Some(Some(CallState::Relay { up, .. })) = call_of(&mut self.conns, &mut self.h3, id) {
                    *up = Some(ui);
                }
                self.up_ready(ui);
            }
            Err(e) => self.relay_failed(id, client_error(&e)),
        }
    }

    /// Relay progress: pass the head and body to the sink, write its events.
    pub(super) fn relay_step(&mut self, owner: Owner, ui: Option<usize>, step: Step) {
        let id = owner.id;
        let Some(Some(CallState::Relay { sink, head_seen, started, .. })) = call_of(&mut self.conns, &mut self.h3, id)
        else {
            return;
        };
        let up = ui.and_then(|ui| self.up.get_mut(ui)).map(|u| (u.reader.head(), &mut u.body));
        let Fed { events, outcome, head } = match feed(sink.as_mut(), head_seen, started, up, step) {
            Ok(fed) => fed,
            Err(p) => return self.relay_panicked(id, p),
        };
        if let Some(resp) = head {
            if !self.exchange_respond(id, resp, true) {
                // `HEAD`: the head went out and the exchange is over; its upstream is not
                // needed any more.
                if let Some(call) = call_of(&mut self.conns, &mut self.h3, id).and_then(Option::take) {
                    self.cancel_call(id, call);
                }
                return;
            }
        }
        match outcome {
            Err(e) => {
                if let Some(ui) = ui {
                    log::warn!("relay upstream: {e:?}");
                    self.up.close(ui, up_loop!(self));
                }
                self.exchange_relay_data(id, &events);
                self.relay_failed(id, e);
            }
            Ok(true) => {
                if let Some(ui) = ui {
                    self.up.release(ui, up_loop!(self));
                }
                self.exchange_relay_data(id, &events);
                self.exchange_relay_done(id);
            }
            Ok(false) => {
                self.exchange_relay_data(id, &events);
                // Behind its client, the upstream pauses; the client's drain resumes it
                // (`relay_resume`).
                let Some(slow) = self.exchange_relay_slow(id) else {
                    if let Some(ui) = ui {
                        self.up.close(ui, up_loop!(self));
                    }
                    return;
                };
                if let Some(ui) = ui {
                    self.up.pause(ui, slow, up_loop!(self));
                }
            }
        }
    }

    /// A relay failed: an error response if nothing was sent yet, else an
    /// error event and the end of the stream.
    fn relay_failed(&mut self, id: ExchangeId, e: Error) {
        let Some(call) = call_of(&mut self.conns, &mut self.h3, id) else { return };
        let Some(CallState::Relay { mut sink, started, up, .. }) = call.take() else { return };
        if let Some(ui) = up {
            self.up.close(ui, up_loop!(self));
        }
        if !started {
            let dev = self.env.development;
            let resp = guard("relay sink error", || sink.error(e)).unwrap_or_else(|p| p.into_response(dev));
            self.exchange_respond(id, resp, false);
            return;
        }
        let mut events = Vec::new();
        if guard("relay sink failure event", || sink.failed(&e, &mut events)).is_err() {
            self.exchange_drop(id, Reset::Internal);
            return;
        }
        self.exchange_relay_data(id, &events);
        self.exchange_relay_done(id);
    }

    /// The relay's sink panicked: a 500 if the client's head has not gone out
    /// yet, else the stream is cut short. The upstream connection is closed.
    fn relay_panicked(&mut self, id: ExchangeId, p: Panicked) {
        let Some(call) = call_of(&mut self.conns, &mut self.h3, id) else { return };
        let started = matches!(call, Some(CallState::Relay { started: true, .. }));
        if started {
            self.exchange_drop(id, Reset::Internal);
            return;
        }
        if let Some(call) = call.take() {
            self.cancel_call(id, call);
        }
        let resp = p.into_response(self.env.development);
        self.exchange_respond(id, resp, false);
    }

    /// The client of a relay drained its output: read the upstream again.
    pub(super) fn relay_resume(&mut self, id: ExchangeId) {
        let Some(Some(CallState::Relay { up: Some(ui), .. })) = call_of(&mut self.conns, &mut self.h3, id) else {
            return;
        };
        let ui = *ui;
        if !self.up.paused(ui) {
            return;
        }
        // Still behind: the drain that follows resumes the upstream.
        if self.exchange_relay_slow(id).unwrap_or(false) {
            return;
        }
        if self.up.unpause(ui) {
            self.up_ready(ui);
        }
    }
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
