//! GPU-timed stream profiling, per-stream reports, Chrome-trace timelines (being built).
