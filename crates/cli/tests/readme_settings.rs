//! The README's environment table against `cuda-streams info`: every
//! variable `info` lists has a row in the table, so a user who reads the
//! README meets every setting the tool would show them.

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use support::{cli, text};

/// Compiled in, so the test also runs from the GPU bundle, where there is
/// no source tree.
const README: &str = include_str!("../../../README.md");

/// The heading of the README's section that holds the table.
const SECTION: &str = "## Configuration by environment";

/// The variables `info` lists: the first word of each line of its
/// environment list (the indented lines after its `environment` header).
fn info_variables(stdout: &str) -> BTreeSet<String> {
    stdout
        .lines()
        .skip_while(|line| !line.starts_with("environment"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every name in backticks in the first column of the section's table.
fn readme_table_variables(readme: &str) -> BTreeSet<String> {
    let start = readme
        .find(SECTION)
        .unwrap_or_else(|| panic!("the README has no {SECTION:?} section"));
    let section = &readme[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .filter_map(|row| row.split('|').nth(1))
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_table_lists_every_variable_info_lists() {
    let output = Command::new(cli())
        .arg("info")
        .output()
        .expect("the CLI runs");
    let stdout = text(&output.stdout);
    let listed = info_variables(&stdout);
    // More than a handful: an `info` whose list this parser missed would
    // pass with nothing to compare.
    assert!(listed.len() >= 10, "info listed only {listed:?}:\n{stdout}");
    assert!(listed.contains("CUDA_STREAMS_DRIVER"), "{listed:?}");
    let table = readme_table_variables(README);
    let missing: Vec<_> = listed.difference(&table).collect();
    assert!(
        missing.is_empty(),
        "`cuda-streams info` lists {missing:?}, which the README's table ({SECTION:?}) lacks"
    );
}

#[test]
fn the_table_parser_reads_names_and_aliases_of_the_first_column() {
    let readme = "intro\n## Configuration by environment\n\n| variable | sets | default |\n\
                  | --- | --- | --- |\n| `A_B` (or `C`) | `x` or `y` | 1 |\n| `D`, `E` | f | `g` |\n\
                  \n## Layout\n| `NOT_HERE` | a | b |\n";
    let names = readme_table_variables(readme);
    let expected: BTreeSet<String> = ["A_B", "C", "D", "E"].map(String::from).into();
    assert_eq!(names, expected);
}
