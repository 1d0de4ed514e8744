//! One WebSocket exchange's state ([`Ws`]: the codec, the user, its rooms, pings) and how its
//! messages become replies and room work ([`Todo`]), over HTTP/1.1 (after a `101`) and HTTP/2
//! (an extended CONNECT) alike.
//!
//! What a message means (an echo, a reply, room work) comes from the app (`App::ws_message`)
//! behind the panic guard; this is the one place the worker turns it into output and
//! [`Todo`]s. This file must not touch a socket, a connection or the room registry
//! (`fanout.rs` does).

use std::time::{Duration, Instant};

use super::panics::guard;
use crate::app::{WebSocket, WsAction as Action};
use crate::proto::ws::{Event, Message, WsConn};

/// How often an idle WebSocket is pinged; a peer that has not answered the
/// previous ping by the next one is dropped.
pub(crate) const WS_PING_EVERY: Duration = Duration::from_secs(30);

/// State of one WebSocket.
pub struct Ws {
    pub(crate) conn: WsConn,
    /// Who the handler let in (the user; none on the echo endpoint).
    pub(crate) peer: WebSocket,
    /// Rooms this client is in.
    pub(crate) rooms: Vec<String>,
    pub(crate) next_ping: Instant,
    pub(crate) awaiting_pong: bool,
}

impl Ws {
    /// The WebSocket of `peer`, pinged from `now`.
    pub(crate) fn new(conn: WsConn, peer: WebSocket, now: Instant) -> Ws {
        Ws { conn, peer, rooms: Vec::new(), next_ping: now + WS_PING_EVERY, awaiting_pong: false }
    }

    /// The WebSocket of `peer` opened, on every protocol: the app's greeting (if any) goes
    /// into `out`. If app code panicked, its close (1011) goes there instead and the second
    /// value is `false`: the caller ends the exchange.
    pub(crate) fn open(
        app: &crate::app::App,
        peer: WebSocket,
        max_message: usize,
        out: &mut Vec<u8>,
        now: Instant,
    ) -> (Ws, bool) {
        let mut conn = WsConn::new(max_message);
        let greeted = match guard("WebSocket greeting", || app.ws_greeting(&peer)) {
            Ok(Some(hello)) => {
                conn.send_text(&hello, out);
                true
            }
            Ok(None) => true,
            Err(_) => {
                conn.close(1011, "internal error", out);
                false
            }
        };
        (Ws::new(conn, peer, now), greeted)
    }

    /// The ping timer fired at `now`. A peer that has not answered the last ping gets a
    /// close (1001) in `out` and `false` back: the caller ends the exchange once it is
    /// flushed. Otherwise a ping goes into `out`, unless the exchange is `backed_up` (a
    /// ping would only queue behind what the peer is not reading).
    pub(crate) fn heartbeat(&mut self, now: Instant, backed_up: bool, out: &mut Vec<u8>) -> bool {
        self.next_ping = now + WS_PING_EVERY;
        if self.awaiting_pong {
            log::debug!("WebSocket peer stopped answering pings; dropping it");
            self.conn.close(1001, "ping timeout", out);
            return false;
        }
        if !backed_up {
            self.conn.ping(b"", out);
            self.awaiting_pong = true;
        }
        true
    }

    /// Read `input` (complete messages only; returns the bytes used): control
    /// frames are answered into `out`, and each message does what the app says:
    /// echoed, answered (into `out`), or turned into [`Todo`]s. `Err` if app code
    /// panicked (what came before it stands). `closed`: the peer's close arrived.
    pub(crate) fn read(
        &mut self,
        app: &crate::app::App,
        input: &[u8],
        out: &mut Vec<u8>,
        todo: &mut Vec<Todo>,
        closed: &mut bool,
    ) -> Result<usize, ()> {
        let mut events = Vec::new();
        let mut at = 0;
        while at < input.len() {
            let used = self.conn.read(&input[at..], out, &mut events);
            at += used;
            for ev in events.drain(..) {
                let m = match ev {
                    Event::Closed { .. } => {
                        *closed = true;
                        continue;
                    }
                    Event::Message(m) => m,
                };
                let peer = &self.peer;
                let action = guard("WebSocket message", || app.ws_message(peer, &m));
                let uid = self.peer.user_id;
                match action {
                    Ok(Action::Echo) => match m {
                        Message::Text(t) => self.conn.send_text(&t, out),
                        Message::Binary(b) => self.conn.send_binary(&b, out),
                    },
                    Ok(Action::Reply(r)) => self.conn.send_text(&r, out),
                    Ok(Action::Join(room)) => todo.push(Todo::Join(room)),
                    Ok(Action::Leave(room)) => todo.push(Todo::Leave(room)),
                    Ok(Action::Room { room, message, skip_sender }) => {
                        todo.push(Todo::Join(room.clone()));
                        todo.push(Todo::Room { room, message, skip_user: uid.filter(|_| skip_sender) });
                    }
                    Err(_) => return Err(()),
                }
            }
            if used == 0 {
                break;
            }
        }
        if self.conn.take_pong() {
            self.awaiting_pong = false;
        }
        Ok(at)
    }
}

/// Work a WebSocket message asks for, done once the connection is released.
pub(crate) enum Todo {
    Join(String),
    Leave(String),
    Room { room: String, message: String, skip_user: Option<i64> },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(now: Instant) -> Ws {
        Ws::new(WsConn::new(1 << 16), WebSocket { user_id: None, name: None }, now)
    }

    #[test]
    fn a_peer_that_misses_a_pong_is_closed_with_1001() {
        let now = Instant::now();
        let mut w = ws(now);
        let mut out = Vec::new();
        assert!(w.heartbeat(now, false, &mut out));
        assert_eq!(out, [0x89, 0x00], "an empty ping");
        out.clear();
        assert!(!w.heartbeat(now + WS_PING_EVERY, false, &mut out));
        assert_eq!(&out[..2], [0x88, 14], "a close frame");
        assert_eq!(&out[2..4], 1001u16.to_be_bytes());
        assert_eq!(&out[4..], b"ping timeout");
    }

    #[test]
    fn a_backed_up_peer_is_not_pinged_nor_judged() {
        let now = Instant::now();
        let mut w = ws(now);
        let mut out = Vec::new();
        assert!(w.heartbeat(now, true, &mut out));
        assert!(w.heartbeat(now + WS_PING_EVERY, true, &mut out));
        assert!(out.is_empty());
        assert_eq!(w.next_ping, now + 2 * WS_PING_EVERY);
    }
}
