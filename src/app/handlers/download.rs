//! `GET /download/{name}` and `GET /download` (the file named `default`)
//! from `download.dir` (CONTRACT §6).
//!
//! This file decides WHAT is sent: the name is checked (no separators, no
//! dot files, no traversal, the resolved path must stay inside the directory,
//! regular files only; anything else is 404), the validators (`ETag`,
//! `Last-Modified`, 304), the single `Range` (206, 416), and a safe
//! `Content-Disposition`. Opening and `fstat` happen here, on the loop
//! (metadata, no content); the content is read in 64 KiB slices on the pool
//! by the worker, only while the client keeps up. Nothing that could block
//! is opened on the loop: a name that is not a regular file (FIFO, device,
//! socket, directory) is never opened at all, and the open itself is
//! non-blocking and checked again on the descriptor (see [`open_regular`]).

use std::fs::{File, Metadata};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use crate::app::router::Router;
use crate::app::{validate, App, Ctx, Handler, Reply};
use crate::error::Error;
use crate::http::request::{Method, Request};
use crate::http::response::Response;

/// Register the routes.
pub fn routes(r: &mut Router<Handler>) {
    r.add(Method::Get, "/download", default_file).add(Method::Get, "/download/{name}", named);
}

fn default_file(app: &App, req: &Request<'_>, _: &Ctx<'_>) -> Result<Reply, Error> {
    serve(app, req, "default")
}

fn named(app: &App, req: &Request<'_>, ctx: &Ctx<'_>) -> Result<Reply, Error> {
    let raw = ctx.params.get(0).ok_or(Error::NotFound)?;
    let name = validate::decode_query(&raw.replace('+', "%2B")).ok_or(Error::NotFound)?;
    serve(app, req, &name)
}

/// A name that can only mean a file directly inside the directory.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\0'])
        && !name.chars().any(char::is_control)
}

fn serve(app: &App, req: &Request<'_>, name: &str) -> Result<Reply, Error> {
    if !safe_name(name) {
        return Err(Error::NotFound);
    }
    let dir = &app.svc.config.download.dir;
    let path = dir.join(name);
    // Symlinks may not lead out of the directory.
    let (Ok(real), Ok(real_dir)) = (path.canonicalize(), dir.canonicalize()) else { return Err(Error::NotFound) };
    if real.parent() != Some(real_dir.as_path()) {
        return Err(Error::NotFound);
    }
    let (file, meta) = open_regular(&real).ok_or(Error::NotFound)?;
    let size = meta.len();
    let etag = format!("\"{:x}-{:x}\"", size, meta.mtime_nsec() as u64 ^ ((meta.mtime() as u64) << 20));
    let modified = meta.modified().map(httpdate::fmt_http_date).unwrap_or_default();
    let mut r = Response::new(200);
    r.content_type = "application/octet-stream";
    r.cache_control = "no-cache";
    r.header("ETag", etag.clone()).header("Last-Modified", modified).header("Accept-Ranges", "bytes");
    if req.header("if-none-match").is_some_and(|v| crate::app::health::etag_matches(v, etag.as_bytes())) {
        r.status = 304;
        return Ok(Reply::full(r));
    }
    r.header("Content-Disposition", disposition(name));
    let range = req
        .header("range")
        .filter(|_| if_range_ok(req, &etag))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| parse_range(v, size));
    let (offset, len) = match range {
        None => (0, size),
        Some(Ok((start, end))) => {
            r.status = 206;
            r.header("Content-Range", format!("bytes {start}-{end}/{size}"));
            (start, end - start + 1)
        }
        Some(Err(())) => {
            let mut r = Error::RangeNotSatisfiable.into_response(app.svc.config.is_development());
            r.header("Content-Range", format!("bytes */{size}"));
            return Ok(Reply::full(r));
        }
    };
    Ok(Reply::file(r, Arc::new(file), offset, len))
}

/// Open `path` for reading if it is a regular file, without ever waiting.
///
/// `open()` of a FIFO waits for a writer, and opening a device can block or
/// act on the device: on the event loop either would stall every connection
/// of the worker. So: `stat` first and open only a regular file; then open
/// with `O_NONBLOCK` (a FIFO swapped in meanwhile returns at once),
/// `O_NOFOLLOW` (nor a symlink: `path` is already resolved), `O_NOCTTY` and
/// `O_CLOEXEC`, and `fstat` the descriptor: only what was really opened
/// counts. `O_NONBLOCK` stays set; it means nothing for a regular file's reads.
fn open_regular(path: &Path) -> Option<(File, Metadata)> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    meta.is_file().then_some((file, meta))
}

/// `If-Range` with a strong ETag: the range applies only if it still matches.
fn if_range_ok(req: &Request<'_>, etag: &str) -> bool {
    req.header("if-range").is_none_or(|v| v == etag.as_bytes())
}

/// One `bytes=` range: `None` to ignore the header (malformed, several
/// ranges), `Some(Err)` when unsatisfiable (416), else the inclusive bounds.
///
/// A last byte past the end of the file, however large (even past 2^64),
/// means the file's last byte (RFC 9110 §14.1.2); so does a suffix longer
/// than the file mean the whole file. Numbers saturate at `u64::MAX` rather
/// than fail, which gives exactly that: no file is that large.
pub fn parse_range(v: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = v.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.bytes().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
    };
    match (a.is_empty(), b.is_empty()) {
        (true, false) => {
            let n = num(b)?;
            if n == 0 || size == 0 {
                return Some(Err(()));
            }
            Some(Ok((size.saturating_sub(n), size - 1)))
        }
        (false, _) => {
            let start = num(a)?;
            let end = if b.is_empty() { u64::MAX } else { num(b)? };
            if end < start {
                return None;
            }
            if start >= size {
                return Some(Err(()));
            }
            Some(Ok((start, end.min(size - 1))))
        }
        (true, true) => None,
    }
}

/// `attachment; filename="…"` (ASCII fallback) plus RFC 6266 `filename*` for non-ASCII names.
pub fn disposition(name: &str) -> String {
    let ascii: String =
        name.chars().map(|c| if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' { c } else { '_' }).collect();
    if name.is_ascii() && ascii == name {
        return format!("attachment; filename=\"{ascii}\"");
    }
    let mut enc = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{enc}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-99", 1000), Some(Ok((0, 99))));
        assert_eq!(parse_range("bytes=100-", 1000), Some(Ok((100, 999))));
        assert_eq!(parse_range("bytes=-100", 1000), Some(Ok((900, 999))));
        assert_eq!(parse_range("bytes=-2000", 1000), Some(Ok((0, 999))));
        assert_eq!(parse_range("bytes=10-999999999", 1000), Some(Ok((10, 999))));
        // Past the file, past u64: the last byte.
        assert_eq!(parse_range("bytes=0-99999999999999999999999", 1000), Some(Ok((0, 999))));
        assert_eq!(parse_range("bytes=990-18446744073709551615", 1000), Some(Ok((990, 999))));
        assert_eq!(parse_range("bytes=990-18446744073709551616", 1000), Some(Ok((990, 999))));
        assert_eq!(parse_range("bytes=0-1000", 1000), Some(Ok((0, 999))));
        assert_eq!(parse_range("bytes=-99999999999999999999999", 1000), Some(Ok((0, 999))));
        assert_eq!(parse_range("bytes=99999999999999999999999-", 1000), Some(Err(())));
        assert_eq!(parse_range("bytes=99999999999999999999999-99999999999999999999999", 1000), Some(Err(())));
        assert_eq!(parse_range("bytes=0-99999999999999999999999", 0), Some(Err(())));
        assert_eq!(parse_range("bytes=99999999999999999999999-5", 1000), None, "end before start");
        assert_eq!(parse_range("bytes=1000-", 1000), Some(Err(())));
        assert_eq!(parse_range("bytes=0-0", 0), Some(Err(())));
        assert_eq!(parse_range("bytes=-0", 1000), Some(Err(())));
        for ignored in ["bytes=abc", "bytes=5-2", "bytes=0-1,5-6", "items=0-1", "bytes=-", "bytes=+1-2"] {
            assert_eq!(parse_range(ignored, 1000), None, "{ignored}");
        }
    }

    #[test]
    fn only_regular_files_are_opened_and_never_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").expect("write");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).expect("mkfifo");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert_eq!(open_regular(&file).map(|(_, m)| m.len()), Some(3));
        // Each of these would block, act on a device or follow a link; none may be opened.
        for p in [fifo.as_path(), dir.path(), Path::new("/dev/null"), link.as_path(), Path::new("/nonexistent")] {
            assert!(open_regular(p).is_none(), "{}", p.display());
        }
    }

    #[test]
    fn names_and_disposition() {
        for bad in ["", ".", "..", ".hidden", "a/b", "a\0b", "/etc/passwd", "a\nb"] {
            assert!(!safe_name(bad), "{bad:?}");
        }
        assert!(safe_name("report 2026.pdf"));
        // On Unix a backslash is an ordinary character, not a separator.
        assert!(safe_name("we\\ird.bin"));
        assert_eq!(disposition("a.bin"), "attachment; filename=\"a.bin\"");
        assert_eq!(
            disposition("résumé.bin"),
            "attachment; filename=\"r_sum_.bin\"; filename*=UTF-8''r%C3%A9sum%C3%A9.bin"
        );
        assert_eq!(disposition("a\"b.bin"), "attachment; filename=\"a_b.bin\"; filename*=UTF-8''a%22b.bin");
    }
}
