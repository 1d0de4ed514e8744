//! The start-up refusals a newcomer meets first, each exit 2 (which the systemd unit does not
//! restart) with one line that names the path or address once, the cause and the fix: a
//! `data_dir` that is not a directory or not writable, a database file the service cannot
//! write, a port below 1024 without the privilege to bind it.
//!
//! File modes and privileged ports do not stop root: when the tests run as root, the runs
//! that need a user without privilege run as `nobody` (uid 65534), and the paths they use are
//! opened to others.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::*;

/// A temp dir open to others (`nobody` must reach the config and the data in it).
fn tmp() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("forkd-start-").tempdir().unwrap();
    chmod(d.path(), 0o755);
    d
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes `forkd.toml` listening on `listen` with `data_dir` and debug routes off.
fn write_config(dir: &tempfile::TempDir, listen: &str, data_dir: &Path) -> PathBuf {
    let p = dir.path().join("forkd.toml");
    fs::write(&p, render_config(listen, data_dir, "[debug]\nroutes = false\n")).unwrap();
    p
}

fn serve_args(cfg: &Path) -> [&str; 3] {
    ["serve", "--config", cfg.to_str().unwrap()]
}

/// `forkd serve` as a user without privilege; `None` (the test skips) when that is impossible.
fn serve_unprivileged(dir: &tempfile::TempDir, cfg: &Path) -> Option<CliOutput> {
    match run_forkd_unprivileged(dir.path(), &serve_args(cfg), &[]) {
        Ok(out) => Some(out),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// The refusal: exit 2, exactly one line on stderr, naming `path` once and saying `cause`;
/// nothing listens on `port`. Returns the line.
fn assert_one_line_refusal(out: &CliOutput, path: &Path, cause: &str, port: u16) -> String {
    assert_eq!(out.code(), Some(2), "a refusal a restart cannot fix exits 2: {out:?}");
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {out:?}");
    let line = lines[0];
    let path = path.display().to_string();
    assert_eq!(line.matches(&path).count(), 1, "the line names {path} once: {line}");
    assert!(line.contains(cause), "the line says the cause {cause:?}: {line}");
    let conn = std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500));
    assert!(conn.is_err(), "something listens on {port} after a refused start");
    line.to_string()
}

#[test]
fn a_data_dir_under_a_file_exits_2_with_the_path_the_cause_and_the_fix() {
    let d = tmp();
    fs::write(d.path().join("afile"), "").unwrap();
    let data = d.path().join("afile").join("data");
    let port = free_port();
    let cfg = write_config(&d, &format!("127.0.0.1:{port}"), &data);
    let out = run_forkd(d.path(), &serve_args(&cfg), &[]);
    let line = assert_one_line_refusal(&out, &data, "not a directory", port);
    assert!(line.contains("data_dir") && line.contains("FORKD_DATA_DIR"), "the fix names the setting: {line}");
}

#[test]
fn a_data_dir_the_service_cannot_write_exits_2_with_permission_denied() {
    let d = tmp();
    let data = d.path().join("data");
    fs::create_dir(&data).unwrap();
    chmod(&data, 0o555); // nobody may create files in it (root aside: the run is `nobody`'s)
    let port = free_port();
    let cfg = write_config(&d, &format!("127.0.0.1:{port}"), &data);
    let Some(out) = serve_unprivileged(&d, &cfg) else { return };
    let line = assert_one_line_refusal(&out, &data, "permission denied", port);
    assert!(line.contains("chown, chmod u+w") && line.contains("FORKD_DATA_DIR"), "the fix: {line}");
    assert!(fs::read_dir(&data).unwrap().next().is_none(), "nothing was created in {}", data.display());
}

#[test]
fn a_read_only_database_file_is_refused_at_start_not_at_the_first_write() {
    let d = tmp();
    let data = d.path().join("data");
    let port = free_port();
    let cfg = write_config(&d, &format!("127.0.0.1:{port}"), &data);
    let made = run_forkd(d.path(), &["migrate", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(made.code(), Some(0), "`forkd migrate` creates the database: {made:?}");
    let db = data.join("forkd.db");
    assert!(db.is_file(), "{} was not created: {made:?}", db.display());
    chmod(&data, 0o777); // the directory is usable by anyone: only the file is in the way
    chmod(&db, 0o444);
    let Some(out) = serve_unprivileged(&d, &cfg) else { return };
    let line = assert_one_line_refusal(&out, &db, "permission denied", port);
    assert!(line.contains("database file"), "the line says it is the database file: {line}");
    assert!(line.contains("chmod u+w"), "the fix: {line}");
}

/// The lowest port any user may bind (`net.ipv4.ip_unprivileged_port_start`; 1024 when the
/// kernel predates it).
fn unprivileged_port_start() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

#[test]
fn port_80_without_privilege_names_the_capability_and_socket_activation() {
    if unprivileged_port_start() <= 80 {
        eprintln!("skipped: this host lets every user bind port 80 (net.ipv4.ip_unprivileged_port_start)");
        return;
    }
    let d = tmp();
    let data = d.path().join("data");
    fs::create_dir(&data).unwrap();
    chmod(&data, 0o777); // the data_dir check passes for `nobody` too
    let cfg = write_config(&d, "127.0.0.1:80", &data);
    let Some(out) = serve_unprivileged(&d, &cfg) else { return };
    assert_eq!(out.code(), Some(2), "a port it may not bind is a refusal, exit 2: {out:?}");
    let line = out.stderr.lines().find(|l| l.contains("cannot listen on 127.0.0.1:80"));
    let line = line.unwrap_or_else(|| panic!("no line names the address: {out:?}"));
    for says in ["permission denied", "CAP_NET_BIND_SERVICE", "socket activation"] {
        assert!(line.contains(says), "the line says {says:?}: {line}");
    }
}
