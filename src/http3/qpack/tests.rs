//! QPACK tests: RFC 9204's static-only example, round trips through the encoder, and every
//! kind of bad input mapped to its error without a panic.

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
        write_response_head(200, std::hint::black_box(response), &mut out);
    }
    let encode_ns = start.elapsed().as_nanos() / u128::from(N);
    println!(
        "request head ({} bytes encoded): decode + checks {decode_ns} ns; response head ({} bytes): encode {encode_ns} ns",
        block.len(),
        out.len()
    );
}
