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
    let mut r = Response::new(200);
    r.content_type = CONTENT_TYPE;
    r.body = Body::Bytes(render(&totals, &app.route_labels).into_bytes());
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
        "Time from the first byte of a request to its response being queued (the head, for streams).",
    );
    let mut cumulative = 0;
    for (i, n) in t.latency.iter().enumerate() {
        cumulative += n;
        match BOUNDS_US.get(i) {
            Some(us) => {
                let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", *us as f64 / 1e6);
            }
            None => {
                let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
            }
        }
    }
    let _ = writeln!(out, "{name}_sum {}", t.latency_sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {cumulative}");
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
        let buckets = lines(&text, "forkd_http_request_duration_seconds_bucket");
        assert_eq!(buckets.len(), BOUNDS_US.len() + 1);
        assert_eq!(buckets[0], "forkd_http_request_duration_seconds_bucket{le=\"0.0005\"} 3");
        assert_eq!(buckets[3], "forkd_http_request_duration_seconds_bucket{le=\"0.005\"} 4");
        assert_eq!(buckets[10], "forkd_http_request_duration_seconds_bucket{le=\"1\"} 4");
        assert_eq!(buckets[11], "forkd_http_request_duration_seconds_bucket{le=\"2.5\"} 4");
        assert_eq!(buckets[13], "forkd_http_request_duration_seconds_bucket{le=\"+Inf\"} 5");
        assert!(text.contains("\nforkd_http_request_duration_seconds_sum 10.0039\n"), "{text}");
        assert!(text.contains("\nforkd_http_request_duration_seconds_count 5\n"), "{text}");
        for name in [
            "forkd_http_requests_total",
            "forkd_http_request_duration_seconds",
            "forkd_open_connections",
            "forkd_sse_streams",
            "forkd_websocket_clients",
            "forkd_worker_restarts_total",
            "forkd_workers",
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
