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

/// A client whose stream windows are closed: nothing but heads can come.
fn closed_window_client(server: &Server) -> H2Client {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    H2Client::h2c_with(server.addr(), builder)
}

/// `CONNECTIONS` connections with `STREAMS` requests for `path` each, every response head
/// received, no body byte let in. Returns the clients (the streams stay open while they live).
fn stall(server: &Server, path: &str) -> Vec<(H2Client, Vec<h2::RecvStream>)> {
    let mut all = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut c = closed_window_client(server);
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
fn growth_while_stalled(worker: i32, before: i64, clients: &mut [(H2Client, Vec<h2::RecvStream>)]) -> i64 {
    let deadline = Instant::now() + SETTLE;
    let mut most = 0;
    while Instant::now() < deadline {
        for (c, _) in clients.iter_mut() {
            c.pump();
        }
        most = most.max(vm_rss_kib(worker) - before);
    }
    let received: usize = clients.iter().map(|(c, _)| c.received).sum();
    assert!(received < 4 << 20, "{received} bytes came through closed windows");
    most
}

/// Two rounds of `CONNECTIONS` × `STREAMS` stalled requests for `path`: each grows the worker
/// by less than `RSS_BOUND_KIB`, and the second round does not grow it past the first.
fn stalled_streams_hold_little(server: &Server, path: &str) {
    let worker = server.wait_workers(1, IO_TIMEOUT)[0];
    // Warm up: one whole exchange of the kind, so lazily made state is there before `before`.
    let mut warm = H2Client::h2c(server.addr());
    assert_eq!(warm.get("/health").status, 200);
    drop(warm);
    let before = vm_rss_kib(worker);
    let mut first = stall(server, path);
    let grew = growth_while_stalled(worker, before, &mut first);
    eprintln!("{path}: {} stalled streams grew the worker by {grew} KiB", CONNECTIONS * STREAMS);
    assert!(grew < RSS_BOUND_KIB, "{path}: {} stalled streams grew the worker by {grew} KiB", CONNECTIONS * STREAMS);
    drop(first);
    // The worker lets the connections go (its SSE count, when it keeps one, drops).
    assert!(eventually(IO_TIMEOUT, || server.get("/health").status == 200));
    let after_first = vm_rss_kib(worker);
    let mut second = stall(server, path);
    let grew_again = growth_while_stalled(worker, before, &mut second);
    eprintln!("{path}: after the first round {} KiB, second round peak +{grew_again} KiB", after_first - before);
    assert!(grew_again < RSS_BOUND_KIB, "{path}: the second round grew the worker by {grew_again} KiB");
    drop(second);
}

#[test]
fn four_hundred_stalled_downloads_hold_a_few_mib() {
    let tmp = tempfile::Builder::new().prefix("forkd-h2stall-").tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("big.bin"), vec![0x42; 8 << 20]).expect("write");
    let server =
        Server::builder().no_rate_limit().set("download", &format!("dir = \"{}\"", tmp.path().display())).start();
    stalled_streams_hold_little(&server, "/download/big.bin");
}

#[test]
fn four_hundred_stalled_event_streams_hold_a_few_mib() {
    let server = Server::api_builder().start();
    stalled_streams_hold_little(&server, "/api/events");
}
