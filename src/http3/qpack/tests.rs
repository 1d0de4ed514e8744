//! QPACK tests: RFC 9204's examples (static-only, and the dynamic table through the client
//! decoder), round trips through the encoders, the dynamic table's encoder rules (insert
//! once, reference only what the decoder acknowledged, stay static-only for a peer without a
//! table), and every kind of bad input mapped to its error without a panic.

use super::decoder::TableDecoder;
use super::encoder::{DecoderStreamError, Index, TableEncoder, MAX_UNACKNOWLEDGED, TABLE_BOUND};
use super::*;

fn decoded(input: &[u8], max: usize) -> Result<Vec<(String, String)>, DecodeError> {
    let mut fields = Fields::default();
    decode(input, max, &mut fields)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(fields.iter().map(|(n, v)| (text(n), text(v))).collect())
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

#[test]
fn rfc_9204_b1_literal_with_name_reference() {
    let mut input = vec![0x00, 0x00, 0x51, 0x0b];
    input.extend_from_slice(b"/index.html");
    assert_eq!(decoded(&input, 1000), Ok(pairs(&[(":path", "/index.html")])));
}

#[test]
fn encoder_output_decodes_to_the_same_fields() {
    let fields = [
        (":status", "200"),
        ("content-type", "application/json"),
        ("content-length", "1234"),
        ("x-request-id", "0f3a-77"),
        ("cache-control", "no-store"),
        ("content-security-policy", "default-src 'self'; script-src 'nonce-abc'"),
        ("x-custom", ""),
        ("set-cookie", "a=b; Path=/; HttpOnly\u{7f}\u{1}"),
    ];
    let (enc, mut out) = (Encoder, Vec::new());
    enc.begin(&mut out);
    for (n, v) in fields {
        enc.field(n.as_bytes(), v.as_bytes(), &mut out);
    }
    assert_eq!(decoded(&out, 10_000), Ok(pairs(&fields)));
    // Exact static entries are one byte each: :status 200 is index 25, no-store index 40.
    out.clear();
    enc.begin(&mut out);
    enc.status(200, &mut out);
    enc.field(b"Cache-Control", b"no-store", &mut out);
    assert_eq!(out, [0, 0, 0xc0 | 25, 0xc0 | 40]);
    // A status not in the table: a name reference to :status (24) and a literal value.
    out.clear();
    enc.status(418, &mut out);
    assert_eq!(out[0], 0x50 | 0x0f, "index 24 needs the 4-bit prefix extended");
    assert_eq!(decoded(&[&[0, 0][..], &out].concat(), 100), Ok(pairs(&[(":status", "418")])));
    // Upper-case names go out lower-case, also when the table does not have them.
    out.clear();
    enc.begin(&mut out);
    enc.field(b"X-Frame-Options", b"DENY", &mut out);
    enc.field(b"X-Mixed-Case", b"v", &mut out);
    assert_eq!(decoded(&out, 1000), Ok(pairs(&[("x-frame-options", "DENY"), ("x-mixed-case", "v")])));
}

#[test]
fn prefixed_integers_round_trip_at_every_prefix() {
    for bits in [3u8, 4, 6, 7, 8] {
        for v in [0u64, 1, 6, 7, 14, 15, 62, 63, 64, 126, 127, 128, 255, 256, 1337, 1 << 20, 1 << 40] {
            let mut out = Vec::new();
            write_integer(v, bits, 0, &mut out);
            assert_eq!(integer(&out, bits), Ok((v, out.len())), "{v} with {bits} bits");
        }
    }
    // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
    assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 5), Ok((1337, 3)));
}

#[test]
fn bad_sections_fail_with_their_error() {
    let failed = |input: &[u8]| match decode(input, 1000, &mut Fields::default()) {
        Err(DecodeError::Failed(_)) => {}
        other => panic!("{input:02x?}: {other:?}"),
    };
    failed(&[0x01, 0x00]); // Required Insert Count 1: we allow no dynamic table
    failed(&[0x00, 0x00, 0x80]); // indexed, dynamic
    failed(&[0x00, 0x00, 0x40, 0x01, b'a']); // name reference, dynamic
    failed(&[0x00, 0x00, 0x10]); // indexed post-base
    failed(&[0x00, 0x00, 0x00]); // literal with post-base name reference
    failed(&[0x00, 0x00, 0xff, 0x24]); // static index 63 + 36 = 99: out of range
    failed(&[0x00, 0x00, 0x51, 0x05, b'/']); // value shorter than its length
    failed(&[0x00, 0x00, 0x51, 0x81, 0x00]); // Huffman value "0" with 000 padding
    failed(&[0x00, 0x00, 0x27]); // literal name whose length runs past the end
    failed(&[0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]); // overflow
    failed(&[]);
    failed(&[0x00]);
    // Over the limit: 431, not a connection error.
    let mut out = Vec::new();
    Encoder.begin(&mut out);
    Encoder.field(b"x-big", &[b'a'; 100], &mut out);
    assert_eq!(decode(&out, 136, &mut Fields::default()), Err(DecodeError::TooLarge));
    assert!(decode(&out, 137, &mut Fields::default()).is_ok(), "5 + 100 + 32 = 137 fits");
}

#[test]
fn arbitrary_sections_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut fields = Fields::default();
    for _ in 0..5000 {
        let len = (seed % 48) as usize;
        let mut bytes = vec![0u8, 0];
        bytes.extend((0..len).map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        }));
        let _ = decode(&bytes, 512, &mut fields);
        assert!(fields.size() <= 512);
    }
}

fn hex(s: &str) -> Vec<u8> {
    let s: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    s.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex")).collect()
}

fn decoded_with(table: &TableDecoder, input: &[u8]) -> Result<(u64, Vec<(String, String)>), DecodeError> {
    let mut fields = Fields::default();
    let required = table.decode(input, 10_000, &mut fields)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok((required, fields.iter().map(|(n, v)| (text(n), text(v))).collect()))
}

#[test]
fn rfc_9204_b2_to_b5_through_the_client_decoder() {
    // A decoder that advertised 220 bytes (MaxEntries 6), as in the appendix.
    let mut table = TableDecoder::new(220);
    let encoder = hex("3fbd01 c00f7777772e6578616d706c652e636f6d c10c2f73616d706c652f70617468");
    assert_eq!(table.on_encoder_stream(&encoder), Ok(encoder.len()));
    // B.2: Required Insert Count 2, Base 0, two post-base references; acknowledged.
    let want = pairs(&[(":authority", "www.example.com"), (":path", "/sample/path")]);
    assert_eq!(decoded_with(&table, &hex("0381 10 11")), Ok((2, want)));
    let mut ack = Vec::new();
    table.acknowledge(4, 2, &mut ack);
    assert_eq!(ack, [0x84], "Section Acknowledgment for stream 4, no increment owed");
    // B.3: a literal-name insertion, then an Insert Count Increment of 1.
    let insert = hex("4a637573746f6d2d6b65790c637573746f6d2d76616c7565");
    assert_eq!(table.on_encoder_stream(&insert), Ok(insert.len()));
    ack.clear();
    table.increment(&mut ack);
    assert_eq!(ack, [0x01]);
    // B.4: Duplicate, then a section with relative (pre-base) references.
    assert_eq!(table.on_encoder_stream(&[0x02]), Ok(1));
    let want = pairs(&[(":authority", "www.example.com"), (":path", "/"), ("custom-key", "custom-value")]);
    assert_eq!(decoded_with(&table, &hex("0500 80 c1 81")), Ok((4, want)));
    // B.5: an insertion with a dynamic name reference evicts the oldest entry.
    let insert = hex("810d637573746f6d2d76616c756532");
    assert_eq!(table.on_encoder_stream(&insert), Ok(insert.len()));
    assert_eq!((table.inserted(), table.len()), (5, 4));
    assert_eq!(table.get(0), None, "evicted");
    assert_eq!(table.get(4), Some((&b"custom-key"[..], &b"custom-value2"[..])));
    // An instruction cut short waits for the rest; bad ones fail.
    assert_eq!(table.on_encoder_stream(&insert[..5]), Ok(0));
    assert!(table.on_encoder_stream(&[0x3f, 0xbe, 0x01]).is_err(), "capacity 221 > 220");
    assert!(table.on_encoder_stream(&[0x09]).is_err(), "Duplicate of no entry");
    assert!(decoded_with(&table, &hex("0d00")).is_err(), "Required Insert Count 12 not received");
    assert!(decoded_with(&table, &hex("0200 80")).is_err(), "a reference at or above the Required Insert Count");
}

/// A typical API response: fixed fields, and the ones that change per response.
const RESPONSE: [(&str, &str); 12] = [
    ("content-type", "application/json"),
    ("content-length", "15"),
    ("date", "Mon, 23 Nov 2026 17:00:00 GMT"),
    ("x-request-id", "0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77"),
    ("cache-control", "no-store"),
    ("server", "forkd"),
    ("strict-transport-security", "max-age=31536000; includeSubDomains; preload"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "strict-origin-when-cross-origin"),
    ("permissions-policy", "camera=(), microphone=(), geolocation=()"),
    ("content-security-policy", "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
];

/// What the HTTP layer decides for a field of [`RESPONSE`].
fn index_of(name: &str) -> Index {
    match name {
        "content-length" | "date" | "x-request-id" => Index::Never,
        _ => Index::Insert,
    }
}

/// One section of `fields` on `stream`, through `enc`.
fn section(enc: &mut TableEncoder, stream: u64, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut s = enc.section(stream, &mut out);
    s.status(200);
    for (n, v) in fields {
        s.field(n.as_bytes(), v.as_bytes(), index_of(n));
    }
    s.finish();
    out
}

/// [`RESPONSE`] as the decoder should see it (`:status` first, names lower-case).
fn response_pairs() -> Vec<(String, String)> {
    let mut want = pairs(&[(":status", "200")]);
    want.extend(RESPONSE.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())));
    want
}

#[test]
fn a_peer_without_a_table_gets_exactly_the_static_encoding() {
    let mut static_only = Vec::new();
    Encoder.begin(&mut static_only);
    Encoder.status(200, &mut static_only);
    for (n, v) in RESPONSE {
        Encoder.field(n.as_bytes(), v.as_bytes(), &mut static_only);
    }
    for peer_max in [None, Some(0), Some(32)] {
        let mut enc = TableEncoder::default();
        if let Some(max) = peer_max {
            assert!(!enc.enable(max, TABLE_BOUND), "{max} bytes hold no entry: the table stays off");
        }
        for stream in [0, 4, 8] {
            assert_eq!(section(&mut enc, stream, &RESPONSE), static_only, "peer max {peer_max:?}");
        }
        assert!(!enc.has_instructions() && enc.inserted() == 0);
    }
}

#[test]
fn fixed_fields_are_inserted_once_and_referenced_once_acknowledged() {
    let (mut enc, mut dec) = (TableEncoder::default(), TableDecoder::new(16_384));
    assert!(enc.enable(16_384, TABLE_BOUND));
    assert_eq!(enc.capacity(), TABLE_BOUND, "the smaller of the peer's maximum and our bound");
    let first = section(&mut enc, 0, &RESPONSE);
    let mut instructions = Vec::new();
    enc.take_instructions(&mut instructions);
    assert_eq!(&instructions[..3], [0x3f, 0xe1, 0x1f], "Set Dynamic Table Capacity 4096 first");
    assert_eq!(dec.on_encoder_stream(&instructions), Ok(instructions.len()));
    // content-type application/json and cache-control no-store are exact static entries;
    // date, x-request-id and content-length change per response: 7 fields are inserted,
    // and the name x-request-id (the static table has date's and content-length's), with
    // an empty value.
    assert_eq!((enc.inserted(), dec.inserted()), (8, 8));
    for abs in 0..8 {
        let (name, value) = dec.get(abs).expect("an entry");
        assert!(![&b"date"[..], b"content-length"].contains(&name), "{name:?}");
        assert_eq!(name == b"x-request-id", value.is_empty(), "{name:?}: {value:?}");
    }
    // The section that inserted them, and every one before the decoder's acknowledgment,
    // carries them as literals: it decodes without the table (Required Insert Count 0).
    assert_eq!(decoded(&first, 10_000), Ok(response_pairs()));
    let second = section(&mut enc, 4, &RESPONSE);
    assert_eq!(second, first, "no second insertion, no reference before acknowledgment");
    assert!(!enc.has_instructions());
    // The decoder acknowledges the insertions; from then on each is one byte.
    let mut ack = Vec::new();
    dec.increment(&mut ack);
    assert_eq!(enc.on_decoder_stream(&ack), Ok(ack.len()));
    assert_eq!(enc.acknowledged(), 8);
    let third = section(&mut enc, 8, &RESPONSE);
    let (required, got) = decoded_with(&dec, &third).expect("decodes with the table");
    assert_eq!((required, got), (8, response_pairs()));
    assert!(decoded(&third, 10_000).is_err(), "it references the table");
    // content-length and date by their static names; the request id by its entry's name,
    // as long as content-length's one byte of static name.
    let named = |v: &str| section(&mut TableEncoder::default(), 0, &[("content-length", v)]).len() - 3;
    let literals = named(RESPONSE[1].1) + named(RESPONSE[2].1) + named(RESPONSE[3].1);
    // Prefix (2) + :status (1) + two static (2) + seven dynamic (7) + the three literals.
    assert_eq!(third.len(), 12 + literals, "{} bytes before, {} after", first.len(), third.len());
    // Its Section Acknowledgment is accepted once.
    ack.clear();
    dec.acknowledge(8, required, &mut ack);
    assert_eq!(ack, [0x88]);
    assert_eq!(enc.on_decoder_stream(&ack), Ok(1));
    assert_eq!(
        enc.on_decoder_stream(&ack),
        Err(DecoderStreamError("a Section Acknowledgment with no section outstanding"))
    );
}

/// An encoder whose table holds `fields` (one section on stream 0, the insertions taken by
/// the decoder and acknowledged), and that decoder.
fn acknowledged(fields: &[(&str, &str)], index: fn(&str) -> Index) -> (TableEncoder, TableDecoder) {
    let (mut enc, mut dec) = (TableEncoder::default(), TableDecoder::new(16_384));
    assert!(enc.enable(16_384, TABLE_BOUND));
    let mut out = Vec::new();
    let mut s = enc.section(0, &mut out);
    for (n, v) in fields {
        s.field(n.as_bytes(), v.as_bytes(), index(n));
    }
    s.finish();
    let mut instructions = Vec::new();
    enc.take_instructions(&mut instructions);
    assert_eq!(dec.on_encoder_stream(&instructions), Ok(instructions.len()));
    let mut ack = Vec::new();
    dec.increment(&mut ack);
    assert_eq!(enc.on_decoder_stream(&ack), Ok(ack.len()));
    (enc, dec)
}

#[test]
fn fields_in_any_order_reference_their_own_entries() {
    let (mut enc, dec) = acknowledged(&RESPONSE, index_of);
    // Reversed, every other one, and one field twice: each decodes to itself.
    let reversed: Vec<_> = RESPONSE.iter().rev().copied().collect();
    let sparse: Vec<_> = RESPONSE.iter().step_by(2).chain(&RESPONSE[4..5]).copied().collect();
    for (stream, fields) in [(4, reversed), (8, sparse)] {
        let block = section(&mut enc, stream, &fields);
        let mut want = pairs(&[(":status", "200")]);
        want.extend(fields.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())));
        let (required, got) = decoded_with(&dec, &block).expect("decodes with the table");
        assert_eq!((required > 0, got), (true, want), "stream {stream}");
    }
    assert_eq!(enc.inserted(), 8, "nothing inserted twice");
}

#[test]
fn a_field_never_indexed_stays_a_literal_even_when_the_table_has_it() {
    let (mut enc, _) = acknowledged(&[("x-a", "1")], |_| Index::Insert);
    for (index, references) in [(Index::Insert, true), (Index::Never, false)] {
        let mut out = Vec::new();
        let mut s = enc.section(4, &mut out);
        s.field(b"x-a", b"1", index);
        s.finish();
        assert_eq!(decoded(&out, 10_000).is_err(), references, "{index:?}");
    }
}

#[test]
fn a_per_message_field_of_a_static_name_is_its_static_line_whether_coded_or_repeated() {
    let (mut enc, _) = acknowledged(&RESPONSE, index_of);
    let names = ["date", "content-length", "etag", "last-modified", "location", "set-cookie"];
    // More names than are kept, values that repeat, change and come back, in two orders.
    let rounds: [[&str; 6]; 5] = [
        ["Sun, 29 Nov 2026 04:00:00 GMT", "15", "\"a\"", "x", "/a", "s=1"],
        ["Sun, 29 Nov 2026 04:00:00 GMT", "15", "\"a\"", "x", "/a", "s=1"],
        ["Sun, 29 Nov 2026 04:00:01 GMT", "15", "\"b\"", "x", "/b", "s=1"],
        ["Sun, 29 Nov 2026 04:00:00 GMT", "2", "\"a\"", "y", "/a", "s=2"],
        ["Sun, 29 Nov 2026 04:00:01 GMT", "15", "\"b\"", "x", "/b", "s=1"],
    ];
    for (round, values) in rounds.iter().enumerate() {
        let mut order: Vec<(&str, &str)> = names.iter().copied().zip(values.iter().copied()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut want = Vec::new();
        Encoder.begin(&mut want);
        let mut got = Vec::new();
        let mut s = enc.section(4 * round as u64 + 4, &mut got);
        for (n, v) in &order {
            Encoder.field(n.as_bytes(), v.as_bytes(), &mut want);
            s.field_with(n.as_bytes(), v.as_bytes(), || Index::Never);
        }
        s.finish();
        assert_eq!(got, want, "round {round}");
    }
    assert!(!enc.has_instructions(), "nothing inserted");
}

#[test]
fn what_does_not_fit_stays_a_literal() {
    let mut enc = TableEncoder::default();
    assert!(enc.enable(100, TABLE_BOUND), "a 100-byte table holds one small entry");
    let fields = [("x-a", "0123456789"), ("x-b", "0123456789")];
    let mut out = Vec::new();
    let mut s = enc.section(0, &mut out);
    for (n, v) in fields {
        s.field(n.as_bytes(), v.as_bytes(), Index::Insert);
    }
    s.finish();
    assert_eq!(enc.inserted(), 2, "45 + 45 bytes fit in 100");
    let mut s = enc.section(4, &mut out);
    s.field(b"x-c", b"0123456789", Index::Insert);
    s.finish();
    assert_eq!(enc.inserted(), 2, "a third does not: nothing is evicted");
    let mut dec = TableDecoder::new(100);
    let mut instructions = Vec::new();
    enc.take_instructions(&mut instructions);
    assert_eq!(dec.on_encoder_stream(&instructions), Ok(instructions.len()));
    assert_eq!(dec.get(1), Some((&b"x-b"[..], &b"0123456789"[..])));
}

#[test]
fn a_request_id_is_named_by_its_table_entry_once_acknowledged() {
    let first = "0f3c2a9e-7d41-4b8e-9c55-2e6f1a0b3d77";
    let (mut enc, dec) = acknowledged(&[("x-a", "1"), ("x-request-id", first)], index_of);
    // The table: `x-a: 1` (0), the name `x-request-id` with no value (1); no id in it.
    assert_eq!(dec.get(1), Some((&b"x-request-id"[..], &b""[..])));
    for (stream, id) in [(4, "5b1d9c3e-2a4f-4c8b-8e7d-6f0a1b2c3d4e"), (8, first)] {
        let block = section(&mut enc, stream, &[("x-request-id", id)]);
        // The value as any literal carries it: after `content-length`'s one-byte name.
        let value = &section(&mut TableEncoder::default(), 0, &[("content-length", id)])[4..];
        // Required Insert Count 2 (encoded 3), Delta Base 0, :status 200 (static 25), then
        // Literal Field Line with Name Reference, dynamic, relative index 0 (absolute 1).
        let mut want = vec![0x03, 0x00, 0xd9, 0x40];
        want.extend_from_slice(value);
        assert_eq!(block, want, "stream {stream}");
        let (required, got) = decoded_with(&dec, &block).expect("decodes with the table");
        assert_eq!((required, got), (2, pairs(&[(":status", "200"), ("x-request-id", id)])));
    }
    assert_eq!(enc.inserted(), 2, "no value of the request id is inserted");
}

#[test]
fn decoder_stream_instructions_and_their_errors() {
    let mut enc = TableEncoder::default();
    assert!(enc.enable(4096, TABLE_BOUND));
    let _ = section(&mut enc, 0, &RESPONSE);
    let err = |enc: &mut TableEncoder, bytes: &[u8]| enc.on_decoder_stream(bytes).expect_err("an error").0;
    assert_eq!(err(&mut enc, &[0x00]), "an Insert Count Increment of 0");
    assert_eq!(err(&mut enc, &[0x09]), "an Insert Count Increment past the entries inserted");
    assert_eq!(err(&mut enc, &[0x80]), "a Section Acknowledgment with no section outstanding");
    assert_eq!(err(&mut enc, &[0x3f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), "an integer too large");
    // An instruction cut short waits; increments add up.
    assert_eq!(enc.on_decoder_stream(&[0x03, 0x3f]), Ok(1));
    assert_eq!(enc.on_decoder_stream(&[0x04]), Ok(1));
    assert_eq!(enc.acknowledged(), 7);
    // Stream Cancellation drops what stream 4 awaited (its acknowledgment is then an error);
    // for a stream with nothing outstanding it is harmless.
    let _ = section(&mut enc, 4, &RESPONSE);
    assert_eq!(enc.on_decoder_stream(&[0x44, 0x48]), Ok(2));
    assert_eq!(err(&mut enc, &[0x84]), "a Section Acknowledgment with no section outstanding");
}

#[test]
fn a_decoder_that_never_acknowledges_sections_gets_static_ones_past_the_bound() {
    let mut enc = TableEncoder::default();
    assert!(enc.enable(4096, TABLE_BOUND));
    let static_only = section(&mut enc, 0, &RESPONSE);
    assert_eq!(enc.on_decoder_stream(&[0x07]), Ok(1));
    for i in 0..MAX_UNACKNOWLEDGED as u64 {
        assert_ne!(section(&mut enc, 4 * (i + 1), &RESPONSE)[0], 0, "section {i} references the table");
    }
    assert_eq!(section(&mut enc, 4, &RESPONSE), static_only, "past the bound: static only");
    assert_eq!(enc.on_decoder_stream(&[0x84]), Ok(1), "one acknowledged");
    assert_ne!(section(&mut enc, 4, &RESPONSE)[0], 0, "below the bound again");
}

/// Two fixed runs: [`RESPONSE`]'s fields after the per-response ones, and a shorter one.
static RUN: [(&str, &str); 7] = {
    let mut run = [("", ""); 7];
    let mut i = 0;
    while i < 7 {
        run[i] = RESPONSE[i + 5];
        i += 1;
    }
    run
};
static OTHER_RUN: [(&str, &str); 2] = [("server", "forkd"), ("vary", "origin")];

/// One section of `lead` then `run`: field by field, or (`as_run`) with `run` as one.
fn section_with_run(
    enc: &mut TableEncoder,
    stream: u64,
    lead: &[(&str, &str)],
    run: &'static [(&'static str, &'static str)],
    as_run: bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut s = enc.section(stream, &mut out);
    s.status(200);
    let field = |s: &mut encoder::Section<'_>, n: &[u8], v: &[u8]| {
        s.field(n, v, index_of(std::str::from_utf8(n).expect("ascii")));
    };
    for (n, v) in lead {
        field(&mut s, n.as_bytes(), v.as_bytes());
    }
    if as_run {
        s.run(run, field);
    } else {
        for (n, v) in run {
            field(&mut s, n.as_bytes(), v.as_bytes());
        }
    }
    s.finish();
    out
}

#[test]
fn a_fixed_run_is_copied_only_into_a_section_of_the_same_base() {
    // Two encoders see the same sections: one writes the runs field by field, the other
    // as runs (copied whenever it may). Byte for byte, every section must be the same:
    // before any acknowledgment (literals), after a partial one (the Base moves: lines kept
    // at the old Base name other entries), after the rest, and with the table given up.
    let (mut fields, mut runs, mut dec) = (TableEncoder::default(), TableEncoder::default(), TableDecoder::new(16_384));
    assert!(fields.enable(16_384, TABLE_BOUND) && runs.enable(16_384, TABLE_BOUND));
    let lead = &RESPONSE[..5];
    let mut stream = 0;
    let mut check = |fields: &mut TableEncoder, runs: &mut TableEncoder, dec: &mut TableDecoder, step: &str| {
        let order: [&'static [(&'static str, &'static str)]; 4] = [&RUN, &OTHER_RUN, &RUN, &RUN];
        for run in order {
            let want = section_with_run(fields, stream, lead, run, false);
            let got = section_with_run(runs, stream, lead, run, true);
            assert_eq!(got, want, "{step}: stream {stream}");
            let mut instructions = (Vec::new(), Vec::new());
            fields.take_instructions(&mut instructions.0);
            runs.take_instructions(&mut instructions.1);
            assert_eq!(instructions.0, instructions.1, "{step}: the same insertions");
            assert_eq!(dec.on_encoder_stream(&instructions.1), Ok(instructions.1.len()));
            let (required, got) = decoded_with(dec, &got).expect("decodes with the table");
            assert!(required <= runs.acknowledged(), "{step}: never blocks");
            let mut pairs = pairs(&[(":status", "200")]);
            pairs.extend(lead.iter().chain(run).map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())));
            assert_eq!(got, pairs, "{step}");
            stream += 4;
        }
    };
    check(&mut fields, &mut runs, &mut dec, "nothing acknowledged");
    let inserted = runs.inserted();
    assert!(inserted > 3, "{inserted} entries");
    for ack in [[0x03], [inserted as u8 - 3]] {
        assert_eq!(fields.on_decoder_stream(&ack), Ok(1));
        assert_eq!(runs.on_decoder_stream(&ack), Ok(1));
        let step = format!("{} acknowledged", runs.acknowledged());
        check(&mut fields, &mut runs, &mut dec, &step);
    }
    // Past the bound of unacknowledged sections both are static-only: no dynamic lines.
    for i in 0..MAX_UNACKNOWLEDGED as u64 {
        section_with_run(&mut fields, 1_000_000 + 4 * i, lead, &RUN, false);
        section_with_run(&mut runs, 1_000_000 + 4 * i, lead, &RUN, true);
    }
    check(&mut fields, &mut runs, &mut dec, "static only");
}

/// Cost of the codec on typical heads: `cargo test --release --lib -- --ignored
/// qpack_cost --nocapture` (reported in docs/performance.md, not asserted).
#[test]
#[ignore]
fn qpack_cost() {
    use crate::http3::head::{write_response_head, RequestHead};
    let request: [(&str, &str); 12] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "api.example.com"),
        (":path", "/api/posts?page=2&pageSize=20"),
        ("accept", "application/json"),
        ("accept-encoding", "gzip, deflate, br"),
        ("accept-language", "en-US,en;q=0.9"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
        ),
        ("authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJlc2lnbmF0dXJl"),
        ("origin", "https://app.example.com"),
        ("referer", "https://app.example.com/posts"),
        ("priority", "u=1, i"),
    ];
    let mut block = Vec::new();
    Encoder.begin(&mut block);
    for (n, v) in request {
        Encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
    }
    let response: [(&[u8], &[u8]); 14] = [
        (b"content-type", b"application/json"),
        (b"content-length", b"1834"),
        (b"date", b"Mon, 23 Nov 2026 17:00:00 GMT"),
        (b"cache-control", b"no-store"),
        (b"x-request-id", b"01HZX3K4M5N6P7Q8R9S0T1V2W3"),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
        (b"strict-transport-security", b"max-age=31536000; includeSubDomains"),
        (b"cross-origin-opener-policy", b"same-origin"),
        (b"cross-origin-resource-policy", b"same-origin"),
        (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
        (b"content-security-policy", b"default-src 'self'; script-src 'self' 'nonce-3q2+7w=='; object-src 'none'"),
        (b"vary", b"origin"),
    ];
    const N: u32 = 200_000;
    let mut fields = Fields::default();
    let start = std::time::Instant::now();
    for _ in 0..N {
        decode(std::hint::black_box(&block), 16_384, &mut fields).expect("decodes");
        let head = RequestHead::from_fields(std::mem::take(&mut fields), false).expect("valid");
        std::hint::black_box(head.path());
    }
    let decode_ns = start.elapsed().as_nanos() / u128::from(N);
    let mut out = Vec::with_capacity(1024);
    let start = std::time::Instant::now();
    for _ in 0..N {
        out.clear();
        write_response_head(200, std::hint::black_box(response), &mut encoder::TableEncoder::default(), 0, &mut out);
    }
    let encode_ns = start.elapsed().as_nanos() / u128::from(N);
    println!(
        "request head ({} bytes encoded): decode + checks {decode_ns} ns; response head ({} bytes): encode {encode_ns} ns",
        block.len(),
        out.len()
    );
}
