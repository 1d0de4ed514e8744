//! forkd: a pre-forked, multi-process HTTP/1.1, HTTP/2 and HTTP/3 service.
//!
//! A supervisor ([`supervisor`]) binds one `SO_REUSEPORT` socket per worker
//! slot and forks single-threaded workers ([`worker`]), each running one mio
//! event loop plus a small thread pool. Bytes become requests in the codecs,
//! each socket-free: [`http1`], [`http2`] and [`http3`] (over QUIC), under the
//! protocol-neutral request, reply and service of [`http`]; one exchange engine
//! (`exchange`), which the worker drives, serves all three (`layering` checks that the
//! engine never names the worker). Requests become responses in [`app`]
//! (declared resources in [`resources`], stored by [`store`]); every error is
//! rendered by [`error`]. State shared across workers lives in [`shm`]; every `unsafe`
//! operation lives in [`sys`]. See `docs/architecture.md`.

#![deny(missing_docs)]

pub mod acme;
pub mod app;
pub mod auth;
pub mod bus;
pub mod cli;
pub mod config;
pub mod cpu;
pub mod error;
pub(crate) mod exchange;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod http1;
pub mod http2;
pub mod http3;
#[cfg(test)]
mod layering;
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
