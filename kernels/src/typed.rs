//! Typed safe wrappers: one method per kernel, taking buffers of the right
//! element type, checking their lengths, and choosing the launch shape.
//!
//! Each wrapper launches through the checked [`Stream::launch`], with the
//! signature this crate registers beside the kernel's twin, so a wrapper
//! cannot pass what the kernel does not expect even if it had a bug.
//!
//! ```
//! use cuda_streams_kernels::driver::{Context, DeviceBuffer, Stream};
//! use cuda_streams_kernels::typed::Elementwise;
//! # fn main() -> cuda_streams_kernels::driver::Result<()> {
//! let ctx = Context::new(0)?;
//! let stream = Stream::new(&ctx)?;
//! let elementwise = Elementwise::load(&ctx)?;
//! let x = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0, 3.0])?;
//! let mut y = DeviceBuffer::from_slice(&stream, &[10.0f32, 20.0, 30.0])?;
//! elementwise.saxpy(&stream, 2.0, &x, &mut y)?; // y = 2x + y
//! assert_eq!(y.to_vec(&stream)?, [12.0, 24.0, 36.0]);
//! // Lengths that differ are an error, not an out-of-bounds read.
//! let short = DeviceBuffer::from_slice(&stream, &[1.0f32])?;
//! assert!(elementwise.saxpy(&stream, 2.0, &short, &mut y).is_err());
//! # Ok(())
//! # }
//! ```

use crate::KernelImage;
use driver::{
    Context, DeviceMemory, DeviceMemoryMut, Kernel, KernelArg, LaunchConfig, Module, Result,
    Stream, check_len,
};
use std::sync::Arc;
use std::time::Duration;

/// Blocks of 256 threads, at most 65,536 blocks: every kernel here loops
/// grid-stride, so any shape is correct and this one fills any GPU.
fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n
        .div_ceil(LaunchConfig::DEFAULT_BLOCK as usize)
        .clamp(1, 1 << 16);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (LaunchConfig::DEFAULT_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn load(ctx: &Arc<Context>, image: &'static KernelImage) -> Result<Arc<Module>> {
    Module::load(ctx, image)
}

/// The kernels of `elementwise.cu`.
#[derive(Clone, Debug)]
pub struct Elementwise {
    saxpy: Kernel,
    fill_f32: Kernel,
    fill_u32: Kernel,
    scale_add: Kernel,
}

impl Elementwise {
    /// Load the image into `ctx`.
    pub fn load(ctx: &Arc<Context>) -> Result<Self> {
        let module = load(ctx, &crate::ELEMENTWISE)?;
        Ok(Self {
            saxpy: module.function("saxpy")?,
            fill_f32: module.function("fill_f32")?,
            fill_u32: module.function("fill_u32")?,
            scale_add: module.function("scale_add")?,
        })
    }

    /// `y[i] = fma(a, x[i], y[i])` over all of `y`; `x` must be as long.
    pub fn saxpy<X, Y>(&self, stream: &Stream, a: f32, x: &X, y: &mut Y) -> Result<()>
    where
        X: DeviceMemory<Elem = f32>,
        Y: DeviceMemoryMut<Elem = f32>,
    {
        let n = y.device_len();
        check_len("saxpy", n, x.device_len())?;
        stream.launch(
            &self.saxpy,
            grid_for(n),
            &[(n as u64).into(), a.into(), x.into(), y.into()],
        )
    }

    /// Set every element of `out` to `value`.
    pub fn fill_f32<O>(&self, stream: &Stream, value: f32, out: &mut O) -> Result<()>
    where
        O: DeviceMemoryMut<Elem = f32>,
    {
        let n = out.device_len();
        stream.launch(
            &self.fill_f32,
            grid_for(n),
            &[(n as u64).into(), value.into(), out.into()],
        )
    }

    /// Set every element of `out` to `value`.
    pub fn fill_u32<O>(&self, stream: &Stream, value: u32, out: &mut O) -> Result<()>
    where
        O: DeviceMemoryMut<Elem = u32>,
    {
        let n = out.device_len();
        stream.launch(
            &self.fill_u32,
            grid_for(n),
            &[(n as u64).into(), value.into(), out.into()],
        )
    }

    /// `out[i] = fma(a, x[i], b * y[i])` over all of `out`; `x` and `y` must
    /// be as long.
    pub fn scale_add<X, Y, O>(
        &self,
        stream: &Stream,
        a: f32,
        x: &X,
        b: f32,
        y: &Y,
        out: &mut O,
    ) -> Result<()>
    where
        X: DeviceMemory<Elem = f32>,
        Y: DeviceMemory<Elem = f32>,
        O: DeviceMemoryMut<Elem = f32>,
    {
        let n = out.device_len();
        check_len("scale_add (x)", n, x.device_len())?;
        check_len("scale_add (y)", n, y.device_len())?;
        let args: [KernelArg<'_>; 6] = [
            (n as u64).into(),
            a.into(),
            x.into(),
            b.into(),
            y.into(),
            out.into(),
        ];
        stream.launch(&self.scale_add, grid_for(n), &args)
    }

    /// The raw kernels, for launches of one's own (`saxpy`, `fill_f32`,
    /// `fill_u32`, `scale_add`), each with its signature.
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        match name {
            "saxpy" => Some(&self.saxpy),
            "fill_f32" => Some(&self.fill_f32),
            "fill_u32" => Some(&self.fill_u32),
            "scale_add" => Some(&self.scale_add),
            _ => None,
        }
    }
}

/// The kernel of `reduce.cu`.
#[derive(Clone, Debug)]
pub struct Reduce {
    checksum: Kernel,
}

impl Reduce {
    /// Load the image into `ctx`.
    pub fn load(ctx: &Arc<Context>) -> Result<Self> {
        Ok(Self {
            checksum: load(ctx, &crate::REDUCE)?.function("checksum")?,
        })
    }

    /// Add [`crate::reference::checksum`]`(data)` to `out[0]` (zero it first
    /// for the checksum alone); `out` needs at least one element.
    pub fn checksum<D, O>(&self, stream: &Stream, data: &D, out: &mut O) -> Result<()>
    where
        D: DeviceMemory<Elem = u32>,
        O: DeviceMemoryMut<Elem = u64>,
    {
        let n = data.device_len();
        stream.launch(
            &self.checksum,
            grid_for(n),
            &[(n as u64).into(), data.into(), out.into()],
        )
    }
}

/// The kernel of `timing.cu`.
#[derive(Clone, Debug)]
pub struct Timing {
    spin: Kernel,
}

impl Timing {
    /// Load the image into `ctx`.
    pub fn load(ctx: &Arc<Context>) -> Result<Self> {
        Ok(Self {
            spin: load(ctx, &crate::TIMING)?.function("spin")?,
        })
    }

    /// Keep `stream` busy for `duration` (one thread busy-waits on the GPU's
    /// clock; the software driver's twin sleeps). Durations beyond `u64`
    /// nanoseconds saturate.
    pub fn spin(&self, stream: &Stream, duration: Duration) -> Result<()> {
        let nanoseconds = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let one_thread = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        stream.launch(&self.spin, one_thread, &[nanoseconds.into()])
    }

    /// The raw `spin` kernel, with its signature.
    pub fn kernel(&self) -> &Kernel {
        &self.spin
    }
}

/// The kernel of `compute.cu`.
#[derive(Clone, Debug)]
pub struct Compute {
    compute: Kernel,
}

impl Compute {
    /// Load the image into `ctx`.
    pub fn load(ctx: &Arc<Context>) -> Result<Self> {
        Ok(Self {
            compute: load(ctx, &crate::COMPUTE)?.function("compute")?,
        })
    }

    /// `y[i] =` [`crate::reference::compute_element`]`(iterations, x[i])`
    /// over all of `y`; `x` must be as long.
    pub fn compute<X, Y>(&self, stream: &Stream, iterations: u32, x: &X, y: &mut Y) -> Result<()>
    where
        X: DeviceMemory<Elem = f32>,
        Y: DeviceMemoryMut<Elem = f32>,
    {
        let n = y.device_len();
        check_len("compute", n, x.device_len())?;
        stream.launch(
            &self.compute,
            grid_for(n),
            &[(n as u64).into(), iterations.into(), x.into(), y.into()],
        )
    }
}
