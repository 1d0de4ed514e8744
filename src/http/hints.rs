//! 103 Early Hints (RFC 8297): `Link` fields a client may act on before the
//! final response, rendered once.
//!
//! A route that knows which files its answer will need (the front page's
//! script and style) attaches an [`EarlyHints`] to its [`super::response::Response`].
//! The response writers, not the handler, put them on the wire: over HTTP/2
//! and HTTP/3 a `103` with the `Link` fields goes out right before the final
//! response; on every protocol the final response carries the same fields
//! (a client that ignores interim responses still learns them). HTTP/1.1
//! gets no `103`: clients there that take the first status line for the
//! answer (Python's `http.client`, so `requests`) would read the 103 as the
//! whole response, and browsers act on a 103 only over HTTP/2 and later.
//!
//! Everything here is built once (at start, from static data); writing a
//! hint is copying bytes. Nothing here may hold a value a client sent: a
//! field value is never checked again when it is written.

/// The `Link` fields of one kind of response, and their HTTP/1.1 form.
#[derive(Debug)]
pub struct EarlyHints {
    links: Vec<String>,
    fields: Vec<u8>,
}

/// A hint that cannot be written as a header field value.
#[derive(Debug, PartialEq, Eq)]
pub struct BadLink(pub String);

impl std::fmt::Display for BadLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a valid Link field value: {:?}", self.0)
    }
}

impl std::error::Error for BadLink {}

impl EarlyHints {
    /// `Link: <url>; rel=preload; as=<destination>` for each `(url, destination)`.
    /// `url` must be a path (`/…`) of visible ASCII without `<`, `>` or a space,
    /// `destination` a token such as `script` or `style`.
    pub fn preload(items: &[(&str, &str)]) -> Result<EarlyHints, BadLink> {
        let mut links = Vec::with_capacity(items.len());
        for (url, dest) in items {
            let url_ok = url.starts_with('/') && url.bytes().all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>');
            let dest_ok = !dest.is_empty() && dest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !url_ok || !dest_ok {
                return Err(BadLink(format!("<{url}>; as={dest}")));
            }
            links.push(format!("<{url}>; rel=preload; as={dest}"));
        }
        Ok(EarlyHints::new(links))
    }

    fn new(links: Vec<String>) -> EarlyHints {
        let mut fields = Vec::new();
        for l in &links {
            fields.extend_from_slice(b"Link: ");
            fields.extend_from_slice(l.as_bytes());
            fields.extend_from_slice(b"\r\n");
        }
        EarlyHints { links, fields }
    }

    /// The `Link` field values, in order.
    pub fn links(&self) -> &[String] {
        &self.links
    }

    /// `Link: …\r\n` for each hint: the lines the final response carries.
    pub fn fields(&self) -> &[u8] {
        &self.fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_link_values_and_the_final_fields() {
        let h = EarlyHints::preload(&[("/static/app.1.js", "script"), ("/static/app.2.css", "style")]).expect("valid");
        assert_eq!(
            h.links(),
            ["</static/app.1.js>; rel=preload; as=script", "</static/app.2.css>; rel=preload; as=style"]
        );
        let fields =
            "Link: </static/app.1.js>; rel=preload; as=script\r\nLink: </static/app.2.css>; rel=preload; as=style\r\n";
        assert_eq!(std::str::from_utf8(h.fields()), Ok(fields));
    }

    #[test]
    fn refuses_what_would_break_the_field() {
        for (url, dest) in [
            ("/a\r\nSet-Cookie: x=1", "script"),
            ("/a b", "script"),
            ("/a>; rel=x", "script"),
            ("https://elsewhere/a.js", "script"),
            ("", "script"),
            ("/a.js", ""),
            ("/a.js", "script; x"),
            ("/é.js", "script"),
        ] {
            assert!(EarlyHints::preload(&[(url, dest)]).is_err(), "{url:?} {dest:?}");
        }
    }
}
