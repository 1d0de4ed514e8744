//! The files `/static/{name}` serves, each under a name that carries a hash
//! of its content (`app.3f2a9c1b.js`).
//!
//! The files are embedded at compile time from the repository's `static/`
//! folder; nothing touches the file system at run time. Their names are
//! computed once per process, on first use (SHA-256 of the bytes, the first
//! 4 bytes in hex), so a changed file gets a new name and may be cached for a
//! year (`immutable`): a browser never holds a stale copy under a current
//! name, and an old name is simply 404. The page refers to a file by its
//! plain name (`/static/app.js`); [`url`] gives the hashed one.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// An embedded file as the repository holds it.
struct Source {
    /// Its plain name in `static/` (what the page's template refers to).
    plain: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const SOURCES: &[Source] = &[
    Source {
        plain: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../static/app.js"),
    },
    Source {
        plain: "records.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../static/records.js"),
    },
    Source {
        plain: "app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../static/app.css"),
    },
    Source {
        plain: "docs.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../static/docs.css"),
    },
    Source { plain: "favicon.ico", content_type: "image/x-icon", bytes: include_bytes!("../../../static/favicon.ico") },
];

/// An embedded file under its hashed name.
#[derive(Debug)]
pub struct Asset {
    /// Its plain name in `static/` (`app.js`).
    pub plain: &'static str,
    /// Its name under `/static/` (`app.3f2a9c1b.js`).
    pub name: String,
    /// `/static/` + [`Asset::name`].
    pub url: String,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
}

/// `stem.<8 hex digits of SHA-256(bytes)>.ext` for `plain` = `stem.ext`
/// (the hash goes before the last extension; a name without one gets it last).
pub fn hashed_name(plain: &str, bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    match plain.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => format!("{stem}.{hex}.{ext}"),
        _ => format!("{plain}.{hex}"),
    }
}

/// Every file `/static/{name}` serves (built on first use, then shared).
pub fn all() -> &'static [Asset] {
    static ALL: OnceLock<Vec<Asset>> = OnceLock::new();
    ALL.get_or_init(|| {
        SOURCES
            .iter()
            .map(|s| {
                let name = hashed_name(s.plain, s.bytes);
                Asset {
                    plain: s.plain,
                    url: format!("/static/{name}"),
                    name,
                    content_type: s.content_type,
                    bytes: s.bytes,
                }
            })
            .collect()
    })
}

/// The file served as `/static/{name}` (its hashed name, exactly), if any.
pub fn by_name(name: &str) -> Option<&'static Asset> {
    all().iter().find(|a| a.name == name)
}

/// The embedded file whose plain name is `plain` (`app.js`), if any.
pub fn by_plain(plain: &str) -> Option<&'static Asset> {
    all().iter().find(|a| a.plain == plain)
}

/// The URL (`/static/app.3f2a9c1b.js`) of the file called `plain` in `static/`.
pub fn url(plain: &str) -> Option<&'static str> {
    by_plain(plain).map(|a| a.url.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_content_hash() {
        // SHA-256("") = e3b0c442…, SHA-256("abc") = ba7816bf…
        assert_eq!(hashed_name("app.js", b""), "app.e3b0c442.js");
        assert_eq!(hashed_name("app.css", b"abc"), "app.ba7816bf.css");
        assert_eq!(hashed_name("app.min.js", b"abc"), "app.min.ba7816bf.js");
        assert_eq!(hashed_name("LICENSE", b"abc"), "LICENSE.ba7816bf");
        assert_eq!(hashed_name(".hidden", b"abc"), ".hidden.ba7816bf");
        // One changed byte, a new name; the same bytes, the same name.
        assert_ne!(hashed_name("app.js", b"let a = 1;"), hashed_name("app.js", b"let a = 2;"));
        assert_eq!(hashed_name("app.js", b"let a = 1;"), hashed_name("app.js", b"let a = 1;"));
    }

    #[test]
    fn every_source_is_served_under_its_hashed_name_only() {
        assert_eq!(all().len(), SOURCES.len());
        for (a, s) in all().iter().zip(SOURCES) {
            assert_eq!(a.name, hashed_name(s.plain, s.bytes));
            assert_eq!(a.url, format!("/static/{}", a.name));
            assert!(std::ptr::eq(by_name(&a.name).expect("served"), a));
            assert!(by_name(a.plain).is_none(), "{} is served only under its hashed name", a.plain);
            assert_eq!(url(a.plain), Some(a.url.as_str()));
            assert!(!a.bytes.is_empty());
            assert!(a.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')), "{}", a.name);
            assert!(!a.name.starts_with('.'));
        }
        assert!(std::ptr::eq(all(), all()), "computed once");
        let js = by_plain("app.js").expect("app.js");
        assert_eq!(js.content_type, "text/javascript; charset=utf-8");
        assert_eq!(by_plain("app.css").map(|a| a.content_type), Some("text/css; charset=utf-8"));
        // A well-formed name with another hash is not served.
        let stale = js.name.replace(&js.name[4..12], "00000000");
        assert_ne!(stale, js.name);
        assert!(by_name(&stale).is_none());
    }
}
