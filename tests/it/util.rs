//! Test harness: start the real `forkd` binary in a temp dir on a free port, talk raw
//! HTTP/1.1 to it, and inspect its processes and logs.
//!
//! Everything here is bounded in time: connects, reads and waits all carry a timeout, and
//! a failure reports what was expected, what came, and the tail of the server's log.

#![allow(dead_code)]

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::h2util::{H2Client, H2Response};

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

/// A free TCP port on 127.0.0.1 (bind :0, read, drop). A race with another process is
/// possible; `Server::start` retries on "address in use".
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
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

// ---------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------

/// Builds the TOML for a server: top-level lines and `[section]` lines, rendered after
/// the harness defaults (`listen`, `data_dir`, `workers = 1`, `[debug] routes = true`).
#[derive(Default, Clone)]
pub struct ServerBuilder {
    top: Vec<String>,
    sections: Vec<(String, Vec<String>)>,
    env: Vec<(String, String)>,
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

    pub fn start(self) -> Server {
        Server::start_with(&self.to_extra_toml(), &self.env)
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

/// A running `forkd serve` (the supervisor) in its own temp dir. Dropping it kills the
/// supervisor and its workers.
pub struct Server {
    child: Option<Child>,
    pid: i32,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    log_path: PathBuf,
    pub config_text: String,
    /// What [`Server::call`] and the helpers built on it speak (HTTP/1.1 unless set).
    proto: Proto,
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
        let mut last_log = String::new();
        for _attempt in 0..3 {
            match Self::try_start(extra_toml, env) {
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
    fn try_start(extra_toml: &str, env: &[(String, String)]) -> Result<Server, String> {
        let dir = tempfile::Builder::new().prefix("forkd-it-").tempdir().expect("tempdir");
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let data_dir = dir.path().join("data");
        // `{listen}` in the extra TOML stands for the address chosen here (e.g. for
        // `public_origin = "http://{listen}"`, the origin a browser sends).
        let config_text = render_config(&listen, &data_dir, &extra_toml.replace("{listen}", &listen));
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
        if self.proto == Proto::H2c {
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
            TcpStream::connect_timeout(&self.addr, IO_TIMEOUT)?; // refused → Err, as over HTTP/1.1
            let mut c = H2Client::h2c(self.addr);
            return h2_exchange(&mut c, "GET", path, &[], b"", timeout).map_err(io::Error::other);
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

fn clear_forkd_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("FORKD_") {
                cmd.env_remove(k);
            }
        }
    }
}

/// Processes whose parent is `parent` (not zombies), from /proc/*/stat. Never by name.
pub fn worker_pids(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let mut f = stat[close + 1..].split_whitespace();
        let state = f.next().unwrap_or("");
        let ppid: i32 = f.next().and_then(|p| p.parse().ok()).unwrap_or(-1);
        if ppid == parent && state != "Z" && state != "X" {
            out.push(pid);
        }
    }
    out.sort();
    out
}

/// `State`, pending/blocked/ignored/caught signal masks of `pid` (for failure messages).
pub fn proc_signal_status(pid: i32) -> String {
    let st = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    st.lines()
        .filter(|l| ["State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"].iter().any(|k| l.starts_with(k)))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Wall-clock time as `HH:MM:SS.mmm` UTC, to line test events up with the server log.
pub fn wall_clock() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let s = d.as_secs() % 86400;
    format!("{:02}:{:02}:{:02}.{:03}Z", s / 3600, s / 60 % 60, s % 60, d.subsec_millis())
}

pub fn pid_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
            !matches!(state.as_deref(), Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

pub fn kill_pid(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap_or_else(|e| panic!("kill({pid}, {sig:?}): {e}"));
}

// ---------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------

pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

impl fmt::Debug for CliOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            tail(&self.stdout, 4000),
            tail(&self.stderr, 4000)
        )
    }
}

/// Runs `forkd args...` in `cwd` with no FORKD_* variables but `env`, bounded at 15 s.
pub fn run_forkd(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    run_forkd_input(cwd, args, env, b"")
}

// ---------------------------------------------------------------------------------------
// Raw HTTP/1.1 client
// ---------------------------------------------------------------------------------------

/// Builds a request with `Host` first, then `headers`, then `Content-Length` when `body`
/// is non-empty.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut s = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        s.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    s.push_str("\r\n");
    let mut v = s.into_bytes();
    v.extend_from_slice(body);
    v
}

#[derive(Clone)]
pub struct Response {
    pub version: String,
    pub status: u16,
    pub reason: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Interim responses read before this one (`103 Early Hints`), in order. `100
    /// Continue` and `101` are never put here: they are read as responses of their own.
    pub interim: Box<[Response]>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    pub fn header_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().filter(|(k, _)| *k == name).map(|(_, v)| v.as_str()).collect()
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }

    /// True when the response asks to close the connection.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "close"))
            .unwrap_or(false)
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in &self.interim {
            writeln!(f, "{} {} {} (interim)", i.version, i.status, i.reason)?;
            for (k, v) in &i.headers {
                writeln!(f, "  {k}: {v}")?;
            }
        }
        writeln!(f, "{} {} {}", self.version, self.status, self.reason)?;
        for (k, v) in &self.headers {
            writeln!(f, "  {k}: {v}")?;
        }
        let b = self.body_str();
        if b.len() > 600 {
            write!(
                f,
                "  body ({} bytes): {}…",
                self.body.len(),
                &b[..b.char_indices().nth(600).map(|(i, _)| i).unwrap_or(b.len())]
            )
        } else {
            write!(f, "  body ({} bytes): {}", self.body.len(), b)
        }
    }
}

/// A client connection that writes arbitrary bytes and reads one response at a time.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
    timeout: Duration,
    log_path: Option<PathBuf>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        Self::open_with_log(addr, None)
    }

    pub fn open_with_log(addr: SocketAddr, log_path: Option<PathBuf>) -> Conn {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect {addr}: {e}{}", log_suffix(&log_path)));
        Conn::from_stream(s, log_path)
    }

    pub fn from_stream(stream: TcpStream, log_path: Option<PathBuf>) -> Conn {
        stream.set_nodelay(true).ok();
        let mut c = Conn { stream, buf: Vec::new(), eof: false, timeout: IO_TIMEOUT, log_path };
        c.set_timeout(IO_TIMEOUT);
        c
    }

    pub fn set_timeout(&mut self, d: Duration) {
        self.timeout = d;
        self.stream.set_read_timeout(Some(d)).unwrap();
        self.stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    }

    fn ctx(&self) -> String {
        log_suffix(&self.log_path)
    }

    /// Writes all of `bytes`, panicking on error.
    pub fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.try_write(bytes) {
            panic!("write failed: {e}{}", self.ctx());
        }
    }

    pub fn try_write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Bytes received but not yet consumed by a response.
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    /// Take the bytes received but not yet consumed (the caller reads the rest itself).
    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    fn fill(&mut self) -> io::Result<usize> {
        let mut tmp = [0u8; 65536];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits up to `d` for anything from the server (bytes or EOF). True if something came.
    pub fn poll_readable(&mut self, d: Duration) -> bool {
        if !self.buf.is_empty() || self.eof {
            return true;
        }
        self.stream.set_read_timeout(Some(d)).unwrap();
        let r = self.fill();
        self.stream.set_read_timeout(Some(self.timeout)).unwrap();
        match r {
            Ok(_) => true,
            Err(e) if is_timeout(&e) => false,
            Err(_) => true, // reset counts as "something happened"
        }
    }

    /// Reads one response (panics with the server log on failure).
    pub fn read_response(&mut self) -> Response {
        self.try_read_response(false).unwrap_or_else(|e| panic!("reading response: {e}{}", self.ctx()))
    }

    /// Reads one response to a HEAD request (no body).
    pub fn read_head_response(&mut self) -> Response {
        self.try_read_response(true).unwrap_or_else(|e| panic!("reading HEAD response: {e}{}", self.ctx()))
    }

    /// Sends `GET path` and reads the response.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(&request("GET", path, &[], b""));
        self.read_response()
    }

    /// Reads one response. `head`: the request was HEAD (no body follows). Interim
    /// responses other than `100` and `101` (`103 Early Hints`) are read and kept in the
    /// final response's `interim`.
    pub fn try_read_response(&mut self, head: bool) -> io::Result<Response> {
        let mut interim = Vec::new();
        loop {
            let r = self.try_read_one(head)?;
            if (102..200).contains(&r.status) {
                interim.push(r);
            } else {
                return Ok(Response { interim: interim.into_boxed_slice(), ..r });
            }
        }
    }

    fn try_read_one(&mut self, head: bool) -> io::Result<Response> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("EOF before a complete response head; got {:?}", String::from_utf8_lossy(&self.buf)),
                ));
            }
            self.fill_ctx("response head")?;
        };
        let head_text = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end + 4);
        let mut lines = head_text.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("").to_string();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {status_line:?}")))?;
        if !version.starts_with("HTTP/1.") {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {status_line:?}")));
        }
        let reason = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad header line {l:?}")));
            };
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = Response { version, status, reason, headers, body: Vec::new(), interim: Box::default() };
        if head || (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(resp);
        }
        let chunked = resp
            .header("transfer-encoding")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked"))
            .unwrap_or(false);
        if chunked {
            resp.body = self.read_chunked()?;
        } else if let Some(cl) = resp.header("content-length") {
            let n: usize = cl
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad Content-Length {cl:?}")))?;
            while self.buf.len() < n {
                if self.eof {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("EOF after {} of {n} body bytes; head: {resp:?}", self.buf.len()),
                    ));
                }
                self.fill_ctx("response body")?;
            }
            resp.body = self.buf.drain(..n).collect();
        } else {
            // No length: delimited by close.
            while !self.eof {
                self.fill_ctx("close-delimited body")?;
            }
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    fn fill_ctx(&mut self, what: &str) -> io::Result<usize> {
        self.fill().map_err(|e| {
            let kind = e.kind();
            io::Error::new(
                kind,
                format!(
                    "{e} while reading {what} (after {:?}); partial: {:?}",
                    self.timeout,
                    String::from_utf8_lossy(tail_bytes(&self.buf, 400))
                ),
            )
        })
    }

    fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    break i;
                }
                if self.eof {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in chunk size"));
                }
                self.fill_ctx("chunk size")?;
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            self.buf.drain(..line_end + 2);
            let size_str = line.split(';').next().unwrap().trim();
            let size = usize::from_str_radix(size_str, 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}")))?;
            if size == 0 {
                // Trailers until an empty line.
                loop {
                    let end = loop {
                        if let Some(i) = find(&self.buf, b"\r\n") {
                            break i;
                        }
                        if self.eof {
                            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in trailers"));
                        }
                        self.fill_ctx("trailers")?;
                    };
                    self.buf.drain(..end + 2);
                    if end == 0 {
                        return Ok(body);
                    }
                }
            }
            while self.buf.len() < size + 2 {
                if self.eof {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in chunk data"));
                }
                self.fill_ctx("chunk data")?;
            }
            body.extend_from_slice(&self.buf[..size]);
            self.buf.drain(..size + 2);
        }
    }

    /// Waits up to `within` for the server to close the connection. `Ok(elapsed)` on EOF
    /// or reset with nothing more received; `Err` describing what happened otherwise
    /// (bytes arrived, or still open at the deadline).
    pub fn expect_close(&mut self, within: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        if !self.buf.is_empty() {
            return Err(format!("unexpected bytes instead of close: {:?}", String::from_utf8_lossy(&self.buf)));
        }
        if self.eof {
            return Ok(start.elapsed());
        }
        self.stream.set_read_timeout(Some(within.max(Duration::from_millis(1)))).unwrap();
        let r = self.fill();
        self.stream.set_read_timeout(Some(self.timeout)).unwrap();
        match r {
            Ok(0) => Ok(start.elapsed()),
            Ok(_) => Err(format!(
                "unexpected bytes instead of close: {:?}",
                String::from_utf8_lossy(tail_bytes(&self.buf, 600))
            )),
            Err(e) if is_timeout(&e) => Err(format!("connection still open after {within:?}")),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(start.elapsed()),
            Err(e) => Err(format!("read error {e}")),
        }
    }

    /// Asserts the server closes the connection within `within` (EOF or reset).
    pub fn assert_closed(&mut self, within: Duration, what: &str) {
        if let Err(e) = self.expect_close(within) {
            panic!("{what}: expected the server to close the connection: {e}{}", self.ctx());
        }
    }
}

fn log_suffix(p: &Option<PathBuf>) -> String {
    match p {
        Some(p) => {
            let log = fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            format!("\n--- server log (tail) ---\n{}", tail(&log, 6000))
        }
        None => String::new(),
    }
}

fn tail_bytes(b: &[u8], n: usize) -> &[u8] {
    &b[b.len().saturating_sub(n)..]
}

pub fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Writes `bytes` on a fresh connection and reads responses until the server closes the
/// connection (or a read times out). Returns the responses and whether it closed.
pub fn send_raw(addr: SocketAddr, bytes: &[u8]) -> (Vec<Response>, bool) {
    let mut c = Conn::open(addr);
    let _ = c.try_write(bytes);
    let mut out = Vec::new();
    loop {
        match c.try_read_response(false) {
            Ok(r) => out.push(r),
            Err(e) => {
                let closed =
                    c.eof || e.kind() == io::ErrorKind::ConnectionReset || e.kind() == io::ErrorKind::UnexpectedEof;
                return (out, closed);
            }
        }
    }
}

/// `GET path` on a fresh connection to `addr`.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    let mut c = Conn::open(addr);
    c.get(path)
}

// ---------------------------------------------------------------------------------------
// Background load
// ---------------------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct HammerReport {
    pub ok: usize,
    pub failures: Vec<String>,
    /// `(when, pid)` from `/_debug/pid` answers (when the path is `/_debug/pid`).
    pub pids: Vec<(Instant, i32)>,
}

/// Sends `GET path` on fresh connections in a loop (every ~20 ms) until stopped,
/// recording every failure (error or non-200).
pub struct Hammer {
    stop: Arc<AtomicBool>,
    done: Arc<std::sync::atomic::AtomicUsize>,
    handle: Option<JoinHandle<HammerReport>>,
}

impl Hammer {
    pub fn start(addr: SocketAddr, path: &str) -> Hammer {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let d2 = done.clone();
        let path = path.to_string();
        let handle = thread::spawn(move || {
            let mut rep = HammerReport::default();
            while !s2.load(Ordering::Relaxed) {
                let r = (|| -> io::Result<Response> {
                    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
                    let mut c = Conn::from_stream(s, None);
                    c.set_timeout(Duration::from_secs(8));
                    c.try_write(&request("GET", &path, &[], b""))?;
                    c.try_read_response(false)
                })();
                match r {
                    Ok(r) if r.status == 200 => {
                        rep.ok += 1;
                        if let Some(p) =
                            serde_json::from_slice::<serde_json::Value>(&r.body).ok().and_then(|v| v["pid"].as_i64())
                        {
                            rep.pids.push((Instant::now(), p as i32));
                        }
                    }
                    Ok(r) => rep.failures.push(format!("status {}: {:?}", r.status, r)),
                    Err(e) => rep.failures.push(format!("error: {e}")),
                }
                d2.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(20));
            }
            rep
        });
        Hammer { stop, done, handle: Some(handle) }
    }

    /// Requests completed so far (success or failure).
    pub fn count(&self) -> usize {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` more requests complete (bounded by `timeout`).
    pub fn wait_more(&self, n: usize, timeout: Duration) -> bool {
        let start = self.count();
        eventually(timeout, || self.count() >= start + n)
    }

    pub fn finish(mut self) -> HammerReport {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().expect("hammer thread")
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Small validators (no extra crates)
// ---------------------------------------------------------------------------------------

/// Lower-case UUID v4, 8-4-4-4-12.
pub fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 36 {
        return false;
    }
    for (i, &c) in b.iter().enumerate() {
        let ok = match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        };
        if !ok {
            return false;
        }
    }
    b[14] == b'4' && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) to Unix seconds.
pub fn parse_imf_fixdate(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 29 || &s[3..5] != ", " || b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || &s[25..] != " GMT" {
        return None;
    }
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let wd = DAYS.iter().position(|d| *d == &s[0..3])?;
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        if s[r.clone()].bytes().all(|c| c.is_ascii_digit()) {
            s[r].parse().ok()
        } else {
            None
        }
    };
    let day = num(5..7)?;
    let month = MONTHS.iter().position(|m| *m == &s[8..11])? as i64 + 1;
    let year = num(12..16)?;
    if &s[19..20] != ":" || &s[22..23] != ":" {
        return None;
    }
    let (h, mi, se) = (num(17..19)?, num(20..22)?, num(23..25)?);
    if !(1..=31).contains(&day) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    // days from civil (Howard Hinnant)
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    // 1970-01-01 was a Thursday (index 3).
    if (days + 3).rem_euclid(7) as usize != wd {
        return None;
    }
    Some(days * 86400 + h * 3600 + mi * 60 + se)
}

pub fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Decodes base64 (standard or URL-safe alphabet, padding optional).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return None;
    }
    Some(out)
}

/// The media type of a Content-Type value, lower-cased, without parameters.
pub fn media_type(ct: Option<&str>) -> Option<String> {
    ct.map(|v| v.split(';').next().unwrap().trim().to_ascii_lowercase())
}

/// Asserts a JSON error response: status, `Content-Type: application/json`, a string
/// `code` (equal to `code` when given) and a string `message`.
pub fn assert_json_error(r: &Response, status: u16, code: Option<&str>, what: &str) {
    assert_eq!(r.status, status, "{what}: expected status {status}, got {r:?}");
    assert_eq!(
        media_type(r.header("content-type")).as_deref(),
        Some("application/json"),
        "{what}: expected Content-Type application/json, got {r:?}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {r:?}"));
    assert!(v["code"].is_string(), "{what}: expected a string `code` in the error body, got {r:?}");
    assert!(v["message"].is_string(), "{what}: expected a string `message` in the error body, got {r:?}");
    if let Some(code) = code {
        assert_eq!(v["code"].as_str(), Some(code), "{what}: expected code {code:?}, got {r:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Self-tests of the harness (no server needed)
// ---------------------------------------------------------------------------------------

mod selftest {
    use super::*;

    /// A one-shot canned server: accepts one connection, reads until `\r\n\r\n`,
    /// writes `reply`, then closes (or not).
    fn canned(reply: &'static [u8], close: bool) -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            let mut tmp = [0u8; 1024];
            while find(&buf, b"\r\n\r\n").is_none() {
                let n = s.read(&mut tmp).unwrap();
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            s.write_all(reply).unwrap();
            if !close {
                thread::sleep(Duration::from_millis(300));
            }
        });
        (addr, h)
    }

    #[test]
    fn harness_reads_content_length_chunked_and_close_delimited() {
        let (addr, h) = canned(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: b\r\n\r\nabc\
              HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nfoo\r\n0\r\nT: 1\r\n\r\n\
              HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\n\r\n\
              HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nrest",
            true,
        );
        let (rs, closed) = send_raw(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        h.join().unwrap();
        assert!(closed);
        assert_eq!(rs.len(), 4, "{rs:?}");
        assert_eq!((rs[0].status, rs[0].body.as_slice(), rs[0].header("X-A")), (200, &b"abc"[..], Some("b")));
        assert_eq!((rs[1].status, rs[1].body.as_slice()), (201, &b"foo"[..]));
        assert_eq!((rs[2].status, rs[2].body.len(), rs[2].header("etag")), (304, 0, Some("\"e\"")));
        assert_eq!((rs[3].status, rs[3].body.as_slice(), rs[3].closes()), (200, &b"rest"[..], true));
    }

    #[test]
    fn harness_head_response_and_timeouts() {
        let (addr, h) = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n", false);
        let mut c = Conn::open(addr);
        c.send(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = c.read_head_response();
        assert_eq!((r.status, r.body.len()), (200, 0));
        assert!(c.expect_close(Duration::from_millis(100)).is_err(), "still open");
        assert!(c.expect_close(Duration::from_secs(2)).is_ok(), "closed after the canned server ends");
        h.join().unwrap();
    }

    #[test]
    fn harness_validators() {
        assert_eq!(parse_imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
        assert_eq!(parse_imf_fixdate("Mon, 06 Nov 1994 08:49:37 GMT"), None, "wrong weekday");
        assert_eq!(parse_imf_fixdate("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert!(is_uuid_v4("0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(!is_uuid_v4("0F8FAD5B-D9CB-469F-A165-70867728950E"));
        assert!(!is_uuid_v4("0f8fad5b-d9cb-169f-a165-70867728950e"));
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").unwrap().len(), 32);
        assert!(base64_decode("a*b").is_none());
        let cfg = render_config("127.0.0.1:1", Path::new("/d"), "workers = 3\n[limits]\nx = 1");
        assert!(cfg.contains("workers = 3") && !cfg.contains("workers = 1"), "{cfg}");
        assert!(cfg.contains("[debug]\nroutes = true"), "{cfg}");
        let cfg = Server::builder()
            .set("debug", "routes = false")
            .set("limits", "a = 1")
            .set("limits", "b = 2")
            .to_extra_toml();
        assert_eq!(cfg, "\n[debug]\nroutes = false\n\n[limits]\na = 1\nb = 2\n");
    }
}

// =======================================================================================
// API helpers: users, posts, auth (CONTRACT §3, §5). Appended; nothing above depends on it.
// =======================================================================================

use base64::Engine as _;
use serde_json::{json, Value};

/// 48 known characters: configured as `[auth] jwt_secret` where a test forges tokens.
pub const TEST_JWT_SECRET: &str = "forkd-it-secret-0123456789abcdefghijklmnopqrstuv";

/// Bound for one request whose handler hashes a password with the REAL argon2 parameters
/// (the test binary is a debug build, where argon2 is slow).
pub const SLOW_IO_TIMEOUT: Duration = Duration::from_secs(60);

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

static UNIQUE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fresh e-mail address `prefix-N@x.io` (unique within this test process).
pub fn unique_email(prefix: &str) -> String {
    format!("{prefix}-{}@x.io", UNIQUE.fetch_add(1, Ordering::Relaxed))
}

impl ServerBuilder {
    /// argon2id at 1 MiB / 1 iteration: fast password hashing for tests that do not time it.
    pub fn fast_argon2(self) -> Self {
        self.set("auth", "argon2_memory_kib = 1024\nargon2_iterations = 1")
    }

    /// Rate limiting off, so suites that send many `/api` requests are not throttled.
    pub fn no_rate_limit(self) -> Self {
        self.set("rate_limit", "enabled = false")
    }

    /// `[auth] jwt_secret = "<secret>"`.
    pub fn jwt_secret(self, secret: &str) -> Self {
        self.set("auth", &format!("jwt_secret = \"{secret}\""))
    }

    /// The database directory (kept by the caller, e.g. to restart on the same data).
    pub fn data_dir(self, p: &Path) -> Self {
        self.top(&format!("data_dir = \"{}\"", p.display()))
    }
}

impl Server {
    /// The defaults for API tests: 1 worker, fast argon2, no rate limit, the known secret.
    pub fn api_builder() -> ServerBuilder {
        Server::builder().fast_argon2().no_rate_limit().jwt_secret(TEST_JWT_SECRET)
    }

    pub fn start_api() -> Server {
        Self::api_builder().start()
    }

    /// The config file the server was started with.
    pub fn config_path(&self) -> PathBuf {
        self.dir().join("forkd.toml")
    }

    /// One request on a fresh connection (read timeout `timeout`).
    pub fn call_t(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Response {
        if self.proto == Proto::H2c {
            let mut c = self.h2c();
            return h2_exchange(&mut c, method, path, headers, body, timeout)
                .unwrap_or_else(|e| panic!("h2c {e}\n--- server log (tail) ---\n{}", self.log_tail()));
        }
        let mut c = self.conn();
        c.set_timeout(timeout);
        c.send(&request(method, path, headers, body));
        if method == "HEAD" {
            c.read_head_response()
        } else {
            c.read_response()
        }
    }

    /// One request on a fresh connection, in this server's protocol, without panicking:
    /// `Err` when no whole response came within `timeout` (or the stream was reset).
    pub fn try_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, String> {
        match self.proto {
            Proto::H1 => {
                let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
                let mut c = Conn::from_stream(s, None);
                c.set_timeout(timeout);
                c.try_write(&request(method, path, headers, body)).map_err(|e| format!("write: {e}"))?;
                c.try_read_response(method == "HEAD").map_err(|e| e.to_string())
            }
            Proto::H2c => h2_exchange(&mut self.h2c(), method, path, headers, body, timeout),
        }
    }

    /// One request on a fresh connection.
    pub fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        self.call_t(method, path, headers, body, IO_TIMEOUT)
    }

    /// A JSON request: `Authorization: Bearer <token>` when given, the body serialized with
    /// `Content-Type: application/json` when given, then `extra` headers.
    pub fn api_h(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
        extra: &[(&str, &str)],
    ) -> Response {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut h: Vec<(&str, &str)> = Vec::new();
        if let Some(a) = &auth {
            h.push(("Authorization", a));
        }
        if body.is_some() {
            h.push(("Content-Type", "application/json"));
        }
        h.extend_from_slice(extra);
        let b = body.map(|v| serde_json::to_vec(v).unwrap()).unwrap_or_default();
        self.call(method, path, &h, &b)
    }

    pub fn api(&self, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Response {
        self.api_h(method, path, token, body, &[])
    }

    /// Sends one request on a fresh keep-alive connection, asserts `status` and no body
    /// (no byte of one: a `GET /health` on the same connection must parse cleanly next).
    pub fn expect_bodyless(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        status: u16,
        what: &str,
    ) -> Response {
        if self.proto == Proto::H2c {
            // The stream ends with no DATA; the connection carries on.
            let mut c = self.h2c();
            let r = h2_exchange(&mut c, method, path, headers, b"", IO_TIMEOUT)
                .unwrap_or_else(|e| panic!("{what}: h2c {e}\n{}", self.log_tail()));
            ensure!(self, r.status == status, "{what}: expected status {status}, got {}:\n{r:?}", r.status);
            ensure!(
                self,
                r.body.is_empty() && r.header("content-length").is_none_or(|v| v == "0"),
                "{what}: a {status} must have no body: {r:?}"
            );
            let h = h2_exchange(&mut c, "GET", "/health", &[], b"", IO_TIMEOUT);
            ensure!(
                self,
                matches!(&h, Ok(h) if h.status == 200),
                "{what}: the connection is unusable after the {status}: {h:?}"
            );
            return r;
        }
        let mut c = self.conn();
        c.send(&request(method, path, headers, b""));
        let r = c.read_response();
        ensure!(self, r.status == status, "{what}: expected status {status}, got {}:\n{r:?}", r.status);
        ensure!(
            self,
            r.body.is_empty() && r.header("content-length").is_none_or(|v| v == "0"),
            "{what}: a {status} must have no body: {r:?}"
        );
        ensure!(self, r.header("transfer-encoding").is_none(), "{what}: a {status} must not be chunked: {r:?}");
        if !r.closes() {
            let stray = c.poll_readable(Duration::from_millis(100));
            ensure!(
                self,
                !stray || c.pending().is_empty(),
                "{what}: bytes after the {status}: {:?}",
                String::from_utf8_lossy(c.pending())
            );
            c.send(&request("GET", "/health", &[], b""));
            let h = c.try_read_response(false);
            ensure!(
                self,
                matches!(&h, Ok(h) if h.status == 200),
                "{what}: the connection is unusable after the {status}: {h:?}"
            );
        }
        r
    }

    /// Asserts a success envelope `{"code": status, "message": "OK"|"Created", "data"}` with
    /// `Content-Type: application/json`; returns `data`.
    pub fn expect_data(&self, r: &Response, status: u16, what: &str) -> Value {
        ensure!(self, r.status == status, "{what}: expected status {status}, got {}:\n{r:?}", r.status);
        ensure_eq!(
            self,
            media_type(r.header("content-type")).as_deref(),
            Some("application/json"),
            "{what}: Content-Type of {r:?}"
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {r:?}\n{}", self.log_tail()));
        ensure_eq!(self, v["code"].as_u64(), Some(status as u64), "{what}: envelope `code` in {r:?}");
        let msg = if status == 201 { "Created" } else { "OK" };
        ensure_eq!(self, v["message"].as_str(), Some(msg), "{what}: envelope `message` in {r:?}");
        ensure!(self, v.get("data").is_some(), "{what}: no `data` in {r:?}");
        v["data"].clone()
    }

    /// Asserts an error: status, JSON content type, `{"code": code, "message": <string>}`;
    /// returns the body.
    pub fn expect_err(&self, r: &Response, status: u16, code: &str, what: &str) -> Value {
        ensure!(self, r.status == status, "{what}: expected status {status} {code}, got {}:\n{r:?}", r.status);
        ensure_eq!(
            self,
            media_type(r.header("content-type")).as_deref(),
            Some("application/json"),
            "{what}: error Content-Type of {r:?}"
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {r:?}\n{}", self.log_tail()));
        ensure_eq!(self, v["code"].as_str(), Some(code), "{what}: error `code` in {r:?}");
        ensure!(self, v["message"].is_string(), "{what}: error without a string `message`: {r:?}");
        v
    }

    /// Asserts a 422 VALIDATION_ERROR whose `errors` name (at least) every one of `fields`.
    pub fn expect_invalid(&self, r: &Response, fields: &[&str], what: &str) -> Value {
        let v = self.expect_err(r, 422, "VALIDATION_ERROR", what);
        let got = error_fields(&v);
        for f in fields {
            ensure!(self, got.iter().any(|g| g == f), "{what}: `errors` must name field {f:?}; named {got:?} in {r:?}");
        }
        v
    }

    /// `forkd user create … --password-stdin --config <this server's config>`.
    pub fn user_create_cli(&self, args: &[&str], stdin: &[u8]) -> CliOutput {
        let cfg = self.config_path();
        let mut a: Vec<&str> = vec!["user", "create"];
        a.extend_from_slice(args);
        a.push("--config");
        a.push(cfg.to_str().unwrap());
        run_forkd_input(self.dir(), &a, &[], stdin)
    }

    /// Creates a user with the CLI (exit 0 required); returns the JSON object it printed.
    pub fn create_user(&self, email: &str, name: &str, role: &str, password: &str) -> Value {
        let out = self.user_create_cli(
            &["--email", email, "--name", name, "--role", role, "--password-stdin"],
            format!("{password}\n").as_bytes(),
        );
        ensure!(self, out.code() == Some(0), "`forkd user create --email {email}` must exit 0: {out:?}");
        let v: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("`forkd user create` must print the user as one JSON object ({e}): {out:?}"));
        ensure!(self, v["id"].is_i64() && v["email"].is_string(), "`user create` printed no user: {v}");
        v
    }

    /// Logs in; asserts 200. Returns (access token, refresh token, Set-Cookie values).
    pub fn login(&self, email: &str, password: &str) -> (String, String, Vec<String>) {
        self.login_at("/api/v1/auth/login", email, password)
    }

    pub fn login_at(&self, path: &str, email: &str, password: &str) -> (String, String, Vec<String>) {
        let body = serde_json::to_vec(&json!({"email": email, "password": password})).unwrap();
        let r = self.call_t("POST", path, &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT);
        let d = self.expect_data(&r, 200, &format!("POST {path} as {email}"));
        let access = d["accessToken"].as_str().unwrap_or_else(|| panic!("no accessToken in {r:?}")).to_string();
        let refresh = d["refreshToken"].as_str().unwrap_or_else(|| panic!("no refreshToken in {r:?}")).to_string();
        let cookies = r.header_all("set-cookie").into_iter().map(str::to_string).collect();
        (access, refresh, cookies)
    }

    /// A fresh admin (CLI) and its access token.
    pub fn admin(&self) -> (Value, String) {
        let email = unique_email("admin");
        let u = self.create_user(&email, "Admin", "admin", "admin-password-1");
        let (t, _, _) = self.login(&email, "admin-password-1");
        (u, t)
    }

    /// Signs up `{name, email, password}` (+`age` when given); asserts 201; returns the user.
    pub fn signup(&self, name: &str, email: &str, password: &str, age: Option<i64>) -> Value {
        let mut b = json!({"name": name, "email": email, "password": password});
        if let Some(a) = age {
            b["age"] = json!(a);
        }
        let body = serde_json::to_vec(&b).unwrap();
        let r = self.call_t("POST", "/api/v1/users", &[("Content-Type", "application/json")], &body, SLOW_IO_TIMEOUT);
        self.expect_data(&r, 201, &format!("sign-up {b}"))
    }

    /// A fresh user (sign-up) and its access token: (user, token, password).
    pub fn user(&self, name: &str) -> (Value, String) {
        let email = unique_email(&name.to_ascii_lowercase().replace(' ', "-"));
        let u = self.signup(name, &email, "user-password-1", None);
        let (t, _, _) = self.login(&email, "user-password-1");
        (u, t)
    }

    /// `total` of `GET /api/v1/users?<query>` (asserts 200).
    pub fn user_total(&self, token: &str, query: &str) -> i64 {
        let path = if query.is_empty() { "/api/v1/users".to_string() } else { format!("/api/v1/users?{query}") };
        let r = self.api("GET", &path, Some(token), None);
        let d = self.expect_data(&r, 200, &format!("GET {path}"));
        d["total"].as_i64().unwrap_or_else(|| panic!("no integer total in {r:?}"))
    }

    /// Every user, paging with `limit=100`.
    pub fn all_users(&self, token: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for page in 1..1000 {
            let r = self.api("GET", &format!("/api/v1/users?limit=100&page={page}"), Some(token), None);
            let d = self.expect_data(&r, 200, "GET /api/v1/users (all pages)");
            let items = d["items"].as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                break;
            }
            out.extend(items);
        }
        out
    }
}

/// The `field` names of an error body's `errors`.
pub fn error_fields(v: &Value) -> Vec<String> {
    v["errors"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["field"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Like [`run_forkd`], with `input` on standard input.
pub fn run_forkd_input(cwd: &Path, args: &[&str], env: &[(&str, &str)], input: &[u8]) -> CliOutput {
    let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
    let out_path = cwd.join(format!(".cli-{}-{n}-stdout", std::process::id()));
    let err_path = cwd.join(format!(".cli-{}-{n}-stderr", std::process::id()));
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    clear_forkd_env(&mut cmd);
    cmd.env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn forkd");
    {
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(input); // the child may exit without reading (bad input)
    }
    let Some(status) = wait_child(&mut child, Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "`forkd {}` did not exit within 30 s; stderr:\n{}",
            args.join(" "),
            fs::read_to_string(&err_path).unwrap_or_default()
        );
    };
    let stdout = String::from_utf8_lossy(&fs::read(&out_path).unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&fs::read(&err_path).unwrap_or_default()).into_owned();
    let _ = fs::remove_file(&out_path);
    let _ = fs::remove_file(&err_path);
    CliOutput { status, stdout, stderr }
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for query values).
pub fn urlencode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)`: an RFC 3339 timestamp in UTC.
pub fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20 {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if !(digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10))
        || !(b[10] == b'T' || b[10] == b't')
        || !(digits(11..13) && b[13] == b':' && digits(14..16) && b[16] == b':' && digits(17..19))
    {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &r[n..];
    }
    let (mo, d, h, mi) = (&s[5..7], &s[8..10], &s[11..13], &s[14..16]);
    let ok_ranges = ("01"..="12").contains(&mo) && ("01"..="31").contains(&d) && h <= "23" && mi <= "59";
    ok_ranges && matches!(rest, "Z" | "z" | "+00:00")
}

/// Checks the public shape of a user object (CONTRACT §5): the seven fields with their
/// types and never anything that looks like a password or a hash. Returns a list of
/// problems (empty when fine).
pub fn user_shape_problems(u: &Value) -> Vec<String> {
    let mut p = Vec::new();
    let Some(o) = u.as_object() else { return vec![format!("not an object: {u}")] };
    if !u["id"].is_i64() {
        p.push(format!("id is not an integer: {}", u["id"]));
    }
    if !u["name"].is_string() {
        p.push(format!("name is not a string: {}", u["name"]));
    }
    if !u["email"].is_string() {
        p.push(format!("email is not a string: {}", u["email"]));
    }
    if !(o.contains_key("age") && (u["age"].is_null() || u["age"].is_i64())) {
        p.push(format!("age must be present, an integer or null: {:?}", o.get("age")));
    }
    if !matches!(u["role"].as_str(), Some("user") | Some("admin")) {
        p.push(format!("role must be user|admin: {}", u["role"]));
    }
    for k in ["createdAt", "updatedAt"] {
        if !u[k].as_str().map(is_rfc3339_utc).unwrap_or(false) {
            p.push(format!("{k} is not RFC 3339 UTC: {}", u[k]));
        }
    }
    for k in o.keys() {
        let l = k.to_ascii_lowercase();
        if l.contains("pass") || l.contains("hash") || l.contains("salt") {
            p.push(format!("secret-looking key {k:?}"));
        }
    }
    p
}

/// True when `text` carries something that looks like a password or a password hash.
pub fn leaks_secret(text: &str, password: &str) -> bool {
    let l = text.to_ascii_lowercase();
    l.contains("password")
        || l.contains("passwordhash")
        || l.contains("$argon2")
        || l.contains("hash")
        || text.contains(password)
}

// ---- JWT forging (HMAC over sha2, no extra crate) ----

/// HMAC (RFC 2104) with SHA-256 / SHA-384 / SHA-512, selected by JWS alg name.
pub fn hmac(alg: &str, key: &[u8], msg: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    fn h<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
        let mut d = D::new();
        for p in parts {
            d.update(p);
        }
        d.finalize().to_vec()
    }
    type HashFn = fn(&[&[u8]]) -> Vec<u8>;
    let (block, hash): (usize, HashFn) = match alg {
        "HS256" => (64, h::<sha2::Sha256>),
        "HS384" => (128, h::<sha2::Sha384>),
        "HS512" => (128, h::<sha2::Sha512>),
        _ => panic!("hmac: unsupported alg {alg}"),
    };
    let mut k = if key.len() > block { hash(&[key]) } else { key.to_vec() };
    k.resize(block, 0);
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = hash(&[&ipad, msg]);
    hash(&[&opad, &inner])
}

pub fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// `b64(header).b64(claims).b64(HMAC-<sig_alg>(secret, signing input))`; `sig_alg` "" for
/// an empty signature.
pub fn jwt_sign(header: &Value, claims: &Value, sig_alg: &str, secret: &[u8]) -> String {
    let input = format!("{}.{}", b64url(header.to_string().as_bytes()), b64url(claims.to_string().as_bytes()));
    let sig = if sig_alg.is_empty() { String::new() } else { b64url(&hmac(sig_alg, secret, input.as_bytes())) };
    format!("{input}.{sig}")
}

/// Splits a JWT: (header, claims, signature bytes). Panics when it is not one.
pub fn jwt_parts(token: &str) -> (Value, Value, Vec<u8>) {
    let p: Vec<&str> = token.split('.').collect();
    assert_eq!(p.len(), 3, "not a JWT (three dot-separated parts): {token:?}");
    let dec = |s: &str| base64_decode(s).unwrap_or_else(|| panic!("JWT part is not base64url: {s:?} in {token:?}"));
    let header = serde_json::from_slice(&dec(p[0])).unwrap_or_else(|e| panic!("JWT header not JSON ({e}): {token}"));
    let claims = serde_json::from_slice(&dec(p[1])).unwrap_or_else(|e| panic!("JWT claims not JSON ({e}): {token}"));
    (header, claims, dec(p[2]))
}

/// Claims the service would issue for `user_id`/`role`, valid for 15 minutes from now.
pub fn good_claims(user_id: i64, role: &str) -> Value {
    let now = now_unix();
    json!({"userId": user_id, "role": role, "iss": "forkd", "aud": "forkd-api", "iat": now, "exp": now + 900,
           "jti": format!("forged-{}", UNIQUE.fetch_add(1, Ordering::Relaxed)), "gen": 0, "iatMs": now * 1000})
}

// ---- Set-Cookie ----

#[derive(Debug, Clone)]
pub struct SetCookie {
    pub name: String,
    pub value: String,
    /// Attribute names lower-cased, values as sent ("" for flags).
    pub attrs: Vec<(String, String)>,
}

impl SetCookie {
    pub fn parse(s: &str) -> SetCookie {
        let mut parts = s.split(';');
        let (name, value) = parts.next().unwrap_or("").split_once('=').unwrap_or((s, ""));
        let attrs = parts
            .map(|a| {
                let (k, v) = a.split_once('=').unwrap_or((a, ""));
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .filter(|(k, _)| !k.is_empty())
            .collect();
        SetCookie { name: name.trim().to_string(), value: value.trim().to_string(), attrs }
    }

    pub fn attr(&self, name: &str) -> Option<&str> {
        let n = name.to_ascii_lowercase();
        self.attrs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }
}

/// The `Set-Cookie` of `name` among `headers` (the last one when several).
pub fn find_cookie(headers: &[String], name: &str) -> Option<SetCookie> {
    headers.iter().map(|h| SetCookie::parse(h)).rfind(|c| c.name == name)
}

pub fn set_cookies(r: &Response) -> Vec<String> {
    r.header_all("set-cookie").into_iter().map(str::to_string).collect()
}

mod selftest_api {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn harness_hmac_matches_rfc4231_and_long_keys() {
        let m = b"what do ya want for nothing?";
        assert_eq!(hex(&hmac("HS256", b"Jefe", m)), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        assert_eq!(
            hex(&hmac("HS384", b"Jefe", m)),
            "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649"
        );
        assert_eq!(
            hex(&hmac("HS512", b"Jefe", m)),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
        let k = [b'k'; 200];
        assert_eq!(hex(&hmac("HS256", &k, b"msg")), "e2adadca233bc31c6e6126c865132c3e945f9dedd44797a1e5acc3c037bc21fc");
        assert_eq!(
            hex(&hmac("HS512", &k, b"msg")),
            "b5245971beb52a5a986812c4666a05c735bf5bb7aba32eae2192adad605df4112d6c285d1c46cf81ccb7ab8c2c3b7b3c6793216909b5add05223ed21f24cdb1e"
        );
    }

    #[test]
    fn harness_jwt_cookie_and_time_helpers() {
        let h = json!({"alg":"HS256","typ":"JWT"});
        let t = jwt_sign(&h, &json!({"sub":"1"}), "HS256", b"s");
        let (hh, cc, sig) = jwt_parts(&t);
        assert_eq!((hh, cc, sig.len()), (h, json!({"sub":"1"}), 32));
        assert!(jwt_sign(&json!({"alg":"none"}), &json!({}), "", b"").ends_with('.'));
        let c = SetCookie::parse(
            "refresh_token=abc=; Path=/api/v1/auth; HttpOnly; secure; SameSite=Strict; Max-Age=604800",
        );
        assert_eq!((c.name.as_str(), c.value.as_str()), ("refresh_token", "abc="));
        assert_eq!(c.attr("path"), Some("/api/v1/auth"));
        assert!(c.has("httponly") && c.has("Secure") && !c.has("domain"));
        assert_eq!(c.attr("max-age"), Some("604800"));
        assert!(is_rfc3339_utc("2024-05-01T10:11:12Z"));
        assert!(is_rfc3339_utc("2024-05-01T10:11:12.123456Z"));
        assert!(is_rfc3339_utc("2024-05-01T10:11:12+00:00"));
        assert!(!is_rfc3339_utc("2024-05-01 10:11:12"));
        assert!(!is_rfc3339_utc("2024-05-01T10:11:12+02:00"));
        assert!(!is_rfc3339_utc("1714558272"));
        assert_eq!(urlencode("a b%_'\\"), "a%20b%25_%27%5C");
    }
}

// =======================================================================================
// Cross-worker helpers: per-worker stream counts, SSE reader, minimal WebSocket client
// (CONTRACT §6, §7). Appended; nothing above depends on it.
// =======================================================================================

use std::collections::BTreeMap;

impl Server {
    /// One `GET /_debug/streams` on a fresh connection: `{"pid","sse","ws","members","connections"}`
    /// of the worker that answered.
    pub fn streams_once(&self) -> Option<Value> {
        let r = self.try_get("/_debug/streams", IO_TIMEOUT).ok()?;
        if r.status != 200 {
            return None;
        }
        let v: Value = serde_json::from_slice(&r.body).ok()?;
        v["pid"].as_i64()?;
        Some(v)
    }

    /// `/_debug/streams` polled over fresh connections until every one of the current
    /// worker pids has answered (bounded 5 s): the latest answer per pid. Panics otherwise.
    pub fn streams_by_pid(&self) -> BTreeMap<i32, Value> {
        let want = self.workers();
        let mut seen: BTreeMap<i32, Value> = BTreeMap::new();
        let ok = eventually(Duration::from_secs(5), || {
            if let Some(v) = self.streams_once() {
                seen.insert(v["pid"].as_i64().unwrap() as i32, v);
            }
            want.iter().all(|p| seen.contains_key(p))
        });
        if !ok {
            panic!(
                "/_debug/streams: did not hear from every worker {want:?} within 5 s; got {seen:?}\nlog:\n{}",
                self.log_tail()
            );
        }
        seen
    }

    /// Polls (bounded `timeout`) until `pred` holds for a complete per-worker snapshot;
    /// returns the last snapshot and whether it held.
    pub fn streams_until(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&BTreeMap<i32, Value>) -> bool,
    ) -> (BTreeMap<i32, Value>, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let snap = self.streams_by_pid();
            if pred(&snap) {
                return (snap, true);
            }
            if Instant::now() >= deadline {
                return (snap, false);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A fresh keep-alive connection known to be served by worker `pid` (asked with
    /// `/_debug/pid` on it); bounded to 300 connection attempts.
    pub fn conn_on(&self, pid: i32) -> Conn {
        for _ in 0..300 {
            let mut c = self.conn();
            let r = c.get("/_debug/pid");
            if r.status == 200 && r.json()["pid"].as_i64() == Some(pid as i64) && !r.closes() {
                return c;
            }
        }
        panic!("no connection landed on worker {pid} in 300 attempts\nlog:\n{}", self.log_tail());
    }

    /// A fresh connection and the pid of the worker serving it.
    pub fn conn_with_pid(&self) -> (Conn, i32) {
        let mut c = self.conn();
        let r = c.get("/_debug/pid");
        assert_eq!(r.status, 200, "GET /_debug/pid: {r:?}\nlog:\n{}", self.log_tail());
        let pid = r.json()["pid"].as_i64().unwrap() as i32;
        (c, pid)
    }
}

/// `v[key]` as i64, 0 when absent (for `/_debug/streams` counts).
pub fn count_of(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or(0)
}

// ---- One client, two protocols ----

/// The protocol a test speaks to the server: HTTP/1.1, or HTTP/2 in clear text with prior
/// knowledge (h2c). [`Server::call`] (and `api`, `get`, `login`, `signup`, `expect_bodyless`,
/// `try_get`, `sse`, …) speak the server's [`Server::proto`]; every request of an h2c server
/// goes on a fresh HTTP/2 connection, as every HTTP/1.1 one goes on a fresh TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2c,
}

impl Server {
    /// This server, spoken to over `p` by the helpers.
    pub fn on(mut self, p: Proto) -> Server {
        self.proto = p;
        self
    }

    pub fn set_proto(&mut self, p: Proto) {
        self.proto = p;
    }

    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// A fresh h2c connection (prior knowledge) to this server.
    pub fn h2c(&self) -> H2Client {
        H2Client::h2c(self.addr)
    }
}

/// One connection for several requests in turn: an HTTP/1.1 keep-alive connection, or one
/// HTTP/2 connection (a stream per request), as the server's [`Proto`] says.
pub enum Session {
    H1(Conn),
    H2(Box<H2Client>),
}

impl Session {
    /// One request and its whole response (HEAD: no body read over HTTP/1.1; over HTTP/2
    /// the stream must end without DATA).
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        match self {
            Session::H1(c) => {
                c.send(&request(method, path, headers, body));
                if method == "HEAD" {
                    c.read_head_response()
                } else {
                    c.read_response()
                }
            }
            Session::H2(c) => {
                h2_exchange(c, method, path, headers, body, IO_TIMEOUT).unwrap_or_else(|e| panic!("h2c {e}"))
            }
        }
    }

    pub fn get(&mut self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }
}

impl Server {
    /// A new connection for several requests, in this server's protocol.
    pub fn session(&self) -> Session {
        match self.proto {
            Proto::H1 => Session::H1(self.conn()),
            Proto::H2c => Session::H2(Box::new(self.h2c())),
        }
    }
}

/// Headers that HTTP/2 forbids (RFC 9113 §8.2.2) or expresses as pseudo-headers: not sent.
const H2_DROPPED: &[&str] = &["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"];

/// One exchange on `c` as a [`Response`] (`version` "HTTP/2", no reason phrase, header
/// names lower-case as HTTP/2 has them): `headers` as given but for the connection-specific
/// ones (a `Host` becomes `:authority`), `Content-Length` added for a body as the HTTP/1.1
/// [`request`] does. `Err` when the stream or the connection fails or `timeout` runs out.
pub fn h2_exchange(
    c: &mut H2Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, String> {
    let authority = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("host"))
        .map_or_else(|| c.addr.to_string(), |(_, v)| v.to_string());
    let mut b = http::Request::builder().method(method).uri(format!("http://{authority}{path}"));
    let mut has_length = false;
    for (k, v) in headers {
        if H2_DROPPED.iter().any(|d| k.eq_ignore_ascii_case(d)) {
            continue;
        }
        has_length |= k.eq_ignore_ascii_case("content-length");
        b = b.header(*k, *v);
    }
    if !body.is_empty() && !has_length {
        b = b.header("content-length", body.len());
    }
    let req = b.body(()).map_err(|e| format!("{method} {path}: not a valid HTTP/2 request: {e}"))?;
    let r = c.exchange(req, body, timeout)?;
    Ok(h2_response(r))
}

/// An HTTP/2 response in the shape of an HTTP/1.1 [`Response`].
pub fn h2_response(r: H2Response) -> Response {
    let headers = r
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    Response {
        version: "HTTP/2".into(),
        status: r.status,
        reason: String::new(),
        headers,
        body: r.body,
        interim: Box::new([]),
    }
}

/// `both!(name)` runs `fn name(p: Proto)` as two tests, `name::h1` and `name::h2c`;
/// `both!(name, h2c_ignore = "why")` marks the h2c one `#[ignore]` (a known forkd bug).
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[test]
            fn h1() {
                super::$name($crate::util::Proto::H1)
            }
            #[test]
            fn h2c() {
                super::$name($crate::util::Proto::H2c)
            }
        }
    };
    ($name:ident, h2c_ignore = $why:literal) => {
        mod $name {
            #[test]
            fn h1() {
                super::$name($crate::util::Proto::H1)
            }
            #[test]
            #[ignore = $why]
            fn h2c() {
                super::$name($crate::util::Proto::H2c)
            }
        }
    };
}
pub(crate) use both;

// ---- Server-sent events ----

/// One SSE event: the fields in order of arrival, plus the usual accessors.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub fields: Vec<(String, String)>,
}

impl SseEvent {
    /// One event block (its lines, without the blank line that ended it); comment and
    /// empty lines are skipped.
    pub fn parse(block: &str) -> SseEvent {
        let mut ev = SseEvent::default();
        for line in block.split('\n') {
            if line.starts_with(':') || line.is_empty() {
                continue;
            }
            let (k, v) = match line.split_once(':') {
                Some((k, v)) => (k, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            ev.fields.push((k.to_string(), v.to_string()));
        }
        ev
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    pub fn event(&self) -> Option<&str> {
        self.get("event")
    }
    pub fn id(&self) -> Option<&str> {
        self.get("id")
    }
    /// The `data` lines joined with `\n` ("" when none).
    pub fn data(&self) -> String {
        self.fields.iter().filter(|(k, _)| k == "data").map(|(_, v)| v.as_str()).collect::<Vec<_>>().join("\n")
    }
    pub fn data_json(&self) -> Value {
        serde_json::from_str(&self.data()).unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {self:?}"))
    }
}

/// An open `text/event-stream` response, de-chunked and parsed incrementally: on an
/// HTTP/1.1 connection, or one stream of an HTTP/2 connection (its DATA frames).
pub struct SseStream {
    src: SseSrc,
    pub head: Response,
    text: Vec<u8>,
    chunked: bool,
    ended: bool,
}

enum SseSrc {
    H1(Conn),
    H2(Box<(H2Client, h2::RecvStream)>),
}

impl SseStream {
    /// Sends `GET path` with `headers` on `conn` and reads the response head. `Err(resp)` (the
    /// whole response) when it is not a 200 stream.
    pub fn open_on(mut conn: Conn, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        conn.send(&request("GET", path, headers, b""));
        let head = conn.read_head_response();
        let is_stream =
            head.status == 200 && media_type(head.header("content-type")).as_deref() == Some("text/event-stream");
        let chunked = head
            .header("transfer-encoding")
            .map(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked"))
            .unwrap_or(false);
        if !is_stream {
            // Read the rest of a normal response for the error message.
            let mut head = head;
            if chunked {
                head.body = conn.read_chunked().unwrap_or_default();
            } else if let Some(n) = head.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
                while conn.buf.len() < n && conn.fill().map(|k| k > 0).unwrap_or(false) {}
                head.body = conn.buf.drain(..n.min(conn.buf.len())).collect();
            }
            return Err(head);
        }
        Ok(SseStream { src: SseSrc::H1(conn), head, text: Vec::new(), chunked, ended: false })
    }

    /// Sends `GET path` with `headers` as a new stream of `c` and waits for the response
    /// head. `Err(resp)` (the whole response) when it is not a 200 stream.
    pub fn open_h2(mut c: H2Client, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        let mut b = http::Request::builder().method("GET").uri(format!("http://{}{path}", c.addr));
        for (k, v) in headers.iter().filter(|(k, _)| !H2_DROPPED.iter().any(|d| k.eq_ignore_ascii_case(d))) {
            b = b.header(*k, *v);
        }
        let req = b.body(()).unwrap_or_else(|e| panic!("GET {path}: not a valid HTTP/2 request: {e}"));
        let (mut rf, _send) = c.start(req, true);
        let resp = c.head(&mut rf).unwrap_or_else(|e| panic!("GET {path} over h2c: {e}"));
        let (parts, mut recv) = resp.into_parts();
        let mut head =
            h2_response(H2Response { status: parts.status.as_u16(), headers: parts.headers, body: Vec::new() });
        let is_stream =
            head.status == 200 && media_type(head.header("content-type")).as_deref() == Some("text/event-stream");
        if !is_stream {
            head.body = c.body(&mut recv);
            return Err(head);
        }
        Ok(SseStream { src: SseSrc::H2(Box::new((c, recv))), head, text: Vec::new(), chunked: false, ended: false })
    }

    /// The HTTP/1.1 connection under the stream (panics for an HTTP/2 one).
    pub fn h1_conn(&mut self) -> &mut Conn {
        match &mut self.src {
            SseSrc::H1(c) => c,
            SseSrc::H2(_) => panic!("an HTTP/2 event stream has no HTTP/1.1 connection"),
        }
    }

    /// The TCP socket the stream arrives on.
    pub fn tcp(&self) -> &TcpStream {
        match &self.src {
            SseSrc::H1(c) => &c.stream,
            SseSrc::H2(b) => b.0.tcp(),
        }
    }

    /// Cuts the connection under the stream (both directions), as a client that goes away.
    pub fn shutdown(&self) {
        let _ = self.tcp().shutdown(std::net::Shutdown::Both);
    }

    /// Reads what arrives within `wait` into `text` (HTTP/2: the stream's DATA).
    fn fill_for(&mut self, wait: Duration) -> Result<(), String> {
        match &mut self.src {
            SseSrc::H1(conn) => {
                conn.stream.set_read_timeout(Some(wait.max(Duration::from_millis(1)))).unwrap();
                let r = conn.fill();
                conn.stream.set_read_timeout(Some(conn.timeout)).unwrap();
                match r {
                    Ok(_) => Ok(()),
                    Err(e) if is_timeout(&e) => Ok(()),
                    Err(e) => Err(format!("read error: {e}")),
                }
            }
            SseSrc::H2(b) => {
                let (c, recv) = &mut **b;
                let until = Instant::now() + wait;
                let had = self.text.len();
                loop {
                    match c.body_now(recv, &mut self.text) {
                        Ok(true) => {
                            self.ended = true;
                            return Ok(());
                        }
                        Ok(false) => {}
                        Err(e) => return Err(format!("stream error: {e}")),
                    }
                    if c.eof {
                        self.ended = true;
                        return Ok(());
                    }
                    if self.text.len() > had || Instant::now() >= until {
                        return Ok(());
                    }
                    c.pump();
                }
            }
        }
    }

    /// Moves de-chunked bytes from the connection buffer into `text`. Ok(false) when the
    /// body has ended (last chunk or EOF).
    fn dechunk(&mut self) -> Result<(), String> {
        let SseSrc::H1(conn) = &mut self.src else { return Ok(()) };
        if !self.chunked {
            self.text.append(&mut conn.buf);
            return Ok(());
        }
        loop {
            let buf = &conn.buf;
            let Some(le) = find(buf, b"\r\n") else { return Ok(()) };
            let line = String::from_utf8_lossy(&buf[..le]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
                .map_err(|_| format!("bad chunk size line {line:?}"))?;
            if size == 0 {
                self.ended = true;
                conn.buf.clear();
                return Ok(());
            }
            if buf.len() < le + 2 + size + 2 {
                return Ok(());
            }
            if &buf[le + 2 + size..le + 2 + size + 2] != b"\r\n" {
                return Err(format!("chunk of {size} bytes not followed by CRLF"));
            }
            self.text.extend_from_slice(&buf[le + 2..le + 2 + size]);
            conn.buf.drain(..le + 2 + size + 2);
        }
    }

    /// Takes one complete event (a block ended by a blank line) from `text`, if any.
    /// Blocks holding only comments are skipped.
    fn take_event(&mut self) -> Option<SseEvent> {
        loop {
            // CRLF line ends become LF (on bytes, so a UTF-8 sequence split across reads stays
            // intact); then the first blank line ends an event.
            if find(&self.text, b"\r\n").is_some() {
                let mut t = Vec::with_capacity(self.text.len());
                for (i, &b) in self.text.iter().enumerate() {
                    if !(b == b'\r' && self.text.get(i + 1) == Some(&b'\n')) {
                        t.push(b);
                    }
                }
                self.text = t;
            }
            let end = find(&self.text, b"\n\n")?;
            let ev = SseEvent::parse(&String::from_utf8_lossy(&self.text[..end]));
            self.text.drain(..end + 2);
            if !ev.fields.is_empty() {
                return Some(ev);
            }
        }
    }

    /// The next event within `timeout`. `Err` on timeout, EOF or a framing error.
    pub fn next(&mut self, timeout: Duration) -> Result<SseEvent, String> {
        let deadline = Instant::now() + timeout;
        loop {
            self.dechunk()?;
            if let Some(ev) = self.take_event() {
                return Ok(ev);
            }
            let eof = matches!(&self.src, SseSrc::H1(c) if c.eof);
            if self.ended || eof {
                return Err(format!(
                    "stream ended; unparsed: {:?}",
                    String::from_utf8_lossy(tail_bytes(&self.text, 400))
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "no complete event within {timeout:?}; unparsed: {:?}",
                    String::from_utf8_lossy(tail_bytes(&self.text, 400))
                ));
            }
            self.fill_for(deadline - now)?;
        }
    }

    /// The next event that is not a heartbeat, within `timeout`.
    pub fn next_non_heartbeat(&mut self, timeout: Duration) -> Result<SseEvent, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.next(left)?;
            if ev.event() != Some("heartbeat") {
                return Ok(ev);
            }
        }
    }

    /// Reads the preamble (`retry`, `connected`): asserts it and returns the retry value.
    pub fn expect_preamble(&mut self) -> Result<String, String> {
        let first = self.next(IO_TIMEOUT)?;
        let retry = first
            .fields
            .first()
            .filter(|(k, _)| k == "retry")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("the first field must be `retry`: {first:?}"))?;
        let connected = if first.event() == Some("connected") { first } else { self.next(IO_TIMEOUT)? };
        if connected.event() != Some("connected") {
            return Err(format!("expected `event: connected` after retry, got {connected:?}"));
        }
        let d: Value =
            serde_json::from_str(&connected.data()).map_err(|e| format!("connected data ({e}): {connected:?}"))?;
        if d != json!({"message": "connected"}) {
            return Err(format!("connected data must be {{\"message\":\"connected\"}}: {connected:?}"));
        }
        Ok(retry)
    }
}

impl Server {
    /// `GET path` (with `headers`) as an event stream on a fresh connection, in this server's
    /// protocol. `Err(the whole response)` unless it is a 200 `text/event-stream`.
    pub fn sse_at(&self, path: &str, headers: &[(&str, &str)]) -> Result<SseStream, Response> {
        match self.proto {
            Proto::H1 => SseStream::open_on(self.conn(), path, headers),
            Proto::H2c => SseStream::open_h2(self.h2c(), path, headers),
        }
    }

    /// Opens `GET /api/events` (with `headers`) on a fresh connection; panics unless 200
    /// `text/event-stream`. The preamble is not read.
    pub fn sse(&self, headers: &[(&str, &str)]) -> SseStream {
        match self.sse_at("/api/events", headers) {
            Ok(s) => s,
            Err(r) => panic!("GET /api/events: expected a 200 text/event-stream, got {r:?}\nlog:\n{}", self.log_tail()),
        }
    }

    /// Like [`Server::sse`], then reads and checks the preamble.
    pub fn sse_connected(&self, headers: &[(&str, &str)]) -> SseStream {
        let mut s = self.sse(headers);
        if let Err(e) = s.expect_preamble() {
            panic!("GET /api/events preamble: {e}\nlog:\n{}", self.log_tail());
        }
        s
    }

    /// `POST /api/v1/notifications` as `token`; asserts 201; returns `data`.
    pub fn notify(&self, token: &str, title: &str, body: &str) -> Value {
        let r = self.api("POST", "/api/v1/notifications", Some(token), Some(&json!({"title": title, "body": body})));
        self.expect_data(&r, 201, &format!("POST /api/v1/notifications {title:?}"))
    }
}

// ---- WebSocket (RFC 6455), client side ----

pub const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for `key`.
pub fn ws_accept(key: &str) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(key.as_bytes());
    h.update(WS_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    use rand::RngCore;
    let mut b = [0u8; N];
    rand::thread_rng().fill_bytes(&mut b);
    b
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsFrame {
    Text(String),
    Binary(Vec<u8>),
    /// Close code (None when the payload is empty) and reason.
    Close(Option<u16>, String),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

/// A WebSocket client over a raw TcpStream: masked frames out, server frames in.
pub struct Ws {
    pub stream: TcpStream,
    pub head: Response,
    buf: Vec<u8>,
    /// The server's close frame, once seen.
    pub closed: Option<WsFrame>,
}

/// The handshake request for `path` (extra headers after the standard ones) and its key.
pub fn ws_handshake_request(path: &str, headers: &[(&str, &str)]) -> (Vec<u8>, String) {
    let key = base64::engine::general_purpose::STANDARD.encode(rand_bytes::<16>());
    let mut h: Vec<(&str, &str)> = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", &key),
        ("Sec-WebSocket-Version", "13"),
    ];
    h.extend_from_slice(headers);
    (request("GET", path, &h, b""), key)
}

/// Appends one client frame to `out`: FIN as given, masked with a random key.
pub fn ws_client_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8], fin: bool) {
    out.push(if fin { 0x80 } else { 0 } | (opcode & 0x0f));
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else if n <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    let mask = rand_bytes::<4>();
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

impl Ws {
    /// Handshake on `conn`. `Err(response)` when the server does not answer 101 (then the
    /// whole response is read); panics when a 101 carries a wrong `Sec-WebSocket-Accept`.
    pub fn connect_on(mut conn: Conn, path: &str, headers: &[(&str, &str)]) -> Result<Ws, Response> {
        let (req, key) = ws_handshake_request(path, headers);
        conn.send(&req);
        let head = conn.read_head_response();
        if head.status != 101 {
            let mut r = head;
            if let Some(n) = r.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
                while conn.buf.len() < n && conn.fill().map(|k| k > 0).unwrap_or(false) {}
                r.body = conn.buf.drain(..n.min(conn.buf.len())).collect();
            } else if r.header("transfer-encoding").is_some() {
                r.body = conn.read_chunked().unwrap_or_default();
            }
            return Err(r);
        }
        assert_eq!(
            head.header("sec-websocket-accept"),
            Some(ws_accept(&key).as_str()),
            "101 with a wrong Sec-WebSocket-Accept: {head:?}"
        );
        let buf = std::mem::take(&mut conn.buf);
        let stream = conn.stream.try_clone().expect("clone stream");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        Ok(Ws { stream, head, buf, closed: None })
    }

    /// Bytes received but not yet parsed into frames (the caller reads the rest itself).
    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Writes one frame: FIN as given, masked with a random key.
    pub fn send_frame(&mut self, opcode: u8, payload: &[u8], fin: bool) -> io::Result<()> {
        let mut f = Vec::with_capacity(payload.len() + 14);
        ws_client_frame(&mut f, opcode, payload, fin);
        self.stream.write_all(&f)?;
        self.stream.flush()
    }

    pub fn send_text(&mut self, s: &str) {
        self.send_frame(0x1, s.as_bytes(), true).expect("WebSocket write (text)");
    }

    pub fn send_json(&mut self, v: &Value) {
        self.send_text(&v.to_string());
    }

    pub fn send_binary(&mut self, b: &[u8]) {
        self.send_frame(0x2, b, true).expect("WebSocket write (binary)");
    }

    pub fn ping(&mut self, payload: &[u8]) {
        self.send_frame(0x9, payload, true).expect("WebSocket write (ping)");
    }

    /// Sends a close frame with `code` (the server should answer with its own).
    pub fn close(&mut self, code: u16) {
        let _ = self.send_frame(0x8, &code.to_be_bytes(), true);
    }

    fn fill(&mut self, deadline: Instant) -> io::Result<()> {
        let now = Instant::now();
        if now >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline"));
        }
        self.stream.set_read_timeout(Some(deadline - now)).unwrap();
        let mut tmp = [0u8; 65536];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF")),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// One raw frame: (fin, opcode, payload). Server frames must not be masked.
    fn read_raw(&mut self, deadline: Instant) -> io::Result<(bool, u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 2 {
                let b0 = self.buf[0];
                let b1 = self.buf[1];
                if b1 & 0x80 != 0 {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "server frame is masked"));
                }
                let (len, hl) = match b1 & 0x7f {
                    126 if self.buf.len() >= 4 => (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4),
                    127 if self.buf.len() >= 10 => {
                        (u64::from_be_bytes(self.buf[2..10].try_into().unwrap()) as usize, 10)
                    }
                    126 | 127 => (usize::MAX, 0),
                    n => (n as usize, 2),
                };
                if len != usize::MAX && self.buf.len() >= hl + len {
                    let payload = self.buf[hl..hl + len].to_vec();
                    self.buf.drain(..hl + len);
                    return Ok((b0 & 0x80 != 0, b0 & 0x0f, payload));
                }
            }
            self.fill(deadline)?;
        }
    }

    /// The next frame or whole message (continuations joined) within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<WsFrame> {
        let deadline = Instant::now() + timeout;
        let mut msg: Option<(u8, Vec<u8>)> = None;
        loop {
            let (fin, op, payload) = self.read_raw(deadline)?;
            let frame = match op {
                0x0 => {
                    let Some((_, m)) = msg.as_mut() else {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "continuation without a start"));
                    };
                    m.extend_from_slice(&payload);
                    if !fin {
                        continue;
                    }
                    let (op, m) = msg.take().unwrap();
                    (op, m)
                }
                0x1 | 0x2 if !fin => {
                    msg = Some((op, payload));
                    continue;
                }
                _ => (op, payload),
            };
            return Ok(match frame {
                (0x1, p) => WsFrame::Text(
                    String::from_utf8(p).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "text not UTF-8"))?,
                ),
                (0x2, p) => WsFrame::Binary(p),
                (0x8, p) => {
                    let code = (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]));
                    let reason = String::from_utf8_lossy(p.get(2..).unwrap_or(&[])).into_owned();
                    let f = WsFrame::Close(code, reason);
                    self.closed = Some(f.clone());
                    f
                }
                (0x9, p) => WsFrame::Ping(p),
                (0xA, p) => WsFrame::Pong(p),
                (op, _) => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("opcode {op:#x}"))),
            });
        }
    }

    /// The next text message parsed as JSON, answering pings and skipping pongs. `Err` on a
    /// close, a binary message, a timeout or a read error.
    pub fn recv_json(&mut self, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left.max(Duration::from_millis(1))) {
                Ok(WsFrame::Text(t)) => {
                    return serde_json::from_str(&t).map_err(|e| format!("text message is not JSON ({e}): {t:?}"))
                }
                Ok(WsFrame::Ping(p)) => {
                    let _ = self.send_frame(0xA, &p, true);
                }
                Ok(WsFrame::Pong(_)) => {}
                Ok(other) => return Err(format!("expected a JSON text message, got {other:?}")),
                Err(e) if is_timeout(&e) => return Err(format!("no message within {timeout:?}")),
                Err(e) => return Err(format!("read error: {e}")),
            }
        }
    }

    /// Waits for the server's close frame (skipping data, pings, pongs) within `timeout`.
    pub fn expect_close_frame(&mut self, timeout: Duration) -> Result<(Option<u16>, String), String> {
        let deadline = Instant::now() + timeout;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left.max(Duration::from_millis(1))) {
                Ok(WsFrame::Close(c, r)) => return Ok((c, r)),
                Ok(f) => skipped.push(f),
                Err(e) => return Err(format!("no close frame ({e}); frames before: {skipped:?}")),
            }
        }
    }
}

impl Server {
    /// Opens a WebSocket on a fresh connection: `Err(response)` when not upgraded.
    pub fn ws_try(&self, path: &str, headers: &[(&str, &str)]) -> Result<Ws, Response> {
        Ws::connect_on(self.conn(), path, headers)
    }

    /// `/ws?token=…`, asserting 101 and the `connected` greeting (returned).
    pub fn ws_chat(&self, token: &str) -> (Ws, Value) {
        let path = format!("/ws?token={}", urlencode(token));
        let mut ws = self
            .ws_try(&path, &[])
            .unwrap_or_else(|r| panic!("GET /ws: expected 101, got {r:?}\nlog:\n{}", self.log_tail()));
        let hello = ws
            .recv_json(IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("/ws: the first message: {e}\nlog:\n{}", self.log_tail()));
        (ws, hello)
    }
}

mod selftest_streams {
    use super::*;

    #[test]
    fn harness_ws_accept_matches_rfc6455_example() {
        assert_eq!(ws_accept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}

/// `VmRSS` of `pid` in KiB.
pub fn vm_rss_kib(pid: i32) -> i64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    st.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for pid {pid}"))
}

// ---- TCP states (`/proc/net/tcp`) ----

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

/// A `[tls]` section's body: listen on 127.0.0.1:`port` with this certificate and key.
pub fn tls_section(port: u16, cert: &Path, key: &Path) -> String {
    format!("listen = \"127.0.0.1:{port}\"\ncert_file = \"{}\"\nkey_file = \"{}\"", cert.display(), key.display())
}

/// Whether the installed `curl` speaks HTTP/2 (false when there is no curl).
pub fn curl_has_http2() -> bool {
    Command::new("curl")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("HTTP2"))
        .unwrap_or(false)
}

/// Polls `child` for its exit, up to `timeout`; `None` if it is still running.
pub fn wait_child(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (at most `within`) until `replacements` workers beyond those in `seen` have been
/// seen (memory-ceiling replacements), adding every worker seen to `seen`.
pub fn wait_replacements(
    s: &Server,
    seen: &mut std::collections::BTreeSet<i32>,
    replacements: usize,
    within: Duration,
) {
    let target = seen.len() + replacements;
    let enough = eventually(within, || {
        seen.extend(s.workers());
        seen.len() >= target
    });
    assert!(
        enough,
        "fewer than {replacements} memory replacements within {within:?}: workers seen {seen:?}\nlog:\n{}",
        s.log_tail()
    );
}
