//! The CLI's demo end to end: it succeeds, verifies its results, prints the
//! profiler's report and writes a Chrome trace where asked.

use std::path::PathBuf;
use std::process::Command;

/// The CLI: where cargo built it, or `bin/` of the GPU bundle, next to the
/// `tests/` folder this test binary was copied into.
fn cli() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_cuda-streams"));
    if built.is_file() {
        return built;
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let bundled = exe
        .parent()
        .and_then(|tests| tests.parent())
        .map(|root| root.join("bin").join("cuda-streams"));
    match bundled {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "the cuda-streams binary is neither at {} nor in a bundle's bin/",
            built.display()
        ),
    }
}

#[test]
fn demo_verifies_its_results_and_writes_a_trace() {
    let dir = std::env::temp_dir().join(format!("cuda-streams-cli-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("demo-trace.json");
    let output = Command::new(cli())
        .args(["demo", "--trace"])
        .arg(&trace)
        .current_dir(&dir)
        .output()
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("every result verified"), "{stdout}");
    assert!(
        stdout.contains("overlap efficiency"),
        "the report table: {stdout}"
    );
    let json = std::fs::read_to_string(&trace).expect("the trace was written");
    assert!(json.contains("\"traceEvents\""), "{json}");
    assert!(json.contains("pipeline compute") && json.contains("dag saxpy"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_options_fail() {
    let output = Command::new(cli())
        .args(["demo", "--no-such-option"])
        .output()
        .expect("the CLI runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--no-such-option"));
}
