//! TLS for tests: a throw-away CA and server certificate (`Pki`), the `[tls]` config
//! lines, a server with a TLS listener, and a rustls HTTPS client. Each certificate is made
//! for one test and trusted by that test's clients only.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("forkd-tls-").tempdir().expect("tempdir")
}

/// A test CA and a server certificate for `localhost` and 127.0.0.1 signed by it.
pub struct Pki {
    pub ca_pem: String,
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
        Pki { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
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

/// A rustls client trusting `pki`'s CA (TLS 1.3 and 1.2, or only `versions`), with the
/// default in-memory session store (so a second connection can resume).
pub fn client_config(pki: &Pki, versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).expect("CA PEM")).expect("CA");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// What one HTTPS exchange gave.
pub struct TlsReply {
    pub status: u16,
    pub head: String,
    pub body: String,
    pub kind: Option<rustls::HandshakeKind>,
    pub alpn: Option<Vec<u8>>,
}

/// One `GET path` over a new TLS connection to `addr` (`Connection: close`, read to the end).
pub fn https_get(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, path: &str) -> TlsReply {
    let sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    https_get_on(sock, config, path, &[])
}

/// [`https_get`] on a connected socket (which may have carried bytes before the handshake,
/// e.g. a PROXY protocol header), with `headers`.
pub fn https_get_on(
    sock: TcpStream,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> TlsReply {
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let session = rustls::ClientConnection::new(Arc::clone(config), name).expect("client session");
    let port = sock.peer_addr().expect("peer").port();
    sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    sock.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(session, sock);
    let extra: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\n{extra}Connection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).expect("send over TLS");
    let mut bytes = Vec::new();
    match tls.read_to_end(&mut bytes) {
        Ok(_) => {}
        // A close without close_notify still ends the response read so far.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => panic!("read over TLS: {e} (after {} bytes)", bytes.len()),
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    // Interim responses (103 Early Hints on `GET /`) come before the final one.
    while text.starts_with("HTTP/1.1 1") && !text.starts_with("HTTP/1.1 101") {
        match text.split_once("\r\n\r\n") {
            Some((_, rest)) => text = rest.to_string(),
            None => break,
        }
    }
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    TlsReply {
        status,
        head: head.to_string(),
        body: body.to_string(),
        kind: tls.conn.handshake_kind(),
        alpn: tls.conn.alpn_protocol().map(<[u8]>::to_vec),
    }
}

/// A server with a TLS listener on a free port; returns it, its TLS address and the PKI.
pub fn tls_server(workers: usize, extra_tls: &str, extra: &str) -> (Server, SocketAddr, Pki, tempfile::TempDir) {
    let pki = Pki::new();
    let d = tmp();
    let (c, k) = pki.write(d.path());
    let port = free_port();
    let text = format!("workers = {workers}\n{}\n{extra}", tls_toml(port, &c, &k, extra_tls));
    let server = Server::start(&text);
    (server, format!("127.0.0.1:{port}").parse().expect("addr"), pki, d)
}

/// A `[tls]` section's body: listen on 127.0.0.1:`port` with this certificate and key.
pub fn tls_section(port: u16, cert: &Path, key: &Path) -> String {
    format!("listen = \"127.0.0.1:{port}\"\ncert_file = \"{}\"\nkey_file = \"{}\"", cert.display(), key.display())
}
