//! Fan-out: who receives what. The per-worker registries of event-stream
//! subscribers and WebSocket members (by exchange, HTTP/1.1 connection or
//! HTTP/2 stream alike; a member's own state is `exchange/websocket.rs`'s, an event
//! stream's `exchange/produce.rs`'s), WebSocket rooms (their table and their bus
//! messages: `crate::bus::rooms`), and the
//! bus: publishing, receiving, and delivering a message to every local
//! subscriber with back pressure (a subscriber whose unsent output passes
//! `MAX_BACKLOG` is dropped rather than buffered without bound). Every
//! event stream is registered with its [`Audience`]; a change event goes only
//! to the streams whose audience may see it, never to the others.
//!
//! What the bytes mean comes from the app (`App::sse_*`, `App::ws_*`) behind
//! the panic guard; HTTP framing is the codecs'. This file
//! must not touch a socket (it queues output and asks for a flush) or know a
//! route.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::mux::ws_of;
use super::Worker;
use crate::bus::rooms::RoomMessage;
use crate::bus::{self, Topic};
use crate::exchange::panics::guard;
use crate::exchange::pool::ExchangeId;
use crate::exchange::Reset;
use crate::exchange::Todo;
use crate::exchange::MAX_BACKLOG;
use crate::proto::ws as wire;
use crate::resources::audience::Audience;

impl Worker {
    /// What a WebSocket message of exchange `id` asked for: join, leave, publish to a room.
    pub(super) fn ws_todo(&mut self, id: ExchangeId, t: Todo) {
        match t {
            Todo::Join(room) => {
                let max = self.config.websocket.max_rooms_per_connection;
                let app = &self.app;
                let Some((w, out, _)) = ws_of(&mut self.conns, id) else { return };
                if w.rooms.contains(&room) {
                    return;
                }
                if w.rooms.len() >= max {
                    w.conn.send_text(&app.ws_too_many_rooms(max), out);
                    self.wake(id);
                    return;
                }
                if self.rooms.join(&room, id) {
                    w.rooms.push(room);
                    self.svc.stats.members.fetch_add(1, Relaxed);
                }
            }
            Todo::Leave(room) => {
                let Some((w, _, _)) = ws_of(&mut self.conns, id) else { return };
                if self.rooms.leave(&room, id) {
                    w.rooms.retain(|r| *r != room);
                    self.svc.stats.members.fetch_sub(1, Relaxed);
                }
            }
            Todo::Room { room, message, skip_user } => {
                // Sending joins first; a join refused (over the cap) sends nothing.
                let member = ws_of(&mut self.conns, id).is_some_and(|(w, _, _)| w.rooms.contains(&room));
                if !member {
                    return;
                }
                self.publish(Topic::Room, &RoomMessage::encode(&room, &message, skip_user));
            }
        }
    }

    /// Deliver a room message to this worker's members of the room. The
    /// frame is encoded once (server frames are unmasked: every member gets
    /// the same bytes; [`Worker::exchange_frame`] sends it).
    fn deliver_room(&mut self, payload: &[u8]) {
        let Some(msg) = RoomMessage::decode(payload) else { return };
        let (message, skip) = (msg.message(), msg.skip_user());
        let Some(list) = self.rooms.members(msg.room()) else { return };
        // Members may leave while it runs (a dropped one): walk a copy, kept between messages.
        let mut members = std::mem::take(&mut self.room_members);
        members.clear();
        members.extend_from_slice(list);
        let mut frame = std::mem::take(&mut self.room_frame);
        frame.clear();
        wire::text_frame(&mut frame, message);
        for &id in &members {
            let Some((w, _, backlog)) = ws_of(&mut self.conns, id) else { continue };
            if skip.is_some() && w.peer.user_id == skip {
                continue;
            }
            if backlog > MAX_BACKLOG {
                log::warn!("WebSocket member is not reading; dropping it");
                self.exchange_drop(id, Reset::Cancel);
                continue;
            }
            if !w.conn.is_open() {
                continue;
            }
            self.exchange_frame(id, &frame);
        }
        self.room_frame = frame;
        self.room_members = members;
    }

    /// Publish on the bus: local subscribers now, the other workers through the supervisor.
    pub(super) fn publish(&mut self, topic: Topic, payload: &[u8]) {
        self.bus_seq += 1;
        self.bus.send(bus::encode(topic, std::process::id(), self.bus_seq, payload));
        self.deliver(topic, payload);
    }

    /// The bus socket is readable or writable.
    pub(super) fn on_bus(&mut self) {
        self.bus.flush();
        loop {
            let n = match self.bus.recv(&mut self.scratch) {
                Ok(Some(n)) => n,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("bus: {e}");
                    return;
                }
            };
            let Some(msg) = bus::decode(&self.scratch[..n]) else { continue };
            let (topic, payload) = (msg.topic, msg.payload.to_vec());
            self.deliver(topic, &payload);
        }
    }

    /// Hand a bus message to this worker's subscribers.
    fn deliver(&mut self, topic: Topic, payload: &[u8]) {
        match topic {
            Topic::Notification => {
                let app = &self.app;
                let Ok(rendered) = guard("SSE notification", || app.sse_notification(payload)) else {
                    self.abort_event_streams();
                    return;
                };
                let Some((id, event)) = rendered else { return };
                self.send_event(id, &event.into(), |_| true);
            }
            Topic::Change => {
                let app = &self.app;
                let Ok(rendered) = guard("SSE change", || app.sse_change(payload)) else {
                    self.abort_event_streams();
                    return;
                };
                let Some(change) = rendered else { return };
                // Only the streams whose caller may read the record, of the resources they asked for.
                let registry = &self.config.resources;
                let sees = |audience: &Audience| audience.sees(registry, change.resource, change.owner_id);
                self.send_event(change.id, &change.event.into(), sees);
            }
            Topic::Room => self.deliver_room(payload),
            // For other hosts: this worker already shares the cache it was written to.
            Topic::Cache => {}
        }
    }

    /// An event could not be rendered, so none of this worker's streams can have it: each
    /// ends (cleanly), and its client reconnects with `Last-Event-ID` and gets the event from
    /// the store's replay.
    fn abort_event_streams(&mut self) {
        let subscribers: Vec<ExchangeId> = self.sse.keys().copied().collect();
        for id in subscribers {
            self.exchange_abort(id);
        }
    }

    /// Send event `id` (rendered once; each subscriber's codec frames it) to the event
    /// streams whose audience `sees` it. They are listed first (in a list kept between
    /// events): a stream may end while it runs.
    fn send_event(&mut self, id: i64, event: &Arc<[u8]>, sees: impl Fn(&Audience) -> bool) {
        let mut targets = std::mem::take(&mut self.sse_targets);
        targets.clear();
        targets.extend(self.sse.iter().filter(|(_, audience)| sees(audience)).map(|(sub, _)| *sub));
        for &sub in &targets {
            self.exchange_event(sub, id, event);
        }
        self.sse_targets = targets;
    }
}
