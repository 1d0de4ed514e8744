//! Small validators with no extra crate: UUID v4, IMF-fixdate and RFC 3339 dates, base64,
//! media types, percent-encoding, and the JSON error envelope. Pure functions: no socket,
//! no server.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

/// Lower-case UUID v4, 8-4-4-4-12.
pub fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 36 {
        return false;
    }
    for (i, &c) in b.iter().enumerate() {
        let ok = match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        };
        if !ok {
            return false;
        }
    }
    b[14] == b'4' && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) to Unix seconds.
pub fn parse_imf_fixdate(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 29 || &s[3..5] != ", " || b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || &s[25..] != " GMT" {
        return None;
    }
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let wd = DAYS.iter().position(|d| *d == &s[0..3])?;
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        if s[r.clone()].bytes().all(|c| c.is_ascii_digit()) {
            s[r].parse().ok()
        } else {
            None
        }
    };
    let day = num(5..7)?;
    let month = MONTHS.iter().position(|m| *m == &s[8..11])? as i64 + 1;
    let year = num(12..16)?;
    if &s[19..20] != ":" || &s[22..23] != ":" {
        return None;
    }
    let (h, mi, se) = (num(17..19)?, num(20..22)?, num(23..25)?);
    if !(1..=31).contains(&day) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    // days from civil (Howard Hinnant)
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    // 1970-01-01 was a Thursday (index 3).
    if (days + 3).rem_euclid(7) as usize != wd {
        return None;
    }
    Some(days * 86400 + h * 3600 + mi * 60 + se)
}

pub fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Decodes base64 (standard or URL-safe alphabet, padding optional).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return None;
    }
    Some(out)
}

/// The media type of a Content-Type value, lower-cased, without parameters.
pub fn media_type(ct: Option<&str>) -> Option<String> {
    ct.map(|v| v.split(';').next().unwrap().trim().to_ascii_lowercase())
}

/// Asserts a JSON error response: status, `Content-Type: application/json`, a string
/// `code` (equal to `code` when given) and a string `message`.
pub fn assert_json_error(r: &Response, status: u16, code: Option<&str>, what: &str) {
    assert_eq!(r.status, status, "{what}: expected status {status}, got {r:?}");
    assert_eq!(
        media_type(r.header("content-type")).as_deref(),
        Some("application/json"),
        "{what}: expected Content-Type application/json, got {r:?}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {r:?}"));
    assert!(v["code"].is_string(), "{what}: expected a string `code` in the error body, got {r:?}");
    assert!(v["message"].is_string(), "{what}: expected a string `message` in the error body, got {r:?}");
    if let Some(code) = code {
        assert_eq!(v["code"].as_str(), Some(code), "{what}: expected code {code:?}, got {r:?}");
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for query values).
pub fn urlencode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)`: an RFC 3339 timestamp in UTC.
pub fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20 {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if !(digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10))
        || !(b[10] == b'T' || b[10] == b't')
        || !(digits(11..13) && b[13] == b':' && digits(14..16) && b[16] == b':' && digits(17..19))
    {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &r[n..];
    }
    let (mo, d, h, mi) = (&s[5..7], &s[8..10], &s[11..13], &s[14..16]);
    let ok_ranges = ("01"..="12").contains(&mo) && ("01"..="31").contains(&d) && h <= "23" && mi <= "59";
    ok_ranges && matches!(rest, "Z" | "z" | "+00:00")
}

#[cfg(test)]
mod selftest {
    use super::*;

    #[test]
    fn harness_validators() {
        assert_eq!(parse_imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
        assert_eq!(parse_imf_fixdate("Mon, 06 Nov 1994 08:49:37 GMT"), None, "wrong weekday");
        assert_eq!(parse_imf_fixdate("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert!(is_uuid_v4("0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(!is_uuid_v4("0F8FAD5B-D9CB-469F-A165-70867728950E"));
        assert!(!is_uuid_v4("0f8fad5b-d9cb-169f-a165-70867728950e"));
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").unwrap().len(), 32);
        assert!(base64_decode("a*b").is_none());
        let cfg = render_config("127.0.0.1:1", Path::new("/d"), "workers = 3\n[limits]\nx = 1");
        assert!(cfg.contains("workers = 3") && !cfg.contains("workers = 1"), "{cfg}");
        assert!(cfg.contains("[debug]\nroutes = true"), "{cfg}");
        let cfg = Server::builder()
            .set("debug", "routes = false")
            .set("limits", "a = 1")
            .set("limits", "b = 2")
            .to_extra_toml();
        assert_eq!(cfg, "\n[debug]\nroutes = false\n\n[limits]\na = 1\nb = 2\n");
    }
}
