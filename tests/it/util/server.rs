//! The server under test: `ServerBuilder` renders a config from the harness defaults plus
//! the test's lines, `Server` runs `forkd serve` in its own temp dir on a free port, waits for
//! `/health`, reads its log, and kills it (supervisor and workers, by pid) when dropped.
//! Protocol-specific request helpers live in `proto.rs` and `api.rs`, not here.

use std::fs::{self, File};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::http2::H2Client;
use super::proto::http3_for_new_servers;
use super::tls::Pki;
use super::*;

/// Builds the TOML for a server: top-level lines and `[section]` lines, rendered after
/// the harness defaults (`listen`, `data_dir`, `workers = 1`, `[debug] routes = true`).
#[derive(Default, Clone)]
pub struct ServerBuilder {
    top: Vec<String>,
    sections: Vec<(String, Vec<String>)>,
    env: Vec<(String, String)>,
    http3: bool,
    port: Option<u16>,
}

impl ServerBuilder {
    pub fn workers(self, n: usize) -> Self {
        self.top(&format!("workers = {n}"))
    }

    /// A top-level line, e.g. `log_format = "json"`.
    pub fn top(mut self, line: &str) -> Self {
        self.top.push(line.to_string());
        self
    }

    /// Lines (one or more, newline separated) for `[section]`.
    pub fn set(mut self, section: &str, lines: &str) -> Self {
        match self.sections.iter_mut().find(|(s, _)| s == section) {
            Some((_, v)) => v.push(lines.to_string()),
            None => self.sections.push((section.to_string(), vec![lines.to_string()])),
        }
        self
    }

    /// An environment variable for the server process (e.g. a `FORKD_` override).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    pub fn to_extra_toml(&self) -> String {
        let mut s = String::new();
        for l in &self.top {
            s.push_str(l);
            s.push('\n');
        }
        for (sec, lines) in &self.sections {
            s.push_str(&format!("\n[{sec}]\n"));
            for l in lines {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }

    /// HTTP/3 on: a TLS listener on a free port with a throw-away certificate, and
    /// `[http3] enabled` on its UDP port ([`Server::h3`] connects to it).
    pub fn http3(mut self) -> Self {
        self.http3 = true;
        self
    }

    /// The plain listener on 127.0.0.1:`port` rather than a free port of the harness's choice
    /// (for a peer that must know it beforehand, such as an ACME CA checking HTTP-01).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub fn start(self) -> Server {
        Server::launch(&self.to_extra_toml(), &self.env, self.http3, self.port)
    }
}

/// Renders a full config: defaults, then `extra` (its top-level part before its first
/// section header, then its sections), then `[debug] routes = true` unless `extra` has a
/// `[debug]` section. `workers = 1` unless `extra` sets `workers` at top level.
pub fn render_config(listen: &str, data_dir: &Path, extra: &str) -> String {
    let mut top = Vec::new();
    let mut rest = Vec::new();
    let mut in_sections = false;
    for line in extra.lines() {
        if line.trim_start().starts_with('[') {
            in_sections = true;
        }
        if in_sections {
            rest.push(line);
        } else {
            top.push(line);
        }
    }
    let sets = |key: &str| {
        top.iter().any(|l| {
            let l = l.trim_start();
            l.starts_with(key) && l[key.len()..].trim_start().starts_with('=')
        })
    };
    let mut s = String::new();
    if !sets("listen") {
        s.push_str(&format!("listen = \"{listen}\"\n"));
    }
    if !sets("data_dir") {
        s.push_str(&format!("data_dir = \"{}\"\n", data_dir.display()));
    }
    if !sets("workers") {
        s.push_str("workers = 1\n");
    }
    for l in &top {
        s.push_str(l);
        s.push('\n');
    }
    s.push('\n');
    for l in &rest {
        s.push_str(l);
        s.push('\n');
    }
    if !rest.iter().any(|l| l.trim() == "[debug]") {
        s.push_str("\n[debug]\nroutes = true\n");
    }
    s
}

/// The config lines that turn HTTP/3 on.
struct Http3Lines {
    /// The https `public_origin` a server with a TLS listener must have.
    origin: String,
    tls: String,
    http3: String,
}

/// A throw-away certificate written into `dir`, a free port for TLS and HTTP/3 (UDP on the
/// same port, never `listen`'s), the config lines for them and the client side.
fn http3_listener(dir: &Path, listen: u16) -> (Http3Lines, Http3Access) {
    let pki = Pki::new();
    let (cert, key) = (dir.join("h3-cert.pem"), dir.join("h3-key.pem"));
    fs::write(&cert, &pki.cert_pem).expect("write cert");
    fs::write(&key, &pki.key_pem).expect("write key");
    // Two free ports picked one after the other may be the same one.
    let port = std::iter::repeat_with(free_port).find(|&p| p != listen).unwrap_or(0);
    let lines = Http3Lines {
        origin: format!("public_origin = \"https://localhost:{port}\""),
        tls: tls_section(port, &cert, &key),
        http3: "enabled = true".into(),
    };
    let access =
        Http3Access { addr: SocketAddr::from(([127, 0, 0, 1], port)), client: super::http3::client_config_1rtt(&pki) };
    (lines, access)
}

/// Whether the top-level part of `extra` (before its first section) sets `key`.
fn sets_top_level(extra: &str, key: &str) -> bool {
    extra.lines().take_while(|l| !l.trim_start().starts_with('[')).any(|l| {
        let l = l.trim_start();
        l.starts_with(key) && l[key.len()..].trim_start().starts_with('=')
    })
}

/// `extra` with `lines` in its `[section]`: right after the section's header when it has
/// one, else in a new section at the end. Panics when `extra` already sets `listen` there
/// (a test with its own TLS listener is not one to run over HTTP/3 by `protocols!`).
fn with_section_lines(extra: &str, section: &str, lines: &str) -> String {
    let header = format!("[{section}]");
    let mut out = String::new();
    let mut found = false;
    let mut in_section = false;
    for l in extra.lines() {
        let t = l.trim();
        if t.starts_with('[') {
            in_section = t == header;
        }
        assert!(
            !(in_section && t.starts_with("listen") && section == "tls"),
            "this server sets its own [tls] listen; HTTP/3 from the harness would clash:\n{extra}"
        );
        out.push_str(l);
        out.push('\n');
        if t == header && !found {
            found = true;
            out.push_str(lines);
            out.push('\n');
        }
    }
    if !found {
        out.push_str(&format!("\n{header}\n{lines}\n"));
    }
    out
}

/// A running `forkd serve` (the supervisor) in its own temp dir. Dropping it kills the
/// supervisor and its workers.
pub struct Server {
    child: Option<Child>,
    pid: i32,
    pub(super) addr: SocketAddr,
    dir: tempfile::TempDir,
    log_path: PathBuf,
    pub config_text: String,
    /// What [`Server::call`] and the helpers built on it speak (HTTP/1.1 unless set).
    pub(super) proto: Proto,
    /// Where and how to reach this server over HTTP/3, when it serves it.
    pub(super) h3: Option<Http3Access>,
}

/// The HTTP/3 side of a server started with [`ServerBuilder::http3`].
pub(super) struct Http3Access {
    pub(super) addr: SocketAddr,
    /// Trusts the server's throw-away CA; no 0-RTT, so every request is sent after the
    /// handshake as over TCP.
    pub(super) client: quinn_proto::ClientConfig,
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// Starts a server with the harness defaults plus `extra_toml` (see [`render_config`]).
    pub fn start(extra_toml: &str) -> Server {
        Self::start_with(extra_toml, &[])
    }

    pub fn start_with(extra_toml: &str, env: &[(String, String)]) -> Server {
        Self::launch(extra_toml, env, false, None)
    }

    /// Starts a server, with HTTP/3 when `http3` or inside [`with_http3`].
    fn launch(extra_toml: &str, env: &[(String, String)], http3: bool, port: Option<u16>) -> Server {
        let http3 = http3 || http3_for_new_servers();
        let mut last_log = String::new();
        for _attempt in 0..3 {
            match Self::try_start(extra_toml, env, http3, port) {
                Ok(s) => return s,
                Err(log) => {
                    let in_use = log.to_lowercase().contains("address already in use")
                        || log.to_lowercase().contains("addrinuse");
                    if !in_use {
                        panic!("server did not become ready:\n{log}");
                    }
                    last_log = log;
                }
            }
        }
        panic!("server did not start after 3 attempts (port races):\n{last_log}");
    }

    /// Spawns and waits for readiness. `Err(log)` when it exits or never answers.
    fn try_start(extra_toml: &str, env: &[(String, String)], http3: bool, port: Option<u16>) -> Result<Server, String> {
        let dir = tempfile::Builder::new().prefix("forkd-it-").tempdir().expect("tempdir");
        let port = port.unwrap_or_else(free_port);
        let listen = format!("127.0.0.1:{port}");
        let data_dir = dir.path().join("data");
        // `{listen}` in the extra TOML stands for the address chosen here (e.g. for
        // `public_origin = "http://{listen}"`, the origin a browser sends).
        let mut extra = extra_toml.replace("{listen}", &listen);
        let h3 = http3.then(|| {
            let (lines, access) = http3_listener(dir.path(), port);
            if !sets_top_level(&extra, "public_origin") {
                extra = format!("{}\n{extra}", lines.origin);
            }
            extra = with_section_lines(&extra, "tls", &lines.tls);
            extra = with_section_lines(&extra, "http3", &lines.http3);
            access
        });
        let config_text = render_config(&listen, &data_dir, &extra);
        let config_path = dir.path().join("forkd.toml");
        fs::write(&config_path, &config_text).expect("write config");
        let log_path = dir.path().join("stderr.log");
        let stderr = File::create(&log_path).expect("create log file");
        let stdout = File::create(dir.path().join("stdout.log")).expect("create stdout file");

        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        clear_forkd_env(&mut cmd);
        cmd.env("RUST_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn forkd");
        let pid = child.id() as i32;
        let mut server = Server {
            child: Some(child),
            pid,
            addr: listen.parse().unwrap(),
            dir,
            log_path,
            config_text,
            proto: Proto::H1,
            h3,
        };

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(st) = server.child.as_mut().unwrap().try_wait().unwrap() {
                let log = server.logs();
                return Err(format!(
                    "forkd exited during start-up with {st}\nconfig:\n{}\nlog:\n{}",
                    server.config_text,
                    tail(&log, 8000)
                ));
            }
            if server.probe_health() {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                let log = server.logs();
                return Err(format!(
                    "GET /health did not answer 200 within {:?}\nconfig:\n{}\nlog:\n{}",
                    START_TIMEOUT,
                    server.config_text,
                    tail(&log, 8000)
                ));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    fn probe_health(&self) -> bool {
        let Ok(s) = TcpStream::connect_timeout(&self.addr, Duration::from_millis(500)) else {
            return false;
        };
        let mut c = Conn::from_stream(s, None);
        c.set_timeout(Duration::from_secs(1));
        // A listener with `proxy_protocol = true` wants a header first: `UNKNOWN` keeps the peer.
        let proxied = self.config_text.lines().take_while(|l| !l.trim_start().starts_with('[')).any(|l| {
            let l = l.replace(' ', "");
            l == "proxy_protocol=true"
        });
        if proxied && c.try_write(b"PROXY UNKNOWN\r\n").is_err() {
            return false;
        }
        if c.try_write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return false;
        }
        matches!(c.try_read_response(false), Ok(r) if r.status == 200)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the server wrote to stderr so far.
    pub fn logs(&self) -> String {
        fs::read(&self.log_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// The last ~6 kB of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        tail(&self.logs(), 6000).to_string()
    }

    /// Sends `sig` to the supervisor.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid), sig).expect("signal supervisor");
    }

    /// Polls for the supervisor's exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_child(self.child.as_mut()?, timeout)
    }

    /// A new keep-alive connection (5 s read timeout) whose failures print the server log.
    pub fn conn(&self) -> Conn {
        Conn::open_with_log(self.addr, Some(self.log_path.clone()))
    }

    /// `GET path` on a fresh connection.
    pub fn get(&self, path: &str) -> Response {
        self.get_with(path, &[])
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        if self.proto != Proto::H1 {
            return self.call("GET", path, headers, b"");
        }
        let mut c = self.conn();
        c.send(&request("GET", path, headers, b""));
        c.read_response()
    }

    /// `GET path` on a fresh connection with a read timeout, returning errors instead of
    /// panicking (for probes that may legitimately fail, e.g. while a worker is killed).
    pub fn try_get(&self, path: &str, timeout: Duration) -> io::Result<Response> {
        if self.proto == Proto::H2c {
            // Refused → Err, as over HTTP/1.1; one connection, as over HTTP/1.1 (the
            // supervisor gives connections to the workers in turn).
            let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT)?;
            let mut c = H2Client::h2c_on(s, h2::client::Builder::new());
            return h2_exchange(&mut c, "GET", path, &[], b"", timeout).map_err(io::Error::other);
        }
        if self.proto == Proto::H3 {
            let mut c = Session::H3(Box::new(self.try_h3(timeout).map_err(io::Error::other)?));
            return c.try_request("GET", path, &[], b"", timeout).map_err(io::Error::other);
        }
        let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT)?;
        let mut c = Conn::from_stream(s, None);
        c.set_timeout(timeout);
        c.try_write(&request("GET", path, &[], b""))?;
        c.try_read_response(false)
    }

    /// The worker pids (children of the supervisor).
    pub fn workers(&self) -> Vec<i32> {
        worker_pids(self.pid)
    }

    /// Waits until exactly `n` workers exist; panics with the log otherwise.
    pub fn wait_workers(&self, n: usize, timeout: Duration) -> Vec<i32> {
        let ok = eventually(timeout, || self.workers().len() == n);
        let w = self.workers();
        if !ok {
            let states: Vec<String> = w.iter().map(|p| format!("{p}: {}", proc_signal_status(*p))).collect();
            panic!(
                "expected {n} worker processes within {timeout:?}, found {w:?}\n{}\nlog:\n{}",
                states.join("\n"),
                self.log_tail()
            );
        }
        w
    }

    /// The pid reported by `GET /_debug/pid` (on a fresh connection).
    pub fn debug_pid(&self) -> i32 {
        let r = self.get("/_debug/pid");
        assert_eq!(r.status, 200, "GET /_debug/pid: {r:?}\nlog:\n{}", self.log_tail());
        r.json()["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {r:?}")) as i32
    }

    /// Asserts `GET /health` still answers 200 (the worker survived).
    pub fn assert_healthy(&self) {
        let r = self.get("/health");
        assert_eq!(r.status, 200, "server no longer healthy: {r:?}\nlog:\n{}", self.log_tail());
    }

    /// Polls the log until a line satisfies `pred`; panics with the log otherwise.
    pub fn wait_log_line(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let found = eventually_some(timeout, || self.logs().lines().find(|l| pred(l)).map(str::to_string));
        found.unwrap_or_else(|| panic!("no matching log line within {timeout:?}; log:\n{}", self.log_tail()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        // Freeze the supervisor so it cannot respawn, kill its workers (verified children of
        // it, by pid), then the supervisor itself. Workers also die by PDEATHSIG.
        let sup = Pid::from_raw(self.pid);
        let _ = kill(sup, Signal::SIGSTOP);
        for w in worker_pids(self.pid) {
            let _ = kill(Pid::from_raw(w), Signal::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn clear_forkd_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("FORKD_") {
                cmd.env_remove(k);
            }
        }
    }
}

#[cfg(test)]
mod selftest {
    use super::*;

    #[test]
    fn harness_section_lines_join_an_existing_section_or_open_one() {
        let extra = "workers = 2\n[http3]\nmax_streams = 5\n";
        assert_eq!(
            with_section_lines(extra, "http3", "enabled = true"),
            "workers = 2\n[http3]\nenabled = true\nmax_streams = 5\n"
        );
        assert_eq!(with_section_lines(extra, "tls", "listen = \"x\""), format!("{extra}\n[tls]\nlisten = \"x\"\n"));
        assert!(sets_top_level("public_origin = \"http://a\"\n[tls]\n", "public_origin"));
        assert!(!sets_top_level("[cors]\npublic_origin = 1\n", "public_origin"));
        assert!(!sets_top_level("public_origin_x = 1\n", "public_origin"));
    }

    #[test]
    #[should_panic(expected = "sets its own [tls] listen")]
    fn harness_refuses_http3_over_a_test_s_own_tls_listener() {
        with_section_lines("[tls]\nlisten = \"127.0.0.1:1\"\n", "tls", "listen = \"x\"");
    }
}
