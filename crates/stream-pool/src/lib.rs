//! Stream pool: real priorities, workload-aware strategies, live readiness, multi-stream coordination (being built).
