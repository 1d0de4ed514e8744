//! HTTP/2 connections in the worker: the loop's side of [`H2Conn`].
//!
//! A connection is HTTP/2 when a plain one opens with the client preface
//! (prior knowledge, h2c) or a TLS one negotiated `h2` by ALPN. Its
//! [`H2Session`] owns the codec and one [`Exchange`] per open stream, keyed
//! by stream id: everything above the codec (pool completions through
//! [`ExchangeId`], per-stream body timeouts, the access log) is per exchange,
//! never per connection. Requests go through the same [`Glue`] and
//! `App::handle` as HTTP/1.1; answers are rendered by the same response
//! writer and handed to h2 as a head and DATA, without the HTTP/1.1
//! connection fields.
//!
//! This module moves bytes between the connection's socket buffers and the
//! codec and turns events into exchanges. It never looks at a route and
//! never writes HTTP/2 frames itself.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::pool::{ExchangeId, Pool, Work};
use super::{flush, read_into, Glue, Worker, READ_AHEAD, SEND_TIMEOUT};
use crate::app::Body;
use crate::error::Error;
use crate::http::conn::{Env, Finished, Service, HIGH_WATERMARK};
use crate::http::headers::valid_request_id;
use crate::http::request::{Method, Request};
use crate::http::response::{write_response, Delimit, RequestMeta, Response};
use crate::http2::{Event, H2Conn, H2Settings, Reason, RequestHead, StreamId};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// After a GOAWAY that asked for no stream to finish (an idle connection),
/// the peer gets this long to acknowledge it before the connection is cut.
const GOAWAY_GRACE: Duration = Duration::from_secs(2);

/// Streams the peer may reset before we answered them, per connection; one
/// more ends the connection with `GOAWAY(ENHANCE_YOUR_CALM)`. h2 catches a
/// burst of resets; this catches the slow kind (one HEADERS + RST_STREAM per
/// read), which h2 never sees as a burst.
const MAX_PEER_RESETS: u32 = 200;

/// Event-handling rounds per drive before the connection yields to the others.
const MAX_ROUNDS: usize = 32;

/// What the first bytes of a connection say it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sniff {
    /// HTTP/1.1.
    H1,
    /// HTTP/2.
    H2,
    /// Not known yet: more bytes (or the TLS handshake) are needed.
    Wait,
}

/// Classify a connection from its first plaintext bytes and, over TLS, the
/// protocol ALPN chose (`Some` once the handshake is done).
pub(super) fn sniff(first: &[u8], tls: Option<Option<&[u8]>>) -> Sniff {
    match tls {
        Some(None) => Sniff::Wait,
        Some(Some(alpn)) if alpn == b"h2" => Sniff::H2,
        Some(Some(_)) => Sniff::H1,
        None if first.len() >= PREFACE.len() => {
            if first.starts_with(PREFACE) {
                Sniff::H2
            } else {
                Sniff::H1
            }
        }
        None if PREFACE.starts_with(first) => Sniff::Wait,
        None => Sniff::H1,
    }
}

/// Where an exchange is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The request body is arriving.
    Receiving,
    /// The handler's job runs on the pool.
    Waiting,
}

/// One request/response exchange: one stream.
struct Exchange {
    stream: StreamId,
    method: Method,
    /// `:path` (with the query), for the handler and the access log.
    target: String,
    authority: Option<String>,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The request body so far.
    body: Vec<u8>,
    stage: Stage,
    started: Instant,
    /// The whole body within `limits.body_timeout_ms` of the head.
    deadline: Option<Instant>,
    request_id: String,
    label: u16,
}

/// One HTTP/2 connection's state: the codec and its exchanges.
pub(super) struct H2Session {
    conn: H2Conn,
    events: Vec<Event>,
    /// Open exchanges (few; searched linearly).
    exchanges: Vec<Exchange>,
    peer: std::net::IpAddr,
    secure: bool,
    /// Since when the connection has had no exchange (the keep-alive timer).
    idle_since: Option<Instant>,
    /// A GOAWAY went out: the connection is cut at this deadline if still open.
    cut_at: Option<Instant>,
    /// Streams the peer reset before their answer.
    peer_resets: u32,
    /// [`Event::Closed`] came: flush the output, then close.
    closed: bool,
    /// Response heads are rendered here first (the HTTP/1.1 writer's form).
    scratch: Vec<u8>,
}

impl H2Session {
    /// A session whose preface (or part of it) may already be in `first`.
    pub(super) fn new(env: &Env, peer: std::net::IpAddr, secure: bool, now: Instant) -> H2Session {
        H2Session {
            conn: H2Conn::new(H2Settings::new(env.max_head)),
            events: Vec::new(),
            exchanges: Vec::new(),
            peer,
            secure,
            idle_since: Some(now),
            cut_at: None,
            peer_resets: 0,
            closed: false,
            scratch: Vec::new(),
        }
    }

    /// The earliest deadline: a stream's body timeout, the idle timeout, the cut.
    pub(super) fn deadline(&self, env: &Env) -> Option<Instant> {
        let idle = self.idle_since.map(|t| t + env.keepalive_timeout);
        let bodies = self.exchanges.iter().filter_map(|e| e.deadline).min();
        [idle, bodies, self.cut_at].into_iter().flatten().min()
    }

    /// Start a graceful shutdown (GOAWAY; open streams finish), cut at `cut_at`.
    pub(super) fn shut_down(&mut self, cut_at: Instant) {
        self.conn.graceful_shutdown();
        self.cut_at = Some(self.cut_at.map_or(cut_at, |t| t.min(cut_at)));
    }

    fn find(&self, stream: StreamId) -> Option<usize> {
        self.exchanges.iter().position(|e| e.stream == stream)
    }

    fn remove(&mut self, i: usize, now: Instant) {
        self.exchanges.swap_remove(i);
        if self.exchanges.is_empty() {
            self.idle_since = Some(now);
        }
    }

    /// Drive the codec and answer what it reports, until it goes quiet (or
    /// [`MAX_ROUNDS`]). Returns whether events are left for the next drive.
    fn step(&mut self, cx: &mut Cx<'_, '_>, now: Instant) -> bool {
        for _ in 0..MAX_ROUNDS {
            self.conn.advance(&mut self.events);
            if self.events.is_empty() {
                return false;
            }
            for event in std::mem::take(&mut self.events) {
                self.on_event(event, cx, now);
            }
        }
        self.conn.advance(&mut self.events);
        !self.events.is_empty()
    }

    fn on_event(&mut self, event: Event, cx: &mut Cx<'_, '_>, now: Instant) {
        match event {
            Event::Request { stream, head } => self.on_request(stream, head, cx, now),
            Event::Data { stream, bytes, end } => {
                // Consumed at once (buffered here, bounded by the body limit).
                let _ = self.conn.release(stream, bytes.len());
                let Some(i) = self.find(stream) else { return };
                let ex = &mut self.exchanges[i];
                if ex.stage != Stage::Receiving {
                    return;
                }
                if (ex.body.len() + bytes.len()) as u64 > cx.env.max_body {
                    return self.fail(i, Error::PayloadTooLarge, cx, now);
                }
                ex.body.extend_from_slice(&bytes);
                if end {
                    self.dispatch(i, cx, now);
                }
            }
            Event::Writable { .. } => {}
            Event::Reset { stream, .. } => {
                if let Some(i) = self.find(stream) {
                    self.remove(i, now);
                    self.peer_resets += 1;
                    if self.peer_resets > MAX_PEER_RESETS {
                        log::debug!("HTTP/2: too many streams reset by the peer");
                        self.conn.abort(Reason::ENHANCE_YOUR_CALM);
                    }
                }
            }
            Event::Closed { error } => {
                if let Some(e) = error {
                    log::debug!("HTTP/2 connection ended: {e}");
                }
                self.closed = true;
                self.exchanges.clear();
            }
        }
    }

    fn on_request(&mut self, stream: StreamId, head: RequestHead, cx: &mut Cx<'_, '_>, now: Instant) {
        let request_id = match head.headers.iter().find(|(n, _)| n.as_str() == "x-request-id") {
            Some((_, v)) if valid_request_id(v.as_bytes()) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            _ => {
                let mut u = [0u8; 36];
                cx.env.common.uuid(&mut u);
                String::from_utf8_lossy(&u).into_owned()
            }
        };
        let declared = head
            .headers
            .iter()
            .find(|(n, _)| n == http::header::CONTENT_LENGTH)
            .and_then(|(_, v)| v.to_str().ok()?.trim().parse::<u64>().ok());
        let ex = Exchange {
            stream,
            method: Method::parse(head.method.as_str()),
            target: if head.path.is_empty() { "/".to_owned() } else { head.path },
            authority: head.authority,
            headers: head.headers,
            body: Vec::new(),
            stage: Stage::Receiving,
            started: now,
            deadline: (!head.end_stream).then(|| now + cx.env.body_timeout),
            request_id,
            label: 0,
        };
        self.exchanges.push(ex);
        self.idle_since = None;
        let i = self.exchanges.len() - 1;
        if declared.is_some_and(|n| n > cx.env.max_body) {
            return self.fail(i, Error::PayloadTooLarge, cx, now);
        }
        if head.end_stream {
            self.dispatch(i, cx, now);
        }
    }

    /// The request is complete: hand it to the app.
    fn dispatch(&mut self, i: usize, cx: &mut Cx<'_, '_>, now: Instant) {
        let ex = &mut self.exchanges[i];
        ex.deadline = None;
        let reply = {
            let mut headers: Vec<httparse::Header<'_>> = Vec::with_capacity(ex.headers.len() + 1);
            // `:authority` plays the role of `Host`; without it, the `host` field.
            if let Some(a) = &ex.authority {
                headers.push(httparse::Header { name: "host", value: a.as_bytes() });
            }
            for (name, value) in &ex.headers {
                if ex.authority.is_some() && name == http::header::HOST {
                    continue;
                }
                headers.push(httparse::Header { name: name.as_str(), value: value.as_bytes() });
            }
            let hosts: Vec<&[u8]> = headers.iter().filter(|h| h.name == "host").map(|h| h.value).collect();
            if hosts.len() != 1 || !crate::http::parse::valid_host(hosts[0]) {
                Err(Error::bad_request("missing or repeated Host"))
            } else {
                let (path, query) = crate::http::parse::split_target(&ex.target);
                let req = Request {
                    method: ex.method,
                    path,
                    query,
                    http10: false,
                    headers: &headers,
                    body: &ex.body,
                    request_id: &ex.request_id,
                    peer: self.peer,
                    secure: self.secure,
                };
                let reply = cx.glue.call(&req);
                Ok(reply)
            }
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return self.fail(i, e, cx, now),
        };
        let ex = &mut self.exchanges[i];
        ex.label = cx.glue.label();
        ex.body = Vec::new();
        match reply.body {
            Body::Full => self.answer(i, reply.head, cx, now),
            Body::Job(job) => {
                ex.stage = Stage::Waiting;
                let id = ExchangeId { conn: cx.conn, stream: ex.stream.0, generation: cx.generation };
                cx.pool.submit(id, Work::Request(job));
            }
            // Streamed bodies come in later steps.
            Body::Producer(_) | Body::File(_) | Body::Upstream(_) | Body::WebSocket(_) => {
                self.fail(i, Error::ServiceUnavailable("not available over HTTP/2"), cx, now)
            }
        }
    }

    /// Answer exchange `i` with an error response (its stream ends; h2
    /// resets the rest of a body still arriving with `NO_ERROR`).
    fn fail(&mut self, i: usize, e: Error, cx: &mut Cx<'_, '_>, now: Instant) {
        self.exchanges[i].label = 0;
        let resp = e.into_response(cx.env.development);
        self.answer(i, resp, cx, now);
    }

    /// Send `resp` whole on exchange `i`'s stream, log it, and forget the exchange.
    fn answer(&mut self, i: usize, resp: Response, cx: &mut Cx<'_, '_>, now: Instant) {
        let ex = &self.exchanges[i];
        let head_only = ex.method == Method::Head;
        let meta = RequestMeta {
            delimit: Delimit::Length,
            head: head_only,
            http10: false,
            keep_alive: true,
            request_id: ex.request_id.as_bytes(),
        };
        self.scratch.clear();
        let bytes = write_response(&mut self.scratch, &resp, &meta, &mut cx.env.common);
        if let Err(e) = send_rendered(&mut self.conn, ex.stream, &self.scratch) {
            log::debug!("HTTP/2 stream {}: {e}", ex.stream.0);
            let _ = self.conn.reset(ex.stream, Reason::INTERNAL_ERROR);
        }
        cx.glue.finished(&Finished {
            method: if ex.method == Method::Other { "OTHER" } else { ex.method.as_str() },
            target: ex.target.as_bytes(),
            status: resp.status,
            bytes,
            elapsed: ex.started.elapsed(),
            request_id: ex.request_id.as_bytes(),
            label: ex.label,
        });
        self.remove(i, now);
        if self.scratch.capacity() > 4 * HIGH_WATERMARK {
            self.scratch = Vec::new();
        }
    }
}

/// Send a response rendered in the HTTP/1.1 form (`rendered`: an optional
/// `103`, the head, the body) on `stream`: the `103` as early hints, the head
/// without the connection fields, the body as DATA.
fn send_rendered(conn: &mut H2Conn, stream: StreamId, rendered: &[u8]) -> Result<(), crate::http2::H2Error> {
    let bad = crate::http2::H2Error::InvalidHead("unparsable rendered head");
    let mut at = 0;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 96];
        let mut r = httparse::Response::new(&mut fields);
        let n = match r.parse(&rendered[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            _ => return Err(bad),
        };
        let status = r.code.unwrap_or(500);
        let pairs: Vec<(&str, &[u8])> = r
            .headers
            .iter()
            .filter(|h| !h.name.eq_ignore_ascii_case("connection") && !h.name.eq_ignore_ascii_case("keep-alive"))
            .map(|h| (h.name, h.value))
            .collect();
        if status == 103 {
            conn.early_hints(stream, &pairs)?;
            at += n;
            continue;
        }
        let body = &rendered[at + n..];
        conn.respond(stream, status, &pairs, body.is_empty())?;
        if !body.is_empty() {
            conn.send_data(stream, Bytes::copy_from_slice(body), true)?;
        }
        return Ok(());
    }
}

/// What a session needs from the worker while it handles events.
struct Cx<'a, 'g> {
    glue: &'a mut Glue<'g>,
    env: &'a mut Env,
    pool: &'a Pool,
    conn: usize,
    generation: u32,
}

impl Worker {
    /// Make connection `idx` HTTP/2; its buffered input is the start of the preface.
    pub(super) fn start_h2(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let mut sess = H2Session::new(&self.env, c.peer, c.tls.is_some(), Instant::now());
        if self.env.draining {
            sess.shut_down(Instant::now() + self.config.shutdown_timeout);
        }
        c.h2 = Some(Box::new(sess));
        self.drive_h2(idx);
    }

    /// [`Worker::drive`] for an HTTP/2 connection: read, run the codec and the
    /// exchanges, write, until nothing more can happen without an event.
    pub(super) fn drive_h2(&mut self, idx: usize) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut close = false;
        let mut end = false;
        let mut again = false;
        for _ in 0..MAX_ROUNDS {
            let Some(sess) = c.h2.as_mut() else { return };
            let mut full = false;
            let backlog = c.out.len() - c.out_pos;
            if !c.eof && sess.conn.input_len() < READ_AHEAD && backlog <= HIGH_WATERMARK {
                match read_into(&mut c.sock, &mut c.tls, &mut c.inbuf, &mut self.scratch, READ_AHEAD) {
                    Ok(eof) => c.eof = eof,
                    Err(_) => {
                        close = true;
                        break;
                    }
                }
                full = c.inbuf.len() >= READ_AHEAD;
                if !c.inbuf.is_empty() {
                    sess.conn.feed(&c.inbuf);
                    c.inbuf.clear();
                }
                if c.eof {
                    sess.conn.feed_eof();
                }
            }
            let mut cx =
                Cx { glue: &mut glue, env: &mut self.env, pool: &self.pool, conn: idx, generation: c.generation };
            again = sess.step(&mut cx, now);
            let before = c.out.len();
            if c.out.len() - c.out_pos <= HIGH_WATERMARK {
                sess.conn.drain_output(&mut c.out);
            }
            let produced = c.out.len() > before;
            if flush(&mut c.sock, &mut c.tls, &mut c.out, &mut c.out_pos).is_err() {
                close = true;
                break;
            }
            let pending = c.out.len() > c.out_pos || c.tls.as_ref().is_some_and(|t| t.wants_write());
            c.send_deadline = if pending { c.send_deadline.or(Some(now + SEND_TIMEOUT)) } else { None };
            if sess.closed && sess.conn.output_len() == 0 {
                end = !pending;
                break;
            }
            if c.eof && sess.exchanges.is_empty() && sess.conn.output_len() == 0 && !pending {
                close = true;
                break;
            }
            // Go on while the socket had more to read or the output moved
            // and drained (h2 may have been waiting for room).
            if !(full || (produced && !pending)) {
                break;
            }
        }
        if close {
            self.close(idx);
            return;
        }
        if end {
            self.end(idx);
            return;
        }
        if again {
            self.drained.push((idx, c.generation));
        }
        self.arm(idx);
    }

    /// A pool job of an HTTP/2 exchange finished.
    pub(super) fn h2_complete(&mut self, id: ExchangeId, resp: Response) {
        let now = Instant::now();
        let Some(Some(c)) = self.conns.get_mut(id.conn) else { return };
        if c.generation != id.generation {
            return;
        }
        let Some(sess) = c.h2.as_mut() else { return };
        let Some(i) = sess.find(StreamId(id.stream)) else { return };
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut cx =
            Cx { glue: &mut glue, env: &mut self.env, pool: &self.pool, conn: id.conn, generation: id.generation };
        sess.answer(i, resp, &mut cx, now);
        self.drive_h2(id.conn);
    }

    /// The HTTP/2 connection's timer fired: 408 on streams whose body is
    /// late, GOAWAY when idle, the cut after a GOAWAY's deadline.
    pub(super) fn h2_timer(&mut self, idx: usize, now: Instant) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let Some(sess) = c.h2.as_mut() else { return };
        if sess.cut_at.is_some_and(|t| t <= now) {
            sess.cut_at = None;
            sess.conn.abort(Reason::NO_ERROR);
        } else if sess.idle_since.is_some_and(|t| t + self.env.keepalive_timeout <= now) {
            sess.idle_since = None;
            sess.shut_down(now + GOAWAY_GRACE);
        }
        let mut glue = Glue::new(&self.app, self.config, self.record, self.metrics);
        let mut cx = Cx { glue: &mut glue, env: &mut self.env, pool: &self.pool, conn: idx, generation: c.generation };
        while let Some(i) = sess.exchanges.iter().position(|e| e.deadline.is_some_and(|t| t <= now)) {
            sess.fail(i, Error::RequestTimeout, &mut cx, now);
        }
        self.drive_h2(idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_makes_a_connection_http2() {
        assert_eq!(sniff(PREFACE, None), Sniff::H2);
        assert_eq!(sniff(&PREFACE[..10], None), Sniff::Wait);
        assert_eq!(sniff(b"", None), Sniff::Wait);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n", None), Sniff::H1);
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", None), Sniff::H1);
        assert_eq!(sniff(b"", Some(None)), Sniff::Wait);
        assert_eq!(sniff(b"", Some(Some(b"h2"))), Sniff::H2);
        assert_eq!(sniff(PREFACE, Some(Some(b"http/1.1"))), Sniff::H1);
    }

    #[test]
    fn a_rendered_response_loses_its_connection_fields() {
        let mut conn = H2Conn::new(H2Settings::default());
        // Unknown stream: the head parses, the codec refuses the stream.
        let rendered = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi";
        assert!(matches!(
            send_rendered(&mut conn, StreamId(1), rendered),
            Err(crate::http2::H2Error::UnknownStream(_))
        ));
        assert!(send_rendered(&mut conn, StreamId(1), b"garbage").is_err());
    }
}
