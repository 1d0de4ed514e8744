//! Test harness: start the real `forkd` binary in a temp dir on a free port, speak HTTP/1.1,
//! HTTP/2 or HTTP/3 to it, and inspect its processes and logs.
//!
//! Everything here is bounded in time: connects, reads and waits all carry a timeout, and
//! a failure reports what was expected, what came, and the tail of the server's log.
//!
//! This file holds the shared bounds, polling and the `ensure!` macros; each concern has its
//! own file, re-exported here so a test needs only `use crate::util::*`:
//!
//! | file | holds |
//! |---|---|
//! | `server.rs` | `ServerBuilder`, `Server` (start, stop, logs, probes), `render_config` |
//! | `proto.rs` | `Proto`, `Session` and the `both!` / `protocols!` parity macros |
//! | `http1.rs` | the raw HTTP/1.1 client: `request`, `Response`, `Conn`, `send_raw`, `Hammer` |
//! | `http2.rs` | the blocking HTTP/2 client `H2Client`, `h2_exchange`, frame-level `wire` |
//! | `http3.rs` | the blocking HTTP/3 client `H3Client` (quinn-proto over UDP), `h3_exchange` |
//! | `tls.rs` | a test PKI (`Pki`), TLS server configs, a rustls HTTPS client |
//! | `api.rs` | users, posts and auth helpers, JWT forging, `Set-Cookie` |
//! | `sse.rs` | `SseStream`, `SseEvent`: event streams over every protocol |
//! | `ws.rs` | `Ws`: a WebSocket (RFC 6455) client |
//! | `workers.rs` | per-worker views: `/_debug/streams`, connections on a chosen worker |
//! | `proc.rs` | processes: worker pids, signals, memory, child exits |
//! | `cli.rs` | running `forkd` subcommands |
//! | `net.rs` | TCP socket states from `/proc/net/tcp`, curl's abilities |
//! | `check.rs` | small validators: UUIDs, dates, base64, JSON error bodies |
//!
//! It must not hold tests of the server: only the harness's self-tests.

#![allow(dead_code)]

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

pub mod api;
pub mod check;
pub mod cli;
pub mod http1;
pub mod http2;
pub mod http3;
pub mod net;
pub mod proc;
pub mod proto;
pub mod server;
pub mod sse;
pub mod tls;
pub mod workers;
pub mod ws;

pub use api::*;
pub use check::*;
pub use cli::*;
pub use http1::*;
pub use http2::{h2_exchange, h2_response};
pub use net::*;
pub use proc::*;
pub use proto::*;
pub use server::*;
pub use sse::*;
pub use tls::tls_section;
pub use workers::*;
pub use ws::*;

/// Default bound for one connect / one read.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for the server to answer `/health` after spawn.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_forkd")
}

// ---------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------

/// Polls `f` every 20 ms until it returns true or `timeout` passes. Returns the last result.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Like [`eventually`] but for a value: returns the first `Some`.
pub fn eventually_some<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on 127.0.0.1 (bind :0, read, drop), never one this test process has
/// handed out before: once dropped, the kernel may give the same port to the next bind, so
/// two calls for one server (its `listen` and its `[tls] listen`) could otherwise collide.
/// A race with another process is still possible; `Server::start` retries on "address in use".
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = 0;
    for _ in 0..1000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        port = l.local_addr().expect("local_addr").port();
        if !given.contains(&port) {
            break;
        }
    }
    given.push(port);
    port
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Like `assert!`, but the failure message ends with the server's log tail.
/// `ensure!(server, cond, "fmt", args…)`.
macro_rules! ensure {
    ($srv:expr, $cond:expr, $($arg:tt)+) => {
        let ok: bool = $cond;
        if !ok {
            panic!("{}\n--- server log (tail) ---\n{}", format!($($arg)+), $srv.log_tail());
        }
    };
}
pub(crate) use ensure;

/// Like `assert_eq!` (prints expected vs actual), plus the server's log tail.
/// `ensure_eq!(server, actual, expected, "fmt", args…)`.
macro_rules! ensure_eq {
    ($srv:expr, $actual:expr, $expected:expr, $($arg:tt)+) => {
        match (&$actual, &$expected) {
            (a, e) => {
                if a != e {
                    panic!(
                        "{}\n  expected: {:?}\n  actual:   {:?}\n--- server log (tail) ---\n{}",
                        format!($($arg)+), e, a, $srv.log_tail()
                    );
                }
            }
        }
    };
}
pub(crate) use ensure_eq;
