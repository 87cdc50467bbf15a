//! `cargo xtask bench-report [--from LOG_DIR] [--out PATH]`: docs/benchmarks.md
//! from the benches' `RATIO` and `FIGURE` lines.
//!
//! With `--from`, the logs are those `target/gpu-bundle/run.sh LOG_DIR` wrote
//! on the GPU machine (`bench-<name>.log` per bench, `gpu.txt` from
//! nvidia-smi). Without it, `cargo bench -p cuda-streams-benches` runs here,
//! one bench at a time, and its output is saved the same way under
//! `target/bench-report/` first, so both paths share one parser.

use crate::{Result, workspace_root};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// `RATIO <name>: ours <x> ns, baseline <y> ns, <r>x` (benches/src/lib.rs).
#[derive(Clone, Debug, PartialEq)]
struct Ratio {
    name: String,
    ours_ns: f64,
    baseline_ns: f64,
    ratio: f64,
}

/// `FIGURE <name>: <value> <unit>`.
#[derive(Clone, Debug, PartialEq)]
struct Figure {
    name: String,
    value: f64,
    unit: String,
}

/// What one bench's log held.
#[derive(Debug, Default)]
struct BenchLog {
    bench: String,
    ratios: Vec<Ratio>,
    figures: Vec<Figure>,
    /// The log's last lines when it produced nothing we could read.
    failure: Option<String>,
}

/// Where the figures came from, for the document's header.
struct Provenance {
    machine: String,
    date: String,
    command: String,
}

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut from = None;
    let mut out = workspace_root().join("docs").join("benchmarks.md");
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--from" => {
                from = Some(PathBuf::from(
                    args.next().ok_or("--from needs a log folder")?,
                ))
            }
            "--out" => out = PathBuf::from(args.next().ok_or("--out needs a path")?),
            other => return Err(format!("bench-report: unknown option `{other}`")),
        }
    }
    let (dir, provenance) = match from {
        Some(dir) => {
            let provenance = Provenance {
                machine: gpu_machine(&dir),
                date: logs_date(&dir)?,
                command: format!(
                    "{}`{}` (each bench binary with `--bench`, `CUDA_STREAMS_DRIVER=cuda`), \
                     then `cargo xtask bench-report --from <log dir>`",
                    bundle_commit(&dir)
                        .map(|commit| format!("`cargo xtask gpu-bundle` at commit {commit}, "))
                        .unwrap_or_default(),
                    run_command(&dir)
                ),
            };
            (dir, provenance)
        }
        None => run_locally()?,
    };
    let logs = read_logs(&dir)?;
    let mut document = render(&logs, &provenance);
    // The guides' measurement history lives at the end of the same file,
    // written by hand: a new run replaces the tables and keeps it.
    if let Ok(previous) = std::fs::read_to_string(&out) {
        document.push_str(kept_by_hand(&previous));
    }
    std::fs::write(&out, document).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    let (ratios, figures) = logs.iter().fold((0, 0), |(r, f), log| {
        (r + log.ratios.len(), f + log.figures.len())
    });
    eprintln!(
        "xtask: {}: {ratios} comparisons and {figures} figures from {} bench logs in {}",
        out.display(),
        logs.len(),
        dir.display()
    );
    Ok(())
}

/// Run every bench here, saving each one's output as `bench-<name>.log`.
fn run_locally() -> Result<(PathBuf, Provenance)> {
    let root = workspace_root();
    let dir = root.join("target").join("bench-report");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let manifest = std::fs::read_to_string(root.join("benches").join("Cargo.toml"))
        .map_err(|e| format!("cannot read benches/Cargo.toml: {e}"))?;
    let benches = bench_names(&manifest);
    if benches.is_empty() {
        return Err("benches/Cargo.toml declares no [[bench]]".into());
    }
    let mut drivers = Vec::new();
    for bench in &benches {
        eprintln!("xtask: cargo bench -p cuda-streams-benches --bench {bench}");
        let output = run_captured(Command::new("cargo").current_dir(&root).args([
            "bench",
            "-p",
            "cuda-streams-benches",
            "--bench",
            bench,
        ]))?;
        std::fs::write(dir.join(format!("bench-{bench}.log")), &output)
            .map_err(|e| format!("cannot write the log of {bench}: {e}"))?;
        // The driver layer says which driver it picked: "cuda-streams: using the X driver".
        if let Some(driver) = output
            .lines()
            .find_map(|l| l.split_once("using ").map(|(_, rest)| rest.trim()))
            .filter(|rest| rest.ends_with(" driver"))
        {
            drivers.push(driver.to_string());
        }
    }
    drivers.sort();
    drivers.dedup();
    let driver = match drivers.as_slice() {
        [] => format!(
            "driver as selected by CUDA_STREAMS_DRIVER ({})",
            std::env::var("CUDA_STREAMS_DRIVER").unwrap_or_else(|_| "unset: auto".into())
        ),
        lines => lines.join("; "),
    };
    let provenance = Provenance {
        machine: format!("this machine ({}), {driver}", local_machine()),
        date: format_date(SystemTime::now()),
        command:
            "`cargo xtask bench-report` (runs `cargo bench -p cuda-streams-benches --bench <name>` \
                  for each bench, here)"
                .to_string(),
    };
    Ok((dir, provenance))
}

/// The `name = "..."` of every `[[bench]]` table.
fn bench_names(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_bench = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bench = line == "[[bench]]";
            continue;
        }
        let value = line
            .strip_prefix("name")
            .and_then(|rest| rest.trim_start().strip_prefix('='));
        match value {
            Some(value) if in_bench => names.push(value.trim().trim_matches('"').to_string()),
            _ => {}
        }
    }
    names
}

/// The `run.sh` command line that wrote the logs, from the `command.txt` it
/// leaves there (logs from before it did get the plain form).
fn run_command(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("command.txt"))
        .ok()
        .and_then(|text| text.lines().next().map(str::trim).map(str::to_string))
        .filter(|line| !line.is_empty())
        .unwrap_or_else(|| "bash target/gpu-bundle/run.sh <log dir>".to_string())
}

/// The commit the bundle was built from, from the `bundle: commit <rev>, ...`
/// line of `run.sh`'s summary.
fn bundle_commit(dir: &Path) -> Option<String> {
    let summary = std::fs::read_to_string(dir.join("summary.txt")).ok()?;
    let line = summary
        .lines()
        .find_map(|l| l.strip_prefix("bundle: commit "))?;
    let commit = line.split(',').next()?.trim();
    (!commit.is_empty()).then(|| commit.to_string())
}

/// Run `command`, echo its stdout and stderr as they come, and return both
/// (interleaved as they arrived, as `run.sh`'s `> log 2>&1` would save them).
fn run_captured(command: &mut Command) -> Result<String> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start cargo bench: {e}"))?;
    let log = Arc::new(Mutex::new(String::new()));
    let pump = |stream: Box<dyn Read + Send>, to_stdout: bool| {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stream)
                .lines()
                .map_while(std::io::Result::ok)
            {
                if to_stdout {
                    println!("{line}");
                } else {
                    eprintln!("{line}");
                }
                let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        })
    };
    let threads = [
        pump(Box::new(child.stdout.take().expect("piped")), true),
        pump(Box::new(child.stderr.take().expect("piped")), false),
    ];
    let status = child.wait().map_err(|e| format!("cargo bench: {e}"))?;
    for thread in threads {
        let _ = thread.join();
    }
    if !status.success() {
        return Err(format!("cargo bench failed ({status})"));
    }
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(log)
}

fn local_machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores")
}

/// The GPU line nvidia-smi left in `gpu.txt`.
fn gpu_machine(dir: &Path) -> String {
    match std::fs::read_to_string(dir.join("gpu.txt")) {
        Ok(text) => match text.lines().map(str::trim).find(|l| !l.is_empty()) {
            Some(line) => {
                let fields: Vec<&str> = line.split(',').map(str::trim).collect();
                match fields.as_slice() {
                    [name, driver, memory] => {
                        format!("{name}, driver {driver}, {memory} (nvidia-smi)")
                    }
                    _ => format!("{line} (nvidia-smi)"),
                }
            }
            None => "unknown (gpu.txt is empty)".into(),
        },
        Err(_) => "unknown (no gpu.txt in the log folder)".into(),
    }
}

/// The date of the run: the newest bench log's modification time.
fn logs_date(dir: &Path) -> Result<String> {
    let newest = bench_logs(dir)?
        .iter()
        .filter_map(|path| path.metadata().and_then(|m| m.modified()).ok())
        .max()
        .unwrap_or_else(SystemTime::now);
    Ok(format_date(newest))
}

/// `YYYY-MM-DD` (UTC) without a date crate: Howard Hinnant's civil_from_days.
fn format_date(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn bench_logs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bench-") && n.ends_with(".log"))
        })
        .collect();
    logs.sort();
    if logs.is_empty() {
        return Err(format!("no bench-*.log files in {}", dir.display()));
    }
    Ok(logs)
}

fn read_logs(dir: &Path) -> Result<Vec<BenchLog>> {
    bench_logs(dir)?
        .iter()
        .map(|path| {
            let bytes =
                std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let bench = name.trim_start_matches("bench-").trim_end_matches(".log");
            Ok(parse_log(bench, &String::from_utf8_lossy(&bytes)))
        })
        .collect()
}

fn parse_log(bench: &str, text: &str) -> BenchLog {
    let mut log = BenchLog {
        bench: bench.to_string(),
        ..BenchLog::default()
    };
    for line in text.lines() {
        let line = line.trim();
        if let Some(ratio) = parse_ratio(line) {
            log.ratios.push(ratio);
        } else if let Some(figure) = parse_figure(line) {
            log.figures.push(figure);
        }
    }
    if log.ratios.is_empty() && log.figures.is_empty() {
        let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(3)..].join(" / ");
        log.failure = Some(if tail.is_empty() {
            "empty log".into()
        } else {
            tail
        });
    }
    log
}

/// A number followed by `unit`, e.g. `"123.4 ns"` -> 123.4.
fn number_with_unit(text: &str, unit: &str) -> Option<f64> {
    text.trim().strip_suffix(unit)?.trim().parse().ok()
}

fn parse_ratio(line: &str) -> Option<Ratio> {
    let rest = line.strip_prefix("RATIO ")?;
    // Names may contain ": " themselves; the figures follow the last one.
    let (name, figures) = rest.rsplit_once(": ours ")?;
    let mut parts = figures.split(',').map(str::trim);
    let ours_ns = number_with_unit(parts.next()?, "ns")?;
    let baseline_ns = number_with_unit(parts.next()?.strip_prefix("baseline")?, "ns")?;
    let ratio = match parts.next() {
        Some(text) => number_with_unit(text, "x")?,
        None => baseline_ns / ours_ns,
    };
    Some(Ratio {
        name: name.trim().to_string(),
        ours_ns,
        baseline_ns,
        ratio,
    })
}

fn parse_figure(line: &str) -> Option<Figure> {
    let rest = line.strip_prefix("FIGURE ")?;
    let (name, value) = rest.rsplit_once(": ")?;
    let (number, unit) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    Some(Figure {
        name: name.trim().to_string(),
        value: number.parse().ok()?,
        unit: unit.trim().to_string(),
    })
}

/// Nanoseconds in the unit that keeps three or four significant digits.
fn format_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

fn format_value(value: f64) -> String {
    if value != 0.0 && value.abs() < 0.01 {
        format!("{value:.3e}")
    } else if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}

/// Table cells must not contain `|`.
/// The heading from which `docs/benchmarks.md` is written by hand.
const BY_HAND: &str = "\n## Measurements";

/// What a regenerated file keeps of the `previous` one: everything from its
/// first [`BY_HAND`] heading on (with the blank line before it), or nothing.
fn kept_by_hand(previous: &str) -> &str {
    previous.find(BY_HAND).map_or("", |at| &previous[at..])
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn render(logs: &[BenchLog], provenance: &Provenance) -> String {
    let mut doc = String::new();
    doc.push_str("# Benchmarks\n\n");
    doc.push_str(
        "Generated by `cargo xtask bench-report` from the `RATIO` and `FIGURE` lines the\n\
         criterion benches in `benches/` print (see `benches/src/lib.rs`); do not edit the\n\
         tables by hand. The sections from \"Measurements\" on are written by hand (each\n\
         guide's history of figures) and kept when this file is generated again.\n\
         Every comparison measures our code and its baseline in the same run, as the\n\
         median of batches of calls (or of whole runs for wall times).\n\n",
    );
    doc.push_str(&format!("- machine: {}\n", provenance.machine));
    doc.push_str(&format!("- date: {} (UTC)\n", provenance.date));
    doc.push_str(&format!("- command: {}\n\n", provenance.command));
    if provenance.machine.contains("software driver") {
        doc.push_str(
            "On the software driver (CPU threads) these figures only show that the benches\n\
             run; the GPU figures come from `cargo xtask bench-report --from <log dir>` on the\n\
             logs of `target/gpu-bundle/run.sh`.\n\n",
        );
    }

    doc.push_str("## Ours against the baseline\n\n");
    doc.push_str("ratio = baseline / ours: above 1 ours is faster (or, for wall times, finishes sooner).\n\n");
    doc.push_str(
        "| bench | comparison | ours | baseline | ratio |\n| --- | --- | ---: | ---: | ---: |\n",
    );
    for log in logs {
        for r in &log.ratios {
            doc.push_str(&format!(
                "| {} | {} | {} | {} | {:.2}× |\n",
                log.bench,
                cell(&r.name),
                format_ns(r.ours_ns),
                format_ns(r.baseline_ns),
                r.ratio
            ));
        }
    }
    doc.push_str("\n## Figures\n\n| bench | figure | value |\n| --- | --- | ---: |\n");
    for log in logs {
        for f in &log.figures {
            let value = if f.unit == "ns" {
                format_ns(f.value)
            } else {
                format!("{} {}", format_value(f.value), f.unit)
                    .trim()
                    .to_string()
            };
            doc.push_str(&format!(
                "| {} | {} | {} |\n",
                log.bench,
                cell(&f.name),
                value
            ));
        }
    }
    let failed: Vec<&BenchLog> = logs.iter().filter(|l| l.failure.is_some()).collect();
    if !failed.is_empty() {
        doc.push_str("\n## Benches without results\n\n");
        for log in failed {
            doc.push_str(&format!(
                "- `{}`: {}\n",
                log.bench,
                log.failure.as_deref().unwrap_or_default()
            ));
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_new_report_keeps_the_measurements_written_by_hand() {
        let previous =
            "# Benchmarks\n\n## Figures\n| a | b |\n\n## Measurements: engine\nhistory\n";
        assert_eq!(
            super::kept_by_hand(previous),
            "\n## Measurements: engine\nhistory\n"
        );
        assert_eq!(super::kept_by_hand("# Benchmarks\n## Figures\n"), "");
    }

    use super::*;

    #[test]
    fn ratio_lines_parse_with_colons_in_names() {
        let r = parse_ratio("RATIO 8 x 10 ms spin: pool streams vs one stream: ours 10050000 ns, baseline 80000000 ns, 7.96x").unwrap();
        assert_eq!(r.name, "8 x 10 ms spin: pool streams vs one stream");
        assert_eq!(
            (r.ours_ns, r.baseline_ns, r.ratio),
            (10_050_000.0, 80_000_000.0, 7.96)
        );
        let r = parse_ratio("RATIO pool get_stream vs stream create+destroy: ours 30.0 ns, baseline 3174 ns, 105.80x").unwrap();
        assert_eq!((r.ours_ns, r.ratio), (30.0, 105.8));
        assert_eq!(parse_ratio("RATIO broken: ours fast"), None);
        assert_eq!(parse_ratio("ratio x: ours 1 ns, baseline 2 ns, 2x"), None);
    }

    #[test]
    fn figure_lines_parse() {
        let f = parse_figure("FIGURE 8 x 10 ms spin kernels, one stream: wall: 80.012 ms").unwrap();
        assert_eq!(
            (f.name.as_str(), f.value, f.unit.as_str()),
            ("8 x 10 ms spin kernels, one stream: wall", 80.012, "ms")
        );
        let f = parse_figure("FIGURE async waiter polls during the run: 12.000 polls").unwrap();
        assert_eq!((f.value, f.unit.as_str()), (12.0, "polls"));
        assert_eq!(parse_figure("FIGURE no value:  ms"), None);
    }

    #[test]
    fn logs_without_results_are_reported() {
        let log = parse_log(
            "pool",
            "Benchmarking x\nthread 'main' panicked at benches/pool.rs:3\n",
        );
        assert!(log.failure.as_deref().unwrap().contains("panicked"));
        let log = parse_log(
            "pool",
            "criterion noise\n  FIGURE a: 1.5 ns\nRATIO b: ours 1 ns, baseline 3 ns, 3.00x\n",
        );
        assert_eq!(
            (log.ratios.len(), log.figures.len(), log.failure.as_deref()),
            (1, 1, None)
        );
        let doc = render(
            &[log],
            &Provenance {
                machine: "m".into(),
                date: "d".into(),
                command: "c".into(),
            },
        );
        assert!(
            doc.contains("| pool | b | 1.0 ns | 3.0 ns | 3.00× |"),
            "{doc}"
        );
        assert!(doc.contains("| pool | a | 1.5 ns |"), "{doc}");
    }

    #[test]
    fn bench_names_come_from_the_manifest() {
        let manifest = "[package]\nname = \"cuda-streams-benches\"\n\n[[bench]]\nname = \"pool\"\nharness = false\n\n[[bench]]\nname = \"events\"\n";
        assert_eq!(bench_names(manifest), ["pool", "events"]);
    }

    #[test]
    fn dates_are_civil() {
        let day = |secs| format_date(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        assert_eq!(day(0), "1970-01-01");
        assert_eq!(day(951_782_400), "2000-02-29");
        assert_eq!(day(1_795_219_200), "2026-11-21");
    }
}
