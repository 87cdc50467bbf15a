//! The repository's documents read as a description of the project, not of
//! how it was developed: no document speaks of sessions, and a commit hash
//! appears only in a "## Measurements" section (where a figure names the
//! commit it was measured at) or in `docs/benchmarks.md`, whose figures each
//! come from a named commit's run.
//!
//! The documents are compiled in, so the test runs wherever its binary does;
//! where the source tree is present, a second test checks that no document
//! was left off the list.

/// Every document checked, by its path from the repository's root.
const DOCUMENTS: &[(&str, &str)] = &[
    ("README.md", include_str!("../../../README.md")),
    ("CHANGELOG.md", include_str!("../../../CHANGELOG.md")),
    (
        "docs/allocator.md",
        include_str!("../../../docs/allocator.md"),
    ),
    (
        "docs/architecture.md",
        include_str!("../../../docs/architecture.md"),
    ),
    ("docs/async.md", include_str!("../../../docs/async.md")),
    (
        "docs/benchmarks.md",
        include_str!("../../../docs/benchmarks.md"),
    ),
    (
        "docs/engine-measurements.md",
        include_str!("../../../docs/engine-measurements.md"),
    ),
    ("docs/engine.md", include_str!("../../../docs/engine.md")),
    (
        "docs/event-coord.md",
        include_str!("../../../docs/event-coord.md"),
    ),
    (
        "docs/glossary.md",
        include_str!("../../../docs/glossary.md"),
    ),
    (
        "docs/graphs-measurements.md",
        include_str!("../../../docs/graphs-measurements.md"),
    ),
    ("docs/graphs.md", include_str!("../../../docs/graphs.md")),
    (
        "docs/host-memory.md",
        include_str!("../../../docs/host-memory.md"),
    ),
    ("docs/kernels.md", include_str!("../../../docs/kernels.md")),
    (
        "docs/multi-gpu.md",
        include_str!("../../../docs/multi-gpu.md"),
    ),
    (
        "docs/ordering-measurements.md",
        include_str!("../../../docs/ordering-measurements.md"),
    ),
    (
        "docs/ordering.md",
        include_str!("../../../docs/ordering.md"),
    ),
    (
        "docs/partitions.md",
        include_str!("../../../docs/partitions.md"),
    ),
    (
        "docs/pipeline.md",
        include_str!("../../../docs/pipeline.md"),
    ),
    (
        "docs/profiler.md",
        include_str!("../../../docs/profiler.md"),
    ),
    (
        "docs/stream-pool.md",
        include_str!("../../../docs/stream-pool.md"),
    ),
    ("docs/testing.md", include_str!("../../../docs/testing.md")),
    (
        "crates/allocator/README.md",
        include_str!("../../../crates/allocator/README.md"),
    ),
    (
        "crates/collectives/README.md",
        include_str!("../../../crates/collectives/README.md"),
    ),
    (
        "crates/cuda-streams/README.md",
        include_str!("../../../crates/cuda-streams/README.md"),
    ),
    (
        "crates/driver/README.md",
        include_str!("../../../crates/driver/README.md"),
    ),
    (
        "crates/engine/README.md",
        include_str!("../../../crates/engine/README.md"),
    ),
    (
        "crates/event-coord/README.md",
        include_str!("../../../crates/event-coord/README.md"),
    ),
    (
        "crates/pipeline/README.md",
        include_str!("../../../crates/pipeline/README.md"),
    ),
    (
        "crates/profiler/README.md",
        include_str!("../../../crates/profiler/README.md"),
    ),
    (
        "crates/soft-driver/README.md",
        include_str!("../../../crates/soft-driver/README.md"),
    ),
    (
        "crates/stream-pool/README.md",
        include_str!("../../../crates/stream-pool/README.md"),
    ),
];

/// The one document made of measurements: every figure in it names the
/// commit of its run, so the commit-hash rule does not apply to it.
const FIGURES: &str = "docs/benchmarks.md";

/// The heading that starts a section where commit hashes may appear.
const MEASUREMENTS: &str = "## Measurements";

/// The CHANGELOG is history by design; only the session rule applies.
const CHANGELOG: &str = "CHANGELOG.md";

/// Whether `word` reads as a commit hash: 7 to 40 lowercase hexadecimal
/// digits, with at least one digit and one letter (so neither `1234567`
/// nor `defaced` counts).
fn is_commit_hash(word: &str) -> bool {
    (7..=40).contains(&word.len())
        && word.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && word.bytes().any(|b| b.is_ascii_digit())
        && word.bytes().any(|b| b.is_ascii_alphabetic())
}

/// The words of `line`: runs of letters and digits.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// Each line of `text` (numbered from 1) that speaks of sessions.
fn session_lines(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            words(line)
                .any(|w| w.eq_ignore_ascii_case("session") || w.eq_ignore_ascii_case("sessions"))
        })
        .map(|(i, line)| (i + 1, line))
        .collect()
}

/// Each line of `text` (numbered from 1) outside a "## Measurements"
/// section that holds a commit hash. A section runs from its `## ` heading
/// to the next `## ` heading; its `### ` subsections belong to it. Lines in
/// fenced code blocks are never headings.
fn hash_lines_outside_measurements(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut in_measurements = false;
    let mut in_code = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with("## ") {
            in_measurements = line.starts_with(MEASUREMENTS);
        }
        if !in_measurements && words(line).any(is_commit_hash) {
            found.push((i + 1, line));
        }
    }
    found
}

fn report(problems: &[(String, usize, &str)]) -> String {
    problems
        .iter()
        .map(|(path, line, text)| format!("{path}:{line}: {text}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_document_speaks_of_sessions() {
    let problems: Vec<_> = DOCUMENTS
        .iter()
        .flat_map(|(path, text)| {
            session_lines(text)
                .into_iter()
                .map(move |(line, found)| (path.to_string(), line, found))
        })
        .collect();
    assert!(
        problems.is_empty(),
        "documents that speak of sessions:\n{}",
        report(&problems)
    );
}

#[test]
fn commit_hashes_appear_only_in_measurements_sections() {
    let problems: Vec<_> = DOCUMENTS
        .iter()
        .filter(|(path, _)| *path != FIGURES && *path != CHANGELOG)
        .flat_map(|(path, text)| {
            hash_lines_outside_measurements(text)
                .into_iter()
                .map(move |(line, found)| (path.to_string(), line, found))
        })
        .collect();
    assert!(
        problems.is_empty(),
        "commit hashes outside a {MEASUREMENTS:?} section (move the figure there, \
         or its history to docs/benchmarks.md or docs/testing.md):\n{}",
        report(&problems)
    );
}

#[test]
fn the_rules_find_what_they_look_for() {
    assert!(is_commit_hash("4d7e173"));
    assert!(!is_commit_hash("1234567") && !is_commit_hash("defaced") && !is_commit_hash("4d7e17"));
    assert_eq!(
        session_lines("a\nSession 11 (2026-11-26)\nsessions.\nno").len(),
        2
    );
    let doc = "# T\nat 4d7e173\n## Measurements\nat 4d7e173\n### Run\nab12cd3\n## Use\nab12cd3\n";
    let lines: Vec<usize> = hash_lines_outside_measurements(doc)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(lines, [2, 8]);
    // A `## ` line inside a code block is no heading.
    let code = "## Measurements\n```sh\n## not a heading\n```\nab12cd3\n";
    assert!(hash_lines_outside_measurements(code).is_empty());
}

/// Where the source tree is present: every guide and crate README is on
/// the list above. (The GPU bundle runs this binary without the tree; there
/// it says so and checks the compiled-in copies only.)
#[test]
fn every_document_is_checked() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let docs = root.join("docs");
    let Ok(entries) = std::fs::read_dir(&docs) else {
        println!("skipped: no source tree at {}", docs.display());
        return;
    };
    let mut present: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    for crate_dir in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        if crate_dir.path().join("README.md").is_file() {
            present.push(format!(
                "crates/{}/README.md",
                crate_dir.file_name().to_string_lossy()
            ));
        }
    }
    let missing: Vec<_> = present
        .iter()
        .filter(|path| !DOCUMENTS.iter().any(|(listed, _)| listed == path))
        .collect();
    assert!(missing.is_empty(), "documents not on the list: {missing:?}");
}
