//! `GET /api/docs`: the OpenAPI document rendered as one HTML page a person
//! reads without JavaScript.
//!
//! The page is [`render`] of the same `serde_json::Value` that
//! `/api/openapi.json` serialises ([`super::document`]), built once per
//! configuration before the workers fork (`app::fixed`): a table of contents by tag, then each operation
//! (method and path, summary, who may call it, parameters, request body with
//! its limits, every response status with its description), the error
//! envelope with every error status and code, and the shared schemas. `$ref`s
//! become links to the schema's section; a request body's schema is also
//! expanded in place, so its limits are read where the operation is.
//!
//! Every string taken from the document goes through [`escape`]: resource and
//! enum names come from the operator's configuration. The page has no script,
//! no inline style and no `style` attribute; its one stylesheet is
//! `/static/docs.<hash>.css`, which the CSP's `style-src 'self'` allows, so
//! the page needs no nonce and is cached like the document.
//!
//! It must not say anything the document does not: it reads the document and
//! adds only layout.

use serde_json::{Map, Value};

use crate::app::{App, Ctx, Reply};
use crate::error::Error;
use crate::http::request::Request;

/// The methods an OpenAPI path item may hold, in display order.
const METHODS: [&str; 8] = ["get", "post", "put", "patch", "delete", "head", "options", "trace"];

/// How deep inline schemas are expanded into nested tables.
const MAX_DEPTH: usize = 3;

/// `GET /api/docs`: the page as rendered before fork (`app::fixed`).
pub fn docs(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    Ok(Reply::full(app.fixed.docs.answer(
        (app.svc.config, &app.fixed.forms),
        req,
        "text/html; charset=utf-8",
        super::CACHE_CONTROL,
    )))
}

/// `s` with `&`, `<`, `>`, `"` and `'` replaced by character references: safe
/// as element text and inside a quoted attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_into(&mut out, s);
    out
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// An `id` made of `[A-Za-z0-9_.-]` only: `prefix-` then `name` with every other character as `-`.
fn anchor(prefix: &str, name: &str) -> String {
    let safe = name.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '-' });
    format!("{prefix}-{}", safe.collect::<String>())
}

/// A JSON value as a reader sees it: a string bare, anything else as JSON.
fn literal(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// The page for `doc`; `stylesheet` is the URL of its style, if any.
pub fn render(doc: &Value, stylesheet: Option<&str>) -> String {
    let mut p = Page { out: String::with_capacity(256 * 1024), doc };
    let title = format!(
        "{} {} API reference",
        doc.pointer("/info/title").and_then(Value::as_str).unwrap_or("API"),
        doc.pointer("/info/version").and_then(Value::as_str).unwrap_or_default()
    );
    p.raw("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    p.raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
    p.text(&title);
    p.raw("</title>\n<link rel=\"icon\" href=\"/favicon.ico\">\n");
    if let Some(url) = stylesheet {
        p.raw("<link rel=\"stylesheet\" href=\"");
        p.text(url);
        p.raw("\">\n");
    }
    p.raw("</head>\n<body>\n<header>\n<h1>");
    p.text(&title);
    p.raw("</h1>\n");
    if let Some(d) = doc.pointer("/info/description").and_then(Value::as_str) {
        p.raw("<p>");
        p.prose(d);
        p.raw("</p>\n");
    }
    p.raw(
        "<p>The same description as OpenAPI 3.1 JSON: <a href=\"/api/openapi.json\"><code>/api/openapi.json</code></a>. \
         <a href=\"/\">The front page</a>.</p>\n</header>\n",
    );
    let groups = groups(doc);
    p.contents(&groups);
    p.raw("<main>\n");
    for g in &groups {
        p.group(g);
    }
    p.errors();
    p.schemas();
    p.raw("</main>\n</body>\n</html>\n");
    p.out
}

/// One operation of the document.
struct Operation<'d> {
    method: &'d str,
    path: &'d str,
    op: &'d Map<String, Value>,
}

impl Operation<'_> {
    fn id(&self) -> String {
        match self.op.get("operationId").and_then(Value::as_str) {
            Some(id) => anchor("op", id),
            None => anchor("op", &format!("{}-{}", self.method, self.path)),
        }
    }
}

/// A tag and its operations.
struct Group<'d> {
    name: &'d str,
    description: &'d str,
    ops: Vec<Operation<'d>>,
}

/// The operations grouped by their first tag: the document's tags in their
/// order, then any tag only an operation names, then the untagged (`other`).
fn groups(doc: &Value) -> Vec<Group<'_>> {
    let mut groups: Vec<Group<'_>> = doc
        .get("tags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let name = t.get("name")?.as_str()?;
            Some(Group { name, description: t.get("description").and_then(Value::as_str).unwrap_or(""), ops: vec![] })
        })
        .collect();
    for (path, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
        let Some(item) = item.as_object() else { continue };
        for method in METHODS {
            let Some(op) = item.get(method).and_then(Value::as_object) else { continue };
            let tag = op.get("tags").and_then(|t| t.get(0)).and_then(Value::as_str).unwrap_or("other");
            let at = match groups.iter().position(|g| g.name == tag) {
                Some(i) => i,
                None => {
                    groups.push(Group { name: tag, description: "", ops: vec![] });
                    groups.len() - 1
                }
            };
            groups[at].ops.push(Operation { method, path, op });
        }
    }
    groups.retain(|g| !g.ops.is_empty());
    groups
}

/// The page being written, and the document it describes.
struct Page<'d> {
    out: String,
    doc: &'d Value,
}

impl<'d> Page<'d> {
    /// Markup, as is (never a string from the document).
    fn raw(&mut self, s: &str) {
        self.out.push_str(s);
    }

    /// Text, escaped.
    fn text(&mut self, s: &str) {
        escape_into(&mut self.out, s);
    }

    /// Text with the document's `` `code` `` spans as `<code>`, escaped.
    fn prose(&mut self, s: &str) {
        for (i, part) in s.split('`').enumerate() {
            if i % 2 == 1 {
                self.raw("<code>");
                self.text(part);
                self.raw("</code>");
            } else {
                self.text(part);
            }
        }
    }

    fn code(&mut self, s: &str) {
        self.raw("<code>");
        self.text(s);
        self.raw("</code>");
    }

    /// The target of a local `$ref` (`#/components/...`), with its last segment.
    fn resolve(&self, reference: &str) -> Option<(&'d str, &'d Value)> {
        let doc: &'d Value = self.doc;
        let pointer = reference.strip_prefix('#')?;
        let name = pointer.rsplit('/').next()?;
        let target = doc.pointer(pointer)?;
        // The name as the document spells it (a `&'d str`), for links.
        let key = pointer.rsplit_once('/').and_then(|(parent, _)| doc.pointer(parent)?.as_object())?;
        let (name, _) = key.get_key_value(name)?;
        Some((name.as_str(), target))
    }

    fn contents(&mut self, groups: &[Group<'_>]) {
        self.raw("<nav aria-labelledby=\"h-contents\">\n<h2 id=\"h-contents\">Contents</h2>\n<ul>\n");
        for g in groups {
            self.raw("<li><a href=\"#");
            self.text(&anchor("tag", g.name));
            self.raw("\">");
            self.text(g.name);
            self.raw("</a>");
            if !g.description.is_empty() {
                self.raw(": ");
                self.prose(g.description);
            }
            self.raw("\n<ul class=\"ops\">\n");
            for o in &g.ops {
                self.raw("<li><a href=\"#");
                self.text(&o.id());
                self.raw("\">");
                self.text(&o.method.to_uppercase());
                self.raw(" ");
                self.code(o.path);
                self.raw("</a></li>\n");
            }
            self.raw("</ul></li>\n");
        }
        self.raw("<li><a href=\"#errors\">Errors</a>: the error envelope and every status</li>\n");
        self.raw("<li><a href=\"#schemas\">Schemas</a>: the bodies and records referred to above</li>\n");
        self.raw("</ul>\n</nav>\n");
    }

    fn group(&mut self, g: &Group<'_>) {
        self.raw("<section id=\"");
        self.text(&anchor("tag", g.name));
        self.raw("\">\n<h2>");
        self.text(g.name);
        self.raw("</h2>\n");
        if !g.description.is_empty() {
            self.raw("<p>");
            self.prose(g.description);
            self.raw("</p>\n");
        }
        for o in &g.ops {
            self.operation(o);
        }
        self.raw("</section>\n");
    }

    fn operation(&mut self, o: &Operation<'_>) {
        self.raw("<section class=\"op\" id=\"");
        self.text(&o.id());
        self.raw("\">\n<h3><span class=\"m m-");
        self.text(o.method);
        self.raw("\">");
        self.text(&o.method.to_uppercase());
        self.raw("</span> ");
        self.code(o.path);
        self.raw("</h3>\n");
        if let Some(s) = o.op.get("summary").and_then(Value::as_str) {
            self.raw("<p class=\"summary\">");
            self.prose(s);
            self.raw("</p>\n");
        }
        if let Some(d) = o.op.get("description").and_then(Value::as_str) {
            self.raw("<p>");
            self.prose(d);
            self.raw("</p>\n");
        }
        self.raw("<p class=\"note\">Authentication: ");
        self.text(&security(o.op.get("security")));
        self.raw("</p>\n");
        if let Some(params) = o.op.get("parameters").and_then(Value::as_array).filter(|p| !p.is_empty()) {
            self.parameters(params);
        }
        if let Some(body) = o.op.get("requestBody").and_then(Value::as_object) {
            self.request_body(body);
        }
        if let Some(responses) = o.op.get("responses").and_then(Value::as_object) {
            self.responses(responses);
        }
        self.raw("</section>\n");
    }

    fn parameters(&mut self, params: &[Value]) {
        self.raw("<h4>Parameters</h4>\n<table>\n<thead><tr><th>Name</th><th>In</th><th>Required</th><th>Type</th>");
        self.raw("<th>Rules</th></tr></thead>\n<tbody>\n");
        for param in params {
            let field = |k: &str| param.get(k).and_then(Value::as_str).unwrap_or("");
            let schema = param.get("schema").unwrap_or(&Value::Null);
            self.raw("<tr><td>");
            self.code(field("name"));
            self.raw("</td><td>");
            self.text(field("in"));
            self.raw("</td><td>");
            self.raw(if param.get("required").and_then(Value::as_bool) == Some(true) { "yes" } else { "no" });
            self.raw("</td><td>");
            self.type_label(schema);
            self.raw("</td><td>");
            self.rules(schema, param.get("description").and_then(Value::as_str), 1);
            self.raw("</td></tr>\n");
        }
        self.raw("</tbody>\n</table>\n");
    }

    fn request_body(&mut self, body: &Map<String, Value>) {
        self.raw("<h4>Request body</h4>\n<p>");
        self.raw(if body.get("required").and_then(Value::as_bool) == Some(true) { "Required" } else { "Optional" });
        if let Some(d) = body.get("description").and_then(Value::as_str) {
            self.raw(". ");
            self.prose(d);
        }
        self.raw(".</p>\n");
        // Media types that share a schema are listed together, the schema once.
        let mut shared: Vec<(Vec<&str>, &Value)> = Vec::new();
        for (media, content) in body.get("content").and_then(Value::as_object).into_iter().flatten() {
            let schema = content.get("schema").unwrap_or(&Value::Null);
            match shared.iter_mut().find(|(_, s)| *s == schema) {
                Some((types, _)) => types.push(media),
                None => shared.push((vec![media], schema)),
            }
        }
        for (types, schema) in shared {
            self.raw("<p>");
            for (i, t) in types.iter().enumerate() {
                if i > 0 {
                    self.raw(", ");
                }
                self.code(t);
            }
            self.raw(": ");
            self.type_label(schema);
            self.raw("</p>\n");
            let expanded = match schema.get("$ref").and_then(Value::as_str) {
                Some(r) => self.resolve(r).map(|(_, s)| s),
                None => Some(schema),
            };
            if let Some(s) = expanded {
                self.described(s);
            }
        }
    }

    fn responses(&mut self, responses: &Map<String, Value>) {
        self.raw("<h4>Responses</h4>\n<table>\n<thead><tr><th>Status</th><th>Description</th><th>Body</th></tr></thead>\n<tbody>\n");
        for (status, response) in responses {
            // A shared (error) response's headers are listed once, under `#errors`.
            let (response, shared) = match response.get("$ref").and_then(Value::as_str) {
                Some(r) => self.resolve(r).map_or((response, false), |(_, v)| (v, true)),
                None => (response, false),
            };
            self.raw("<tr><td>");
            self.text(status);
            self.raw("</td><td>");
            self.prose(response.get("description").and_then(Value::as_str).unwrap_or(""));
            if !shared {
                self.response_headers(response);
            }
            self.raw("</td><td>");
            let content = response.get("content").and_then(Value::as_object);
            for (i, (media, c)) in content.into_iter().flatten().enumerate() {
                if i > 0 {
                    self.raw("<br>");
                }
                self.code(media);
                let schema = c.get("schema").unwrap_or(&Value::Null);
                if let Some(code) = error_code(schema) {
                    self.raw(": the <a href=\"#errors\">error envelope</a>, <code>code</code> ");
                    self.code(code);
                } else if is_union(schema) {
                    self.raw(":");
                    self.schema(schema, 1);
                } else if !schema.is_null() {
                    self.raw(": ");
                    self.brief(schema, 0);
                }
            }
            self.raw("</td></tr>\n");
        }
        self.raw("</tbody>\n</table>\n");
    }

    /// The headers a response defines itself (those every response has are `$ref`s, left out).
    fn response_headers(&mut self, response: &Value) {
        let own: Vec<(&String, &Value)> = response
            .get("headers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(_, h)| h.get("$ref").is_none())
            .collect();
        if own.is_empty() {
            return;
        }
        self.raw("<br><span class=\"note\">Headers: ");
        for (i, (name, h)) in own.into_iter().enumerate() {
            if i > 0 {
                self.raw("; ");
            }
            self.code(name);
            if let Some(v) = h.pointer("/schema/const") {
                self.raw(" ");
                self.code(&literal(v));
            }
        }
        self.raw("</span>");
    }

    /// A one-line type: a link for a `$ref`, `array of …`, a constant, the JSON type(s).
    fn type_label(&mut self, s: &Value) {
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            match self.resolve(r) {
                Some((name, _)) => {
                    self.raw("<a href=\"#");
                    self.text(&anchor("schema", name));
                    self.raw("\">");
                    self.text(name);
                    self.raw("</a>");
                }
                None => self.code(r),
            }
            return;
        }
        if let Some(v) = s.get("const") {
            self.raw("exactly ");
            self.code(&literal(v));
            return;
        }
        let types: Vec<&str> = match s.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if types.is_empty() {
            self.raw(match () {
                _ if is_union(s) => "one of several forms",
                _ if s.get("not").is_some() => "nothing",
                _ => "any",
            });
            return;
        }
        for (i, t) in types.iter().enumerate() {
            if i > 0 {
                self.raw(" or ");
            }
            self.text(t);
            if *t == "array" {
                if let Some(items) = s.get("items") {
                    self.raw(" of ");
                    self.type_label(items);
                }
            }
        }
        if let Some(f) = s.get("format").and_then(Value::as_str) {
            self.raw(" (");
            self.text(f);
            self.raw(")");
        }
    }

    /// A schema's limits and description, then what is inside it ([`Page::inside`]).
    fn rules(&mut self, s: &Value, description: Option<&str>, depth: usize) {
        self.rules_text(s, description);
        self.inside(s, depth);
    }

    /// A schema's limits and description, as one run of text.
    fn rules_text(&mut self, s: &Value, description: Option<&str>) {
        let mut parts: Vec<String> = Vec::new();
        let num = |k: &str| s.get(k).filter(|v| v.is_number()).map(literal);
        let range = |what: &str, min: Option<String>, max: Option<String>| {
            let r = match (min, max) {
                (Some(a), Some(b)) => format!("{a} to {b}"),
                (Some(a), None) => format!("at least {a}"),
                (None, Some(b)) => format!("at most {b}"),
                (None, None) => return None,
            };
            Some(format!("{what} {}", escape(&r)))
        };
        parts.extend(range("length", num("minLength"), num("maxLength")));
        parts.extend(range("items", num("minItems"), num("maxItems")));
        parts.extend(range("value", num("minimum"), num("maximum")));
        if let Some(v) = num("exclusiveMinimum") {
            parts.push(format!("greater than {}", escape(&v)));
        }
        if let Some(v) = num("exclusiveMaximum") {
            parts.push(format!("less than {}", escape(&v)));
        }
        if let Some(v) = num("multipleOf") {
            parts.push(format!("a multiple of {}", escape(&v)));
        }
        if let Some(values) = s.get("enum").and_then(Value::as_array) {
            let list: Vec<String> = values.iter().map(|v| format!("<code>{}</code>", escape(&literal(v)))).collect();
            parts.push(format!("one of {}", list.join(", ")));
        }
        let patterns = s
            .get("pattern")
            .into_iter()
            .chain(s.get("allOf").and_then(Value::as_array).into_iter().flatten().filter_map(|a| a.get("pattern")));
        for p in patterns.filter_map(Value::as_str) {
            parts.push(format!("matches <code>{}</code>", escape(p)));
        }
        if s.get("properties").is_none() {
            let required = s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
            let list: Vec<String> = required.map(|n| format!("<code>{}</code>", escape(n))).collect();
            if !list.is_empty() {
                parts.push(format!("with {}", list.join(", ")));
            }
        }
        if let Some(v) = s.get("default") {
            parts.push(format!("default <code>{}</code>", escape(&literal(v))));
        }
        if let Some(v) = s.get("contentMediaType").and_then(Value::as_str) {
            parts.push(format!("holds <code>{}</code>", escape(v)));
        }
        self.raw(&parts.join("; "));
        let description = description.or_else(|| s.get("description").and_then(Value::as_str));
        if let Some(d) = description {
            if !parts.is_empty() {
                self.raw(". ");
            }
            self.prose(d);
        }
    }

    /// What is inside a schema, as nested blocks: an inline object's fields, an array's inline
    /// items, the JSON an event's data holds, the forms of a union (down to [`MAX_DEPTH`]).
    fn inside(&mut self, s: &Value, depth: usize) {
        let inner = s.get("items").filter(|i| i.get("$ref").is_none()).or(s.get("contentSchema")).unwrap_or(s);
        if depth < MAX_DEPTH && (has_fields(inner) || is_union(inner)) {
            self.schema(inner, depth);
        }
    }

    /// A schema in full under its own description (a request body's, a shared schema's).
    fn described(&mut self, s: &Value) {
        if has_fields(s) || is_union(s) {
            if let Some(d) = s.get("description").and_then(Value::as_str) {
                self.raw("<p>");
                self.prose(d);
                self.raw("</p>\n");
            }
        }
        self.schema(s, 0);
    }

    /// A schema in full: a table of its fields, the forms of a union, else its type and rules.
    fn schema(&mut self, s: &Value, depth: usize) {
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            let required: Vec<&str> =
                s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            self.raw("<table>\n<thead><tr><th>Field</th><th>Type</th><th>Required</th><th>Rules</th></tr></thead>\n<tbody>\n");
            for (name, prop) in props {
                self.raw("<tr><td>");
                self.code(name);
                self.raw("</td><td>");
                self.type_label(prop);
                self.raw("</td><td>");
                self.raw(if required.contains(&name.as_str()) { "yes" } else { "no" });
                self.raw("</td><td>");
                self.rules(prop, None, depth + 1);
                self.raw("</td></tr>\n");
            }
            self.raw("</tbody>\n</table>\n");
            if s.get("additionalProperties") == Some(&Value::Bool(false)) {
                self.raw("<p class=\"note\">No other field is accepted.</p>\n");
            }
        }
        for key in ["oneOf", "anyOf"] {
            let Some(forms) = s.get(key).and_then(Value::as_array) else { continue };
            self.raw(if key == "oneOf" { "<p>Exactly one of:</p>\n<ul>\n" } else { "<p>Any of:</p>\n<ul>\n" });
            for f in forms {
                self.raw("<li>");
                self.type_label(f);
                if depth < MAX_DEPTH {
                    self.raw(" ");
                    self.rules(f, None, depth + 1);
                }
                self.raw("</li>\n");
            }
            self.raw("</ul>\n");
        }
        if s.get("properties").is_none() && !is_union(s) {
            self.raw("<p>");
            self.type_label(s);
            self.raw(". ");
            self.rules_text(s, None);
            self.raw("</p>\n");
            self.inside(s, depth);
        }
    }

    /// A short form of a response body: `{code, message, data: User}`.
    fn brief(&mut self, s: &Value, depth: usize) {
        match s.get("properties").and_then(Value::as_object) {
            Some(props) if depth < 2 => {
                self.raw("{");
                for (i, (name, prop)) in props.iter().enumerate() {
                    if i > 0 {
                        self.raw(", ");
                    }
                    self.code(name);
                    self.raw(": ");
                    self.brief(prop, depth + 1);
                }
                self.raw("}");
            }
            _ => self.type_label(s),
        }
    }

    /// `#errors`: the envelope's fields (with the statuses that carry each) and every error status.
    fn errors(&mut self) {
        let doc: &'d Value = self.doc;
        let responses = doc.pointer("/components/responses").and_then(Value::as_object);
        // (status, code, description, schema) of each error status, once (the rate limited copy aside).
        let mut errors: Vec<(&str, &str, &Value, &Value)> = Vec::new();
        for r in responses.into_iter().flat_map(|m| m.values()) {
            let Some(content) = r.get("content").and_then(Value::as_object) else { continue };
            for c in content.values() {
                let schema = c.get("schema").unwrap_or(&Value::Null);
                let Some(code) = error_code(schema) else { continue };
                let status = status_of(code, doc).unwrap_or("");
                if !errors.iter().any(|e| e.1 == code) {
                    errors.push((status, code, r, schema));
                }
            }
        }
        errors.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(b.1)));
        self.raw("<section id=\"errors\">\n<h2>Errors</h2>\n");
        self.raw("<p>Every error is a JSON object with <code>Content-Type: application/json</code>. Its fields:</p>\n");
        // Each field of the envelope, its type from its first appearance, and where it appears.
        let mut fields: Vec<(&str, &Value, Vec<&str>, Vec<&str>)> = Vec::new();
        for &(status, _, _, schema) in &errors {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            for (name, prop) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
                let at = match fields.iter().position(|f| f.0 == name) {
                    Some(i) => i,
                    None => {
                        fields.push((name, prop, Vec::new(), Vec::new()));
                        fields.len() - 1
                    }
                };
                fields[at].2.push(status);
                if required.contains(&name.as_str()) {
                    fields[at].3.push(status);
                }
            }
        }
        self.raw("<table>\n<thead><tr><th>Field</th><th>Type</th><th>Present</th></tr></thead>\n<tbody>\n");
        for (name, prop, on, required_on) in &fields {
            self.raw("<tr><td>");
            self.code(name);
            self.raw("</td><td>");
            let shown = if prop.get("const").is_some() { &Value::Null } else { *prop };
            if shown.is_null() {
                self.raw("string: the code of the status (below)");
            } else {
                self.type_label(shown);
            }
            self.raw("</td><td>");
            if required_on.len() == errors.len() {
                self.raw("always");
            } else {
                self.raw("on ");
                self.text(&on.join(", "));
                if !required_on.is_empty() {
                    self.raw(" (always on ");
                    self.text(&required_on.join(", "));
                    self.raw(")");
                }
            }
            if let Some(d) = prop.get("description").and_then(Value::as_str) {
                self.raw(". ");
                self.prose(d);
            }
            self.raw("</td></tr>\n");
        }
        self.raw("</tbody>\n</table>\n");
        self.raw("<table>\n<thead><tr><th>Status</th><th><code>code</code></th><th>When</th></tr></thead>\n<tbody>\n");
        for (status, code, response, _) in &errors {
            self.raw("<tr><td>");
            self.text(status);
            self.raw("</td><td>");
            self.code(code);
            self.raw("</td><td>");
            self.prose(response.get("description").and_then(Value::as_str).unwrap_or(""));
            self.response_headers(response);
            self.raw("</td></tr>\n");
        }
        self.raw("</tbody>\n</table>\n</section>\n");
    }

    /// `#schemas`: every shared schema, each under `#schema-<name>`.
    fn schemas(&mut self) {
        let doc: &'d Value = self.doc;
        self.raw("<section id=\"schemas\">\n<h2>Schemas</h2>\n");
        for (name, s) in doc.pointer("/components/schemas").and_then(Value::as_object).into_iter().flatten() {
            self.raw("<section class=\"schema\" id=\"");
            self.text(&anchor("schema", name));
            self.raw("\">\n<h3>");
            self.text(name);
            self.raw("</h3>\n");
            self.described(s);
            self.raw("</section>\n");
        }
        self.raw("</section>\n");
    }
}

/// Whether `s` is an object schema with fields.
fn has_fields(s: &Value) -> bool {
    s.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty())
}

/// Whether `s` is a `oneOf` or `anyOf`.
fn is_union(s: &Value) -> bool {
    s.get("oneOf").is_some() || s.get("anyOf").is_some()
}

/// The `code` of an error envelope's schema (`properties.code.const` a string), if `s` is one.
fn error_code(s: &Value) -> Option<&str> {
    s.pointer("/properties/code/const").and_then(Value::as_str)
}

/// The status whose shared error response carries `code`, as the document names it (`E404` → `404`).
fn status_of<'d>(code: &str, doc: &'d Value) -> Option<&'d str> {
    let responses = doc.pointer("/components/responses").and_then(Value::as_object)?;
    responses.iter().find_map(|(name, r)| {
        let content = r.get("content")?.as_object()?;
        let carries = content.values().any(|c| c.get("schema").and_then(error_code) == Some(code));
        let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        carries.then_some(&digits[..end]).filter(|d| !d.is_empty())
    })
}

/// Who may call an operation, from its `security` requirements.
fn security(s: Option<&Value>) -> String {
    let Some(list) = s.and_then(Value::as_array) else { return "as the document's default".into() };
    if list.is_empty() {
        return "none".into();
    }
    let ways: Vec<String> = list
        .iter()
        .filter_map(Value::as_object)
        .map(|req| {
            if req.is_empty() {
                "none".to_owned()
            } else {
                req.keys().map(|k| format!("{k} token")).collect::<Vec<_>>().join(" and ")
            }
        })
        .collect();
    ways.join(" or ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;
    use crate::config::Config;

    #[test]
    fn escape_replaces_every_character_that_could_open_markup() {
        assert_eq!(escape("<script>alert('x')</script>"), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;");
        assert_eq!(escape("a & b \"c\""), "a &amp; b &quot;c&quot;");
        assert_eq!(escape("plain ünïcode"), "plain ünïcode");
        assert_eq!(escape(""), "");
        assert_eq!(escape("&amp;"), "&amp;amp;", "escaping is not undone by an entity in the input");
    }

    #[test]
    fn anchors_are_safe_ids() {
        assert_eq!(anchor("op", "articles.list"), "op-articles.list");
        assert_eq!(anchor("op", "x\"><script>"), "op-x---script-");
        assert_eq!(anchor("tag", "a b/c"), "tag-a-b-c");
    }

    /// A document whose every string is hostile: nothing of it reaches the page as markup.
    #[test]
    fn strings_from_the_document_are_escaped_everywhere() {
        let evil = "<script>alert(1)</script>\"'&";
        let doc = json!({
            "info": {"title": evil, "version": evil, "description": format!("`{evil}` {evil}")},
            "tags": [{"name": evil, "description": evil}],
            "paths": {format!("/api/{evil}"): {"get": {
                "operationId": evil, "tags": [evil], "summary": evil, "description": evil,
                "security": [{evil: []}],
                "parameters": [{"name": evil, "in": evil, "required": true, "description": evil,
                    "schema": {"type": evil, "enum": [evil], "pattern": evil, "default": evil}}],
                "requestBody": {"required": true, "content": {evil: {"schema": {"$ref": "#/components/schemas/x"}}}},
                "responses": {evil: {"description": evil, "headers": {evil: {"schema": {"const": evil}}},
                    "content": {evil: {"schema": {"type": "object", "properties": {evil: {"const": evil}}}}}},
                    "404": {"$ref": "#/components/responses/E404"}}
            }}},
            "components": {
                "schemas": {"x": {"type": "object", "description": evil, "required": [evil],
                    "properties": {evil: {"type": "string", "maxLength": 3, "description": evil,
                        "enum": [evil, null], "format": evil}}}},
                "responses": {"E404": {"description": evil, "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"code": {"const": evil}, "message": {"type": "string"}}}}}}}
            }
        });
        let page = render(&doc, Some(evil));
        assert!(!page.contains("<script"), "raw <script in the page");
        assert!(!page.contains(evil), "an unescaped string from the document");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
        // Every attribute value is quoted and holds no raw quote from the document.
        for attr in page.split(" id=\"").skip(1).chain(page.split(" href=\"").skip(1)) {
            let value = attr.split('"').next().unwrap_or_default();
            assert!(!value.contains(['<', '>', '\'']), "{value}");
        }
    }

    fn declared() -> Config {
        super::super::declaring(
            r#"
            [[resources]]
            name = "articles"
            read = "public"
            [resources.fields.title]
            type = "string"
            required = true
            max = 120
            [resources.fields.state]
            type = "enum"
            values = ["draft", "<b>live</b>"]
            default = "draft"
        "#,
        )
    }

    /// Every operation of the real document is on the page, linked from the contents.
    #[test]
    fn every_operation_of_the_document_is_listed_and_linked() {
        let mut c = declared();
        c.websocket.echo = true;
        let doc = super::super::document(&c);
        let page = render(&doc, Some("/static/docs.css"));
        let mut count = 0;
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                let id = anchor("op", op["operationId"].as_str().unwrap_or_default());
                let heading = format!(
                    "<section class=\"op\" id=\"{id}\">\n<h3><span class=\"m m-{method}\">{}</span> <code>{}</code></h3>",
                    method.to_uppercase(),
                    escape(path)
                );
                assert_eq!(page.matches(&heading).count(), 1, "{method} {path}");
                assert!(page.contains(&format!("<a href=\"#{id}\">")), "{method} {path} not in the contents");
                count += 1;
            }
        }
        assert!(count > 50, "{count} operations");
        for path in ["/api/v1/users", "/api/v1/articles/{id}", "/api/articles", "/ws/echo", "/api/docs"] {
            assert!(page.contains(&format!("<code>{path}</code></h3>")), "{path}");
        }
        // Every link inside the page lands on an id of the page.
        let ids: BTreeSet<&str> = page.split(" id=\"").skip(1).filter_map(|s| s.split('"').next()).collect();
        for target in page.split("href=\"#").skip(1).filter_map(|s| s.split('"').next()) {
            assert!(ids.contains(target), "dangling link #{target}");
        }
        assert!(page.contains("&lt;b&gt;live&lt;/b&gt;") && !page.contains("<b>live"), "an enum value is escaped");
    }

    /// What a reader needs is on the page: limits, responses, errors, who may call.
    #[test]
    fn the_page_states_limits_responses_and_errors() {
        let page = render(&super::super::document(&Config::default()), None);
        let users = page.split("id=\"op-createUser\"").nth(1).and_then(|s| s.split("</section>").next());
        let users = users.expect("createUser");
        for needle in [
            "<p class=\"summary\">Sign up</p>",
            "Authentication: none or bearer token",
            "<a href=\"#schema-SignUp\">SignUp</a>",
            "<code>password</code></td><td>string</td><td>yes</td><td>length 8 to 128",
            "<code>age</code></td><td>integer or null</td><td>no</td><td>value 0 to 150",
            "<tr><td>201</td><td>Created",
            "<code>Location</code>",
            "<tr><td>409</td><td>A duplicate",
            "the <a href=\"#errors\">error envelope</a>, <code>code</code> <code>CONFLICT</code>",
            "<tr><td>422</td>",
        ] {
            assert!(users.contains(needle), "{needle} not in\n{users}");
        }
        let list = page.split("id=\"op-listUsers\"").nth(1).and_then(|s| s.split("</section>").next());
        let list = list.expect("listUsers");
        assert!(list.contains("<code>limit</code></td><td>query</td><td>no</td><td>integer</td><td>value 1 to 100"));
        let chat = page.split("id=\"op-chat\"").nth(1).and_then(|s| s.split("</section>").next()).expect("chat");
        assert!(chat.contains("items 1 to 100"), "maxItems of a body: {chat}");
        let errors = page.split("<section id=\"errors\">").nth(1).expect("errors");
        for needle in [
            "<tr><td>404</td><td><code>NOT_FOUND</code></td>",
            "<tr><td>429</td><td><code>RATE_LIMITED</code></td>",
            "<tr><td><code>code</code></td><td>string: the code of the status (below)</td><td>always",
            "<tr><td><code>errors</code></td>",
        ] {
            assert!(errors.contains(needle), "{needle}");
        }
        assert!(page.starts_with("<!doctype html>\n<html lang=\"en\">"));
        // Within the CSP with no nonce: no script, no inline style, no handler attribute.
        for bad in ["<script", "<style", "style=", " onclick=", " onload=", "http://", "https://"] {
            assert!(!page.contains(bad), "{bad}");
        }
    }
}
