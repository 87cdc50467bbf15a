//! Working with other Rust CUDA libraries in the same process.
//!
//! Both libraries talk to the same `libcuda.so.1` (each loads it at run
//! time), so their handles mean the same thing to the driver: what this
//! module adds is the ownership and ordering rules that make sharing them
//! safe. Interop needs NVIDIA's driver: the software driver is ours alone,
//! and every conversion from a [`Context`](crate::Context) running on it is
//! refused with [`Error::Interop`](crate::Error::Interop).

#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub mod cudarc;
#[cfg(feature = "cust")]
#[cfg_attr(docsrs, doc(cfg(feature = "cust")))]
pub mod cust;
