//! The protocol a test speaks: `Proto` (HTTP/1.1, h2c, HTTP/3), `Session` (one connection
//! for several requests), and the parity macros `both!` (HTTP/1.1 and h2c) and `protocols!`
//! (HTTP/1.1, h2c and HTTP/3) that run one test body once per protocol. How to reach the
//! server only: no assertion about what it answers.

use std::cell::Cell;
use std::net::SocketAddr;

use super::http2::H2Client;
use super::http3::{h3_exchange, H3Client};
use super::*;

/// The protocol a test speaks to the server: HTTP/1.1, HTTP/2 in clear text with prior
/// knowledge (h2c), or HTTP/3 (QUIC on the server's TLS port). [`Server::call`] (and `api`,
/// `get`, `login`, `signup`, `expect_bodyless`, `try_get`, `sse`, …) speak the server's
/// [`Server::proto`]; every request goes on a fresh connection (TCP or QUIC) of that protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2c,
    H3,
}

thread_local! {
    /// Set while a `protocols!` test runs its HTTP/3 case: every server started on this
    /// thread then serves HTTP/3 too.
    static HTTP3_FOR_NEW_SERVERS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `test` with HTTP/3 on for every server it starts on this thread (as
/// [`ServerBuilder::http3`] does), so a test body written for any [`Proto`] needs no
/// protocol-specific set-up.
pub fn with_http3<T>(test: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            HTTP3_FOR_NEW_SERVERS.with(|on| on.set(false));
        }
    }
    HTTP3_FOR_NEW_SERVERS.with(|on| on.set(true));
    let _reset = Reset;
    test()
}

/// Whether servers started now on this thread serve HTTP/3 (inside [`with_http3`]).
pub(super) fn http3_for_new_servers() -> bool {
    HTTP3_FOR_NEW_SERVERS.with(Cell::get)
}

impl Server {
    /// This server, spoken to over `p` by the helpers. HTTP/3 needs a server started with
    /// it ([`ServerBuilder::http3`], or inside [`with_http3`]).
    pub fn on(mut self, p: Proto) -> Server {
        self.set_proto(p);
        self
    }

    pub fn set_proto(&mut self, p: Proto) {
        assert!(
            p != Proto::H3 || self.h3.is_some(),
            "this server was started without HTTP/3: start it with ServerBuilder::http3, or under protocols!"
        );
        self.proto = p;
    }

    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// A fresh h2c connection (prior knowledge) to this server.
    pub fn h2c(&self) -> H2Client {
        H2Client::h2c(self.addr)
    }

    /// A fresh HTTP/3 connection to this server, its handshake done (panics when the
    /// server has no HTTP/3 or the handshake fails).
    pub fn h3(&self) -> H3Client {
        self.try_h3(IO_TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "{e}
--- server log (tail) ---
{}",
                self.log_tail()
            )
        })
    }

    /// Like [`Server::h3`], with `Err` instead of a panic when the handshake does not
    /// complete within `timeout`.
    pub fn try_h3(&self, timeout: Duration) -> Result<H3Client, String> {
        let h3 = self.h3.as_ref().ok_or("this server was started without HTTP/3")?;
        H3Client::try_connect(h3.addr, &h3.client, timeout)
    }

    /// The UDP address of this server's HTTP/3 (`None` when it has none).
    pub fn h3_addr(&self) -> Option<SocketAddr> {
        self.h3.as_ref().map(|h| h.addr)
    }

    /// A fresh connection of this server's protocol, for several requests.
    pub fn session(&self) -> Session {
        match self.proto {
            Proto::H1 => Session::H1(self.conn()),
            Proto::H2c => Session::H2(Box::new(self.h2c())),
            Proto::H3 => Session::H3(Box::new(self.h3())),
        }
    }
}

/// One connection for several requests in turn: an HTTP/1.1 keep-alive connection, one
/// HTTP/2 connection or one HTTP/3 connection (a stream per request), as the server's
/// [`Proto`] says.
pub enum Session {
    H1(Conn),
    H2(Box<H2Client>),
    H3(Box<H3Client>),
}

impl Session {
    /// One request and its whole response (HEAD: no body read over HTTP/1.1; over HTTP/2
    /// and HTTP/3 the stream must end without DATA). Panics when none comes.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        match self {
            Session::H1(c) => {
                c.send(&request(method, path, headers, body));
                if method == "HEAD" {
                    c.read_head_response()
                } else {
                    c.read_response()
                }
            }
            Session::H2(_) | Session::H3(_) => self
                .try_request(method, path, headers, body, IO_TIMEOUT)
                .unwrap_or_else(|e| panic!("{method} {path}: {e}")),
        }
    }

    /// One request and its whole response, `Err` when none came within `timeout` (the
    /// connection closed, the stream was reset, or the time ran out).
    pub fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, String> {
        match self {
            Session::H1(c) => {
                c.set_timeout(timeout);
                c.try_write(&request(method, path, headers, body)).map_err(|e| format!("write: {e}"))?;
                c.try_read_response(method == "HEAD").map_err(|e| e.to_string())
            }
            Session::H2(c) => h2_exchange(c, method, path, headers, body, timeout).map_err(|e| format!("h2c {e}")),
            Session::H3(c) => h3_exchange(c, method, path, headers, body, timeout).map_err(|e| format!("HTTP/3 {e}")),
        }
    }

    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }
}

/// `both!(name)` runs `fn name(p: Proto)` as two tests, `name::h1` and `name::h2c`;
/// `both!(name, h2c_ignore = "why")` marks the h2c one `#[ignore]` (a known forkd bug).
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[test]
            fn h1() {
                super::$name($crate::util::Proto::H1)
            }
            #[test]
            fn h2c() {
                super::$name($crate::util::Proto::H2c)
            }
        }
    };
    ($name:ident, h2c_ignore = $why:literal) => {
        mod $name {
            #[test]
            fn h1() {
                super::$name($crate::util::Proto::H1)
            }
            #[test]
            #[ignore = $why]
            fn h2c() {
                super::$name($crate::util::Proto::H2c)
            }
        }
    };
}
pub(crate) use both;

/// `protocols!(name)` runs `fn name(p: Proto)` as three tests, `name::h1`, `name::h2c` and
/// `name::h3`; the HTTP/3 one runs under [`with_http3`], so the servers it starts serve
/// HTTP/3 (on a TLS port with a throw-away certificate) and `.on(p)` can speak it.
macro_rules! protocols {
    ($name:ident) => {
        mod $name {
            #[test]
            fn h1() {
                super::$name($crate::util::Proto::H1)
            }
            #[test]
            fn h2c() {
                super::$name($crate::util::Proto::H2c)
            }
            #[test]
            fn h3() {
                $crate::util::with_http3(|| super::$name($crate::util::Proto::H3))
            }
        }
    };
}
pub(crate) use protocols;
