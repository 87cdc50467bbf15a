//! The features: what users do with streams, built on the enqueue protocol.
//!
//! Copies, memsets and prefetches ([`copy`]), launches ([`launch`], their
//! shape in [`launch_config`]),
//! programmatic dependent launches ([`dependent_launch`]) and kernel
//! declarations ([`declare`]), loaded modules ([`module`]), run-time
//! compilation with NVRTC ([`program`]), host callbacks ([`callback`]),
//! graphs ([`graph`]), futures ([`future`]) and the reactor that wakes them
//! ([`reactor`]), interop with other Rust CUDA libraries (`interop`), and device memory and
//! events shared between processes ([`ipc`]).
//!
//! What it may import: every layer below (the ground, the objects, the
//! enqueue protocol) and other features. Nothing below imports a feature,
//! but for the context, which holds its reactor.

pub(crate) mod callback;
pub(crate) mod closest_name;
pub(crate) mod copy;
pub(crate) mod declare;
pub(crate) mod dependent_launch;
pub(crate) mod future;
pub(crate) mod graph;
#[cfg(any(feature = "cudarc", feature = "cust"))]
pub mod interop;
pub(crate) mod ipc;
pub(crate) mod kernel_arg;
pub(crate) mod kernel_decl;
pub(crate) mod launch;
pub(crate) mod launch_config;
pub(crate) mod launch_raw;
pub(crate) mod module;
pub(crate) mod partition_function;
pub(crate) mod partition_load;
pub(crate) mod pdl_policy;
pub(crate) mod program;
pub(crate) mod reactor;
