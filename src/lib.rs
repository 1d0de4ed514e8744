//! forkd: a pre-forked, multi-process HTTP/1.1 service.
//!
//! A supervisor ([`supervisor`]) binds one `SO_REUSEPORT` socket per worker
//! slot and forks single-threaded workers ([`worker`]), each running one mio
//! event loop plus a small thread pool. Bytes become requests in [`http`]
//! (HTTP/2 framing, socket-free, in [`http2`]; HTTP/3 over QUIC, socket-free and not yet
//! served, in [`http3`]);
//! requests become responses in [`app`]; every error is rendered by
//! [`error`]. State shared across workers lives in [`shm`]; every `unsafe`
//! operation lives in [`sys`]. See `docs/architecture.md`.

#![deny(missing_docs)]

pub mod app;
pub mod auth;
pub mod bus;
pub mod cli;
pub mod config;
pub mod cpu;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod http1;
pub mod http2;
pub mod http3;
pub mod logging;
pub mod net;
pub mod proto;
pub mod redis;
pub mod resources;
pub mod shm;
pub mod store;
pub mod supervisor;
pub mod sys;
pub mod tls;
pub mod upstream;
pub mod worker;
