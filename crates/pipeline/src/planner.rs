//! Deciding once whether a batch upload should use several streams, and
//! which stream each key goes on.

use crate::error::Result;
use driver::sys::env::{Found, Setting};
use std::fmt;

/// Batches smaller than this (in samples) use one stream by default.
pub const DEFAULT_MIN_BATCH_SIZE: usize = 8;
/// Batches smaller than this (in MiB) use one stream by default.
pub const DEFAULT_MIN_BATCH_MB: f64 = 100.0;
/// The most streams used by default.
pub const DEFAULT_MAX_STREAMS: usize = 4;
/// The most streams an override may ask for.
pub const MAX_STREAMS_LIMIT: usize = 64;

/// Overrides [`PlannerConfig::min_batch_size`] (seed 004's name,
/// `MIN_BATCH_SIZE_FOR_STREAMS`, is accepted too; this one wins).
pub const ENV_MIN_BATCH_SIZE: &str = "CUDA_STREAMS_MIN_BATCH_SIZE";
/// Overrides [`PlannerConfig::min_batch_mb`] (seed 004's name,
/// `MIN_BATCH_MEMORY_FOR_STREAMS_MB`, is accepted too; this one wins).
pub const ENV_MIN_BATCH_MB: &str = "CUDA_STREAMS_MIN_BATCH_MB";
/// Overrides [`PlannerConfig::max_streams`] (seed 004's name,
/// `MAX_CONCURRENT_CUDA_STREAMS`, is accepted too; this one wins).
pub const ENV_MAX_STREAMS: &str = "CUDA_STREAMS_MAX_STREAMS";

/// The planner's settings, each under our name and the specification's
/// (seed 004: `MIN_BATCH_SIZE_FOR_STREAMS`, `MIN_BATCH_MEMORY_FOR_STREAMS_MB`,
/// `MAX_CONCURRENT_CUDA_STREAMS`). When both names are set, ours wins.
pub const PLANNER_SETTINGS: [Setting; 3] = [
    Setting {
        name: ENV_MIN_BATCH_SIZE,
        aliases: &["MIN_BATCH_SIZE_FOR_STREAMS"],
        default: "8",
        about: "batches of fewer samples use one stream",
    },
    Setting {
        name: ENV_MIN_BATCH_MB,
        aliases: &["MIN_BATCH_MEMORY_FOR_STREAMS_MB"],
        default: "100",
        about: "batches of fewer MiB use one stream",
    },
    Setting {
        name: ENV_MAX_STREAMS,
        aliases: &["MAX_CONCURRENT_CUDA_STREAMS"],
        default: "4",
        about: "the most streams a batch upload spreads over (1 to 64)",
    },
];

/// One named array of a batch: the shape of one sample and its element size.
///
/// ```
/// use cuda_streams_pipeline::ArraySpec;
/// let image = ArraySpec::f32("image", &[64, 64, 32]);
/// assert_eq!(image.sample_bytes(), 64 * 64 * 32 * 4);
/// // Other element types: give the size (here one-byte labels).
/// let labels = ArraySpec { name: "labels".into(), shape: vec![64, 64, 32], element_size: 1 };
/// assert_eq!(labels.sample_bytes(), 131_072);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArraySpec {
    /// The key it is known by.
    pub name: String,
    /// The shape of one sample (e.g. `[64, 64, 32]`, or `[classes, d, h, w]`).
    pub shape: Vec<usize>,
    /// Bytes per element (4 for `f32`).
    pub element_size: usize,
}

impl ArraySpec {
    /// An array of `f32` samples of `shape`.
    pub fn f32(name: impl Into<String>, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
            element_size: 4,
        }
    }

    /// Bytes per sample.
    pub fn sample_bytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.element_size as u64
    }
}

/// The thresholds of the decision.
///
/// ```
/// use cuda_streams_pipeline::{ArraySpec, PlannerConfig, plan_transfers};
/// let config = PlannerConfig::default();
/// assert_eq!((config.min_batch_size, config.min_batch_mb, config.max_streams), (8, 100.0, 4));
/// // Two arrays of 4 MiB per sample: 8 samples are 64 MiB, below the default 100 MiB.
/// let arrays = [ArraySpec::f32("a", &[1024, 1024]), ArraySpec::f32("b", &[1024, 1024])];
/// assert!(!plan_transfers(&arrays, 8, &config).use_streams);
/// let lower = PlannerConfig { min_batch_mb: 16.0, ..config };
/// assert!(plan_transfers(&arrays, 8, &lower).use_streams);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannerConfig {
    /// Fewer samples per batch than this: one stream.
    pub min_batch_size: usize,
    /// Fewer MiB per batch than this: one stream.
    pub min_batch_mb: f64,
    /// The most streams to spread keys over.
    pub max_streams: usize,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            min_batch_size: DEFAULT_MIN_BATCH_SIZE,
            min_batch_mb: DEFAULT_MIN_BATCH_MB,
            max_streams: DEFAULT_MAX_STREAMS,
        }
    }
}

impl PlannerConfig {
    /// The defaults, overridden by `CUDA_STREAMS_MIN_BATCH_SIZE`,
    /// `CUDA_STREAMS_MIN_BATCH_MB` and `CUDA_STREAMS_MAX_STREAMS` when set, or
    /// by seed 004's names for them ([`PLANNER_SETTINGS`]); ours win when
    /// both are set. A value that does not parse, or is out of range, is an
    /// error naming the variable and the value.
    pub fn from_env() -> Result<Self> {
        let [size, mb, streams] = PLANNER_SETTINGS.map(|s| s.from_env());
        Self::from_found(size?, mb?, streams?)
    }

    /// [`from_env`](Self::from_env) with the variables read through `lookup`.
    ///
    /// ```
    /// use cuda_streams_pipeline::PlannerConfig;
    /// let config = PlannerConfig::from_lookup(|var| {
    ///     (var == "CUDA_STREAMS_MAX_STREAMS").then(|| "2".to_string())
    /// }).unwrap();
    /// assert_eq!((config.max_streams, config.min_batch_size), (2, 8));
    /// // Seed 004's names work too; ours win when both are set.
    /// let config = PlannerConfig::from_lookup(|var| match var {
    ///     "MAX_CONCURRENT_CUDA_STREAMS" => Some("3".into()),
    ///     "MIN_BATCH_SIZE_FOR_STREAMS" => Some("16".into()),
    ///     "CUDA_STREAMS_MIN_BATCH_SIZE" => Some("32".into()),
    ///     _ => None,
    /// }).unwrap();
    /// assert_eq!((config.max_streams, config.min_batch_size), (3, 32));
    /// let err = PlannerConfig::from_lookup(|_| Some("lots".into())).unwrap_err();
    /// assert!(err.to_string().contains("CUDA_STREAMS_MIN_BATCH_SIZE=\"lots\""), "{err}");
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let [size, mb, streams] = PLANNER_SETTINGS.map(|s| s.lookup(&lookup));
        Self::from_found(size?, mb?, streams?)
    }

    fn from_found(size: Option<Found>, mb: Option<Found>, streams: Option<Found>) -> Result<Self> {
        let mut config = Self::default();
        if let Some(found) = size {
            config.min_batch_size = found.parse_int(1..)?;
        }
        if let Some(found) = mb {
            config.min_batch_mb = found.parse_number(0.0)?;
        }
        if let Some(found) = streams {
            config.max_streams = found.parse_int(1..=MAX_STREAMS_LIMIT)?;
        }
        Ok(config)
    }
}

/// The decision and the key-to-stream assignment, computed once.
///
/// ```
/// use cuda_streams_pipeline::{ArraySpec, PlannerConfig, plan_transfers};
/// let arrays = [
///     ArraySpec::f32("image", &[256, 256, 64]), // 16 MiB per sample
///     ArraySpec::f32("mask", &[256, 256, 16]),  // 4 MiB
///     ArraySpec::f32("weights", &[256, 256, 16]),
/// ];
/// let config = PlannerConfig { max_streams: 2, ..PlannerConfig::default() };
/// let plan = plan_transfers(&arrays, 16, &config);
/// assert!(plan.use_streams && plan.streams == 2);
/// // Largest first onto the least loaded stream: the image alone, the rest together.
/// assert_eq!((plan.stream_of("image"), plan.stream_of("weights")), (Some(0), Some(1)));
/// assert_eq!(plan.stream_bytes, [256 << 20, 128 << 20]);
/// let line = plan.to_string(); // the one log line
/// assert!(line.starts_with("CUDA streams enabled: 2 stream(s), batch_size=16, memory=384.0MB"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TransferPlan {
    /// Whether keys are spread over several streams.
    pub use_streams: bool,
    /// Samples per batch.
    pub batch_size: usize,
    /// Bytes per batch, all keys together.
    pub batch_bytes: u64,
    /// The streams used (1 when `use_streams` is false).
    pub streams: usize,
    /// Each key's stream index, in the order the arrays were given.
    pub assignment: Vec<(String, usize)>,
    /// Bytes per batch on each stream.
    pub stream_bytes: Vec<u64>,
    /// Why streams are on or off (the thresholds that decided).
    pub reason: String,
}

impl TransferPlan {
    /// Bytes per batch in MiB.
    pub fn batch_mb(&self) -> f64 {
        self.batch_bytes as f64 / (1024.0 * 1024.0)
    }

    /// The stream index of `key`.
    pub fn stream_of(&self, key: &str) -> Option<usize> {
        self.assignment
            .iter()
            .find(|(name, _)| name == key)
            .map(|&(_, stream)| stream)
    }
}

impl fmt::Display for TransferPlan {
    /// The one log line, e.g. `CUDA streams enabled: 4 streams, batch_size=16, memory=402.7MB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA streams {}: {} stream(s), batch_size={}, memory={:.1}MB ({})",
            if self.use_streams {
                "enabled"
            } else {
                "disabled"
            },
            self.streams,
            self.batch_size,
            self.batch_mb(),
            self.reason
        )
    }
}

/// Decide whether a batch of `batch_size` samples of `arrays` should be
/// uploaded on several streams, and assign each key a stream.
///
/// Streams are used when the batch has at least `min_batch_size` samples
/// *and* at least `min_batch_mb` MiB. Then keys are assigned largest first,
/// each to the stream with the fewest bytes so far (ties: the lower index),
/// over `min(max_streams, keys)` streams; otherwise every key goes on stream 0.
///
/// ```
/// use cuda_streams_pipeline::{ArraySpec, PlannerConfig, plan_transfers};
/// // 16 samples of 256×256×64 float32: 16 × 16 MiB = 256 MiB ≥ 100 MiB.
/// let plan = plan_transfers(&[ArraySpec::f32("raw", &[256, 256, 64])], 16, &PlannerConfig::default());
/// assert!(plan.use_streams);
/// assert_eq!(plan.batch_mb(), 256.0);
/// ```
pub fn plan_transfers(
    arrays: &[ArraySpec],
    batch_size: usize,
    config: &PlannerConfig,
) -> TransferPlan {
    let bytes: Vec<u64> = arrays
        .iter()
        .map(|a| a.sample_bytes() * batch_size as u64)
        .collect();
    let batch_bytes: u64 = bytes.iter().sum();
    let mb = batch_bytes as f64 / (1024.0 * 1024.0);
    let big_enough = batch_size >= config.min_batch_size;
    let heavy_enough = mb >= config.min_batch_mb;
    let use_streams = big_enough && heavy_enough;
    let reason = format!(
        "batch size {batch_size} {} {}, batch {mb:.1} MiB {} {} MiB, {} key(s)",
        if big_enough { ">=" } else { "<" },
        config.min_batch_size,
        if heavy_enough { ">=" } else { "<" },
        config.min_batch_mb,
        arrays.len()
    );
    let streams = if use_streams {
        config.max_streams.min(arrays.len()).max(1)
    } else {
        1
    };
    let mut stream_bytes = vec![0u64; streams];
    let mut assignment: Vec<(String, usize)> = arrays.iter().map(|a| (a.name.clone(), 0)).collect();
    let mut largest_first: Vec<usize> = (0..arrays.len()).collect();
    largest_first.sort_by(|&a, &b| bytes[b].cmp(&bytes[a]).then(a.cmp(&b)));
    for key in largest_first {
        let (stream, _) = stream_bytes
            .iter()
            .enumerate()
            .min_by_key(|&(i, &load)| (load, i))
            .expect("at least one stream");
        stream_bytes[stream] += bytes[key];
        assignment[key].1 = stream;
    }
    TransferPlan {
        use_streams,
        batch_size,
        batch_bytes,
        streams,
        assignment,
        stream_bytes,
        reason,
    }
}
