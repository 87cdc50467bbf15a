//! The workspace's doc tests as binaries, for the GPU bundle.
//!
//! `cargo test --doc` compiles each doc test, runs it and throws the binary
//! away, and has no `--no-run`. rustdoc can keep them (`--persist-doctests
//! DIR`) and skip running them (`--no-run`), but both flags are unstable
//! (`-Z unstable-options`). We pass them on the stable toolchain with
//! `RUSTC_BOOTSTRAP=1`, for the doc-test step only: this is a build tool
//! choosing to use two rustdoc flags, no crate is compiled with unstable
//! features, and the alternative (extracting the examples and compiling
//! them ourselves) would re-implement rustdoc's preprocessing.
//!
//! What rustdoc leaves in DIR, per package:
//! - `merged_doctest_<edition>_<n>/rust_out`: the doc tests of the 2024
//!   edition, merged into one libtest binary. It ignores its command line;
//!   with `RUSTDOC_DOCTEST_BIN_PATH` set to itself it runs every doc test in
//!   a child process of its own, as `cargo test --doc` does (run.sh sets it),
//!   and it knows which are `should_panic`, `no_run` or `ignore`.
//! - `<file>_<line>_<n>/rust_out`: a doc test that cannot be merged (say
//!   `standalone_crate`), one plain program. Its fence's attributes are read
//!   from the source here: a `no_run` one is left out of the bundle, a
//!   `should_panic` one is named `*.should_panic` so that run.sh expects it
//!   to fail. `compile_fail` doc tests leave no binary.
//!
//! The binaries are statically linked against the workspace's crates (only
//! libc and libgcc_s are shared, as for the test binaries), and the code they
//! include from files (`include_str!`, the README and `docs/*.md`) is compiled
//! in, so they run from any directory on a machine without the source tree.

use crate::{Result, cuda_toolchain::run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Workspace packages whose doc tests have nothing to do with a GPU.
const SKIPPED: &[&str] = &["xtask", "cuda-streams-benches"];

/// A doc-test binary to put in the bundle.
pub(crate) struct Doctest {
    /// The file name in the bundle's `doctests/`: `<package>.<rustdoc's folder>`,
    /// with `.should_panic` appended where the program must fail.
    pub(crate) name: String,
    pub(crate) path: PathBuf,
}

/// Build every library's doc tests in release mode under `persist` (cleared
/// first) and list the binaries rustdoc kept.
pub(crate) fn build(root: &Path, persist: &Path) -> Result<Vec<Doctest>> {
    if persist.exists() {
        std::fs::remove_dir_all(persist)
            .map_err(|e| format!("cannot clear {}: {e}", persist.display()))?;
    }
    let mut found = Vec::new();
    for package in library_packages(root)? {
        let dir = persist.join(&package);
        // Appended to what the caller set, 0x1f-separated so that paths may
        // hold spaces.
        let mut flags = std::env::var("CARGO_ENCODED_RUSTDOCFLAGS").unwrap_or_default();
        for flag in ["-Zunstable-options", "--persist-doctests"]
            .into_iter()
            .chain([dir.to_str().ok_or("a non-UTF-8 target path")?, "--no-run"])
        {
            if !flags.is_empty() {
                flags.push('\u{1f}');
            }
            flags.push_str(flag);
        }
        // rustdoc still prints each doc test as "ok": compiled, not run.
        run(Command::new("cargo")
            .current_dir(root)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_ENCODED_RUSTDOCFLAGS", flags)
            .env_remove("RUSTDOCFLAGS")
            .args(["test", "--doc", "--release", "--quiet", "-p", &package])
            .stdout(Stdio::null()))?;
        collect(root, &package, &dir, &mut found)?;
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// The workspace's packages with a library target, but [`SKIPPED`].
fn library_packages(root: &Path) -> Result<Vec<String>> {
    let output = Command::new("cargo")
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err("cargo metadata failed".into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata's output: {e}"))?;
    let mut packages = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        let has_lib = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                t["kind"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k == "lib")
            });
        if has_lib && !SKIPPED.contains(&name) {
            packages.push(name.to_string());
        }
    }
    packages.sort();
    Ok(packages)
}

/// Add the binaries rustdoc persisted for `package` in `dir` to `found`.
fn collect(root: &Path, package: &str, dir: &Path, found: &mut Vec<Doctest>) -> Result<()> {
    // A package without doc tests leaves no folder.
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let binary = entry.path().join("rust_out");
        if !binary.is_file() {
            continue; // compile_fail, or a test that did not build
        }
        let folder = entry.file_name().to_string_lossy().into_owned();
        let mut name = format!("{package}.{folder}");
        if !folder.starts_with("merged_doctest_") {
            match standalone_fence(root, &folder) {
                Some(attributes) if attributes.iter().any(|a| a == "no_run") => continue,
                Some(attributes) if attributes.iter().any(|a| a == "should_panic") => {
                    name.push_str(".should_panic");
                }
                Some(_) => {}
                None => eprintln!(
                    "xtask: doc test {folder} of {package}: its fence was not found; \
                     run.sh will expect it to succeed"
                ),
            }
        }
        found.push(Doctest { name, path: binary });
    }
    Ok(())
}

/// The attributes of the fence that opens a standalone doc test, whose
/// folder rustdoc names `<source path, each non-alphanumeric as '_'>_<line>_<n>`.
/// `None` when the line is not a fence (a doc test in an included Markdown
/// file is numbered within that file, which the folder does not name).
fn standalone_fence(root: &Path, folder: &str) -> Option<Vec<String>> {
    let mut parts = folder.rsplitn(3, '_');
    let (_n, line, stem) = (parts.next()?, parts.next()?, parts.next()?);
    let line: usize = line.parse().ok()?;
    let source = sources(root).into_iter().find(|path| {
        path.chars()
            .map(|c| if c.is_alphanumeric() { c } else { '_' })
            .eq(stem.chars())
    })?;
    let text = std::fs::read_to_string(root.join(&source)).ok()?;
    let fence = text.lines().nth(line.checked_sub(1)?)?.trim_start();
    let fence = fence
        .trim_start_matches("//!")
        .trim_start_matches("///")
        .trim_start();
    let attributes = fence.strip_prefix("```")?;
    Some(
        attributes
            .split([',', ' ', '\t'])
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// The workspace's `.rs` files, relative to `root`, as rustdoc names them.
fn sources(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && !name.to_string_lossy().starts_with('.') {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && let Ok(relative) = path.strip_prefix(root)
            {
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found
}
