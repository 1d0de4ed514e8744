//! The HTTP/1.1 side of one connection: bytes in, bytes out, no socket.
//!
//! [`Http1::advance`] consumes the connection's read buffer, parses heads
//! and bodies, hands complete requests to a [`Service`] and writes responses
//! into the output buffer, in order. A request answered later (a pool job)
//! parks the connection in `Waiting` until [`Http1::complete`]; pipelined
//! requests behind it stay in the read buffer, so responses keep their order
//! (nginx does the same: one request at a time per connection). Above the
//! output high-watermark it stops producing ([`Progress::Paused`]): the
//! caller stops reading the socket until the peer drains what is queued.
//!
//! It owns every piece of HTTP/1.1 framing of what it sends: `Content-Length`
//! or chunked, the WebSocket handshake and its `101` (or its refusal: 400, or
//! 426 for the version), `Connection`, and `HEAD` (the head
//! only, for every kind of [`Reply`]). A body produced after its head (a
//! stream, a download, a relay) is handed to it as bytes ([`Http1::data`],
//! [`Http1::end_body`]); nothing outside this codec writes chunk framing.
//! It must not touch a socket, a poll or a route.
//!
//! States: `Idle` (between requests, keep-alive timer) → `Head` (some bytes,
//! header timer) → `Body` (framing known, body timer) → `Waiting` (pending
//! handler) → back to `Idle`, or `Closing` once a response ends the
//! connection, or `Detached` while a body that follows its head is produced.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::error::Error;

use crate::http::headers::valid_request_id;
use crate::http::reply::{refusal, Body, Reply};
use crate::http::request::{Method, Request};
use crate::http::response::{Delimit, RequestMeta, Response};
use crate::http::service::{Env, Finished, Protocol, Service, HIGH_WATERMARK};
use crate::logging;
use crate::proto::handshake;

use super::body::Chunked;
use super::parse::{self, Framing, Head};
use super::writer::{write_response, BodyWriter};

/// The `101` head switching to `protocol`, whose handshake `accept` answers.
fn switch_head(protocol: &'static str, accept: String) -> Response {
    let mut r = Response::new(101);
    r.header("Upgrade", protocol).header("Sec-WebSocket-Accept", accept);
    r
}

/// While draining, a keep-alive connection left idle this long (counted from
/// the start of the drain) is closed: a client that keeps sending has sent its
/// next request well within it, and gets it answered with `Connection: close`.
pub const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// Where the connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Between requests; nothing buffered.
    Idle,
    /// Part of a head has arrived.
    Head,
    /// The head is complete; the body is arriving.
    Body,
    /// A handler is working on the request.
    Waiting,
    /// A response ends the connection; nothing more is read.
    Closing,
    /// A stream or another protocol owns the connection now.
    Detached,
}

/// Why the connection's timer fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// Idle keep-alive: close silently.
    Idle,
    /// Head or body too slow: 408 and close.
    Request,
}

/// What the caller should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Read more input.
    NeedInput,
    /// Stop reading until output drains below the watermark.
    Paused,
    /// A handler is pending; keep the socket but do not parse.
    Waiting,
    /// Flush the output, then close.
    Close,
    /// The connection left HTTP/1.1 request processing (stream or upgrade).
    Detached,
}

struct Current {
    method: Method,
    http10: bool,
    keep_alive: bool,
    rid: [u8; 128],
    rid_len: usize,
    /// What the access line quotes from the head, kept past it: the target, then the
    /// `User-Agent` and `Referer` values (each cut at [`logging::FIELD_MAX`] bytes), in one
    /// buffer reused by every request of the connection.
    quoted: Vec<u8>,
    target_len: usize,
    /// The lengths of the `User-Agent` and `Referer` values after the target, when present.
    agent_len: Option<usize>,
    referer_len: Option<usize>,
    started: Instant,
    label: u16,
    client: Option<std::net::IpAddr>,
}

impl Current {
    /// Keep `target`, `agent` and `referer` for the access line.
    fn quote(&mut self, target: &[u8], agent: Option<&[u8]>, referer: Option<&[u8]>) {
        let (agent, referer) = (agent.map(logging::capped), referer.map(logging::capped));
        let q = &mut self.quoted;
        q.clear();
        q.reserve(target.len() + agent.map_or(0, <[u8]>::len) + referer.map_or(0, <[u8]>::len));
        q.extend_from_slice(target);
        q.extend_from_slice(agent.unwrap_or_default());
        q.extend_from_slice(referer.unwrap_or_default());
        (self.target_len, self.agent_len, self.referer_len) =
            (target.len(), agent.map(<[u8]>::len), referer.map(<[u8]>::len));
    }

    /// Keep nothing: the access line is off.
    fn unquote(&mut self) {
        self.quoted.clear();
        (self.target_len, self.agent_len, self.referer_len) = (0, None, None);
    }

    /// The target, `User-Agent` and `Referer` [`Current::quote`] kept.
    fn quoted(&self) -> (&[u8], Option<&[u8]>, Option<&[u8]>) {
        let (target, rest) = self.quoted.split_at(self.target_len.min(self.quoted.len()));
        let (agent, referer) = rest.split_at(self.agent_len.unwrap_or(0).min(rest.len()));
        (target, self.agent_len.map(|_| agent), self.referer_len.map(|_| referer))
    }
}

/// HTTP/1.1 state of one connection.
///
/// Owns all HTTP/1.1 framing: `Content-Length` or chunked, the `101` of an
/// upgrade, `Connection`, and `HEAD` (the head only, whatever the reply). A
/// response whose body follows later leaves the connection `Detached`; the
/// caller hands the body bytes to [`Http1::data`] and ends it with
/// [`Http1::end_body`], and the codec frames them ([`BodyWriter`]).
pub struct Http1 {
    phase: Phase,
    /// How the body of the response in progress is framed.
    writer: BodyWriter,
    /// The body of the reply in progress, for the caller to run
    /// ([`Http1::take_body`]): a job or upstreams while `Waiting`, a producer,
    /// file or WebSocket once `Detached`.
    handoff: Option<Body>,
    chunked: Chunked,
    body: Vec<u8>,
    continue_sent: bool,
    /// Bytes of a chunked body decoded into `body` and still in the read
    /// buffer (after its head).
    chunk_used: usize,
    head_known: bool,
    cur: Current,
    deadline: Option<(Instant, Timeout)>,
    peer: IpAddr,
    /// The connection is TLS (copied into each [`Request`]).
    secure: bool,
    /// Its TLS version once the handshake agreed on one ([`Http1::set_tls`]), for the access log.
    tls: Option<&'static str>,
    /// No request has started on this connection yet.
    fresh: bool,
    /// The `Host` value of an earlier request, checked valid then (`host[..host_len]`):
    /// the same bytes again are not checked again ([`parse::parse_seen`]).
    host: [u8; parse::HOST_MEMO],
    host_len: usize,
}

impl Http1 {
    /// A fresh connection from `peer` (over TLS when `secure`): it must send a head within the
    /// header timeout (for TLS, the handshake counts against it).
    pub fn new(peer: IpAddr, secure: bool, env: &Env, now: Instant) -> Http1 {
        Http1 {
            phase: Phase::Idle,
            writer: BodyWriter::None,
            handoff: None,
            chunked: Chunked::default(),
            body: Vec::new(),
            continue_sent: false,
            chunk_used: 0,
            head_known: false,
            cur: Current {
                method: Method::Other,
                http10: false,
                keep_alive: true,
                rid: [0; 128],
                rid_len: 0,
                quoted: Vec::new(),
                target_len: 0,
                agent_len: None,
                referer_len: None,
                started: now,
                label: 0,
                client: None,
            },
            deadline: Some((now + env.header_timeout, Timeout::Idle)),
            peer,
            secure,
            tls: None,
            fresh: true,
            host: [0; parse::HOST_MEMO],
            host_len: 0,
        }
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// When the connection's timer fires, and why.
    pub fn deadline(&self) -> Option<(Instant, Timeout)> {
        self.deadline
    }

    /// Consume input, produce output; call after new bytes arrived, after
    /// output drained, and after [`Http1::complete`].
    ///
    /// Pipelined requests are parsed in place, one after the other, at a
    /// cursor; the bytes they took leave `inbuf` once, when it returns (all
    /// of them: a clear, no copy), so what is left starts at `inbuf[0]`.
    pub fn advance(
        &mut self,
        inbuf: &mut Vec<u8>,
        out: &mut Vec<u8>,
        svc: &mut dyn Service,
        env: &mut Env,
        now: Instant,
    ) -> Progress {
        let mut pos = 0;
        let progress = self.run(inbuf, &mut pos, out, svc, env, now);
        if pos >= inbuf.len() {
            inbuf.clear();
        } else if pos > 0 {
            inbuf.drain(..pos);
        }
        progress
    }

    /// [`Http1::advance`] from `*pos`, which it moves past each request it dispatches.
    fn run(
        &mut self,
        inbuf: &mut Vec<u8>,
        pos: &mut usize,
        out: &mut Vec<u8>,
        svc: &mut dyn Service,
        env: &mut Env,
        now: Instant,
    ) -> Progress {
        loop {
            match self.phase {
                Phase::Waiting => return Progress::Waiting,
                Phase::Closing => return Progress::Close,
                Phase::Detached => return Progress::Detached,
                _ => {}
            }
            if out.len() > HIGH_WATERMARK {
                return Progress::Paused;
            }
            if *pos >= inbuf.len() && self.phase == Phase::Idle {
                // Also while draining: an idle keep-alive connection is never
                // closed here, as its next request may be on the way; see
                // [`Http1::drain`].
                return Progress::NeedInput;
            }
            match self.step(inbuf, *pos, out, svc, env, now) {
                Ok(Some(used)) => *pos += used,
                Ok(None) => return Progress::NeedInput,
                Err(e) => {
                    self.fail(e, out, svc, env, now);
                    return Progress::Close;
                }
            }
        }
    }

    /// Deliver the response of a pending request; then call [`Http1::advance`].
    pub fn complete(&mut self, resp: Response, out: &mut Vec<u8>, svc: &mut dyn Service, env: &mut Env, now: Instant) {
        if self.phase == Phase::Waiting {
            self.respond(resp, Delimit::Length, out, svc, env, now);
        }
    }

    /// The body of the reply just given, when the caller has to run it: a
    /// [`Body::Job`] or [`Body::Upstream`] the connection waits on (then
    /// [`Http1::complete`] or [`Http1::complete_stream`]), or a body that
    /// follows the head written ([`Body::Producer`], [`Body::File`],
    /// [`Body::WebSocket`] once its handshake was good; never for `HEAD`,
    /// which got the head only).
    pub fn take_body(&mut self) -> Option<Body> {
        self.handoff.take()
    }

    /// Deliver a pending request's answer as a stream head. Returns whether
    /// its body follows: then the connection is detached, the caller hands
    /// the body to [`Http1::data`] and ends it with [`Http1::end_body`]. For
    /// `HEAD` only the head goes out (`false`): the connection carries on.
    pub fn complete_stream(
        &mut self,
        resp: Response,
        out: &mut Vec<u8>,
        svc: &mut dyn Service,
        env: &mut Env,
        now: Instant,
    ) -> bool {
        if self.phase == Phase::Waiting {
            self.respond(resp, Delimit::Chunked, out, svc, env, now);
        }
        self.phase == Phase::Detached
    }

    /// Body bytes of the detached response in progress: framed into `out` as
    /// its head announced (nothing for `HEAD` or after the end).
    pub fn data(&mut self, out: &mut Vec<u8>, bytes: &[u8]) {
        self.writer.data(out, bytes);
    }

    /// [`Http1::data`] for an owned buffer: moved into an empty `out` when the
    /// framing adds nothing (no copy); returns the leftover buffer for reuse.
    pub fn data_owned(&mut self, out: &mut Vec<u8>, bytes: Vec<u8>) -> Vec<u8> {
        self.writer.data_owned(out, bytes)
    }

    /// [`BodyWriter::passthrough`] of the exchange in progress: how many of the next `want`
    /// body bytes may bypass the output buffer.
    pub fn passthrough(&self, want: u64) -> u64 {
        self.writer.passthrough(want)
    }

    /// `n` body bytes went to the socket directly ([`BodyWriter::passed`]).
    pub fn passed(&mut self, n: u64) {
        self.writer.passed(n);
    }

    /// The detached response's body is complete: write its end (the last
    /// chunk) and return to HTTP/1.1. Returns `false` when the connection must
    /// close instead (no keep-alive, or draining).
    pub fn end_body(&mut self, out: &mut Vec<u8>, env: &Env, now: Instant) -> bool {
        self.writer.end(out);
        self.reattach(env, now)
    }

    /// The worker started draining. A connection between requests gets
    /// [`DRAIN_IDLE_GRACE`] (or what is left of its keep-alive time, if less)
    /// to send its next request, which is answered with `Connection: close`;
    /// then the idle timer closes it. A fresh connection (accepted, nothing
    /// received yet) keeps its header timeout. Every other phase ends with the
    /// response in progress, which closes the connection.
    pub fn drain(&mut self, now: Instant) {
        if self.phase == Phase::Idle && !self.fresh {
            let grace = now + DRAIN_IDLE_GRACE;
            self.deadline = Some(match self.deadline {
                Some((at, Timeout::Idle)) if at < grace => (at, Timeout::Idle),
                _ => (grace, Timeout::Idle),
            });
        }
    }

    /// The connection's TLS version (`TLSv1.3`), once its handshake agreed on one: the access
    /// lines of its exchanges name it.
    pub fn set_tls(&mut self, version: Option<&'static str>) {
        self.tls = version;
    }

    /// The first bytes of a head arrived (a no-op after that): the header
    /// timer runs from now, and [`Http1::on_timeout`] answers `408` if the
    /// head is not complete by then. [`Http1::advance`] calls it; so does a
    /// caller that holds the bytes back while it decides the protocol (they
    /// may be the start of the HTTP/2 preface), since that wait is part of
    /// the head.
    pub fn head_started(&mut self, env: &Env, now: Instant) {
        if self.phase == Phase::Idle {
            self.phase = Phase::Head;
            self.fresh = false;
            self.cur.started = now;
            self.deadline = Some((now + env.header_timeout, Timeout::Request));
        }
    }

    /// The connection's timer fired. Returns `Close` when it should go.
    pub fn on_timeout(&mut self, out: &mut Vec<u8>, svc: &mut dyn Service, env: &mut Env, now: Instant) -> Progress {
        match self.deadline {
            Some((at, kind)) if at <= now => {
                self.deadline = None;
                match (kind, self.phase) {
                    (_, Phase::Waiting) => Progress::Waiting,
                    (Timeout::Request, Phase::Head | Phase::Body) => {
                        self.fail(Error::RequestTimeout, out, svc, env, now);
                        Progress::Close
                    }
                    _ => {
                        self.phase = Phase::Closing;
                        Progress::Close
                    }
                }
            }
            _ => Progress::NeedInput,
        }
    }

    /// Parse the request at `inbuf[pos..]` once and, when its body is
    /// complete, dispatch it: `Ok(Some(bytes it took))`. `Ok(None)`: more
    /// input is needed (the partial request stays at `pos`).
    fn step(
        &mut self,
        inbuf: &mut Vec<u8>,
        pos: usize,
        out: &mut Vec<u8>,
        svc: &mut dyn Service,
        env: &mut Env,
        now: Instant,
    ) -> Result<Option<usize>, Error> {
        self.head_started(env, now);
        let mut hdrs = parse::header_slots();
        let seen = &self.host[..self.host_len];
        let (head, parsed) = match parse::parse_seen(&inbuf[pos..], &mut hdrs, env.max_head, seen)? {
            Some((head, parsed)) => {
                if !head.host_seen {
                    match parse::host_value(parsed.headers) {
                        Some(v) if v.len() <= parse::HOST_MEMO => {
                            self.host[..v.len()].copy_from_slice(v);
                            self.host_len = v.len();
                        }
                        _ => self.host_len = 0,
                    }
                }
                // Known from here on, so that a later 400/413/408 is logged with them.
                self.cur.method = head.method;
                if svc.quotes() {
                    let field =
                        |name: &str| parsed.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
                    let target = parsed.path.unwrap_or("/").as_bytes();
                    self.cur.quote(target, field("user-agent"), field("referer"));
                } else {
                    self.cur.unquote();
                }
                self.head_known = true;
                (head, parsed)
            }
            None => return Ok(None),
        };
        let avail = inbuf.len() - pos;
        let body_ready = match head.framing {
            Framing::None => true,
            Framing::Length(n) => {
                if n > env.max_body {
                    return Err(Error::PayloadTooLarge);
                }
                avail as u64 >= head.len as u64 + n
            }
            Framing::Chunked => {
                if self.phase != Phase::Body {
                    self.body.clear();
                    self.chunked = Chunked::default();
                    self.chunk_used = 0;
                }
                let from = pos + head.len + self.chunk_used;
                let (used, done) = self.chunked.decode(&inbuf[from..], &mut self.body, env.max_body)?;
                self.chunk_used += used;
                done
            }
        };
        if body_ready {
            let used = self.dispatch(head, parsed, &inbuf[pos..], out, svc, env, now);
            return Ok(Some(used));
        }
        if self.phase != Phase::Body {
            // The whole body within `body_timeout` of the end of the head,
            // however it trickles in (a byte a second does not extend it).
            self.phase = Phase::Body;
            self.deadline = Some((now + env.body_timeout, Timeout::Request));
        }
        if head.expect_continue && !self.continue_sent {
            self.continue_sent = true;
            out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        if self.chunk_used > 0 {
            // The decoded part of a chunked body leaves the buffer (it is in
            // `body`): the head stays, for the next parse, the rest follows it.
            let from = pos + head.len;
            inbuf.drain(from..from + self.chunk_used);
            self.chunk_used = 0;
        }
        Ok(None)
    }

    /// Build the request, call the service, write or park. Returns bytes consumed.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        head: Head,
        parsed: httparse::Request<'_, '_>,
        inbuf: &[u8],
        out: &mut Vec<u8>,
        svc: &mut dyn Service,
        env: &mut Env,
        now: Instant,
    ) -> usize {
        let (body, consumed): (&[u8], usize) = match head.framing {
            Framing::Length(n) => (&inbuf[head.len..head.len + n as usize], head.len + n as usize),
            Framing::Chunked => (&self.body, head.len + std::mem::take(&mut self.chunk_used)),
            Framing::None => (&[], head.len),
        };
        let target = parsed.path.unwrap_or("/");
        let cur = &mut self.cur;
        cur.http10 = head.http10;
        cur.keep_alive = head.keep_alive;
        match parsed.headers.iter().find(|h| h.name.eq_ignore_ascii_case("x-request-id")) {
            Some(h) if valid_request_id(h.value) => {
                cur.rid[..h.value.len()].copy_from_slice(h.value);
                cur.rid_len = h.value.len();
            }
            _ => {
                let mut u = [0u8; 36];
                env.common.uuid(&mut u);
                cur.rid[..36].copy_from_slice(&u);
                cur.rid_len = 36;
            }
        }
        let (path, query) = head.split.apply(target);
        let method = head.method;
        let request_id = std::str::from_utf8(&cur.rid[..cur.rid_len]).unwrap_or("");
        let req = Request {
            method,
            path,
            query,
            http10: head.http10,
            headers: crate::http::fields::Fields::new(parsed.headers),
            body,
            request_id,
            peer: self.peer,
            secure: self.secure,
        };
        let Reply { head, body } = svc.call(&req);
        self.cur.label = svc.label();
        self.cur.client = svc.client();
        self.continue_sent = false;
        let (head, delimit) = match &body {
            Body::Full => (head, Delimit::Length),
            Body::Producer(_) => (head, Delimit::Chunked),
            Body::File(f) => (head, Delimit::Sized(f.len)),
            // The handler let the client in; the handshake is checked here, after it, so a
            // refused token or `Origin` is answered before a bad handshake.
            Body::WebSocket(_) => {
                match handshake::accept_key(method.as_str(), parsed.headers.iter().map(|h| (h.name, h.value))) {
                    Ok(accept) => (switch_head("websocket", accept), Delimit::Upgrade),
                    Err(e) => (refusal(head, e, env.development), Delimit::Length),
                }
            }
            Body::Job(_) | Body::Upstream(_) => {
                self.phase = Phase::Waiting;
                self.deadline = None;
                self.handoff = Some(body);
                return consumed;
            }
        };
        self.respond(head, delimit, out, svc, env, now);
        // `HEAD`: the head only; what would have produced the body is dropped.
        if self.phase == Phase::Detached {
            self.handoff = Some(body);
        }
        consumed
    }

    fn respond(
        &mut self,
        resp: Response,
        delimit: Delimit,
        out: &mut Vec<u8>,
        svc: &mut dyn Service,
        env: &mut Env,
        now: Instant,
    ) {
        let cur = &self.cur;
        let keep_alive = cur.keep_alive && !resp.close && !env.draining;
        let meta = RequestMeta {
            delimit,
            head: cur.method == Method::Head,
            http10: cur.http10,
            keep_alive,
            request_id: &cur.rid[..cur.rid_len],
        };
        let bytes = write_response(out, &resp, &meta, &mut env.common);
        let (target, user_agent, referer) = cur.quoted();
        svc.finished(&Finished {
            method: cur.method.as_str(),
            target,
            status: resp.status,
            bytes,
            elapsed: cur.started.elapsed(),
            request_id: &cur.rid[..cur.rid_len],
            label: cur.label,
            client: cur.client,
            protocol: if cur.http10 { Protocol::Http10 } else { Protocol::Http11 },
            tls: self.tls,
            user_agent,
            referer,
        });
        self.head_known = false;
        self.cur.keep_alive = keep_alive;
        // HEAD gets the head `GET` would, and never a body, whatever follows a
        // `GET` (a download, an event stream, a relay, a chat).
        self.writer = BodyWriter::for_head(delimit, self.cur.method == Method::Head);
        if self.writer.expects_body() {
            self.phase = Phase::Detached;
            self.deadline = None;
        } else if keep_alive {
            self.phase = Phase::Idle;
            self.deadline = Some((now + env.keepalive_timeout, Timeout::Idle));
        } else {
            self.phase = Phase::Closing;
            self.deadline = None;
        }
    }

    /// The body of a sized or streamed response is complete: back
    /// to HTTP/1.1. Returns `false` when the connection must close instead.
    fn reattach(&mut self, env: &Env, now: Instant) -> bool {
        if self.cur.keep_alive && !env.draining {
            self.phase = Phase::Idle;
            self.deadline = Some((now + env.keepalive_timeout, Timeout::Idle));
            true
        } else {
            self.phase = Phase::Closing;
            false
        }
    }

    /// A protocol error: answer it with `Connection: close` and stop reading.
    fn fail(&mut self, e: Error, out: &mut Vec<u8>, svc: &mut dyn Service, env: &mut Env, now: Instant) {
        if self.phase == Phase::Idle {
            self.cur.started = now;
        }
        if !self.head_known {
            self.cur.method = Method::Other;
            self.cur.quote(b"-", None, None);
        }
        let mut u = [0u8; 36];
        env.common.uuid(&mut u);
        self.cur.rid[..36].copy_from_slice(&u);
        self.cur.rid_len = 36;
        self.cur.keep_alive = false;
        self.cur.label = 0;
        self.cur.client = None;
        let mut resp = e.into_response(env.development);
        resp.close = true;
        env.announce(&mut resp, self.secure);
        self.phase = Phase::Waiting;
        self.respond(resp, Delimit::Length, out, svc, env, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::reply::{Producer, WebSocket};
    use crate::http::response::Body as Bytes;

    struct Echo {
        pending: bool,
        log: Vec<(String, u16, u16)>,
    }

    impl Service for Echo {
        fn call(&mut self, req: &Request<'_>) -> Reply {
            if self.pending && req.path == "/slow" {
                return Reply::later(Box::new(|| Ok(Response::new(200))));
            }
            let mut r = Response::new(200);
            r.body = Bytes::Bytes(format!("{}{}", req.path, String::from_utf8_lossy(req.body)).into_bytes());
            Reply::full(r)
        }
        fn label(&self) -> u16 {
            7
        }
        fn quotes(&self) -> bool {
            true
        }
        fn finished(&mut self, done: &Finished<'_>) {
            self.log.push((String::from_utf8_lossy(done.target).into_owned(), done.status, done.label));
        }
    }

    fn env() -> Env {
        Env { keepalive_timeout: Duration::from_secs(1), development: true, ..Env::testing() }
    }

    fn run(input: &[u8]) -> (String, Progress, Echo) {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut inbuf = input.to_vec();
        let mut out = Vec::new();
        let p = h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now);
        (String::from_utf8_lossy(&out).into_owned(), p, svc)
    }

    fn bodies(out: &str) -> Vec<&str> {
        out.split("HTTP/1.1 ").skip(1).map(|r| r.split("\r\n\r\n").nth(1).unwrap_or("")).collect()
    }

    #[test]
    fn pipelined_in_order() {
        let (out, p, svc) = run(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(p, Progress::NeedInput);
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 3);
        assert_eq!(svc.log.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(), ["/a", "/b", "/c"]);
    }

    /// What the access log got for each exchange: protocol, TLS version, agent, referer.
    type Quoted = (Protocol, Option<&'static str>, Option<Vec<u8>>, Option<Vec<u8>>);

    struct Quoting(Vec<Quoted>);

    impl Service for Quoting {
        fn call(&mut self, _: &Request<'_>) -> Reply {
            Reply::full(Response::new(204))
        }
        fn quotes(&self) -> bool {
            true
        }
        fn finished(&mut self, done: &Finished<'_>) {
            let owned = |v: Option<&[u8]>| v.map(<[u8]>::to_vec);
            self.0.push((done.protocol, done.tls, owned(done.user_agent), owned(done.referer)));
        }
    }

    #[test]
    fn each_exchange_is_logged_with_its_own_agent_and_referer() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), true, &e, now);
        h.set_tls(Some("TLSv1.3"));
        let mut svc = Quoting(Vec::new());
        let long = "x".repeat(logging::FIELD_MAX + 100);
        let mut inbuf = format!(
            "GET /a HTTP/1.1\r\nHost: x\r\nUser-Agent: one\r\nReferer: https://r.example/\r\n\r\n\
             GET /b HTTP/1.1\r\nHost: x\r\n\r\n\
             GET /c HTTP/1.0\r\nhost: x\r\nuser-agent: {long}\r\nREFERER: \r\n\r\n"
        )
        .into_bytes();
        h.advance(&mut inbuf, &mut Vec::new(), &mut svc, &mut e, now);
        let cut = long.as_bytes()[..logging::FIELD_MAX].to_vec();
        let tls = Some("TLSv1.3");
        assert_eq!(
            svc.0,
            [
                (Protocol::Http11, tls, Some(b"one".to_vec()), Some(b"https://r.example/".to_vec())),
                (Protocol::Http11, tls, None, None),
                (Protocol::Http10, tls, Some(cut), Some(Vec::new())),
            ],
            "nothing carries over from the request before; an agent is cut at the cap"
        );
    }

    /// Keeps the target and agent of each exchange; quotes only when told to.
    struct Targets {
        quotes: bool,
        seen: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    }

    impl Service for Targets {
        fn call(&mut self, _: &Request<'_>) -> Reply {
            Reply::full(Response::new(204))
        }
        fn quotes(&self) -> bool {
            self.quotes
        }
        fn finished(&mut self, done: &Finished<'_>) {
            self.seen.push((done.target.to_vec(), done.user_agent.map(<[u8]>::to_vec)));
        }
    }

    /// A service that reads no target or agent (the access log is off) gets none: the
    /// connection does not copy them out of the head; the answers are the same.
    #[test]
    fn a_service_that_quotes_nothing_is_handed_no_target_or_agent() {
        let input = b"GET /a HTTP/1.1\r\nHost: x\r\nUser-Agent: one\r\n\r\nGET /b?q HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut answers = Vec::new();
        for (quotes, want) in [
            (true, vec![(b"/a".to_vec(), Some(b"one".to_vec())), (b"/b?q".to_vec(), None)]),
            (false, vec![(Vec::new(), None), (Vec::new(), None)]),
        ] {
            let mut e = env();
            let now = Instant::now();
            let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
            let mut svc = Targets { quotes, seen: Vec::new() };
            let mut out = Vec::new();
            assert_eq!(h.advance(&mut input.to_vec(), &mut out, &mut svc, &mut e, now), Progress::NeedInput);
            assert_eq!(svc.seen, want, "quotes: {quotes}");
            answers.push(String::from_utf8_lossy(&out).matches("HTTP/1.1 204").count());
        }
        assert_eq!(answers, [2, 2]);
    }

    #[test]
    fn chunked_body_split_across_reads() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut out = Vec::new();
        let mut inbuf = b"POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert!(out.is_empty());
        inbuf.extend_from_slice(b"c\r\n0\r\n\r\n");
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert!(String::from_utf8_lossy(&out).ends_with("/eabc"));
        assert!(inbuf.is_empty());
    }

    #[test]
    fn too_large_declared_body_is_413_before_reading() {
        let (out, p, _) = run(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(p, Progress::Close);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        assert!(!out.contains("100 Continue"));
        assert!(out.contains("Connection: close"));
    }

    #[test]
    fn expect_continue_sent_once() {
        let (out, p, _) = run(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(p, Progress::NeedInput);
        assert_eq!(out, "HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn pending_holds_pipelined_requests_in_order() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: true, log: Vec::new() };
        let mut out = Vec::new();
        let mut inbuf = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::Waiting);
        assert!(out.is_empty());
        let mut r = Response::new(200);
        r.body = Bytes::Static(b"slow-done");
        h.complete(r, &mut out, &mut svc, &mut e, now);
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert_eq!(bodies(&String::from_utf8_lossy(&out)), ["slow-done", "/fast"]);
        // The label the service gave at `call` comes back when the pending answer finishes.
        assert_eq!(svc.log, [("/slow".to_owned(), 200, 7), ("/fast".to_owned(), 200, 7)]);
    }

    #[test]
    fn malformed_gets_400_and_close() {
        let (out, p, svc) = run(b"GET / HTTP/1.1\r\nHost : x\r\n\r\n");
        assert_eq!(p, Progress::Close);
        assert!(out.starts_with("HTTP/1.1 400"));
        assert!(out.contains("Connection: close\r\n"));
        assert!(out.contains("\"code\":\"BAD_REQUEST\""));
        assert_eq!(svc.log.len(), 1);
        assert_eq!(svc.log[0].2, 0, "a request the service never saw has label 0");
    }

    #[test]
    fn a_protocol_error_after_a_request_is_labelled_zero() {
        let (_, p, svc) = run(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost : x\r\n\r\n");
        assert_eq!(p, Progress::Close);
        assert_eq!(svc.log.iter().map(|l| (l.1, l.2)).collect::<Vec<_>>(), [(200, 7), (400, 0)]);
    }

    #[test]
    fn timeouts_408_in_head_silent_when_idle() {
        let mut e = env();
        let now = Instant::now();
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut out = Vec::new();
        let mut inbuf = b"GET / HTTP/1.1\r\n".to_vec();
        h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now);
        let later = now + Duration::from_secs(2);
        assert_eq!(h.on_timeout(&mut out, &mut svc, &mut e, later), Progress::Close);
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"));
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut out = Vec::new();
        assert_eq!(h.on_timeout(&mut out, &mut svc, &mut e, later), Progress::Close);
        assert!(out.is_empty());
    }

    #[test]
    fn bytes_held_back_by_the_caller_start_the_head_and_its_408() {
        let mut e = env();
        let now = Instant::now();
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        // `PRI * HTTP` waits for the rest of the HTTP/2 preface, out of the codec's sight.
        let first = now + Duration::from_millis(300);
        h.head_started(&e, first);
        h.head_started(&e, first + Duration::from_millis(300));
        assert_eq!(h.deadline(), Some((first + e.header_timeout, Timeout::Request)), "timed from the first byte");
        let (mut out, due) = (Vec::new(), first + e.header_timeout);
        assert_eq!(h.on_timeout(&mut out, &mut svc, &mut e, due), Progress::Close);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408") && text.contains("\"code\":"), "{text}");
        assert!(text.contains("Connection: close"), "{text}");
        assert_eq!(h.phase(), Phase::Closing);
    }

    #[test]
    fn draining_keeps_an_idle_keep_alive_for_its_next_request_then_closes_it() {
        let mut e = env();
        e.keepalive_timeout = Duration::from_secs(60);
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut out = Vec::new();
        let mut inbuf = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert!(!String::from_utf8_lossy(&out).contains("Connection: close"));
        // The worker drains: the idle connection is not closed under a request on its way...
        e.draining = true;
        h.drain(now);
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        let (at, kind) = h.deadline().expect("an idle deadline");
        assert_eq!((at, kind), (now + DRAIN_IDLE_GRACE, Timeout::Idle), "idle for the grace, not the keep-alive time");
        // ...the request that arrives is answered with `Connection: close`...
        out.clear();
        inbuf.extend_from_slice(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::Close);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Connection: close") && text.ends_with("/b"), "{text}");
        // ...and one that stays idle past the grace is closed by its timer, silently.
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut inbuf = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        e.draining = false;
        h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now);
        e.draining = true;
        h.drain(now);
        out.clear();
        assert_eq!(h.on_timeout(&mut out, &mut svc, &mut e, now + DRAIN_IDLE_GRACE / 2), Progress::NeedInput);
        assert_eq!(h.on_timeout(&mut out, &mut svc, &mut e, now + DRAIN_IDLE_GRACE), Progress::Close);
        assert!(out.is_empty());
    }

    #[test]
    fn a_trickled_body_is_bounded_by_the_body_timeout_as_a_whole() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut out = Vec::new();
        let mut inbuf = b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert_eq!(h.deadline(), Some((now + e.body_timeout, Timeout::Request)));
        // One byte a second does not move the deadline.
        for i in 1..3u64 {
            inbuf.push(b'x');
            let t = now + Duration::from_secs(i);
            assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, t), Progress::NeedInput);
            assert_eq!(h.deadline(), Some((now + e.body_timeout, Timeout::Request)));
        }
        let due = now + e.body_timeout;
        assert_eq!(h.on_timeout(&mut out, &mut svc, &mut e, due), Progress::Close);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408") && text.contains("Connection: close"), "{text}");
    }

    struct Streamer;

    impl Service for Streamer {
        fn call(&mut self, _: &Request<'_>) -> Reply {
            Reply::stream(Response::new(200), Producer::Events { last_event_id: None, audience: Default::default() })
        }
        fn finished(&mut self, _: &Finished<'_>) {}
    }

    #[test]
    fn head_of_a_stream_is_the_head_only_and_the_connection_goes_on() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut out = Vec::new();
        let mut inbuf = b"HEAD /events HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut Streamer, &mut e, now), Progress::NeedInput);
        assert_eq!(h.phase(), Phase::Idle, "HEAD must not hand the connection to a stream");
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Transfer-Encoding: chunked") && text.ends_with("\r\n\r\n"), "{text}");
        let mut inbuf = b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut Streamer, &mut e, now), Progress::Detached);
    }

    /// Answers every request with the body kind its path names.
    struct Kinds;

    impl Service for Kinds {
        fn call(&mut self, req: &Request<'_>) -> Reply {
            match req.path {
                "/stream" => Reply::stream(
                    Response::new(200),
                    Producer::Events { last_event_id: None, audience: Default::default() },
                ),
                "/sized" => {
                    let file = std::fs::File::open("/dev/null").expect("/dev/null");
                    Reply::file(Response::new(200), std::sync::Arc::new(file), 0, 5)
                }
                "/ws" => {
                    // The fields the service gives every answer, which a refusal carries.
                    let mut r = Reply::websocket(WebSocket { user_id: None, name: None });
                    r.head.header("Vary", "Origin");
                    r
                }
                "/relay" => Reply::later(Box::new(|| Ok(Response::new(200)))),
                _ => Reply::full(Response::static_json(b"{}")),
            }
        }
        fn finished(&mut self, _: &Finished<'_>) {}
    }

    fn exchange(h: &mut Http1, e: &mut Env, input: &[u8]) -> (String, Progress) {
        let mut inbuf = input.to_vec();
        let mut out = Vec::new();
        let p = h.advance(&mut inbuf, &mut out, &mut Kinds, e, Instant::now());
        (String::from_utf8_lossy(&out).into_owned(), p)
    }

    #[test]
    fn head_of_every_kind_is_the_head_only_and_the_connection_goes_on() {
        let mut e = env();
        let now = Instant::now();
        for path in ["/stream", "/sized", "/plain"] {
            let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
            let (text, p) = exchange(&mut h, &mut e, format!("HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
            assert_eq!((p, h.phase()), (Progress::NeedInput, Phase::Idle), "{path}");
            assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("\r\n\r\n"), "{path}: {text}");
            // Body bytes handed over anyway are not written.
            let mut out = Vec::new();
            h.data(&mut out, b"body");
            assert!(out.is_empty(), "{path}");
        }
        // A relay's head arrives later: HEAD gets it, and no body.
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let (text, p) = exchange(&mut h, &mut e, b"HEAD /relay HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!((text.as_str(), p), ("", Progress::Waiting));
        let mut out = Vec::new();
        assert!(!h.complete_stream(Response::new(200), &mut out, &mut Kinds, &mut e, now), "no body follows");
        h.data(&mut out, b"event");
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("Transfer-Encoding: chunked") && text.ends_with("\r\n\r\n"), "{text}");
        assert_eq!(h.phase(), Phase::Idle);
    }

    #[test]
    fn the_body_to_run_is_handed_over_only_when_it_is_needed() {
        let mut e = env();
        let now = Instant::now();
        let cases: [(&str, &str, Option<&str>); 8] = [
            ("GET", "/stream", Some("producer")),
            ("HEAD", "/stream", None),
            ("GET", "/sized", Some("file")),
            ("HEAD", "/sized", None),
            ("GET", "/ws", Some("websocket")),
            ("GET", "/relay", Some("job")),
            // A job's response is the head: `HEAD` needs it run.
            ("HEAD", "/relay", Some("job")),
            ("GET", "/plain", None),
        ];
        for (method, path, want) in cases {
            let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
            let fields = if path == "/ws" { HANDSHAKE } else { "" };
            exchange(&mut h, &mut e, format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{fields}\r\n").as_bytes());
            let got = h.take_body().map(|b| match b {
                Body::Full => "full",
                Body::Job(_) => "job",
                Body::Producer(_) => "producer",
                Body::File(_) => "file",
                Body::Upstream(_) => "upstream",
                Body::WebSocket(_) => "websocket",
            });
            assert_eq!(got, want, "{method} {path}");
            assert!(h.take_body().is_none(), "handed over once");
        }
    }

    #[test]
    fn a_stream_is_chunked_by_the_codec_and_returns_to_keep_alive() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let (text, p) = exchange(&mut h, &mut e, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(p, Progress::Detached);
        assert!(text.contains("Transfer-Encoding: chunked\r\n") && !text.contains("Content-Length"), "{text}");
        let mut out = Vec::new();
        h.data(&mut out, b"data: 1\n\n");
        h.data(&mut out, b"");
        assert!(h.end_body(&mut out, &e, now), "keep-alive");
        assert_eq!(out, b"9\r\ndata: 1\n\n\r\n0\r\n\r\n");
        assert_eq!(h.phase(), Phase::Idle);
        // A sized body: as it is, never past its length.
        let (text, p) = exchange(&mut h, &mut e, b"GET /sized HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(p, Progress::Detached);
        assert!(text.contains("Content-Length: 5\r\n"), "{text}");
        let mut out = Vec::new();
        h.data(&mut out, b"abcdefg");
        assert!(h.end_body(&mut out, &e, now));
        assert_eq!(out, b"abcde");
    }

    /// The fields of the RFC 6455 §1.3 example handshake, whose accept is
    /// `s3pPLMBiTxaQ9kYGzzhZRbK+xOo=`.
    const HANDSHAKE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

    #[test]
    fn an_upgrade_writes_a_101_and_then_raw_bytes() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let (text, p) = exchange(&mut h, &mut e, format!("GET /ws HTTP/1.1\r\nHost: x\r\n{HANDSHAKE}\r\n").as_bytes());
        assert_eq!(p, Progress::Detached);
        assert!(text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"), "{text}");
        for field in [
            "Upgrade: websocket\r\n",
            "Connection: Upgrade\r\n",
            "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n",
        ] {
            assert!(text.contains(field), "{field}: {text}");
        }
        assert!(!text.contains("Content-Length") && !text.contains("Transfer-Encoding"), "{text}");
        assert!(text.ends_with("\r\n\r\n"));
        assert!(!text.contains("Vary"), "a 101 carries none of the reply's fields: {text}");
        let mut out = Vec::new();
        h.data(&mut out, b"\x81\x02hi");
        assert_eq!(out, b"\x81\x02hi");
    }

    #[test]
    fn a_bad_handshake_is_refused_with_the_replys_fields_and_the_connection_goes_on() {
        let mut e = env();
        let now = Instant::now();
        let no_version = HANDSHAKE.replace("Sec-WebSocket-Version: 13\r\n", "");
        let no_key = HANDSHAKE.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "");
        let cases = [
            ("GET", no_version.as_str(), "426 Upgrade Required", "WebSocket version 13 required"),
            ("GET", no_key.as_str(), "400 Bad Request", "invalid Sec-WebSocket-Key"),
            ("GET", "", "400 Bad Request", "missing Upgrade: websocket"),
            ("POST", HANDSHAKE, "400 Bad Request", "websocket upgrade requires GET"),
        ];
        for (method, fields, status, message) in cases {
            let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
            let (text, p) =
                exchange(&mut h, &mut e, format!("{method} /ws HTTP/1.1\r\nHost: x\r\n{fields}\r\n").as_bytes());
            assert_eq!((p, h.phase()), (Progress::NeedInput, Phase::Idle), "{text}");
            assert!(text.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{text}");
            assert!(text.contains(message) && text.contains("\r\nVary: Origin\r\n"), "{text}");
            let version = text.contains("\r\nSec-WebSocket-Version: 13\r\n");
            assert_eq!(version, status.starts_with("426"), "{text}");
            assert!(h.take_body().is_none(), "nothing to run: {text}");
        }
    }

    #[test]
    fn draining_answers_a_fresh_connection_then_closes() {
        let mut e = env();
        e.draining = true;
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut out = Vec::new();
        // Accepted from the queue before its request arrived: it waits for it.
        let mut inbuf = Vec::new();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        inbuf.extend_from_slice(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::Close);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200") && text.contains("Connection: close"), "{text}");
    }

    /// A mixed pipeline: no body, a sized body, a chunked body, then a plain GET.
    const MIXED: &[u8] = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n\
POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz\
POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1;x=y\r\nc\r\n0\r\n\r\n\
GET /z HTTP/1.1\r\nHost: x\r\n\r\n";
    const MIXED_BODIES: [&str; 4] = ["/a", "/exyz", "/eabc", "/z"];

    /// Feed `parts` one after another as separate reads; the responses, and
    /// whether the read buffer ends empty.
    fn feed(parts: &[&[u8]]) -> (String, bool) {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let (mut inbuf, mut out) = (Vec::new(), Vec::new());
        for part in parts {
            inbuf.extend_from_slice(part);
            assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        }
        (String::from_utf8_lossy(&out).into_owned(), inbuf.is_empty())
    }

    #[test]
    fn a_pipeline_split_at_every_byte_gives_the_same_answers() {
        let (whole, empty) = feed(&[MIXED]);
        assert_eq!(bodies(&whole), MIXED_BODIES);
        assert!(empty, "every request consumed");
        for at in 1..MIXED.len() {
            let (text, empty) = feed(&[&MIXED[..at], &MIXED[at..]]);
            assert_eq!(bodies(&text), MIXED_BODIES, "split at {at}");
            assert!(empty, "split at {at}");
        }
        // And one byte per read.
        let bytes: Vec<&[u8]> = MIXED.chunks(1).collect();
        let (text, empty) = feed(&bytes);
        assert_eq!(bodies(&text), MIXED_BODIES);
        assert!(empty);
    }

    #[test]
    fn the_partial_request_behind_a_pipeline_stays_at_the_front() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: false, log: Vec::new() };
        let mut out = Vec::new();
        let mut inbuf =
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHo".to_vec();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert_eq!(inbuf, b"GET /c HTTP/1.1\r\nHo");
        assert_eq!(h.phase(), Phase::Head);
        // A chunked body arriving in parts: the decoded part leaves the buffer, the head stays.
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let head = b"POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut inbuf = [b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n".as_slice(), head, b"2\r\nab\r\n1\r"].concat();
        out.clear();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert_eq!(inbuf, head, "the decoder took all it was given (it keeps its own state)");
        inbuf.extend_from_slice(b"\nc\r\n0\r\n\r\nGET /z HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert_eq!(bodies(&String::from_utf8_lossy(&out)), ["/a", "/eabc", "/z"]);
        assert!(inbuf.is_empty());
    }

    #[test]
    fn a_host_is_checked_again_whenever_it_changes_on_a_connection() {
        let (out, p, svc) = run(b"GET /a HTTP/1.1\r\nHost: x:1\r\n\r\nGET /b HTTP/1.1\r\nHost: x:1\r\n\r\n\
GET /c HTTP/1.1\r\nHost: y\r\n\r\nGET /d HTTP/1.1\r\nHost: y:\r\n\r\n");
        assert_eq!(p, Progress::Close);
        assert_eq!(svc.log.iter().map(|l| l.1).collect::<Vec<_>>(), [200, 200, 200, 400], "{out}");
    }

    #[test]
    fn a_full_buffer_without_a_head_end_is_431_after_a_pipeline() {
        let mut input = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n".to_vec();
        // The second head grows past `max_head` (1024) with no blank line.
        while input.len() < 3000 {
            input.extend_from_slice(b"X-Pad: 0123456789012345678901234567890123456789\r\n");
        }
        let (out, p, svc) = run(&input);
        assert_eq!(p, Progress::Close);
        assert_eq!(out.matches("HTTP/1.1 ").count(), 2, "{out}");
        assert!(out.contains("HTTP/1.1 431"), "{out}");
        assert_eq!(svc.log.iter().map(|l| l.1).collect::<Vec<_>>(), [200, 431]);
    }

    #[test]
    fn a_waiting_request_keeps_exactly_the_requests_behind_it() {
        let mut e = env();
        let now = Instant::now();
        let mut h = Http1::new("127.0.0.1".parse().expect("ip"), false, &e, now);
        let mut svc = Echo { pending: true, log: Vec::new() };
        let mut out = Vec::new();
        let rest = b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /z HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut inbuf =
            [b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n".as_slice(), rest].concat();
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::Waiting);
        assert_eq!(inbuf, rest, "the answered and the pending request left; the rest is at the front");
        h.complete(Response::new(204), &mut out, &mut svc, &mut e, now);
        assert_eq!(h.advance(&mut inbuf, &mut out, &mut svc, &mut e, now), Progress::NeedInput);
        assert!(inbuf.is_empty());
        assert_eq!(svc.log.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(), ["/a", "/slow", "/e", "/z"]);
    }
}
