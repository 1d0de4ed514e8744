//! Hash maps keyed by identifiers the protocol hands out in order: QUIC stream IDs (a peer
//! opens its streams in order, up to a limit) and quinn's connection handles. They hash with
//! one multiplication instead of SipHash, whose resistance to chosen keys they do not need:
//! no peer can pick a set of live keys that collide.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by a stream ID or a connection handle.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A set of stream IDs or connection handles.
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// Multiplies by the golden ratio's 64-bit fraction and folds the high half down, so keys
/// that differ in any bit (stream IDs step by 4) spread over the table's low bits too.
#[derive(Default)]
pub struct IdHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn stream_ids_spread_over_the_low_bits() {
        let build = BuildHasherDefault::<IdHasher>::default();
        // Client bidirectional stream IDs: 0, 4, 8, ... Their hashes' low 7 bits (a table of
        // 128 buckets) must not pile into a quarter of the buckets.
        let buckets: HashSet<u64> = (0..128u64).map(|i| build.hash_one(i * 4) & 127).collect();
        assert!(buckets.len() > 64, "{} buckets of 128 used", buckets.len());
        let mut map: IdMap<u64, u64> = IdMap::default();
        for i in 0..1000 {
            map.insert(i * 4, i);
        }
        assert!((0..1000).all(|i| map.get(&(i * 4)) == Some(&i)));
        assert_eq!(map.get(&2), None);
    }
}
