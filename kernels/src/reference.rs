//! Plain CPU implementations of every kernel: the oracle for tests and the
//! arithmetic of the CPU twins.
//!
//! Each computation is written once, per element (`*_element`); the slice
//! functions and the twins both call those, so the twins cannot drift from the
//! reference. Products and sums are fused (`f32::mul_add`) exactly where the CUDA
//! source writes `fmaf`, so results are bit-identical to the GPU's.

/// The multiplier in [`checksum_term`]: 2^64 divided by the golden ratio.
pub const CHECKSUM_GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// One element of `saxpy`: `a * x + y`, fused.
#[inline]
pub fn saxpy_element(a: f32, x: f32, y: f32) -> f32 {
    a.mul_add(x, y)
}

/// One element of `chain_step_f32`: `x + 1`.
#[inline]
pub fn chain_step_element(x: f32) -> f32 {
    x + 1.0
}

/// One element of `scale_add`: `a * x + (b * y)`, the first product fused.
#[inline]
pub fn scale_add_element(a: f32, x: f32, b: f32, y: f32) -> f32 {
    a.mul_add(x, b * y)
}

/// The contribution of element `index` with value `value` to `checksum`.
#[inline]
pub fn checksum_term(index: u64, value: u32) -> u64 {
    u64::from(value) ^ index.wrapping_mul(CHECKSUM_GOLDEN)
}

/// One element of `compute`: `iterations` steps of `v = v * 0.5 + x`, fused,
/// starting from `v = x`.
#[inline]
pub fn compute_element(iterations: u32, x: f32) -> f32 {
    let mut v = x;
    for _ in 0..iterations {
        v = v.mul_add(0.5, x);
    }
    v
}

/// `y[i] = a * x[i] + y[i]`.
///
/// # Panics
/// When `x` and `y` differ in length.
///
/// ```
/// let mut y = [1.0, 2.0];
/// cuda_streams_kernels::reference::saxpy(2.0, &[10.0, 20.0], &mut y);
/// assert_eq!(y, [21.0, 42.0]);
/// ```
pub fn saxpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_same_len("saxpy", x.len(), y.len());
    for (y, &x) in y.iter_mut().zip(x) {
        *y = saxpy_element(a, x, *y);
    }
}

/// `out[i] = value`.
///
/// ```
/// let mut out = [0.0; 3];
/// cuda_streams_kernels::reference::fill_f32(1.5, &mut out);
/// assert_eq!(out, [1.5; 3]);
/// ```
pub fn fill_f32(value: f32, out: &mut [f32]) {
    out.fill(value);
}

/// `out[i] = value`.
///
/// ```
/// let mut out = [0; 3];
/// cuda_streams_kernels::reference::fill_u32(7, &mut out);
/// assert_eq!(out, [7; 3]);
/// ```
pub fn fill_u32(value: u32, out: &mut [u32]) {
    out.fill(value);
}

/// `out[i] = a * x[i] + b * y[i]`.
///
/// # Panics
/// When `x`, `y` and `out` are not all the same length.
///
/// ```
/// let mut out = [0.0; 2];
/// cuda_streams_kernels::reference::scale_add(2.0, &[1.0, 2.0], 3.0, &[10.0, 20.0], &mut out);
/// assert_eq!(out, [32.0, 64.0]);
/// ```
pub fn scale_add(a: f32, x: &[f32], b: f32, y: &[f32], out: &mut [f32]) {
    assert_same_len("scale_add", x.len(), y.len());
    assert_same_len("scale_add", x.len(), out.len());
    for ((out, &x), &y) in out.iter_mut().zip(x).zip(y) {
        *out = scale_add_element(a, x, b, y);
    }
}

/// The checksum of `data`: the wrapping sum of [`checksum_term`] over all
/// elements. The `checksum` kernel adds exactly this to its output word.
///
/// ```
/// use cuda_streams_kernels::reference::{checksum, CHECKSUM_GOLDEN};
/// assert_eq!(checksum(&[5, 0]), 5 + CHECKSUM_GOLDEN);
/// assert_ne!(checksum(&[1, 2]), checksum(&[2, 1]));
/// ```
pub fn checksum(data: &[u32]) -> u64 {
    data.iter()
        .zip(0u64..)
        .fold(0u64, |sum, (&v, i)| sum.wrapping_add(checksum_term(i, v)))
}

/// `y[i] = compute_element(iterations, x[i])`.
///
/// # Panics
/// When `x` and `y` differ in length.
///
/// ```
/// let mut y = [0.0; 2];
/// cuda_streams_kernels::reference::compute(1, &[1.0, 2.0], &mut y);
/// assert_eq!(y, [1.5, 3.0]);
/// ```
pub fn compute(iterations: u32, x: &[f32], y: &mut [f32]) {
    assert_same_len("compute", x.len(), y.len());
    for (y, &x) in y.iter_mut().zip(x) {
        *y = compute_element(iterations, x);
    }
}

fn assert_same_len(kernel: &str, a: usize, b: usize) {
    assert!(
        a == b,
        "{kernel}: slices of different lengths ({a} and {b} elements)"
    );
}

/// One Jacobi sweep of `tridiag(-1, 4, -1) x = b` (`x[-1] = x[n] = 0`):
/// `y[i] = ((b[i] + x[i-1]) + x[i+1]) * 0.25`, in that order; returns the
/// largest `|y[i] - x[i]|` (what `jacobi_sweep` leaves in `*delta`, from 0).
///
/// ```
/// let (b, x, mut y) = ([4.0f32, 4.0], [0.0f32, 0.0], [0.0f32; 2]);
/// assert_eq!(cuda_streams_kernels::reference::jacobi_sweep(&b, &x, &mut y), 1.0);
/// assert_eq!(y, [1.0, 1.0]);
/// ```
pub fn jacobi_sweep(b: &[f32], x: &[f32], y: &mut [f32]) -> f32 {
    let n = x.len();
    let mut delta = 0.0f32;
    for (i, y) in y.iter_mut().enumerate() {
        let left = if i > 0 { x[i - 1] } else { 0.0 };
        let right = if i + 1 < n { x[i + 1] } else { 0.0 };
        *y = ((b[i] + left) + right) * 0.25;
        delta = delta.max((*y - x[i]).abs());
    }
    delta
}
