//! `forkd print-config`: a configuration written back as TOML that forkd reads again. Every key
//! appears in the order `raw.rs` declares it, under its section, after its doc comment as `#`
//! lines; a value set by a `FORKD_*` variable says so. An optional key that is not set (a path
//! or URL whose default `""` means "none") is written commented out with an example value.
//! `forkd.example.toml` at the top of the repository is exactly this rendering of the defaults
//! (a test keeps the two equal).
//!
//! The signing secret is never written: a set `auth.jwt_secret` becomes a comment saying that
//! it is set, so the output is safe to paste and still parses (without the secret).
//!
//! This file must not read files or the environment; it renders values already validated.

use std::fmt::Write;

use toml::{Table, Value};

use super::env::Sources;
use super::raw::{Doc, Documented, RawConfig};

/// Keys whose value is never printed (dotted paths).
const SECRETS: &[&str] = &["auth.jwt_secret"];
/// URL keys printed without the password they may hold (dotted paths).
const URLS: &[&str] = &["cluster.database_url", "cluster.redis_url"];

/// Where the printed configuration came from, for its header.
pub(super) struct Origin<'a> {
    /// The config file, if one was read.
    pub file: Option<&'a std::path::Path>,
    /// Where each key set by a variable came from (dotted path → variable name).
    pub sources: &'a Sources,
}

/// The header of the rendering of the defaults: the text `forkd.example.toml` starts with.
const DEFAULTS_HEADER: &str = "\
# forkd configuration: every key with its default value and what it does.
# (This is what `forkd print-config` prints with no config file and no FORKD_* variables.)
#
# Copy it to /etc/forkd/forkd.toml (or pass --config FILE) and change what you need; a key
# left out keeps its default. Every key can also be set from the environment: FORKD_ + the
# key path in upper case, sections joined by __ (FORKD_LISTEN=0.0.0.0:8080,
# FORKD_RATE_LIMIT__MAX=1000); a variable wins over the file. `forkd check-config` validates
# a file, `forkd print-config --config FILE` shows what forkd makes of it.
# Optional keys that are not set are shown commented out, with an example value.
";

/// `raw` as commented TOML, with a header naming `origin`.
pub(super) fn render(raw: &RawConfig, declared: Option<&Value>, origin: &Origin<'_>) -> String {
    let table = match Value::try_from(raw) {
        Ok(Value::Table(table)) => table,
        _ => Table::new(), // unreachable: plain structs of scalars always serialize
    };
    let mut out = header(origin);
    // Top-level keys first: TOML puts every key after a [section] header into that section.
    out.push('\n');
    for doc in RawConfig::DOCS.iter().filter(|d| d.fields.is_empty()) {
        key(&mut out, doc, table.get(doc.name), doc.name, origin.sources);
    }
    for doc in RawConfig::DOCS.iter().filter(|d| !d.fields.is_empty()) {
        section(&mut out, doc, table.get(doc.name).and_then(Value::as_table), doc.name, origin.sources);
    }
    resources(&mut out, declared);
    out
}

/// The section `doc` at dotted `path` with its `values`: its plain keys, then each of its own
/// sections as `[path.name]` (TOML puts every key after a header into that header's table).
fn section(out: &mut String, doc: &Doc, values: Option<&Table>, path: &str, sources: &Sources) {
    out.push('\n');
    comment(out, doc.doc);
    let _ = writeln!(out, "[{path}]");
    for field in doc.fields.iter().filter(|f| f.fields.is_empty()) {
        let dotted = format!("{path}.{}", field.name);
        key(out, field, values.and_then(|t| t.get(field.name)), &dotted, sources);
    }
    for field in doc.fields.iter().filter(|f| !f.fields.is_empty()) {
        let dotted = format!("{path}.{}", field.name);
        section(out, field, values.and_then(|t| t.get(field.name)).and_then(Value::as_table), &dotted, sources);
    }
}

/// The declared resources as written (normalised by the TOML writer), or, when there are
/// none, the commented example of one.
fn resources(out: &mut String, declared: Option<&Value>) {
    out.push('\n');
    let mut table = Table::new();
    match declared {
        Some(list @ Value::Array(items)) if !items.is_empty() => {
            out.push_str(RESOURCES_DOC);
            table.insert("resources".into(), list.clone());
            out.push_str(&toml::to_string(&table).unwrap_or_default());
        }
        _ => {
            out.push_str(RESOURCES_DOC);
            for line in RESOURCES_EXAMPLE.lines() {
                let _ = writeln!(out, "# {line}");
            }
        }
    }
}

/// The comment above `[[resources]]`.
const RESOURCES_DOC: &str = "\
# [[resources]]: collections you declare; each is served under /api/v1/<name> with lists
# (filter, sort, search, pages), ETags, access rules and change events, on SQLite or
# PostgreSQL. The built-in `posts` (under /users/{id}/posts) is one; declaring `posts` here
# replaces it. `forkd migrate` shows the schema changes a new declaration needs.
";

/// A commented example declaration (what `forkd.example.toml` shows).
const RESOURCES_EXAMPLE: &str = r#"[[resources]]
name = "articles"        # ^[a-z][a-z0-9_]{0,39}$, a plural noun
parent = ""              # "" = top level; "users" or another resource = nested
read = "public"          # public | signed_in | owner | admin
create = "signed_in"     # signed_in | owner (of the parent record) | admin
update = "owner"         # owner | admin (an admin always may)
delete = "owner"         # owner | admin
events = true            # push changes on /api/events
default_sort = "-createdAt"   # a list's order without ?sort= (default "id")

[resources.fields.title]
type = "string"          # string text integer number boolean enum datetime email url ref
required = true
min = 1
max = 200
sort = true
search = true

[resources.fields.status]
type = "enum"
values = ["draft", "published", "archived"]
default = "draft"
filter = true
transitions = { draft = ["published"], published = ["archived"] }"#;

fn header(origin: &Origin<'_>) -> String {
    if origin.file.is_none() && origin.sources.is_empty() {
        return DEFAULTS_HEADER.to_string();
    }
    let file = match origin.file {
        Some(path) => format!("file {}", path.display().to_string().escape_debug()),
        None => "no config file".to_string(),
    };
    let mut vars: Vec<String> = origin.sources.values().map(|v| v.escape_debug().to_string()).collect();
    vars.sort();
    let vars = match vars.len() {
        0 => "no FORKD_* variables".to_string(),
        _ => format!("FORKD_* variables: {}", vars.join(", ")),
    };
    format!(
        "# forkd configuration in effect (`forkd print-config`): {file}, {vars}, built-in defaults\n\
         # for the rest. forkd reads this file back as it is; the signing secret is never printed.\n"
    )
}

/// One key: its doc comment, then `name = value`, commented out when it is an unset optional
/// key or a secret.
fn key(out: &mut String, doc: &Doc, value: Option<&Value>, path: &str, sources: &Sources) {
    comment(out, doc.doc);
    let from = sources.get(path).map(|var| format!("from {}", var.escape_debug()));
    let set = value.is_some_and(|v| v.as_str() != Some(""));
    if SECRETS.contains(&path) && set {
        let from = from.map(|f| format!(", {f}")).unwrap_or_default();
        let _ = writeln!(out, "# {} = (set{from}; not shown)", doc.name);
        return;
    }
    if let (true, Some(url)) = (URLS.contains(&path), value.and_then(Value::as_str)) {
        let shown = super::cluster::without_password(url);
        if shown != url {
            let from = from.map(|f| format!(", {f}")).unwrap_or_default();
            let _ = writeln!(out, "{} = {}  # password not shown{from}", doc.name, Value::from(shown));
            return;
        }
    }
    if let (Some(example), false) = (doc.example, set) {
        let _ = writeln!(out, "# {} = {}", doc.name, Value::from(example));
        return;
    }
    let value = value.map(ToString::to_string).unwrap_or_default();
    let _ = match from {
        Some(from) => writeln!(out, "{} = {value}  # {from}", doc.name),
        None => writeln!(out, "{} = {value}", doc.name),
    };
}

/// A doc comment as `#` lines.
fn comment(out: &mut String, doc: &str) {
    for line in doc.lines() {
        let _ = writeln!(out, "# {}", line.trim());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn defaults() -> String {
        render(&RawConfig::default(), None, &Origin { file: None, sources: &Sources::new() })
    }

    #[test]
    fn the_example_file_is_the_rendering_of_the_defaults() {
        let example = include_str!("../../forkd.example.toml");
        assert!(
            example == defaults(),
            "forkd.example.toml is out of date: regenerate it with\n  \
             env -u FORKD_CONFIG cargo run -q -- print-config > forkd.example.toml\n\
             (no FORKD_* variables set)"
        );
    }

    #[test]
    fn the_example_file_parses_to_the_defaults() {
        let example = include_str!("../../forkd.example.toml");
        let raw: RawConfig = toml::from_str(example).expect("the example parses");
        assert_eq!(raw, RawConfig::default());
        assert_eq!(super::super::from_toml("forkd.example.toml", example, &[]), Ok(super::super::Config::default()));
    }

    #[test]
    fn every_key_is_documented_and_printed() {
        let text = defaults();
        let table: Table = text.parse().expect("parses");
        let mut defaults = super::super::raw::default_table();
        // Unset optional keys are commented out: they keep their default "" when read back.
        for doc in RawConfig::DOCS {
            assert!(!doc.doc.trim().is_empty(), "{} has no doc", doc.name);
            if doc.fields.is_empty() && doc.example.is_some() {
                assert_eq!(defaults.remove(doc.name), Some(Value::from("")), "{}", doc.name);
                assert!(text.contains(&format!("# {} = ", doc.name)), "{} missing from\n{text}", doc.name);
            }
            let section = defaults.get_mut(doc.name).and_then(Value::as_table_mut);
            if let Some(section) = section {
                unset_examples(doc, section, &text);
            }
        }
        assert_eq!(table, defaults);
    }

    /// Remove from `section` (the defaults of `doc`) the optional keys printed commented out,
    /// checking each is documented and printed; into its own sections too.
    fn unset_examples(doc: &Doc, section: &mut Table, text: &str) {
        for field in doc.fields {
            assert!(!field.doc.trim().is_empty(), "{}.{} has no doc", doc.name, field.name);
            if field.example.is_some() {
                assert_eq!(section.remove(field.name), Some(Value::from("")), "{}.{}", doc.name, field.name);
                let line = format!("# {} = ", field.name);
                assert!(text.contains(&line), "{} missing from\n{text}", field.name);
            }
            if let Some(inner) = section.get_mut(field.name).and_then(Value::as_table_mut) {
                unset_examples(field, inner, text);
            }
        }
    }

    #[test]
    fn a_set_value_reads_back_and_says_where_it_came_from() {
        let raw: RawConfig = toml::from_str(
            "workers = 3\n[cors]\norigins = [\"https://a.example\"]\n[upstreams]\nusers = \"http://u:1\"\n\
             [chat]\nmodel = \"a \\\"quoted\\\" name\\nwith a line break\"\n",
        )
        .expect("parses");
        let sources = Sources::from([("workers".to_string(), "FORKD_WORKERS".to_string())]);
        let text = render(
            &raw,
            None,
            &Origin { file: Some(std::path::Path::new("/etc/forkd/forkd.toml")), sources: &sources },
        );
        assert!(text.starts_with("# forkd configuration in effect"), "{text}");
        assert!(text.contains("file /etc/forkd/forkd.toml, FORKD_* variables: FORKD_WORKERS,"), "{text}");
        assert!(text.contains("\nworkers = 3  # from FORKD_WORKERS\n"), "{text}");
        assert!(text.contains("\nusers = \"http://u:1\"\n"), "{text}");
        assert!(text.contains("\n# orders = \"http://orders.internal:9000\"\n"), "{text}");
        let back: RawConfig = toml::from_str(&text).expect("reads back");
        assert_eq!(back, raw);
    }

    #[test]
    fn the_secret_is_never_printed() {
        let mut raw = RawConfig::default();
        raw.auth.jwt_secret = SECRET.to_string();
        let text = render(&raw, None, &Origin { file: None, sources: &Sources::new() });
        assert!(!text.contains(SECRET), "{text}");
        assert!(text.contains("\n# jwt_secret = (set; not shown)\n"), "{text}");
        let sources = Sources::from([("auth.jwt_secret".to_string(), "FORKD_AUTH__JWT_SECRET".to_string())]);
        let text = render(&raw, None, &Origin { file: None, sources: &sources });
        assert!(!text.contains(SECRET), "{text}");
        assert!(text.contains("\n# jwt_secret = (set, from FORKD_AUTH__JWT_SECRET; not shown)\n"), "{text}");
        let back: RawConfig = toml::from_str(&text).expect("still parses");
        assert_eq!(back.auth.jwt_secret, "", "read back without the secret");
    }

    #[test]
    fn a_database_password_is_never_printed() {
        let mut raw = RawConfig::default();
        raw.cluster.database_url = "postgres://forkd:s3cret@db:5432/forkd".to_string();
        let text = render(&raw, None, &Origin { file: None, sources: &Sources::new() });
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("\ndatabase_url = \"postgres://forkd@db:5432/forkd\"  # password not shown\n"), "{text}");
        let back: RawConfig = toml::from_str(&text).expect("still parses");
        assert_eq!(back.cluster.database_url, "postgres://forkd@db:5432/forkd", "read back without the password");
        raw.cluster.database_url = "postgres://forkd@db:5432/forkd".to_string();
        let text = render(&raw, None, &Origin { file: None, sources: &Sources::new() });
        assert!(text.contains("\ndatabase_url = \"postgres://forkd@db:5432/forkd\"\n"), "{text}");
    }
}
