//! The borrow rules that keep asynchronous GPU work sound, each proved by
//! code that must not compile (these blocks run as `compile_fail` doc tests,
//! each checked for its error code, and the same code with the rule obeyed
//! compiles and runs).
//!
//! # 1. Host memory of an asynchronous copy outlives the copy
//!
//! An asynchronous copy takes host memory only as a [`HostMemory`]
//! ([`PinnedBuffer`], [`UnifiedBuffer`]), whose drop and host access wait for
//! the copies that use it. A plain `Vec` or slice is refused: dropping it
//! would free memory the copy engine may still read.
//!
//! ```compile_fail,E0277
//! # use cuda_streams_driver::{Context, DeviceBuffer, Stream};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! # let mut device = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
//! let host = vec![1.0f32; 4];
//! stream.copy_from_host_async(&mut device, &host).unwrap(); // a Vec is no HostMemory
//! drop(host); // would free what the copy reads
//! ```
//!
//! Obeyed: the same copy from a pinned buffer, whose drop waits for it.
//!
//! ```
//! # use cuda_streams_driver::{Context, DeviceBuffer, PinnedBuffer, Stream};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! # let mut device = DeviceBuffer::<f32>::new_async(&stream, 4).unwrap();
//! let host = PinnedBuffer::from_slice(&ctx, &[1.0f32; 4]).unwrap();
//! stream.copy_from_host_async(&mut device, &host).unwrap();
//! drop(host); // waits for the copy
//! assert_eq!(device.to_vec(&stream).unwrap(), [1.0; 4]);
//! ```
//!
//! # 2. No GPU write behind a live host slice
//!
//! A kernel writes a buffer only when it is lent `&mut`, which no slice of
//! it can outlive: a slice of a unified buffer cannot be held across a launch
//! that writes the buffer.
//!
//! ```compile_fail,E0502
//! # use cuda_streams_driver::{Context, LaunchConfig, Module, Stream, UnifiedBuffer};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! # let fill = Module::load(&ctx, kernels::ELEMENTWISE.fatbin()).unwrap().function("fill_f32").unwrap();
//! # let cfg = LaunchConfig::for_num_elems(4);
//! let mut unified = UnifiedBuffer::<f32>::new(&ctx, 4).unwrap();
//! let slice = unified.as_slice().unwrap();
//! stream.launch(&fill, cfg, &[4u64.into(), 1.0f32.into(), (&mut unified).into()]).unwrap();
//! println!("{}", slice[0]); // would read while the kernel writes
//! ```
//!
//! Obeyed: the slice is taken after the launch, and waits for the write.
//!
//! ```
//! # use cuda_streams_driver::{Context, LaunchConfig, Module, Stream, UnifiedBuffer};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! # let fill = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap().function("fill_f32").unwrap();
//! # let cfg = LaunchConfig::for_num_elems(4);
//! let mut unified = UnifiedBuffer::<f32>::new(&ctx, 4).unwrap();
//! stream.launch(&fill, cfg, &[4u64.into(), 1.0f32.into(), (&mut unified).into()]).unwrap();
//! let slice = unified.as_slice().unwrap(); // waits for the kernel
//! assert_eq!(slice, [1.0; 4]);
//! ```
//!
//! A shared borrow lends the buffer for reading only: a kernel parameter the
//! kernel writes refuses it at run time (the signature says which ones), so
//! a slice held across a *reading* launch is fine.
//!
//! # 3. Unchecked launches are `unsafe`
//!
//! A launch whose arguments are not checked against a declared signature,
//! and the declaration of a signature itself, are promises only the caller
//! can keep.
//!
//! ```compile_fail,E0133
//! # use cuda_streams_driver::{Context, LaunchConfig, Module, Stream};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! # let spin = Module::load(&ctx, &kernels::TIMING).unwrap().function("spin").unwrap();
//! # let cfg = LaunchConfig::for_num_elems(1);
//! stream.launch_unchecked(&spin, cfg, &[1u64.into()]).unwrap();
//! ```
//!
//! ```compile_fail,E0133
//! # use cuda_streams_driver::{Context, Module};
//! # use cuda_streams_driver::sys::signature::{Param, Scalar};
//! # let ctx = Context::new(0).unwrap();
//! # let spin = Module::load(&ctx, &kernels::TIMING).unwrap().function("spin").unwrap();
//! let spin = spin.with_signature(&[Param::Scalar(Scalar::U64)]).unwrap();
//! ```
//!
//! Obeyed: inside `unsafe`, with the contract argued.
//!
//! ```
//! # use cuda_streams_driver::{Context, LaunchConfig, Module, Stream};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! # let spin = Module::load(&ctx, &kernels::TIMING).unwrap().function("spin").unwrap();
//! # let cfg = LaunchConfig::for_num_elems(1);
//! // SAFETY: spin(u64 nanoseconds) takes one u64.
//! unsafe { stream.launch_unchecked(&spin, cfg, &[1u64.into()]) }.unwrap();
//! ```
//!
//! # 4. A device buffer is written only through `&mut`
//!
//! Copies into device memory, memsets and writing kernel parameters take
//! `&mut` of a [`DeviceMemoryMut`]; a shared borrow cannot be written.
//!
//! ```compile_fail,E0308
//! # use cuda_streams_driver::{Context, DeviceBuffer, Stream};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! let device = DeviceBuffer::<u32>::new_async(&stream, 4).unwrap();
//! let reader = &device;
//! stream.memset_u32_async(reader, 0).unwrap(); // a shared borrow
//! ```
//!
//! [`HostMemory`]: crate::HostMemory
//! [`PinnedBuffer`]: crate::PinnedBuffer
//! [`UnifiedBuffer`]: crate::UnifiedBuffer
//! [`DeviceMemoryMut`]: crate::DeviceMemoryMut
