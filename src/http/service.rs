//! What every codec (HTTP/1.1, HTTP/2, HTTP/3) shares with the worker: the
//! [`Service`] a connection hands complete requests to, the [`Finished`]
//! record of an answered exchange (access log, metrics), the per-worker
//! [`Env`] (limits, timeouts, common headers, draining) and the output
//! [`HIGH_WATERMARK`]. No framing lives here, and nothing touches a socket.

use std::time::Duration;

use super::headers::Common;
use super::reply::Reply;
use super::request::Request;

/// Above this many queued output bytes the connection stops producing.
pub const HIGH_WATERMARK: usize = 64 * 1024;

/// The application side, as seen by the connection.
pub trait Service {
    /// Answer one request.
    fn call(&mut self, req: &Request<'_>) -> Reply;
    /// A small label for the request [`Service::call`] just answered (the
    /// app's route slot, for metrics); the connection keeps it and hands it
    /// back in [`Finished::label`]. A request that never reached `call` (a
    /// protocol error) is labelled 0.
    fn label(&self) -> u16 {
        0
    }
    /// The client of the request [`Service::call`] just answered, as the service decided it
    /// (behind trusted proxies, not always the peer); the connection keeps it and hands it
    /// back in [`Finished::client`]. `None`: not called, or not known.
    fn client(&self) -> Option<std::net::IpAddr> {
        None
    }
    /// Whether [`Service::finished`] reads the request's target, `User-Agent` and `Referer`
    /// (what the access line quotes). When it does not, a connection keeps none of them past
    /// the head, and [`Finished`] carries an empty target and no agent or referer. By
    /// default, while the access log is on.
    fn quotes(&self) -> bool {
        crate::logging::access_on()
    }
    /// One request/response exchange finished (the access log).
    fn finished(&mut self, done: &Finished<'_>);
}

/// A finished exchange, for the access log.
pub struct Finished<'a> {
    /// Method name (`-` when the request line was unreadable).
    pub method: &'a str,
    /// Request target as received (empty when [`Service::quotes`] said no).
    pub target: &'a [u8],
    /// Status sent.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: usize,
    /// Time from the first byte of the head to the response.
    pub elapsed: Duration,
    /// The request id sent.
    pub request_id: &'a [u8],
    /// What [`Service::label`] said for this request (0 when not called).
    pub label: u16,
    /// What [`Service::client`] said for this request (`None` when not called).
    pub client: Option<std::net::IpAddr>,
    /// The protocol the exchange was spoken in.
    pub protocol: Protocol,
    /// The connection's TLS version (`TLSv1.3`, `TLSv1.2`, as nginx's `$ssl_protocol`);
    /// `None` over plain TCP (or before the handshake finished).
    pub tls: Option<&'static str>,
    /// The request's `User-Agent`, as received (`None`: absent, or not read yet).
    pub user_agent: Option<&'a [u8]>,
    /// The request's `Referer`, as received (`None`: absent, or not read yet).
    pub referer: Option<&'a [u8]>,
}

/// The protocol of an exchange, named as nginx's `$server_protocol` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `HTTP/1.0`
    Http10,
    /// `HTTP/1.1`
    Http11,
    /// `HTTP/2.0`
    Http2,
    /// `HTTP/3.0`
    Http3,
}

impl Protocol {
    /// `HTTP/1.0`, `HTTP/1.1`, `HTTP/2.0` or `HTTP/3.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http10 => "HTTP/1.0",
            Protocol::Http11 => "HTTP/1.1",
            Protocol::Http2 => "HTTP/2.0",
            Protocol::Http3 => "HTTP/3.0",
        }
    }
}

/// Per-worker settings and header state every connection shares.
pub struct Env {
    /// Common headers (Date, CSP nonce, security block).
    pub common: Common,
    /// `limits.max_header_bytes`.
    pub max_head: usize,
    /// `limits.json_body_bytes`: every request body's limit.
    pub max_body: u64,
    /// `limits.header_timeout_ms`: the whole head, from its first byte.
    pub header_timeout: Duration,
    /// `limits.body_timeout_ms`: the whole body, from the end of the head.
    pub body_timeout: Duration,
    /// `limits.keepalive_timeout_ms`.
    pub keepalive_timeout: Duration,
    /// Development mode (`stack` in 500s).
    pub development: bool,
    /// The worker is draining: every response closes its connection.
    pub draining: bool,
    /// `Alt-Svc` for responses over TLS when HTTP/3 is on: the app adds it to what it
    /// answers; the codecs add it to the errors they answer themselves (400, 408, 413, 431).
    pub alt_svc: Option<&'static str>,
}

impl Env {
    /// Adds `Alt-Svc` to an error a codec answers by itself on a connection (`secure`: over
    /// TLS), as the app does to its own answers.
    pub fn announce(&self, resp: &mut super::response::Response, secure: bool) {
        if let (true, Some(v)) = (secure, self.alt_svc) {
            resp.header("Alt-Svc", v);
        }
    }

    /// The environment the socket-free unit tests run codecs and sessions in: a 1 KiB head
    /// limit, a 16-byte body limit, 1 s / 3 s / 5 s header, body and keep-alive timeouts.
    #[cfg(test)]
    pub fn testing() -> Env {
        use std::time::Duration;
        Env {
            common: super::headers::Common::new(false),
            max_head: 1024,
            max_body: 16,
            header_timeout: Duration::from_secs(1),
            body_timeout: Duration::from_secs(3),
            keepalive_timeout: Duration::from_secs(5),
            development: false,
            draining: false,
            alt_svc: None,
        }
    }
}
