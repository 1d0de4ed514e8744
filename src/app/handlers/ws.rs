//! WebSocket endpoints and chat-room semantics (CONTRACT §7).
//!
//! `GET /ws?token=…` is let in after the token (401) and the `Origin` (403)
//! are checked, so nothing unauthenticated ever speaks WebSocket;
//! `/ws/echo` (only with `websocket.echo = true`) is the conformance target.
//! The handlers only authenticate: the handshake (HTTP/1.1 upgrade or HTTP/2
//! extended CONNECT) is each codec's to check, and the framing is
//! `crate::proto`'s. What a socket says first ([`greeting`]) and what a client
//! message asks for ([`on_message`]: an echo, or chat as an [`Action`]) are
//! decided here; the worker does the delivery (local members, other workers
//! through the bus).

use crate::app::router::Router;
use crate::app::{cors, session, validate, App, Ctx, Handler, Reply, WebSocket};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::proto::Message;

/// Register `/ws` and, when enabled, `/ws/echo`.
pub fn routes(r: &mut Router<Handler>, echo_enabled: bool) {
    r.add(Method::Get, "/ws", chat);
    if echo_enabled {
        r.add(Method::Get, "/ws/echo", echo);
    }
}

fn chat(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    cors::check_origin_always(app.svc.config, req)?;
    let token = req
        .query_param("token")
        .and_then(validate::decode_query)
        .filter(|t| !t.is_empty())
        .ok_or(Error::Unauthorized("token required"))?;
    // The revocations this host knows of are checked too; the store is not asked (the upgrade
    // answers on the loop), so a token revoked on another host speaks until it expires.
    let (caller, claims) = session::from_token(app, &token)?;
    Ok(Reply::websocket(WebSocket { user_id: Some(caller.user_id), name: claims.name }))
}

fn echo(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    cors::check_origin_always(app.svc.config, req)?;
    Ok(Reply::websocket(WebSocket { user_id: None, name: None }))
}

/// Longest room id, in bytes (UTF-8).
pub const MAX_ROOM_ID: usize = 128;

/// The error a join beyond `websocket.max_rooms_per_connection` gets.
pub fn too_many_rooms(max: usize) -> String {
    error_message(&format!("a connection may be in at most {max} rooms"))
}

/// What a client message asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Send the message back as it came (the echo endpoint).
    Echo,
    /// Answer the sender only (errors).
    Reply(String),
    /// Join a room.
    Join(String),
    /// Leave a room.
    Leave(String),
    /// Deliver `message` to every member of `room` (joining it first);
    /// `skip_sender`: not to the sender's own user (typing).
    Room {
        /// The room.
        room: String,
        /// The JSON text to deliver.
        message: String,
        /// Leave the sender's user out.
        skip_sender: bool,
    },
}

/// What `ws` says first: the chat's `connected` greeting; nothing on the echo endpoint.
pub fn greeting(ws: &WebSocket) -> Option<String> {
    ws.user_id.map(connected)
}

/// What message `m` on `ws` asks for: the echo endpoint echoes everything; the chat reads
/// text ([`on_text`]) and refuses binary. `debug`: as for [`on_text`].
pub fn on_message(ws: &WebSocket, m: &Message, debug: bool) -> Action {
    match (ws.user_id, m) {
        (None, _) => Action::Echo,
        (Some(_), Message::Binary(_)) => Action::Reply(error_message("binary messages are not supported")),
        (Some(id), Message::Text(text)) => on_text(Sender { id, name: ws.name.as_deref() }, text, debug),
    }
}

/// The `connected` greeting.
pub fn connected(user_id: i64) -> String {
    serde_json::json!({"type": "connected", "userId": user_id}).to_string()
}

/// An error message for the sender.
pub fn error_message(message: &str) -> String {
    serde_json::json!({"type": "error", "message": message}).to_string()
}

/// Who sent a message: `chat` and `typing` messages carry both (`from`, and
/// `name` when the sender's token had one).
#[derive(Clone, Copy, Debug)]
pub struct Sender<'a> {
    /// The user's id.
    pub id: i64,
    /// The user's display name.
    pub name: Option<&'a str>,
}

impl Sender<'_> {
    /// `{"type": kind, "roomId": room, "from": id, "name"?: name}`, to which a chat adds its fields.
    fn message(&self, kind: &str, room: &str) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("type".into(), kind.into());
        m.insert("roomId".into(), room.into());
        m.insert("from".into(), self.id.into());
        if let Some(name) = self.name {
            m.insert("name".into(), name.into());
        }
        m
    }
}

/// Interpret one text message from `sender`. `debug`: the debug routes are
/// on (then a message of type [`crate::app::debug::PANIC_WS`] panics, for the tests
/// of the worker's panic boundary).
pub fn on_text(sender: Sender<'_>, text: &str, debug: bool) -> Action {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Action::Reply(error_message("invalid JSON"));
    };
    let room = m.get("roomId").and_then(|v| v.as_str()).filter(|r| (1..=MAX_ROOM_ID).contains(&r.len()));
    let kind = m.get("type").and_then(|v| v.as_str()).unwrap_or("");
    if debug {
        crate::app::debug::ws_message(kind);
    }
    let Some(room) = room.map(str::to_owned) else {
        return Action::Reply(error_message(match kind {
            "join" | "leave" | "chat" | "typing" => "roomId must be a string of 1 to 128 bytes",
            _ => "unknown message type",
        }));
    };
    match kind {
        "join" => Action::Join(room),
        "leave" => Action::Leave(room),
        "chat" => match m.get("content").and_then(|v| v.as_str()) {
            Some(content) => {
                let ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0);
                let mut m = sender.message("chat", &room);
                m.insert("content".into(), content.into());
                m.insert("timestamp".into(), ms.into());
                let message = serde_json::Value::Object(m).to_string();
                Action::Room { room, message, skip_sender: false }
            }
            None => Action::Reply(error_message("content must be a string")),
        },
        "typing" => {
            let message = serde_json::Value::Object(sender.message("typing", &room)).to_string();
            Action::Room { room, message, skip_sender: true }
        }
        _ => Action::Reply(error_message("unknown message type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender without a name (a token issued without one).
    fn id(id: i64) -> Sender<'static> {
        Sender { id, name: None }
    }

    #[test]
    fn the_echo_endpoint_echoes_and_the_chat_reads_text() {
        let echo = WebSocket { user_id: None, name: None };
        let chat = WebSocket { user_id: Some(7), name: Some("Ann".into()) };
        let join = Message::Text(r#"{"type":"join","roomId":"r"}"#.into());
        let binary = Message::Binary(b"\x00\x01".to_vec());
        assert_eq!(greeting(&echo), None);
        assert_eq!(greeting(&chat), Some(connected(7)));
        assert_eq!(on_message(&echo, &join, false), Action::Echo);
        assert_eq!(on_message(&echo, &binary, false), Action::Echo);
        assert_eq!(on_message(&chat, &join, false), Action::Join("r".into()));
        assert_eq!(
            on_message(&chat, &binary, false),
            Action::Reply(error_message("binary messages are not supported"))
        );
        let typing = Message::Text(r#"{"type":"typing","roomId":"r"}"#.into());
        match on_message(&chat, &typing, false) {
            Action::Room { message, skip_sender: true, .. } => {
                let v: serde_json::Value = serde_json::from_str(&message).expect("json");
                assert_eq!((v["from"].as_i64(), v["name"].as_str()), (Some(7), Some("Ann")), "{v}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn messages() {
        assert_eq!(on_text(id(1), r#"{"type":"join","roomId":"r"}"#, false), Action::Join("r".into()));
        assert_eq!(on_text(id(1), r#"{"type":"leave","roomId":"r"}"#, false), Action::Leave("r".into()));
        match on_text(id(7), r#"{"type":"chat","roomId":"r","content":"hi"}"#, false) {
            Action::Room { room, message, skip_sender: false } => {
                assert_eq!(room, "r");
                let v: serde_json::Value = serde_json::from_str(&message).expect("json");
                assert_eq!(
                    (v["type"].as_str(), v["from"].as_i64(), v["content"].as_str()),
                    (Some("chat"), Some(7), Some("hi"))
                );
                assert!(v["timestamp"].as_u64().is_some());
                assert!(v.get("name").is_none(), "no name without one: {v}");
            }
            other => panic!("{other:?}"),
        }
        // With a name, chat and typing carry it next to `from`.
        let ann = Sender { id: 7, name: Some("Ann \"A\" <b>") };
        for (text, skip) in
            [(r#"{"type":"chat","roomId":"r","content":"hi"}"#, false), (r#"{"type":"typing","roomId":"r"}"#, true)]
        {
            match on_text(ann, text, false) {
                Action::Room { message, skip_sender, .. } => {
                    assert_eq!(skip_sender, skip);
                    let v: serde_json::Value = serde_json::from_str(&message).expect("json");
                    assert_eq!((v["from"].as_i64(), v["name"].as_str()), (Some(7), Some("Ann \"A\" <b>")), "{v}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            on_text(id(7), r#"{"type":"typing","roomId":"r"}"#, false),
            Action::Room { skip_sender: true, .. }
        ));
        for bad in
            ["nope", "[]", r#"{"type":"dance","roomId":"r"}"#, r#"{"type":"chat","roomId":"r"}"#, r#"{"type":"join"}"#]
        {
            assert!(matches!(on_text(id(1), bad, false), Action::Reply(_)), "{bad}");
        }
    }

    #[test]
    fn the_debug_panic_message_is_ordinary_without_debug_routes() {
        let msg = r#"{"type":"__debug_panic"}"#;
        assert_eq!(on_text(id(1), msg, false), Action::Reply(error_message("unknown message type")));
        assert!(std::panic::catch_unwind(|| on_text(id(1), msg, true)).is_err());
        assert!(matches!(on_text(id(1), r#"{"type":"join","roomId":"r"}"#, true), Action::Join(_)));
    }

    #[test]
    fn room_ids_are_1_to_128_bytes() {
        let join = |room: &str| on_text(id(1), &serde_json::json!({"type": "join", "roomId": room}).to_string(), false);
        for ok in ["r".repeat(128), "€".repeat(42), "x".to_string()] {
            assert_eq!(join(&ok), Action::Join(ok.clone()), "{} bytes", ok.len());
        }
        // 43 characters, 129 bytes: the limit is in bytes.
        for bad in ["r".repeat(129), "€".repeat(43), String::new()] {
            assert!(matches!(join(&bad), Action::Reply(_)), "{} bytes", bad.len());
            let chat = serde_json::json!({"type": "chat", "roomId": bad, "content": "x"}).to_string();
            assert!(matches!(on_text(id(1), &chat, false), Action::Reply(_)), "chat, {} bytes", bad.len());
        }
    }
}
