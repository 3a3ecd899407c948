//! Span ids as map keys, and the keyed hash of the engine's maps.
//!
//! A span id is kept inline, in 16 bytes: its length and its bytes (ids up to 15 bytes long; OTLP's
//! are 8), so that a held span costs no allocation of its own. A longer id (only a hostile or a
//! broken sender writes one) is kept as 120 bits of a keyed hash of it instead: two such ids could
//! meet only by a collision of that hash, under a key the sender never sees.
//!
//! What a reader would not guess: the maps hash with a folded multiply (the construction foldhash
//! and ahash use), keyed per engine from the standard library's random state, rather than with
//! SipHash: the keys (ids, names) come from the senders, so the hash must be keyed, and SipHash
//! costs a fifth of a span's work here.
#![forbid(unsafe_code)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

/// A span id, inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId([u8; 16]);

const HASHED: u8 = 0xff;

impl SpanId {
    pub fn of(id: &[u8], keys: &Keyed) -> SpanId {
        let mut inline = [0u8; 16];
        if id.len() < 16 {
            inline[0] = id.len() as u8;
            inline[1..=id.len()].copy_from_slice(id);
        } else {
            inline[0] = HASHED;
            let low = keys.hash_one(id);
            let high = keys.rekeyed().hash_one(id);
            inline[1..9].copy_from_slice(&low.to_le_bytes());
            inline[9..16].copy_from_slice(&high.to_le_bytes()[..7]);
        }
        SpanId(inline)
    }
}

/// The engine's hash: a folded multiply of each word with a secret key (see the module docstring).
#[derive(Debug, Clone, Copy)]
pub struct Keyed {
    k0: u64,
    k1: u64,
}

impl Keyed {
    /// A new random key.
    pub fn new() -> Keyed {
        let random = RandomState::new();
        Keyed {
            k0: random.hash_one(0x6f74_656c_5f67_7561_u64) | 1,
            k1: random.hash_one(0x7264_5f65_6e67_696e_u64) | 1,
        }
    }

    fn rekeyed(self) -> Keyed {
        Keyed {
            k0: fold(self.k0, 0x9e37_79b9_7f4a_7c15) | 1,
            k1: fold(self.k1, 0xc2b2_ae3d_27d4_eb4f) | 1,
        }
    }
}

impl Default for Keyed {
    fn default() -> Self {
        Keyed::new()
    }
}

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl BuildHasher for Keyed {
    type Hasher = KeyedHasher;

    #[inline]
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            state: self.k0,
            key: self.k1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct KeyedHasher {
    state: u64,
    key: u64,
}

impl KeyedHasher {
    #[inline(always)]
    fn mix(&mut self, word: u64) {
        self.state = fold(self.state ^ word, self.key ^ 0x243f_6a88_85a3_08d3);
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.mix(u64::from(value));
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.mix(u64::from(value));
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.mix(value);
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.mix(value as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fold(self.state, self.key.rotate_left(23) ^ 0x1319_8a2e_0370_7344)
    }
}

/// A `HashMap` hashed by [`Keyed`].
pub type Map<K, V> = std::collections::HashMap<K, V, Keyed>;

pub fn map<K, V>(keys: Keyed) -> Map<K, V> {
    Map::with_hasher(keys)
}

/// Hash `value` as the maps do (for a key's identity, not for a map).
pub fn hash_of<T: Hash + ?Sized>(keys: Keyed, value: &T) -> u64 {
    keys.hash_one(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ids_are_kept_as_they_are_and_long_ones_by_their_hash() {
        let keys = Keyed::new();
        let id = SpanId::of(&[1, 2, 3, 4, 5, 6, 7, 8], &keys);
        assert_eq!(&id.0[..9], &[8, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_ne!(SpanId::of(b"", &keys), SpanId::of(&[0], &keys));
        assert_ne!(SpanId::of(&[0; 7], &keys), SpanId::of(&[0; 8], &keys));
        let long = [7u8; 40];
        assert_eq!(SpanId::of(&long, &keys), SpanId::of(&long, &keys));
        assert_ne!(SpanId::of(&long, &keys), SpanId::of(&long[..39], &keys));
        assert_eq!(SpanId::of(&long, &keys).0[0], HASHED);
    }

    #[test]
    fn the_hash_spreads_near_keys_and_depends_on_the_key() {
        let keys = Keyed::new();
        let low_bits: std::collections::HashSet<u64> =
            (0u64..4096).map(|n| keys.hash_one(n) & 0xfff).collect();
        assert!(low_bits.len() > 2000, "{}", low_bits.len());
        let other = Keyed::new();
        assert_ne!(keys.hash_one(1u64), other.hash_one(1u64));
        assert_ne!(keys.hash_one(b"ab"), keys.hash_one(b"ab\0"));
    }
}
