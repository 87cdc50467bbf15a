//! What the CLI's end-to-end tests share: where the binary is, and its
//! output as text.

use std::path::PathBuf;

/// The CLI: where cargo built it, or `bin/` of the GPU bundle, next to the
/// `tests/` folder this test binary was copied into.
pub(crate) fn cli() -> PathBuf {
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

/// Output bytes as text (lossy: the CLI prints UTF-8).
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
