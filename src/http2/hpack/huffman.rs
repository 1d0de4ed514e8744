//! The Huffman code of HPACK (RFC 7541 §5.2 and Appendix B), the one table forkd has: QPACK
//! reuses it as `crate::http3::qpack::huffman`. A canonical code of 5 to 30 bits per byte plus
//! EOS, strings padded to a byte with the top bits of EOS (all ones).
//!
//! Decoding reads the next 32 bits at once and finds the code's length by comparing them with
//! each length's limit: in a canonical code, codes left-justified rise with their length and
//! the codes of one length are consecutive, so the symbol is one subtraction away ([`DECODE`],
//! built at compile time from the table; 5-bit to 7-bit codes, the common bytes, take one to
//! three comparisons). No tree, no 4-KiB state tables. Encoding shifts codes into a 64-bit
//! accumulator.
//!
//! Rejected, as RFC 7541 §5.2 demands: EOS inside the string, padding longer than 7 bits, and
//! padding that is not all ones.

/// `(code, bit length)` of bytes 0..=255 and of EOS (256): RFC 7541 Appendix B.
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// Longest code.
const MAX_LEN: usize = 30;

/// Per code length: the first code, how many codes, where their symbols start in `syms`, and
/// the limit: one past the length's last code, left-justified in 32 bits (a length without
/// codes has the limit of the length before it).
struct Decode {
    first: [u32; MAX_LEN + 1],
    count: [u16; MAX_LEN + 1],
    offset: [u16; MAX_LEN + 1],
    limit: [u64; MAX_LEN + 1],
    syms: [u16; 257],
}

/// The decode tables, derived from [`CODES`] at compile time.
const DECODE: Decode = build();

const fn build() -> Decode {
    let mut d = Decode {
        first: [u32::MAX; MAX_LEN + 1],
        count: [0; MAX_LEN + 1],
        offset: [0; MAX_LEN + 1],
        limit: [0; MAX_LEN + 1],
        syms: [0; 257],
    };
    let mut i = 0;
    while i < 257 {
        let (code, len) = CODES[i];
        let len = len as usize;
        d.count[len] += 1;
        if code < d.first[len] {
            d.first[len] = code;
        }
        i += 1;
    }
    let (mut len, mut at) = (1, 0u16);
    while len <= MAX_LEN {
        d.offset[len] = at;
        at += d.count[len];
        d.limit[len] = if d.count[len] > 0 {
            ((d.first[len] + d.count[len] as u32) as u64) << (32 - len)
        } else {
            d.limit[len - 1]
        };
        len += 1;
    }
    i = 0;
    while i < 257 {
        let (code, len) = CODES[i];
        let len = len as usize;
        d.syms[(d.offset[len] as u32 + code - d.first[len]) as usize] = i as u16;
        i += 1;
    }
    d
}

/// A Huffman string that breaks RFC 7541 §5.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadHuffman;

/// Appends the decoding of `input` to `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), BadHuffman> {
    // The unread bits, left-justified in `acc`: `bits` of them.
    let (mut acc, mut bits, mut at) = (0u64, 0u32, 0);
    loop {
        while bits <= 56 {
            let Some(&byte) = input.get(at) else { break };
            acc |= u64::from(byte) << (56 - bits);
            bits += 8;
            at += 1;
        }
        if bits == 0 {
            return Ok(());
        }
        // The next 32 bits (zeros past the end): the shortest length whose limit is above them
        // is the code's (the longest codes' limit is 2^32, so the search ends there).
        let next = acc >> 32;
        let mut len = 5;
        while len < MAX_LEN && next >= DECODE.limit[len] {
            len += 1;
        }
        if len as u32 > bits {
            // No whole code is left: the rest is padding, at most 7 bits, all ones.
            if bits > 7 || acc >> (64 - bits) != (1 << bits) - 1 {
                return Err(BadHuffman);
            }
            return Ok(());
        }
        let code = (next >> (32 - len)) as u32;
        let sym = DECODE.syms[(u32::from(DECODE.offset[len]) + code - DECODE.first[len]) as usize];
        if sym == 256 {
            return Err(BadHuffman); // EOS in the string
        }
        out.push(sym as u8);
        acc <<= len;
        bits -= len as u32;
    }
}

/// The encoded length of `input` in bytes.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input.iter().map(|&b| CODES[b as usize].1 as usize).sum();
    bits.div_ceil(8)
}

/// Appends the encoding of `input` to `out`, padded with ones.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    // `acc` holds fewer than 32 pending bits between symbols (codes are at most 30 bits long),
    // written out 32 at a time.
    let (mut acc, mut bits) = (0u64, 0u32);
    for &b in input {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        if bits >= 32 {
            bits -= 32;
            out.extend_from_slice(&((acc >> bits) as u32).to_be_bytes());
            acc &= (1 << bits) - 1;
        }
    }
    while bits >= 8 {
        bits -= 8;
        out.push((acc >> bits) as u8);
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    #[test]
    fn rfc_7541_examples() {
        // RFC 7541 C.4.1–C.4.3 and C.6.1.
        let cases = [
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("private", "aec3 771a 4b"),
            ("Mon, 21 Oct 2013 20:13:21 GMT", "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff"),
            ("https://www.example.com", "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3"),
        ];
        for (plain, coded) in cases {
            let coded = hex(coded);
            let mut out = Vec::new();
            encode(plain.as_bytes(), &mut out);
            assert_eq!(out, coded, "{plain}");
            assert_eq!(encoded_len(plain.as_bytes()), coded.len());
            out.clear();
            decode(&coded, &mut out).expect("decodes");
            assert_eq!(out, plain.as_bytes());
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        for len in [0, 1, 2, 3, 255, 256] {
            let input: Vec<u8> = all.iter().cycle().skip(len * 7).take(len).copied().collect();
            let (mut coded, mut back) = (Vec::new(), Vec::new());
            encode(&input, &mut coded);
            assert_eq!(coded.len(), encoded_len(&input));
            decode(&coded, &mut back).expect("decodes");
            assert_eq!(back, input);
        }
    }

    /// RFC 7541's decoding, one bit at a time: each code read so far looked up in [`CODES`].
    fn reference(input: &[u8]) -> Result<Vec<u8>, BadHuffman> {
        let (mut out, mut code, mut len) = (Vec::new(), 0u32, 0u8);
        for bit in input.iter().flat_map(|&b| (0..8).rev().map(move |i| (b >> i) & 1)) {
            (code, len) = ((code << 1) | u32::from(bit), len + 1);
            if let Some(sym) = CODES.iter().position(|&c| c == (code, len)) {
                if sym == 256 {
                    return Err(BadHuffman);
                }
                out.push(sym as u8);
                (code, len) = (0, 0);
            }
        }
        if len > 7 || code != (1 << len) - 1 {
            return Err(BadHuffman);
        }
        Ok(out)
    }

    #[test]
    fn any_input_decodes_as_the_bit_by_bit_reading_does() {
        // A xorshift stream of inputs: short and long, mostly valid codes cut anywhere, and
        // plain noise (mostly rejected).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..4000 {
            let len = (next() % 40) as usize;
            let plain: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let mut input = Vec::new();
            if round % 2 == 0 {
                encode(&plain, &mut input);
                let cut = input.len().saturating_sub((next() % 3) as usize);
                input.truncate(cut);
                if let Some(last) = input.last_mut().filter(|_| round % 6 == 0) {
                    *last ^= 1 << (next() % 8);
                }
            } else {
                input = plain;
            }
            let mut got = Vec::new();
            let got = decode(&input, &mut got).map(|()| got);
            assert_eq!(got, reference(&input), "input {input:02x?}");
        }
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // "0" is 00000 (5 bits): padding 000 is not all ones.
        assert_eq!(decode(&[0x00], &mut out), Err(BadHuffman));
        // A whole byte of padding (8 one bits).
        assert_eq!(decode(&[0x07, 0xff], &mut out), Err(BadHuffman));
        // EOS (30 one bits) inside the string.
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xfc], &mut out), Err(BadHuffman));
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff], &mut out), Err(BadHuffman));
        // "0" then 111 padding is fine.
        out.clear();
        assert_eq!(decode(&[0x07], &mut out), Ok(()));
        assert_eq!(out, b"0");
    }
}
