//! One service per address, and what an operator sees of it (CONTRACT §9): a second
//! instance on an address another process listens on is refused at start (exit 2,
//! `address already in use`) instead of sharing the port through `SO_REUSEPORT`; the
//! `pid_file`; process titles in `ps`.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::upgrade::{new_supervisor_pid, StopOnDrop};
use crate::util::*;

/// `forkd serve` with the harness defaults plus `extra` on `listen`, in a fresh
/// directory; must exit by itself (bounded by `run_forkd`).
fn serve_must_exit(listen: &str, extra: &str) -> CliOutput {
    let dir = tempfile::Builder::new().prefix("forkd-second-").tempdir().unwrap();
    let cfg = dir.path().join("forkd.toml");
    std::fs::write(&cfg, render_config(listen, &dir.path().join("data"), extra)).unwrap();
    run_forkd(dir.path(), &["serve", "--config", cfg.to_str().unwrap()], &[])
}

fn assert_refused_in_use(out: &CliOutput, addr: &str, what: &str) {
    assert_eq!(out.code(), Some(2), "{what}: start-up must exit 2: {out:?}");
    let line = out.stderr.lines().find(|l| l.contains("address already in use"));
    let line = line.unwrap_or_else(|| panic!("{what}: stderr must say `address already in use`: {out:?}"));
    assert!(line.contains(addr), "{what}: the line must name the address {addr}: {line}");
    assert!(!out.stderr.contains("ready:"), "{what}: it must never say ready: {out:?}");
}

#[test]
fn a_second_forkd_on_the_same_address_exits_2_and_the_first_keeps_serving() {
    let s = Server::builder().workers(2).start();
    let workers = s.wait_workers(2, START_TIMEOUT);
    let addr = s.addr().to_string();
    let out = serve_must_exit(&addr, "workers = 2");
    assert_refused_in_use(&out, &addr, "a second forkd");
    for _ in 0..10 {
        s.assert_healthy();
    }
    assert_eq!(s.workers(), workers, "the first one's workers are untouched");
    assert!(!s.logs().contains("ERROR"), "the first one logged nothing wrong:\n{}", s.log_tail());
}

#[test]
fn an_address_another_program_listens_on_is_refused_with_exit_2() {
    let holder = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = holder.local_addr().unwrap().to_string();
    let out = serve_must_exit(&addr, "");
    assert_refused_in_use(&out, &addr, "a plain listener holds the port");
    // Also when it listens on every address of the port.
    let any = TcpListener::bind("0.0.0.0:0").expect("bind 0.0.0.0");
    let addr = format!("127.0.0.1:{}", any.local_addr().unwrap().port());
    let out = serve_must_exit(&addr, "");
    assert_refused_in_use(&out, &addr, "a listener on 0.0.0.0 holds the port");
    drop((holder, any));
}

#[test]
fn hup_and_ttin_on_the_running_instance_are_not_refused_as_in_use() {
    let s = Server::builder().workers(1).start();
    s.wait_workers(1, START_TIMEOUT);
    s.signal(Signal::SIGTTIN);
    s.wait_workers(2, Duration::from_secs(15));
    std::fs::write(s.config_path(), s.config_text.replace("workers = 1", "workers = 3")).unwrap();
    s.signal(Signal::SIGHUP);
    s.wait_log_line(Duration::from_secs(20), |l| l.contains("reload complete"));
    s.wait_workers(3, Duration::from_secs(15));
    assert!(!s.logs().to_lowercase().contains("in use"), "{}", s.log_tail());
    s.assert_healthy();
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn pid_file_holds_the_supervisor_pid_and_goes_away_on_a_clean_stop() {
    let mut s = Server::builder().top("pid_file = \"run.pid\"").start();
    let path = s.dir().join("run.pid");
    assert_eq!(read_pid(&path), Some(s.pid()), "pid_file must name the supervisor");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{}\n", s.pid()), "one line, the pid");
    s.signal(Signal::SIGTERM);
    let st = s.wait_exit(Duration::from_secs(20));
    assert!(st.is_some_and(|st| st.success()), "clean stop: {st:?}");
    assert!(!path.exists(), "the pid file must be removed on a clean exit");
    let left: Vec<_> = std::fs::read_dir(s.dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().ends_with(".tmp")), "no temporary file left: {left:?}");
}

#[test]
fn pid_file_from_the_environment_and_usr2_rewrites_it() {
    let pid_dir = tempfile::tempdir().unwrap();
    let path = pid_dir.path().join("forkd.pid");
    let s = Server::builder().workers(1).env("FORKD_PID_FILE", path.to_str().unwrap()).start();
    assert_eq!(read_pid(&path), Some(s.pid()), "FORKD_PID_FILE sets pid_file");
    s.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&s);
    let stop = StopOnDrop(new_pid);
    assert!(
        eventually(Duration::from_secs(20), || read_pid(&path) == Some(new_pid) && !pid_alive(s.pid())),
        "after USR2 the new supervisor {new_pid} owns the pid file ({:?}) and the old one exits\nlog:\n{}",
        read_pid(&path),
        s.log_tail()
    );
    // The old one, exiting, left the new one's file alone.
    assert_eq!(read_pid(&path), Some(new_pid));
    drop(stop);
    assert!(!path.exists(), "the new supervisor removes it when it stops");
}

#[test]
fn a_pid_file_that_cannot_be_written_stops_start_up_with_exit_2() {
    let holder = free_port();
    let out = serve_must_exit(&format!("127.0.0.1:{holder}"), "pid_file = \"/nonexistent/forkd/forkd.pid\"");
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("pid_file /nonexistent/forkd/forkd.pid"), "the error names the file: {out:?}");
}

/// `/proc/<pid>/cmdline` without its trailing NUL padding, and `/proc/<pid>/comm`.
fn titles(pid: i32) -> (String, String) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).trim_end_matches('\0').to_string();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string();
    (cmdline, comm)
}

#[test]
fn ps_shows_the_supervisor_and_each_worker_with_its_slot() {
    let s = Server::builder().workers(2).start();
    let workers = s.wait_workers(2, START_TIMEOUT);
    assert_eq!(
        titles(s.pid()),
        ("forkd: supervisor".to_string(), "forkd: supervis".to_string()),
        "the supervisor's cmdline and comm (15 bytes)"
    );
    let mut seen: Vec<(String, String)> = workers.iter().map(|w| titles(*w)).collect();
    seen.sort();
    let expected: Vec<(String, String)> =
        (0..2).map(|i| (format!("forkd: worker {i}"), format!("forkd: worker {i}"))).collect();
    assert_eq!(seen, expected, "the workers' cmdline and comm");
    // A replacement worker takes its slot's title.
    kill_pid(workers[0], Signal::SIGKILL);
    assert!(eventually(Duration::from_secs(10), || {
        let now = s.workers();
        now.len() == 2 && !now.contains(&workers[0])
    }));
    let mut seen: Vec<String> = s.workers().iter().map(|w| titles(*w).0).collect();
    seen.sort();
    assert_eq!(seen, ["forkd: worker 0", "forkd: worker 1"], "after a respawn");
    s.assert_healthy();
}

#[test]
fn a_title_longer_than_the_arguments_is_shown_whole() {
    // `forkd` run with no argument (configured through the environment): 6 bytes of
    // arguments, the title takes the environment's room after them.
    let dir = tempfile::Builder::new().prefix("forkd-title-").tempdir().unwrap();
    let exe = dir.path().join("forkd");
    std::os::unix::fs::symlink(bin(), &exe).unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut cmd = std::process::Command::new("forkd");
    cmd.env_clear()
        .env("PATH", dir.path())
        .env("FORKD_LISTEN", format!("127.0.0.1:{port}"))
        .env("FORKD_WORKERS", "1")
        .env("FORKD_DATA_DIR", dir.path().join("data"))
        .env("RUST_LOG", "info")
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    let mut child = cmd.spawn().expect("spawn forkd from PATH");
    let pid = child.id() as i32;
    let _stop = StopOnDrop(pid);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let up = eventually(START_TIMEOUT, || {
        std::net::TcpStream::connect(addr).is_ok() && worker_pids(pid).len() == 1 && get(addr, "/health").status == 200
    });
    let logs = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
    assert!(up, "forkd did not serve:\n{logs}");
    assert_eq!(titles(pid).0, "forkd: supervisor", "argv was only \"forkd\"");
    assert_eq!(titles(worker_pids(pid)[0]).0, "forkd: worker 0");
    // The environment still works after it was moved: the overrides applied, and a HUP
    // (which reads the same FORKD_* variables again) keeps serving.
    kill_pid(pid, Signal::SIGHUP);
    let ok = eventually(Duration::from_secs(15), || {
        std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default().contains("reload complete")
    });
    assert!(ok, "reload after the title was set");
    assert_eq!(get(addr, "/health").status, 200);
    kill_pid(pid, Signal::SIGTERM);
    let _ = child.wait();
}
