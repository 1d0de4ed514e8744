//! What a service answers a request with: one [`Reply`], a head and a body
//! whose kind says how the body comes to be.
//!
//! This module is protocol-neutral: it owns the shape of an answer, not its
//! wire form. The codec (HTTP/1.1 today: `super::conn::Http1`) turns the head
//! and the body's kind into framing (a length, chunks, a `101`; the head only
//! for `HEAD`) and hands the kinds that need the event loop to the worker,
//! which matches on them once. It must not know about sockets, polls or
//! routes.

use std::sync::Arc;
use std::time::Duration;

use super::response::Response;
use crate::error::Error;
use crate::proto::HandshakeError;
use crate::upstream::wire::{ClientError, Outbound};

/// Work for the pool: runs off the event loop and produces the response.
pub type Job = Box<dyn FnOnce() -> Result<Response, Error> + Send>;

/// What [`Call::finish`] gets per request: the upstream's status and body, or why it failed.
pub type Fetched = Result<(u16, Vec<u8>), ClientError>;

/// A service's answer to one request: the head and what the body is.
///
/// For the kinds whose head is not known yet ([`Body::Job`],
/// [`Body::Upstream`]) and for [`Body::WebSocket`] (the codec checks the
/// handshake and writes the protocol switch itself), `head` is not sent: build
/// those with [`Reply::later`], [`Reply::call`], [`Reply::relay`] and
/// [`Reply::websocket`]. A WebSocket's `head` carries the fields a refusal of
/// its handshake gets ([`refusal`]).
pub struct Reply {
    /// The response head (for [`Body::Full`], with its body).
    pub head: Response,
    /// What follows the head.
    pub body: Body,
}

/// What the body of a [`Reply`] is, each kind with what it needs.
pub enum Body {
    /// The whole body is in the head's `Response::body`.
    Full,
    /// Run this on the worker's pool; its result is the whole response.
    Job(Job),
    /// A body of events produced over time (chunked in HTTP/1.1).
    Producer(Producer),
    /// A byte range of a file, with a known length (downloads).
    File(FileRange),
    /// Upstream requests; the response comes from their results.
    Upstream(Upstream),
    /// Switch to WebSocket, once the codec found the handshake good.
    WebSocket(WebSocket),
}

/// Who produces the events of a [`Body::Producer`].
pub enum Producer {
    /// An `/api/events` stream: bus notifications and the changes `audience` may see,
    /// replayed after `last_event_id` first.
    Events {
        /// The client's `Last-Event-ID`.
        last_event_id: Option<i64>,
        /// Who the stream is for and which resources it asked for.
        audience: crate::resources::audience::Audience,
    },
    /// Events that come from a timer.
    Ticker(Box<dyn Ticker>),
}

/// The part of a file a [`Body::File`] sends.
pub struct FileRange {
    /// The open file (shared with pool reads).
    pub file: Arc<std::fs::File>,
    /// First byte to send.
    pub offset: u64,
    /// Bytes to send (the body's length).
    pub len: u64,
}

/// How a [`Body::Upstream`] waits on upstreams.
pub enum Upstream {
    /// Requests in parallel; one response built from all results.
    Call(Call),
    /// One upstream stream relayed as it arrives.
    Relay(Relay),
}

/// A WebSocket the handler lets in (it authenticated the client); the
/// handshake is the codec's to check: the HTTP/1.1 upgrade answered `101`, the
/// HTTP/2 extended CONNECT answered `200` (`crate::proto::handshake`).
pub struct WebSocket {
    /// The authenticated user; `None` on the echo endpoint.
    pub user_id: Option<i64>,
    /// That user's display name, from the access token (chat messages carry it).
    pub name: Option<String>,
}

/// Upstream requests made in parallel on the worker's loop, and what to make of their results.
pub struct Call {
    /// The requests, all started at once.
    pub requests: Vec<Outbound>,
    /// Builds the response from the results (in request order). Runs on the
    /// event loop: it must be cheap and must not block; work that is not (compressing the
    /// body) goes to the pool as [`Assembled::Later`].
    pub finish: Box<dyn FnOnce(Vec<Fetched>) -> Result<Assembled, Error>>,
}

/// What [`Call::finish`] makes of the results.
pub enum Assembled {
    /// The response, ready to send.
    Now(Response),
    /// A job for the pool that finishes the response (compresses its body); its result is
    /// sent as a [`Body::Job`]'s is.
    Later(Job),
}

/// A streamed upstream response relayed to the client (`/api/chat`).
pub struct Relay {
    /// The upstream request.
    pub request: Outbound,
    /// Turns upstream bytes into the client's stream.
    pub sink: Box<dyn RelaySink>,
}

/// The app's half of a relay: the worker feeds it what the upstream sends
/// and hands what it produces to the codec as body bytes, pausing the
/// upstream while the client is slow.
pub trait RelaySink {
    /// The upstream's status and content type arrived. An error here is the
    /// client's response (nothing has been sent to it yet).
    fn head(&mut self, status: u16, content_type: Option<&str>) -> Result<(), Error>;
    /// Upstream body bytes: append complete events for the client to `out`.
    /// `Ok(true)` once the stream is complete (its last event is in `out`).
    fn body(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, Error>;
    /// The upstream ended its body cleanly (its length reached, its last
    /// chunk, or the close that delimits it) before [`RelaySink::body`] said
    /// the stream was complete. `Ok`: a normal end, with the closing events
    /// appended to `out`; `Err`: a failure. By default a failure.
    fn ended(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let _ = out;
        Err(Error::UpstreamUnavailable("the upstream ended the stream early".into()))
    }
    /// The client's response head, sent before the first event.
    fn response(&mut self) -> Response;
    /// The upstream failed or ended early after events were sent: append the
    /// closing event.
    fn failed(&mut self, error: &Error, out: &mut Vec<u8>);
    /// The client's response when the relay failed before its first event.
    fn error(&mut self, e: Error) -> Response {
        if let Error::Internal(detail) = &e {
            log::error!("internal error: {detail}");
        }
        e.into_response(false)
    }
}

/// A stream produced on a timer (the built-in chat echo).
pub trait Ticker {
    /// Append the next event to `out`; the delay until the next one, or
    /// `None` when the stream is complete.
    fn tick(&mut self, out: &mut Vec<u8>) -> Option<Duration>;
}

impl Reply {
    /// The whole response, now.
    pub fn full(head: Response) -> Reply {
        Reply { head, body: Body::Full }
    }

    /// The response comes from `job`, run on the pool.
    pub fn later(job: Job) -> Reply {
        Reply { head: Response::new(200), body: Body::Job(job) }
    }

    /// `head`, then a body of events from `producer`.
    pub fn stream(head: Response, producer: Producer) -> Reply {
        Reply { head, body: Body::Producer(producer) }
    }

    /// `head`, then `len` bytes of `file` from `offset`.
    pub fn file(head: Response, file: Arc<std::fs::File>, offset: u64, len: u64) -> Reply {
        Reply { head, body: Body::File(FileRange { file, offset, len }) }
    }

    /// The response comes from the results of upstream requests.
    pub fn call(call: Call) -> Reply {
        Reply { head: Response::new(200), body: Body::Upstream(Upstream::Call(call)) }
    }

    /// The response is an upstream stream, relayed.
    pub fn relay(relay: Relay) -> Reply {
        Reply { head: Response::new(200), body: Body::Upstream(Upstream::Relay(relay)) }
    }

    /// Switch to WebSocket (the codec checks the handshake and writes the protocol switch).
    pub fn websocket(ws: WebSocket) -> Reply {
        Reply { head: Response::new(101), body: Body::WebSocket(ws) }
    }
}

/// The answer to a [`Body::WebSocket`] whose handshake its codec refused for
/// `e`: the error's response, with the fields of the reply's `head` after its
/// own (what the service decorates every answer to the request with).
pub fn refusal(head: Response, e: HandshakeError, development: bool) -> Response {
    let mut r = Error::from(e).into_response(development);
    for (name, value) in head.headers {
        r.header(name, value);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_the_errors_response_then_the_replys_fields() {
        let mut head = Response::new(101);
        head.header("Vary", "Origin").header("Alt-Svc", "h3=\":443\"");
        let r = refusal(head, HandshakeError::Version, false);
        assert_eq!(r.status, 426);
        let names: Vec<_> = r.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(names, [("Sec-WebSocket-Version", "13"), ("Vary", "Origin"), ("Alt-Svc", "h3=\":443\"")]);
        let r = refusal(Response::new(101), HandshakeError::Key, false);
        assert_eq!((r.status, r.headers.len()), (400, 0));
        let body = String::from_utf8_lossy(r.body.as_bytes()).into_owned();
        assert!(body.contains("\"invalid Sec-WebSocket-Key\""), "{body}");
    }
}
