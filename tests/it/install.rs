//! `bin/install` into a staging root (`DESTDIR`): the files it installs and their modes, a
//! config that forkd accepts, a signing secret forkd can read, a drop-in that hands it over as a
//! credential, a second run that keeps the operator's config and secret, `--uninstall` that
//! removes everything but the state directory and a changed config, `--purge` the rest, and bad
//! arguments. With `DESTDIR` set the script touches nothing outside it (no useradd, no
//! systemctl), so this runs anywhere, as root or not.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bin/install")
}

/// Runs `bin/install args...` with `DESTDIR=destdir` (and no `FORKD_*` variables), bounded at 60 s.
fn run_install(destdir: &Path, args: &[&str]) -> CliOutput {
    let dir = destdir.parent().expect("destdir has a parent");
    let (out_path, err_path) = (dir.join("install.stdout"), dir.join("install.stderr"));
    let mut cmd = Command::new(script());
    cmd.args(args)
        .env("DESTDIR", destdir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap());
    for (k, _) in std::env::vars() {
        if k.starts_with("FORKD_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd.spawn().expect("spawn bin/install");
    let Some(status) = wait_child(&mut child, Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("bin/install {} did not finish within 60 s", args.join(" "));
    };
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    CliOutput { status, stdout, stderr }
}

/// The permission bits of `root` + `path`; panics naming the path when it is missing.
fn mode(root: &Path, path: &str) -> u32 {
    let full = root.join(path.trim_start_matches('/'));
    let meta = fs::metadata(&full).unwrap_or_else(|e| panic!("{path} not installed ({}): {e}", full.display()));
    meta.permissions().mode() & 0o7777
}

/// Every file and directory under `root`, as target paths (`/etc/forkd`), sorted.
fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap().flatten() {
            let p = entry.path();
            out.push(format!("/{}", p.strip_prefix(root).unwrap().display()));
            if p.is_dir() && !p.is_symlink() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

const FILES: &[(&str, u32)] = &[
    ("/usr/local/bin/forkd", 0o755),
    ("/etc/systemd/system/forkd.service", 0o644),
    ("/etc/systemd/system/forkd.socket", 0o644),
    ("/etc/systemd/system/forkd-tls.socket", 0o644),
    ("/etc/systemd/system/forkd.service.d/jwt-secret.conf", 0o644),
    ("/etc/forkd", 0o755),
    ("/etc/forkd/forkd.toml", 0o644),
    ("/etc/forkd/jwt_secret", 0o600),
    ("/var/lib/forkd", 0o750),
    ("/usr/local/share/doc/forkd/operations.md", 0o644),
    ("/usr/local/share/doc/forkd/forkd.example.toml", 0o644),
];

#[test]
fn install_into_destdir_then_uninstall_and_purge() {
    let tmp = tempfile::Builder::new().prefix("forkd-install-").tempdir().unwrap();
    let root = tmp.path().join("root");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));

    let out = run_install(&root, &["--binary", bin()]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    for (path, want) in FILES {
        assert_eq!(mode(&root, path), *want, "mode of {path}: want {want:o}\n{out:?}");
    }
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    assert_eq!(fs::read(at("/usr/local/bin/forkd")).unwrap(), fs::read(bin()).unwrap(), "the binary given");
    for unit in ["forkd.service", "forkd.socket", "forkd-tls.socket"] {
        let installed = fs::read_to_string(at(&format!("/etc/systemd/system/{unit}"))).unwrap();
        assert_eq!(installed, fs::read_to_string(repo.join("systemd").join(unit)).unwrap(), "{unit} as shipped");
    }
    assert!(out.stdout.contains("no system user created"), "DESTDIR: useradd is skipped with a note: {out:?}");

    // The secret: a fresh 256-bit base64 line, handed over as a credential the unit reads.
    let secret = fs::read_to_string(at("/etc/forkd/jwt_secret")).unwrap();
    let decoded = base64_decode(secret.trim_end()).unwrap_or_else(|| panic!("not base64: {secret:?}"));
    assert_eq!(decoded.len(), 32, "a 256-bit secret");
    assert!(!out.stdout.contains(secret.trim_end()), "the secret must not be printed");
    let dropin = fs::read_to_string(at("/etc/systemd/system/forkd.service.d/jwt-secret.conf")).unwrap();
    let lines: Vec<&str> = dropin.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        lines,
        [
            "[Service]",
            "LoadCredential=jwt_secret:/etc/forkd/jwt_secret",
            "Environment=FORKD_AUTH__JWT_SECRET_FILE=%d/jwt_secret"
        ],
        "target paths, not staging paths: {dropin}"
    );

    // The config: the example in production, which forkd accepts with that secret file.
    let config = at("/etc/forkd/forkd.toml");
    let text = fs::read_to_string(&config).unwrap();
    assert!(text.lines().any(|l| l == "environment = \"production\""), "{text}");
    let secret_file = at("/etc/forkd/jwt_secret");
    let env = [("FORKD_AUTH__JWT_SECRET_FILE", secret_file.to_str().unwrap())];
    let printed = run_forkd(tmp.path(), &["print-config", "--config", config.to_str().unwrap()], &env);
    assert_eq!(printed.code(), Some(0), "the installed config must load in production: {printed:?}");
    let without = run_forkd(tmp.path(), &["check-config", "--config", config.to_str().unwrap()], &[]);
    assert_eq!(without.code(), Some(2), "production without the credential is refused: {without:?}");

    // A second run keeps what the operator has: the changed config and the secret.
    fs::write(&config, format!("{text}\n# changed by the operator\n")).unwrap();
    let again = run_install(&root, &["--binary", bin()]);
    assert_eq!(again.code(), Some(0), "{again:?}");
    assert!(fs::read_to_string(&config).unwrap().ends_with("# changed by the operator\n"), "config overwritten");
    assert_eq!(fs::read_to_string(&secret_file).unwrap(), secret, "secret regenerated");

    // --uninstall: everything but the state directory and the changed config.
    let out = run_install(&root, &["--uninstall"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let left: Vec<String> = tree(&root).into_iter().filter(|p| !at(p).is_dir()).collect();
    assert_eq!(left, ["/etc/forkd/forkd.toml"], "files left after --uninstall: {:#?}\n{out:?}", tree(&root));
    assert!(at("/var/lib/forkd").is_dir(), "the state directory is kept");
    assert!(!at("/etc/systemd/system/forkd.service.d").exists(), "the drop-in directory is removed");
    assert!(out.stdout.contains("kept /etc/forkd/forkd.toml"), "{out:?}");
    assert!(out.stdout.contains("kept /var/lib/forkd"), "{out:?}");

    // --purge: the rest.
    let out = run_install(&root, &["--purge"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(!at("/etc/forkd").exists() && !at("/var/lib/forkd").exists(), "{:#?}", tree(&root));
    assert!(tree(&root).iter().all(|p| at(p).is_dir()), "no file left after --purge: {:#?}", tree(&root));
}

#[test]
fn uninstall_removes_an_unchanged_config_too() {
    let tmp = tempfile::Builder::new().prefix("forkd-install-").tempdir().unwrap();
    let root = tmp.path().join("root");
    assert_eq!(run_install(&root, &["--binary", bin()]).code(), Some(0));
    let out = run_install(&root, &["--uninstall"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let files: Vec<String> = tree(&root).into_iter().filter(|p| !root.join(&p[1..]).is_dir()).collect();
    assert!(files.is_empty(), "files left after --uninstall: {files:#?}\n{out:?}");
    assert!(root.join("var/lib/forkd").is_dir(), "the state directory is kept");
}

#[test]
fn install_refuses_bad_arguments() {
    let tmp = tempfile::Builder::new().prefix("forkd-install-").tempdir().unwrap();
    let root = tmp.path().join("root");
    let out = run_install(&root, &["--frobnicate"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("unknown argument --frobnicate"), "{out:?}");
    let out = run_install(&root, &["--binary"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    let missing = tmp.path().join("no-such-binary");
    let out = run_install(&root, &["--binary", missing.to_str().unwrap()]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("not an executable file"), "{out:?}");
    let not_forkd = tmp.path().join("not-forkd");
    fs::write(&not_forkd, "#!/bin/sh\nexit 3\n").unwrap();
    fs::set_permissions(&not_forkd, fs::Permissions::from_mode(0o755)).unwrap();
    let out = run_install(&root, &["--binary", not_forkd.to_str().unwrap()]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(!root.exists() || tree(&root).is_empty(), "nothing installed on a bad binary: {:#?}", tree(&root));
}
