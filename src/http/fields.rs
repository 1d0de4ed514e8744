//! A request's header fields as the handlers see them ([`Fields`], `Request::headers`):
//! lookup by name and iteration in the order received, whichever codec decoded them.
//!
//! The storage is the field lines a codec filled: HTTP/1.1's parsed lines as they sit in the
//! connection's buffer, or the array the exchange engine fills from an HTTP/2 or HTTP/3 field
//! section (with `:authority` as `host`). A view never copies or allocates. This file owns
//! lookup and iteration only: it does not validate fields (each codec does) and knows no
//! protocol's framing.

/// One request's fields, borrowed from where the codec keeps them.
#[derive(Clone, Copy)]
pub struct Fields<'a>(&'a [httparse::Header<'a>]);

impl<'a> Fields<'a> {
    /// No field.
    pub const EMPTY: Fields<'static> = Fields(&[]);

    /// The field lines a codec parsed or filled, in the order received.
    pub fn new(lines: &'a [httparse::Header<'a>]) -> Fields<'a> {
        Fields(lines)
    }

    /// The first value of field `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.0.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
    }

    /// Every value of field `name` (case-insensitive), in the order received.
    pub fn get_all<'n>(&self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        self.0.iter().filter(move |h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
    }

    /// Every field as `(name, value)`, in the order received (names as sent).
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + use<'a> {
        self.0.iter().map(|h| (h.name, h.value))
    }

    /// How many field lines there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// There is no field.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_is_case_insensitive_and_keeps_the_order() {
        let lines = [
            httparse::Header { name: "Cookie", value: b"a=1" },
            httparse::Header { name: "host", value: b"example.test" },
            httparse::Header { name: "cookie", value: b"b=2" },
        ];
        let f = Fields::new(&lines);
        assert_eq!(f.get("COOKIE"), Some(&b"a=1"[..]));
        assert_eq!(f.get_all("cookie").collect::<Vec<_>>(), [&b"a=1"[..], &b"b=2"[..]]);
        assert_eq!(f.get("origin"), None);
        assert_eq!(f.iter().map(|(n, _)| n).collect::<Vec<_>>(), ["Cookie", "host", "cookie"]);
        assert_eq!((f.len(), Fields::EMPTY.is_empty()), (3, true));
    }
}
