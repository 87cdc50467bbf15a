//! Runs every example of this crate and checks that it succeeds.
//!
//! `cargo test` builds the examples but never runs them; this test does, from
//! `CUDA_STREAMS_EXAMPLES_DIR` when set (the GPU bundle's `run.sh` sets it) or
//! else from where cargo put them (`target/<profile>/examples/`, next to this
//! test's `deps/` directory), each in a temporary working directory. The
//! examples need every feature (`required-features`), so this test does too.
#![cfg(all(
    feature = "pool",
    feature = "events",
    feature = "allocator",
    feature = "profiler",
    feature = "pipeline",
    feature = "kernels",
    feature = "collectives"
))]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every `[[example]]` of Cargo.toml.
const EXAMPLES: &[&str] = &[
    "stream_pool",
    "event_coordination",
    "allocator",
    "triple_buffer",
    "stage_manager",
    "managed_context",
    "batch_planner",
    "profiler",
    "async_loader",
    "graph_replay",
    "data_parallel",
    "two_gpu_pipeline",
    "user_kernels",
];

/// Where the examples are: `CUDA_STREAMS_EXAMPLES_DIR`, or the directory
/// cargo builds them into if this test runs from cargo's layout
/// (`target/<profile>/deps/examples-<hash>`).
fn examples_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CUDA_STREAMS_EXAMPLES_DIR") {
        return Some(dir.into());
    }
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    (deps.file_name()? == "deps").then(|| deps.parent().unwrap().join("examples"))
}

fn executable(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

#[test]
fn every_example_runs() {
    let dir = examples_dir().expect(
        "this test binary is not in cargo's target layout: \
         set CUDA_STREAMS_EXAMPLES_DIR to the folder holding the example binaries",
    );
    let work = std::env::temp_dir().join(format!("cuda-streams-examples-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let mut failures = Vec::new();
    for name in EXAMPLES {
        let path = executable(&dir, name);
        assert!(
            path.is_file(),
            "example `{name}` is not built at {} (cargo test builds examples; \
             with a `--test` filter run `cargo build -p cuda-streams --examples` first)",
            path.display()
        );
        let output = Command::new(&path)
            .current_dir(&work)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
        println!("--- {name}: {}", output.status);
        print!("{}", String::from_utf8_lossy(&output.stdout));
        if !output.status.success() {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
            failures.push(format!("{name} ({})", output.status));
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(failures.is_empty(), "examples failed: {failures:?}");
}
