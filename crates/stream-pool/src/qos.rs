//! Service classes: urgent work on SMs kept for it, the rest beside it.
//!
//! A stream priority decides which blocks start next, but never takes an SM
//! back from a running block: behind long kernels, urgent work waits
//! whatever its priority. A [`QosPool`] keeps an SM partition for
//! [`ServiceClass::Urgent`] (its streams at the greatest priority) and runs
//! [`ServiceClass::Normal`] and [`ServiceClass::Background`] on the rest of
//! the device, at the middle and the least priority. With an urgent size of
//! 0 SMs it uses priorities alone, on the whole device.

use crate::error::{Error, Result};
use driver::sys::env::Setting;
use driver::{Context, Kernel, Partition, Sms, Stream, StreamPriority};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The environment variable that sets the SMs kept for urgent work
/// ([`QosSettings::from_env`]).
pub const URGENT_SMS_ENV: &str = "CUDA_STREAMS_URGENT_SMS";

/// The SMs kept for urgent work when none is set: 16, two steps of Hopper's
/// granularity, which kept an urgent one-block kernel at its idle latency on
/// an H200 under a saturating background.
pub const DEFAULT_URGENT_SMS: u32 = 16;

/// `CUDA_STREAMS_URGENT_SMS` as a setting (for listings such as `cuda-streams info`).
pub const URGENT_SMS_SETTING: Setting = Setting {
    name: URGENT_SMS_ENV,
    aliases: &[],
    default: "16",
    about: "SMs kept for urgent work by a QoS pool built from the environment (0: priorities only)",
};

/// The three kinds of work a [`QosPool`] serves. Exhaustive by decision: a
/// class is a promise about latency, and code that matches on them should
/// have to say what a new one means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceClass {
    /// Work that must start at once (an inference request, a control step):
    /// its own SMs, the greatest priority.
    Urgent,
    /// Ordinary work: the rest of the device, the middle priority.
    Normal,
    /// Long work that fills the GPU: the rest of the device, the least priority.
    Background,
}

/// How a [`QosPool`] is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QosSettings {
    /// SMs kept for urgent work, rounded up by the driver to its granularity
    /// (8 on Hopper); 0 keeps none and relies on priorities.
    pub urgent_sms: u32,
    /// Streams per class.
    pub streams_per_class: usize,
}

impl Default for QosSettings {
    fn default() -> Self {
        Self {
            urgent_sms: DEFAULT_URGENT_SMS,
            streams_per_class: 2,
        }
    }
}

impl QosSettings {
    /// The defaults, with the urgent size from `CUDA_STREAMS_URGENT_SMS`
    /// when it is set; a value that is not a number from 0 to 1024 is an
    /// error naming the variable and the value.
    ///
    /// ```
    /// use cuda_streams_stream_pool::QosSettings;
    /// // Unset in the doctest's environment.
    /// assert_eq!(QosSettings::from_env().unwrap(), QosSettings::default());
    /// ```
    pub fn from_env() -> Result<Self> {
        let mut settings = Self::default();
        if let Some(found) = URGENT_SMS_SETTING.from_env()? {
            settings.urgent_sms = found.parse_int(0..=1024)?;
        }
        Ok(settings)
    }
}

/// The SMs to keep for urgent work that takes `on_whole_device` on an idle
/// device of `total_sms` SMs, so that it takes about `target` alone on its
/// partition: work that fills the device slows in proportion to the SMs it
/// loses. Rounded up to `granularity`, at least one step, and leaving at
/// least one step for the rest. A kernel too small to fill even one step
/// (a one-block kernel) gets one step: it runs at its idle latency there.
///
/// ```
/// use cuda_streams_stream_pool::urgent_sms_for;
/// use std::time::Duration;
/// let us = Duration::from_micros;
/// // 10 µs on all 132 SMs of an H200, 80 µs allowed: 16.5 SMs, so 24.
/// assert_eq!(urgent_sms_for(132, 8, us(10), us(80)), 24);
/// // A tiny kernel: one step of 8.
/// assert_eq!(urgent_sms_for(132, 8, us(5), us(1000)), 8);
/// // More than the device can spare: all but one step.
/// assert_eq!(urgent_sms_for(132, 8, us(100), us(10)), 120);
/// ```
pub fn urgent_sms_for(
    total_sms: u32,
    granularity: u32,
    on_whole_device: Duration,
    target: Duration,
) -> u32 {
    let granularity = granularity.max(1);
    let steps = total_sms / granularity;
    if steps < 2 {
        return steps * granularity;
    }
    let needed = if target.is_zero() {
        f64::from(total_sms)
    } else {
        f64::from(total_sms) * on_whole_device.as_secs_f64() / target.as_secs_f64()
    };
    let wanted = (needed / f64::from(granularity)).ceil().max(1.0) as u32;
    wanted.min(steps - 1) * granularity
}

/// Streams by [`ServiceClass`]: urgent ones on an SM partition of their own,
/// the others on the rest of the device, each at its class's priority.
///
/// ```
/// use cuda_streams_stream_pool::driver::Context;
/// use cuda_streams_stream_pool::{QosPool, QosSettings, ServiceClass};
/// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
/// let ctx = Context::new(0)?;
/// let pool = QosPool::new(&ctx, QosSettings { urgent_sms: 12, streams_per_class: 2 })?;
/// assert_eq!(pool.urgent_sms(), Some(16), "rounded up to the granularity");
/// let urgent = pool.stream(ServiceClass::Urgent);
/// let background = pool.stream(ServiceClass::Background);
/// assert_eq!(urgent.priority()?, ctx.priority_range().greatest);
/// assert_eq!(background.priority()?, ctx.priority_range().least);
/// assert_eq!(urgent.partition().map(|p| p.sms()), Some(16));
/// # Ok(())
/// # }
/// ```
pub struct QosPool {
    ctx: Arc<Context>,
    urgent: Option<Partition>,
    rest: Option<Partition>,
    classes: [ClassStreams; 3],
}

struct ClassStreams {
    streams: Vec<Arc<Stream>>,
    next: AtomicUsize,
}

impl QosPool {
    /// A pool per `settings` on `ctx`'s device. Fails when the urgent size
    /// does not fit the device (the error names the counts), when the
    /// driver has no partitions (before CUDA 12.4) while `urgent_sms` is
    /// not 0, and on a pool of 0 streams per class.
    pub fn new(ctx: &Arc<Context>, settings: QosSettings) -> Result<Self> {
        if settings.streams_per_class == 0 {
            return Err(Error::EmptyPool);
        }
        let (urgent, rest) = if settings.urgent_sms == 0 {
            (None, None)
        } else {
            let split = ctx.partition(&[Sms(settings.urgent_sms)])?;
            let urgent = split.partitions.into_iter().next();
            (urgent, split.remainder)
        };
        let make =
            |partition: Option<&Partition>, priority: StreamPriority| -> Result<ClassStreams> {
                let streams = (0..settings.streams_per_class)
                    .map(|_| match partition {
                        Some(partition) => partition.stream(priority),
                        None => Stream::new_with_priority(ctx, priority),
                    })
                    .collect::<driver::Result<Vec<_>>>()?;
                Ok(ClassStreams {
                    streams,
                    next: AtomicUsize::new(0),
                })
            };
        let classes = [
            make(urgent.as_ref(), StreamPriority::High)?,
            make(rest.as_ref(), StreamPriority::Normal)?,
            make(rest.as_ref(), StreamPriority::Low)?,
        ];
        Ok(Self {
            ctx: Arc::clone(ctx),
            urgent,
            rest,
            classes,
        })
    }

    /// A pool sized from the environment ([`QosSettings::from_env`]).
    pub fn from_env(ctx: &Arc<Context>) -> Result<Self> {
        Self::new(ctx, QosSettings::from_env()?)
    }

    /// The next stream of `class`, round robin.
    pub fn stream(&self, class: ServiceClass) -> Arc<Stream> {
        let streams = &self.classes[class as usize];
        let i = streams.next.fetch_add(1, Ordering::Relaxed) % streams.streams.len();
        Arc::clone(&streams.streams[i])
    }

    /// Load `kernel` for every class's streams now ([`Partition::load`] on
    /// each partition), so that no first launch loads it: on a GPU loading
    /// waits for the device, and urgent work would wait for the background.
    /// Call it for each kernel urgent work launches, before that work starts.
    /// Without partitions there is nothing to load.
    ///
    /// ```
    /// use cuda_streams_stream_pool::driver::{Context, Module};
    /// use cuda_streams_stream_pool::{QosPool, QosSettings};
    /// # fn main() -> Result<(), cuda_streams_stream_pool::Error> {
    /// let ctx = Context::new(0)?;
    /// let pool = QosPool::new(&ctx, QosSettings::default())?;
    /// let fill = Module::load(&ctx, &kernels::ELEMENTWISE)?.function("fill_f32")?;
    /// pool.load(&fill)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn load(&self, kernel: &Kernel) -> Result<()> {
        for partition in self.urgent.iter().chain(&self.rest) {
            partition.load(kernel)?;
        }
        Ok(())
    }

    /// The SMs the driver granted urgent work (`None`: priorities only).
    pub fn urgent_sms(&self) -> Option<u32> {
        self.urgent.as_ref().map(Partition::sms)
    }

    /// The SMs the other classes run on (`None`: the whole device).
    pub fn rest_sms(&self) -> Option<u32> {
        self.rest.as_ref().map(Partition::sms)
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl std::fmt::Debug for QosPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QosPool")
            .field("urgent_sms", &self.urgent_sms())
            .field("rest_sms", &self.rest_sms())
            .field("streams_per_class", &self.classes[0].streams.len())
            .finish()
    }
}
