//! The document's `paths`: one [`Op`] per route, in the order `App`
//! registers them. [`Paths::add`] adds what every operation shares (path
//! parameters, the errors any request of its kind can get, the security
//! requirement, the common headers); the versioned resources are added
//! under `/api/v1` and, with the `version` query parameter, under `/api`.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use super::components::{cache_control, error_ref, header, headers, limited};
use crate::app::redirect::MAX_TARGET;
use crate::app::{assets, pages};
use crate::config::Config;

/// Tag names and descriptions, in display order.
pub const TAGS: &[(&str, &str)] = &[
    ("auth", "Log in, rotate and revoke refresh tokens"),
    ("users", "Sign-up and user accounts"),
    ("notifications", "Notifications pushed to every event stream"),
    ("streams", "Server-sent events, chat, WebSocket"),
    ("aggregation", "Responses built from upstream services"),
    ("files", "Downloads, static assets, the page"),
    ("service", "Health, metrics, configuration, this document and its HTML page, CSP reports, redirects"),
];

/// Who may call an operation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Anyone.
    None,
    /// A bearer token (401 without one).
    Bearer,
    /// Anyone; a bearer token, if sent, must be valid (and may allow more).
    Optional,
}

/// What a success response carries.
#[derive(Clone)]
pub enum Content {
    /// No body.
    Empty,
    /// The `{code, message, data}` envelope around this `data` schema.
    Envelope(Value),
    /// A body of these media types with this schema.
    Raw(Vec<&'static str>, Value),
}

/// One success (or redirect, or not-modified) response.
#[derive(Clone)]
pub struct Ok {
    status: u16,
    description: &'static str,
    content: Content,
    cache: &'static str,
    headers: Vec<(&'static str, Value)>,
    links: Option<Value>,
}

/// A success response; `cache` is its `Cache-Control`.
pub fn ok(status: u16, description: &'static str, content: Content, cache: &'static str) -> Ok {
    Ok { status, description, content, cache, headers: Vec::new(), links: None }
}

impl Ok {
    /// With a further (required) header.
    pub fn header(mut self, name: &'static str, value: Value) -> Ok {
        self.headers.push((name, value));
        self
    }

    /// With OpenAPI links to the operations its body's `data.id` feeds.
    pub fn links(mut self, links: Value) -> Ok {
        self.links = Some(links);
        self
    }
}

/// One operation.
#[derive(Clone)]
pub struct Op {
    /// `operationId` (the unversioned copy gets `Unversioned` appended).
    pub id: Cow<'static, str>,
    /// Its tag.
    pub tag: Cow<'static, str>,
    /// One line.
    pub summary: Cow<'static, str>,
    /// The details a caller needs.
    pub description: Cow<'static, str>,
    /// Who may call it.
    pub auth: Auth,
    /// Query, header and cookie parameters (path parameters are added from the path).
    pub params: Vec<Value>,
    /// The request body.
    pub body: Option<Value>,
    /// Success responses.
    pub ok: Vec<Ok>,
    /// Error statuses besides those every operation of its kind gets.
    pub errors: Vec<u16>,
}

impl Op {
    /// An operation with no parameters, body or responses yet, callable by anyone.
    pub fn new(
        id: impl Into<Cow<'static, str>>,
        tag: impl Into<Cow<'static, str>>,
        summary: impl Into<Cow<'static, str>>,
        description: impl Into<Cow<'static, str>>,
    ) -> Op {
        Op {
            id: id.into(),
            tag: tag.into(),
            summary: summary.into(),
            description: description.into(),
            auth: Auth::None,
            params: Vec::new(),
            body: None,
            ok: Vec::new(),
            errors: Vec::new(),
        }
    }
    /// See the field of the same name.
    pub fn auth(mut self, auth: Auth) -> Op {
        self.auth = auth;
        self
    }
    /// See the field of the same name.
    pub fn param(mut self, p: Value) -> Op {
        self.params.push(p);
        self
    }
    /// See the field of the same name.
    pub fn body(mut self, b: Value) -> Op {
        self.body = Some(b);
        self
    }
    /// See the field of the same name.
    pub fn ok(mut self, r: Ok) -> Op {
        self.ok.push(r);
        self
    }
    /// See the field of the same name.
    pub fn errors(mut self, e: &[u16]) -> Op {
        self.errors.extend_from_slice(e);
        self
    }
}

/// The `paths` object being built.
pub struct Paths<'c> {
    /// The configuration the document describes.
    pub config: &'c Config,
    map: Map<String, Value>,
}

impl<'c> Paths<'c> {
    /// Empty, for a service running with `config`.
    pub fn new(config: &'c Config) -> Paths<'c> {
        Paths { config, map: Map::new() }
    }

    /// The finished `paths` object.
    pub fn into_map(self) -> Map<String, Value> {
        self.map
    }

    /// Add `method path` (upper-case method).
    pub fn add(&mut self, method: &str, path: &str, op: &Op) {
        self.add_as(method, path, op, op.id.to_string(), Vec::new());
    }

    /// Add a versioned resource under `/api/v1{rest}` and `/api{rest}`.
    pub fn versioned(&mut self, method: &str, rest: &str, op: &Op) {
        self.add(method, &format!("/api/v1{rest}"), op);
        let version = json!({"name": "version", "in": "query", "required": false,
            "description": "The API version (also `Accept: application/vnd.forkd+json; version=1`); any other is 400",
            "schema": {"type": "string", "enum": ["1"]}});
        self.add_as(method, &format!("/api{rest}"), op, format!("{}Unversioned", op.id), vec![version]);
    }

    fn add_as(&mut self, method: &str, path: &str, op: &Op, id: String, extra: Vec<Value>) {
        let config = self.config;
        let limited = limited(config, path);
        let mut params: Vec<Value> = path_params(path);
        params.extend(op.params.iter().cloned());
        params.extend(extra);
        let mut responses = Map::new();
        for r in &op.ok {
            responses.insert(r.status.to_string(), success(config, limited, r));
        }
        let mut errors = vec![400, 431, 500];
        if limited {
            errors.push(429);
        }
        if op.auth != Auth::None {
            errors.push(401);
        }
        if method != "GET" {
            errors.push(403); // the origin check of unsafe methods
        }
        if op.body.is_some() {
            errors.extend([413, 415, 422]);
        }
        errors.extend(&op.errors);
        errors.sort_unstable();
        errors.dedup();
        for status in errors {
            // 413 and 431 come from the HTTP layer, before the request is counted.
            let counted = limited && !matches!(status, 413 | 431);
            responses.insert(status.to_string(), error_ref(status, counted));
        }
        let mut o = Map::new();
        o.insert("operationId".into(), Value::String(id));
        o.insert("tags".into(), json!([op.tag]));
        o.insert("summary".into(), json!(op.summary));
        if !op.description.is_empty() {
            o.insert("description".into(), json!(op.description));
        }
        match op.auth {
            Auth::None => o.insert("security".into(), json!([])),
            Auth::Bearer => o.insert("security".into(), json!([{"bearer": []}])),
            Auth::Optional => o.insert("security".into(), json!([{}, {"bearer": []}])),
        };
        if !params.is_empty() {
            o.insert("parameters".into(), Value::Array(params));
        }
        if let Some(b) = &op.body {
            o.insert("requestBody".into(), b.clone());
        }
        o.insert("responses".into(), Value::Object(responses));
        let item = self.map.entry(path.to_owned()).or_insert_with(|| json!({}));
        if let Some(item) = item.as_object_mut() {
            item.insert(method.to_lowercase(), Value::Object(o));
        }
    }
}

fn path_params(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| match name {
            "id" => json!({"name": "id", "in": "path", "required": true,
                "description": "A numeric id; anything else is 404",
                "schema": {"type": "integer", "format": "int64", "minimum": 1}}),
            _ => json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "minLength": 1}}),
        })
        .collect()
}

fn success(config: &Config, limited: bool, r: &Ok) -> Value {
    let mut extra = vec![("Cache-Control", cache_control(r.cache))];
    extra.extend(r.headers.iter().map(|(k, v)| (*k, v.clone())));
    let mut o = Map::new();
    o.insert("description".into(), r.description.into());
    o.insert("headers".into(), headers(config, limited, extra));
    match &r.content {
        Content::Empty => {}
        Content::Envelope(data) => {
            let message = if r.status == 201 { "Created" } else { "OK" };
            let schema = json!({"type": "object", "additionalProperties": false,
                "required": ["code", "message", "data"],
                "properties": {"code": {"const": r.status}, "message": {"const": message}, "data": data}});
            o.insert("content".into(), json!({"application/json": {"schema": schema}}));
        }
        Content::Raw(types, schema) => {
            let content: Map<String, Value> =
                types.iter().map(|t| ((*t).to_owned(), json!({"schema": schema}))).collect();
            o.insert("content".into(), Value::Object(content));
        }
    }
    if let Some(l) = &r.links {
        o.insert("links".into(), l.clone());
    }
    Value::Object(o)
}

pub(super) fn schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

pub(super) fn json_body(name: &str, required: bool) -> Value {
    json!({"required": required, "content": {"application/json": {"schema": schema(name)}}})
}

pub(super) fn query(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "query", "required": false, "description": description, "schema": schema})
}

pub(super) fn header_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "header", "required": false, "description": description, "schema": {"type": "string"}})
}

pub(super) fn etag() -> Value {
    header("A strong validator of the representation", json!({"type": "string", "pattern": "^\"[^\"]*\"$"}))
}

pub(super) fn location() -> Value {
    header("Where the new resource lives", json!({"type": "string", "pattern": "^/api/v1/"}))
}

fn set_cookie() -> Value {
    header(
        "`refresh_token` (HttpOnly, Path=/api/v1/auth) and `csrf_token` (readable by scripts, Path=/)",
        json!({"type": "string", "minLength": 1}),
    )
}

pub(super) const NO_STORE: &str = "no-store";
const SSE: &str = "text/event-stream";

fn status_ok() -> Content {
    Content::Raw(
        vec!["application/json"],
        json!({"type": "object", "required": ["status"], "additionalProperties": false,
            "properties": {"status": {"const": "ok"}}}),
    )
}

/// An event's `data` holding JSON that matches `schema`.
fn json_data(schema: Value) -> Value {
    json!({"type": "string", "contentMediaType": "application/json", "contentSchema": schema})
}

/// One event of `/api/events` (the schema applies to each event of the stream).
fn events_schema() -> Value {
    let event = |name: &str, data: Value| {
        json!({"type": "object", "required": ["event", "data"],
            "properties": {"event": {"const": name}, "data": json_data(data)}})
    };
    json!({"anyOf": [
        event("connected", json!({"type": "object", "required": ["message"], "additionalProperties": false,
            "properties": {"message": {"const": "connected"}}})),
        event("heartbeat", json!({"type": "object", "required": ["time"], "additionalProperties": false,
            "properties": {"time": {"type": "integer", "minimum": 0}}})),
        {"type": "object", "required": ["event", "data", "id"],
            "properties": {"event": {"const": "notification"}, "id": {"type": "string", "pattern": "^[0-9]+$"},
                "data": json_data(schema("Notification"))}},
        {"type": "object", "required": ["event", "data", "id"],
            "properties": {"event": {"const": "change"}, "id": {"type": "string", "pattern": "^[0-9]+$"},
                "data": json_data(json!({"type": "object", "required": ["resource", "action", "id", "record"],
                    "additionalProperties": false,
                    "properties": {"resource": {"type": "string"},
                        "action": {"type": "string", "enum": ["create", "update", "delete"]},
                        "id": {"type": "integer", "minimum": 1}, "record": {"type": ["object", "null"]}}}))}},
    ]})
}

/// `?resources=` of `/api/events`: a comma list of the resources whose changes are pushed
/// (blanks around a name and empty items are ignored).
fn resources_pattern(config: &Config) -> Value {
    let names: Vec<&str> = config.resources.list.iter().filter(|r| r.events).map(|r| r.name.as_str()).collect();
    let item =
        if names.is_empty() { "[ \\t]*".to_owned() } else { format!("[ \\t]*(?:(?:{})[ \\t]*)?", names.join("|")) };
    json!({"type": "string", "pattern": format!("^{item}(?:,{item})*$")})
}

/// One event of a chat answer: a chunk, the closing `[DONE]`, or an error that ends the stream.
fn chat_events_schema() -> Value {
    json!({"anyOf": [
        {"type": "object", "required": ["data"], "properties": {"event": {"const": "message"},
            "data": {"anyOf": [
                {"const": "[DONE]"},
                json_data(json!({"type": "object", "required": ["content"], "additionalProperties": false,
                    "properties": {"content": {"type": "string"}}})),
            ]}}},
        {"type": "object", "required": ["event", "data"], "properties": {"event": {"const": "error"},
            "data": json_data(json!({"type": "object", "required": ["message", "code"],
                "properties": {"message": {"type": "string"}, "code": {"type": "string"}}}))}},
    ]})
}

pub(super) fn by_id(op: &str) -> Value {
    json!({"operationId": op, "parameters": {"id": "$response.body#/data/id"}})
}

/// Every route, in the order `App` registers them.
pub fn all(p: &mut Paths<'_>) {
    service(p);
    files_and_pages(p);
    users(p);
    super::resources::paths(p);
    auth(p);
    notifications(p);
    streams(p);
    downloads(p);
    aggregation(p);
    p.add(
        "GET",
        "/metrics",
        &Op::new(
            "metrics",
            "service",
            "Prometheus metrics",
            "Requests by route pattern and status, latency histogram, open connections, streams, \
             WebSocket clients, workers and restarts, summed over all workers. Loopback clients only \
             (behind a `[proxy] trusted` proxy, the client it names): anyone else gets the 404 of \
             an unknown path.",
        )
        .ok(ok(200, "The exposition text", Content::Raw(vec!["text/plain"], json!({"type": "string"})), NO_STORE))
        .errors(&[404]),
    );
}

fn service(p: &mut Paths<'_>) {
    p.add(
        "GET",
        "/health",
        &Op::new("health", "service", "Liveness", "Cheap: touches no database.").ok(ok(
            200,
            "Alive",
            status_ok(),
            NO_STORE,
        )),
    );
    p.add(
        "GET",
        "/health/ready",
        &Op::new("ready", "service", "Readiness", "200 when the database answers; 503 while draining or without it.")
            .ok(ok(200, "Ready", status_ok(), NO_STORE))
            .errors(&[503]),
    );
    p.add(
        "GET",
        "/api/config",
        &Op::new("clientConfig", "service", "Public client settings", "")
            .param(header_param("If-None-Match", "An `ETag` from an earlier answer: 304 when it still matches"))
            .ok(ok(200, "The settings", Content::Envelope(schema("ClientConfig")), "public, max-age=3600")
                .header("ETag", etag()))
            .ok(ok(304, "Not modified", Content::Empty, "public, max-age=3600").header("ETag", etag())),
    );
    p.add(
        "GET",
        "/api/events",
        &Op::new(
            "events",
            "streams",
            "Server-sent events",
            "Starts with `retry: <ms>` and `event: connected` (`data: {\"message\":\"connected\"}`); then \
             `event: heartbeat` (`data: {\"time\": <ms since the epoch>}`) periodically, `event: notification` \
             with `id: <n>` and the notification as data, and `event: change` with `id: <n>` (the same sequence) \
             for each create, update and delete of a declared resource with `events = true` whose record the \
             stream's user may read (`data: {\"resource\", \"action\", \"id\", \"record\"}`, `record` null on a \
             delete). The stream's user comes from the bearer token or `?token=` (a bad token is 401); without \
             one the stream is anonymous and gets changes of `public` resources only. `Last-Event-ID: n` \
             replays what came after `n` first, by the same rule. The stream does not end by itself.",
        )
        .auth(Auth::Optional)
        .param(header_param(
            "Last-Event-ID",
            "Replay notifications and changes after this id (a non-negative integer; anything else is ignored)",
        ))
        .param(query(
            "token",
            "An access token, for clients that cannot send `Authorization` (never logged)",
            json!({"type": "string"}),
        ))
        .param(query(
            "resources",
            "Only the changes of these resources (a comma list of resources with `events = true`; \
             notifications still arrive); another name is 400",
            resources_pattern(p.config),
        ))
        .ok(ok(200, "The event stream", Content::Raw(vec![SSE], events_schema()), "no-cache")),
    );
    p.add(
        "GET",
        "/api/openapi.json",
        &Op::new("openapi", "service", "This document", "OpenAPI 3.1, built once per process.").ok(ok(
            200,
            "The document",
            Content::Raw(
                vec!["application/json"],
                json!({"type": "object", "required": ["openapi", "info", "paths"],
                    "properties": {"openapi": {"type": "string", "pattern": "^3\\.1\\."}}}),
            ),
            super::CACHE_CONTROL,
        )),
    );
    p.add(
        "GET",
        "/api/docs",
        &Op::new(
            "apiDocs",
            "service",
            "This document as an HTML page",
            "Every operation with its parameters, request body and responses, the errors and the \
             schemas, rendered from this document once per process. No script; its stylesheet is a \
             `/static/` file.",
        )
        .ok(ok(
            200,
            "The page",
            Content::Raw(vec!["text/html"], json!({"type": "string"})),
            super::CACHE_CONTROL,
        )),
    );
}

/// What `redirect::safe_path` accepts: `/`, then visible ASCII but `\`, and
/// percent escapes only of bytes that are still safe once decoded again
/// (visible ASCII but `\`, or non-ASCII); the first character is not `/`
/// (nor its escape `%2F`).
fn safe_path_pattern() -> String {
    let escape = |first: bool| {
        let two = if first { "2[1-9A-Ea-e]" } else { "2[1-9A-Fa-f]" };
        format!("%(?:{two}|[346][0-9A-Fa-f]|5[0-9ABD-Fabd-f]|7[0-9A-Ea-e]|[89A-Fa-f][0-9A-Fa-f])")
    };
    format!("^/(?:(?:[!-$&-.0-\\[\\]-~]|{})(?:[!-$&-\\[\\]-~]|{})*)?$", escape(true), escape(false))
}

/// What `redirect::allowed_url` accepts: `https://`, an allow-listed host
/// (any letter case, one trailing dot allowed), an optional port, then
/// visible ASCII but `\`. With no host allowed, nothing is.
fn allowed_url_schema(hosts: &[String]) -> Value {
    if hosts.is_empty() {
        return json!({"not": {}, "description": "No host is allowed: every `url` is refused"});
    }
    // Any letter case, without inline flags (not every regex dialect has them).
    let any_case = |s: &str| -> String {
        s.chars()
            .map(|c| match c {
                'a'..='z' => format!("[{c}{}]", c.to_ascii_uppercase()),
                '.' => "\\.".to_owned(),
                c => c.to_string(),
            })
            .collect()
    };
    let hosts: Vec<String> = hosts.iter().map(|h| any_case(h)).collect();
    let port = "[0-9]{1,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]";
    json!({"type": "string", "maxLength": MAX_TARGET, "pattern": format!(
        "^{}://(?:{})\\.?(?::(?:{port}))?(?:[/?#][!-\\[\\]-~]*)?$", any_case("https"), hosts.join("|"))})
}

fn files_and_pages(p: &mut Paths<'_>) {
    let links = pages::early_hints().map(|h| h.links().join(", ")).unwrap_or_default();
    p.add(
        "GET",
        "/",
        &Op::new(
            "page",
            "files",
            "The browser front end",
            "An HTML page: login form, live event feed, chat. Its script and style are `/static/` files \
             with a content hash in their names. An HTTP/1.1 `GET` is first answered with \
             `103 Early Hints` carrying the same `Link` fields (preload of the script and the style).",
        )
        .ok(ok(200, "The page", Content::Raw(vec!["text/html"], json!({"type": "string"})), NO_STORE).header(
            "Link",
            header(
                "Preload of the page's script and style (also sent in a `103 Early Hints` first)",
                json!({"type": "string", "examples": [links]}),
            ),
        )),
    );
    let icon = assets::by_plain("favicon.ico").map_or("image/x-icon", |a| a.content_type);
    p.add(
        "GET",
        "/favicon.ico",
        &Op::new("favicon", "files", "The favicon", "").ok(ok(
            200,
            "The icon",
            Content::Raw(vec![icon], json!({"type": "string"})),
            "public, max-age=86400",
        )),
    );
    let mut types: Vec<&'static str> =
        assets::all().iter().filter_map(|a| a.content_type.split(';').next()).map(str::trim).collect();
    types.sort_unstable();
    types.dedup();
    p.add(
        "GET",
        "/static/{name}",
        &Op::new(
            "staticAsset",
            "files",
            "A static asset of the page",
            "By its name with a content hash (`app.3f2a9c1b.js`, as the page links it); any other name, \
             an old hash included, is 404. Immutable: cached for a year.",
        )
        .ok(ok(200, "The asset", Content::Raw(types, json!({"type": "string"})), pages::IMMUTABLE))
        .errors(&[404]),
    );
    p.add(
        "GET",
        "/redirect",
        &Op::new(
            "redirect",
            "service",
            "A safe redirect",
            "Exactly one of `path` and `url`, once. `path`: a same-origin absolute path (one leading `/`, \
             not `//` or `/\\`, visible ASCII only, also after one more percent-decoding). `url`: an `https` \
             URL whose host is allow-listed. Anything else is 400 `illegal redirect target`.",
        )
        .param(query(
            "path",
            "A same-origin path, e.g. `/x`",
            json!({"type": "string", "maxLength": MAX_TARGET, "pattern": safe_path_pattern()}),
        ))
        .param(query(
            "url",
            "An https URL on an allow-listed host",
            allowed_url_schema(&p.config.redirect.allowed_hosts),
        ))
        .ok(ok(302, "To the target", Content::Empty, NO_STORE).header(
            "Location",
            header("The target, as a valid URI reference", json!({"type": "string", "minLength": 1})),
        )),
    );
    p.add(
        "POST",
        "/csp-report",
        &Op::new(
            "cspReport",
            "service",
            "Report a Content-Security-Policy violation",
            "Logged as one line; malformed JSON or another shape is 400.",
        )
        .body(json!({"required": true, "content": {
            "application/csp-report": {"schema": schema("CspReport")},
            "application/reports+json": {"schema": schema("CspReport")},
            "application/json": {"schema": schema("CspReport")},
        }}))
        .ok(ok(204, "Logged", Content::Empty, NO_STORE)),
    );
}

fn users(p: &mut Paths<'_>) {
    let mut links = json!({
        "GetUser": by_id("getUser"), "ReplaceUser": by_id("replaceUser"), "PatchUser": by_id("patchUser"),
        "DeleteUser": by_id("deleteUser"),
    });
    super::resources::child_links(p.config, "users", &mut links);
    p.versioned(
        "POST",
        "/users",
        &Op::new(
            "createUser",
            "users",
            "Sign up",
            "No token needed. `role` other than `user` needs an admin's token (403); a bad token is 401. \
             A duplicate e-mail (any letter case) is 409.",
        )
        .auth(Auth::Optional)
        .body(json_body("SignUp", true))
        .ok(ok(201, "Created", Content::Envelope(schema("User")), NO_STORE)
            .header("Location", location())
            .links(links.clone()))
        .errors(&[409, 503]),
    );
    p.versioned(
        "GET",
        "/users",
        &Op::new(
            "listUsers",
            "users",
            "List users",
            "Bad `role`, `sort`, `page` or `limit` is 400 listing each in `errors`.",
        )
        .auth(Auth::Bearer)
        .param(query("role", "Only this role", json!({"type": "string", "enum": ["user", "admin"]})))
        .param(query("q", "Name contains (case-insensitive)", json!({"type": "string"})))
        .param(query(
            "sort",
            "Comma list of `id`, `name`, `email`, `age`, `createdAt`, each optionally `-` (descending)",
            json!({"type": "string",
                    "pattern": "^-?(id|name|email|age|createdAt)(,-?(id|name|email|age|createdAt))*$"}),
        ))
        .param(query(
            "page",
            "Page number",
            json!({"type": "integer", "minimum": 1, "maximum": 1_000_000, "default": 1}),
        ))
        .param(query("limit", "Page size", json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20})))
        .ok(ok(200, "A page of users", Content::Envelope(schema("UserPage")), NO_STORE))
        .errors(&[503]),
    );
    p.versioned(
        "GET",
        "/users/{id}",
        &Op::new("getUser", "users", "Read a user", "")
            .auth(Auth::Bearer)
            .param(header_param("If-None-Match", "An `ETag` from an earlier answer: 304 when it still matches"))
            .ok(ok(200, "The user", Content::Envelope(schema("User")), NO_STORE).header("ETag", etag()))
            .ok(ok(304, "Not modified", Content::Empty, NO_STORE).header("ETag", etag()))
            .errors(&[404, 503]),
    );
    let write = "The user itself or an admin (else 403, checked before 404). `role` is for admins only (403). \
                 A new `password` or another `role` voids the user's access and refresh tokens.";
    let if_match = header_param("If-Match", "The user's current `ETag` (or `*`): 412 when it does not match");
    p.versioned(
        "PUT",
        "/users/{id}",
        &Op::new("replaceUser", "users", "Replace name, e-mail and age (absent age: null)", write)
            .auth(Auth::Bearer)
            .param(if_match.clone())
            .body(json_body("UserReplace", true))
            .ok(ok(200, "The user", Content::Envelope(schema("User")), NO_STORE).header("ETag", etag()))
            .errors(&[404, 409, 412, 503]),
    );
    p.versioned(
        "PATCH",
        "/users/{id}",
        &Op::new("patchUser", "users", "Change the fields given", write)
            .auth(Auth::Bearer)
            .param(if_match)
            .body(json_body("UserPatch", true))
            .ok(ok(200, "The user", Content::Envelope(schema("User")), NO_STORE).header("ETag", etag()))
            .errors(&[404, 409, 412, 503]),
    );
    p.versioned(
        "DELETE",
        "/users/{id}",
        &Op::new("deleteUser", "users", "Delete a user and what they own", "The user itself or an admin (else 403). Every record the user owns goes with it (and those records' children).")
            .auth(Auth::Bearer)
            .ok(ok(204, "Deleted", Content::Empty, NO_STORE))
            .errors(&[404, 503]),
    );
}

fn auth(p: &mut Paths<'_>) {
    let tokens = || {
        ok(
            200,
            "A new access token and a new refresh token (also as cookies)",
            Content::Envelope(schema("Tokens")),
            NO_STORE,
        )
        .header("Set-Cookie", set_cookie())
    };
    p.versioned(
        "POST",
        "/auth/login",
        &Op::new(
            "login",
            "auth",
            "Log in",
            "A wrong e-mail or password is 401 `invalid credentials` (same timing for both). Failed attempts \
             per address and e-mail are limited (429).",
        )
        .body(json_body("Login", true))
        .ok(tokens())
        .errors(&[401, 503]),
    );
    let cookie_params = [
        json!({"name": "refresh_token", "in": "cookie", "required": false,
            "description": "Used when the body has no `refreshToken`; needs `X-CSRF-Token`", "schema": {"type": "string"}}),
        json!({"name": "csrf_token", "in": "cookie", "required": false, "schema": {"type": "string"}}),
        header_param(
            "X-CSRF-Token",
            "Equal to the `csrf_token` cookie when the refresh token comes from the cookie (else 403)",
        ),
    ];
    let mut refresh = Op::new(
        "refresh",
        "auth",
        "Rotate the refresh token",
        "The token from the body, else from the cookie. It is spent: re-using it revokes its whole family (401).",
    )
    .body(json_body("RefreshBody", false))
    .ok(tokens())
    .errors(&[401, 503]);
    let mut logout =
        Op::new("logout", "auth", "Log out", "Revokes the token's family (if any) and clears the cookies.")
            .body(json_body("RefreshBody", false))
            .ok(ok(204, "Logged out; cookies cleared (`Max-Age=0`)", Content::Empty, NO_STORE)
                .header("Set-Cookie", set_cookie()))
            .errors(&[503]);
    for c in &cookie_params {
        refresh = refresh.param(c.clone());
        logout = logout.param(c.clone());
    }
    p.versioned("POST", "/auth/refresh", &refresh);
    p.versioned("POST", "/auth/logout", &logout);
    p.versioned(
        "GET",
        "/auth/me",
        &Op::new("me", "auth", "The caller", "A deleted user's token is 401 `invalid token`.")
            .auth(Auth::Bearer)
            .ok(ok(200, "The user", Content::Envelope(schema("User")), NO_STORE))
            .errors(&[503]),
    );
}

fn notifications(p: &mut Paths<'_>) {
    p.versioned(
        "POST",
        "/notifications",
        &Op::new(
            "createNotification",
            "notifications",
            "Send a notification",
            "Admins only (else 403); pushed to every `/api/events` stream.",
        )
        .auth(Auth::Bearer)
        .body(json_body("NewNotification", true))
        .ok(ok(201, "Created and pushed", Content::Envelope(schema("Notification")), NO_STORE))
        .errors(&[503]),
    );
}

fn streams(p: &mut Paths<'_>) {
    let upgrade = |id, summary, description| {
        Op::new(id, "streams", summary, description)
            .ok(ok(101, "Switching to WebSocket", Content::Empty, NO_STORE)
                .header("Upgrade", header("The new protocol", json!({"const": "websocket"})))
                .header("Sec-WebSocket-Accept", header("The handshake's answer", json!({"type": "string"}))))
            .errors(&[403, 426])
    };
    p.add(
        "GET",
        "/ws",
        &upgrade(
            "websocket",
            "WebSocket chat rooms",
            "An RFC 6455 upgrade (`Connection: Upgrade`, `Upgrade: websocket`, `Sec-WebSocket-Key`, \
             `Sec-WebSocket-Version: 13`); without one 400. The token is checked first (401), then the \
             `Origin` (403). Messages: `join`, `leave`, `chat`, `typing` with a `roomId`; `chat` and `typing` reach the room's members \
             with the sender's `from` (user id) and `name` (from the access token).",
        )
        .param(json!({"name": "token", "in": "query", "required": true,
            "description": "An access token (never logged)", "schema": {"type": "string"}}))
        .errors(&[401]),
    );
    if p.config.websocket.echo {
        p.add(
            "GET",
            "/ws/echo",
            &upgrade(
                "websocketEcho",
                "WebSocket echo",
                "Echoes every message (conformance testing). Same upgrade rules as `/ws`; no token.",
            ),
        );
    }
    let chat = Op::new(
        "chat",
        "streams",
        "Chat completion as server-sent events",
        "Validated first (422). Then `data: {\"content\": \"…\"}` per chunk and `data: [DONE]`; the response \
         ends. From the configured upstream (502/504 when it fails before the first chunk; after it an \
         `event: error` ends the stream) or the built-in echo.",
    )
    .body(json_body("Chat", true))
    .ok(ok(200, "The answer's chunks", Content::Raw(vec![SSE], chat_events_schema()), "no-cache"))
    .errors(&[502, 504]);
    p.add("POST", "/api/chat", &Op { id: "chatUnversioned".into(), ..chat.clone() });
    p.add("POST", "/api/v1/chat", &chat);
}

fn downloads(p: &mut Paths<'_>) {
    let file = |id, summary| {
        let bytes = || Content::Raw(vec!["application/octet-stream"], json!({"type": "string"}));
        let common = |r: Ok| {
            r.header("ETag", etag())
                .header("Last-Modified", header("The file's modification time", json!({"type": "string"})))
                .header("Accept-Ranges", header("Ranges are served", json!({"const": "bytes"})))
        };
        let disposition =
            || header("Always an attachment", json!({"type": "string", "pattern": "^attachment; filename=\""}));
        Op::new(id, "files", summary, "Regular files directly in the download directory only; anything else is 404. One `Range` (206); one outside the file is 416.")
            .param(header_param("Range", "`bytes=a-b`, `bytes=a-` or `bytes=-n`; an end past the file is clamped"))
            .param(header_param("If-Range", "The `ETag`: the range applies only if it still matches"))
            .param(header_param("If-None-Match", "An `ETag`: 304 when it still matches"))
            .ok(common(ok(200, "The file", bytes(), "no-cache")).header("Content-Disposition", disposition()))
            .ok(common(ok(206, "Part of the file", bytes(), "no-cache"))
                .header("Content-Disposition", disposition())
                .header("Content-Range", header("The part sent", json!({"type": "string", "pattern": "^bytes [0-9]+-[0-9]+/[0-9]+$"}))))
            .ok(common(ok(304, "Not modified", Content::Empty, "no-cache")))
            .errors(&[404, 416])
    };
    p.add("GET", "/download", &file("downloadDefault", "Download the file named `default`"));
    p.add("GET", "/download/{name}", &file("download", "Download a file"));
}

fn aggregation(p: &mut Paths<'_>) {
    let home = Op::new(
        "homepage",
        "aggregation",
        "The caller's homepage from three upstreams",
        "User, recent orders and recommendations fetched in parallel (cached). The user part failing is 502 \
         (or 504 on a timeout); orders or recommendations failing leave `[]` and are listed in `degraded`.",
    )
    .auth(Auth::Bearer)
    .ok(ok(200, "The homepage", Content::Envelope(schema("Homepage")), NO_STORE))
    .errors(&[502, 504]);
    p.add("GET", "/api/homepage", &Op { id: "homepageUnversioned".into(), ..home.clone() });
    p.add("GET", "/api/v1/homepage", &home);
}
