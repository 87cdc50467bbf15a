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
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long one example may run: `CUDA_STREAMS_EXAMPLE_TIMEOUT_S`, or 300 s
/// (the software driver runs each in seconds; a hang fails instead of
/// stalling the suite).
fn timeout() -> Duration {
    std::env::var("CUDA_STREAMS_EXAMPLE_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs_f64)
}

/// The child's output, or `None` (the child killed) when it has not ended
/// within `limit`. A thread waits for it; this one waits on a channel with
/// a deadline.
fn wait_within(child: Child, limit: Duration) -> Option<Output> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => Some(output.expect("waiting for an example")),
        Err(_) => {
            // The waiter thread owns the child: kill it by its id (its
            // own children, the ranks of a multi-process example, end
            // with their NCCL peers).
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            None
        }
    }
}

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
    "pipeline_parallel",
    "all_to_all",
    "user_kernels",
    "first_hour",
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
        let child = Command::new(&path)
            .current_dir(&work)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
        let Some(output) = wait_within(child, timeout()) else {
            println!("--- {name}: killed after {:?}", timeout());
            failures.push(format!(
                "{name} (still running after {:?}: a hang, or set CUDA_STREAMS_EXAMPLE_TIMEOUT_S)",
                timeout()
            ));
            continue;
        };
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
