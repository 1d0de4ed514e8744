//! The protocol a test speaks: `Proto` (HTTP/1.1, h2c, HTTP/3), `Session` (one connection
//! for several requests), and the parity macros `both!` (HTTP/1.1 and h2c) and `protocols!`
//! (HTTP/1.1, h2c and HTTP/3) that run one test body once per protocol.

use super::http2::H2Client;
use super::*;

/// The protocol a test speaks to the server: HTTP/1.1, or HTTP/2 in clear text with prior
/// knowledge (h2c). [`Server::call`] (and `api`, `get`, `login`, `signup`, `expect_bodyless`,
/// `try_get`, `sse`, …) speak the server's [`Server::proto`]; every request of an h2c server
/// goes on a fresh HTTP/2 connection, as every HTTP/1.1 one goes on a fresh TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2c,
}

impl Server {
    /// This server, spoken to over `p` by the helpers.
    pub fn on(mut self, p: Proto) -> Server {
        self.proto = p;
        self
    }

    pub fn set_proto(&mut self, p: Proto) {
        self.proto = p;
    }

    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// A fresh h2c connection (prior knowledge) to this server.
    pub fn h2c(&self) -> H2Client {
        H2Client::h2c(self.addr)
    }
}

/// One connection for several requests in turn: an HTTP/1.1 keep-alive connection, or one
/// HTTP/2 connection (a stream per request), as the server's [`Proto`] says.
pub enum Session {
    H1(Conn),
    H2(Box<H2Client>),
}

impl Session {
    /// One request and its whole response (HEAD: no body read over HTTP/1.1; over HTTP/2
    /// the stream must end without DATA).
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
            Session::H2(c) => {
                h2_exchange(c, method, path, headers, body, IO_TIMEOUT).unwrap_or_else(|e| panic!("h2c {e}"))
            }
        }
    }

    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }
}

impl Server {
    /// A new connection for several requests, in this server's protocol.
    pub fn session(&self) -> Session {
        match self.proto {
            Proto::H1 => Session::H1(self.conn()),
            Proto::H2c => Session::H2(Box::new(self.h2c())),
        }
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
