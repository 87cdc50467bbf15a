//! The launch configuration a kernel's CPU twin runs under: what every
//! twin, raw or safe, is handed first.

/// The launch configuration a twin runs under: `cuLaunchKernel`'s grid,
/// block and shared-memory arguments.
///
/// ```
/// use cuda_streams_soft_driver::LaunchDims;
/// use std::ffi::c_void;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// static THREADS: AtomicU64 = AtomicU64::new(0);
/// // A twin that covers exactly the threads launched (no grid-stride loop).
/// unsafe fn count_threads(dims: &LaunchDims, _params: *mut *mut c_void) {
///     let ((gx, gy, gz), (bx, by, bz)) = (dims.grid, dims.block);
///     THREADS.store(u64::from(gx * gy * gz) * u64::from(bx * by * bz), Ordering::Relaxed);
/// }
/// let dims = LaunchDims { grid: (4, 2, 1), block: (128, 1, 1), shared_mem_bytes: 0 };
/// // SAFETY: the twin reads no arguments.
/// unsafe { count_threads(&dims, std::ptr::null_mut()) };
/// assert_eq!(THREADS.load(Ordering::Relaxed), 1024);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    /// Blocks in the grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}
