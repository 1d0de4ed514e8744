//! `forkd` subcommands run as child processes (`check-config`, `user create`, …): bounded
//! in time, with no `FORKD_*` variable but those a test gives. A long-running server is
//! `server.rs`'s, not started here.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;

use super::api::UNIQUE;
use super::server::clear_forkd_env;
use super::*;

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

/// Like [`run_forkd`], with `input` on standard input.
/// `forkd check-config` in `dir` on the harness defaults plus `extra` (written to
/// `dir/forkd.toml`, data under `dir/data`).
pub fn check_config(dir: &Path, extra: &str) -> CliOutput {
    let text = super::server::render_config(&format!("127.0.0.1:{}", free_port()), &dir.join("data"), extra);
    let path = dir.join("forkd.toml");
    fs::write(&path, text).expect("write config");
    run_forkd(dir, &["check-config", "--config", path.to_str().expect("utf-8")], &[])
}

pub fn run_forkd_input(cwd: &Path, args: &[&str], env: &[(&str, &str)], input: &[u8]) -> CliOutput {
    run(cwd, args, env, input, None).expect("spawn forkd")
}

/// The uid and gid the tests run a child as when they themselves run as root: `nobody`'s.
pub const NOBODY: u32 = 65534;

/// Whether the tests run as root, for whom file modes and privileged ports do not apply.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Like [`run_forkd`], as a user without privilege: the tests' own, or [`NOBODY`] when they
/// run as root (then `cwd` and every path the run needs must be open to others). `Err` says
/// why it could not run (the binary out of `nobody`'s reach): the caller skips.
pub fn run_forkd_unprivileged(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<CliOutput, String> {
    let user = is_root().then_some(NOBODY);
    run(cwd, args, env, b"", user).map_err(|e| format!("cannot run {} as uid {NOBODY}: {e}", bin()))
}

/// Runs `forkd args...` in `cwd` (as `uid`, when given, with the same gid); `Err` only when it
/// cannot be started.
fn run(cwd: &Path, args: &[&str], env: &[(&str, &str)], input: &[u8], uid: Option<u32>) -> io::Result<CliOutput> {
    use std::os::unix::process::CommandExt;
    let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
    let out_path = cwd.join(format!(".cli-{}-{n}-stdout", std::process::id()));
    let err_path = cwd.join(format!(".cli-{}-{n}-stderr", std::process::id()));
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    if let Some(id) = uid {
        cmd.uid(id).gid(id);
    }
    clear_forkd_env(&mut cmd);
    cmd.env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn()?;
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
    Ok(CliOutput { status, stdout, stderr })
}
