//! The CLI end to end, run as a user runs it: help, the demo (it succeeds,
//! verifies its results, prints the profiler's report and writes a Chrome
//! trace where asked), the bench's JSON, `info`, and the exit codes. What
//! the demo and the bench tell a new user is in `first_screen.rs`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use support::{cli, text};

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
    assert!(stdout.contains("every result checked"), "{stdout}");
    // What overlapped: the profiler's summary of the pipeline's streams.
    assert!(
        stdout.contains("\nwhat overlapped: the pipeline's streams over steps 3.."),
        "{stdout}"
    );
    let json = std::fs::read_to_string(&trace).expect("the trace was written");
    assert!(json.contains("\"traceEvents\""), "{json}");
    assert!(json.contains("pipeline compute") && json.contains("dag saxpy"));
    // The allocator's memory counter track: the DAG's scratch buffers.
    assert!(
        json.contains(r#""cat":"memory","ph":"C""#),
        "no memory track"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the CLI with `args` in a fresh temporary directory (so a default
/// `trace.json` lands there), returning its output and that directory.
fn run_in_temp(name: &str, args: &[&str]) -> (Output, PathBuf) {
    let dir = std::env::temp_dir().join(format!("cuda-streams-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(cli())
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("the CLI runs");
    (output, dir)
}

/// The demo's stdout, once it is known to have succeeded.
fn demo_stdout(output: &Output) -> String {
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        output.status,
        text(&output.stderr)
    );
    stdout
}

#[test]
fn help_lists_every_command_and_each_has_its_own() {
    let output = Command::new(cli())
        .arg("--help")
        .output()
        .expect("the CLI runs");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let help = text(&output.stdout);
    for command in ["info", "demo", "bench", "completions"] {
        assert!(help.contains(command), "{command} missing from:\n{help}");
    }
    assert!(help.contains("CUDA_STREAMS_DRIVER"), "{help}");

    let demo = Command::new(cli())
        .args(["demo", "--help"])
        .output()
        .unwrap();
    assert!(demo.status.success());
    let demo = text(&demo.stdout);
    assert!(
        demo.contains("--steps <N>") && demo.contains("--trace <PATH>"),
        "{demo}"
    );
    let bench = Command::new(cli())
        .args(["help", "bench"])
        .output()
        .unwrap();
    assert!(bench.status.success());
    assert!(text(&bench.stdout).contains("--json"));
}

#[test]
fn demo_with_two_steps_runs_two_steps_and_two_rounds() {
    let (output, dir) = run_in_temp("steps", &["demo", "--steps", "2"]);
    let stdout = demo_stdout(&output);
    assert!(
        stdout.contains("pipeline: 2 triple-buffered steps"),
        "{stdout}"
    );
    assert!(stdout.contains("2 results checked"), "{stdout}");
    assert!(stdout.contains("operation DAG: 2 rounds"), "{stdout}");
    assert!(stdout.contains("every result checked"), "{stdout}");
    // Two steps are all warm-up: no figure rather than a made-up one.
    assert!(
        stdout.contains("what overlapped: not measured (the first 3 steps are warm-up"),
        "{stdout}"
    );
    // Without --trace the trace goes to ./trace.json.
    let json = std::fs::read_to_string(dir.join("trace.json")).expect("./trace.json was written");
    let trace: serde_json::Value = serde_json::from_str(&json).expect("the trace is JSON");
    assert!(
        trace["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_verify_all_checks_every_element() {
    let (output, dir) = run_in_temp("verify-all", &["demo", "--steps", "4", "--verify-all"]);
    let stdout = demo_stdout(&output);
    assert!(
        stdout.contains("4 results checked (every element)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("every round checked (every element)"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_json_is_one_json_object_with_every_measurement() {
    let output = Command::new(cli())
        .args(["bench", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is exactly one JSON value");
    let measurements = report["measurements"]
        .as_array()
        .expect("a list of measurements");
    assert!(measurements.len() >= 4, "{report:#}");
    for m in measurements {
        let (ours, baseline, ratio) = (
            m["ours_ns"].as_f64().unwrap(),
            m["baseline_ns"].as_f64().unwrap(),
            m["ratio"].as_f64().unwrap(),
        );
        assert!(ours > 0.0 && baseline > 0.0, "{m}");
        assert!(
            (ratio - baseline / ours).abs() <= 1e-9 * ratio.abs().max(1.0),
            "{m}"
        );
        assert!(m["name"].as_str().is_some_and(|n| !n.is_empty()));
    }
    let driver = report["driver"].as_str().unwrap();
    assert!(driver == "CUDA" || driver == "software", "{driver}");
}

#[test]
fn info_describes_every_device_and_peer_access() {
    let output = Command::new(cli()).arg("info").output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let count: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("devices:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("a device count in:\n{stdout}"));
    assert!(count >= 1);
    for ordinal in 0..count {
        assert!(stdout.contains(&format!("device {ordinal}:")), "{stdout}");
    }
    assert!(stdout.contains("peer access:"), "{stdout}");
}

/// A usage error: exit code 2 and exactly one line on stderr naming it.
#[test]
fn a_bad_argument_exits_with_2_and_one_line() {
    for args in [
        &["demo", "--no-such-option"][..],
        &["demo", "--steps", "zero"],
        &["demo", "--steps", "0"],
        &["no-such-command"],
    ] {
        let output = Command::new(cli()).args(args).output().unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(args[args.len() - 1]), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

/// A failure while running: exit code 1 and one line naming the cause.
#[test]
fn a_failure_exits_with_1_and_one_line() {
    let output = Command::new(cli())
        .arg("info")
        .env("CUDA_STREAMS_DRIVER", "no-such-driver")
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no-such-driver"), "{stderr}");

    // A trace path that cannot be written fails the demo, after the work.
    let (output, dir) = run_in_temp(
        "badtrace",
        &["demo", "--steps", "1", "--trace", "no/such/dir/t.json"],
    );
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().count() == 1 && stderr.contains("no/such/dir/t.json"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_are_generated() {
    let output = Command::new(cli())
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let script = text(&output.stdout);
    assert!(
        script.contains("cuda-streams") && script.contains("--steps"),
        "{script}"
    );
}

/// Every variable the libraries and the CLI read, by every name: cleared in
/// the child so that the harness's own settings cannot change what it sees.
const SETTING_NAMES: &[&str] = &[
    "CUDA_STREAMS_SOFT_DEVICES",
    "CUDA_STREAMS_SOFT_CAPACITY_MB",
    "CUDA_STREAMS_POOL_SIZE",
    "CUDA_STREAMS_MIN_BATCH_SIZE",
    "MIN_BATCH_SIZE_FOR_STREAMS",
    "CUDA_STREAMS_MIN_BATCH_MB",
    "MIN_BATCH_MEMORY_FOR_STREAMS_MB",
    "CUDA_STREAMS_MAX_STREAMS",
    "MAX_CONCURRENT_CUDA_STREAMS",
    "CUDA_STREAMS_PROFILER_BACKEND",
    "CUDA_STREAMS_ORDERING",
    "CUDA_STREAMS_SOFT_SHUFFLE",
    "CUDA_STREAMS_KERNEL_CACHE",
];

/// `cuda-streams info` with exactly `vars` among [`SETTING_NAMES`] set (the
/// driver choice is left as the harness set it, so this runs on the GPU too).
/// Each run is its own process: nothing here changes this process's environment.
fn info_with(vars: &[(&str, &str)]) -> Output {
    let mut command = Command::new(cli());
    command.arg("info");
    for name in SETTING_NAMES {
        command.env_remove(name);
    }
    command.envs(vars.iter().copied());
    command.output().unwrap()
}

/// The line of `info`'s environment list for `name`.
fn setting_line<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no line for {name} in:\n{stdout}"))
}

#[test]
fn info_lists_every_setting_with_its_value_and_where_it_came_from() {
    let output = info_with(&[("CUDA_STREAMS_POOL_SIZE", "5")]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    for name in SETTING_NAMES
        .iter()
        .filter(|n| n.starts_with("CUDA_STREAMS_"))
        .chain(&["CUDA_STREAMS_DRIVER", "CUDA_STREAMS_LOG"])
    {
        setting_line(&stdout, name);
    }
    let pool = setting_line(&stdout, "CUDA_STREAMS_POOL_SIZE");
    assert!(
        pool.contains("\"5\"") && pool.ends_with("from CUDA_STREAMS_POOL_SIZE"),
        "{pool}"
    );
    let streams = setting_line(&stdout, "CUDA_STREAMS_MAX_STREAMS");
    assert!(
        streams.contains(" 4 ") && streams.ends_with("default"),
        "{streams}"
    );
}

#[test]
fn info_takes_seed_004_names_and_ours_win_when_both_are_set() {
    // The specification's names alone.
    let output = info_with(&[
        ("MAX_CONCURRENT_CUDA_STREAMS", "3"),
        ("MIN_BATCH_MEMORY_FOR_STREAMS_MB", "12.5"),
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let streams = setting_line(&stdout, "CUDA_STREAMS_MAX_STREAMS");
    assert!(
        streams.contains("\"3\"") && streams.contains("from MAX_CONCURRENT_CUDA_STREAMS"),
        "{streams}"
    );
    let mb = setting_line(&stdout, "CUDA_STREAMS_MIN_BATCH_MB");
    assert!(
        mb.contains("\"12.5\"") && mb.contains("from MIN_BATCH_MEMORY_FOR_STREAMS_MB"),
        "{mb}"
    );

    // Both names: ours, and the other is said to be ignored.
    let output = info_with(&[
        ("MIN_BATCH_SIZE_FOR_STREAMS", "3"),
        ("CUDA_STREAMS_MIN_BATCH_SIZE", "9"),
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let size = setting_line(&stdout, "CUDA_STREAMS_MIN_BATCH_SIZE");
    assert!(
        size.contains("\"9\"")
            && size.contains("from CUDA_STREAMS_MIN_BATCH_SIZE;")
            && size.contains("MIN_BATCH_SIZE_FOR_STREAMS is set too, and ignored"),
        "{size}"
    );

    // Ours wins even when the other name holds something unusable.
    let output = info_with(&[
        ("MAX_CONCURRENT_CUDA_STREAMS", "many"),
        ("CUDA_STREAMS_MAX_STREAMS", "2"),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[test]
fn a_bad_setting_fails_with_one_line_naming_the_variable_and_the_value() {
    for (var, value) in [
        ("CUDA_STREAMS_SOFT_CAPACITY_MB", "abc"),
        ("CUDA_STREAMS_SOFT_DEVICES", "0"),
        ("CUDA_STREAMS_POOL_SIZE", "eight"),
        ("CUDA_STREAMS_MIN_BATCH_SIZE", "-2"),
        ("MIN_BATCH_SIZE_FOR_STREAMS", "x"),
        ("MIN_BATCH_MEMORY_FOR_STREAMS_MB", "NaN"),
        ("MAX_CONCURRENT_CUDA_STREAMS", "1000"),
        ("CUDA_STREAMS_ORDERING", "sometimes"),
        ("CUDA_STREAMS_SOFT_SHUFFLE", "shuffled"),
    ] {
        let output = info_with(&[(var, value)]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{var}={value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("environment variable {var}={value:?} is invalid")),
            "{stderr}"
        );
        // The list still shows it, marked.
        let stdout = text(&output.stdout);
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("from {var}")))
            .unwrap_or_else(|| panic!("{var} is not listed:\n{stdout}"));
        assert!(line.contains("INVALID"), "{line}");
    }
}

/// A profiler backend that is not UTF-8 is refused like any bad value, not
/// taken silently as the default.
#[cfg(unix)]
#[test]
fn a_profiler_backend_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let value = std::ffi::OsStr::from_bytes(b"cup\xfftti");
    let output = Command::new(cli())
        .arg("info")
        .env("CUDA_STREAMS_PROFILER_BACKEND", value)
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("CUDA_STREAMS_PROFILER_BACKEND"), "{stderr}");
}

/// Not only `info` checks: the software driver itself refuses a bad capacity
/// rather than falling back to 16 GiB, so any command fails naming it.
#[test]
fn the_software_driver_refuses_a_bad_capacity() {
    let output = Command::new(cli())
        .args(["demo", "--steps", "1"])
        .env("CUDA_STREAMS_DRIVER", "soft")
        .env("CUDA_STREAMS_SOFT_CAPACITY_MB", "abc")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CUDA_STREAMS_SOFT_CAPACITY_MB=\"abc\" is invalid"),
        "{stderr}"
    );
}

/// Output into a pipe whose reader has gone ends the tool quietly (no panic
/// from `println!`): `info` prints its settings, then its devices after the
/// driver starts, by which time `head -n 1` has left.
#[cfg(unix)]
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let script = format!("'{}' info | head -n 1", cli().display());
    let output = Command::new("sh").args(["-c", &script]).output().unwrap();
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert_eq!(text(&output.stdout).lines().count(), 1);
}
