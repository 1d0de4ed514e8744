//! `SIGUSR2` and `LISTEN_FDS` (CONTRACT §9): a binary upgrade starts a new supervisor
//! from the binary on disk and hands it the listening sockets; the old one drains and
//! exits 0 once the new one serves, without a failed request. The same hand-over
//! (`LISTEN_FDS` from fd 3) is systemd socket activation: a socket passed at start is
//! served, and `listen` does not apply.

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::util::*;

/// Stops a supervisor this test caused to exist (not our child), by pid, also on failure.
pub(crate) struct StopOnDrop(pub(crate) i32);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if !pid_alive(self.0) {
            return;
        }
        kill_pid(self.0, Signal::SIGTERM);
        if !eventually(Duration::from_secs(10), || !pid_alive(self.0)) {
            for w in worker_pids(self.0) {
                kill_pid(w, Signal::SIGKILL);
            }
            kill_pid(self.0, Signal::SIGKILL);
        }
    }
}

/// After `SIGUSR2`: the new supervisor's pid, from the old one's log line
/// `SIGUSR2: started a new supervisor <pid>` (waited for up to `IO_TIMEOUT`).
pub(crate) fn new_supervisor_pid(s: &Server) -> i32 {
    let line = s.wait_log_line(IO_TIMEOUT, |l| l.contains("SIGUSR2: started a new supervisor"));
    line.split("supervisor ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

#[test]
fn usr2_hands_the_sockets_to_a_new_supervisor_and_the_old_one_drains() {
    let mut s = Server::builder().workers(2).start();
    let old_workers = s.wait_workers(2, START_TIMEOUT);
    let hammer = Hammer::start(s.addr(), "/health");
    assert!(hammer.wait_more(5, IO_TIMEOUT), "no background traffic before the upgrade");
    s.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&s);
    let _stop = StopOnDrop(new_pid);
    let status = s.wait_exit(Duration::from_secs(20));
    assert!(
        status.is_some_and(|st| st.success()),
        "the old supervisor must drain and exit 0 once the new one serves: {status:?}\nlog:\n{}",
        s.log_tail()
    );
    assert!(
        eventually(Duration::from_secs(10), || worker_pids(new_pid).len() == 2),
        "the new supervisor {new_pid} must run 2 workers: {:?}",
        worker_pids(new_pid)
    );
    for w in old_workers {
        assert!(eventually(Duration::from_secs(10), || !pid_alive(w)), "old worker {w} still runs");
    }
    assert!(hammer.wait_more(5, IO_TIMEOUT), "traffic stalled after the upgrade");
    let rep = hammer.finish();
    assert!(rep.failures.is_empty(), "requests failed during the upgrade: {:?}", rep.failures);
    assert_eq!(get(s.addr(), "/health").status, 200, "the port is served by the new supervisor");
}

#[test]
fn usr2_keeps_the_old_supervisor_when_the_new_one_cannot_start() {
    // The new supervisor reads the config file as it is now: an invalid one makes it exit
    // before serving, and the old one must carry on as if nothing happened.
    let s = Server::builder().workers(2).start();
    let before = s.wait_workers(2, START_TIMEOUT);
    std::fs::write(s.config_path(), format!("{}\nno_such_key = 1\n", s.config_text)).unwrap();
    let hammer = Hammer::start(s.addr(), "/health");
    s.signal(Signal::SIGUSR2);
    let line = s.wait_log_line(Duration::from_secs(15), |l| l.contains("exited before serving"));
    assert!(line.contains("this one stays"), "{line}");
    assert!(hammer.wait_more(5, IO_TIMEOUT), "traffic stalled after the failed upgrade");
    let rep = hammer.finish();
    assert!(rep.failures.is_empty(), "requests failed during the failed upgrade: {:?}", rep.failures);
    assert_eq!(s.workers(), before, "the old workers keep serving");
    assert!(pid_alive(s.pid()), "the old supervisor keeps running");
    // The service is unchanged and healthy (the config file is put back for the drop).
    std::fs::write(s.config_path(), &s.config_text).unwrap();
    s.assert_healthy();
}

#[test]
fn a_socket_passed_in_listen_fds_is_served_and_listen_does_not_apply() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // `listen` names another port: the passed socket wins.
    let config = render_config(&format!("127.0.0.1:{}", free_port()), dir.path(), "workers = 2");
    let cfg = dir.path().join("forkd.toml");
    std::fs::write(&cfg, config).unwrap();
    let log = std::fs::File::create(dir.path().join("forkd.log")).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--config", cfg.to_str().unwrap()])
        .env("LISTEN_FDS", "1")
        .env_remove("LISTEN_PID")
        .env_remove("FORKD_CONFIG")
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: dup2 and fcntl are async-signal-safe; they place the listener at fd 3
    // without close-on-exec in the child only, as systemd does. (When it already is fd 3,
    // dup2 would be a no-op that keeps close-on-exec: clear the flag instead.)
    unsafe {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let r = if fd == 3 { fcntl(3, FcntlArg::F_SETFD(FdFlag::empty())) } else { nix::unistd::dup2(fd, 3) };
            r.map(|_| ()).map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().expect("spawn forkd");
    let pid = child.id() as i32;
    let _stop = StopOnDrop(pid);
    drop(listener);
    let served = eventually(START_TIMEOUT, || {
        std::net::TcpStream::connect(addr).is_ok_and(|_| get(addr, "/health").status == 200)
    });
    let logs = std::fs::read_to_string(dir.path().join("forkd.log")).unwrap_or_default();
    assert!(served, "the socket passed as fd 3 must be served\nlog:\n{logs}");
    assert!(logs.contains("handed over (LISTEN_FDS)"), "the log must say the socket was handed over:\n{logs}");
    assert!(eventually(START_TIMEOUT, || worker_pids(pid).len() == 2), "2 workers on the passed socket");
    kill_pid(pid, Signal::SIGTERM);
    let _ = child.wait();
}

#[test]
fn usr2_in_development_keeps_the_generated_signing_secret() {
    // No jwt_secret: development generates one. Tokens issued before the upgrade must
    // verify on the new supervisor's workers.
    let mut s = Server::builder().workers(1).fast_argon2().no_rate_limit().start();
    let (_, token) = s.user("Before Upgrade");
    assert_eq!(s.api("GET", "/api/v1/auth/me", Some(&token), None).status, 200, "the token works before");
    s.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&s);
    let _stop = StopOnDrop(new_pid);
    let status = s.wait_exit(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "the old supervisor exits 0: {status:?}\nlog:\n{}", s.log_tail());
    let new_workers = worker_pids(new_pid);
    assert_eq!(new_workers.len(), 1, "the new supervisor serves with its own worker");
    for _ in 0..5 {
        let (mut c, pid) = s.conn_with_pid();
        assert!(new_workers.contains(&pid), "served by the new supervisor's worker {new_workers:?}, not {pid}");
        let auth = format!("Bearer {token}");
        c.send(&request("GET", "/api/v1/auth/me", &[("Authorization", &auth)], b""));
        let r = c.read_response();
        assert_eq!(r.status, 200, "a token issued before USR2 must still verify: {r:?}\nlog:\n{}", s.log_tail());
    }
    assert!(s.logs().contains("development secret of the previous supervisor is kept"), "{}", s.log_tail());
}

/// The new supervisor's workers do not answer users from memory while the old
/// supervisor's workers live: those write the same database but bump the change counters
/// of another shared-memory region. Here an old worker, draining, finishes a `PATCH` that
/// was half sent before `SIGUSR2`, after the new worker has read the user twice; the new
/// worker's next read must show the change (with the memo on, it would answer the name it
/// read before).
#[test]
fn after_usr2_a_change_finished_by_an_old_worker_is_seen_by_the_new_ones() {
    let s = Server::api_builder().workers(1).start();
    let (u, token) = s.user("Before");
    let id = u["id"].as_i64().expect("id");
    let path = format!("/api/v1/users/{id}");
    let auth = format!("Bearer {token}");
    let old = s.wait_workers(1, START_TIMEOUT);
    // Half a PATCH on the old worker: it stays until this request is answered.
    let body = br#"{"name":"After"}"#;
    let mut patch = Conn::open(s.addr());
    let head = request(
        "PATCH",
        &path,
        &[("Authorization", &auth), ("Content-Type", "application/json"), ("Content-Length", &body.len().to_string())],
        b"",
    );
    // `request` adds no Content-Length for an empty body: the one above stands.
    patch.send(&head);
    patch.send(&body[..4]);
    s.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(&s);
    let _stop = StopOnDrop(new_pid);
    // A connection the new supervisor's worker holds.
    let mut reader = eventually_some(Duration::from_secs(20), || {
        let mut c = Conn::open(s.addr());
        let pid = c.get("/_debug/pid").json()["pid"].as_i64()? as i32;
        worker_pids(new_pid).contains(&pid).then_some(c)
    })
    .unwrap_or_else(|| panic!("no connection reached the new supervisor's worker\n{}", s.log_tail()));
    for _ in 0..2 {
        reader.send(&request("GET", &path, &[("Authorization", &auth)], b""));
        let r = reader.read_response();
        assert_eq!(r.json()["data"]["name"], "Before", "{r:?}");
    }
    assert!(old.iter().all(|&w| pid_alive(w)), "the old worker still drains (the PATCH is open)");
    patch.send(&body[4..]);
    let r = patch.read_response();
    assert_eq!(r.status, 200, "the old worker finishes the PATCH: {r:?}");
    reader.send(&request("GET", &path, &[("Authorization", &auth)], b""));
    let r = reader.read_response();
    assert_eq!(r.json()["data"]["name"], "After", "the new worker reads the change at once: {r:?}");
}

/// `SIGUSR2` to `s` (whose workers are `old_workers`), then the upgrade must complete within
/// `within`: the old supervisor exits 0, its workers are gone, and the new supervisor runs
/// `workers` workers. Returns the guard that stops the new supervisor (made as soon as its
/// pid is known, so it is stopped also when an assertion here fails), its pid, and the old
/// supervisor's log tail.
pub(crate) fn upgrade_completes(
    s: &mut Server,
    old_workers: &[i32],
    workers: usize,
    within: Duration,
) -> (StopOnDrop, i32, String) {
    s.signal(Signal::SIGUSR2);
    let new_pid = new_supervisor_pid(s);
    let stop = StopOnDrop(new_pid);
    let status = s.wait_exit(within);
    let log = s.log_tail();
    assert!(status.is_some_and(|st| st.success()), "the old supervisor must drain and exit 0: {status:?}\n{log}");
    for w in old_workers {
        assert!(eventually(within, || !pid_alive(*w)), "old worker {w} still runs");
    }
    assert!(
        eventually(within, || worker_pids(new_pid).len() == workers),
        "the new supervisor {new_pid} must run {workers} workers: {:?}",
        worker_pids(new_pid)
    );
    (stop, new_pid, log)
}
