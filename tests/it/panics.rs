//! The worker's panic boundary: app code that panics outside a request handler (a ticker,
//! the chat relay's sink, a WebSocket message, SSE rendering, the homepage assembly) ends
//! its own exchange only. Before any response byte: a 500 `INTERNAL_ERROR`; after the head:
//! the stream ends (SSE: the last chunk; a ticker or relay: cut short, no last chunk); a
//! WebSocket: close 1011. The worker keeps its pid, a connection opened before the panic
//! still works, and one error line names the place.
//!
//! The panics come from debug hooks (`[debug] routes = true`, the harness default); with
//! debug routes off the same values are ordinary data (last test).

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::upstream::*;
use crate::util::*;

const PANIC_RELAY_HEAD: &str = "__debug_panic_relay_head__";
const PANIC_RELAY_BODY: &str = "__debug_panic_relay_body__";
const PANIC_SSE: &str = "__debug_panic_sse__";
const PANIC_SSE_REPLAY: &str = "__debug_panic_sse_replay__";
const PANIC_HOMEPAGE: &str = "__debug_panic_homepage__";
const ZERO: Duration = Duration::ZERO;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// What is checked after a panic: the worker, and a connection opened before it.
struct Witness {
    workers: Vec<i32>,
    pid: i32,
    other: Conn,
}

/// The single worker's pid and a keep-alive connection to it, before the panic.
fn witness(s: &Server) -> Witness {
    let workers = s.wait_workers(1, Duration::from_secs(5));
    let (other, pid) = s.conn_with_pid();
    ensure_eq!(s, vec![pid], workers, "the one worker answers");
    Witness { workers, pid, other }
}

/// After the panic: one error line naming `place`, the same worker, the earlier
/// connection still served.
fn survived(s: &Server, w: Witness, place: &str) {
    let mut other = w.other;
    other.send(&request("GET", "/_debug/pid", &[], b""));
    let r = other.try_read_response(false);
    ensure!(s, matches!(&r, Ok(r) if r.status == 200), "the connection opened before the panic: {r:?}");
    let pid = r.ok().and_then(|r| r.json()["pid"].as_i64());
    ensure_eq!(s, pid, Some(w.pid as i64), "same worker on the earlier connection");
    ensure_eq!(s, s.workers(), w.workers, "the worker was not replaced");
    ensure_eq!(s, s.debug_pid(), w.pid, "a new connection reaches the same worker");
    let line = s.wait_log_line(Duration::from_secs(5), |l| l.contains(&format!("{place} panicked: debug panic")));
    ensure!(s, line.contains("ERROR"), "the panic is logged as an error: {line}");
    let lines = s.logs().lines().filter(|l| l.contains("debug panic")).count();
    ensure_eq!(s, lines, 1, "exactly one log line for the panic");
    s.assert_healthy();
}

/// Everything the server sends on `conn` until it closes (bounded). Panics if it stays open.
fn read_until_close(s: &Server, conn: &mut Conn, what: &str) -> Vec<u8> {
    let mut raw = conn.take_pending();
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut tmp = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        ensure!(
            s,
            !left.is_zero(),
            "{what}: the connection is still open after {IO_TIMEOUT:?}; got {:?}",
            String::from_utf8_lossy(&raw)
        );
        conn.stream.set_read_timeout(Some(left)).unwrap();
        match conn.stream.read(&mut tmp) {
            Ok(0) => return raw,
            Ok(n) => raw.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return raw,
            Err(e) if is_timeout(&e) => {}
            Err(e) => panic!("{what}: read error {e}\nlog:\n{}", s.log_tail()),
        }
    }
}

/// A chunked body: its bytes, and whether its last chunk arrived.
fn dechunk(raw: &[u8]) -> (String, bool) {
    let mut body = Vec::new();
    let mut rest = raw;
    while let Some(le) = find(rest, b"\r\n") {
        let Ok(size) = usize::from_str_radix(String::from_utf8_lossy(&rest[..le]).trim(), 16) else { break };
        if size == 0 {
            return (String::from_utf8_lossy(&body).into_owned(), rest[le..].starts_with(b"\r\n\r\n"));
        }
        if rest.len() < le + 2 + size + 2 {
            break;
        }
        body.extend_from_slice(&rest[le + 2..le + 2 + size]);
        rest = &rest[le + 2 + size + 2..];
    }
    (String::from_utf8_lossy(&body).into_owned(), false)
}

/// A GET on a fresh connection whose answer is a stream: the connection, its 200 head read.
fn open_stream(s: &Server, path: &str, headers: &[(&str, &str)]) -> Conn {
    let mut c = s.conn();
    c.send(&request("GET", path, headers, b""));
    let head = c.read_head_response();
    ensure_eq!(s, head.status, 200, "the stream's head: {head:?}");
    c
}

/// The rest of a stream that a panic cuts short, until the server closes: its body. A
/// stream cut short has no last chunk.
fn read_cut_stream(s: &Server, conn: &mut Conn, what: &str) -> String {
    let raw = read_until_close(s, conn, what);
    let (body, ended) = dechunk(&raw);
    ensure!(s, !ended, "a stream cut short by a panic has no last chunk: {:?}", String::from_utf8_lossy(&raw));
    body
}

/// The rest of an SSE stream whose notification panicked while rendering: the preamble,
/// no notification event, and the stream ends with its last chunk.
fn read_sse_ended_without_notification(s: &Server, conn: &mut Conn, what: &str) {
    let raw = read_until_close(s, conn, what);
    let (body, ended) = dechunk(&raw);
    ensure!(s, body.contains("event: connected"), "the preamble came first: {body:?}");
    ensure!(s, !body.contains("event: notification"), "no notification event: {body:?}");
    ensure!(s, ended, "the stream ends with its last chunk: {:?}", String::from_utf8_lossy(&raw));
}

/// One upstream SSE event carrying `content` as a delta.
fn delta(content: &str) -> String {
    format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": content}}]}))
}

/// A chat upstream streaming "first", then (after 300 ms) "second", then `[DONE]`.
fn chat_upstream() -> Upstream {
    let pieces =
        vec![(ZERO, delta("first")), (Duration::from_millis(300), delta("second")), (ZERO, "data: [DONE]\n\n".into())];
    Upstream::start(move |_| Behaviour::sse(pieces.clone(), After::Finish))
}

/// The `[chat]` section relaying to `up`.
fn chat_lines(up: &Upstream) -> String {
    format!("upstream = \"{}/v1/chat/completions\"\nmodel = \"m1\"", up.url())
}

/// A chat upstream (`chat_upstream`) and a server relaying `/api/chat` to it.
fn chat_server() -> (Upstream, Server) {
    let up = chat_upstream();
    let s = Server::api_builder().set("chat", &chat_lines(&up)).start();
    (up, s)
}

fn chat_body(content: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"messages": [{"role": "user", "content": content}]})).unwrap()
}

fn post_chat(conn: &mut Conn, content: &str) -> Response {
    conn.send(&request("POST", "/api/chat", &[("Content-Type", "application/json")], &chat_body(content)));
    conn.read_head_response()
}

/// Fake homepage upstreams: the users upstream names every user `name`.
fn homepage_upstreams(name: &'static str) -> (Upstream, Upstream) {
    let users = Upstream::start(move |_| Behaviour::json(200, &json!({"name": name, "avatar": null})));
    let lists = Upstream::start(|_| Behaviour::json(200, &json!([])));
    (users, lists)
}

fn upstream_lines(users: &Upstream, lists: &Upstream) -> String {
    format!("users = \"{}\"\norders = \"{}\"\nrecommendations = \"{}\"", users.url(), lists.url(), lists.url())
}

// ---------------------------------------------------------------------------------------
// One test per place
// ---------------------------------------------------------------------------------------

#[test]
fn ticker_panic_cuts_its_stream_only() {
    let s = Server::start("");
    let w = witness(&s);
    let mut c = open_stream(&s, "/_debug/panic/ticker", &[]);
    let body = read_cut_stream(&s, &mut c, "ticker stream");
    ensure!(s, body.contains("{\"tick\":1}"), "the first tick's event arrives: {body:?}");
    survived(&s, w, "stream ticker");
}

#[test]
fn relay_head_panic_is_a_500() {
    let (_up, s) = chat_server();
    let w = witness(&s);
    let mut c = s.conn();
    c.send(&request("POST", "/api/chat", &[("Content-Type", "application/json")], &chat_body(PANIC_RELAY_HEAD)));
    let r = c.read_response();
    assert_json_error(&r, 500, Some("INTERNAL_ERROR"), "relay whose sink panics on the upstream's head");
    let stack = r.json()["stack"].as_str().unwrap_or_default().to_string();
    ensure!(s, stack.contains("relay sink head panicked"), "development: the `stack` names the place: {r:?}");
    ensure!(s, !r.closes(), "the 500 keeps the connection: {r:?}");
    ensure_eq!(s, c.get("/health").status, 200, "the same connection after the 500");
    survived(&s, w, "relay sink head");
}

#[test]
fn relay_body_panic_cuts_the_stream() {
    let (up, s) = chat_server();
    let w = witness(&s);
    let mut c = s.conn();
    let head = post_chat(&mut c, PANIC_RELAY_BODY);
    ensure_eq!(s, head.status, 200, "the stream started with the first event: {head:?}");
    let body = read_cut_stream(&s, &mut c, "relay stream");
    ensure!(s, body.contains("{\"content\":\"first\"}"), "the first event arrives: {body:?}");
    ensure!(s, !body.contains("second") && !body.contains("[DONE]"), "nothing after the panic: {body:?}");
    ensure!(s, up.wait_peer_closed(0, IO_TIMEOUT).is_some(), "the upstream connection is closed:\n{}", up.describe());
    survived(&s, w, "relay sink body");
}

#[test]
fn websocket_message_panic_closes_that_socket_with_1011() {
    let s = Server::start_api();
    let (_, token) = s.user("Panicky");
    let w = witness(&s);
    let (mut calm, _) = s.ws_chat(&token);
    let (mut ws, _) = s.ws_chat(&token);
    for sock in [&mut calm, &mut ws] {
        sock.send_json(&json!({"type": "join", "roomId": "r"}));
    }
    let (_, ok) = s.streams_until(Duration::from_secs(5), |m| m.values().any(|v| count_of(v, "members") == 2));
    ensure!(s, ok, "both sockets joined the room");
    ws.send_json(&json!({"type": "__debug_panic"}));
    let close = ws.expect_close_frame(IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, close.0, Some(1011), "close code after a panic: {close:?}");
    // The other socket is untouched, and the closed one left the room.
    calm.send_json(&json!({"type": "chat", "roomId": "r", "content": "still here"}));
    let m = calm.recv_json(IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, m["content"].as_str(), Some("still here"), "the other socket after the panic: {m}");
    let (snap, ok) = s.streams_until(Duration::from_secs(5), |m| {
        m.values().all(|v| count_of(v, "ws") == 1 && count_of(v, "members") == 1)
    });
    ensure!(s, ok, "one socket and one membership left: {snap:?}");
    survived(&s, w, "WebSocket message");
}

#[test]
fn sse_notification_panic_ends_the_streams_not_the_worker() {
    let s = Server::start_api();
    let (_, admin) = s.admin();
    let w = witness(&s);
    let (_, token) = s.user("Listener");
    let (mut ws, _) = s.ws_chat(&token);
    let mut c = open_stream(&s, "/api/events", &[]);
    let n = s.notify(&admin, PANIC_SSE, "rendering this event panics");
    read_sse_ended_without_notification(&s, &mut c, "SSE stream");
    // The client reconnects with Last-Event-ID and gets it from the store.
    let last = (n["id"].as_i64().unwrap() - 1).to_string();
    let mut st = s.sse_connected(&[("Last-Event-ID", &last)]);
    let ev = st.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("replay: {e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, ev.id(), Some(n["id"].as_i64().unwrap().to_string().as_str()), "the replayed event: {ev:?}");
    // A WebSocket opened before is untouched.
    ws.send_json(&json!({"type": "join", "roomId": "x"}));
    ws.send_json(&json!({"type": "chat", "roomId": "x", "content": "hi"}));
    let m = ws.recv_json(IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, m["content"].as_str(), Some("hi"), "the WebSocket after the panic: {m}");
    survived(&s, w, "SSE notification");
}

#[test]
fn sse_replay_panic_ends_that_stream_only() {
    let s = Server::start_api();
    let (_, admin) = s.admin();
    let w = witness(&s);
    let mut live = s.sse_connected(&[]);
    let n = s.notify(&admin, PANIC_SSE_REPLAY, "replaying this event panics");
    let ev = live.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("live: {e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, ev.event(), Some("notification"), "delivered live: {ev:?}");
    let last = (n["id"].as_i64().unwrap() - 1).to_string();
    let mut c = open_stream(&s, "/api/events", &[("Last-Event-ID", &last)]);
    read_sse_ended_without_notification(&s, &mut c, "replaying SSE stream");
    // The live stream opened before goes on.
    s.notify(&admin, "after", "an ordinary one");
    let ev = live.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("live: {e}\nlog:\n{}", s.log_tail()));
    ensure!(s, ev.data().contains("\"after\""), "the earlier stream still gets notifications: {ev:?}");
    survived(&s, w, "SSE replay");
}

#[test]
fn homepage_assembly_panic_is_a_500() {
    let (users, lists) = homepage_upstreams(PANIC_HOMEPAGE);
    let s = Server::api_builder().set("upstreams", &upstream_lines(&users, &lists)).start();
    let (_, token) = s.user("Home");
    let w = witness(&s);
    let mut c = s.conn();
    let auth = format!("Bearer {token}");
    c.send(&request("GET", "/api/homepage", &[("Authorization", &auth)], b""));
    let r = c.read_response();
    assert_json_error(&r, 500, Some("INTERNAL_ERROR"), "homepage whose assembly panics");
    ensure!(s, !r.closes(), "the 500 keeps the connection: {r:?}");
    ensure_eq!(s, c.get("/health").status, 200, "the same connection after the 500");
    survived(&s, w, "response assembly");
}

// ---------------------------------------------------------------------------------------
// Debug routes off
// ---------------------------------------------------------------------------------------

#[test]
fn the_debug_triggers_are_ordinary_data_without_debug_routes() {
    let chat = chat_upstream();
    let (users, lists) = homepage_upstreams(PANIC_HOMEPAGE);
    let s = Server::api_builder()
        .set("debug", "routes = false")
        .set("chat", &chat_lines(&chat))
        .set("upstreams", &upstream_lines(&users, &lists))
        .start();
    let r = s.get("/_debug/panic/ticker");
    assert_json_error(&r, 404, Some("NOT_FOUND"), "/_debug/panic/ticker with debug routes off");

    for content in [PANIC_RELAY_HEAD, PANIC_RELAY_BODY] {
        let mut c = s.conn();
        let head = post_chat(&mut c, content);
        ensure_eq!(s, head.status, 200, "chat with {content:?}: {head:?}");
        let mut raw = c.take_pending();
        let deadline = Instant::now() + IO_TIMEOUT;
        while !dechunk(&raw).1 && Instant::now() < deadline {
            let mut tmp = [0u8; 4096];
            match c.stream.read(&mut tmp) {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&tmp[..n]),
            }
        }
        let (body, ended) = dechunk(&raw);
        ensure!(s, ended && body.contains("second") && body.contains("[DONE]"), "chat with {content:?}: {body:?}");
    }

    let (_, admin) = s.admin();
    let (_, token) = s.user("Ordinary");
    let (mut ws, _) = s.ws_chat(&token);
    ws.send_json(&json!({"type": "__debug_panic"}));
    let m = ws.recv_json(IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, m["type"].as_str(), Some("error"), "an unknown message type: {m}");

    let mut live = s.sse_connected(&[]);
    let mut ids = Vec::new();
    for title in [PANIC_SSE, PANIC_SSE_REPLAY] {
        let n = s.notify(&admin, title, "ordinary");
        let ev = live.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
        ensure!(s, ev.data().contains(title), "{title:?} delivered live: {ev:?}");
        ids.push(n["id"].as_i64().unwrap());
    }
    let last = (ids[0] - 1).to_string();
    let mut replay = s.sse_connected(&[("Last-Event-ID", &last)]);
    for id in ids {
        let ev = replay.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
        ensure_eq!(s, ev.id(), Some(id.to_string().as_str()), "replayed: {ev:?}");
    }

    let r = s.api("GET", "/api/homepage", Some(&token), None);
    let d: Value = s.expect_data(&r, 200, "homepage of a user named like the trigger");
    ensure_eq!(s, d["user"]["name"].as_str(), Some(PANIC_HOMEPAGE), "the name passes through: {d}");

    ensure!(s, !s.logs().contains("panicked"), "no panic with debug routes off");
}

/// A panic the boundary does not catch (`/_debug/panic/worker`: app code dropped by the
/// worker) ends that worker, cleanly: exit code 101, and the slot gets a new worker.
/// Regression: the panic unwound out of the worker into the supervisor's stack frames of
/// the forked child and dropped the supervisor's objects there, whose descriptors the
/// child had already closed: "fatal runtime error: IO Safety violation: owned file
/// descriptor already closed, aborting" (or, in a release build, a close of whatever
/// descriptor had the number by then).
#[test]
fn an_uncaught_panic_ends_the_worker_without_a_double_close() {
    let s = Server::start("");
    let old = s.wait_workers(1, Duration::from_secs(5))[0];
    let mut c = s.conn();
    c.send(&request("GET", "/_debug/panic/worker", &[], b""));
    read_until_close(&s, &mut c, "the stream of the worker that dies");
    let died = s.wait_log_line(Duration::from_secs(5), |l| l.contains(&format!("worker {old} of slot 0 died")));
    let logs = s.logs();
    ensure!(s, !logs.contains("IO Safety violation"), "a descriptor was closed twice:\n{logs}");
    ensure!(s, died.contains("exit code 101"), "the worker exits with the panic exit code 101: {died}");
    ensure!(
        s,
        logs.lines().any(|l| l.contains("panicked: debug panic outside the panic boundary")),
        "the panic is logged"
    );
    let replaced = eventually(Duration::from_secs(10), || matches!(s.workers()[..], [w] if w != old));
    ensure!(s, replaced, "a new worker serves the slot: {:?}", s.workers());
    s.assert_healthy();
}
