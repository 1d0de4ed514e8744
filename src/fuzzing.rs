//! Entry points for the fuzzers in `fuzz/` and for the test that replays
//! their seed corpus (`fuzz/seeds/<target>/`); not part of the service.
//!
//! Each function takes arbitrary bytes, drives one parser the way the
//! service does, and panics only when the parser panics or breaks one of
//! the cheap invariants checked here (bounds, consistency between one-shot
//! and split input, the safety promises of the redirect check). See
//! [`TARGETS`] for the list.

use crate::app::handlers::{auth, chat, download, events, redirect as redirect_check, users};
use crate::app::resources::body;
use crate::app::validate;
use crate::error::Error;
use crate::http::request::Method;
use crate::http::target::split_target;
use crate::http1::body::Chunked;
use crate::http1::parse::{self, Framing};
use crate::proto::ws::{Event, Message, WsConn};

mod records;

pub use records::records;

/// A fuzz target's entry function.
pub type Target = fn(&[u8]);

/// Every fuzz target: its name (the directory under `fuzz/seeds/` and the
/// file under `fuzz/fuzz_targets/`) and its entry function.
pub const TARGETS: &[(&str, Target)] = &[
    ("http_head", http_head),
    ("chunked", chunked),
    ("websocket", websocket),
    ("json_body", json_body),
    ("redirect", redirect),
    ("range", range),
    ("config", config),
    ("http3_frames", http3_frames),
    ("http2_frames", http2_frames),
    ("records", records),
    ("proxy_protocol", proxy_protocol),
];

/// Split lengths for feeding `len` bytes in pieces, chosen by `seed`
/// (deterministic, so a crash replays).
fn pieces(seed: u8, len: usize) -> Vec<usize> {
    let mut state = (u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ len as u64) | 1;
    let max = [1, 3, 16, 200][usize::from(seed & 3)];
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let n = (1 + (state % max) as usize).min(left);
        out.push(n);
        left -= n;
    }
    out
}

// ------------------------------------------------------------ request head

/// The request head parser ([`parse::parse`]) with a large and a small
/// head limit, and [`split_target`] on the target and on the input.
pub fn http_head(data: &[u8]) {
    for max_head in [16 * 1024, 256] {
        if let Some(len) = head_once(data, max_head) {
            // The connection parses again as bytes arrive: every prefix of
            // a complete head must read as "need more bytes".
            for cut in [len - 1, len / 2] {
                let mut headers = parse::header_slots();
                let partial = parse::parse(&data[..cut], &mut headers, max_head);
                assert!(matches!(partial, Ok(None)), "prefix of {cut} bytes of a {len}-byte head");
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    let (path, query) = split_target(&text);
    assert!(path.len() + query.len() <= text.len());
}

/// Parse once; the head's length when complete.
fn head_once(data: &[u8], max_head: usize) -> Option<usize> {
    let mut headers = parse::header_slots();
    match parse::parse(data, &mut headers, max_head) {
        Ok(None) => {
            assert!(data.len() <= max_head, "an incomplete head over the limit must be 431");
            None
        }
        Ok(Some((head, req))) => {
            assert!(head.len > 0 && head.len <= data.len() && head.len <= max_head);
            let target = req.path.unwrap_or("");
            let (path, query) = split_target(target);
            assert!(path.starts_with('/') || (target == "*" && head.method == Method::Options), "{target:?}");
            assert!(path.len() + query.len() <= target.len());
            let named = |name: &str| req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).count();
            let te = named("transfer-encoding");
            assert!(te <= 1);
            assert_eq!(te == 1, head.framing == Framing::Chunked);
            if head.framing == Framing::Chunked {
                assert_eq!(named("content-length"), 0, "both framings");
            }
            if let Framing::Length(n) = head.framing {
                assert!(n > 0 && named("content-length") > 0);
            }
            if head.http10 && head.framing == Framing::Chunked {
                assert!(!head.keep_alive);
            }
            if head.expect_continue {
                assert_ne!(head.framing, Framing::None);
            }
            if !head.http10 {
                assert_eq!(named("host"), 1);
            }
            Some(head.len)
        }
        Err(e) => {
            assert!(matches!(e.status(), 400 | 417 | 431), "{e:?}");
            None
        }
    }
}

// ------------------------------------------------------------ chunked body

/// What decoding a whole input came to.
#[derive(Debug, PartialEq, Eq)]
enum Decoded {
    /// Body so far, input consumed, complete.
    Ok(Vec<u8>, usize, bool),
    /// The error's status.
    Err(u16),
}

/// The chunked decoder fed `data[1..]` in one piece and in pieces chosen by
/// `data[0]` (whose low two bits also choose the body limit): both must
/// agree, and neither may consume more than it was given.
pub fn chunked(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else { return };
    let limit = [0, 16, 1 << 20, u64::MAX][usize::from(seed & 3)];
    let whole = decode_chunked(input, &[input.len()], limit);
    let split = decode_chunked(input, &pieces(seed >> 2, input.len()), limit);
    assert_eq!(whole, split, "one piece vs. pieces");
    let byte_by_byte = decode_chunked(input, &vec![1; input.len()], limit);
    assert_eq!(whole, byte_by_byte, "one piece vs. byte by byte");
}

fn decode_chunked(input: &[u8], pieces: &[usize], limit: u64) -> Decoded {
    let mut d = Chunked::default();
    let mut out = Vec::new();
    let (mut at, mut consumed) = (0, 0);
    for &n in pieces {
        let piece = &input[at..at + n];
        at += n;
        match d.decode(piece, &mut out, limit) {
            Ok((used, done)) => {
                assert!(used <= piece.len(), "consumed {used} of {} bytes", piece.len());
                consumed += used;
                assert!(out.len() <= consumed && out.len() as u64 <= limit);
                if done {
                    // The rest is the next request: a finished decoder takes nothing more.
                    assert_eq!(d.decode(&piece[used..], &mut out, limit).ok(), Some((0, true)));
                    return Decoded::Ok(out, consumed, true);
                }
                assert_eq!(used, piece.len(), "an unfinished body takes all it is given");
            }
            Err(e) => {
                assert!(matches!(e.status(), 400 | 413 | 431), "{e:?}");
                return Decoded::Err(e.status());
            }
        }
    }
    Decoded::Ok(out, consumed, false)
}

// ------------------------------------------------------------ WebSocket

/// The WebSocket frame reader fed `data[1..]` as client bytes, in one piece
/// and in pieces chosen by `data[0]` (whose low two bits also choose the
/// message limit), echoing every message like `/ws/echo`: both runs must
/// write and report the same, and what is written must be well-formed
/// server frames.
pub fn websocket(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else { return };
    let max = [125, 1024, 65536, 1 << 20][usize::from(seed & 3)];
    let whole = ws_run(input, &[input.len()], max);
    let split = ws_run(input, &pieces(seed >> 2, input.len()), max);
    assert_eq!(whole, split, "one piece vs. pieces");
    check_server_frames(&whole.0);
}

fn ws_run(input: &[u8], pieces: &[usize], max: usize) -> (Vec<u8>, Vec<Event>) {
    let mut ws = WsConn::new(max);
    let (mut buf, mut out, mut events) = (Vec::new(), Vec::new(), Vec::new());
    let mut closed = false;
    let mut at = 0;
    for &n in pieces {
        buf.extend_from_slice(&input[at..at + n]);
        at += n;
        while !buf.is_empty() {
            let (events_before, out_before) = (events.len(), out.len());
            let used = ws.read(&buf, &mut out, &mut events);
            assert!(used > 0 && used <= buf.len(), "read took {used} of {} bytes", buf.len());
            assert!(events.len() <= events_before + 1, "at most one event per read");
            buf.drain(..used);
            if closed {
                assert!(events.len() == events_before && out.len() == out_before, "output after the end");
                continue;
            }
            match events.last().filter(|_| events.len() > events_before) {
                Some(Event::Message(Message::Text(t))) => {
                    assert!(t.len() <= max);
                    let t = t.clone();
                    ws.send_text(&t, &mut out);
                }
                Some(Event::Message(Message::Binary(b))) => {
                    assert!(b.len() <= max);
                    let b = b.clone();
                    ws.send_binary(&b, &mut out);
                }
                Some(Event::Closed { code }) => {
                    assert!(ws.is_closing());
                    assert!(matches!(code, 1000..=1003 | 1005 | 1007..=1014 | 3000..=4999), "code {code}");
                    closed = true;
                }
                None => {}
            }
        }
    }
    (out, events)
}

/// Unmasked, final frames of known opcodes; controls within 125 bytes;
/// close frames with a sendable code; at most one close, and it is last.
fn check_server_frames(mut out: &[u8]) {
    let mut closed = false;
    while !out.is_empty() {
        assert!(!closed, "a frame after the close frame");
        assert!(out.len() >= 2);
        let (b0, b1) = (out[0], out[1]);
        assert_eq!(b0 & 0xf0, 0x80, "FIN and no reserved bits");
        assert_eq!(b1 & 0x80, 0, "server frames are unmasked");
        let (len, at) = match b1 & 0x7f {
            126 => (usize::from(u16::from_be_bytes([out[2], out[3]])), 4),
            127 => (u64::from_be_bytes(out[2..10].try_into().unwrap_or([0xff; 8])) as usize, 10),
            n => (usize::from(n), 2),
        };
        let payload = &out[at..at + len];
        match b0 & 0x0f {
            0x1 => assert!(std::str::from_utf8(payload).is_ok()),
            0x2 => {}
            0x8 => {
                assert!((2..=125).contains(&len));
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                assert!(matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999), "close code {code}");
                assert!(std::str::from_utf8(&payload[2..]).is_ok());
                closed = true;
            }
            0x9 | 0xa => assert!(len <= 125),
            op => panic!("opcode {op:#x} written"),
        }
        out = &out[at + len..];
    }
}

// ------------------------------------------------------------ JSON bodies

/// A request body through [`validate::json_body`] and then through every
/// handler's body check (users, posts, login, refresh, notifications,
/// chat): each either returns values that pass the field rules or is a 422
/// listing at least one problem; an unknown key (`__proto__`) is always one.
/// The field rules also see the input as a string.
pub fn json_body(data: &[u8]) {
    for other in [None, Some(&b"text/plain"[..]), Some(b"application/jsonx")] {
        assert_eq!(validate::json_body(other, data).err().map(|e| e.status()), Some(415));
    }
    let text = String::from_utf8_lossy(data);
    check_rules(&text);
    let map = match validate::json_body(Some(b"Application/JSON ; charset=utf-8"), data) {
        Ok(map) => map,
        Err(e) => {
            assert!(matches!(e.status(), 400 | 422), "{e:?}");
            return;
        }
    };
    let unknown = |allowed: &[&str]| map.keys().any(|k| !allowed.contains(&k.as_str()));
    let user_keys = ["name", "email", "password", "age", "role"];

    match users::sign_up(map.clone()) {
        Ok(u) => {
            assert!(!unknown(&user_keys));
            assert!(validate::name(&u.name).is_ok() && validate::email(&u.email).is_ok());
            assert!(validate::password(&u.password).is_ok());
            assert!(u.age.is_none_or(|a| (0..=150).contains(&a)));
        }
        Err(e) => rejected(e),
    }
    for full in [true, false] {
        match users::user_changes(map.clone(), full) {
            Ok(users::Edit { changes: c, password, current_password }) => {
                assert!(!unknown(&[&user_keys[..], &["currentPassword"]].concat()));
                assert!(password.as_deref().is_none_or(|p| validate::password(p).is_ok()));
                assert!(current_password.is_none() || password.is_some());
                assert!(c.password_hash.is_none(), "hashed on the pool, never from the body");
                assert!(!full || (c.name.is_some() && c.email.is_some() && c.age.is_some()));
                assert!(c.name.as_deref().is_none_or(|n| validate::name(n).is_ok()));
                assert!(c.email.as_deref().is_none_or(|m| validate::email(m).is_ok()));
                assert!(c.age.flatten().is_none_or(|a| (0..=150).contains(&a)));
            }
            Err(e) => rejected(e),
        }
    }
    let post_keys = ["title", "body"];
    let posts = crate::resources::builtin::posts();
    let text = |c: &crate::resources::value::Cell| c.as_str().map(str::to_owned);
    match body::create(&posts, map.clone()) {
        Ok(cells) => {
            assert!(!unknown(&post_keys));
            let (title, body) = (text(&cells[0]).unwrap_or_default(), text(&cells[1]).unwrap_or_default());
            assert!(validate::title(&title).is_ok() && validate::post_body(&body).is_ok());
        }
        Err(e) => rejected(e),
    }
    match body::patch(&posts, map.clone()) {
        Ok(cells) => {
            assert!(!unknown(&post_keys));
            let title = cells[0].as_ref().and_then(text);
            assert!(title.as_deref().is_none_or(|t| validate::title(t).is_ok()));
            let body = cells[1].as_ref().and_then(text);
            assert!(body.as_deref().is_none_or(|b| validate::post_body(b).is_ok()));
        }
        Err(e) => rejected(e),
    }
    match events::notification(map.clone()) {
        Ok((title, body)) => {
            assert!(!unknown(&post_keys));
            assert!(validate::title(&title).is_ok() && body.chars().count() <= 2000);
        }
        Err(e) => rejected(e),
    }
    match auth::credentials(map.clone()) {
        Ok(_) => assert!(!unknown(&["email", "password"])),
        Err(e) => rejected(e),
    }
    match auth::refresh_body(map.clone()) {
        Ok(_) => assert!(!unknown(&["refreshToken"])),
        Err(e) => rejected(e),
    }
    match chat::messages(map.clone()) {
        Ok(messages) => {
            assert!(!unknown(&["messages"]));
            assert!((1..=100).contains(&messages.len()));
            assert!(messages.iter().all(|m| ["system", "user", "assistant"].contains(&m.role)));
        }
        Err(e) => rejected(e),
    }
}

/// A refused body: 422 naming at least one field, and it renders.
fn rejected(e: Error) {
    match &e {
        Error::Validation(errors) => assert!(!errors.is_empty()),
        other => panic!("a body is valid or 422, not {other:?}"),
    }
    let _ = e.into_response(true);
}

/// The single-field rules on any string.
fn check_rules(s: &str) {
    if validate::email(s).is_ok() {
        assert!(s.len() <= 254 && s.contains('@') && !s.contains(char::is_whitespace));
    }
    let chars = s.chars().count();
    assert_eq!(validate::name(s).is_ok(), (1..=100).contains(&chars) && !s.trim().is_empty());
    assert_eq!(validate::password(s).is_ok(), (8..=128).contains(&chars));
    if let Some(decoded) = validate::decode_query(s) {
        assert!(decoded.len() <= s.len());
        let b = s.as_bytes();
        let escapes_ok = (0..b.len())
            .filter(|&i| b[i] == b'%')
            .all(|i| b.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)));
        assert!(escapes_ok, "{s:?} decoded with a malformed escape");
    }
}

// ------------------------------------------------------------ redirect

/// The allow-list the redirect target is checked against.
const ALLOWED_HOSTS: [&str; 2] = ["allowed.example", "docs.allowed.example"];

/// The input as the query string of `GET /redirect`
/// ([`crate::app::handlers::redirect::target`]) and as an already decoded value
/// (`safe_path`, `allowed_url`): whatever is accepted is a same-origin path
/// (one `/`, not `//` or `/\`, not even after one more decoding) or an
/// http(s) URL on an allowed host.
pub fn redirect(data: &[u8]) {
    let hosts: Vec<String> = ALLOWED_HOSTS.iter().map(|h| h.to_string()).collect();
    let text = String::from_utf8_lossy(data);
    match redirect_check::target(&text, &hosts) {
        Ok(location) => assert!(safe_location(&location), "{location:?}"),
        Err(e) => assert_eq!(e.status(), 400),
    }
    if redirect_check::safe_path(&text) {
        assert!(text.starts_with('/') && safe_location(&text), "{text:?}");
    }
    if redirect_check::allowed_url(&text, &hosts) {
        assert!(!text.starts_with('/') && safe_location(&text), "{text:?}");
    }
}

/// An independent statement of what a `Location` may be.
fn safe_location(loc: &str) -> bool {
    if loc.is_empty() || loc.len() > redirect_check::MAX_TARGET || !loc.bytes().all(|b| b.is_ascii_graphic()) {
        return false;
    }
    if loc.contains('\\') {
        return false;
    }
    if loc.starts_with('/') {
        let once = percent_decode_lossy(loc.as_bytes());
        let bad_start = |b: &[u8]| b.starts_with(b"//") || b.starts_with(b"/\\");
        return !bad_start(loc.as_bytes())
            && !bad_start(&once)
            && !once.contains(&b'\\')
            && once.iter().all(|&b| b >= 0x80 || b.is_ascii_graphic());
    }
    let lower = loc.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("https://").or_else(|| lower.strip_prefix("http://")) else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return false;
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        Some(_) => return false,
        None => authority,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    ALLOWED_HOSTS.contains(&host)
}

/// Percent-decode once; a malformed escape stays as it is.
fn percent_decode_lossy(b: &[u8]) -> Vec<u8> {
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

// ------------------------------------------------------------ Range

/// File sizes every `Range` value is tried against.
const SIZES: [u64; 9] = [0, 1, 2, 100, 1000, 1 << 31, 1 << 63, u64::MAX - 1, u64::MAX];

/// The input as a `Range` header value ([`crate::app::handlers::download::parse_range`])
/// for files of several sizes: a satisfiable range lies within the file.
pub fn range(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for size in SIZES {
        if let Some(Ok((start, end))) = download::parse_range(&text, size) {
            assert!(start <= end && end < size, "{text:?} on {size} bytes gave {start}-{end}");
            // The length sent: no overflow.
            assert!(end - start < size);
        }
    }
}

// ------------------------------------------------------------ PROXY protocol

/// The PROXY protocol header parser ([`crate::proto::proxy_protocol::parse`]): a whole
/// header is within the input and [`MAX_HEADER`](crate::proto::proxy_protocol::MAX_HEADER),
/// every prefix of it reads as incomplete, and the answer does not depend on what follows.
pub fn proxy_protocol(data: &[u8]) {
    use crate::proto::proxy_protocol::{parse, Parse, MAX_HEADER};
    match parse(data) {
        Parse::Done(h) => {
            assert!(h.len <= data.len() && h.len <= MAX_HEADER, "{h:?} from {} bytes", data.len());
            assert_eq!(parse(&data[..h.len]), Parse::Done(h), "the header alone");
            for cut in [0, h.len / 2, h.len - 1] {
                assert_eq!(parse(&data[..cut]), Parse::Incomplete, "a {}-byte prefix of {h:?}", cut);
            }
        }
        Parse::Incomplete => assert!(data.len() < MAX_HEADER, "{} bytes and still incomplete", data.len()),
        Parse::Invalid(e) => {
            let mut more = data.to_vec();
            more.extend_from_slice(b"\r\n\0more");
            assert_eq!(parse(&more), Parse::Invalid(e), "more input does not mend it");
        }
    }
}

// ------------------------------------------------------------ config

/// The input as a config file ([`crate::config::from_toml`]); after a NUL
/// byte, `NAME=value` lines are `FORKD_NAME` environment overrides. A valid
/// config holds values in their ranges and `print-config` writes it as TOML
/// that reads back to the same configuration (the signing secret aside, which
/// is never printed); an invalid one has problems of one non-empty line each.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (toml, env) = text.split_once('\0').unwrap_or((&text, ""));
    let env: Vec<(String, String)> =
        env.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (format!("FORKD_{k}"), v.to_string())).collect();
    match crate::config::from_toml("fuzz.toml", toml, &env) {
        Ok(c) => {
            assert!(c.workers >= 1 && c.db.pool_size >= 1 && c.io.threads >= 1);
            assert!(c.limits.max_header_bytes >= 1024 && c.limits.json_body_bytes >= 1);
            assert!(c.websocket.max_message_bytes >= 125);
            assert!(c.public_origin.bytes().all(|b| !b.is_ascii_uppercase()));
            assert!(c
                .redirect
                .allowed_hosts
                .iter()
                .all(|h| !h.is_empty() && h.bytes().all(|b| !b.is_ascii_uppercase())));
            assert!(c.cors.origins.iter().all(|o| o.bytes().all(|b| !b.is_ascii_uppercase())));
            let path = std::path::Path::new("fuzz.toml");
            let printed = crate::config::print_toml(path, toml, &env).expect("a valid config prints");
            let inline = matches!(c.auth.secret, crate::config::JwtSecret::Inline(_));
            match crate::config::from_toml("printed.toml", &printed, &[]) {
                Ok(mut back) => {
                    if inline {
                        assert_eq!(back.auth.secret, crate::config::JwtSecret::Generate, "the secret was printed");
                        back.auth.secret = c.auth.secret.clone();
                    }
                    assert_eq!(back, c, "print-config did not read back:\n{printed}");
                }
                // Without its secret (never printed) a production config is refused.
                Err(e) => assert!(inline && !c.is_development(), "print-config did not read back: {e}\n{printed}"),
            }
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            for p in &e.problems {
                assert!(!p.is_empty() && !p.contains(['\n', '\r']), "{p:?}");
            }
        }
    }
}

// ------------------------------------------------------------ HTTP/3 frames and QPACK

/// A request stream's bytes (after a first byte choosing the split and the field-section
/// limit) to [`http3::frame::FrameReader`], whole and in pieces, and every HEADERS payload to
/// [`http3::qpack::decode`] and [`http3::head::RequestHead::from_fields`].
///
/// Invariants: both feedings see the same frames; a decoded section is within the limit and
/// decodes again at exactly its size; a valid request head re-encoded by our encoder decodes to
/// the same fields.
pub fn http3_frames(data: &[u8]) {
    use crate::http3::qpack::{self, DecodeError, Encoder, Fields};
    let Some((&seed, input)) = data.split_first() else { return };
    let limit = [64, 1024, 16 * 1024][usize::from(seed % 3)];
    let whole = h3_frames(input, &[input.len()], limit);
    let split = h3_frames(input, &pieces(seed, input.len()), limit);
    assert_eq!(whole, split, "whole and split input disagree");
    for block in whole.iter().filter_map(|(kind, bytes)| (*kind == "headers").then_some(bytes)) {
        let mut fields = Fields::default();
        match qpack::decode(block, limit, &mut fields) {
            Ok(()) => {
                assert!(fields.size() <= limit);
                let mut again = Fields::default();
                assert_eq!(qpack::decode(block, fields.size(), &mut again), Ok(()));
                if fields.size() > 0 {
                    assert_eq!(qpack::decode(block, fields.size() - 1, &mut again), Err(DecodeError::TooLarge));
                }
                if let Ok(head) = crate::http3::head::RequestHead::from_fields(fields.clone(), false) {
                    let _ = (head.method(), head.path(), head.authority(), head.fields().count());
                    let mut out = Vec::new();
                    Encoder.begin(&mut out);
                    for (name, value) in fields.iter() {
                        Encoder.field(name, value, &mut out);
                    }
                    let mut round = Fields::default();
                    assert_eq!(qpack::decode(&out, usize::MAX, &mut round), Ok(()));
                    assert_eq!(round, fields, "a valid head survives our encoder");
                }
            }
            Err(DecodeError::TooLarge | DecodeError::Failed(_)) => {}
        }
    }
}

/// An HTTP/2 frame stream (after a first byte choosing the split and the header list limit)
/// to [`http2::wire::parse`], whole and in pieces, and every header block (HEADERS and its
/// CONTINUATIONs joined) to one connection's [`http2::hpack::Decoder`].
///
/// Invariants: both feedings see the same frames; a decoded list stays within the limit;
/// only the list limit is a stream error (decoding goes on after it); the fields of a block
/// re-encoded by our [`http2::hpack::Encoder`] decode to the same fields.
pub fn http2_frames(data: &[u8]) {
    use crate::http2::hpack::{Decoder, Encoder, HpackError};
    use crate::http2::wire::Frame;
    let Some((&seed, input)) = data.split_first() else { return };
    let limit = [64, 1024, 16 * 1024][usize::from(seed % 3)];
    let whole = h2_frames(input, &[input.len()]);
    let split = h2_frames(input, &pieces(seed, input.len()));
    assert_eq!(whole.len(), split.len(), "whole and split input disagree");
    let mut decoder = Decoder::new(4096);
    let mut encoder = Encoder::new(4096);
    let mut mirror = Decoder::new(4096);
    let mut block = Vec::new();
    for (i, frame) in whole.iter().enumerate() {
        assert_eq!(format!("{frame:?}"), format!("{:?}", split[i]), "whole and split input disagree");
        let end = match frame {
            Ok(Frame::Headers { block: part, end_headers, .. }) => {
                block.clear();
                block.extend_from_slice(part);
                *end_headers
            }
            Ok(Frame::Continuation { block: part, end_headers, .. }) => {
                block.extend_from_slice(part);
                *end_headers
            }
            _ => false,
        };
        if !end {
            continue;
        }
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        match decoder.decode(&block, limit, |n, v| fields.push((n.to_vec(), v.to_vec()))) {
            Ok(()) => {
                let size: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
                assert!(size <= limit, "a decoded list within its limit");
                let mut out = Vec::new();
                encoder.encode(&mut out, None, fields.iter().map(|(n, v)| (&n[..], &v[..])));
                let mut round = Vec::new();
                let got = mirror.decode(&out, usize::MAX, |n, v| round.push((n.to_vec(), v.to_vec())));
                assert_eq!(got, Ok(()));
                assert_eq!(round, fields, "fields survive our encoder");
            }
            Err(HpackError::ListTooLarge) => {}
            Err(_) => return,
        }
    }
}

/// The frames of `input` fed in `pieces`, ending at the first error.
fn h2_frames<'a>(
    input: &'a [u8],
    pieces: &[usize],
) -> Vec<Result<crate::http2::wire::Frame<'a>, crate::http2::wire::FrameError>> {
    use crate::http2::wire::{parse, MIN_MAX_FRAME};
    let mut out = Vec::new();
    let (mut start, mut avail) = (0, 0);
    for &n in pieces {
        avail += n;
        loop {
            match parse(&input[start..avail], MIN_MAX_FRAME) {
                Ok(Some((frame, used))) => {
                    assert!(used <= avail - start, "takes what it was given");
                    out.push(Ok(frame));
                    start += used;
                }
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }
    out
}

/// Frames of `input` fed in `pieces`: `(kind, payload)` each (DATA pieces joined per frame),
/// then `("error", code)` if the reader failed.
fn h3_frames(input: &[u8], pieces: &[usize], limit: usize) -> Vec<(&'static str, Vec<u8>)> {
    use crate::http3::frame::{Frame, FrameReader};
    let mut reader = FrameReader::new(2 * limit);
    let (mut buf, mut fed) = (Vec::new(), 0);
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let mut pieces = pieces.iter();
    loop {
        let (drop, frame) = match reader.next(&buf) {
            Ok(step) => step,
            Err(e) => {
                out.push(("error", e.code().value().to_be_bytes().to_vec()));
                return out;
            }
        };
        assert!(drop <= buf.len(), "drops what it was given");
        buf.drain(..drop);
        match frame {
            None => match pieces.next() {
                Some(&n) => {
                    buf.extend_from_slice(&input[fed..fed + n]);
                    fed += n;
                }
                None => return out,
            },
            Some(Frame::Data { len, start }) => {
                let bytes: Vec<u8> = buf.drain(..len).collect();
                match out.last_mut() {
                    Some(("data", joined)) if !start => joined.extend(bytes),
                    _ => out.push(("data", bytes)),
                }
            }
            Some(Frame::Headers { len }) => {
                assert!(len <= 2 * limit, "a HEADERS payload within its bound");
                out.push(("headers", buf.drain(..len).collect()));
            }
            Some(other) => out.push(("control", format!("{other:?}").into_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Every file under `fuzz/seeds/<target>/` through its target: none may
    /// panic, every target has seeds, and every seed directory is a target.
    #[test]
    fn fuzz_seed_corpus_replays_without_panics() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        let mut failures = Vec::new();
        for (name, run) in TARGETS {
            let dir = root.join(name);
            let mut files: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("seed directory {}: {e}", dir.display()))
                .map(|entry| entry.expect("directory entry").path())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            assert!(!files.is_empty(), "no seeds in {}", dir.display());
            for file in files {
                let data = std::fs::read(&file).expect("read seed");
                if std::panic::catch_unwind(|| run(&data)).is_err() {
                    failures.push(file.display().to_string());
                }
            }
        }
        for entry in std::fs::read_dir(&root).expect("fuzz/seeds") {
            let name = entry.expect("directory entry").file_name();
            let name = name.to_string_lossy();
            assert!(TARGETS.iter().any(|(t, _)| *t == name), "fuzz/seeds/{name} is not a target");
        }
        let programs = root.with_file_name("fuzz_targets");
        for entry in std::fs::read_dir(&programs).expect("fuzz/fuzz_targets") {
            let path = entry.expect("directory entry").path();
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            assert!(TARGETS.iter().any(|(t, _)| *t == name), "{} is not in TARGETS", path.display());
        }
        assert!(failures.is_empty(), "seeds that panicked:\n{}", failures.join("\n"));
    }

    #[test]
    fn pieces_cover_the_input() {
        for seed in 0..=255 {
            for len in [0, 1, 7, 300] {
                let p = pieces(seed, len);
                assert_eq!(p.iter().sum::<usize>(), len);
                assert!(p.iter().all(|&n| n > 0));
            }
        }
    }
}
