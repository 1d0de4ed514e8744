//! Server-sent events and notifications (CONTRACT §5 notifications, §6 `/api/events`): the
//! stream's head and preamble, heartbeats, notifications fanned out to every stream on every
//! worker, `Last-Event-ID` replay and its limit, hostile `Last-Event-ID`, and streams freed
//! at once on disconnect.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

fn sse_server(workers: usize, extra_sse: &str) -> Server {
    let mut sse = String::from("heartbeat_ms = 300");
    if !extra_sse.is_empty() {
        sse.push('\n');
        sse.push_str(extra_sse);
    }
    Server::api_builder().workers(workers).set("sse", &sse).start()
}

/// The next `notification` event (heartbeats skipped); panics with context otherwise.
fn next_notification(s: &Server, st: &mut SseStream, what: &str) -> SseEvent {
    let ev = st.next_non_heartbeat(IO_TIMEOUT).unwrap_or_else(|e| panic!("{what}: {e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, ev.event(), Some("notification"), "{what}: event name of {ev:?}");
    ev
}

/// Asserts `ev` is the notification `n` (id line and JSON data).
fn check_is(s: &Server, ev: &SseEvent, n: &Value, what: &str) {
    let id = n["id"].as_i64().unwrap().to_string();
    ensure_eq!(s, ev.id(), Some(id.as_str()), "{what}: `id:` of {ev:?}");
    let d: Result<Value, _> = serde_json::from_str(&ev.data());
    ensure!(s, d.is_ok(), "{what}: data is not JSON: {ev:?}");
    ensure_eq!(s, d.unwrap(), n.clone(), "{what}: data of the notification event");
}

protocols!(stream_head_preamble_and_heartbeats);
fn stream_head_preamble_and_heartbeats(p: Proto) {
    let s = sse_server(1, "").on(p);
    let mut st = s.sse(&[]);
    let h = &st.head;
    ensure_eq!(s, media_type(h.header("content-type")).as_deref(), Some("text/event-stream"), "Content-Type: {h:?}");
    ensure_eq!(s, h.header("cache-control"), Some("no-cache"), "Cache-Control: {h:?}");
    if p == Proto::H1 {
        ensure!(
            s,
            h.header("connection").map(|v| v.eq_ignore_ascii_case("keep-alive")).unwrap_or(false),
            "Connection: keep-alive expected: {h:?}"
        );
        ensure!(
            s,
            h.header("transfer-encoding").map(|v| v.eq_ignore_ascii_case("chunked")).unwrap_or(false),
            "the stream must be chunked: {h:?}"
        );
    } else {
        // HTTP/2: DATA frames of one stream, no connection-specific fields (CONTRACT §11).
        for f in ["connection", "keep-alive", "transfer-encoding"] {
            ensure!(s, h.header(f).is_none(), "no `{f}` over HTTP/2: {h:?}");
        }
    }
    let retry = st.expect_preamble().unwrap_or_else(|e| panic!("{e}\nlog:\n{}", s.log_tail()));
    ensure_eq!(s, retry.as_str(), "3000", "retry: sse.retry_ms");
    // Heartbeats about every 300 ms.
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 4 {
        let ev = st.next(Duration::from_secs(2)).unwrap_or_else(|e| panic!("heartbeat: {e}\nlog:\n{}", s.log_tail()));
        ensure_eq!(s, ev.event(), Some("heartbeat"), "only heartbeats on an idle stream: {ev:?}");
        let d = ev.data_json();
        let t = d["time"].as_i64();
        ensure!(
            s,
            t.is_some() && d.as_object().map(|o| o.len()) == Some(1),
            "heartbeat data {{\"time\":<ms>}}: {ev:?}"
        );
        let now_ms = now_unix() * 1000;
        ensure!(s, (t.unwrap() - now_ms).abs() < 5_000, "heartbeat time must be ms since the epoch, now: {ev:?}");
        times.push((Instant::now(), t.unwrap()));
    }
    let took = start.elapsed();
    ensure!(
        s,
        took >= Duration::from_millis(600) && took <= Duration::from_millis(2500),
        "4 heartbeats at heartbeat_ms = 300 took {took:?}"
    );
    ensure!(s, times.windows(2).all(|w| w[1].1 >= w[0].1), "heartbeat times must not go back: {times:?}");
}

protocols!(notifications_api_auth_and_validation);
fn notifications_api_auth_and_validation(p: Proto) {
    let s = sse_server(1, "").on(p);
    let (_, admin) = s.admin();
    let (_, user) = s.user("Plain User");
    let r = s.api("POST", "/api/v1/notifications", Some(&admin), Some(&json!({"title": "Hello", "body": "World"})));
    let d = s.expect_data(&r, 201, "admin posts a notification");
    ensure!(s, d["id"].is_i64(), "id integer: {d}");
    ensure_eq!(s, d["title"].as_str(), Some("Hello"), "title: {d}");
    ensure_eq!(s, d["body"].as_str(), Some("World"), "body: {d}");
    ensure!(s, d["createdAt"].as_str().map(is_rfc3339_utc).unwrap_or(false), "createdAt RFC 3339 UTC: {d}");
    let r = s.api("POST", "/api/v1/notifications", Some(&admin), Some(&json!({"title": "No body"})));
    let d2 = s.expect_data(&r, 201, "body is optional (0–2000)");
    ensure!(s, d2["id"].as_i64() > d["id"].as_i64(), "ids increase: {d} then {d2}");

    let r = s.api("POST", "/api/v1/notifications", Some(&user), Some(&json!({"title": "x"})));
    s.expect_err(&r, 403, "FORBIDDEN", "a non-admin posts a notification");
    let r = s.api("POST", "/api/v1/notifications", None, Some(&json!({"title": "x"})));
    s.expect_err(&r, 401, "UNAUTHORIZED", "no token");
    for (body, field) in [
        (json!({"title": ""}), "title"),
        (json!({"title": "t".repeat(201)}), "title"),
        (json!({"body": "b"}), "title"),
        (json!({"title": 5}), "title"),
        (json!({"title": "ok", "body": "b".repeat(2001)}), "body"),
    ] {
        let r = s.api("POST", "/api/v1/notifications", Some(&admin), Some(&body));
        s.expect_invalid(&r, &[field], &format!("notification body {body}"));
    }
    let r = s.api(
        "POST",
        "/api/v1/notifications",
        Some(&admin),
        Some(&json!({"title": "t".repeat(200), "body": "b".repeat(2000)})),
    );
    s.expect_data(&r, 201, "title of 200 and body of 2000 characters");
}

protocols!(a_notification_reaches_every_stream_on_both_workers);
fn a_notification_reaches_every_stream_on_both_workers(p: Proto) {
    let s = sse_server(2, "").on(p);
    s.wait_workers(2, Duration::from_secs(10));
    let (_, admin) = s.admin();
    let mut streams = Vec::new();
    let mut snap = Default::default();
    for _ in 0..40 {
        streams.push(s.sse_connected(&[]));
        if streams.len() < 6 {
            continue;
        }
        snap = s.streams_by_pid();
        let total: i64 = snap.values().map(|v| count_of(v, "sse")).sum();
        if snap.values().all(|v| count_of(v, "sse") > 0) {
            ensure_eq!(s, total, streams.len() as i64, "sum of sse over workers vs streams open: {snap:?}");
            break;
        }
    }
    ensure!(
        s,
        snap.values().all(|v| count_of(v, "sse") > 0) && snap.len() == 2,
        "setup: could not spread streams over both workers: {snap:?}"
    );
    let n = s.notify(&admin, "Fan-out", "to everyone");
    let total = streams.len();
    for (i, st) in streams.iter_mut().enumerate() {
        let ev = next_notification(&s, st, &format!("stream {i} of {total}"));
        check_is(&s, &ev, &n, &format!("stream {i}"));
    }
    // And a second one, in order after the first.
    let n2 = s.notify(&admin, "Second", "");
    for (i, st) in streams.iter_mut().enumerate() {
        let ev = next_notification(&s, st, &format!("second notification, stream {i}"));
        check_is(&s, &ev, &n2, &format!("second notification, stream {i}"));
    }
}

protocols!(last_event_id_replays_missed_notifications_before_live_ones);
fn last_event_id_replays_missed_notifications_before_live_ones(p: Proto) {
    let s = sse_server(2, "").on(p);
    let (_, admin) = s.admin();
    let ns: Vec<Value> = (1..=4).map(|i| s.notify(&admin, &format!("n{i}"), "")).collect();
    let after = ns[1]["id"].as_i64().unwrap().to_string();
    let mut st = s.sse_connected(&[("Last-Event-ID", &after)]);
    for (k, n) in ns[2..].iter().enumerate() {
        let ev = next_notification(&s, &mut st, &format!("replay #{k} after Last-Event-ID {after}"));
        check_is(&s, &ev, n, &format!("replay #{k}"));
    }
    let live = s.notify(&admin, "live", "");
    let ev = next_notification(&s, &mut st, "the live notification after the replay");
    check_is(&s, &ev, &live, "live after replay");
}

protocols!(replay_limit_keeps_the_newest_oldest_first);
fn replay_limit_keeps_the_newest_oldest_first(p: Proto) {
    let s = sse_server(1, "replay_limit = 2").on(p);
    let (_, admin) = s.admin();
    let ns: Vec<Value> = (1..=5).map(|i| s.notify(&admin, &format!("n{i}"), "")).collect();
    let first_id = ns[0]["id"].as_i64().unwrap();
    let before_first = (first_id - 1).to_string();
    let mut st = s.sse_connected(&[("Last-Event-ID", &before_first)]);
    for n in &ns[3..] {
        let ev = next_notification(&s, &mut st, "replay with replay_limit = 2");
        check_is(&s, &ev, n, "replay_limit = 2: the newest two, oldest first");
    }
    let live = s.notify(&admin, "live", "");
    let ev = next_notification(&s, &mut st, "live after a limited replay");
    check_is(&s, &ev, &live, "nothing but the newest two is replayed");
}

protocols!(hostile_last_event_id_is_treated_as_absent);
fn hostile_last_event_id_is_treated_as_absent(p: Proto) {
    let s = sse_server(1, "").on(p);
    let (_, admin) = s.admin();
    s.notify(&admin, "old 1", "");
    s.notify(&admin, "old 2", "");
    let big = "9".repeat(10_000);
    for v in ["abc", "-5", big.as_str(), "1e3", " ", "0x1"] {
        // A value of only white space is a malformed field over HTTP/2 (RFC 9113 §8.2.1): 400.
        if v == " " && p != Proto::H1 {
            continue;
        }
        let shown = if v.len() > 20 { format!("<{} bytes>", v.len()) } else { format!("{v:?}") };
        let mut st = match s.sse_at("/api/events", &[("Last-Event-ID", v)]) {
            Ok(st) => st,
            Err(r) => panic!("Last-Event-ID {shown}: expected a 200 stream, got {r:?}\nlog:\n{}", s.log_tail()),
        };
        st.expect_preamble().unwrap_or_else(|e| panic!("Last-Event-ID {shown}: {e}\nlog:\n{}", s.log_tail()));
        let live = s.notify(&admin, "live", "");
        let ev = next_notification(&s, &mut st, &format!("Last-Event-ID {shown}"));
        check_is(&s, &ev, &live, &format!("Last-Event-ID {shown} must replay nothing"));
    }
    s.assert_healthy();
}

protocols!(disconnect_frees_streams_on_both_workers_at_once);
fn disconnect_frees_streams_on_both_workers_at_once(p: Proto) {
    let s = sse_server(2, "").on(p);
    s.wait_workers(2, Duration::from_secs(10));
    let mut streams = Vec::new();
    let mut snap = Default::default();
    for _ in 0..40 {
        streams.push(s.sse_connected(&[]));
        if streams.len() < 10 {
            continue;
        }
        snap = s.streams_by_pid();
        if snap.values().all(|v| count_of(v, "sse") > 0) {
            break;
        }
    }
    ensure!(s, snap.values().all(|v| count_of(v, "sse") > 0), "setup: streams on both workers: {snap:?}");
    drop(streams);
    let t = Instant::now();
    let (snap, ok) = s.streams_until(Duration::from_secs(3), |m| m.values().all(|v| count_of(v, "sse") == 0));
    ensure!(s, ok, "after closing every client socket, sse must drop to 0 on both workers within 3 s: {snap:?}");
    let _ = t;
}

protocols!(head_on_the_stream_is_the_head_only_and_the_connection_carries_on);
fn head_on_the_stream_is_the_head_only_and_the_connection_carries_on(p: Proto) {
    let s = sse_server(1, "").on(p);
    let mut h2 = None;
    let h = match p {
        Proto::H1 => {
            let mut c = s.conn();
            c.send(&request("HEAD", "/api/events", &[], b""));
            let h = c.read_head_response();
            ensure!(
                s,
                h.header("transfer-encoding").map(|v| v.eq_ignore_ascii_case("chunked")).unwrap_or(false),
                "the head GET gets (chunked): {h:?}"
            );
            // Longer than a heartbeat (300 ms): neither the preamble nor a heartbeat follows.
            let stray = c.poll_readable(Duration::from_millis(700));
            ensure!(
                s,
                !stray || c.pending().is_empty(),
                "bytes after the HEAD response: {:?}",
                String::from_utf8_lossy(&c.pending()[..c.pending().len().min(64)])
            );
            c.send(&request("GET", "/health", &[], b""));
            let r = c.try_read_response(false);
            ensure!(s, matches!(&r, Ok(r) if r.status == 200), "GET /health on the same connection: {r:?}");
            h
        }
        Proto::H2c | Proto::H3 => {
            // The stream ends with the head (no DATA: no preamble, no heartbeat).
            let mut c = s.session();
            let h = c
                .try_request("HEAD", "/api/events", &[], b"", Duration::from_millis(700))
                .unwrap_or_else(|e| panic!("HEAD /api/events must end with its head: {e}\n{}", s.log_tail()));
            ensure!(s, h.body.is_empty(), "HEAD /api/events: no DATA: {h:?}");
            h2 = Some(c);
            h
        }
    };
    ensure_eq!(s, h.status, 200, "HEAD /api/events: {h:?}");
    ensure_eq!(s, media_type(h.header("content-type")).as_deref(), Some("text/event-stream"), "Content-Type: {h:?}");
    if let Some(mut c) = h2 {
        let r = c.try_request("GET", "/health", &[], b"", IO_TIMEOUT);
        ensure!(s, matches!(&r, Ok(r) if r.status == 200), "GET /health on the same connection: {r:?}");
    }
}
