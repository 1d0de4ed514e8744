//! `GET /api/openapi.json`: the OpenAPI 3.1 document of the API: public,
//! cacheable for an hour, rate limited like every `/api/*` route, and
//! following the configuration it runs with.

use crate::util::*;

both!(openapi_document_is_public_cacheable_json_of_openapi_3_1);
fn openapi_document_is_public_cacheable_json_of_openapi_3_1(p: Proto) {
    let server = Server::start("").on(p);
    let r = server.get("/api/openapi.json");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(media_type(r.header("content-type")).as_deref(), Some("application/json"), "{r:?}");
    assert_eq!(r.header("cache-control"), Some("public, max-age=3600"), "{r:?}");
    for h in ["ratelimit-policy", "ratelimit-remaining", "x-request-id", "content-security-policy", "x-frame-options"] {
        assert!(r.header(h).is_some(), "{h} missing: {r:?}");
    }
    let doc = r.json();
    let version = doc["openapi"].as_str().unwrap_or_default();
    assert!(version.starts_with("3.1"), "openapi version {version:?}");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["type"], "http");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    for (path, method) in [
        ("/api/v1/users", "post"),
        ("/api/v1/users/{id}", "patch"),
        ("/api/v1/users/{id}/posts", "get"),
        ("/api/v1/auth/login", "post"),
        ("/api/events", "get"),
        ("/api/openapi.json", "get"),
        ("/health", "get"),
    ] {
        assert!(doc["paths"][path][method]["responses"].is_object(), "{method} {path} not documented");
    }
    assert!(doc["paths"].get("/ws/echo").is_none(), "/ws/echo is off by default");
    // Built once: the next answer is the same document, byte for byte.
    let again = server.get("/api/openapi.json");
    assert_eq!(again.body, r.body);
}

both!(openapi_document_follows_the_configuration);
fn openapi_document_follows_the_configuration(p: Proto) {
    let server = Server::builder()
        .set("websocket", "echo = true")
        .set("rate_limit", "enabled = false")
        .top("csp_report_only = true")
        .start()
        .on(p);
    let r = server.get("/api/openapi.json");
    assert_eq!(r.status, 200, "{r:?}");
    let doc = r.json();
    assert!(doc["paths"]["/ws/echo"]["get"].is_object(), "/ws/echo is on");
    let health = &doc["components"]["responses"]["E404"]["headers"];
    assert!(health.get("Content-Security-Policy-Report-Only").is_some(), "{health}");
    assert!(health.get("RateLimit-Policy").is_none(), "{health}");
    assert!(doc["paths"]["/api/v1/users"]["get"]["responses"].get("429").is_none(), "no 429 without a limiter");
}

both!(openapi_document_is_rate_limited_like_every_api_route);
fn openapi_document_is_rate_limited_like_every_api_route(p: Proto) {
    let server = Server::builder().set("rate_limit", "max = 2\nwindow_secs = 60").start().on(p);
    for _ in 0..2 {
        assert_eq!(server.get("/api/openapi.json").status, 200);
    }
    let r = server.get("/api/openapi.json");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.json()["code"], "RATE_LIMITED", "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
}

both!(openapi_document_answers_head_without_a_body);
fn openapi_document_answers_head_without_a_body(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r = c.request("HEAD", "/api/openapi.json", &[], b"");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.is_empty(), "{r:?}");
    assert!(r.header("content-length").is_some_and(|n| n != "0"), "{r:?}");
}
