//! What a kernel's C parameters are, as plain data: scalars of an exact type,
//! and pointers that carry their element type, whether the kernel writes
//! through them, and how many elements it touches.
//!
//! Both layers above read the same description: the safe launch in
//! `cuda-streams-driver` checks every argument against it before the driver
//! sees the launch, and the software driver checks every pointer a kernel twin
//! receives against its allocation table (as `compute-sanitizer` would), so a
//! description lives once, beside the kernel, and is never restated.
//!
//! ```
//! use cuda_streams_sys::signature::{Access, Extent, Param, Scalar};
//! // saxpy(u64 n, f32 a, const f32* x, f32* y)
//! const SAXPY: &[Param] = &[
//!     Param::Scalar(Scalar::U64),
//!     Param::Scalar(Scalar::F32),
//!     Param::Pointer { elem: Scalar::F32, access: Access::Read, extent: Extent::Arg(0) },
//!     Param::Pointer { elem: Scalar::F32, access: Access::Write, extent: Extent::Arg(0) },
//! ];
//! assert!(cuda_streams_sys::signature::validate(SAXPY).is_ok());
//! assert_eq!(SAXPY.iter().map(Param::size).sum::<usize>(), 28);
//! ```

use std::fmt;
use std::ops::Range;

/// A C scalar type, by exact width and kind: an `f32` parameter takes an
/// `f32`, never an `f64` or a `u32` of the same size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// `unsigned char`.
    U8,
    /// `unsigned int`.
    U32,
    /// `int`.
    I32,
    /// `unsigned long long` / `size_t`.
    U64,
    /// `long long`.
    I64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl Scalar {
    /// The size in bytes.
    pub const fn size(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// Whether it is an integer type (only integers can count elements).
    pub const fn is_integer(self) -> bool {
        !matches!(self, Self::F32 | Self::F64)
    }

    /// The Rust name of the type.
    pub const fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F32 => "f32",
            Self::F64 => "f64",
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a kernel may write through a pointer parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only reads (`const T*`).
    Read,
    /// Reads and writes, or writes only (`T*`).
    Write,
}

/// How many elements a kernel touches through a pointer parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Extent {
    /// The value of the integer scalar parameter at this index.
    Arg(usize),
    /// A fixed number of elements (e.g. one accumulator).
    Elements(u64),
}

/// One kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// A value of this type.
    Scalar(Scalar),
    /// A `CUdeviceptr` to elements of `elem`, of which the kernel touches
    /// `extent` (from the start), reading or writing as `access` says.
    Pointer {
        /// The element type.
        elem: Scalar,
        /// Whether the kernel writes through it.
        access: Access,
        /// How many elements it touches.
        extent: Extent,
    },
    /// A graph's condition handle (`cudaGraphConditionalHandle`, an
    /// `unsigned long long`), which the kernel sets with
    /// `cudaGraphSetConditional`. Its own kind, not a [`Scalar::U64`], so a
    /// launch can tell a handle from a number: a handle is valid only in
    /// the graph that made it.
    Condition,
}

impl Param {
    /// The size of the argument in the launch's parameter buffer.
    pub const fn size(&self) -> usize {
        match self {
            Self::Scalar(scalar) => scalar.size(),
            Self::Pointer { .. } | Self::Condition => size_of::<u64>(),
        }
    }
}

/// Where each parameter sits in a launch's parameter buffer, as CUDA lays
/// it out: the parameters in order, each at the next offset that is a
/// multiple of its size (8 bytes for pointers and condition handles). The
/// byte range of each, in order.
///
/// ```
/// use cuda_streams_sys::signature::{Access, Extent, Param, Scalar, param_layout};
/// // fill_u32(u64 n, u32 value, u32* out)
/// let out = Param::Pointer { elem: Scalar::U32, access: Access::Write, extent: Extent::Arg(0) };
/// let fill = [Param::Scalar(Scalar::U64), Param::Scalar(Scalar::U32), out];
/// assert_eq!(param_layout(&fill).collect::<Vec<_>>(), [0..8, 8..12, 16..24]);
/// ```
pub fn param_layout(params: &[Param]) -> impl Iterator<Item = Range<usize>> + '_ {
    params.iter().scan(0usize, |end, param| {
        let size = param.size();
        let start = end.next_multiple_of(size);
        *end = start + size;
        Some(start..*end)
    })
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Scalar(scalar) => write!(f, "{scalar}"),
            Self::Pointer { elem, access, .. } => match access {
                Access::Read => write!(f, "a read-only buffer of {elem}"),
                Access::Write => write!(f, "a writable buffer of {elem}"),
            },
            Self::Condition => f.write_str("a graph condition"),
        }
    }
}

/// Why a signature cannot be checked: a pointer's extent names a parameter
/// that does not exist or is not an integer scalar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSignature {
    /// The pointer parameter.
    pub param: usize,
    /// What is wrong with its extent.
    pub reason: String,
}

impl fmt::Display for InvalidSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parameter {}: {}", self.param, self.reason)
    }
}

impl std::error::Error for InvalidSignature {}

/// Check that every pointer's extent refers to an integer scalar parameter.
///
/// ```
/// use cuda_streams_sys::signature::{validate, Access, Extent, Param, Scalar};
/// let bad = [
///     Param::Scalar(Scalar::F32),
///     Param::Pointer { elem: Scalar::F32, access: Access::Write, extent: Extent::Arg(0) },
/// ];
/// assert!(validate(&bad).unwrap_err().to_string().contains("f32"));
/// ```
pub fn validate(params: &[Param]) -> Result<(), InvalidSignature> {
    for (index, param) in params.iter().enumerate() {
        if let Param::Pointer {
            extent: Extent::Arg(count),
            ..
        } = param
        {
            match params.get(*count) {
                Some(Param::Scalar(scalar)) if scalar.is_integer() => {}
                Some(other) => {
                    return Err(InvalidSignature {
                        param: index,
                        reason: format!(
                            "its element count is parameter {count}, which is {other}, not an integer"
                        ),
                    });
                }
                None => {
                    return Err(InvalidSignature {
                        param: index,
                        reason: format!(
                            "its element count is parameter {count}, but the kernel has {} parameter(s)",
                            params.len()
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Read an integer scalar argument of type `scalar` from its bytes (native
/// endianness), as a count: negative values count as zero elements.
///
/// ```
/// use cuda_streams_sys::signature::{count_from_bytes, Scalar};
/// assert_eq!(count_from_bytes(Scalar::U32, &7u32.to_ne_bytes()), Some(7));
/// assert_eq!(count_from_bytes(Scalar::I64, &(-3i64).to_ne_bytes()), Some(0));
/// assert_eq!(count_from_bytes(Scalar::F32, &1f32.to_ne_bytes()), None);
/// ```
pub fn count_from_bytes(scalar: Scalar, bytes: &[u8]) -> Option<u64> {
    let take = |n: usize| bytes.get(..n);
    Some(match scalar {
        Scalar::U8 => u64::from(*bytes.first()?),
        Scalar::U32 => u64::from(u32::from_ne_bytes(take(4)?.try_into().ok()?)),
        Scalar::I32 => i32::from_ne_bytes(take(4)?.try_into().ok()?).max(0) as u64,
        Scalar::U64 => u64::from_ne_bytes(take(8)?.try_into().ok()?),
        Scalar::I64 => i64::from_ne_bytes(take(8)?.try_into().ok()?).max(0) as u64,
        Scalar::F32 | Scalar::F64 => return None,
    })
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is exactly one C scalar type: `u8`, `u32`, `i32`, `u64`,
/// `i64`, `f32` or `f64`. Every bit pattern of them is a valid value, so
/// device memory of elements of [`ScalarType::SCALAR`] may be viewed as a
/// slice of them. Sealed: no other type is one.
///
/// ```
/// use cuda_streams_sys::signature::{Scalar, ScalarType};
/// assert_eq!(<f32 as ScalarType>::SCALAR, Scalar::F32);
/// assert_eq!(<u64 as ScalarType>::SCALAR, Scalar::U64);
/// ```
pub trait ScalarType: sealed::Sealed + Copy + Send + Sync + 'static {
    /// Which scalar it is.
    const SCALAR: Scalar;
}

macro_rules! scalar_type {
    ($($t:ty => $scalar:ident),*) => { $(
        impl sealed::Sealed for $t {}
        impl ScalarType for $t {
            const SCALAR: Scalar = Scalar::$scalar;
        }
    )* };
}
scalar_type!(u8 => U8, u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);

/// The position of `name` in `names`, for declarations that name the
/// parameter counting a pointer (`x: &[f32; n]`); evaluated at compile time
/// by the `kernel!` macro, where a name that is not a parameter fails the
/// build.
///
/// ```
/// use cuda_streams_sys::signature::index_of;
/// const AT: usize = index_of(&["n", "a", "x"], "a");
/// assert_eq!(AT, 1);
/// ```
///
/// # Panics
/// When `name` is not in `names` (at compile time in a `const`).
pub const fn index_of(names: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < names.len() {
        let candidate = names[i].as_bytes();
        let wanted = name.as_bytes();
        if candidate.len() == wanted.len() {
            let mut j = 0;
            while j < wanted.len() && candidate[j] == wanted[j] {
                j += 1;
            }
            if j == wanted.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("a pointer's element count names a parameter the kernel does not have");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_sit_at_their_alignment() {
        let write = |extent| Param::Pointer {
            elem: Scalar::U32,
            access: Access::Write,
            extent,
        };
        // fill_u32(u64 n, u32 value, u32* out): 0, 8, 16.
        let fill = [
            Param::Scalar(Scalar::U64),
            Param::Scalar(Scalar::U32),
            write(Extent::Arg(0)),
        ];
        let starts: Vec<usize> = param_layout(&fill).map(|bytes| bytes.start).collect();
        assert_eq!(starts, [0, 8, 16]);
        // (u8, u32, u8, f64, u8): 0, 4, 8, 16, 24.
        let mixed = [
            Param::Scalar(Scalar::U8),
            Param::Scalar(Scalar::U32),
            Param::Scalar(Scalar::U8),
            Param::Scalar(Scalar::F64),
            Param::Scalar(Scalar::U8),
        ];
        let starts: Vec<usize> = param_layout(&mixed).map(|bytes| bytes.start).collect();
        assert_eq!(starts, [0, 4, 8, 16, 24]);
    }
}
