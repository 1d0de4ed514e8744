//! The document's `components`: the bearer scheme, the resource and body
//! schemas (with the limits the validators enforce), the headers every
//! response carries, and one error response per status (in two forms: with
//! and without the rate limiter's headers).

use serde_json::{json, Map, Value};

use crate::config::Config;

/// Error statuses with a shared response; `(status, code, description)`.
pub const ERRORS: &[(u16, &str, &str)] = &[
    (
        400,
        "BAD_REQUEST",
        "Malformed request or JSON, a bad query parameter (listed in `errors`), an unsupported API version",
    ),
    (
        401,
        "UNAUTHORIZED",
        "No credential (`token required`), a bad one (`invalid token`) or a failed login (`invalid credentials`)",
    ),
    (403, "FORBIDDEN", "Authenticated but not allowed, or a failed origin or CSRF check"),
    (404, "NOT_FOUND", "No such resource"),
    (
        409,
        "CONFLICT",
        "A duplicate: the e-mail is already registered (any letter case) or a `unique` field's value is taken; \
         or a change of state its transitions do not allow. `errors` names the field (declared resources)",
    ),
    (412, "PRECONDITION_FAILED", "`If-Match` does not match the current `ETag`"),
    (413, "PAYLOAD_TOO_LARGE", "The body is over the JSON body limit"),
    (415, "UNSUPPORTED_MEDIA_TYPE", "The body is not of a media type this route takes"),
    (416, "RANGE_NOT_SATISFIABLE", "The `Range` lies outside the file (`Content-Range: bytes */<size>`)"),
    (422, "VALIDATION_ERROR", "The body breaks the schema; `errors` lists every bad field, nothing is stored"),
    (426, "UPGRADE_REQUIRED", "A WebSocket version other than 13"),
    (431, "REQUEST_HEADER_FIELDS_TOO_LARGE", "The request head (target included) is over the header size limit"),
    (429, "RATE_LIMITED", "Over the rate limit (or the login attempts of this address for this e-mail)"),
    (500, "INTERNAL_ERROR", "A bug; details only in the logs"),
    (502, "UPSTREAM_UNAVAILABLE", "An upstream refused, failed or answered something unusable"),
    (503, "SERVICE_UNAVAILABLE", "Draining, or the database does not answer"),
    (504, "UPSTREAM_TIMEOUT", "An upstream did not answer in time"),
];

/// The `$ref` of the shared response for `status`; `limited`: the route is rate limited.
pub fn error_ref(status: u16, limited: bool) -> Value {
    json!({"$ref": format!("#/components/responses/{}", error_name(status, limited))})
}

fn error_name(status: u16, limited: bool) -> String {
    if limited {
        format!("E{status}Limited")
    } else {
        format!("E{status}")
    }
}

/// Whether the rate limiter's headers go out on `path`'s responses.
pub fn limited(config: &Config, path: &str) -> bool {
    config.rate_limit.enabled && (path.starts_with("/api/") || path == "/csp-report")
}

/// The headers of a response: those every response has, the limiter's when
/// `limited`, then `extra` (name, header object).
pub fn headers(config: &Config, limited: bool, extra: Vec<(&str, Value)>) -> Value {
    let mut m = Map::new();
    let csp = if config.csp_report_only { "Content-Security-Policy-Report-Only" } else { "Content-Security-Policy" };
    m.insert(csp.into(), json!({"$ref": "#/components/headers/Content-Security-Policy"}));
    for name in COMMON {
        m.insert((*name).into(), json!({"$ref": format!("#/components/headers/{name}")}));
    }
    if limited {
        for name in RATE_LIMIT {
            m.insert((*name).into(), json!({"$ref": format!("#/components/headers/{name}")}));
        }
    }
    for (k, v) in extra {
        m.insert(k.into(), v);
    }
    Value::Object(m)
}

/// A required header with `schema`.
pub fn header(description: &str, schema: Value) -> Value {
    json!({"description": description, "required": true, "schema": schema})
}

/// The `Cache-Control` header with exactly `value`.
pub fn cache_control(value: &str) -> Value {
    header("Caching rule of this response", json!({"const": value}))
}

const COMMON: &[&str] = &[
    "X-Request-Id",
    "Date",
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Referrer-Policy",
    "Permissions-Policy",
    "Cross-Origin-Opener-Policy",
    "Cross-Origin-Embedder-Policy",
    "Cross-Origin-Resource-Policy",
];

const RATE_LIMIT: &[&str] = &["RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];

fn header_components(config: &Config) -> Value {
    let fixed = |v: &str| header("Sent on every response", json!({"const": v}));
    let number = |d: &str| header(d, json!({"type": "integer", "minimum": 0}));
    json!({
        "Content-Security-Policy": header(
            if config.csp_report_only {
                "The policy (report only): on an HTML document with a fresh script nonce per response, \
                 on every other response the one fixed API policy"
            } else {
                "The policy: on an HTML document with a fresh script nonce per response, on every other \
                 response the one fixed API policy"
            },
            json!({"type": "string", "anyOf": [
                {"const": crate::http::headers::API_CSP},
                {"pattern": "^default-src 'none'; script-src 'nonce-[A-Za-z0-9+/=_-]+' 'strict-dynamic'"},
            ]}),
        ),
        "X-Request-Id": header(
            "The request's own `x-request-id` when it is 1-128 of `[A-Za-z0-9._-]`, else a fresh UUID",
            json!({"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$"}),
        ),
        "Date": header("When the response was made", json!({"type": "string", "minLength": 1})),
        "Strict-Transport-Security": fixed("max-age=31536000; includeSubDomains; preload"),
        "X-Content-Type-Options": fixed("nosniff"),
        "X-Frame-Options": fixed("DENY"),
        "X-XSS-Protection": fixed("0"),
        "Referrer-Policy": fixed("strict-origin-when-cross-origin"),
        "Permissions-Policy": fixed("camera=(), microphone=(), geolocation=()"),
        "Cross-Origin-Opener-Policy": fixed("same-origin"),
        "Cross-Origin-Embedder-Policy": fixed("require-corp"),
        "Cross-Origin-Resource-Policy": fixed("same-origin"),
        "RateLimit-Policy": header(
            "`<max>;w=<window seconds>`",
            json!({"type": "string", "pattern": format!("^{};w={}$", config.rate_limit.max, config.rate_limit.window.as_secs())}),
        ),
        "RateLimit-Limit": number("Requests allowed per window"),
        "RateLimit-Remaining": number("Requests left in this window"),
        "RateLimit-Reset": number("Seconds until the window ends"),
    })
}

fn error_responses(config: &Config) -> Value {
    let mut m = Map::new();
    for &(status, code, description) in ERRORS {
        for limited in [false, true] {
            if limited && !config.rate_limit.enabled {
                continue;
            }
            if status == 429 && !limited {
                continue; // only limited routes answer 429
            }
            let mut extra = vec![("Cache-Control", cache_control("no-store"))];
            match status {
                401 => extra.push(("WWW-Authenticate", header("The scheme to use", json!({"const": "Bearer"})))),
                429 => extra.push((
                    "Retry-After",
                    header("Seconds until the window ends", json!({"type": "integer", "minimum": 0})),
                )),
                416 => extra.push((
                    "Content-Range",
                    header("The file's size", json!({"type": "string", "pattern": "^bytes \\*/[0-9]+$"})),
                )),
                426 => extra.push(("Sec-WebSocket-Version", header("The version spoken", json!({"const": "13"})))),
                _ => {}
            }
            m.insert(
                error_name(status, limited),
                json!({
                    "description": description,
                    "headers": headers(config, limited, extra),
                    "content": {"application/json": {"schema": error_schema(config, status, code)}},
                }),
            );
        }
    }
    Value::Object(m)
}

/// The error envelope for `status`.
fn error_schema(config: &Config, status: u16, code: &str) -> Value {
    let message = match status {
        401 => json!({"enum": ["token required", "invalid token", "invalid credentials"]}),
        404 => json!({"const": "resource not found"}),
        500 => json!({"const": "internal server error"}),
        _ => json!({"type": "string", "minLength": 1}),
    };
    let mut props = Map::new();
    props.insert("code".into(), json!({"const": code}));
    props.insert("message".into(), message);
    let mut required = vec!["code", "message"];
    if status == 422 {
        props.insert("errors".into(), json!({"$ref": "#/components/schemas/FieldErrors"}));
        required.push("errors");
    } else if status == 400 || status == 409 {
        props.insert("errors".into(), json!({"$ref": "#/components/schemas/FieldErrors"}));
    }
    if status == 500 && config.is_development() {
        props.insert("stack".into(), json!({"type": "string", "description": "The detail (development only)"}));
    }
    json!({"type": "object", "required": required, "additionalProperties": false, "properties": props})
}

/// Unicode `White_Space`: what `str::trim` removes (a name must hold something else).
const NOT_ONLY_SPACE: &str =
    "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";

/// What `validate::email` accepts (with [`EMAIL_LOCAL_LENGTH`]): one `@`;
/// before it dot-separated runs of letters, digits and `!#$%&'*+/=?^_`{|}~-`;
/// after it at least two dot-separated labels of letters, digits and inner `-`.
pub const EMAIL_PATTERN: &str = concat!(
    "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*",
    "@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
);

/// At most 64 characters before the `@` (a second pattern: one regular
/// expression for both rules would need a look-ahead).
pub const EMAIL_LOCAL_LENGTH: &str = "^[^@]{1,64}@";

/// Envelope B's `data`: a page of `item` (a schema's name).
pub fn page(item: &str) -> Value {
    json!({"type": "object", "additionalProperties": false,
    "required": ["items", "total", "page", "pageSize", "totalPages"],
    "properties": {
        "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{item}")}},
        "total": {"type": "integer", "minimum": 0},
        "page": {"type": "integer", "minimum": 1},
        "pageSize": {"type": "integer", "minimum": 1, "maximum": 100},
        "totalPages": {"type": "integer", "minimum": 0},
    }})
}

/// A timestamp as the service writes it: RFC 3339 in UTC.
pub fn time() -> Value {
    json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$",
        "description": "RFC 3339, UTC"})
}

fn schemas(config: &Config) -> Value {
    let name = json!({"type": "string", "minLength": 1, "maxLength": 100, "pattern": NOT_ONLY_SPACE,
        "description": "1-100 characters, not only white space"});
    let email = json!({"type": "string", "maxLength": 254,
        "allOf": [{"pattern": EMAIL_PATTERN}, {"pattern": EMAIL_LOCAL_LENGTH}],
        "description": "An e-mail address of at most 254 characters, at most 64 before the `@`; unique in any letter case"});
    let age = json!({"type": ["integer", "null"], "minimum": 0, "maximum": 150});
    let role = json!({"type": "string", "enum": ["user", "admin"]});
    let time = time();
    let id = json!({"type": "integer", "minimum": 1});
    let text = json!({"type": ["string", "null"]});
    let count = json!({"type": ["integer", "null"], "minimum": 0});
    let mut m = Map::new();
    m.insert(
        "User".into(),
        json!({"type": "object", "additionalProperties": false,
            "required": ["id", "name", "email", "age", "role", "createdAt", "updatedAt"],
            "properties": {"id": id, "name": {"type": "string"}, "email": {"type": "string"}, "age": age,
                "role": role, "createdAt": time, "updatedAt": time}}),
    );
    m.insert(
        "Notification".into(),
        json!({"type": "object", "additionalProperties": false,
            "required": ["id", "title", "body", "createdAt"],
            "properties": {"id": id, "title": {"type": "string"}, "body": {"type": "string"}, "createdAt": time}}),
    );
    m.insert("UserPage".into(), page("User"));
    m.insert(
        "FieldErrors".into(),
        json!({"type": "array", "items": {"type": "object", "additionalProperties": false,
            "required": ["field", "message"],
            "properties": {"field": {"type": "string"}, "message": {"type": "string"}}}}),
    );
    m.insert("SignUp".into(), json!({"type": "object", "additionalProperties": false, "required": ["name", "email", "password"],
            "properties": {"name": name, "email": email,
                "password": {"type": "string", "minLength": 8, "maxLength": 128}, "age": age,
                "role": {"type": "string", "enum": ["user", "admin"], "description": "Anything but `user` needs an admin's bearer token (else 403)"}}}));
    let password = json!({"type": "string", "minLength": 8, "maxLength": 128,
        "description": "A new password: voids every token issued before (the caller logs in again)"});
    let current = json!({"type": "string",
        "description": "Required to change your own password (403 without or when wrong; failures count as login attempts); ignored without `password`"});
    let role = json!({"type": "string", "enum": ["user", "admin"],
        "description": "Admins only (else 403); another role voids the user's tokens"});
    m.insert(
        "UserReplace".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["name", "email"],
            "properties": {"name": name, "email": email, "age": age, "role": role,
                "password": password, "currentPassword": current}}),
    );
    m.insert(
        "UserPatch".into(),
        json!({"type": "object", "additionalProperties": false,
            "properties": {"name": name, "email": email, "age": age, "role": role,
                "password": password, "currentPassword": current}}),
    );
    m.insert(
        "NewNotification".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["title"],
            "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 200},
                "body": {"type": "string", "maxLength": 2000}}}),
    );
    m.insert(
        "Login".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["email", "password"],
            "properties": {"email": {"type": "string"}, "password": {"type": "string"}}}),
    );
    m.insert(
        "RefreshBody".into(),
        json!({"type": "object", "additionalProperties": false,
            "properties": {"refreshToken": {"type": "string",
                "description": "Absent: the `refresh_token` cookie is used (with the CSRF double submit)"}}}),
    );
    m.insert(
        "Tokens".into(),
        json!({"type": "object", "additionalProperties": false,
            "required": ["accessToken", "tokenType", "expiresIn", "refreshToken"],
            "properties": {"accessToken": {"type": "string", "minLength": 1}, "tokenType": {"const": "Bearer"},
                "expiresIn": {"const": config.auth.access_ttl.as_secs()},
                "refreshToken": {"type": "string", "minLength": 1}}}),
    );
    m.insert(
        "Chat".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["messages"],
            "properties": {"messages": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
                "type": "object", "additionalProperties": false, "required": ["role", "content"],
                "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]},
                    "content": {"type": "string"}}}}}}),
    );
    m.insert(
        "ClientConfig".into(),
        json!({"type": "object", "additionalProperties": false,
            "required": ["environment", "version", "publicOrigin", "apiBase", "limits", "sse", "websocket", "auth"],
            "properties": {
                "environment": {"type": "string", "enum": ["development", "production"]},
                "version": {"type": "string"},
                "publicOrigin": {"type": "string"},
                "apiBase": {"const": "/api/v1"},
                "limits": {"type": "object", "required": ["jsonBodyBytes"],
                    "properties": {"jsonBodyBytes": {"type": "integer"}}},
                "sse": {"type": "object", "required": ["path", "retryMs"],
                    "properties": {"path": {"const": "/api/events"}, "retryMs": {"type": "integer"}}},
                "websocket": {"type": "object", "required": ["path", "maxMessageBytes"],
                    "properties": {"path": {"const": "/ws"}, "maxMessageBytes": {"type": "integer"}}},
                "auth": {"type": "object", "required": ["accessTtlSecs"],
                    "properties": {"accessTtlSecs": {"type": "integer"}}}}}),
    );
    m.insert(
        "Homepage".into(),
        json!({"type": "object", "additionalProperties": false,
            "required": ["user", "recentOrders", "recommendations"],
            "properties": {
                "user": {"type": "object", "required": ["name", "avatar"],
                    "properties": {"name": {}, "avatar": {}}},
                "recentOrders": {"type": "array", "items": {"type": "object", "required": ["id", "status", "total"],
                    "properties": {"id": {}, "status": {}, "total": {}}}},
                "recommendations": {"type": "array", "maxItems": 10},
                "degraded": {"type": "array", "minItems": 1,
                    "items": {"type": "string", "enum": ["recentOrders", "recommendations"]}}}}),
    );
    super::resources::schemas(&config.resources, &mut m);
    m.insert("CspReport".into(), json!({
            "description": "The `report-uri` form, or the Reporting API's list of reports (at least one `csp-violation`)",
            "oneOf": [
                {"type": "object", "required": ["csp-report"], "properties": {"csp-report": {"type": "object",
                    "properties": {
                        "document-uri": text, "violated-directive": text, "effective-directive": text,
                        "blocked-uri": text, "original-policy": {}, "source-file": text,
                        "script-sample": text, "disposition": text, "line-number": count, "column-number": count},
                    "anyOf": [
                        {"required": ["effective-directive"], "properties": {"effective-directive": {"type": "string"}}},
                        {"required": ["violated-directive"], "properties": {"violated-directive": {"type": "string"}}}]}}},
                {"type": "array", "minItems": 1,
                    "contains": {"type": "object", "required": ["type"], "properties": {"type": {"const": "csp-violation"}}},
                    "items": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}},
                        "if": {"properties": {"type": {"const": "csp-violation"}}},
                        "then": {"required": ["body"], "properties": {"body": {"type": "object",
                            "required": ["effectiveDirective"],
                            "properties": {
                                "documentURL": text, "effectiveDirective": {"type": "string"}, "blockedURL": text,
                                "sourceFile": text, "sample": text, "disposition": text,
                                "lineNumber": count, "columnNumber": count}}}}}},
            ]}));
    Value::Object(m)
}

/// The whole `components` object.
pub fn components(config: &Config) -> Value {
    json!({
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
            "description": "An access token from `POST /api/v1/auth/login` or `/auth/refresh`"}},
        "schemas": schemas(config),
        "headers": header_components(config),
        "responses": error_responses(config),
    })
}
