//! Request-body and query validation (CONTRACT §5, seed 2.3).
//!
//! [`json_object`] turns a body into a JSON object or the right error (415
//! wrong media type, 400 malformed, 422 not an object); [`Fields`] then reads
//! typed fields, collecting EVERY problem (unknown keys such as `__proto__`
//! included) before [`Fields::finish`] reports them as one 422. The single
//! field rules are plain functions so `forkd user create` applies the same.

use serde_json::{Map, Value};

use crate::error::{Error, FieldError};
use crate::http::request::Request;

/// Parse the body of `req` as a JSON object.
pub fn json_object(req: &Request<'_>) -> Result<Map<String, Value>, Error> {
    json_body(req.header("content-type"), req.body)
}

/// [`json_object`] on a `Content-Type` value and a body.
pub fn json_body(content_type: Option<&[u8]>, body: &[u8]) -> Result<Map<String, Value>, Error> {
    let json_type = content_type.is_some_and(|v| {
        let media = v.split(|&c| c == b';').next().unwrap_or(b"").trim_ascii();
        media.eq_ignore_ascii_case(b"application/json")
    });
    if !json_type {
        return Err(Error::UnsupportedMediaType("Content-Type must be application/json"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::Validation(vec![FieldError::new("body", "must be a JSON object")])),
        Err(_) => Err(Error::bad_request("malformed JSON")),
    }
}

/// A value that may be absent, explicitly null, or present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence<T> {
    /// The key is not there.
    Absent,
    /// The key is there with `null`.
    Null,
    /// The key has a valid value.
    Value(T),
}

/// Typed, collecting access to a JSON object's fields.
pub struct Fields {
    map: Map<String, Value>,
    errors: Vec<FieldError>,
}

impl Fields {
    /// Start checking `map`; every key not in `allowed` is an error.
    pub fn new(map: Map<String, Value>, allowed: &[&str]) -> Fields {
        let errors = map
            .keys()
            .filter(|k| !allowed.contains(&k.as_str()))
            .map(|k| FieldError::new(k.as_str(), "unknown field"))
            .collect();
        Fields { map, errors }
    }

    /// Record a problem.
    pub fn error(&mut self, field: &str, message: &str) {
        self.errors.push(FieldError::new(field, message));
    }

    /// Whether `key` is present (even as null).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// A string checked by `rule`; `required` makes absence an error.
    pub fn string(&mut self, key: &str, required: bool, rule: fn(&str) -> Result<(), &'static str>) -> Option<String> {
        match self.map.remove(key) {
            None if required => self.error(key, "is required"),
            None => {}
            Some(Value::String(s)) => match rule(&s) {
                Ok(()) => return Some(s),
                Err(m) => self.error(key, m),
            },
            Some(_) => self.error(key, "must be a string"),
        }
        None
    }

    /// An integer in `min..=max`, or null.
    pub fn int(&mut self, key: &str, min: i64, max: i64) -> Presence<i64> {
        match self.map.remove(key) {
            None => Presence::Absent,
            Some(Value::Null) => Presence::Null,
            Some(Value::Number(n)) => match integral(&n) {
                Some(v) if (min..=max).contains(&v) => Presence::Value(v),
                Some(_) => {
                    self.error(key, &format!("must be between {min} and {max}"));
                    Presence::Absent
                }
                None => {
                    self.error(key, "must be an integer");
                    Presence::Absent
                }
            },
            Some(_) => {
                self.error(key, "must be an integer");
                Presence::Absent
            }
        }
    }

    /// Report every problem found, or nothing.
    pub fn finish(self) -> Result<(), Error> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Validation(self.errors))
        }
    }
}

/// The integer a JSON number stands for: `7`, and also `7.0` (JSON and
/// JSON Schema draw no line between them; JavaScript clients cannot), but
/// not `7.5`. `None` for a fraction. A whole number outside `i64` (`1e30`,
/// `4638101243934267968323584`) is still an integer: it comes back as
/// `i64::MAX` or `i64::MIN`, beyond every range checked here.
pub fn integral(n: &serde_json::Number) -> Option<i64> {
    if let Some(v) = n.as_i64() {
        return Some(v);
    }
    if n.is_u64() {
        return Some(i64::MAX);
    }
    let f = n.as_f64()?;
    // `as` saturates: 2^63 and above give i64::MAX, below -2^63 i64::MIN.
    (f.fract() == 0.0).then_some(f as i64)
}

fn chars_between(s: &str, min: usize, max: usize) -> bool {
    let n = s.chars().count();
    (min..=max).contains(&n)
}

/// `name`: 1–100 characters.
pub fn name(s: &str) -> Result<(), &'static str> {
    if chars_between(s, 1, 100) && !s.trim().is_empty() {
        Ok(())
    } else {
        Err("must be 1 to 100 characters")
    }
}

/// `password`: 8–128 characters.
pub fn password(s: &str) -> Result<(), &'static str> {
    if chars_between(s, 8, 128) {
        Ok(())
    } else {
        Err("must be 8 to 128 characters")
    }
}

/// `title`: 1–200 characters.
pub fn title(s: &str) -> Result<(), &'static str> {
    if chars_between(s, 1, 200) {
        Ok(())
    } else {
        Err("must be 1 to 200 characters")
    }
}

/// A post `body`: 0–10000 characters.
pub fn post_body(s: &str) -> Result<(), &'static str> {
    if chars_between(s, 0, 10_000) {
        Ok(())
    } else {
        Err("must be at most 10000 characters")
    }
}

/// Any string (type check only).
pub fn any(_: &str) -> Result<(), &'static str> {
    Ok(())
}

/// `email`: a plausible address of at most 254 characters: one `@`, a
/// non-empty local part of at most 64, a dotted domain of letters, digits,
/// `-` and `.`, no spaces or control characters.
pub fn email(s: &str) -> Result<(), &'static str> {
    const BAD: &str = "must be a valid e-mail address";
    if s.len() > 254 {
        return Err("must be at most 254 characters");
    }
    let Some((local, domain)) = s.split_once('@') else { return Err(BAD) };
    let local_ok = (1..=64).contains(&local.len())
        && local.chars().all(|c| {
            c.is_ascii_graphic() && !matches!(c, '@' | '(' | ')' | ',' | ':' | ';' | '<' | '>' | '[' | ']' | '\\' | '"')
        })
        && !local.starts_with('.')
        && !local.ends_with('.')
        && !local.contains("..");
    let labels: Vec<&str> = domain.split('.').collect();
    let domain_ok = labels.len() >= 2
        && labels.iter().all(|l| {
            (1..=63).contains(&l.len())
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if local_ok && domain_ok {
        Ok(())
    } else {
        Err(BAD)
    }
}

/// Percent-decode a query value (`+` is a space). `None` on bad escapes or invalid UTF-8.
pub fn decode_query(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
                let s = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(s, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_rules() {
        assert!(name("a").is_ok() && name(&"a".repeat(100)).is_ok());
        assert!(name("").is_err() && name(&"a".repeat(101)).is_err());
        assert!(email("a@x.io").is_ok() && email("first.last+tag@sub.example.com").is_ok());
        for bad in ["nope", "a@b", "@x.io", "a@@x.io", "a b@x.io", "a@x..io", "a@-x.io", "'; DROP TABLE users; --@x.io"]
        {
            assert!(email(bad).is_err(), "{bad}");
        }
        assert!(email(&format!("{}@x.io", "a".repeat(250))).is_err());
        assert!(password("12345678").is_ok() && password("1234567").is_err());
    }

    #[test]
    fn collects_every_problem() {
        let map = serde_json::json!({"name": "", "age": 1.5, "__proto__": {}, "email": 3})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let mut f = Fields::new(map, &["name", "email", "age"]);
        f.string("name", true, name);
        f.string("email", true, email);
        f.int("age", 0, 150);
        f.string("password", true, password);
        let Err(Error::Validation(errors)) = f.finish() else { panic!("expected 422") };
        let mut fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        fields.sort();
        assert_eq!(fields, ["__proto__", "age", "email", "name", "password"]);
    }

    #[test]
    fn ints_reject_strings_and_fractions() {
        let map =
            serde_json::json!({"a": "20", "b": 1.5, "c": null, "d": 151, "e": 7, "f": 7.0, "g": 151.0, "h": 1e300})
                .as_object()
                .cloned()
                .unwrap_or_default();
        let mut f = Fields::new(map, &["a", "b", "c", "d", "e", "f", "g", "h"]);
        assert_eq!(f.int("a", 0, 150), Presence::Absent);
        assert_eq!(f.int("b", 0, 150), Presence::Absent);
        assert_eq!(f.int("c", 0, 150), Presence::Null);
        assert_eq!(f.int("d", 0, 150), Presence::Absent);
        assert_eq!(f.int("e", 0, 150), Presence::Value(7));
        // Schemathesis: `7.0` is an integer to JSON Schema (and to every JavaScript client).
        assert_eq!(f.int("f", 0, 150), Presence::Value(7));
        assert_eq!(f.int("g", 0, 150), Presence::Absent);
        assert_eq!(f.int("h", 0, 150), Presence::Absent);
        assert!(f.finish().is_err());
    }

    /// Found by Schemathesis: without serde_json's `float_roundtrip`, the
    /// whole number `1940619656927089.0` was read one unit in the last place
    /// off, with a fraction, and refused.
    #[test]
    fn whole_floats_are_read_exactly() {
        let v: serde_json::Value = serde_json::from_str("[1940619656927089.0, 9007199254740991.0]").unwrap_or_default();
        let got: Vec<Option<i64>> =
            v.as_array().into_iter().flatten().map(|n| n.as_number().and_then(integral)).collect();
        assert_eq!(got, [Some(1_940_619_656_927_089), Some(9_007_199_254_740_991)]);
    }

    #[test]
    fn whole_numbers_beyond_i64_are_integers_out_of_every_range() {
        // Found by Schemathesis: a CSP report's `columnNumber` of 4.6e24 was 400.
        let v: serde_json::Value =
            serde_json::from_str("[4638101243934267968323584, 1e30, -1e30, 18446744073709551615, 2.5e30, 0.5]")
                .unwrap_or_default();
        let got: Vec<Option<i64>> =
            v.as_array().into_iter().flatten().map(|n| n.as_number().and_then(integral)).collect();
        assert_eq!(got, [Some(i64::MAX), Some(i64::MAX), Some(i64::MIN), Some(i64::MAX), Some(i64::MAX), None]);
    }

    #[test]
    fn query_decoding() {
        assert_eq!(decode_query("a%25b+c").as_deref(), Some("a%b c"));
        assert_eq!(decode_query("%zz"), None);
        assert_eq!(decode_query("%"), None);
        // `u8::from_str_radix` alone would read "+4" as 4.
        assert_eq!(decode_query("%+4"), None);
        assert_eq!(decode_query("a%+Fb"), None);
    }
}
