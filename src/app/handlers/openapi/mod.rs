//! `GET /api/openapi.json`: an OpenAPI 3.1 description of every route the
//! router serves (the `/_debug/*` test hooks excepted); `GET /api/docs`: the
//! same document rendered as an HTML page (`html.rs`).
//!
//! The document is what a client or a schema-driven fuzzer (Schemathesis,
//! `bin/schemathesis`) relies on, so it states what the handlers really
//! enforce: the field limits of `validate.rs` and the handlers, the success
//! envelopes, every error status with its envelope and code, and the headers
//! every response carries. It follows the configuration it is built from
//! (the CSP header's name, whether rate limiting is on, whether `/ws/echo`
//! exists, whether errors may carry `stack`).
//!
//! It is built and serialised once per configuration, by the supervisor before it forks the
//! workers (`app::fixed`, with its strong `ETag` and its compressed forms); a request then
//! costs no more than `/health`. A unit test compares its `paths` with
//! [`crate::app::router::Router::routes`], both ways, so a route cannot be added
//! or removed without the document following. Operations are in `paths.rs`,
//! shared schemas, headers and error responses in `components.rs`, and what
//! each declared resource adds (the built-in `posts` too) in `resources.rs`.

mod components;
mod html;
mod paths;
mod resources;

use serde_json::{json, Value};

use crate::app::{App, Ctx, Reply};
use crate::config::Config;
use crate::error::Error;
use crate::http::request::Request;

pub use html::docs;

/// The `Cache-Control` of the document: it changes only with a new binary or configuration.
pub const CACHE_CONTROL: &str = "public, max-age=3600";

/// `GET /api/openapi.json`: the document as serialised before fork (`app::fixed`).
pub fn openapi(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::full(app.fixed.openapi.answer(
        (app.svc.config, &app.fixed.forms),
        req,
        "application/json",
        CACHE_CONTROL,
    )))
}

/// The `/api/docs` page for `document`.
pub fn render_page(document: &Value) -> String {
    html::render(document, crate::app::assets::url("docs.css"))
}

/// The OpenAPI document for a service running with `config`.
pub fn document(config: &Config) -> Value {
    let mut paths = paths::Paths::new(config);
    paths::all(&mut paths);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "forkd",
            "version": env!("CARGO_PKG_VERSION"),
            "description": DESCRIPTION,
        },
        "servers": [{"url": "/"}],
        "tags": tags(config),
        "paths": Value::Object(paths.into_map()),
        "components": components::components(config),
    })
}

/// The tags in display order: the built-in groups, each resource's after `users`.
fn tags(config: &Config) -> Vec<Value> {
    let tag = |name: &str, description: &str| json!({"name": name, "description": description});
    let mut out = Vec::new();
    for (name, description) in paths::TAGS {
        out.push(tag(name, description));
        if *name == "users" {
            out.extend(resources::tags(&config.resources).iter().map(|(n, d)| tag(n, d)));
        }
    }
    out
}

const DESCRIPTION: &str = "\
A pre-forked HTTP/1.1 service. Success bodies are `{\"code\", \"message\", \"data\"}` envelopes \
(paginated `data` is `{\"items\", \"total\", \"page\", \"pageSize\", \"totalPages\"}`); errors are \
`{\"code\": \"<STRING>\", \"message\", \"errors\"?, \"stack\"?}` with `Content-Type: application/json`. \
Resources live under `/api/v1`; `/api/users`, `/api/auth`, `/api/notifications` and each declared \
resource's `/api/<name>` (the built-in `posts` among them) answer too, the version taken from `?version=1` or `Accept: application/vnd.forkd+json; version=1` \
(any other version is 400). Every `/api/*` route and `/csp-report` is rate limited per client \
address (the `RateLimit-*` headers; over the limit 429 with `Retry-After`). Unsafe methods with an \
`Origin` that is neither the service's own nor allow-listed are refused with 403. `HEAD` is answered \
for every `GET` route, and `OPTIONS` on a known path answers 204 with `Allow`; a method a path does \
not have is 405 with `Allow`. The HTTP layer may answer any request 400 (malformed), 408 (too slow), \
413 (body over the limit), 417 (unknown `Expect`) or 431 (head too large).";

/// A configuration declaring the resources of `text` (TOML, `[[resources]]` tables), for the
/// tests of this module and its children.
#[cfg(test)]
fn declaring(text: &str) -> Config {
    let table: toml::Table = text.parse().expect("toml");
    let mut errors = Vec::new();
    let resources = crate::resources::parse::registry(table.get("resources"), &mut errors);
    assert_eq!(errors, Vec::<String>::new());
    Config { resources, ..Config::default() }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn config(echo: bool) -> Config {
        let mut c = Config::default();
        c.websocket.echo = echo;
        c
    }

    /// A configuration with declared resources: one top level, one nested under it with a
    /// `ref`, one under users that replaces nothing.
    fn declared() -> Config {
        declaring(
            r#"
            [[resources]]
            name = "articles"
            read = "public"
            [resources.fields.title]
            type = "string"
            required = true
            max = 100
            sort = true
            [resources.fields.state]
            type = "enum"
            values = ["draft", "live"]
            default = "draft"
            transitions = { draft = ["live"] }
            [[resources]]
            name = "comments"
            parent = "articles"
            read = "owner"
            [resources.fields.about]
            type = "ref"
            ref = "articles"
            [[resources]]
            name = "notes"
            parent = "users"
            [resources.fields.at]
            type = "datetime"
            filter = true
        "#,
        )
    }

    /// `(METHOD, path)` of every documented operation.
    fn documented(doc: &Value) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
                if ["get", "put", "post", "delete", "options", "head", "patch", "trace"].contains(&method.as_str()) {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    /// `(METHOD, pattern)` of every route the router serves, test hooks aside.
    fn served(config: &Config) -> BTreeSet<(String, String)> {
        crate::app::routes(config)
            .routes()
            .filter(|(_, p)| !p.starts_with("/_debug/"))
            .map(|(m, p)| (m.as_str().to_owned(), p.to_owned()))
            .collect()
    }

    #[test]
    fn every_route_is_documented_and_every_documented_operation_is_routed() {
        for (echo, c) in [(false, config(false)), (true, config(true)), (false, declared())] {
            let (doc, routes) = (documented(&document(&c)), served(&c));
            let missing: Vec<_> = routes.difference(&doc).collect();
            let extra: Vec<_> = doc.difference(&routes).collect();
            assert!(missing.is_empty(), "routes missing from the document (echo {echo}): {missing:?}");
            assert!(extra.is_empty(), "documented but not routed (echo {echo}): {extra:?}");
        }
        assert!(served(&config(true)).contains(&("GET".into(), "/ws/echo".into())));
        let doc = documented(&document(&declared()));
        for op in [
            ("GET", "/api/v1/articles"),
            ("POST", "/api/v1/articles/{id}/comments"),
            ("PUT", "/api/comments/{id}"),
            ("GET", "/api/v1/users/{id}/notes"),
            ("PATCH", "/api/v1/posts/{id}"),
        ] {
            assert!(doc.contains(&(op.0.into(), op.1.into())), "{op:?}");
        }
    }

    #[test]
    fn debug_routes_stay_out_of_the_document() {
        let mut c = config(false);
        c.debug.routes = true;
        let doc = document(&c);
        assert!(doc["paths"].as_object().is_some_and(|p| p.keys().all(|k| !k.starts_with("/_debug"))));
    }

    #[test]
    fn is_openapi_3_1_with_the_bearer_scheme() {
        let doc = document(&Config::default());
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")));
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        assert!(doc["info"]["description"].as_str().is_some_and(|d| !d.contains("CONTRACT")));
    }

    /// Every `$ref` points at something that exists.
    #[test]
    fn every_reference_resolves() {
        fn walk(v: &Value, doc: &Value, bad: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        let target = r.strip_prefix('#').and_then(|p| doc.pointer(p));
                        if target.is_none() {
                            bad.push(r.clone());
                        }
                    }
                    m.values().for_each(|x| walk(x, doc, bad));
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, doc, bad)),
                _ => {}
            }
        }
        for c in [config(false), declared(), {
            let mut c = config(true);
            c.rate_limit.enabled = false;
            c.csp_report_only = true;
            c
        }] {
            let doc = document(&c);
            let mut bad = Vec::new();
            walk(&doc, &doc, &mut bad);
            assert!(bad.is_empty(), "dangling references: {bad:?}");
        }
    }

    #[test]
    fn operations_have_unique_ids_and_responses() {
        let mut c = declared();
        c.websocket.echo = true;
        let doc = document(&c);
        let mut ids = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                let id = op["operationId"].as_str().unwrap_or_default().to_owned();
                assert!(ids.insert(id.clone()), "duplicate operationId {id} ({method} {path})");
                assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}");
            }
        }
    }

    #[test]
    fn rate_limited_routes_document_429_only_when_the_limiter_is_on() {
        let on = document(&Config::default());
        assert!(on["paths"]["/api/v1/users"]["get"]["responses"].get("429").is_some());
        assert!(on["paths"]["/health"]["get"]["responses"].get("429").is_none());
        let mut c = Config::default();
        c.rate_limit.enabled = false;
        let off = document(&c);
        assert!(off["paths"]["/api/v1/users"]["get"]["responses"].get("429").is_none());
    }

    /// The limits the validators enforce are the ones the document states.
    #[test]
    fn body_limits_match_the_validators() {
        use crate::app::validate;
        let doc = document(&Config::default());
        let user = &doc["components"]["schemas"]["SignUp"]["properties"];
        let len = |s: &Value, k: &str| s[k].as_u64().unwrap_or(u64::MAX) as usize;
        let name = &user["name"];
        assert!(validate::name(&"n".repeat(len(name, "maxLength"))).is_ok());
        assert!(validate::name(&"n".repeat(len(name, "maxLength") + 1)).is_err());
        assert!(validate::name(&"n".repeat(len(name, "minLength"))).is_ok());
        let pw = &user["password"];
        assert!(validate::password(&"p".repeat(len(pw, "minLength"))).is_ok());
        assert!(validate::password(&"p".repeat(len(pw, "minLength") - 1)).is_err());
        assert!(validate::password(&"p".repeat(len(pw, "maxLength"))).is_ok());
        assert!(validate::password(&"p".repeat(len(pw, "maxLength") + 1)).is_err());
        assert_eq!((user["age"]["minimum"].as_i64(), user["age"]["maximum"].as_i64()), (Some(0), Some(150)));
        let post = &doc["components"]["schemas"]["postsInput"]["properties"];
        for f in &crate::resources::builtin::posts().fields {
            let max = len(&post[&f.name], "maxLength");
            assert!(crate::resources::value::check(f, &json!("t".repeat(max))).is_ok(), "{}", f.name);
            assert!(crate::resources::value::check(f, &json!("t".repeat(max + 1))).is_err(), "{}", f.name);
        }
        let n = &doc["components"]["schemas"]["NewNotification"]["properties"];
        let body = "b".repeat(len(&n["body"], "maxLength"));
        let ok = |b: &str| {
            let map = json!({"title": "t", "body": b}).as_object().cloned().unwrap_or_default();
            crate::app::events::notification(map).is_ok()
        };
        assert!(ok(&body) && !ok(&format!("{body}b")));
    }
}
