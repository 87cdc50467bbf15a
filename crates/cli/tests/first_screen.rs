//! What the demo and the bench tell a new user. The demo's first screen says
//! what ran and what overlapped, counts each stream's launches and
//! transfers, gives one overlap figure with its definition, calls no time
//! "GPU time" that no GPU measured, and keeps the engine's diagnostics
//! behind `--verbose`. The bench says, on the software driver, that its
//! figures only show the code runs.

mod support;

use std::process::Command;
use std::sync::OnceLock;
use support::{cli, text};

/// The definition that goes with the one overlap figure, as printed.
const BUSY_SHARE: &str = "% of the span (time with at least one stream busy / span)";

/// `cuda-streams demo` with `args`, in a temporary directory of its own;
/// its stdout, once it is known to have succeeded.
fn run_demo(name: &str, args: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!(
        "cuda-streams-first-screen-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(cli())
        .arg("demo")
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("the CLI runs");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "demo {args:?} failed: {}\n{stdout}\n{}",
        output.status,
        text(&output.stderr)
    );
    stdout
}

/// The demo as a new user first runs it, run once for the tests that read it.
fn demo() -> &'static str {
    static STDOUT: OnceLock<String> = OnceLock::new();
    STDOUT.get_or_init(|| run_demo("default", &[]))
}

/// `demo --verbose` with enough steps for a timed pipeline and timed DAG
/// rounds (the first three steps and the first round are warm-up).
fn verbose_demo() -> &'static str {
    static STDOUT: OnceLock<String> = OnceLock::new();
    STDOUT.get_or_init(|| run_demo("verbose", &["--verbose", "--steps", "6"]))
}

/// Whether the demo ran on the software driver, from its first line.
fn on_the_software_driver(stdout: &str) -> bool {
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("cuda-streams demo on "), "{stdout}");
    first.ends_with("(software driver)")
}

/// A row of the profiler's streams table, by what ran on the stream.
#[derive(Debug)]
struct Row {
    ops: u64,
    kernels: u64,
    transfers: u64,
}

/// The streams table's row whose work column is exactly `work`: after it,
/// ops, time and busy (a number and a unit each), busy %, kernels,
/// transfers, bytes.
fn row(stdout: &str, work: &str) -> Row {
    let line = stdout
        .lines()
        .find(|line| {
            line.split_once(' ').is_some_and(|(id, rest)| {
                id.parse::<u64>().is_ok() && rest.trim_start().starts_with(work)
            })
        })
        .unwrap_or_else(|| panic!("no streams-table row for {work:?}:\n{stdout}"));
    let rest = line.split_once(work).expect("the work column").1;
    let cells: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| -> u64 {
        cells
            .get(i)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("cell {i} of {line:?}"))
    };
    Row {
        ops: number(0),
        kernels: number(6),
        transfers: number(7),
    }
}

/// The pipeline's streams compute and copy: their rows count it (they read
/// 0 launches and 0 transfers when the profiler lost a dropped stream's
/// counters).
#[test]
fn the_pipeline_streams_count_their_launches_and_transfers() {
    let stdout = demo();
    let compute = row(stdout, "pipeline compute");
    assert!(
        compute.ops > 0 && compute.kernels >= compute.ops && compute.transfers == 0,
        "{compute:?}\n{stdout}"
    );
    for work in ["pipeline upload", "pipeline download"] {
        let copy = row(stdout, work);
        assert!(
            copy.ops > 0 && copy.transfers >= copy.ops && copy.kernels == 0,
            "{work}: {copy:?}\n{stdout}"
        );
    }
}

/// Times are "GPU time" only where a GPU timed them; the software driver's
/// come from CPU threads, and the report says so.
#[test]
fn only_a_gpu_s_times_are_called_gpu_time() {
    for stdout in [demo(), verbose_demo()] {
        if on_the_software_driver(stdout) {
            assert!(!stdout.contains("GPU time"), "{stdout}");
            assert!(
                stdout.contains("timed by the software driver on CPU threads"),
                "{stdout}"
            );
        } else {
            assert!(stdout.contains("span of GPU time"), "{stdout}");
        }
    }
}

/// One overlap figure, with its definition: the share of the pipeline's
/// span in which a stream was busy, which the streams-busy table confirms
/// (100% less the share with none busy).
#[test]
fn the_demo_gives_one_overlap_figure_with_its_definition() {
    for stdout in [demo(), verbose_demo()] {
        assert_eq!(stdout.matches(BUSY_SHARE).count(), 1, "{stdout}");
        for other in ["overlap efficiency", "pipeline overlap"] {
            assert!(!stdout.contains(other), "{other}: {stdout}");
        }
        let busy: f64 = stdout
            .split_once(BUSY_SHARE)
            .and_then(|(before, _)| before.rsplit_once("busy "))
            .and_then(|(_, figure)| figure.parse().ok())
            .unwrap_or_else(|| panic!("no busy share: {stdout}"));
        let idle: f64 = stdout
            .lines()
            .skip_while(|line| !line.starts_with("streams busy"))
            .nth(1)
            .and_then(|line| line.strip_prefix("0 "))
            .and_then(|rest| rest.split_whitespace().last())
            .and_then(|share| share.parse().ok())
            .unwrap_or_else(|| panic!("no idle share: {stdout}"));
        assert!(busy > 0.0 && busy <= 100.0, "{busy}: {stdout}");
        assert!(
            (busy + idle - 100.0).abs() <= 0.15,
            "{busy} + {idle}: {stdout}"
        );
    }
}

/// The engine's diagnostics of the DAG (its host time per operation beside
/// the engine bench's shape, run here) and every stream's operation table
/// are for `--verbose`; the DAG's share against the shape is still there,
/// for the check that it stays within 2x of it.
#[test]
fn the_engine_diagnostics_are_behind_verbose() {
    let diagnostics = [
        "DAG host time per operation",
        "the engine bench's shape run here before and after the DAG",
        "the engine's share split at the body",
        "the DAG's share in the rounds enqueued right after the host waited",
        "completion callbacks ran",
    ];
    let stdout = demo();
    for line in diagnostics {
        assert!(!stdout.contains(line), "{line}: {stdout}");
    }
    assert!(!stdout.contains(" p99"), "no operation tables: {stdout}");
    assert!(stdout.contains("--verbose prints"), "{stdout}");

    let verbose = verbose_demo();
    for line in diagnostics {
        assert!(verbose.contains(line), "{line}: {verbose}");
    }
    assert!(
        verbose.contains(
            "DAG host time per operation (steady state: rounds 2 on, the first left out as warm-up):"
        ) && verbose.contains("with a 4-byte memset as each body")
            && verbose.contains("scale_add "),
        "{verbose}"
    );
    let share: f64 = verbose
        .split_once("the DAG's share is ")
        .and_then(|(_, rest)| rest.split_once("x that"))
        .and_then(|(figure, _)| figure.parse().ok())
        .unwrap_or_else(|| panic!("no DAG share against the shape: {verbose}"));
    assert!(share.is_finite() && share > 0.0, "{share}: {verbose}");
    assert!(
        verbose.contains("every stream, the DAG's included, operation by operation:")
            && verbose.contains(" p99")
            && verbose.contains("dag saxpy"),
        "{verbose}"
    );
}

/// On the software driver the bench's ratios time CPU threads standing in
/// for a GPU: the table and the JSON say so; on a GPU they do not.
#[test]
fn the_bench_says_what_its_figures_mean() {
    let output = Command::new(cli()).arg("bench").output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let software = stdout
        .lines()
        .next()
        .is_some_and(|line| line.contains("(software driver)"));
    let note = "these figures only show that the code runs, not how fast it is on a GPU";
    assert_eq!(stdout.contains(note), software, "{stdout}");
    assert_eq!(
        stdout.contains("software driver: the ratios say nothing about a GPU"),
        software,
        "{stdout}"
    );

    let output = Command::new(cli())
        .args(["bench", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let figures = report["figures"].as_str().expect("what the figures mean");
    assert_eq!(report["driver"] == "software", software, "{report:#}");
    assert_eq!(figures.contains(note), software, "{report:#}");
}
