//! HTTP/2 streams whose client never opens their window (SETTINGS_INITIAL_WINDOW_SIZE = 0):
//! a stalled stream pauses its producer and holds no more than its window allows and a
//! small watermark (issue #22, item 4). Hundreds of stalled downloads or event streams on
//! a few connections grow the worker by a few MiB, and the memory comes back (or at least
//! does not grow again) once the connections close.

use std::time::{Duration, Instant};

use crate::h2util::H2Client;
use crate::util::*;

/// Stalled streams per connection, and connections.
const STREAMS: usize = 100;
const CONNECTIONS: usize = 4;
/// The most 400 stalled streams may grow the worker's RSS.
const RSS_BOUND_KIB: i64 = 10 * 1024;
/// How long the worker is watched after the last head, for reads it should not do.
const SETTLE: Duration = Duration::from_secs(1);

/// A client whose stream windows are `window` bytes and never reopened (its connection
/// window is wide: only the streams stall).
fn stalling_client(server: &Server, window: u32) -> H2Client {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(window).initial_connection_window_size(64 << 20);
    H2Client::h2c_with(server.addr(), builder)
}

/// `CONNECTIONS` connections with `STREAMS` requests for `path` each, every response head
/// received, no more than `window` body bytes let in per stream. Returns the clients (the
/// streams stay open while they live).
fn stall(server: &Server, path: &str, window: u32) -> Vec<(H2Client, Vec<h2::RecvStream>)> {
    let mut all = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut c = stalling_client(server, window);
        let mut pending = Vec::new();
        for _ in 0..STREAMS {
            let req = c.build("GET", path, &[]);
            pending.push(c.start(req, true).0);
        }
        let mut bodies = Vec::new();
        for mut rf in pending {
            let resp = c.head(&mut rf).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert_eq!(resp.status(), 200, "{path}");
            bodies.push(resp.into_body());
        }
        all.push((c, bodies));
    }
    all
}

/// The worker's RSS over `SETTLE` after `stall`: the most it grew above `before`.
fn growth_while_stalled(worker: i32, before: i64, window: u32, clients: &mut [(H2Client, Vec<h2::RecvStream>)]) -> i64 {
    let deadline = Instant::now() + SETTLE;
    let mut most = 0;
    while Instant::now() < deadline {
        for (c, _) in clients.iter_mut() {
            c.pump();
        }
        most = most.max(anon_rss_kib(worker) - before);
    }
    let received: usize = clients.iter().map(|(c, _)| c.received).sum();
    let allowed = CONNECTIONS * STREAMS * (window as usize + 4096);
    assert!(received < allowed, "{received} bytes came through windows of {window} bytes");
    most
}

/// Two rounds of `CONNECTIONS` × `STREAMS` requests for `path` stalled after `window` bytes
/// each: each round grows the worker by less than `RSS_BOUND_KIB`, and the second round does
/// not grow it past the bound again.
fn stalled_streams_hold_little(server: &Server, path: &str, window: u32) {
    let worker = server.wait_workers(1, IO_TIMEOUT)[0];
    // Warm up: one whole exchange of the kind, so lazily made state is there before `before`.
    let mut warm = H2Client::h2c(server.addr());
    assert_eq!(warm.get("/health").status, 200);
    drop(warm);
    let before = anon_rss_kib(worker);
    let mut first = stall(server, path, window);
    let grew = growth_while_stalled(worker, before, window, &mut first);
    let what = format!("{path}: {} streams stalled after {window} bytes", CONNECTIONS * STREAMS);
    eprintln!("{what}: the worker grew by {grew} KiB");
    assert!(grew < RSS_BOUND_KIB, "{what}: the worker grew by {grew} KiB");
    drop(first);
    // The worker lets the connections go (its SSE count, when it keeps one, drops).
    assert!(eventually(IO_TIMEOUT, || server.get("/health").status == 200));
    let after_first = anon_rss_kib(worker);
    let mut second = stall(server, path, window);
    let grew_again = growth_while_stalled(worker, before, window, &mut second);
    eprintln!("{what}: after the first round +{} KiB, second round peak +{grew_again} KiB", after_first - before);
    assert!(grew_again < RSS_BOUND_KIB, "{what}: the second round grew the worker by {grew_again} KiB");
    drop(second);
}

/// A server with `[download] dir` holding `big.bin` (8 MiB), no rate limit.
fn download_server() -> (Server, tempfile::TempDir) {
    let tmp = tempfile::Builder::new().prefix("forkd-h2stall-").tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("big.bin"), vec![0x42; 8 << 20]).expect("write");
    let server =
        Server::builder().no_rate_limit().set("download", &format!("dir = \"{}\"", tmp.path().display())).start();
    (server, tmp)
}

#[test]
fn four_hundred_downloads_with_closed_windows_hold_a_few_mib() {
    let (server, _files) = download_server();
    stalled_streams_hold_little(&server, "/download/big.bin", 0);
}

#[test]
fn four_hundred_downloads_stalled_after_8_kib_hold_a_few_mib() {
    let (server, _files) = download_server();
    stalled_streams_hold_little(&server, "/download/big.bin", 8192);
}

#[test]
fn four_hundred_event_streams_with_closed_windows_hold_a_few_mib() {
    let server = Server::api_builder().start();
    stalled_streams_hold_little(&server, "/api/events", 0);
}
