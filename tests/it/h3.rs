//! HTTP/3 served by the workers (RFC 9114 over QUIC on the slot's UDP socket): the real binary
//! over real UDP on 127.0.0.1, spoken to with the blocking client in `h3client.rs`. REST
//! routes, a pool job (sign-up), SSE, a 100 MiB download under QUIC flow control with the
//! worker's memory bounded, many connections over two workers, `Alt-Svc` on TLS responses,
//! 0-RTT (GET served, POST 425), graceful stop during a stream, a killed worker's
//! connections reset while the other worker's go on, and a connection that survives the
//! client's moves to new ports (packets steered to its worker by connection ID).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;

use crate::h3client::{client_config, client_config_with_tickets, H3Client, TIMEOUT};
use crate::tls::tls_server;
use crate::util::*;

const H3_ON: &str = "[http3]\nenabled = true\n";
/// Fast password hashing and no rate limit (the API tests' settings), HTTP/3 on.
const API_H3: &str =
    "[auth]\nargon2_memory_kib = 1024\nargon2_iterations = 1\n[rate_limit]\nenabled = false\n[http3]\nenabled = true\n";

#[test]
fn health_and_a_json_route() {
    let (server, addr, pki, _d) = tls_server(1, "", H3_ON);
    server.wait_workers(1, Duration::from_secs(10));
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let r = c.get("/health");
    assert_eq!(r.status(), 200, "{r:?}\n{}", server.log_tail());
    assert!(r.header("content-type").is_some_and(|v| v.starts_with("application/json")), "{r:?}");
    assert!(r.json().is_object());
    let config = c.get("/api/config");
    assert_eq!(config.status(), 200, "{config:?}");
    assert!(config.json().is_object());
    let missing = c.get("/nope");
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json()["code"], "NOT_FOUND", "{}", missing.body_str());
    // HEAD: the head only.
    let id = c.send("HEAD", "/health", &[], b"");
    let head = c.response(id);
    assert_eq!((head.status(), head.body.len()), (200, 0), "{head:?}");
    // The access log names the exchange.
    server.wait_log_line(IO_TIMEOUT, |l| l.contains("/api/config"));
}

#[test]
fn sign_up_and_login_over_h3() {
    let (server, addr, pki, _d) = tls_server(1, "", API_H3);
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let email = unique_email("h3");
    let body = serde_json::to_vec(&json!({"name": "Ada", "email": email, "password": "correct horse 42"})).unwrap();
    let json_ct = [("content-type", "application/json")];
    let id = c.send("POST", "/api/v1/users", &json_ct, &body);
    let r = c.response(id);
    assert_eq!(r.status(), 201, "{}\n{}", r.body_str(), server.log_tail());
    assert_eq!(r.json()["data"]["email"], json!(email));
    let login = serde_json::to_vec(&json!({"email": email, "password": "correct horse 42"})).unwrap();
    let id = c.send("POST", "/api/v1/auth/login", &json_ct, &login);
    let r = c.response(id);
    assert_eq!(r.status(), 200, "{}", r.body_str());
    let token = r.json()["data"]["accessToken"].as_str().expect("an access token").to_string();
    let auth = format!("Bearer {token}");
    let id = c.send("GET", "/api/v1/auth/me", &[("authorization", &auth)], b"");
    let me = c.response(id);
    assert_eq!(me.status(), 200, "{}", me.body_str());
    assert_eq!(me.json()["data"]["email"], json!(email));
    // A body over the limit: 413, as over TCP.
    let big = vec![b' '; 2 << 20];
    let id = c.send("POST", "/api/v1/users", &json_ct, &big);
    let r = c.response(id);
    assert_eq!(r.status(), 413, "{}", r.body_str());
}

#[test]
fn an_event_stream_receives_a_notification() {
    let (server, addr, pki, _d) = tls_server(1, "", &format!("{API_H3}[sse]\nheartbeat_ms = 300\n"));
    let (_, admin) = server.admin();
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let id = c.send("GET", "/api/events", &[("accept", "text/event-stream")], b"");
    let deadline = Instant::now() + TIMEOUT;
    c.run_until(deadline, |c| !c.partial(id).heads.is_empty());
    let head = c.partial(id);
    assert_eq!(head.status(), 200, "{head:?}\n{}", server.log_tail());
    assert!(head.header("content-type").is_some_and(|v| v.starts_with("text/event-stream")), "{head:?}");
    // A heartbeat comes on its own; then a notification posted over HTTP/1.1 arrives.
    c.run_until(deadline, |c| c.partial(id).body_str().contains("heartbeat"));
    assert!(c.partial(id).body_str().contains("heartbeat"), "{:?}", c.partial(id).body_str());
    let n = server.notify(&admin, "over h3", "hello");
    let want = format!("id: {}", n["id"]);
    c.run_until(deadline, |c| c.partial(id).body_str().contains(&want));
    let text = c.partial(id).body_str();
    assert!(text.contains(&want) && text.contains("over h3"), "{text}\n{}", server.log_tail());
    assert!(!c.streams[&id].fin, "the stream stays open");
}

/// A server with `[download] dir` and HTTP/3; its download directory.
fn download_server(workers: usize, extra: &str) -> (Server, std::net::SocketAddr, crate::tls::Pki, tempfile::TempDir) {
    let files = tempfile::Builder::new().prefix("forkd-h3dl-").tempdir().expect("tempdir");
    let (s, addr, pki, _d) =
        tls_server(workers, "", &format!("{H3_ON}{extra}[download]\ndir = \"{}\"\n", files.path().display()));
    std::mem::forget(_d);
    (s, addr, pki, files)
}

/// `n` bytes of a pattern that shows a misplaced or lost slice.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8).collect()
}

#[test]
fn a_100_mib_download_is_byte_exact_with_bounded_worker_memory() {
    let (server, addr, pki, files) = download_server(1, "");
    let data = pattern(100 << 20);
    std::fs::write(files.path().join("big.bin"), &data).expect("write");
    let worker = server.wait_workers(1, Duration::from_secs(10))[0];
    let mut c = H3Client::connect(addr, &client_config(&pki));
    assert_eq!(c.get("/health").status(), 200);
    let before = anon_rss_kib(worker);
    let started = Instant::now();
    let id = c.send("GET", "/download/big.bin", &[], b"");
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut peak = before;
    let mut steps = 0u64;
    c.run_until(deadline, |c| {
        steps += 1;
        if steps % 200 == 0 {
            peak = peak.max(anon_rss_kib(worker));
        }
        c.streams.get(&id).is_some_and(|s| s.fin || s.reset.is_some()) || c.lost.is_some()
    });
    let elapsed = started.elapsed();
    let r = c.response(id);
    assert_eq!(r.status(), 200, "{:?}", r.heads);
    assert_eq!(r.header("content-length"), Some("104857600"));
    assert_eq!(r.body.len(), data.len(), "the whole body");
    assert!(r.body == data, "byte-exact");
    eprintln!(
        "HTTP/3 100 MiB download: {elapsed:?} ({:.1} MiB/s); worker RSS {before} KiB -> peak {peak} KiB",
        100.0 / elapsed.as_secs_f64()
    );
    assert!(peak - before < 48 * 1024, "worker RSS grew {} KiB during the download", peak - before);
}

#[test]
fn forty_connections_over_two_workers_are_all_answered() {
    let (server, addr, pki, _d) = tls_server(2, "", H3_ON);
    let workers: HashSet<i32> = server.wait_workers(2, Duration::from_secs(10)).into_iter().collect();
    let config = client_config(&pki);
    let mut clients: Vec<H3Client> = (0..40).map(|_| H3Client::start(addr, &config)).collect();
    let ids: Vec<_> = clients
        .iter_mut()
        .map(|c| {
            let deadline = Instant::now() + TIMEOUT;
            c.run_until(deadline, |c| !c.conn.is_handshaking() || c.lost.is_some());
            c.send("GET", "/_debug/pid", &[], b"")
        })
        .collect();
    let mut seen = HashSet::new();
    for (c, id) in clients.iter_mut().zip(ids) {
        let r = c.response(id);
        assert_eq!(r.status(), 200, "{r:?}\n{}", server.log_tail());
        let pid = r.json()["pid"].as_i64().expect("pid") as i32;
        assert!(workers.contains(&pid), "{pid} is a worker");
        seen.insert(pid);
    }
    assert_eq!(seen.len(), 2, "both workers served connections");
}

#[test]
fn alt_svc_on_tls_responses_only_with_http3_on() {
    let (server, addr, pki, _d) = tls_server(1, "", "[http3]\nenabled = true\nalt_svc_max_age = 60\n");
    let want = format!("h3=\":{}\"; ma=60", addr.port());
    let h1 = crate::tls::https_get(addr, &crate::tls::client_config(&pki, rustls::DEFAULT_VERSIONS), "/health");
    assert_eq!(h1.status, 200);
    assert!(h1.head.to_ascii_lowercase().contains(&format!("alt-svc: {want}").to_ascii_lowercase()), "{}", h1.head);
    let mut h2 = crate::h2util::H2Client::tls(addr, crate::h2util::h2_tls_config(&pki.ca_pem));
    let r = h2.get("/nope");
    assert_eq!((r.status, r.header("alt-svc")), (404, Some(want.as_str())), "{r:?}");
    // Errors the codecs answer themselves carry it too: a malformed HTTP/1.1 request line
    // (400), an HTTP/2 body announced over the limit (413).
    let bad = crate::tls::https_get(addr, &crate::tls::client_config(&pki, rustls::DEFAULT_VERSIONS), "/a b");
    assert_eq!(bad.status, 400, "{}", bad.head);
    assert!(bad.head.to_ascii_lowercase().contains(&format!("alt-svc: {want}").to_ascii_lowercase()), "{}", bad.head);
    let (mut rf, _) = h2.start(
        h2.build("POST", "/api/v1/users", &[("content-type", "application/json"), ("content-length", "99999999")]),
        false,
    );
    let r = h2.head(&mut rf).expect("head");
    assert_eq!(
        (r.status().as_u16(), r.headers().get("alt-svc").and_then(|v| v.to_str().ok())),
        (413, Some(want.as_str()))
    );
    // Not over plain HTTP.
    assert_eq!(server.get("/health").header("alt-svc"), None);
    let bad = server.call("GET", "/a b", &[], b"");
    assert_eq!((bad.status, bad.header("alt-svc")), (400, None));
    // Off: no Alt-Svc over TLS either.
    let (_off, addr, pki, _d2) = tls_server(1, "", "");
    let h1 = crate::tls::https_get(addr, &crate::tls::client_config(&pki, rustls::DEFAULT_VERSIONS), "/health");
    assert_eq!(h1.status, 200);
    assert!(!h1.head.to_ascii_lowercase().contains("alt-svc"), "{}", h1.head);
    let mut h2 = crate::h2util::H2Client::tls(addr, crate::h2util::h2_tls_config(&pki.ca_pem));
    assert_eq!(h2.get("/health").header("alt-svc"), None);
}

#[test]
fn zero_rtt_get_is_served_and_post_is_too_early() {
    let (server, addr, pki, _d) = tls_server(1, "", H3_ON);
    let config = client_config(&pki);
    let mut first = H3Client::connect(addr, &config);
    assert_eq!(first.get("/health").status(), 200);
    // The resumed connection sends its requests in 0-RTT, before the handshake is done.
    let mut c = H3Client::start(addr, &config);
    assert!(c.conn.has_0rtt(), "the client resumes with 0-RTT keys");
    let get = c.send("GET", "/health", &[], b"");
    let post = c.send("POST", "/api/v1/auth/login", &[("content-type", "application/json")], b"{}");
    let g = c.response(get);
    assert_eq!(g.status(), 200, "{g:?}\n{}", server.log_tail());
    let p = c.response(post);
    assert_eq!(p.status(), 425, "{p:?}");
    assert_eq!(p.json()["code"], "TOO_EARLY", "{}", p.body_str());
    assert!(c.conn.accepted_0rtt(), "the server took the early data");
    // After the handshake the same POST reaches its handler.
    let again = c.send("POST", "/api/v1/auth/login", &[("content-type", "application/json")], b"{}");
    let r = c.response(again);
    assert_ne!(r.status(), 425, "{r:?}");
}

#[test]
fn zero_rtt_resumes_on_any_worker() {
    // Two workers: each new connection comes from a new client port, so the kernel's hash
    // sends its first packet to either worker. With a session store per worker, a session
    // issued by one would resume without 0-RTT on the other (about half of the time, so 8 in
    // a row would all pass with a chance of 1 in 256); the store in shared memory serves
    // early data whichever worker the client reaches.
    // Each resumption takes a ticket; the server sends new ones when the client's Finished
    // arrives, which may be after the early answer: each round waits for its tickets.
    let (server, addr, pki, _d) = tls_server(2, "", H3_ON);
    server.wait_workers(2, Duration::from_secs(10));
    let (config, tickets) = client_config_with_tickets(&pki);
    let mut first = H3Client::connect(addr, &config);
    assert_eq!(first.get("/health").status(), 200);
    for round in 0..8 {
        let before = tickets.received();
        let mut c = H3Client::start(addr, &config);
        assert!(c.conn.has_0rtt(), "round {round}: the client resumes with 0-RTT keys");
        let get = c.send("GET", "/health", &[], b"");
        assert_eq!(c.response(get).status(), 200, "round {round}\n{}", server.log_tail());
        assert!(c.conn.accepted_0rtt(), "round {round}: early data refused\n{}", server.log_tail());
        c.run_until(Instant::now() + TIMEOUT, |c| c.lost.is_some() || tickets.received() > before);
        assert!(tickets.received() > before, "round {round}: a new ticket on the resumed connection");
    }
}

#[test]
fn zero_rtt_off_with_early_data_false() {
    let (_server, addr, pki, _d) = tls_server(1, "", "[http3]\nenabled = true\nearly_data = false\n");
    let config = client_config(&pki);
    let mut first = H3Client::connect(addr, &config);
    assert_eq!(first.get("/health").status(), 200);
    let mut c = H3Client::start(addr, &config);
    let id = if c.conn.has_0rtt() { Some(c.send("GET", "/health", &[], b"")) } else { None };
    let deadline = Instant::now() + TIMEOUT;
    c.run_until(deadline, |c| !c.conn.is_handshaking() || c.lost.is_some());
    assert!(!c.conn.accepted_0rtt(), "no early data accepted");
    if let Some(id) = id {
        // quinn sends the 0-RTT request again in 1-RTT once it was rejected.
        assert_eq!(c.response(id).status(), 200);
    }
    assert_eq!(c.get("/health").status(), 200);
}

#[test]
fn graceful_stop_lets_an_open_stream_finish() {
    let (mut server, addr, pki, files) = download_server(1, "");
    let data = pattern(24 << 20);
    std::fs::write(files.path().join("mid.bin"), &data).expect("write");
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let id = c.send("GET", "/download/mid.bin", &[], b"");
    let deadline = Instant::now() + Duration::from_secs(120);
    c.run_until(deadline, |c| c.partial(id).body.len() >= 1 << 20);
    assert!(c.partial(id).body.len() >= 1 << 20, "the download started\n{}", server.log_tail());
    server.signal(Signal::SIGTERM);
    c.run_until(deadline, |c| c.streams[&id].fin || c.streams[&id].reset.is_some() || c.lost.is_some());
    let r = c.response(id);
    assert!(r.body == data, "the whole body after the stop began ({} of {} bytes)", r.body.len(), data.len());
    c.run_until(Instant::now() + TIMEOUT, |c| c.goaway || c.lost.is_some());
    assert!(c.goaway, "GOAWAY came");
    // The client goes on (acknowledging the body's last packets) until the worker closes the
    // connection: otherwise the worker keeps it until its idle timeout, as long as the drain's.
    c.run_until(Instant::now() + TIMEOUT, |c| c.lost.is_some());
    assert!(server.wait_exit(Duration::from_secs(30)).is_some(), "the server exits\n{}", server.log_tail());
}

#[test]
fn a_connection_survives_the_clients_address_change() {
    // Two workers. After each rebind the client's packets come from a new port with a
    // connection ID it has not used before: without steering by the ID, the kernel's hash of
    // the new 4-tuple picks either worker, and the one without the connection answers with a
    // stateless reset (so 16 rebinds in a row would all survive with a chance of 1 in 65 536).
    let (server, addr, pki, _d) = tls_server(2, "", H3_ON);
    server.wait_workers(2, Duration::from_secs(10));
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let r = c.get("/_debug/pid");
    assert_eq!(r.status(), 200, "{r:?}\n{}", server.log_tail());
    let pid = r.json()["pid"].as_i64().expect("pid");
    let mut ports = HashSet::new();
    for round in 0..16 {
        // The kernel may hand out a port this client left a few rounds ago: rebind again.
        let mut local = c.rebind();
        for _ in 0..8 {
            if !ports.contains(&local.port()) {
                break;
            }
            local = c.rebind();
        }
        assert!(ports.insert(local.port()), "a new port each time");
        let id = c.send("GET", "/_debug/pid", &[], b"");
        let deadline = Instant::now() + TIMEOUT;
        c.run_until(deadline, |c| c.lost.is_some() || c.streams[&id].fin || c.streams[&id].reset.is_some());
        assert!(
            c.lost.is_none(),
            "round {round}: connection lost after moving to {local}: {:?}\n{}",
            c.lost,
            server.log_tail()
        );
        let r = c.response(id);
        assert_eq!(
            (r.status(), r.json()["pid"].as_i64()),
            (200, Some(pid)),
            "round {round}: answered on the same connection by the same worker"
        );
    }
    // The connection carried every request (no new handshake).
    assert!(c.lost.is_none() && !c.conn.is_handshaking());
}

#[test]
fn a_killed_workers_connections_are_reset_the_others_go_on() {
    let (server, addr, pki, _d) = tls_server(2, "", H3_ON);
    server.wait_workers(2, Duration::from_secs(10));
    let config = client_config(&pki);
    // Connections until both workers hold one.
    let mut by_pid: Vec<(i32, H3Client)> = Vec::new();
    for _ in 0..64 {
        let mut c = H3Client::connect(addr, &config);
        let pid = c.get("/_debug/pid").json()["pid"].as_i64().expect("pid") as i32;
        if !by_pid.iter().any(|(p, _)| *p == pid) {
            by_pid.push((pid, c));
        }
        if by_pid.len() == 2 {
            break;
        }
    }
    assert_eq!(by_pid.len(), 2, "connections on both workers");
    let (victim, mut dead) = by_pid.remove(0);
    let (other, mut alive) = by_pid.remove(0);
    kill_pid(victim, Signal::SIGKILL);
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = server.workers();
            now.len() == 2 && !now.contains(&victim)
        }),
        "a replacement worker\n{}",
        server.log_tail()
    );
    // The other worker's connection goes on.
    let r = alive.get("/_debug/pid");
    assert_eq!((r.status(), r.json()["pid"].as_i64()), (200, Some(i64::from(other))));
    // The killed worker's connection: its packets reach the new worker, which resets it.
    let id = dead.send("GET", "/health", &[], b"");
    let deadline = Instant::now() + TIMEOUT;
    dead.run_until(deadline, |c| c.lost.is_some() || c.streams[&id].fin);
    assert!(
        matches!(dead.lost, Some(quinn_proto::ConnectionError::Reset)),
        "stateless reset: {:?} (fin {})\n{}",
        dead.lost,
        dead.streams[&id].fin,
        server.log_tail()
    );
    // A new connection works.
    let mut fresh = H3Client::connect(addr, &config);
    assert_eq!(fresh.get("/health").status(), 200);
}

#[test]
fn early_hints_on_the_homepage() {
    let (server, addr, pki, _d) = tls_server(1, "", H3_ON);
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let id = c.send("GET", "/", &[("accept", "text/html")], b"");
    let r = c.response(id);
    assert!(r.heads.len() >= 2, "103 then the answer: {:?}\n{}", r.heads, server.log_tail());
    let first = &r.heads[0];
    assert!(first.iter().any(|(n, v)| n == ":status" && v == "103"), "{first:?}");
    assert!(first.iter().any(|(n, v)| n == "link" && v.contains("rel=preload")), "{first:?}");
    assert_eq!(r.status(), 200, "{:?}", r.heads.last());
}

/// A one-worker server with a 16 MiB download under way on an HTTP/3 connection: the server,
/// its address, the client config, the client, the stream, the file's bytes, the worker pid
/// (and the file's directory, kept alive).
struct MidDownload {
    server: Server,
    addr: std::net::SocketAddr,
    config: quinn_proto::ClientConfig,
    c: H3Client,
    id: quinn_proto::StreamId,
    data: Vec<u8>,
    old: i32,
    _files: tempfile::TempDir,
}

const MID_DEADLINE: Duration = Duration::from_secs(120);

fn mid_download() -> MidDownload {
    mid_download_with("")
}

/// [`mid_download`] with `extra` configuration.
fn mid_download_with(extra: &str) -> MidDownload {
    let (server, addr, pki, files) = download_server(1, extra);
    let data = pattern(16 << 20);
    std::fs::write(files.path().join("mid.bin"), &data).expect("write");
    let old = server.wait_workers(1, Duration::from_secs(10))[0];
    let config = client_config(&pki);
    let mut c = H3Client::connect(addr, &config);
    let id = c.send("GET", "/download/mid.bin", &[], b"");
    c.run_until(Instant::now() + MID_DEADLINE, |c| c.partial(id).body.len() >= 1 << 20);
    assert!(c.partial(id).body.len() >= 1 << 20, "the download started\n{}", server.log_tail());
    MidDownload { server, addr, config, c, id, data, old, _files: files }
}

impl MidDownload {
    /// The stream runs to its end, byte-exact, on the same connection (`across`: what
    /// happened meanwhile, for the message).
    fn finishes(&mut self, across: &str) {
        let (c, id) = (&mut self.c, self.id);
        c.run_until(Instant::now() + MID_DEADLINE, |c| {
            c.streams[&id].fin || c.streams[&id].reset.is_some() || c.lost.is_some()
        });
        assert!(c.lost.is_none(), "{:?} after {} bytes\n{}", c.lost, c.partial(id).body.len(), self.server.log_tail());
        let r = c.response(id);
        assert!(
            r.body == self.data,
            "the whole body across the {across} ({} of {} bytes)",
            r.body.len(),
            self.data.len()
        );
    }

    /// The pid of the worker that answers a new connection.
    fn fresh_pid(&self) -> i32 {
        let mut fresh = H3Client::connect(self.addr, &self.config);
        fresh.get("/_debug/pid").json()["pid"].as_i64().expect("pid") as i32
    }
}

#[test]
fn reload_lets_an_open_stream_finish_and_the_new_worker_serves() {
    let mut m = mid_download();
    m.server.signal(Signal::SIGHUP);
    // The old worker drains beside its replacement (both read the slot's socket): its stream
    // goes on to the end; the replacement leaves its packets alone.
    m.finishes("reload");
    m.c.run_until(Instant::now() + TIMEOUT, |c| c.goaway || c.lost.is_some());
    assert!(m.c.goaway, "GOAWAY from the draining worker");
    // Acknowledging the last packets until the worker closes (see the graceful stop's test).
    m.c.run_until(Instant::now() + TIMEOUT, |c| c.lost.is_some());
    assert!(
        eventually(Duration::from_secs(30), || !m.server.workers().contains(&m.old)),
        "the old worker exits\n{}",
        m.server.log_tail()
    );
    assert_ne!(m.fresh_pid(), m.old, "served by the replacement");
}

#[test]
fn usr2_lets_an_open_stream_finish_and_the_new_supervisor_serves() {
    use crate::upgrade::{new_supervisor_pid, StopOnDrop};
    let mut m = mid_download();
    m.server.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&m.server);
    let _stop = StopOnDrop(new_pid);
    // The new supervisor's worker shares the slot's UDP socket with the old worker, which
    // drains: it must leave the old connection's packets alone (not reset them).
    m.finishes("upgrade");
    let status = m.server.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "the old supervisor drains: {status:?}\n{}", m.server.log_tail());
    let pid = m.fresh_pid();
    assert!(pid != m.old && worker_pids(new_pid).contains(&pid), "served by the new supervisor's worker");
}

#[test]
fn rate_limits_count_http3_with_the_tcp_traffic() {
    let (server, addr, pki, _d) =
        tls_server(2, "", &format!("{H3_ON}[rate_limit]\nenabled = true\nmax = 4\nwindow_secs = 900\n"));
    for _ in 0..2 {
        assert_eq!(server.get("/api/config").status, 200, "over TCP");
    }
    let mut c = H3Client::connect(addr, &client_config(&pki));
    for left in ["1", "0"] {
        let r = c.get("/api/config");
        assert_eq!((r.status(), r.header("ratelimit-remaining")), (200, Some(left)), "{:?}", r.heads);
    }
    let r = c.get("/api/config");
    assert_eq!(r.status(), 429, "the fifth request of the address, over HTTP/3: {:?}", r.heads);
    assert_eq!(r.json()["code"], "RATE_LIMITED");
    assert_eq!(server.get("/api/config").status, 429, "and over TCP");
}

/// `POST /api/chat` over HTTP/3; the whole streamed body.
fn chat_over_h3(addr: std::net::SocketAddr, pki: &crate::tls::Pki, text: &str) -> crate::h3client::H3Response {
    let mut c = H3Client::connect(addr, &client_config(pki));
    let body = serde_json::to_vec(&json!({"messages": [{"role": "user", "content": text}]})).unwrap();
    let id = c.send("POST", "/api/chat", &[("content-type", "application/json")], &body);
    c.response(id)
}

#[test]
fn chat_echo_and_relay_stream_over_h3() {
    // The built-in echo: a ticker-driven stream.
    let (server, addr, pki, _d) = tls_server(1, "", &format!("{H3_ON}[chat]\necho_delay_ms = 20\n"));
    let r = chat_over_h3(addr, &pki, "one two three");
    assert_eq!(r.status(), 200, "{:?}\n{}", r.heads, server.log_tail());
    assert!(r.header("content-type").is_some_and(|v| v.starts_with("text/event-stream")), "{:?}", r.heads);
    let text = r.body_str();
    assert!(text.contains("one") && text.contains("three") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    // A relay: an upstream's deltas forwarded as they arrive, the stream ended after [DONE].
    let pieces: Vec<(Duration, String)> = ["alpha", "beta"]
        .iter()
        .map(|c| (Duration::ZERO, format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": c}}]}))))
        .chain([(Duration::ZERO, "data: [DONE]\n\n".to_string())])
        .collect();
    let up = crate::upstream::Upstream::start(move |_| {
        crate::upstream::Behaviour::sse(pieces.clone(), crate::upstream::After::Finish)
    });
    let (server, addr, pki, _d2) =
        tls_server(1, "", &format!("{H3_ON}[chat]\nupstream = \"{}/v1/chat/completions\"\nmodel = \"m1\"\n", up.url()));
    let r = chat_over_h3(addr, &pki, "hi");
    assert_eq!(r.status(), 200, "{:?}\n{}", r.heads, server.log_tail());
    let text = r.body_str();
    assert!(text.contains("alpha") && text.contains("beta") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(up.count("/v1/chat/completions"), 1);
}

#[test]
fn under_load_new_clients_are_retried_first() {
    // Under load from half of `max_connections` (TCP and QUIC): three here.
    let (server, addr, pki, _d) = tls_server(1, "", &format!("{H3_ON}[limits]\nmax_connections = 6\n"));
    let config = client_config(&pki);
    let mut first = H3Client::connect(addr, &config);
    assert_eq!((first.get("/health").status(), first.retries), (200, 0), "no Retry when idle");
    let _more: Vec<H3Client> = (0..2).map(|_| H3Client::connect(addr, &config)).collect();
    let mut loaded = H3Client::connect(addr, &config);
    assert_eq!(loaded.get("/health").status(), 200, "{}", server.log_tail());
    assert_eq!(loaded.retries, 1, "a Retry round trip first");
}

#[test]
fn a_more_urgent_stream_is_sent_first() {
    let (server, addr, pki, files) = download_server(1, "");
    let data = pattern(8 << 20);
    std::fs::write(files.path().join("a.bin"), &data).expect("write");
    std::fs::write(files.path().join("b.bin"), &data).expect("write");
    // The urgent file is opened and read on the pool: on a busy machine most of the lazy one
    // can be sent before the urgent one's first bytes are read, and then nothing was
    // compared; the pair is asked again.
    for attempt in 1..=5 {
        let mut c = H3Client::connect(addr, &client_config(&pki));
        // Asked for first, least urgent; then the most urgent one.
        let lazy = c.send("GET", "/download/a.bin", &[("priority", "u=7")], b"");
        let urgent = c.send("GET", "/download/b.bin", &[("priority", "u=0")], b"");
        let deadline = Instant::now() + Duration::from_secs(120);
        // How much of the lazy stream had come when the urgent one's first bytes came; which
        // ended first; how much of the lazy one had come by then.
        let (mut lazy_at_begin, mut first, mut lazy_at_first) = (None, None, 0);
        c.run_until(deadline, |c| {
            let done = |id| c.streams.get(&id).is_some_and(|s| s.fin);
            if lazy_at_begin.is_none() && c.streams.get(&urgent).is_some_and(|s| !s.bytes.is_empty()) {
                lazy_at_begin = Some(c.streams.get(&lazy).map_or(0, |s| s.bytes.len()));
            }
            for id in [urgent, lazy] {
                if first.is_none() && done(id) {
                    first = Some(id);
                    lazy_at_first = c.streams.get(&lazy).map_or(0, |s| s.bytes.len());
                }
            }
            done(urgent) && done(lazy)
        });
        assert_eq!(c.response(urgent).body.len(), data.len(), "{}", server.log_tail());
        assert_eq!(c.response(lazy).body.len(), data.len());
        // Both had most of their bytes still to send when they began to compete.
        if lazy_at_begin.is_none_or(|n| n > data.len() / 2) {
            eprintln!("attempt {attempt}: the u=7 stream had {lazy_at_begin:?} bytes when the u=0 one began; again");
            continue;
        }
        eprintln!("u=7 stream had {lazy_at_first} of ~{} bytes when the first stream ended", data.len());
        assert_eq!(first, Some(urgent), "the u=0 stream ends first");
        return;
    }
    panic!("in 5 attempts the u=7 stream was always half sent before the u=0 one began");
}

#[test]
fn a_less_urgent_stream_goes_on_while_the_urgent_one_waits_for_its_window() {
    let (server, addr, pki, files) = download_server(1, "");
    let data = pattern(4 << 20);
    std::fs::write(files.path().join("a.bin"), &data).expect("write");
    let mut c = H3Client::connect(addr, &client_config(&pki));
    let urgent = c.send("GET", "/download/a.bin", &[("priority", "u=0")], b"");
    // Never read: the urgent stream's window stays where it is once the server filled it.
    c.streams.remove(&urgent);
    let lazy = c.send("GET", "/download/a.bin", &[("priority", "u=7")], b"");
    let deadline = Instant::now() + Duration::from_secs(60);
    c.run_until(deadline, |c| c.streams.get(&lazy).is_some_and(|s| s.fin || s.reset.is_some()) || c.lost.is_some());
    assert_eq!(c.response(lazy).body, data, "{}", server.log_tail());
}

/// The pid `/_debug/pid` names on a new connection by `deadline`, or why not.
fn try_pid(addr: std::net::SocketAddr, config: &quinn_proto::ClientConfig, deadline: Instant) -> Result<i32, String> {
    let mut c = H3Client::start(addr, config);
    c.run_until(deadline, |c| !c.conn.is_handshaking() || c.lost.is_some());
    if c.lost.is_some() || c.conn.is_handshaking() {
        return Err(format!("handshake: lost {:?}", c.lost));
    }
    let id = c.send("GET", "/_debug/pid", &[], b"");
    c.run_until(deadline, |c| c.lost.is_some() || c.streams[&id].fin || c.streams[&id].reset.is_some());
    let s = &c.streams[&id];
    if !s.fin {
        return Err(format!("request: reset {:?}, lost {:?}, goaway {}", s.reset, c.lost, c.goaway));
    }
    c.response(id).json()["pid"].as_i64().map(|p| p as i32).ok_or_else(|| "no pid".to_string())
}

/// The pid `/_debug/pid` names on a new connection, if one answers within `within` (a new
/// connection each time one is refused: a worker that begins to drain sends GOAWAY).
fn pid_within(addr: std::net::SocketAddr, config: &quinn_proto::ClientConfig, within: Duration) -> Result<i32, String> {
    let deadline = Instant::now() + within;
    let mut failed = Vec::new();
    while Instant::now() < deadline {
        match try_pid(addr, config, deadline) {
            Ok(pid) => return Ok(pid),
            Err(e) => failed.push(e),
        }
    }
    Err(failed.join("; "))
}

impl MidDownload {
    /// Waits until the old worker drains.
    fn old_drains(&self) {
        let line = format!("worker {} draining", self.old);
        self.server.wait_log_line(Duration::from_secs(10), |l| l.contains(&line));
    }
}

/// How long a new client may take to be served while a worker drains (without the hand-over
/// by forwarding it was not served until the drain ended: `shutdown_timeout`, 30 s).
const SERVED_WITHIN: Duration = Duration::from_secs(10);

#[test]
fn new_clients_are_served_during_a_long_drain_after_a_reload() {
    let mut m = mid_download();
    m.server.signal(Signal::SIGHUP);
    let new = eventually_some(Duration::from_secs(10), || m.server.workers().into_iter().find(|&p| p != m.old))
        .unwrap_or_else(|| panic!("a new worker\n{}", m.server.log_tail()));
    // Until then the old worker serves new clients itself.
    m.old_drains();
    // The old client is not pumped: its stream stays open and the old worker keeps draining.
    let pid = pid_within(m.addr, &m.config, SERVED_WITHIN);
    assert_eq!(pid, Ok(new), "a new client is served by the new worker\n{}", m.server.log_tail());
    assert!(pid_alive(m.old), "while the old worker still drains");
    // The old worker's packets reach it through the new one.
    m.finishes("reload");
}

#[test]
fn new_clients_are_served_during_a_long_drain_after_usr2() {
    use crate::upgrade::{new_supervisor_pid, StopOnDrop};
    let mut m = mid_download();
    m.server.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&m.server);
    let _stop = StopOnDrop(new_pid);
    let new = eventually_some(Duration::from_secs(10), || worker_pids(new_pid).first().copied())
        .unwrap_or_else(|| panic!("a worker of the new supervisor\n{}", m.server.log_tail()));
    m.old_drains();
    let pid = pid_within(m.addr, &m.config, SERVED_WITHIN);
    assert_eq!(pid, Ok(new), "a new client is served by the new supervisor's worker\n{}", m.server.log_tail());
    assert!(pid_alive(m.old), "while the old supervisor's worker still drains");
    m.finishes("upgrade");
    let status = m.server.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "the old supervisor drains: {status:?}\n{}", m.server.log_tail());
}

#[test]
fn new_clients_are_served_across_memory_replacements() {
    // Every worker is over 1 MiB: each check (every 200 ms) replaces it, so the worker with the
    // download drains while one successor after another starts, and each says hello to it.
    let mut m = mid_download_with("[supervisor]\nworker_max_rss_mb = 1\nmemory_check_ms = 200\n");
    let started = m.server.workers();
    assert!(
        eventually(Duration::from_secs(10), || m.server.workers().iter().filter(|p| !started.contains(p)).count() >= 2),
        "two replacements\n{}",
        m.server.log_tail()
    );
    for round in 0..3 {
        let pid = pid_within(m.addr, &m.config, SERVED_WITHIN);
        assert!(pid.is_ok(), "round {round}: a new client is served: {pid:?}\n{}", m.server.log_tail());
    }
    m.finishes("memory replacements");
}

/// A stand-in successor for [`a_predecessor_whose_successor_died_reads_again`], run as a
/// process of its own (this test binary again, with `FORKD_FAKE_SUCCESSOR=<port>:<pid>`): it
/// says hello to that worker's inbox, prints the ack's generation, and exits when its stdin
/// closes. It does nothing in a normal run.
#[test]
#[ignore = "a helper process of a_predecessor_whose_successor_died_reads_again"]
fn fake_successor() {
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Ok(spec) = std::env::var("FORKD_FAKE_SUCCESSOR") else { return };
    let (port, pid) = spec.split_once(':').expect("port:pid");
    let name = |pid: &str| SocketAddr::from_abstract_name(format!("forkd-h3-{port}-{pid}")).expect("name");
    let sock = UnixDatagram::bind_addr(&name(&std::process::id().to_string())).expect("bind");
    sock.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    sock.send_to_addr(b"H", &name(pid)).expect("hello");
    let mut ack = [0u8; 16];
    let n = sock.recv(&mut ack).expect("an ack");
    assert_eq!((n, ack[0]), (2, b'A'), "{:?}", &ack[..n]);
    println!("FAKE-ACK {}", ack[1]);
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

#[test]
fn a_predecessor_whose_successor_died_reads_again() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut m = mid_download();
    // The worker is told a successor reads the socket for it: it stops reading and acks.
    let mut helper = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "h3::fake_successor", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env("FORKD_FAKE_SUCCESSOR", format!("{}:{}", m.addr.port(), m.old))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("helper");
    let out = helper.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines().map_while(Result::ok);
    let ack = lines
        .by_ref()
        // (The harness may print the test's name on the same line first.)
        .find_map(|l| l.split("FAKE-ACK ").nth(1).and_then(|g| g.trim().parse::<u8>().ok()));
    assert_eq!(ack, Some(m.old as u8), "acked with the worker's generation\n{}", m.server.log_tail());
    // The successor forwards nothing: a new client is not served meanwhile.
    let mut c = H3Client::start(m.addr, &m.config);
    c.run_until(Instant::now() + Duration::from_secs(1), |c| !c.conn.is_handshaking() || c.lost.is_some());
    assert!(c.conn.is_handshaking(), "the worker does not read the socket while its successor lives");
    // The successor dies before it served: the worker reads again, the waiting client and the
    // download go on.
    drop(helper.stdin.take());
    lines.for_each(drop);
    assert!(helper.wait().expect("helper exit").success(), "the helper");
    c.run_until(Instant::now() + SERVED_WITHIN, |c| !c.conn.is_handshaking() || c.lost.is_some());
    assert!(c.lost.is_none() && !c.conn.is_handshaking(), "served again: {:?}\n{}", c.lost, m.server.log_tail());
    let r = c.get("/_debug/pid");
    assert_eq!(r.json()["pid"].as_i64(), Some(i64::from(m.old)));
    m.finishes("successor's death");
}
