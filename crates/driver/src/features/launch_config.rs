//! [`LaunchConfig`]: the grid and block shape of a launch, and the limits
//! it is checked against.

use crate::ground::error::{Error, Result};

/// Grid and block shape of a launch, with dynamic shared memory.
///
/// ```
/// use cuda_streams_driver::LaunchConfig;
/// let cfg = LaunchConfig::for_num_elems(1000);
/// assert_eq!((cfg.grid_dim, cfg.block_dim), ((4, 1, 1), (256, 1, 1)));
/// assert!(cfg.validate().is_ok());
/// let too_big = LaunchConfig { block_dim: (64, 32, 1), ..cfg };
/// assert!(too_big.validate().unwrap_err().to_string().contains("2048"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in the grid (x, y, z).
    pub grid_dim: (u32, u32, u32),
    /// Threads in a block (x, y, z); at most 1024 in all.
    pub block_dim: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// The most threads a block may have on every supported GPU.
    pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
    /// The block size `for_num_elems` uses.
    pub const DEFAULT_BLOCK: u32 = 256;

    /// One thread per element in blocks of 256 (at least one block, so the
    /// kernel must check its bounds).
    pub fn for_num_elems(n: u32) -> Self {
        Self {
            grid_dim: (n.div_ceil(Self::DEFAULT_BLOCK).max(1), 1, 1),
            block_dim: (Self::DEFAULT_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Reject zero dimensions, blocks over 1024 threads, and grids beyond the
    /// hardware's limits (x < 2^31, y and z <= 65535), naming the value.
    #[inline]
    pub fn validate(&self) -> Result<()> {
        if self.within_limits() {
            Ok(())
        } else {
            self.refusal()
        }
    }

    /// Whether [`LaunchConfig::validate`] accepts it: the whole check of
    /// every launch, without branches. `d - 1 < max` (wrapping) is
    /// `1 <= d <= max` in one comparison; a block's dimensions are each at
    /// most 1024 when that holds, so their product cannot overflow.
    #[inline]
    fn within_limits(&self) -> bool {
        let (bx, by, bz) = self.block_dim;
        let (gx, gy, gz) = self.grid_dim;
        let max = Self::MAX_THREADS_PER_BLOCK;
        let in_range = |d: u32, most: u32| d.wrapping_sub(1) < most;
        let block = in_range(bx, max) & in_range(by, max) & in_range(bz, max);
        // Wrapping: exact whenever `block` holds, and ignored otherwise.
        let threads = bx.wrapping_mul(by).wrapping_mul(bz);
        let grid = in_range(gx, i32::MAX as u32) & in_range(gy, 65_535) & in_range(gz, 65_535);
        block & (threads <= max) & grid
    }

    /// The error [`LaunchConfig::validate`] returns, naming the first limit
    /// the configuration breaks.
    #[cold]
    fn refusal(&self) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidLaunchConfig { reason });
        let (bx, by, bz) = self.block_dim;
        let (gx, gy, gz) = self.grid_dim;
        if bx == 0 || by == 0 || bz == 0 {
            return invalid(format!(
                "block_dim {:?} has a zero dimension",
                self.block_dim
            ));
        }
        // In u128: three dimensions of up to 2^32 - 1 overflow a u64.
        let threads = u128::from(bx) * u128::from(by) * u128::from(bz);
        if threads > u128::from(Self::MAX_THREADS_PER_BLOCK) {
            return invalid(format!(
                "block_dim {:?} has {threads} threads; a block may have at most {}",
                self.block_dim,
                Self::MAX_THREADS_PER_BLOCK
            ));
        }
        if gx == 0 || gy == 0 || gz == 0 {
            return invalid(format!("grid_dim {:?} has a zero dimension", self.grid_dim));
        }
        if gx > i32::MAX as u32 || gy > 65_535 || gz > 65_535 {
            return invalid(format!(
                "grid_dim {:?} exceeds the limits (2^31 - 1, 65535, 65535)",
                self.grid_dim
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limits as the docs state them, written plainly in `u128`.
    fn allowed(cfg: &LaunchConfig) -> bool {
        let (bx, by, bz) = cfg.block_dim;
        let (gx, gy, gz) = cfg.grid_dim;
        let threads = u128::from(bx) * u128::from(by) * u128::from(bz);
        [bx, by, bz, gx, gy, gz].iter().all(|&d| d > 0)
            && threads <= 1024
            && u64::from(gx) < 1 << 31
            && gy <= 65_535
            && gz <= 65_535
    }

    #[test]
    fn the_branchless_check_accepts_exactly_what_the_limits_allow_and_every_refusal_names_the_value()
     {
        let edges = [
            0,
            1,
            2,
            3,
            32,
            1023,
            1024,
            1025,
            65_535,
            65_536,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX,
        ];
        let mut refused = 0;
        for &a in &edges {
            for &b in &edges {
                for &c in &edges {
                    for cfg in [
                        LaunchConfig {
                            grid_dim: (1, 1, 1),
                            block_dim: (a, b, c),
                            shared_mem_bytes: 0,
                        },
                        LaunchConfig {
                            grid_dim: (a, b, c),
                            block_dim: (32, 1, 1),
                            shared_mem_bytes: 0,
                        },
                    ] {
                        // The fast check alone, then the whole of `validate`
                        // (whose slow path checks again, one limit at a time).
                        assert_eq!(cfg.within_limits(), allowed(&cfg), "{cfg:?}");
                        let result = cfg.validate();
                        assert_eq!(result.is_ok(), allowed(&cfg), "{cfg:?}: {result:?}");
                        if let Err(err) = result {
                            refused += 1;
                            let text = err.to_string();
                            let named = if allowed(&LaunchConfig {
                                grid_dim: (1, 1, 1),
                                ..cfg
                            }) {
                                format!("{:?}", cfg.grid_dim)
                            } else {
                                format!("{:?}", cfg.block_dim)
                            };
                            assert!(text.contains(&named), "{cfg:?}: {text}");
                        }
                    }
                }
            }
        }
        assert!(refused > 1_000, "only {refused} refusals");
    }
}
