//! The files of automatic certificates, under `data_dir/acme/` (mode 0700): `account.key`
//! (the ACME account's PKCS#8 key), `cert.pem` (the chain, leaf first), `key.pem` (its key)
//! and `domains` (the names it was ordered for, one a line). Every file is mode 0600 and
//! replaced atomically (written aside, then renamed), so a reader sees the old pair or the
//! new one.
//!
//! It owns those paths and nothing else; it must not touch sockets.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use rustls::sign::CertifiedKey;

use super::certs;
use super::jws::AccountKey;
use super::msg::AcmeError;

/// A certificate on disk that serves: the pair, and its validity in Unix seconds.
pub struct Stored {
    /// The chain and key, loaded.
    pub key: Arc<CertifiedKey>,
    /// `(notBefore, notAfter)` of the leaf.
    pub validity: (i64, i64),
}

/// The directory of the ACME files for `data_dir`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("acme")
}

fn store_error(path: &Path, e: std::io::Error) -> AcmeError {
    AcmeError::Store(format!("{}: {e}", path.display()))
}

/// Create `dir` (0700) if needed, and make it 0700 if it exists.
fn ensure_dir(dir: &Path) -> Result<(), AcmeError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| store_error(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| store_error(dir, e))
}

/// Write `bytes` to `dir/name` with mode 0600, atomically.
fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), AcmeError> {
    let path = dir.join(name);
    let aside = dir.join(format!(".{name}.new"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&aside)
        .map_err(|e| store_error(&aside, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(|e| store_error(&aside, e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| store_error(&aside, e))?;
    std::fs::rename(&aside, &path).map_err(|e| store_error(&path, e))
}

/// The account key in `dir`, made and stored on first use.
pub fn account_key(dir: &Path) -> Result<AccountKey, AcmeError> {
    ensure_dir(dir)?;
    let path = dir.join("account.key");
    match std::fs::read(&path) {
        Ok(pem) => {
            use rustls::pki_types::pem::PemObject;
            let der = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_slice(&pem)
                .map_err(|_| AcmeError::Store(format!("{}: not a PKCS#8 PEM key", path.display())))?;
            AccountKey::from_pkcs8(der.secret_pkcs8_der())
                .map_err(|e| AcmeError::Store(format!("{}: {e}", path.display())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = AccountKey::generate().map_err(|e| AcmeError::Local(e.to_string()))?;
            write(dir, "account.key", pem("PRIVATE KEY", key.pkcs8()).as_bytes())?;
            log::info!("tls.acme: new account key in {}", path.display());
            Ok(key)
        }
        Err(e) => Err(store_error(&path, e)),
    }
}

/// `der` as PEM with `label`.
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Store a new certificate chain and its key for `domains`, and load them back.
pub fn save(dir: &Path, chain_pem: &[u8], key_pem: &str, domains: &[String]) -> Result<Stored, AcmeError> {
    ensure_dir(dir)?;
    let (cert, key) = (dir.join(".cert.pem.check"), dir.join(".key.pem.check"));
    // Checked as a pair before it replaces the one in use.
    write(dir, ".cert.pem.check", chain_pem)?;
    write(dir, ".key.pem.check", key_pem.as_bytes())?;
    let checked = load_pair(&cert, &key);
    let _ = std::fs::remove_file(&cert);
    let _ = std::fs::remove_file(&key);
    let stored = checked?;
    write(dir, "key.pem", key_pem.as_bytes())?;
    write(dir, "cert.pem", chain_pem)?;
    write(dir, "domains", format!("{}\n", domains.join("\n")).as_bytes())?;
    Ok(stored)
}

fn load_pair(cert: &Path, key: &Path) -> Result<Stored, AcmeError> {
    let loaded = crate::tls::load(cert, key).map_err(|e| AcmeError::Store(e.to_string()))?;
    let validity = loaded
        .cert
        .first()
        .and_then(|c| certs::validity(c.as_ref()))
        .ok_or_else(|| AcmeError::Store(format!("{}: cannot read the certificate's validity", cert.display())))?;
    Ok(Stored { key: loaded, validity })
}

/// The certificate in `dir` when it is for exactly `domains` and not expired at `now` (Unix
/// seconds); `Ok(None)` when there is none (or it is for other names, or expired); an error
/// when the files are there but unusable.
pub fn current(dir: &Path, domains: &[String], now: i64) -> Result<Option<Stored>, AcmeError> {
    let listed = match std::fs::read_to_string(dir.join("domains")) {
        Ok(text) => text.lines().map(str::to_string).filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(store_error(&dir.join("domains"), e)),
    };
    if listed != domains {
        return Ok(None);
    }
    let stored = load_pair(&dir.join("cert.pem"), &dir.join("key.pem"))?;
    Ok((now < stored.validity.1).then_some(stored))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn chain_and_key(domains: &[String]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(domains.to_vec()).expect("params");
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 4, 1);
        (params.self_signed(&key).expect("cert").pem(), key.serialize_pem())
    }

    #[test]
    fn files_are_private_and_come_back() {
        let data = tempfile::tempdir().expect("temp dir");
        let dir = dir(data.path());
        let account = account_key(&dir).expect("made");
        assert_eq!(account_key(&dir).expect("read back").thumbprint(), account.thumbprint());
        let domains = vec!["a.example".to_string()];
        let (chain, key) = chain_and_key(&domains);
        let saved = save(&dir, chain.as_bytes(), &key, &domains).expect("saved");
        assert_eq!(saved.validity, (1_767_225_600, 1_775_001_600));
        assert_eq!(std::fs::metadata(&dir).expect("dir").mode() & 0o777, 0o700);
        for name in ["account.key", "cert.pem", "key.pem", "domains"] {
            assert_eq!(std::fs::metadata(dir.join(name)).expect(name).mode() & 0o777, 0o600, "{name}");
        }
        let names: Vec<_> = std::fs::read_dir(&dir).expect("list").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names.len(), 4, "nothing left aside: {names:?}");
        let before_expiry = 1_775_001_599;
        assert!(current(&dir, &domains, before_expiry).expect("reads").is_some());
        assert!(current(&dir, &domains, before_expiry + 1).expect("reads").is_none(), "expired");
        assert!(current(&dir, &["b.example".to_string()], 0).expect("reads").is_none(), "other names");
    }

    #[test]
    fn a_bad_pair_is_refused_and_the_old_one_stays() {
        let data = tempfile::tempdir().expect("temp dir");
        let dir = dir(data.path());
        let domains = vec!["a.example".to_string()];
        let (chain, key) = chain_and_key(&domains);
        save(&dir, chain.as_bytes(), &key, &domains).expect("saved");
        let (_, other_key) = chain_and_key(&domains);
        let e = save(&dir, chain.as_bytes(), &other_key, &domains).map(|_| ()).expect_err("mismatch");
        assert!(e.to_string().contains("is not the private key"), "{e}");
        assert_eq!(std::fs::read_to_string(dir.join("key.pem")).expect("key"), key);
        assert!(current(&dir, &domains, 0).expect("reads").is_some());
    }

    #[test]
    fn no_files_is_no_certificate() {
        let data = tempfile::tempdir().expect("temp dir");
        assert!(current(&dir(data.path()), &["a.example".to_string()], 0).expect("reads").is_none());
    }
}
