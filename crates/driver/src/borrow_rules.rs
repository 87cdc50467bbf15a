//! The borrow rules that keep asynchronous GPU work sound, each proved by
//! code that must not compile, and shown obeyed by code that compiles and runs.
//!
//! The code that must not compile is the driver crate's
//! `tests/compile_fail/*.rs`, shown here as it is tested: the `borrow_rules`
//! test compiles each case with `trybuild` and compares the compiler's errors
//! with the case's `.stderr` snapshot, error code included. rustdoc's
//! `compile_fail` would accept any error (it does not check the code on
//! stable), so a proof broken by a typo would still pass; a snapshot does not.
//! The obeyed examples are doc tests.
//!
//! # 1. Host memory of an asynchronous copy outlives the copy
//!
//! An asynchronous copy takes host memory only as a [`HostMemory`]
//! ([`PinnedBuffer`], [`UnifiedBuffer`]), whose drop and host access wait for
//! the copies that use it. A plain `Vec` or slice is refused: dropping it
//! would free memory the copy engine may still read.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/async_copy_needs_host_memory.rs"), "```")]
//!
//! Refused: `E0277`, `Vec<f32>: HostMemory<f32>` is not satisfied.
//!
//! A copy that writes host memory takes it `&mut`, so no slice of it is held
//! while the copy is queued.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/pinned_slice_across_async_copy.rs"), "```")]
//!
//! Refused: `E0502`, `host` borrowed as mutable while borrowed as immutable.
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
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/unified_slice_across_writing_launch.rs"), "```")]
//!
//! Refused: `E0502`, `unified` borrowed as mutable while borrowed as immutable.
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
//! A kernel argument borrows its buffer for as long as it exists, with the
//! borrow it was made from: `&mut` lends exclusively, so one launch cannot
//! take a buffer twice for writing, or for writing and reading, and a buffer
//! cannot be freed, or go out of scope, while an argument list holds it.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/one_buffer_lent_twice_for_writing.rs"), "```")]
//!
//! Refused: `E0499`, `data` borrowed as mutable twice.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/one_buffer_read_and_written.rs"), "```")]
//!
//! Refused: `E0502`, `data` borrowed as mutable while borrowed as immutable.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/buffer_dropped_while_lent.rs"), "```")]
//!
//! Refused: `E0505`, `data` moved out (dropped) while borrowed.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/argument_outlives_buffer.rs"), "```")]
//!
//! Refused: `E0597`, `data` does not live long enough.
//!
//! # 3. Unchecked launches are `unsafe`
//!
//! A launch whose arguments are not checked against a declared signature,
//! and the declaration of a signature itself, are promises only the caller
//! can keep.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/launch_unchecked_needs_unsafe.rs"), "```")]
//!
//! Refused: `E0133`, a call to an unsafe function outside `unsafe`.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/with_signature_needs_unsafe.rs"), "```")]
//!
//! Refused: `E0133`, likewise.
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
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/memset_needs_mut.rs"), "```")]
//!
//! Refused: `E0308`, the parameter is `&mut`, the argument `&`.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/copy_into_shared_borrow.rs"), "```")]
//!
//! Refused: `E0308`, likewise.
//!
//! # 5. Views of a buffer borrow it as `&[T]` and `&mut [T]` do
//!
//! [`DeviceBuffer::slice`] borrows the buffer shared and lends its range for
//! reading only; [`DeviceBuffer::slice_mut`] borrows it mutably, so no other
//! view, and no drop of the buffer, can happen while the GPU may be told to
//! write through it.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/read_slice_cannot_be_written.rs"), "```")]
//!
//! Refused: `E0277`, a read view is no `DeviceMemoryMut`.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/slice_mut_while_slice_lives.rs"), "```")]
//!
//! Refused: `E0502`, a writable view while a read view is in use.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/two_mutable_slices_at_once.rs"), "```")]
//!
//! Refused: `E0499`, two writable views at once.
//!
#![doc = concat!("```ignore\n", include_str!("../tests/compile_fail/slice_outlives_its_buffer.rs"), "```")]
//!
//! Refused: `E0505`, the buffer dropped while a view of it is in use.
//!
//! Obeyed: one writable view at a time.
//!
//! ```
//! # use cuda_streams_driver::{Context, DeviceBuffer, Stream};
//! # let ctx = Context::new(0).unwrap();
//! # let stream = Stream::new(&ctx).unwrap();
//! let mut device = DeviceBuffer::<u32>::zeroed_async(&stream, 8).unwrap();
//! stream.memset_u32_async(&mut device.slice_mut(0..4).unwrap(), 1).unwrap();
//! stream.memset_u32_async(&mut device.slice_mut(4..8).unwrap(), 2).unwrap();
//! assert_eq!(device.to_vec(&stream).unwrap(), [1, 1, 1, 1, 2, 2, 2, 2]);
//! ```
//!
//! [`DeviceBuffer::slice`]: crate::DeviceBuffer::slice
//! [`DeviceBuffer::slice_mut`]: crate::DeviceBuffer::slice_mut
//! [`HostMemory`]: crate::HostMemory
//! [`PinnedBuffer`]: crate::PinnedBuffer
//! [`UnifiedBuffer`]: crate::UnifiedBuffer
//! [`DeviceMemoryMut`]: crate::DeviceMemoryMut
