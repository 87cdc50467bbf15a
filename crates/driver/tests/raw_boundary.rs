//! The raw function table is called from this crate only (and from the
//! software driver that fills it): every other library crate of the
//! workspace goes through the result layer (`cuda_streams_driver::result`)
//! and the safe types. NCCL's and CUPTI's own tables stay with the crates
//! that wrap those libraries; their entry points do not start with `cu`
//! followed by a capital letter.
//!
//! Benches (whose baselines are raw calls by design) and tests are not
//! library code and are not scanned.

use std::path::{Path, PathBuf};

/// The crates allowed to call the CUDA driver's table directly.
const OWNERS: [&str; 2] = ["driver", "soft-driver"];

/// `(path, line number, line)` of each raw driver call `(x.cuName)(` in the
/// Rust files under `dir`.
fn raw_calls(dir: &Path, found: &mut Vec<(PathBuf, usize, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            raw_calls(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (index, line) in text.lines().enumerate() {
                if is_raw_call(line) {
                    found.push((path.clone(), index + 1, line.trim().to_string()));
                }
            }
        }
    }
}

/// Whether `line` calls a table entry: `.cu` and a capital letter, an
/// identifier, then `)(`, outside a comment.
fn is_raw_call(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices(".cu").any(|(at, _)| {
        let rest = &code[at + 3..];
        rest.starts_with(|c: char| c.is_ascii_uppercase())
            && rest
                .trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_')
                .starts_with(")(")
    })
}

#[test]
fn the_pattern_sees_a_raw_call_and_not_its_mention() {
    assert!(is_raw_call("let code = unsafe { (table.cuMemFree)(ptr) };"));
    assert!(is_raw_call("d.check((d.cuInit)(0))?;"));
    assert!(!is_raw_call("// (table.cuMemFree)(ptr)"));
    assert!(!is_raw_call("/// `cuMemAllocAsync` on the default pool"));
    assert!(!is_raw_call("(nccl.ncclAllReduce)(send)"));
    assert!(!is_raw_call("(table.cuptiActivityFlushAll)(0)"));
}

#[test]
fn no_library_crate_but_the_driver_calls_the_raw_table() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Ok(entries) = std::fs::read_dir(&crates) else {
        println!("skipped: no workspace around this crate (a packaged build)");
        return;
    };
    let mut found = Vec::new();
    let mut scanned = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if OWNERS.contains(&name.as_str()) {
            continue;
        }
        scanned += 1;
        raw_calls(&entry.path().join("src"), &mut found);
    }
    assert!(
        scanned >= 5,
        "expected the workspace's crates under {crates:?}"
    );
    let listed: Vec<String> = found
        .iter()
        .map(|(path, line, text)| format!("{}:{line}: {text}", path.display()))
        .collect();
    assert!(
        listed.is_empty(),
        "raw driver-table calls outside the driver crate (use cuda_streams_driver::result or a safe type):\n{}",
        listed.join("\n")
    );
}
