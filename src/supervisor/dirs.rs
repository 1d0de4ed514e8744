//! The download directory (`download.dir`), prepared by the supervisor before it forks: created
//! when it is missing (the default `./data/files` does not exist on a fresh machine), so that
//! `GET /download/...` answers for the files put there instead of a 404 nobody can explain.
//! When it cannot be created (or is not a directory), one warning at start (and at a reload)
//! names the path; the service runs on, and downloads answer 404 until it exists.
//!
//! This file must not touch anything but that one path.

use std::path::Path;

/// Creates `dir` (with its parents) if it does not exist; logs what it did or why it could not.
pub(super) fn prepare_download_dir(dir: &Path) {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => log::warn!(
            "download.dir {} is not a directory: GET /download/... answers 404 until it is one",
            dir.display()
        ),
        Err(_) => match std::fs::create_dir_all(dir) {
            Ok(()) => log::info!("created download.dir {} (empty: put the files to serve there)", dir.display()),
            Err(e) => log::warn!(
                "download.dir {} does not exist and cannot be created ({e}): GET /download/... answers 404 until it exists",
                dir.display()
            ),
        },
    }
}
