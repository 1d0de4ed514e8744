//! HTTP/1.1: parsing, bodies, the per-connection state machine, responses
//! and the headers every response carries.
//!
//! This layer turns bytes into [`request::Request`]s and
//! [`response::Response`]s into bytes. It never touches a socket, a poll or
//! a route: the worker moves the bytes, the app answers the requests.

pub mod body;
pub mod conn;
pub mod headers;
pub mod hints;
pub mod parse;
pub mod request;
pub mod response;
pub mod sse;
