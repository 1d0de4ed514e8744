//! TLS on `tls.listen`: the certificate and key checked by `check-config` and at start.
//! Each test makes its own CA and server certificate (rcgen).

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::*;

/// A test CA and a server certificate for `localhost` and 127.0.0.1 signed by it.
pub struct Pki {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    pub fn new() -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "forkd test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
        let key = rcgen::KeyPair::generate().expect("key");
        let params =
            rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).expect("server params");
        let cert = params.signed_by(&key, &ca_cert, &ca_key).expect("server cert");
        let _ = ca_cert;
        Pki { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// Writes `cert.pem` and `key.pem` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        fs::write(&c, &self.cert_pem).expect("write cert");
        fs::write(&k, &self.key_pem).expect("write key");
        (c, k)
    }
}

/// The `[tls]` lines (and the https `public_origin`) for a listener on `port`.
pub fn tls_toml(port: u16, cert: &Path, key: &Path, extra: &str) -> String {
    format!(
        "public_origin = \"https://localhost:{port}\"\n\n[tls]\nlisten = \"127.0.0.1:{port}\"\n\
         cert_file = \"{}\"\nkey_file = \"{}\"\n{extra}",
        cert.display(),
        key.display()
    )
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("forkd-tls-").tempdir().expect("tempdir")
}

/// `forkd check-config` of the harness defaults plus `extra`.
fn check(dir: &Path, extra: &str) -> CliOutput {
    let text = render_config(&format!("127.0.0.1:{}", free_port()), &dir.join("data"), extra);
    let path = dir.join("forkd.toml");
    fs::write(&path, text).expect("write config");
    run_forkd(dir, &["check-config", "--config", path.to_str().expect("utf-8")], &[])
}

#[test]
fn check_config_accepts_a_matching_pair() {
    let d = tmp();
    let (c, k) = Pki::new().write(d.path());
    let port = free_port();
    let out = check(d.path(), &tls_toml(port, &c, &k, ""));
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
        let out = check(d.path(), &tls_toml(free_port(), &cert, &key, ""));
        assert_eq!(out.code(), Some(2), "{want}: {out:?}");
        assert!(out.stderr.contains(want), "{want}: {out:?}");
    }
    // `listen` without the files; `redirect_http` without `listen`.
    let out = check(d.path(), "public_origin = \"https://localhost\"\n[tls]\nlisten = \"127.0.0.1:1\"\n");
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("tls.cert_file is required when tls.listen is set"), "{out:?}");
    let out = check(d.path(), "[tls]\nredirect_http = true\n");
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
