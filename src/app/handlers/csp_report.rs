//! `POST /csp-report` (CONTRACT §6): browsers report Content-Security-Policy
//! violations here (the policy's `report-uri`).
//!
//! Two shapes are accepted, whatever the media type among
//! `application/csp-report`, `application/reports+json` and
//! `application/json` (anything else is 415):
//!
//! - the legacy `report-uri` form, `{"csp-report": {"document-uri", "violated-directive", …}}`;
//! - the Reporting API form, an array of `{"type": "csp-violation", "body": {"documentURL", …}}`
//!   (entries of other types are skipped; at least one violation is required).
//!
//! A report yields 204 and exactly ONE warn line with target `csp`, however
//! many violations a batch holds: a handful of fields, each cut to
//! [`MAX_FIELD`] characters and quoted with control, format and quote
//! characters escaped, so a report can neither flood nor forge log lines.
//! Malformed JSON or any other shape is 400. The body size limit is the HTTP
//! layer's.

use serde_json::{Map, Value};

use crate::app::{App, Ctx, Reply};
use crate::error::Error;
use crate::http::request::Request;
use crate::http::response::Response;

/// Longest logged field, in characters.
pub const MAX_FIELD: usize = 200;

/// Media types a report may come as.
const MEDIA_TYPES: [&[u8]; 3] = [b"application/csp-report", b"application/reports+json", b"application/json"];

/// The fields of one violation that reach the log (borrowed from the parsed body).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Violation<'a> {
    /// The page the violation happened on.
    pub document: Option<&'a str>,
    /// The directive that was violated (the effective one when known).
    pub directive: Option<&'a str>,
    /// What was blocked: a URL, `inline`, `eval`, …
    pub blocked: Option<&'a str>,
    /// The script that caused it.
    pub source_file: Option<&'a str>,
    /// Its line.
    pub line: Option<u64>,
    /// Its column.
    pub column: Option<u64>,
    /// The first characters of the offending inline code, when sent.
    pub sample: Option<&'a str>,
    /// `enforce` or `report`.
    pub disposition: Option<&'a str>,
}

/// `POST /csp-report`: log one line, answer 204.
pub fn report(_: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let line = accept(req)?;
    log::warn!(target: "csp", "{line}");
    Ok(Reply::full(Response::new(204)))
}

/// Check and parse a report request; the line to log, or 415/400.
pub fn accept(req: &Request<'_>) -> Result<String, Error> {
    check_media_type(req.header("content-type"))?;
    let value: Value = serde_json::from_slice(req.body).map_err(|_| Error::bad_request("malformed JSON"))?;
    let (v, count) = parse(&value)?;
    Ok(log_line(&v, count, req.request_id))
}

/// 415 unless `content_type` is one of the three report media types.
pub fn check_media_type(content_type: Option<&[u8]>) -> Result<(), Error> {
    let media = content_type.map(|v| v.split(|&c| c == b';').next().unwrap_or(b"").trim_ascii()).unwrap_or(b"");
    if MEDIA_TYPES.iter().any(|m| media.eq_ignore_ascii_case(m)) {
        Ok(())
    } else {
        Err(Error::UnsupportedMediaType(
            "Content-Type must be application/csp-report, application/reports+json or application/json",
        ))
    }
}

fn wrong_shape() -> Error {
    Error::bad_request("not a CSP report")
}

/// The first violation of a report and how many it holds, or 400.
pub fn parse(value: &Value) -> Result<(Violation<'_>, usize), Error> {
    match value {
        Value::Object(top) => {
            let body = top.get("csp-report").and_then(Value::as_object).ok_or_else(wrong_shape)?;
            Ok((legacy(body)?, 1))
        }
        Value::Array(list) => {
            let mut first = None;
            let mut count = 0;
            for entry in list {
                let entry = entry.as_object().ok_or_else(wrong_shape)?;
                if entry.get("type").and_then(Value::as_str).ok_or_else(wrong_shape)? != "csp-violation" {
                    continue;
                }
                let body = entry.get("body").and_then(Value::as_object).ok_or_else(wrong_shape)?;
                let v = reporting_api(body)?;
                count += 1;
                first.get_or_insert(v);
            }
            first.map(|v| (v, count)).ok_or_else(wrong_shape)
        }
        _ => Err(wrong_shape()),
    }
}

/// A string field: absent or null is `None`, another type is 400.
fn text<'a>(m: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong_shape()),
    }
}

/// A non-negative integer field: absent or null is `None`, another type is 400.
fn number(m: &Map<String, Value>, key: &str) -> Result<Option<u64>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        // `721.0` is a whole number too (JSON Schema's `integer`).
        Some(Value::Number(n)) => match crate::app::validate::integral(n) {
            Some(v) if v >= 0 => Ok(Some(v as u64)),
            _ => n.as_u64().map(Some).ok_or_else(wrong_shape),
        },
        Some(_) => Err(wrong_shape()),
    }
}

/// `{"csp-report": {…}}` as sent for `report-uri`.
fn legacy(m: &Map<String, Value>) -> Result<Violation<'_>, Error> {
    let v = Violation {
        document: text(m, "document-uri")?,
        directive: text(m, "effective-directive")?.or(text(m, "violated-directive")?),
        blocked: text(m, "blocked-uri")?,
        source_file: text(m, "source-file")?,
        line: number(m, "line-number")?,
        column: number(m, "column-number")?,
        sample: text(m, "script-sample")?,
        disposition: text(m, "disposition")?,
    };
    v.directive.map(|_| v).ok_or_else(wrong_shape)
}

/// The `body` of a Reporting API `csp-violation` report.
fn reporting_api(m: &Map<String, Value>) -> Result<Violation<'_>, Error> {
    let v = Violation {
        document: text(m, "documentURL")?,
        directive: text(m, "effectiveDirective")?,
        blocked: text(m, "blockedURL")?,
        source_file: text(m, "sourceFile")?,
        line: number(m, "lineNumber")?,
        column: number(m, "columnNumber")?,
        sample: text(m, "sample")?,
        disposition: text(m, "disposition")?,
    };
    v.directive.map(|_| v).ok_or_else(wrong_shape)
}

/// The log line for a report: `key="value"` pairs, absent values as `-`.
pub fn log_line(v: &Violation<'_>, count: usize, request_id: &str) -> String {
    let source = v.source_file.map(|f| match (v.line, v.column) {
        (Some(l), Some(c)) => format!("{f}:{l}:{c}"),
        (Some(l), None) => format!("{f}:{l}"),
        _ => f.to_string(),
    });
    let mut out = String::from("csp violation");
    for (key, value) in [
        ("document", v.document),
        ("directive", v.directive),
        ("blocked", v.blocked),
        ("source", source.as_deref()),
        ("sample", v.sample),
        ("disposition", v.disposition),
    ] {
        out.push(' ');
        out.push_str(key);
        out.push('=');
        match value {
            Some(s) => quote(s, &mut out),
            None => out.push('-'),
        }
    }
    // The request id is already restricted to [A-Za-z0-9._-].
    out.push_str(&format!(" reports={count} id={request_id}"));
    out
}

/// Append `s` cut to [`MAX_FIELD`] characters, in double quotes, with `"`,
/// `\`, control characters and invisible format characters (line/paragraph
/// separators, bidi overrides, zero-width characters) escaped.
pub fn quote(s: &str, out: &mut String) {
    out.push('"');
    let mut chars = s.chars();
    for c in chars.by_ref().take(MAX_FIELD) {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || invisible(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    if chars.next().is_some() {
        out.push('…');
    }
    out.push('"');
}

/// Format characters that could hide or reorder text in a terminal or viewer.
fn invisible(c: char) -> bool {
    matches!(c, '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(v: &Value) -> Result<(Violation<'_>, usize), u16> {
        parse(v).map_err(|e| e.status())
    }

    #[test]
    fn media_types() {
        for ok in [
            &b"application/csp-report"[..],
            b"application/reports+json",
            b"application/json",
            b"Application/JSON; charset=utf-8",
            b" application/csp-report ;x=y",
        ] {
            assert!(check_media_type(Some(ok)).is_ok(), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [&b"text/plain"[..], b"application/x-www-form-urlencoded", b"application/jsonx", b""] {
            assert_eq!(check_media_type(Some(bad)).map_err(|e| e.status()), Err(415));
        }
        assert_eq!(check_media_type(None).map_err(|e| e.status()), Err(415));
    }

    #[test]
    fn legacy_report() {
        let body = json!({"csp-report": {
            "document-uri": "https://app.example/page",
            "referrer": "",
            "violated-directive": "script-src-elem",
            "effective-directive": "script-src-elem",
            "original-policy": "default-src 'none'; report-uri /csp-report",
            "disposition": "enforce",
            "blocked-uri": "inline",
            "line-number": 12,
            "column-number": 3,
            "source-file": "https://app.example/page",
            "status-code": 200,
            "script-sample": "alert(1)"
        }});
        let (v, n) = parsed(&body).expect("ok");
        assert_eq!(n, 1);
        assert_eq!(v.document, Some("https://app.example/page"));
        assert_eq!(v.directive, Some("script-src-elem"));
        assert_eq!(v.blocked, Some("inline"));
        assert_eq!((v.line, v.column), (Some(12), Some(3)));
        let line = log_line(&v, n, "rid-1");
        assert_eq!(
            line,
            "csp violation document=\"https://app.example/page\" directive=\"script-src-elem\" blocked=\"inline\" \
             source=\"https://app.example/page:12:3\" sample=\"alert(1)\" disposition=\"enforce\" reports=1 id=rid-1"
        );
    }

    #[test]
    fn legacy_minimal_uses_violated_directive() {
        let body = json!({"csp-report": {"document-uri": "http://x/", "violated-directive": "img-src", "blocked-uri": "data"}});
        let (v, _) = parsed(&body).expect("ok");
        assert_eq!(v.directive, Some("img-src"));
        let line = log_line(&v, 1, "r");
        assert!(line.contains("source=- sample=- disposition=-"), "{line}");
    }

    /// Schemathesis: a whole number written `721.0` is a line number like `721`.
    #[test]
    fn whole_numbers_written_as_floats_are_numbers() {
        let body = json!([{"type": "csp-violation",
            "body": {"effectiveDirective": "img-src", "lineNumber": 721.0, "columnNumber": 3}}]);
        let (v, _) = parsed(&body).expect("ok");
        assert_eq!((v.line, v.column), (Some(721), Some(3)));
        // Schemathesis again: any whole number is an integer, however large.
        let body: Value = serde_json::from_str(
            r#"[{"type": "csp-violation", "body": {"effectiveDirective": "x", "columnNumber": 4638101243934267968323584}}]"#,
        )
        .expect("json");
        assert_eq!(parsed(&body).map(|(v, _)| v.column).ok(), Some(Some(i64::MAX as u64)));
        for bad in [json!(7.5), json!(-1), json!("7")] {
            let body = json!({"csp-report": {"violated-directive": "img-src", "line-number": bad}});
            assert!(parsed(&body).is_err(), "{body}");
        }
    }

    #[test]
    fn reporting_api_batch() {
        let body = json!([
            {"type": "deprecation", "age": 1, "url": "x", "body": {"id": "y"}},
            {"type": "csp-violation", "age": 10, "url": "https://app.example/", "user_agent": "UA",
             "body": {"documentURL": "https://app.example/", "effectiveDirective": "connect-src",
                      "blockedURL": "https://evil.example/", "originalPolicy": "…", "disposition": "enforce",
                      "sourceFile": "https://app.example/", "lineNumber": 4, "statusCode": 200, "sample": ""}},
            {"type": "csp-violation", "body": {"documentURL": "https://app.example/2", "effectiveDirective": "img-src"}}
        ]);
        let (v, n) = parsed(&body).expect("ok");
        assert_eq!(n, 2);
        assert_eq!(v.directive, Some("connect-src"));
        assert_eq!(v.blocked, Some("https://evil.example/"));
        let line = log_line(&v, n, "r");
        assert!(line.contains("source=\"https://app.example/:4\""), "{line}");
        assert!(line.ends_with(" reports=2 id=r"), "{line}");
    }

    #[test]
    fn wrong_shapes_are_400() {
        for bad in [
            json!(null),
            json!(1),
            json!("csp-report"),
            json!({}),
            json!({"csp-report": null}),
            json!({"csp-report": "x"}),
            json!({"csp-report": []}),
            json!({"csp-report": {}}),
            json!({"csp-report": {"document-uri": "http://x/"}}),
            json!({"csp-report": {"violated-directive": 5}}),
            json!({"csp-report": {"violated-directive": "img-src", "blocked-uri": {"a": 1}}}),
            json!({"csp-report": {"violated-directive": "img-src", "line-number": "12"}}),
            json!({"csp-report": {"violated-directive": "img-src", "line-number": -1}}),
            json!({"csp-report": {"violated-directive": "img-src", "line-number": 1.5}}),
            json!({"cspReport": {"violated-directive": "img-src"}}),
            json!([]),
            json!([1]),
            json!([{"type": "deprecation", "body": {}}]),
            json!([{"body": {"effectiveDirective": "img-src"}}]),
            json!([{"type": "csp-violation"}]),
            json!([{"type": "csp-violation", "body": {}}]),
            json!([{"type": "csp-violation", "body": {"effectiveDirective": "img-src"}}, "x"]),
        ] {
            assert_eq!(parsed(&bad).map(|_| ()), Err(400), "{bad}");
        }
    }

    #[test]
    fn fields_cannot_forge_lines() {
        let evil = "x\"\n2024-01-01 WARN  csp: csp violation document=\"forged\"\r\t\u{1b}[31m\u{2028}\u{202e}\\";
        let body = json!({"csp-report": {"violated-directive": evil, "document-uri": evil}});
        let (v, n) = parsed(&body).expect("ok");
        let line = log_line(&v, n, "r");
        assert!(!line.chars().any(|c| c.is_control() || invisible(c)), "{line:?}");
        assert!(line.contains(r#"directive="x\"\n2024-01-01 WARN  csp: csp violation document=\"forged\"\r\t\u{001b}[31m\u{2028}\u{202e}\\""#), "{line}");
        // Every unescaped quote is a field delimiter: 2 per present field, none from the values.
        let unescaped = line.replace("\\\\", "").replace("\\\"", "").matches('"').count();
        assert_eq!(unescaped, 4, "{line}");
    }

    #[test]
    fn fields_are_truncated() {
        let long = "é".repeat(1000);
        let mut out = String::new();
        quote(&long, &mut out);
        assert_eq!(out.chars().count(), MAX_FIELD + 3);
        assert!(out.ends_with("…\""));
        let mut out = String::new();
        quote(&"a".repeat(MAX_FIELD), &mut out);
        assert_eq!(out, format!("\"{}\"", "a".repeat(MAX_FIELD)));
        let controls = "\u{1}".repeat(1000);
        let mut out = String::new();
        quote(&controls, &mut out);
        assert_eq!(out.matches("\\u{0001}").count(), MAX_FIELD);
    }

    fn request<'a>(headers: &'a [httparse::Header<'a>], body: &'a [u8]) -> Request<'a> {
        Request {
            method: crate::http::request::Method::Post,
            path: "/csp-report",
            query: "",
            http10: false,
            headers: crate::http::fields::Fields::new(headers),
            body,
            request_id: "t-1",
            peer: std::net::IpAddr::from([127, 0, 0, 1]),
            secure: false,
        }
    }

    fn accept_with(content_type: Option<&str>, body: &str) -> Result<String, u16> {
        let headers: Vec<httparse::Header<'_>> =
            content_type.iter().map(|ct| httparse::Header { name: "Content-Type", value: ct.as_bytes() }).collect();
        accept(&request(&headers, body.as_bytes())).map_err(|e| e.status())
    }

    #[test]
    fn request_checks() {
        let legacy = r#"{"csp-report":{"document-uri":"http://127.0.0.1:8080/","violated-directive":"img-src","blocked-uri":"http://evil.example/x.png","original-policy":"default-src 'none'"}}"#;
        let line = accept_with(Some("application/csp-report"), legacy).expect("ok");
        assert!(line.starts_with("csp violation document=\"http://127.0.0.1:8080/\" directive=\"img-src\""), "{line}");
        assert!(line.ends_with(" reports=1 id=t-1"), "{line}");
        let batch = r#"[{"type":"csp-violation","body":{"documentURL":"http://x/","effectiveDirective":"img-src"}}]"#;
        assert!(accept_with(Some("application/reports+json"), batch).is_ok());
        assert!(accept_with(Some("application/json"), legacy).is_ok());
        assert!(accept_with(Some("application/json"), batch).is_ok());
        assert_eq!(accept_with(Some("text/plain"), legacy), Err(415));
        assert_eq!(accept_with(None, legacy), Err(415));
        assert_eq!(accept_with(Some("application/csp-report"), "text/plain"), Err(400));
        assert_eq!(accept_with(Some("application/csp-report"), "{\"csp-report\":"), Err(400));
        assert_eq!(accept_with(Some("application/csp-report"), ""), Err(400));
        assert_eq!(accept_with(Some("application/csp-report"), "{\"a\":1}"), Err(400));
        assert_eq!(accept_with(Some("text/plain"), "garbage"), Err(415));
    }
}
