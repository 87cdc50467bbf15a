//! SM partitions (green contexts): a device's SMs split into disjoint sets,
//! each with streams of its own.
//!
//! A stream priority only orders which blocks start next; it never takes an
//! SM back from a block already running, so behind long kernels urgent work
//! waits whatever its priority. A partition keeps SMs for its streams: work
//! there starts on them while the rest of the device is busy.
//!
//! [`Context::partition`] splits the device; each [`Partition`] reports the
//! SMs it was granted (the driver rounds a request up to its granularity, 8
//! on Hopper), and [`Partition::stream`] makes a [`Stream`] in it. Such a
//! stream is a stream of the device's context like any other: events, waits,
//! buffers, the order checker, pools and graphs take it as they take any
//! stream. It keeps its partition alive, so a partition cannot go away under
//! its streams: dropping the `Partition` handle only gives up the right to
//! make more streams there.
//!
//! Kernels launch in any partition. On a GPU a module's functions belong to
//! the context they were loaded in, and a partition is a context of its own,
//! so a launch on a partition's stream uses the same image loaded as a
//! context-less library (`cuLibraryLoadData`), once per partition and image,
//! whose kernel takes its context from the stream. The software driver runs
//! the module's CPU twin on any stream of its device. Loading waits for the
//! device, so `Partition::load` loads a kernel before urgent work needs it.

use crate::objects::context::Context;
use crate::objects::priority::StreamPriority;
use crate::objects::stream::Stream;
use crate::{Error, Result};
use std::collections::HashMap;
use std::ffi::CString;
use std::fmt;
use std::sync::{Arc, Mutex};
use sys::{
    CUdevResource, CUdevResourceType, CUfunction, CUgreenCtx, CUgreenCtxCreate_flags, CUkernel,
    CUlibrary, CUstream, CUstream_flags, GreenContexts,
};

/// A number of SMs asked of a partition: [`Context::partition`] rounds it up
/// to the device's granularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sms(pub u32);

/// A device split into partitions: those asked for, in order, and what was
/// left ([`Context::partition`]).
#[derive(Debug)]
#[must_use = "dropping the partitions before making streams in them gives the SMs back"]
pub struct Partitions {
    /// One partition per [`Sms`] asked for, in the same order.
    pub partitions: Vec<Partition>,
    /// The SMs left over, as a partition of their own (`None` when none are
    /// left). The driver does not promise it the symmetry of the others.
    pub remainder: Option<Partition>,
}

/// A set of a device's SMs and the streams that run on them only. Cloning
/// it is cheap and shares the partition; the partition's green context is
/// destroyed once every clone and every stream made in it are dropped.
#[derive(Clone)]
pub struct Partition(Arc<GreenPartition>);

/// The green context behind a [`Partition`], owned.
struct GreenPartition {
    /// Unique in the process, never reused: a kernel's handle kept for a
    /// dropped partition matches no live one (`partition_function.rs`).
    id: u64,
    ctx: Arc<Context>,
    green: &'static GreenContexts,
    raw: CUgreenCtx,
    sms: u32,
    requested: Option<u32>,
    /// Each image loaded as a library for this partition's launches, by the
    /// image's address, with its kernels by name.
    libraries: Mutex<HashMap<usize, Library>>,
}

struct Library {
    raw: CUlibrary,
    kernels: HashMap<Arc<str>, CUkernel>,
}

// SAFETY: a green context and a library are driver handles usable from any
// thread (only passed to the driver); the maps are behind a Mutex.
unsafe impl Send for GreenPartition {}
// SAFETY: as above; the handles are immutable after creation.
unsafe impl Sync for GreenPartition {}

impl Context {
    /// The SMs that partitions of this device can take altogether, and the
    /// step they split in: `(sms, granularity)`. Fails on a driver without
    /// partitions.
    ///
    /// Partitions are made of whole groups of the granularity, and the
    /// driver makes fewer groups than the SMs divide into where its
    /// clusters do not divide evenly: an H100 with 132 SMs makes 15 groups
    /// of 8, so partitions take at most 120 SMs there, and the other 12
    /// stay in the remainder.
    ///
    /// ```
    /// # let ctx = cuda_streams_driver::Context::new(0).unwrap();
    /// let (sms, granularity) = ctx.partitionable_sms().unwrap();
    /// assert!(sms >= granularity && granularity >= 1);
    /// ```
    pub fn partitionable_sms(&self) -> Result<(u32, u32)> {
        let green = self.loaded_driver().green_contexts()?;
        let all = device_resource(self, green)?;
        let granularity = sm_of(&all).minSmPartitionSize.max(1);
        Ok((
            group_capacity(self, green, &all, granularity)? * granularity,
            granularity,
        ))
    }

    /// Split this device's SMs into partitions of at least `sizes[i]` SMs
    /// each, in order, and a remainder of what is left.
    ///
    /// The driver rounds each size up to its granularity (8 on Hopper);
    /// [`Partition::sms`] says what each got. Partitions of one size are
    /// split as one group each of that size; otherwise the device is split
    /// once into groups of the granularity and each partition made of as
    /// many groups as it needs, since a GPU driver does not split a split's
    /// remainder again. Fails, naming the partition
    /// and the counts, when one asks for 0 SMs or for more than are left,
    /// and on a driver without partitions (before CUDA 12.4).
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Sms, StreamPriority};
    /// # fn main() -> cuda_streams_driver::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let split = ctx.partition(&[Sms(12)])?;
    /// let urgent = &split.partitions[0];
    /// assert_eq!(urgent.sms(), 16, "12 rounded up to the granularity of 8");
    /// let stream = urgent.stream(StreamPriority::High)?;
    /// stream.synchronize()?;
    /// if let Some(rest) = &split.remainder {
    ///     // What is left, and any SMs partitions cannot take.
    ///     let (total, _) = ctx.partitionable_sms()?;
    ///     assert!(rest.sms() >= total - 16);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn partition(self: &Arc<Self>, sizes: &[Sms]) -> Result<Partitions> {
        let green = self.loaded_driver().green_contexts()?;
        let device = device_resource(self, green)?;
        let total = sm_of(&device).smCount;
        let granularity = sm_of(&device).minSmPartitionSize.max(1);
        // What partitions can take: whole groups, as many as the driver
        // makes (fewer than `total` divides into on some devices).
        let capacity = group_capacity(self, green, &device, granularity)? * granularity;
        // Each partition as a number of granularity-sized groups.
        let mut steps = Vec::with_capacity(sizes.len());
        let mut taken = 0u32;
        for (index, &Sms(requested)) in sizes.iter().enumerate() {
            if requested == 0 {
                return Err(Error::PartitionOfZeroSms { index });
            }
            let available = capacity - taken;
            let rounded = requested.div_ceil(granularity).saturating_mul(granularity);
            if rounded > available {
                return Err(Error::PartitionTooLarge {
                    index,
                    requested,
                    rounded,
                    granularity,
                    available,
                    total,
                    device: self.ordinal(),
                });
            }
            taken += rounded;
            steps.push((requested, rounded / granularity));
        }
        // Partitions of one size are split as green-context code asks for
        // them, one group each of that size (`minCount` the partition's
        // SMs); the driver may lay out such a group otherwise than several
        // groups of the granularity. Mixed sizes, or a size the driver
        // makes too few groups of, take one split of the whole device into
        // groups of the granularity, several to a partition: the driver
        // refuses to split a split's output (its remainder included) again,
        // but makes one descriptor of several outputs of one split.
        let uniform = steps
            .first()
            .map(|&(_, groups)| groups)
            .filter(|&first| steps.iter().all(|&(_, groups)| groups == first));
        let one_each = match uniform {
            Some(per) if per > 1 => {
                let count = steps.len() as u32;
                // A refusal here is no error: the groups of the
                // granularity below may still fit.
                split(self, green, &device, count, per * granularity)
                    .ok()
                    .filter(|&(_, made, _)| made == count)
                    .map(|(groups, _, rest)| (groups, rest))
            }
            _ => None,
        };
        let (mut groups, rest, per_partition) = match one_each {
            Some((groups, rest)) => (groups, rest, vec![1; steps.len()]),
            None => {
                let wanted: u32 = steps.iter().map(|&(_, groups)| groups).sum();
                let (groups, made, rest) = split(self, green, &device, wanted, granularity)?;
                if made < wanted {
                    // The driver may make fewer groups than SMs divide into
                    // (cluster constraints): name the first partition that
                    // did not fit.
                    let mut covered = 0;
                    for (index, &(requested, count)) in steps.iter().enumerate() {
                        if covered + count > made {
                            return Err(Error::PartitionTooLarge {
                                index,
                                requested,
                                rounded: count * granularity,
                                granularity,
                                available: (made - covered) * granularity,
                                total,
                                device: self.ordinal(),
                            });
                        }
                        covered += count;
                    }
                }
                (
                    groups,
                    rest,
                    steps.iter().map(|&(_, count)| count).collect(),
                )
            }
        };
        let mut partitions = Vec::with_capacity(steps.len());
        let mut next = 0;
        for (&(requested, _), count) in steps.iter().zip(per_partition) {
            let own = &mut groups[next..next + count as usize];
            next += count as usize;
            partitions.push(Partition::create(self, green, own, Some(requested))?);
        }
        let mut rest = rest;
        let remainder = match sm_of(&rest).smCount {
            0 => None,
            _ => Some(Partition::create(
                self,
                green,
                std::slice::from_mut(&mut rest),
                None,
            )?),
        };
        tracing::debug!(
            context = self.id(),
            granted = ?partitions.iter().map(Partition::sms).collect::<Vec<_>>(),
            remainder = remainder.as_ref().map(Partition::sms),
            "device partitioned"
        );
        Ok(Partitions {
            partitions,
            remainder,
        })
    }
}

/// One split of `device` into `wanted` groups of `group_sms` SMs each:
/// the groups, how many the driver made (it may make fewer), and the
/// remainder. No groups wanted: the whole device is the remainder.
fn split(
    ctx: &Context,
    green: &GreenContexts,
    device: &CUdevResource,
    wanted: u32,
    group_sms: u32,
) -> Result<(Vec<CUdevResource>, u32, CUdevResource)> {
    let mut groups = vec![CUdevResource::default(); wanted as usize];
    let mut rest = CUdevResource::default();
    if wanted == 0 {
        return Ok((groups, 0, *device));
    }
    let mut made = wanted;
    // SAFETY: `groups` has `made` slots; a valid input and remainder; all
    // locals.
    ctx.check(unsafe {
        (green.cuDevSmResourceSplitByCount)(
            groups.as_mut_ptr(),
            &mut made,
            device,
            &mut rest,
            0,
            group_sms,
        )
    })?;
    groups.truncate(made as usize);
    Ok((groups, made, rest))
}

/// How many groups of `granularity` SMs the driver can split `device` into
/// (a split without outputs only counts them).
fn group_capacity(
    ctx: &Context,
    green: &GreenContexts,
    device: &CUdevResource,
    granularity: u32,
) -> Result<u32> {
    let mut groups = 0;
    // SAFETY: no output array (the driver only counts); a valid input and
    // out-pointer, all locals.
    ctx.check(unsafe {
        (green.cuDevSmResourceSplitByCount)(
            std::ptr::null_mut(),
            &mut groups,
            device,
            std::ptr::null_mut(),
            0,
            granularity,
        )
    })?;
    Ok(groups)
}

/// The device's whole SM resource.
fn device_resource(ctx: &Context, green: &GreenContexts) -> Result<CUdevResource> {
    let mut all = CUdevResource::default();
    let sm = CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
    // SAFETY: writes one resource through a valid pointer.
    ctx.check(unsafe { (green.cuDeviceGetDevResource)(ctx.device(), &mut all, sm) })?;
    Ok(all)
}

/// The SM part of an SM resource.
fn sm_of(resource: &CUdevResource) -> sys::CUdevSmResource {
    // SAFETY: every resource here is an SM resource the driver wrote, whose
    // union holds `sm`; any bits are valid for its integers.
    unsafe { resource.__bindgen_anon_1.sm }
}

impl Partition {
    /// A green context over the SMs of `resources`, outputs of one split.
    fn create(
        ctx: &Arc<Context>,
        green: &'static GreenContexts,
        resources: &mut [CUdevResource],
        requested: Option<u32>,
    ) -> Result<Self> {
        let mut desc = std::ptr::null_mut();
        let count = u32::try_from(resources.len()).expect("a split makes at most u32::MAX groups");
        // SAFETY: `count` valid resources of one split; writes one descriptor.
        ctx.check(unsafe {
            (green.cuDevResourceGenerateDesc)(&mut desc, resources.as_mut_ptr(), count)
        })?;
        let mut raw = std::ptr::null_mut();
        let flags = CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM.0;
        // SAFETY: a descriptor just made, the context's device; writes one handle.
        ctx.check(unsafe { (green.cuGreenCtxCreate)(&mut raw, desc, ctx.device(), flags) })?;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let mut partition = GreenPartition {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ctx: Arc::clone(ctx),
            green,
            raw,
            sms: 0,
            requested,
            libraries: Mutex::default(),
        };
        // What the driver granted, read back rather than predicted.
        let mut granted = CUdevResource::default();
        let sm = CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
        // SAFETY: a live green context; writes one resource.
        ctx.check(unsafe { (green.cuGreenCtxGetDevResource)(raw, &mut granted, sm) })?;
        partition.sms = sm_of(&granted).smCount;
        Ok(Self(Arc::new(partition)))
    }

    /// The SMs this partition was granted: what was asked for, rounded up
    /// to the device's granularity (or what was left, for the remainder).
    pub fn sms(&self) -> u32 {
        self.0.sms
    }

    /// The SMs asked for ([`Sms`]), or `None` for the remainder.
    pub fn requested(&self) -> Option<u32> {
        self.0.requested
    }

    /// Its id, unique in the process and never reused.
    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }

    /// The device context the partition splits.
    pub fn context(&self) -> &Arc<Context> {
        &self.0.ctx
    }

    /// What keeps this partition (and the libraries its launches use) alive,
    /// for a captured graph whose replays launch its kernels.
    pub(crate) fn keep_alive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.0.clone()
    }

    /// The raw green context, for interop. It stays valid while this
    /// partition or a stream made in it lives.
    pub fn as_raw(&self) -> CUgreenCtx {
        self.0.raw
    }

    /// A stream whose work runs on this partition's SMs only, with a
    /// priority mapped onto the device's range as [`Stream::new_with_priority`]
    /// maps it. The stream keeps the partition alive.
    ///
    /// ```
    /// use cuda_streams_driver::{Context, Sms, StreamPriority};
    /// let ctx = Context::new(0).unwrap();
    /// let split = ctx.partition(&[Sms(8)]).unwrap();
    /// let stream = split.partitions[0].stream(StreamPriority::High).unwrap();
    /// drop(split); // the stream still runs on its 8 SMs
    /// assert_eq!(stream.priority().unwrap(), ctx.priority_range().greatest);
    /// assert_eq!(stream.partition().unwrap().sms(), 8);
    /// ```
    pub fn stream(&self, priority: StreamPriority) -> Result<Arc<Stream>> {
        self.stream_with_raw_priority(self.0.ctx.priority_range().value(priority))
    }

    /// [`Partition::stream`] with a raw CUDA priority, which must lie in the
    /// device's range.
    pub fn stream_with_raw_priority(&self, priority: i32) -> Result<Arc<Stream>> {
        let ctx = &self.0.ctx;
        let range = ctx.priority_range();
        if !range.contains(priority) {
            return Err(Error::InvalidPriority {
                value: priority,
                least: range.least,
                greatest: range.greatest,
            });
        }
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        // SAFETY: a live green context (kept by `self`); writes one handle.
        ctx.check(unsafe {
            (self.0.green.cuGreenCtxStreamCreate)(&mut raw, self.0.raw, flags, priority)
        })?;
        // SAFETY: `raw` was just made on `ctx`'s device and nothing else has
        // it; the partition it runs in lives as long as the stream's owner.
        Ok(unsafe { Stream::in_partition(ctx, raw, Box::new(self.clone())) })
    }

    /// The kernel `name` of module image `image`, loaded as a library (once
    /// per partition and image) for launches on this partition's streams on
    /// a GPU: a library's kernel runs in the context of the stream it is
    /// launched on, as a module's function, bound to the context it was
    /// loaded in, cannot. Returned as the function `cuLaunchKernel` takes,
    /// as cuda.h documents. The driver loads it into the partition's context
    /// at its first launch there, unless [`Partition::load`] did.
    pub(crate) fn library_kernel(&self, image: &'static [u8], name: &str) -> Result<CUfunction> {
        let ctx = &self.0.ctx;
        let mut libraries = self
            .0
            .libraries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let library = match libraries.entry(image.as_ptr() as usize) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut raw = std::ptr::null_mut();
                // SAFETY: `image` is a module image (it loaded as a module),
                // 'static; no JIT or library options.
                ctx.check(unsafe {
                    (self.0.green.cuLibraryLoadData)(
                        &mut raw,
                        image.as_ptr().cast(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        0,
                    )
                })?;
                entry.insert(Library {
                    raw,
                    kernels: HashMap::new(),
                })
            }
        };
        if let Some(&found) = library.kernels.get(name) {
            return Ok(found as CUfunction);
        }
        let c_name = CString::new(name).map_err(|_| Error::InvalidName {
            name: name.to_owned(),
        })?;
        let mut found = std::ptr::null_mut();
        // SAFETY: a live library; a NUL-terminated name; writes one handle.
        ctx.check(unsafe {
            (self.0.green.cuLibraryGetKernel)(&mut found, library.raw, c_name.as_ptr())
        })?;
        library.kernels.insert(Arc::from(name), found);
        Ok(found as CUfunction)
    }
}

impl Partition {
    /// Load `kernel` (a kernel of this partition's libraries, as
    /// [`Partition::library_kernel`] returns it) into the partition's green
    /// context now (`cuKernelGetFunction` there, then `cuFuncLoad`), rather
    /// than at its first launch: CUDA loads a library into a context lazily
    /// by default.
    pub(crate) fn load_into_partition(&self, kernel: CUfunction) -> Result<()> {
        let kernel = kernel as CUkernel;
        let ctx = &self.0.ctx;
        let green = self.0.green;
        let mut own = std::ptr::null_mut();
        // SAFETY: a live green context; writes one context handle.
        ctx.check(unsafe { (green.cuCtxFromGreenCtx)(&mut own, self.0.raw) })?;
        // SAFETY: the green context's own context, alive with `self`; the
        // thread's binding is restored below, whatever the lookup returns.
        ctx.check(unsafe { (ctx.driver().cuCtxSetCurrent)(own) })?;
        let mut function = std::ptr::null_mut();
        // SAFETY: a live kernel of a library this partition holds; writes one handle.
        let found = ctx.check(unsafe { (green.cuKernelGetFunction)(&mut function, kernel) });
        // Under lazy loading the function may be loaded only in part:
        // finish it here, not at the first launch.
        // SAFETY: the function just returned for this partition's context.
        let loaded = found.and_then(|()| ctx.check(unsafe { (green.cuFuncLoad)(function) }));
        ctx.force_bind()?;
        loaded
    }
}

impl Stream {
    /// The partition this stream was made in ([`Partition::stream`]).
    /// Inlined: every launch asks (`Stream::function_for`).
    #[inline]
    pub fn partition(&self) -> Option<&Partition> {
        self.owner::<Partition>()
    }
}

impl Drop for GreenPartition {
    fn drop(&mut self) {
        let libraries = std::mem::take(
            self.libraries
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for (_, library) in libraries {
            // SAFETY: loaded by this partition, unloaded once; every stream
            // that launched its kernels is gone (each held this partition).
            let code = unsafe { (self.green.cuLibraryUnload)(library.raw) };
            if let Err(err) = self.ctx.check(code) {
                tracing::error!(
                    context = self.ctx.id(),
                    "unloading a partition's library: {err}"
                );
            }
        }
        // SAFETY: created by this partition, destroyed once, after its streams.
        let code = unsafe { (self.green.cuGreenCtxDestroy)(self.raw) };
        if let Err(err) = self.ctx.check(code) {
            tracing::error!(context = self.ctx.id(), "destroying a green context: {err}");
        }
    }
}

impl fmt::Debug for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partition")
            .field("sms", &self.0.sms)
            .field("requested", &self.0.requested)
            .field("raw", &self.0.raw)
            .finish()
    }
}
