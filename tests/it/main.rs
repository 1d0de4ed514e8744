//! Black-box integration tests for `forkd`: the real binary, real sockets, real processes.
//!
//! Each test starts its own server (`util::Server`) in a temp dir on a free port, so tests
//! run in parallel without interfering. Everything is bounded in time.

mod drainload;
mod keepalive;
mod util;

/// The harness's HTTP/2 and HTTP/3 clients under the names the tests import them by.
use util::http2 as h2util;
use util::http3 as h3client;

mod cli;
mod docs_examples;
mod endpoints;
mod flow;
mod headers;
mod http1;
mod install;
mod limits;
mod liveness;
mod logging;
mod process;
mod start_errors;

mod auth;
mod cluster;
mod cors;
mod identity;
mod migrate;
mod posts;
mod resources;
mod store;
mod users;
mod versioning;

mod browser;
mod changes;
mod early_hints;
mod pages;
mod proxy;
mod proxy_protocol;
mod ratelimit;
mod redis;
mod sse;
mod websocket;
mod ws_handshake;

mod download;

mod upstream;

mod chat;
mod homepage;

mod apidocs;
mod compression;
mod metrics;
mod openapi;
mod panics;

mod drain;
mod instance;
mod reload;
mod upgrade;

mod acme;
mod tls;

mod h3;
mod h3drain;
mod h3limits;
mod http3;

mod h2config;
mod h2drain;
mod h2flood;
mod h2idle;
mod h2prio;
mod h2stall;
mod h2ws;
mod http2;
