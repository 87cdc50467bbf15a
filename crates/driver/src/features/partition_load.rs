//! Loading a kernel into an SM partition: before its first launch there
//! ([`Partition::load`]), and the handle each launch there uses.

use crate::features::module::Kernel;
use crate::objects::partition::Partition;
use crate::{Error, Result};

impl Partition {
    /// Load `kernel` into this partition now, so that its first launch on
    /// the partition's streams does not load it.
    ///
    /// On a GPU a launch on a partition's stream uses the kernel's image
    /// loaded as a library for the partition, and loading (the library, then
    /// the kernel into the partition's context: CUDA loads kernels lazily by
    /// default) waits for the device: behind a long background kernel, the
    /// first urgent launch would wait for it. Load what urgent work launches
    /// before that work starts; loading again is a lookup. The software
    /// driver loads nothing (its kernels run as CPU twins on any stream).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Module, Sms, StreamPriority};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
    /// let split = ctx.partition(&[Sms(8)])?;
    /// split.partitions[0].load(&fill)?; // before the background starts
    /// let urgent = split.partitions[0].stream(StreamPriority::High)?;
    /// # let _ = urgent;
    /// # Ok(())
    /// # }
    /// ```
    pub fn load(&self, kernel: &Kernel) -> Result<()> {
        let ctx = self.context();
        let own = kernel.module().context();
        if own.id() != ctx.id() {
            return Err(Error::ContextMismatch {
                what: "the kernel loaded into a partition",
                expected: ctx.id(),
                found: own.id(),
            });
        }
        if ctx.loaded_driver().runs_twins() {
            return Ok(());
        }
        self.load_into_partition(kernel.function_in(self)?)
    }
}

impl Kernel {
    /// This kernel as loaded for `partition`
    /// ([`Partition::library_kernel`]): the handle kept on the kernel when
    /// it is that partition's (no lock), otherwise looked up in the
    /// partition's table and kept (`partition_function.rs`).
    #[inline]
    pub(crate) fn function_in(&self, partition: &Partition) -> Result<sys::CUfunction> {
        if let Some(function) = self.partition_function.get(partition.id()) {
            return Ok(function);
        }
        let function = partition.library_kernel(self.module().image.bytes(), self.name())?;
        self.partition_function.set(partition.id(), function);
        Ok(function)
    }
}
