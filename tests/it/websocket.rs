//! WebSocket (CONTRACT §7): the handshake and its refusals, rooms (join, chat to every member
//! including the sender, typing to the others, leave), errors that keep the connection, chat
//! across workers with per-sender order, clients removed at once, frame limits (1009), ping,
//! close 1001 on shutdown, and `/ws/echo`.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::util::*;

const T: Duration = Duration::from_secs(5);

fn id_of(v: &Value) -> i64 {
    v["id"].as_i64().unwrap_or_else(|| panic!("no integer id in {v}"))
}

fn recv(s: &Server, ws: &mut Ws, what: &str) -> Value {
    ws.recv_json(T).unwrap_or_else(|e| panic!("{what}: {e}\nlog:\n{}", s.log_tail()))
}

/// Checks a chat message.
fn check_chat(s: &Server, m: &Value, room: &str, from: i64, content: &str, what: &str) {
    ensure_eq!(s, m["type"].as_str(), Some("chat"), "{what}: type of {m}");
    ensure_eq!(s, m["roomId"].as_str(), Some(room), "{what}: roomId of {m}");
    ensure_eq!(s, m["from"].as_i64(), Some(from), "{what}: from of {m}");
    ensure_eq!(s, m["content"].as_str(), Some(content), "{what}: content of {m}");
    let ts = m["timestamp"].as_i64();
    ensure!(
        s,
        ts.map(|t| (t - now_unix() * 1000).abs() < 60_000).unwrap_or(false),
        "{what}: timestamp must be ms since the epoch: {m}"
    );
}

fn chat(room: &str, content: &str) -> Value {
    json!({"type": "chat", "roomId": room, "content": content})
}

/// Reads messages until one satisfies `pred` (bounded); returns it. Messages before it are
/// skipped (e.g. chats in the room that crossed the bus while the join was in flight).
fn recv_until(s: &Server, ws: &mut Ws, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut skipped = Vec::new();
    for _ in 0..200 {
        let m = recv(s, ws, what);
        if pred(&m) {
            return m;
        }
        skipped.push(m);
    }
    panic!("{what}: not found in 200 messages; got {skipped:?}\nlog:\n{}", s.log_tail());
}

/// Sends `join` and waits until the server has applied it: a later chat from `ws` to the
/// same room comes back to `ws` (marker content). Room messages that arrive first (sent by
/// others on another worker while the join was in flight) are skipped.
fn join(s: &Server, ws: &mut Ws, room: &str, from: i64) {
    ws.send_json(&json!({"type": "join", "roomId": room}));
    let marker = format!("joined-{room}-{}", unique_email("m"));
    ws.send_json(&chat(room, &marker));
    let m = recv_until(s, ws, &format!("own marker after joining {room}"), |m| {
        m["from"].as_i64() == Some(from) && m["content"].as_str() == Some(marker.as_str())
    });
    check_chat(s, &m, room, from, &marker, "own marker after join");
}

#[test]
fn handshake_connected_and_refusals() {
    let s = Server::api_builder().start();
    let (u, token) = s.user("Ws User");
    let (mut ws, hello) = s.ws_chat(&token);
    ensure_eq!(s, hello, json!({"type": "connected", "userId": id_of(&u)}), "the first message");
    ensure!(
        s,
        ws.head.header("upgrade").map(|v| v.eq_ignore_ascii_case("websocket")).unwrap_or(false),
        "101 must carry Upgrade: websocket: {:?}",
        ws.head
    );
    ensure!(
        s,
        ws.head.header("connection").map(|v| v.to_ascii_lowercase().contains("upgrade")).unwrap_or(false),
        "101 must carry Connection: Upgrade: {:?}",
        ws.head
    );
    ws.close(1000);
    let c = ws.expect_close_frame(T);
    ensure!(s, c.is_ok(), "the server answers a close with a close: {c:?}");

    // The public origin itself is allowed.
    let path = format!("/ws?token={}", urlencode(&token));
    let r = s.ws_try(&path, &[("Origin", "http://127.0.0.1:8080")]);
    ensure!(s, r.is_ok(), "Origin = public_origin must be accepted: {:?}", r.err());

    let refuse =
        |path: &str, headers: &[(&str, &str)], status: u16, code: &str, what: &str| match s.ws_try(path, headers) {
            Ok(_) => panic!("{what}: upgraded (101) but expected {status}\nlog:\n{}", s.log_tail()),
            Err(r) => {
                s.expect_err(&r, status, code, what);
            }
        };
    refuse("/ws", &[], 401, "UNAUTHORIZED", "no token");
    refuse("/ws?token=", &[], 401, "UNAUTHORIZED", "empty token");
    refuse("/ws?token=not.a.jwt", &[], 401, "UNAUTHORIZED", "bad token");
    let forged = jwt_sign(
        &json!({"alg":"HS256","typ":"JWT"}),
        &good_claims(id_of(&u), "user"),
        "HS256",
        b"wrong-secret-wrong-secret-wrong-secret!!",
    );
    refuse(&format!("/ws?token={forged}"), &[], 401, "UNAUTHORIZED", "token signed with another secret");
    refuse(&path, &[("Origin", "http://evil.example")], 403, "FORBIDDEN", "Origin: http://evil.example");
    s.assert_healthy();
    ensure!(s, !s.logs().contains(&token), "the token query value must never reach a log");
}

#[test]
fn rooms_chat_typing_errors_and_leave() {
    let s = Server::api_builder().start();
    let (ua, ta) = s.user("Alice");
    let (ub, tb) = s.user("Bob");
    let (uc, tc) = s.user("Carol");
    let (a_id, b_id, c_id) = (id_of(&ua), id_of(&ub), id_of(&uc));
    let (mut a, _) = s.ws_chat(&ta);
    let (mut a2, _) = s.ws_chat(&ta); // Alice's second tab
    let (mut b, _) = s.ws_chat(&tb);
    let (mut c, _) = s.ws_chat(&tc);
    join(&s, &mut a, "r", a_id);
    join(&s, &mut a2, "r", a_id);
    // a gets a2's marker too (same room).
    let m = recv(&s, &mut a, "a sees a2's join marker");
    ensure_eq!(s, m["type"].as_str(), Some("chat"), "a sees a2's marker: {m}");
    join(&s, &mut b, "r", b_id);
    for (ws, who) in [(&mut a, "a"), (&mut a2, "a2")] {
        let m = recv(&s, ws, &format!("{who} sees b's join marker"));
        ensure_eq!(s, m["from"].as_i64(), Some(b_id), "{who} sees b's marker: {m}");
    }
    join(&s, &mut c, "other", c_id);

    // chat → every member, the sender included; not to a non-member.
    a.send_json(&chat("r", "hello room"));
    for (ws, who) in [(&mut a, "sender a"), (&mut a2, "a2"), (&mut b, "b")] {
        let m = recv(&s, ws, &format!("{who}: chat from a"));
        check_chat(&s, &m, "r", a_id, "hello room", who);
    }
    // Carol is not in r: her next message is her own marker in "other".
    c.send_json(&chat("other", "carol-sentinel"));
    let m = recv(&s, &mut c, "carol's own sentinel");
    check_chat(&s, &m, "other", c_id, "carol-sentinel", "a non-member must not get room r's chat");

    // typing → members except the sender's user (not even her other tab).
    a.send_json(&json!({"type": "typing", "roomId": "r"}));
    let m = recv(&s, &mut b, "b: typing from a");
    ensure_eq!(s, m, json!({"type": "typing", "roomId": "r", "from": a_id, "name": "Alice"}), "typing message");
    a.send_json(&chat("r", "after-typing"));
    for (ws, who) in [(&mut a, "a"), (&mut a2, "a2")] {
        let m = recv(&s, ws, &format!("{who} after typing"));
        check_chat(&s, &m, "r", a_id, "after-typing", &format!("{who} must not receive its own user's typing"));
    }
    let m = recv(&s, &mut b, "b: chat after typing");
    check_chat(&s, &m, "r", a_id, "after-typing", "b");

    // Sending to a room joins it: b sends to "fresh", then a's chat there reaches b.
    b.send_json(&chat("fresh", "b-first"));
    let m = recv(&s, &mut b, "b's own first message in fresh");
    check_chat(&s, &m, "fresh", b_id, "b-first", "sender gets its own message (joined by sending)");
    c.send_json(&chat("fresh", "c-too"));
    let m = recv(&s, &mut c, "c's own message in fresh");
    check_chat(&s, &m, "fresh", c_id, "c-too", "c joined fresh by sending");
    let m = recv(&s, &mut b, "b gets c's message in fresh");
    check_chat(&s, &m, "fresh", c_id, "c-too", "b, member of fresh by having sent to it");

    // Errors keep the connection open.
    for bad in ["{not json", "[1,2]", r#"{"type":"dance","roomId":"r"}"#, r#"{"roomId":"r"}"#] {
        b.send_text(bad);
        let m = recv(&s, &mut b, &format!("error for {bad:?}"));
        ensure_eq!(s, m["type"].as_str(), Some("error"), "answer to {bad:?}: {m}");
        ensure!(s, m["message"].as_str().map(|t| !t.is_empty()).unwrap_or(false), "error message for {bad:?}: {m}");
    }
    b.send_json(&chat("r", "still-here"));
    for (ws, who) in [(&mut b, "b"), (&mut a, "a"), (&mut a2, "a2")] {
        let m = recv(&s, ws, &format!("{who}: chat after errors"));
        check_chat(&s, &m, "r", b_id, "still-here", "the connection stays usable after errors");
    }

    // leave stops delivery.
    b.send_json(&json!({"type": "leave", "roomId": "r"}));
    // b's leave is applied once b's own later message is back (same connection, in order).
    b.send_json(&chat("fresh", "b-left-r"));
    let m = recv(&s, &mut b, "b's marker after leave");
    check_chat(&s, &m, "fresh", b_id, "b-left-r", "b marker");
    let m = recv(&s, &mut c, "c gets b's marker");
    check_chat(&s, &m, "fresh", b_id, "b-left-r", "c");
    a.send_json(&chat("r", "b-should-not-see"));
    a.send_json(&chat("fresh", "a-sentinel")); // a joins fresh by sending
    let m = recv(&s, &mut b, "b after leaving r");
    check_chat(&s, &m, "fresh", a_id, "a-sentinel", "after leave, b must not get room r's chat");
}

/// Chat and typing messages carry the sender's display name (from the access token, so a
/// renamed user shows the new name from its next token on); a token without a name (issued
/// by an older version) gives messages without one.
#[test]
fn chat_and_typing_carry_the_senders_name() {
    let s = Server::start_api();
    let email = unique_email("zoe");
    let ua = s.signup("Zoë \"Z\" <b>", &email, "user-password-1", None);
    let (ta, _, _) = s.login(&email, "user-password-1");
    let (ub, tb) = s.user("Bob");
    let (a_id, b_id) = (id_of(&ua), id_of(&ub));
    let (mut a, _) = s.ws_chat(&ta);
    let (mut b, _) = s.ws_chat(&tb);
    join(&s, &mut a, "n", a_id);
    join(&s, &mut b, "n", b_id);
    a.send_json(&chat("n", "hi"));
    let m = recv_until(&s, &mut b, "b gets a's chat", |m| m["content"] == "hi");
    check_chat(&s, &m, "n", a_id, "hi", "named chat");
    ensure_eq!(s, m["name"].as_str(), Some("Zoë \"Z\" <b>"), "the sender's name, as stored: {m}");
    a.send_json(&json!({"type": "typing", "roomId": "n"}));
    let m = recv_until(&s, &mut b, "b gets a's typing", |m| m["type"] == "typing");
    ensure_eq!(s, m, json!({"type": "typing", "roomId": "n", "from": a_id, "name": "Zoë \"Z\" <b>"}), "typing");

    // A renamed user keeps its old name until its next token.
    let r = s.api("PATCH", &format!("/api/v1/users/{b_id}"), Some(&tb), Some(&json!({"name": "Robert"})));
    s.expect_data(&r, 200, "rename Bob");
    b.send_json(&chat("n", "old token"));
    let m = recv_until(&s, &mut a, "a gets b's chat (old token)", |m| m["content"] == "old token");
    ensure_eq!(s, m["name"].as_str(), Some("Bob"), "the name in the connection's token: {m}");
    let (t2, _, _) = s.login(ub["email"].as_str().unwrap_or_default(), "user-password-1");
    let (mut b2, _) = s.ws_chat(&t2);
    join(&s, &mut b2, "n", b_id);
    b2.send_json(&chat("n", "new token"));
    let m = recv_until(&s, &mut a, "a gets b's chat (new token)", |m| m["content"] == "new token");
    ensure_eq!(s, m["name"].as_str(), Some("Robert"), "a fresh token carries the new name: {m}");

    // A valid token without a name: messages have `from` only.
    let t = jwt_sign(
        &json!({"alg": "HS256", "typ": "JWT"}),
        &good_claims(b_id, "user"),
        "HS256",
        TEST_JWT_SECRET.as_bytes(),
    );
    let (mut b3, hello) = s.ws_chat(&t);
    ensure_eq!(s, hello, json!({"type": "connected", "userId": b_id}), "greeting");
    join(&s, &mut b3, "n", b_id);
    b3.send_json(&chat("n", "no name"));
    let m = recv_until(&s, &mut a, "a gets the nameless chat", |m| m["content"] == "no name");
    check_chat(&s, &m, "n", b_id, "no name", "nameless chat");
    ensure!(s, m.get("name").is_none(), "no name without one in the token: {m}");
}

/// Opens `/ws` clients for `token` until one lands on a worker other than `avoid` (told by
/// the per-worker `ws` counts). Returns it and its worker pid; extra clients are kept open
/// in `spare`.
fn ws_on_other_worker(s: &Server, token: &str, avoid: i32, spare: &mut Vec<Ws>) -> (Ws, i32) {
    for _ in 0..30 {
        let before = s.streams_by_pid();
        let (ws, _) = s.ws_chat(token);
        let after = s.streams_by_pid();
        let grew: Vec<i32> = after
            .iter()
            .filter(|(p, v)| count_of(v, "ws") > before.get(p).map(|b| count_of(b, "ws")).unwrap_or(0))
            .map(|(p, _)| *p)
            .collect();
        if grew.len() == 1 && grew[0] != avoid {
            return (ws, grew[0]);
        }
        spare.push(ws);
    }
    panic!("could not place a WebSocket client on a worker other than {avoid}\nlog:\n{}", s.log_tail());
}

#[test]
fn chat_crosses_workers_in_order_and_closed_clients_are_removed_at_once() {
    let s = Server::api_builder().workers(2).start();
    s.wait_workers(2, Duration::from_secs(10));
    let (ua, ta) = s.user("Ann");
    let (ub, tb) = s.user("Ben");
    let (a_id, b_id) = (id_of(&ua), id_of(&ub));
    let before = s.streams_by_pid();
    let (mut a, _) = s.ws_chat(&ta);
    let after = s.streams_by_pid();
    let a_pid = *after
        .iter()
        .find(|(p, v)| count_of(v, "ws") > before.get(p).map(|b| count_of(b, "ws")).unwrap_or(0))
        .unwrap_or_else(|| panic!("no worker's ws count grew after a connect: {before:?} → {after:?}"))
        .0;
    let mut spare = Vec::new();
    let (mut b, b_pid) = ws_on_other_worker(&s, &tb, a_pid, &mut spare);
    ensure!(s, a_pid != b_pid, "setup: a on {a_pid}, b on {b_pid}");
    join(&s, &mut a, "x", a_id);
    join(&s, &mut b, "x", b_id);
    // Quiesce both streams: whatever crossed the bus during the joins (a's marker may reach
    // b, since b joined while it was in flight) comes before each sender's next message.
    a.send_json(&chat("x", "sync-1"));
    recv_until(&s, &mut b, "b gets a's sync-1", |m| m["from"].as_i64() == Some(a_id) && m["content"] == "sync-1");
    b.send_json(&chat("x", "sync-2"));
    recv_until(&s, &mut b, "b gets its own sync-2", |m| m["from"].as_i64() == Some(b_id) && m["content"] == "sync-2");
    recv_until(&s, &mut a, "a gets b's sync-2", |m| m["from"].as_i64() == Some(b_id) && m["content"] == "sync-2");
    let snap = s.streams_by_pid();
    ensure!(
        s,
        count_of(&snap[&a_pid], "members") >= 1 && count_of(&snap[&b_pid], "members") >= 1,
        "members per worker after joins on both: {snap:?}"
    );

    a.send_json(&chat("x", "over the bus"));
    let m = recv(&s, &mut b, "b (other worker) gets a's chat");
    check_chat(&s, &m, "x", a_id, "over the bus", "cross-worker delivery");
    let m = recv(&s, &mut a, "a gets its own chat");
    check_chat(&s, &m, "x", a_id, "over the bus", "sender");
    b.send_json(&chat("x", "and back"));
    let m = recv(&s, &mut a, "a gets b's chat");
    check_chat(&s, &m, "x", b_id, "and back", "cross-worker delivery, the other way");
    let _ = recv(&s, &mut b, "b's own");
    b.send_json(&json!({"type": "typing", "roomId": "x"}));
    let m = recv(&s, &mut a, "typing across workers");
    ensure_eq!(s, m, json!({"type": "typing", "roomId": "x", "from": b_id, "name": "Ben"}), "typing across workers");

    // Per-sender order: 50 chats from a arrive at b in order.
    for i in 0..50 {
        a.send_json(&chat("x", &format!("seq-{i}")));
    }
    for i in 0..50 {
        let m = recv(&s, &mut b, &format!("b: seq-{i}"));
        check_chat(&s, &m, "x", a_id, &format!("seq-{i}"), "per-sender order across workers");
    }
    for i in 0..50 {
        let m = recv(&s, &mut a, &format!("a: own seq-{i}"));
        check_chat(&s, &m, "x", a_id, &format!("seq-{i}"), "the sender's own copies in order");
    }

    // leave across workers.
    b.send_json(&json!({"type": "leave", "roomId": "x"}));
    b.send_json(&chat("y", "b-marker"));
    let _ = recv(&s, &mut b, "b marker after leave");
    a.send_json(&chat("x", "not-for-b"));
    a.send_json(&chat("y", "a-sentinel"));
    let m = recv(&s, &mut b, "b after leaving x");
    check_chat(&s, &m, "y", a_id, "a-sentinel", "after leave, no delivery from room x across workers");

    // Closed clients are removed at once: a by close handshake, b and the spares abruptly.
    a.close(1000);
    let _ = a.expect_close_frame(T);
    drop(a);
    drop(b);
    drop(spare);
    let (snap, ok) = s.streams_until(Duration::from_secs(3), |m| {
        m.values().all(|v| count_of(v, "ws") == 0 && count_of(v, "members") == 0)
    });
    ensure!(s, ok, "ws and members must drop to 0 on both workers within 3 s of closing: {snap:?}");
}

#[test]
fn oversized_message_gets_1009_and_ping_gets_pong() {
    let s = Server::api_builder().start();
    let (_, t) = s.user("Framer");
    let (mut ws, _) = s.ws_chat(&t);
    ws.ping(b"are-you-there");
    let mut got = None;
    for _ in 0..10 {
        match ws.recv(T) {
            Ok(WsFrame::Pong(p)) => {
                got = Some(p);
                break;
            }
            Ok(WsFrame::Ping(p)) => {
                let _ = ws.send_frame(0xA, &p, true);
            }
            other => panic!("expected a pong, got {other:?}\nlog:\n{}", s.log_tail()),
        }
    }
    ensure_eq!(s, got.as_deref(), Some(&b"are-you-there"[..]), "pong payload");

    let big = format!("{{\"type\":\"chat\",\"roomId\":\"r\",\"content\":\"{}\"}}", "x".repeat(65536));
    let _ = ws.send_frame(0x1, big.as_bytes(), true); // the server may stop reading
    let c = ws.expect_close_frame(T);
    ensure!(s, matches!(c, Ok((Some(1009), _))), "a {} byte text message must get close 1009: {c:?}", big.len());
    s.assert_healthy();
}

#[test]
fn echo_endpoint_off_by_default_and_echoes_when_on() {
    let s = Server::api_builder().start();
    match s.ws_try("/ws/echo", &[]) {
        Ok(_) => panic!("/ws/echo must not upgrade unless [websocket] echo = true"),
        Err(r) => {
            s.expect_err(&r, 404, "NOT_FOUND", "/ws/echo with echo = false");
        }
    }
    drop(s);
    let s = Server::api_builder().set("websocket", "echo = true").start();
    let mut ws = s.ws_try("/ws/echo", &[]).unwrap_or_else(|r| panic!("/ws/echo (echo = true, no token): {r:?}"));
    for t in ["hello", "", "ünïcödé ✓"] {
        ws.send_text(t);
        let f = ws.recv(T);
        ensure!(s, matches!(&f, Ok(WsFrame::Text(x)) if x == t), "echo of text {t:?}: {f:?}");
    }
    let bin: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    ws.send_binary(&bin);
    let f = ws.recv(T);
    ensure!(s, matches!(&f, Ok(WsFrame::Binary(x)) if *x == bin), "echo of 1000 binary bytes: {f:?}");
    // A fragmented text message comes back whole.
    ws.send_frame(0x1, b"frag", false).unwrap();
    ws.send_frame(0x0, b"mented", true).unwrap();
    let f = ws.recv(T);
    ensure!(s, matches!(&f, Ok(WsFrame::Text(x)) if x == "fragmented"), "echo of a fragmented message: {f:?}");
    // Exactly max_message_bytes is fine; one more is 1009.
    let max = "z".repeat(65536);
    ws.send_text(&max);
    let f = ws.recv(T);
    ensure!(
        s,
        matches!(&f, Ok(WsFrame::Text(x)) if x.len() == 65536),
        "echo of 65536 bytes: {:?}",
        f.as_ref().map(|_| "other frame")
    );
    let _ = ws.send_frame(0x1, "z".repeat(65537).as_bytes(), true);
    let c = ws.expect_close_frame(T);
    ensure!(s, matches!(c, Ok((Some(1009), _))), "65537 bytes on /ws/echo → close 1009: {c:?}");
}

#[test]
fn shutdown_sends_close_1001() {
    let mut s = Server::api_builder().workers(2).top("shutdown_timeout_ms = 3000").start();
    let (_, t) = s.user("Leaver");
    let (mut ws, _) = s.ws_chat(&t);
    s.signal(Signal::SIGTERM);
    let c = ws.expect_close_frame(Duration::from_secs(5));
    ensure!(s, matches!(c, Ok((Some(1001), _))), "on SIGTERM a connected client must get close 1001: {c:?}");
    let st = s.wait_exit(Duration::from_secs(10));
    assert!(
        matches!(st, Some(st) if st.success()),
        "the supervisor must exit 0 after SIGTERM: {st:?}\n{}",
        s.log_tail()
    );
}

/// Regression: a WebSocket read at most 64 KiB per readiness event; with edge-triggered
/// polling the rest of a larger burst never raised another event, so a 1 MiB message
/// (allowed by `max_message_bytes`) stalled forever instead of being echoed.
#[test]
fn a_message_larger_than_one_read_slice_is_not_stalled() {
    let s = Server::api_builder().set("websocket", "echo = true\nmax_message_bytes = 4194304").start();
    let mut ws = s.ws_try("/ws/echo", &[]).unwrap_or_else(|r| panic!("/ws/echo: {r:?}"));
    let big: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    ws.send_binary(&big);
    let f = ws.recv(T);
    ensure!(
        s,
        matches!(&f, Ok(WsFrame::Binary(x)) if *x == big),
        "echo of a 1 MiB binary message: {:?}",
        f.as_ref().map(|_| "other")
    );
}

/// A room member that stops reading is dropped once more than 1 MiB waits for it, instead
/// of being buffered without bound; the sender (who keeps reading) is unaffected.
#[test]
fn a_member_that_cannot_keep_up_is_dropped() {
    let s = Server::api_builder().start();
    let (ua, ta) = s.user("Alice");
    let (ub, tb) = s.user("Bob");
    let (a_id, b_id) = (id_of(&ua), id_of(&ub));
    let (mut a, _) = s.ws_chat(&ta);
    let (mut b, _) = s.ws_chat(&tb);
    join(&s, &mut b, "flood", b_id);
    join(&s, &mut a, "flood", a_id);
    // Bob never reads again. Alice sends ~12 MiB into the room, reading her own copies.
    let big = "x".repeat(60_000);
    let dropped = (0..200).any(|i| {
        a.send_json(&chat("flood", &big));
        let m = recv_until(&s, &mut a, &format!("Alice's own message {i}"), |m| m["from"].as_i64() == Some(a_id));
        ensure_eq!(s, m["content"].as_str().map(str::len), Some(big.len()), "Alice's copy {i}");
        s.streams_once().is_some_and(|v| v["ws"].as_u64() == Some(1))
    });
    ensure!(s, dropped, "Bob (not reading) was never dropped: {:?}\n{}", s.streams_once(), s.log_tail());
    ensure!(s, s.logs().contains("WebSocket member is not reading; dropping it"), "the drop is logged");
    drop(b);
}

fn join_msg(room: &str) -> Value {
    json!({"type": "join", "roomId": room})
}

/// The next message must be `{"type":"error","message":…}`.
fn expect_error(s: &Server, ws: &mut Ws, what: &str) {
    let m = recv(s, ws, what);
    ensure_eq!(s, m["type"].as_str(), Some("error"), "{what}: expected an error message, got {m}");
    ensure!(s, m["message"].as_str().is_some_and(|t| !t.is_empty()), "{what}: error without a message: {m}");
}

/// Sends a chat to `room` and expects it back as the very next message (no error before it).
fn round_trip(s: &Server, ws: &mut Ws, room: &str, from: i64, content: &str) {
    ws.send_json(&chat(room, content));
    let m = recv(s, ws, &format!("own chat in {room:?}"));
    check_chat(s, &m, room, from, content, &format!("own chat in a joined room {room:?}"));
}

/// Regression: joins were unbounded (one connection could make a worker hold any number of
/// rooms). `websocket.max_rooms_per_connection` (default 64) caps them; a join beyond it, or
/// a chat to a new room beyond it, is an error and the connection stays usable. Room ids are
/// 1–128 bytes (not characters).
#[test]
fn room_joins_are_capped_per_connection_and_room_ids_are_1_to_128_bytes() {
    let s = Server::api_builder().start();
    let (u, t) = s.user("Roamer");
    let uid = id_of(&u);
    let (mut ws, _) = s.ws_chat(&t);
    for i in 0..64 {
        ws.send_json(&join_msg(&format!("room-{i}")));
    }
    // Every join was applied and none refused: the first answer is the chat itself.
    round_trip(&s, &mut ws, "room-63", uid, "all 64 joined");
    ws.send_json(&join_msg("room-64"));
    expect_error(&s, &mut ws, "the 65th join");
    // Sending to a room joins it, so a chat to a 65th room is refused too, and not delivered.
    ws.send_json(&chat("room-65", "must-not-arrive"));
    expect_error(&s, &mut ws, "a chat to a 65th room");
    // Re-joining a room it is in is not a new room.
    ws.send_json(&join_msg("room-0"));
    round_trip(&s, &mut ws, "room-0", uid, "still usable after the errors");

    // Room ids: 1–128 bytes. 43 × "€" is 43 characters but 129 bytes.
    ws.send_json(&json!({"type": "leave", "roomId": "room-0"}));
    ws.send_json(&json!({"type": "leave", "roomId": "room-1"}));
    for bad in ["€".repeat(43), "r".repeat(129), String::new()] {
        ws.send_json(&join_msg(&bad));
        expect_error(&s, &mut ws, &format!("join of a {}-byte room id", bad.len()));
        ws.send_json(&chat(&bad, "x"));
        expect_error(&s, &mut ws, &format!("chat to a {}-byte room id", bad.len()));
    }
    // After leaving two rooms, two new ones fit: 128 ASCII bytes, and 42 × "€" (126 bytes).
    let long = "r".repeat(128);
    let euros = "€".repeat(42);
    ws.send_json(&join_msg(&long));
    round_trip(&s, &mut ws, &long, uid, "in a 128-byte room");
    round_trip(&s, &mut ws, &euros, uid, "joined by sending, 126 bytes");
    // And now it is full again.
    ws.send_json(&join_msg("one-too-many"));
    expect_error(&s, &mut ws, "a join after refilling to 64");
    round_trip(&s, &mut ws, "room-2", uid, "the connection stays usable");
    s.assert_healthy();
}

/// `websocket.max_rooms_per_connection` is a configuration key, overridable from the
/// environment like every other key.
#[test]
fn max_rooms_per_connection_can_be_set_from_the_environment() {
    let s = Server::api_builder().env("FORKD_WEBSOCKET__MAX_ROOMS_PER_CONNECTION", "2").start();
    let (u, t) = s.user("Two Rooms");
    let uid = id_of(&u);
    let (mut ws, _) = s.ws_chat(&t);
    ws.send_json(&join_msg("a"));
    round_trip(&s, &mut ws, "b", uid, "second room, joined by sending");
    ws.send_json(&join_msg("c"));
    expect_error(&s, &mut ws, "a third join with max_rooms_per_connection = 2");
    ws.send_json(&json!({"type": "leave", "roomId": "a"}));
    ws.send_json(&join_msg("c"));
    round_trip(&s, &mut ws, "c", uid, "after leaving one, another fits");
}

/// A room member that is not reading gets what its socket does not take queued behind it
/// (room messages are written straight to a member's socket when nothing is queued): once it
/// reads, every message arrives whole and in order, and so does the sender's own copy.
#[test]
fn a_member_that_reads_late_gets_every_room_message_whole_and_in_order() {
    let s = Server::api_builder().start();
    let (ua, ta) = s.user("Sender");
    let (ub, tb) = s.user("Late Reader");
    let (a_id, b_id) = (id_of(&ua), id_of(&ub));
    let (mut a, _) = s.ws_chat(&ta);
    let (mut b, _) = s.ws_chat(&tb);
    join(&s, &mut a, "late", a_id);
    join(&s, &mut b, "late", b_id);
    // ~300 KB for each member: more than a fresh loopback socket takes at once, far below
    // the backlog at which a member is dropped.
    const N: usize = 300;
    let body = "x".repeat(1000);
    for i in 0..N {
        a.send_json(&chat("late", &format!("{i:04}{body}")));
    }
    for (ws, who) in [(&mut b, "the late reader"), (&mut a, "the sender")] {
        let first = recv_until(&s, ws, &format!("{who}: the first flooded message"), |m| {
            m["content"].as_str().is_some_and(|c| c.starts_with("0000x"))
        });
        check_chat(&s, &first, "late", a_id, &format!("0000{body}"), who);
        for i in 1..N {
            let m = recv(&s, ws, &format!("{who}: message {i}"));
            check_chat(&s, &m, "late", a_id, &format!("{i:04}{body}"), &format!("{who}: message {i}"));
        }
    }
    s.assert_healthy();
}
