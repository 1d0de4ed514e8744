//! WebSocket rooms over the bus: the payload of a [`super::Topic::Room`] message
//! ([`RoomMessage`]: written by the worker of the member that sends, read by every worker)
//! and one worker's table of who is in which room ([`Rooms`]), so a room message goes to
//! exactly the local members of its room.
//!
//! It keeps names and exchange ids only: it must not touch a socket or a member's state
//! (the worker sends the frames and drops a member that stopped reading).

use std::collections::HashMap;

use serde_json::Value;

use crate::http::exchange::ExchangeId;

/// One worker's WebSocket rooms: room → its members here.
#[derive(Default)]
pub struct Rooms {
    members: HashMap<String, Vec<ExchangeId>>,
}

impl Rooms {
    /// Exchange `id` joins `room`; `false` if it was a member already.
    pub fn join(&mut self, room: &str, id: ExchangeId) -> bool {
        let list = self.members.entry(room.to_owned()).or_default();
        if list.contains(&id) {
            return false;
        }
        list.push(id);
        true
    }

    /// Exchange `id` leaves `room`; `false` if it was not a member. An empty room is
    /// forgotten.
    pub fn leave(&mut self, room: &str, id: ExchangeId) -> bool {
        let Some(list) = self.members.get_mut(room) else { return false };
        let Some(pos) = list.iter().position(|&m| m == id) else { return false };
        list.swap_remove(pos);
        if list.is_empty() {
            self.members.remove(room);
            // Give the table's memory back once most of its rooms are gone.
            if self.members.capacity() > 64 && self.members.len() * 4 < self.members.capacity() {
                self.members.shrink_to(self.members.len() * 2);
            }
        }
        true
    }

    /// The members of `room` here, if it has any.
    pub fn members(&self, room: &str) -> Option<&[ExchangeId]> {
        self.members.get(room).map(Vec::as_slice)
    }
}

/// A room message as the bus carries it: JSON `{"room", "skipUser", "message"}`.
pub struct RoomMessage(Value);

impl RoomMessage {
    /// The payload for `message` to `room`; `skip_user`: that user's members do not get it.
    pub fn encode(room: &str, message: &str, skip_user: Option<i64>) -> Vec<u8> {
        let payload = serde_json::json!({"room": room, "skipUser": skip_user, "message": message});
        serde_json::to_vec(&payload).unwrap_or_default()
    }

    /// Read a payload; `None` unless its room and message are strings.
    pub fn decode(payload: &[u8]) -> Option<RoomMessage> {
        let v = serde_json::from_slice::<Value>(payload).ok()?;
        (v["room"].is_string() && v["message"].is_string()).then_some(RoomMessage(v))
    }

    /// The room.
    pub fn room(&self) -> &str {
        self.0["room"].as_str().unwrap_or_default()
    }

    /// The message's text.
    pub fn message(&self) -> &str {
        self.0["message"].as_str().unwrap_or_default()
    }

    /// The user whose members do not get it.
    pub fn skip_user(&self) -> Option<i64> {
        self.0["skipUser"].as_i64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_list_each_member_once_and_forget_empty_rooms() {
        let mut rooms = Rooms::default();
        let a = ExchangeId::H1 { conn: 1, gen: 1 };
        let b = ExchangeId::H2 { conn: 2, stream: 5, gen: 9 };
        assert!(rooms.join("r", a));
        assert!(!rooms.join("r", a), "already a member");
        assert!(rooms.join("r", b));
        assert_eq!(rooms.members("r"), Some(&[a, b][..]));
        assert!(rooms.leave("r", a));
        assert!(!rooms.leave("r", a), "not a member any more");
        assert!(!rooms.leave("nowhere", b));
        assert!(rooms.leave("r", b));
        assert_eq!(rooms.members("r"), None, "an empty room is dropped");
    }

    #[test]
    fn a_room_message_reads_back_as_written() {
        let m = RoomMessage::decode(&RoomMessage::encode("lobby", "hi \"all\"", Some(7))).expect("valid");
        assert_eq!((m.room(), m.message(), m.skip_user()), ("lobby", "hi \"all\"", Some(7)));
        let m = RoomMessage::decode(&RoomMessage::encode("lobby", "hi", None)).expect("valid");
        assert_eq!(m.skip_user(), None);
    }

    #[test]
    fn a_room_message_without_a_room_or_a_text_is_refused() {
        assert!(RoomMessage::decode(br#"{"message":"hi"}"#).is_none());
        assert!(RoomMessage::decode(br#"{"room":"r","message":3}"#).is_none());
        assert!(RoomMessage::decode(b"not json").is_none());
        let m = RoomMessage::decode(br#"{"room":"r","message":"m","skipUser":"7"}"#).expect("valid");
        assert_eq!(m.skip_user(), None, "a skipped user is a number");
    }
}
