//! QUIC variable-length integers (RFC 9000 §16): the two top bits of the first byte give the
//! length (1, 2, 4 or 8 bytes), the rest is the value, big-endian. Every HTTP/3 frame type,
//! length, setting and stream type is one. Pure functions on byte slices.

/// The largest value a varint holds (2^62 - 1).
pub const MAX: u64 = (1 << 62) - 1;

/// The value at the start of `input` and its encoded length; `None`: `input` is too short (more
/// bytes are needed). Every byte pattern is a valid varint, so this cannot fail otherwise.
pub fn decode(input: &[u8]) -> Option<(u64, usize)> {
    let first = *input.first()?;
    let len = 1usize << (first >> 6);
    let bytes = input.get(..len)?;
    let mut value = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        value = (value << 8) | u64::from(b);
    }
    Some((value, len))
}

/// How many bytes `value` takes (values above [`MAX`] are clamped to it by [`encode`]).
pub fn len(value: u64) -> usize {
    match value {
        0..=63 => 1,
        64..=16_383 => 2,
        16_384..=1_073_741_823 => 4,
        _ => 8,
    }
}

/// Appends `value` (at most [`MAX`]; larger values are written as [`MAX`]) in its shortest form.
pub fn encode(value: u64, out: &mut Vec<u8>) {
    let value = value.min(MAX);
    match len(value) {
        1 => out.push(value as u8),
        2 => out.extend_from_slice(&(value as u16 | 0x4000).to_be_bytes()),
        4 => out.extend_from_slice(&(value as u32 | 0x8000_0000).to_be_bytes()),
        _ => out.extend_from_slice(&(value | 0xc000_0000_0000_0000).to_be_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_9000_examples() {
        // RFC 9000 §A.1.
        let cases: [(&[u8], u64); 4] = [
            (&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c], 151_288_809_941_952_652),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, value) in cases {
            assert_eq!(decode(bytes), Some((value, bytes.len())));
            let mut out = Vec::new();
            encode(value, &mut out);
            assert_eq!(out, bytes);
        }
        // A non-minimal encoding still decodes (RFC 9000 allows it).
        assert_eq!(decode(&[0x40, 0x25]), Some((37, 2)));
    }

    #[test]
    fn short_input_asks_for_more_and_bounds_hold() {
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[0xc0, 0, 0]), None);
        for v in [0, 63, 64, 16_383, 16_384, 1_073_741_823, 1_073_741_824, MAX] {
            let mut out = Vec::new();
            encode(v, &mut out);
            assert_eq!((out.len(), decode(&out)), (len(v), Some((v, len(v)))), "{v}");
        }
        let mut out = Vec::new();
        encode(u64::MAX, &mut out);
        assert_eq!(decode(&out), Some((MAX, 8)));
    }
}
