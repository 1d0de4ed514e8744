//! The network as the kernel sees it: TCP socket states from `/proc/net/tcp{,6}` (to find
//! connections the server left in CLOSE-WAIT), and whether curl speaks HTTP/2. It only
//! reads: no socket is opened or closed here.

use std::fs;
use std::process::Command;

use super::*;

/// `/proc/net/tcp`'s code for CLOSE-WAIT: the peer closed, this side has not.
pub const TCP_CLOSE_WAIT: u8 = 0x08;

/// One line of `/proc/net/tcp{,6}`: the socket's ports, state and queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEntry {
    pub local_port: u16,
    pub remote_port: u16,
    pub state: u8,
    /// Bytes sent and not acknowledged.
    pub tx_queue: u64,
    /// Bytes received and not read by the process.
    pub rx_queue: u64,
}

/// Every TCP socket of this network namespace (IPv4 and IPv6 tables).
pub fn tcp_entries() -> Vec<TcpEntry> {
    let port = |a: &str| a.rsplit(':').next().and_then(|h| u16::from_str_radix(h, 16).ok());
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(st), Some(queues)) = (f.get(1), f.get(2), f.get(3), f.get(4)) else {
                continue;
            };
            let (tx, rx) = queues.split_once(':').unwrap_or(("0", "0"));
            let (Some(local_port), Some(remote_port), Ok(state)) =
                (port(local), port(remote), u8::from_str_radix(st, 16))
            else {
                continue;
            };
            out.push(TcpEntry {
                local_port,
                remote_port,
                state,
                tx_queue: u64::from_str_radix(tx, 16).unwrap_or(0),
                rx_queue: u64::from_str_radix(rx, 16).unwrap_or(0),
            });
        }
    }
    out
}

/// How many sockets on this machine have local port `port` and TCP state `state`.
/// The server's accepted sockets have its port as local port.
pub fn tcp_sockets(port: u16, state: u8) -> usize {
    tcp_entries().iter().filter(|e| e.local_port == port && e.state == state).count()
}

/// Waits until none of the server's sockets is in CLOSE-WAIT (the server closed every
/// connection whose peer closed); panics with the count and the log otherwise. Returns how
/// long that took.
pub fn assert_no_close_wait(s: &Server, within: Duration, what: &str) -> Duration {
    let t = Instant::now();
    let port = s.addr().port();
    let ok = eventually(within, || tcp_sockets(port, TCP_CLOSE_WAIT) == 0);
    assert!(
        ok,
        "{what}: {} server socket(s) still in CLOSE-WAIT after {within:?}\nlog:\n{}",
        tcp_sockets(port, TCP_CLOSE_WAIT),
        s.log_tail()
    );
    t.elapsed()
}

/// Whether the installed `curl` speaks HTTP/2 (false when there is no curl).
pub fn curl_has_http2() -> bool {
    Command::new("curl")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("HTTP2"))
        .unwrap_or(false)
}
