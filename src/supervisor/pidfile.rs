//! The `pid_file`: where the supervisor's pid is kept for tools that signal
//! it (`kill -HUP $(cat forkd.pid)`), the way nginx keeps `nginx.pid`.
//!
//! Written atomically (a temporary file in the same directory, renamed over
//! the target), so a reader never sees a half-written number. Removed at exit
//! only while it still names this process: during a binary upgrade the new
//! supervisor rewrites it before the old one exits, and the old one must
//! leave the new one's file alone. It must not decide when to write: the
//! supervisor does (at start; after an upgrade, once the new one serves).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Write `pid` (and a newline) to `path`, atomically.
pub fn write(path: &Path, pid: u32) -> io::Result<()> {
    let tmp = temporary(path, pid)?;
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(format!("{pid}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Remove `path` if it names `pid`; a file naming another process (the new
/// supervisor of an upgrade) or no file at all is left as it is.
pub fn remove_if_ours(path: &Path, pid: u32) {
    let ours = std::fs::read_to_string(path).is_ok_and(|s| s.trim().parse::<u32>().ok() == Some(pid));
    if ours {
        if let Err(e) = std::fs::remove_file(path) {
            log::warn!("pid_file {}: cannot remove it: {e}", path.display());
        }
    }
}

/// `.<name>.<pid>.tmp` beside `path`.
fn temporary(path: &Path, pid: u32) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{pid}.tmp"));
    Ok(path.with_file_name(tmp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replaces_and_removes_only_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("forkd.pid");
        write(&path, 41).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "41\n");
        write(&path, 42).expect("rewrite");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "42\n");
        remove_if_ours(&path, 41);
        assert!(path.exists(), "another process's pid file stays");
        remove_if_ours(&path, 42);
        assert!(!path.exists(), "our own is removed");
        remove_if_ours(&path, 42);
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(left.is_empty(), "no temporary file left: {left:?}");
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nope").join("forkd.pid");
        assert!(write(&path, 1).is_err());
    }
}
