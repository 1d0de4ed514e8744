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
//!   (not acceptable); the highest `q` above 0 wins, ties going to the server's order
//!   ([`Coding::ALL`]: zstd, then br, then gzip, among those built in);
//! - an entry with a malformed `q` is ignored;
//! - when nothing is acceptable, identity is sent even if `identity;q=0` refuses it (nginx's
//!   behaviour, RFC 9110's "SHOULD" rather than a 406: a readable body beats an error).

use super::fields::Fields;

/// A content coding this build can produce, in the server's order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coding {
    /// `gzip` (RFC 1952), by `flate2`.
    Gzip,
}

impl Coding {
    /// Every coding the build has, most preferred first.
    pub const ALL: &'static [Coding] = &[Coding::Gzip];

    /// The token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
        }
    }

    /// Whether `token` names this coding (case-insensitive; `x-gzip` is gzip, RFC 9110 §8.4.1.3).
    fn named(self, token: &[u8]) -> bool {
        match self {
            Coding::Gzip => token.eq_ignore_ascii_case(b"gzip") || token.eq_ignore_ascii_case(b"x-gzip"),
        }
    }
}

/// The coding to send for a request with `fields` (every `Accept-Encoding` line counts, in
/// order), chosen among `available` (most preferred first); `None`: identity.
pub fn negotiate(fields: Fields<'_>, available: &[Coding]) -> Option<Coding> {
    let mut best: Option<(Coding, u16)> = None;
    for &coding in available {
        let q = quality(fields.get_all("accept-encoding"), coding);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((coding, q));
        }
    }
    best.map(|(c, _)| c)
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

    fn lines<'a>(values: &[&'a str]) -> Vec<httparse::Header<'a>> {
        values.iter().map(|v| httparse::Header { name: "Accept-Encoding", value: v.as_bytes() }).collect()
    }

    fn pick(header: &str) -> Option<Coding> {
        negotiate(Fields::new(&lines(&[header])), Coding::ALL)
    }

    #[test]
    fn no_field_or_an_empty_one_is_identity() {
        assert_eq!(negotiate(Fields::EMPTY, Coding::ALL), None);
        assert_eq!(pick(""), None);
        assert_eq!(pick(" , ,"), None);
    }

    #[test]
    fn an_accepted_coding_is_chosen_whatever_its_case_or_alias() {
        assert_eq!(pick("gzip"), Some(Coding::Gzip));
        assert_eq!(pick("GZip;Q=0.5"), Some(Coding::Gzip));
        assert_eq!(pick("x-gzip"), Some(Coding::Gzip));
        assert_eq!(pick("deflate, gzip;q=1.0, br"), Some(Coding::Gzip));
        assert_eq!(pick("deflate, br"), None, "none the build has");
    }

    #[test]
    fn q_zero_refuses_and_the_star_covers_what_is_not_listed() {
        assert_eq!(pick("gzip;q=0"), None);
        assert_eq!(pick("gzip;q=0.000, *"), None, "its own entry wins over *");
        assert_eq!(pick("*"), Some(Coding::Gzip));
        assert_eq!(pick("*;q=0"), None);
        assert_eq!(pick("*;q=0, gzip;q=0.1"), Some(Coding::Gzip));
    }

    #[test]
    fn identity_refused_with_nothing_else_acceptable_is_still_identity() {
        assert_eq!(pick("identity;q=0, gzip;q=0"), None);
        assert_eq!(pick("identity;q=0"), None);
        assert_eq!(pick("identity;q=0, *;q=0"), None);
    }

    #[test]
    fn a_malformed_entry_is_ignored() {
        assert_eq!(pick("gzip;q=2"), None);
        assert_eq!(pick("gzip;q=0.1234"), None);
        assert_eq!(pick("gzip;q=abc, *;q=0.2"), Some(Coding::Gzip), "then * applies");
        assert_eq!(pick("gzip;q"), None);
        assert_eq!(pick("gzip;level=9"), Some(Coding::Gzip), "other parameters are allowed");
    }

    #[test]
    fn every_field_line_counts() {
        let other = [httparse::Header { name: "accept-encoding", value: b"gzip;q=0.4" }];
        assert_eq!(negotiate(Fields::new(&lines(&["br"])), Coding::ALL), None);
        assert_eq!(negotiate(Fields::new(&[lines(&["br"]), other.to_vec()].concat()), Coding::ALL), Some(Coding::Gzip));
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
    fn nothing_built_in_is_identity() {
        assert_eq!(negotiate(Fields::new(&lines(&["gzip"])), &[]), None);
    }
}
