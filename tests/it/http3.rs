//! HTTP/3 groundwork: with `[http3] enabled`, the supervisor binds one UDP socket per slot on
//! `http3.listen` (by default the TLS listener's address and port) and keeps it across worker
//! restarts. Nothing serves HTTP/3 yet; the QUIC layer is tested in memory (`src/http3/`).

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::tls::tls_server;
use crate::util::*;

/// Whether some socket holds UDP `addr` (a bind without `SO_REUSEPORT` is refused).
fn udp_bound(addr: SocketAddr) -> bool {
    matches!(UdpSocket::bind(addr), Err(e) if e.kind() == ErrorKind::AddrInUse)
}

#[test]
fn the_udp_port_of_the_tls_listener_is_bound_per_slot_and_kept() {
    let (server, addr, _pki, _d) = tls_server(2, "", "[http3]\nenabled = true\n");
    let workers = server.wait_workers(2, Duration::from_secs(10));
    assert_eq!(workers.len(), 2);
    assert!(udp_bound(addr), "UDP {addr} is bound\n{}", server.log_tail());
    let line = server.wait_log_line(Duration::from_secs(10), |l| l.contains("HTTP/3 UDP socket(s) bound on"));
    assert!(line.contains(&addr.to_string()), "{line}");
    assert!(!server.log_tail().contains("cannot steer"), "the steering program is attached\n{}", server.log_tail());
    // The supervisor holds the sockets: a worker's death leaves the port bound.
    kill_pid(workers[0], Signal::SIGKILL);
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = server.workers();
            now.len() == 2 && !now.contains(&workers[0])
        }),
        "a replacement worker\n{}",
        server.log_tail()
    );
    assert!(udp_bound(addr), "still bound after a worker restart");
}

#[test]
fn without_http3_the_udp_port_stays_free() {
    let (server, addr, _pki, _d) = tls_server(1, "", "");
    server.assert_healthy();
    assert!(!udp_bound(addr), "nothing binds UDP {addr} with HTTP/3 off");
}

#[test]
fn hup_refuses_to_turn_http3_on() {
    let (server, addr, _pki, _d) = tls_server(1, "", "[http3]\nenabled = false\n");
    let before = server.wait_workers(1, Duration::from_secs(10));
    let text = server.config_text.replace("enabled = false", "enabled = true");
    std::fs::write(server.config_path(), text).expect("write config");
    server.signal(Signal::SIGHUP);
    let line = server.wait_log_line(Duration::from_secs(10), |l| l.contains("reload refused"));
    assert!(line.contains("HTTP/3 address changed (off → "), "{line}");
    assert_eq!(server.workers(), before, "the workers stay");
    assert!(!udp_bound(addr));
}
