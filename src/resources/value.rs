//! What a declared field accepts: the one check of a JSON value against a [`Field`], used for
//! request bodies, query filters and declared defaults, and the typed [`Cell`] it yields (what
//! the store binds as a parameter and reads back).
//!
//! A check names what is wrong in words a client can act on; it never panics on any input,
//! and what it accepts is already in its stored form (a datetime in UTC with milliseconds), so
//! a record read back equals the record written.

use serde_json::Value;

use super::{Field, Kind};

/// A field's value in its stored form.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Absent or null (optional fields only).
    Null,
    /// integer, ref.
    Int(i64),
    /// number.
    Num(f64),
    /// boolean.
    Bool(bool),
    /// string, text, enum, datetime (normalised), email, url.
    Text(String),
}

impl Cell {
    /// The value as JSON, as a record shows it.
    pub fn to_json(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Int(n) => Value::from(*n),
            Cell::Num(n) => serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number),
            Cell::Bool(b) => Value::Bool(*b),
            Cell::Text(s) => Value::String(s.clone()),
        }
    }

    /// The text, for text kinds.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Cell::Text(s) => Some(s),
            _ => None,
        }
    }
}

/// The longest `url` value, in characters.
pub const MAX_URL: usize = 2048;

/// `value` checked against `field`: its stored form, or what is wrong (a message for the
/// field's `errors` entry). `null` is accepted for an optional field; a required field's
/// `null` is refused here (absence is the caller's business: it applies the default first).
pub fn check(field: &Field, value: &Value) -> Result<Cell, String> {
    if value.is_null() {
        return if field.required { Err("is required".into()) } else { Ok(Cell::Null) };
    }
    match field.kind {
        Kind::String | Kind::Text => {
            let s = value.as_str().ok_or("must be a string")?;
            if field.kind == Kind::String && s.chars().any(char::is_control) {
                return Err("must be one line without control characters".into());
            }
            if field.kind == Kind::Text && s.chars().any(|c| c.is_control() && c != '\n' && c != '\r' && c != '\t') {
                return Err("must not contain control characters other than newlines and tabs".into());
            }
            let n = s.chars().count() as f64;
            bounds(field, n, "characters")?;
            Ok(Cell::Text(s.to_string()))
        }
        Kind::Integer | Kind::Ref => {
            let n = value.as_number().and_then(crate::app::validate::integral).ok_or(if field.kind == Kind::Ref {
                "must be a record id (an integer)"
            } else {
                "must be an integer"
            })?;
            if field.kind == Kind::Ref && n < 1 {
                return Err("must be a record id (an integer from 1)".into());
            }
            bounds(field, n as f64, "")?;
            Ok(Cell::Int(n))
        }
        Kind::Number => {
            let n = value.as_f64().ok_or("must be a number")?;
            bounds(field, n, "")?;
            Ok(Cell::Num(n))
        }
        Kind::Boolean => value.as_bool().map(Cell::Bool).ok_or_else(|| "must be true or false".into()),
        Kind::Enum => {
            let s = value.as_str().filter(|s| field.values.iter().any(|v| v == s));
            s.map(|s| Cell::Text(s.to_string())).ok_or_else(|| format!("must be one of {}", field.values.join(", ")))
        }
        Kind::Datetime => {
            let s = value.as_str().ok_or("must be an RFC 3339 date-time string")?;
            datetime(s).map(Cell::Text).ok_or_else(|| "must be an RFC 3339 date-time (2026-01-31T12:00:00Z)".into())
        }
        Kind::Email => {
            let s = value.as_str().ok_or("must be a string")?;
            crate::app::validate::email(s)?;
            Ok(Cell::Text(s.to_string()))
        }
        Kind::Url => {
            let s = value.as_str().ok_or("must be a string")?;
            if s.chars().count() > MAX_URL {
                return Err(format!("must be at most {MAX_URL} characters"));
            }
            if !url(s) {
                return Err("must be an absolute http or https URL".into());
            }
            Ok(Cell::Text(s.to_string()))
        }
    }
}

/// `n` within the field's `min`/`max`, or the message saying the range (`unit`: "characters"
/// for text, "" for numbers).
fn bounds(field: &Field, n: f64, unit: &str) -> Result<(), String> {
    let low = field.min.is_some_and(|m| n < m);
    let high = field.max.is_some_and(|m| n > m);
    if !low && !high {
        return Ok(());
    }
    let unit = if unit.is_empty() { String::new() } else { format!(" {unit}") };
    Err(match (field.min, field.max) {
        (Some(a), Some(b)) => format!("must be {} to {}{unit}", show(a), show(b)),
        (Some(a), None) => format!("must be at least {}{unit}", show(a)),
        (None, Some(b)) => format!("must be at most {}{unit}", show(b)),
        (None, None) => String::new(),
    })
}

/// A bound as written: `5`, not `5.0`.
pub fn show(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// An absolute `http`/`https` URL: scheme, `://`, a non-empty host of URL characters, no
/// whitespace or control characters anywhere.
fn url(s: &str) -> bool {
    let lower = s.get(..8).map(str::to_ascii_lowercase).unwrap_or_default();
    let rest = if lower.starts_with("https://") {
        &s[8..]
    } else if lower.starts_with("http://") {
        &s[7..]
    } else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    !host.is_empty()
        && !host.starts_with(':')
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'))
        && s.chars().all(|c| c.is_ascii_graphic() || (!c.is_ascii() && !c.is_control() && !c.is_whitespace()))
}

/// An RFC 3339 timestamp (`2026-01-31T12:00:00Z`, `…T12:00:00.5+02:00`; `t`, `z` and a space
/// for `T` accepted) as UTC with milliseconds: `2026-01-31T10:00:00.500Z`. `None` when it is
/// not one, or names a day or time that does not exist (leap seconds are refused).
pub fn datetime(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter().all(u8::is_ascii_digit).then(|| part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') || !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if b.get(13) != Some(&b':') || b.get(16) != Some(&b':') {
        return None;
    }
    let mut at = 19;
    let mut millis = 0i64;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        // Milliseconds, the rest truncated.
        for i in 0..3 {
            millis = millis * 10 + b.get(at + 1 + i).filter(|_| i < digits).map_or(0, |d| i64::from(d - b'0'));
        }
        at += 1 + digits;
    }
    let offset_min = match b.get(at) {
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if at + 6 == b.len() && b[at + 3] == b':' => {
            let (h, m) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let off = h * 60 + m;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if !(1..=12).contains(&month) || day < 1 || day > days_in[(month - 1) as usize] {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let local = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let utc = local - offset_min * 60;
    let (days, secs) = (utc.div_euclid(86_400), utc.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return None;
    }
    Some(format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", secs / 3600, secs / 60 % 60, secs % 60))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(kind: Kind) -> Field {
        Field::new("f", kind)
    }

    #[test]
    fn datetimes_are_normalised_to_utc_milliseconds() {
        assert_eq!(datetime("2026-01-31T12:00:00Z").as_deref(), Some("2026-01-31T12:00:00.000Z"));
        assert_eq!(datetime("2026-01-31t12:00:00.5z").as_deref(), Some("2026-01-31T12:00:00.500Z"));
        assert_eq!(datetime("2026-03-01T01:30:00.123456+02:00").as_deref(), Some("2026-02-28T23:30:00.123Z"));
        assert_eq!(datetime("2024-12-31T23:00:00-01:30").as_deref(), Some("2025-01-01T00:30:00.000Z"));
        assert_eq!(datetime("2024-02-29 00:00:00Z").as_deref(), Some("2024-02-29T00:00:00.000Z"));
        for bad in [
            "",
            "2026-01-31",
            "2026-01-31T12:00:00",
            "2026-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-31T24:00:00Z",
            "2026-01-31T12:00:60Z",
            "2026-01-31T12:00:00.Z",
            "2026-01-31T12:00:00+2:00",
            "2026-01-31T12:00:00Zjunk",
            "0000-01-01T00:00:00+01:00",
            "２026-01-31T12:00:00Z",
        ] {
            assert_eq!(datetime(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_kind_takes_its_json_type_only() {
        let ok = |k: Kind, v: Value| check(&field(k), &v);
        assert_eq!(ok(Kind::Integer, json!(5)), Ok(Cell::Int(5)));
        assert_eq!(ok(Kind::Integer, json!(5.0)), Ok(Cell::Int(5)));
        assert!(ok(Kind::Integer, json!(1.5)).is_err());
        assert!(ok(Kind::Integer, json!("1")).is_err());
        assert_eq!(ok(Kind::Number, json!(1.5)), Ok(Cell::Num(1.5)));
        assert!(ok(Kind::Number, json!("1.5")).is_err());
        assert_eq!(ok(Kind::Boolean, json!(true)), Ok(Cell::Bool(true)));
        assert!(ok(Kind::Boolean, json!(1)).is_err());
        assert!(ok(Kind::String, json!("a\nb")).is_err());
        assert_eq!(ok(Kind::Text, json!("a\nb")), Ok(Cell::Text("a\nb".into())));
        assert!(ok(Kind::Email, json!("nope")).is_err());
        assert!(ok(Kind::Url, json!("ftp://x.io")).is_err());
        assert!(ok(Kind::Url, json!("https://")).is_err());
        assert!(ok(Kind::Url, json!("https://x.io/a b")).is_err());
        assert!(ok(Kind::Url, json!(format!("https://x.io/{}", "a".repeat(MAX_URL)))).is_err());
        assert_eq!(ok(Kind::Url, json!("HTTPS://x.io/?q=1")), Ok(Cell::Text("HTTPS://x.io/?q=1".into())));
        assert!(ok(Kind::Ref, json!(0)).is_err());
        assert_eq!(ok(Kind::Ref, json!(3)), Ok(Cell::Int(3)));
        assert_eq!(ok(Kind::String, Value::Null), Ok(Cell::Null));
        let mut req = field(Kind::String);
        req.required = true;
        assert_eq!(check(&req, &Value::Null), Err("is required".into()));
    }

    #[test]
    fn bounds_count_characters_or_values() {
        let mut f = field(Kind::String);
        (f.min, f.max) = (Some(1.0), Some(3.0));
        assert!(check(&f, &json!("")).is_err());
        assert!(check(&f, &json!("ééé")).is_ok());
        assert_eq!(check(&f, &json!("abcd")), Err("must be 1 to 3 characters".into()));
        let mut n = field(Kind::Number);
        n.min = Some(0.5);
        assert_eq!(check(&n, &json!(0.25)), Err("must be at least 0.5".into()));
        let mut e = field(Kind::Enum);
        e.values = vec!["a".into(), "b".into()];
        assert_eq!(check(&e, &json!("c")), Err("must be one of a, b".into()));
        assert_eq!(check(&e, &json!("b")), Ok(Cell::Text("b".into())));
    }
}
