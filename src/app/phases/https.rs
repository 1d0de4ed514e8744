//! `tls.redirect_http`: a request that came over plain HTTP (the plain listener, or a trusted
//! proxy's plain side when the proxy says its client used http) is answered with a 308 to
//! the same path and query on the https origin (`public_origin`, which is the https origin
//! whenever TLS is on), except the operators' `/health` and `/metrics`, which load balancers
//! and scrapers poll over plain HTTP, and ACME's HTTP-01 path, which the CA asks over plain
//! HTTP. 308 keeps the method and body (RFC 9110 §15.4.9).

use crate::config::Config;
use crate::http::request::Request;
use crate::http::response::Response;

/// The 308 for `req` when it must move to https (`secure`: the client used https, as
/// `crate::http::client` decided); `None` to serve it here.
pub fn redirect(config: &Config, req: &Request<'_>, secure: bool) -> Option<Response> {
    if secure
        || !config.tls.redirect_http
        || matches!(req.path, "/health" | "/metrics")
        || req.path.starts_with(crate::acme::HTTP_PREFIX)
    {
        return None;
    }
    let mut location = String::with_capacity(config.public_origin.len() + req.path.len() + req.query.len() + 1);
    location.push_str(&config.public_origin);
    location.push_str(req.path);
    if !req.query.is_empty() {
        location.push('?');
        location.push_str(req.query);
    }
    let mut r = Response::new(308);
    r.header("Location", location);
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(path: &'a str, query: &'a str, secure: bool) -> Request<'a> {
        Request {
            method: crate::http::request::Method::Post,
            path,
            query,
            http10: false,
            headers: crate::http::fields::Fields::EMPTY,
            body: b"",
            request_id: "r",
            peer: "127.0.0.1".parse().expect("ip"),
            secure,
        }
    }

    fn location(r: Option<Response>) -> Option<String> {
        let r = r?;
        assert_eq!(r.status, 308);
        r.headers.iter().find(|(n, _)| *n == "Location").map(|(_, v)| v.to_string())
    }

    #[test]
    fn plain_requests_move_to_the_https_origin_but_health_and_metrics() {
        let mut config = Config { public_origin: "https://a.example:8443".into(), ..Config::default() };
        assert_eq!(location(redirect(&config, &req("/api/v1/users", "page=2", false), false)), None, "off by default");
        config.tls.redirect_http = true;
        assert_eq!(
            location(redirect(&config, &req("/api/v1/users", "page=2", false), false)).as_deref(),
            Some("https://a.example:8443/api/v1/users?page=2")
        );
        assert_eq!(
            location(redirect(&config, &req("/", "", false), false)).as_deref(),
            Some("https://a.example:8443/")
        );
        assert_eq!(location(redirect(&config, &req("/api/v1/users", "", true), true)), None, "already on TLS");
        assert_eq!(location(redirect(&config, &req("/health", "", false), false)), None);
        assert_eq!(location(redirect(&config, &req("/metrics", "", false), false)), None);
        assert_eq!(location(redirect(&config, &req("/.well-known/acme-challenge/t", "", false), false)), None);
    }
}
