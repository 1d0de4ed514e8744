//! The files the SQLite store lives in, checked at start before anything opens them: the
//! data directory (`data_dir`, and the directory of `db.file` when that lies elsewhere) must
//! exist or be creatable, and this process must be able to create files in it (SQLite adds
//! `-wal` and `-shm` beside the database); a database file that exists (with its `-wal` and
//! `-shm`) must be writable. Otherwise the service would start, report ready and fail every
//! write, or exit with a path and no reason.
//!
//! Each refusal is one line: the path once, the cause and what to do. It creates the
//! directories and a probe file it removes at once; it must not open the database (SQLite
//! does that, in `sqlite.rs`) or touch any other path. With PostgreSQL nothing is stored
//! under `data_dir` and nothing is checked.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use crate::config::Config;

/// Why the store's files cannot be used, with the path and the operating system's error.
#[derive(Debug)]
pub enum FilesError {
    /// The directory set by `key` (`data_dir`, or `db.file` when that names another
    /// directory) cannot be created, is not a directory, or this process cannot create files
    /// in it.
    Dir {
        /// The setting that names the directory.
        key: &'static str,
        /// The directory.
        path: PathBuf,
        /// What the operating system said.
        cause: io::Error,
    },
    /// A database file (or its `-wal` or `-shm`) exists and this process cannot write it.
    File {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        cause: io::Error,
    },
}

/// Check (and create when missing) the directories of the SQLite database and that this
/// process can write them and the database files that exist. A no-op with PostgreSQL.
pub fn check(config: &Config) -> Result<(), FilesError> {
    if config.cluster.database_url.is_some() {
        return Ok(());
    }
    let db = &config.db.path;
    check_dir("data_dir", &config.data_dir)?;
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty() && *d != config.data_dir) {
        check_dir("db.file", dir)?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.clone().into_os_string();
        name.push(suffix);
        let path = PathBuf::from(name);
        match OpenOptions::new().write(true).open(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(cause) => return Err(FilesError::File { path, cause }),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// `dir` exists (created with its parents if missing), is a directory, and takes a new file.
fn check_dir(key: &'static str, dir: &Path) -> Result<(), FilesError> {
    let fail = |cause| FilesError::Dir { key, path: dir.to_path_buf(), cause };
    match fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => return Err(fail(ErrorKind::NotADirectory.into())),
        Ok(_) => {}
        Err(_) => fs::create_dir_all(dir).map_err(fail)?,
    }
    let probe = dir.join(format!(".forkd-write-check-{}", std::process::id()));
    OpenOptions::new().write(true).create_new(true).open(&probe).map_err(fail)?;
    // The probe proved the point; a leftover empty file would be harmless.
    let _ = fs::remove_file(&probe);
    Ok(())
}

impl fmt::Display for FilesError {
    /// One line: the path once, the cause, what to do.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let user = format!("user {}", user());
        match self {
            FilesError::Dir { key, path, cause } => {
                let (path, var) = (path.display(), variable(key));
                let elsewhere = format!("or set {key} ({var}) to a directory {user} can write");
                match cause.kind() {
                    ErrorKind::PermissionDenied => write!(
                        f,
                        "{key} {path}: permission denied ({user} cannot create it or files in it): \
                         make it a directory {user} owns and can write (chown, chmod u+w), {elsewhere}"
                    ),
                    ErrorKind::NotADirectory => write!(
                        f,
                        "{key} {path}: not a directory (a file is in the way): remove or rename that file, {elsewhere}"
                    ),
                    ErrorKind::ReadOnlyFilesystem => write!(
                        f,
                        "{key} {path}: read-only file system: {elsewhere} \
                         (under systemd with ProtectSystem=strict: the unit's StateDirectory)"
                    ),
                    _ => write!(f, "{key} {path}: {}: {elsewhere}", cause_text(cause)),
                }
            }
            FilesError::File { path, cause } => write!(
                f,
                "database file {}: {} ({user} cannot write it, so every change would fail): \
                 make {user} its owner with write access (chown, chmod u+w), or set data_dir (FORKD_DATA_DIR) elsewhere",
                path.display(),
                cause_text(cause)
            ),
        }
    }
}

impl std::error::Error for FilesError {}

/// The operating system's error in words, without "(os error N)".
fn cause_text(e: &io::Error) -> String {
    match e.kind() {
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::NotADirectory => "not a directory".into(),
        ErrorKind::IsADirectory => "is a directory".into(),
        ErrorKind::ReadOnlyFilesystem => "read-only file system".into(),
        ErrorKind::StorageFull => "no space left on device".into(),
        _ => {
            let text = e.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text);
            text.to_lowercase()
        }
    }
}

/// The environment variable that sets `key`.
fn variable(key: &str) -> &'static str {
    match key {
        "db.file" => "FORKD_DB__FILE",
        _ => "FORKD_DATA_DIR",
    }
}

/// The user this process runs as, by name when it has one (else `uid N`).
fn user() -> String {
    let uid = nix::unistd::geteuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data_dir: &Path) -> Config {
        let mut cfg = crate::config::load(None, &[]).expect("the defaults are valid");
        cfg.db.path = data_dir.join("forkd.db");
        cfg.data_dir = data_dir.to_path_buf();
        cfg
    }

    #[test]
    fn a_missing_directory_is_created_and_the_probe_is_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a").join("data");
        check(&config(&dir)).expect("creatable");
        assert!(dir.is_dir());
        assert_eq!(fs::read_dir(&dir).expect("read_dir").count(), 0, "nothing is left in {}", dir.display());
    }

    #[test]
    fn a_file_in_the_way_is_one_line_with_the_path_once_the_cause_and_the_fix() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("afile");
        fs::write(&file, "").expect("write");
        for dir in [file.join("data"), file.clone()] {
            let err = check(&config(&dir)).expect_err("a file is in the way").to_string();
            assert!(!err.contains('\n'), "{err}");
            assert_eq!(err.matches(&dir.display().to_string()).count(), 1, "{err}");
            assert!(err.contains("not a directory") && err.contains("FORKD_DATA_DIR"), "{err}");
        }
    }

    #[test]
    fn a_database_path_that_is_a_directory_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::create_dir(tmp.path().join("forkd.db")).expect("mkdir");
        let err = check(&config(tmp.path())).expect_err("a directory is not a database file").to_string();
        assert!(err.starts_with("database file ") && err.contains("is a directory"), "{err}");
    }

    #[test]
    fn the_cause_is_in_words() {
        assert_eq!(cause_text(&io::Error::from_raw_os_error(libc::EACCES)), "permission denied");
        assert_eq!(cause_text(&io::Error::from_raw_os_error(libc::ENOTDIR)), "not a directory");
        assert_eq!(cause_text(&io::Error::from_raw_os_error(libc::EROFS)), "read-only file system");
        assert_eq!(cause_text(&io::Error::from_raw_os_error(libc::ELOOP)), "too many levels of symbolic links");
    }
}
