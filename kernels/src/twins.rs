//! The CPU twins: each kernel run over its whole range on the calling thread,
//! with its arguments read from the `kernelParams` array, as the software driver
//! calls them from `cuLaunchKernel`.
//!
//! The CUDA kernels use grid-stride loops over the flattened thread index, so
//! their result does not depend on the launch shape; the twins ignore
//! [`LaunchDims`] for the same reason.
//!
//! Device pointers on the software driver are host addresses (with exposed
//! provenance), so a twin turns each `CUdeviceptr` argument back into a pointer.
//! Elements are accessed through raw pointers, one at a time, because arguments
//! may alias (`scale_add` writing into `x`, for one) and slices over aliasing
//! memory would be undefined behaviour.

use crate::reference;
use soft_driver::{LaunchDims, TwinSpec};
use std::ffi::c_void;

use soft_driver::sys::signature::{Access, Extent, Param, Scalar};

const N: Param = Param::Scalar(Scalar::U64);
const F32: Param = Param::Scalar(Scalar::F32);
const U32: Param = Param::Scalar(Scalar::U32);

/// A pointer to `n` elements (parameter 0 counts them in every kernel here).
const fn buffer(elem: Scalar, access: Access) -> Param {
    Param::Pointer {
        elem,
        access,
        extent: Extent::Arg(0),
    }
}

/// The parameters of `saxpy(u64 n, f32 a, const f32* x, f32* y)`.
pub const SAXPY: &[Param] = &[
    N,
    F32,
    buffer(Scalar::F32, Access::Read),
    buffer(Scalar::F32, Access::Write),
];
/// The parameters of `fill_f32(u64 n, f32 value, f32* out)`.
pub const FILL_F32: &[Param] = &[N, F32, buffer(Scalar::F32, Access::Write)];
/// The parameters of `fill_u32(u64 n, u32 value, u32* out)`.
pub const FILL_U32: &[Param] = &[N, U32, buffer(Scalar::U32, Access::Write)];
/// The parameters of `scale_add(u64 n, f32 a, const f32* x, f32 b, const f32* y, f32* out)`.
pub const SCALE_ADD: &[Param] = &[
    N,
    F32,
    buffer(Scalar::F32, Access::Read),
    F32,
    buffer(Scalar::F32, Access::Read),
    buffer(Scalar::F32, Access::Write),
];
/// The parameters of `checksum(u64 n, const u32* data, u64* out)`: `out` is one accumulator.
pub const CHECKSUM: &[Param] = &[
    N,
    buffer(Scalar::U32, Access::Read),
    Param::Pointer {
        elem: Scalar::U64,
        access: Access::Write,
        extent: Extent::Elements(1),
    },
];
/// The parameters of `spin(u64 nanoseconds)`.
pub const SPIN: &[Param] = &[N];
/// The parameters of `compute(u64 n, u32 iterations, const f32* x, f32* y)`.
pub const COMPUTE_PARAMS: &[Param] = &[
    N,
    U32,
    buffer(Scalar::F32, Access::Read),
    buffer(Scalar::F32, Access::Write),
];

/// The twins of `elementwise.cu`.
pub const ELEMENTWISE: &[TwinSpec] = &[
    TwinSpec {
        name: "saxpy",
        params: SAXPY,
        run: saxpy,
    },
    TwinSpec {
        name: "fill_f32",
        params: FILL_F32,
        run: fill_f32,
    },
    TwinSpec {
        name: "fill_u32",
        params: FILL_U32,
        run: fill_u32,
    },
    TwinSpec {
        name: "scale_add",
        params: SCALE_ADD,
        run: scale_add,
    },
];

/// The twins of `reduce.cu`.
pub const REDUCE: &[TwinSpec] = &[TwinSpec {
    name: "checksum",
    params: CHECKSUM,
    run: checksum,
}];

/// The twins of `timing.cu`.
pub const TIMING: &[TwinSpec] = &[TwinSpec {
    name: "spin",
    params: SPIN,
    run: spin,
}];

/// The twins of `compute.cu`.
pub const COMPUTE: &[TwinSpec] = &[TwinSpec {
    name: "compute",
    params: COMPUTE_PARAMS,
    run: compute,
}];

/// Argument `index` of a launch, read as a `T`.
///
/// # Safety
/// `params[index]` must point at a readable value of `T`'s size.
unsafe fn arg<T: Copy>(params: *mut *mut c_void, index: usize) -> T {
    // SAFETY: the caller guarantees `params[index]` exists and points at a `T`;
    // the driver gives no alignment promise, hence the unaligned read.
    unsafe { (*params.add(index)).cast::<T>().read_unaligned() }
}

/// Argument `index`, a `CUdeviceptr`, as a pointer to `T`.
///
/// # Safety
/// As for [`arg`], with a `u64` argument.
unsafe fn ptr_arg<T>(params: *mut *mut c_void, index: usize) -> *mut T {
    // SAFETY: forwarded from the caller.
    let address: u64 = unsafe { arg(params, index) };
    std::ptr::with_exposed_provenance_mut(address as usize)
}

/// Twin of `saxpy(n, a, x, y)`.
///
/// # Safety
/// `params` holds the kernel's four arguments; `x` and `y` point at `n` floats.
pub unsafe fn saxpy(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    unsafe {
        let n: u64 = arg(params, 0);
        let a: f32 = arg(params, 1);
        let x = ptr_arg::<f32>(params, 2);
        let y = ptr_arg::<f32>(params, 3);
        for i in 0..n as usize {
            *y.add(i) = reference::saxpy_element(a, *x.add(i), *y.add(i));
        }
    }
}

/// Twin of `fill_f32(n, value, out)`.
///
/// # Safety
/// `params` holds the kernel's three arguments; `out` points at `n` floats.
pub unsafe fn fill_f32(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    unsafe {
        let n: u64 = arg(params, 0);
        let value: f32 = arg(params, 1);
        let out = ptr_arg::<f32>(params, 2);
        for i in 0..n as usize {
            *out.add(i) = value;
        }
    }
}

/// Twin of `fill_u32(n, value, out)`.
///
/// # Safety
/// `params` holds the kernel's three arguments; `out` points at `n` `u32`s.
pub unsafe fn fill_u32(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    unsafe {
        let n: u64 = arg(params, 0);
        let value: u32 = arg(params, 1);
        let out = ptr_arg::<u32>(params, 2);
        for i in 0..n as usize {
            *out.add(i) = value;
        }
    }
}

/// Twin of `scale_add(n, a, x, b, y, out)`.
///
/// # Safety
/// `params` holds the kernel's six arguments; `x`, `y` and `out` point at `n`
/// floats (they may overlap exactly, as on the GPU).
pub unsafe fn scale_add(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    unsafe {
        let n: u64 = arg(params, 0);
        let a: f32 = arg(params, 1);
        let x = ptr_arg::<f32>(params, 2);
        let b: f32 = arg(params, 3);
        let y = ptr_arg::<f32>(params, 4);
        let out = ptr_arg::<f32>(params, 5);
        for i in 0..n as usize {
            *out.add(i) = reference::scale_add_element(a, *x.add(i), b, *y.add(i));
        }
    }
}

/// Twin of `checksum(n, data, out)`: adds the checksum of `data` to `*out`.
///
/// # Safety
/// `params` holds the kernel's three arguments; `data` points at `n` `u32`s and
/// `out` at one `u64`.
pub unsafe fn checksum(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    unsafe {
        let n: u64 = arg(params, 0);
        let data = ptr_arg::<u32>(params, 1);
        let out = ptr_arg::<u64>(params, 2);
        let mut sum = 0u64;
        for i in 0..n {
            sum = sum.wrapping_add(reference::checksum_term(i, *data.add(i as usize)));
        }
        *out = (*out).wrapping_add(sum);
    }
}

/// Twin of `spin(nanoseconds)`: sleeps rather than spins.
///
/// On the GPU the kernel keeps its stream busy for the duration; here the
/// stream's worker is occupied for as long, without using a CPU core (CI
/// machines have two, and tests run several spins at once).
///
/// # Safety
/// `params` holds the kernel's one argument.
pub unsafe fn spin(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    let nanoseconds: u64 = unsafe { arg(params, 0) };
    std::thread::sleep(std::time::Duration::from_nanos(nanoseconds));
}

/// Twin of `compute(n, iterations, x, y)`.
///
/// # Safety
/// `params` holds the kernel's four arguments; `x` and `y` point at `n` floats.
pub unsafe fn compute(_dims: &LaunchDims, params: *mut *mut c_void) {
    // SAFETY: the launch contract above.
    unsafe {
        let n: u64 = arg(params, 0);
        let iterations: u32 = arg(params, 1);
        let x = ptr_arg::<f32>(params, 2);
        let y = ptr_arg::<f32>(params, 3);
        for i in 0..n as usize {
            *y.add(i) = reference::compute_element(iterations, *x.add(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIMS: LaunchDims = LaunchDims {
        grid: (3, 1, 1),
        block: (32, 1, 1),
        shared_mem_bytes: 0,
    };

    struct XorShift(u64);
    impl XorShift {
        fn next_u32(&mut self) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 32) as u32
        }
        /// Uniform in [-1, 1), never zero.
        fn next_f32(&mut self) -> f32 {
            let v = (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
            if v == 0.0 { 0.25 } else { v }
        }
        fn f32s(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next_f32()).collect()
        }
        fn u32s(&mut self, n: usize) -> Vec<u32> {
            (0..n).map(|_| self.next_u32() | 1).collect()
        }
    }

    /// A `CUdeviceptr` for host memory, as the software driver hands them out.
    fn dptr<T>(p: *const T) -> u64 {
        p.expose_provenance() as u64
    }

    /// Run `twin` with `args` laid out as a kernelParams array.
    fn launch(twin: KernelTwin, args: &mut [&mut dyn Arg]) {
        let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| (**a).as_param()).collect();
        // SAFETY: each params entry points at a live argument of the kernel's
        // type; pointer arguments address host vectors of the right length.
        unsafe { twin(&DIMS, params.as_mut_ptr()) };
    }

    trait Arg {
        fn as_param(&mut self) -> *mut c_void;
    }
    impl<T> Arg for T {
        fn as_param(&mut self) -> *mut c_void {
            (self as *mut T).cast()
        }
    }

    use soft_driver::KernelTwin;

    const N: usize = 1000;

    #[test]
    fn saxpy_matches_reference() {
        let mut rng = XorShift(0x1234_5678_9abc_def1);
        let (a, x, y0) = (rng.next_f32(), rng.f32s(N), rng.f32s(N));
        let mut y = y0.clone();
        launch(
            saxpy,
            &mut [
                &mut (N as u64),
                &mut { a },
                &mut dptr(x.as_ptr()),
                &mut dptr(y.as_mut_ptr()),
            ],
        );
        let mut expected = y0;
        reference::saxpy(a, &x, &mut expected);
        assert_eq!(y, expected);
        assert!(
            y.iter().zip(&x).any(|(y, x)| y != x),
            "saxpy changed nothing"
        );
    }

    #[test]
    fn fills_match_reference() {
        let mut rng = XorShift(0x2345_6789_abcd_ef12);
        let (vf, vu) = (rng.next_f32(), rng.next_u32() | 1);
        let mut out_f = rng.f32s(N);
        let mut out_u = rng.u32s(N);
        launch(
            fill_f32,
            &mut [
                &mut (N as u64 - 1),
                &mut { vf },
                &mut dptr(out_f.as_mut_ptr()),
            ],
        );
        launch(
            fill_u32,
            &mut [
                &mut (N as u64 - 1),
                &mut { vu },
                &mut dptr(out_u.as_mut_ptr()),
            ],
        );
        assert!(out_f[..N - 1].iter().all(|&v| v == vf));
        assert!(out_u[..N - 1].iter().all(|&v| v == vu));
        // n bounds the write.
        assert_ne!(out_f[N - 1], vf);
        assert_ne!(out_u[N - 1], vu);
    }

    #[test]
    fn scale_add_matches_reference_even_in_place() {
        let mut rng = XorShift(0x3456_789a_bcde_f123);
        let (a, b, x, y) = (rng.next_f32(), rng.next_f32(), rng.f32s(N), rng.f32s(N));
        let mut expected = vec![0.0; N];
        reference::scale_add(a, &x, b, &y, &mut expected);

        let mut out = vec![0.0f32; N];
        let args = |out: u64, x: &[f32]| (N as u64, a, dptr(x.as_ptr()), b, dptr(y.as_ptr()), out);
        let (mut n, mut a1, mut x1, mut b1, mut y1, mut o1) = args(dptr(out.as_mut_ptr()), &x);
        launch(
            scale_add,
            &mut [&mut n, &mut a1, &mut x1, &mut b1, &mut y1, &mut o1],
        );
        assert_eq!(out, expected);

        // out == x: the GPU kernel allows it, so must the twin.
        let mut inout = x.clone();
        let p = dptr(inout.as_mut_ptr());
        let (mut n, mut a1, _, mut b1, mut y1, _) = args(0, &x);
        launch(
            scale_add,
            &mut [&mut n, &mut a1, &mut { p }, &mut b1, &mut y1, &mut { p }],
        );
        assert_eq!(inout, expected);
    }

    #[test]
    fn checksum_adds_the_reference_to_out() {
        let mut rng = XorShift(0x4567_89ab_cdef_1234);
        let data = rng.u32s(N);
        let start = u64::from(rng.next_u32()) << 32 | u64::from(rng.next_u32());
        let mut out = start;
        launch(
            checksum,
            &mut [
                &mut (N as u64),
                &mut dptr(data.as_ptr()),
                &mut dptr(&mut out as *mut u64),
            ],
        );
        assert_eq!(out, start.wrapping_add(reference::checksum(&data)));
        assert_ne!(reference::checksum(&data), 0);
    }

    #[test]
    fn compute_matches_reference() {
        let mut rng = XorShift(0x5678_9abc_def1_2345);
        let x = rng.f32s(N);
        let mut y = vec![0.0f32; N];
        launch(
            compute,
            &mut [
                &mut (N as u64),
                &mut 37u32,
                &mut dptr(x.as_ptr()),
                &mut dptr(y.as_mut_ptr()),
            ],
        );
        let mut expected = vec![0.0; N];
        reference::compute(37, &x, &mut expected);
        assert_eq!(y, expected);
        // 37 halvings of the start: every element is (almost exactly) 2x.
        assert!(
            y.iter()
                .zip(&x)
                .all(|(y, x)| (y - 2.0 * x).abs() <= 1e-6 * x.abs().max(1.0))
        );
    }

    #[test]
    fn spin_sleeps_for_the_duration() {
        let start = std::time::Instant::now();
        launch(spin, &mut [&mut 20_000_000u64]);
        assert!(start.elapsed() >= std::time::Duration::from_millis(20));
    }

    #[test]
    fn zero_elements_touch_nothing() {
        // Null pointers with n = 0 are legal launches on the GPU.
        for twin in [saxpy, fill_f32, fill_u32, compute] {
            launch(twin, &mut [&mut 0u64, &mut 0u32, &mut 0u64, &mut 0u64]);
        }
        launch(
            scale_add,
            &mut [
                &mut 0u64, &mut 0u32, &mut 0u64, &mut 0u32, &mut 0u64, &mut 0u64,
            ],
        );
    }
}
