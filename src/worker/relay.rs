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

use super::exchange::CallState;
use super::exchange::Reset;
use super::mux::call_of;
use super::panics::{guard, Panicked};
use super::pool::ExchangeId;
use super::upstream::up_loop;
use super::Worker;
use crate::error::Error;
use crate::upstream::conn::{client_error, Owner, Step};
use crate::upstream::wire::Outbound;

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
        let up = ui.and_then(|ui| self.up.get_mut(ui));
        let mut events = Vec::new();
        let mut outcome: Result<bool, Error> = Ok(false);
        if let Some(u) = up {
            if !*head_seen {
                if let Some(h) = u.reader.head() {
                    *head_seen = true;
                    match guard("relay sink head", || sink.head(h.status, h.content_type.as_deref())) {
                        Ok(r) => outcome = r.map(|()| false),
                        Err(p) => return self.relay_panicked(id, p),
                    }
                }
            }
            if outcome.is_ok() && !u.body.is_empty() {
                match guard("relay sink body", || sink.body(&u.body, &mut events)) {
                    Ok(r) => outcome = r,
                    Err(p) => return self.relay_panicked(id, p),
                }
                u.body.clear();
            }
        }
        let outcome = match (outcome, step) {
            (Err(e), _) => Err(e),
            (Ok(true), _) => Ok(true),
            (Ok(false), Step::Failed(e)) => Err(client_error(&e)),
            (Ok(false), Step::Done) => sink.ended(&mut events).map(|()| true),
            (Ok(false), Step::Pending) => Ok(false),
        };
        if !events.is_empty() && !*started {
            let resp = match guard("relay sink response", || sink.response()) {
                Ok(resp) => resp,
                Err(p) => return self.relay_panicked(id, p),
            };
            *started = true;
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
