//! `FORKD_*` environment overrides, applied to the parsed TOML table before it is
//! deserialized: `FORKD_RATE_LIMIT__MAX=1000` sets `rate_limit.max` (the name after `FORKD_`,
//! lower-cased, with `__` between sections). The string is coerced by the type the key has in
//! the defaults. `FORKD_CONFIG` names the config file and is not a key.
//!
//! This file must not read the process environment (the caller passes the pairs) nor do any
//! I/O; it reports problems as message lines and never panics on input.

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::raw::expected;

/// Where each overridden key came from: dotted key path → variable name, for messages.
pub(super) type Sources = BTreeMap<String, String>;

/// The prefix of every override variable.
const PREFIX: &str = "FORKD_";

/// The variable naming the config file; not a key.
pub(super) const CONFIG_VAR: &str = "FORKD_CONFIG";

/// Applies every `FORKD_*` pair of `env` onto `table`, checking each name against the keys of
/// `defaults` and coercing each value to that key's type. Later pairs win.
pub(super) fn apply(
    table: &mut Table,
    defaults: &Table,
    env: &[(String, String)],
    errors: &mut Vec<String>,
) -> Sources {
    let mut sources = Sources::new();
    for (name, text) in env {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if name == CONFIG_VAR {
            continue;
        }
        let segments: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let path = segments.join(".");
        let var = name.escape_debug(); // a variable's name may hold control characters
        match lookup(defaults, &segments) {
            Found::Key(default) => match coerce(default, text) {
                Some(value) => {
                    if insert(table, &segments, value) {
                        sources.insert(path, name.clone());
                    }
                }
                None => errors.push(format!("{name}={text:?}: {path} must be {}", hint(default))),
            },
            Found::Section => errors.push(format!("{path} is a section, not a key (from {var})")),
            Found::UnknownKey { section } => {
                let key = segments.last().map(String::as_str).unwrap_or("").escape_debug();
                let line = match section.as_str() {
                    "" => format!("unknown key {key} (from {var})"),
                    section => format!("unknown key {key} in section [{section}] (from {var})"),
                };
                errors.push(line + &suggestion(defaults, &segments));
            }
            Found::UnknownSection { section } => {
                let line = format!("unknown section [{}] (from {var})", section.escape_debug());
                errors.push(line + &suggestion(defaults, &segments));
            }
        }
    }
    sources
}

/// What a variable's key path names in the defaults.
enum Found<'a> {
    /// A key, with its default.
    Key(&'a Value),
    /// A whole section (only keys can be set).
    Section,
    /// No such key in the (known) dotted `section` (`""`: the top level).
    UnknownKey { section: String },
    /// No such section: the dotted path of the first unknown one.
    UnknownSection { section: String },
}

/// Walks `segments` down the default table.
fn lookup<'a>(defaults: &'a Table, segments: &[String]) -> Found<'a> {
    let mut table = defaults;
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match table.get(segment) {
            Some(Value::Table(_)) if last => return Found::Section,
            Some(Value::Table(inner)) => table = inner,
            Some(value) if last => return Found::Key(value),
            _ if last => return Found::UnknownKey { section: segments[..i].join(".") },
            _ => return Found::UnknownSection { section: segments[..=i].join(".") },
        }
    }
    Found::Section // no segments: unreachable, `split` yields at least one
}

/// `; did you mean \`FORKD_X\`?` for the known variable closest to the unknown one named by
/// `segments`, or else for a key of that name in another section; empty when there is neither.
/// An unknown key of a known section is compared with that section's keys only
/// (`FORKD_RATE_LIMIT__MAXX`); anything else with every variable's whole name, which also
/// catches a single `_` between section and key (`FORKD_RATE_LIMIT_MAX`).
fn suggestion(defaults: &Table, segments: &[String]) -> String {
    let Some((last, sections)) = segments.split_last() else { return String::new() };
    let mut known = Vec::new();
    variables(defaults, "", &mut known);
    let upper = |s: &str| s.to_ascii_uppercase();
    let section = sections.iter().try_fold(defaults, |t, s| t.get(s).and_then(Value::as_table));
    let close = match section {
        Some(table) if !sections.is_empty() => {
            let keys = table.iter().filter(|(_, v)| !v.is_table()).map(|(k, _)| k.as_str());
            super::suggest::closest(last, keys).map(|key| format!("{}__{}", upper(&sections.join("__")), upper(key)))
        }
        _ => {
            super::suggest::closest(&upper(&segments.join("__")), known.iter().map(String::as_str)).map(str::to_string)
        }
    };
    let close = close.or_else(|| {
        let tail = format!("__{}", upper(last));
        known.into_iter().find(|v| v.ends_with(&tail) || *v == upper(last))
    });
    close.map(|v| format!("; did you mean `{PREFIX}{v}`?")).unwrap_or_default()
}

/// The name after `FORKD_` of every key's variable (`RATE_LIMIT__MAX`), sorted by key path.
fn variables(table: &Table, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in table {
        let name = format!("{prefix}{}", key.to_ascii_uppercase());
        match value {
            Value::Table(inner) => variables(inner, &format!("{name}__"), out),
            _ => out.push(name),
        }
    }
}

/// Sets `value` at `segments`, creating sections the file lacks. A section the file has set to
/// a non-table is left alone (the key check reports it); returns whether the value was set.
fn insert(table: &mut Table, segments: &[String], value: Value) -> bool {
    let Some((last, sections)) = segments.split_last() else {
        return false;
    };
    let mut table = table;
    for section in sections {
        let entry = table.entry(section.clone()).or_insert_with(|| Value::Table(Table::new()));
        match entry.as_table_mut() {
            Some(inner) => table = inner,
            None => return false,
        }
    }
    table.insert(last.clone(), value);
    true
}

/// `text` as a value of the same type as `default`, or `None` if it does not parse as one.
fn coerce(default: &Value, text: &str) -> Option<Value> {
    let trimmed = text.trim();
    match default {
        Value::String(_) => Some(Value::String(text.to_string())),
        Value::Integer(_) => trimmed.parse().ok().map(Value::Integer),
        Value::Float(_) => trimmed.parse().ok().map(Value::Float),
        Value::Boolean(_) => match trimmed.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Some(Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Some(Value::Boolean(false)),
            _ => None,
        },
        Value::Array(_) => list(trimmed).map(Value::Array),
        Value::Datetime(_) | Value::Table(_) => None,
    }
}

/// A list of strings: a TOML array literal (`["a", "b"]`) or comma-separated (`a, b`).
fn list(text: &str) -> Option<Vec<Value>> {
    if text.starts_with('[') {
        let mut table: Table = format!("v = {text}").parse().ok()?;
        let items = table.remove("v")?.try_into::<Vec<String>>().ok()?;
        return Some(items.into_iter().map(Value::String).collect());
    }
    let items = text.split(',').map(str::trim).filter(|s| !s.is_empty());
    Some(items.map(|s| Value::String(s.to_string())).collect())
}

/// What a variable for a key of this type accepts.
fn hint(default: &Value) -> &'static str {
    match default {
        Value::Boolean(_) => "true or false (or 1/0, yes/no, on/off)",
        Value::Array(_) => "a list: [\"a\", \"b\"] or a,b",
        other => expected(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(env: &[(&str, &str)]) -> (Table, Vec<String>) {
        let defaults = super::super::raw::default_table();
        let env: Vec<_> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (mut table, mut errors) = (Table::new(), Vec::new());
        apply(&mut table, &defaults, &env, &mut errors);
        (table, errors)
    }

    #[test]
    fn coerces_by_the_type_of_the_key() {
        let (t, errors) = run(&[
            ("FORKD_RATE_LIMIT__MAX", " 1000 "),
            ("FORKD_WEBSOCKET__ECHO", "TRUE"),
            ("FORKD_LISTEN", "0.0.0.0:80"),
            ("FORKD_CORS__ORIGINS", "[\"https://a.example\", \"https://b.example\"]"),
            ("FORKD_REDIRECT__ALLOWED_HOSTS", "a.example, b.example,"),
            ("PATH", "/bin"),
        ]);
        assert_eq!(errors, Vec::<String>::new());
        let expected: Table = r#"
            listen = "0.0.0.0:80"
            rate_limit = { max = 1000 }
            websocket = { echo = true }
            cors = { origins = ["https://a.example", "https://b.example"] }
            redirect = { allowed_hosts = ["a.example", "b.example"] }
        "#
        .parse()
        .expect("test literal");
        assert_eq!(t, expected);
    }

    #[test]
    fn empty_list_and_float() {
        assert_eq!(list(""), Some(vec![]));
        assert_eq!(list("[]"), Some(vec![]));
        assert_eq!(list("[1, 2]"), None);
        assert_eq!(coerce(&Value::Float(0.0), "2.5"), Some(Value::Float(2.5)));
        assert_eq!(coerce(&Value::Float(0.0), "x"), None);
    }

    #[test]
    fn reports_bad_names_and_values() {
        let (t, errors) = run(&[
            ("FORKD_CONFIG", "/etc/forkd.toml"),
            ("FORKD_RATE_LIMIT__FOO", "1"),
            ("FORKD_RATE_LIMIT__MAX", "lots"),
            ("FORKD_LIMITS", "1"),
            ("FORKD_CSP_REPORT_ONLY", "maybe"),
            ("FORKD_CORS__ORIGINS", "[\"a\""),
        ]);
        assert!(t.is_empty());
        assert_eq!(
            errors,
            [
                "unknown key foo in section [rate_limit] (from FORKD_RATE_LIMIT__FOO)",
                "FORKD_RATE_LIMIT__MAX=\"lots\": rate_limit.max must be an integer",
                "limits is a section, not a key (from FORKD_LIMITS)",
                "FORKD_CSP_REPORT_ONLY=\"maybe\": csp_report_only must be true or false \
                 (or 1/0, yes/no, on/off)",
                "FORKD_CORS__ORIGINS=\"[\\\"a\\\"\": cors.origins must be a list: [\"a\", \"b\"] or a,b",
            ]
        );
    }
}
