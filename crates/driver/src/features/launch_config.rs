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
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidLaunchConfig { reason });
        let (bx, by, bz) = self.block_dim;
        let (gx, gy, gz) = self.grid_dim;
        if bx == 0 || by == 0 || bz == 0 {
            return invalid(format!(
                "block_dim {:?} has a zero dimension",
                self.block_dim
            ));
        }
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if threads > u64::from(Self::MAX_THREADS_PER_BLOCK) {
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
