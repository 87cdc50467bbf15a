//! The workspace's one hasher for maps keyed by ids and addresses
//! ([`IdMap`]): the driver's, the allocator's and the engine's.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a stream id (a small counter) or an address with one
/// multiplication and a fold: the default SipHash costs more than the rest
/// of a lookup.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The table indexes by the low bits: fold the high ones, which
        // depend on every bit of the key, into them (an address's own low
        // bits are often all zero).
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: the high bits depend on every bit of the key.
        self.0 = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, id: usize) {
        self.write_u64(id as u64);
    }
}

/// A map keyed by an id or an address, hashed with [`IdHasher`]. The
/// keys must not come from an adversary: the hash is not keyed.
pub type IdMap<K, V> = HashMap<K, V, IdBuildHasher>;

/// The `BuildHasher` of [`IdMap`], for other maps and sets keyed the same
/// way (`HashSet`, `DashMap`).
pub type IdBuildHasher = BuildHasherDefault<IdHasher>;
