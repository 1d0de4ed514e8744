//! TLS on `tls.listen`: the certificate and key checked by `check-config` and at start,
//! HTTPS requests through a rustls client (and curl, when installed), handshakes that fail
//! or stall. Each test makes its own CA and server certificate (rcgen).

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::util::tls::{client_config, https_get, tls_server, tls_toml, Pki};
use crate::util::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("forkd-tls-").tempdir().expect("tempdir")
}

#[test]
fn check_config_accepts_a_matching_pair() {
    let d = tmp();
    let (c, k) = Pki::new().write(d.path());
    let port = free_port();
    let out = check_config(d.path(), &tls_toml(port, &c, &k, ""));
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.contains(&format!("127.0.0.1:{port} (TLS)")), "{out:?}");
}

#[test]
fn check_config_refuses_bad_pairs() {
    let d = tmp();
    let (c, k) = Pki::new().write(d.path());
    let other = d.path().join("other");
    fs::create_dir(&other).expect("mkdir");
    let (_, other_key) = Pki::new().write(&other);
    let garbage = d.path().join("garbage.pem");
    fs::write(&garbage, "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").expect("write");
    let missing = d.path().join("missing.pem");
    let cases = [
        (c.clone(), other_key.clone(), "is not the private key of the certificate"),
        (missing.clone(), k.clone(), "cannot read it"),
        (c.clone(), missing.clone(), "cannot read it"),
        (garbage.clone(), k.clone(), "tls.cert_file"),
        (k.clone(), k.clone(), "no certificate"),
        (c.clone(), c.clone(), "no private key"),
    ];
    for (cert, key, want) in cases {
        let out = check_config(d.path(), &tls_toml(free_port(), &cert, &key, ""));
        assert_eq!(out.code(), Some(2), "{want}: {out:?}");
        assert!(out.stderr.contains(want), "{want}: {out:?}");
    }
    // `listen` without the files; `redirect_http` without `listen`.
    let out = check_config(d.path(), "public_origin = \"https://localhost\"\n[tls]\nlisten = \"127.0.0.1:1\"\n");
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("tls.cert_file is required when tls.listen is set (or set tls.acme.directory)"),
        "{out:?}"
    );
    let out = check_config(d.path(), "[tls]\nredirect_http = true\n");
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("tls.redirect_http = true needs tls.listen"), "{out:?}");
}

#[test]
fn serve_with_a_mismatched_pair_exits_2_without_listening() {
    let d = tmp();
    let (c, _) = Pki::new().write(d.path());
    let other = d.path().join("other");
    fs::create_dir(&other).expect("mkdir");
    let (_, other_key) = Pki::new().write(&other);
    let (port, tls_port) = (free_port(), free_port());
    let text =
        render_config(&format!("127.0.0.1:{port}"), &d.path().join("data"), &tls_toml(tls_port, &c, &other_key, ""));
    let path = d.path().join("forkd.toml");
    fs::write(&path, text).expect("write config");
    let t = Instant::now();
    let out = run_forkd(d.path(), &["serve", "--config", path.to_str().expect("utf-8")], &[]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("is not the private key of the certificate"), "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    for p in [port, tls_port] {
        let addr = format!("127.0.0.1:{p}").parse().expect("addr");
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "port {p} listens");
    }
}

#[test]
fn https_serves_the_same_requests_as_http() {
    let (server, addr, pki, _d) = tls_server(1, "", "");
    let config = client_config(&pki, rustls::DEFAULT_VERSIONS);
    let r = https_get(addr, &config, "/health");
    assert_eq!(r.status, 200, "{}\n{}", r.head, server.log_tail());
    assert_eq!(r.alpn.as_deref(), Some(&b"http/1.1"[..]), "ALPN http/1.1");
    let plain = server.get("/health");
    assert_eq!(plain.status, 200);
    assert_eq!(plain.body_str(), r.body, "the same answer on both listeners");
    // Every route: a 404 envelope, the same headers.
    let missing = https_get(addr, &config, "/nope");
    assert_eq!(missing.status, 404, "{}", missing.head);
    assert!(missing.head.to_ascii_lowercase().contains("strict-transport-security"), "{}", missing.head);
    // TLS 1.2 works too.
    let tls12 = client_config(&pki, &[&rustls::version::TLS12]);
    assert_eq!(https_get(addr, &tls12, "/health").status, 200);
    // Keep-alive: two requests on one TLS connection.
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(Arc::clone(&config), name).expect("session");
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    tls.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\nGET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("send");
    let mut bytes = Vec::new();
    let _ = tls.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2, "{text}");
}

#[test]
fn https_with_curl_and_openssl_when_installed() {
    let (server, addr, pki, d) = tls_server(1, "", "");
    let ca = d.path().join("ca.pem");
    fs::write(&ca, &pki.ca_pem).expect("write CA");
    let url = format!("https://localhost:{}/health", addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", addr.port());
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "--cacert",
            ca.to_str().expect("utf-8"),
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
        ])
        .args(["-w", "%{http_code} %{http_version}", &url])
        .output();
    match out {
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stdout);
            // ALPN offers h2 first: a curl built with HTTP/2 takes it.
            assert!(
                said == "200 2" || said == "200 1.1",
                "curl said {said}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                server.log_tail()
            );
        }
        Err(e) => eprintln!("curl not run ({e}); the rustls client tests cover HTTPS"),
    }
    let ca_file = ca.to_str().expect("utf-8");
    if let Some((stdout, stderr)) = s_client_get_health(addr, &["-servername", "localhost", "-CAfile", ca_file]) {
        assert!(stdout.contains("HTTP/1.1 200"), "openssl s_client:\n{stdout}\n{stderr}");
        assert!(stdout.contains("Verify return code: 0 (ok)"), "{stdout}");
        assert!(stdout.contains("ALPN protocol: http/1.1"), "{stdout}");
    }
}

/// `GET /health` over `openssl s_client -connect addr <args> -alpn http/1.1`; its stdout and
/// stderr, or `None` when openssl cannot be run. Bounded: killed after 10 s.
fn s_client_get_health(addr: SocketAddr, args: &[&str]) -> Option<(String, String)> {
    let mut child = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args(args)
        .args(["-alpn", "http/1.1", "-ign_eof"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("openssl output");
    Some((String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[test]
fn a_client_cannot_fill_the_log_through_rustls_warnings() {
    // OpenSSL clients (wrk, `s_client -servername`) send an IP address as SNI, which rustls
    // reports at warn level: one line per connection, at the client's will.
    let (server, addr, _pki, _d) = tls_server(1, "", "");
    for _ in 0..3 {
        let Some((stdout, _)) = s_client_get_health(addr, &["-servername", "127.0.0.1"]) else {
            eprintln!("openssl not run: nothing to check");
            return;
        };
        assert!(stdout.contains("HTTP/1.1 200"), "openssl s_client:\n{stdout}\n{}", server.log_tail());
    }
    // The request lines are in the log (so it was read after the exchanges), the warnings not.
    let log = server.logs();
    assert!(log.contains("GET /health"), "the access lines are logged:\n{log}");
    assert!(!log.contains("rustls"), "rustls wrote to the log:\n{log}");
}

/// Connects to `addr`, sends `bytes`, and reads until the server closes (within `within`, else
/// a panic); returns what it sent before closing.
fn closed_after(addr: SocketAddr, bytes: &[u8], within: Duration) -> Vec<u8> {
    let mut sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.write_all(bytes).expect("send");
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "not closed within {within:?} after {bytes:?}; got {got:?}");
        sock.set_read_timeout(Some(left)).expect("timeout");
        match sock.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => panic!("read: {e}"),
        }
    }
}

#[test]
fn failed_and_stalled_handshakes_are_closed_and_the_server_stays_up() {
    let (server, addr, pki, _d) = tls_server(1, "", "[limits]\nheader_timeout_ms = 500\n");
    // Plain HTTP on the HTTPS port: not a ClientHello; the connection is closed.
    let t = Instant::now();
    let got = closed_after(addr, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", Duration::from_secs(3));
    assert!(t.elapsed() < Duration::from_millis(400), "not closed at once: {:?}", t.elapsed());
    assert_eq!(got.first(), Some(&0x15), "a TLS alert record, then the close: {got:?}");
    // Nothing at all: closed once the header timeout passes.
    let t = Instant::now();
    assert_eq!(closed_after(addr, b"", Duration::from_secs(4)), b"", "a client that never starts its handshake");
    assert!(t.elapsed() >= Duration::from_millis(400), "closed too early: {:?}", t.elapsed());
    // Half a ClientHello, then silence: the same bound.
    closed_after(addr, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc], Duration::from_secs(4));
    // A client that does not trust the certificate gives up; the server carries on.
    let stranger = client_config(&Pki::new(), rustls::DEFAULT_VERSIONS);
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(stranger, name).expect("session");
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    assert!(tls.write_all(b"GET / HTTP/1.1\r\n\r\n").and_then(|_| tls.read(&mut [0u8; 16])).is_err());
    let ok = https_get(addr, &client_config(&pki, rustls::DEFAULT_VERSIONS), "/health");
    assert_eq!(ok.status, 200, "{}", server.log_tail());
    server.assert_healthy();
}

/// Connections with one client session store until `n` resumed handshakes were tried; returns
/// how many of them resumed.
fn resumed_of(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, n: usize) -> usize {
    let first = https_get(addr, config, "/health");
    assert_eq!((first.status, first.kind), (200, Some(rustls::HandshakeKind::Full)));
    (0..n)
        .filter(|_| {
            let r = https_get(addr, config, "/health");
            assert_eq!(r.status, 200);
            r.kind == Some(rustls::HandshakeKind::Resumed)
        })
        .count()
}

#[test]
fn sessions_resume_on_any_worker() {
    let (server, addr, pki, _d) = tls_server(2, "", "");
    let workers = server.wait_workers(2, Duration::from_secs(10));
    assert_eq!(workers.len(), 2);
    // SO_REUSEPORT spreads the connections over both workers; a ticket from either opens on
    // both (per-worker keys resumed about half of them).
    let tls13 = client_config(&pki, &[&rustls::version::TLS13]);
    assert_eq!(resumed_of(addr, &tls13, 20), 20, "TLS 1.3\n{}", server.log_tail());
    let tls12 = client_config(&pki, &[&rustls::version::TLS12]);
    assert_eq!(resumed_of(addr, &tls12, 20), 20, "TLS 1.2\n{}", server.log_tail());
}

#[test]
fn usr2_hands_over_the_tls_socket_and_sessions_resume_across_it() {
    use crate::upgrade::{new_supervisor_pid, StopOnDrop};
    let (mut server, addr, pki, _d) = tls_server(2, "", "");
    server.wait_workers(2, START_TIMEOUT);
    let config = client_config(&pki, &[&rustls::version::TLS13]);
    assert_eq!(https_get(addr, &config, "/health").kind, Some(rustls::HandshakeKind::Full));
    server.signal(nix::sys::signal::Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&server);
    let _stop = StopOnDrop(new_pid);
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "old supervisor: {status:?}\n{}", server.log_tail());
    assert!(eventually(Duration::from_secs(10), || worker_pids(new_pid).len() == 2));
    // The tickets the old workers issued open on the new ones.
    let r = https_get(addr, &config, "/health");
    assert_eq!(r.status, 200, "{}", server.log_tail());
    assert_eq!(r.kind, Some(rustls::HandshakeKind::Resumed), "{}", server.log_tail());
}

#[test]
fn redirect_http_sends_plain_requests_to_https_but_health_and_metrics() {
    let (server, addr, pki, _d) = tls_server(1, "redirect_http = true\n", "");
    let origin = format!("https://localhost:{}", addr.port());
    for (method, path) in
        [("GET", "/"), ("GET", "/api/v1/users?page=2"), ("POST", "/api/v1/auth/login"), ("HEAD", "/x")]
    {
        let (rs, _) = send_raw(server.addr(), &request(method, path, &[("Connection", "close")], b""));
        let r = &rs[0];
        assert_eq!(r.status, 308, "{method} {path}: {r:?}");
        assert_eq!(r.header("location"), Some(format!("{origin}{path}").as_str()), "{method} {path}");
    }
    assert_eq!(server.get("/health").status, 200, "/health stays on plain HTTP");
    assert_eq!(server.get("/metrics").status, 200, "/metrics stays on plain HTTP");
    // Over TLS nothing moves.
    let config = client_config(&pki, rustls::DEFAULT_VERSIONS);
    assert_eq!(https_get(addr, &config, "/api/v1/users?page=2").status, 401);
    let page = https_get(addr, &config, "/");
    assert_eq!(page.status, 200, "{}", page.head);
}

#[test]
fn without_redirect_http_the_plain_listener_serves_everything() {
    let (server, _addr, _pki, _d) = tls_server(1, "", "");
    assert_eq!(server.get("/").status, 200);
}

/// Whether a TLS handshake with `config` succeeds and `/health` answers 200.
fn trusted(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> bool {
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(Arc::clone(config), name).expect("session");
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    let mut bytes = Vec::new();
    tls.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_ok()
        && tls.read_to_end(&mut bytes).is_ok()
        && bytes.starts_with(b"HTTP/1.1 200")
}

#[test]
fn hup_reads_the_certificate_again_and_a_bad_pair_keeps_the_old_one() {
    let (server, addr, old, d) = tls_server(2, "", "");
    server.wait_workers(2, START_TIMEOUT);
    let old_client = client_config(&old, rustls::DEFAULT_VERSIONS);
    assert!(trusted(addr, &old_client));
    // A key that is not the certificate's: the reload is refused, the old pair serves on.
    let new = Pki::new();
    fs::write(d.path().join("cert.pem"), &new.cert_pem).expect("write");
    server.signal(nix::sys::signal::Signal::SIGHUP);
    let line = server.wait_log_line(IO_TIMEOUT, |l| l.contains("reload refused"));
    assert!(line.contains("is not the private key of the certificate"), "{line}");
    let fresh = client_config(&old, rustls::DEFAULT_VERSIONS);
    assert!(trusted(addr, &fresh), "the old certificate still serves\n{}", server.log_tail());
    // Now a good pair: new workers present it.
    new.write(d.path());
    server.signal(nix::sys::signal::Signal::SIGHUP);
    server.wait_log_line(Duration::from_secs(15), |l| l.contains("reload complete"));
    let new_client = client_config(&new, rustls::DEFAULT_VERSIONS);
    assert!(trusted(addr, &new_client), "the new certificate serves\n{}", server.log_tail());
    // A fresh client (a cached session would resume without looking at the certificate).
    let fresh = client_config(&old, rustls::DEFAULT_VERSIONS);
    assert!(!trusted(addr, &fresh), "the old certificate is gone");
}

#[test]
fn socket_activation_passes_a_plain_and_a_tls_socket_by_name() {
    use crate::upgrade::StopOnDrop;
    use std::os::fd::AsRawFd;
    let plain = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let tls = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let (plain_addr, tls_addr) = (plain.local_addr().expect("addr"), tls.local_addr().expect("addr"));
    let d = tmp();
    let pki = Pki::new();
    let (c, k) = pki.write(d.path());
    // `listen` and `tls.listen` name other ports: the passed sockets win.
    let configured_tls = free_port();
    let extra = format!("workers = 2\n{}", tls_toml(configured_tls, &c, &k, ""));
    let text = render_config(&format!("127.0.0.1:{}", free_port()), &d.path().join("data"), &extra);
    let cfg = d.path().join("forkd.toml");
    fs::write(&cfg, text).expect("write config");
    let log = fs::File::create(d.path().join("forkd.log")).expect("log");
    let (pfd, tfd) = (plain.as_raw_fd(), tls.as_raw_fd());
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["serve", "--config", cfg.to_str().expect("utf-8")])
        .env("LISTEN_FDS", "2")
        .env("LISTEN_FDNAMES", "forkd.socket:forkd-tls")
        .env_remove("LISTEN_PID")
        .env_remove("FORKD_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: fcntl and dup2 are async-signal-safe; in the child only, the two listeners are
    // moved out of the way (fd 100, 101), then placed at fd 3 and 4 without close-on-exec,
    // as systemd passes them.
    unsafe {
        use nix::fcntl::{fcntl, FcntlArg};
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let high_p = fcntl(pfd, FcntlArg::F_DUPFD(100))?;
            let high_t = fcntl(tfd, FcntlArg::F_DUPFD(101))?;
            nix::unistd::dup2(high_p, 3)?;
            nix::unistd::dup2(high_t, 4)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn forkd");
    let pid = child.id() as i32;
    let _stop = StopOnDrop(pid);
    drop((plain, tls));
    let logs = || fs::read_to_string(d.path().join("forkd.log")).unwrap_or_default();
    let config = client_config(&pki, rustls::DEFAULT_VERSIONS);
    let served = eventually(START_TIMEOUT, || {
        TcpStream::connect(plain_addr).is_ok_and(|_| get(plain_addr, "/health").status == 200)
    });
    assert!(served, "the plain socket (fd 3) is served\n{}", logs());
    assert!(eventually(START_TIMEOUT, || worker_pids(pid).len() == 2), "2 workers\n{}", logs());
    for _ in 0..4 {
        assert_eq!(https_get(tls_addr, &config, "/health").status, 200, "the TLS socket (fd 4)\n{}", logs());
    }
    let configured = format!("127.0.0.1:{configured_tls}").parse().expect("addr");
    assert!(TcpStream::connect_timeout(&configured, Duration::from_millis(500)).is_err(), "tls.listen does not apply");
    kill_pid(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
}

#[test]
fn a_large_download_and_an_sse_stream_over_tls() {
    let files = tmp();
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    fs::write(files.path().join("data.bin"), &data).expect("write");
    let extra = format!("[download]\ndir = \"{}\"\n", files.path().display());
    let (server, addr, pki, _d) = tls_server(1, "", &extra);
    let config = client_config(&pki, rustls::DEFAULT_VERSIONS);
    // A slow reader: the worker's output backs up behind rustls and the socket, and resumes.
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(Arc::clone(&config), name).expect("session");
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    tls.write_all(b"GET /download/data.bin HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("send");
    std::thread::sleep(Duration::from_millis(300));
    let mut bytes = Vec::new();
    let _ = tls.read_to_end(&mut bytes);
    let at = find(&bytes, b"\r\n\r\n").expect("a head") + 4;
    assert!(bytes.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&bytes[..at]));
    assert!(bytes[at..] == data[..], "3 MiB intact over TLS: got {} bytes\n{}", bytes.len() - at, server.log_tail());
    // An SSE stream: the head and the first event arrive through TLS.
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(config, name).expect("session");
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    tls.write_all(b"GET /api/events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n").expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + IO_TIMEOUT;
    while find(&got, b"\r\n\r\n").is_none() && Instant::now() < deadline {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200") && head.contains("text/event-stream"), "{head}");
}
