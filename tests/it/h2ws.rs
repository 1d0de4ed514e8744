//! WebSocket over HTTP/2 (RFC 8441) under a flood: input back pressure by
//! flow control. A WebSocket whose output is backed up stops having its
//! input read and released, so its client's stream window closes and the
//! client's sending blocks, instead of the worker buffering without bound;
//! it resumes when the output drains.

use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::h2util::H2Client;
use crate::http2::{ws_frames, ws_recv_until, ws_text_frame};
use crate::util::{Server, IO_TIMEOUT};

fn status_kib(pid: i32, field: &str) -> i64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    st.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// Capacity to send `want` bytes on `send` now (pumping once), or 0.
fn capacity(c: &mut H2Client, send: &mut h2::SendStream<bytes::Bytes>, want: usize) -> Result<usize, h2::Error> {
    send.reserve_capacity(want);
    c.pump();
    match send.poll_capacity(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Some(r)) => r,
        Poll::Ready(None) | Poll::Pending => Ok(send.capacity()),
    }
}

/// Alice (HTTP/2) floods chat messages into a room whose other member (Bob,
/// HTTP/1.1) never reads, and never reads her own stream either: her stream
/// window closes after a bounded amount and her sending blocks (her stream
/// is not reset), the worker's memory stays bounded, `/health` answers on
/// another connection and on hers, and another stream of hers can still send
/// a body. Once she reads, her window reopens and her messages flow again.
#[test]
fn a_websocket_flood_over_h2_closes_the_senders_window_instead_of_buffering() {
    let s = Server::api_builder().workers(1).start();
    let worker = s.wait_workers(1, IO_TIMEOUT)[0];
    let (_, ta) = s.user("Alice");
    let (_, tb) = s.user("Bob");
    // Bob joins room r (his own marker proves it), then never reads again.
    let (mut b, _) = s.ws_chat(&tb);
    b.send_json(&json!({"type": "join", "roomId": "r"}));
    b.send_json(&json!({"type": "chat", "roomId": "r", "content": "bob-marker"}));
    while b.recv_json(IO_TIMEOUT).expect("bob's marker")["content"] != json!("bob-marker") {}

    let (mut c, resp, mut send) = crate::h2util::ws_connect(s.addr(), &ta);
    assert_eq!(resp.status(), 200, "{resp:?}");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    assert_eq!(ws_recv_until(&mut c, &mut body, &mut buf, |_| true)["type"], json!("connected"));
    let join = ws_text_frame(&json!({"type": "join", "roomId": "r"}).to_string());
    send.send_data(bytes::Bytes::from(join), false).expect("join");

    assert_eq!(s.get("/health").status, 200);
    let peak_reset = std::fs::write(format!("/proc/{worker}/clear_refs"), "5").is_ok();
    let before = status_kib(worker, "VmRSS:");
    // From here on Alice reads nothing: her echoes pile up on the server.
    let content = "x".repeat(1000);
    let frame = ws_text_frame(&json!({"type": "chat", "roomId": "r", "content": content}).to_string());
    // Frames back to back, cut wherever the window ends, so it fills to the last byte.
    let mut sent = 0usize;
    let mut at = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut blocked_since: Option<Instant> = None;
    loop {
        assert!(Instant::now() < deadline, "still sending after {sent} bytes");
        let n = capacity(&mut c, &mut send, frame.len()).unwrap_or_else(|e| panic!("after {sent} bytes: {e:?}"));
        if n > 0 {
            let n = n.min(frame.len() - at);
            send.send_data(bytes::Bytes::copy_from_slice(&frame[at..at + n]), false)
                .unwrap_or_else(|e| panic!("after {sent} bytes: {e:?}\n{}", s.log_tail()));
            at = (at + n) % frame.len();
            sent += n;
            blocked_since = None;
            continue;
        }
        // Blocked for a second (and still open): the window is shut.
        let since = *blocked_since.get_or_insert_with(Instant::now);
        if since.elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    eprintln!("Alice's sending blocked after {sent} bytes");
    assert!(sent < 1 << 20, "{sent} bytes accepted before the window closed");
    // Her stream is blocked, not reset, and the rest of the connection works.
    assert!(matches!(send.poll_reset(&mut Context::from_waker(Waker::noop())), Poll::Pending));
    let t = Instant::now();
    assert_eq!(c.get("/health").status, 200);
    let r = c.request("POST", "/api/v1/users", &[("content-type", "application/json")], Some(&[b'{'; 8000]));
    assert_eq!(r.status, 400, "{}", r.body_str());
    assert_eq!(s.get("/health").status, 200);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let now = status_kib(worker, "VmRSS:");
    let peak = if peak_reset { status_kib(worker, "VmHWM:").max(now) } else { now };
    eprintln!("worker RSS before {before} KiB, now {now} KiB, peak {peak} KiB");
    assert!(peak - before < 16 * 1024, "worker RSS {before} KiB → peak {peak} KiB");
    // Still blocked after all that.
    assert_eq!(capacity(&mut c, &mut send, frame.len()).expect("capacity"), 0);

    // Alice reads: the server's output drains, her waiting frames are read,
    // her window reopens, and a new message of hers comes back to her.
    let mut echoes = 0usize;
    c.until(Duration::from_secs(20), "Alice's window to reopen", |c| {
        let _ = c.body_now(&mut body, &mut buf).expect("body");
        echoes += ws_frames(&mut buf).len();
        (capacity(c, &mut send, frame.len()).ok()? >= frame.len()).then_some(())
    });
    // The rest of the frame the window cut, then one more message.
    send.send_data(bytes::Bytes::copy_from_slice(&frame[at..]), false).expect("the rest of a frame");
    let last = ws_text_frame(&json!({"type": "chat", "roomId": "r", "content": "last"}).to_string());
    send.send_data(bytes::Bytes::from(last), false).expect("send after the window reopened");
    let m = ws_recv_until(&mut c, &mut body, &mut buf, |m| m["content"] == json!("last"));
    assert_eq!(m["type"], json!("chat"));
    eprintln!("{echoes} messages waited for Alice");
    assert!(echoes > 0);
    drop(b);
}
