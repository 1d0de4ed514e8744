//! Content-coding negotiation (RFC 9110 §12.5.3): which [`Coding`] a response may be sent in,
//! from the request's `Accept-Encoding` values.
//!
//! Pure and socket-free: it reads header bytes and returns a choice. It does not compress
//! (that is `crate::app::phases::compress`), does not decide which responses may be
//! compressed, and never allocates.
//!
//! The rules, as nginx and Caddy apply them:
//! - no `Accept-Encoding` field: identity;
//! - each coding the build has gets the `q` of its own entry, else the `q` of `*`, else 0
//!   (not acceptable); the highest `q` above 0 wins;
//! - a tie goes to the server's order, which depends on how the body is compressed: a body
//!   compressed once at the best level prefers the smallest result ([`Coding::FIXED`]: br,
//!   zstd, gzip); a body compressed per response prefers the cheapest good ratio
//!   ([`Coding::FRESH`]: zstd, gzip, br: the `brotli` crate costs tens of times zstd's CPU
//!   on a body of a few kilobytes, see `docs/performance.md`);
//! - an entry with a malformed `q` is ignored, and so is a coding the build does not have
//!   (`deflate`, `compress`);
//! - when nothing is acceptable, identity is sent even if `identity;q=0` refuses it (nginx's
//!   behaviour, RFC 9110's "SHOULD" rather than a 406: a readable body beats an error).

use super::fields::Fields;

/// A content coding this build can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coding {
    /// `zstd` (RFC 8878), by the `zstd` crate (the reference C library).
    Zstd,
    /// `br` (RFC 7932), by the `brotli` crate (pure Rust).
    Br,
    /// `gzip` (RFC 1952), by `flate2`.
    Gzip,
}

impl Coding {
    /// Every coding the build has.
    pub const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

    /// The server's order for a body compressed once at the best level: the smallest first.
    pub const FIXED: &'static [Coding] = &[Coding::Br, Coding::Zstd, Coding::Gzip];

    /// The server's order for a body compressed per response: the cheapest good ratio first.
    pub const FRESH: &'static [Coding] = &[Coding::Zstd, Coding::Gzip, Coding::Br];

    /// The token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// Whether `token` names this coding (case-insensitive; `x-gzip` is gzip, RFC 9110 §8.4.1.3).
    fn named(self, token: &[u8]) -> bool {
        token.eq_ignore_ascii_case(self.token().as_bytes())
            || (self == Coding::Gzip && token.eq_ignore_ascii_case(b"x-gzip"))
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a request accepts: each coding's quality in thousandths (0: not acceptable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Accepted {
    q: [u16; Coding::ALL.len()],
}

impl Accepted {
    /// The coding to send, among `order` (the server's preference, most preferred first):
    /// the highest `q` above 0, a tie going to the earlier in `order`; `None`: identity.
    pub fn pick(self, order: &[Coding]) -> Option<Coding> {
        let mut best: Option<(Coding, u16)> = None;
        for &coding in order {
            let q = self.q[coding.index()];
            if q > 0 && best.is_none_or(|(_, b)| q > b) {
                best = Some((coding, q));
            }
        }
        best.map(|(c, _)| c)
    }

    /// Whether any coding is acceptable.
    pub fn any(self) -> bool {
        self.q.iter().any(|&q| q > 0)
    }
}

/// What a request with `fields` accepts (every `Accept-Encoding` line counts, in order).
pub fn negotiate(fields: Fields<'_>) -> Accepted {
    let mut accepted = Accepted::default();
    for coding in Coding::ALL {
        accepted.q[coding.index()] = quality(fields.get_all("accept-encoding"), coding);
    }
    accepted
}

/// `coding`'s quality in thousandths: its own entry's, else `*`'s, else 0.
fn quality<'a>(values: impl IntoIterator<Item = &'a [u8]>, coding: Coding) -> u16 {
    let mut star = None;
    for value in values {
        for entry in value.split(|&b| b == b',') {
            let mut parts = entry.split(|&b| b == b';');
            let token = parts.next().unwrap_or_default().trim_ascii();
            if token.is_empty() {
                continue;
            }
            let Some(q) = entry_q(parts) else { continue };
            if coding.named(token) {
                return q;
            }
            if token == b"*" {
                star = Some(q);
            }
        }
    }
    star.unwrap_or(0)
}

/// The `q` of an entry's parameters in thousandths (1000 when absent); `None` when malformed.
fn entry_q<'a>(params: impl Iterator<Item = &'a [u8]>) -> Option<u16> {
    let mut q = 1000;
    for p in params {
        let (name, value) = split_once(p.trim_ascii(), b'=')?;
        if name.trim_ascii().eq_ignore_ascii_case(b"q") {
            q = parse_q(value.trim_ascii())?;
        }
    }
    Some(q)
}

fn split_once(s: &[u8], at: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == at)?;
    Some((&s[..i], &s[i + 1..]))
}

/// A qvalue (RFC 9110 §12.4.2: `0[.ddd]` or `1[.000]`) in thousandths.
fn parse_q(v: &[u8]) -> Option<u16> {
    let (whole, frac) = match split_once(v, b'.') {
        Some((w, f)) => (w, f),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match whole {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Coding::{Br, Gzip, Zstd};

    fn lines<'a>(values: &[&'a str]) -> Vec<httparse::Header<'a>> {
        values.iter().map(|v| httparse::Header { name: "Accept-Encoding", value: v.as_bytes() }).collect()
    }

    fn accepted(header: &str) -> Accepted {
        negotiate(Fields::new(&lines(&[header])))
    }

    /// The choice for a body compressed per response.
    fn pick(header: &str) -> Option<Coding> {
        accepted(header).pick(Coding::FRESH)
    }

    /// The choice for a body compressed once at the best level.
    fn pick_fixed(header: &str) -> Option<Coding> {
        accepted(header).pick(Coding::FIXED)
    }

    #[test]
    fn no_field_or_an_empty_one_is_identity() {
        assert_eq!(negotiate(Fields::EMPTY).pick(Coding::FRESH), None);
        assert!(!negotiate(Fields::EMPTY).any());
        assert_eq!(pick(""), None);
        assert_eq!(pick(" , ,"), None);
    }

    #[test]
    fn what_browsers_and_curl_send_gets_the_server_order_of_the_body_kind() {
        // Chrome and Edge, then Firefox (since 126), Safari, `curl --compressed`.
        let chrome = "gzip, deflate, br, zstd";
        assert_eq!((pick_fixed(chrome), pick(chrome)), (Some(Br), Some(Zstd)));
        let firefox = "gzip, deflate, br, zstd";
        assert_eq!((pick_fixed(firefox), pick(firefox)), (Some(Br), Some(Zstd)));
        let safari = "gzip, deflate, br";
        assert_eq!((pick_fixed(safari), pick(safari)), (Some(Br), Some(Gzip)));
        let curl = "deflate, gzip, br, zstd";
        assert_eq!((pick_fixed(curl), pick(curl)), (Some(Br), Some(Zstd)));
        let old_curl = "deflate, gzip";
        assert_eq!((pick_fixed(old_curl), pick(old_curl)), (Some(Gzip), Some(Gzip)));
    }

    #[test]
    fn a_higher_q_beats_the_server_order() {
        assert_eq!(pick("zstd;q=0.5, gzip"), Some(Gzip));
        assert_eq!(pick_fixed("br;q=0.8, zstd;q=0.9"), Some(Zstd));
        assert_eq!(pick("br;q=0.9, zstd;q=0.8, gzip;q=0.9"), Some(Gzip), "a tie among the best: server order");
        assert_eq!(pick("br, gzip;q=0.9"), Some(Br));
        assert_eq!(pick_fixed("br;q=0.9, zstd;q=0.8, gzip;q=0.9"), Some(Br));
    }

    #[test]
    fn an_accepted_coding_is_chosen_whatever_its_case_or_alias() {
        assert_eq!(pick("gzip"), Some(Gzip));
        assert_eq!(pick("GZip;Q=0.5"), Some(Gzip));
        assert_eq!(pick("x-gzip"), Some(Gzip));
        assert_eq!(pick("BR"), Some(Br));
        assert_eq!(pick("ZSTD;q=0.1"), Some(Zstd));
        assert_eq!(pick("deflate, gzip;q=1.0, br;q=0.5"), Some(Gzip));
    }

    #[test]
    fn unknown_codings_are_not_chosen() {
        assert_eq!(pick("deflate, compress, exi"), None, "none the build has");
        assert_eq!(pick("brotli, zst, x-zstd"), None, "near misses are other codings");
        assert!(!accepted("deflate").any());
        assert_eq!(pick("deflate;q=1, zstd;q=0.1"), Some(Zstd));
    }

    #[test]
    fn q_zero_refuses_and_the_star_covers_what_is_not_listed() {
        assert_eq!(pick("gzip;q=0"), None);
        assert_eq!(pick("gzip;q=0.000, *"), Some(Zstd), "its own entry wins over *, the others take *");
        assert_eq!(pick("gzip, br;q=0, zstd;q=0"), Some(Gzip));
        assert_eq!(pick_fixed("br;q=0, *"), Some(Zstd));
        assert_eq!(pick("*"), Some(Zstd));
        assert_eq!(pick_fixed("*"), Some(Br));
        assert_eq!(pick("*;q=0"), None);
        assert_eq!(pick("*;q=0, gzip;q=0.1"), Some(Gzip));
    }

    #[test]
    fn identity_refused_with_nothing_else_acceptable_is_still_identity() {
        assert_eq!(pick("identity;q=0, gzip;q=0, br;q=0, zstd;q=0"), None);
        assert_eq!(pick("identity;q=0"), None);
        assert_eq!(pick("identity;q=0, *;q=0"), None);
        assert_eq!(pick("identity;q=0, br"), Some(Br), "identity refused, br taken");
    }

    #[test]
    fn a_malformed_entry_is_ignored() {
        assert_eq!(pick("gzip;q=2"), None);
        assert_eq!(pick("gzip;q=0.1234"), None);
        assert_eq!(pick("gzip;q=abc, *;q=0.2"), Some(Zstd), "then * applies (to every coding)");
        assert_eq!(pick("gzip;q=abc, zstd;q=0, br;q=0, *;q=0.2"), Some(Gzip));
        assert_eq!(pick("gzip;q"), None);
        assert_eq!(pick("gzip;level=9"), Some(Gzip), "other parameters are allowed");
    }

    #[test]
    fn every_field_line_counts() {
        let other = [httparse::Header { name: "accept-encoding", value: b"gzip;q=0.4" }];
        assert_eq!(negotiate(Fields::new(&lines(&["deflate"]))).pick(Coding::FRESH), None);
        let both = [lines(&["deflate"]), other.to_vec()].concat();
        assert_eq!(negotiate(Fields::new(&both)).pick(Coding::FRESH), Some(Gzip));
    }

    #[test]
    fn qvalues_parse_to_thousandths() {
        for (text, want) in [("0", Some(0)), ("0.", Some(0)), ("0.5", Some(500)), ("0.001", Some(1)), ("1", Some(1000))]
        {
            assert_eq!(parse_q(text.as_bytes()), want, "{text}");
        }
        for bad in ["1.5", "1.001", "2", ".5", "-0", "0.x", ""] {
            assert_eq!(parse_q(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn an_empty_order_is_identity() {
        assert_eq!(accepted("gzip, br, zstd").pick(&[]), None);
        assert_eq!(accepted("gzip, br, zstd").pick(&[Gzip]), Some(Gzip));
    }
}
