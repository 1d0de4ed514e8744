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
        let config_text = render_config(&listen, &data_dir, extra_toml);
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
        let mut server = Server { child: Some(child), pid, addr: listen.parse().unwrap(), dir, log_path, config_text };

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
        let child = self.child.as_mut()?;
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

    /// A new keep-alive connection (5 s read timeout) whose failures print the server log.
    pub fn conn(&self) -> Conn {
        Conn::open_with_log(self.addr, Some(self.log_path.clone()))
    }

    /// `GET path` on a fresh connection.
    pub fn get(&self, path: &str) -> Response {
        self.get_with(path, &[])
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut c = self.conn();
        c.send(&request("GET", path, headers, b""));
        c.read_response()
    }

    /// `GET path` on a fresh connection with a read timeout, returning errors instead of
    /// panicking (for probes that may legitimately fail, e.g. while a worker is killed).
    pub fn try_get(&self, path: &str, timeout: Duration) -> io::Result<Response> {
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
    let out_path = cwd.join(format!(".cli-{}-stdout", std::process::id()));
    let err_path = cwd.join(format!(".cli-{}-stderr", std::process::id()));
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    clear_forkd_env(&mut cmd);
    cmd.env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn forkd");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`forkd {}` did not exit within 15 s; stderr:\n{}",
                args.join(" "),
                fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stdout = String::from_utf8_lossy(&fs::read(&out_path).unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&fs::read(&err_path).unwrap_or_default()).into_owned();
    let _ = fs::remove_file(&out_path);
    let _ = fs::remove_file(&err_path);
    CliOutput { status, stdout, stderr }
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

    /// Reads one response. `head`: the request was HEAD (no body follows).
    pub fn try_read_response(&mut self, head: bool) -> io::Result<Response> {
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
        let mut resp = Response { version, status, reason, headers, body: Vec::new() };
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
