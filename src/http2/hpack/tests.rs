//! HPACK against RFC 7541 Appendix C, encoder/decoder round trips, and hostile blocks.

use super::encoder::Part;
use super::table::Table;
use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

type Fields = Vec<(String, String)>;

fn decode(d: &mut Decoder, block: &[u8]) -> Result<Fields, HpackError> {
    let mut fields = Vec::new();
    d.decode(block, usize::MAX, |n, v| {
        fields.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
    })?;
    Ok(fields)
}

fn fields(list: &[(&str, &str)]) -> Fields {
    list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

#[test]
fn integers_of_appendix_c1() {
    let mut out = Vec::new();
    put_int(&mut out, 0, 5, 10);
    assert_eq!(out, [0x0a]);
    out.clear();
    put_int(&mut out, 0, 5, 1337);
    assert_eq!(out, [0x1f, 0x9a, 0x0a]);
    assert_eq!(get_int(&out, 5), Ok((1337, 3)));
    out.clear();
    put_int(&mut out, 0, 8, 42);
    assert_eq!(out, [0x2a]);
    for v in [0, 30, 31, 127, 128, 4096, 16_384, MAX_INT] {
        out.clear();
        put_int(&mut out, 0x40, 6, v);
        assert_eq!(get_int(&out, 6), Ok((v, out.len())), "{v}");
    }
}

const C3: [&str; 3] = [
    "828684410f7777772e6578616d706c652e636f6d",
    "828684be58086e6f2d6361636865",
    "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
];

const C4: [&str; 3] = [
    "828684418cf1e3c2e5f23a6ba0ab90f4ff",
    "828684be5886a8eb10649cbf",
    "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
];

/// Appendix C.3 (plain) and C.4 (Huffman): three requests on one connection, the dynamic
/// table growing from one to the next.
#[test]
fn request_examples_of_appendix_c3_and_c4() {
    let first = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")];
    let mut second = first.to_vec();
    second.push(("cache-control", "no-cache"));
    let third = [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ];
    for blocks in [C3, C4] {
        let mut d = Decoder::new(4096);
        assert_eq!(decode(&mut d, &hex(blocks[0])), Ok(fields(&first)));
        assert_eq!(d.table_size(), 57);
        assert_eq!(decode(&mut d, &hex(blocks[1])), Ok(fields(&second)));
        assert_eq!(d.table_size(), 110);
        assert_eq!(decode(&mut d, &hex(blocks[2])), Ok(fields(&third)));
        assert_eq!(d.table_size(), 164);
    }
}

/// Appendix C.5: responses with a 256-byte table, so the third one evicts.
#[test]
fn response_examples_of_appendix_c5_evict() {
    let mut d = Decoder::new(256);
    let one = hex("4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d54\
         6e1768747470733a2f2f7777772e6578616d706c652e636f6d");
    let date1 = "Mon, 21 Oct 2013 20:13:21 GMT";
    let loc = "https://www.example.com";
    let got = decode(&mut d, &one);
    assert_eq!(
        got,
        Ok(fields(&[(":status", "302"), ("cache-control", "private"), ("date", date1), ("location", loc)]))
    );
    assert_eq!(d.table_size(), 222);
    let got = decode(&mut d, &hex("4803333037c1c0bf"));
    assert_eq!(
        got,
        Ok(fields(&[(":status", "307"), ("cache-control", "private"), ("date", date1), ("location", loc)]))
    );
    assert_eq!(d.table_size(), 222);
    let three = hex("88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d\
         4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b207665\
         7273696f6e3d31");
    let got = decode(&mut d, &three);
    assert_eq!(
        got,
        Ok(fields(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", loc),
            ("content-encoding", "gzip"),
            ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"),
        ]))
    );
    assert_eq!(d.table_size(), 215);
}

const CSP: &[u8] = b"default-src 'self'; frame-ancestors 'none'";

fn response(date: &'static [u8], id: &'static [u8]) -> Vec<(&'static [u8], &'static [u8])> {
    vec![
        (b"content-type", b"application/json"),
        (b"content-security-policy", CSP),
        (b"x-content-type-options", b"nosniff"),
        (b"server", b"forkd"),
        (b"date", date),
        (b"x-request-id", id),
        (b"content-length", b"15"),
    ]
}

fn owned(list: &[(&[u8], &[u8])], status: &str) -> Fields {
    let mut all = vec![(":status".to_string(), status.to_string())];
    all.extend(
        list.iter().map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned())),
    );
    all
}

/// The fixed fields go into the table on the first response and are one byte each after it;
/// `date` goes in once a second; the first `x-request-id` goes in for its name;
/// `content-length` stays a literal out of the table.
#[test]
fn encoder_indexes_fixed_fields_once_and_round_trips() {
    let mut e = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let first = response(b"Sat, 28 Nov 2026 15:00:00 GMT", b"0f3a9c11-2b1e-4c55-9a7e-1f2e3d4c5b6a");
    let mut out = Vec::new();
    e.encode(&mut out, Some(200), first.iter().copied());
    assert_eq!(decode(&mut d, &out), Ok(owned(&first, "200")));
    let kept: usize = first[..6].iter().map(|(n, v)| n.len() + v.len() + 32).sum();
    assert_eq!(e.table_size(), kept, "the fixed fields, the date and the first request id");
    assert_eq!(d.table_size(), e.table_size());

    let second = response(b"Sat, 28 Nov 2026 15:00:01 GMT", b"77aa9c11-2b1e-4c55-9a7e-1f2e3d4c5b6a");
    let first_len = out.len();
    out.clear();
    e.encode(&mut out, Some(200), second.iter().copied());
    assert_eq!(decode(&mut d, &out), Ok(owned(&second, "200")));
    assert_eq!(out[0], 0x88, ":status 200 is static index 8");
    assert!(out[1..5].iter().all(|b| b & 0x80 != 0), "fixed fields are indexed: {out:02x?}");
    assert!(out.len() < first_len / 2, "{} vs {first_len}", out.len());
    assert_eq!(d.table_size(), e.table_size());
}

/// Credentials are never-indexed literals (first byte 0001xxxx) and stay out of both tables.
#[test]
fn credentials_are_never_indexed() {
    let mut e = Encoder::new(4096);
    let mut out = Vec::new();
    e.encode(&mut out, None, [(&b"set-cookie"[..], &b"sid=secret; HttpOnly"[..])]);
    assert_eq!(out[0] & 0xf0, 0x10, "{out:02x?}");
    assert_eq!(e.table_size(), 0);
    let mut d = Decoder::new(4096);
    assert_eq!(decode(&mut d, &out), Ok(fields(&[("set-cookie", "sid=secret; HttpOnly")])));
    assert_eq!(d.table_size(), 0);
}

/// A field marked sensitive (an HTML document's CSP with its nonce) is a never-indexed literal
/// whatever its name; the same name unmarked is indexed.
#[test]
fn sensitive_fields_are_never_indexed() {
    let mut e = Encoder::new(4096);
    let csp = (&b"content-security-policy"[..], &b"script-src 'nonce-abc'"[..]);
    let mut out = Vec::new();
    e.encode_marked(&mut out, None, [(csp.0, csp.1, true)]);
    assert_eq!(out[0] & 0xf0, 0x10, "{out:02x?}");
    assert_eq!(e.table_size(), 0);
    let mut d = Decoder::new(4096);
    assert_eq!(decode(&mut d, &out), Ok(fields(&[("content-security-policy", "script-src 'nonce-abc'")])));
    out.clear();
    e.encode_marked(&mut out, None, [(csp.0, csp.1, false)]);
    assert_eq!(out[0] & 0xc0, 0x40, "inserted: {out:02x?}");
    assert!(e.table_size() > 0);
}

/// A status outside the static table is indexed after its first use; any value round trips.
#[test]
fn statuses_round_trip() {
    let mut e = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    for code in [200, 101, 103, 204, 301, 404, 101, 500, 503] {
        let mut out = Vec::new();
        e.encode(&mut out, Some(code), []);
        assert_eq!(decode(&mut d, &out), Ok(fields(&[(":status", &code.to_string())])));
    }
}

/// The peer's SETTINGS_HEADER_TABLE_SIZE shrinks the table: the next block opens with the
/// size updates (the smallest, then the final), which a decoder holding that limit accepts.
#[test]
fn encoder_signals_table_size_changes() {
    let mut e = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let list = response(b"d", b"i");
    let mut out = Vec::new();
    e.encode(&mut out, Some(200), list.iter().copied());
    decode(&mut d, &out).unwrap();
    e.set_peer_table_size(0);
    e.set_peer_table_size(1024);
    out.clear();
    e.encode(&mut out, Some(200), list.iter().copied());
    assert_eq!(&out[..2], &[0x20, 0x3f], "size update to 0 first: {out:02x?}");
    assert_eq!(decode(&mut d, &out), Ok(owned(&list, "200")));
    assert_eq!(d.table_size(), e.table_size());
    assert!(e.table_size() <= 1024);
    // An encoder capped below the default says so on its first block.
    let mut small = Encoder::new(512);
    out.clear();
    small.encode(&mut out, Some(204), []);
    assert_eq!(out, [0x3f, 0xe1, 0x03, 0x89]);
}

#[test]
fn hostile_blocks_are_compression_errors() {
    let cases: [(&str, &[u8], HpackError); 9] = [
        ("index 0", &[0x80], HpackError::BadIndex),
        ("index past both tables", &[0xbe], HpackError::BadIndex),
        ("literal name index past the tables", &[0x7f, 0x10, 0x01, b'a'], HpackError::BadIndex),
        ("truncated integer", &[0xff, 0x80], HpackError::Truncated),
        ("integer overflow", &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], HpackError::IntegerOverflow),
        ("string past the block", &[0x40, 0x05, b'a', b'b'], HpackError::Truncated),
        ("Huffman padding of zeros", &[0x40, 0x81, 0x00, 0x00], HpackError::BadHuffman),
        ("size update above the limit", &[0x3f, 0xe2, 0x1f], HpackError::BadSizeUpdate),
        ("size update after a field", &[0x82, 0x20], HpackError::BadSizeUpdate),
    ];
    for (what, block, want) in cases {
        let mut d = Decoder::new(4096);
        assert_eq!(decode(&mut d, block), Err(want), "{what}");
    }
}

/// An HPACK bomb: one big entry referenced over and over. Fields stop at the list limit,
/// the block is still decoded to its end, and the result is a stream error.
#[test]
fn header_list_limit_stops_a_bomb() {
    let mut d = Decoder::new(4096);
    let mut block = Vec::new();
    put_int(&mut block, 0x40, 6, 0);
    put_str(&mut block, b"x-big");
    put_str(&mut block, &[b'a'; 4000]);
    block.extend(std::iter::repeat_n(0xbe, 10_000));
    let mut handed = 0usize;
    let got = d.decode(&block, 16_384, |n, v| handed += n.len() + v.len() + 32);
    assert_eq!(got, Err(HpackError::ListTooLarge));
    assert!(handed <= 16_384, "{handed}");
    assert_eq!(d.table_size(), 4037, "the table still took the insert");
    // The table is intact: the next block can index the entry.
    assert_eq!(d.decode(&[0xbe], 8192, |_, v| assert_eq!(v.len(), 4000)), Ok(()));
}

#[test]
fn table_evicts_oldest_and_refuses_oversized_entries() {
    let mut t = Table::new(100);
    t.insert(b"a", b"1");
    t.insert(b"b", b"2");
    t.insert(b"c", b"3");
    assert_eq!(t.len(), 2, "three 34-byte entries do not fit in 100");
    assert_eq!(t.get(0), Some((&b"c"[..], &b"3"[..])));
    assert_eq!(t.get(1), Some((&b"b"[..], &b"2"[..])));
    assert_eq!(t.find(b"b", b"2"), Some(1));
    assert_eq!(t.find(b"a", b"1"), None);
    t.insert(b"big", &[0; 100]);
    assert_eq!((t.len(), t.size()), (0, 0));
    t.insert(b"d", b"4");
    t.set_max(10);
    assert_eq!((t.len(), t.size()), (0, 0));
}

/// The static-table lookups agree with the table itself (RFC 7541 Appendix A).
#[test]
fn static_lookups_match_the_table() {
    use crate::http2::hpack::{static_field, static_name, STATIC};
    for (i, (name, value)) in STATIC.iter().enumerate() {
        let first = STATIC.iter().position(|(n, _)| n == name).map(|j| j + 1);
        assert_eq!(static_name(name.as_bytes()), first, "{name}");
        let want = (!value.is_empty()).then_some(i + 1);
        assert_eq!(static_field(name.as_bytes(), value.as_bytes()), want, "{name}: {value}");
    }
    assert_eq!(static_name(b"x-request-id"), None);
    assert_eq!(static_field(b":status", b"201"), None);
    assert_eq!(static_field(b"content-type", b""), None);
}

/// A run of fields fixed for the program: the same static slice every time.
static RUN: [(&str, &str); 3] =
    [("server", "forkd"), ("x-content-type-options", "nosniff"), ("x-frame-options", "DENY")];

/// One block both ways: `lead` fields then [`RUN`], as parts with the run kept by `kept`, and
/// as fields one by one by `plain`. The two must be the same bytes.
fn both_ways(kept: &mut Encoder, plain: &mut Encoder, lead: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut a = Vec::new();
    let parts = lead.iter().map(|&(n, v)| Part::Field(n, v, false)).chain([Part::Fixed(&RUN)]);
    kept.encode_parts(&mut a, Some(200), parts);
    let mut b = Vec::new();
    let run = RUN.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
    plain.encode(&mut b, Some(200), lead.iter().copied().chain(run));
    assert_eq!(a, b, "a kept run writes what its fields write");
    a
}

/// A fixed run's bytes are reused only while the table is as it was: a field inserted before
/// it, or a new table size, moves the indices it names, and the next block writes them anew.
#[test]
fn a_fixed_run_is_its_fields_whatever_the_table_did_in_between() {
    let (mut kept, mut plain) = (Encoder::new(4096), Encoder::new(4096));
    let mut d = Decoder::new(4096);
    let mut want = vec![(":status".to_string(), "200".to_string())];
    want.extend(RUN.iter().map(|(n, v)| (n.to_string(), v.to_string())));
    let json: &[(&[u8], &[u8])] = &[(b"content-type", b"application/json")];
    let mut with_json = vec![want[0].clone(), ("content-type".to_string(), "application/json".to_string())];
    with_json.extend_from_slice(&want[1..]);
    // Inserted, then indices (kept), then a new entry ahead of the run moves them.
    let first = both_ways(&mut kept, &mut plain, &[]);
    assert_eq!(decode(&mut d, &first), Ok(want.clone()));
    let second = both_ways(&mut kept, &mut plain, &[]);
    assert_eq!(second, [0x88, 0xc0, 0xbf, 0xbe], "indices, the first inserted highest: {second:02x?}");
    assert_eq!(decode(&mut d, &second), Ok(want.clone()));
    let third = both_ways(&mut kept, &mut plain, json);
    assert_eq!(decode(&mut d, &third), Ok(with_json.clone()));
    let fourth = both_ways(&mut kept, &mut plain, json);
    assert_eq!(fourth, [0x88, 0xbe, 0xc1, 0xc0, 0xbf], "the run's indices moved by one: {fourth:02x?}");
    assert_eq!(decode(&mut d, &fourth), Ok(with_json.clone()));
    // The peer empties its table: the run is inserted again.
    for e in [&mut kept, &mut plain] {
        e.set_peer_table_size(0);
        e.set_peer_table_size(4096);
    }
    let fifth = both_ways(&mut kept, &mut plain, &[]);
    assert_eq!(decode(&mut d, &fifth), Ok(want.clone()));
    assert_eq!(both_ways(&mut kept, &mut plain, &[]), [0x88, 0xc0, 0xbf, 0xbe]);
    assert_eq!(d.table_size(), kept.table_size());
}

/// `date` is inserted when its second begins and its entry's index (one byte) for the rest of
/// that second; a short value that changes per response (a request id) is a raw literal, a
/// long one Huffman-coded.
#[test]
fn literals_follow_their_values() {
    let mut e = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let id = b"0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77";
    let mut blocks = Vec::new();
    for date in
        [&b"Sat, 28 Nov 2026 15:00:00 GMT"[..], b"Sat, 28 Nov 2026 15:00:00 GMT", b"Sat, 28 Nov 2026 15:00:01 GMT"]
    {
        let mut out = Vec::new();
        e.encode(&mut out, None, [(&b"date"[..], date), (b"x-request-id", id)]);
        let text = |s: &[u8]| String::from_utf8_lossy(s).into_owned();
        let want = vec![("date".to_string(), text(date)), ("x-request-id".to_string(), text(id))];
        assert_eq!(decode(&mut d, &out), Ok(want));
        assert!(out.windows(id.len()).any(|w| w == id), "the id is raw: {out:02x?}");
        blocks.push(out);
    }
    assert_eq!(blocks[0][0], 0x40 | 33, "inserted, static name `date`: {:02x?}", blocks[0]);
    assert_eq!(blocks[1][0], 0x80 | 63, "its entry, behind the first id's: {:02x?}", blocks[1]);
    assert_eq!(blocks[2][0], 0x40 | 33, "the next second is inserted: {:02x?}", blocks[2]);
    assert_eq!(e.table_size(), 2 * (4 + 29 + 32) + (12 + 36 + 32), "two dates, the first id");
    assert_eq!(d.table_size(), e.table_size());
    // Another entry moves it: found in the table, not assumed newest.
    let date = &b"Sat, 28 Nov 2026 15:00:01 GMT"[..];
    let mut out = Vec::new();
    e.encode(&mut out, None, [(&b"x-one"[..], &b"v"[..]), (b"date", date)]);
    assert_eq!(out.last(), Some(&(0x80 | 63)), "{out:02x?}");
    let want =
        vec![("x-one".to_string(), "v".to_string()), ("date".to_string(), String::from_utf8_lossy(date).into_owned())];
    assert_eq!(decode(&mut d, &out), Ok(want));
    // A long fresh value (an HTML document's CSP) is coded: shorter than itself.
    let csp = format!("script-src 'nonce-{}'; {}", "a".repeat(24), "default-src 'self'; ".repeat(4));
    let mut out = Vec::new();
    e.encode_marked(&mut out, None, [(&b"content-security-policy"[..], csp.as_bytes(), true)]);
    assert!(out.len() < csp.len(), "{} vs {}", out.len(), csp.len());
    assert_eq!(decode(&mut d, &out), Ok(fields(&[("content-security-policy", &csp)])));
}

/// A static field is kept like a run: the same bytes as the field given plainly, before and
/// after the table changes under it.
#[test]
fn a_static_field_is_its_field_whatever_the_table_did() {
    static JSON: &str = "application/json";
    let (mut kept, mut plain) = (Encoder::new(4096), Encoder::new(4096));
    let mut d = Decoder::new(4096);
    for extra in [None, None, Some("x-one"), None, Some("x-two"), None] {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let head = extra.map(|n| (n.as_bytes(), &b"v"[..]));
        kept.encode_parts(
            &mut a,
            Some(200),
            head.map(|(n, v)| Part::Field(n, v, false)).into_iter().chain([Part::Static("content-type", JSON)]),
        );
        plain.encode(&mut b, Some(200), head.into_iter().chain([(&b"content-type"[..], JSON.as_bytes())]));
        assert_eq!(a, b, "after {extra:?}");
        let decoded = decode(&mut d, &a).expect("decodes");
        assert_eq!(decoded.last(), Some(&("content-type".to_string(), JSON.to_string())));
    }
}

/// The first `x-request-id` of a connection enters the table (no static entry has its name);
/// every later one is a literal without indexing that names the entry: two bytes where the
/// name as a literal takes eleven. The index follows the entry as others enter ahead of it,
/// and a request id marked sensitive stays a never-indexed literal.
#[test]
fn a_request_id_names_its_table_entry_after_the_first() {
    let mut e = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let ids: [&[u8]; 3] = [
        b"0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77",
        b"1a2b3c4d-7d41-4b8e-9c55-2e6f1a0b3d77",
        b"99999999-7d41-4b8e-9c55-2e6f1a0b3d77",
    ];
    let id_field = |id: &[u8]| ("x-request-id".to_string(), String::from_utf8_lossy(id).into_owned());
    let mut out = Vec::new();
    e.encode(&mut out, None, [(&b"x-request-id"[..], ids[0])]);
    assert_eq!(out[..2], [0x40, 0x80 | 9], "inserted, the name Huffman-coded: {out:02x?}");
    assert_eq!(decode(&mut d, &out), Ok(vec![id_field(ids[0])]));
    assert_eq!(e.table_size(), 12 + 36 + 32);

    out.clear();
    e.encode(&mut out, None, [(&b"x-request-id"[..], ids[1])]);
    let mut want = vec![0x0f, 62 - 15, 36];
    want.extend_from_slice(ids[1]);
    assert_eq!(out, want, "the name is dynamic index 62, the value a raw literal");
    assert_eq!(decode(&mut d, &out), Ok(vec![id_field(ids[1])]));
    assert_eq!(e.table_size(), 12 + 36 + 32, "later ids stay out of the table");

    out.clear();
    e.encode(&mut out, None, [(&b"x-one"[..], &b"v"[..]), (b"x-request-id", ids[2])]);
    let at = out.len() - 36 - 3;
    assert_eq!(out[at..at + 3], [0x0f, 63 - 15, 36], "moved behind x-one: {out:02x?}");
    assert_eq!(decode(&mut d, &out), Ok(vec![("x-one".to_string(), "v".to_string()), id_field(ids[2])]));
    assert_eq!(d.table_size(), e.table_size());

    out.clear();
    e.encode_marked(&mut out, None, [(&b"x-request-id"[..], ids[2], true)]);
    assert_eq!(out[0] & 0xf0, 0x10, "never indexed: {out:02x?}");
    assert_eq!(decode(&mut d, &out), Ok(vec![id_field(ids[2])]));
}

/// Once the table evicted the request id's entry, the next id enters it again; with no table
/// at all (the peer's SETTINGS say 0), the name is a literal every time.
#[test]
fn an_evicted_request_id_entry_is_inserted_again() {
    let mut e = Encoder::new(4096);
    let mut d = Decoder::new(4096);
    let id = &b"0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77"[..];
    let fill = vec![b'f'; 980];
    let mut first_bytes = Vec::new();
    for i in 0..8 {
        let name = format!("x-fill-{i}");
        let mut out = Vec::new();
        let filler = (i % 2 == 1).then_some((name.as_bytes(), &fill[..]));
        e.encode(&mut out, None, [(&b"x-request-id"[..], id)].into_iter().chain(filler));
        let mut want = vec![("x-request-id".to_string(), String::from_utf8_lossy(id).into_owned())];
        want.extend(
            filler.map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned())),
        );
        assert_eq!(decode(&mut d, &out), Ok(want), "block {i}");
        assert_eq!(d.table_size(), e.table_size(), "block {i}");
        first_bytes.push(out[0]);
    }
    // Four fillers of 1 020 bytes and the id's 80 overflow 4 096 bytes: the fourth (block 7)
    // evicts the id's entry, the oldest.
    assert_eq!(first_bytes, [0x40, 0x0f, 0x0f, 0x0f, 0x0f, 0x0f, 0x0f, 0x0f], "{first_bytes:02x?}");
    let mut out = Vec::new();
    e.encode(&mut out, None, [(&b"x-request-id"[..], id)]);
    assert_eq!(out[0], 0x40, "inserted again: {out:02x?}");
    decode(&mut d, &out).expect("decodes");

    e.set_peer_table_size(0);
    for start in [&[0x20, 0x00][..], &[0x00]] {
        out.clear();
        e.encode(&mut out, None, [(&b"x-request-id"[..], id)]);
        assert_eq!(out[..start.len()], *start, "a literal name: {out:02x?}");
        assert_eq!(out[start.len()], 0x80 | 9, "the name Huffman-coded: {out:02x?}");
        let got = decode(&mut d, &out).expect("decodes");
        assert_eq!(got, vec![("x-request-id".to_string(), String::from_utf8_lossy(id).into_owned())]);
        assert_eq!(e.table_size(), 0);
    }
}
