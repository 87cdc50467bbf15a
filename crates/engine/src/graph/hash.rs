//! A cheap hasher for the coordinator's maps, keyed by sequential `u64` ids.
//!
//! The default SipHash guards against adversarial keys; ours are issued by the
//! coordinator itself, so a multiply-and-fold is enough and several times
//! cheaper on the hot path.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiply by a large odd constant (a bijection) and fold the high half down,
/// so both the shard index (high bits) and the bucket (low bits) vary.
#[derive(Default, Clone, Copy)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by our keys; FNV-1a keeps it correct for any.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(5) ^ n;
    }
}

/// The `BuildHasher` for maps keyed by operation or stream id.
pub(super) type IdBuild = BuildHasherDefault<IdHasher>;
