//! `GET /metrics` (CONTRACT §9): Prometheus text summed over every worker. Requests are
//! labelled by route pattern and status, the histogram is cumulative and agrees with the
//! request count, counts survive a killed worker, stream gauges follow open streams, and a
//! peer that is not loopback gets the same 404 as an unknown path.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::util::*;

/// One scrape: `series → value` (the series with its labels, as written).
struct Scrape {
    text: String,
    series: BTreeMap<String, f64>,
}

impl Scrape {
    fn get(&self, series: &str) -> f64 {
        self.series.get(series).copied().unwrap_or(0.0)
    }

    /// `forkd_http_requests_total` for one route pattern and status.
    fn requests(&self, route: &str, status: &str) -> f64 {
        self.get(&format!("forkd_http_requests_total{{route=\"{route}\",status=\"{status}\"}}"))
    }

    /// Every series of family `name` (any labels), summed.
    fn sum_of(&self, name: &str) -> f64 {
        self.series.iter().filter(|(k, _)| k.starts_with(&format!("{name}{{"))).map(|(_, v)| v).sum()
    }

    /// Every `forkd_http_requests_total` series, summed.
    fn requests_sum(&self) -> f64 {
        self.series.iter().filter(|(k, _)| k.starts_with("forkd_http_requests_total{")).map(|(_, v)| v).sum()
    }

    /// Route `route`'s histogram buckets in the order written: `(le, cumulative count)`.
    fn buckets(&self, route: &str) -> Vec<(String, f64)> {
        let prefix = format!("forkd_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"");
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .filter_map(|rest| {
                let (le, value) = rest.split_once("\"} ")?;
                Some((le.to_string(), value.parse().ok()?))
            })
            .collect()
    }
}

fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// `GET /metrics` on a fresh loopback connection: 200, the exposition content type.
fn scrape(s: &Server) -> Scrape {
    let r = s.get("/metrics");
    ensure_eq!(s, r.status, 200, "GET /metrics: {r:?}");
    ensure_eq!(
        s,
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8"),
        "GET /metrics content type"
    );
    let text = r.body_str();
    Scrape { series: parse(&text), text }
}

/// `GET /_debug/pid` on fresh connections until at least two workers answered; returns
/// the number of requests sent. Bounded by `eventually`.
fn reach_both_workers(s: &Server) -> usize {
    let mut seen = BTreeSet::new();
    let mut sent = 0;
    let ok = eventually(Duration::from_secs(10), || {
        seen.insert(s.debug_pid());
        sent += 1;
        seen.len() >= 2
    });
    ensure!(s, ok, "fresh connections reached only {seen:?} after {sent} requests");
    sent
}

protocols!(requests_are_counted_by_route_pattern_and_status);
fn requests_are_counted_by_route_pattern_and_status(p: Proto) {
    let s = Server::api_builder().start().on(p);
    let before = scrape(&s);
    let users: Vec<u16> = (1..=3).map(|id| s.get(&format!("/api/v1/users/{id}")).status).collect();
    ensure!(s, users.iter().all(|st| *st == users[0]), "GET /api/v1/users/N answered {users:?}");
    for name in ["nope-1.js", "nope-2.js"] {
        ensure_eq!(s, s.get(&format!("/static/{name}")).status, 404, "GET /static/{name}");
    }
    for path in ["/no/such/path", "/nope", "/api/v1/users/1/x/y"] {
        ensure_eq!(s, s.get(path).status, 404, "GET {path}");
    }
    ensure_eq!(s, s.call("DELETE", "/health", &[], b"").status, 405, "DELETE /health");

    let m = scrape(&s);
    let status = users[0].to_string();
    ensure_eq!(s, m.requests("/api/v1/users/{id}", &status), 3.0, "users by pattern\n{}", m.text);
    ensure_eq!(s, m.requests("/static/{name}", "404"), 2.0, "a route's own 404s\n{}", m.text);
    ensure_eq!(
        s,
        m.requests("other", "404") - before.requests("other", "404"),
        3.0,
        "unmatched paths count as `other`\n{}",
        m.text
    );
    ensure_eq!(s, m.requests("/health", "405"), 1.0, "a wrong method keeps the pattern\n{}", m.text);
    ensure!(s, m.requests("/metrics", "200") >= 1.0, "the earlier scrape is counted\n{}", m.text);
    ensure!(s, !m.text.contains("/api/v1/users/1"), "a raw path leaked into a label:\n{}", m.text);
    for name in [
        "forkd_http_requests_total counter",
        "forkd_http_request_duration_seconds histogram",
        "forkd_open_connections gauge",
        "forkd_sse_streams gauge",
        "forkd_websocket_clients gauge",
        "forkd_worker_restarts_total counter",
        "forkd_workers gauge",
        "process_resident_memory_bytes gauge",
        "process_open_fds gauge",
        "process_cpu_seconds_total counter",
    ] {
        ensure!(s, m.text.contains(&format!("\n# TYPE {name}\n")), "no `# TYPE {name}` in\n{}", m.text);
    }
    ensure_eq!(s, m.get("forkd_workers"), 1.0, "serving workers");
    ensure_eq!(s, m.get("forkd_worker_restarts_total"), 0.0, "restarts");
    ensure!(s, m.get("forkd_open_connections") >= 1.0, "the scrape's own connection is open\n{}", m.text);
}

protocols!(histogram_is_cumulative_per_route_and_its_count_is_the_requests_counted);
fn histogram_is_cumulative_per_route_and_its_count_is_the_requests_counted(p: Proto) {
    let s = Server::api_builder().start().on(p);
    ensure_eq!(s, s.get("/_debug/sleep?ms=300").status, 200, "a slow pool request");
    for _ in 0..5 {
        s.assert_healthy();
    }
    let m = scrape(&s);
    let buckets = m.buckets("/_debug/sleep");
    ensure_eq!(s, buckets.len(), 14, "buckets\n{}", m.text);
    ensure_eq!(s, buckets[0].0.as_str(), "0.0005", "first bucket");
    ensure_eq!(s, buckets[13].0.as_str(), "+Inf", "last bucket");
    ensure!(s, buckets.windows(2).all(|w| w[0].1 <= w[1].1), "buckets are not cumulative:\n{}", m.text);
    let le_250ms = buckets.iter().find(|(le, _)| le == "0.25").map(|b| b.1).unwrap_or(-1.0);
    ensure_eq!(s, (le_250ms, buckets[13].1), (0.0, 1.0), "the 300 ms request is above le=0.25:\n{}", m.text);
    let h = "forkd_http_request_duration_seconds";
    ensure!(s, m.get(&format!("{h}_sum{{route=\"/_debug/sleep\"}}")) >= 0.3, "_sum in seconds\n{}", m.text);
    let health = m.get(&format!("{h}_count{{route=\"/health\"}}"));
    ensure_eq!(s, health, m.requests("/health", "200"), "/health's count vs its requests\n{}", m.text);
    ensure!(s, health >= 6.0, "start-up probe and 5 × health: {health}");
    ensure_eq!(s, m.buckets("/health")[13].1, health, "+Inf bucket vs _count");
    ensure_eq!(s, m.sum_of(&format!("{h}_count")), m.requests_sum(), "requests counted vs _counts\n{}", m.text);
}

protocols!(every_process_reports_its_memory_descriptors_and_cpu);
fn every_process_reports_its_memory_descriptors_and_cpu(p: Proto) {
    let s = Server::api_builder().workers(2).start().on(p);
    let workers = s.wait_workers(2, Duration::from_secs(10));
    let m = scrape(&s);
    for (role, pid) in std::iter::once(("supervisor", s.pid())).chain(workers.iter().map(|&w| ("worker", w))) {
        let labels = format!("{{role=\"{role}\",pid=\"{pid}\"}}");
        let rss = m.get(&format!("process_resident_memory_bytes{labels}"));
        ensure!(s, rss > 1_000_000.0 && rss < 1e9, "{role} {pid} RSS {rss}\n{}", m.text);
        ensure!(s, m.get(&format!("process_open_fds{labels}")) >= 3.0, "{role} {pid} fds\n{}", m.text);
        ensure!(s, m.series.contains_key(&format!("process_cpu_seconds_total{labels}")), "{role} cpu\n{}", m.text);
    }
    ensure_eq!(
        s,
        m.series.keys().filter(|k| k.starts_with("process_open_fds{")).count(),
        3,
        "one series each\n{}",
        m.text
    );
}

protocols!(counts_are_summed_over_workers);
fn counts_are_summed_over_workers(p: Proto) {
    let s = Server::api_builder().workers(2).start().on(p);
    s.wait_workers(2, Duration::from_secs(10));
    let sent = reach_both_workers(&s);
    // Fresh connections land on either worker; every one of them sees the same sums.
    for i in 0..6 {
        let m = scrape(&s);
        ensure_eq!(s, m.requests("/_debug/pid", "200"), sent as f64, "scrape {i}\n{}", m.text);
        ensure_eq!(s, m.get("forkd_workers"), 2.0, "scrape {i}: serving workers");
        // The route's latency histogram is summed over the workers the same way.
        let count = m.get("forkd_http_request_duration_seconds_count{route=\"/_debug/pid\"}");
        ensure_eq!(s, count, sent as f64, "scrape {i}: the histogram's _count over both workers\n{}", m.text);
        let inf = m.buckets("/_debug/pid").last().map(|b| b.1);
        ensure_eq!(s, inf, Some(sent as f64), "scrape {i}: the +Inf bucket over both workers\n{}", m.text);
    }
}

protocols!(counts_survive_a_killed_worker);
fn counts_survive_a_killed_worker(p: Proto) {
    let s = Server::api_builder().workers(2).start().on(p);
    let before_workers = s.wait_workers(2, Duration::from_secs(10));
    let sent = reach_both_workers(&s);
    let before = scrape(&s);
    ensure_eq!(s, before.requests("/_debug/pid", "200"), sent as f64, "before the kill");
    let victim = before_workers[0];
    kill_pid(victim, Signal::SIGKILL);
    let replaced = eventually(Duration::from_secs(10), || {
        let w = s.workers();
        w.len() == 2 && !w.contains(&victim)
    });
    ensure!(s, replaced, "no replacement for {victim}: {:?}", s.workers());
    let mut last = None;
    let serving = eventually(Duration::from_secs(10), || {
        let m = scrape(&s);
        let ok = m.get("forkd_workers") == 2.0;
        last = Some(m);
        ok
    });
    let m = last.expect("scraped");
    ensure!(s, serving, "the replacement is not serving:\n{}", m.text);
    ensure_eq!(s, m.requests("/_debug/pid", "200"), sent as f64, "the victim's requests stay counted\n{}", m.text);
    ensure!(
        s,
        m.requests_sum() >= before.requests_sum(),
        "totals went down: {} → {}\n{}",
        before.requests_sum(),
        m.requests_sum(),
        m.text
    );
    ensure!(
        s,
        m.sum_of("forkd_http_request_duration_seconds_count")
            >= before.sum_of("forkd_http_request_duration_seconds_count"),
        "the histogram count went down\n{}",
        m.text
    );
    ensure!(s, m.get("forkd_worker_restarts_total") >= 1.0, "restarts\n{}", m.text);
}

#[test]
fn open_streams_show_in_the_gauges() {
    let s = Server::api_builder().set("websocket", "echo = true").start();
    let m = scrape(&s);
    ensure_eq!(s, (m.get("forkd_sse_streams"), m.get("forkd_websocket_clients")), (0.0, 0.0), "at start");
    let sse = s.sse_connected(&[]);
    let ws = s.ws_try("/ws/echo", &[]).unwrap_or_else(|r| panic!("GET /ws/echo: {r:?}\n{}", s.log_tail()));
    let m = scrape(&s);
    ensure_eq!(s, m.get("forkd_sse_streams"), 1.0, "one SSE stream open\n{}", m.text);
    ensure_eq!(s, m.get("forkd_websocket_clients"), 1.0, "one WebSocket open\n{}", m.text);
    ensure!(s, m.get("forkd_open_connections") >= 3.0, "SSE, WebSocket and the scrape\n{}", m.text);
    ensure_eq!(s, m.requests("/api/events", "200"), 1.0, "the stream's request\n{}", m.text);
    ensure_eq!(s, m.requests("/ws/echo", "101"), 1.0, "the upgrade\n{}", m.text);
    drop(sse);
    drop(ws);
    let closed = eventually(Duration::from_secs(5), || {
        let m = scrape(&s);
        m.get("forkd_sse_streams") == 0.0 && m.get("forkd_websocket_clients") == 0.0
    });
    ensure!(s, closed, "gauges did not return to 0:\n{}", scrape(&s).text);
}

/// This host's address on a non-loopback interface, if it has one: the source address
/// the kernel would pick for a remote destination (a UDP `connect` sends nothing).
fn local_non_loopback_ip() -> Option<IpAddr> {
    let u = UdpSocket::bind("0.0.0.0:0").ok()?;
    u.connect("198.51.100.1:9").ok()?;
    let ip = u.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn metrics_are_a_plain_404_for_peers_that_are_not_loopback() {
    let s = Server::api_builder().start();
    let Some(ip) = local_non_loopback_ip() else {
        eprintln!("no non-loopback address on this host: the peer check is covered by app::metrics unit tests only");
        return;
    };
    // The server still listens on 127.0.0.1 only; the client binds this host's other
    // address, so the server sees a peer that is not loopback without leaving the machine.
    let get_from = |path: &str| {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
        sock.bind(&SocketAddr::new(ip, 0).into()).expect("bind the non-loopback address");
        sock.connect_timeout(&s.addr().into(), IO_TIMEOUT).expect("connect");
        let mut c = Conn::from_stream(TcpStream::from(sock), None);
        c.send(&request("GET", path, &[], b""));
        c.read_response()
    };
    ensure_eq!(s, get_from("/health").status, 200, "the peer {ip} reaches the server");
    let hidden = get_from("/metrics");
    let unknown = get_from("/no-such-page");
    s.expect_err(&hidden, 404, "NOT_FOUND", &format!("GET /metrics from {ip}"));
    ensure_eq!(s, hidden.json()["message"], unknown.json()["message"], "same 404 as an unknown path");
    ensure!(s, !hidden.body_str().contains("forkd_"), "metrics leaked: {hidden:?}");
    // Loopback still sees them.
    scrape(&s);
}
