//! HTTP, protocol-neutral: the request handlers see ([`request`], its fields [`fields`], who
//! sent it behind proxies [`client`], the content coding its `Accept-Encoding` allows
//! [`encoding`]), the
//! reply they return ([`reply`], [`response`]), the key of one exchange
//! ([`exchange`]), the service every codec hands requests to ([`service`]),
//! the target and `Host` rules ([`target`]), the headers every response
//! carries ([`headers`], [`hints`]) and event-stream framing ([`sse`]).
//!
//! The codecs that put these on the wire are `crate::http1` (HTTP/1.1),
//! `crate::http2` and `crate::http3`. Nothing here writes protocol framing, touches a socket, a
//! poll or a route.

pub mod client;
pub mod encoding;
pub mod exchange;
pub mod fields;
pub mod headers;
pub mod hints;
pub mod reply;
pub mod request;
pub mod response;
pub mod service;
pub mod sse;
pub mod target;
