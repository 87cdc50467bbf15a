//! GPU-timed stream profiling: per-stream reports, overlap across streams,
//! and a Chrome-trace timeline that Perfetto opens.
//!
//! Times come from timing events recorded on the streams (GPU time, not host
//! guesses), taken from an [`driver::EventPool`], resolved without stalling
//! the streams, on one timeline shared by every stream. A scope counts its
//! own work only: it starts at its first work item, after the waits that
//! order it on other streams, and shares one boundary event with the scope
//! before it. A [`Sampler`] times one scope in N of a name for launch-bound
//! loops; [`StreamProfiler::track_memory`] adds an allocator's memory to the
//! trace as counter tracks; with the `nvtx` feature scopes are NVTX ranges.
//! [`Backend::Cupti`] takes the times from CUPTI's activity records instead
//! of events, where a GPU and `libcupti.so.13` are there.
//!
//! ```
//! use cuda_streams_profiler::StreamProfiler;
//! use cuda_streams_profiler::driver::{Context, LaunchConfig, Module, Stream};
//! # fn main() -> cuda_streams_profiler::Result<()> {
//! let ctx = Context::new(0)?;
//! let spin = Module::load(&ctx, &kernels::TIMING)?.function("spin")?;
//! let one_thread = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
//! let streams = [Stream::new(&ctx)?, Stream::new(&ctx)?];
//!
//! let profiler = StreamProfiler::new(&ctx)?;
//! profiler.enable();
//! for stream in &streams {
//!     // 2 ms of GPU time on each stream; the streams run side by side.
//!     profiler.time(stream, "spin", |s| s.launch(&spin, one_thread, &[2_000_000u64.into()]))??;
//! }
//!
//! let report = profiler.get_comprehensive_report();
//! assert_eq!(report.total_streams, 2);
//! assert_eq!(report.streams[0].kernel_launches, 1);
//! println!("{report}");
//! let trace = profiler.to_chrome_trace()?; // save as .json, open in ui.perfetto.dev
//! assert!(trace.contains(r#""ph":"X""#));
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/profiler.md` for a guide.

// Only the CUPTI backend (FFI callbacks and records) uses `unsafe`.
#![deny(unsafe_code)]

mod clock;
#[allow(unsafe_code, reason = "CUPTI's C API: callbacks, buffers and records")]
mod cupti;
mod display;
mod error;
mod graph;
mod memory;
mod memory_report;
mod profiler;
mod report;
mod sampler;
mod sampler_state;
mod scope;
mod shared;
mod stats;
mod timed_op;
mod timeline;
mod trace;

/// The allocator whose memory a profiler can put on its timeline
/// ([`StreamProfiler::track_memory`]).
pub use allocator;
/// The safe driver layer this crate builds on (contexts, streams, buffers),
/// so examples can name it through this crate.
pub use driver;
/// How reports print byte counts and durations (the driver layer's, shared
/// by every crate's reports).
pub use driver::{format_bytes, format_duration};
/// The operation graph a profiler can observe (`OperationGraph::observe`:
/// every operation timed under its label).
pub use engine;
pub use error::{Error, Result};
pub use memory_report::{MemoryReport, StreamMemory};
pub use profiler::{BACKEND_ENV, BACKEND_SETTING, Backend, StreamProfiler};
pub use report::{ComprehensiveReport, StreamReport};
pub use sampler::Sampler;
pub use scope::ScopeGuard;
pub use stats::OperationStats;

/// The guide's examples, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/profiler.md")]
pub struct Guide;
