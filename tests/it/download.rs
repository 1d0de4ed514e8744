//! File downloads (CONTRACT §6 `GET /download/{name}`): the response head
//! (`Content-Type`, `Content-Disposition` with an RFC 6266 / 8187 `filename*` for non-ASCII
//! names, `Content-Length`, strong `ETag`, `Last-Modified`, `Accept-Ranges`), byte-exact
//! bodies, `GET /download` → the file `default`, `HEAD`, `If-None-Match` → 304, single byte
//! ranges (206 / 416, malformed or multiple ranges ignored per RFC 9110), traversal and
//! other names that must not be served (404 `NOT_FOUND`), back pressure against a slow
//! reader (bounded worker memory, the event loop stays responsive), keep-alive after a
//! download, and clients that go away mid-download.
//!
//! Every test has its own server and its own download directory (`<tmp>/files`), created
//! before the requests; the server reads the files at request time.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::util::*;

const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A server whose `[download] dir` is `<tmp>/files`; `tmp` also holds files *outside* the
/// download directory (targets for traversal attempts).
struct Dl {
    s: Server,
    tmp: tempfile::TempDir,
    files: PathBuf,
}

impl Dl {
    fn start(workers: usize) -> Dl {
        let tmp = tempfile::Builder::new().prefix("forkd-dl-").tempdir().expect("tempdir");
        let files = tmp.path().join("files");
        fs::create_dir_all(&files).expect("create files dir");
        let s = Server::builder().workers(workers).set("download", &format!("dir = \"{}\"", files.display())).start();
        Dl { s, tmp, files }
    }

    /// This server, spoken to over `p`.
    fn on(mut self, p: Proto) -> Dl {
        self.s.set_proto(p);
        self
    }

    /// Writes `files/<name>` (parents created).
    fn put(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.files.join(name);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(&p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        p
    }

    /// Writes `<tmp>/<name>`, outside the download directory.
    fn put_outside(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.tmp.path().join(name);
        fs::write(&p, data).unwrap();
        p
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.s.get_with(path, headers)
    }

    fn head(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.s.call("HEAD", path, headers, b"")
    }
}

/// `len` pseudo-random bytes (xorshift64), different per `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

const FNV_INIT: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64, continued from `h`.
fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where two byte strings first differ (for failure messages instead of megabytes of dump).
fn diff_at(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        return format!("length {} != {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i} of {}", a.len()),
        None => "identical".into(),
    }
}

/// Response summary without the body (a 3 MiB body in a panic message helps nobody).
fn head_of(r: &Response) -> String {
    let mut h = r.clone();
    let n = h.body.len();
    h.body = format!("<{n} bytes>").into_bytes();
    format!("{h:?}")
}

fn mtime_secs(p: &Path) -> i64 {
    fs::metadata(p).unwrap().modified().unwrap().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A strong entity tag: `"…"` of etagc characters, no `W/`.
fn is_strong_etag(e: &str) -> bool {
    let b = e.as_bytes();
    b.len() >= 2
        && b[0] == b'"'
        && b[b.len() - 1] == b'"'
        && b[1..b.len() - 1].iter().all(|&c| c == 0x21 || (0x23..=0x7e).contains(&c) || c >= 0x80)
}

/// A parsed `Content-Disposition`: the type and its parameters (names lower-cased, quoted
/// strings unquoted). `Err` when the value does not parse.
fn parse_disposition(v: &str) -> Result<(String, Vec<(String, String)>), String> {
    let b = v.as_bytes();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t') {
            *i += 1;
        }
    };
    let token = |i: &mut usize| -> String {
        let s = *i;
        while *i < b.len() && !matches!(b[*i], b';' | b'=' | b' ' | b'\t' | b'"') {
            *i += 1;
        }
        v[s..*i].to_string()
    };
    skip_ws(&mut i);
    let ty = token(&mut i).to_ascii_lowercase();
    if ty.is_empty() {
        return Err(format!("no disposition type in {v:?}"));
    }
    let mut params = Vec::new();
    loop {
        skip_ws(&mut i);
        if i == b.len() {
            break;
        }
        if b[i] != b';' {
            return Err(format!("expected `;` at byte {i} of {v:?}"));
        }
        i += 1;
        skip_ws(&mut i);
        let name = token(&mut i).to_ascii_lowercase();
        skip_ws(&mut i);
        if name.is_empty() || i >= b.len() || b[i] != b'=' {
            return Err(format!("bad parameter at byte {i} of {v:?}"));
        }
        i += 1;
        skip_ws(&mut i);
        let value = if i < b.len() && b[i] == b'"' {
            i += 1;
            let mut out = Vec::new();
            loop {
                if i >= b.len() {
                    return Err(format!("unterminated quoted string in {v:?}"));
                }
                match b[i] {
                    b'"' => {
                        i += 1;
                        break;
                    }
                    b'\\' if i + 1 < b.len() => {
                        out.push(b[i + 1]);
                        i += 2;
                    }
                    c => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        } else {
            token(&mut i)
        };
        params.push((name, value));
    }
    Ok((ty, params))
}

/// The raw text between `filename="` and the next `"` (to check what went on the wire,
/// before any unescaping).
fn raw_quoted_filename(v: &str) -> Option<&str> {
    let lower = v.to_ascii_lowercase();
    let start = lower.find("filename=\"")? + "filename=\"".len();
    let end = v[start..].find('"')? + start;
    Some(&v[start..end])
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Checks a `Content-Disposition` for a file named `name`: `attachment`, a plain
/// `filename="…"` that is printable ASCII without `"` or `\` (equal to `name` when `name` is
/// such), and — required when `name` is not plain ASCII, optional otherwise — an
/// RFC 8187 `filename*=UTF-8''…` that decodes to `name`.
fn check_disposition(s: &Server, r: &Response, name: &str, what: &str) {
    let cd = r.header("content-disposition");
    ensure!(s, cd.is_some(), "{what}: no Content-Disposition: {}", head_of(r));
    let cd = cd.unwrap();
    let parsed = parse_disposition(cd);
    ensure!(s, parsed.is_ok(), "{what}: Content-Disposition does not parse ({:?}): {cd:?}", parsed.err());
    let (ty, params) = parsed.unwrap();
    ensure_eq!(s, ty.as_str(), "attachment", "{what}: disposition type in {cd:?}");
    let plain = params.iter().find(|(k, _)| k == "filename").map(|(_, v)| v.clone());
    ensure!(s, plain.is_some(), "{what}: no plain filename=\"…\" parameter in {cd:?}");
    let raw = raw_quoted_filename(cd);
    ensure!(s, raw.is_some(), "{what}: the filename parameter must be a quoted string: {cd:?}");
    let raw = raw.unwrap();
    ensure!(
        s,
        !raw.is_empty() && raw.bytes().all(|c| (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\'),
        "{what}: the plain filename=\"…\" must be non-empty printable ASCII without `\"` or `\\`: {cd:?}"
    );
    ensure_eq!(s, plain.as_deref(), Some(raw), "{what}: the filename parameter must end at its closing quote: {cd:?}");
    let simple = name.bytes().all(|c| (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\');
    if simple {
        ensure_eq!(s, raw, name, "{what}: filename in {cd:?}");
    }
    let star = params.iter().find(|(k, _)| k == "filename*").map(|(_, v)| v.clone());
    if name.is_ascii() && star.is_none() {
        return;
    }
    ensure!(s, star.is_some(), "{what}: a non-ASCII name needs filename*=UTF-8''…: {cd:?}");
    let star = star.unwrap();
    ensure!(
        s,
        star.len() > 7 && star[..7].eq_ignore_ascii_case("UTF-8''"),
        "{what}: filename* must be UTF-8'' + percent-encoding: {cd:?}"
    );
    let enc = &star[7..];
    ensure!(
        s,
        enc.bytes().all(|c| c.is_ascii_alphanumeric() || b"!#$&+-.^_`|~%".contains(&c)),
        "{what}: filename* value has characters outside RFC 8187 attr-char / pct-encoded: {cd:?}"
    );
    let dec = percent_decode(enc);
    ensure_eq!(s, dec.as_deref(), Some(name.as_bytes()), "{what}: filename* must decode to the file's name: {cd:?}");
}

/// Checks a 200 full download of `data` (file at `path`, named `name`).
fn check_full(s: &Server, r: &Response, name: &str, path: &Path, data: &[u8], what: &str) {
    ensure!(s, r.status == 200, "{what}: expected 200, got {}", head_of(r));
    ensure_eq!(
        s,
        media_type(r.header("content-type")).as_deref(),
        Some("application/octet-stream"),
        "{what}: Content-Type of {}",
        head_of(r)
    );
    check_disposition(s, r, name, what);
    let cl = data.len().to_string();
    ensure_eq!(s, r.header("content-length"), Some(cl.as_str()), "{what}: Content-Length of {}", head_of(r));
    ensure!(
        s,
        r.header("transfer-encoding").is_none(),
        "{what}: must not be chunked when the size is known: {}",
        head_of(r)
    );
    ensure!(s, r.header("content-range").is_none(), "{what}: a 200 carries no Content-Range: {}", head_of(r));
    let etag = r.header("etag").unwrap_or("");
    ensure!(s, is_strong_etag(etag), "{what}: a strong ETag \"…\" expected: {}", head_of(r));
    let lm = r.header("last-modified").and_then(parse_imf_fixdate);
    ensure!(s, lm.is_some(), "{what}: Last-Modified must be an IMF-fixdate: {}", head_of(r));
    let mt = mtime_secs(path);
    ensure!(s, (lm.unwrap() - mt).abs() <= 1, "{what}: Last-Modified {lm:?} vs the file's mtime {mt}: {}", head_of(r));
    ensure_eq!(
        s,
        r.header("accept-ranges").map(|v| v.to_ascii_lowercase()),
        Some("bytes".to_string()),
        "{what}: Accept-Ranges of {}",
        head_of(r)
    );
    ensure!(s, r.body == data, "{what}: body differs from the file: {}", diff_at(&r.body, data));
}

/// Checks a 206 for `[first, last]` of `data`.
fn check_206(s: &Server, r: &Response, data: &[u8], first: usize, last: usize, what: &str) {
    ensure!(s, r.status == 206, "{what}: expected 206, got {}", head_of(r));
    let want = format!("bytes {first}-{last}/{}", data.len());
    ensure_eq!(s, r.header("content-range"), Some(want.as_str()), "{what}: Content-Range of {}", head_of(r));
    let cl = (last - first + 1).to_string();
    ensure_eq!(s, r.header("content-length"), Some(cl.as_str()), "{what}: Content-Length of {}", head_of(r));
    ensure_eq!(
        s,
        media_type(r.header("content-type")).as_deref(),
        Some("application/octet-stream"),
        "{what}: Content-Type of {}",
        head_of(r)
    );
    ensure!(
        s,
        r.body == data[first..=last],
        "{what}: body is not bytes {first}-{last} of the file: {}",
        diff_at(&r.body, &data[first..=last])
    );
}

/// Asserts a `GET /health` on `c` answers 200 (the connection is still in sync).
fn health_on(s: &Server, c: &mut Conn, what: &str) {
    c.send(&request("GET", "/health", &[], b""));
    let h = c.try_read_response(false);
    ensure!(s, matches!(&h, Ok(h) if h.status == 200), "{what}: GET /health on the same connection: {h:?}");
}

/// Asserts a `GET /health` in `c` answers 200 (HTTP/1.1: the connection is still in sync;
/// HTTP/2: the connection still serves streams).
fn health_in(s: &Server, c: &mut Session, what: &str) {
    let h = c.request("GET", "/health", &[], b"");
    ensure!(s, h.status == 200, "{what}: GET /health on the same connection: {h:?}");
}

/// Reads from `c.stream` into the running checksum until `n` more bytes came or the
/// deadline passes. Returns bytes read; `Err` on EOF or an error.
fn read_body(c: &mut Conn, mut h: u64, n: usize, deadline: Instant) -> Result<(usize, u64), String> {
    let mut got = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("timed out after {got} of {n} bytes"));
        }
        c.stream.set_read_timeout(Some(left.min(IO_TIMEOUT))).unwrap();
        let want = buf.len().min(n - got);
        match c.stream.read(&mut buf[..want]) {
            Ok(0) => return Err(format!("EOF after {got} of {n} bytes")),
            Ok(k) => {
                h = fnv(h, &buf[..k]);
                got += k;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read error after {got} of {n} bytes: {e}")),
        }
    }
    Ok((got, h))
}

// ---------------------------------------------------------------------------------------
// Full downloads, HEAD, conditional requests
// ---------------------------------------------------------------------------------------

protocols!(full_download_head_and_byte_identical_body);
fn full_download_head_and_byte_identical_body(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(3 * MIB, 1);
    let path = d.put("data.bin", &data);
    let r = d.get("/download/data.bin", &[]);
    check_full(&d.s, &r, "data.bin", &path, &data, "GET /download/data.bin (3 MiB)");
    // The same representation, the same ETag.
    let again = d.get("/download/data.bin", &[]);
    ensure_eq!(d.s, again.header("etag"), r.header("etag"), "the ETag must be stable for an unchanged file");
    ensure!(d.s, again.body == data, "second GET: {}", diff_at(&again.body, &data));
}

protocols!(bare_download_serves_the_file_named_default);
fn bare_download_serves_the_file_named_default(p: Proto) {
    let d = Dl::start(1).on(p);
    // Not there yet: 404, and the server looks again on the next request.
    let r = d.get("/download", &[]);
    d.s.expect_err(&r, 404, "NOT_FOUND", "GET /download with no `default` file");
    let data = pattern(200_000, 2);
    let path = d.put("default", &data);
    d.put("other.bin", b"not this one");
    let r = d.get("/download", &[]);
    check_full(&d.s, &r, "default", &path, &data, "GET /download (the file `default`)");
}

protocols!(head_has_the_get_headers_and_no_body);
fn head_has_the_get_headers_and_no_body(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(3 * MIB, 3);
    let path = d.put("data.bin", &data);
    let g = d.get("/download/data.bin", &[]);
    check_full(&d.s, &g, "data.bin", &path, &data, "GET before HEAD");

    // Over HTTP/2 the stream must end with the head (no DATA: `request` reads to its end).
    let mut c = d.s.session();
    let h = c.request("HEAD", "/download/data.bin", &[], b"");
    ensure!(d.s, h.status == 200, "HEAD /download/data.bin: expected 200, got {h:?}");
    ensure!(d.s, h.body.is_empty(), "HEAD /download/data.bin: no body: {h:?}");
    for name in ["content-type", "content-disposition", "content-length", "etag", "last-modified", "accept-ranges"] {
        ensure_eq!(d.s, h.header(name), g.header(name), "HEAD must carry the GET's {name}: HEAD {h:?}");
    }
    // No body byte followed: the connection parses a next response cleanly.
    if let Session::H1(c) = &mut c {
        let stray = c.poll_readable(Duration::from_millis(200));
        ensure!(
            d.s,
            !stray || c.pending().is_empty(),
            "bytes after the HEAD response: {} bytes, starting {:?}",
            c.pending().len(),
            String::from_utf8_lossy(&c.pending()[..c.pending().len().min(64)])
        );
    }
    health_in(&d.s, &mut c, "after HEAD");
}

protocols!(if_none_match_with_the_etag_is_304_without_body);
fn if_none_match_with_the_etag_is_304_without_body(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(100_000, 4);
    let path = d.put("data.bin", &data);
    let r = d.get("/download/data.bin", &[]);
    check_full(&d.s, &r, "data.bin", &path, &data, "GET");
    let etag = r.header("etag").unwrap().to_string();

    let nm =
        d.s.expect_bodyless("GET", "/download/data.bin", &[("If-None-Match", &etag)], 304, "If-None-Match: <etag>");
    ensure_eq!(d.s, nm.header("etag"), Some(etag.as_str()), "a 304 carries the ETag: {nm:?}");

    let other = d.get("/download/data.bin", &[("If-None-Match", "\"not-the-etag\"")]);
    check_full(&d.s, &other, "data.bin", &path, &data, "If-None-Match with another tag → 200 full");

    // The file changes (other size, later mtime): a new ETag, the old one no longer matches.
    thread::sleep(Duration::from_millis(1100));
    let data2 = pattern(100_001, 5);
    d.put("data.bin", &data2);
    let r2 = d.get("/download/data.bin", &[("If-None-Match", &etag)]);
    check_full(&d.s, &r2, "data.bin", &path, &data2, "If-None-Match: <old etag> after the file changed");
    ensure!(d.s, r2.header("etag") != Some(etag.as_str()), "the ETag must change with the file: {}", head_of(&r2));
}

protocols!(if_none_match_list_and_weak_comparison);
fn if_none_match_list_and_weak_comparison(p: Proto) {
    // RFC 9110 §13.1.2: a list of tags; weak comparison (W/ prefix ignored).
    let d = Dl::start(1).on(p);
    let data = pattern(10_000, 6);
    d.put("data.bin", &data);
    let etag = d.get("/download/data.bin", &[]).header("etag").unwrap_or("\"?\"").to_string();
    let list = format!("\"nope\", {etag}");
    d.s.expect_bodyless(
        "GET",
        "/download/data.bin",
        &[("If-None-Match", &list)],
        304,
        "If-None-Match: \"nope\", <etag>",
    );
    let weak = format!("W/{etag}");
    d.s.expect_bodyless("GET", "/download/data.bin", &[("If-None-Match", &weak)], 304, "If-None-Match: W/<etag>");
    d.s.expect_bodyless("GET", "/download/data.bin", &[("If-None-Match", "*")], 304, "If-None-Match: *");
}

protocols!(non_ascii_name_gets_filename_star_and_an_ascii_fallback);
fn non_ascii_name_gets_filename_star_and_an_ascii_fallback(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(5000, 7);
    let path = d.put("résumé.bin", &data);
    let r = d.get("/download/r%C3%A9sum%C3%A9.bin", &[]);
    check_full(&d.s, &r, "résumé.bin", &path, &data, "GET /download/r%C3%A9sum%C3%A9.bin");
    let cd = r.header("content-disposition").unwrap();
    ensure!(
        d.s,
        cd.to_ascii_lowercase().contains("filename*=utf-8''r%c3%a9sum%c3%a9.bin"),
        "expected filename*=UTF-8''r%C3%A9sum%C3%A9.bin in {cd:?}"
    );
    // A name with a quote and a backslash (legal on Linux): the plain filename must not
    // carry them; filename*, when present, gives the real name.
    let data2 = pattern(100, 8);
    let p2 = d.put("we\"ird\\name.bin", &data2);
    let r2 = d.get("/download/we%22ird%5Cname.bin", &[]);
    check_full(&d.s, &r2, "we\"ird\\name.bin", &p2, &data2, "GET /download/we%22ird%5Cname.bin");
}

// ---------------------------------------------------------------------------------------
// Ranges
// ---------------------------------------------------------------------------------------

protocols!(single_ranges_give_206_with_exact_bytes);
fn single_ranges_give_206_with_exact_bytes(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(3 * MIB, 9);
    let n = data.len();
    d.put("data.bin", &data);
    let cases: Vec<(String, usize, usize)> = vec![
        ("bytes=0-99".into(), 0, 99),
        ("bytes=100-".into(), 100, n - 1),
        ("bytes=-100".into(), n - 100, n - 1),
        ("bytes=10-999999999".into(), 10, n - 1),
        ("bytes=1048570-2097160".into(), 1_048_570, 2_097_160),
        (format!("bytes={}-{}", n - 1, n - 1), n - 1, n - 1),
    ];
    for (range, first, last) in cases {
        let r = d.get("/download/data.bin", &[("Range", &range)]);
        check_206(&d.s, &r, &data, first, last, &format!("Range: {range}"));
    }
}

protocols!(range_edge_cases_per_rfc9110);
fn range_edge_cases_per_rfc9110(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(1000, 10);
    d.put("data.bin", &data);
    // A suffix longer than the file selects the whole file (RFC 9110 §14.1.2).
    let r = d.get("/download/data.bin", &[("Range", "bytes=-5000")]);
    check_206(&d.s, &r, &data, 0, 999, "Range: bytes=-5000 on 1000 bytes");
    let r = d.get("/download/data.bin", &[("Range", "bytes=0-0")]);
    check_206(&d.s, &r, &data, 0, 0, "Range: bytes=0-0");
    let r = d.get("/download/data.bin", &[("Range", "bytes=0-")]);
    check_206(&d.s, &r, &data, 0, 999, "Range: bytes=0-");
}

protocols!(if_range_applies_the_range_only_for_the_current_etag);
fn if_range_applies_the_range_only_for_the_current_etag(p: Proto) {
    // RFC 9110 §13.1.5: If-Range with the current strong ETag → the range (206); with any
    // other tag → the whole file (200).
    let d = Dl::start(1).on(p);
    let data = pattern(10_000, 20);
    let path = d.put("data.bin", &data);
    let etag = d.get("/download/data.bin", &[]).header("etag").unwrap_or("\"?\"").to_string();
    let r = d.get("/download/data.bin", &[("Range", "bytes=0-9"), ("If-Range", &etag)]);
    check_206(&d.s, &r, &data, 0, 9, "Range with If-Range: <current etag>");
    let r = d.get("/download/data.bin", &[("Range", "bytes=0-9"), ("If-Range", "\"stale\"")]);
    check_full(&d.s, &r, "data.bin", &path, &data, "Range with If-Range: <stale etag> → 200 full");
}

protocols!(unsatisfiable_range_is_416_with_star_content_range);
fn unsatisfiable_range_is_416_with_star_content_range(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(3 * MIB, 11);
    let n = data.len();
    d.put("data.bin", &data);
    d.put("empty.bin", b"");
    for (path, range, size) in [
        ("/download/data.bin", format!("bytes={n}-"), n),
        ("/download/data.bin", format!("bytes={}-{}", n + 10, n + 20), n),
        ("/download/empty.bin", "bytes=0-0".to_string(), 0),
    ] {
        let what = format!("GET {path} Range: {range}");
        let mut c = d.s.session();
        let r = c.request("GET", path, &[("Range", &range)], b"");
        ensure!(d.s, r.status == 416, "{what}: expected 416, got {}", head_of(&r));
        let want = format!("bytes */{size}");
        ensure_eq!(d.s, r.header("content-range"), Some(want.as_str()), "{what}: Content-Range of {}", head_of(&r));
        ensure!(d.s, r.body.len() < 1000, "{what}: a 416 must not carry the file: {}", head_of(&r));
        if !r.closes() {
            health_in(&d.s, &mut c, &what);
        }
    }
    // The empty file itself is a 200 with Content-Length: 0.
    let r = d.get("/download/empty.bin", &[]);
    check_full(&d.s, &r, "empty.bin", &d.files.join("empty.bin"), b"", "GET /download/empty.bin");
}

protocols!(malformed_or_multiple_ranges_are_ignored);
fn malformed_or_multiple_ranges_are_ignored(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(100_000, 12);
    let path = d.put("data.bin", &data);
    for range in ["bytes=abc", "bytes=5-2", "bytes=0-1,5-6", "items=0-5", "bytes=", "bytes=--5", "bytes=1-2-3"] {
        let r = d.get("/download/data.bin", &[("Range", range)]);
        check_full(&d.s, &r, "data.bin", &path, &data, &format!("Range: {range} (to be ignored → 200 full)"));
    }
}

protocols!(a_range_end_past_the_file_even_past_u64_is_clamped_to_the_last_byte);
/// Regression: a Range end past the file was clamped only while it fitted in a u64; past it
/// (`bytes=0-99999999999999999999999`) the header was ignored and the whole file sent with
/// 200. RFC 9110 §14.1.2: an end past the file means its last byte → 206.
fn a_range_end_past_the_file_even_past_u64_is_clamped_to_the_last_byte(p: Proto) {
    let d = Dl::start(1).on(p);
    let data = pattern(1000, 16);
    d.put("data.bin", &data);
    for (range, first) in [
        ("bytes=0-99999999999999999999999", 0),
        ("bytes=990-18446744073709551616", 990),
        ("bytes=990-18446744073709551615", 990),
        ("bytes=500-1000", 500),
        ("bytes=-99999999999999999999999", 0),
    ] {
        let r = d.get("/download/data.bin", &[("Range", range)]);
        check_206(&d.s, &r, &data, first, 999, &format!("Range: {range} on 1000 bytes"));
    }
    // A first byte past the file, however large, is unsatisfiable.
    let r = d.get("/download/data.bin", &[("Range", "bytes=99999999999999999999999-")]);
    ensure!(d.s, r.status == 416, "Range: bytes=99999999999999999999999- → 416, got {}", head_of(&r));
    ensure_eq!(d.s, r.header("content-range"), Some("bytes */1000"), "Content-Range of the 416");
}

// ---------------------------------------------------------------------------------------
// Names that must not be served
// ---------------------------------------------------------------------------------------

protocols!(traversal_and_unservable_names_are_404);
fn traversal_and_unservable_names_are_404(p: Proto) {
    let d = Dl::start(1).on(p);
    let ok = pattern(1000, 13);
    let ok_path = d.put("ok.bin", &ok);
    d.put(".hidden", b"HIDDEN-DOTFILE-CONTENT");
    d.put("sub/file", b"SUBDIR-FILE-CONTENT");
    fs::create_dir_all(d.files.join("adir")).unwrap();
    let secret = d.put_outside("secret", b"OUTSIDE-SECRET-CONTENT");
    d.put_outside("Cargo.toml", b"OUTSIDE-CARGO-CONTENT");
    std::os::unix::fs::symlink(&secret, d.files.join("link")).unwrap();
    std::os::unix::fs::symlink(&secret, d.files.join("link.bin")).unwrap();

    // Sanity: a plain file is served (so a 404 below means "refused", not "no feature").
    let r = d.get("/download/ok.bin", &[]);
    check_full(&d.s, &r, "ok.bin", &ok_path, &ok, "GET /download/ok.bin");

    let abs_secret = format!("/download/{}", urlencode(&secret.display().to_string()));
    let paths: Vec<String> = vec![
        "/download/..%2fCargo.toml".into(),
        "/download/..%2FCargo.toml".into(),
        "/download/%2e%2e%2fsecret".into(),
        "/download/%2E%2E/secret".into(),
        "/download/../secret".into(),
        "/download/..".into(),
        "/download/%2e%2e".into(),
        "/download/.".into(),
        "/download/.hidden".into(),
        "/download/%2ehidden".into(),
        "/download/sub/file".into(),
        "/download/sub%2ffile".into(),
        "/download/sub".into(),
        "/download/adir".into(),
        "/download/%2Fetc%2Fpasswd".into(),
        abs_secret,
        "/download/link".into(),
        "/download/link.bin".into(),
        "/download/ok.bin%00".into(),
        "/download/ok.bin%00.txt".into(),
        "/download/missing.bin".into(),
        "/download/..%5csecret".into(),
        "/download/%252e%252e%252fsecret".into(),
        "/download/files%2f..%2f..%2fsecret".into(),
    ];
    let mut failures = Vec::new();
    for p in &paths {
        let r = match d.s.try_call("GET", p, &[], b"", IO_TIMEOUT) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("GET {p}: no response: {e}"));
                continue;
            }
        };
        let body = r.body_str();
        if body.contains("CONTENT") {
            failures.push(format!("GET {p}: LEAKED a file outside the served set: {}", head_of(&r)));
            continue;
        }
        let v: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
        let code = v.as_ref().and_then(|v| v["code"].as_str().map(str::to_string));
        if r.status != 404
            || media_type(r.header("content-type")).as_deref() != Some("application/json")
            || code.as_deref() != Some("NOT_FOUND")
        {
            failures.push(format!("GET {p}: expected 404 NOT_FOUND (JSON), got {}", head_of(&r)));
        }
    }
    ensure!(d.s, failures.is_empty(), "{} of {} paths wrong:\n{}", failures.len(), paths.len(), failures.join("\n"));
    // HEAD follows the same rule.
    let h = d.head("/download/..%2fCargo.toml", &[]);
    ensure_eq!(d.s, h.status, 404, "HEAD /download/..%2fCargo.toml: {h:?}");
    d.s.assert_healthy();
}

protocols!(a_fifo_a_directory_or_a_socket_is_404_at_once_and_the_loop_keeps_serving);
/// Regression: `open()` of a FIFO blocks until a writer appears, so a FIFO in the download
/// directory stalled the worker's loop until the watchdog killed it. Anything that is not a
/// regular file (FIFO, directory, symlink to a directory, socket) is 404 at once, and the
/// worker keeps serving.
fn a_fifo_a_directory_or_a_socket_is_404_at_once_and_the_loop_keeps_serving(p: Proto) {
    use nix::sys::stat::Mode;
    let d = Dl::start(1).on(p);
    nix::unistd::mkfifo(&d.files.join("pipe"), Mode::S_IRUSR | Mode::S_IWUSR).expect("mkfifo pipe");
    nix::unistd::mkfifo(&d.files.join("default"), Mode::S_IRUSR | Mode::S_IWUSR).expect("mkfifo default");
    fs::create_dir_all(d.files.join("adir")).unwrap();
    std::os::unix::fs::symlink(d.files.join("adir"), d.files.join("dirlink")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(d.files.join("sock")).expect("bind a unix socket");
    for (method, path) in [
        ("GET", "/download/pipe"),
        ("HEAD", "/download/pipe"),
        ("GET", "/download"),
        ("GET", "/download/adir"),
        ("GET", "/download/dirlink"),
        ("GET", "/download/sock"),
    ] {
        let what = format!("{method} {path}");
        let t = Instant::now();
        let r = d.s.try_call(method, path, &[], b"", Duration::from_secs(3));
        ensure!(d.s, matches!(&r, Ok(r) if r.status == 404), "{what}: expected 404 within 3 s, got {r:?}");
        if method == "GET" {
            if let Ok(r) = &r {
                d.s.expect_err(r, 404, "NOT_FOUND", &what);
            }
        }
        ensure!(d.s, t.elapsed() < Duration::from_secs(1), "{what}: the 404 took {:?}", t.elapsed());
        let h = d.s.try_get("/health", Duration::from_secs(2));
        ensure!(d.s, matches!(&h, Ok(h) if h.status == 200), "GET /health right after {what}: {h:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Streaming: back pressure, keep-alive, disconnects
// ---------------------------------------------------------------------------------------

#[test]
fn slow_reader_keeps_worker_memory_bounded_and_the_loop_responsive() {
    let d = Dl::start(1);
    let size = 64 * MIB;
    let data = pattern(size, 14);
    let want_sum = fnv(FNV_INIT, &data);
    d.put("big.bin", &data);
    drop(data);
    d.put("small.bin", &pattern(300_000, 15));
    let pid = d.s.debug_pid();
    ensure_eq!(d.s, d.s.workers(), vec![pid], "one worker expected");
    // Warm up the download path, then take the baseline.
    let w = d.get("/download/small.bin", &[]);
    ensure!(d.s, w.status == 200, "warm-up GET /download/small.bin: {}", head_of(&w));
    thread::sleep(Duration::from_millis(200));
    let rss0 = anon_rss_kib(pid);

    let mut c = d.s.conn();
    c.send(&request("GET", "/download/big.bin", &[], b""));
    let head = c.read_head_response();
    ensure!(d.s, head.status == 200, "GET /download/big.bin: {head:?}");
    let cl = size.to_string();
    ensure_eq!(d.s, head.header("content-length"), Some(cl.as_str()), "Content-Length of {head:?}");
    let pre = c.take_pending();
    let mut sum = fnv(FNV_INIT, &pre);
    let mut got = pre.len();
    let deadline = Instant::now() + Duration::from_secs(90);
    let (k, h) = read_body(&mut c, sum, MIB.saturating_sub(got), deadline)
        .unwrap_or_else(|e| panic!("reading the first MiB: {e}\nlog:\n{}", d.s.log_tail()));
    got += k;
    sum = h;

    // Stall for 2 s: sample RSS and CPU; /health on other connections must stay quick.
    let stall = Instant::now();
    let cpu0 = cpu_ms(pid);
    let mut max_rss = rss0;
    let mut health_ms = Vec::new();
    let mut health_fail = Vec::new();
    while stall.elapsed() < Duration::from_secs(2) {
        max_rss = max_rss.max(anon_rss_kib(pid));
        let t = Instant::now();
        match d.s.try_get("/health", Duration::from_secs(2)) {
            Ok(r) if r.status == 200 => health_ms.push(t.elapsed().as_millis() as u64),
            other => health_fail.push(format!("{other:?}")),
        }
        thread::sleep(Duration::from_millis(150));
    }
    max_rss = max_rss.max(anon_rss_kib(pid));
    let cpu_used = cpu_ms(pid) - cpu0;

    eprintln!(
        "slow reader: read {got} of {size} bytes, stalled 2 s; worker RSS {rss0} KiB before, max {max_rss} KiB \
         during; CPU {cpu_used} ms; /health took {health_ms:?} ms"
    );
    ensure!(d.s, health_fail.is_empty(), "/health failed during the stall: {health_fail:?}");
    let mut sorted = health_ms.clone();
    sorted.sort();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(u64::MAX);
    ensure!(
        d.s,
        median < 200 && sorted.last().copied().unwrap_or(0) < 1000,
        "/health during a stalled download must answer quickly (< 200 ms): took {health_ms:?} ms"
    );
    let grew = max_rss - rss0;
    ensure!(
        d.s,
        grew <= 8 * 1024,
        "worker RSS grew by {grew} KiB (from {rss0} to {max_rss} KiB) while a reader stalled after {got} of {size} bytes; \
         the server must stop reading the file while the socket is full"
    );
    ensure!(
        d.s,
        cpu_used <= 1000,
        "the worker used {cpu_used} ms of CPU in a 2 s stall: busy-waiting on a full socket?"
    );

    // Now read the rest: every byte, in order.
    let (k, h) = read_body(&mut c, sum, size - got, deadline)
        .unwrap_or_else(|e| panic!("reading the rest after the stall: {e}\nlog:\n{}", d.s.log_tail()));
    got += k;
    ensure_eq!(d.s, got, size, "total bytes");
    ensure!(d.s, h == want_sum, "checksum of the 64 MiB body differs from the file's (FNV-1a {h:#x} vs {want_sum:#x})");
    let after = anon_rss_kib(pid);
    ensure!(d.s, after - rss0 <= 8 * 1024, "worker RSS after the download: {after} KiB vs {rss0} KiB before");
    health_on(&d.s, &mut c, "after the 64 MiB download");
}

/// A plain HTTP/1.1 download goes from the page cache to the socket with `sendfile(2)`: a
/// reader that stops costs the worker no file buffer. With 64 KiB slices read into user space
/// each stalled download would hold two of them (128 KiB); here the worker's RSS grows by
/// far less than one slice per reader (nginx with `sendfile on` holds ~11 KiB per reader).
#[test]
fn stalled_plain_downloads_hold_no_file_buffers_in_the_worker() {
    const READERS: usize = 24;
    let d = Dl::start(1);
    let size = 32 * MIB;
    d.put("shared.bin", &pattern(size, 21));
    let pid = d.s.debug_pid();
    let w = d.get("/download/shared.bin", &[("range", "bytes=0-99999")]);
    ensure!(d.s, w.status == 206, "warm-up range: {}", head_of(&w));
    let settle = |what: &str| -> i64 {
        // The loop is done when the worker's RSS has not moved for half a second.
        let (mut last, mut same, t) = (anon_rss_kib(pid), 0, Instant::now());
        while same < 5 && t.elapsed() < Duration::from_secs(8) {
            thread::sleep(Duration::from_millis(100));
            let now = anon_rss_kib(pid);
            same = if now == last { same + 1 } else { 0 };
            last = now;
        }
        eprintln!("{what}: worker RSS {last} KiB");
        last
    };
    let rss0 = settle("before");
    let mut readers = Vec::new();
    for i in 0..READERS {
        let mut c = d.s.conn();
        c.send(&request("GET", "/download/shared.bin", &[], b""));
        let head = c.read_head_response();
        ensure!(d.s, head.status == 200, "reader {i}: {head:?}");
        readers.push(c);
    }
    let rss1 = settle("with every reader stalled");
    let grew = rss1 - rss0;
    let per_reader = grew * 1024 / READERS as i64;
    ensure!(
        d.s,
        per_reader <= 32 * 1024,
        "{READERS} stalled downloads grew the worker by {grew} KiB ({per_reader} bytes each): file bytes are \
         buffered in user space instead of going to the socket from the page cache"
    );
    let r = d.s.try_get("/health", Duration::from_secs(2));
    ensure!(d.s, matches!(&r, Ok(r) if r.status == 200), "/health beside {READERS} stalled downloads: {r:?}");
}

#[test]
fn keep_alive_after_downloads() {
    let d = Dl::start(1);
    let data = pattern(100 * 1024, 16);
    let path = d.put("small.bin", &data);
    let mut c = d.s.conn();
    c.send(&request("GET", "/download/small.bin", &[], b""));
    let r = c.read_response();
    check_full(&d.s, &r, "small.bin", &path, &data, "first GET on the connection");
    ensure!(d.s, !r.closes(), "a download must not close a keep-alive connection: {}", head_of(&r));
    health_on(&d.s, &mut c, "after a full download");

    c.send(&request("GET", "/download/small.bin", &[("Range", "bytes=10-19")], b""));
    let r = c.read_response();
    check_206(&d.s, &r, &data, 10, 19, "206 on the same connection");
    health_on(&d.s, &mut c, "after a 206");

    c.send(&request("GET", "/download/small.bin", &[], b""));
    let r = c.read_response();
    check_full(&d.s, &r, "small.bin", &path, &data, "third GET on the connection");
    health_on(&d.s, &mut c, "after a second full download");
}

#[test]
fn pipelined_request_after_a_download_is_answered_in_order() {
    let d = Dl::start(1);
    let data = pattern(1024 * 1024, 17);
    let path = d.put("mid.bin", &data);
    let mut c = d.s.conn();
    let mut reqs = request("GET", "/download/mid.bin", &[], b"");
    reqs.extend_from_slice(&request("GET", "/health", &[], b""));
    c.send(&reqs);
    let r = c.read_response();
    check_full(&d.s, &r, "mid.bin", &path, &data, "pipelined download");
    let h = c.read_response();
    ensure!(d.s, h.status == 200 && h.body_str().contains("ok"), "the pipelined /health after the download: {h:?}");
}

#[test]
fn client_gone_mid_download_is_cleaned_up() {
    let d = Dl::start(1);
    let size = 32 * MIB;
    d.put("big.bin", &pattern(size, 18));
    let small = pattern(50_000, 19);
    let small_path = d.put("small.bin", &small);
    let pid = d.s.debug_pid();

    for (i, read_before_close) in [None, Some(0usize), Some(256 * 1024), Some(4 * MIB)].into_iter().enumerate() {
        let what = format!("disconnect #{i} (read {read_before_close:?} body bytes first)");
        let mut c = d.s.conn();
        c.send(&request("GET", "/download/big.bin", &[], b""));
        if let Some(n) = read_before_close {
            let head = c.read_head_response();
            ensure!(d.s, head.status == 200, "{what}: {head:?}");
            let have = c.pending().len();
            if n > have {
                let r = read_body(&mut c, FNV_INIT, n - have, Instant::now() + Duration::from_secs(30));
                ensure!(d.s, r.is_ok(), "{what}: {r:?}");
            }
            // While it is open the worker counts it (plus the probe).
            let mut v = None;
            let two = eventually(Duration::from_secs(2), || {
                v = d.s.streams_once();
                v.as_ref().map(|v| count_of(v, "connections")) == Some(2)
            });
            ensure!(d.s, two, "{what}: /_debug/streams during the download should count 2 connections: {v:?}");
        } else {
            thread::sleep(Duration::from_millis(50));
        }
        drop(c);
        let mut last = None;
        let back = eventually(Duration::from_secs(5), || {
            last = d.s.streams_once();
            last.as_ref().map(|v| count_of(v, "connections")) == Some(1)
        });
        ensure!(d.s, back, "{what}: /_debug/streams `connections` did not return to 1 within 5 s: {last:?}");
        d.s.assert_healthy();
    }
    // The same worker (no crash, no replacement) still serves downloads.
    ensure_eq!(d.s, d.s.debug_pid(), pid, "the worker must survive clients that go away");
    let r = d.get("/download/small.bin", &[]);
    check_full(&d.s, &r, "small.bin", &small_path, &small, "GET after the disconnects");
    ensure!(
        d.s,
        !d.s.logs().to_lowercase().contains("panicked"),
        "a panic in the log after client disconnects:\n{}",
        d.s.log_tail()
    );
}

// ---------------------------------------------------------------------------------------
// The download directory at start
// ---------------------------------------------------------------------------------------

#[test]
fn the_default_download_dir_is_created_at_start() {
    // The harness leaves `download.dir` at its default, `./data/files`, relative to the
    // server's working directory (its temp dir).
    let s = Server::start("");
    let files = s.dir().join("data/files");
    assert!(files.is_dir(), "{} was not created at start; log:\n{}", files.display(), s.log_tail());
    s.wait_log_line(Duration::from_secs(5), |l| l.contains("created download.dir ./data/files"));
    fs::write(files.join("hello.txt"), b"hello").unwrap();
    let r = s.get("/download/hello.txt");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]), "{r:?}");
}

#[test]
fn a_missing_download_dir_is_created_with_its_parents() {
    let tmp = tempfile::Builder::new().prefix("forkd-dl-").tempdir().unwrap();
    let files = tmp.path().join("not/there/yet");
    let s = Server::builder().set("download", &format!("dir = \"{}\"", files.display())).start();
    assert!(files.is_dir(), "{} was not created at start; log:\n{}", files.display(), s.log_tail());
    fs::write(files.join("default"), b"the default file").unwrap();
    let r = s.get("/download");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"the default file"[..]), "{r:?}");
}

#[test]
fn a_download_dir_that_cannot_be_created_is_logged_once_with_its_path() {
    let tmp = tempfile::Builder::new().prefix("forkd-dl-").tempdir().unwrap();
    // A regular file where a parent directory should be: creating the directory fails.
    fs::write(tmp.path().join("plain-file"), b"x").unwrap();
    let files = tmp.path().join("plain-file/files");
    let s = Server::builder().set("download", &format!("dir = \"{}\"", files.display())).start();
    let line = s.wait_log_line(Duration::from_secs(5), |l| l.contains("download.dir"));
    assert!(
        line.contains(&files.display().to_string()) && line.contains("cannot be created") && line.contains("WARN"),
        "the warning must name the directory: {line}"
    );
    for _ in 0..3 {
        let r = s.get("/download/x");
        assert_json_error(&r, 404, Some("NOT_FOUND"), "a download from a missing directory");
    }
    s.assert_healthy();
    let logs = s.logs();
    let warnings = logs.lines().filter(|l| l.contains("download.dir")).count();
    assert_eq!(warnings, 1, "logged once, at start, not per request:\n{logs}");
}
