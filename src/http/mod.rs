//! HTTP: the protocol-neutral request and reply ([`request`], [`reply`],
//! [`response`]'s `Response`), and the HTTP/1.1 codec: parsing, bodies, the
//! per-connection state machine ([`conn`]), response writing and all body
//! framing, and the headers every response carries.
//!
//! This layer turns bytes into [`request::Request`]s and
//! [`reply::Reply`]s into bytes. It never touches a socket, a poll or
//! a route: the worker moves the bytes, the app answers the requests.

pub mod body;
pub mod conn;
pub mod exchange;
pub mod headers;
pub mod hints;
pub mod parse;
pub mod reply;
pub mod request;
pub mod response;
pub mod sse;
