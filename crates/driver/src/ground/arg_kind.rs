//! What a kernel argument is: a plain description, for the signature checks
//! of launches and for the errors that report a mismatch (which is why it
//! lives on the ground floor, beside the error type).

use std::fmt;
use sys::signature::Scalar;

/// What a [`KernelArg`](crate::KernelArg) is, for signature checks and error messages.
///
/// ```
/// use cuda_streams_driver::{ArgKind, Context, DeviceBuffer, KernelArg, Stream};
/// use cuda_streams_driver::sys::signature::Scalar;
/// let ctx = Context::new(0).unwrap();
/// let stream = Stream::new(&ctx).unwrap();
/// let mut buf = DeviceBuffer::<f32>::new_async(&stream, 16).unwrap();
/// assert_eq!(KernelArg::from(2.5f32).kind(), ArgKind::Scalar(Scalar::F32));
/// assert_eq!(KernelArg::from(2.5).kind(), ArgKind::Scalar(Scalar::F64), "an unsuffixed float is f64");
/// assert_eq!(
///     KernelArg::from(&mut buf).kind(),
///     ArgKind::Buffer { elem: Some(Scalar::F32), writable: true }
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgKind {
    /// A value of this scalar type.
    Scalar(Scalar),
    /// A buffer: its element type when it is a C scalar, and whether it was
    /// lent mutably (`&mut`), so the kernel may write it.
    Buffer {
        /// The element type, when it is a C scalar type.
        elem: Option<Scalar>,
        /// Whether the kernel may write it.
        writable: bool,
    },
    /// A raw device pointer ([`KernelArg::raw_pointer`](crate::KernelArg::raw_pointer)): unchecked launches only.
    RawPointer,
    /// A graph's condition handle ([`Condition`](crate::Condition)): only for
    /// a parameter declared as one, in a launch captured in its graph.
    Condition,
}

impl fmt::Display for ArgKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Scalar(scalar) => write!(f, "{scalar}"),
            Self::Buffer { elem, writable } => {
                let lent = if *writable { "&mut" } else { "&" };
                match elem {
                    Some(elem) => write!(f, "a buffer of {elem} lent as {lent}"),
                    None => write!(f, "a buffer of a non-scalar type lent as {lent}"),
                }
            }
            Self::RawPointer => f.write_str("a raw pointer"),
            Self::Condition => f.write_str("a graph condition"),
        }
    }
}
