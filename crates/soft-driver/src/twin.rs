//! Safe CPU twins: a kernel's CPU implementation written over typed slices
//! and scalars, never raw pointers.
//!
//! The driver hands a [`Twin`] checked views of the launch's arguments
//! ([`TwinArgs`]): before the twin runs, every pointer parameter has been
//! checked as memcheck would (live, in bounds for the elements the
//! declaration says the kernel touches, reachable from the device) and
//! aligned for its element type, so the views are sound:
//! - a read-only parameter becomes a `&[T]`, a written one a `&mut [T]` of
//!   exactly the declared element count;
//! - a written range never overlaps another pointer's range: two written
//!   parameters over the same bytes fail the launch (a kernel racing with
//!   itself), and a read-only parameter that overlaps a written one is
//!   handed over as a copy taken when the launch starts (what an
//!   element-wise kernel computing `x[i] = f(x[i])` reads on a GPU too);
//! - each parameter is handed out once, in order, with a check of its type.
//!
//! Declarations made with `cuda_streams_driver::kernel!` generate the calls
//! to [`TwinArgs`]; a twin written by hand looks like this:
//!
//! ```
//! use cuda_streams_soft_driver::{LaunchDims, Twin, TwinArgs};
//! /// Twin of `scale(u64 n, float a, float* y)`: y[i] *= a.
//! fn scale(_dims: &LaunchDims, args: &mut TwinArgs<'_>) {
//!     let _n: u64 = args.scalar();
//!     let a: f32 = args.scalar();
//!     for y in args.slice_mut::<f32>() {
//!         *y *= a;
//!     }
//! }
//! let twin: Twin = scale;
//! # let _ = twin;
//! ```

use crate::launch_dims::LaunchDims;
use std::marker::PhantomData;
use sys::signature::{Access, Param, Scalar, ScalarType};

/// A safe CPU twin: called once per launch, on the stream's worker, with
/// the launch shape and checked views of the arguments. A panic fails the
/// launch (`CUDA_ERROR_LAUNCH_FAILED`, the message in the error's detail)
/// and, as any fault of a kernel, the context's later work.
pub type Twin = fn(&LaunchDims, &mut TwinArgs<'_>);

/// One argument as the twin receives it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum View {
    Scalar {
        scalar: Scalar,
        bytes: [u8; 8],
    },
    Read {
        elem: Scalar,
        ptr: usize,
        len: usize,
    },
    Write {
        elem: Scalar,
        ptr: usize,
        len: usize,
    },
}

/// The checked arguments of one launch, handed out in parameter order.
///
/// Each accessor takes the next parameter and panics (failing the launch
/// with a message naming the kernel and the parameter) when it is not of
/// the kind and type asked for. The slices live as long as the twin's call.
pub struct TwinArgs<'a> {
    kernel: &'static str,
    views: Vec<View>,
    next: usize,
    _memory: PhantomData<&'a mut [u8]>,
}

impl<'a> TwinArgs<'a> {
    /// Views over checked memory.
    ///
    /// # Safety
    /// Every `Read` view addresses `len` initialised elements of `elem`,
    /// aligned, that nothing writes for `'a`; every `Write` view addresses
    /// `len` such elements that nothing else reads or writes for `'a`
    /// (including the other views).
    pub(crate) unsafe fn new(kernel: &'static str, views: Vec<View>) -> Self {
        Self {
            kernel,
            views,
            next: 0,
            _memory: PhantomData,
        }
    }

    /// The kernel's name.
    pub fn kernel(&self) -> &'static str {
        self.kernel
    }

    /// How many arguments the launch has.
    pub fn len(&self) -> usize {
        self.views.len()
    }

    /// Whether the kernel takes no arguments.
    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    fn take(&mut self, wanted: &str) -> (usize, View) {
        let index = self.next;
        let Some(view) = self.views.get(index).copied() else {
            panic!(
                "twin of `{}` asked for parameter {index} ({wanted}), but the kernel has {} parameter(s)",
                self.kernel,
                self.views.len()
            );
        };
        self.next += 1;
        (index, view)
    }

    fn wrong(&self, index: usize, wanted: String, view: View) -> ! {
        let found = match view {
            View::Scalar { scalar, .. } => format!("a {scalar}"),
            View::Read { elem, .. } => format!("a read-only buffer of {elem}"),
            View::Write { elem, .. } => format!("a written buffer of {elem}"),
        };
        panic!(
            "twin of `{}` asked for parameter {index} as {wanted}, but it is declared as {found}",
            self.kernel
        )
    }

    /// The next parameter, a scalar of type `T`.
    pub fn scalar<T: ScalarType>(&mut self) -> T {
        let (index, view) = self.take(T::SCALAR.name());
        match view {
            View::Scalar { scalar, bytes } if scalar == T::SCALAR => {
                // SAFETY: `bytes` holds a value of `T::SCALAR`, i.e. of `T`
                // (ScalarType is sealed to the seven scalars, each valid for
                // every bit pattern); an unaligned read of size_of::<T>() <= 8.
                unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
            }
            other => self.wrong(index, format!("a {}", T::SCALAR), other),
        }
    }

    /// The next parameter, a read-only buffer of `T`, as a slice of the
    /// declared element count.
    pub fn slice<T: ScalarType>(&mut self) -> &'a [T] {
        let (index, view) = self.take("a read-only slice");
        match view {
            View::Read { elem, ptr, len } if elem == T::SCALAR => {
                if len == 0 {
                    return &[];
                }
                // SAFETY: `new`'s contract: `len` aligned, initialised
                // elements of `T` that nothing writes for 'a.
                unsafe { std::slice::from_raw_parts(std::ptr::with_exposed_provenance(ptr), len) }
            }
            other => self.wrong(index, format!("a read-only buffer of {}", T::SCALAR), other),
        }
    }

    /// The next parameter, a written buffer of `T`, as a mutable slice of
    /// the declared element count.
    pub fn slice_mut<T: ScalarType>(&mut self) -> &'a mut [T] {
        let (index, view) = self.take("a mutable slice");
        match view {
            View::Write { elem, ptr, len } if elem == T::SCALAR => {
                if len == 0 {
                    return &mut [];
                }
                // SAFETY: `new`'s contract: `len` aligned, initialised
                // elements of `T` that nothing else touches for 'a; the cursor
                // hands each parameter out once, so this is the only slice.
                unsafe {
                    std::slice::from_raw_parts_mut(std::ptr::with_exposed_provenance_mut(ptr), len)
                }
            }
            other => self.wrong(index, format!("a written buffer of {}", T::SCALAR), other),
        }
    }
}

impl std::fmt::Debug for TwinArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwinArgs")
            .field("kernel", &self.kernel)
            .field("args", &self.views.len())
            .field("next", &self.next)
            .finish()
    }
}

/// One thread of a launch's grid, as a per-thread twin sees it: CUDA's
/// `blockIdx`, `threadIdx`, `blockDim` and `gridDim`.
///
/// ```
/// use cuda_streams_soft_driver::LaunchDims;
/// let dims = LaunchDims { grid: (2, 1, 1), block: (4, 1, 1), shared_mem_bytes: 0 };
/// let ids: Vec<usize> = dims.threads().map(|t| t.global_x()).collect();
/// assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6, 7]);
/// assert_eq!(dims.threads().last().unwrap().grid_threads_x(), 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thread {
    /// `blockIdx`.
    pub block_idx: (u32, u32, u32),
    /// `threadIdx`.
    pub thread_idx: (u32, u32, u32),
    /// `blockDim`.
    pub block_dim: (u32, u32, u32),
    /// `gridDim`.
    pub grid_dim: (u32, u32, u32),
}

impl Thread {
    /// `blockIdx.x * blockDim.x + threadIdx.x`.
    pub fn global_x(&self) -> usize {
        self.block_idx.0 as usize * self.block_dim.0 as usize + self.thread_idx.0 as usize
    }

    /// `blockIdx.y * blockDim.y + threadIdx.y`.
    pub fn global_y(&self) -> usize {
        self.block_idx.1 as usize * self.block_dim.1 as usize + self.thread_idx.1 as usize
    }

    /// `gridDim.x * blockDim.x`: the stride of a grid-stride loop.
    pub fn grid_threads_x(&self) -> usize {
        self.grid_dim.0 as usize * self.block_dim.0 as usize
    }
}

impl LaunchDims {
    /// Every thread of the grid, blocks in order and threads in order
    /// within each block (x fastest), as a per-thread twin is run.
    pub fn threads(&self) -> impl Iterator<Item = Thread> + use<> {
        let (grid, block) = (self.grid, self.block);
        let blocks = (0..grid.2)
            .flat_map(move |z| (0..grid.1).flat_map(move |y| (0..grid.0).map(move |x| (x, y, z))));
        blocks.flat_map(move |block_idx| {
            (0..block.2).flat_map(move |z| {
                (0..block.1).flat_map(move |y| {
                    (0..block.0).map(move |x| Thread {
                        block_idx,
                        thread_idx: (x, y, z),
                        block_dim: block,
                        grid_dim: grid,
                    })
                })
            })
        })
    }
}

/// The views of a launch's arguments for a safe twin, after the memcheck
/// checks: pointers aligned for their element type, written ranges disjoint
/// from every other pointer's, read ranges that overlap a written one
/// copied into `snapshots`. An error is the fault's detail.
pub(crate) fn views(
    kernel: &'static str,
    params: &[Param],
    scalar_bytes: impl Fn(usize) -> [u8; 8],
    counts: &[u64],
    snapshots: &mut Vec<Box<[u128]>>,
) -> Result<Vec<View>, String> {
    let mut views = Vec::with_capacity(params.len());
    for (index, param) in params.iter().enumerate() {
        let bytes = scalar_bytes(index);
        views.push(match *param {
            Param::Scalar(scalar) => View::Scalar { scalar, bytes },
            // The twin reads a condition as the `u64` handle it is, for
            // `set_conditional`.
            Param::Condition => View::Scalar {
                scalar: Scalar::U64,
                bytes,
            },
            Param::Pointer { elem, access, .. } => {
                let ptr = usize::try_from(u64::from_ne_bytes(bytes)).unwrap_or(usize::MAX);
                let len = usize::try_from(counts[index]).unwrap_or(usize::MAX);
                if len > 0 && !ptr.is_multiple_of(elem.size()) {
                    return Err(format!(
                        "kernel `{kernel}` parameter {index}: {ptr:#x} is not aligned for {elem} \
                         ({} bytes)",
                        elem.size()
                    ));
                }
                match access {
                    Access::Read => View::Read { elem, ptr, len },
                    Access::Write => View::Write { elem, ptr, len },
                }
            }
        });
    }
    let range = |view: &View| match *view {
        View::Read { elem, ptr, len } | View::Write { elem, ptr, len } if len > 0 => {
            Some((ptr, ptr + len * elem.size()))
        }
        _ => None,
    };
    let overlaps = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    for i in 0..views.len() {
        let (View::Write { .. }, Some(written)) = (views[i], range(&views[i])) else {
            continue;
        };
        for (j, view) in views.iter_mut().enumerate() {
            let Some(other) = range(view).filter(|_| i != j) else {
                continue;
            };
            if !overlaps(written, other) {
                continue;
            }
            match *view {
                View::Write { .. } => {
                    return Err(format!(
                        "kernel `{kernel}`: parameters {} and {} are both written and their \
                         ranges overlap ({:#x}..{:#x} and {:#x}..{:#x}); a twin cannot hold two \
                         mutable slices of the same memory",
                        i.min(j),
                        i.max(j),
                        written.0,
                        written.1,
                        other.0,
                        other.1
                    ));
                }
                View::Read { elem, len, .. } => {
                    // The launch-time values, as an element-wise kernel
                    // writing in place reads them.
                    let bytes = other.1 - other.0;
                    let mut copy = vec![0u128; bytes.div_ceil(16)].into_boxed_slice();
                    // SAFETY: the source range is live and in bounds
                    // (checked), the copy has room for `bytes`, and they are
                    // distinct allocations.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            std::ptr::with_exposed_provenance::<u8>(other.0),
                            copy.as_mut_ptr().cast::<u8>(),
                            bytes,
                        )
                    };
                    let ptr = copy.as_ptr().expose_provenance();
                    snapshots.push(copy);
                    *view = View::Read { elem, ptr, len };
                }
                View::Scalar { .. } => {}
            }
        }
    }
    Ok(views)
}
