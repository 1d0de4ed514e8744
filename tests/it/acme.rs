//! Automatic certificates (`[tls.acme]`) against Debian's `pebble`, the ACME test CA, on
//! loopback: `pebble-challtestsrv` answers DNS for the test names with 127.0.0.1, pebble
//! checks HTTP-01 on forkd's plain port and TLS-ALPN-01 on its TLS port. For each challenge
//! a test obtains a certificate, checks that the TLS listener serves it with a chain to
//! pebble's root, that the files are private, and that a second start (pebble gone) serves it
//! again without a new order; another has pebble issue 9-second certificates and sees one
//! renewed. `check-config`'s handling of `[tls.acme]` needs no pebble.
//!
//! Skipped, with the reason printed, when pebble is not installed, except under CI (`CI`
//! set), where it must run (`bin/install-test-deps` installs it).

use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::util::*;

const DOMAINS: [&str; 2] = ["acme.forkd.test", "www.forkd.test"];

/// pebble and its DNS server, killed (by pid) when dropped.
struct Pebble {
    children: Vec<Child>,
    _dir: tempfile::TempDir,
    /// The directory URL.
    directory: String,
    /// The roots pebble's own HTTPS certificate chains to.
    ca_file: PathBuf,
    /// The management interface (roots of the certificates it issues).
    management: u16,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Why pebble cannot run here; `None` when it can.
fn missing() -> Option<&'static str> {
    let found = |bin: &str| Command::new(bin).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    (!found("pebble") || !found("pebble-challtestsrv")).then_some(
        "pebble and pebble-challtestsrv not installed (Debian: apt-get install pebble; bin/install-test-deps)",
    )
}

fn wait_listening(port: u16, what: &str, log: &Path) {
    let up = eventually(Duration::from_secs(20), || TcpStream::connect(("127.0.0.1", port)).is_ok());
    assert!(up, "{what} did not listen on {port}:\n{}", fs::read_to_string(log).unwrap_or_default());
}

impl Pebble {
    /// Start pebble checking challenges on forkd's `http_port` and `tls_port`, issuing
    /// certificates valid for `lifetime` seconds (`None`: pebble's 5 years); `None` (the test
    /// is skipped) when it is not installed outside CI.
    fn start(http_port: u16, tls_port: u16, lifetime: Option<u64>) -> Option<Pebble> {
        if let Some(why) = missing() {
            assert!(std::env::var_os("CI").is_none(), "{why}: CI must run the ACME tests");
            eprintln!("skipped: {why}");
            return None;
        }
        let dir = tempfile::Builder::new().prefix("forkd-pebble-").tempdir().expect("tempdir");
        let pki = crate::util::tls::Pki::new();
        let (cert, key) = pki.write(dir.path());
        let ca_file = dir.path().join("ca.pem");
        fs::write(&ca_file, &pki.ca_pem).expect("write CA");
        let (listen, management, dns) = (free_port(), free_port(), free_port());
        let config = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": cert, "privateKey": key,
            "httpPort": http_port, "tlsPort": tls_port,
            "ocspResponderURL": "", "externalAccountBindingRequired": false,
        }});
        let mut config = config;
        if let Some(secs) = lifetime {
            config["pebble"]["certificateValidityPeriod"] = secs.into();
        }
        let config_path = dir.path().join("pebble.json");
        fs::write(&config_path, config.to_string()).expect("write pebble config");
        let log = |name: &str| fs::File::create(dir.path().join(name)).expect("log file");
        let mut children = Vec::new();
        let dns_addr = format!("127.0.0.1:{dns}");
        let challtestsrv = Command::new("pebble-challtestsrv")
            .args(["-dns01", &dns_addr, "-http01", "", "-https01", "", "-tlsalpn01", "", "-defaultIPv6", ""])
            .args(["-management", &format!("127.0.0.1:{}", free_port())])
            .stdout(log("dns.log"))
            .stderr(log("dns.err"))
            .spawn()
            .expect("start pebble-challtestsrv");
        children.push(challtestsrv);
        let pebble = Command::new("pebble")
            .arg("-config")
            .arg(&config_path)
            .args(["-dnsserver", &dns_addr])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(log("pebble.log"))
            .stderr(log("pebble.err"))
            .spawn()
            .expect("start pebble");
        children.push(pebble);
        let pebble =
            Pebble { children, directory: format!("https://127.0.0.1:{listen}/dir"), ca_file, management, _dir: dir };
        wait_listening(dns, "pebble-challtestsrv", &pebble._dir.path().join("dns.log"));
        wait_listening(listen, "pebble", &pebble._dir.path().join("pebble.log"));
        wait_listening(management, "pebble's management interface", &pebble._dir.path().join("pebble.log"));
        Some(pebble)
    }

    /// The root the certificates pebble issues chain to (it makes a new one at each start).
    fn issuing_root(&self) -> CertificateDer<'static> {
        let ca = self.ca_file.to_string_lossy();
        let tls = Arc::new(forkd::tls::client::config(Some(&ca)).expect("client config"));
        let url = format!("https://127.0.0.1:{}/roots/0", self.management);
        let r = forkd::acme::https::request(&tls, "GET", &url, None).expect("pebble's root");
        assert_eq!(r.status, 200, "{url}");
        CertificateDer::from_pem_slice(&r.body).expect("root PEM")
    }
}

/// The chain the TLS listener at `port` serves for `name`, verified against `root`.
fn served_chain(port: u16, name: &str, root: CertificateDer<'static>) -> Vec<CertificateDer<'static>> {
    use std::io::Write;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(config), server_name).expect("client");
    let sock = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let req = format!("GET /health HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).expect("handshake and request: the served chain verifies to pebble's root");
    tls.conn.peer_certificates().expect("a chain").iter().map(|c| c.clone().into_owned()).collect()
}

/// The config of a server on `tls_port` ordering from `pebble` with `challenge`, its data in
/// `data`.
fn acme_server(plain: u16, tls_port: u16, data: &Path, directory: &str, ca_file: &Path, challenge: &str) -> Server {
    let domains: Vec<String> = DOMAINS.iter().map(|d| format!("{d:?}")).collect();
    Server::builder()
        .port(plain)
        .workers(2)
        .top(&format!("public_origin = \"https://{}:{tls_port}\"", DOMAINS[0]))
        .top(&format!("data_dir = \"{}\"", data.display()))
        // Plain requests move to https, but for the CA's HTTP-01 checks.
        .set("tls", &format!("listen = \"127.0.0.1:{tls_port}\"\nredirect_http = true"))
        .set(
            "tls.acme",
            &format!(
                "directory = \"{directory}\"\nemail = \"ops@forkd.test\"\ndomains = [{}]\nca_file = \"{}\"\nchallenge = \"{challenge}\"",
                domains.join(", "),
                ca_file.display()
            ),
        )
        .start()
}

fn obtains_serves_and_reuses(challenge: &str) {
    let (plain, tls_port) = (free_port(), free_port());
    let Some(pebble) = Pebble::start(plain, tls_port, None) else { return };
    let data = tempfile::Builder::new().prefix("forkd-acme-").tempdir().expect("tempdir");
    // Kept past pebble's own directory: the second start names it too.
    let ca_file = data.path().join("pebble-ca.pem");
    fs::copy(&pebble.ca_file, &ca_file).expect("copy the CA");
    let server = acme_server(plain, tls_port, data.path(), &pebble.directory, &ca_file, challenge);
    server.wait_log_line(Duration::from_secs(90), |l| l.contains("tls.acme: new certificate for"));
    // The answers are withdrawn once the certificate serves; an unknown token is 404 (not
    // redirected to https, as everything else on the plain listener is).
    assert_eq!(server.get("/.well-known/acme-challenge/no-such-token").status, 404);
    assert_eq!(server.get("/api/config").status, 308);
    let acme = data.path().join("acme");
    let stored = fs::read(acme.join("cert.pem")).expect("cert.pem");
    let stored: Vec<_> = CertificateDer::pem_slice_iter(&stored).collect::<Result<_, _>>().expect("chain PEM");
    assert!(stored.len() >= 2, "leaf and pebble's intermediate: {} certificate(s)", stored.len());
    let root = pebble.issuing_root();
    for name in DOMAINS {
        let served = served_chain(tls_port, name, root.clone());
        assert_eq!(served[0], stored[0], "{name}: the leaf served is the one stored");
    }
    assert_eq!(fs::metadata(&acme).expect("acme dir").mode() & 0o777, 0o700);
    for file in ["account.key", "cert.pem", "key.pem", "domains"] {
        assert_eq!(fs::metadata(acme.join(file)).expect(file).mode() & 0o777, 0o600, "{file}");
    }
    let orders = server.logs().matches("tls.acme: ordered a certificate").count();
    assert_eq!(orders, 1, "{}", server.log_tail());
    drop(server);
    let pebble_directory = pebble.directory.clone();
    // Pebble gone: the stored certificate must serve without the CA.
    drop(pebble);
    let again = acme_server(plain, tls_port, data.path(), &pebble_directory, &ca_file, challenge);
    let line = again.wait_log_line(Duration::from_secs(10), |l| l.contains("tls.acme: serving the certificate for"));
    assert!(line.contains(&acme.display().to_string()), "{line}");
    let leaf = served_leaf_unverified(tls_port, DOMAINS[0]);
    assert_eq!(leaf, stored[0], "the second start serves the stored leaf");
    assert!(!again.logs().contains("tls.acme: ordered"), "no new order:\n{}", again.log_tail());
}

/// The leaf served for `name`, without verifying it (the CA that issued it is gone).
fn served_leaf_unverified(port: u16, name: &str) -> CertificateDer<'static> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", name])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    CertificateDer::from_pem_slice(text.as_bytes()).expect("a certificate in s_client's output").into_owned()
}

#[test]
fn http_01_on_the_plain_listener_gets_a_certificate_that_a_restart_reuses() {
    obtains_serves_and_reuses("http-01");
}

#[test]
fn tls_alpn_01_on_the_tls_listener_gets_a_certificate_that_a_restart_reuses() {
    obtains_serves_and_reuses("tls-alpn-01");
}

#[test]
fn a_certificate_is_renewed_at_two_thirds_of_its_lifetime() {
    let (plain, tls_port) = (free_port(), free_port());
    // 9 s: renewed about 6 s after it was issued.
    let Some(pebble) = Pebble::start(plain, tls_port, Some(9)) else { return };
    let data = tempfile::Builder::new().prefix("forkd-acme-").tempdir().expect("tempdir");
    let server = acme_server(plain, tls_port, data.path(), &pebble.directory, &pebble.ca_file, "http-01");
    server.wait_log_line(Duration::from_secs(90), |l| l.contains("tls.acme: new certificate for"));
    let root = pebble.issuing_root();
    let first = served_chain(tls_port, DOMAINS[0], root.clone()).remove(0);
    // Requests all through the renewal: the workers take the new certificate as on a HUP,
    // with no request failed.
    let hammer = Hammer::start(server.addr(), "/health");
    assert!(hammer.wait_more(5, IO_TIMEOUT), "no background traffic before the renewal");
    server.wait_log_line(Duration::from_secs(60), |l| l.contains("tls.acme: renewing the certificate for"));
    let renewed =
        eventually(Duration::from_secs(60), || server.logs().matches("tls.acme: new certificate for").count() >= 2);
    assert!(renewed, "no second certificate:\n{}", server.log_tail());
    let second = served_chain(tls_port, DOMAINS[0], root).remove(0);
    assert_ne!(first, second, "the renewed certificate serves");
    assert!(hammer.wait_more(5, IO_TIMEOUT), "background traffic stalled after the renewal");
    let rep = hammer.finish();
    assert!(rep.failures.is_empty(), "requests failed during the renewal: {:?}", rep.failures);
}

#[test]
fn check_config_takes_acme_instead_of_files_and_refuses_bad_values_in_one_line() {
    let d = tempfile::Builder::new().prefix("forkd-acme-").tempdir().expect("tempdir");
    let ca = d.path().join("ca.pem");
    fs::write(&ca, crate::util::tls::Pki::new().ca_pem).expect("write CA");
    let base = format!("public_origin = \"https://a.example\"\n[tls]\nlisten = \"127.0.0.1:{}\"\n", free_port());
    let good = format!(
        "{base}[tls.acme]\ndirectory = \"https://ca.example/dir\"\ndomains = [\"a.example\"]\nca_file = \"{}\"\n",
        ca.display()
    );
    let out = check_config(d.path(), &good);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let cases = [
        (
            "directory = \"http://ca.example/dir\"\ndomains = [\"a.example\"]\n",
            "tls.acme.directory = \"http://ca.example/dir\": must be an https:// URL",
        ),
        ("directory = \"https://ca.example/dir\"\ndomains = [\"*.a.example\"]\n", "wildcards need DNS-01"),
        (
            "directory = \"https://ca.example/dir\"\ndomains = [\"a.example\"]\nca_file = \"/nonexistent.pem\"\n",
            "tls.acme.ca_file: /nonexistent.pem",
        ),
    ];
    for (acme, want) in cases {
        let out = check_config(d.path(), &format!("{base}[tls.acme]\n{acme}"));
        assert_eq!(out.code(), Some(2), "{want}: {out:?}");
        let lines: Vec<&str> = out.stderr.lines().filter(|l| l.contains("tls.acme")).collect();
        assert_eq!(lines.len(), 1, "{want}: {out:?}");
        assert!(lines[0].contains(want), "{want}: {out:?}");
    }
}
