//! The compression phase, after a response is decorated: a body worth compressing goes out
//! in the coding the request's `Accept-Encoding` allows (`crate::http::encoding`: zstd, br or
//! gzip), with `Content-Encoding`, `Vary: Accept-Encoding` and an `ETag` of its own per coding.
//!
//! Where the work happens is the point of this module:
//! - a pool job's response is compressed inside the job ([`Plan::finish`]) at `level`, the
//!   coding chosen in the order of bodies compressed per response ([`Coding::FRESH`]);
//! - a body fixed for a configuration's life (`Body::Static`: the OpenAPI document, the
//!   `/api/docs` page, `/api/config`, the `/static/*` files) is compressed once per coding at
//!   the best level, before the workers fork ([`Precompressed`], built by `crate::app::fixed`),
//!   and chosen in the order of bodies compressed once ([`Coding::FIXED`]);
//! - any other body made on the loop that should be compressed is handed to the pool
//!   ([`OnLoop::ToPool`]): per-request compression never runs on the loop.
//!
//! A response shorter than `min_bytes` costs one comparison of its length ([`worth_a_look`]).
//!
//! Never compressed: responses of the auth routes and any response with `Set-Cookie` (they
//! carry tokens next to text an attacker may choose: BREACH); statuses other than 2xx, and
//! 204 and 206 among them; pages whose body gets a CSP nonce as it is written; bodies that do
//! not get smaller. Event streams, downloads and WebSocket never reach this phase.
//!
//! It must not touch sockets or framing, pick routes, or compress a body on the loop.

use std::io::Write;

use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::cpu::CpuLane;
use crate::http::encoding::{self, Accepted, Coding};
use crate::http::fields::Fields;
use crate::http::response::{Body, Response, Value};

/// How hard a body is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effort {
    /// Per response, on the pool: `[compression] level` (1 to 9) is gzip's level and zstd's,
    /// and brotli's quality less one, at most [`FRESH_BROTLI_MAX`].
    Level(u32),
    /// Once for a configuration's life: gzip 9, brotli 11, zstd 19 (the best each has
    /// without zstd's "ultra" levels, whose windows exceed what browsers decode). A debug
    /// build (the test suite's) uses brotli 6 and zstd 9 instead: brotli 11 on the OpenAPI
    /// document takes about a second there, which every server start would pay.
    Best,
}

/// The highest brotli quality a body compressed per response gets. From quality 5 up the
/// `brotli` crate sets up hash tables whose cost does not shrink with the body: a 3 KB page
/// takes about 25 times longer at 5 than at 4, for a body 2 % smaller.
pub const FRESH_BROTLI_MAX: u32 = 4;

/// brotli's quality and zstd's level for [`Effort::Best`].
const BEST_BROTLI: u32 = if cfg!(debug_assertions) { 6 } else { 11 };
const BEST_ZSTD: i32 = if cfg!(debug_assertions) { 9 } else { 19 };

/// brotli's window for a body of `len` bytes: the smallest that holds it, from 1 KiB
/// (`lgwin` 10) to 4 MiB (22, the format's default, what every browser decodes).
fn brotli_window(len: usize) -> u32 {
    (usize::BITS - len.saturating_sub(1).leading_zeros()).clamp(10, 22)
}

/// What a request allows for its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Never compressed and never said to vary: compression is off, or the route answers
    /// with tokens.
    Never,
    /// Sent as it is; an eligible response still says `Vary: Accept-Encoding`.
    Identity,
    /// An eligible response is compressed with one of these codings (the choice depends on
    /// how the body is compressed: [`Coding::FRESH`] or [`Coding::FIXED`]).
    Encode(Accepted),
}

/// Where a response made on the loop goes.
#[derive(Debug)]
pub enum OnLoop {
    /// Ready to send: as it is, or in a precompressed form.
    Send(Response),
    /// To be compressed on the pool ([`Plan::finish`] in a job), then sent.
    ToPool(Response),
}

impl Plan {
    /// The plan for a request to `path` with header `fields`.
    pub fn new(config: &Config, path: &str, fields: Fields<'_>) -> Plan {
        if !config.compression.enabled || token_route(path) {
            return Plan::Never;
        }
        let accepted = encoding::negotiate(fields);
        if accepted.any() {
            Plan::Encode(accepted)
        } else {
            Plan::Identity
        }
    }

    /// A pool job's response, compressed when eligible (on the compression lane: the pool
    /// job waits for it).
    pub fn finish(self, mut r: Response, config: &Config) -> Response {
        if self == Plan::Never || !eligible(&r, config.compression.min_bytes) {
            return r;
        }
        vary(&mut r);
        if let Some(c) = self.pick(Coding::FRESH) {
            match on_lane(c, std::mem::take(&mut r.body), Effort::Level(config.compression.level)) {
                Some((_, Some(z))) => {
                    r.body = Body::Bytes(z);
                    mark(&mut r, c);
                }
                Some((body, None)) => r.body = body,
                None => {
                    let e = crate::error::Error::Internal("the compression lane is gone".into());
                    return crate::app::render(e, config.is_development());
                }
            }
        }
        r
    }

    /// A response made on the loop: a fixed body in its precompressed form; a body made per
    /// request that should be compressed, to the pool; anything else as it is.
    pub fn on_loop(self, mut r: Response, config: &Config, forms: &'static Precompressed) -> OnLoop {
        if self == Plan::Never || !eligible(&r, config.compression.min_bytes) {
            return OnLoop::Send(r);
        }
        let Body::Static(body) = r.body else {
            return match self.pick(Coding::FRESH) {
                Some(_) => OnLoop::ToPool(r),
                None => {
                    vary(&mut r);
                    OnLoop::Send(r)
                }
            };
        };
        vary(&mut r);
        if let Some((c, z)) = self.fixed_form(body, forms) {
            r.body = Body::Static(z);
            mark(&mut r, c);
        }
        OnLoop::Send(r)
    }

    /// A 304 for a fixed body: the `ETag` (the coding's own) and `Vary` that the 200 to the
    /// same request would carry, so a cache revalidating one coding's form keeps that form.
    pub fn not_modified(self, r: &mut Response, body: &'static [u8], config: &Config, forms: &'static Precompressed) {
        if self == Plan::Never || body.len() < config.compression.min_bytes || !compressible(r.content_type) {
            return;
        }
        vary(r);
        if let Some((c, _)) = self.fixed_form(body, forms) {
            code_etags(r, c);
        }
    }

    /// The precompressed form of fixed `body` this request gets, if any.
    fn fixed_form(self, body: &'static [u8], forms: &'static Precompressed) -> Option<(Coding, &'static [u8])> {
        let c = self.pick(Coding::FIXED)?;
        Some((c, forms.get(body, c)?))
    }

    fn pick(self, order: &[Coding]) -> Option<Coding> {
        match self {
            Plan::Encode(accepted) => accepted.pick(order),
            Plan::Never | Plan::Identity => None,
        }
    }
}

/// Whether a response with this body may need the phase at all: the one check every
/// response pays (a length comparison), before any header is read.
pub fn worth_a_look(r: &Response, config: &Config) -> bool {
    config.compression.enabled && r.body.as_bytes().len() >= config.compression.min_bytes
}

/// The auth routes (`/api/auth/*`, `/api/v1/auth/*`): their answers carry tokens.
fn token_route(path: &str) -> bool {
    path.starts_with("/api/auth/") || path.starts_with("/api/v1/auth/")
}

/// Whether `r` may be compressed: a 2xx with a whole body (not 204 or 206) of at least
/// `min_bytes`, of a compressible type, with no token cookie, no coding yet and no nonce slot.
fn eligible(r: &Response, min_bytes: usize) -> bool {
    let s = r.status;
    (200..300).contains(&s)
        && s != 204
        && s != 206
        && r.body.as_bytes().len() >= min_bytes
        && r.nonce_slot.is_none()
        && compressible(r.content_type)
        && !r
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("set-cookie") || n.eq_ignore_ascii_case("content-encoding"))
}

/// Text types: JSON, HTML, CSS, JavaScript, SVG, XML (never `text/event-stream`).
pub fn compressible(content_type: &str) -> bool {
    let t = content_type.split(';').next().unwrap_or_default().trim();
    let text = t.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("text/"));
    (text && !t.eq_ignore_ascii_case("text/event-stream"))
        || ["application/json", "application/javascript", "application/xml", "image/svg+xml"]
            .iter()
            .any(|k| t.eq_ignore_ascii_case(k))
        || t.get(t.len().saturating_sub(5)..).is_some_and(|s| s.eq_ignore_ascii_case("+json"))
}

fn vary(r: &mut Response) {
    r.header("Vary", "Accept-Encoding");
}

/// `Content-Encoding`, and each `ETag` made the coding's own (`"abc"` → `"abc-br"`).
fn mark(r: &mut Response, c: Coding) {
    code_etags(r, c);
    r.header("Content-Encoding", c.token());
}

/// Each `ETag` of `r` made the coding's own.
fn code_etags(r: &mut Response, c: Coding) {
    for (name, value) in &mut r.headers {
        if name.eq_ignore_ascii_case("etag") {
            *value = coded_etag(value, c);
        }
    }
}

/// `etag` with `-<coding>` before its closing quote (weak or strong); as it is when unquoted.
fn coded_etag(etag: &str, c: Coding) -> Value {
    match etag.strip_suffix('"') {
        Some(open) if etag.len() >= 2 => Value::display(format_args!("{open}-{}\"", c.token())),
        _ => Value::from(etag.to_owned()),
    }
}

/// Whether the entity tag `tag` (from `If-None-Match`) is `etag` in one of the codings
/// ([`coded_etag`]): a client that holds the br form asks with that form's tag.
pub fn is_coded_form(tag: &[u8], etag: &[u8]) -> bool {
    let (Some(open), Some(tag_open)) = (etag.strip_suffix(b"\""), tag.strip_suffix(b"\"")) else { return false };
    Coding::ALL.iter().any(|c| {
        tag_open
            .strip_prefix(open)
            .and_then(|rest| rest.strip_prefix(b"-"))
            .is_some_and(|token| token == c.token().as_bytes())
    })
}

/// `body` compressed with `c` at `effort`; `None` when it would not get smaller (or the
/// encoder failed, which only an allocation failure makes it do).
pub fn compress(c: Coding, body: &[u8], effort: Effort) -> Option<Vec<u8>> {
    let out = match (c, effort) {
        (Coding::Gzip, effort) => {
            let level = match effort {
                Effort::Level(l) => l.clamp(1, 9),
                Effort::Best => 9,
            };
            let mut z = GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::new(level));
            z.write_all(body).ok()?;
            z.finish().ok()?
        }
        (Coding::Br, effort) => {
            let quality = match effort {
                Effort::Level(l) => (l.clamp(1, 9) - 1).min(FRESH_BROTLI_MAX),
                Effort::Best => BEST_BROTLI,
            };
            // The size known up front: small bodies get small hash tables, whose set-up
            // otherwise costs more than compressing a few kilobytes.
            let params = brotli::enc::BrotliEncoderParams {
                quality: quality as i32,
                lgwin: brotli_window(body.len()) as i32,
                size_hint: body.len(),
                ..Default::default()
            };
            let mut z = brotli::CompressorWriter::with_params(Vec::with_capacity(body.len() / 4), 4096, &params);
            z.write_all(body).ok()?;
            z.into_inner()
        }
        (Coding::Zstd, effort) => {
            let level = match effort {
                Effort::Level(l) => l.clamp(1, 9) as i32,
                Effort::Best => BEST_ZSTD,
            };
            // One frame with the content size in its header.
            zstd::bulk::compress(body, level).ok()?
        }
    };
    (out.len() < body.len()).then_some(out)
}

/// The lane per-response compression runs on in a worker ([`start_lane`]): threads below the
/// event loop's priority. A process without one (the supervisor, unit tests) compresses on
/// the calling thread.
static LANE: std::sync::OnceLock<CpuLane> = std::sync::OnceLock::new();

/// Give this process its compression lane (a worker, after fork; once).
pub fn start_lane(lane: CpuLane) {
    let _ = LANE.set(lane);
}

/// `body` and, when it got smaller, its compressed form, made on the lane when there is one;
/// `None` only when the lane's threads are gone (the body with them).
fn on_lane(c: Coding, body: Body, effort: Effort) -> Option<(Body, Option<Vec<u8>>)> {
    let Some(lane) = LANE.get() else {
        let z = compress(c, body.as_bytes(), effort);
        return Some((body, z));
    };
    lane.run(move || {
        // A panic (only an allocation failure) leaves the body as it is.
        let z = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compress(c, body.as_bytes(), effort)));
        (body, z.ok().flatten())
    })
}

/// Each job's body compressed at [`Effort::Best`] in its coding (`None`: not smaller), on
/// the calling thread and up to one more thread per other CPU, all joined before it returns
/// (the supervisor forks after). A thread the OS refuses leaves the work to the others.
fn compress_all(jobs: &[(&[u8], Coding)]) -> Vec<Option<Box<[u8]>>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(body, c)) = jobs.get(i) else { return done };
            done.push((i, compress(c, body, Effort::Best).map(Vec::into_boxed_slice)));
        }
    };
    let mut out = vec![None; jobs.len()];
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..cpus.min(jobs.len()))
            .filter_map(|_| std::thread::Builder::new().name("compress".into()).spawn_scoped(scope, work).ok())
            .collect();
        let mut done = work();
        for helper in helpers {
            // A helper that panicked (an allocation failure) leaves its forms out.
            done.extend(helper.join().unwrap_or_default());
        }
        for (i, form) in done {
            out[i] = form;
        }
    });
    out
}

/// The compressed forms of the bodies fixed for a configuration's life, each made once per
/// coding at the best level and never changed after: built before the workers fork, read by
/// them with no lock. A body is known by its address and length: it lives as long as the
/// table, so neither can be another body's.
#[derive(Default)]
pub struct Precompressed {
    entries: Vec<Kept>,
}

struct Kept {
    at: usize,
    len: usize,
    coding: Coding,
    /// SHA-256 of the body: what a later configuration's table recognises it by.
    digest: [u8; 32],
    /// `None`: the coding does not make it smaller.
    form: Option<Box<[u8]>>,
}

impl Precompressed {
    /// A table with no forms, for responses that never carry a fixed body (those assembled
    /// from upstream results).
    pub const NONE: &'static Precompressed = &Precompressed { entries: Vec::new() };

    /// Forms of each of `bodies` (with its `Content-Type`) that is compressible and at least
    /// `min_bytes` long, in every coding; none when compression is off. `reuse` holds forms
    /// made before (for an earlier configuration): a body with the same bytes takes them.
    pub fn build(config: &Config, bodies: &[(&[u8], &str)], reuse: Option<&Precompressed>) -> Precompressed {
        let mut entries = Vec::new();
        if !config.compression.enabled {
            return Precompressed { entries };
        }
        // (entry, body) of each form not lent by `reuse`: compressed below, all at once.
        let mut todo: Vec<(usize, &[u8])> = Vec::new();
        for &(body, content_type) in bodies {
            if body.len() < config.compression.min_bytes || !compressible(content_type) {
                continue;
            }
            let digest: [u8; 32] = Sha256::digest(body).into();
            for coding in Coding::ALL {
                let form = match reuse.and_then(|old| old.kept_for(&digest, body.len(), coding)) {
                    Some(old) => old.clone(),
                    None => {
                        todo.push((entries.len(), body));
                        None
                    }
                };
                entries.push(Kept { at: body.as_ptr() as usize, len: body.len(), coding, digest, form });
            }
        }
        // The largest first, so the threads finish together.
        todo.sort_by_key(|&(_, body)| std::cmp::Reverse(body.len()));
        let jobs: Vec<(&[u8], Coding)> = todo.iter().map(|&(i, body)| (body, entries[i].coding)).collect();
        for ((i, _), form) in todo.iter().zip(compress_all(&jobs)) {
            entries[*i].form = form;
        }
        Precompressed { entries }
    }

    /// `body` in coding `c`, when it was precompressed and got smaller; never compresses.
    pub fn get(&'static self, body: &[u8], c: Coding) -> Option<&'static [u8]> {
        let (at, len) = (body.as_ptr() as usize, body.len());
        self.entries.iter().find(|k| k.at == at && k.len == len && k.coding == c)?.form.as_deref()
    }

    /// The form kept here, in `c`, of a body of `len` bytes with SHA-256 `digest`.
    fn kept_for(&self, digest: &[u8; 32], len: usize, c: Coding) -> Option<&Option<Box<[u8]>>> {
        self.entries.iter().find(|k| k.coding == c && k.len == len && &k.digest == digest).map(|k| &k.form)
    }

    /// How many forms are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// `z` decoded from coding `c`.
    fn decode(c: Coding, z: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match c {
            Coding::Gzip => flate2::read::GzDecoder::new(z).read_to_end(&mut out).map(drop).expect("gzip"),
            Coding::Br => brotli::Decompressor::new(z, 4096).read_to_end(&mut out).map(drop).expect("br"),
            Coding::Zstd => out = zstd::stream::decode_all(z).expect("zstd"),
        }
        out
    }

    fn big_json() -> Vec<u8> {
        format!("[{}0]", "{\"name\":\"someone\",\"email\":\"a@example.test\"},".repeat(100)).into_bytes()
    }

    fn json(status: u16, body: Vec<u8>) -> Response {
        let mut r = Response::new(status);
        r.body = Body::Bytes(body);
        r
    }

    fn header<'a>(r: &'a Response, name: &str) -> Vec<&'a str> {
        r.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    fn plan(accept: &str) -> Plan {
        let lines = [httparse::Header { name: "Accept-Encoding", value: accept.as_bytes() }];
        Plan::new(&Config::default(), "/api/v1/users", Fields::new(&lines))
    }

    fn leaked(body: Vec<u8>) -> &'static [u8] {
        Box::leak(body.into_boxed_slice())
    }

    fn forms_of(bodies: &[&'static [u8]]) -> &'static Precompressed {
        let list: Vec<(&[u8], &str)> = bodies.iter().map(|b| (*b, "application/json")).collect();
        Box::leak(Box::new(Precompressed::build(&Config::default(), &list, None)))
    }

    fn sent(o: OnLoop) -> Response {
        match o {
            OnLoop::Send(r) => r,
            OnLoop::ToPool(r) => panic!("handed to the pool: {r:?}"),
        }
    }

    #[test]
    fn each_coding_round_trips_at_every_effort() {
        let body = big_json();
        for c in Coding::ALL {
            for effort in [Effort::Level(1), Effort::Level(6), Effort::Level(9), Effort::Best] {
                let z = compress(c, &body, effort).expect("smaller");
                assert!(z.len() * 4 < body.len(), "{c:?} {effort:?}: {} of {}", z.len(), body.len());
                assert_eq!(decode(c, &z), body, "{c:?} {effort:?}");
            }
        }
        assert_eq!(compress(Coding::Br, b"{}", Effort::Best), None, "not smaller: not sent");
    }

    #[test]
    fn brotli_per_response_stops_at_its_highest_cheap_quality() {
        let body = big_json();
        let capped = compress(Coding::Br, &body, Effort::Level(FRESH_BROTLI_MAX + 1));
        for level in FRESH_BROTLI_MAX + 2..=9 {
            assert_eq!(compress(Coding::Br, &body, Effort::Level(level)), capped, "level {level}");
        }
        assert_ne!(compress(Coding::Br, &body, Effort::Level(FRESH_BROTLI_MAX)), capped, "below the cap");
    }

    #[test]
    fn a_large_json_body_is_compressed_in_the_per_response_order_with_vary_and_a_coded_etag() {
        let config = Config::default();
        for (accept, want) in [
            ("gzip", Coding::Gzip),
            ("br", Coding::Br),
            ("gzip, br", Coding::Gzip),
            ("gzip;q=0.5, br", Coding::Br),
            ("gzip, deflate, br, zstd", Coding::Zstd),
        ] {
            let mut r = json(200, big_json());
            r.header("ETag", "\"abc\"");
            let r = plan(accept).finish(r, &config);
            assert_eq!(header(&r, "Content-Encoding"), [want.token()], "{accept}");
            assert_eq!(header(&r, "Vary"), ["Accept-Encoding"]);
            assert_eq!(header(&r, "ETag"), [format!("\"abc-{}\"", want.token())]);
            assert_eq!(decode(want, r.body.as_bytes()), big_json());
        }
    }

    #[test]
    fn identity_still_says_vary_and_small_bodies_are_untouched() {
        let config = Config::default();
        let r = plan("deflate").finish(json(200, big_json()), &config);
        assert_eq!((header(&r, "Vary"), header(&r, "Content-Encoding")), (vec!["Accept-Encoding"], vec![]));
        assert_eq!(r.body.as_bytes(), big_json());
        let small = plan("gzip").finish(json(200, b"{\"status\":\"ok\"}".to_vec()), &config);
        assert!(small.headers.is_empty() && small.body.as_bytes() == b"{\"status\":\"ok\"}");
        assert!(!worth_a_look(&small, &config), "below min_bytes: the one check");
    }

    #[test]
    fn token_responses_and_other_kinds_are_never_compressed() {
        let config = Config::default();
        let lines = [httparse::Header { name: "Accept-Encoding", value: b"gzip, br, zstd" }];
        assert_eq!(Plan::new(&config, "/api/v1/auth/login", Fields::new(&lines)), Plan::Never);
        assert_eq!(Plan::new(&config, "/api/auth/refresh", Fields::new(&lines)), Plan::Never);
        assert!(matches!(Plan::new(&config, "/api/v1/users", Fields::new(&lines)), Plan::Encode(_)));
        let mut cookie = json(200, big_json());
        cookie.header("Set-Cookie", "refresh_token=x");
        let untouched = |r: Response| {
            let r = plan("gzip, br, zstd").finish(r, &config);
            header(&r, "Content-Encoding").is_empty() && header(&r, "Vary").is_empty()
        };
        assert!(untouched(cookie));
        for status in [204, 206, 304, 404, 500] {
            assert!(untouched(json(status, big_json())), "{status}");
        }
        let mut stream = json(200, big_json());
        stream.content_type = "text/event-stream";
        assert!(untouched(stream));
        let mut image = json(200, big_json());
        image.content_type = "image/png";
        assert!(untouched(image));
        let mut page = json(200, big_json());
        page.nonce_slot = Some(b"nonce-slot-xxxxxxxxxxxxx");
        assert!(untouched(page));
        let mut off = Config::default();
        off.compression.enabled = false;
        assert_eq!(Plan::new(&off, "/api/openapi.json", Fields::new(&lines)), Plan::Never);
    }

    #[test]
    fn compressible_types() {
        for t in ["application/json", "text/html; charset=utf-8", "text/css", "application/problem+json", "TEXT/PLAIN"]
        {
            assert!(compressible(t), "{t}");
        }
        for t in ["text/event-stream", "image/png", "application/octet-stream", "image/x-icon"] {
            assert!(!compressible(t), "{t}");
        }
    }

    #[test]
    fn a_fixed_body_is_sent_in_its_precompressed_form_in_the_fixed_order() {
        let config = Config::default();
        let body = leaked(big_json());
        let forms = forms_of(&[body]);
        assert_eq!(forms.len(), 3, "one form per coding");
        for (accept, want) in
            [("gzip, deflate, br, zstd", Coding::Br), ("gzip, zstd", Coding::Zstd), ("gzip", Coding::Gzip)]
        {
            let first = sent(plan(accept).on_loop(Response::static_json(body), &config, forms));
            let second = sent(plan(accept).on_loop(Response::static_json(body), &config, forms));
            assert_eq!(header(&first, "Content-Encoding"), [want.token()], "{accept}");
            assert_eq!(header(&first, "Vary"), ["Accept-Encoding"]);
            assert_eq!(first.body.as_bytes().as_ptr(), second.body.as_bytes().as_ptr(), "the same kept bytes");
            assert_eq!(decode(want, first.body.as_bytes()), body);
        }
        let other = leaked(big_json());
        let unknown = sent(plan("br").on_loop(Response::static_json(other), &config, forms));
        assert!(header(&unknown, "Content-Encoding").is_empty(), "a fixed body not in the table: never compressed");
        assert_eq!(unknown.body.as_bytes(), other);
    }

    #[test]
    fn a_body_made_per_request_on_the_loop_goes_to_the_pool_to_be_compressed() {
        let config = Config::default();
        let forms = forms_of(&[]);
        let OnLoop::ToPool(r) = plan("gzip, br, zstd").on_loop(json(200, big_json()), &config, forms) else {
            panic!("compressed on the loop or not at all");
        };
        assert!(r.headers.is_empty() && r.body.as_bytes() == big_json(), "untouched on the loop");
        let r = plan("gzip, br, zstd").finish(r, &config);
        assert_eq!(header(&r, "Content-Encoding"), ["zstd"]);
        // Nothing to compress with: sent from the loop as it is, still varying.
        let r = sent(plan("deflate").on_loop(json(200, big_json()), &config, forms));
        assert_eq!((header(&r, "Vary"), header(&r, "Content-Encoding")), (vec!["Accept-Encoding"], vec![]));
        let r = sent(plan("br").on_loop(json(404, big_json()), &config, forms));
        assert!(r.headers.is_empty(), "not eligible: as it is");
    }

    #[test]
    fn a_rebuilt_table_reuses_the_forms_of_unchanged_bodies_only() {
        let config = Config::default();
        let (a, b) = (leaked(big_json()), leaked(big_json()));
        let old = forms_of(&[a]);
        let mut changed = big_json();
        changed[2] = b'N';
        let changed = leaked(changed);
        let list: [(&[u8], &str); 2] = [(b, "application/json"), (changed, "application/json")];
        let new: &'static Precompressed = Box::leak(Box::new(Precompressed::build(&config, &list, Some(old))));
        assert_eq!(new.get(b, Coding::Br), old.get(a, Coding::Br), "same bytes: the same form");
        assert_eq!(decode(Coding::Zstd, new.get(changed, Coding::Zstd).expect("made")), changed);
        let mut off = Config::default();
        off.compression.enabled = false;
        assert_eq!(Precompressed::build(&off, &list, None).len(), 0);
    }

    #[test]
    fn the_embedded_files_get_forms_when_large_enough() {
        let config = Config::default();
        let list: Vec<(&[u8], &str)> =
            crate::app::handlers::assets::all().iter().map(|a| (a.bytes, a.content_type)).collect();
        let forms: &'static Precompressed = Box::leak(Box::new(Precompressed::build(&config, &list, None)));
        let js = crate::app::handlers::assets::by_plain("app.js").expect("app.js");
        for c in Coding::ALL {
            assert_eq!(decode(c, forms.get(js.bytes, c).expect("kept")), js.bytes, "{c:?}");
        }
        let icon = crate::app::handlers::assets::by_plain("favicon.ico").expect("icon");
        assert!(forms.get(icon.bytes, Coding::Br).is_none(), "an image is not compressed");
    }

    #[test]
    fn brotli_windows_fit_the_body() {
        assert_eq!(brotli_window(0), 10);
        assert_eq!(brotli_window(1024), 10);
        assert_eq!(brotli_window(1025), 11);
        assert_eq!(brotli_window(3349), 12);
        assert_eq!(brotli_window(230_000), 18);
        assert_eq!(brotli_window(100 << 20), 22);
    }

    #[test]
    fn etags_per_coding() {
        assert_eq!(coded_etag("\"abc\"", Coding::Gzip), "\"abc-gzip\"");
        assert_eq!(coded_etag("W/\"abc\"", Coding::Br), "W/\"abc-br\"");
        assert_eq!(coded_etag("abc", Coding::Zstd), "abc");
        for form in ["\"abc-gzip\"", "\"abc-br\"", "\"abc-zstd\""] {
            assert!(is_coded_form(form.as_bytes(), b"\"abc\""), "{form}");
        }
        assert!(!is_coded_form(b"\"abc-br0\"", b"\"abc\""));
        assert!(!is_coded_form(b"\"abc-deflate\"", b"\"abc\""));
        assert!(!is_coded_form(b"\"abc\"", b"\"abc\""));
    }
}
