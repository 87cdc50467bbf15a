//! Programmatic dependent launches in a capture ([`Capture::launch_programmatic`]).
//!
//! CUDA's stream capture turns a launch with programmatic stream
//! serialization into a kernel node joined to the node before it by a
//! programmatic edge: at every replay the kernel may start while that node
//! is still running, and waits for it in `cudaGridDependencySynchronize`.
//! The graph's order (`CaptureOrder`) takes the node as ordered after the
//! node before it, as for a plain launch, for the reason
//! `features/dependent_launch.rs` gives: the kernel touches nothing before
//! that synchronisation returns. The software driver records stream order,
//! and replays it so.

use super::args::GraphArg;
use super::capture::Capture;
use crate::features::launch_config::LaunchConfig;
use crate::features::module::Kernel;
use crate::features::pdl_policy::Dependency;
use crate::ground::error::Result;
use crate::objects::stream::Stream;

impl Capture {
    /// Capture a programmatic dependent launch of `kernel` on `stream`:
    /// [`Capture::launch`], checked the same way, with the attribute
    /// [`Stream::launch_programmatic`] sets, which capture records as a
    /// programmatic edge. Refused as that method refuses (a kernel that does
    /// not declare `cudaGridDependencySynchronize`, a device below compute
    /// capability 9.0); under `CUDA_STREAMS_PDL=off` the node is plain.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, DeviceBuffer, GraphArg, LaunchConfig, Module, Stream};
    /// use std::sync::Arc;
    /// let ctx = Context::new(0).unwrap();
    /// let stream = Stream::new(&ctx).unwrap();
    /// let step = Module::load(&ctx, &kernels::ELEMENTWISE).unwrap().function("chain_step_f32").unwrap();
    /// let a = Arc::new(DeviceBuffer::from_slice(&stream, &[0.0f32; 8]).unwrap());
    /// let b = Arc::new(DeviceBuffer::<f32>::new_async(&stream, 8).unwrap());
    /// let cfg = LaunchConfig::for_num_elems(8);
    /// let mut capture = stream.begin_capture().unwrap();
    /// // a -> b -> a, each step after the one before it.
    /// for (from, to) in [(&a, &b), (&b, &a)] {
    ///     let args = [8u64.into(), GraphArg::read(from), GraphArg::write(to)];
    ///     capture.launch_programmatic(&stream, &step, cfg, &args).unwrap();
    /// }
    /// let exec = capture.end().unwrap().instantiate().unwrap();
    /// for _ in 0..3 {
    ///     exec.launch(&stream).unwrap();
    /// }
    /// assert_eq!(a.to_vec(&stream).unwrap(), [6.0; 8]);
    /// ```
    pub fn launch_programmatic(
        &mut self,
        stream: &Stream,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[GraphArg],
    ) -> Result<()> {
        self.launch_checked(
            stream,
            kernel,
            config,
            args,
            Dependency::Programmatic,
            false,
        )
    }
}
