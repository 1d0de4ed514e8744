//! The headers every response carries (CONTRACT §4), rendered cheaply.
//!
//! The security set, CSP included, is rendered once at start into two byte
//! blocks: an HTML document's, whose CSP has two 24-byte holes for a nonce
//! fresh per response (written with one copy and two patches), and every other
//! response's, whose CSP is one fixed strict policy ([`API_CSP`]: nothing but
//! a document runs a script, so a nonce protects nothing there), written with
//! one copy and the same bytes every time. The `Date` value is re-rendered at
//! most once per second; the CSP nonce and
//! generated request ids come from a per-worker ChaCha generator seeded from
//! the OS after fork (so no two workers share a stream). Nothing here
//! allocates per response.

use rand::{RngCore, SeedableRng};

const CSP_1: &str = "default-src 'none'; script-src 'nonce-";
const CSP_2: &str = "' 'strict-dynamic'; style-src 'self' 'nonce-";
const CSP_3: &str = "'; img-src 'self'; font-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'; report-uri /csp-report";

/// The policy of every response that is not an HTML document (JSON, event streams, files):
/// fixed bytes, so HTTP/2's and HTTP/3's header compression can index them.
pub const API_CSP: &str =
    "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; report-uri /csp-report";

const SECURITY: &str = "Server: forkd\r\n\
Strict-Transport-Security: max-age=31536000; includeSubDomains; preload\r\n\
X-Content-Type-Options: nosniff\r\n\
X-Frame-Options: DENY\r\n\
X-XSS-Protection: 0\r\n\
Referrer-Policy: strict-origin-when-cross-origin\r\n\
Permissions-Policy: camera=(), microphone=(), geolocation=()\r\n\
Cross-Origin-Opener-Policy: same-origin\r\n\
Cross-Origin-Embedder-Policy: require-corp\r\n\
Cross-Origin-Resource-Policy: same-origin\r\n";

/// The fixed security fields of [`SECURITY`], one `(name, value)` each, in
/// the same order: the form a framing that does not write HTTP/1.1 lines
/// (HTTP/2) sends. Names in lower case.
pub const SECURITY_FIELDS: [(&str, &str); 10] = [
    ("server", "forkd"),
    ("strict-transport-security", "max-age=31536000; includeSubDomains; preload"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("x-xss-protection", "0"),
    ("referrer-policy", "strict-origin-when-cross-origin"),
    ("permissions-policy", "camera=(), microphone=(), geolocation=()"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-embedder-policy", "require-corp"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// Per-worker state for the common headers.
pub struct Common {
    csp_name: &'static [u8],
    /// The CSP field (name, value with nonce holes, CRLF) and [`SECURITY`], as written.
    block: Box<[u8]>,
    /// The CSP field with [`API_CSP`] and [`SECURITY`], as written.
    api_block: Box<[u8]>,
    /// Where the nonce goes in `block` (twice).
    holes: [usize; 2],
    date_secs: u64,
    date: [u8; 29],
    rng: rand::rngs::StdRng,
    nonce: [u8; 24],
    /// The head prefix of the last response of its shape, for a codec to copy whole.
    pub template: Template,
}

/// The opening of a response head (status line to the last field that does
/// not change per response) as a codec rendered it last, and the shape it
/// stands for: a codec writes the next head of the same shape with one copy.
/// The key is the codec's own (it must cover everything the bytes depend on,
/// the `Date` second included); this only keeps it.
#[derive(Default)]
pub struct Template {
    key: Option<TemplateKey>,
    bytes: Vec<u8>,
}

/// What a [`Template`]'s bytes depend on, as the codec that wrote them counts it.
pub type TemplateKey = [usize; 8];

impl Template {
    /// The bytes rendered for `key`, if they are the last ones kept.
    pub fn get(&self, key: &TemplateKey) -> Option<&[u8]> {
        (self.key.as_ref() == Some(key)).then_some(self.bytes.as_slice())
    }

    /// Keep `bytes` as the rendering of `key` (replacing what was kept).
    pub fn put(&mut self, key: TemplateKey, bytes: &[u8]) {
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.key = Some(key);
    }
}

impl Common {
    /// Build the block; `report_only` selects `Content-Security-Policy-Report-Only`.
    pub fn new(report_only: bool) -> Common {
        let csp_name: &'static [u8] =
            if report_only { b"Content-Security-Policy-Report-Only: " } else { b"Content-Security-Policy: " };
        let mut block =
            Vec::with_capacity(csp_name.len() + CSP_1.len() + CSP_2.len() + CSP_3.len() + 48 + 2 + SECURITY.len());
        let mut holes = [0; 2];
        block.extend_from_slice(csp_name);
        for (i, part) in [CSP_1, CSP_2].into_iter().enumerate() {
            block.extend_from_slice(part.as_bytes());
            holes[i] = block.len();
            block.extend_from_slice(&[b'='; 24]);
        }
        block.extend_from_slice(CSP_3.as_bytes());
        block.extend_from_slice(b"\r\n");
        block.extend_from_slice(SECURITY.as_bytes());
        let api_block = [csp_name, API_CSP.as_bytes(), b"\r\n", SECURITY.as_bytes()].concat();
        let mut c = Common {
            csp_name,
            block: block.into_boxed_slice(),
            api_block: api_block.into_boxed_slice(),
            holes,
            date_secs: 0,
            date: [b' '; 29],
            rng: rand::rngs::StdRng::from_entropy(),
            nonce: [0; 24],
            template: Template::default(),
        };
        c.tick(std::time::SystemTime::now());
        c
    }

    /// Re-render `Date` if the second changed. Called once per loop turn.
    pub fn tick(&mut self, now: std::time::SystemTime) {
        let secs = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        if secs != self.date_secs {
            self.date_secs = secs;
            let s = httpdate::fmt_http_date(now);
            let n = s.len().min(29);
            self.date[..n].copy_from_slice(&s.as_bytes()[..n]);
        }
    }

    /// Rough size of the fixed headers, for reserving output space.
    pub fn block_len(&self) -> usize {
        self.block.len() + 120
    }

    /// Write `Date: …\r\n`.
    pub fn write_date(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"Date: ");
        out.extend_from_slice(&self.date);
        out.extend_from_slice(b"\r\n");
    }

    /// The current `Date` value (29 bytes) and the second it stands for.
    pub fn date(&self) -> (u64, &[u8; 29]) {
        (self.date_secs, &self.date)
    }

    /// Write the CSP and the static security headers: for an HTML `document` the policy
    /// with a fresh nonce, else [`API_CSP`].
    pub fn write_security(&mut self, out: &mut Vec<u8>, document: bool) {
        if !document {
            out.extend_from_slice(&self.api_block);
            return;
        }
        self.fresh_nonce();
        let start = out.len();
        out.extend_from_slice(&self.block);
        let written = &mut out[start..];
        for at in self.holes {
            if let Some(hole) = written.get_mut(at..at + 24) {
                hole.copy_from_slice(&self.nonce);
            }
        }
    }

    /// The CSP field's name in lower case (`content-security-policy`, or
    /// its `-report-only` form).
    pub fn csp_field_name(&self) -> &'static str {
        let name = self.csp_name.strip_suffix(b": ").unwrap_or(self.csp_name);
        if name.len() > "Content-Security-Policy".len() {
            "content-security-policy-report-only"
        } else {
            "content-security-policy"
        }
    }

    /// A fresh nonce, and the CSP value carrying it, in pieces to be
    /// written one after the other (as [`Common::write_security`] does).
    /// [`Common::fill_nonce`] and [`Common::nonce`] then use this nonce.
    pub fn fresh_csp(&mut self) -> [&[u8]; 5] {
        self.fresh_nonce();
        [CSP_1.as_bytes(), &self.nonce, CSP_2.as_bytes(), &self.nonce, CSP_3.as_bytes()]
    }

    /// Replace every `slot` in `body` with the nonce of the response being
    /// written (after [`Common::write_security`]). Same length, so the
    /// `Content-Length` already written stays right.
    pub fn fill_nonce(&self, body: &mut [u8], slot: &[u8; 24]) {
        let mut i = 0;
        while i + slot.len() <= body.len() {
            if body[i..i + slot.len()] == slot[..] {
                body[i..i + slot.len()].copy_from_slice(&self.nonce);
                i += slot.len();
            } else {
                i += 1;
            }
        }
    }

    /// The nonce of the response being written (for pages with inline scripts).
    pub fn nonce(&self) -> &str {
        std::str::from_utf8(&self.nonce).unwrap_or("")
    }

    fn fresh_nonce(&mut self) {
        let raw = self.random16();
        self.nonce = nonce_base64(&raw);
    }

    /// 16 random bytes: the bytes `fill_bytes` would give, drawn as two
    /// words (the generator's cheapest path).
    fn random16(&mut self) -> [u8; 16] {
        let (a, b) = (self.rng.next_u64(), self.rng.next_u64());
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&a.to_le_bytes());
        raw[8..].copy_from_slice(&b.to_le_bytes());
        raw
    }

    /// A fresh UUID v4, lower-case hyphenated, into `out`.
    pub fn uuid(&mut self, out: &mut [u8; 36]) {
        let mut b = self.random16();
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        // Where each byte's two hex digits go; the hyphens sit at 8, 13, 18, 23.
        const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
        for at in [8, 13, 18, 23] {
            out[at] = b'-';
        }
        for (byte, at) in b.iter().zip(AT) {
            out[at..at + 2].copy_from_slice(&HEX2[usize::from(*byte)]);
        }
    }
}

/// Each byte as two lower-case hex digits.
static HEX2: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// 16 bytes in standard padded base64 (24 characters, the last two `=`):
/// what `base64`'s `STANDARD` engine writes, without its general loop.
fn nonce_base64(raw: &[u8; 16]) -> [u8; 24] {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = [b'='; 24];
    for (group, o) in raw.chunks_exact(3).zip(out.chunks_exact_mut(4)) {
        let n = u32::from(group[0]) << 16 | u32::from(group[1]) << 8 | u32::from(group[2]);
        o[0] = B64[(n >> 18) as usize & 63];
        o[1] = B64[(n >> 12) as usize & 63];
        o[2] = B64[(n >> 6) as usize & 63];
        o[3] = B64[n as usize & 63];
    }
    out[20] = B64[usize::from(raw[15] >> 2)];
    out[21] = B64[usize::from(raw[15] & 3) << 4];
    out
}

/// Whether a client-supplied `x-request-id` may be echoed: 1–128 of `[A-Za-z0-9._-]`.
pub fn valid_request_id(v: &[u8]) -> bool {
    (1..=128).contains(&v.len()) && v.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    #[test]
    fn nonce_is_fresh_and_in_both_places() {
        let mut c = Common::new(false);
        let mut a = Vec::new();
        c.write_security(&mut a, true);
        let first = c.nonce().to_string();
        let mut b = Vec::new();
        c.write_security(&mut b, true);
        assert_ne!(first, c.nonce());
        let text = String::from_utf8(a).expect("utf8");
        assert_eq!(text.matches(&format!("'nonce-{first}'")).count(), 2, "{text}");
        assert!(text.starts_with("Content-Security-Policy: default-src 'none';"));
    }

    #[test]
    fn the_security_block_is_the_csp_with_its_nonce_then_the_fixed_fields() {
        for report_only in [false, true] {
            let mut c = Common::new(report_only);
            for _ in 0..3 {
                let mut got = Vec::new();
                c.write_security(&mut got, true);
                let n = c.nonce().to_string();
                let name = if report_only { "Content-Security-Policy-Report-Only" } else { "Content-Security-Policy" };
                let want = format!("{name}: {CSP_1}{n}{CSP_2}{n}{CSP_3}\r\n{SECURITY}");
                assert_eq!(String::from_utf8(got).expect("ascii"), want);
            }
        }
    }

    #[test]
    fn every_other_response_gets_the_fixed_policy_and_no_nonce() {
        for report_only in [false, true] {
            let mut c = Common::new(report_only);
            let before = c.nonce().to_string();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            c.write_security(&mut a, false);
            c.write_security(&mut b, false);
            let name = if report_only { "Content-Security-Policy-Report-Only" } else { "Content-Security-Policy" };
            assert_eq!(String::from_utf8(a.clone()).expect("ascii"), format!("{name}: {API_CSP}\r\n{SECURITY}"));
            assert_eq!(a, b, "the same bytes every time");
            assert_eq!(c.nonce(), before, "no nonce drawn");
        }
    }

    #[test]
    fn report_only_name() {
        let mut c = Common::new(true);
        let mut a = Vec::new();
        c.write_security(&mut a, true);
        assert!(a.starts_with(b"Content-Security-Policy-Report-Only: "));
        assert_eq!(c.csp_field_name(), "content-security-policy-report-only");
        assert_eq!(Common::new(false).csp_field_name(), "content-security-policy");
    }

    #[test]
    fn the_field_list_is_the_security_block() {
        // Names compare case-insensitively, values exactly.
        for (line, (name, value)) in SECURITY.split("\r\n").zip(SECURITY_FIELDS) {
            let (n, v) = line.split_once(": ").expect("a field line");
            assert!(n.eq_ignore_ascii_case(name), "{n} vs {name}");
            assert_eq!(v, value);
        }
        assert_eq!(SECURITY.split("\r\n").filter(|l| !l.is_empty()).count(), SECURITY_FIELDS.len());
    }

    #[test]
    fn uuid_shape() {
        let mut c = Common::new(false);
        let mut u = [0u8; 36];
        c.uuid(&mut u);
        let s = std::str::from_utf8(&u).expect("ascii");
        let parts: Vec<_> = s.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&s[14..15], "4");
    }

    #[test]
    fn nonce_encoding_is_standard_base64() {
        let mut c = Common::new(false);
        for _ in 0..200 {
            let mut raw = [0u8; 16];
            c.rng.fill_bytes(&mut raw);
            let want = base64::engine::general_purpose::STANDARD.encode(raw);
            assert_eq!(&nonce_base64(&raw)[..], want.as_bytes());
        }
        assert_eq!(&nonce_base64(&[0xff; 16]), b"/////////////////////w==");
    }

    #[test]
    fn uuid_is_the_random_bytes_in_hex() {
        // The same generator state gives the same 16 bytes: render them the plain way and compare.
        let mut c = Common::new(false);
        let mut twin = rand::rngs::StdRng::from_rng(&mut c.rng).expect("seed");
        c.rng = twin.clone();
        for _ in 0..100 {
            let mut u = [0u8; 36];
            c.uuid(&mut u);
            let mut b = [0u8; 16];
            twin.fill_bytes(&mut b);
            b[6] = (b[6] & 0x0f) | 0x40;
            b[8] = (b[8] & 0x3f) | 0x80;
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let want = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
            assert_eq!(std::str::from_utf8(&u).expect("ascii"), want);
        }
    }

    #[test]
    fn request_id_rules() {
        assert!(valid_request_id(b"abc-1.2_3"));
        assert!(!valid_request_id(b""));
        assert!(!valid_request_id(b"a b"));
        assert!(!valid_request_id(&[b'a'; 129]));
        assert!(valid_request_id(&[b'a'; 128]));
    }
}
