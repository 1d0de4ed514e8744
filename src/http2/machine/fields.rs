//! A request head as the HPACK decoder hands it over: the fields of one header block, kept in
//! one buffer the connection reuses, with the RFC 9113 §8.2 and §8.3 checks that make a
//! request malformed (a stream error of type `PROTOCOL_ERROR`).
//!
//! A head that outlives the connection's buffer is copied into a [`Text`] buffer
//! ([`Fields::to_text`]): text as one UTF-8 string, validated once, so reading a pseudo-field
//! or a name as `&str` costs no validation after that.
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
/// fields; [`Fields::malformed`] says why the head breaks RFC 9113, if it does. `B` holds
/// the bytes: a `Vec` while fields are pushed, a [`Text`] once copied out.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields<B = Vec<u8>> {
    buf: B,
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
    /// A regular field's value holds a control byte (other than tab) that RFC 9113 allows
    /// and HTTP's field grammar does not (RFC 9110 §5.5).
    controls: bool,
}

/// A copied head's bytes: one UTF-8 string when they are one (a value may hold other
/// bytes, obs-text), else as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// Valid UTF-8: spans read as `&str` without validation.
    Utf8(String),
    /// Not UTF-8: each span is validated when read as `&str`.
    Bytes(Vec<u8>),
}

impl AsRef<[u8]> for Text {
    fn as_ref(&self) -> &[u8] {
        match self {
            Text::Utf8(s) => s.as_bytes(),
            Text::Bytes(b) => b,
        }
    }
}

impl Fields<Text> {
    /// `:method` as text.
    #[inline]
    pub fn method_str(&self) -> Option<&str> {
        self.text(self.method)
    }

    /// `:scheme` as text.
    #[inline]
    pub fn scheme_str(&self) -> Option<&str> {
        self.text(self.scheme)
    }

    /// `:authority` as text.
    #[inline]
    pub fn authority_str(&self) -> Option<&str> {
        self.text(self.authority)
    }

    /// `:path` as text.
    #[inline]
    pub fn path_str(&self) -> Option<&str> {
        self.text(self.path)
    }

    /// `:protocol` as text.
    #[inline]
    pub fn protocol_str(&self) -> Option<&str> {
        self.text(self.protocol)
    }

    /// The regular fields in the order received, names as text (a name is a token: ASCII).
    pub fn iter_str(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.list.iter().map(|&(n, v)| (self.text(Some(n)).unwrap_or(""), self.span(v)))
    }

    /// The span as text; `None` for no span, or one that is not UTF-8.
    #[inline]
    fn text(&self, span: Option<Span>) -> Option<&str> {
        let (start, end) = span?;
        match &self.buf {
            Text::Utf8(s) => s.get(start as usize..end as usize),
            Text::Bytes(b) => std::str::from_utf8(b.get(start as usize..end as usize)?).ok(),
        }
    }
}

/// A plain GET's pseudo-fields, for tests of request heads.
#[cfg(test)]
pub(crate) const TEST_GET: [(&str, &str); 4] =
    [(":method", "GET"), (":scheme", "https"), (":authority", "a.test"), (":path", "/")];

#[cfg(test)]
impl Fields {
    /// `list` pushed as a connection would decode it (tests).
    pub(crate) fn of(list: &[(&str, &str)]) -> Fields {
        let mut f = Fields::default();
        for (n, v) in list {
            f.push(n.as_bytes(), v.as_bytes());
        }
        f
    }
}

impl Fields {
    /// A copy that owns its bytes as [`Text`]: checked as UTF-8 once, here.
    pub fn to_text(&self) -> Fields<Text> {
        let buf = match String::from_utf8(self.buf.clone()) {
            Ok(s) => Text::Utf8(s),
            Err(e) => Text::Bytes(e.into_bytes()),
        };
        Fields {
            buf,
            list: self.list.clone(),
            method: self.method,
            scheme: self.scheme,
            authority: self.authority,
            path: self.path,
            protocol: self.protocol,
            size: self.size,
            broken: self.broken,
            controls: self.controls,
        }
    }

    /// Empties the list, keeping its memory.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.list.clear();
        (self.method, self.scheme, self.authority, self.path, self.protocol) = (None, None, None, None, None);
        self.size = 0;
        self.broken = None;
        self.controls = false;
    }

    /// Adds one decoded field, in block order.
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        self.size += name.len() + value.len() + 32;
        // The rare value that may have a control byte is looked at again, byte by byte.
        let controls = maybe_controls(value) && value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f);
        if controls && value.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') {
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
        self.controls |= controls;
        if name.is_empty() || every(name) & NAME == 0 {
            self.broke("a field name that is empty, uppercase or not a token");
        }
        if CONNECTION_SPECIFIC.contains(&name) || (name == b"te" && value != b"trailers") {
            self.broke("a connection-specific field");
        }
        let name = self.keep(name);
        self.list.push((name, span));
    }

    fn broke(&mut self, why: &'static str) {
        self.broken.get_or_insert(why);
    }

    fn keep(&mut self, bytes: &[u8]) -> Span {
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(bytes);
        (start, self.buf.len() as u32)
    }
}

impl<B: AsRef<[u8]>> Fields<B> {
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

    /// A regular field's value holds a control byte other than tab (none of NUL, CR or LF,
    /// which make the head malformed), or DEL.
    pub fn has_controls(&self) -> bool {
        self.controls
    }

    /// The header list's size as RFC 9113 §6.5.2 counts it, pseudo-fields included.
    pub fn list_size(&self) -> usize {
        self.size
    }

    #[inline]
    fn span(&self, (start, end): Span) -> &[u8] {
        &self.buf.as_ref()[start as usize..end as usize]
    }

    #[inline]
    fn get(&self, span: Option<Span>) -> Option<&[u8]> {
        span.map(|s| self.span(s))
    }
}

/// A `tchar` of RFC 9110 §5.6.2: what field names and methods are made of.
pub(crate) const fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~'
        )
}

/// Whether `bytes` may hold a byte below 0x20 or DEL: exact but for tab, which also
/// counts. Eight bytes at a time (a word's borrows mark the bytes below a bound), which
/// is cheap whatever the build's optimisation.
fn maybe_controls(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = bytes.chunks_exact(8);
    let mut hit = 0;
    for word in &mut words {
        let x = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        let del = x ^ (ONES * 0x7f);
        hit |= (x.wrapping_sub(ONES * 0x20) & !x & HIGH) | (del.wrapping_sub(ONES) & !del & HIGH);
    }
    hit != 0 || words.remainder().iter().any(|&b| b < 0x20 || b == 0x7f)
}

/// Byte class: a `tchar` that is not upper-case (what a field name is made of).
pub(crate) const NAME: u8 = 1;
/// Byte class: what `http::Uri` takes anywhere in a path and query, fragments aside.
pub(crate) const PATH: u8 = 4;
/// Byte class: what a plain `host[:port]` authority is made of.
pub(crate) const HOST: u8 = 8;

/// Each byte's classes: one table look-up per byte where a chain of compares was.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let mut c = 0;
        if is_token(b) && !b.is_ascii_uppercase() {
            c |= NAME;
        }
        if b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'/' | b'-'
                    | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
                    | b'%'
                    | b'?'
            )
        {
            c |= PATH;
        }
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':') {
            c |= HOST;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The classes every byte of `bytes` has (all of them for none).
pub(crate) fn every(bytes: &[u8]) -> u8 {
    bytes.iter().fold(!0, |c, &b| c & CLASS[usize::from(b)])
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::TEST_GET as GET;

    fn head(fields: &[(&str, &str)]) -> Fields {
        Fields::of(fields)
    }

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
    fn control_bytes_but_nul_cr_lf_are_framed_yet_flagged() {
        for (value, malformed, flagged) in [("a\u{1}b", false, true), ("a\u{7f}", false, true), ("a\u{0}", true, true)]
        {
            let f = head(&[GET.to_vec(), vec![("x-a", value)]].concat());
            assert_eq!((f.malformed().is_some(), f.has_controls()), (malformed, flagged), "{value:?}");
        }
        let f = head(&[GET.to_vec(), vec![("x-a", "a\tb c")]].concat());
        assert_eq!((f.malformed(), f.has_controls()), (None, false), "tab and space are text");
        let mut f = head(&[GET.to_vec(), vec![("x-a", "\u{1}")]].concat());
        f.clear();
        assert!(!f.has_controls());
    }

    #[test]
    fn the_word_scan_finds_every_control_byte_at_every_place() {
        for len in 0..20 {
            for at in 0..len {
                for bad in [0u8, 1, b'\t', b'\n', 0x1f, 0x7f] {
                    let mut v = vec![b'a'; len];
                    v[at] = bad;
                    assert!(maybe_controls(&v), "{bad:#x} at {at} of {len}");
                }
                for good in [b' ', b'~', 0x80, 0xff, b'A'] {
                    let mut v = vec![b'a'; len];
                    v[at] = good;
                    assert!(!maybe_controls(&v), "{good:#x} at {at} of {len}");
                }
            }
        }
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
