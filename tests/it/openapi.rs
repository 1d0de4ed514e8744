//! `GET /api/openapi.json`: the OpenAPI 3.1 document of the API: public,
//! cacheable for an hour, rate limited like every `/api/*` route, and
//! following the configuration it runs with.

use crate::util::*;

protocols!(openapi_document_is_public_cacheable_json_of_openapi_3_1);
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

protocols!(openapi_document_follows_the_configuration);
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

protocols!(openapi_document_is_rate_limited_like_every_api_route);
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

protocols!(openapi_document_answers_head_without_a_body);
fn openapi_document_answers_head_without_a_body(p: Proto) {
    let server = Server::start("").on(p);
    let mut c = server.session();
    let r = c.request("HEAD", "/api/openapi.json", &[], b"");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.is_empty(), "{r:?}");
    assert!(r.header("content-length").is_some_and(|n| n != "0"), "{r:?}");
}

/// Declared resources for the document tests: a public top-level one with limits, an enum
/// with transitions, sort, filter and search fields; an owner-only one nested under it.
const DECLARED: &str = r#"
[[resources]]
name = "articles"
read = "public"
create = "signed_in"
update = "owner"
delete = "admin"
default_sort = "-createdAt"

[resources.fields.title]
type = "string"
required = true
min = 3
max = 120
sort = true
search = true

[resources.fields.status]
type = "enum"
values = ["draft", "published", "archived"]
default = "draft"
filter = true
transitions = { draft = ["published"], published = ["archived"] }

[resources.fields.rating]
type = "integer"
min = 1
max = 5
filter = true

[resources.fields.link]
type = "url"

[[resources]]
name = "comments"
parent = "articles"
read = "owner"

[resources.fields.text]
type = "text"
required = true
max = 2000

[resources.fields.about]
type = "ref"
ref = "articles"
"#;

protocols!(openapi_document_describes_each_declared_resource);
fn openapi_document_describes_each_declared_resource(p: Proto) {
    let server = Server::start(DECLARED).on(p);
    let r = server.get("/api/openapi.json");
    assert_eq!(r.status, 200, "{r:?}");
    let doc = r.json();
    let paths = &doc["paths"];
    let schemas = &doc["components"]["schemas"];

    // Paths: top level, records, nested under the parent's records, versioned and not.
    for (path, methods) in [
        ("/api/v1/articles", &["get", "post"][..]),
        ("/api/v1/articles/{id}", &["get", "put", "patch", "delete"][..]),
        ("/api/v1/articles/{id}/comments", &["get", "post"][..]),
        ("/api/v1/comments", &["get"][..]),
        ("/api/v1/comments/{id}", &["get", "put", "patch", "delete"][..]),
        ("/api/articles", &["get", "post"][..]),
    ] {
        for m in methods {
            assert!(paths[path][m]["responses"].is_object(), "{m} {path} not documented");
        }
    }
    assert!(paths["/api/v1/comments"].get("post").is_none(), "a nested resource is created under its parent");

    // The record and the bodies, with the declared limits.
    let record = &schemas["articles"];
    for key in ["id", "ownerId", "title", "status", "rating", "link", "createdAt", "updatedAt"] {
        assert!(record["properties"].get(key).is_some(), "record lacks {key}: {record}");
    }
    assert_eq!(schemas["comments"]["properties"]["parentId"]["type"], "integer");
    assert!(record["properties"].get("parentId").is_none(), "a top-level record has no parentId");
    let input = &schemas["articlesInput"];
    assert_eq!(input["additionalProperties"], false);
    assert_eq!(input["required"], serde_json::json!(["title"]), "status has a default");
    let title = &input["properties"]["title"];
    assert_eq!((title["minLength"].as_u64(), title["maxLength"].as_u64()), (Some(3), Some(120)), "{title}");
    let rating = &input["properties"]["rating"];
    assert_eq!((rating["minimum"].as_i64(), rating["maximum"].as_i64()), (Some(1), Some(5)), "{rating}");
    assert_eq!(rating["type"], serde_json::json!(["integer", "null"]), "optional: nullable");
    assert!(input["properties"]["link"]["pattern"]
        .as_str()
        .is_some_and(|p| p.starts_with("^[Hh][Tt][Tt][Pp][Ss]?://")));
    assert_eq!(input["properties"]["link"]["maxLength"], 2048);
    assert_eq!(input["properties"]["status"]["enum"], serde_json::json!(["draft", null]), "start states only");
    assert_eq!(
        schemas["articlesReplace"]["properties"]["status"]["enum"],
        serde_json::json!(["draft", "published", "archived", null])
    );
    assert!(schemas["articlesPatch"].get("required").is_none_or(|r| r == &serde_json::json!([])));
    assert_eq!(schemas["commentsInput"]["properties"]["about"]["minimum"], 1);
    assert_eq!(schemas["articlesPage"]["properties"]["items"]["items"]["$ref"], "#/components/schemas/articles");

    // List parameters: paging, sort over the sort fields, filters with ranges, q.
    let list = &paths["/api/v1/articles"]["get"];
    let params: Vec<&str> =
        list["parameters"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    for name in ["page", "limit", "sort", "status", "rating", "rating.gte", "rating.lte", "q"] {
        assert!(params.contains(&name), "{name} missing from {params:?}");
    }
    assert!(!params.contains(&"title"), "title is not a filter field");
    let comment_params = &paths["/api/v1/comments"]["get"]["parameters"];
    assert!(comment_params.as_array().is_some_and(|a| a.iter().all(|p| p["name"] != "q")), "no search field, no q");

    // Security follows the rules: public reads take an optional token, writes need one.
    assert_eq!(list["security"], serde_json::json!([{}, {"bearer": []}]));
    assert_eq!(paths["/api/v1/articles"]["post"]["security"], serde_json::json!([{"bearer": []}]));
    assert_eq!(paths["/api/v1/comments/{id}"]["get"]["security"], serde_json::json!([{"bearer": []}]));
    let responses = |path: &str, m: &str| paths[path][m]["responses"].as_object().cloned().unwrap_or_default();
    for (path, m, codes) in [
        ("/api/v1/articles", "post", &["201", "401", "403", "409", "422"][..]),
        ("/api/v1/articles/{id}", "get", &["200", "304", "404"][..]),
        ("/api/v1/articles/{id}", "patch", &["200", "404", "409", "412", "422"][..]),
        ("/api/v1/articles/{id}/comments", "post", &["201", "404", "422"][..]),
        ("/api/v1/articles/{id}", "delete", &["204", "403", "404"][..]),
    ] {
        let got = responses(path, m);
        for c in codes {
            assert!(got.contains_key(*c), "{m} {path} lacks {c}: {:?}", got.keys().collect::<Vec<_>>());
        }
    }
    assert!(responses("/api/v1/articles", "get").contains_key("401"), "a bad token on a public read is 401");
}

protocols!(openapi_document_still_has_the_built_in_posts);
fn openapi_document_still_has_the_built_in_posts(p: Proto) {
    let server = Server::start("").on(p);
    let doc = server.get("/api/openapi.json").json();
    for (path, method) in [
        ("/api/v1/users/{id}/posts", "get"),
        ("/api/v1/users/{id}/posts", "post"),
        ("/api/v1/posts/{id}", "get"),
        ("/api/v1/posts/{id}", "patch"),
        ("/api/v1/posts/{id}", "delete"),
        ("/api/posts/{id}", "get"),
    ] {
        assert!(doc["paths"][path][method]["responses"].is_object(), "{method} {path} not documented");
    }
    let post = &doc["components"]["schemas"]["posts"]["properties"];
    assert!(post.get("userId").is_some() && post.get("title").is_some(), "{post}");
    let title = &doc["components"]["schemas"]["postsInput"]["properties"]["title"];
    assert_eq!((title["minLength"].as_u64(), title["maxLength"].as_u64()), (Some(1), Some(200)), "{title}");
    assert_eq!(doc["paths"]["/api/v1/posts/{id}"]["get"]["security"], serde_json::json!([{"bearer": []}]));
}
