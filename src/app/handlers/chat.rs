//! `POST /api/chat` (CONTRACT §6): validate the conversation, then stream
//! the answer as server-sent events, `data: {"content": …}` per chunk and
//! `data: [DONE]` at the end.
//!
//! Two producers: the built-in echo (the last user message, word by word,
//! `chat.echo_delay_ms` apart, a [`Ticker`]) and the relay of an
//! OpenAI-compatible streaming upstream (`chat.upstream`, a [`RelaySink`]
//! that turns each upstream `choices[0].delta.content` into one event as it
//! arrives). The worker moves the bytes, with back pressure; this file only
//! decides what they are. An upstream that ends its body cleanly without
//! `data: [DONE]` ended normally: the client still gets `data: [DONE]`. Only
//! a broken, refused or silent upstream ends the stream with `event: error`.

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::app::router::Router;
use crate::app::validate;
use crate::app::{App, Ctx, Handler, Producer, Relay, RelaySink, Reply, Ticker};
use crate::error::{Error, FieldError};
use crate::http::request::{Method, Request};
use crate::http::response::Response;
use crate::http::sse;
use crate::upstream::wire::Outbound;

/// Messages accepted in one conversation.
const MAX_MESSAGES: usize = 100;
/// Longest upstream event line buffered before the stream is refused.
const MAX_LINE: usize = 1 << 20;
const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// Register the route.
pub fn routes(r: &mut Router<Handler>) {
    r.add(Method::Post, "/api/chat", chat).add(Method::Post, "/api/v1/chat", chat);
}

/// One validated message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) role: &'static str,
    pub(crate) content: String,
}

fn chat(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    let messages = messages(validate::json_object(req)?)?;
    let config = &app.svc.config.chat;
    let Some(endpoint) = app.svc.endpoints.chat.clone() else {
        let last = messages.iter().rev().find(|m| m.role == "user").or(messages.last());
        let words = last.map(|m| m.content.split_whitespace().map(str::to_string).collect()).unwrap_or_default();
        let echo = Echo { words, next: 0, delay: config.echo_delay };
        return Ok(Reply::stream(head(), Producer::Ticker(Box::new(echo))));
    };
    let wire: Vec<Value> = messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
    let body = json!({"model": config.model, "messages": wire, "stream": true});
    let request = Outbound {
        endpoint,
        method: "POST",
        path: String::new(),
        headers: vec![
            ("Content-Type", "application/json".into()),
            ("Accept", "text/event-stream".into()),
            ("x-request-id", req.request_id.into()),
        ],
        body: serde_json::to_vec(&body).map_err(|e| Error::Internal(e.to_string()))?,
        max_body: u64::MAX,
        timeout: app.svc.config.upstreams.timeout,
        total_deadline: false,
        coalesce: false,
    };
    let mut sink: Box<dyn RelaySink> = Box::new(Upstream::default());
    if app.svc.config.debug.routes {
        sink = crate::app::debug::relay_sink(sink, messages.iter().map(|m| m.content.as_str()));
    }
    Ok(Reply::relay(Relay { request, sink }))
}

/// `{messages: [{role, content}]}`, every problem reported at once (422).
pub(crate) fn messages(mut body: Map<String, Value>) -> Result<Vec<Message>, Error> {
    let mut errors: Vec<FieldError> = body
        .keys()
        .filter(|k| k.as_str() != "messages")
        .map(|k| FieldError::new(k.as_str(), "unknown field"))
        .collect();
    let list = match body.remove("messages") {
        Some(Value::Array(a)) if (1..=MAX_MESSAGES).contains(&a.len()) => a,
        Some(Value::Array(_)) => {
            errors.push(FieldError::new("messages", format!("must hold 1 to {MAX_MESSAGES} messages")));
            Vec::new()
        }
        None => {
            errors.push(FieldError::new("messages", "is required"));
            Vec::new()
        }
        Some(_) => {
            errors.push(FieldError::new("messages", "must be an array"));
            Vec::new()
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let Value::Object(mut m) = m else {
            errors.push(FieldError::new(format!("messages[{i}]"), "must be an object"));
            continue;
        };
        let role = match m.remove("role") {
            Some(Value::String(r)) => ROLES.into_iter().find(|x| *x == r),
            _ => None,
        };
        if role.is_none() {
            errors.push(FieldError::new(format!("messages[{i}].role"), "must be system, user or assistant"));
        }
        let content = match m.remove("content") {
            Some(Value::String(c)) => Some(c),
            _ => {
                errors.push(FieldError::new(format!("messages[{i}].content"), "must be a string"));
                None
            }
        };
        for k in m.keys() {
            errors.push(FieldError::new(format!("messages[{i}].{k}"), "unknown field"));
        }
        if let (Some(role), Some(content)) = (role, content) {
            out.push(Message { role, content });
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(Error::Validation(errors))
    }
}

/// The client's response head: an event stream.
fn head() -> Response {
    let mut r = Response::new(200);
    r.content_type = "text/event-stream";
    r.cache_control = "no-cache";
    r.header("X-Accel-Buffering", "no");
    r
}

fn content_event(out: &mut Vec<u8>, content: &str) {
    let data = serde_json::to_string(&json!({"content": content})).unwrap_or_default();
    sse::event(out, None, None, &data);
}

fn done_event(out: &mut Vec<u8>) {
    sse::event(out, None, None, "[DONE]");
}

/// The built-in echo: one word per tick.
struct Echo {
    words: Vec<String>,
    next: usize,
    delay: Duration,
}

impl Ticker for Echo {
    fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration> {
        if let Some(word) = self.words.get(self.next) {
            if self.next == 0 {
                content_event(out, word);
            } else {
                content_event(out, &format!(" {word}"));
            }
            self.next += 1;
            if self.next < self.words.len() {
                return Some(self.delay);
            }
        }
        done_event(out);
        None
    }
}

/// The relay of an OpenAI-compatible stream: `data: {"choices":[{"delta":{"content":…}}]}`
/// lines in, one client event per non-empty delta out.
#[derive(Default)]
struct Upstream {
    line: Vec<u8>,
}

impl Upstream {
    /// One complete upstream line. `Ok(true)` at `[DONE]`.
    fn line(line: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { return Ok(false) }; // event:, id:, comments
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            done_event(out);
            return Ok(true);
        }
        let bad = |why: &str| Error::UpstreamUnavailable(format!("chat upstream: {why}").into());
        let v: Value = serde_json::from_slice(data).map_err(|_| bad("invalid JSON event"))?;
        if let Some(e) = v.get("error") {
            let msg = e.get("message").and_then(Value::as_str).unwrap_or("error event");
            return Err(bad(msg));
        }
        if let Some(content) = v.pointer("/choices/0/delta/content").and_then(Value::as_str) {
            if !content.is_empty() {
                content_event(out, content);
            }
        }
        Ok(false)
    }
}

impl RelaySink for Upstream {
    fn head(&mut self, status: u16, content_type: Option<&str>) -> Result<(), Error> {
        if !(200..300).contains(&status) {
            return Err(Error::UpstreamUnavailable(format!("chat upstream answered {status}").into()));
        }
        let media = content_type.and_then(|c| c.split(';').next()).map(str::trim).unwrap_or("");
        if !media.eq_ignore_ascii_case("text/event-stream") {
            return Err(Error::UpstreamUnavailable("chat upstream did not answer an event stream".into()));
        }
        Ok(())
    }

    fn body(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let done = if self.line.is_empty() {
                Upstream::line(&bytes[..nl], out)?
            } else {
                self.line.extend_from_slice(&bytes[..nl]);
                let line = std::mem::take(&mut self.line);
                Upstream::line(&line, out)?
            };
            if done {
                return Ok(true);
            }
            bytes = &bytes[nl + 1..];
        }
        if self.line.len() + bytes.len() > MAX_LINE {
            return Err(Error::UpstreamUnavailable("chat upstream: event line too long".into()));
        }
        self.line.extend_from_slice(bytes);
        Ok(false)
    }

    fn ended(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        // A last line without its newline is an incomplete event: dropped, as
        // an event-stream parser drops one at the end of the stream.
        self.line.clear();
        done_event(out);
        Ok(())
    }

    fn response(&mut self) -> Response {
        head()
    }

    fn failed(&mut self, error: &Error, out: &mut Vec<u8>) {
        let message = match error {
            Error::UpstreamTimeout => "upstream timed out",
            _ => "upstream failed",
        };
        let data = serde_json::to_string(&json!({"message": message, "code": error.code()})).unwrap_or_default();
        sse::event(out, None, Some("error"), &data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Vec<Message>, Vec<String>> {
        let Value::Object(m) = v else { panic!("object") };
        messages(m).map_err(|e| match e {
            Error::Validation(list) => list.into_iter().map(|f| f.field).collect(),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn validation_names_every_bad_field() {
        assert_eq!(parse(json!({})), Err(vec!["messages".to_string()]));
        assert_eq!(parse(json!({"messages": []})), Err(vec!["messages".to_string()]));
        assert_eq!(parse(json!({"messages": "hi"})), Err(vec!["messages".to_string()]));
        assert_eq!(
            parse(json!({"messages": [{"role": "bot", "content": 1}, {"role": "user"}]})),
            Err(vec!["messages[0].role".into(), "messages[0].content".into(), "messages[1].content".into()])
        );
        let many: Vec<Value> = (0..101).map(|_| json!({"role": "user", "content": "x"})).collect();
        assert_eq!(parse(json!({ "messages": many })), Err(vec!["messages".to_string()]));
        assert_eq!(
            parse(json!({"messages": [{"role": "user", "content": "hi"}]})),
            Ok(vec![Message { role: "user", content: "hi".into() }])
        );
    }

    #[test]
    fn echo_sends_words_then_done() {
        let mut e = Echo { words: vec!["a".into(), "b".into()], next: 0, delay: Duration::from_millis(5) };
        let mut out = Vec::new();
        assert_eq!(e.tick(&mut out), Some(Duration::from_millis(5)));
        assert_eq!(e.tick(&mut out), None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data: {\"content\":\"a\"}\n\ndata: {\"content\":\" b\"}\n\ndata: [DONE]\n\n"
        );
        let mut empty = Echo { words: vec![], next: 0, delay: Duration::ZERO };
        let mut out = Vec::new();
        assert_eq!(empty.tick(&mut out), None);
        assert_eq!(out, b"data: [DONE]\n\n");
    }

    #[test]
    fn relay_forwards_deltas_across_split_lines() {
        let mut u = Upstream::default();
        let mut out = Vec::new();
        let stream = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n\
                      : comment\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n\
                      data: [DONE]\n\n";
        let bytes = stream.as_bytes();
        let mut done = false;
        for piece in bytes.chunks(7) {
            assert!(!done, "bytes after DONE");
            done = u.body(piece, &mut out).unwrap();
        }
        assert!(done);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data: {\"content\":\"Hel\"}\n\ndata: {\"content\":\"lo\"}\n\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn relay_ending_without_done_is_a_normal_end() {
        let mut u = Upstream::default();
        let mut out = Vec::new();
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choi";
        assert!(!u.body(stream.as_bytes(), &mut out).unwrap());
        u.ended(&mut out).expect("a clean end is not an error");
        assert_eq!(String::from_utf8(out).unwrap(), "data: {\"content\":\"Hi\"}\n\ndata: [DONE]\n\n");
    }

    #[test]
    fn relay_refuses_bad_upstreams() {
        let mut u = Upstream::default();
        assert!(u.head(500, Some("text/event-stream")).is_err());
        assert!(u.head(200, Some("application/json")).is_err());
        assert!(u.head(200, Some("text/event-stream; charset=utf-8")).is_ok());
        assert!(u.body(b"data: {not json\n", &mut Vec::new()).is_err());
        assert!(u.body(b"data: {\"error\":{\"message\":\"quota\"}}\n", &mut Vec::new()).is_err());
        let mut u = Upstream::default();
        assert!(u.body(&vec![b'x'; MAX_LINE + 1], &mut Vec::new()).is_err());
    }
}
