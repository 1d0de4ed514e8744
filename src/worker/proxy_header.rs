//! The PROXY protocol on a listener with `proxy_protocol = true` (the plain one, the TLS one,
//! or both): who may connect, and the header read before anything else.
//!
//! A connection's TCP peer must be in `[proxy] trusted`, or it is closed as soon as it is
//! accepted: the header is a claim about who the client is, and only a trusted balancer may
//! make it. A trusted peer's connection starts in [`ConnState::ProxyHeader`]: its socket is
//! *peeked* until a whole header is there (within the header timeout), then exactly the
//! header's bytes are read off, so what follows (a ClientHello, an HTTP/1.1 request, the
//! HTTP/2 preface) is still in the socket for the connection to read as it would without the
//! option. The header's client replaces the TCP peer for everything downstream (the rate
//! limits, `[proxy] trusted` on forwarded fields, the access log); a `LOCAL` or `UNKNOWN`
//! header keeps the TCP peer. No header, a bad one, or none in time: the connection is closed
//! without a response (as nginx does), logged at debug level and counted
//! (`forkd_proxy_protocol_refused_total`), as is a refused peer.
//!
//! Framing of the header is `crate::proto::proxy_protocol`'s; this file only moves bytes and
//! changes the connection's state.

use std::io::{self, Read};
use std::net::IpAddr;
use std::time::Instant;

use super::conn::{ConnState, H1};
use super::Worker;
use crate::proto::proxy_protocol::{parse, Parse, MAX_HEADER};

impl Worker {
    /// Whether a connection accepted from `peer` on the plain (`tls` false) or the TLS
    /// listener may be served: always without `proxy_protocol`; with it, only from a trusted
    /// peer. Returns `Some(true)` when the connection must start with a header.
    pub(super) fn proxy_admits(&self, tls: bool, peer: IpAddr) -> Option<bool> {
        let on = if tls { self.config.tls.proxy_protocol } else { self.config.proxy_protocol };
        if !on {
            return Some(false);
        }
        let peer = peer.to_canonical();
        if self.config.proxy.trusted.iter().any(|net| net.contains(peer)) {
            Some(true)
        } else {
            log::debug!("PROXY protocol: {peer} is not in proxy.trusted: closed");
            self.metrics.count_proxy_refused();
            None
        }
    }

    /// [`Worker::drive`] for a connection awaiting its header: peek, and once a whole header
    /// is in the socket, read it off and go on as HTTP (or TLS) from the header's client.
    pub(super) fn drive_proxy_header(&mut self, idx: usize) {
        let Some(Some(c)) = self.conns.get_mut(idx) else { return };
        let cap = MAX_HEADER.min(self.scratch.len());
        let peeked = loop {
            match c.io.sock.peek(&mut self.scratch[..cap]) {
                Ok(0) => break Err("the peer closed before a whole header".into()),
                Ok(n) => break Ok(parse(&self.scratch[..n])),
                // Nothing yet (or only a prefix, peeked before): a new edge comes with more.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(Parse::Incomplete),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e.to_string()),
            }
        };
        let refused = match peeked {
            Ok(Parse::Incomplete) => {
                self.arm(idx);
                return;
            }
            Ok(Parse::Done(header)) => Ok(header),
            Ok(Parse::Invalid(e)) => Err(e.to_string()),
            Err(e) => Err(e),
        };
        let header = match refused {
            Ok(header) => header,
            Err(why) => {
                log::debug!("PROXY protocol from {}: {why}: closed", c.peer);
                self.metrics.count_proxy_refused();
                self.close(idx);
                return;
            }
        };
        // The header's bytes are in the socket (peeked): read exactly them, no more.
        let mut left = header.len;
        while left > 0 {
            match c.io.sock.read(&mut self.scratch[..left]) {
                Ok(0) => break,
                Ok(n) => left -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if left > 0 {
            self.metrics.count_proxy_refused();
            self.close(idx);
            return;
        }
        if let Some(source) = header.source {
            c.peer = source.ip().to_canonical();
        }
        let secure = c.io.tls.is_some();
        c.state = ConnState::Http1(H1::fresh(
            idx,
            c.generation,
            c.peer,
            secure,
            self.h2.is_some(),
            &self.env,
            Instant::now(),
        ));
        c.timer_at = None;
        self.drive(idx);
    }
}
