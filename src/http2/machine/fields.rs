//! A request head as the HPACK decoder hands it over: the fields of one header block, kept in
//! one buffer the connection reuses, with the RFC 9113 §8.2 and §8.3 checks that make a
//! request malformed (a stream error of type `PROTOCOL_ERROR`).
//!
//! This file owns the field list and the framing-level checks only; what the server refuses
//! on top (a header list over its limit, a `Host` that disagrees with `:authority`, schemes)
//! is `super::super::request`'s.

/// Fields that are connection-specific in HTTP/1.1 and malformed in HTTP/2 (RFC 9113 §8.2.2).
const CONNECTION_SPECIFIC: [&[u8]; 5] =
    [b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"];

/// A range of [`Fields`]' buffer.
type Span = (u32, u32);

/// One request's header block, decoded. Pseudo-fields are kept apart from the regular
/// fields; [`Fields::malformed`] says why the head breaks RFC 9113, if it does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fields {
    buf: Vec<u8>,
    /// Regular fields: name and value spans, in the order received.
    list: Vec<(Span, Span)>,
    method: Option<Span>,
    scheme: Option<Span>,
    authority: Option<Span>,
    path: Option<Span>,
    protocol: Option<Span>,
    /// The RFC 9113 §6.5.2 size of the list: name + value + 32 per field.
    size: usize,
    /// The first rule broken while fields were added.
    broken: Option<&'static str>,
}

impl Fields {
    /// Empties the list, keeping its memory.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.list.clear();
        (self.method, self.scheme, self.authority, self.path, self.protocol) = (None, None, None, None, None);
        self.size = 0;
        self.broken = None;
    }

    /// Adds one decoded field, in block order.
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        self.size += name.len() + value.len() + 32;
        if value.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') {
            self.broke("a field value with NUL, CR or LF");
        }
        let span = self.keep(value);
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !self.list.is_empty() {
                self.broke("a pseudo-field after a regular field");
            }
            let slot = match pseudo {
                b"method" => &mut self.method,
                b"scheme" => &mut self.scheme,
                b"authority" => &mut self.authority,
                b"path" => &mut self.path,
                b"protocol" => &mut self.protocol,
                _ => return self.broke("an unknown pseudo-field"),
            };
            if slot.replace(span).is_some() {
                self.broke("a repeated pseudo-field");
            }
            return;
        }
        if name.is_empty() || !name.iter().all(|&b| is_token(b) && !b.is_ascii_uppercase()) {
            self.broke("a field name that is empty, uppercase or not a token");
        }
        if CONNECTION_SPECIFIC.contains(&name) || (name == b"te" && value != b"trailers") {
            self.broke("a connection-specific field");
        }
        let name = self.keep(name);
        self.list.push((name, span));
    }

    /// Why the head is malformed (RFC 9113 §8.3.1), checked once all fields are in:
    /// `:method` always; `:scheme` and a non-empty `:path` unless a plain CONNECT, which
    /// instead needs `:authority` and neither of them; `:protocol` only on CONNECT.
    pub fn malformed(&self) -> Option<&'static str> {
        if self.broken.is_some() {
            return self.broken;
        }
        let Some(method) = self.method() else { return Some("no :method") };
        let connect = method == b"CONNECT";
        if connect && self.protocol.is_none() {
            if self.scheme.is_some() || self.path.is_some() {
                return Some("a CONNECT with :scheme or :path");
            }
            return self.authority.is_none().then_some("a CONNECT without :authority");
        }
        if self.protocol.is_some() && !connect {
            return Some(":protocol without CONNECT");
        }
        if self.scheme.is_none() || self.path().is_none_or(<[u8]>::is_empty) {
            return Some("no :scheme or :path");
        }
        None
    }

    /// `:method`.
    pub fn method(&self) -> Option<&[u8]> {
        self.get(self.method)
    }

    /// `:scheme`.
    pub fn scheme(&self) -> Option<&[u8]> {
        self.get(self.scheme)
    }

    /// `:authority`.
    pub fn authority(&self) -> Option<&[u8]> {
        self.get(self.authority)
    }

    /// `:path`, with the query.
    pub fn path(&self) -> Option<&[u8]> {
        self.get(self.path)
    }

    /// `:protocol` (RFC 8441).
    pub fn protocol(&self) -> Option<&[u8]> {
        self.get(self.protocol)
    }

    /// The regular fields in the order received, names lowercase.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.list.iter().map(|&(n, v)| (self.span(n), self.span(v)))
    }

    /// The number of regular fields.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// No regular field.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The header list's size as RFC 9113 §6.5.2 counts it, pseudo-fields included.
    pub fn list_size(&self) -> usize {
        self.size
    }

    fn broke(&mut self, why: &'static str) {
        self.broken.get_or_insert(why);
    }

    fn keep(&mut self, bytes: &[u8]) -> Span {
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(bytes);
        (start, self.buf.len() as u32)
    }

    fn span(&self, (start, end): Span) -> &[u8] {
        &self.buf[start as usize..end as usize]
    }

    fn get(&self, span: Option<Span>) -> Option<&[u8]> {
        span.map(|s| self.span(s))
    }
}

/// A `tchar` of RFC 9110 §5.6.2.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(fields: &[(&str, &str)]) -> Fields {
        let mut f = Fields::default();
        for (n, v) in fields {
            f.push(n.as_bytes(), v.as_bytes());
        }
        f
    }

    const GET: [(&str, &str); 4] = [(":method", "GET"), (":scheme", "https"), (":authority", "a.test"), (":path", "/")];

    #[test]
    fn a_plain_request_keeps_its_pseudo_fields_apart() {
        let mut fields = GET.to_vec();
        fields.extend([("accept", "*/*"), ("cookie", "a=1"), ("cookie", "b=2")]);
        let f = head(&fields);
        assert_eq!(f.malformed(), None);
        assert_eq!((f.method(), f.scheme(), f.path()), (Some(&b"GET"[..]), Some(&b"https"[..]), Some(&b"/"[..])));
        assert_eq!(f.authority(), Some(&b"a.test"[..]));
        let list: Vec<_> = f.iter().collect();
        assert_eq!(list, [(&b"accept"[..], &b"*/*"[..]), (b"cookie", b"a=1"), (b"cookie", b"b=2")]);
        let size: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
        assert_eq!(f.list_size(), size);
    }

    #[test]
    fn connect_forms() {
        let plain = head(&[(":method", "CONNECT"), (":authority", "a.test:443")]);
        assert_eq!(plain.malformed(), None);
        let extended =
            head(&[(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/ws")]);
        assert_eq!(extended.malformed(), None);
        assert_eq!(extended.protocol(), Some(&b"websocket"[..]));
        assert!(head(&[(":method", "CONNECT")]).malformed().is_some());
        assert!(head(&[(":method", "CONNECT"), (":authority", "a"), (":path", "/")]).malformed().is_some());
    }

    #[test]
    fn malformed_heads_say_why() {
        let cases: [(&str, Vec<(&str, &str)>); 10] = [
            ("no :method", vec![(":scheme", "https"), (":path", "/")]),
            ("no :path", vec![(":method", "GET"), (":scheme", "https")]),
            ("empty :path", vec![(":method", "GET"), (":scheme", "https"), (":path", "")]),
            ("unknown pseudo", [GET.to_vec(), vec![(":status", "200")]].concat()),
            ("pseudo after regular", vec![(":method", "GET"), ("a", "b"), (":scheme", "https"), (":path", "/")]),
            ("repeated pseudo", [GET.to_vec(), vec![(":path", "/x")]].concat()),
            ("uppercase name", [GET.to_vec(), vec![("Accept", "x")]].concat()),
            ("connection-specific", [GET.to_vec(), vec![("connection", "close")]].concat()),
            ("te other than trailers", [GET.to_vec(), vec![("te", "gzip")]].concat()),
            ("CR in a value", [GET.to_vec(), vec![("a", "b\r\nc: d")]].concat()),
        ];
        for (what, fields) in cases {
            assert!(head(&fields).malformed().is_some(), "{what}");
        }
        assert_eq!(head(&[GET.to_vec(), vec![("te", "trailers")]].concat()).malformed(), None);
        assert!(head(&[(":method", "GET"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/")])
            .malformed()
            .is_some());
    }

    #[test]
    fn clear_starts_over() {
        let mut f = head(&[("Bad", "x")]);
        f.clear();
        for (n, v) in GET {
            f.push(n.as_bytes(), v.as_bytes());
        }
        assert_eq!(f.malformed(), None);
        assert!(f.is_empty());
    }
}
