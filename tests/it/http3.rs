//! HTTP/3 groundwork: with `[http3] enabled`, the supervisor binds one UDP socket per slot on
//! `http3.listen` (by default the TLS listener's address and port) and keeps it across worker
//! restarts, hands them to a new supervisor on `SIGUSR2` and takes them from systemd
//! (`LISTEN_FDS`, datagram sockets). Nothing serves HTTP/3 yet; the QUIC layer is tested in
//! memory (`src/http3/`), steering over loopback (`supervisor/listen.rs`).

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::tls::tls_server;
use crate::upgrade::{new_supervisor_pid, StopOnDrop};
use crate::util::*;

/// The inodes of the UDP sockets bound to `port` (any address), from `/proc/net/udp{,6}`.
fn udp_inodes(port: u16) -> std::collections::BTreeSet<u64> {
    let mut out = std::collections::BTreeSet::new();
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let bound_port =
                cols.get(1).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            if bound_port == Some(port) {
                if let Some(inode) = cols.get(9).and_then(|i| i.parse().ok()) {
                    out.insert(inode);
                }
            }
        }
    }
    out
}

/// The socket inodes process `pid` holds open.
fn socket_inodes(pid: i32) -> std::collections::BTreeSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Default::default() };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

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

#[test]
fn usr2_hands_the_udp_sockets_to_the_new_supervisor() {
    let (mut server, addr, _pki, _d) = tls_server(2, "", "[http3]\nenabled = true\n");
    server.wait_workers(2, Duration::from_secs(10));
    let before = udp_inodes(addr.port());
    assert_eq!(before.len(), 2, "one UDP socket per slot\n{}", server.log_tail());
    assert!(before.is_subset(&socket_inodes(server.pid())), "the supervisor holds them");
    server.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&server);
    let _stop = StopOnDrop(new_pid);
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "the old supervisor drains: {status:?}\n{}", server.log_tail());
    assert!(eventually(Duration::from_secs(10), || worker_pids(new_pid).len() == 2), "new workers");
    // The same sockets (same inodes), now held by the new supervisor; none closed, none new.
    assert_eq!(udp_inodes(addr.port()), before, "the same UDP sockets\n{}", server.log_tail());
    assert!(before.is_subset(&socket_inodes(new_pid)), "held by the new supervisor");
    let logs = server.logs();
    assert!(logs.contains("2 HTTP/3 UDP socket(s) handed over (LISTEN_FDS)"), "{logs}");
    assert!(!logs.contains("cannot steer"), "{logs}");
}

#[test]
fn a_datagram_socket_from_systemd_is_slot_0s_udp_socket() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // What systemd passes for `ListenStream=` + `ListenDatagram=` with `ReusePort=yes`: both
    // sockets named after the unit.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp");
    let udp = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("udp");
    udp.set_reuse_port(true).expect("SO_REUSEPORT");
    let udp_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    udp.bind(&udp_addr.into()).expect("bind udp");
    let passed = udp_inodes(udp_addr.port());
    assert_eq!(passed.len(), 1);
    let pki = crate::tls::Pki::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = pki.write(dir.path());
    let tls_port = free_port();
    let extra = format!("workers = 2\n{}\n[http3]\nenabled = true\n", crate::tls::tls_toml(tls_port, &cert, &key, ""));
    let cfg = dir.path().join("forkd.toml");
    std::fs::write(&cfg, render_config(&format!("127.0.0.1:{}", free_port()), dir.path(), &extra)).expect("config");
    let log_path = dir.path().join("forkd.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let fds = [tcp.as_raw_fd(), udp.as_raw_fd()];
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["serve", "--config", cfg.to_str().expect("utf-8")])
        .env("LISTEN_FDS", "2")
        .env("LISTEN_FDNAMES", "forkd.socket:forkd.socket")
        .env_remove("LISTEN_PID")
        .env_remove("FORKD_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: fcntl and dup2 are async-signal-safe; in the child only, they move the two
    // sockets out of the way, then to fds 3 and 4 without close-on-exec, as systemd does.
    unsafe {
        cmd.pre_exec(move || {
            use nix::fcntl::{fcntl, FcntlArg};
            let high: Vec<i32> = fds
                .iter()
                .map(|&fd| fcntl(fd, FcntlArg::F_DUPFD(100)))
                .collect::<Result<_, _>>()
                .map_err(std::io::Error::from)?;
            for (i, fd) in high.into_iter().enumerate() {
                nix::unistd::dup2(fd, 3 + i as i32).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn forkd");
    let pid = child.id() as i32;
    let _stop = StopOnDrop(pid);
    drop((tcp, udp));
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(eventually(Duration::from_secs(10), || worker_pids(pid).len() == 2), "2 workers\n{}", logs());
    assert!(eventually(Duration::from_secs(10), || logs().contains("HTTP/3 UDP socket(s) bound on")), "{}", logs());
    // Slot 0 is the passed socket, slot 1 a socket the supervisor added on its port.
    let now = udp_inodes(udp_addr.port());
    assert_eq!(now.len(), 2, "{}", logs());
    assert!(passed.is_subset(&now) && now.is_subset(&socket_inodes(pid)), "{}", logs());
    assert!(logs().contains("1 HTTP/3 UDP socket(s) handed over (LISTEN_FDS)"), "{}", logs());
    assert!(udp_inodes(tls_port).is_empty(), "`http3.listen` does not apply");
    kill_pid(pid, Signal::SIGTERM);
    let _ = child.wait();
}
