//! Method + path routing with `{param}` segments.
//!
//! Routes are grouped by path pattern at start, so a path that matches with
//! the wrong method yields 405 with a pre-rendered `Allow` list. `HEAD` is
//! served by a `GET` route. Matching allocates nothing; a path equal to a
//! pattern without parameters (that no earlier pattern can take) is found
//! by comparing whole strings, before any split into segments. Each path pattern
//! has a small index (in the order patterns were first added), which is
//! what `/metrics` labels requests with: the pattern, never the raw path.

use crate::http::request::Method;

/// Up to this many `{param}` segments per route.
pub const MAX_PARAMS: usize = 4;

/// Up to this many segments per route pattern (checked when a route is added).
pub const MAX_SEGS: usize = 16;

/// Captured path parameters (byte ranges into the path).
#[derive(Clone, Copy, Debug, Default)]
pub struct Params<'a> {
    vals: [&'a str; MAX_PARAMS],
    len: usize,
}

impl<'a> Params<'a> {
    /// Parameter `i` (in pattern order).
    pub fn get(&self, i: usize) -> Option<&'a str> {
        if i < self.len {
            Some(self.vals[i])
        } else {
            None
        }
    }
}

enum Seg {
    Lit(&'static str),
    Param,
}

struct Entry<H> {
    pattern: &'static str,
    segs: Vec<Seg>,
    methods: Vec<(Method, H)>,
    allow: &'static str,
}

/// The result of a lookup.
pub enum Match<'r, 'p, H> {
    /// A handler, its parameters, and the pattern's index.
    Found(&'r H, Params<'p>, usize),
    /// The path exists; the method does not. The `Allow` value and the pattern's index.
    MethodNotAllowed(&'static str, usize),
    /// No such path.
    NotFound,
}

/// A route table.
pub struct Router<H> {
    entries: Vec<Entry<H>>,
    /// The patterns without a parameter that no earlier pattern can take a
    /// path from, with their index: such a pattern matches exactly the path
    /// equal to it, so a lookup tries them by comparing whole paths first.
    literals: Vec<(&'static str, usize)>,
    /// Bit `n` set: some pattern in `literals` is `n` bytes long (63: longer).
    literal_lens: u64,
}

impl<H> Default for Router<H> {
    fn default() -> Self {
        Router { entries: Vec::new(), literals: Vec::new(), literal_lens: 0 }
    }
}

/// The bit of [`Router::literal_lens`] for a path of `len` bytes.
fn len_bit(len: usize) -> u64 {
    1 << len.min(63)
}

impl<H> Router<H> {
    /// Add `method pattern` → `handler`; pattern segments `{name}` capture.
    pub fn add(&mut self, method: Method, pattern: &'static str, handler: H) -> &mut Self {
        let segs: Vec<Seg> =
            pattern.split('/').skip(1).map(|s| if s.starts_with('{') { Seg::Param } else { Seg::Lit(s) }).collect();
        assert!(segs.len() <= MAX_SEGS, "route {pattern}: more than {MAX_SEGS} segments");
        let same = |e: &Entry<H>| {
            e.segs.len() == segs.len()
                && e.segs.iter().zip(&segs).all(|(a, b)| match (a, b) {
                    (Seg::Lit(x), Seg::Lit(y)) => x == y,
                    (Seg::Param, Seg::Param) => true,
                    _ => false,
                })
        };
        let idx = match self.entries.iter().position(same) {
            Some(i) => i,
            None => {
                let literal = segs.iter().all(|s| matches!(s, Seg::Lit(_)));
                // An earlier pattern with a parameter and as many segments
                // may match this pattern's path first: then no shortcut.
                let shadowed = self
                    .entries
                    .iter()
                    .any(|e| e.segs.len() == segs.len() && e.segs.iter().any(|s| matches!(s, Seg::Param)));
                if literal && !shadowed {
                    self.literals.push((pattern, self.entries.len()));
                    self.literal_lens |= len_bit(pattern.len());
                }
                self.entries.push(Entry { pattern, segs, methods: Vec::new(), allow: "" });
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[idx];
        entry.methods.push((method, handler));
        let mut names: Vec<&str> = entry.methods.iter().map(|(m, _)| m.as_str()).collect();
        if entry.methods.iter().any(|(m, _)| *m == Method::Get) {
            names.push("HEAD");
        }
        // Leaked once per route at start-up: the Allow value is then a static slice.
        entry.allow = Box::leak(names.join(", ").into_boxed_str());
        self
    }

    /// The path patterns, by index (the first pattern added for each shape).
    pub fn patterns(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.iter().map(|e| e.pattern)
    }

    /// Every route as (method, pattern), in the order the patterns were
    /// first added (`HEAD`, served by each `GET` route, is not listed).
    pub fn routes(&self) -> impl Iterator<Item = (Method, &'static str)> + '_ {
        self.entries.iter().flat_map(|e| e.methods.iter().map(move |(m, _)| (*m, e.pattern)))
    }

    /// Look up `method path`.
    pub fn find<'r, 'p>(&'r self, method: Method, path: &'p str) -> Match<'r, 'p, H> {
        let want = if method == Method::Head { Method::Get } else { method };
        // A path that starts with a slash is its segments joined by slashes,
        // as a pattern is: a pattern without parameters matches it exactly
        // when the two are equal.
        if path.starts_with('/') && self.literal_lens & len_bit(path.len()) != 0 {
            if let Some(&(_, i)) = self.literals.iter().find(|(p, _)| *p == path) {
                let e = &self.entries[i];
                return match e.methods.iter().find(|(m, _)| *m == want) {
                    Some((_, h)) => Match::Found(h, Params::default(), i),
                    None => Match::MethodNotAllowed(e.allow, i),
                };
            }
        }
        self.find_by_segments(want, path)
    }

    /// [`Router::find`] segment by segment, every pattern in order (`want`: `HEAD` as `GET`).
    #[inline(never)]
    fn find_by_segments<'r, 'p>(&'r self, want: Method, path: &'p str) -> Match<'r, 'p, H> {
        // Split the path once: one segment after each slash (what comes
        // before the first slash is not a segment). A path with more
        // segments than any pattern has matches nothing.
        let mut parts: [&'p str; MAX_SEGS] = [""; MAX_SEGS];
        let mut n = 0;
        let mut from = None;
        for (i, b) in path.bytes().enumerate() {
            if b == b'/' {
                if let Some(f) = from {
                    if n == MAX_SEGS {
                        return Match::NotFound;
                    }
                    parts[n] = &path[f..i];
                    n += 1;
                }
                from = Some(i + 1);
            }
        }
        if let Some(f) = from {
            if n == MAX_SEGS {
                return Match::NotFound;
            }
            parts[n] = &path[f..];
            n += 1;
        }
        let parts = &parts[..n];
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| e.segs.len() == n) {
            let mut params = Params::default();
            let ok = e.segs.iter().zip(parts).all(|(seg, &p)| match seg {
                Seg::Lit(l) => *l == p,
                Seg::Param if !p.is_empty() && params.len < MAX_PARAMS => {
                    params.vals[params.len] = p;
                    params.len += 1;
                    true
                }
                Seg::Param => false,
            });
            if !ok {
                continue;
            }
            return match e.methods.iter().find(|(m, _)| *m == want) {
                Some((_, h)) => Match::Found(h, params, i),
                None => Match::MethodNotAllowed(e.allow, i),
            };
        }
        Match::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_params_and_405() {
        let mut r = Router::default();
        r.add(Method::Get, "/health", 1).add(Method::Get, "/users/{id}", 2).add(Method::Delete, "/users/{id}", 3);
        assert!(matches!(r.find(Method::Get, "/health"), Match::Found(1, _, _)));
        assert!(matches!(r.find(Method::Head, "/health"), Match::Found(1, _, _)));
        match r.find(Method::Get, "/users/42") {
            Match::Found(2, p, _) => assert_eq!(p.get(0), Some("42")),
            _ => panic!("no match"),
        }
        assert!(matches!(r.find(Method::Post, "/users/1"), Match::MethodNotAllowed("GET, DELETE, HEAD", _)));
        assert!(matches!(r.find(Method::Get, "/users/"), Match::NotFound));
        assert!(matches!(r.find(Method::Get, "/users/1/x"), Match::NotFound));
        assert!(matches!(r.find(Method::Get, "/nope"), Match::NotFound));
    }

    #[test]
    fn segments_split_once_match_like_a_split_on_slashes() {
        let mut r = Router::default();
        r.add(Method::Get, "/a/{x}/b/{y}", 1).add(Method::Get, "/", 2).add(Method::Get, "/a//c", 3);
        match r.find(Method::Get, "/a/one/b/two") {
            Match::Found(1, p, _) => assert_eq!((p.get(0), p.get(1), p.get(2)), (Some("one"), Some("two"), None)),
            _ => panic!("no match"),
        }
        assert!(matches!(r.find(Method::Get, "/a/one/c/two"), Match::NotFound));
        assert!(matches!(r.find(Method::Get, "/a/one/b/"), Match::NotFound));
        assert!(matches!(r.find(Method::Get, "/"), Match::Found(2, _, _)));
        assert!(matches!(r.find(Method::Get, "/a//c"), Match::Found(3, _, _)));
        assert!(matches!(r.find(Method::Options, "*"), Match::NotFound));
        assert!(matches!(r.find(Method::Get, "/é/ü"), Match::NotFound));
        // More segments than any pattern can hold: no match, no overflow.
        assert!(matches!(r.find(Method::Get, &"/x".repeat(MAX_SEGS + 3)), Match::NotFound));
    }

    #[test]
    fn a_pattern_with_a_parameter_added_first_still_wins() {
        let mut r = Router::default();
        r.add(Method::Get, "/users/{id}", 1).add(Method::Get, "/users/me", 2).add(Method::Get, "/me", 3);
        assert!(matches!(r.find(Method::Get, "/users/me"), Match::Found(1, _, 0)));
        assert!(matches!(r.find(Method::Get, "/me"), Match::Found(3, _, 2)));
        assert!(matches!(r.find(Method::Post, "/me"), Match::MethodNotAllowed("GET, HEAD", 2)));
        let mut r = Router::default();
        r.add(Method::Get, "/users/me", 2).add(Method::Get, "/users/{id}", 1);
        assert!(matches!(r.find(Method::Get, "/users/me"), Match::Found(2, _, 0)));
        assert!(matches!(r.find(Method::Get, "/users/you"), Match::Found(1, _, 1)));
        // The same literal pattern for two methods is one entry.
        r.add(Method::Delete, "/users/me", 3);
        assert!(matches!(r.find(Method::Delete, "/users/me"), Match::Found(3, _, 0)));
        // A long path takes the shortcut too.
        let long = "/a-path-longer-than-sixty-four-bytes/to-take-the-last-length-bit/x";
        r.add(Method::Get, long, 4);
        assert!(matches!(r.find(Method::Get, long), Match::Found(4, _, _)));
        assert!(matches!(r.find(Method::Get, &format!("{long}y")), Match::NotFound));
    }

    #[test]
    fn each_pattern_has_one_index_whatever_the_method() {
        let mut r = Router::default();
        r.add(Method::Get, "/health", 1).add(Method::Get, "/users/{id}", 2).add(Method::Delete, "/users/{id}", 3).add(
            Method::Get,
            "/users/{id}/posts",
            4,
        );
        assert_eq!(r.patterns().collect::<Vec<_>>(), ["/health", "/users/{id}", "/users/{id}/posts"]);
        assert!(matches!(r.find(Method::Get, "/health"), Match::Found(_, _, 0)));
        assert!(matches!(r.find(Method::Get, "/users/7"), Match::Found(_, _, 1)));
        assert!(matches!(r.find(Method::Delete, "/users/8"), Match::Found(_, _, 1)));
        assert!(matches!(r.find(Method::Post, "/users/9"), Match::MethodNotAllowed(_, 1)));
        assert!(matches!(r.find(Method::Get, "/users/9/posts"), Match::Found(_, _, 2)));
        assert_eq!(
            r.routes().collect::<Vec<_>>(),
            [
                (Method::Get, "/health"),
                (Method::Get, "/users/{id}"),
                (Method::Delete, "/users/{id}"),
                (Method::Get, "/users/{id}/posts")
            ]
        );
    }
}
