//! Relays: an exchange answered by one upstream stream forwarded as it arrives
//! (`Upstream::Relay`), seated in the loop. What the app's relay sink makes of each pass on
//! the upstream connection (events, the client's head with the first ones, how the stream
//! ends) is `crate::exchange::relay`'s; this file sends it: the head answers the exchange,
//! the events follow as its body, and the upstream is read only while the client keeps up
//! (paused while the exchange is behind its client, resumed by its drain). A relay that
//! fails before its head is answered with the sink's error response, after it with the
//! sink's failure event and the end of the body; app code that panics is answered 500, or
//! cuts the body short.
//!
//! The upstream connections are `crate::upstream::pool`'s, seated in the loop by
//! `upstream.rs`; the exchange is reached through `mux.rs`. This file must not touch a
//! socket or frame a body.

use super::mux::call_of;
use super::upstream::up_loop;
use super::Worker;
use crate::error::Error;
use crate::exchange::panics::{guard, Panicked};
use crate::exchange::pool::ExchangeId;
use crate::exchange::relay::{feed, Fed};
use crate::exchange::CallState;
use crate::exchange::Reset;
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
