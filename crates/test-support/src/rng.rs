//! Random but reproducible test data: never all zeros, no external crate.
//!
//! Two generators, because the crates' tests were written against both and
//! their data must not change: [`XorShift`] (xorshift64*) and [`XorShift64`]
//! (Marsaglia's plain xorshift64).

/// The top 24 bits of `bits`, spread over [-4, 4) (every value exact in f32).
fn plus_minus_four(bits: u64) -> f32 {
    (bits >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
}

/// A small xorshift64* generator.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// Seeded with `seed` (0, which would stay 0 for ever, becomes 1).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The high half of [`XorShift::next_u64`].
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [-4, 4), never exactly 0.
    pub fn next_f32(&mut self) -> f32 {
        let value = plus_minus_four(self.next_u64());
        if value == 0.0 { 0.5 } else { value }
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    /// `n` values of [`XorShift::next_u32`].
    pub fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_u32()).collect()
    }

    /// `n` values of [`XorShift::next_f32`].
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

/// A plain xorshift64 generator (shifts 13, 7, 17). The state is public so a
/// test can seed it directly; it must not be 0.
#[derive(Clone, Debug)]
pub struct XorShift64(pub u64);

impl XorShift64 {
    /// Seeded with `seed`, made odd so it is never 0.
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next 64 random bits (the new state).
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n` (modulo bias is irrelevant for test data).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `n` values in [-4, 4) (0 is possible, with odds of 2^-24 each).
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| plus_minus_four(self.next_u64())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_seed_still_gives_data() {
        assert_ne!(XorShift::new(0).next_u64(), 0);
        assert_ne!(XorShift64::new(0).next_u64(), 0);
    }

    #[test]
    fn the_same_seed_gives_the_same_data_and_others_differ() {
        assert_eq!(XorShift::new(7).u32s(16), XorShift::new(7).u32s(16));
        assert_ne!(XorShift::new(7).u32s(16), XorShift::new(8).u32s(16));
        assert_eq!(XorShift64::new(7).f32s(16), XorShift64::new(7).f32s(16));
    }

    #[test]
    fn floats_stay_in_range() {
        let mut star = XorShift::new(3);
        let mut plain = XorShift64::new(3);
        for v in star.f32s(10_000).into_iter().chain(plain.f32s(10_000)) {
            assert!((-4.0..4.0).contains(&v), "{v}");
        }
        assert!(star.f32s(10_000).iter().all(|&v| v != 0.0));
    }

    #[test]
    fn range_and_below_stay_in_bounds() {
        let mut star = XorShift::new(11);
        let mut plain = XorShift64(11);
        for _ in 0..10_000 {
            assert!((5..9).contains(&star.range(5, 9)));
            assert!(plain.below(3) < 3);
        }
    }
}
