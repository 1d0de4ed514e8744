//! `GET /metrics`: the shared-memory counters of every worker, summed, in the
//! Prometheus text exposition format (version 0.0.4).
//!
//! Loopback clients only: any other client gets the same 404 as an unknown path,
//! so the endpoint is not revealed. Behind a trusted proxy the client is the one the proxy
//! names (`crate::http::client`), so a proxy on this host does not open the endpoint to the
//! clients it forwards. Requests are labelled with the matched
//! route *pattern* (`/api/v1/users/{id}`, `other` when nothing matched),
//! never the raw path, so the number of series stays bounded. The counting
//! itself happens in the worker (`shm::metrics`); this module only reads and
//! renders (a few KB, on the loop).

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::app::router::Router;
use crate::app::{App, Ctx, Handler, Reply};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::{Body, Response};
use crate::shm::metrics::{status_label, Totals, BOUNDS_US, ROUTES, ROUTE_OTHER, STATUSES};

/// The exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Register `/metrics`.
pub fn routes(r: &mut Router<Handler>) {
    r.add(Method::Get, "/metrics", metrics);
}

/// The metrics route slot of router pattern `index`: patterns are numbered
/// from 1 (0 is `other`); patterns past the fixed number of slots count as `other`.
pub fn route_slot(index: usize) -> u16 {
    if index + 1 < ROUTES {
        (index + 1) as u16
    } else {
        ROUTE_OTHER
    }
}

/// The route label of every slot: `other`, then the router's patterns.
pub fn route_labels<H>(router: &Router<H>) -> Vec<&'static str> {
    std::iter::once("other").chain(router.patterns()).take(ROUTES).collect()
}

/// Whether `peer` is this host's loopback (IPv4-mapped `::ffff:127.x` included).
pub fn is_loopback(peer: IpAddr) -> bool {
    match peer {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

fn metrics(app: &App, _: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    if !is_loopback(ctx.client.addr) {
        return Err(Error::NotFound);
    }
    let totals = app.svc.region.metrics_totals();
    let mut text = render(&totals, &app.route_labels);
    let workers = app.svc.region.claimed_records().map(|(rec, _)| rec.pid.load(std::sync::atomic::Ordering::Acquire));
    let procs: Vec<Process> = std::iter::once(("supervisor", std::os::unix::process::parent_id() as i32))
        .chain(workers.filter(|&pid| pid > 0).map(|pid| ("worker", pid)))
        .map(|(role, pid)| Process::read(role, pid))
        .collect();
    render_processes(&procs, &mut text);
    let mut r = Response::new(200);
    r.content_type = CONTENT_TYPE;
    r.body = Body::Bytes(text.into_bytes());
    Ok(Reply::full(r))
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").into()
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Render `t` in the text format; `routes[i]` labels route slot `i`.
pub fn render(t: &Totals, routes: &[&str]) -> String {
    let mut out = String::with_capacity(4096);
    let name = "forkd_http_requests_total";
    head(&mut out, name, "counter", "HTTP requests answered, by route pattern and status code.");
    for (r, row) in t.requests.iter().enumerate() {
        let route = routes.get(r).copied().unwrap_or("other");
        for (s, n) in row.iter().enumerate().take(STATUSES) {
            if *n > 0 {
                let _ = writeln!(out, "{name}{{route=\"{}\",status=\"{}\"}} {n}", escape(route), status_label(s));
            }
        }
    }
    let name = "forkd_http_request_duration_seconds";
    head(
        &mut out,
        name,
        "histogram",
        "Time from the first byte of a request to its response being queued (the head, for streams), by route pattern.",
    );
    for (r, row) in t.latency.iter().enumerate() {
        if row.iter().all(|n| *n == 0) {
            continue;
        }
        let route = escape(routes.get(r).copied().unwrap_or("other"));
        let mut cumulative = 0;
        for (i, n) in row.iter().enumerate() {
            cumulative += n;
            match BOUNDS_US.get(i) {
                Some(us) => {
                    let _ =
                        writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"{}\"}} {cumulative}", *us as f64 / 1e6);
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum{{route=\"{route}\"}} {}", t.latency_sum_us[r] as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{route=\"{route}\"}} {cumulative}");
    }
    let gauges = [
        ("forkd_open_connections", "gauge", "Open client connections.", t.connections),
        ("forkd_sse_streams", "gauge", "Open SSE streams.", t.sse_streams),
        ("forkd_websocket_clients", "gauge", "Open WebSocket clients.", t.websocket_clients),
        (
            "forkd_worker_restarts_total",
            "counter",
            "Worker processes that exited without being asked to (crash, kill, watchdog).",
            t.restarts,
        ),
        ("forkd_workers", "gauge", "Worker processes serving.", t.workers),
        (
            "forkd_proxy_protocol_refused_total",
            "counter",
            "Connections a proxy_protocol listener closed unserved: a peer outside proxy.trusted, or no valid PROXY header in time.",
            t.proxy_refused,
        ),
    ];
    for (name, kind, help, v) in gauges {
        head(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
    if let Some((up, fallbacks)) = t.redis {
        let redis = [
            ("forkd_redis_up", "gauge", "Whether Redis (cluster.redis_url) answers: 1 up, 0 down.", up as u64),
            (
                "forkd_redis_fallbacks_total",
                "counter",
                "Times Redis was lost and rate limits fell back to this host's own count.",
                fallbacks,
            ),
        ];
        for (name, kind, help, v) in redis {
            head(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {v}");
        }
    }
    out
}

/// What `/proc` says of one process of the service (a figure it could not read is `None`).
pub struct Process {
    role: &'static str,
    pid: i32,
    rss: Option<u64>,
    fds: Option<u64>,
    cpu: Option<f64>,
}

impl Process {
    /// Read `pid`'s resident memory, open descriptors and CPU time.
    fn read(role: &'static str, pid: i32) -> Process {
        Process {
            role,
            pid,
            rss: crate::sys::rss_bytes(pid).ok(),
            fds: crate::sys::open_fds(pid).ok(),
            cpu: crate::sys::cpu_seconds(pid).ok(),
        }
    }
}

/// A `process_*` family: name, type, help, and its value for a process.
type Family = (&'static str, &'static str, &'static str, fn(&Process) -> Option<f64>);

/// Append the `process_*` families: one series per process, labelled with its role
/// (`supervisor`, `worker`) and pid.
pub fn render_processes(procs: &[Process], out: &mut String) {
    let families: [Family; 3] = [
        ("process_resident_memory_bytes", "gauge", "Resident memory of each process of the service.", |p| {
            p.rss.map(|v| v as f64)
        }),
        ("process_open_fds", "gauge", "Open file descriptors of each process of the service.", |p| {
            p.fds.map(|v| v as f64)
        }),
        ("process_cpu_seconds_total", "counter", "User and system CPU time of each process of the service.", |p| p.cpu),
    ];
    for (name, kind, help, value) in families {
        head(out, name, kind, help);
        for p in procs {
            if let Some(v) = value(p) {
                let _ = writeln!(out, "{name}{{role=\"{}\",pid=\"{}\"}} {v}", p.role, p.pid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;
    use crate::shm::Region;

    fn lines(text: &str, prefix: &str) -> Vec<String> {
        text.lines().filter(|l| l.starts_with(prefix)).map(str::to_owned).collect()
    }

    #[test]
    fn renders_requests_by_pattern_and_a_cumulative_histogram() {
        let region = Region::create().expect("map");
        let i = region.claim().expect("record");
        region.procs[i].pid.store(10, Ordering::Relaxed);
        let m = &region.metrics[i];
        for _ in 0..3 {
            m.record(2, 200, Duration::from_micros(300));
        }
        m.record(ROUTE_OTHER, 404, Duration::from_millis(3));
        m.record(2, 418, Duration::from_secs(10));
        let text = render(&region.metrics_totals(), &["other", "/health", "/api/v1/users/{id}"]);
        assert_eq!(
            lines(&text, "forkd_http_requests_total{"),
            [
                "forkd_http_requests_total{route=\"other\",status=\"404\"} 1",
                "forkd_http_requests_total{route=\"/api/v1/users/{id}\",status=\"200\"} 3",
                "forkd_http_requests_total{route=\"/api/v1/users/{id}\",status=\"4xx\"} 1",
            ]
        );
        let buckets = lines(&text, "forkd_http_request_duration_seconds_bucket{route=\"/api/v1/users/{id}\"");
        assert_eq!(buckets.len(), BOUNDS_US.len() + 1);
        let h = "forkd_http_request_duration_seconds";
        assert_eq!(buckets[0], format!("{h}_bucket{{route=\"/api/v1/users/{{id}}\",le=\"0.0005\"}} 3"));
        assert_eq!(buckets[10], format!("{h}_bucket{{route=\"/api/v1/users/{{id}}\",le=\"1\"}} 3"));
        assert_eq!(buckets[13], format!("{h}_bucket{{route=\"/api/v1/users/{{id}}\",le=\"+Inf\"}} 4"));
        let other = lines(&text, "forkd_http_request_duration_seconds_bucket{route=\"other\"");
        assert_eq!(other[2], format!("{h}_bucket{{route=\"other\",le=\"0.0025\"}} 0"));
        assert_eq!(other[3], format!("{h}_bucket{{route=\"other\",le=\"0.005\"}} 1"));
        assert!(text.contains(&format!("\n{h}_sum{{route=\"/api/v1/users/{{id}}\"}} 10.0009\n")), "{text}");
        assert!(text.contains(&format!("\n{h}_count{{route=\"/api/v1/users/{{id}}\"}} 4\n")), "{text}");
        assert!(text.contains(&format!("\n{h}_count{{route=\"other\"}} 1\n")), "{text}");
        assert!(!text.contains("route=\"/health\",le"), "a route with no request has no histogram");
        for name in [
            "forkd_http_requests_total",
            "forkd_http_request_duration_seconds",
            "forkd_open_connections",
            "forkd_sse_streams",
            "forkd_websocket_clients",
            "forkd_worker_restarts_total",
            "forkd_workers",
            "forkd_proxy_protocol_refused_total",
        ] {
            assert_eq!(lines(&text, &format!("# HELP {name} ")).len(), 1, "HELP for {name}");
            assert_eq!(lines(&text, &format!("# TYPE {name} ")).len(), 1, "TYPE for {name}");
        }
        assert!(text.ends_with('\n'));
        assert!(!text.contains("forkd_redis_"), "no Redis lines without cluster.redis_url");
        region.set_redis_up(false);
        region.count_redis_fallback();
        let text = render(&region.metrics_totals(), &["other"]);
        assert!(text.contains("\nforkd_redis_up 0\n") && text.contains("\nforkd_redis_fallbacks_total 1\n"), "{text}");
        region.set_redis_up(true);
        assert!(render(&region.metrics_totals(), &["other"]).contains("\nforkd_redis_up 1\n"));
    }

    #[test]
    fn each_process_is_one_series_per_family_and_unread_figures_are_left_out() {
        let procs = [
            Process { role: "supervisor", pid: 7, rss: Some(4096), fds: Some(12), cpu: Some(1.5) },
            Process { role: "worker", pid: 8, rss: Some(8192), fds: None, cpu: Some(0.25) },
        ];
        let mut text = String::new();
        render_processes(&procs, &mut text);
        assert_eq!(
            lines(&text, "process_"),
            [
                "process_resident_memory_bytes{role=\"supervisor\",pid=\"7\"} 4096",
                "process_resident_memory_bytes{role=\"worker\",pid=\"8\"} 8192",
                "process_open_fds{role=\"supervisor\",pid=\"7\"} 12",
                "process_cpu_seconds_total{role=\"supervisor\",pid=\"7\"} 1.5",
                "process_cpu_seconds_total{role=\"worker\",pid=\"8\"} 0.25",
            ]
        );
        assert_eq!(lines(&text, "# TYPE process_cpu_seconds_total counter").len(), 1);
    }

    #[test]
    fn route_slots_start_at_one_and_overflow_to_other() {
        assert_eq!(route_slot(0), 1);
        assert_eq!(route_slot(ROUTES - 2), (ROUTES - 1) as u16);
        assert_eq!(route_slot(ROUTES - 1), ROUTE_OTHER);
        let mut r: Router<u8> = Router::default();
        r.add(Method::Get, "/health", 0).add(Method::Get, "/users/{id}", 1).add(Method::Put, "/users/{id}", 2);
        assert_eq!(route_labels(&r), ["other", "/health", "/users/{id}"]);
    }

    #[test]
    fn only_loopback_peers_see_metrics() {
        for ip in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().expect("ip")), "{ip}");
        }
        for ip in ["192.0.2.2", "10.0.0.1", "0.0.0.0", "::", "fd00::2", "::ffff:10.0.0.1"] {
            assert!(!is_loopback(ip.parse().expect("ip")), "{ip}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("/a/{id}"), "/a/{id}");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
