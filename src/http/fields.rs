//! The request's header fields as handlers see them, whichever codec decoded them: a view over
//! the codec's own storage (HTTP/1.1's parsed lines, HTTP/2's `HeaderMap`, HTTP/3's decoded
//! field section), never a copy. `:authority` plays the role of `Host`: when a request has one,
//! `host` reads as the authority and any `host` field is not seen.
//!
//! This file owns lookup and iteration only. It does not validate fields (each codec does, before
//! building a view), allocate, or know any protocol's framing.

use http::header::{HeaderMap, HeaderValue};

/// One request's fields, borrowed from where the codec keeps them.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    /// `:authority`, answered as the `host` field.
    authority: Option<&'a str>,
    store: Store<'a>,
    /// Fields seen after the stored ones.
    extra: &'a [(&'a str, &'a [u8])],
}

/// Where the fields are.
#[derive(Clone, Copy)]
enum Store<'a> {
    /// Lines parsed by httparse, names as sent.
    Lines(&'a [httparse::Header<'a>]),
    /// Name and value pairs.
    List(&'a [(&'a str, &'a [u8])]),
    /// An `http` crate map, names lower case, repeated names together.
    Map(&'a HeaderMap),
    /// Names and values packed in `buf`; per field, where its name starts, where its value starts
    /// (where its name ends) and where its value ends. Names are lower-case tokens.
    Packed { buf: &'a [u8], spans: &'a [(u32, u32, u32)] },
}

impl<'a> Fields<'a> {
    /// HTTP/1.1's parsed header lines.
    pub fn lines(headers: &'a [httparse::Header<'a>]) -> Fields<'a> {
        Fields { authority: None, store: Store::Lines(headers), extra: &[] }
    }

    /// A list of `(name, value)` pairs.
    pub fn list(pairs: &'a [(&'a str, &'a [u8])]) -> Fields<'a> {
        Fields { authority: None, store: Store::List(pairs), extra: &[] }
    }

    /// HTTP/2's regular fields and `:authority`.
    pub fn map(authority: Option<&'a str>, map: &'a HeaderMap) -> Fields<'a> {
        Fields { authority, store: Store::Map(map), extra: &[] }
    }

    /// Fields packed in one buffer (HTTP/3's decoded section, pseudo-headers left out) and
    /// `:authority`. A span outside `buf` reads as an empty name and value.
    pub fn packed(authority: Option<&'a str>, buf: &'a [u8], spans: &'a [(u32, u32, u32)]) -> Fields<'a> {
        Fields { authority, store: Store::Packed { buf, spans }, extra: &[] }
    }

    /// The same fields followed by `extra`.
    pub fn with_extra(self, extra: &'a [(&'a str, &'a [u8])]) -> Fields<'a> {
        Fields { extra, ..self }
    }

    /// The first value of field `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        if let Some(authority) = self.authority.filter(|_| name.eq_ignore_ascii_case("host")) {
            return Some(authority.as_bytes());
        }
        match self.store {
            Store::Map(map) => match map.get(name) {
                Some(v) => Some(v.as_bytes()),
                None => self.extra.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v),
            },
            _ => self.get_all(name).next(),
        }
    }

    /// Every value of field `name` (case-insensitive), in the order received.
    pub fn get_all<'n>(&self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        self.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v)
    }

    /// Every field as `(name, value)`: `host` from `:authority` first when there is one.
    pub fn iter(&self) -> Iter<'a> {
        let rest = match self.store {
            Store::Lines(lines) => Rest::Lines(lines.iter()),
            Store::List(pairs) => Rest::List(pairs.iter()),
            Store::Map(map) => Rest::Map(map.iter()),
            Store::Packed { buf, spans } => Rest::Packed { buf, spans: spans.iter() },
        };
        Iter { authority: self.authority, host: self.authority, rest, extra: self.extra.iter() }
    }
}

impl<'a> IntoIterator for &Fields<'a> {
    type Item = (&'a str, &'a [u8]);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The fields of a [`Fields`], in order.
pub struct Iter<'a> {
    /// `:authority`: stored `host` fields are skipped when set.
    authority: Option<&'a str>,
    /// The `host` field still to yield.
    host: Option<&'a str>,
    rest: Rest<'a>,
    extra: std::slice::Iter<'a, (&'a str, &'a [u8])>,
}

enum Rest<'a> {
    Lines(std::slice::Iter<'a, httparse::Header<'a>>),
    List(std::slice::Iter<'a, (&'a str, &'a [u8])>),
    Map(http::header::Iter<'a, HeaderValue>),
    Packed { buf: &'a [u8], spans: std::slice::Iter<'a, (u32, u32, u32)> },
}

impl<'a> Rest<'a> {
    fn next(&mut self) -> Option<(&'a str, &'a [u8])> {
        match self {
            Rest::Lines(lines) => lines.next().map(|h| (h.name, h.value)),
            Rest::List(pairs) => pairs.next().copied(),
            Rest::Map(map) => map.next().map(|(n, v)| (n.as_str(), v.as_bytes())),
            Rest::Packed { buf, spans } => spans.next().map(|&(n, v, e)| {
                let (n, v, e) = (n as usize, v as usize, e as usize);
                let name = buf.get(n..v).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or("");
                (name, buf.get(v..e).unwrap_or(b""))
            }),
        }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a [u8]);

    fn next(&mut self) -> Option<(&'a str, &'a [u8])> {
        if let Some(host) = self.host.take() {
            return Some(("host", host.as_bytes()));
        }
        while let Some((name, value)) = self.rest.next() {
            if self.authority.is_none() || name != "host" {
                return Some((name, value));
            }
        }
        self.extra.next().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all<'a>(f: &Fields<'a>) -> Vec<(&'a str, &'a [u8])> {
        f.iter().collect()
    }

    #[test]
    fn lines_read_as_sent_and_match_names_case_insensitively() {
        let lines = [
            httparse::Header { name: "Host", value: b"a.test" },
            httparse::Header { name: "Cookie", value: b"x=1" },
            httparse::Header { name: "cookie", value: b"y=2" },
        ];
        let f = Fields::lines(&lines);
        assert_eq!(f.get("host"), Some(&b"a.test"[..]));
        assert_eq!(f.get("COOKIE"), Some(&b"x=1"[..]));
        assert_eq!(f.get_all("cookie").collect::<Vec<_>>(), [&b"x=1"[..], b"y=2"]);
        assert_eq!(f.get("origin"), None);
        assert_eq!(all(&f), [("Host", &b"a.test"[..]), ("Cookie", b"x=1"), ("cookie", b"y=2")]);
    }

    #[test]
    fn a_list_reads_like_lines() {
        let pairs: [(&str, &[u8]); 2] = [("Origin", b"https://a"), ("origin", b"https://b")];
        let f = Fields::list(&pairs);
        assert_eq!(f.get("ORIGIN"), Some(&b"https://a"[..]));
        assert_eq!(f.get_all("origin").count(), 2);
        assert_eq!(all(&f), pairs);
    }

    #[test]
    fn a_map_with_an_authority_answers_host_from_it_and_hides_host_fields() {
        let mut map = HeaderMap::new();
        map.append("accept", HeaderValue::from_static("a/b"));
        map.append("cookie", HeaderValue::from_static("x=1"));
        map.append("cookie", HeaderValue::from_static("y=2"));
        map.append("host", HeaderValue::from_static("ignored.test"));
        let f = Fields::map(Some("a.test"), &map);
        assert_eq!(f.get("Host"), Some(&b"a.test"[..]));
        assert_eq!(f.get("Accept"), Some(&b"a/b"[..]));
        assert_eq!(f.get("cookie"), Some(&b"x=1"[..]));
        assert_eq!(f.get("x-missing"), None);
        assert_eq!(f.get("not a name"), None);
        assert_eq!(f.get_all("host").collect::<Vec<_>>(), [&b"a.test"[..]]);
        let seen = all(&f);
        assert_eq!(seen[0], ("host", &b"a.test"[..]));
        assert_eq!(seen.len(), 4);
        assert_eq!(f.get_all("cookie").collect::<Vec<_>>(), [&b"x=1"[..], b"y=2"]);
    }

    #[test]
    fn a_map_without_an_authority_shows_its_host_field() {
        let mut map = HeaderMap::new();
        map.append("host", HeaderValue::from_static("h.test"));
        let f = Fields::map(None, &map);
        assert_eq!(f.get("host"), Some(&b"h.test"[..]));
        assert_eq!(all(&f), [("host", &b"h.test"[..])]);
    }

    #[test]
    fn extra_fields_come_after_the_stored_ones() {
        let map = HeaderMap::new();
        let extra: [(&str, &[u8]); 1] = [("upgrade", b"websocket")];
        let f = Fields::map(Some("a.test"), &map).with_extra(&extra);
        assert_eq!(f.get("Upgrade"), Some(&b"websocket"[..]));
        assert_eq!(all(&f), [("host", &b"a.test"[..]), ("upgrade", b"websocket")]);
    }

    #[test]
    fn packed_fields_read_by_their_spans() {
        let buf = b"hostother.testacceptx/ycookiec=1";
        let spans = [(0, 4, 14), (14, 20, 23), (23, 29, 32)];
        let f = Fields::packed(Some("a.test"), buf, &spans);
        assert_eq!(f.get("host"), Some(&b"a.test"[..]));
        assert_eq!(f.get("ACCEPT"), Some(&b"x/y"[..]));
        assert_eq!(all(&f), [("host", &b"a.test"[..]), ("accept", b"x/y"), ("cookie", b"c=1")]);
        let without = Fields::packed(None, buf, &spans);
        assert_eq!(without.get("host"), Some(&b"other.test"[..]));
    }

    #[test]
    fn a_span_outside_the_buffer_reads_empty() {
        let spans = [(0, 4, 99)];
        let f = Fields::packed(None, b"name", &spans);
        assert_eq!(all(&f), [("name", &b""[..])]);
    }
}
